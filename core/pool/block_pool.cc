// The caching block allocator: segments from a backend (virtual memory where it can), best-fit blocks, pending frees, events.
#include "core/pool/block_pool.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <unordered_set>

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

uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

}  // namespace

block_pool::block_pool(const pool_config& cfg, pool_backend& backend, event_sink* sink, int device) noexcept
    : cfg_(cfg), backend_(backend), sink_(sink), device_(int16_t(device)), immediate_(cfg.reuse != reuse_mode::safe) {
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
    // Ordered releases only (events known to work: no driver call here to find out), and not
    // - under a synchronize's release, which has the sync budget for a batch;
    // - with trimming, which would unmap free chunks while the batch keeps grown ones pending:
    //   replayed over the GPT-2 log with GPUMEM_POOL_TRIM=32MiB, 1.154x the live peak against
    //   1.125x (docs/benchmarks.md, "Ordered releases in batches");
    // - once the driver's free memory, as last counted (free_est_, only lowered by growth between
    //   looks), is under an eighth of the device: near the limit a batch's growth scatters the live
    //   blocks over more chunks (the emulated training loop that needs 146 MiB under safe reuse
    //   without batches needed 152 with them), and the headroom kept for lazy loads is safe;
    // - once exit has begun (no driver call may follow).
    const bool roomy = free_est_ == UINT64_MAX || !total_ || free_est_ >= total_ / 8;
    const bool on = cfg_.order_batch && cfg_.order && !order_off_ && !immediate_ && !exiting_ && events_state_ > 0 &&
                    streams_ && streams_->usable() && !(chunk_ && cfg_.trim) && roomy;
    return on ? std::min(k_requests * asize, cfg_.order_batch) : 0;
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
        return b;
    }
    return new (std::nothrow) block{};
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

void block_pool::addr_insert(block* b) {
    if (!spare_addr_nodes_.empty()) {
        addr_map::node_type nh = std::move(spare_addr_nodes_.back());
        spare_addr_nodes_.pop_back();
        nh.key() = b->addr;
        nh.mapped() = b;
        blocks_.insert(std::move(nh));
    } else {
        blocks_.emplace(b->addr, b);
    }
}

void block_pool::addr_erase(block* b) noexcept {
    addr_map::node_type nh = blocks_.extract(b->addr);
    if (nh && spare_addr_nodes_.size() < spare_addr_nodes_.capacity()) spare_addr_nodes_.push_back(std::move(nh));
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
    e.dev = device_;
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
    sink_->emit(e);
}

void block_pool::emit_segment(ev_kind ev, api_id api, const segment* s) noexcept {
    if (!sink_) return;
    event e{};
    e.ev = ev;
    e.dev = device_;
    e.kind = mem_kind::device;
    e.api = api;
    e.pool = s->pool;
    e.b.ptr = s->base;
    e.b.size = s->size;
    // An arena maps only its start at first: asize says how much (docs/log-format.md).
    if (ev == ev_kind::segment_alloc && s->mapped != s->size) e.b.asize = s->mapped;
    sink_->emit(e);
}

void block_pool::emit_chunks(api_id api, const segment* s, uint64_t addr, uint64_t bytes, ev_kind ev) noexcept {
    if (!sink_) return;
    event e{};
    e.ev = ev;
    e.dev = device_;
    e.kind = mem_kind::device;
    e.api = api;
    e.pool = s->pool;
    e.b.ptr = addr;
    e.b.size = bytes;
    e.b.seg = s->base;
    sink_->emit(e);
}

void block_pool::emit_simple(ev_kind ev, api_id api, uint64_t count) noexcept {
    event e{};
    if (!sink_) return;
    e.ev = ev;
    e.dev = device_;
    e.api = api;
    e.c.count = count;
    sink_->emit(e);
}

static uint64_t steady_ns() noexcept {
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
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
    e.dev = device_;
    e.kind = mem_kind::device;
    e.api = api;
    e.err = k_cuda_oom;
    e.p = snapshot_locked();
    e.p.size = size;
    if (!exiting_) backend_.mem_info(&e.p.gpu_free, &e.p.gpu_total);
    if (!exiting_) note_driver_free(e.p.gpu_free, e.p.gpu_total);
    if (streams_) e.p.streams = uint32_t(std::min<uint64_t>(streams_->count(ctx_), UINT32_MAX));
    sink_->emit(e);
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

void block_pool::backend_release(segment* s) noexcept {
    if (!s->vmm()) {
        backend_.segment_free(s->base);
        return;
    }
    // A chunk still mapped a second time would stay allocated after its release.
    drop_aliases(0, true);
    // The mapped chunks (the unmapped ones went back earlier), then the address space.
    for_each_mapped_run(s->chunks, [&](size_t i, size_t n) {
        backend_.unmap_chunks(s->base + i * chunk_, chunk_, n, &s->chunks[i]);
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
        try {
            s->chunks.assign(seg_size / chunk_, 0);
        } catch (...) {
            delete s;
            return k_cuda_oom;
        }
        int rc = backend_.va_reserve(seg_size, &base);
        if (rc == k_cuda_success) {
            rc = backend_.map_chunks(base, chunk_, map_bytes / chunk_, s->chunks.data());
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
    emit_segment(ev_kind::segment_alloc, api, s);
    *out = b;
    return k_cuda_success;
}

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
            backend_.mem_info(&free_b, &total);
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
    const int rc = backend_.map_chunks(u->addr, chunk_, bytes / chunk_, &s->chunks[i]);
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
    int rc = arenas ? arena_grow(p, asize, api, &b) : new_segment(p, seg_size, api, &b);
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

    // OOM: first the pending frees of both pools (waiting on their fences), then the cached free
    // segments, then (virtual memory) every whole chunk inside a free range, then retry in fresh
    // address space with a segment of just the request, rounded to chunks.  With VMM this makes
    // the pool's limit the driver's: it fails only when the chunks holding live blocks plus the
    // request do not fit (docs/pool.md).  Unmapping needs every earlier free's work done
    // (cuMemUnmap does not wait, unlike cuMemFree): a block freed for immediate reuse since the
    // last sync may still have its last owner's work queued, so wait for every stream first.
    if (can_sync()) {
        if ((pending_bytes_[0] | pending_bytes_[1]) != 0) {
            if (reclaim(api, true, p, asize) && (b = find_free(p, asize))) return b;
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
                addr_insert(r);
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

int block_pool::allocate(uint64_t size, api_id api, uint64_t* out, uint32_t stack) noexcept {
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
            if (reserved_ > reserved_before) after_growth(reserved_ - reserved_before);
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

bool block_pool::deallocate(uint64_t ptr, api_id api, int* result) noexcept {
    int dummy = 0;
    if (!result) result = &dummy;
    op_lock lk(*this);
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
            e.dev = device_;
            e.kind = mem_kind::device;
            e.api = api;
            e.flags = ef_pooled;
            e.err = k_cuda_invalid_value;
            e.b.ptr = ptr;
            sink_->emit(e);
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
            // fence_batch frees, or the whole budget (pool_config::fence_batch says why); a single
            // free when the last fence had no non-blocking stream to ask, as batches amortize the
            // per-stream calls and a lone legacy-stream event gains nothing by waiting.
            unfenced_bytes_ += b->size;
            const uint64_t budget = sync_budget();
            // None where ordered release stands in for fences (order_alone): the miss that wants
            // the memory releases it with one event, and a fence here would be a second.
            const uint64_t batch = last_fence_streams_ ? cfg_.fence_batch : 1;
            if (!poisoned_ && streams_ && unfenced_bytes_ >= budget / 8 &&
                (pending_.size() - fenced_end() >= batch || unfenced_bytes_ >= budget) && !order_alone() &&
                can_sync())
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

// One synchronize releases every pending free: work enqueued before any of them has finished.
bool block_pool::sync_release(api_id api) {
    // Every caller checked can_sync(), but a capture may have opened since (on another thread): a
    // synchronize now would invalidate it.  The frees stay pending.
    if (!can_sync()) return false;
    ++syncs_;
    const uint64_t destroys = streams_ ? streams_->destroy_count() : 0;  // before: see forget_destroyed
    const uint64_t t0 = steady_ns();
    const int rc = backend_.synchronize();
    note_wait(t0);
    capture_checked_ = false;  // a wait, even a failed one: a capture may have begun meanwhile (can_sync)
    if (rc != k_cuda_success) return false;  // a broken context: keep them pending
    unsettled_frees_ = 0;
    // Every fence is reached now, and destroyed streams' work has finished.
    forget_fences();
    if (streams_) streams_->forget_destroyed(ctx_, destroys);
    const size_t n = pending_.size();
    for (block* b : pending_) {
        pending_bytes_[pool_index(b->seg->pool)] -= b->size;
        make_free(b);
    }
    pending_.clear();
    pending_large_.clear();
    emit_release(api, n, 0);
    if (n_stitched_) dissolve_free_stitched(api);
    return true;
}

void block_pool::forget_fences() noexcept {
    for (fence& f : fences_) {
        recycle_events(f.events);
        // The emptied list keeps its capacity for the next fence, as poll_fences keeps it: dropped
        // here, an ordered release after fences at frees made record_fence allocate each time.
        if (spare_fence_events_.size() < spare_fence_events_.capacity())
            spare_fence_events_.push_back(std::move(f.events));  // cannot throw: within capacity
    }
    fences_.clear();
    unfenced_bytes_ = 0;
}

// Returns every segment that holds no allocated or pending block: a cuMemAlloc segment that is
// one free block, a VMM segment of free and unmapped blocks.
// ---- fences ---------------------------------------------------------------------------------

void block_pool::set_streams(stream_set* streams, uint64_t ctx) noexcept {
    op_lock lk(*this);
    streams_ = streams;
    ctx_ = ctx;
    try {
        order_marks_.reserve(k_order_marks);  // ordered releases then never grow it
    } catch (...) {
    }
}

bool block_pool::fences_usable() noexcept {
    if (!streams_ || events_state_ < 0 || !streams_->usable()) return false;
    if (events_state_ == 0) {
        // Asked once: a backend (or driver) without events keeps the synchronize path for good.
        uint64_t ev = 0;
        if (backend_.event_create(&ev) != k_cuda_success) {
            events_state_ = -1;
            return false;
        }
        events_state_ = 1;
        try {
            spare_events_.push_back(ev);
        } catch (...) {
        }
    }
    return true;
}

bool block_pool::take_event(uint64_t* ev) noexcept {
    if (!spare_events_.empty()) {
        *ev = spare_events_.back();
        spare_events_.pop_back();
        return true;
    }
    return backend_.event_create(ev) == k_cuda_success;
}

void block_pool::recycle_events(std::vector<uint64_t>& evs) noexcept {
    for (uint64_t ev : evs) recycle_event(ev);
    evs.clear();
}

void block_pool::recycle_event(uint64_t ev) noexcept {
    try {
        spare_events_.push_back(ev);
    } catch (...) {
        // Leaked: a handful of events, once, when host memory ran out.
    }
}

bool block_pool::record_fence() noexcept {
    if (fenced_end() == pending_.size()) return true;
    fence_timer timed(*this);
    if (!fences_usable() || !can_sync()) return false;
    // The set stays locked until every event is recorded: no stream of the list dies meanwhile.
    std::unique_lock<std::mutex> held = streams_->hold();
    // Again under the lock: a capture opened since can_sync() must see no record or query (the
    // capture hooks count it under this lock before the driver opens it).
    if (!can_sync() || !streams_->fence_streams(ctx_, fence_streams_, held)) return false;
    fence f;
    if (!spare_fence_events_.empty()) {  // an emptied list with its capacity: no allocation
        f.events = std::move(spare_fence_events_.back());
        spare_fence_events_.pop_back();
    }
    try {
        // Room for an event per stream at the record and another at the sweep.
        f.events.reserve(2 * fence_streams_.size() + 1);
        hot_scratch_.reserve(fence_streams_.size());
        fences_.emplace_back();
    } catch (...) {
        return false;
    }
    // The legacy stream first: its event covers it and every blocking stream.  Then each hot
    // non-blocking stream (found busy before): an event if it still has work (an idle one has
    // nothing before the fence).  The others never ran anything the pool saw; PyTorch makes
    // 32 streams or more at its first side stream and runs work on one or two, and a cuStreamQuery
    // costs 0.27-1.5 us on the H200 (docs/benchmarks.md), so they are asked once for all the fences
    // recorded until a release needs them (sweep_streams), not at every fence.
    bool ok = true;
    hot_scratch_.clear();
    for (size_t i = 0; ok && i <= fence_streams_.size(); ++i) {
        if (i > 0) {
            const uint64_t st = fence_streams_[i - 1];
            if (!is_hot(st)) {
                f.unswept = true;
                continue;
            }
            hot_scratch_.push_back(st);  // reserved: cannot throw
            if (backend_.stream_query(st) == k_cuda_success) continue;  // idle: nothing before this fence
        }
        uint64_t ev = 0;
        ok = take_event(&ev);
        if (!ok) break;
        f.events.push_back(ev);  // reserved: cannot throw
        ok = backend_.event_record(ev, i == 0 ? k_stream_legacy : fence_streams_[i - 1]) == k_cuda_success;
    }
    if (!ok) {
        recycle_events(f.events);
        fences_.pop_back();
        return false;
    }
    hot_streams_.swap(hot_scratch_);
    f.end = pending_.size();
    fences_.back() = std::move(f);
    unfenced_bytes_ = 0;
    last_fence_streams_ = fence_streams_.size();
    return true;
}

bool block_pool::is_hot(uint64_t stream) const noexcept {
    return std::find(hot_streams_.begin(), hot_streams_.end(), stream) != hot_streams_.end();
}

int block_pool::sweep_streams() noexcept {
    fence_timer timed(*this);
    if (!can_sync()) return k_cuda_not_ready;
    std::unique_lock<std::mutex> held = streams_->hold();
    if (!can_sync()) return k_cuda_not_ready;  // as in record_fence: a capture opened meanwhile
    if (!streams_->fence_streams(ctx_, fence_streams_, held)) return k_cuda_not_supported;
    for (uint64_t st : fence_streams_) {
        if (backend_.stream_query(st) == k_cuda_success) continue;
        // Busy: an event now, after everything it had before those frees, for each fence.
        try {
            if (!is_hot(st)) hot_streams_.push_back(st);
            for (fence& f : fences_) {
                if (!f.unswept) continue;
                f.events.reserve(f.events.size() + 1);  // within the record's reserve unless streams were added since
                uint64_t ev = 0;
                if (!take_event(&ev)) return k_cuda_not_supported;
                f.events.push_back(ev);  // reserved: cannot throw, so the event is never lost
                if (backend_.event_record(ev, st) != k_cuda_success) return k_cuda_not_supported;
            }
        } catch (...) {
            return k_cuda_not_supported;
        }
    }
    for (fence& f : fences_) f.unswept = false;
    return k_cuda_success;
}

int block_pool::poll_fences(api_id api, bool waited) {
    if (fences_.empty()) return k_cuda_success;
    fence_timer timed(*this);
    size_t n = 0;
    int rc = k_cuda_success;
    while (!fences_.empty()) {
        fence& f = fences_.front();
        size_t from = 0;
        for (;;) {
            {
                std::unique_lock<std::mutex> held;
                if (!capture_guard(held)) rc = k_cuda_not_ready;  // a capture opened since the caller's check
                for (size_t k = from; k < f.events.size() && rc == k_cuda_success; ++k) rc = backend_.event_query(f.events[k]);
            }
            if (rc != k_cuda_success || !f.unswept) break;
            // Its events are reached; the streams it did not ask are asked now, once for every
            // fence so far (none is unswept after).  A busy one adds an event to each, which is
            // asked next.  A capture leaves the fences waiting (k_cuda_not_ready: success below).
            from = f.events.size();
            rc = sweep_streams();
        }
        if (rc != k_cuda_success) break;
        n = f.end;
        recycle_events(f.events);
        if (spare_fence_events_.size() < spare_fence_events_.capacity())
            spare_fence_events_.push_back(std::move(f.events));  // cannot throw: within capacity
        fences_.erase(fences_.begin());
    }
    timed.stop();  // the queries belong to the release they make
    if (n) release_prefix(n, api, uint8_t(ef_fence | (waited ? ef_waited : 0)));
    return rc == k_cuda_not_ready ? k_cuda_success : rc;
}

// Every pool_sync line: a release by fences (or a wait on every stream, n = 0), or by a sync (flags
// 0), with the time the pool's waits held the program and its fence calls took since the previous
// pool_sync line.
void block_pool::emit_release(api_id api, size_t n, uint8_t flags) noexcept {
    event e{};
    std::swap(e.c.wait_ns, wait_ns_unlogged_);
    std::swap(e.c.fence_ns, fence_ns_unlogged_);
    if (!sink_) return;
    e.ev = ev_kind::pool_sync;
    e.dev = device_;
    e.api = api;
    e.c.count = n;
    e.flags = flags;
    sink_->emit(e);
}

// The first n pending frees (in free order) become free; the fences after them now count from 0.
void block_pool::release_prefix(size_t n, api_id api, uint8_t flags) {
    for (size_t k = 0; k < n; ++k) {
        block* b = pending_[k];
        pending_bytes_[pool_index(b->seg->pool)] -= b->size;
        if (b->seg->pool == pool_id::large) {
            auto it = pending_large_.find(b->size);
            if (it != pending_large_.end()) pending_large_erase(it);
        }
        make_free(b);
    }
    pending_.erase(pending_.begin(), pending_.begin() + ptrdiff_t(n));
    for (fence& f : fences_) f.end -= n;
    emit_release(api, n, flags);
    // A stitched segment whose block came back goes back to its lenders at once (after the
    // pool_sync line, which frees its block in the log): kept, it would hold its lenders' chunks
    // from every other request (docs/benchmarks.md, "Stitching").
    if (n_stitched_) dissolve_free_stitched(api);
}

bool block_pool::reclaim(api_id api, bool wait, pool_id p, uint64_t asize) {
    if (!fences_usable()) return sync_release(api);
    // GPUMEM_FENCE_WAIT=order: no wait; and where it costs what a fence costs, no fence.
    if ((wait || order_alone()) && order_release(api)) return true;
    const size_t before = pending_.size();
    if (!wait) {
        // Not waiting: only a fence the GPU has reached helps now.  While an older fence is not
        // reached, a new one cannot be either (each waits on the legacy stream after it), so it
        // is recorded only when none is left: on an idle GPU it is reached at once.  Recording
        // at every miss instead cost one event per stream each time (a fence per 4 allocations
        // replaying the H200 GPT-2 log, docs/benchmarks.md).
        if (poll_fences(api) != k_cuda_success) return sync_release(api);
        if (!fences_.empty() || fenced_end() == pending_.size()) return pending_.size() < before;
    }
    if (!record_fence()) return sync_release(api);
    if (poll_fences(api) != k_cuda_success) return sync_release(api);  // a broken event: the old way
    // Memory is short: wait for the oldest fence, then the next, until the request fits.  Waiting
    // for the newest (recorded just now, after all the work the program has queued) would drain
    // the GPU's queue: the device idles while the program queues its next kernels, and a
    // training step under PYTORCH_NO_CUDA_MEMORY_CACHING pays that at every wait.
    while (wait && !fences_.empty() && !(asize && find_free(p, asize))) {
        // A capture opened on another thread since the last wait: no more waits (each would
        // invalidate it), and no fallback sync either; the frees stay pending through it.
        if (!can_sync()) break;
        if (!wait_oldest_fence(api)) return sync_release(api);
    }
    return pending_.size() < before;
}

// Ordered release (GPUMEM_FENCE_WAIT=order; docs/pool.md, "Ordered release").  Instead of the host
// waiting until the GPU reaches a fence, every pending free is handed out now and the device is
// made to order any later use after the work before the frees: the legacy stream waits for the
// work each busy non-blocking stream has queued, then an event E on the legacy stream marks all
// of it, and every non-blocking stream waits for E.  A new owner's work then follows the old
// owner's on whichever stream it runs: on the legacy stream by its order, on a blocking stream by
// its implicit wait for the legacy stream, on a non-blocking stream by its wait for E, on a stream
// made later by order_new_stream.  The price is the device's: each release serializes the
// program's streams, which costs nothing while they idle (PyTorch's 32 pooled streams) and
// would take away the overlap of a stream the program runs beside the legacy one (NCCL).  So a
// stream found busy with E of the last release already reached (its busyness is the program's,
// not a wait of ours) stops ordered releases for good, and the pool waits as before.  False when
// it released nothing; the caller then waits as before.
bool block_pool::order_release(api_id api) {
    if (!cfg_.order || order_off_ || pending_.empty() || immediate_ || !fences_usable()) return false;
    fence_timer timed(*this);
    if (!can_sync()) return false;
    std::unique_lock<std::mutex> held = streams_->hold();  // no stream dies between the list and the waits
    if (!can_sync() || !streams_->fence_streams(ctx_, fence_streams_, held)) return false;
    if ((!order_scratch_ && !take_event(&order_scratch_)) || (!order_event_ && !take_event(&order_event_))) return false;
    // Whether the last release's work is done is asked only at the first busy stream (most
    // releases find every stream idle: no query).  Asked after that stream's query, so a stream
    // found busy then, unless E was known reached before, is asked again: busy after its wait
    // for E is over, it is busy with the program's own work (asked before, it may have been busy
    // only with that wait).  Not done (the GPU behind): every stream still waits for that E (each
    // was made to, at the release or at its creation), so each would be found busy and marked
    // anyway; the rest are marked without their query (1.4 µs while the GPU runs, run 77: 32 of
    // them a release in a PyTorch program).
    int last_reached = -1;  // -1: not asked yet
    bool behind = false;
    bool ok = true;
    for (uint64_t st : fence_streams_) {
        if (!behind && backend_.stream_query(st) == k_cuda_success) continue;  // idle: nothing to wait for
        if (last_reached < 0) {
            const bool known = order_reached_ == ordered_releases_;  // (none yet: nothing to wait for)
            last_reached = known || order_reached(true) == ordered_releases_;
            if (!known && last_reached && backend_.stream_query(st) == k_cuda_success) continue;
            behind = last_reached == 0;
        }
        if (last_reached == 1 && !cfg_.order_beside_busy) {  // busy with the program's own work: leave it its overlap
            order_off_ = true;
            return false;
        }
        // Busy, maybe only with our last wait: the legacy stream waits for whatever it has.
        // (A failure here leaves extra waits at most: the program's work is only delayed.)
        ok = backend_.event_record(order_scratch_, st) == k_cuda_success &&
             backend_.stream_wait_event(k_stream_legacy, order_scratch_) == k_cuda_success;
        if (!ok) break;
    }
    // The last release's event, if not reached yet, is kept to tell when its frees are done; this
    // release records a fresh one (or, with no event to spare, the same one again).  Only once the
    // record succeeded does the fresh one become order_event_: a failed record leaves the last
    // release's event as what new streams wait for (order_new_stream).
    uint64_t ev = order_event_;
    if (ok && ordered_releases_ > order_reached_ && !take_event(&ev)) ev = order_event_;
    ok = ok && backend_.event_record(ev, k_stream_legacy) == k_cuda_success;
    if (ev != order_event_) {
        if (ok) {
            try {
                if (order_marks_.size() == k_order_marks) {
                    recycle_event(order_marks_.front().second);
                    order_marks_.erase(order_marks_.begin());
                }
                order_marks_.emplace_back(ordered_releases_, order_event_);
            } catch (...) {
                recycle_event(order_event_);  // no host memory for the mark: a later release's says as much
            }
            order_event_ = ev;
        } else {
            recycle_event(ev);
        }
    }
    for (size_t i = 0; ok && i < fence_streams_.size(); ++i)
        ok = backend_.stream_wait_event(fence_streams_[i], order_event_) == k_cuda_success;
    if (!ok) {
        // Some streams may wait for E and others not: nothing is handed out early.  Waits from now on.
        order_off_ = true;
        return false;
    }
    held.unlock();
    ++ordered_releases_;
    forget_fences();  // every fence is covered now, as after a synchronize
    // Their last owners' work may still run: no chunk of theirs is unmapped before a wait on every
    // stream (settle_frees), as for frees under immediate reuse.
    const size_t n = pending_.size();
    unsettled_frees_ += n;
    for (size_t k = 0; k < n; ++k)
        if (pending_[k]->seg->stitched()) pending_[k]->seg->settle_gen = ordered_releases_;
    timed.stop();  // its line carries its calls' time
    release_prefix(n, api, uint8_t(ef_fence | ef_ordered));  // its line says "ordered"
    return true;
}

// Ordered release in place of fences: in a context without non-blocking streams a release is one
// event record on the legacy stream (nothing to query, no stream to make wait), as a fence is, and
// it needs no query of its own, while a fence must be asked before its frees serve.  The 20 MiB
// pool hit (a free, then a miss) paid a record and a query a pair; now one record.
bool block_pool::order_alone() noexcept {
    return cfg_.order && !order_off_ && !immediate_ && streams_ && streams_->count(ctx_) == 0;
}

// The frees ordered releases handed out count as unsettled (their last owners' work may still run,
// so no chunk of theirs is unmapped).  Once the last release's event is reached, all work enqueued
// before any of them is done: they are settled without a wait, so trimming and stitching's
// dissolves go on as under fences.  (Frees made for immediate reuse before auto's switch came
// before the first ordered release, whose event covers them too.)  True when no free is unsettled.
// Only where can_sync() holds: an event query may not run during a capture.
bool block_pool::ordered_frees_settled() noexcept {
    if (unsettled_frees_ && ordered_releases_ && !immediate_ && order_reached() == ordered_releases_)
        unsettled_frees_ = 0;
    return unsettled_frees_ == 0;
}

// Asks the kept events oldest first, then the last release's, and stops at the first not reached
// (one query while the GPU is behind).  With half the marks kept or more, once the oldest is
// reached the last release's is asked next: reached, it says every kept one is (events on one
// stream are reached in order), which spares a query per mark where nothing asked for a while (a
// context without non-blocking streams asks none at its releases, and keeps 64; one call asked
// 65 events).  Only where can_sync() holds, as every query.
uint64_t block_pool::order_reached(bool locked) noexcept {
    if (order_marks_.empty() && order_reached_ == ordered_releases_) return order_reached_;  // nothing to ask
    fence_timer timed(*this);
    std::unique_lock<std::mutex> held;
    if (!locked && !capture_guard(held)) return order_reached_;  // a capture opened since the caller's check
    size_t done = 0;
    bool all = false;
    const bool long_list = order_marks_.size() >= k_order_marks / 2;
    while (done < order_marks_.size() && backend_.event_query(order_marks_[done].second) == k_cuda_success) {
        order_reached_ = order_marks_[done].first;
        recycle_event(order_marks_[done].second);
        ++done;
        if (long_list && done == 1 && done < order_marks_.size() && backend_.event_query(order_event_) == k_cuda_success) {
            all = true;
            break;
        }
    }
    if (all) {
        for (size_t k = done; k < order_marks_.size(); ++k) recycle_event(order_marks_[k].second);
        done = order_marks_.size();
        order_reached_ = ordered_releases_;
    }
    order_marks_.erase(order_marks_.begin(), order_marks_.begin() + ptrdiff_t(done));
    if (order_marks_.empty() && order_reached_ < ordered_releases_ && backend_.event_query(order_event_) == k_cuda_success)
        order_reached_ = ordered_releases_;
    return order_reached_;
}

// Whether the last ordered release's work may still run, for a stream or green context the
// program is about to get; `held` gets the stream set's lock, as a fence's records and queries
// hold it (a capture cannot open between the check and the calls: capture_begin counts it under
// this lock).  False when there was none or it is done, and when a capture is open (or at exit):
// then nothing may be asked, a cuEventQuery on any thread invalidating a global-mode capture and
// the driver perhaps gone, so ordered releases stop (a limit: docs/pool.md).
bool block_pool::order_work_pending(std::unique_lock<std::mutex>& held) noexcept {
    if (ordered_releases_ == 0 || !streams_) return false;
    held = streams_->hold();
    if (!can_sync()) {
        order_off_ = true;
        return false;
    }
    return order_reached(true) != ordered_releases_;  // no query when already known done
}

// What cannot be ordered on the device is waited for by the host, once; ordered releases stop.
void block_pool::order_host_wait(std::unique_lock<std::mutex>& held) noexcept {
    held.unlock();  // the wait may be long: streams may come and go meanwhile
    order_off_ = true;
    const uint64_t t0 = steady_ns();
    (void)backend_.event_synchronize(order_event_);
    note_wait(t0);
}

void block_pool::order_new_stream(uint64_t stream) noexcept {
    if (!cfg_.order) return;  // GPUMEM_FENCE_WAIT=old|any: stream creation does not touch the pool (cfg_ is const)
    op_lock lk(*this);
    std::unique_lock<std::mutex> held;
    fence_timer timed(*this);
    if (!order_work_pending(held)) return;
    if (backend_.stream_wait_event(stream, order_event_) == k_cuda_success) return;
    timed.stop();  // what follows is a wait (wait_ns)
    order_host_wait(held);  // the stream cannot be made to wait
}

// A green context (or green stream) runs beside the context's streams, and no wait orders it:
// the host waits for the last ordered release's work before the program gets it.
void block_pool::order_settle() noexcept {
    if (!cfg_.order) return;
    op_lock lk(*this);
    std::unique_lock<std::mutex> held;
    if (order_work_pending(held)) order_host_wait(held);
}

uint64_t block_pool::ordered_releases() const noexcept {
    held lk(*this);
    return ordered_releases_;
}

bool block_pool::order_stopped() const noexcept {
    held lk(*this);
    return order_off_;
}

bool block_pool::wait_oldest_fence(api_id api) {
    // The streams it did not ask first, so that the wait covers them too.  Its callers checked
    // can_sync(), so a refusal here is a capture opened meanwhile or a stream destroyed: both
    // fall back as a broken event does (sync_release, which a capture also stops).
    if (fences_.front().unswept && sweep_streams() != k_cuda_success) return false;
    // Not under the stream set's lock, unlike queries: it is the whole process's, and a wait may
    // last as long as the GPU's queue (another GPU's pool, or a thread that must launch the work
    // waited for, would block on it).  So a capture opened on another thread in the moment
    // between this check and the wait is not seen (docs/pool.md).
    if (!can_sync()) return false;
    const uint64_t t0 = steady_ns();
    bool ok = true;
    ++fence_waits_;
    for (uint64_t ev : fences_.front().events)
        if (backend_.event_synchronize(ev) != k_cuda_success) {
            ok = false;
            break;
        }
    // A wait: the driver is asked again afterwards (can_sync), for a capture opened meanwhile by a
    // route no hook sees.
    capture_checked_ = false;
    note_wait(t0);
    if (!ok) return false;
    const size_t left = fences_.size();
    if (poll_fences(api, true) != k_cuda_success) return false;
    return fences_.size() < left;  // reached but not released: a broken event
}

// A program under PYTORCH_NO_CUDA_MEMORY_CACHING runs far ahead of the GPU: on the H200 GPT-2 run
// the frees the GPU had not yet passed peaked at 12.5 GiB against a live peak of 13.3 GiB, and a
// pool that grows (or cuts a larger free block) whenever no reached free fits reserved 1.47x the
// live peak (docs/benchmarks.md, run 33).  Waiting for the fence of a block freed long ago costs
// the GPU little: the work queued after that fence keeps it busy while the program waits.
// Waiting for one freed just now would drain its queue.  So the wait is for the oldest pending
// block of pool p that serves asize, with the free and old pending blocks around it, among those
// with at least a quarter of the sync budget of frees after them; a request only a recent free
// would serve grows the pool, as before.  A quarter: replaying the H200 GPT-2 log with the GPU
// 2-100 ms behind, peak reserved was 1.22-1.24x the live peak with the whole budget, 1.16-1.19x
// with a quarter, 1.14-1.17x with a sixteenth, whose waits come nearer the tail of the GPU's
// queue (the GPU keeping up: 1.135x; immediate reuse: 1.104x).  On the H200 (runs 34-35):
// 1.14-1.22x.  Variants that looked sounder did worse on average over nine lags of that replay
// (1.21x against 1.18x), the layout being chaotic in the policy: the fit needing the fewest
// releases instead of the oldest, only runs tighter than the block a hit would cut, and old
// counted from the fence instead of the free.  True if it waited and the run it found is free
// now; it may also have released frees when it returns false.
bool block_pool::wait_for_old_fit(api_id api, pool_id p, uint64_t asize) {
    if (pending_bytes_[pool_index(p)] == 0 || !fences_usable() || !can_sync()) return false;
    // GPUMEM_FENCE_WAIT=order: every pending free at once (or, where that cannot be, the waits).
    if (order_release(api)) return true;
    // pending_[0, old): frees with at least `window` bytes freed after them (cum grows along
    // pending_, so a binary search).
    // GPUMEM_FENCE_WAIT=any: the newest frees too, fenced now if no fence covers them yet.
    const bool wait_any = cfg_.wait_any;
    if (wait_any && fenced_end() < pending_.size()) record_fence();
    const uint64_t window = wait_any ? 0 : sync_budget() / 4, newest = pending_.back()->cum;
    size_t old = size_t(std::partition_point(pending_.begin(), pending_.end(),
                                             [&](const block* x) { return newest - x->cum >= window; }) -
                        pending_.begin());
    old = std::min(old, fenced_end());  // a block no fence covers yet cannot be waited for
    if (old == 0) return false;
    // The run of free and old pending blocks around each old pending block of pool p, oldest
    // first, until one run serves asize: need = the frees to release, oldest first, to free it.
    // Bounded (the oldest 256 frees, 16 neighbours a side: at most 8,192 steps) so that a miss
    // stays cheap however many small frees wait; what lies beyond grows the pool as before.
    const uint64_t base = pending_[0]->seq, limit = base + old;
    auto usable = [&](const block* x) {
        return x && (x->state == block_state::free || (x->state == block_state::pending && x->seq < limit));
    };
    size_t need = SIZE_MAX;
    for (size_t k = 0; k < std::min<size_t>(old, 256) && need == SIZE_MAX; ++k) {
        const block* b = pending_[k];
        if (b->seg->pool != p) continue;
        uint64_t room = b->size, last = b->seq;
        int steps = 0;
        for (const block* x = b->prev; room < asize && steps < 16 && usable(x); x = x->prev, ++steps) {
            room += x->size;
            if (x->state == block_state::pending) last = std::max(last, x->seq);
        }
        steps = 0;
        for (const block* x = b->next; room < asize && steps < 16 && usable(x); x = x->next, ++steps) {
            room += x->size;
            if (x->state == block_state::pending) last = std::max(last, x->seq);
        }
        if (room >= asize) need = size_t(last - base) + 1;
    }
    if (need == SIZE_MAX) return false;
    const size_t before = pending_.size();
    while (before - pending_.size() < need && !fences_.empty()) {
        // A capture opened on another thread since the caller looked must see no wait.
        if (!can_sync()) return false;
        if (!wait_oldest_fence(api)) return sync_release(api);
    }
    return before - pending_.size() >= need;
}

// Waits, on events, for all work enqueued so far on every stream of the context: the legacy
// stream (its event waits for every blocking stream, per-thread default streams included) and,
// unless legacy_only, each non-blocking stream.  What a cuCtxSynchronize would wait for, but only
// on those streams: other contexts run on.  False when fences cannot cover the context now (a
// destroyed stream, a green context, no events); the caller then synchronizes.
bool block_pool::wait_all_streams(bool legacy_only) noexcept {
    if (!fences_usable() || !can_sync()) return false;
    std::unique_lock<std::mutex> held = streams_->hold();  // until the records are made (record_fence)
    if (!can_sync() || !streams_->fence_streams(ctx_, fence_streams_, held)) return false;  // as in record_fence
    fence f;  // scratch: every event is recorded first, then all are waited on
    try {
        f.events.reserve(fence_streams_.size() + 1);
    } catch (...) {
        return false;
    }
    const size_t n = legacy_only ? 1 : fence_streams_.size() + 1;
    bool ok = true;
    fence_timer timed(*this);  // the queries and records; the waits below are wait_ns
    for (size_t i = 0; ok && i < n; ++i) {
        if (i > 0 && backend_.stream_query(fence_streams_[i - 1]) == k_cuda_success) continue;  // idle
        uint64_t ev = 0;
        ok = take_event(&ev);
        if (!ok) break;
        f.events.push_back(ev);  // reserved: cannot throw
        ok = backend_.event_record(ev, i == 0 ? k_stream_legacy : fence_streams_[i - 1]) == k_cuda_success;
    }
    timed.stop();
    held.unlock();  // the waits below may be long: streams may come and go meanwhile (wait_oldest_fence)
    const uint64_t t0 = steady_ns();
    for (size_t i = 0; ok && i < f.events.size(); ++i) ok = backend_.event_synchronize(f.events[i]) == k_cuda_success;
    note_wait(t0);
    capture_checked_ = false;  // a wait: ask the driver again afterwards (can_sync)
    recycle_events(f.events);
    if (!ok) return false;
    ++fence_waits_;
    return true;
}

bool block_pool::drain_by_fence(api_id api) {
    // Before the switch all work of the context ran in one issue order: the legacy stream and at
    // most one blocking stream (the stream that ends it is new and has no work yet).  An event on
    // the legacy stream waits for all of it.  A context that lost a stream takes the sync.
    if (!wait_all_streams(true)) return false;
    unsettled_frees_ = 0;
    release_prefix(0, api, ef_fence);  // the drain's pool_sync, count 0
    return true;
}

// The frees made for immediate reuse since the last sync must have no work left before their
// chunks are unmapped.  auto before its switch has one issue order: the legacy stream's event
// covers it; immediate reuse (the program's own choice) may run on any stream.
bool block_pool::settle_frees(api_id api) {
    if (wait_all_streams(immediate_ && cfg_.reuse == reuse_mode::automatic)) {
        unsettled_frees_ = 0;
        // Logged as the drain is (a release of nothing by fences), so that its wait_ns is written
        // now: under immediate reuse no other pool_sync may ever follow to carry it.
        emit_release(api, 0, ef_fence);
        return true;
    }
    return sync_release(api);
}

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
            backend_.unmap_chunks(s->base + lo, chunk_, n, &s->chunks[i]);
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

void block_pool::release_unused(api_id api, uint64_t want) {
    // Again: a capture opened on another thread during the caller's waits forbids the frees below.
    if (!can_sync()) return;
    // (Frees of ordered releases whose last event a query finds reached need no wait.)
    if (chunk_ && !ordered_frees_settled()) settle_frees(api);
    const uint64_t before = reserved_;
    auto given = [&] { return before > reserved_ ? before - reserved_ : 0; };
    // Some bytes only (headroom): free chunks may be enough, and an empty arena is the pool's whole
    // memory, which the next growth would map again.
    if (want != UINT64_MAX && chunk_ && !unsettled_frees_ && can_sync() && unmap_free_chunks(api, want, nullptr, true) >= want)
        return;
    dissolve_free_stitched(api);
    // cuMemAlloc segments: as many as make up want.
    if (given() < want) release_free_segments(api, want == UINT64_MAX ? want : want - given());
    // Again: settle_frees may have waited (a capture opened meanwhile forbids unmapping).
    if (chunk_ && !unsettled_frees_ && can_sync() && given() < want)
        unmap_free_chunks(api, want - given(), nullptr, want != UINT64_MAX);
}

uint64_t block_pool::headroom_limit() const noexcept {
    return total_ ? std::min(cfg_.headroom, total_ / 64) : cfg_.headroom;
}

void block_pool::set_short(bool now) noexcept {
    if (short_.exchange(now, std::memory_order_relaxed) != now) short_pools_.fetch_add(now ? 1 : -1, std::memory_order_relaxed);
}

void block_pool::note_driver_free(uint64_t free_b, uint64_t total) noexcept {
    if (!cfg_.headroom || total == 0) return;  // off, or a backend that cannot say
    total_ = total;
    free_est_ = free_b;
    set_short(free_b < headroom_limit());
}

uint64_t block_pool::look_at_driver() noexcept {
    uint64_t free_b = 0, total = 0;
    backend_.mem_info(&free_b, &total);
    note_driver_free(free_b, total);
    return free_b;
}

void block_pool::after_growth(uint64_t grown) noexcept {
    if (!cfg_.headroom || exiting_) return;
    if (free_est_ != UINT64_MAX) free_est_ -= std::min(free_est_, grown);
    // One cuMemGetInfo per growth only near the line: other allocators' memory may have brought
    // it closer than the count says, which the stats event's look (every GPUMEM_STATS_MS) catches.
    if (free_est_ == UINT64_MAX || free_est_ < 2 * headroom_limit()) look_at_driver();
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

// ---- lifecycle ------------------------------------------------------------------------------

void block_pool::forget_all() noexcept {
    set_short(false);
    free_est_ = UINT64_MAX;
    for (auto& [base, s] : segments_) {
        for (block* b = s->first; b;) {
            block* n = b->next;
            delete b;
            b = n;
        }
        delete s;
    }
    segments_.clear();
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

bool block_pool::lookup(uint64_t addr, block_info* out) const noexcept {
    held lk(*this);
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
    e.dev = device_;
    e.p = snapshot_locked();
    if (!exiting_) backend_.mem_info(&e.p.gpu_free, &e.p.gpu_total);
    if (!exiting_) note_driver_free(e.p.gpu_free, e.p.gpu_total);
    if (streams_) e.p.streams = uint32_t(std::min<uint64_t>(streams_->count(ctx_), UINT32_MAX));
    sink_->emit(e);
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
