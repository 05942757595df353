// Snapshot scheduling: the state at the peak of allocated bytes (copied when a new peak is about
// to be lost, within a copying budget, or left to a second pass that stops at the peak's seq),
// and at --at.  Other metrics take their own snapshots through take().
#pragma once

#include <map>
#include <vector>

#include "metrics/metric.h"

namespace gpumem::analysis {

class snapshots : public metric {
public:
    explicit snapshots(metric_context& c) : metric(c), opt_(c.options) {}

    void any_event(const log_event&) { ++events_seen_; }
    void new_device(device_state& d) {
        if (dev_.size() <= d.slot) dev_.resize(d.slot + 1);
    }
    void before_event(const log_event& e, uint64_t) { take_due(e, false); }
    void before_change(device_state& d) { settle_peak(d); }
    void placed(device_state& d, const log_event&, const live_alloc&, uint64_t) {
        per_dev& p = dev_[d.slot];
        if (d.rep.allocated.peak != p.last_peak) {
            p.last_peak = d.rep.allocated.peak;
            p.peak_dirty = true;
            p.peak_missing = false;
        }
    }
    void after_event(device_state*, const log_event& e, uint64_t line) {
        applied_seq_ = e.seq;
        applied_t_ = e.t;
        applied_line_ = line;
    }
    void finish();

    // The state of d now, counted against the budget.
    state_snapshot take(device_state& d, const std::string& label, uint64_t seq, uint64_t t, uint64_t line);
    // Called before d changes: a pending peak snapshot is the state right now, so take it (within
    // budget) before it is lost.
    void settle_peak(device_state& d);

    // True when some device's peak snapshot was skipped for budget: run a second pass with
    // peak_snapshot_seq = peak_seqs().
    bool needs_second_pass() const;
    std::map<int, uint64_t> peak_seqs();
    std::map<int, state_snapshot> take_peak_snapshots();

private:
    struct per_dev {
        uint64_t last_peak = 0;
        bool peak_dirty = false;    // allocated reached a new peak and no snapshot was taken yet
        bool peak_missing = false;  // the snapshot of the current peak was skipped (budget)
        bool second_pass_taken = false;
    };
    // Snapshots due before the event e is applied (or at the end): --at and second-pass peaks.
    void take_due(const log_event& e, bool at_end);

    const rebuild_options& opt_;
    std::vector<per_dev> dev_;  // by slot
    uint64_t events_seen_ = 0;
    uint64_t work_ = 0;  // items copied into snapshots so far
    bool at_taken_ = false;
    // The second pass's peaks, (seq, device) by seq, and the first not yet taken: each event looks
    // at one entry, not at every device (a log of 16,384 device ordinals took minutes).
    std::vector<std::pair<uint64_t, int>> due_;
    size_t due_next_ = 0;
    bool due_built_ = false;
    uint64_t applied_seq_ = 0, applied_t_ = 0, applied_line_ = 0;  // the last event applied
};

}  // namespace gpumem::analysis
