// Recorder settings read from GPUMEM_* environment variables, and the log-path pattern.
#pragma once

#include <cstdint>
#include <string>

#include "size_parse.h"  // parse_size: the one rule for sizes, used for every numeric setting
#include "stacks/stack_mode.h"

namespace gpumem {

// The ways in that GPUMEM_ROUTES chooses from, one bit each: a exported symbols, b dlsym, c
// cuGetProcAddress, d cudaGetDriverEntryPoint* (preload/gpumem_preload.h, route).
constexpr unsigned k_all_routes = 1 | 2 | 4 | 8;

struct config {
    bool pool = true;                 // GPUMEM_POOL=on|off: cuMemAlloc_v2/cuMemFree_v2 served by the caching pool (docs/pool.md)
    static constexpr const char* k_default_out = "gpumem-%p.jsonl";
    std::string out = k_default_out;  // GPUMEM_OUT: a path pattern, or a directory (log_path_for)
    uint32_t flush_ms = 20;           // GPUMEM_FLUSH_MS: writer wakes at least this often
    uint32_t buffer_events = 65536;   // GPUMEM_BUFFER_EVENTS: ring capacity, rounded up to a power of 2
    uint32_t wait_ms = 2000;          // GPUMEM_WAIT_MS: how long a caller waits for ring space before the event is counted lost
    uint32_t sink_stall_ms = 10000;   // GPUMEM_SINK_STALL_MS: a FIFO log that takes nothing this long is a failed write; 0: wait for ever
    stacks::stack_mode stacks = stacks::stack_mode::python;  // GPUMEM_STACKS: off|python|native|all
    uint32_t stack_depth = 64;        // GPUMEM_STACK_DEPTH: frames kept per stack and kind, innermost first (1..256)
    int log_level = 3;                // GPUMEM_LOG_LEVEL: trace debug info warn (default) error critical off, or 0-6
    unsigned routes = k_all_routes;   // GPUMEM_ROUTES: the ways in that substitute wrappers (parse_routes)
    bool routes_set = false;          // GPUMEM_ROUTES held a value parse_routes accepts (the header records it)

    // Never throws: bad values keep the default and are reported through `warnings`.
    static config from_env(std::string* warnings = nullptr) noexcept;
};

// Expands %p, %h, %r and %% in a GPUMEM_OUT pattern.  `rank` comes from RANK / LOCAL_RANK.
std::string expand_out_pattern(const std::string& pattern, long pid, const std::string& host,
                               const std::string& rank);

// The first token of a pattern that expand_out_pattern does not know ("%q"; "%" for a lone % at
// the end), or "" when there is none.  The library keeps such a token as written and warns;
// `gpumem run -o` refuses it.
std::string unknown_out_token(const std::string& pattern);
// The tokens expand_out_pattern knows, for messages.
inline constexpr const char* k_out_tokens = "%p (pid), %r (rank), %h (host) and %% (a percent sign)";

// The log's path for a GPUMEM_OUT pattern: the pattern expanded, except that a directory (an
// expansion that ends in '/' or names an existing directory, "." included) gets the default name
// inside it, DIR/gpumem-<pid>.jsonl, as `gpumem run -o DIR` does.  A directory that does not exist
// is not made: its file then goes to /tmp by the log's fallback rule.
std::string log_path_for(const std::string& pattern, long pid, const std::string& host, const std::string& rank);

// $RANK, else $LOCAL_RANK, else "0".
std::string rank_from_env();

// A setting's variable (GPUMEM_*, RANK, LOCAL_RANK) as the program's environment holds it now, or,
// when it holds it no longer (clearenv, unsetenv before the first allocation, where the settings
// are read), as it was when libgpumem.so was loaded: the user's GPUMEM_POOL=off must not turn into
// the default because the program scrubbed its environment.  Null when neither has it.  Reads
// only; no allocation.
const char* setting_env(const char* name) noexcept;
// Keeps those variables as they are now, for setting_env: called once, by the preload's
// constructor (before the program runs; no CUDA call, only the environment read and copied).
void snapshot_settings_env() noexcept;

// Parses a GPUMEM_LOG_LEVEL: trace, debug, info, warn (warning), error (err), critical, off in any
// case, or 0-6 in that order (spdlog's levels).  False, leaving *out, for anything else.  No allocation.
bool parse_log_level(const char* s, int* out) noexcept;

// Parses a GPUMEM_ROUTES value into route bits (a = 1, b = 2, c = 4, d = 8): "all", or letters a to d
// in any order and case, alone or separated by commas or spaces ("a,c,d", "acd", "a, c").  False,
// leaving *out, for anything else ("garbage", "e", "", ","), which then means all routes, the
// default.  No allocation: the preload reads it at its first hooked lookup.
bool parse_routes(const char* s, unsigned* out) noexcept;

// Parses "on"/"off"/"1"/"0"/"true"/"false"/"yes"/"no" (letters in any case); returns false, leaving
// *out, for anything else.  Every GPUMEM_* switch reads this way (GPUMEM_POOL, GPUMEM_POOL_VMM, ...).
bool parse_bool(const char* s, bool* out) noexcept;


}  // namespace gpumem
