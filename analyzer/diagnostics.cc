// Sets up the analyzer's spdlog logger (diagnostics.h).
#include "diagnostics.h"

#include <unistd.h>

#include <CLI/CLI.hpp>

#include <spdlog/sinks/stdout_sinks.h>

namespace gpumem::analysis {

void init_diagnostics(bool verbose) {
    // Single-threaded sink: the analyzer logs from one thread.  stderr is unbuffered, so messages
    // keep their order with the reports written to stdout.
    auto logger = spdlog::stderr_logger_st("gpumem");
    logger->set_pattern("gpumem: %l: %v");
    logger->set_level(verbose ? spdlog::level::debug : spdlog::level::warn);
    spdlog::set_default_logger(logger);
}

bool progress_flags::wanted() const { return on || (!off && ::isatty(2) == 1); }

void add_progress_flags(CLI::App* app, progress_flags& p) {
    auto* on = app->add_flag("--progress", p.on, "print progress on stderr every 2 s (default when stderr is a terminal)");
    app->add_flag("--no-progress", p.off, "never print progress")->excludes(on);
    app->add_option("--progress-every", p.every_s, "seconds between progress lines")
        ->check(CLI::Range(0.0, 3600.0))
        ->group("");  // hidden: for the tests, which cannot wait 2 s per line
}

}  // namespace gpumem::analysis
