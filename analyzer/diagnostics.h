// The analyzer's own diagnostics on stderr, through spdlog: "gpumem: warning: ...", "gpumem: error: ...",
// and with -v/--verbose "gpumem: debug: ..." (what was read, how, and how long it took).
#pragma once

#include <spdlog/spdlog.h>

namespace gpumem::analysis {

// Sends spdlog's default logger to stderr with the "gpumem: LEVEL: " prefix; warnings and errors
// by default, debug messages too when verbose.  Called once by main before any command runs.
void init_diagnostics(bool verbose);

}  // namespace gpumem::analysis
