// Event-by-event reconstruction of segments, blocks and live allocations, and metric accumulation.
#include "replay.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <limits>

#include "log_reader.h"
#include "u64_map.h"

namespace gpumem::analysis {

namespace {

std::string hex(uint64_t v) {
    char b[24];
    std::snprintf(b, sizeof b, "0x%" PRIx64, v);
    return b;
}

struct live_alloc {
    uint64_t size, asize, seq, t, line, seg;
    uint16_t api;
    int32_t dev;
    mem_kind kind;
    bool pooled;
};

struct seg_state {
    uint64_t size;
    int32_t dev;
    pool_id pool;
    std::map<uint64_t, uint64_t> blocks;  // ptr -> asize; ordered so neighbours give the gaps
};

struct mapping {
    uint64_t size;
    int32_t dev;
};

// Downsamples the memory-over-time series to at most k_timeline_points, keeping maxima.
struct timeline_builder {
    std::vector<time_point> pts;
    uint64_t per_point = 1;
    void add(uint64_t t, uint64_t seq, uint64_t req, uint64_t alloc, uint64_t res, double frag) {
        if (pts.empty() || pts.back().events >= per_point) {
            if (pts.size() >= k_timeline_points) compact();
            time_point p;
            p.t_first = t;
            pts.push_back(p);
        }
        time_point& p = pts.back();
        p.t_last = t;
        p.seq_last = seq;
        p.requested_max = std::max(p.requested_max, req);
        p.allocated_max = std::max(p.allocated_max, alloc);
        p.reserved_max = std::max(p.reserved_max, res);
        p.frag_max = std::max(p.frag_max, frag);
        p.requested_last = req;
        p.allocated_last = alloc;
        p.reserved_last = res;
        p.frag_last = frag;
        ++p.events;
    }
    void compact() {
        size_t n = 0;
        for (size_t i = 0; i < pts.size(); i += 2) {
            time_point a = pts[i];
            if (i + 1 < pts.size()) {
                const time_point& b = pts[i + 1];
                a.t_last = b.t_last;
                a.seq_last = b.seq_last;
                a.requested_max = std::max(a.requested_max, b.requested_max);
                a.allocated_max = std::max(a.allocated_max, b.allocated_max);
                a.reserved_max = std::max(a.reserved_max, b.reserved_max);
                a.frag_max = std::max(a.frag_max, b.frag_max);
                a.requested_last = b.requested_last;
                a.allocated_last = b.allocated_last;
                a.reserved_last = b.reserved_last;
                a.frag_last = b.frag_last;
                a.events += b.events;
            }
            pts[n++] = a;
        }
        pts.resize(n);
        per_point *= 2;
    }
};

// The free gaps of one device as a multiset of sizes, built for "largest" after every event: a
// hash map of counts plus a max-heap that may hold stale sizes, dropped lazily when they surface.
// This replaced a std::map<size, count>, whose node churn was the replay's largest cost; the counts
// are an open-addressing map since std::unordered_map's nodes were the next largest.
class gap_set {
public:
    void add(uint64_t s) {
        if (!s) return;
        uint32_t& c = count_[s];
        if (c++ == 0) {
            // Stale sizes below the top pile up; rebuild when they outnumber the live ones.
            if (heap_.size() > 2 * count_.size() + 1024) rebuild();
            heap_.push_back(s);
            std::push_heap(heap_.begin(), heap_.end());
        }
        total_ += s;
        ++n_;
    }
    void remove(uint64_t s) {
        if (!s) return;
        uint32_t* c = count_.find(s);
        if (!c) return;  // unreachable while the map is consistent
        if (--*c == 0) {
            count_.erase(s);
            // Only a vanished top makes the answer stale; sizes below it are checked as they surface.
            if (!heap_.empty() && s == heap_.front()) top_stale_ = true;
        }
        total_ -= s;
        --n_;
    }
    // Called after every event, so the common case (the top is still live) does no lookup.
    uint64_t largest() {
        if (top_stale_) {
            while (!heap_.empty() && !count_.contains(heap_.front())) {
                std::pop_heap(heap_.begin(), heap_.end());
                heap_.pop_back();
            }
            top_stale_ = false;
        }
        return heap_.empty() ? 0 : heap_.front();
    }
    void clear() {
        count_.clear();
        heap_.clear();
        total_ = n_ = 0;
        top_stale_ = false;
    }
    uint64_t total() const { return total_; }
    uint64_t count() const { return n_; }

private:
    void rebuild() {
        heap_.clear();
        for (const auto& kv : count_) heap_.push_back(kv.first);
        std::make_heap(heap_.begin(), heap_.end());
        top_stale_ = false;  // every size in the heap is live again
    }

    u64_map<uint32_t> count_;
    std::vector<uint64_t> heap_;
    uint64_t total_ = 0, n_ = 0;
    bool top_stale_ = false;  // heap_.front() may no longer be a live size
};

struct dev_state {
    device_report rep;
    gap_set gaps;
    timeline_builder timeline;
    std::vector<usage_row> by_api;
    std::vector<usage_row> by_kind;
    bool peak_dirty = false;    // allocated reached a new peak and no snapshot was taken yet
    bool peak_missing = false;  // the snapshot of the current peak was skipped (budget)
    bool pending_oom = false;   // an "oom" not yet matched by its alloc_fail
    uint64_t pending_oom_size = 0;
    bool second_pass_taken = false;
    std::vector<std::pair<uint64_t, uint64_t>> pending;  // (segment base, block ptr), in free order
    uint64_t segment_bytes = 0;  // Σ held segment sizes: the pool's own "reserved"
    bool seen = false;  // has had an event of its own

    uint64_t largest_free() { return gaps.largest(); }
    uint64_t free_total() const { return gaps.total(); }
    uint64_t n_gaps() const { return gaps.count(); }
    double frag() {
        return gaps.total() ? 1.0 - double(largest_free()) / double(gaps.total()) : 0.0;
    }
};

}  // namespace

struct replayer::impl {
    process_report& rep;
    const line_parser& names;
    replay_options opt;

    std::map<int, dev_state> devs;
    int last_dev_index = 0;
    dev_state* last_dev = nullptr;
    u64_map<live_alloc> live;      // address -> allocation
    u64_map<live_alloc> live_vmm;  // cuMemCreate handle -> allocation
    u64_map<uint64_t> freed;       // recently freed address -> line of free
    std::map<uint64_t, seg_state> segments;             // base -> segment (addresses are global: UVA)
    // The same segments by exact base: every pooled alloc and free looks its segment up, and the
    // hash lookup is cheaper than the tree walk (std::map nodes do not move, so pointers stay valid).
    u64_map<std::pair<const uint64_t, seg_state>*> segment_at;
    std::unordered_map<uint64_t, mapping> maps;         // cuMemMap'd VA -> size
    std::unordered_map<uint64_t, uint64_t> va_ranges;   // cuMemAddressReserve'd VA -> size

    bool have_seq = false;
    uint64_t last_seq = 0;
    // After lost events or a seq gap the log is known to be incomplete, so inconsistencies that
    // the missing events could explain become warnings instead of errors.
    bool lenient = false;
    bool after_end = false;
    // When a pooled free leaves its block pending (docs/log-format.md, rebuilding the layout).  The
    // header is read before the first event, so the rule is settled lazily on first use.
    enum class pend_rule : uint8_t { unknown, never, after_reuse_safe, always };
    pend_rule rule = pend_rule::unknown;
    pend_rule pending_rule() {
        if (rule == pend_rule::unknown) {
            if (rep.pool_mode == "off" || rep.reuse_mode == "immediate") rule = pend_rule::never;
            else if (rep.reuse_mode == "auto") rule = pend_rule::after_reuse_safe;
            else rule = pend_rule::always;  // "safe", absent, or a value we do not know: as before auto
        }
        return rule;
    }
    // Whether a pooled free on device d pends right now: "auto" switches each device on its own event.
    bool pending_frees(const dev_state& d) {
        switch (pending_rule()) {
        case pend_rule::never: return false;
        case pend_rule::after_reuse_safe: return d.rep.reuse_safe;
        default: return true;
        }
    }
    uint64_t events_seen = 0;
    uint64_t snapshot_work = 0;
    bool at_taken = false;
    uint64_t stats_mismatch_warnings = 0;
    uint64_t applied_seq = 0, applied_t = 0, applied_line = 0;  // the last event applied

    impl(process_report& r, const line_parser& n, replay_options o) : rep(r), names(n), opt(std::move(o)) {}

    // ----- diagnostics
    void warn(uint64_t line, const std::string& msg) {
        ++rep.n_warnings;
        if (rep.warnings.size() < k_max_warnings)
            rep.warnings.push_back(line ? rep.file + ":" + std::to_string(line) + ": " + msg
                                        : rep.file + ": " + msg);
    }
    [[noreturn]] void fail(uint64_t line, const std::string& msg) { throw input_error(rep.file, line, msg); }
    void inconsistent(uint64_t line, const std::string& msg) {
        if (lenient) warn(line, msg + " (tolerated: the log is missing events)");
        else fail(line, msg);
    }

    dev_state& dev(int d) {
        // Nearly every event names the device of the one before; std::map nodes do not move.
        if (last_dev && last_dev_index == d) return *last_dev;
        auto it = devs.find(d);
        if (it != devs.end()) {
            last_dev_index = d;
            last_dev = &it->second;
            return it->second;
        }
        dev_state& s = devs[d];
        s.rep.dev = d;
        for (const header_device& h : rep.header_devices)
            if (h.index == d) {
                s.rep.name = h.name;
                s.rep.total = h.total;
            }
        s.by_kind.resize(size_t(mem_kind::count_));
        for (size_t i = 0; i < s.by_kind.size(); ++i)
            s.by_kind[i].name = i == 0 ? "other" : k_mem_kind_names[i];
        return s;
    }

    // ----- free gaps
    static void gap_add(dev_state& d, uint64_t n) { d.gaps.add(n); }
    static void gap_remove(dev_state& d, uint64_t n) { d.gaps.remove(n); }
    // The free range a block absent from s would sit in, given its position `at` (its lower_bound):
    // [prev_end, next_start).
    static void gap_at(const seg_state& s, uint64_t base, std::map<uint64_t, uint64_t>::const_iterator at,
                       uint64_t& prev_end, uint64_t& next_start) {
        next_start = at == s.blocks.end() ? base + s.size : at->first;
        prev_end = base;
        if (at != s.blocks.begin()) {
            auto prev = std::prev(at);
            prev_end = prev->first + prev->second;
        }
    }

    // ----- usage rows
    usage_row& api_row(dev_state& d, uint16_t api) {
        if (d.by_api.size() <= api) d.by_api.resize(size_t(api) + 1);
        return d.by_api[api];
    }
    void usage_add(dev_state& d, const live_alloc& a, uint64_t t, uint64_t seq, uint64_t line) {
        for (usage_row* r : {&api_row(d, a.api), &d.by_kind[size_t(a.kind)]}) {
            r->bytes.add(a.size, t, seq, line);
            ++r->live;
            ++r->n_alloc;
        }
    }
    void usage_sub(dev_state& d, const live_alloc& a, bool counted_free) {
        for (usage_row* r : {&api_row(d, a.api), &d.by_kind[size_t(a.kind)]}) {
            r->bytes.sub(a.size);
            if (r->live) --r->live;
            if (counted_free) ++r->n_free;
        }
    }

    // ----- snapshots
    uint64_t snapshot_cost(const dev_state& d) const {
        uint64_t n = live.size() + segments.size();
        for (const auto& [base, s] : segments)
            if (s.dev == d.rep.dev) n += s.blocks.size();
        return n;
    }
    state_snapshot snapshot(dev_state& d, const std::string& label, uint64_t seq, uint64_t t,
                            uint64_t line) {
        state_snapshot s;
        s.valid = true;
        s.label = label;
        s.seq = seq;
        s.t = t;
        s.line = line;
        s.requested = d.rep.requested.current;
        s.allocated = d.rep.allocated.current;
        s.reserved = d.rep.reserved.current;
        s.free_in_segments = d.free_total();
        s.largest_free = d.largest_free();
        s.free_blocks = d.n_gaps();
        s.external_fragmentation = d.frag();
        s.pending = d.rep.pending.current;
        std::unordered_map<uint64_t, bool> pend;
        for (const auto& pr : d.pending) pend[pr.second] = true;
        for (const auto& [base, sg] : segments) {
            if (sg.dev != d.rep.dev) continue;
            segment_view v;
            v.base = base;
            v.size = sg.size;
            v.pool = sg.pool;
            v.blocks.assign(sg.blocks.begin(), sg.blocks.end());
            if (!pend.empty())
                for (const auto& b : v.blocks)
                    if (pend.count(b.first)) v.pending.push_back(b);
            // Free blocks for the histogram: the gaps between consecutive blocks.
            uint64_t cur = base;
            for (const auto& [p, a] : sg.blocks) {
                if (p > cur) s.free_block_sizes.add(p - cur);
                cur = p + a;
            }
            if (base + sg.size > cur) s.free_block_sizes.add(base + sg.size - cur);
            s.segment_map.push_back(std::move(v));
        }
        s.segments = s.segment_map.size();
        std::vector<const u64_map<live_alloc>::entry*> mine;
        for (const auto* m : {&live, &live_vmm})
            for (const auto& kv : *m)
                if (kv.second.dev == d.rep.dev) mine.push_back(&kv);
        s.live_allocs = mine.size();
        size_t k = std::min(mine.size(), k_top_blocks);
        std::partial_sort(mine.begin(), mine.begin() + ptrdiff_t(k), mine.end(), [](auto* a, auto* b) {
            return a->second.size != b->second.size ? a->second.size > b->second.size
                                                    : a->second.seq < b->second.seq;
        });
        for (size_t i = 0; i < k; ++i) s.largest_live.push_back(view(mine[i]->first, mine[i]->second));
        snapshot_work += snapshot_cost(d);
        return s;
    }
    block_view view(uint64_t ptr, const live_alloc& a) const {
        block_view b;
        b.ptr = ptr;
        b.size = a.size;
        b.asize = a.asize;
        b.seq = a.seq;
        b.t = a.t;
        b.line = a.line;
        b.seg = a.seg;
        b.api = names.api_name(a.api);
        b.kind = a.kind;
        b.pooled = a.pooled;
        return b;
    }
    // Called before an event changes device d (or at the end): a pending peak snapshot is the
    // state right now, so take it (within budget) before it is lost.
    void settle_peak(dev_state& d, uint64_t line) {
        if (!d.peak_dirty) return;
        d.peak_dirty = false;
        if (!opt.peak_snapshot_seq.empty()) return;  // second pass: snapshots by seq instead
        uint64_t allowance = opt.snapshot_budget_per_event * events_seen + opt.snapshot_budget_fixed;
        if (snapshot_work + snapshot_cost(d) > allowance) {
            d.peak_missing = true;
            return;
        }
        const tracked_bytes& a = d.rep.allocated;
        d.rep.at_peak = snapshot(d, "peak", a.peak_seq, a.peak_t, a.peak_line);
        d.peak_missing = false;
    }
    void settle_all_peaks(uint64_t line) {
        for (auto& [k, d] : devs) settle_peak(d, line);
    }

    // Snapshots that are due before the event (seq, t) is applied: --at and second-pass peaks.
    void take_due_snapshots(const log_event& e, uint64_t line, bool at_end) {
        if (opt.at.kind != moment::by::none && !at_taken) {
            bool due = at_end || (opt.at.kind == moment::by::seq ? e.seq > opt.at.value
                                                                 : e.t > opt.at.value);
            if (due) {
                at_taken = true;
                for (auto& [k, d] : devs) {
                    d.rep.at_request = snapshot(d, "--at", applied_seq, applied_t, applied_line);
                    if (at_end) d.rep.at_request.label = "--at (end of log)";
                }
            }
        }
        for (auto& [k, d] : devs) {
            if (d.second_pass_taken) continue;
            auto it = opt.peak_snapshot_seq.find(k);
            if (it == opt.peak_snapshot_seq.end()) continue;
            if (at_end || e.seq > it->second) {
                d.second_pass_taken = true;
                const tracked_bytes& a = d.rep.allocated;
                d.rep.at_peak = snapshot(d, "peak", a.peak_seq, a.peak_t, a.peak_line);
            }
        }
    }

    void point(dev_state& d, uint64_t t, uint64_t seq) {
        double f = d.frag();
        if (f > d.rep.max_external_fragmentation) {
            d.rep.max_external_fragmentation = f;
            d.rep.max_external_fragmentation_t = t;
            d.rep.max_external_fragmentation_seq = seq;
        }
        d.rep.max_free_blocks = std::max(d.rep.max_free_blocks, d.n_gaps());
        d.timeline.add(t, seq, d.rep.requested.current, d.rep.allocated.current,
                       d.rep.reserved.current, f);
    }

    // ----- event handlers
    void on_alloc(const log_event& e, uint64_t line) {
        dev_state& d = dev(e.dev);
        ++d.rep.n_alloc;
        d.pending_oom = false;
        d.rep.alloc_sizes.add(e.size);
        if (e.ptr == 0) return;  // a zero-byte allocation returns NULL: nothing is held
        live_alloc a{e.size, e.set_aside(), e.seq, e.t, line, e.pooled ? e.seg : 0,
                     e.api, e.dev, e.kind, e.pooled};
        if (e.kind == mem_kind::vmm) {
            auto [old, fresh] = live_vmm.try_emplace(e.ptr, a);
            if (!fresh) {
                inconsistent(line, "allocation handle " + hex(e.ptr) + " is already live (allocated at line " +
                                       std::to_string(old->line) + "; missing release?)");
                release(*old, false, e.t, e.seq);
                *old = a;
            }
        } else {
            if (live_alloc* old = live.find(e.ptr)) {
                inconsistent(line, "allocation at " + hex(e.ptr) + " overlaps a live allocation from line " +
                                       std::to_string(old->line) + " (missing free?)");
                release(*old, false, e.t, e.seq);
                live.erase(e.ptr);
            }
            if (e.pooled) {
                auto* const* found = segment_at.find(e.seg);
                auto* sit = found ? *found : nullptr;
                if (!sit) {
                    inconsistent(line, "pooled block " + hex(e.ptr) + " is in segment " + hex(e.seg) +
                                           ", which no segment_alloc created");
                    a.pooled = false;  // account it like a plain allocation so totals stay right
                    a.seg = 0;
                } else if (!place_block(sit->second, sit->first, e.ptr, a.asize, line)) {
                    a.pooled = false;
                    a.seg = 0;
                }
            }
            live.try_emplace(e.ptr, a);
            freed.erase(e.ptr);
        }
        d.rep.requested.add(a.size, e.t, e.seq, line);
        uint64_t peak_before = d.rep.allocated.peak;
        d.rep.allocated.add(a.asize, e.t, e.seq, line);
        if (!a.pooled) d.rep.reserved.add(a.asize, e.t, e.seq, line);
        if (d.rep.allocated.peak != peak_before) {
            d.peak_dirty = true;
            d.peak_missing = false;
        }
        usage_add(d, a, e.t, e.seq, line);
    }

    bool place_block(seg_state& s, uint64_t base, uint64_t p, uint64_t asz, uint64_t line) {
        dev_state& d = dev(s.dev);
        uint64_t end = base + s.size;
        if (p < base || p > end || asz > end - p) {
            inconsistent(line, "pooled block [" + hex(p) + ", +" + std::to_string(asz) + ") lies outside segment [" +
                                   hex(base) + ", +" + std::to_string(s.size) + ")");
            return false;
        }
        // One tree walk serves the duplicate check, both neighbours and the insertion.
        auto at = s.blocks.lower_bound(p);
        if (at != s.blocks.end() && at->first == p) {
            inconsistent(line, "pooled block " + hex(p) + " is already allocated in segment " + hex(base));
            return false;
        }
        uint64_t prev_end, next_start;
        gap_at(s, base, at, prev_end, next_start);
        if (p < prev_end || p + asz > next_start) {
            inconsistent(line, "pooled block [" + hex(p) + ", +" + std::to_string(asz) +
                                   ") overlaps another live block in segment " + hex(base));
            return false;
        }
        gap_remove(d, next_start - prev_end);
        gap_add(d, p - prev_end);
        gap_add(d, next_start - (p + asz));
        s.blocks.emplace_hint(at, p, asz);
        return true;
    }
    void unplace_block(seg_state& s, uint64_t base, uint64_t p) {
        auto it = s.blocks.find(p);
        if (it == s.blocks.end()) return;
        uint64_t asz = it->second;
        auto after = s.blocks.erase(it);
        dev_state& d = dev(s.dev);
        uint64_t prev_end, next_start;
        gap_at(s, base, after, prev_end, next_start);
        gap_remove(d, p - prev_end);
        gap_remove(d, next_start - (p + asz));
        gap_add(d, next_start - prev_end);
    }

    // Removes an allocation's bytes from its device's totals (a free, or a drop).
    void release(const live_alloc& a, bool counted_free, uint64_t t, uint64_t seq) {
        dev_state& d = dev(a.dev);
        d.rep.requested.sub(a.size);
        d.rep.allocated.sub(a.asize);
        if (!a.pooled) d.rep.reserved.sub(a.asize);
        usage_sub(d, a, counted_free);
    }

    void on_free(const log_event& e, uint64_t line) {
        dev_state& d = dev(e.dev);
        if (e.unknown) {  // recorded by design: the allocation predates gpumem or bypassed it
            ++d.rep.n_free;
            ++d.rep.n_unknown_free;
            return;
        }
        if (e.ptr == 0) {  // cudaFree(NULL) is a legal no-op
            ++d.rep.n_free;
            return;
        }
        auto& m = e.kind == mem_kind::vmm ? live_vmm : live;
        live_alloc* found = m.find(e.ptr);
        if (!found) {
            const char* what = e.kind == mem_kind::vmm ? "handle " : "pointer ";
            if (const uint64_t* f = freed.find(e.ptr))
                inconsistent(line, std::string("double free of ") + what + hex(e.ptr) +
                                       ": it was already freed at line " + std::to_string(*f));
            else
                inconsistent(line, std::string("free of unknown ") + what + hex(e.ptr) +
                                       ": never allocated in this log and not marked \"unknown\":true");
            ++d.rep.n_free;
            return;
        }
        live_alloc a = *found;  // copied: erase moves entries
        m.erase(e.ptr);
        if (a.dev != e.dev && e.dev >= 0)
            warn(line, "free of " + hex(e.ptr) + " on device " + std::to_string(e.dev) +
                           ", allocated on device " + std::to_string(a.dev) + " at line " + std::to_string(a.line));
        if (e.has(fd_size) && e.size != a.size)
            warn(line, "free of " + hex(e.ptr) + " says size " + std::to_string(e.size) + ", allocated with size " +
                           std::to_string(a.size) + " at line " + std::to_string(a.line));
        dev_state& ad = dev(a.dev);
        settle_peak(ad, line);
        if (a.pooled) {
            auto* const* sit = segment_at.find(a.seg);
            if (sit) {
                if (pending_frees(ad)) {
                    // docs/pool.md: a freed block stays in place, neither allocated nor free, until
                    // a pool_sync releases it; counting it as free would misjudge fragmentation.
                    ad.pending.push_back({a.seg, e.ptr});
                    ad.rep.pending.add(a.asize, e.t, e.seq, line);
                } else {
                    unplace_block((*sit)->second, (*sit)->first, e.ptr);
                }
            }
        }
        release(a, true, e.t, e.seq);
        ++ad.rep.n_free;
        // Remember recent frees (bounded) so a second free can be named a double free.
        if (freed.size() >= (size_t(1) << 20)) freed.clear();
        freed.insert_or_assign(e.ptr, line);
        if (&ad != &d) point(ad, e.t, e.seq);
    }

    void on_segment_alloc(const log_event& e, uint64_t line) {
        dev_state& d = dev(e.dev);
        ++d.rep.n_segment_alloc;
        if (e.size == 0) return;
        auto next = segments.lower_bound(e.ptr);
        bool overlap = (next != segments.end() && next->first < e.ptr + e.size);
        if (next != segments.begin()) {
            auto prev = std::prev(next);
            if (prev->first + prev->second.size > e.ptr) overlap = true;
        }
        if (overlap || e.ptr + e.size < e.ptr) {
            inconsistent(line, "segment [" + hex(e.ptr) + ", +" + std::to_string(e.size) +
                                   ") overlaps a segment that is still held");
            return;
        }
        auto added = segments.emplace(e.ptr, seg_state{e.size, e.dev, e.pool, {}}).first;
        segment_at.insert_or_assign(e.ptr, &*added);
        gap_add(d, e.size);
        d.segment_bytes += e.size;
        d.rep.reserved.add(e.size, e.t, e.seq, line);
        d.rep.segment_count.add(1, e.t, e.seq, line);
    }

    void on_segment_free(const log_event& e, uint64_t line) {
        dev_state& d = dev(e.dev);
        ++d.rep.n_segment_free;
        auto it = segments.find(e.ptr);
        if (it == segments.end()) {
            if (e.size) inconsistent(line, "segment_free of " + hex(e.ptr) + ", which is not a held segment");
            return;
        }
        seg_state& s = it->second;
        dev_state& sd = dev(s.dev);
        settle_peak(sd, line);
        drop_pending_in(sd, it->first);
        if (!s.blocks.empty()) {
            size_t n_live = 0;
            for (const auto& [p, a] : s.blocks) {
                if (const live_alloc* l = live.find(p)) {
                    release(*l, false, e.t, e.seq);
                    live.erase(p);
                    ++n_live;
                }
            }
            warn(line, "segment " + hex(e.ptr) + " returned to the driver with " + std::to_string(n_live) +
                           " live and " + std::to_string(s.blocks.size() - n_live) + " pending block(s); they are dropped");
            // Rebuild the segment as one free gap before removing it.
            uint64_t cur = it->first;
            for (const auto& [p, a] : s.blocks) {
                gap_remove(sd, p - cur);
                cur = p + a;
            }
            gap_remove(sd, it->first + s.size - cur);
            gap_add(sd, s.size);
        }
        gap_remove(sd, s.size);
        sd.segment_bytes -= s.size;
        sd.rep.reserved.sub(s.size);
        sd.rep.segment_count.sub(1);
        segment_at.erase(it->first);
        segments.erase(it);
        if (&sd != &d) point(sd, e.t, e.seq);
    }

    void on_oom(const log_event& e, uint64_t line, bool from_pool) {
        dev_state& d = dev(e.dev);
        if (!from_pool) {
            ++d.rep.n_alloc_fail;
            // CUDA_ERROR_OUT_OF_MEMORY and cudaErrorMemoryAllocation are both 2.
            if (!e.has(fd_err) || e.err != 2) return;
            if (d.pending_oom && d.pending_oom_size == e.size) {
                // The pool's "oom" already stands for this failure; attach the call's error.
                d.pending_oom = false;
                if (!d.rep.ooms.empty()) d.rep.ooms.back().err = e.err;
                return;
            }
        }
        ++d.rep.n_oom;
        oom_report o;
        o.seq = e.seq;
        o.t = e.t;
        o.line = line;
        o.size = e.size;
        o.api = e.has(fd_api) ? names.api_name(e.api) : "";
        o.from_pool = from_pool;
        o.err = from_pool ? 0 : e.err;
        o.free_in_segments = d.free_total();
        o.largest_free = d.largest_free();
        o.reserved = d.rep.reserved.current;
        o.allocated = d.rep.allocated.current;
        o.gpu_free = e.has(fd_gpu_free) ? e.gpu_free : 0;
        o.gpu_total = e.has(fd_gpu_total) ? e.gpu_total : 0;
        uint64_t available = o.free_in_segments + o.gpu_free;
        uint64_t biggest = std::max(o.largest_free, o.gpu_free);
        if (o.size > available) {
            o.verdict = "capacity";
            o.explanation = "the request is larger than all free memory together (free in segments + free on the GPU)";
        } else {
            o.verdict = "fragmentation";
            o.explanation = biggest >= o.size
                ? "enough free memory exists, and a free block is large enough, yet the request failed (pool size class or limit)"
                : "enough free memory exists in total, but no single free block is large enough";
        }
        if (d.rep.ooms.size() < k_max_oom_maps) {
            settle_peak(d, line);
            o.map = snapshot(d, "oom #" + std::to_string(d.rep.n_oom), e.seq, e.t, line);
        }
        if (from_pool) {
            d.pending_oom = true;
            d.pending_oom_size = e.size;
        }
        if (d.rep.ooms.size() < 1000) d.rep.ooms.push_back(std::move(o));
    }

    // Every pending block of the device becomes free and merges with its free neighbours.
    void on_pool_sync(dev_state& d, const log_event& e, uint64_t line) {
        ++d.rep.n_pool_sync;
        if (e.has(fd_count) && pending_frees(d) && e.count != d.pending.size() && !lenient)
            warn(line, "pool_sync releases " + std::to_string(e.count) + " frees; the reconstruction has " +
                           std::to_string(d.pending.size()) + " pending");
        for (const auto& [seg, ptr] : d.pending) {
            if (auto* const* sit = segment_at.find(seg)) unplace_block((*sit)->second, (*sit)->first, ptr);
        }
        d.pending.clear();
        d.rep.pending.current = 0;
    }

    // "auto": from this event on the device's pooled frees pend until a pool_sync.  The pool logs
    // it once per device (a second one, or one in a log not in auto mode, changes nothing), then
    // usually a pool_sync with count 0 (the drain), which the per-device count check covers.
    void on_reuse_safe(dev_state& d, const log_event& e, uint64_t line) {
        std::string api = names.api_name(e.api);
        if (pending_rule() != pend_rule::after_reuse_safe) {
            std::string why = rep.pool_mode == "off" ? std::string(" in a log with the pool off")
                              : " in a log whose config.reuse is " +
                                    (rep.reuse_mode.empty() ? std::string("absent (safe)") : "\"" + rep.reuse_mode + "\"") +
                                    ", not \"auto\"";
            warn(line, "reuse_safe (" + api + ") on device " + std::to_string(d.rep.dev) + why + "; ignored");
            return;
        }
        if (d.rep.reuse_safe) {
            warn(line, "reuse_safe (" + api + ") on device " + std::to_string(d.rep.dev) +
                           ", which is in safe reuse since seq " + std::to_string(d.rep.reuse_safe_seq) +
                           " (line " + std::to_string(d.rep.reuse_safe_line) + "); ignored");
            return;
        }
        d.rep.reuse_safe = true;
        d.rep.reuse_safe_seq = e.seq;
        d.rep.reuse_safe_t = e.t;
        d.rep.reuse_safe_line = line;
        d.rep.reuse_safe_api = std::move(api);
    }

    // Pending blocks inside [base, base+size) are forgotten (their segment is going away).
    void drop_pending_in(dev_state& d, uint64_t base) {
        auto& v = d.pending;
        for (auto it = v.begin(); it != v.end();) {
            if (it->first == base) {
                auto sit = segments.find(base);
                if (sit != segments.end()) {
                    auto b = sit->second.blocks.find(it->second);
                    if (b != sit->second.blocks.end()) d.rep.pending.sub(b->second);
                }
                it = v.erase(it);
            } else {
                ++it;
            }
        }
    }

    void on_stats(const log_event& e, uint64_t line) {
        dev_state& d = dev(e.dev);
        // The pool's own account of reserved bytes and segments must match the reconstruction;
        // a difference means events are missing or the recorder and analyzer disagree.
        bool seg_ok = !e.has(fd_segments) || e.segments == d.rep.segment_count.current;
        bool res_ok = !e.has(fd_reserved) || e.reserved == d.segment_bytes;
        if ((!seg_ok || !res_ok) && stats_mismatch_warnings++ < 3)
            warn(line, "the pool reports " + std::to_string(e.reserved) + " bytes reserved in " +
                           std::to_string(e.segments) + " segments; the reconstruction has " +
                           std::to_string(d.segment_bytes) + " in " +
                           std::to_string(d.rep.segment_count.current));
    }

    void drop_device_state(int only_dev, uint64_t line, const log_event& e) {
        for (auto& [k, d] : devs)
            if (only_dev < 0 || k == only_dev) settle_peak(d, line);
        std::vector<uint64_t> dropped;  // erased after the walk: erase moves entries
        for (const auto& [ptr, a] : live)
            if (only_dev < 0 ? a.pooled : a.dev == only_dev) {
                release(a, false, e.t, e.seq);
                dropped.push_back(ptr);
            }
        for (uint64_t ptr : dropped) live.erase(ptr);
        for (auto it = segments.begin(); it != segments.end();) {
            if (only_dev < 0 || it->second.dev == only_dev) {
                dev_state& d = dev(it->second.dev);
                d.segment_bytes -= it->second.size;
                d.rep.reserved.sub(it->second.size);
                d.rep.segment_count.sub(1);
                segment_at.erase(it->first);
                it = segments.erase(it);
            } else {
                ++it;
            }
        }
        for (auto& [k, d] : devs)
            if (only_dev < 0 || k == only_dev) {
                d.pending.clear();
                d.rep.pending.current = 0;
                // Segments are gone; recompute gaps from what remains on the device.
                d.gaps.clear();
                for (const auto& [base, s] : segments)
                    if (s.dev == k) {
                        uint64_t cur = base;
                        for (const auto& [p, a] : s.blocks) {
                            gap_add(d, p - cur);
                            cur = p + a;
                        }
                        gap_add(d, base + s.size - cur);
                    }
                point(d, e.t, e.seq);
            }
    }

    void apply(const log_event& e, uint64_t line) {
        ++events_seen;
        ++rep.events;
        if (!e.known_kind) {
            // A kind from a newer recorder: skipped by the version policy, but its seq still counts.
            ++rep.skipped_unknown;
            if (e.has(fd_seq)) check_seq(e, line);
            return;
        }
        if (e.has(fd_seq)) check_seq(e, line);  // every kind but "lost" has one
        if (after_end) warn(line, "event after the end line");
        if (e.has(fd_t)) rep.last_t = std::max(rep.last_t, e.t);
        apply_known(e, line);
    }

    void check_seq(const log_event& e, uint64_t line) {
        // Order: seq must grow by exactly one per event.
        if (have_seq) {
            if (e.seq <= last_seq)
                fail(line, "events out of order: seq " + std::to_string(e.seq) + " follows seq " +
                               std::to_string(last_seq) + " (the file must be in seq order)");
            if (e.seq != last_seq + 1) {
                warn(line, "seq jumps from " + std::to_string(last_seq) + " to " + std::to_string(e.seq) + ": " +
                               std::to_string(e.seq - last_seq - 1) + " event(s) missing");
                lenient = true;
            }
        } else {
            if (e.seq != 0) {
                warn(line, "the first event has seq " + std::to_string(e.seq) + ", not 0: earlier events are missing");
                lenient = true;
            }
            rep.first_t = e.t;
        }
        have_seq = true;
        last_seq = e.seq;
    }

    void apply_known(const log_event& e, uint64_t line) {
        take_due_snapshots(e, line, false);

        bool has_dev = e.has(fd_dev);
        dev_state* d = nullptr;
        if (has_dev) {
            d = &dev(e.dev);
            if (!d->seen) {
                d->seen = true;
                d->rep.first_t = e.t;
            }
            d->rep.last_t = std::max(d->rep.last_t, e.t);
            // A pending peak snapshot must be taken before anything but a growth changes the state
            // (reuse_safe changes no block, only what later frees do).
            if (e.ev != ev_kind::alloc && e.ev != ev_kind::stats && e.ev != ev_kind::oom &&
                e.ev != ev_kind::alloc_fail && e.ev != ev_kind::reuse_safe)
                settle_peak(*d, line);
        }

        switch (e.ev) {
        case ev_kind::header: fail(line, "a second header line: two logs concatenated into one file?");
        case ev_kind::alloc: on_alloc(e, line); break;
        case ev_kind::free: on_free(e, line); break;
        case ev_kind::alloc_fail: on_oom(e, line, false); break;
        case ev_kind::free_fail:
            if (d) ++d->rep.n_free_fail;
            else ++dev(-1).rep.n_free_fail;
            break;
        case ev_kind::map: {
            // The recorder writes dev; older or other writers may not, then the handle tells.
            int md = has_dev ? e.dev : -1;
            const live_alloc* h = live_vmm.find(e.handle);
            if (!has_dev && h) md = h->dev;
            dev_state& x = dev(md);
            ++x.rep.n_map;
            x.rep.mapped.add(e.size, e.t, e.seq, line);
            maps[e.ptr] = mapping{e.size, md};
            break;
        }
        case ev_kind::unmap: {
            auto m = maps.find(e.ptr);
            if (m == maps.end()) {
                warn(line, "unmap of " + hex(e.ptr) + ", which no map event mapped");
                ++dev(-1).rep.n_unmap;
                break;
            }
            dev_state& x = dev(m->second.dev);
            ++x.rep.n_unmap;
            x.rep.mapped.sub(m->second.size);
            maps.erase(m);
            break;
        }
        case ev_kind::reserve:
            ++rep.n_reserve;
            rep.va_reserved.add(e.size, e.t, e.seq, line);
            va_ranges[e.ptr] = e.size;
            break;
        case ev_kind::unreserve: {
            ++rep.n_unreserve;
            auto r = va_ranges.find(e.ptr);
            if (r == va_ranges.end()) {
                warn(line, "unreserve of " + hex(e.ptr) + ", which no reserve event reserved");
                break;
            }
            rep.va_reserved.sub(r->second);
            va_ranges.erase(r);
            break;
        }
        case ev_kind::segment_alloc: on_segment_alloc(e, line); break;
        case ev_kind::segment_free: on_segment_free(e, line); break;
        case ev_kind::oom: on_oom(e, line, true); break;
        case ev_kind::stats: on_stats(e, line); break;
        case ev_kind::pool_sync:
            ++rep.n_pool_sync;
            if (d) on_pool_sync(*d, e, line);
            break;
        case ev_kind::context_reset:
            // The reuse mode survives: the pool object lives on (docs/pool.md), and so does its mode.
            ++rep.n_context_reset;
            drop_device_state(has_dev ? e.dev : -1, line, e);
            break;
        case ev_kind::reuse_safe:
            if (d) on_reuse_safe(*d, e, line);  // dev is a required member
            break;
        case ev_kind::lost:
            rep.lost += e.count;
            lenient = true;
            warn(line, std::to_string(e.count) + " event(s) were lost by the recorder; totals may be off");
            break;
        case ev_kind::end:
            after_end = true;
            rep.has_end = true;
            rep.end_reason = e.reason;
            rep.end_signal = e.signal;
            rep.end_events = e.events;
            rep.end_n_alloc = e.n_alloc;
            rep.end_n_free = e.n_free;
            rep.end_n_fail = e.n_fail;
            rep.end_live_allocs = e.live_allocs;
            rep.end_live_bytes = e.live_bytes;
            rep.end_lost = e.lost;
            rep.end_unmatched = e.unmatched;
            if (e.has(fd_events) && e.events != rep.events - 1)
                warn(line, "the end line counts " + std::to_string(e.events) + " events; the log has " +
                               std::to_string(rep.events - 1));
            break;
        case ev_kind::stack:  // analyze.cc keeps stack records away from the rebuild
        case ev_kind::count_: break;
        }
        if (d && e.ev != ev_kind::stats && e.ev != ev_kind::end) point(*d, e.t, e.seq);
        applied_seq = e.seq;
        applied_t = e.t;
        applied_line = line;
    }

    void finish(uint64_t last_line) {
        log_event none;
        take_due_snapshots(none, last_line + 1, true);
        settle_all_peaks(last_line);
        // Leaks: whatever is still live when the log ends.
        std::map<int, std::vector<const u64_map<live_alloc>::entry*>> by_dev;
        for (const auto* m : {&live, &live_vmm})
            for (const auto& kv : *m) by_dev[kv.second.dev].push_back(&kv);
        for (auto& [k, v] : by_dev) {
            dev_state& d = dev(k);
            d.rep.n_leaks = v.size();
            for (auto* p : v) d.rep.leaked_bytes += p->second.size;
            size_t n = std::min(v.size(), opt.max_listed_leaks);
            std::partial_sort(v.begin(), v.begin() + ptrdiff_t(n), v.end(), [](auto* a, auto* b) {
                return a->second.size != b->second.size ? a->second.size > b->second.size
                                                        : a->second.seq < b->second.seq;
            });
            for (size_t i = 0; i < n; ++i) d.rep.leaks.push_back(view(v[i]->first, v[i]->second));
        }
        if (rep.has_end && !lenient) {
            uint64_t n_live = live.size() + live_vmm.size();
            // The recorder counts live allocations itself; NULL results of 0-byte calls excepted.
            if (rep.end_live_allocs != n_live)
                warn(0, "the end line reports " + std::to_string(rep.end_live_allocs) +
                            " live allocations; the reconstruction has " + std::to_string(n_live));
        }
        rep.devices.clear();
        for (auto& [k, d] : devs) {
            const device_report& r = d.rep;
            // A device only named by a free of dev -1 or similar, with nothing of its own, is noise.
            if (r.n_alloc + r.n_free + r.n_alloc_fail + r.n_free_fail + r.n_segment_alloc + r.n_map +
                    r.n_unmap + r.n_oom + r.n_leaks == 0)
                continue;
            d.rep.end_free_in_segments = d.free_total();
            d.rep.end_largest_free = d.largest_free();
            d.rep.end_free_blocks = d.n_gaps();
            d.rep.end_external_fragmentation = d.frag();
            d.rep.timeline = d.timeline.pts;
            d.rep.timeline_events_per_point = d.timeline.per_point;
            for (size_t i = 0; i < d.by_api.size(); ++i)
                if (d.by_api[i].n_alloc) {
                    d.by_api[i].name = names.api_name(uint16_t(i));
                    d.rep.by_api.push_back(d.by_api[i]);
                }
            std::sort(d.rep.by_api.begin(), d.rep.by_api.end(),
                      [](const usage_row& a, const usage_row& b) { return a.bytes.peak > b.bytes.peak; });
            for (const usage_row& r : d.by_kind)
                if (r.n_alloc) d.rep.by_kind.push_back(r);
            rep.devices.push_back(d.rep);
        }
    }
};

replayer::replayer(process_report& report, const line_parser& names, replay_options options)
    : impl_(std::make_unique<impl>(report, names, std::move(options))) {}
replayer::~replayer() = default;
void replayer::apply(const log_event& e, uint64_t line) { impl_->apply(e, line); }
void replayer::finish(uint64_t last_line) { impl_->finish(last_line); }
void replayer::warn(uint64_t line, const std::string& message) { impl_->warn(line, message); }
bool replayer::needs_second_pass() const {
    for (const auto& [k, d] : impl_->devs)
        if (d.peak_missing) return true;
    return false;
}
std::map<int, uint64_t> replayer::peak_seqs() const {
    std::map<int, uint64_t> m;
    for (const auto& [k, d] : impl_->devs)
        if (d.peak_missing) m[k] = d.rep.allocated.peak_seq;
    return m;
}
std::map<int, state_snapshot> replayer::take_peak_snapshots() {
    std::map<int, state_snapshot> m;
    for (auto& [k, d] : impl_->devs)
        if (d.second_pass_taken) m[k] = d.rep.at_peak;
    return m;
}

}  // namespace gpumem::analysis
