// Rebuilds the memory state of one process event by event: segments, blocks, free gaps, live
// allocations, and the metrics of docs/metrics.md.  Memory is proportional to what is live.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "log_event.h"
#include "report_model.h"

namespace gpumem::analysis {

class line_parser;

// A moment the caller wants a snapshot of (--at).
struct moment {
    enum class by { none, seq, time } kind = by::none;
    uint64_t value = 0;  // seq number, or ns since start
};

struct replay_options {
    moment at;
    // Second pass only: take each device's peak snapshot right after this seq (dev -> seq).
    std::map<int, uint64_t> peak_snapshot_seq;
    // Bound on snapshot copying, in copied items per event seen (plus a fixed allowance); past it
    // the peak snapshot is left to a second pass instead of copying the state at every new peak.
    uint64_t snapshot_budget_per_event = 4;
    uint64_t snapshot_budget_fixed = uint64_t(1) << 22;
    size_t max_listed_leaks = k_max_listed_leaks;
};

class replayer {
public:
    replayer(process_report& report, const line_parser& names, replay_options options);
    ~replayer();

    // Applies one event read from `line`.  Throws input_error for an inconsistent log.
    void apply(const log_event& e, uint64_t line);
    // End of input: leak list, end state, pending snapshots; fills report.devices.
    void finish(uint64_t last_line);
    // Records a warning about `line` (0: the file as a whole) in the report.
    void warn(uint64_t line, const std::string& message);
    // True when some device's peak snapshot was skipped for budget: run a second pass with
    // peak_snapshot_seq = peak_seqs().
    bool needs_second_pass() const;
    std::map<int, uint64_t> peak_seqs() const;
    // Snapshots taken by a second pass, to graft onto the first pass's report.
    std::map<int, state_snapshot> take_peak_snapshots();

private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

}  // namespace gpumem::analysis
