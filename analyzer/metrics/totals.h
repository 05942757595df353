// Byte totals and event counts per device and per process: requested, allocated, reserved,
// segments, pending, mapped, reserved VA, the end line as written, and the header's device names.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "metrics/metric.h"

namespace gpumem::analysis {

class totals : public metric {
public:
    using metric::metric;
    void new_device(device_state& d);
    void any_event(const log_event& e);
    void after_event(device_state* d, const log_event& e, uint64_t line);
    void placed(device_state& d, const log_event& e, const live_alloc& a, uint64_t line) {
        add_bytes(ctx, d.rep.requested, a.size, e, line);
        add_bytes(ctx, d.rep.allocated, a.asize, e, line);
        if (!a.pooled) add_bytes(ctx, d.rep.reserved, a.asize, e, line);
    }
    void released(device_state& d, const live_alloc& a, bool) {
        d.rep.requested.sub(a.size);
        d.rep.allocated.sub(a.asize);
        if (!a.pooled) d.rep.reserved.sub(a.asize);
    }
    void freed(device_state& d, const log_event& e, const live_alloc*, uint64_t) {
        ++d.rep.n_free;
        if (e.unknown) ++d.rep.n_unknown_free;  // the allocation predates gpumem or bypassed it
    }
    // Only the mapped part is reserved; an arena segment's unmapped rest is a hole from the start.
    void segment_added(device_state& d, const log_event& e, uint64_t mapped, uint64_t line) {
        add_bytes(ctx, d.rep.reserved, mapped, e, line);
        if (e.size > mapped) add_bytes(ctx, d.rep.unmapped, e.size - mapped, e, line);
        d.rep.segment_count.add(1, e.t, e.seq, line);
    }
    void segment_removed(device_state& d, uint64_t size, uint64_t unmapped) {
        d.rep.reserved.sub(size);
        d.rep.unmapped.sub(unmapped);
        d.rep.segment_count.sub(1);
    }
    // The hole's memory went back to the driver: it leaves reserved, and stays out (docs/metrics.md).
    void segment_unmapped(device_state& d, const log_event& e, uint64_t line) {
        d.rep.reserved.sub(e.size);
        ++d.rep.n_segment_unmap;
        add_bytes(ctx, d.rep.unmapped, e.size, e, line);
    }
    // The segment grew: the chunks mapped into the hole are memory held from the driver again.
    void segment_mapped(device_state& d, const log_event& e, uint64_t line) {
        add_bytes(ctx, d.rep.reserved, e.size, e, line);
        ++d.rep.n_segment_map;
        d.rep.unmapped.sub(e.size);
    }
    void pending_added(device_state& d, uint64_t asize, const log_event& e, uint64_t line) {
        add_bytes(ctx, d.rep.pending, asize, e, line);
    }
    void pending_removed(device_state& d, uint64_t asize) { d.rep.pending.sub(asize); }
    void pending_cleared(device_state& d) { d.rep.pending.current = 0; }
    void mapped(device_state& d, const log_event& e, uint64_t line) {
        ++d.rep.n_map;
        add_bytes(ctx, d.rep.mapped, e.size, e, line);
    }
    void unmapped(device_state& d, uint64_t size) {
        ++d.rep.n_unmap;
        d.rep.mapped.sub(size);
    }
    void va_reserved(const log_event& e, uint64_t line) {
        ++ctx.proc.n_reserve;
        add_bytes(ctx, ctx.proc.va_reserved, e.size, e, line);
    }
    void va_released(uint64_t size) {
        ++ctx.proc.n_unreserve;
        ctx.proc.va_reserved.sub(size);
    }
    void reuse_safe(device_state& d, const log_event& e, uint64_t line);

private:
    bool have_first_ = false;
    std::vector<bool> seen_;  // by slot: the device has had an event of its own
};

// Called for every event: inline, so the common kinds cost a few compares.
inline void totals::any_event(const log_event& e) {
    process_report& p = ctx.proc;
    ++p.events;
    if (!e.known_kind) ++p.skipped_unknown;  // a kind from a newer recorder; its seq still counts
    if (e.has(fd_seq) && !have_first_) {
        have_first_ = true;
        p.first_t = e.t;
    }
    if (e.known_kind && e.has(fd_t)) p.last_t = std::max(p.last_t, e.t);
}

inline void totals::after_event(device_state* d, const log_event& e, uint64_t) {
    process_report& p = ctx.proc;
    if (d) {
        if (!seen_[d->slot]) {
            seen_[d->slot] = true;
            d->rep.first_t = e.t;
        }
        d->rep.last_t = std::max(d->rep.last_t, e.t);
    }
    switch (e.ev) {
    case ev_kind::alloc: {
        device_state& a = ctx.model.dev(e.dev);
        ++a.rep.n_alloc;
        a.rep.alloc_sizes.add(e.size);
        break;
    }
    case ev_kind::free_fail: ++(d ? *d : ctx.model.dev(-1)).rep.n_free_fail; break;
    case ev_kind::segment_alloc: ++ctx.model.dev(e.dev).rep.n_segment_alloc; break;
    case ev_kind::segment_free: ++ctx.model.dev(e.dev).rep.n_segment_free; break;
    case ev_kind::pool_sync:
        if (d) {
            d->rep.pool_wait_ns += e.wait_ns;
            d->rep.pool_fence_ns += e.fence_ns;
        }
        if (e.fence) {  // released by fences: no device-wide sync, maybe a wait on one
            if (d && e.count) ++d->rep.n_pool_fenced;  // a drain or settle line (count 0) frees nothing
            if (e.waited && d) ++d->rep.n_pool_wait;
            if (e.ordered && d) ++d->rep.n_pool_ordered;
            break;
        }
        ++p.n_pool_sync;
        if (d) ++d->rep.n_pool_sync;
        break;
    case ev_kind::context_reset: ++p.n_context_reset; break;
    case ev_kind::lost: p.lost = e.count > UINT64_MAX - p.lost ? UINT64_MAX : p.lost + e.count; break;  // crafted counts saturate
    case ev_kind::end:
        p.has_end = true;
        p.end_reason = e.reason;
        p.end_signal = e.signal;
        p.end_events = e.events;
        p.end_n_alloc = e.n_alloc;
        p.end_n_free = e.n_free;
        p.end_n_fail = e.n_fail;
        p.end_live_allocs = e.live_allocs;
        p.end_live_bytes = e.live_bytes;
        p.end_lost = e.lost;
        // Every loss so far, those with no lost line too; lost lines after this one add to it.
        p.lost = std::max(p.lost, e.lost);
        p.end_unmatched = e.unmatched;
        p.stacks_lost = e.stacks_lost;
        break;
    default: break;
    }
}

}  // namespace gpumem::analysis
