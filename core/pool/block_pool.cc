// The caching block allocator's core: best-fit blocks in segments, allocate, free, lifecycle, queries and invariants.
// Its other parts: block_pool_vmm.cc (arenas, stitching), block_pool_fences.cc (when a free is reusable),
// block_pool_giveback.cc (memory back to the driver).
#include "core/pool/block_pool.h"

#include <algorithm>
#include <iterator>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <unordered_set>

#include "core/pool/block_pool_util.h"
#include "core/stderr_write.h"

namespace gpumem {
namespace {

// Spare tree nodes and block objects kept for reuse.  Safe reuse releases pending frees in
// batches (a fence covers an eighth of the sync budget: 8,192 frees of 512 B), and each release
// merges blocks back, erasing their nodes; with 64 spares kept the next batch of splits called
// malloc for almost every block again (callgrind on the emulated device, 512 B pairs: 850 more
// instructions per pair than immediate reuse).  A kept node costs about 48 bytes, a block 80.
constexpr size_t k_spare_nodes = 8192;
constexpr size_t k_spare_blocks = 8192;
constexpr size_t k_spare_fences = 64;  // fences waiting at once, and their event lists kept

}  // namespace

block_pool::block_pool(const pool_config& cfg, pool_backend& backend, event_sink* sink, int device, int ordinal) noexcept
    : cfg_(cfg), backend_(backend), sink_(sink), device_(int16_t(device)), ordinal_(uint8_t(ordinal)), immediate_(cfg.reuse != reuse_mode::safe) {
    try {
        // Fixed capacity: addr_erase/free_erase keep nodes only while it lasts, so they never
        // allocate (they run inside noexcept paths that must not fail halfway).
        spare_addr_nodes_.reserve(k_spare_nodes);
        spare_free_nodes_.reserve(k_spare_nodes);
        spare_large_nodes_.reserve(k_spare_nodes);
        fences_.reserve(k_spare_fences);
        spare_fence_events_.reserve(k_spare_fences);
        pending_.reserve(256);
    } catch (...) {
        // No spares: every insert allocates; still correct.
    }
}

block_pool::~block_pool() {
    forget_all();
    while (spare_blocks_) {
        block* n = spare_blocks_->next;
        delete spare_blocks_;
        spare_blocks_ = n;
    }
}

// ---- policy ---------------------------------------------------------------------------------

pool_id block_pool::pool_for(uint64_t size) const noexcept {
    return size <= cfg_.small_size ? pool_id::small : pool_id::large;
}

uint64_t block_pool::segment_size_for(pool_id p, uint64_t asize) const noexcept {
    if (p == pool_id::small) return cfg_.small_segment;
    if (asize < cfg_.min_large_alloc) return cfg_.large_segment;
    return round_up(asize, cfg_.large_round);
}

bool block_pool::should_split(pool_id p, uint64_t remaining) const noexcept {
    // Small pool: any remainder worth a block.  Large pool: only a remainder above large_split,
    // so big blocks are not chopped into slivers that only small requests could use (and small
    // requests never come here).
    return p == pool_id::small ? remaining >= cfg_.small_split : remaining > cfg_.large_split;
}

uint64_t block_pool::sync_budget() const noexcept {
    return std::max(cfg_.sync_budget, reserved_ / cfg_.sync_budget_div);
}

uint64_t block_pool::order_batch_for(uint64_t asize) const noexcept {
    constexpr uint64_t k_requests = 8;  // a batch is at most this many requests of asize
    // and, for requests under the batch's bytes, at least this many, up to twice those bytes:
    // with 32 MiB, 20 MiB pairs released at every other pair, and an allocation's median paid a
    // release (1.42 us a pair on an H100 against 0.78 with four; docs/benchmarks.md, "Run 145").
    constexpr uint64_t k_min_requests = 4;
    // Ordered releases only (events known to work: no driver call here to find out), and not
    // - under a synchronize's release, which has the sync budget for a batch;
    // - with trimming, which would unmap free chunks while the batch keeps grown ones pending:
    //   replayed over the GPT-2 log with GPUMEM_POOL_TRIM=32MiB, 1.154x the live peak against
    //   1.125x (docs/benchmarks.md, "Ordered releases in batches");
    // - once the driver's free memory, as counted (free_est()), is under an eighth of the device: near the limit a batch's growth scatters the live
    //   blocks over more chunks (the emulated training loop that needs 146 MiB under safe reuse
    //   without batches needed 152 with them), and the headroom kept for lazy loads is safe;
    // - once exit has begun (no driver call may follow).
    const uint64_t free_now = free_est();
    const bool roomy = free_now == UINT64_MAX || !total_ || free_now >= total_ / 8;
    const bool on = cfg_.order_batch && cfg_.order && !order_off_ && !immediate_ && !exiting_ && events_state_ > 0 &&
                    streams_ && streams_->usable() && !(chunk_ && cfg_.trim) && roomy;
    return on ? std::min(k_requests * asize, requests_within(k_min_requests, asize, cfg_.order_batch)) : 0;
}

bool block_pool::batch_pending(int i, uint64_t asize) const noexcept { return pending_bytes_[i] < order_batch_for(asize); }

// The driver's answer (a capture no hook of gpumem saw, on the legacy stream) once per operation,
// the backend's own count of captures at every later check of that operation: a 20 MiB pair
// with fences asked the driver three times (cuCtxGetCurrent and cuStreamIsCapturing each), and a
// capture begun by an unseen route between two checks of one operation is no more caught by the
// second than by the first.  After a blocking wait, though, the driver is asked again: a wait can
// last milliseconds.
bool block_pool::can_sync() noexcept {
    if (exiting_) return false;
    if (capture_checked_) return backend_.may_synchronize_again();
    capture_checked_ = backend_.may_synchronize();
    return capture_checked_;
}

// Event queries run under the stream set's lock, under which a capture is counted as it opens
// (capture_begin): a capture opened on another thread after the caller's can_sync() and before
// the queries would be invalidated by them (a cuEventQuery during a global-mode capture), so it is
// asked again inside the lock.  False: a capture is open now, ask nothing.  Queries are short;
// waits do not hold the lock (wait_oldest_fence).  Without a stream set (no hooks: tests, replay)
// there is nothing to hold, but the question is still asked.
bool block_pool::capture_guard(std::unique_lock<std::mutex>& held) noexcept {
    if (streams_) held = streams_->hold();
    return can_sync();  // after a wait, the driver itself is asked again (captures no hook saw)
}

// ---- node recycling -------------------------------------------------------------------------

block_pool::block* block_pool::new_block() noexcept {
    block* b = spare_blocks_;
    if (b) {
        spare_blocks_ = b->next;
        --n_spare_blocks_;
        *b = block{};
    } else {
        b = new (std::nothrow) block{};
    }
    if (b) b->pos = blocks_.end();
    return b;
}

void block_pool::recycle(block* b) noexcept {
    if (n_spare_blocks_ >= k_spare_blocks) {
        delete b;
        return;
    }
    b->next = spare_blocks_;
    spare_blocks_ = b;
    ++n_spare_blocks_;
}

void block_pool::addr_insert(block* b, const block* after) {
    // The hint is exact (b sorts right after `after`), so the insert takes amortized constant time.
    const addr_map::iterator hint = after && after->pos != blocks_.end() ? std::next(after->pos) : blocks_.end();
    if (!spare_addr_nodes_.empty()) {
        addr_map::node_type nh = std::move(spare_addr_nodes_.back());
        spare_addr_nodes_.pop_back();
        nh.key() = b->addr;
        nh.mapped() = b;
        b->pos = after ? blocks_.insert(hint, std::move(nh)) : blocks_.insert(std::move(nh)).position;
    } else {
        b->pos = blocks_.emplace_hint(hint, b->addr, b);
    }
    if (b->pos->second != b) b->pos = blocks_.end();  // its address taken (never, validate says): erase nothing
}

void block_pool::addr_erase(block* b) noexcept {
    if (b->pos == blocks_.end()) return;
    addr_map::node_type nh = blocks_.extract(b->pos);
    b->pos = blocks_.end();
    if (spare_addr_nodes_.size() < spare_addr_nodes_.capacity()) spare_addr_nodes_.push_back(std::move(nh));
}

void block_pool::pending_large_erase(std::multiset<uint64_t>::iterator it) noexcept {
    std::multiset<uint64_t>::node_type nh = pending_large_.extract(it);
    if (spare_large_nodes_.size() < spare_large_nodes_.capacity()) spare_large_nodes_.push_back(std::move(nh));
}

void block_pool::free_insert(block* b) {
    free_set& fs = free_[pool_index(b->seg->pool)];
    if (!spare_free_nodes_.empty()) {
        free_set::node_type nh = std::move(spare_free_nodes_.back());
        spare_free_nodes_.pop_back();
        nh.value() = b;
        fs.insert(std::move(nh));
    } else {
        fs.insert(b);
    }
}

// Must run before b->size or b->addr change: the set is ordered by them.
void block_pool::free_erase(block* b) noexcept {
    free_set::node_type nh = free_[pool_index(b->seg->pool)].extract(b);
    if (nh && spare_free_nodes_.size() < spare_free_nodes_.capacity()) spare_free_nodes_.push_back(std::move(nh));
}

// ---- events ---------------------------------------------------------------------------------

void block_pool::emit_block(ev_kind ev, api_id api, const block* b, uint64_t requested, int err,
                            uint32_t stack) noexcept {
    if (!sink_) return;
    event e{};
    e.ev = ev;
    e.kind = mem_kind::device;
    e.api = api;
    e.flags = ef_pooled;
    e.err = err;
    e.b.size = requested;
    e.b.stack = stack;
    if (b) {
        e.pool = b->seg->pool;
        e.b.ptr = b->addr;
        e.b.asize = b->size;
        e.b.seg = b->seg->base;
    }
    send(e);
}

void block_pool::emit_segment(ev_kind ev, api_id api, const segment* s) noexcept {
    if (!sink_) return;
    event e{};
    e.ev = ev;
    e.kind = mem_kind::device;
    e.api = api;
    e.pool = s->pool;
    e.b.ptr = s->base;
    e.b.size = s->size;
    // An arena maps only its start at first: asize says how much (docs/log-format.md).
    if (ev == ev_kind::segment_alloc && s->mapped != s->size) e.b.asize = s->mapped;
    send(e);
}

void block_pool::emit_chunks(api_id api, const segment* s, uint64_t addr, uint64_t bytes, ev_kind ev) noexcept {
    if (!sink_) return;
    event e{};
    e.ev = ev;
    e.kind = mem_kind::device;
    e.api = api;
    e.pool = s->pool;
    e.b.ptr = addr;
    e.b.size = bytes;
    e.b.seg = s->base;
    send(e);
}

void block_pool::emit_simple(ev_kind ev, api_id api, uint64_t count) noexcept {
    event e{};
    if (!sink_) return;
    e.ev = ev;
    e.api = api;
    e.c.count = count;
    send(e);
}

void block_pool::note_wait(uint64_t t0_ns) noexcept {
    const uint64_t d = steady_ns() - t0_ns;
    wait_ns_unlogged_ += d;
    wait_ns_total_ += d;
}

block_pool::fence_timer::fence_timer(block_pool& p) noexcept : p_(p) {
    if (p_.fence_depth_++ == 0) t0_ = steady_ns();
}

void block_pool::fence_timer::stop() noexcept {
    if (!running_) return;
    running_ = false;
    if (--p_.fence_depth_ != 0) return;
    const uint64_t d = steady_ns() - t0_;
    p_.fence_ns_unlogged_ += d;
    p_.fence_ns_total_ += d;
}

void block_pool::emit_oom(api_id api, uint64_t size) noexcept {
    if (!sink_) return;
    event e{};
    e.ev = ev_kind::oom;
    e.kind = mem_kind::device;
    e.api = api;
    e.err = k_cuda_oom;
    e.p = snapshot_locked();
    e.p.size = size;
    if (!exiting_) mem_info(&e.p.gpu_free, &e.p.gpu_total);
    if (!exiting_) note_driver_free(e.p.gpu_free, e.p.gpu_total);
    if (streams_) e.p.streams = uint32_t(std::min<uint64_t>(streams_->count(ctx_), UINT32_MAX));
    send(e);
}

// ---- allocation -----------------------------------------------------------------------------

block_pool::block* block_pool::find_free(pool_id p, uint64_t asize) noexcept {
    block key;
    key.size = asize;
    key.addr = 0;
    free_set& fs = free_[pool_index(p)];
    auto it = fs.lower_bound(&key);
    // A stitched segment's one block is never split (take): it serves only a request that needs
    // all its chunks, or a small request would hold them all.
    while (n_stitched_ && it != fs.end() && (*it)->seg->stitched() && round_up(asize, chunk_) != (*it)->size) ++it;
    return it == fs.end() ? nullptr : *it;
}

bool block_pool::use_vmm() noexcept {
    if (!vmm_decided_) {
        vmm_decided_ = true;
        const uint64_t g = cfg_.vmm ? backend_.vmm_granularity() : 0;
        no_vmm_device_ = cfg_.vmm && g == 0;
        // Chunks must keep blocks 512 B-aligned and be a whole number of blocks; GPUMEM_POOL_CHUNK
        // asks for larger ones (a whole number of granules).  A GPUMEM_POOL_ROUND the granule is
        // no multiple of: cuMemAlloc segments, by that request.
        chunk_ = g != 0 && g % cfg_.round == 0 ? std::max(g, round_up(cfg_.chunk, g)) : 0;
    }
    return chunk_ != 0;
}

// Calls f(first, n) for each maximal run [first, first + n) of mapped chunks (non-zero handles):
// one backend call per run rather than per chunk.
template <class F>
static void for_each_mapped_run(const std::vector<uint64_t>& chunks, F&& f) {
    const size_t n = chunks.size();
    for (size_t i = 0; i < n;) {
        if (!chunks[i]) {
            ++i;
            continue;
        }
        size_t j = i;
        while (j < n && chunks[j]) ++j;
        f(i, j - i);
        i = j;
    }
}

void block_pool::track(segment* s) noexcept {
    if (s->in_ranges) return;
    s->range_slot = ranges_.add(s->base, s->size);
    s->in_ranges = true;
}

void block_pool::untrack(segment* s) noexcept {
    if (!s->in_ranges) return;
    ranges_.remove(s->range_slot);
    s->in_ranges = false;
}

void block_pool::backend_release(segment* s) noexcept {
    // Out of the table before the driver call: a cuMemFree of the segment that comes back into the
    // hooks (through another interposer) must reach the driver.
    untrack(s);
    if (!s->vmm()) {
        backend_.segment_free(s->base);
        return;
    }
    // A chunk still mapped a second time would stay allocated after its release.
    drop_aliases(0, true);
    // The mapped chunks (the unmapped ones went back earlier), then the address space.
    for_each_mapped_run(s->chunks, [&](size_t i, size_t n) {
        unmap_chunks(s->base + i * chunk_, n, &s->chunks[i]);
        for (size_t k = i; k < i + n; ++k) s->chunks[k] = 0;
    });
    backend_.va_free(s->base, s->size);
}

int block_pool::new_segment(pool_id p, uint64_t seg_size, api_id api, block** out, bool plain, uint64_t map_bytes) {
    if (exiting_) return k_cuda_deinitialized;
    uint64_t base = 0;
    segment* s = new (std::nothrow) segment{};
    if (!s) return k_cuda_oom;
    if (!plain && use_vmm()) {
        // Address space, then one physical chunk per granule: chunks that end up inside free
        // ranges can go back to the driver one by one (unmap_free_chunks).
        seg_size = round_up(seg_size, chunk_);
        map_bytes = map_bytes ? std::min(round_up(map_bytes, chunk_), seg_size) : seg_size;
        // A growth the driver cannot hold (map_chunks would decline it): declined before the
        // address space and the slot list (an arena's: one per chunk of the device and an eighth),
        // which it would make only to undo.  Kept chunks map first, so only the rest counts.
        const uint64_t kept = uint64_t(loose_.size()) * chunk_;
        if (map_bytes > kept && foreseen_short(map_bytes - kept)) {
            delete s;
            return k_cuda_oom;
        }
        try {
            s->chunks.assign(seg_size / chunk_, 0);
        } catch (...) {
            delete s;
            return k_cuda_oom;
        }
        int rc = backend_.va_reserve(seg_size, &base);
        if (rc == k_cuda_success) {
            rc = map_chunks(base, map_bytes / chunk_, s->chunks.data());
            if (rc != k_cuda_success) backend_.va_free(base, seg_size);
        }
        if (rc != k_cuda_success) {
            delete s;
            return rc;
        }
    } else {
        const int rc = backend_.segment_alloc(seg_size, &base);
        if (rc != k_cuda_success) {
            delete s;
            return rc;
        }
    }
    const uint64_t mapped = s->vmm() ? map_bytes : seg_size;
    s->base = base;
    s->size = seg_size;
    s->mapped = mapped;
    s->pool = p;

    block* b = new_block();
    block* hole = mapped < seg_size ? new_block() : nullptr;
    bool in_segments = false, in_blocks = false, hole_in_blocks = false, hole_in_holes = false;
    try {
        if (!b || (mapped < seg_size && !hole)) throw std::bad_alloc();
        s->first = b;
        b->addr = base;
        b->size = mapped;
        b->seg = s;
        b->state = block_state::free;
        segments_.emplace(base, s);
        in_segments = true;
        addr_insert(b);
        in_blocks = true;
        if (hole) {  // the arena's unmapped rest
            hole->addr = base + mapped;
            hole->size = seg_size - mapped;
            hole->seg = s;
            hole->state = block_state::unmapped;
            hole->prev = b;
            b->next = hole;
            addr_insert(hole);
            hole_in_blocks = true;
            hole_insert(hole);
            hole_in_holes = true;
        }
        free_insert(b);
    } catch (...) {
        // Host memory ran out while recording the segment: hand it back (if allowed) and report OOM.
        if (hole_in_holes) hole_erase(hole);
        if (hole_in_blocks) addr_erase(hole);
        if (in_blocks) addr_erase(b);
        if (in_segments) segments_.erase(base);
        if (b) recycle(b);
        if (hole) recycle(hole);
        if (can_sync()) backend_release(s);  // unused: no device work can touch it yet
        delete s;
        return k_cuda_oom;
    }
    reserved_ += mapped;
    free_bytes_ += mapped;
    track(s);
    emit_segment(ev_kind::segment_alloc, api, s);
    *out = b;
    return k_cuda_success;
}

// The free lists missed.  Decides between releasing pending frees (one sync) and a new segment;
// on OOM releases everything it can and retries once.
block_pool::block* block_pool::grow(pool_id p, uint64_t asize, api_id api, int* err) {
    if (exiting_) {  // the driver may be gone: no backend call at all (docs/pool.md, lifecycle)
        *err = k_cuda_deinitialized;
        return nullptr;
    }
    const uint64_t seg_size = segment_size_for(p, asize);
    const int i = pool_index(p);
    block* b = nullptr;

    // Amortized sync: worth it once enough bytes wait (one sync releases them all), when the new
    // segment would itself be at least the budget and the pending bytes might cover the request,
    // or when the request is large and pending bytes cover it twice.  Growing instead for large
    // requests makes dedicated segments that outlive the step: on GPT-2 with varying batch sizes
    // (docs/benchmarks.md) the budget alone let reserved memory reach 1.6x PyTorch's, as the budget
    // grows with reserved.  "Twice" and not "once": a loop of one large size then syncs every
    // other pair instead of every pair, for the same peak on the GPT-2 trace (3986 vs 3982 MiB).
    if (pending_bytes_[i] != 0 && can_sync()) {
        // Fences already reached cost one cuEventQuery each to cash in: always worth a look.
        if (!fences_.empty() && poll_fences(api) == k_cuda_success && (b = find_free(p, asize))) return b;
    }
    // Under ordered release, a few pending frees wait for more (batch_pending): one release then
    // hands out a batch, where a loop of one size paid an event record at every pair.  The growth
    // holds at most the batch more; memory short, the OOM path below releases them all, and a
    // growth refused otherwise releases them before the refusal is the answer.
    const bool batched = pending_bytes_[i] != 0 && batch_pending(i, asize);
    // The pending frees of pool p, released where they serve this request rather than grow.
    auto release_pending = [&]() -> block* {
        if (pending_bytes_[i] == 0 || !can_sync()) return nullptr;
        // An old pending block that fits: wait for its fence rather than grow (see wait_for_old_fit).
        if (block* f = wait_for_old_fit(api, p, asize) ? find_free(p, asize) : nullptr) return f;
        const uint64_t budget = sync_budget();
        const uint64_t pend = pending_bytes_[i];
        if (pend >= budget || (seg_size >= budget && pend >= asize) ||
            (asize >= cfg_.min_large_alloc && pend >= 2 * asize)) {
            // With fences, block only when memory is short: twice the budget waits, so reserved
            // memory stays within about two budgets of the live peak while the GPU runs behind.
            if (reclaim(api, pend >= 2 * budget, p, asize)) return find_free(p, asize);
        }
        return nullptr;
    };
    if (!batched && (b = release_pending())) return b;

    // Trim (virtual memory, GPUMEM_POOL_TRIM > 0): when growing would lift reserved memory more
    // than `trim` above the live blocks plus this request, first give back the excess in whole free
    // chunks.  Only with every free settled (fences, or no immediate reuse since the last sync), so
    // it never waits.  Reserved memory then follows the live bytes rounded to chunks instead of a
    // fragmented pool's high-water mark: 2x the live peak on a GPT-2 with varying sequence lengths
    // (docs/benchmarks.md), as PyTorch's default allocator also reserves.
    // Not during a capture (can_sync): cuMemUnmap does not wait, and a graph may still run there.
    const bool arenas = use_arenas();
    if (chunk_ && cfg_.trim && can_sync() && ordered_frees_settled()) {
        // With arenas the growth maps only what the hole it will use lacks; the free blocks
        // beside that hole are kept, or the trim would unmap what the growth maps straight back.
        uint64_t grow_bytes = seg_size;
        const block* keep = nullptr;
        if (arenas) grow_bytes = arena_growth(p, asize, &keep);
        if (reserved_ + grow_bytes > allocated_ + asize + cfg_.trim)
            unmap_free_chunks(api, reserved_ + grow_bytes - (allocated_ + asize + cfg_.trim), keep);
    }

    // Stitching (GPUMEM_POOL_STITCH): a large request whose growth would set a new high-water mark
    // takes scattered free chunks instead, when there are enough.  Only while frees wait for
    // their fences: under immediate reuse a freed stitched block is settled only by a wait on the
    // device, so its segment (and its lenders' chunks) would stay until memory ran short
    // (the first cut, replayed on one stream, reserved 23.08 GiB against 14.69 without stitching:
    // docs/benchmarks.md, "Stitching").
    if (arenas && cfg_.stitch && p == pool_id::large && !immediate_ &&
        reserved_ + arena_growth(p, asize, nullptr) > hwm_ && (b = stitch(p, asize, api)))
        return b;
    int rc;
    {
        struct foresight {  // foresee_ for this growth only, however it ends
            bool& on;
            explicit foresight(bool& f) : on(f) { on = true; }
            ~foresight() { on = false; }
        } f(foresee_);
        rc = arenas ? arena_grow(p, asize, api, &b) : new_segment(p, seg_size, api, &b);
    }
    // An arena the driver would not reserve for another reason than memory (its size): a segment.
    if (arenas && rc != k_cuda_success && rc != k_cuda_oom) rc = new_segment(p, seg_size, api, &b);
    // Virtual memory refused for another reason than memory (a setting that forbids cuMemCreate or
    // cuMemSetAccess, say): a cuMemAlloc segment, which is what the program would have got.
    if (chunk_ && rc != k_cuda_success && rc != k_cuda_oom) rc = new_segment(p, seg_size, api, &b, true);
    if (rc == k_cuda_success) return b;
    if (rc != k_cuda_oom) {
        // The batch left waiting would have served: released now, as without batches, unless the
        // driver just said a stream capture is open (900-907, CUDA_ERROR_STREAM_CAPTURE_*), one
        // no hook saw: then no event or sync may follow, and its answer is the program's.
        const bool capture = rc >= 900 && rc <= 907;
        if (batched && !capture && (b = release_pending())) return b;
        *err = rc;  // e.g. a capture that forbids cuMemAlloc: return what the driver said
        return nullptr;
    }

    // OOM: first the pending frees of both pools (waiting on their fences), then (arenas) whole
    // free chunks that make up what the growth lacks and the growth again, then the cached free
    // segments, then (virtual memory) every whole chunk inside a free range, then retry in fresh
    // address space with a segment of just the request, rounded to chunks.  With VMM this makes
    // the pool's limit the driver's: it fails only when the chunks holding live blocks plus the
    // request do not fit (docs/pool.md).  Unmapping needs every earlier free's work done
    // (cuMemUnmap does not wait, unlike cuMemFree): a block freed for immediate reuse since the
    // last sync may still have its last owner's work queued, so wait for every stream first.
    // A request larger than the whole device (its size known from the last look at the driver)
    // fails here, as the driver fails it, at once: no give-back could make room, and one emptied
    // the cache of a program probing for the largest allocation that fits.
    if (beyond_device(asize)) {
        *err = k_cuda_oom;
        return nullptr;
    }
    if (can_sync()) {
        if ((pending_bytes_[0] | pending_bytes_[1]) != 0) {
            if (reclaim(api, true, p, asize) && (b = find_free(p, asize))) return b;
        }
        // With arenas, first only what the growth lacks, from free blocks other than the ones
        // beside the hole it will use: giving back every free chunk made the next allocations map
        // them again, step after step, in a program whose peak is near the device's memory.
        // (Settled first: settling joins free blocks, which may recycle the one `keep` names.)
        if (arenas && chunk_) {
            if (!ordered_frees_settled()) settle_frees(api);
            const block* keep = nullptr;
            const uint64_t need = arena_growth(p, asize, &keep);
            // The chunks it gives back are kept and mapped again by the growth (moves), which saves
            // a release and a create each; those the growth does not take go back after it.
            struct mover {
                block_pool& pool;
                mover(block_pool& p, uint64_t chunks) : pool(p) {
                    try {
                        pool.loose_.reserve(chunks);
                        pool.moving_ = true;
                    } catch (...) {  // no host memory for the list: released as before
                    }
                }
                ~mover() {
                    pool.moving_ = false;
                    pool.release_loose();
                }
            };
            if (need) {
                bool grown = false;
                {
                    mover mv(*this, need / chunk_);
                    if (unmap_settled(api, need, keep, true) >= need) {
                        moving_ = false;  // the growth below only takes
                        grown = arena_grow(p, asize, api, &b) == k_cuda_success;
                    }
                }
                // Then a look (the kept chunks that went unused are the driver's again): a growth
                // the driver refused where the count said it would fit means other allocators
                // took memory, which the count would otherwise learn only at the next stats look,
                // and every miss until then would try a growth the driver refuses.
                if (cfg_.headroom && !exiting_) look_at_driver();
                if (grown) return b;
            }
        }
        release_unused(api);
        // The give-back raised the driver's free memory, which batches look at (order_batch_for):
        // counted again, or they would stay off until the next stats look.
        if (cfg_.headroom && !exiting_) look_at_driver();
    }
    // With arenas, first the holes just made (mapping into them joins their free neighbours).
    rc = arenas ? arena_grow(p, asize, api, &b) : k_cuda_oom;
    // Then, with or without arenas, the hole that needs the fewest chunks: a free head or tail left
    // beside a hole by this or an earlier give-back holds part of the request, so fewer chunks than
    // fresh address space may do (never more: a hole is whole chunks).  Without arenas the holes
    // were never mapped again, and a request that a free head plus one chunk would hold asked for
    // two: under GPUMEM_POOL_ARENA=off the emulated training loop that fits in 138 MiB alone
    // failed at 146 and 148 MiB.  With arenas this runs only where arena_grow failed (its lowest
    // hole needed more than the driver had, and a higher one may need less), so a layout the
    // default pool served before is unchanged.
    // (A map the driver refused for another reason leaves the hole as it was: fresh space next.)
    if (rc == k_cuda_oom && chunk_ && map_cheapest_hole(p, asize, api, &b) == k_cuda_success) rc = k_cuda_success;
    // Then fresh address space with just the request's chunks mapped.  Without arenas it spans the
    // segment the request would have had (20 MiB under MIN_LARGE_ALLOC), the rest a hole: the
    // block's rest before it splits off (take), and a later give-back's retry maps the hole joined
    // to it.  Reserved at the request's chunks only, a 3 MiB block held 4 MiB for good: the
    // training loop failed at 142 and 144 MiB too, and filling 584 MiB with 3 MiB blocks stopped
    // two blocks short of the driver alone.
    if (rc == k_cuda_oom) {
        const uint64_t mapped = chunk_ ? round_up(asize, chunk_) : seg_size;
        rc = new_segment(p, chunk_ && !arenas ? std::max(seg_size, mapped) : mapped, api, &b, false, mapped);
    }
    if (rc == k_cuda_success) return b;
    if (rc != k_cuda_oom && !chunk_) {  // virtual memory refused otherwise: the cuMemAlloc below
        *err = rc;
        return nullptr;
    }
    // Last resorts, before an OOM the driver alone might not have given: a free block of the other
    // pool (a small request in the tail of a large segment), then a segment of just the request's
    // rounded size from cuMemAlloc, which may fit where a whole chunk or segment does not.  On the
    // emulated device (512 B granularity) a training loop that fits in 150 MiB alone failed
    // without these (docs/pool.md).
    if ((b = find_free(p == pool_id::small ? pool_id::large : pool_id::small, asize))) return b;
    rc = new_segment(p, asize, api, &b, true);
    if (rc == k_cuda_success) return b;
    *err = rc;
    return nullptr;
}

// Hands out the front of free block b, splitting off the rest when the pool's threshold allows.
void block_pool::take(block* b, uint64_t asize, uint64_t requested) {
    free_erase(b);  // leaves a spare node, which the remainder's free_insert reuses
    free_bytes_ -= b->size;
    const uint64_t rem = b->size - asize;
    // Before a hole (an arena's growth edge) any rest splits off: kept inside the block, a 1 MiB
    // rest of a 3 MiB request in 4 MiB of chunks would be lost for good; split, the next growth
    // joins it.
    // A stitched segment holds its one block (a rest under a chunk): then it is wholly free, and
    // dissolved, as soon as that block comes back.
    // On virtual memory a rest that reaches into a chunk the request does not touch splits off too,
    // however small: kept in the allocated block it would hold that chunk, which memory short
    // could not give back, where the promise counts only the chunks under requests (docs/pool.md).
    // The random property test's OOM check found 2-4 MiB held so.  (Split at the request's end:
    // replayed over the GPT-2 log, 1.108x / 1.110x / 1.109x the live peak with the GPU 0 / 2 /
    // 20 ms behind, as without the rule, 1.102x / 1.111x / 1.113x; split at the next chunk's
    // start instead, which leaves no sliver beside the live block, 1.124x / 1.123x / 1.108x.)
    const bool pins_chunk = rem != 0 && chunk_ && b->seg->vmm() &&
                            round_up(b->addr + asize - b->seg->base, chunk_) < b->addr + b->size - b->seg->base;
    if (rem != 0 && !b->seg->stitched() &&
        (should_split(b->seg->pool, rem) || pins_chunk || (b->next && b->next->state == block_state::unmapped))) {
        if (block* r = new_block()) {
            r->addr = b->addr + asize;
            r->size = rem;
            r->seg = b->seg;
            r->state = block_state::free;
            bool ok = true;
            try {
                addr_insert(r, b);
            } catch (...) {
                ok = false;
            }
            if (ok) {
                try {
                    free_insert(r);
                } catch (...) {
                    addr_erase(r);
                    ok = false;
                }
            }
            if (ok) {
                r->prev = b;
                r->next = b->next;
                if (b->next) b->next->prev = r;
                b->next = r;
                b->size = asize;
                free_bytes_ += rem;
            } else {
                recycle(r);  // no host memory: hand out the whole block rather than fail
            }
        }
    }
    b->state = block_state::allocated;
    b->requested = requested;
    allocated_ += b->size;
    requested_ += requested;
}

int block_pool::allocate(uint64_t size, api_id api, uint64_t* out, uint32_t stack, bool quiet_oom) noexcept {
    if (!out) return k_cuda_invalid_value;
    op_lock lk(*this);
    if (poisoned_ && size != 0) return k_pool_declined;  // an update half done: the driver serves it
    if (drain_owed_) drain_if_owed(api);
    int err = k_cuda_oom;
    if (size == 0) {
        err = k_cuda_invalid_value;
    } else if (size <= k_max_request) {
        try {
            const pool_id p = pool_for(size);
            const uint64_t asize = round_up(size, cfg_.round);
            block* b = find_free(p, asize);
            // Not for the free block at a segment's end or before its unmapped rest (an arena's growth
            // room) while ordered releases still gather a batch of this pool (batch_pending): the
            // batch's own growth left it there, and the release would come at every pair of a loop
            // of one large size (on the H200, 20 MiB pairs under safe reuse 1.98 us against 0.97
            // without batches, run 142).  The batch's release, at a miss, merges the cut back; a
            // block inside the layout keeps the check (skipping it for every block raised the
            // replayed GPT-2 peak from 1.108x to 1.122x; for this one the peak is unchanged).
            const bool growth_room = b && (!b->next || b->next->state == block_state::unmapped);
            if (b && asize >= cfg_.min_large_alloc && b->size > 2 * asize + cfg_.large_split && !pending_large_.empty() &&
                !(growth_room && batch_pending(pool_index(p), asize))) {
                // The hit would use less than half of a bigger block while a tighter one waits for
                // a sync.  Cutting large blocks for want of a sync is what fragments the large pool:
                // replaying an H200 GPT-2 trace (tests/pool/pool_replay) put peak reserved at 2.3x
                // the live peak without this check.  "Less than half" rather than a closer fit: on
                // that trace it needs 29% fewer syncs for 1% more peak (docs/benchmarks.md).  With
                // fences and the GPU behind, no fence is reached yet: then an old pending block's
                // fence is waited for (wait_for_old_fit).  Without that wait the replay with the GPU
                // 100 ms behind reserved 2.67x the live peak, with it 1.19x (docs/benchmarks.md).
                auto tighter = pending_large_.lower_bound(asize);
                if (tighter != pending_large_.end() && *tighter < b->size && can_sync()) {
                    // Either may release frees, and a release may merge b away, even when it then
                    // fails: b is looked up again whatever they return.
                    if (!reclaim(api, false)) wait_for_old_fit(api, p, asize);
                    b = find_free(p, asize);
                }
            }
            // After exit began the driver is the program's again: a miss goes there, as it would
            // without gpumem (a late static destructor's allocation must not fail for the pool).
            if (!b && exiting_) return k_pool_declined;
            // A device without virtual memory where it was asked for: no pool (pool_config::vmm_only).
            if (!b && cfg_.vmm_only && !use_vmm() && no_vmm_device_) {
                if (!said_no_vmm_) {
                    said_no_vmm_ = true;
                    write_stderr({"gpumem: device ", decimal(device_),
                                  " has no virtual memory management: the pool serves nothing there (GPUMEM_POOL_VMM=off "
                                  "pools it in cuMemAlloc segments, which can run out of memory where the driver alone "
                                  "would not)\n"});
                }
                return k_pool_declined;
            }
            const uint64_t reserved_before = reserved_;
            if (!b) b = grow(p, asize, api, &err);
            if (reserved_ > reserved_before) after_growth();
            if (reserved_ > hwm_) hwm_ = reserved_;
            if (b) {
                take(b, asize, size);
                *out = b->addr;
                emit_block(ev_kind::alloc, api, b, size, 0, stack);
                check_after_op();
                return k_cuda_success;
            }
        } catch (...) {
            poisoned_ = true;  // an update may be half done: stop serving (see docs/pool.md)
            err = k_cuda_oom;
        }
    }
    if (err == k_cuda_oom && quiet_oom && size <= k_max_request && !beyond_device(round_up(size, cfg_.round))) {
        check_after_op();
        return k_pool_oom_quiet;
    }
    if (err == k_cuda_oom) emit_oom(api, size);
    emit_block(ev_kind::alloc_fail, api, nullptr, size, err, stack);  // the refused call's stack, as alloc's
    check_after_op();
    return err;
}

// ---- free -----------------------------------------------------------------------------------

// `left` takes over its right neighbour's bytes; the neighbour block is unlinked and recycled.
void block_pool::absorb_next(block* left) {
    block* right = left->next;
    left->size += right->size;
    left->next = right->next;
    if (right->next) right->next->prev = left;
    addr_erase(right);
    recycle(right);
}

void block_pool::make_free(block* b) {
    b->state = block_state::free;
    b->requested = 0;
    if (block* pr = b->prev; pr && pr->state == block_state::free) {
        free_erase(pr);
        free_bytes_ -= pr->size;
        absorb_next(pr);
        b = pr;
    }
    if (block* nx = b->next; nx && nx->state == block_state::free) {
        free_erase(nx);
        free_bytes_ -= nx->size;
        absorb_next(b);
    }
    free_insert(b);
    free_bytes_ += b->size;
}

void block_pool::release_before_capture() noexcept {
    // Only if the lock comes within 2 ms: another thread's short operation is waited out, but one
    // that waits on the GPU (an OOM's fence waits) is not, since a capture's begin must never
    // wait for that, which it never did before batches (the work waited on may need this thread).
    // A batch left pending then serves after the capture, as without this call.
    op_lock lk(*this, 20, 100000);
    if (!lk.owns()) return;
    try {
        // Only what a batch left (without batches a miss released them); can_sync() stops it when
        // another capture is open already.  One event record, no wait.
        if (!pending_.empty() && !poisoned_ && cfg_.order_batch && can_sync()) order_release(api_id::none);
    } catch (...) {
        poisoned_ = true;
    }
    check_after_op();
}

bool block_pool::deallocate(uint64_t ptr, api_id api, int* result, bool walking) noexcept {
    int dummy = 0;
    if (!result) result = &dummy;
    op_lock lk(*this, ptr, walking);
    if (!lk.owns()) return false;  // busy, and ptr is in none of its segments
    auto it = blocks_.find(ptr);
    if (it == blocks_.end() || it->second->state != block_state::allocated) {
        bool ours = it != blocks_.end();
        if (!ours) {
            auto s = segments_.upper_bound(ptr);
            ours = s != segments_.begin() && ptr - std::prev(s)->second->base < std::prev(s)->second->size;
        }
        if (!ours) return false;
        *result = k_cuda_invalid_value;
        if (sink_) {
            event e{};
            e.ev = ev_kind::free_fail;
            e.kind = mem_kind::device;
            e.api = api;
            e.flags = ef_pooled;
            e.err = k_cuda_invalid_value;
            e.b.ptr = ptr;
            send(e);
        }
        return true;
    }
    block* b = it->second;
    // Logged first, as every free is: the block's address is in no other state afterwards.
    emit_block(ev_kind::free, api, b, b->requested, 0);
    *result = k_cuda_success;
    try {
        // Pending: device work enqueued before this free may still use the block, so it waits for
        // the next synchronize (sync_release) before anyone can get it again.  A poisoned pool
        // leaves it pending for ever (leaked).  The two inserts first: they are the only steps
        // that can fail, and a failure leaves the block as it was.
        const bool pend = poisoned_ || !immediate_;
        if (!pend) ++unsettled_frees_;
        if (pend) {
            const bool large = b->seg->pool == pool_id::large;
            std::multiset<uint64_t>::iterator sized;
            if (large) {
                if (!spare_large_nodes_.empty()) {  // a kept node: no allocation
                    std::multiset<uint64_t>::node_type nh = std::move(spare_large_nodes_.back());
                    spare_large_nodes_.pop_back();
                    nh.value() = b->size;
                    sized = pending_large_.insert(std::move(nh));
                } else {
                    sized = pending_large_.insert(b->size);
                }
            }
            try {
                pending_.push_back(b);
            } catch (...) {
                if (large) pending_large_erase(sized);
                throw;
            }
            // Free order, for wait_for_old_fit: pending_[k]->seq == pending_[0]->seq + k, and
            // cum grows with the bytes the program has freed (validate_locked checks both).
            b->seq = next_seq_++;
            b->cum = pending_cum_ += b->size;
        }
        allocated_ -= b->size;
        requested_ -= b->requested;
        if (pend) {
            b->state = block_state::pending;
            pending_bytes_[pool_index(b->seg->pool)] += b->size;
            // One fence per batch of frees, recorded now so that it has usually been reached by
            // the time the memory is wanted.  A batch is an eighth of the sync budget and at least
            // fence_batch frees, or bytes that reach the budget and, for a free under it,
            // fence_batch times its size up to twice the budget (pool_config::fence_batch says
            // why); a single free when the last fence had no non-blocking stream to ask, as
            // batches amortize the per-stream calls and a lone legacy-stream event gains nothing
            // by waiting.
            unfenced_bytes_ += b->size;
            const uint64_t budget = sync_budget();
            // None where ordered release stands in for fences (order_alone): the miss that wants
            // the memory releases it with one event, and a fence here would be a second.
            const uint64_t batch = last_fence_streams_ ? cfg_.fence_batch : 1;
            if (!poisoned_ && streams_ && unfenced_bytes_ >= budget / 8 &&
                (pending_.size() - fenced_end() >= batch || unfenced_bytes_ >= requests_within(batch, b->size, budget)) &&
                !order_alone() && can_sync())
                record_fence();
        } else {
            make_free(b);
        }
    } catch (...) {
        poisoned_ = true;
    }
    check_after_op();
    return true;
}

// ---- lifecycle ------------------------------------------------------------------------------

void block_pool::forget_all() noexcept {
    set_short(false);
    free_at_look_ = UINT64_MAX;
    for (auto& [base, s] : segments_) {
        for (block* b = s->first; b;) {
            block* n = b->next;
            delete b;
            b = n;
        }
        delete s;
    }
    segments_.clear();
    ranges_.clear();
    aliases_.clear();
    alias_stuck_ = false;
    blocks_.clear();
    free_[0].clear();
    free_[1].clear();
    holes_[0].clear();
    holes_[1].clear();
    pending_.clear();
    pending_large_.clear();
    fences_.clear();          // the events went with the context (or the process is ending)
    hot_streams_.clear();     // and its streams
    spare_events_.clear();
    events_state_ = 0;
    // The ordered release's events went with the context too: a stream made in a new context of
    // the same handle must not wait on them (order_new_stream), nor a later release reuse them.
    order_event_ = order_scratch_ = 0;
    ordered_releases_ = order_reached_ = 0;
    order_marks_.clear();
    // Their blocks are gone too: nothing is unsettled (else ordered_frees_settled, which asks
    // only after an ordered release, would keep trimming and dissolves off in the next context).
    unsettled_frees_ = 0;
    unfenced_bytes_ = 0;
    reserved_ = allocated_ = requested_ = free_bytes_ = 0;
    pending_bytes_[0] = pending_bytes_[1] = 0;
    n_stitched_ = 0;
    hwm_ = 0;
    poisoned_ = false;
}

void block_pool::drop_all(context_end when) noexcept {
    op_lock lk(*this);
    // cuMemCreate chunks and address reservations belong to no context: cuCtxDestroy, a primary
    // context's reset and its last release free none of them (on the H200, run 116, they stay
    // mapped and usable in the device's next primary context), so forgetting them would keep the
    // pool's memory from the program's next context.  They go back here, before the driver ends
    // the context once the work queued in it is done (an unmap under a running kernel would fault
    // it; the context's end waits for that work too), or after the driver ended it, work and all
    // (unmap and release need no context: run 116).  The program's live blocks die with the
    // context, as its cudaMalloc memory does.  cuMemAlloc segments are the context's: the driver
    // frees them.  A poisoned pool's books may be half updated, and a capture (another thread's,
    // in global mode) forbids the synchronize and the unmaps: then leaked.
    bool any_vmm = false;
    for (auto& [base, s] : segments_) any_vmm |= s->vmm();
    // After the end only gpumem's own capture count is asked: the driver has no context to ask.
    const bool may = when == context_end::past ? !exiting_ && backend_.may_synchronize_again() : can_sync();
    if (when != context_end::forget && any_vmm && !poisoned_ && may) {
        if (when == context_end::coming) backend_.synchronize();  // a broken context still gets its memory back
        // The second mappings first (stitched segments' and idle ones): the lenders' release
        // frees the chunks.
        for (alias& a : aliases_) unmap_alias_from(a, 0);
        aliases_.clear();
        for (auto& [base, s] : segments_)
            if (s->vmm() && !s->stitched()) backend_release(s);
    }
    forget_all();
    backend_.forget_peers();  // peer access ended with the context; the slot may serve a new one
    emit_simple(ev_kind::context_reset, api_id::none, 0);
    check_after_op();
}

void block_pool::enter_safe_reuse(api_id api) noexcept {
    op_lock lk(*this);
    if (!immediate_ || cfg_.reuse != reuse_mode::automatic) return;
    immediate_ = false;
    emit_simple(ev_kind::reuse_safe, api, 0);
    // The drain.  Nothing is pending (the pool was immediate), so this releases no block; it makes
    // every earlier reuse safe against the new stream.  An empty pool has handed nothing out.  A
    // poisoned one releases nothing ever.  At exit no work follows.  During a capture no sync is
    // allowed: the drain is owed until the capture ends (capture_end, or the next allocate).
    if (segments_.empty() || poisoned_ || exiting_) return;
    drain_owed_ = true;
    drain_if_owed(api);
    check_after_op();
}

void block_pool::drain_if_owed(api_id api) noexcept {
    if (!drain_owed_ || !can_sync()) return;
    try {
        // A failed sync (broken context) stays owed.
        if (drain_by_fence(api) || sync_release(api)) drain_owed_ = false;
    } catch (...) {
        poisoned_ = true;
    }
}

void block_pool::settle_owed_drain() noexcept {
    op_lock lk(*this);
    if (!drain_owed_) return;
    drain_if_owed(api_id::none);
    check_after_op();
}

bool block_pool::reuse_is_immediate() const noexcept {
    held lk(*this);
    return immediate_;
}

thread_local int critical_section::depth = 0;

bool block_pool::release_all_at_exit() noexcept {
    exit_pending_.store(true, std::memory_order_relaxed);
    // This thread is inside a gpumem lock (or taking or leaving one): exit() from a signal handler
    // that interrupted it, which will never go on.  Waiting could be for ever; the flag takes
    // effect at the next operation (op_lock).
    if (critical_section::active()) return false;
    // Another thread's operation is waited for, so none reaches the driver after this call, but
    // for 2 s at most: one blocked on GPU work that never ends (a hung kernel, a peer gone) must
    // not hold the exit for ever, as without gpumem it would not (its thread dies with the process).
    op_lock lk(*this, 2000, 1000000);
    if (!lk.owns()) return false;
    exiting_ = true;
    set_short(false);
    return true;
}

// ---- queries --------------------------------------------------------------------------------

bool block_pool::lookup(uint64_t addr, block_info* out, bool walking) const noexcept {
    held lk(*this, addr, walking);
    if (!lk.lk.owns_lock()) return false;  // busy, and addr is in none of its segments
    auto it = blocks_.upper_bound(addr);
    if (it == blocks_.begin()) return false;
    const block* b = std::prev(it)->second;
    if (addr - b->addr >= b->size) return false;  // blocks tile segments: past it is a gap
    if (out) {
        out->block = b->addr;
        out->block_size = b->size;
        out->requested = b->state == block_state::allocated ? b->requested : 0;
        out->segment = b->seg->base;
        out->segment_size = b->seg->size;
        out->allocated = b->state == block_state::allocated;
        out->vmm = b->seg->vmm();
    }
    return true;
}

void block_pool::grant_peer(int device) noexcept {
    op_lock lk(*this);
    if (device == device_ || exiting_) return;
    backend_.add_peer(device);  // under the lock: no map can fall between this and the walk below
    if (!chunk_) return;
    // Not a structured binding: clang 14 (scripts/test.sh's sanitizer tree) cannot capture one.
    for (const auto& entry : segments_) {
        const segment* s = entry.second;
        for_each_mapped_run(s->chunks, [&](size_t i, size_t n) {
            backend_.set_peer_access(s->base + i * chunk_, n * chunk_, device);
        });
    }
    // Stitched ranges' other positions too (the segments above hold a used range's first ones):
    // an idle range's, and a used one's past its block.  A later stitch keeps such positions as
    // they are mapped, and one granted to the device alone would fault the peer's kernels there.
    for (const alias& a : aliases_) {
        const size_t from = a.user ? a.user->size / chunk_ : 0;
        for_each_mapped_run(a.handles, [&](size_t i, size_t n) {
            if (i + n <= from) return;
            const size_t lo = std::max(i, from);
            backend_.set_peer_access(a.base + lo * chunk_, (i + n - lo) * chunk_, device);
        });
    }
}

bool block_pool::visit_block_chunks(uint64_t addr, size_t from, size_t max, chunk_view* view, chunk_visitor visit,
                                    void* ctx) const noexcept {
    held lk(*this);
    auto it = blocks_.find(addr);
    if (it == blocks_.end()) return false;
    const block* b = it->second;
    const segment* s = b->seg;
    if (b->state != block_state::allocated || !s->vmm() || !chunk_) return false;
    const uint64_t lo = (b->addr - s->base) / chunk_;
    const uint64_t hi = (b->addr + std::max<uint64_t>(b->requested, 1) - s->base + chunk_ - 1) / chunk_;
    view->chunk = chunk_;
    view->offset = b->addr - (s->base + lo * chunk_);
    view->count = hi - lo;
    if (from >= view->count) return false;
    const size_t n = size_t(std::min<uint64_t>(max, view->count - from));
    for (size_t k = 0; k < n; ++k)
        if (!s->chunks[lo + from + k]) return false;  // an allocated block's chunks are mapped; never trust it blindly
    return visit(ctx, &s->chunks[lo + from], n);
}

pool_state block_pool::snapshot_locked() const noexcept {
    pool_state p{};
    p.reserved = reserved_;
    p.allocated = allocated_;
    p.requested = requested_;
    for (const free_set& fs : free_) {
        if (!fs.empty()) p.largest_free = std::max(p.largest_free, (*fs.rbegin())->size);
        p.free_blocks += fs.size();
    }
    p.segments = uint32_t(std::min<size_t>(segments_.size(), UINT32_MAX));
    return p;
}

pool_state block_pool::snapshot() const noexcept {
    held lk(*this);
    return snapshot_locked();
}

uint64_t block_pool::pending_bytes() const noexcept {
    held lk(*this);
    return pending_bytes_[0] + pending_bytes_[1];
}

uint64_t block_pool::chunk_size() const noexcept {
    held lk(*this);
    return chunk_;
}

uint64_t block_pool::fence_wait_count() const noexcept {
    held lk(*this);
    return fence_waits_;
}

uint64_t block_pool::wait_ns() const noexcept {
    held lk(*this);
    return wait_ns_total_;
}

uint64_t block_pool::fence_ns() const noexcept {
    held lk(*this);
    return fence_ns_total_;
}

uint64_t block_pool::sync_count() const noexcept {
    held lk(*this);
    return syncs_;
}

void block_pool::maybe_emit_stats(uint64_t now_ns) noexcept {
    if (cfg_.stats_ms == 0 || !sink_) return;
    uint64_t due = next_stats_ns_.load(std::memory_order_relaxed);
    if (now_ns < due) return;
    // One caller per interval wins; the others return at once.
    if (!next_stats_ns_.compare_exchange_strong(due, now_ns + cfg_.stats_ms * 1000000ull, std::memory_order_relaxed))
        return;
    op_lock lk(*this);
    event e{};
    e.ev = ev_kind::stats;
    e.p = snapshot_locked();
    if (!exiting_) mem_info(&e.p.gpu_free, &e.p.gpu_total);
    if (!exiting_) note_driver_free(e.p.gpu_free, e.p.gpu_total);
    if (streams_) e.p.streams = uint32_t(std::min<uint64_t>(streams_->count(ctx_), UINT32_MAX));
    send(e);
}

// ---- invariants -----------------------------------------------------------------------------

bool block_pool::validate(std::string* why) const {
    held lk(*this);
    return validate_locked(why);
}

bool block_pool::validate_locked(std::string* why) const {
    auto fail = [&](const char* what, uint64_t addr) {
        if (why) {
            char buf[160];
            std::snprintf(buf, sizeof buf, "%s (at 0x%llx)", what, (unsigned long long)addr);
            *why = buf;
        }
        return false;
    };
    uint64_t reserved = 0, allocated = 0, requested = 0, free_b = 0, pend[2] = {0, 0}, unmapped = 0, lent = 0, stitched = 0,
             dead = 0;
    size_t n_free[2] = {0, 0}, n_holes[2] = {0, 0}, n_blocks = 0, n_pending = 0;
    uint64_t prev_end = 0;
    if (moving_ || !loose_.empty()) return fail("chunks kept for a move outside a give-back", 0);
    for (const auto& [base, s] : segments_) {
        if (!s || s->base != base) return fail("segment keyed by wrong base", base);
        if (s->base < prev_end) return fail("segments overlap", base);
        if (s->pool != pool_id::small && s->pool != pool_id::large) return fail("segment without pool", base);
        if (s->size == 0 || s->size % cfg_.round) return fail("segment size not a multiple of round", base);
        prev_end = s->base + s->size;
        if (s->vmm()) {
            // (The base is aligned to the device's granularity, not to a GPUMEM_POOL_CHUNK larger
            // than it: chunks are counted from the base.)
            if (!chunk_ || s->size % chunk_ || s->chunks.size() != s->size / chunk_)
                return fail("VMM segment not made of whole chunks", base);
            uint64_t m = 0;
            for (uint64_t h : s->chunks) m += h ? chunk_ : 0;
            if (m != s->mapped) return fail("segment's mapped bytes differ from its mapped chunks", base);
        } else if (s->mapped != s->size) {
            return fail("cuMemAlloc segment not wholly mapped", base);
        }
        if (s->stitched()) {
            uint64_t l = 0;
            for (const block* b : s->lent) {
                if (b->state != block_state::lent || b->seg->stitched()) return fail("stitched segment's lender not lent", base);
                l += b->size;
            }
            if (l != s->size || s->mapped != s->size) return fail("stitched segment's size differs from its lent chunks", base);
            if (!s->first || s->first->next) return fail("stitched segment not one block", base);
            // Its positions are its alias's, each mapping the handle the segment names.
            const alias* al = nullptr;
            for (const alias& a : aliases_)
                if (a.user == s) al = &a;
            if (!al || al->base != s->base || al->handles.size() < s->chunks.size() ||
                !std::equal(s->chunks.begin(), s->chunks.end(), al->handles.begin()))
                return fail("stitched segment's positions differ from its alias's", base);
            stitched += s->size;
            // Out of service after a refused unmap (dissolve): its block lent, in no count.
            if (s->first->state == block_state::lent) dead += s->size;
        } else {
            reserved += s->mapped;  // a stitched segment's bytes are its lenders'
        }
        const int i = pool_index(s->pool);
        uint64_t at = s->base;
        const block* prev = nullptr;
        for (const block* b = s->first; b; prev = b, b = b->next) {
            if (++n_blocks > blocks_.size()) return fail("block list longer than the address map", at);
            if (b->prev != prev) return fail("broken prev link", b->addr);
            if (b->seg != s) return fail("block in wrong segment", b->addr);
            if (b->addr != at) return fail("gap or overlap between blocks", at);
            if (b->size == 0 || b->size % cfg_.round) return fail("block size not a multiple of round", b->addr);
            if (b->size > s->base + s->size - b->addr) return fail("block runs past its segment", b->addr);
            auto it = blocks_.find(b->addr);
            if (it == blocks_.end() || it->second != b) return fail("block missing from address map", b->addr);
            if (b->pos != it) return fail("block's address map position is stale", b->addr);
            switch (b->state) {
                case block_state::free:
                    if (prev && prev->state == block_state::free) return fail("adjacent free blocks not merged", b->addr);
                    if (!free_[i].count(const_cast<block*>(b))) return fail("free block not in its free set", b->addr);
                    free_b += b->size;
                    ++n_free[i];
                    break;
                case block_state::allocated:
                    if (b->requested == 0 || b->requested > b->size) return fail("requested size out of range", b->addr);
                    allocated += b->size;
                    requested += b->requested;
                    break;
                case block_state::pending:
                    pend[i] += b->size;
                    ++n_pending;
                    break;
                case block_state::lent:
                    if (!s->vmm() || (b->addr - s->base) % chunk_ || b->size % chunk_)
                        return fail("lent block not whole chunks of a VMM segment", b->addr);
                    if (!s->stitched()) lent += b->size;  // in a stitched segment: out of service
                    break;
                case block_state::unmapped:
                    if (!s->vmm() || (b->addr - s->base) % chunk_ || b->size % chunk_)
                        return fail("unmapped block not whole chunks of a VMM segment", b->addr);
                    if (free_[i].count(const_cast<block*>(b))) return fail("unmapped block in a free set", b->addr);
                    if (!holes_[i].count(const_cast<block*>(b))) return fail("unmapped block not in its hole set", b->addr);
                    if (b->prev && b->prev->state == block_state::unmapped) return fail("adjacent holes not merged", b->addr);
                    ++n_holes[i];
                    unmapped += b->size;
                    break;
            }
            if (s->vmm()) {
                // An unmapped block's chunks are all unmapped; every other block's are all mapped.
                const uint64_t first = (b->addr - s->base) / chunk_, last = (b->addr + b->size - 1 - s->base) / chunk_;
                for (uint64_t k = first; k <= last && k < s->chunks.size(); ++k)
                    if ((s->chunks[k] != 0) == (b->state == block_state::unmapped))
                        return fail(b->state == block_state::unmapped ? "unmapped block over a mapped chunk"
                                                                      : "block over an unmapped chunk",
                                    b->addr);
            }
            at += b->size;
        }
        if (at != s->base + s->size) return fail("blocks do not tile the segment", s->base);
    }
    if (n_blocks != blocks_.size()) return fail("address map holds blocks of no segment", 0);
    for (int i = 0; i < 2; ++i) {
        if (free_[i].size() != n_free[i]) return fail("free set size differs from free block count", 0);
        if (holes_[i].size() != n_holes[i]) return fail("hole set size differs from unmapped block count", 0);
        for (const block* b : free_[i])
            if (b->state != block_state::free || pool_index(b->seg->pool) != i) return fail("free set holds a wrong block", b->addr);
    }
    if (pending_.size() != n_pending) return fail("pending list size differs from pending block count", 0);
    size_t last_end = 0;
    for (const fence& f : fences_) {
        if (f.end < last_end || f.end > pending_.size() || f.events.empty()) return fail("fence list out of order", 0);
        last_end = f.end;
    }
    if (!poisoned_ && immediate_ && n_pending) return fail("pending block in immediate mode", 0);
    std::unordered_set<const block*> seen;
    for (size_t k = 0; k < pending_.size(); ++k) {
        const block* b = pending_[k];
        if (b->state != block_state::pending || !seen.insert(b).second) return fail("pending list holds a wrong block", b->addr);
        if (b->seq != pending_[0]->seq + k || (k && b->cum <= pending_[k - 1]->cum))
            return fail("pending list out of free order", b->addr);
    }
    // The sizes the hit path asks for a tighter pending block: a stale one would make it wait
    // on a fence for a block that is no longer pending.
    std::vector<uint64_t> large_pending;
    for (const block* b : pending_)
        if (b->seg->pool == pool_id::large) large_pending.push_back(b->size);
    std::sort(large_pending.begin(), large_pending.end());
    if (!std::equal(large_pending.begin(), large_pending.end(), pending_large_.begin(), pending_large_.end()))
        return fail("pending large sizes differ from the large pool's pending blocks", 0);
    (void)unmapped;
    if (lent != stitched) return fail("lent bytes differ from stitched ones", 0);
    if (reserved != reserved_) return fail("reserved counter wrong", reserved_);
    if (allocated != allocated_) return fail("allocated counter wrong", allocated_);
    if (requested != requested_) return fail("requested counter wrong", requested_);
    if (free_b != free_bytes_) return fail("free counter wrong", free_bytes_);
    if (pend[0] != pending_bytes_[0] || pend[1] != pending_bytes_[1]) return fail("pending counter wrong", 0);
    if (reserved != allocated + free_b + pend[0] + pend[1] + dead) return fail("bytes do not add up", 0);
    return true;
}

void block_pool::check_after_op() const {
#ifdef GPUMEM_POOL_VALIDATE
    std::string why;
    if (!validate_locked(&why)) {
        write_stderr({"gpumem: pool invariant broken on device ", decimal(device_), ": ", why, "\n"});
        std::abort();
    }
#endif
}

}  // namespace gpumem
