// Sets up the analyzer's spdlog logger (diagnostics.h).
#include "diagnostics.h"

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

}  // namespace gpumem::analysis
