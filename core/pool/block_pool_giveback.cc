// Memory back to the driver: idle segments, whole free chunks, the headroom kept for the driver, the OOM path.
#include "core/pool/block_pool.h"

#include <algorithm>
#include <iterator>
#include <new>
#include <vector>

#include "core/pool/block_pool_util.h"

namespace gpumem {

// ---- giving back ---------------------------------------------------------------------------

void block_pool::release_free_segments(api_id api, uint64_t want) {
    // Idle: every block free or unmapped.  A stitched segment's chunks are its lenders': it is
    // dissolved (OOM path), never released here.
    // No unmap during a capture (one may have opened during a caller's wait), and no release then.
    if (!can_sync()) return;
    drop_aliases(0, true);  // a chunk still mapped a second time would stay allocated after its release
    auto idle = [this](const segment* s) {
        if (s->stitched() || (s->vmm() && alias_stuck_)) return false;
        for (const block* b = s->first; b; b = b->next)
            if (b->state != block_state::free && b->state != block_state::unmapped) return false;
        return true;
    };
    const uint64_t before = reserved_;
    if (want == UINT64_MAX) {  // all of them, in address order
        for (auto it = segments_.begin(); it != segments_.end();) {
            segment* s = it->second;
            const uint64_t base = s->base;
            if (idle(s) && !release_segment(s, api)) return;
            // Found again by address: a release may settle frees, and a settle may dissolve (erase)
            // a stitched segment anywhere, the next one included.
            it = segments_.upper_bound(base);
        }
        return;
    }
    // Bounded (headroom): as few bytes past `want` as the segments allow.  Each round takes the
    // smallest idle segment that covers what is still lacking, else the largest (on the H200 the
    // address order gave back all 169 cuMemAlloc segments, 142 GB, for a 256 MiB headroom).
    std::vector<segment*> cand;
    try {
        for (auto& [base, s] : segments_)
            if (s->mapped && idle(s)) cand.push_back(s);
    } catch (...) {
        return;  // no host memory for the list: nothing given back, as when none is idle
    }
    while (!cand.empty() && before - reserved_ < want) {
        const uint64_t lack = want - (before - reserved_);
        size_t pick = 0;
        for (size_t k = 1; k < cand.size(); ++k) {
            const bool k_covers = cand[k]->mapped >= lack, pick_covers = cand[pick]->mapped >= lack;
            if (k_covers != pick_covers ? k_covers
                                        : (k_covers ? cand[k]->mapped < cand[pick]->mapped : cand[k]->mapped > cand[pick]->mapped))
                pick = k;
        }
        segment* s = cand[pick];
        cand.erase(cand.begin() + std::ptrdiff_t(pick));
        if (!release_segment(s, api)) return;
    }
}

bool block_pool::release_segment(segment* s, api_id api) {
    // Unmapping does not wait for device work, as cuMemFree does: a block freed for immediate
    // reuse may still have its last owner's work queued.
    if (s->vmm() && !ordered_frees_settled() && !settle_frees(api)) return false;
    // A capture opened on another thread during that wait (or a caller's): no unmap and no
    // cuMemFree now; the segment stays cached until the next chance.
    if (!can_sync()) return false;
    // Logged before the driver call, so a reuse of the address by anyone else is logged after.
    // If the driver refuses, the context is broken: the segment is forgotten (leaked) anyway,
    // which keeps the pool and its log in agreement.
    emit_segment(ev_kind::segment_free, api, s);
    backend_release(s);
    for (block* b = s->first; b;) {
        block* n = b->next;
        if (b->state == block_state::free) {
            free_erase(b);
            free_bytes_ -= b->size;
        }
        if (b->state == block_state::unmapped) hole_erase(b);
        addr_erase(b);
        recycle(b);
        b = n;
    }
    reserved_ -= s->mapped;
    segments_.erase(s->base);
    delete s;
    return true;
}

// Memory is short: give back every physical chunk that lies wholly inside a free block, in every
// VMM segment, including segments that still hold live blocks.  The free block is cut into a free
// head, an unmapped middle and a free tail (heads and tails share a chunk with a live block).
// The caller has made sure no work on a free block is left (unsettled_frees_ == 0: a sync, fences or
// a wait for every stream since the last free made for immediate reuse).
uint64_t block_pool::unmap_free_chunks(api_id api, uint64_t want, const block* keep, bool part) {
    uint64_t given = 0;
    drop_aliases(0, true);  // a chunk still mapped a second time would stay allocated after its release
    if (alias_stuck_) return 0;
    for (auto& [base, s] : segments_) {
        if (!s->vmm() || s->mapped == 0 || s->stitched()) continue;  // a stitched segment's chunks are lent to it
        for (block* b = s->first; b; b = b->next) {
            if (given >= want) return given;
            if (b->state != block_state::free) continue;
            if (keep && (b == keep->prev || b == keep->next)) continue;
            const uint64_t lo = round_up(b->addr - s->base, chunk_);
            uint64_t hi = (b->addr + b->size - s->base) / chunk_ * chunk_;
            if (hi <= lo) continue;
            // part: no more than is wanted, the rest of a large free block stays mapped (a headroom
            // of 256 MiB out of a freed GPU unmapped all 139 GiB in 3 s, H200 run 106).  The trim
            // takes whole blocks: on the replayed GPT-2 log, cut to the excess, its peak rose from
            // 13.67 to 13.80 GiB.
            if (part && hi - lo > want - given) hi = lo + round_up(want - given, chunk_);
            // Host bookkeeping first (it can fail), then the driver.
            block* mid = new_block();
            block* tail = hi < b->addr + b->size - s->base ? new_block() : nullptr;
            if (!mid || (hi < b->addr + b->size - s->base && !tail)) {
                if (mid) recycle(mid);
                if (tail) recycle(tail);
                return given;  // no host memory: keep the rest mapped
            }
            const uint64_t end = b->addr + b->size;
            // The hole joins the hole set before anything changes (the insert can fail).
            block* const hole = b->addr < s->base + lo ? mid : b;
            if (hole == mid) {
                mid->addr = s->base + lo;
                mid->seg = s;
            }
            try {
                hole_insert(hole);
            } catch (...) {
                recycle(mid);
                if (tail) recycle(tail);
                throw;
            }
            free_erase(b);
            free_bytes_ -= b->size;
            block* head = nullptr;
            block* cut = b;
            if (b->addr < s->base + lo) {  // b keeps the head
                head = b;
                head->size = s->base + lo - head->addr;
                cut = mid;
                mid = nullptr;
                cut->addr = s->base + lo;
                cut->seg = s;
                cut->prev = head;
                cut->next = head->next;
                if (head->next) head->next->prev = cut;
                head->next = cut;
                addr_insert(cut);
                free_insert(head);
                free_bytes_ += head->size;
            }
            cut->size = hi - lo;
            cut->state = block_state::unmapped;
            if (mid) recycle(mid);
            if (tail) {
                tail->addr = s->base + hi;
                tail->size = end - tail->addr;
                tail->seg = s;
                tail->state = block_state::free;
                tail->prev = cut;
                tail->next = cut->next;
                if (cut->next) cut->next->prev = tail;
                cut->next = tail;
                addr_insert(tail);
                free_insert(tail);
                free_bytes_ += tail->size;
            }
            emit_chunks(api, s, s->base + lo, hi - lo);
            const size_t i = lo / chunk_, n = (hi - lo) / chunk_;
            unmap_chunks(s->base + lo, n, &s->chunks[i]);
            for (size_t k = i; k < i + n; ++k) s->chunks[k] = 0;
            s->mapped -= hi - lo;
            reserved_ -= hi - lo;
            given += hi - lo;
            // A hole next to a hole becomes one: an arena maps a hole as a whole range.
            if (block* nx = cut->next; nx && nx->state == block_state::unmapped) {
                hole_erase(nx);
                absorb_next(cut);
            }
            if (block* pr = cut->prev; pr && pr->state == block_state::unmapped) {
                hole_erase(cut);
                absorb_next(pr);
                cut = pr;
            }
            b = tail ? tail : cut;
        }
    }
    return given;
}

void block_pool::release_cached() noexcept {
    op_lock lk(*this);
    try {
        if (!can_sync()) return;
        if (!pending_.empty() && !poisoned_) reclaim(api_id::none, true);
        if (n_stitched_ && unsettled_frees_) settle_frees(api_id::none);
        dissolve_free_stitched(api_id::none);  // their lenders' segments may then be wholly free
        release_free_segments(api_id::none);   // kept stitched ranges first, then the segments
    } catch (...) {
        poisoned_ = true;
    }
    check_after_op();
}

uint64_t block_pool::unmap_settled(api_id api, uint64_t want, const block* keep, bool part) {
    return chunk_ && !unsettled_frees_ && can_sync() ? unmap_free_chunks(api, want, keep, part) : 0;
}

void block_pool::release_unused(api_id api, uint64_t want) {
    // Again: a capture opened on another thread during the caller's waits forbids the frees below.
    if (!can_sync()) return;
    // (Frees of ordered releases whose last event a query finds reached need no wait.)
    if (chunk_ && !ordered_frees_settled()) settle_frees(api);
    const uint64_t before = reserved_;
    auto given = [&] { return before > reserved_ ? before - reserved_ : 0; };
    // Some bytes only (headroom): free chunks may be enough, and an empty arena is the pool's whole
    // memory, which the next growth would map again.
    if (want != UINT64_MAX && unmap_settled(api, want, nullptr, true) >= want) return;
    dissolve_free_stitched(api);
    // cuMemAlloc segments: as many as make up want.
    if (given() < want) release_free_segments(api, want == UINT64_MAX ? want : want - given());
    // Again: settle_frees may have waited (a capture opened meanwhile forbids unmapping).
    if (given() < want) unmap_settled(api, want - given(), nullptr, want != UINT64_MAX);
}

uint64_t block_pool::headroom_limit() const noexcept {
    return total_ ? std::min(cfg_.headroom, total_ / 64) : cfg_.headroom;
}

void block_pool::set_short(bool now) noexcept {
    if (short_.exchange(now, std::memory_order_relaxed) != now) short_pools_.fetch_add(now ? 1 : -1, std::memory_order_relaxed);
}

void block_pool::note_driver_free(uint64_t free_b, uint64_t total) noexcept {
    if (total == 0) return;  // a backend that cannot say
    total_ = total;  // the device's size: also what no request can exceed (allocate's OOM path)
    if (!cfg_.headroom) return;  // the headroom off: its count is not kept
    free_at_look_ = free_b;
    reserved_at_look_ = reserved_;
    set_short(free_b < headroom_limit());
}

uint64_t block_pool::look_at_driver(uint64_t* total_out) noexcept {
    uint64_t free_b = 0, total = 0;
    mem_info(&free_b, &total);
    note_driver_free(free_b, total);
    if (total_out) *total_out = total;
    return free_b;
}

void block_pool::after_growth() noexcept {
    if (!cfg_.headroom || exiting_) return;
    // One cuMemGetInfo per growth only near the line: other allocators' memory may have brought
    // it closer than the count says, which the stats event's look (every GPUMEM_STATS_MS) catches.
    const uint64_t free_now = free_est();
    if (free_now == UINT64_MAX || free_now < 2 * headroom_limit()) look_at_driver();
}

uint64_t block_pool::make_headroom(api_id api) noexcept {
    if (!short_.load(std::memory_order_relaxed)) return 0;
    op_lock lk(*this);
    const uint64_t before = reserved_;
    try {
        if (exiting_ || poisoned_ || !can_sync()) return 0;
        const uint64_t free_b = look_at_driver();
        const uint64_t want = headroom_limit();
        // Nothing to give: no wait (the next function's first use looks again).
        if (!short_.load(std::memory_order_relaxed) || count_giveable() == 0) return 0;
        const uint64_t need = want - free_b;  // short: free_b < want
        // First what needs no wait: whole free chunks while every free is settled (safe reuse:
        // the free blocks' fences were reached).  Only if that falls short, the pending frees (a
        // wait on their fences) and the frees made for immediate reuse (a wait on the device).
        uint64_t given = 0;
        if (chunk_ && ordered_frees_settled()) given = unmap_free_chunks(api, need, nullptr, true);
        if (given < need && (pending_bytes_[0] | pending_bytes_[1]) != 0) reclaim(api, true);
        if (given < need) release_unused(api, need - given);
        look_at_driver();
    } catch (...) {
        poisoned_ = true;
    }
    check_after_op();
    return before > reserved_ ? before - reserved_ : 0;
}

uint64_t block_pool::give_back(api_id api) noexcept {
    op_lock lk(*this);
    const uint64_t before = reserved_;
    try {
        // grow()'s OOM path, for no request: every pending free, then everything unused.
        if (exiting_ || poisoned_ || !can_sync()) return 0;
        if ((pending_bytes_[0] | pending_bytes_[1]) != 0) reclaim(api, true);
        release_unused(api);
        look_at_driver();  // the headroom's look, after the give-back
    } catch (...) {
        poisoned_ = true;
    }
    check_after_op();
    return before > reserved_ ? before - reserved_ : 0;
}

uint64_t block_pool::giveable_bytes() const noexcept {
    // Never waits: the pool holds its lock through device waits (a fence, a synchronize), and a
    // query of free memory must not block behind them.  While another operation runs, the answer
    // of the last call that got the lock stands.
    held lk(*this, std::try_to_lock);
    if (!lk.lk.owns_lock()) return giveable_last_.load(std::memory_order_relaxed);
    const uint64_t n = count_giveable();
    giveable_last_.store(n, std::memory_order_relaxed);
    return n;
}

uint64_t block_pool::count_giveable() const noexcept {
    if (exiting_ || poisoned_) return 0;
    auto idle = [](const block* b) { return b->state == block_state::free || b->state == block_state::pending; };
    uint64_t n = 0;
    for (const auto& [base, s] : segments_) {
        if (s->stitched()) {  // its chunks are its lenders': they count once it is dissolvable
            if (idle(s->first))
                for (const block* l : s->lent) n += l->size;
            continue;
        }
        if (!s->vmm()) {  // a cuMemAlloc segment goes back whole or not at all
            bool all = true;
            for (const block* b = s->first; b && all; b = b->next) all = idle(b);
            if (all) n += s->size;
            continue;
        }
        // Runs of neighbouring idle blocks: pending blocks merge with their neighbours once released.
        for (const block* b = s->first; b;) {
            if (!idle(b)) {
                b = b->next;
                continue;
            }
            const uint64_t from = b->addr;
            uint64_t to = b->addr + b->size;
            for (b = b->next; b && idle(b); b = b->next) to = b->addr + b->size;
            const uint64_t lo = round_up(from - s->base, chunk_), hi = (to - s->base) / chunk_ * chunk_;
            if (hi > lo) n += hi - lo;
        }
    }
    return n;
}

}  // namespace gpumem
