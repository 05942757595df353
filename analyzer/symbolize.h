// Offline symbolization of native frames (module + offset) with libdw, once per unique address.
//
// libdw (elfutils) reads the ELF symbol tables and DWARF line tables, and finds separate debug
// files (build-id, .gnu_debuglink) the way gdb does; a hand-written ELF reader would get none of
// that.  Modules are opened lazily and kept for the whole run; each module's function symbols are
// read once and searched by address (docs/benchmarks.md, "Symbolizing native stacks").
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace gpumem::analysis {

struct symbol_info {
    std::string function;  // demangled when it is a C++ name; "" when unknown
    std::string file;      // source file, "" when the module has no line table for it
    uint64_t line = 0;
};

class symbolizer {
  public:
    symbolizer();
    ~symbolizer();
    symbolizer(const symbolizer&) = delete;
    symbolizer& operator=(const symbolizer&) = delete;

    // Names the code at `offset` in `module` (an ELF path as recorded).  `return_address`: the
    // offset is a return address, so the call instruction is the byte before it.  Never throws; an
    // unreadable module gives an empty result.
    symbol_info lookup(const std::string& module, uint64_t offset, bool return_address);

    uint64_t lookups() const;  // libdw queries made (one per unique module+offset)

  private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

}  // namespace gpumem::analysis
