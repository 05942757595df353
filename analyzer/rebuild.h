// Rebuilds the memory state of one process event by event and measures it: each event goes to
// the log checks, the address-space model (model/) and the metrics (metrics/), which fill the
// report of docs/metrics.md.  Memory is proportional to what is live.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "log_event.h"
#include "metrics/metric.h"
#include "report_model.h"

namespace gpumem::analysis {

class line_parser;

class rebuilder {
public:
    rebuilder(process_report& report, const line_parser& names, rebuild_options options);
    ~rebuilder();

    // Applies one event read from `line`.  Throws input_error for an inconsistent log.
    void apply(const log_event& e, uint64_t line);
    // End of input: leak list, end state, pending snapshots; fills report.devices.
    void finish(uint64_t last_line);
    // Records a warning about `line` (0: the file as a whole) in the report; `always`: even past
    // the cap on listed warnings (for the few that say the whole report is in doubt).
    void warn(uint64_t line, const std::string& message, bool always = false);
    // The device's report as the pass has filled it so far (its peaks, its OOMs), or null before
    // its first event.
    const device_report* device_so_far(int dev) const;
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
