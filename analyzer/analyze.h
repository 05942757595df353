// Analysis of whole log files: header checks, the streaming pass (and a second pass when needed),
// progress on stderr, and the combined table over several processes.
#pragma once

#include <string>
#include <vector>

#include "rebuild.h"
#include "report_model.h"

namespace gpumem::analysis {

struct analyze_options {
    moment at;                 // --at
    bool progress = false;     // print progress to stderr every few seconds
    double progress_interval_s = 2.0;
    // Snapshot copying allowed per event before the peak map is left to a second pass (tests set
    // 0 to force the second pass).
    uint64_t snapshot_budget_per_event = 4;
    uint64_t snapshot_budget_fixed = uint64_t(1) << 22;
    // Leaks listed per device (all are counted); tests raise it to compare every live block.
    size_t max_listed_leaks = k_max_listed_leaks;
    // The gpumem command reading the log, named in the advice on a compressed one.
    const char* command = "report";
};

// Reads and analyzes one log.  Throws input_error (exit code 2) when the log cannot be used.
// `open_path`: what to read in place of `path` (input_spool::path() of an input the caller has
// spooled already); messages name `path`.  Without it, a pipe is spooled here.
process_report analyze_file(const std::string& path, const analyze_options& options, const std::string& open_path = {});

// Peak per rank/device and the imbalance between them.
combined_report combine(const std::vector<process_report>& processes);

}  // namespace gpumem::analysis
