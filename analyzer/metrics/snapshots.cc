// Snapshot scheduling; see snapshots.h.
#include "metrics/snapshots.h"

#include <algorithm>

namespace gpumem::analysis {

state_snapshot snapshots::take(device_state& d, const std::string& label, uint64_t seq, uint64_t t, uint64_t line) {
    state_snapshot s;
    s.valid = true;
    s.label = label;
    s.seq = seq;
    s.t = t;
    s.line = line;
    s.requested = d.rep.requested.current;
    s.allocated = d.rep.allocated.current;
    s.reserved = d.rep.reserved.current;
    s.pending = d.rep.pending.current;
    ctx.model.fill_snapshot(d, s, ctx.names);
    work_ += ctx.model.snapshot_cost(d);
    return s;
}

void snapshots::settle_peak(device_state& d) {
    per_dev& p = dev_[d.slot];
    if (!p.peak_dirty) return;
    p.peak_dirty = false;
    if (!opt_.peak_snapshot_seq.empty()) return;  // second pass: snapshots by seq instead
    uint64_t allowance = opt_.snapshot_budget_per_event * events_seen_ + opt_.snapshot_budget_fixed;
    if (work_ + ctx.model.snapshot_cost(d) > allowance) {
        p.peak_missing = true;
        return;
    }
    const tracked_bytes& a = d.rep.allocated;
    d.rep.at_peak = take(d, "peak", a.peak_seq, a.peak_t, a.peak_line);
    p.peak_missing = false;
}

void snapshots::take_due(const log_event& e, bool at_end) {
    if (opt_.at.kind != moment::by::none && !at_taken_) {
        bool due = at_end || (opt_.at.kind == moment::by::seq ? e.seq > opt_.at.value : e.t > opt_.at.value);
        if (due) {
            at_taken_ = true;
            for (auto& [k, d] : ctx.model.devices()) {
                d.rep.at_request = take(d, "--at", applied_seq_, applied_t_, applied_line_);
                if (at_end) d.rep.at_request.label = "--at (end of log)";
            }
        }
    }
    if (!due_built_) {
        due_built_ = true;
        for (const auto& [k, seq] : opt_.peak_snapshot_seq) due_.emplace_back(seq, k);
        std::sort(due_.begin(), due_.end());
    }
    for (; due_next_ < due_.size() && (at_end || e.seq > due_[due_next_].first); ++due_next_) {
        auto dit = ctx.model.devices().find(due_[due_next_].second);
        if (dit == ctx.model.devices().end()) continue;
        device_state& d = dit->second;
        per_dev& p = dev_[d.slot];
        if (p.second_pass_taken) continue;
        p.second_pass_taken = true;
        const tracked_bytes& a = d.rep.allocated;
        d.rep.at_peak = take(d, "peak", a.peak_seq, a.peak_t, a.peak_line);
    }
}

void snapshots::finish() {
    log_event none;
    take_due(none, true);
    for (auto& [k, d] : ctx.model.devices()) settle_peak(d);
}

bool snapshots::needs_second_pass() const {
    for (const per_dev& p : dev_)
        if (p.peak_missing) return true;
    return false;
}

std::map<int, uint64_t> snapshots::peak_seqs() {
    std::map<int, uint64_t> m;
    for (auto& [k, d] : ctx.model.devices())
        if (dev_[d.slot].peak_missing) m[k] = d.rep.allocated.peak_seq;
    return m;
}

std::map<int, state_snapshot> snapshots::take_peak_snapshots() {
    std::map<int, state_snapshot> m;
    for (auto& [k, d] : ctx.model.devices())
        if (dev_[d.slot].second_pass_taken) m[k] = d.rep.at_peak;
    return m;
}

}  // namespace gpumem::analysis
