// The address-space model of one process: pool segments and their blocks, free gaps, pending
// blocks, live allocations, mappings and reserved VA ranges, changed event by event.  It says
// what changed to a model_observer (the metrics) and what does not add up to a model_checks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "log_event.h"
#include "model/gap_set.h"
#include "report_model.h"
#include "u64_map.h"

namespace gpumem::analysis {

class line_parser;

struct live_alloc {
    uint64_t size, asize, seq, t, line, seg;
    uint16_t api;
    int32_t dev;
    mem_kind kind;
    bool pooled;
    // Outside the pools: made on a stream (its line has "stream"), which no context owns.
    bool stream_ordered;
    // Outside the pools: its line's "ctx", the pool of its context (saturated: no pool numbers that high).
    uint32_t ctx;
};

// A range of a virtual-memory segment with no physical chunks behind it: given back by a
// segment_unmap, or not mapped yet when the segment was taken (segment_alloc's asize below its
// size).  segment_map turns (part of) it into free space again.
struct hole {
    uint64_t size, line;  // line: the segment_unmap's, or the segment_alloc's for an initial hole
    bool initial;         // from segment_alloc's asize: never mapped yet (for messages)
};

struct pool_part;

struct segment {
    uint64_t size;
    int32_t dev;
    pool_id pool;
    pool_part* part;  // the device's pool that holds it (its segment_alloc's "ctx")
    // ptr -> asize of every occupied range: live and pending blocks, and holes.  A hole is kept
    // here too, so the gaps between entries are exactly the free blocks (a hole is not free).
    std::map<uint64_t, uint64_t> blocks;
    std::map<uint64_t, hole> holes;  // the holes among `blocks`, by ptr
    uint64_t unmapped = 0;           // Σ hole sizes: size - unmapped is what the segment holds
};

// One pool of a device: a context's, as the pool's events name it ("ctx", 0 for the device's
// first).  Its free gaps, pending frees and reuse switch are its own: a pool_sync or reuse_safe
// changes only this pool, and a stats line describes only it (docs/log-format.md).
struct pool_part {
    gap_set gaps;  // the free blocks of its segments
    std::vector<std::pair<uint64_t, uint64_t>> pending;  // (segment base, block ptr), in free order
    uint64_t segment_bytes = 0;  // Σ held segment sizes less their holes: the pool's own "reserved"
    uint64_t n_segments = 0;
    bool reuse_safe = false;  // config.reuse "auto": this pool's frees pend from now on
    uint64_t reuse_safe_seq = 0, reuse_safe_line = 0;
};

// One device as the model sees it, and the report the metrics fill for it (the model writes only
// rep.dev).  `slot` numbers devices densely in the order they appear, so a metric can keep its own
// per-device state in a vector.  Its free blocks are those of all its pools.
struct device_state {
    int dev = -1;
    uint32_t slot = 0;
    device_report rep;
    std::map<uint64_t, pool_part> pools;  // by "ctx"; nodes do not move, so segments point at them
    uint64_t unmapped_bytes = 0; // Σ holes of held segments (address space without memory)

    pool_part& pool(uint64_t ctx) { return pools[ctx]; }
    uint64_t largest_free() {
        uint64_t m = 0;
        for (auto& [c, p] : pools) m = std::max(m, p.gaps.largest());
        return m;
    }
    uint64_t free_total() const {
        uint64_t n = 0;
        for (const auto& [c, p] : pools) n += p.gaps.total();
        return n;
    }
    uint64_t n_gaps() const {
        uint64_t n = 0;
        for (const auto& [c, p] : pools) n += p.gaps.count();
        return n;
    }
    bool any_pending() const {
        for (const auto& [c, p] : pools)
            if (!p.pending.empty()) return true;
        return false;
    }
    double frag() {
        const uint64_t total = free_total();
        return total ? 1.0 - double(largest_free()) / double(total) : 0.0;
    }
};

// What the model tells about each change, in the order it happens.  Every call comes from
// address_space::apply or address_space::dev.
class model_observer {
public:
    virtual ~model_observer() = default;
    virtual void new_device(device_state& d) = 0;
    // d is about to change other than by growing (a block or segment goes away, or pends).
    virtual void before_change(device_state& d) = 0;
    // A new live allocation (a replaced one was released first).
    virtual void placed(device_state& d, const log_event& e, const live_alloc& a, uint64_t line) = 0;
    // An allocation's bytes leave the device: a free (counted_free) or a drop.
    virtual void released(device_state& d, const live_alloc& a, bool counted_free) = 0;
    // A free event is done; `a` is what it freed (null: NULL, "unknown", or not live).  counted_on
    // is the device the free counts on: the allocation's, else the event's.
    virtual void freed(device_state& counted_on, const log_event& e, const live_alloc* a, uint64_t line) = 0;
    // mapped: the bytes mapped at once (asize, else size); the rest of [e.ptr, e.ptr + e.size) is a hole.
    virtual void segment_added(device_state& d, const log_event& e, uint64_t mapped, uint64_t line) = 0;
    // size: the bytes the segment still held (its holes were subtracted by segment_unmapped);
    // unmapped: the bytes of its holes.
    virtual void segment_removed(device_state& d, uint64_t size, uint64_t unmapped) = 0;
    // A segment_unmap cut the hole [e.ptr, e.ptr + e.size) out of a free block.
    virtual void segment_unmapped(device_state& d, const log_event& e, uint64_t line) = 0;
    // A segment_map made [e.ptr, e.ptr + e.size), a hole until now, free space.
    virtual void segment_mapped(device_state& d, const log_event& e, uint64_t line) = 0;
    virtual void pending_added(device_state& d, uint64_t asize, const log_event& e, uint64_t line) = 0;
    virtual void pending_removed(device_state& d, uint64_t asize) = 0;
    virtual void pending_cleared(device_state& d) = 0;
    virtual void mapped(device_state& d, const log_event& e, uint64_t line) = 0;
    virtual void unmapped(device_state& d, uint64_t size) = 0;  // size 0: an unmap of nothing mapped
    virtual void va_reserved(const log_event& e, uint64_t line) = 0;
    virtual void va_released(uint64_t size) = 0;  // size 0: an unreserve of nothing reserved
    virtual void reuse_safe(device_state& d, const log_event& e, uint64_t line) = 0;
    // d changed as a side effect of an event of another device (or of a context reset).
    virtual void changed(device_state& d, uint64_t t, uint64_t seq) = 0;
};

// Where the model reports a log that does not add up (model/log_checker.h decides how hard).
class model_checks {
public:
    virtual ~model_checks() = default;
    virtual void warn(uint64_t line, const std::string& message) = 0;
    // A warning about the whole report (events lost, absurd totals): shown even past the cap.
    virtual void warn_always(uint64_t line, const std::string& message) = 0;
    // An error, or a warning once the log is known to miss events.
    virtual void inconsistent(uint64_t line, const std::string& message) = 0;
    // A free of a pointer or handle that is not live: names it a double free when it can.
    virtual void bad_free(uint64_t line, uint64_t ptr, bool handle) = 0;
    virtual bool lenient() const = 0;
};

std::string hex(uint64_t v);

class address_space {
public:
    address_space(const process_report& proc, const line_parser& names, model_observer& obs, model_checks& checks)
        : proc_(proc), names_(names), obs_(obs), checks_(checks) {}

    // Applies one event of a known kind.  May throw input_error (through model_checks).
    void apply(const log_event& e, uint64_t line);
    // The device of the last event applied, when it named one.
    device_state* event_device() const { return event_dev_; }

    device_state& dev(int d) {
        // Nearly every event names the device of the one before; std::map nodes do not move.
        if (last_dev_ && last_dev_index_ == d) return *last_dev_;
        auto it = devs_.find(d);
        if (it == devs_.end()) return add_device(d);
        last_dev_index_ = d;
        last_dev_ = &it->second;
        return it->second;
    }
    std::map<int, device_state>& devices() { return devs_; }

    // Queries for snapshots, leaks and checks.
    size_t n_live() const { return live_.size() + live_vmm_.size(); }
    template <typename F>
    void for_each_live(F&& f) const {
        for (const auto* m : {&live_, &live_vmm_})
            for (const auto& kv : *m) f(kv);
    }
    using live_entry = u64_map<live_alloc>::entry;
    // Items a snapshot of d copies, for the snapshot budget.
    uint64_t snapshot_cost(const device_state& d) const;
    // The model's part of a snapshot of d: gaps, segment map, largest live blocks.
    void fill_snapshot(device_state& d, state_snapshot& s, const line_parser& names) const;
    static block_view view(uint64_t ptr, const live_alloc& a, const line_parser& names);
    // Whether a pooled free in pool p pends right now (docs/log-format.md, rebuilding the layout).
    bool pends(const pool_part& p);

private:
    device_state& add_device(int d);
    void on_alloc(const log_event& e, uint64_t line);
    void check_plain_overlap(const log_event& e, uint64_t line);
    bool place_block(segment& s, uint64_t base, uint64_t p, uint64_t asz, uint64_t line);
    void unplace_block(segment& s, uint64_t base, uint64_t p);
    void release(const live_alloc& a, bool counted_free) { obs_.released(dev(a.dev), a, counted_free); }
    void on_free(const log_event& e, uint64_t line);
    void on_segment_alloc(const log_event& e, uint64_t line);
    void on_segment_free(const log_event& e, uint64_t line);
    void on_segment_unmap(device_state& d, const log_event& e, uint64_t line);
    void on_segment_map(device_state& d, const log_event& e, uint64_t line);
    std::string occupant(const segment& s, uint64_t base, uint64_t p) const;
    void on_pool_sync(device_state& d, const log_event& e, uint64_t line);
    void release_pending(device_state& d, uint64_t seg, uint64_t ptr);
    void on_reuse_safe(device_state& d, const log_event& e, uint64_t line);
    void drop_pending_in(device_state& d, pool_part& p, uint64_t base);
    void drop_device_state(int only_dev, const log_event& e);

    const process_report& proc_;  // the header: config.pool and config.reuse
    const line_parser& names_;    // API names, for warnings
    model_observer& obs_;
    model_checks& checks_;

    std::map<int, device_state> devs_;
    int last_dev_index_ = 0;
    device_state* last_dev_ = nullptr;
    device_state* event_dev_ = nullptr;
    u64_map<live_alloc> live_;      // address -> allocation
    u64_map<live_alloc> live_vmm_;  // cuMemCreate handle -> allocation
    // Plain (not pooled, not VMM) allocations by address -> end, to catch overlapping ranges.
    std::map<uint64_t, uint64_t> plain_ranges_;
    std::map<uint64_t, segment> segments_;  // base -> segment (addresses are global: UVA)
    // The same segments by exact base: every pooled alloc and free looks its segment up, and the
    // hash lookup is cheaper than the tree walk (std::map nodes do not move, so pointers stay valid).
    u64_map<std::pair<const uint64_t, segment>*> segment_at_;
    struct mapping {
        uint64_t size;
        int32_t dev;
    };
    std::unordered_map<uint64_t, mapping> maps_;        // cuMemMap'd VA -> size
    std::unordered_map<uint64_t, uint64_t> va_ranges_;  // cuMemAddressReserve'd VA -> size
    // When a pooled free leaves its block pending.  The header is read before the first event, so
    // the rule is settled lazily on first use.
    enum class pend_rule : uint8_t { unknown, never, after_reuse_safe, always };
    pend_rule rule_ = pend_rule::unknown;
    pend_rule pending_rule();
};

}  // namespace gpumem::analysis
