// The preload's own diagnostics (warnings, debug traces) on stderr through spdlog; silent below GPUMEM_LOG_LEVEL.
//
// Safety rules, because this runs inside someone else's process:
// - Check the level first: `enabled` is one relaxed atomic load, so a trace that is off costs no
//   formatting and no allocation on a hot path.
// - Never call these from a signal handler (they format and may allocate) nor from the `_exit` path
//   (a vfork child shares the parent's memory).
// - Before `init` (start of recording, a normal call context) nothing touches spdlog: a message
//   then goes out through write_stderr (core/stderr_write.h), in pieces.  So a dlsym or
//   cuGetProcAddress hook that reports something while the process is still starting never
//   constructs the logger.  A message longer than `log`'s 1 KiB stack buffer is formatted again on
//   the heap, so that it comes out whole.
// - A thread that is already inside a message does not log again (reentrancy), and a fork child
//   starts with the output lock free.
#pragma once

#include <atomic>
#include <cstddef>
#include <new>
#include <string>
#include <utility>

#include <spdlog/fmt/fmt.h>  // fmt as spdlog is configured with it (header-only here)

namespace gpumem::diag {

// spdlog's levels, in its order; GPUMEM_LOG_LEVEL names them (core/config.h, parse_log_level).
enum level : int { trace = 0, debug, info, warn, err, critical, off };

// The level in force.  Read from GPUMEM_LOG_LEVEL on first use; `init` sets it from the config.
int current_level() noexcept;
inline bool enabled(level l) noexcept { return l >= current_level(); }

// Makes the spdlog logger (stderr) at `lvl`.  Called once recording starts; later calls only set the level.
void init(int lvl) noexcept;
// In a fork child: the output lock may have been held by a thread that does not exist here.
void after_fork_child() noexcept;

// Writes one finished message (no trailing newline) at `l`, whole, whatever its length.
void write(level l, const char* msg, size_t n) noexcept;
// Writes the first `n` bytes of a message of `whole` bytes, with "... (whole - n bytes cut)" after them.
void write_cut(level l, const char* msg, size_t n, size_t whole) noexcept;

// Formats into a stack buffer; a message longer than it (a long path or setting in it) is formatted
// again on the heap and goes out whole.  Only when there is no memory for that does it go out cut,
// and then visibly: its first bytes, then "... (N bytes cut)".
template <class... A>
void log(level l, fmt::format_string<A...> f, A&&... a) noexcept {
    if (!enabled(l)) return;
    char buf[1024];
    try {
        const auto args = fmt::make_format_args(a...);
        const fmt::string_view text = f;
        const size_t size = fmt::vformat_to_n(buf, sizeof buf, text, args).size;
        if (size <= sizeof buf) return write(l, buf, size);
        try {
            const std::string whole = fmt::vformat(text, args);
            return write(l, whole.data(), whole.size());
        } catch (const std::bad_alloc&) {
            write_cut(l, buf, sizeof buf, size);
        }
    } catch (...) {
        // A formatting error in our own message: nothing to report it with.
    }
}
}  // namespace gpumem::diag

// A warning said once per `said` flag (a static at the call site), however often its cause recurs.
#define GPUMEM_WARN_ONCE(said, ...) \
    do { if (!(said).exchange(true)) GPUMEM_WARN(__VA_ARGS__); } while (0)

// Arguments are evaluated only when the level is on.
#define GPUMEM_WARN(...) \
    do { if (::gpumem::diag::enabled(::gpumem::diag::warn)) ::gpumem::diag::log(::gpumem::diag::warn, __VA_ARGS__); } while (0)
#define GPUMEM_INFO(...) \
    do { if (::gpumem::diag::enabled(::gpumem::diag::info)) ::gpumem::diag::log(::gpumem::diag::info, __VA_ARGS__); } while (0)
#define GPUMEM_DEBUG(...) \
    do { if (::gpumem::diag::enabled(::gpumem::diag::debug)) ::gpumem::diag::log(::gpumem::diag::debug, __VA_ARGS__); } while (0)
