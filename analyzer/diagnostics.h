// The analyzer's own diagnostics on stderr, through spdlog: "gpumem: warning: ...", "gpumem: error: ...",
// and with -v/--verbose "gpumem: debug: ..." (what was read, how, and how long it took).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <spdlog/spdlog.h>

namespace CLI {
class App;
class Option;
}

namespace gpumem::analysis {

// Sends spdlog's default logger to stderr with the "gpumem: LEVEL: " prefix; warnings and errors
// by default, debug messages too when verbose.  Called once by main before any command runs.
void init_diagnostics(bool verbose);

// --progress and --no-progress, one meaning in every command that reads logs (report, check, diff,
// replay, and run for its summary): progress on stderr every 2 s, by default when stderr is a
// terminal, so that a long read of a large log is never silent and a CI log is never cluttered.
struct progress_flags {
    bool on = false, off = false;
    double every_s = 2.0;  // hidden --progress-every: the tests' short interval
    bool wanted() const;
};
void add_progress_flags(CLI::App* app, progress_flags& p);

// A count option (-j/--jobs, diff's --top): a whole number from lo to hi, written as every number on
// the command line is (parse_number_arg), so "1e2", "+4" and "0x4", which CLI11's own conversion
// took or refused unlike the rest, are refused with the option and value named.  `set` receives it.
CLI::Option* add_count_option(CLI::App* app, const std::string& names, std::function<void(uint64_t)> set,
                              const std::string& description, uint64_t lo, uint64_t hi);

}  // namespace gpumem::analysis
