// Captures the calling thread's native return addresses, and names the module each one lies in.
//
// Capture walks the stack with the unwinder of the libgcc that libgpumem.so links statically
// (.eh_frame based, so it needs no frame pointers).  Symbols are not looked up in the process: the
// log records module and offset, and the analyzer symbolizes offline, once per unique address.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gpumem::stacks {

// Fills up to `max` return addresses of the caller's stack, innermost first, leaving out the frames
// of the module that holds this code (gpumem itself).  Returns the number filled.
size_t capture_native(uint64_t* pcs, size_t max) noexcept;

// The module holding `pc` and the offset of `pc` from the module's load base: the address an ELF
// reader finds it at.  False when no loaded object holds it (JIT code).
bool describe_native(uint64_t pc, std::string& module, uint64_t& offset) noexcept;

}  // namespace gpumem::stacks
