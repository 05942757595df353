// The block pool on virtual memory: arenas that grow chunk by chunk, and stitching of scattered free chunks into one range.
#include "core/pool/block_pool.h"

#include <algorithm>
#include <iterator>
#include <new>
#include <vector>

#include "core/pool/block_pool_util.h"
#include "core/stderr_write.h"

namespace gpumem {

// ---- arenas ---------------------------------------------------------------------------------

void block_pool::hole_insert(block* u) { holes_[pool_index(u->seg->pool)].insert(u); }
void block_pool::hole_erase(block* u) noexcept { holes_[pool_index(u->seg->pool)].erase(u); }

bool block_pool::use_arenas() noexcept {
    if (!use_vmm() || !cfg_.arenas) return false;
    if (arena_size_ == 0) {
        // Decided at the first growth.  Address space is cheap and holds no memory: PyTorch's
        // expandable segments reserve the device's memory plus an eighth per stream and pool.
        uint64_t a = cfg_.arena;
        if (a == 0) {
            uint64_t free_b = 0, total = 0;
            mem_info(&free_b, &total);
            a = total ? total + total / 8 : 256ull << 30;
        }
        // At most 1 TiB: the arena keeps one handle slot per chunk (4 MiB of host memory for
        // 1 TiB of 2 MiB chunks), and a replay's fake device may claim petabytes.
        arena_size_ = round_up(std::min<uint64_t>(a, 1ull << 40), chunk_);
    }
    return true;
}

block_pool::block* block_pool::split_hole(block* u, uint64_t at) {
    block* rest = new_block();
    if (!rest) return nullptr;
    rest->addr = u->addr + at;
    rest->size = u->size - at;
    rest->seg = u->seg;
    rest->state = block_state::unmapped;
    try {
        addr_insert(rest);
    } catch (...) {
        recycle(rest);
        throw;
    }
    try {
        hole_insert(rest);
    } catch (...) {
        addr_erase(rest);
        recycle(rest);
        throw;
    }
    rest->prev = u;
    rest->next = u->next;
    if (u->next) u->next->prev = rest;
    u->next = rest;
    u->size = at;  // the hole set orders by address: u stays where it is
    return rest;
}

int block_pool::map_hole(block* u, uint64_t bytes, api_id api, block** out) {
    segment* s = u->seg;
    // Host bookkeeping first, so nothing can fail once the chunks are mapped: the unmapped rest
    // as its own hole, and a spare node for the free set (make_free inserts one).
    block* rest = nullptr;
    if (bytes < u->size && !(rest = split_hole(u, bytes)))
        return k_cuda_oom;  // nothing changed yet: the program gets an OOM, the pool lives on
    auto unsplit = [&] {  // the map failed: the hole is one again
        if (!rest) return;
        hole_erase(rest);
        absorb_next(u);
    };
    if (spare_free_nodes_.empty()) {
        try {
            free_set& fs = free_[pool_index(s->pool)];
            auto it = fs.insert(u).first;  // u is no free block: taken out again at once
            spare_free_nodes_.push_back(fs.extract(it));  // capacity reserved: cannot throw
        } catch (...) {
            unsplit();
            throw;
        }
    }
    const size_t i = (u->addr - s->base) / chunk_;
    const int rc = map_chunks(u->addr, bytes / chunk_, &s->chunks[i]);
    if (rc != k_cuda_success) {
        // The backend made nothing; its handles must not look mapped.
        std::fill(s->chunks.begin() + i, s->chunks.begin() + i + bytes / chunk_, 0);
        unsplit();
        return rc;
    }
    emit_chunks(api, s, u->addr, bytes, ev_kind::segment_map);
    s->mapped += bytes;
    reserved_ += bytes;
    hole_erase(u);
    block* joined = (u->prev && u->prev->state == block_state::free) ? u->prev : u;
    make_free(u);
    *out = joined;
    return k_cuda_success;
}

// The lowest hole where asize fits, counting the free blocks on either side that mapping joins
// to it: reusing address space keeps blocks together, so frees merge (PyTorch's expandable
// segments look in the same order).  Usually the only hole is each arena's unmapped end.  *bytes:
// what to map at the hole's start.  nullptr when none fits.
block_pool::block* block_pool::find_hole(pool_id p, uint64_t asize, uint64_t* bytes) noexcept {
    for (block* u : holes_[pool_index(p)]) {
        const uint64_t before = u->prev && u->prev->state == block_state::free ? u->prev->size : 0;
        const uint64_t after = u->next && u->next->state == block_state::free ? u->next->size : 0;
        if (before + u->size >= asize) {
            *bytes = std::min(round_up(asize - std::min(asize, before), chunk_), u->size);
            return u;
        }
        if (before + u->size + after >= asize) {
            *bytes = u->size;
            return u;
        }
    }
    return nullptr;
}

int block_pool::map_cheapest_hole(pool_id p, uint64_t asize, api_id api, block** out) {
    block* best = nullptr;
    uint64_t best_bytes = 0;
    bool best_end = false;
    for (block* u : holes_[pool_index(p)]) {
        const uint64_t before = u->prev && u->prev->state == block_state::free ? u->prev->size : 0;
        const uint64_t after = u->next && u->next->state == block_state::free ? u->next->size : 0;
        if (before + u->size + after < asize) continue;
        // The hole's front joined to the free block before it, its back to the one after, or all of it.
        uint64_t bytes = u->size;
        bool at_end = false;
        if (before + u->size >= asize) bytes = round_up(asize - std::min(asize, before), chunk_);
        if (u->size + after >= asize && round_up(asize - std::min(asize, after), chunk_) < bytes) {
            bytes = round_up(asize - std::min(asize, after), chunk_);
            at_end = true;
        }
        bytes = std::max(std::min(bytes, u->size), chunk_);  // a hole is at least one chunk
        if (!best || bytes < best_bytes) best = u, best_bytes = bytes, best_end = at_end;
    }
    if (!best) return k_cuda_oom;
    if (!best_end || best_bytes == best->size) return map_hole(best, best_bytes, api, out);
    // The back of the hole: its front stays a hole of its own.
    block* v = split_hole(best, best->size - best_bytes);
    if (!v) return k_cuda_oom;  // nothing changed yet
    auto unsplit = [&] {  // v is a hole still: one hole again, as adjacent holes must be
        hole_erase(v);
        absorb_next(best);
    };
    int rc;
    try {
        rc = map_hole(v, best_bytes, api, out);
    } catch (...) {
        unsplit();
        throw;
    }
    if (rc != k_cuda_success) unsplit();
    return rc;
}

uint64_t block_pool::arena_unit(pool_id p, uint64_t asize) const noexcept {
    // The large pool maps just the request's chunks (take() splits off the rest before a hole,
    // however small, so the next growth joins it).  On the H200 GPT-2 log, growing by whole
    // 20 MiB segments for requests under 10 MiB reserved 0.6% more (docs/benchmarks.md, "Arenas").
    return p == pool_id::small ? std::max(asize, cfg_.small_segment) : asize;
}

uint64_t block_pool::arena_growth(pool_id p, uint64_t asize, const block** hole) noexcept {
    const uint64_t unit = arena_unit(p, asize);
    uint64_t bytes = 0;
    const block* u = find_hole(p, unit, &bytes);
    if (hole) *hole = u;
    return u ? bytes : round_up(unit, chunk_);
}

int block_pool::arena_grow(pool_id p, uint64_t asize, api_id api, block** out) {
    // A segment's worth first; when the device cannot give that, just the request's chunks.
    const uint64_t unit = arena_unit(p, asize);
    for (uint64_t want : {unit, asize}) {
        uint64_t bytes = 0;
        int rc;
        if (block* u = find_hole(p, want, &bytes)) {
            rc = map_hole(u, bytes, api, out);
        } else {
            // A new arena: its address space, with the chunks wanted mapped at its start.
            const uint64_t first = round_up(want, chunk_);
            rc = new_segment(p, std::max(arena_size_, first), api, out, false, first);
        }
        if (rc != k_cuda_oom || want == asize) return rc;
    }
    return k_cuda_oom;
}

// ---- stitching ------------------------------------------------------------------------------

block_pool::block* block_pool::carve(block* b, uint64_t lo, uint64_t hi, block_state st) {
    // Everything that can throw comes first, so that a throw leaves b as it was: the new blocks,
    // their address-map entries, and a spare free-set node for the tail (b's own node, freed by
    // free_erase below, serves the head).
    const uint64_t end = b->addr + b->size;
    block* mid = b->addr < lo ? new_block() : nullptr;
    block* tail = hi < end ? new_block() : nullptr;
    bool mid_in = false, tail_in = false;
    try {
        if ((b->addr < lo && !mid) || (hi < end && !tail)) throw std::bad_alloc();
        if (mid) {
            mid->addr = lo;
            mid->seg = b->seg;
            addr_insert(mid);
            mid_in = true;
        }
        if (tail) {
            tail->addr = hi;
            tail->size = end - hi;
            tail->seg = b->seg;
            tail->state = block_state::free;
            addr_insert(tail);
            tail_in = true;
            if (spare_free_nodes_.empty()) {
                free_set& fs = free_[pool_index(b->seg->pool)];
                auto it = fs.insert(tail).first;  // taken out again at once: a node for later
                spare_free_nodes_.push_back(fs.extract(it));  // capacity reserved: cannot throw
            }
        }
    } catch (...) {
        if (mid_in) addr_erase(mid);
        if (tail_in) addr_erase(tail);
        if (mid) recycle(mid);
        if (tail) recycle(tail);
        throw;
    }
    free_erase(b);
    free_bytes_ -= b->size;
    block* cut = b;
    if (mid) {  // b keeps the head, still free
        b->size = lo - b->addr;
        mid->prev = b;
        mid->next = b->next;
        if (b->next) b->next->prev = mid;
        b->next = mid;
        free_insert(b);  // b's own node, spare since free_erase: cannot throw
        free_bytes_ += b->size;
        cut = mid;
    }
    cut->size = hi - lo;
    cut->state = st;
    if (tail) {
        tail->prev = cut;
        tail->next = cut->next;
        if (cut->next) cut->next->prev = tail;
        cut->next = tail;
        free_insert(tail);  // a spare node: cannot throw
        free_bytes_ += tail->size;
    }
    return cut;
}

// GMLake (ASPLOS'24) serves a request that no free block fits from the free physical chunks that
// lie scattered between live blocks, mapped once more into one new virtual range; the chunks stay
// mapped where they were (their old range is only marked lent), so a stitch costs a map per chunk
// and no cuMemCreate/cuMemRelease.  The range outlives its segment (an alias, kept idle): the next
// stitch on it remaps only the positions whose chunks are no longer free.
block_pool::block* block_pool::stitch(pool_id p, uint64_t asize, api_id api) {
    const uint64_t need = round_up(asize, chunk_);
    const size_t n = need / chunk_;
    // A chunk is lendable where its whole first mapping lies in a free block of a plain VMM
    // segment of pool p, still mapping the same handle.
    auto lendable = [&](uint64_t a, uint64_t h) -> bool {
        auto it = blocks_.upper_bound(a);
        if (it == blocks_.begin()) return false;
        const block* b = std::prev(it)->second;
        const segment* s = b->seg;
        return b->state == block_state::free && s->pool == p && s->vmm() && !s->stitched() &&
               a + chunk_ <= b->addr + b->size && s->chunks[(a - s->base) / chunk_] == h;
    };
    // The plan: the alias (nullptr: a new one), and each position's chunk, src[i] at handle h[i];
    // keep[i]: the alias maps it there already.
    alias* al = nullptr;
    std::vector<uint64_t> src, h;
    std::vector<char> keep;
    auto plan = [&]() -> bool {
        src.assign(n, 0);
        h.assign(n, 0);
        keep.assign(n, 0);
        al = nullptr;
        size_t best = 0;
        // Remapping a position unmaps it first, which, like a dissolve, waits for no device work:
        // only outside a capture (the stale chunk's new owner may be in one: its work goes on).
        const bool may_unmap = !aliases_.empty() && can_sync();
        // Each idle range's positions that can stay, {chunk, position} by chunk: one per lendable
        // chunk (a chunk may sit at two positions, a tail position's chunk lent to a lower one by
        // a shorter stitch: it is kept at one, and the other is remapped).  Every other position
        // below n is remapped.
        std::vector<std::pair<uint64_t, size_t>> cand, kept;
        for (alias& a : aliases_) {
            if (a.user || a.va < need) continue;
            const size_t m = std::min(n, a.handles.size());
            cand.clear();
            for (size_t i = 0; i < m; ++i)
                if (lendable(a.src[i], a.handles[i])) cand.emplace_back(a.src[i], i);
            std::sort(cand.begin(), cand.end());
            cand.erase(std::unique(cand.begin(), cand.end(), [](const auto& x, const auto& y) { return x.first == y.first; }),
                       cand.end());
            if ((cand.size() < m && !may_unmap) || cand.size() <= best) continue;
            best = cand.size();
            al = &a;
            kept.swap(cand);
        }
        std::vector<uint64_t> used;  // the kept positions' chunks, sorted: not lent twice
        for (const auto& [chunk, i] : kept) {
            keep[i] = 1;
            src[i] = chunk;
            h[i] = al->handles[i];
            used.push_back(chunk);
        }
        // The other positions: whole chunks of the free blocks, smallest first (the pieces no
        // request fits are the ones worth lending; a larger free block left whole may still serve
        // one), each from its low end.
        size_t i = 0;
        auto next_slot = [&] {
            while (i < n && keep[i]) ++i;
        };
        next_slot();
        block key;
        key.size = chunk_;
        for (auto it = free_[pool_index(p)].lower_bound(&key); it != free_[pool_index(p)].end() && i < n; ++it) {
            const block* b = *it;
            const segment* s = b->seg;
            if (!s->vmm() || s->stitched()) continue;
            const uint64_t lo = s->base + round_up(b->addr - s->base, chunk_);
            const uint64_t hi = s->base + (b->addr + b->size - s->base) / chunk_ * chunk_;
            for (uint64_t c = lo; c < hi && i < n; c += chunk_) {
                if (std::binary_search(used.begin(), used.end(), c)) continue;
                src[i] = c;
                h[i] = s->chunks[(c - s->base) / chunk_];
                ++i;
                next_slot();
            }
        }
        return i >= n;
    };
    try {
        bool enough = plan();
        // Too few: the chunks of wholly free stitched segments go back to their lenders first.
        if (!enough && dissolve_free_stitched(api)) enough = plan();
        if (!enough) return nullptr;
    } catch (...) {
        return nullptr;  // no host memory for the lists: nothing changed, grow instead
    }

    segment* st = new (std::nothrow) segment{};
    if (!st) return nullptr;
    std::vector<uint64_t> runs;  // the lent ranges' first chunks, by address
    try {
        st->chunks = h;
        runs = src;
        std::sort(runs.begin(), runs.end());
        if (!al) aliases_.emplace_back();  // reserved below; popped again on failure
    } catch (...) {
        delete st;
        return nullptr;
    }
    const bool fresh = !al;
    if (fresh) {
        al = &aliases_.back();
        // Twice the request: a later, larger request of a training loop with varying shapes
        // fits in it too.  Address space is cheap; the alias is capped in number, not size.
        al->va = round_up(2 * need, chunk_);
        if (backend_.va_reserve(al->va, &al->base) != k_cuda_success) {
            aliases_.pop_back();
            delete st;
            return nullptr;
        }
    }
    auto drop_fresh = [&] {
        if (fresh) {
            backend_.va_free(al->base, al->va);
            aliases_.pop_back();
        }
    };
    // Lend the chunks: each run of adjacent chunks within one free block is carved out as one lent
    // block.  The blocks' first mapping stays; only the pool's view changes, so undoing it needs no
    // backend call.
    auto unlend = [&] {  // back to the free blocks they were (make_free merges them again)
        for (block* l : st->lent) make_free(l);
        st->lent.clear();
    };
    try {
        st->lent.reserve(runs.size());
        for (size_t k = 0; k < runs.size();) {
            const uint64_t lo = runs[k];
            block* b = std::prev(blocks_.upper_bound(lo))->second;  // free, holds lo (plan)
            size_t e = k + 1;
            while (e < runs.size() && runs[e] == runs[e - 1] + chunk_ && runs[e] + chunk_ <= b->addr + b->size) ++e;
            block* l = carve(b, lo, runs[e - 1] + chunk_, block_state::lent);  // b unchanged if it throws
            st->lent.push_back(l);  // reserved: cannot throw
            k = e;
        }
    } catch (...) {
        unlend();  // no host memory halfway: what was lent goes back, and the request grows instead
        drop_fresh();
        delete st;
        return nullptr;
    }
    // The driver: positions that map another chunk are unmapped, then every position not kept is
    // mapped, in runs.  A refusal drops the whole alias (what is mapped of it unmapped).
    uint64_t mapped_now = 0;
    bool ok = true;
    for (size_t i = 0; i < n && ok;) {
        if (keep[i]) {
            ++i;
            continue;
        }
        size_t e = i + 1;
        while (e < n && !keep[e]) ++e;
        const size_t old_end = std::min(e, al->handles.size());
        // Stale positions: their chunks serve someone else now.  A refused one stays known as
        // mapped (the drop below tries it again, and stops chunk releases if refused again).
        if (i < old_end && !unmap_alias_range(*al, i, old_end)) ok = false;
        if (ok && al->handles.size() < e) {
            try {
                al->handles.resize(e, 0);
                al->src.resize(e, 0);
            } catch (...) {
                ok = false;
            }
        }
        if (ok && alias_map(al->base + i * chunk_, e - i, &h[i]) != k_cuda_success) ok = false;
        if (ok) {
            for (size_t k = i; k < e; ++k) al->handles[k] = h[k], al->src[k] = src[k];
            mapped_now += e - i;
        }
        i = e;
    }
    block* b = ok ? new_block() : nullptr;
    if (!b) {
        unlend();
        // The alias goes (its address space too; a kept alias's slot as well), but no unmap during
        // a capture (only maps ran then): it stays, idle, with what it maps.
        const bool mapped = std::any_of(al->handles.begin(), al->handles.end(), [](uint64_t x) { return x != 0; });
        if (!mapped || can_sync()) {
            unmap_alias_from(*al, 0);
            aliases_.erase(aliases_.begin() + (al - aliases_.data()));
        } else {
            while (!al->handles.back()) al->handles.pop_back(), al->src.pop_back();  // the positions a failed map left
            al->used = stitches_;
        }
        delete st;
        return nullptr;
    }
    st->base = al->base;
    st->size = need;
    st->mapped = need;
    st->pool = p;
    st->first = b;
    b->addr = st->base;
    b->size = need;
    b->seg = st;
    b->state = block_state::free;
    bool in_segments = false, in_blocks = false;
    try {
        segments_.emplace(st->base, st);
        in_segments = true;
        addr_insert(b);
        in_blocks = true;
        free_insert(b);
    } catch (...) {
        if (in_blocks) addr_erase(b);
        if (in_segments) segments_.erase(st->base);
        recycle(b);
        unlend();
        al->used = stitches_;  // idle again, mapped as planned: still worth keeping
        delete st;
        return nullptr;
    }
    track(st);
    al->user = st;
    al->used = ++stitches_;
    free_bytes_ += need;
    // Logged as a move: the lent ranges leave (segment_unmap), the stitched range arrives
    // (segment_alloc), so the log's reserved bytes stay the physical ones (docs/log-format.md).
    for (block* l : st->lent) emit_chunks(api, l->seg, l->addr, l->size);
    emit_segment(ev_kind::segment_alloc, api, st);
    ++n_stitched_;
    stitched_chunks_ += mapped_now;
    if (!fresh) ++alias_reuses_;
    return b;
}

int block_pool::alias_map(uint64_t addr, size_t n, const uint64_t* handles) noexcept {
    const uint64_t t0 = steady_ns();
    const int rc = backend_.map_alias(addr, chunk_, n, handles);
    alias_ns_ += steady_ns() - t0;
    return rc;
}

int block_pool::alias_unmap(uint64_t addr, size_t n) noexcept {
    const uint64_t t0 = steady_ns();
    const int rc = backend_.unmap_alias(addr, chunk_, n);
    alias_ns_ += steady_ns() - t0;
    if (rc == k_cuda_success) alias_unmapped_ += n;
    return rc;
}

int block_pool::map_chunks(uint64_t addr, size_t n, uint64_t* handles) noexcept {
    if (!loose_.empty()) {  // the give-back's chunks first: a map and an access grant, no create
        const size_t k = std::min(n, loose_.size());
        const uint64_t* from = loose_.data() + loose_.size() - k;
        uint64_t t0 = steady_ns();
        int rc = backend_.map_kept(addr, chunk_, k, from);
        tally_.map_ns += steady_ns() - t0;
        if (rc == k_cuda_success) {
            std::copy(from, from + k, handles);
            loose_.resize(loose_.size() - k);  // shrinking keeps the capacity: no allocation
            if (k < n && (rc = map_chunks(addr + k * chunk_, n - k, handles + k)) != k_cuda_success) {
                // All or nothing: the moved ones are loose again (the capacity holds them).
                t0 = steady_ns();
                if (backend_.unmap_keep(addr, chunk_, k, handles) == k_cuda_success) {
                    loose_.insert(loose_.end(), handles, handles + k);
                } else {
                    backend_.release_kept(chunk_, k, handles);  // what unmap_chunks would have done
                }
                tally_.unmap_ns += steady_ns() - t0;
                return rc;
            }
            tally_.mapped += k;
            tally_.moved += k;
            return k_cuda_success;
        }
        // Not mapped (a backend without moves, say): released now, and the chunks made below.
        release_loose();
    }
    // A growth the driver cannot hold makes and unmakes every chunk before the one it refuses
    // (cuMemCreate, cuMemMap, cuMemUnmap, cuMemRelease each): near the device's memory a refused
    // growth a step cost the H200 tens of ms (run 148).  The count of the driver's free memory
    // (free_est(), exact for the pool's own calls) says when one is likely; a look confirms it.
    if (foreseen_short(n * chunk_)) return k_cuda_oom;
    const uint64_t t0 = steady_ns();
    const int rc = backend_.map_chunks(addr, chunk_, n, handles);
    tally_.map_ns += steady_ns() - t0;
    if (rc == k_cuda_success) tally_.mapped += n;
    else if (rc == k_cuda_oom) ++tally_.refused;
    return rc;
}

bool block_pool::foreseen_short(uint64_t bytes) noexcept {
    if (!foresee_ || bytes <= free_est()) return false;
    uint64_t total = 0;
    const uint64_t free_b = look_at_driver(&total);
    if (total == 0 || free_b >= bytes) return false;  // (a driver that cannot say: asked)
    ++tally_.foreseen;
    return true;
}

void block_pool::unmap_chunks(uint64_t addr, size_t n, uint64_t* handles) noexcept {
    const uint64_t t0 = steady_ns();
    if (moving_ && loose_.capacity() - loose_.size() >= n) {
        int rc = backend_.unmap_keep(addr, chunk_, n, handles);
        if (rc == k_cuda_success) {
            loose_.insert(loose_.end(), handles, handles + n);  // within the capacity: no allocation
        } else if (rc != k_cuda_not_supported) {
            rc = backend_.release_kept(chunk_, n, handles);  // unmapped or not, released: as unmap_chunks
        } else {
            rc = backend_.unmap_chunks(addr, chunk_, n, handles);
        }
        tally_.unmap_ns += steady_ns() - t0;
        if (rc == k_cuda_success) tally_.unmapped += n;
        return;
    }
    const int rc = backend_.unmap_chunks(addr, chunk_, n, handles);
    tally_.unmap_ns += steady_ns() - t0;
    if (rc == k_cuda_success) tally_.unmapped += n;  // (the pool forgets them either way)
}

void block_pool::release_loose() noexcept {
    if (loose_.empty()) return;
    const uint64_t t0 = steady_ns();
    backend_.release_kept(chunk_, loose_.size(), loose_.data());
    tally_.unmap_ns += steady_ns() - t0;
    loose_.clear();
}

void block_pool::mem_info(uint64_t* free_b, uint64_t* total_b) noexcept {
    const uint64_t t0 = steady_ns();
    backend_.mem_info(free_b, total_b);
    tally_.look_ns += steady_ns() - t0;
    ++tally_.looks;
}

block_pool::driver_tally block_pool::chunk_driver() const noexcept {
    held lk(*this);
    return tally_;
}

void block_pool::stitch_driver(uint64_t* unmapped_chunks, uint64_t* ns) const noexcept {
    held lk(*this);
    if (unmapped_chunks) *unmapped_chunks = alias_unmapped_;
    if (ns) *ns = alias_ns_;
}

size_t block_pool::kept_ranges() const noexcept {
    held lk(*this);
    size_t n = 0;
    for (const alias& a : aliases_) n += !a.user;
    return n;
}

block_pool::alias* block_pool::alias_of(const segment* st) noexcept {
    for (alias& a : aliases_)
        if (a.user == st) return &a;
    return nullptr;
}

bool block_pool::unmap_alias_range(alias& a, size_t from, size_t to) noexcept {
    bool ok = true;
    for (size_t i = from; i < to;) {
        if (!a.handles[i]) {
            ++i;
            continue;
        }
        size_t e = i + 1;
        while (e < to && a.handles[e]) ++e;
        if (alias_unmap(a.base + i * chunk_, e - i) == k_cuda_success)
            std::fill(a.handles.begin() + ptrdiff_t(i), a.handles.begin() + ptrdiff_t(e), 0);
        else
            ok = false;
        i = e;
    }
    return ok;
}

void block_pool::unmap_alias_from(alias& a, size_t from) noexcept {
    // A refusal (a context the driver has broken) leaves a chunk mapped twice, which must then
    // never be released: from now on the pool releases no chunk (alias_stuck_).
    const bool ok = unmap_alias_range(a, from, a.handles.size());
    alias_stuck_ |= !ok;
    if (!ok) return;  // the refused positions stay known as mapped; the address space is leaked with them
    a.handles.resize(from);  // shrinks: cannot throw
    a.src.resize(from);
    if (!from) backend_.va_free(a.base, a.va);
}

void block_pool::drop_aliases(size_t idle_keep, bool tails) noexcept {
    size_t idle = 0;
    for (const alias& a : aliases_) idle += !a.user;
    while (idle > idle_keep) {
        auto oldest = aliases_.end();
        for (auto it = aliases_.begin(); it != aliases_.end(); ++it)
            if (!it->user && (oldest == aliases_.end() || it->used < oldest->used)) oldest = it;
        unmap_alias_from(*oldest, 0);
        aliases_.erase(oldest);
        --idle;
    }
    if (tails)
        for (alias& a : aliases_)
            if (a.user) unmap_alias_from(a, a.user->size / chunk_);
}

void block_pool::dissolve(segment* st, api_id api) {
    // Free-set nodes for the lenders first: the only step below that could throw, and nothing has
    // changed yet if it does.
    free_set& fs = free_[pool_index(st->pool)];
    std::vector<free_set::node_type> nodes;
    nodes.reserve(st->lent.size());
    for (block* l : st->lent) nodes.push_back(fs.extract(fs.insert(l).first));  // l is in no free set
    block* b = st->first;  // wholly free: one block
    alias* al = alias_of(st);
    // Kept mapped (idle) for the next stitch, or unmapped before any lender is free again.  A
    // driver that refuses the unmap has a broken context: the stitched segment stays out of
    // service (its block lent, never handed out) and its lenders stay lent, so no chunk is
    // released while it may still be mapped twice.
    if (!cfg_.stitch_keep && al && !unmap_alias_range(*al, 0, st->chunks.size())) {
        free_erase(b);
        free_bytes_ -= b->size;
        b->state = block_state::lent;
        // No event says "out of service": the log goes on showing the block free, so stderr says
        // it (a pool review found the rebuilt free blocks one more than the pool's).
        write_stderr({"gpumem: the driver refused to unmap a stitched range on device ", decimal(device_), ": its ",
                      decimal((long long)(b->size >> 20)),
                      " MiB stay out of service, which the log still shows as a free block\n"});
        return;
    }
    // Logged before the address space goes back: after va_free the range may be anyone's.
    emit_segment(ev_kind::segment_free, api, st);
    untrack(st);
    if (al) {
        al->user = nullptr;
        if (!cfg_.stitch_keep) {
            unmap_alias_from(*al, 0);  // a tail past the segment, then the address space
            aliases_.erase(aliases_.begin() + (al - aliases_.data()));
        }
    }
    free_erase(b);
    free_bytes_ -= b->size;
    addr_erase(b);
    recycle(b);
    segments_.erase(st->base);
    for (block* l : st->lent) {
        if (spare_free_nodes_.empty() && !nodes.empty()) {  // make_free's insert then cannot throw
            spare_free_nodes_.push_back(std::move(nodes.back()));
            nodes.pop_back();
        }
        emit_chunks(api, l->seg, l->addr, l->size, ev_kind::segment_map);
        make_free(l);
    }
    delete st;
    --n_stitched_;
    ++dissolves_;
    drop_aliases(cfg_.stitch_keep, false);
}

bool block_pool::dissolve_free_stitched(api_id api) {
    // Unmapping does not wait for device work: only outside a capture, and only a segment whose
    // blocks' work is done: every free settled, or the ordered release that last handed one of
    // its blocks out reached (its settle_gen; 0 when fences or a sync released them all).
    if (!n_stitched_ || !can_sync()) return false;
    const bool all_settled = ordered_frees_settled();
    const uint64_t reached = all_settled ? ordered_releases_ : order_reached();
    std::vector<segment*> idle;
    try {
        for (auto& [base, s] : segments_)
            if (s->stitched() && s->first->state == block_state::free && !s->first->next && s->settle_gen <= reached)
                idle.push_back(s);
    } catch (...) {
        return false;  // no host memory for the list: they stay, as they may
    }
    for (segment* s : idle) dissolve(s, api);
    return !idle.empty();
}

void block_pool::stitch_counts(uint64_t* made, uint64_t* chunks, uint64_t* dissolved, uint64_t* reused) const noexcept {
    held lk(*this);
    if (reused) *reused = alias_reuses_;
    if (made) *made = stitches_;
    if (chunks) *chunks = stitched_chunks_;
    if (dissolved) *dissolved = dissolves_;
}

}  // namespace gpumem
