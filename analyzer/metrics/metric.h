// What a metric sees: the hooks the driver (rebuild.cc) calls on every metric, in the order of
// its list, and the context they share.  A metric overrides (hides) only the hooks it needs; the
// calls are on the concrete type, so an empty hook costs nothing.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "log_event.h"
#include "model/address_space.h"
#include "report_model.h"

namespace gpumem::analysis {

class line_parser;
class snapshots;

// A moment the caller wants a snapshot of (--at).
struct moment {
    enum class by { none, seq, time } kind = by::none;
    uint64_t value = 0;  // seq number, or ns since start
};

// What the caller asks of one pass; the metrics read what concerns them.
struct rebuild_options {
    moment at;
    // Second pass only: take each device's peak snapshot right after this seq (dev -> seq).
    std::map<int, uint64_t> peak_snapshot_seq;
    // Bound on snapshot copying, in copied items per event seen (plus a fixed allowance); past it
    // the peak snapshot is left to a second pass instead of copying the state at every new peak.
    uint64_t snapshot_budget_per_event = 4;
    uint64_t snapshot_budget_fixed = uint64_t(1) << 22;
    size_t max_listed_leaks = k_max_listed_leaks;
};

struct metric_context {
    process_report& proc;
    address_space& model;
    const line_parser& names;
    model_checks& checks;  // warnings go here
    snapshots& snaps;      // for metrics that take a snapshot of their own (OOM maps)
    const rebuild_options& options;
    bool overflow_said = false;
};

// Adds n bytes to b.  Only an absurd or hostile log sums past 2^64 - 1; the total then stays at
// that maximum instead of wrapping to a small number, and the log gets one warning.
inline void add_bytes(metric_context& c, tracked_bytes& b, uint64_t n, const log_event& e, uint64_t line) {
    if (n > UINT64_MAX - b.current) [[unlikely]] {
        if (!c.overflow_said) {
            c.overflow_said = true;
            c.checks.warn_always(line, "the byte totals pass 2^64 - 1 here (sizes no program can hold): "
                                "they stay at that maximum from now on and are not meaningful");
        }
        n = UINT64_MAX - b.current;
    }
    b.add(n, e.t, e.seq, line);
}

struct metric {
    explicit metric(metric_context& c) : ctx(c) {}
    metric_context& ctx;

    // From the driver.
    void any_event(const log_event&) {}                         // every event, known kind or not
    void before_event(const log_event&, uint64_t /*line*/) {}   // a known event, before the model applies it
    void after_event(device_state* /*event's device*/, const log_event&, uint64_t /*line*/) {}
    void finish() {}
    // From the model (model_observer, which the driver fans out).
    void new_device(device_state&) {}
    void before_change(device_state&) {}
    void placed(device_state&, const log_event&, const live_alloc&, uint64_t /*line*/) {}
    void released(device_state&, const live_alloc&, bool /*counted_free*/) {}
    void freed(device_state&, const log_event&, const live_alloc*, uint64_t /*line*/) {}
    void segment_added(device_state&, const log_event&, uint64_t /*mapped*/, uint64_t /*line*/) {}
    void segment_removed(device_state&, uint64_t /*size*/, uint64_t /*unmapped*/) {}
    void segment_unmapped(device_state&, const log_event&, uint64_t /*line*/) {}
    void segment_mapped(device_state&, const log_event&, uint64_t /*line*/) {}
    void pending_added(device_state&, uint64_t /*asize*/, const log_event&, uint64_t /*line*/) {}
    void pending_removed(device_state&, uint64_t /*asize*/) {}
    void pending_cleared(device_state&) {}
    void mapped(device_state&, const log_event&, uint64_t /*line*/) {}
    void unmapped(device_state&, uint64_t /*size*/) {}
    void va_reserved(const log_event&, uint64_t /*line*/) {}
    void va_released(uint64_t /*size*/) {}
    void reuse_safe(device_state&, const log_event&, uint64_t /*line*/) {}
    void changed(device_state&, uint64_t /*t*/, uint64_t /*seq*/) {}
};

}  // namespace gpumem::analysis
