// GPUMEM_STACKS: which frames the recorder captures at each allocation (docs/log-format.md, "stack").
#pragma once

#include <cstdint>

namespace gpumem::stacks {

// `all` puts the native frames (innermost) before the Python frames of the same thread.
enum class stack_mode : uint8_t { off = 0, python, native, all, count_ };
inline constexpr const char* k_stack_mode_names[] = {"off", "python", "native", "all"};

}  // namespace gpumem::stacks
