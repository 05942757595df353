// Rebuilds each segment's block layout from the pool's events alone, as the analyzer must: shared by the pool's property tests.
//
// Pending blocks are kept in free order; a pool_sync with `fence` releases the oldest `count`,
// one without releases every pending block and must count them all (docs/log-format.md,
// pool_sync).  `error` names the first event the layout cannot take.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "pool_test_util.h"

namespace gpumem::test {

struct layout_replayer {
    enum st { free_b, alloc_b, pending_b, unmapped_b };
    struct blk {
        uint64_t size;
        st state;
    };
    std::map<uint64_t, std::map<uint64_t, blk>> segs;
    std::vector<std::pair<uint64_t, uint64_t>> pending;  // seg, ptr in free order
    size_t next = 0;
    bool immediate = false;
    std::string error;
    static void merge_at(std::map<uint64_t, blk>& m, std::map<uint64_t, blk>::iterator it) {
        if (it != m.begin()) {
            auto pr = std::prev(it);
            if (pr->second.state == free_b && pr->first + pr->second.size == it->first) {
                pr->second.size += it->second.size;
                m.erase(it);
                it = pr;
            }
        }
        auto nx = std::next(it);
        if (nx != m.end() && nx->second.state == free_b && it->first + it->second.size == nx->first) {
            it->second.size += nx->second.size;
            m.erase(nx);
        }
    }
    void apply(const event& e) {
        if (!error.empty()) return;
        std::ostringstream o;
        o << "event " << e.seq << " kind " << int(e.ev) << ": ";
        switch (e.ev) {
            case ev_kind::segment_alloc: {
                // An arena segment maps its first asize bytes (0: not written, all of it); the
                // rest starts unmapped.
                const uint64_t mapped = e.b.asize ? e.b.asize : e.b.size;
                if (mapped > e.b.size) {
                    error = o.str() + "segment_alloc maps more than its size";
                    return;
                }
                seg_pool[e.b.ptr] = e.pool;
                auto& m = segs[e.b.ptr];
                if (!m.empty()) error = o.str() + "segment_alloc over a live segment";
                m[e.b.ptr] = {mapped, free_b};
                if (mapped < e.b.size) m[e.b.ptr + mapped] = {e.b.size - mapped, unmapped_b};
                break;
            }
            case ev_kind::segment_free: {
                auto& m = segs[e.b.ptr];
                uint64_t total = 0;
                for (auto& [a, b] : m) {
                    if (b.state != free_b && b.state != unmapped_b) error = o.str() + "segment_free with live/pending blocks";
                    total += b.size;
                }
                if (total != e.b.size) error = o.str() + "segment_free size differs";
                segs.erase(e.b.ptr);
                seg_pool.erase(e.b.ptr);
                break;
            }
            case ev_kind::segment_unmap: {
                auto& m = segs[e.b.seg];
                auto it = m.upper_bound(e.b.ptr);
                if (it == m.begin()) {
                    error = o.str() + "segment_unmap outside every block";
                    return;
                }
                --it;
                const uint64_t a = it->first, end = a + it->second.size;
                if (it->second.state != free_b || e.b.ptr + e.b.size > end) {
                    error = o.str() + "segment_unmap of bytes that are not free";
                    return;
                }
                if (a < e.b.ptr) it->second.size = e.b.ptr - a;
                m[e.b.ptr] = {e.b.size, unmapped_b};
                if (e.b.ptr + e.b.size < end) m[e.b.ptr + e.b.size] = {end - e.b.ptr - e.b.size, free_b};
                // touching unmapped ranges: merge for simplicity
                break;
            }
            case ev_kind::segment_map: {
                auto s = segs.find(e.b.seg);
                if (s == segs.end() || e.b.size == 0) {
                    error = o.str() + "segment_map outside every segment";
                    return;
                }
                auto& m = s->second;
                const uint64_t p = e.b.ptr, q = e.b.ptr + e.b.size;
                auto it = m.upper_bound(p);
                if (it == m.begin()) {
                    error = o.str() + "segment_map outside every block";
                    return;
                }
                --it;
                const auto first = it;
                for (uint64_t cur = p; cur < q; ++it) {
                    if (it == m.end() || it->first > cur || it->second.state != unmapped_b || it->first + it->second.size <= cur) {
                        error = o.str() + "segment_map of bytes that are not unmapped";
                        return;
                    }
                    cur = it->first + it->second.size;
                }
                const uint64_t h0 = first->first, h1 = std::prev(it)->first + std::prev(it)->second.size;
                m.erase(first, it);
                if (h0 < p) m[h0] = {p - h0, unmapped_b};
                if (q < h1) m[q] = {h1 - q, unmapped_b};
                merge_at(m, m.emplace(p, blk{e.b.size, free_b}).first);
                break;
            }
            case ev_kind::alloc: {
                auto& m = segs[e.b.seg];
                auto it = m.find(e.b.ptr);
                if (it == m.end() || it->second.state != free_b || it->second.size < e.b.asize) {
                    error = o.str() + "alloc not at the start of a large enough free block";
                    return;
                }
                if (it->second.size > e.b.asize) m[e.b.ptr + e.b.asize] = {it->second.size - e.b.asize, free_b};
                it->second = {e.b.asize, alloc_b};
                break;
            }
            case ev_kind::free: {
                auto& m = segs[e.b.seg];
                auto it = m.find(e.b.ptr);
                if (it == m.end() || it->second.state != alloc_b || it->second.size != e.b.asize) {
                    error = o.str() + "free of a block that is not allocated";
                    return;
                }
                if (immediate) {
                    it->second.state = free_b;
                    merge_at(m, it);
                    break;
                }
                it->second.state = pending_b;
                pending.emplace_back(e.b.seg, e.b.ptr);
                break;
            }
            case ev_kind::pool_sync: {
                const bool fence = (e.flags & ef_fence) != 0;
                size_t n = fence ? e.c.count : pending.size();
                if (!fence && e.c.count != pending.size()) {
                    error = o.str() + "unfenced pool_sync count " + std::to_string(e.c.count) + " != pending " +
                            std::to_string(pending.size());
                    return;
                }
                if (n > pending.size()) {
                    error = o.str() + "pool_sync releases more than pending";
                    return;
                }
                for (size_t k = 0; k < n; ++k) {
                    auto& m = segs[pending[k].first];
                    auto it = m.find(pending[k].second);
                    if (it == m.end() || it->second.state != pending_b) {
                        error = o.str() + "pool_sync of a block not pending";
                        return;
                    }
                    it->second.state = free_b;
                    merge_at(m, it);
                }
                pending.erase(pending.begin(), pending.begin() + ptrdiff_t(n));
                break;
            }
            case ev_kind::reuse_safe: immediate = false; break;
            case ev_kind::context_reset:
                segs.clear();
                seg_pool.clear();
                pending.clear();
                break;
            default: break;
        }
    }
    void catch_up(recording_sink& s) {
        for (; next < s.events.size(); ++next) apply(s.events[next]);
    }
    pool_state state() const {
        pool_state p{};
        for (auto& [base, m] : segs) {
            ++p.segments;
            for (auto& [a, b] : m) {
                if (b.state != unmapped_b) p.reserved += b.size;
                if (b.state == alloc_b) p.allocated += b.size;
                if (b.state == free_b) ++p.free_blocks, p.largest_free = std::max(p.largest_free, b.size);
            }
        }
        return p;
    }
    // The fewest bytes a request of asize bytes in pool p needs mapped at one hole of that pool,
    // joined to the free block before it (the hole's front), after it (its back) or both (all of
    // it); UINT64_MAX when no hole and its neighbours fit asize.  (Not for stitching: the log shows
    // a lender's range as unmapped, the pool as lent.)
    uint64_t fewest_hole_bytes(pool_id p, uint64_t asize, uint64_t chunk) const {
        auto up = [chunk](uint64_t v) { return (v + chunk - 1) / chunk * chunk; };
        uint64_t best = UINT64_MAX;
        for (auto& [base, m] : segs) {
            auto sp = seg_pool.find(base);
            if (sp == seg_pool.end() || sp->second != p) continue;
            for (auto it = m.begin(); it != m.end(); ++it) {
                if (it->second.state != unmapped_b) continue;
                const uint64_t h = it->second.size;
                uint64_t before = 0, after = 0;
                if (it != m.begin()) {
                    auto pr = std::prev(it);
                    if (pr->second.state == free_b && pr->first + pr->second.size == it->first) before = pr->second.size;
                }
                if (auto nx = std::next(it); nx != m.end() && nx->second.state == free_b && it->first + h == nx->first)
                    after = nx->second.size;
                if (before + h >= asize) best = std::min(best, std::max(chunk, up(asize - std::min(asize, before))));
                if (h + after >= asize) best = std::min(best, std::max(chunk, up(asize - std::min(asize, after))));
                if (before + h + after >= asize) best = std::min(best, h);
            }
        }
        return best;
    }
    std::map<uint64_t, pool_id> seg_pool;  // seg base -> its pool
};

}  // namespace gpumem::test
