// The address-space model: how each event changes segments, blocks, gaps and live allocations.
#include "model/address_space.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "log_reader.h"
#include "log_fields.h"

namespace gpumem::analysis {

std::string hex(uint64_t v) {
    char b[24];
    std::snprintf(b, sizeof b, "0x%" PRIx64, v);
    return b;
}

device_state& address_space::add_device(int d) {
    device_state& s = devs_[d];
    s.dev = d;
    s.rep.dev = d;
    s.slot = uint32_t(devs_.size() - 1);
    last_dev_index_ = d;
    last_dev_ = &s;
    obs_.new_device(s);
    return s;
}

address_space::pend_rule address_space::pending_rule() {
    if (rule_ == pend_rule::unknown) {
        if (proc_.pool_mode == config_value::pool_off || proc_.reuse_mode == config_value::reuse_immediate) rule_ = pend_rule::never;
        else if (proc_.reuse_mode == config_value::reuse_auto) rule_ = pend_rule::after_reuse_safe;
        else rule_ = pend_rule::always;  // "safe", or absent (a log from before auto); read_header refuses others
    }
    return rule_;
}

// "auto" switches each pool on its own reuse_safe event.
bool address_space::pends(const pool_part& p) {
    switch (pending_rule()) {
    case pend_rule::never: return false;
    case pend_rule::after_reuse_safe: return p.reuse_safe;
    default: return true;
    }
}

void address_space::apply(const log_event& e, uint64_t line) {
    bool has_dev = e.has(fd_dev);
    // A map is on its handle's device.  The recorder writes it; logs before 2026-12-06 wrote -1,
    // and other writers may write none: then the handle tells.
    int map_dev = -1;
    if (e.ev == ev_kind::map) {
        map_dev = has_dev ? e.dev : -1;
        if (const live_alloc* h = map_dev < 0 ? live_vmm_.find(e.handle) : nullptr) map_dev = h->dev;
    }
    device_state* d = e.ev == ev_kind::map ? &dev(map_dev) : has_dev ? &dev(e.dev) : nullptr;
    event_dev_ = d;
    // A pending peak snapshot must be taken before anything but a growth changes the state
    // (reuse_safe changes no block, only what later frees do).
    if (d && e.ev != ev_kind::alloc && e.ev != ev_kind::stats && e.ev != ev_kind::oom &&
        e.ev != ev_kind::alloc_fail && e.ev != ev_kind::reuse_safe)
        obs_.before_change(*d);

    switch (e.ev) {
    case ev_kind::alloc: on_alloc(e, line); break;
    case ev_kind::free: on_free(e, line); break;
    case ev_kind::map:
        maps_[e.ptr] = mapping{e.size, map_dev};
        obs_.mapped(dev(map_dev), e, line);
        break;
    case ev_kind::unmap: {
        auto m = maps_.find(e.ptr);
        if (m == maps_.end()) {
            checks_.warn(line, "unmap of " + hex(e.ptr) + ", which no map event mapped");
            obs_.unmapped(dev(-1), 0);
            break;
        }
        mapping gone = m->second;
        maps_.erase(m);
        obs_.unmapped(dev(gone.dev), gone.size);
        break;
    }
    case ev_kind::reserve:
        va_ranges_[e.ptr] = e.size;
        obs_.va_reserved(e, line);
        break;
    case ev_kind::unreserve: {
        auto r = va_ranges_.find(e.ptr);
        if (r == va_ranges_.end()) {
            obs_.va_released(0);
            checks_.warn(line, "unreserve of " + hex(e.ptr) + ", which no reserve event reserved");
            break;
        }
        uint64_t size = r->second;
        va_ranges_.erase(r);
        obs_.va_released(size);
        break;
    }
    case ev_kind::segment_alloc: on_segment_alloc(e, line); break;
    case ev_kind::segment_free: on_segment_free(e, line); break;
    case ev_kind::segment_unmap:
        if (d) on_segment_unmap(*d, e, line);  // dev is a required member
        break;
    case ev_kind::segment_map:
        if (d) on_segment_map(*d, e, line);  // dev is a required member
        break;
    case ev_kind::pool_sync:
        if (d) on_pool_sync(*d, e, line);
        break;
    case ev_kind::context_reset:
        // The reuse mode survives: the pool object lives on (docs/pool.md), and so does its mode.
        drop_device_state(has_dev ? e.dev : -1, e);
        break;
    case ev_kind::reuse_safe:
        if (d) on_reuse_safe(*d, e, line);  // dev is a required member
        break;
    default: break;  // the rest change no memory: the metrics and checks read them
    }
}

void address_space::on_alloc(const log_event& e, uint64_t line) {
    device_state& d = dev(e.dev);
    if (e.ptr == 0) return;  // a zero-byte allocation returns NULL: nothing is held
    live_alloc a{e.size, e.set_aside(), e.seq, e.t, line, e.pooled ? e.seg : 0,
                 e.api, e.dev, e.kind, e.pooled, e.has(fd_stream), uint32_t(std::min<uint64_t>(e.ctx, UINT32_MAX))};
    if (a.asize < a.size) {
        // What is set aside holds at least what was asked for (a pool's block, a pitched row's
        // padding): less would put allocated below requested and print a negative rounding.
        checks_.inconsistent(line, "allocation at " + hex(e.ptr) + " of " + std::to_string(e.size) + " bytes sets aside " +
                                       std::to_string(a.asize) + " (asize below size)");
        a.asize = a.size;  // lenient (a log missing events): taken as exactly its size
    }
    if (e.kind == mem_kind::vmm) {
        auto [old, fresh] = live_vmm_.try_emplace(e.ptr, a);
        if (!fresh) {
            checks_.inconsistent(line, "allocation handle " + hex(e.ptr) + " is already live (allocated at line " +
                                           std::to_string(old->line) + "; missing release?)");
            release(*old, false);
            *old = a;
        }
    } else {
        if (live_alloc* old = live_.find(e.ptr)) {
            checks_.inconsistent(line, "allocation at " + hex(e.ptr) + " overlaps a live allocation from line " +
                                           std::to_string(old->line) + " (missing free?)");
            live_alloc gone = *old;  // copied: erase moves entries
            live_.erase(e.ptr);
            if (!gone.pooled) plain_ranges_.erase(e.ptr);
            release(gone, false);
        }
        if (e.pooled) {
            auto* const* found = segment_at_.find(e.seg);
            auto* sit = found ? *found : nullptr;
            if (!sit) {
                checks_.inconsistent(line, "pooled block " + hex(e.ptr) + " is in segment " + hex(e.seg) +
                                               ", which no segment_alloc created");
                a.pooled = false;  // account it like a plain allocation so totals stay right
                a.seg = 0;
            } else if (sit->second.dev != e.dev) {
                // Its bytes would count on one device and its block on the other's map.
                checks_.inconsistent(line, "pooled block " + hex(e.ptr) + " on dev " + std::to_string(e.dev) +
                                               " is in segment " + hex(e.seg) + " of dev " +
                                               std::to_string(sit->second.dev));
                a.pooled = false;
                a.seg = 0;
            } else if (!place_block(sit->second, sit->first, e.ptr, a.asize, line)) {
                a.pooled = false;
                a.seg = 0;
            }
        }
        if (!a.pooled) check_plain_overlap(e, line);
        live_.try_emplace(e.ptr, a);
    }
    obs_.placed(d, e, a, line);
}

// Two live allocations cannot share an address: a range that overlaps another one's means events
// are missing or the log was edited.  Only a warning: the totals stay right either way.
void address_space::check_plain_overlap(const log_event& e, uint64_t line) {
    if (e.size == 0) return;
    uint64_t end = e.ptr + e.size < e.ptr ? UINT64_MAX : e.ptr + e.size;
    auto next = plain_ranges_.lower_bound(e.ptr);
    const live_alloc* other = nullptr;
    uint64_t other_ptr = 0;
    if (next != plain_ranges_.end() && next->first < end) other_ptr = next->first;
    else if (next != plain_ranges_.begin() && std::prev(next)->second > e.ptr) other_ptr = std::prev(next)->first;
    if (other_ptr) other = live_.find(other_ptr);
    if (other)
        checks_.warn(line, "allocation [" + hex(e.ptr) + ", +" + std::to_string(e.size) + ") overlaps the live allocation [" +
                               hex(other_ptr) + ", +" + std::to_string(other->size) + ") from line " +
                               std::to_string(other->line));
    plain_ranges_.insert_or_assign(e.ptr, end);
}

bool address_space::place_block(segment& s, uint64_t base, uint64_t p, uint64_t asz, uint64_t line) {
    gap_set& gaps = s.part->gaps;
    uint64_t end = base + s.size;
    if (p < base || p > end || asz > end - p) {
        checks_.inconsistent(line, "pooled block [" + hex(p) + ", +" + std::to_string(asz) + ") lies outside segment [" +
                                       hex(base) + ", +" + std::to_string(s.size) + ")");
        return false;
    }
    // One tree walk serves the duplicate check, both neighbours and the insertion.
    auto at = s.blocks.lower_bound(p);
    if (at != s.blocks.end() && at->first == p) {
        if (s.holes.count(p)) {
            checks_.inconsistent(line, "pooled block [" + hex(p) + ", +" + std::to_string(asz) + ") overlaps " +
                                           occupant(s, base, p) + " in segment " + hex(base));
            return false;
        }
        checks_.inconsistent(line, "pooled block " + hex(p) + " is already allocated in segment " + hex(base));
        return false;
    }
    uint64_t next_start = at == s.blocks.end() ? base + s.size : at->first;
    uint64_t prev_end = at == s.blocks.begin() ? base : std::prev(at)->first + std::prev(at)->second;
    if (p < prev_end || p + asz > next_start) {
        uint64_t other = p < prev_end ? std::prev(at)->first : at->first;
        checks_.inconsistent(line, "pooled block [" + hex(p) + ", +" + std::to_string(asz) + ") overlaps " +
                                       occupant(s, base, other) + " in segment " + hex(base));
        return false;
    }
    gaps.remove(next_start - prev_end);
    gaps.add(p - prev_end);
    gaps.add(next_start - (p + asz));
    s.blocks.emplace_hint(at, p, asz);
    return true;
}

void address_space::unplace_block(segment& s, uint64_t base, uint64_t p) {
    auto it = s.blocks.find(p);
    if (it == s.blocks.end()) return;
    uint64_t asz = it->second;
    auto after = s.blocks.erase(it);
    gap_set& gaps = s.part->gaps;
    uint64_t next_start = after == s.blocks.end() ? base + s.size : after->first;
    uint64_t prev_end = after == s.blocks.begin() ? base : std::prev(after)->first + std::prev(after)->second;
    gaps.remove(p - prev_end);
    gaps.remove(next_start - (p + asz));
    gaps.add(next_start - prev_end);
}

void address_space::on_free(const log_event& e, uint64_t line) {
    device_state& d = dev(e.dev);
    if (e.unknown || e.ptr == 0) {
        // "unknown": recorded by design (the allocation predates gpumem or bypassed it);
        // cudaFree(NULL) is a legal no-op.
        obs_.freed(d, e, nullptr, line);
        return;
    }
    bool handle = e.kind == mem_kind::vmm;
    auto& m = handle ? live_vmm_ : live_;
    live_alloc* found = m.find(e.ptr);
    if (!found) {
        checks_.bad_free(line, e.ptr, handle);
        obs_.freed(d, e, nullptr, line);
        return;
    }
    live_alloc a = *found;  // copied: erase moves entries
    m.erase(e.ptr);
    if (!handle && !a.pooled) plain_ranges_.erase(e.ptr);
    device_state& ad = dev(a.dev);
    obs_.before_change(ad);
    if (a.pooled) {
        if (auto* const* sit = segment_at_.find(a.seg)) {
            // The block's segment names its pool: the pool_sync that releases it is that pool's.
            if (pool_part& pp = *(*sit)->second.part; pends(pp)) {
                // docs/pool.md: a freed block stays in place, neither allocated nor free, until
                // a pool_sync releases it; counting it as free would misjudge fragmentation.
                pp.pending.push_back({a.seg, e.ptr});
                obs_.pending_added(ad, a.asize, e, line);
            } else {
                unplace_block((*sit)->second, (*sit)->first, e.ptr);
            }
        }
    }
    release(a, true);
    obs_.freed(ad, e, &a, line);
    if (&ad != &d) obs_.changed(ad, e.t, e.seq);
}

// docs/log-format.md, 1: a new segment; only [ptr, ptr+asize) is mapped when asize is below size
// (an arena segment that grows by segment_map), and the rest starts as a hole.
void address_space::on_segment_alloc(const log_event& e, uint64_t line) {
    device_state& d = dev(e.dev);
    uint64_t mapped = e.set_aside();
    if (mapped > e.size) {
        // The pool cannot map more than it reserved: the recorder and this reader disagree.
        checks_.inconsistent(line, "segment_alloc of [" + hex(e.ptr) + ", +" + std::to_string(e.size) + ") maps " +
                                       std::to_string(mapped) + " bytes (asize), more than the segment");
        mapped = e.size;  // lenient (a log missing events): taken as wholly mapped
    }
    if (e.size == 0) {
        // Said here: ignored, the blocks placed in it failed later lines with a misleading message.
        checks_.inconsistent(line, "segment_alloc of [" + hex(e.ptr) + ", +0): a segment of 0 bytes");
        return;
    }
    if (e.ptr + e.size <= e.ptr) {  // wraps, or ends exactly at 2^64: no device address does
        checks_.inconsistent(line, "segment [" + hex(e.ptr) + ", +" + std::to_string(e.size) +
                                       ") passes the end of the 64-bit address space");
        return;
    }
    auto next = segments_.lower_bound(e.ptr);
    bool overlap = (next != segments_.end() && next->first < e.ptr + e.size);
    if (next != segments_.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second.size > e.ptr) overlap = true;
    }
    if (overlap) {
        checks_.inconsistent(line, "segment [" + hex(e.ptr) + ", +" + std::to_string(e.size) +
                                       ") overlaps a segment that is still held");
        return;
    }
    pool_part& pp = d.pool(e.ctx);
    auto added = segments_.emplace(e.ptr, segment{e.size, e.dev, e.pool, &pp, {}, {}, 0}).first;
    segment_at_.insert_or_assign(e.ptr, &*added);
    if (mapped < e.size) {
        // The unmapped tail is a hole like one a segment_unmap cut: in `blocks`, so the gaps
        // between entries stay exactly the free blocks.
        segment& s = added->second;
        s.blocks.emplace(e.ptr + mapped, e.size - mapped);
        s.holes.emplace(e.ptr + mapped, hole{e.size - mapped, line, true});
        s.unmapped = e.size - mapped;
    }
    pp.gaps.add(mapped);
    pp.segment_bytes += mapped;
    d.unmapped_bytes += e.size - mapped;
    ++pp.n_segments;
    obs_.segment_added(d, e, mapped, line);
}

void address_space::on_segment_free(const log_event& e, uint64_t line) {
    device_state& d = dev(e.dev);
    auto it = segments_.find(e.ptr);
    if (it == segments_.end()) {
        if (e.size) checks_.inconsistent(line, "segment_free of " + hex(e.ptr) + ", which is not a held segment");
        return;
    }
    segment& s = it->second;
    device_state& sd = dev(s.dev);
    pool_part& pp = *s.part;
    obs_.before_change(sd);
    drop_pending_in(sd, pp, it->first);
    if (s.blocks.size() > s.holes.size()) {
        size_t n_live = 0;
        for (const auto& [p, a] : s.blocks) {
            if (s.holes.count(p)) continue;
            if (const live_alloc* l = live_.find(p)) {
                live_alloc gone = *l;
                live_.erase(p);
                release(gone, false);
                ++n_live;
            }
        }
        checks_.warn(line, "segment " + hex(e.ptr) + " returned to the driver with " + std::to_string(n_live) +
                               " live and " + std::to_string(s.blocks.size() - s.holes.size() - n_live) +
                               " pending block(s); they are dropped");
    }
    // The segment's free blocks leave with it (holes are not among them).
    for_each_gap(it->first, s.size, s.blocks, [&](uint64_t g) { pp.gaps.remove(g); });
    pp.segment_bytes -= s.size - s.unmapped;
    sd.unmapped_bytes -= s.unmapped;
    if (pp.n_segments) --pp.n_segments;
    obs_.segment_removed(sd, s.size - s.unmapped, s.unmapped);
    segment_at_.erase(it->first);
    segments_.erase(it);
    if (&sd != &d) obs_.changed(sd, e.t, e.seq);
}

// What occupies the range starting at p in segment s, for a message: a hole, a live block or a
// pending one.
std::string address_space::occupant(const segment& s, uint64_t base, uint64_t p) const {
    auto b = s.blocks.find(p);
    uint64_t n = b == s.blocks.end() ? 0 : b->second;
    std::string range = "[" + hex(p) + ", +" + std::to_string(n) + ")";
    if (auto h = s.holes.find(p); h != s.holes.end())
        return "the range " + range +
               (h->second.initial ? " not mapped since its segment_alloc at line " : " unmapped at line ") +
               std::to_string(h->second.line) + " (no block is made in a hole)";
    if (const live_alloc* l = live_.find(p); l && l->pooled && l->seg == base)
        return "the live block " + range + " allocated at line " + std::to_string(l->line);
    return "the pending block " + range + " (freed, not yet released by a pool_sync)";
}

// docs/log-format.md, 5a: the pool gave back the physical chunks of [ptr, ptr+size), which must
// lie inside one free block of segment `seg`.  The range becomes a hole: neither free (it cannot
// serve a request, so it is no fragmentation) nor reserved (its memory is the driver's again).
// A segment_map may fill it again (5b); else the address space goes back with the segment's
// segment_free.
void address_space::on_segment_unmap(device_state& d, const log_event& e, uint64_t line) {
    auto* const* found = segment_at_.find(e.seg);
    auto* sit = found ? *found : nullptr;
    const std::string range = "[" + hex(e.ptr) + ", +" + std::to_string(e.size) + ")";
    if (!sit) {
        checks_.inconsistent(line, "segment_unmap of " + range + " in segment " + hex(e.seg) +
                                       ", which is not a held segment");
        return;
    }
    const uint64_t base = sit->first;
    segment& s = sit->second;
    const uint64_t end = base + s.size;
    if (e.size == 0 || e.ptr < base || e.ptr > end || e.size > end - e.ptr) {
        checks_.inconsistent(line, "segment_unmap of " + range + " lies outside segment [" + hex(base) + ", +" +
                                       std::to_string(s.size) + ")");
        return;
    }
    auto at = s.blocks.lower_bound(e.ptr);
    uint64_t next_start = at == s.blocks.end() ? end : at->first;
    uint64_t prev_end = at == s.blocks.begin() ? base : std::prev(at)->first + std::prev(at)->second;
    if (e.ptr < prev_end || e.ptr + e.size > next_start) {
        // Unmapping memory the program still holds (or that still pends) would pull it from
        // under the program: the pool only gives back free chunks.
        uint64_t other = e.ptr < prev_end ? std::prev(at)->first : at->first;
        checks_.inconsistent(line, "segment_unmap of " + range + " covers " + occupant(s, base, other) +
                                       " in segment " + hex(base) + ": only free bytes can be unmapped");
        return;
    }
    // The segment's device holds its gaps (the event's dev names the same one in any sane log).
    device_state& sd = dev(s.dev);
    gap_set& gaps = s.part->gaps;
    gaps.remove(next_start - prev_end);
    gaps.add(e.ptr - prev_end);
    gaps.add(next_start - (e.ptr + e.size));
    s.blocks.emplace_hint(at, e.ptr, e.size);
    s.holes.emplace(e.ptr, hole{e.size, line, false});
    s.unmapped += e.size;
    s.part->segment_bytes -= e.size;
    sd.unmapped_bytes += e.size;
    obs_.segment_unmapped(sd, e, line);
    if (&sd != &d) obs_.changed(sd, e.t, e.seq);
}

// docs/log-format.md, 5b: the pool mapped physical chunks over [ptr, ptr+size), which must lie in
// a hole of segment `seg` (holes that touch count as one: no byte between them is memory).  The
// range becomes free space and merges with the free blocks on either side; what is left of the
// hole before and after it stays a hole.  Its bytes are reserved again.
void address_space::on_segment_map(device_state& d, const log_event& e, uint64_t line) {
    auto* const* found = segment_at_.find(e.seg);
    auto* sit = found ? *found : nullptr;
    const std::string range = "[" + hex(e.ptr) + ", +" + std::to_string(e.size) + ")";
    if (!sit) {
        checks_.inconsistent(line, "segment_map of " + range + " in segment " + hex(e.seg) +
                                       ", which is not a held segment");
        return;
    }
    const uint64_t base = sit->first;
    segment& s = sit->second;
    const uint64_t end = base + s.size;
    if (e.size == 0) {
        checks_.inconsistent(line, "segment_map of " + range + " maps nothing (size 0)");
        return;
    }
    if (e.ptr < base || e.ptr > end || e.size > end - e.ptr) {
        checks_.inconsistent(line, "segment_map of " + range + " lies outside segment [" + hex(base) + ", +" +
                                       std::to_string(s.size) + ")");
        return;
    }
    const uint64_t p = e.ptr, q = e.ptr + e.size;
    // Mapping over memory that is already there (free, or a block) would mean the pool lost track
    // of its chunks: only address space without memory can be mapped.
    auto not_a_hole = [&](std::string what) {
        checks_.inconsistent(line, "segment_map of " + range + " covers " + what + " in segment " + hex(base) +
                                       ": only a hole can be mapped");
    };
    auto free_bytes = [&](uint64_t from, uint64_t to) {
        return "the free bytes [" + hex(from) + ", +" + std::to_string(std::min(to, q) - from) + ")";
    };
    // The entry holding p, then the entries after it, each starting where the one before ends,
    // until the range is covered: every one of them must be a hole.
    auto first = s.blocks.upper_bound(p);
    if (first == s.blocks.begin() || std::prev(first)->first + std::prev(first)->second <= p) {
        uint64_t gap_end = first == s.blocks.end() ? end : first->first;
        return not_a_hole(free_bytes(p, gap_end));
    }
    --first;
    auto it = first;
    uint64_t cur = p;
    while (true) {
        if (!s.holes.count(it->first)) return not_a_hole(occupant(s, base, it->first));
        cur = it->first + it->second;
        ++it;
        if (cur >= q) break;
        if (it == s.blocks.end() || it->first != cur)
            return not_a_hole(free_bytes(cur, it == s.blocks.end() ? end : it->first));
    }
    // [first, it) are the holes; h0 and h1 their outer ends.
    const auto last = std::prev(it);
    const uint64_t h0 = first->first, h1 = last->first + last->second;
    const hole head = s.holes.at(h0), tail = s.holes.at(last->first);
    const uint64_t prev_end = first == s.blocks.begin() ? base : std::prev(first)->first + std::prev(first)->second;
    const uint64_t next_start = it == s.blocks.end() ? end : it->first;
    device_state& sd = dev(s.dev);
    gap_set& gaps = s.part->gaps;
    gaps.remove(h0 - prev_end);
    gaps.remove(next_start - h1);
    for (auto h = first; h != it; ++h) s.holes.erase(h->first);
    s.blocks.erase(first, it);
    if (h0 < p) {
        s.blocks.emplace(h0, p - h0);
        s.holes.emplace(h0, hole{p - h0, head.line, head.initial});
        gaps.add(h0 - prev_end);  // the free block before the hole stays as it was
    }
    if (q < h1) {
        s.blocks.emplace(q, h1 - q);
        s.holes.emplace(q, hole{h1 - q, tail.line, tail.initial});
        gaps.add(next_start - h1);
    }
    // The mapped range, merged with the free block before it when no hole is left between them,
    // and with the one after it likewise.
    gaps.add((q < h1 ? q : next_start) - (h0 < p ? p : prev_end));
    s.unmapped -= e.size;
    s.part->segment_bytes += e.size;
    sd.unmapped_bytes -= e.size;
    obs_.segment_mapped(sd, e, line);
    if (&sd != &d) obs_.changed(sd, e.t, e.seq);
}

// A context synchronize: every pending block of the pool ("ctx") becomes free and merges with
// its free neighbours.  A release by fences ("fence"): the first `count` pending blocks, in free
// order (the pool fences its frees in that order).  Another pool of the device keeps its own.
void address_space::on_pool_sync(device_state& d, const log_event& e, uint64_t line) {
    pool_part& p = d.pool(e.ctx);
    auto& pending = p.pending;
    const bool prefix = e.fence && e.has(fd_count) && e.count <= pending.size();
    if (!prefix && e.has(fd_count) && pends(p) && e.count != pending.size() && !checks_.lenient())
        checks_.warn(line, "pool_sync releases " + std::to_string(e.count) + " frees; the reconstruction has " +
                               std::to_string(pending.size()) + " pending");
    const size_t n = prefix ? size_t(e.count) : pending.size();
    for (size_t i = 0; i < n; ++i) release_pending(d, pending[i].first, pending[i].second);
    pending.erase(pending.begin(), pending.begin() + ptrdiff_t(n));
    if (!d.any_pending()) obs_.pending_cleared(d);
}

// A pending block of d becomes free (a pool_sync released it).
void address_space::release_pending(device_state& d, uint64_t seg, uint64_t ptr) {
    if (auto* const* sit = segment_at_.find(seg)) {
        auto b = (*sit)->second.blocks.find(ptr);
        if (b != (*sit)->second.blocks.end()) obs_.pending_removed(d, b->second);
        unplace_block((*sit)->second, (*sit)->first, ptr);
    }
}

// "auto": from this event on the pool's frees pend until a pool_sync.  The pool logs it once (a
// second one, or one in a log not in auto mode, changes nothing), then usually a pool_sync with
// count 0 (the drain), which the per-pool count check covers.  Each pool of a device has its own;
// the device's report names the first.
void address_space::on_reuse_safe(device_state& d, const log_event& e, uint64_t line) {
    const std::string& api = names_.api_name(e.api);
    if (pending_rule() != pend_rule::after_reuse_safe) {
        std::string why = proc_.pool_mode == config_value::pool_off
                              ? std::string(" in a log with the pool off")
                              : " in a log whose config.reuse is " +
                                    (proc_.reuse_mode.empty() ? std::string("absent (safe)") : "\"" + proc_.reuse_mode + "\"") +
                                    ", not \"auto\"";
        checks_.warn(line, "reuse_safe (" + api + ") on device " + std::to_string(d.dev) + why + "; ignored");
        return;
    }
    pool_part& p = d.pool(e.ctx);
    if (p.reuse_safe) {
        checks_.warn(line, "reuse_safe (" + api + ") on device " + std::to_string(d.dev) +
                               (e.ctx ? " (ctx " + std::to_string(e.ctx) + ")" : std::string()) +
                               ", which is in safe reuse since seq " + std::to_string(p.reuse_safe_seq) +
                               " (line " + std::to_string(p.reuse_safe_line) + "); ignored");
        return;
    }
    p.reuse_safe = true;
    p.reuse_safe_seq = e.seq;
    p.reuse_safe_line = line;
    if (!d.rep.reuse_safe) obs_.reuse_safe(d, e, line);
}

// Pending blocks of the segment at `base` (of pool p on d) are forgotten (the segment is going away).
void address_space::drop_pending_in(device_state& d, pool_part& p, uint64_t base) {
    auto& v = p.pending;
    for (auto it = v.begin(); it != v.end();) {
        if (it->first == base) {
            auto sit = segments_.find(base);
            if (sit != segments_.end()) {
                auto b = sit->second.blocks.find(it->second);
                if (b != sit->second.blocks.end()) obs_.pending_removed(d, b->second);
            }
            it = v.erase(it);
        } else {
            ++it;
        }
    }
}

// A context reset (docs/log-format.md, rule 6): its pool's segments and blocks are gone, and its
// context's allocations outside the pools (by their "ctx"; every one of the device's in a log
// without the header's alloc_ctx).  Without "dev", every pooled allocation and segment of every
// device.
void address_space::drop_device_state(int only_dev, const log_event& e) {
    const pool_part* reset = nullptr;  // the pool whose context ended, when it has a part
    if (only_dev >= 0)
        if (auto d = devs_.find(only_dev); d != devs_.end())
            if (auto p = d->second.pools.find(e.ctx); p != d->second.pools.end()) reset = &p->second;
    auto gone = [&](const segment& s) { return only_dev < 0 || s.part == reset; };
    for (auto& [k, d] : devs_)
        if (only_dev < 0 || k == only_dev) {
            obs_.before_change(d);
            // Its pending blocks first, while their segments still say their sizes.
            for (auto& [c, p] : d.pools)
                if (only_dev < 0 || &p == reset) {
                    for (const auto& [seg, ptr] : p.pending)
                        if (auto* const* sit = segment_at_.find(seg))
                            if (auto b = (*sit)->second.blocks.find(ptr); b != (*sit)->second.blocks.end())
                                obs_.pending_removed(d, b->second);
                    p.pending.clear();
                }
        }
    // Outside the pools, a reset takes its own context's allocations (their "ctx"), but no
    // stream-ordered one; in a log whose header lacks alloc_ctx (written before its allocations
    // carried "ctx") every one of the device's, as the recorder that wrote it did.
    const uint32_t reset_ctx = uint32_t(std::min<uint64_t>(e.ctx, UINT32_MAX));
    auto plain_dies = [&](const live_alloc& a) {
        return !proc_.alloc_ctx || (!a.stream_ordered && a.ctx == reset_ctx);
    };
    std::vector<uint64_t> dropped;  // erased after the walk: erase moves entries
    for (const auto& [ptr, a] : live_) {
        bool dies = only_dev < 0 ? a.pooled : a.dev == only_dev && !a.pooled && plain_dies(a);
        if (a.pooled && only_dev >= 0)
            if (auto* const* sit = segment_at_.find(a.seg)) dies = gone((*sit)->second);
        if (dies) {
            release(a, false);
            dropped.push_back(ptr);
        }
    }
    for (uint64_t ptr : dropped) {
        live_.erase(ptr);
        plain_ranges_.erase(ptr);
    }
    for (auto it = segments_.begin(); it != segments_.end();) {
        if (gone(it->second)) {
            device_state& d = dev(it->second.dev);
            pool_part& p = *it->second.part;
            const uint64_t held = it->second.size - it->second.unmapped;
            p.segment_bytes -= held;
            d.unmapped_bytes -= it->second.unmapped;
            if (p.n_segments) --p.n_segments;
            obs_.segment_removed(d, held, it->second.unmapped);
            segment_at_.erase(it->first);
            it = segments_.erase(it);
        } else {
            ++it;
        }
    }
    for (auto& [k, d] : devs_)
        if (only_dev < 0 || k == only_dev) {
            for (auto& [c, p] : d.pools)
                if (only_dev < 0 || &p == reset) p.gaps.clear();  // its segments went, their free blocks too
            if (!d.any_pending()) obs_.pending_cleared(d);
            obs_.changed(d, e.t, e.seq);
        }
}

uint64_t address_space::snapshot_cost(const device_state& d) const {
    uint64_t n = live_.size() + segments_.size();
    for (const auto& [base, s] : segments_)
        if (s.dev == d.dev) n += s.blocks.size();
    return n;
}

block_view address_space::view(uint64_t ptr, const live_alloc& a, const line_parser& names) {
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

void address_space::fill_snapshot(device_state& d, state_snapshot& s, const line_parser& names) const {
    s.free_in_segments = d.free_total();
    s.largest_free = d.largest_free();
    s.free_blocks = d.n_gaps();
    s.external_fragmentation = d.frag();
    s.unmapped = d.unmapped_bytes;
    std::unordered_map<uint64_t, bool> pend;
    for (const auto& [c, p] : d.pools)
        for (const auto& pr : p.pending) pend[pr.second] = true;
    for (const auto& [base, sg] : segments_) {
        if (sg.dev != d.dev) continue;
        segment_view v;
        v.base = base;
        v.size = sg.size;
        v.pool = sg.pool;
        if (sg.holes.empty()) {
            v.blocks.assign(sg.blocks.begin(), sg.blocks.end());
        } else {
            for (const auto& b : sg.blocks)
                (sg.holes.count(b.first) ? v.holes : v.blocks).push_back(b);
        }
        if (!pend.empty())
            for (const auto& b : v.blocks)
                if (pend.count(b.first)) v.pending.push_back(b);
        // Free blocks for the histogram: the gaps between consecutive blocks.
        for_each_gap(base, sg.size, sg.blocks, [&](uint64_t g) { s.free_block_sizes.add(g); });
        s.segment_map.push_back(std::move(v));
    }
    s.segments = s.segment_map.size();
    std::vector<const live_entry*> mine;
    for_each_live([&](const live_entry& kv) {
        if (kv.second.dev == d.dev) mine.push_back(&kv);
    });
    s.live_allocs = mine.size();
    size_t k = std::min(mine.size(), k_top_blocks);
    std::partial_sort(mine.begin(), mine.begin() + ptrdiff_t(k), mine.end(), [](auto* a, auto* b) {
        return a->second.size != b->second.size ? a->second.size > b->second.size : a->second.seq < b->second.seq;
    });
    for (size_t i = 0; i < k; ++i) s.largest_live.push_back(view(mine[i]->first, mine[i]->second, names));
}

}  // namespace gpumem::analysis
