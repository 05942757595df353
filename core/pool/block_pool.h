// The caching block allocator for one device+context: best-fit, split, coalesce, safe reuse.
#pragma once

#include <atomic>
#include <cstdint>
#include <ctime>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/event_schema.h"
#include "core/pool/context_end.h"
#include "core/pool/critical_section.h"
#include "core/pool/event_sink.h"
#include "core/pool/pool_backend.h"
#include "core/pool/pool_config.h"
#include "core/pool/segment_ranges.h"
#include "core/pool/stream_set.h"

namespace gpumem {

// Requests above this fail with OOM before any arithmetic: no device has 2^48 bytes (256 TiB), and
// it keeps every rounding far from overflow.  `gpumem replay` stops every policy there too.
inline constexpr uint64_t k_max_request = 1ull << 48;
inline constexpr int k_pool_declined = -1;  // allocate: not served, ask the driver (never a CUresult)
inline constexpr int k_pool_oom_quiet = -2;  // allocate(quiet_oom): out of memory, nothing logged (never a CUresult)

// A block_pool serves device allocations from segments it takes from a pool_backend, and logs
// every state change to an event_sink.  docs/pool.md is its design and guarantee.  All public
// functions are thread-safe (one mutex) and, except validate(), noexcept.
class block_pool {
 public:
    // ordinal: the pool's number among its device's pools, written as each event's "ctx"
    // (docs/log-format.md): 0 for the device's first.
    block_pool(const pool_config& cfg, pool_backend& backend, event_sink* sink, int device, int ordinal = 0) noexcept;
    ~block_pool();  // frees host bookkeeping only: never calls the backend
    int ordinal() const noexcept { return ordinal_; }  // its "ctx"
    block_pool(const block_pool&) = delete;
    block_pool& operator=(const block_pool&) = delete;

    // cuMemAlloc semantics.  Returns a CUresult; on success *out is the block address (aligned to
    // cfg.round).  Emits segment_alloc/segment_free/pool_sync as it works, then alloc, or oom (on
    // OOM) and alloc_fail (on any error).  size 0 -> k_cuda_invalid_value, like the driver.
    // `stack` is the caller's interned call stack, captured before the call so that walking the
    // stack never happens under the pool's lock; the alloc or alloc_fail event carries it.
    // Returns k_pool_declined without an event, and the caller passes the request to the driver,
    // from a poisoned pool (host memory ran out mid-update: it serves nothing more), for a miss
    // after release_all_at_exit, and on a device without virtual memory when cfg.vmm_only.
    // `quiet_oom`: an out-of-memory answer is k_pool_oom_quiet and emits neither oom nor
    // alloc_fail, for a caller that makes room elsewhere (another context's pool on the device)
    // and asks again, logged then.  Not for a request larger than the device, which no room made
    // anywhere could serve: that one is k_cuda_oom, logged, as without quiet_oom.
    int allocate(uint64_t size, api_id api, uint64_t* out, uint32_t stack = 0, bool quiet_oom = false) noexcept;

    // cuMemFree semantics.  Returns false, with nothing done or logged, when ptr lies outside every
    // segment of this pool: the caller passes the call to the driver.  Otherwise returns true with
    // *result = 0 for a live block start (emits free), or k_cuda_invalid_value (emits free_fail)
    // for any other address inside a segment (double free, interior pointer): passing such a
    // pointer to the driver could free a whole segment.  ptr == 0 is the caller's job.
    // `walking`: the caller asks every pool in turn (a free that may be another pool's, or no
    // pool's at all): a pool whose lock another thread holds (through a device wait, or a green
    // context's destruction: pool_hooks.cc, primary_released_by) answers false at once when its
    // segment table says ptr lies in none of its segments (holds() 0), rather than wait.  Exact: a
    // segment enters the table before any of its blocks is handed out and leaves it only once none
    // is allocated, so a block the program holds is never skipped.  The lock is tried first: a
    // pool nobody holds costs what it did.
    bool deallocate(uint64_t ptr, api_id api, int* result, bool walking = false) noexcept;

    struct block_info {
        uint64_t block, block_size, requested, segment, segment_size;
        bool allocated;  // false: a free, pending or unmapped block (the program holds no allocation there)
        bool vmm;        // the segment is virtual memory (reserved address space, mapped chunks)
    };
    // Finds the block holding addr (any address inside it).  Lets the hook answer
    // cuMemGetAddressRange / cuPointerGetAttribute(RANGE_START/RANGE_SIZE) with the block's own
    // range instead of the segment's, and step aside (e.g. cuIpcGetMemHandle) for pooled blocks.
    // `walking`: as deallocate's (a pointer query asks every pool).
    bool lookup(uint64_t addr, block_info* out, bool walking = false) const noexcept;
    // Whether addr lies in one of this pool's segments, without the lock and async-signal-safe,
    // for a signal handler that interrupted a pool operation (segment_ranges.h): 1 yes, 0 no,
    // -1 cannot tell (more segments than the table holds).
    int holds(uint64_t addr) const noexcept { return ranges_.holds(addr); }

    // Sharing a block with another process (docs/pool.md, "Sharing memory between processes"):
    // the physical chunks under [addr, addr + requested) of the allocated block that starts at
    // addr in a virtual-memory segment.  Under the pool's lock, so that no free can release them
    // meanwhile, calls visit(ctx, handles, n) with chunks [from, from + n) of them, n <= max, and
    // fills *view.  False, with visit not called, for any other address or when visit says so.
    struct chunk_view {
        uint64_t chunk;   // bytes per chunk
        uint64_t offset;  // addr minus the first chunk's address
        uint64_t count;   // chunks under the block
    };
    using chunk_visitor = bool (*)(void* ctx, const uint64_t* handles, size_t n);
    bool visit_block_chunks(uint64_t addr, size_t from, size_t max, chunk_view* view, chunk_visitor visit,
                            void* ctx) const noexcept;

    // The schema's pool_state; size, gpu_free and gpu_total are left 0.
    pool_state snapshot() const noexcept;
    // Bytes freed by the program but not yet reusable (safe mode).
    uint64_t pending_bytes() const noexcept;
    // Number of backend synchronize() calls made (device-wide syncs).
    uint64_t sync_count() const noexcept;
    // The physical chunk size of this pool's virtual-memory segments; 0 while it takes segments
    // from segment_alloc (no VMM on the device, GPUMEM_POOL_VMM=off, or no segment yet).
    uint64_t chunk_size() const noexcept;
    // Number of times the pool blocked on a fence (event_synchronize) because memory was short.
    uint64_t fence_wait_count() const noexcept;
    // GPUMEM_FENCE_WAIT=order: a non-blocking stream just made in this pool's context starts
    // after the last ordered release's event (docs/pool.md, "Ordered release").  The hook calls
    // it before the program gets the stream.
    void order_new_stream(uint64_t stream) noexcept;
    // GPUMEM_FENCE_WAIT=order: streams appeared that no wait can order (a green context's run
    // beside this context's): the host waits for the last ordered release's work, once, before
    // the program has them.  The green-context hooks call it.
    void order_settle() noexcept;
    uint64_t ordered_releases() const noexcept;  // how many ordered releases ran
    bool order_stopped() const noexcept;         // ordered release gave way to waits for good
    uint64_t wait_ns() const noexcept;  // ns blocked in the pool's waits, all told
    uint64_t fence_ns() const noexcept;  // ns in its event and stream calls that do not wait, all told
    // Stitched segments made, chunks the driver mapped into them (a kept range's positions still
    // free are not mapped again), stitched segments dissolved, and stitches on a kept range, so far.
    void stitch_counts(uint64_t* made, uint64_t* chunks, uint64_t* dissolved, uint64_t* reused = nullptr) const noexcept;
    // Chunks unmapped from stitched ranges, and the host ns of every second mapping and unmapping
    // call (map, access grant, unmap), so far: what stitching costs the program.
    void stitch_driver(uint64_t* unmapped_chunks, uint64_t* ns) const noexcept;
    // Stitched ranges kept mapped with no segment on them (GPUMEM_POOL_STITCH_KEEP): address
    // reservations that are no segment's.
    size_t kept_ranges() const noexcept;
    // The pool's own chunk calls, so far (stitching's second mappings are stitch_driver's): chunks
    // mapped (cuMemCreate, cuMemMap, cuMemSetAccess), maps the driver refused for memory, chunks
    // unmapped (cuMemUnmap, cuMemRelease), looks at the driver's free memory (cuMemGetInfo), and
    // the host ns of each kind of call.  Near the device's memory the out-of-memory path cycles
    // chunks through these calls every step: what that costs the program (docs/pool.md).
    struct driver_tally {
        uint64_t mapped = 0, refused = 0, unmapped = 0, looks = 0;
        uint64_t foreseen = 0;  // growths not tried: a fresh look said the driver had too little
        uint64_t moved = 0;     // of `mapped`, chunks given back and mapped again without a release
        uint64_t map_ns = 0, unmap_ns = 0, look_ns = 0;
    };
    driver_tally chunk_driver() const noexcept;

    // Fences (docs/pool.md, "safe: fences"): with a stream set and a backend that has events,
    // pending frees are released by events recorded on the legacy stream and on every
    // non-blocking stream of ctx, instead of a synchronize of the context.  Without (the default),
    // or whenever a fence cannot be made, by synchronize() as before.
    void set_streams(stream_set* streams, uint64_t ctx) noexcept;

    // Peer access (cuCtxEnablePeerAccess from a context of `device` to this pool's): `device` may
    // use this pool's memory from now on, as it may the driver's cuMemAlloc memory.  Every chunk
    // mapped so far gets access for it, and every later one too.  No-op for cuMemAlloc segments.
    void grant_peer(int device) noexcept;

    // A call the pool does not serve (cuMemCreate, the stream-ordered pools, managed or pitched
    // memory, a module load, a launch) ran out of memory: gives back what the pool's own OOM path
    // would (pending frees once their work is done, idle stitched segments, empty segments, and on
    // virtual memory every whole chunk inside free memory), so that the pool holds no memory the
    // driver alone would have had free.  Like that path it waits for the device work queued before
    // it (unmapping memory a kernel may still use would fault), holding the pool meanwhile.
    // Returns the reserved bytes given back; 0 during a stream capture, which forbids the waits
    // and unmaps.  Segment events carry `api`, the call that ran out.
    uint64_t give_back(api_id api) noexcept;
    // What give_back could return now, without a backend call: on virtual memory the whole chunks
    // inside runs of free and pending blocks, and the lenders of idle stitched segments; the
    // cuMemAlloc segments whose every block is free or pending.  cuMemGetInfo adds it to the
    // driver's free.  Never blocks: while another thread holds the pool (a wait on the device,
    // say) it answers the last count it made.
    uint64_t giveable_bytes() const noexcept;
    // Headroom for the driver (pool_config::headroom, docs/pool.md "Headroom for the driver"):
    // after each growth the pool looks at the driver's free memory (counted down by its own
    // growths, asked again near the line and with each stats event); below the headroom the pool
    // is short, and any_short() says so to the hooks in one load.  make_headroom, which the hooks
    // call before a function's first use (a lazy load), gives back whole free chunks, pending
    // frees once their work is done, and at last empty segments, until the driver has the
    // headroom or the pool nothing more to give; then looks again.  It waits like give_back, and
    // does nothing while the pool is not short or a capture is open.  Returns the bytes given back.
    uint64_t make_headroom(api_id api) noexcept;
    static bool any_short() noexcept { return short_pools_.load(std::memory_order_relaxed) != 0; }
    bool headroom_short() const noexcept { return short_.load(std::memory_order_relaxed); }
    // Returns every fully free segment to the driver, after releasing pending frees with one sync.
    // Does nothing during a stream capture.  Segment events carry api "none".
    void release_cached() noexcept;
    // A stream capture is about to open (the capture-begin hook, before the driver opens it):
    // frees an ordered-release batch left pending are released now, since inside the capture
    // nothing may be, and they would serve only after it (docs/pool.md, "Ordered release").
    void release_before_capture() noexcept;
    // The context ends: its memory goes with it.  Gives back the virtual-memory segments, which
    // outlive contexts (`coming`: the context still exists, its work is waited for first; `past`:
    // the driver ended it and its work already, and these calls need no context), unless a
    // capture forbids it (`forget`: nothing goes back); then forgets every segment and block, and
    // emits context_reset.  cuMemAlloc segments are left to the driver, which frees them with the
    // context.  The pool is usable afterwards.
    void drop_all(context_end when = context_end::coming) noexcept;
    // Process exit: the driver may already be unloaded, and the OS reclaims device memory anyway,
    // so the pool leaks its segments and from now on never calls the backend again.  Late frees
    // (static destructors) still find their blocks; an allocation that the cache cannot serve
    // returns k_pool_declined, so the hook passes it to the driver, as without gpumem.  Waits for
    // another thread's operation (2 s at most), but not at all inside a critical_section of this
    // thread: exit() from a signal handler may have interrupted it, holding the lock.  True when
    // it took the lock: then the other queries may lock too (false: they might wait for ever).
    bool release_all_at_exit() noexcept;
    // The pool's lock, for a caller that changes the context its backend works in and must keep
    // every operation, and so every backend call, out until it has (a destroyed green context's
    // pool going on in the primary context: pool_hooks.cc, primary_released_by).  The caller is
    // inside a critical_section from before this call until after the unlock (critical_section.h).
    std::unique_lock<std::mutex> hold() const noexcept { return std::unique_lock<std::mutex>(mu_); }

    // GPUMEM_REUSE=auto: the program created a stream, so a freed block may still be read by work
    // on another stream, and stream order alone no longer makes reuse safe.  From now on frees are
    // pending (safe mode).  Emits reuse_safe, then synchronizes once if the pool holds memory: a
    // block handed out before this call may still have its previous owner's work queued, and the
    // new stream must not overtake it.  No-op unless the mode is auto and still immediate.
    void enter_safe_reuse(api_id api) noexcept;
    // True while frees become reusable at once (immediate mode, or auto before a stream appeared).
    bool reuse_is_immediate() const noexcept;
    // The drain of enter_safe_reuse, if it was owed because no sync was allowed then (a capture);
    // also made by the next allocate() that may sync.
    void settle_owed_drain() noexcept;

    // Emits a stats event (with backend mem_info) if cfg.stats_ms has elapsed since the last one;
    // the first call emits.  Cheap (one atomic load) when it is not due.
    void maybe_emit_stats(uint64_t now_ns) noexcept;

    // Invariant checker (docs/pool.md lists the invariants).  With GPUMEM_POOL_VALIDATE defined it
    // also runs after every operation and aborts on failure.
    bool validate(std::string* why) const;

    const pool_config& config() const noexcept { return cfg_; }

 private:
    // unmapped: address space of a VMM segment whose physical chunks went back to the driver;
    // never handed out, never merged with free neighbours (its bytes do not count as reserved).
    // lent: whole chunks of a segment that are also mapped into a stitched segment, which uses
    // them (docs/pool.md, "Stitching"); neither free nor handed out here until it is dissolved.
    enum class block_state : uint8_t { free, allocated, pending, unmapped, lent };
    struct segment;
    struct block;
    using addr_map = std::map<uint64_t, block*>;
    struct block {
        uint64_t addr = 0, size = 0, requested = 0;
        segment* seg = nullptr;
        block* prev = nullptr;  // neighbours within the segment, by address
        block* next = nullptr;
        block_state state = block_state::free;
        uint64_t seq = 0;  // pending blocks: the order of their frees (pending_ is sorted by it)
        uint64_t cum = 0;  // pending blocks: bytes freed into pending_ so far, this block's included
        // Its entry in blocks_ while it has one, else blocks_.end() (new_block sets it): a split
        // inserts its rest right after it and a merge erases by position, in constant time rather
        // than a walk down a map of thousands of blocks (512 B pairs under `safe`, docs/pool.md).
        addr_map::iterator pos;
    };
    struct segment {
        uint64_t base = 0, size = 0;  // size: the whole range (reserved address space for VMM)
        pool_id pool = pool_id::none;
        block* first = nullptr;
        // VMM segments only: the handle of each chunk of the range, 0 where unmapped.
        std::vector<uint64_t> chunks;
        uint64_t mapped = 0;  // bytes of mapped chunks (== size for a cuMemAlloc segment)
        // Stitched: a second mapping of other segments' chunks (their `lent` blocks, in order),
        // so its bytes are not reserved again and its chunks are not its own to release.
        std::vector<block*> lent;
        // Stitched: the last ordered release that handed out one of its blocks (0: none).  Its
        // range is unmapped (dissolved) only once that release's work is done (order_reached).
        uint64_t settle_gen = 0;
        bool in_ranges = false;  // in ranges_ (holds()), at range_slot
        int range_slot = -1;
        bool stitched() const noexcept { return !lent.empty(); }
        bool vmm() const noexcept { return !chunks.empty(); }
    };
    struct by_size_addr {  // best fit: smallest size, then lowest address
        bool operator()(const block* a, const block* b) const noexcept {
            return a->size != b->size ? a->size < b->size : a->addr < b->addr;
        }
    };
    using free_set = std::set<block*, by_size_addr>;

    // The pool's lock, held by every operation and query, inside a critical_section from before it
    // locks until after it unlocks (critical_section.h): exit() called by a signal handler that
    // interrupted this thread anywhere in there (even between the lock's acquisition and a record
    // of its holder, which hung 1 run in 10) must not wait for it.
    struct held {
        critical_section in;  // constructed before lk locks, destroyed after it unlocks
        std::unique_lock<std::mutex> lk;
        explicit held(const block_pool& pool) : lk(pool.mu_) {}
        held(const block_pool& pool, std::try_to_lock_t t) : lk(pool.mu_, t) {}
        // A walk's (deallocate, lookup): not taken (owns_lock() false) where another thread holds
        // it and addr lies in none of the pool's segments.
        held(const block_pool& pool, uint64_t addr, bool walking) : lk(pool.mu_, std::defer_lock) {
            if (walking && (lk.try_lock() || pool.ranges_.holds(addr) == 0)) return;
            lk.lock();
        }
    };
    // The lock of one state-changing operation.  It also makes the operation's first capture check
    // ask the driver afresh (can_sync), so no operation inherits an earlier one's answer.  The
    // bounded form waits `tries` times `step_ns` at most and may not get it (owns()).
    struct op_lock {
        held h;
        explicit op_lock(block_pool& p) : h(p) { begin(p); }
        op_lock(block_pool& p, int tries, long step_ns) : h(p, std::try_to_lock) {
            for (int i = 0; i < tries && !owns(); ++i) {
                timespec ts{0, step_ns};
                nanosleep(&ts, nullptr);
                h.lk.try_lock();
            }
            if (owns()) begin(p);
        }
        op_lock(block_pool& p, uint64_t addr, bool walking) : h(p, addr, walking) {
            if (owns()) begin(p);
        }
        bool owns() const { return h.lk.owns_lock(); }
        static void begin(block_pool& p) {
            p.capture_checked_ = false;
            // An exit that could not take the lock (release_all_at_exit) takes effect here.
            if (p.exit_pending_.load(std::memory_order_relaxed)) p.exiting_ = true;
        }
    };

    static int pool_index(pool_id p) noexcept { return p == pool_id::small ? 0 : 1; }
    pool_id pool_for(uint64_t size) const noexcept;
    uint64_t segment_size_for(pool_id p, uint64_t asize) const noexcept;
    bool should_split(pool_id p, uint64_t remaining) const noexcept;
    uint64_t sync_budget() const noexcept;
    bool can_sync() noexcept;
    // Under ordered release, the pending bytes of a batch for requests of asize (from
    // pool_config::order_batch, the rule stated there; 0: none), and whether pool index i's are still fewer: a miss
    // then grows rather than release them.
    uint64_t order_batch_for(uint64_t asize) const noexcept;
    bool batch_pending(int i, uint64_t asize) const noexcept;

    block* find_free(pool_id p, uint64_t asize) noexcept;
    block* grow(pool_id p, uint64_t asize, api_id api, int* err);
    // A block of asize bytes is larger than the whole device (its size known from the last look at
    // the driver): no give-back can make room for it.
    bool beyond_device(uint64_t asize) const noexcept { return total_ && asize > total_; }
    // plain: from segment_alloc even when the pool is on virtual memory (the last-resort segment).
    // map_bytes (VMM only, 0 = all): map only the first map_bytes of the range; the rest starts
    // as one unmapped block, a hole (an arena).
    int new_segment(pool_id p, uint64_t seg_size, api_id api, block** out, bool plain = false, uint64_t map_bytes = 0);
    // Arenas (GPUMEM_POOL_ARENA): serves a miss by mapping chunks into the lowest hole of pool p
    // where a free neighbour plus the hole fit asize, else in a new arena.  Returns a CUresult; on
    // success a free block of at least asize exists in pool p (*out).
    int arena_grow(pool_id p, uint64_t asize, api_id api, block** out);
    block* find_hole(pool_id p, uint64_t asize, uint64_t* bytes) noexcept;
    // Memory short: maps into the hole of pool p (arena or not) that serves asize with the fewest
    // chunks, joined to the free block before it (its front), after it (its back) or both (all of
    // it).  k_cuda_oom when no hole and its free neighbours fit asize, or the driver refuses.
    int map_cheapest_hole(pool_id p, uint64_t asize, api_id api, block** out);
    uint64_t arena_unit(pool_id p, uint64_t asize) const noexcept;  // what a miss maps when it can
    // The bytes arena_grow would map for asize first (its unit), and the hole it would map into
    // (*hole, nullptr for a new arena): what a growth would add to reserved memory.
    uint64_t arena_growth(pool_id p, uint64_t asize, const block** hole) noexcept;
    bool use_arenas() noexcept;
    // Maps the first `bytes` (whole chunks) of unmapped block u; they become free, merged with a
    // free block before u (and after, when u is mapped whole).  *out: the free block they joined.
    int map_hole(block* u, uint64_t bytes, api_id api, block** out);
    // Splits hole u at `at` (0 < at < u->size): u keeps its first `at` bytes, the returned new hole
    // the rest.  nullptr, u unchanged, without host memory for the block; a throw leaves u unchanged.
    block* split_hole(block* u, uint64_t at);
    // Stitching: serves a large miss that would lift reserved memory over its high-water mark by
    // mapping whole free chunks of the pool, wherever they lie, a second time into fresh address
    // space.  The free block made there, or nullptr (nothing changed) when the free chunks are too
    // few or the backend cannot.
    block* stitch(pool_id p, uint64_t asize, api_id api);
    // Returns a wholly free stitched segment's chunks to their lenders (unmap of the second
    // mapping, no release).  Only with every free settled and no capture open (the caller checks).
    // If the driver refuses the unmap, the segment stays out of service and its lenders lent.
    void dissolve(segment* s, api_id api);
    // Dissolves every wholly free stitched segment; true if any was.
    bool dissolve_free_stitched(api_id api);
    // A stitched range's address space and second mappings (docs/pool.md, "Stitching").  After
    // its segment dissolves the range stays mapped, idle (up to cfg.stitch_keep of them), so the
    // next stitch remaps only the positions whose chunks are no longer free: a training step's
    // large request finds most of the last step's lenders free again, and each remap costs the
    // driver about 50 us a chunk (H200 runs 65-67).  A second mapping takes no memory, but a
    // chunk released while one remains stays allocated: every path that releases chunks first
    // unmaps the idle aliases and the tails of the used ones (drop_aliases).
    struct alias {
        uint64_t base = 0, va = 0;      // the reservation
        std::vector<uint64_t> handles;  // position i maps handles[i] (0: unmapped), from base
        std::vector<uint64_t> src;      // each position's chunk's first mapping (its segment's address)
        segment* user = nullptr;        // the stitched segment on positions [0, its size); none: idle
        uint64_t used = 0;              // the stitch count at its last use: the oldest idle goes first
    };
    std::vector<alias> aliases_;
    bool alias_stuck_ = false;  // an alias's unmap was refused: no chunk may be released any more
    alias* alias_of(const segment* st) noexcept;
    // backend_.map_alias / unmap_alias of n chunks at addr, timed and counted (stitch_driver).
    int alias_map(uint64_t addr, size_t n, const uint64_t* handles) noexcept;
    int alias_unmap(uint64_t addr, size_t n) noexcept;
    // Unmaps the mapped positions of [from, to) of an alias, in runs; false if the driver refused
    // one (that run stays known as mapped).
    bool unmap_alias_range(alias& a, size_t from, size_t to) noexcept;
    // Unmaps an alias's mapped positions from `from` on (all of them: then frees its address space).
    // A refusal sets alias_stuck_ and leaves the positions as they are, the address space reserved.
    void unmap_alias_from(alias& a, size_t from) noexcept;
    // idle_keep: how many idle aliases may stay (the oldest go first); tails: also unmap the
    // positions past each used alias's segment.  0 and true before any chunk is released.
    void drop_aliases(size_t idle_keep, bool tails) noexcept;
    // Splits [lo, hi) (inside free block b) off as a block of state st; returns it.
    block* carve(block* b, uint64_t lo, uint64_t hi, block_state st);
    void hole_insert(block* u);
    void hole_erase(block* u) noexcept;
    bool use_vmm() noexcept;  // decides once, at the first segment, from the config and backend
    void backend_release(segment* s) noexcept;  // unmap + address free, or segment_free (untracked first)
    // A segment the pool now holds goes into ranges_ / leaves it, before anything goes back to the driver.
    void track(segment* s) noexcept;
    void untrack(segment* s) noexcept;
    // Whole chunks inside free blocks go back to the driver, until `want` bytes have (all of them
    // on OOM; GPUMEM_POOL_TRIM's excess before growing).  Returns the bytes given back.
    // keep: a hole whose free neighbours stay mapped (the trim before an arena maps into it).
    // part: a free block may go back in part, the front chunks that make up `want` (headroom).
    uint64_t unmap_free_chunks(api_id api, uint64_t want = UINT64_MAX, const block* keep = nullptr, bool part = false);
    // The same, only when it may run: chunks in use (VMM), no free block's last work left to wait
    // for (unsettled_frees_ == 0) and no capture open (cuMemUnmap does not wait); 0 otherwise.
    uint64_t unmap_settled(api_id api, uint64_t want, const block* keep, bool part);
    // The backend's chunk and memory-info calls, counted and timed into tally_.
    int map_chunks(uint64_t addr, size_t n, uint64_t* handles) noexcept;
    void unmap_chunks(uint64_t addr, size_t n, uint64_t* handles) noexcept;
    void mem_info(uint64_t* free_b, uint64_t* total_b) noexcept;
    // After the pending frees were released (OOM, give_back): settles the rest, dissolves idle
    // stitched segments, returns empty segments and unmaps every whole free chunk; nothing inside
    // a capture.
    // want: as much as that; whole free chunks first, then idle stitched and empty segments.
    void release_unused(api_id api, uint64_t want = UINT64_MAX);
    // Headroom: the driver's free memory as just measured (under the lock); sets short_.
    void note_driver_free(uint64_t free_b, uint64_t total) noexcept;
    // mem_info, then note_driver_free; returns the free bytes (*total: the device's, 0 when it cannot say)
    uint64_t look_at_driver(uint64_t* total = nullptr) noexcept;
    void set_short(bool now) noexcept;   // short_, and the process's count of short pools with it
    uint64_t headroom_limit() const noexcept;  // min(cfg.headroom, the device / 64)
    void after_growth() noexcept;  // looks at the driver when free_est() is near the line
    // Under foresee_: true (counted as foreseen) when bytes more than free_est() and a fresh look
    // agree that the driver cannot hold them; false otherwise, or when the driver cannot say.
    bool foreseen_short(uint64_t bytes) noexcept;
    void take(block* b, uint64_t asize, uint64_t requested);
    void absorb_next(block* left);  // merges left->next into left
    void make_free(block* b);  // pending/allocated -> free, coalesced, in its free set
    bool sync_release(api_id api);
    // Releases pending frees whose fences have completed: by fences when they can cover the
    // context (recording one for the frees not yet fenced), else by one synchronize.  With `wait`,
    // blocks on the oldest fences, one at a time, until a free block of `asize` fits in pool `p`
    // (asize 0: until every fence is reached).  True if anything was released or the sync succeeded.
    bool reclaim(api_id api, bool wait, pool_id p = pool_id::small, uint64_t asize = 0);
    // The wait for an old pending block instead of a growth or of a cut of a larger free block;
    // GPUMEM_FENCE_WAIT says which blocks are old enough.
    bool wait_for_old_fit(api_id api, pool_id p, uint64_t asize);
    // Blocks on the oldest fence (fences_ not empty) and releases its frees; false when an event
    // broke, and the caller then falls back to sync_release().
    bool wait_oldest_fence(api_id api);
    bool fences_usable() noexcept;
    bool record_fence() noexcept;          // fences pending_[fenced_end(), size); false if it cannot
    // Asks every non-blocking stream of the context once, for every unswept fence: an idle stream
    // has finished all it had before their frees; a busy one gets an event per such fence.
    // k_cuda_success; k_cuda_not_ready when no query is allowed now (a capture: the fences wait);
    // another error when fences cannot cover the context (a stream destroyed since, a failed
    // record: the caller falls back to a sync).
    int sweep_streams() noexcept;
    // Releases completed fences' frees; 0 or an error.  `waited`: the pool just blocked on the
    // oldest fence, which its pool_sync says.
    int poll_fences(api_id api, bool waited = false);
    // flags: the pool_sync line's event_flags (ef_fence, with ef_waited or ef_ordered).
    void release_prefix(size_t n, api_id api, uint8_t flags);
    void emit_release(api_id api, size_t n, uint8_t flags) noexcept;
    bool drain_by_fence(api_id api);       // enter_safe_reuse's drain without a context sync
    bool wait_all_streams(bool legacy_only) noexcept;  // events on the streams, waited on; false: not covered
    bool settle_frees(api_id api);         // unsettled_frees_ to 0: wait_all_streams, else a sync
    size_t fenced_end() const noexcept { return fences_.empty() ? 0 : fences_.back().end; }
    bool take_event(uint64_t* ev) noexcept;
    void recycle_events(std::vector<uint64_t>& evs) noexcept;
    void recycle_event(uint64_t ev) noexcept;
    void drain_if_owed(api_id api) noexcept;  // the owed drain of enter_safe_reuse, if a sync is allowed
    // Every idle segment (all blocks free or unmapped) goes back to the driver, or (want) as few
    // as make up want bytes.
    void release_free_segments(api_id api, uint64_t want = UINT64_MAX);
    // One idle segment back to the driver (segment_free); false, with nothing done, when its frees
    // cannot be settled now or a capture is open: the caller stops.
    bool release_segment(segment* s, api_id api);
    void forget_all() noexcept;
    pool_state snapshot_locked() const noexcept;
    bool validate_locked(std::string* why) const;
    void check_after_op() const;
    uint64_t count_giveable() const noexcept;  // giveable_bytes' walk, under the lock

    // Node recycling: the hot path re-keys std::set/std::map nodes instead of allocating, and
    // reuses block objects, so steady-state alloc/free pairs do not touch malloc.
    block* new_block() noexcept;
    void recycle(block* b) noexcept;
    // after: b's lower neighbour, already in blocks_ (a hint: b goes right after it), or null.
    void addr_insert(block* b, const block* after = nullptr);
    void addr_erase(block* b) noexcept;  // no-op for a block not in blocks_
    void free_insert(block* b);
    void free_erase(block* b) noexcept;
    void pending_large_erase(std::multiset<uint64_t>::iterator it) noexcept;  // keeps the node

    void emit_block(ev_kind ev, api_id api, const block* b, uint64_t requested, int err, uint32_t stack = 0) noexcept;
    void emit_segment(ev_kind ev, api_id api, const segment* s) noexcept;
    // segment_unmap (chunks given back) or segment_map (chunks mapped into a hole) of [addr, +bytes).
    void emit_chunks(api_id api, const segment* s, uint64_t addr, uint64_t bytes, ev_kind ev = ev_kind::segment_unmap) noexcept;
    void emit_simple(ev_kind ev, api_id api, uint64_t count) noexcept;
    void emit_oom(api_id api, uint64_t size) noexcept;
    // Every event of the pool goes out here, stamped with its device and ordinal ("dev", "ctx").
    void send(event& e) noexcept {
        e.dev = device_;
        e.ctx = ordinal_;
        sink_->emit(e);
    }

    const pool_config cfg_;
    pool_backend& backend_;
    event_sink* const sink_;
    const int16_t device_;
    const uint8_t ordinal_;

    mutable std::mutex mu_;
    std::map<uint64_t, segment*> segments_;  // by base
    segment_ranges ranges_;                  // their ranges, for holds()
    addr_map blocks_;                        // every block of every segment, by address
    free_set free_[2];                       // reusable free blocks: [0] small pool, [1] large pool
    struct by_addr {
        bool operator()(const block* a, const block* b) const noexcept { return a->addr < b->addr; }
    };
    std::set<block*, by_addr> holes_[2];     // unmapped blocks by address (arenas map them again)
    uint64_t arena_size_ = 0;                // address space of a new arena; 0 = no arenas (decided once)
    driver_tally tally_;                     // chunk_driver()
    // Set around a miss's first growth only (grow): map_chunks may then decline a growth that a
    // fresh look says the driver cannot hold, without asking for it (docs/pool.md, "When memory is
    // short").  Never around a retry, so the pool's last word is always the driver's own.
    bool foresee_ = false;
    // Moves (memory short, the bounded give-back): while moving_, unmap_chunks keeps the chunks it
    // unmaps (loose_, up to its capacity) instead of releasing them, and map_chunks maps loose ones
    // before it creates any; what is left goes back at the end of the give-back (release_loose).
    // A move saves a cuMemRelease and a cuMemCreate a chunk (docs/pool.md, "When memory is short").
    bool moving_ = false;
    std::vector<uint64_t> loose_;
    void release_loose() noexcept;
    std::vector<block*> pending_;            // freed, waiting for a synchronize (safe mode)
    std::multiset<uint64_t> pending_large_;  // sizes of the large pool's pending blocks
    std::vector<std::multiset<uint64_t>::node_type> spare_large_nodes_;  // for its inserts
    uint64_t next_seq_ = 0;                  // the next pending block's seq
    uint64_t pending_cum_ = 0;               // bytes ever freed into pending_ (block::cum)

    uint64_t reserved_ = 0, allocated_ = 0, requested_ = 0, free_bytes_ = 0;
    uint64_t pending_bytes_[2] = {0, 0};
    uint64_t syncs_ = 0;
    // Frees made reusable at once (immediate reuse) since the last sync or wait for all streams:
    // their last owner's work may still be queued, so their chunks cannot be unmapped yet.
    uint64_t unsettled_frees_ = 0;
    uint64_t chunk_ = 0;             // VMM chunk size, 0 = cuMemAlloc segments
    bool vmm_decided_ = false;
    uint64_t fence_waits_ = 0;
    // ns blocked in waits (fences, a drain, a synchronize) not yet written: the next pool_sync
    // line carries them ("wait_ns"), so the log says how long the pool held the program up.
    uint64_t wait_ns_unlogged_ = 0, wait_ns_total_ = 0;
    void note_wait(uint64_t t0_ns) noexcept;
    // The same for the host time of the calls that make reuse safe without waiting (fence and
    // ordered-release records, queries and stream waits: "fence_ns"), so a user sees what safe
    // reuse costs the host, and a benchmark sees it per step, free of the machine's noise.  Timed
    // by the outermost fence_timer of an operation only (they nest: a release asks order_reached).
    uint64_t fence_ns_unlogged_ = 0, fence_ns_total_ = 0;
    int fence_depth_ = 0;
    class fence_timer {
     public:
        explicit fence_timer(block_pool& p) noexcept;
        ~fence_timer() { stop(); }
        void stop() noexcept;  // adds the time so far (once); before a release's own pool_sync line
        fence_timer(const fence_timer&) = delete;
        fence_timer& operator=(const fence_timer&) = delete;

     private:
        block_pool& p_;
        uint64_t t0_ = 0;
        bool running_ = true;
    };
    // Ordered release (GPUMEM_FENCE_WAIT=order): order_event_ is the legacy-stream event of the
    // last one (0: none yet), order_scratch_ an event each busy stream's work is marked with.
    bool order_release(api_id api);
    bool ordered_frees_settled() noexcept;
    bool order_alone() noexcept;  // ordered release instead of fences: no non-blocking stream to order
    // The last ordered release known done (polls order_marks_).  locked: the caller holds the
    // stream set's lock (capture_guard), else it is taken here.
    uint64_t order_reached(bool locked = false) noexcept;
    bool capture_guard(std::unique_lock<std::mutex>& held) noexcept;  // the lock for event queries
    bool order_work_pending(std::unique_lock<std::mutex>& held) noexcept;
    void order_host_wait(std::unique_lock<std::mutex>& held) noexcept;
    void forget_fences() noexcept;  // every fence covered (a synchronize, an ordered release): events back
    uint64_t order_event_ = 0, order_scratch_ = 0, ordered_releases_ = 0;
    // Earlier releases' events not yet seen reached, oldest first: {release number, event}.  On
    // one stream (legacy), so they are reached in order.  Why: with the GPU tens of ms behind, a
    // release comes every few ms and the last one's event is never reached when asked, so a
    // stitched block freed long ago would never be dissolved (replayed with the GPU 20 ms behind:
    // 1.35x the live peak, 2.57x at 100 ms).  At most k_order_marks; the oldest goes first (a
    // later release's event reached says as much).
    static constexpr size_t k_order_marks = 64;
    std::vector<std::pair<uint64_t, uint64_t>> order_marks_;
    uint64_t order_reached_ = 0;
    bool order_off_ = false;  // a stream ran the program's own work beside it, or a call failed
    uint64_t hwm_ = 0;               // the most reserved_ has been: stitching keeps under it
    uint64_t stitches_ = 0, stitched_chunks_ = 0, dissolves_ = 0, alias_reuses_ = 0, alias_unmapped_ = 0, alias_ns_ = 0;
    size_t n_stitched_ = 0;          // stitched segments now

    // A fence: events recorded on the legacy stream and on every non-blocking stream of the
    // context after pending_[0, end) were freed.  Oldest first.
    // unswept: some non-blocking stream was not asked at the record (it was idle at its last
    // check); before the fence releases anything, one sweep asks every stream (sweep_streams).
    struct fence {
        std::vector<uint64_t> events;
        size_t end = 0;
        bool unswept = false;
    };
    // Oldest first.  A vector, popped at the front: rarely more than a few fences wait, and a deque
    // would allocate and free a node buffer every 16 fences of a steady loop.
    std::vector<fence> fences_;
    std::vector<std::vector<uint64_t>> spare_fence_events_;  // released fences' event lists, emptied
    std::vector<uint64_t> spare_events_;   // reached events, reused for the next fence
    std::vector<uint64_t> fence_streams_;  // scratch: the streams of the fence being made
    // Non-blocking streams ever found busy (hot): a fence asks these at its record and leaves the
    // others, which never ran anything the pool saw, to the sweep (docs/pool.md, "`safe`: fences").
    // A hot stream stays hot: a sweep that finds a cold stream busy cannot tell its work from work
    // before the frees and waits for all of it (H200 run 62: demoted after 8 idle checks, the
    // streams of a transformer step flipped, and the pool waited 35% more often).  Rebuilt at each
    // record from the live streams, so a destroyed one leaves.
    std::vector<uint64_t> hot_streams_, hot_scratch_;
    bool is_hot(uint64_t stream) const noexcept;
    // Live non-blocking streams at the last fence, which it or its sweep asks (SIZE_MAX before the
    // first): 0 when a fence is one event on the legacy stream, which a batch of frees does not
    // amortize (pool_config::fence_batch).
    size_t last_fence_streams_ = SIZE_MAX;
    stream_set* streams_ = nullptr;
    uint64_t ctx_ = 0;
    int events_state_ = 0;             // 0: not tried, 1: the backend has events, -1: it has none
    uint64_t unfenced_bytes_ = 0;      // freed since the last fence
    bool immediate_;         // frees skip the pending state (see reuse_mode; auto starts true)
    bool drain_owed_ = false;  // enter_safe_reuse could not sync (capture): the next chance must
    bool exiting_ = false;   // release_all_at_exit was called: no more backend calls
    std::atomic<bool> exit_pending_{false};  // release_all_at_exit was called: op_lock sets exiting_
    bool said_no_vmm_ = false;  // vmm_only on a device without virtual memory: said once (per pool)
    bool no_vmm_device_ = false;  // use_vmm() found virtual memory asked for and the device without it
    bool capture_checked_ = false;  // this operation's may_synchronize() said true (can_sync)
    bool poisoned_ = false;  // host allocation failed mid-update: serve nothing more, leak

    std::vector<addr_map::node_type> spare_addr_nodes_;
    std::vector<free_set::node_type> spare_free_nodes_;
    block* spare_blocks_ = nullptr;  // singly linked through block::next
    size_t n_spare_blocks_ = 0;

    std::atomic<uint64_t> next_stats_ns_{0};
    mutable std::atomic<uint64_t> giveable_last_{0};  // giveable_bytes' last count (its answer while the lock is held)
    // Headroom: the driver's free memory at the last look (UINT64_MAX: never looked) and the pool's
    // reserved bytes then, the device's size, whether below the headroom, and how many pools of the
    // process are (the hooks' one load per launch).
    uint64_t free_at_look_ = UINT64_MAX, reserved_at_look_ = 0, total_ = 0;
    // The driver's free memory as counted: at the last look, less what the pool has mapped since
    // and plus what it has given back (UINT64_MAX: never looked).  Exact for the pool's own calls;
    // other allocators' are seen at the next look.  (Lowered by net growth only, before 2026-12-06, a
    // give-back and growth in one miss counted the give-back twice: replayed near the device's
    // memory, the count said 774 MiB free where a 410 MiB growth was refused.)
    uint64_t free_est() const noexcept {
        if (free_at_look_ == UINT64_MAX) return UINT64_MAX;
        const uint64_t up = free_at_look_ + reserved_at_look_;
        return up > reserved_ ? up - reserved_ : 0;
    }
    std::atomic<bool> short_{false};
    static inline std::atomic<int> short_pools_{0};
};

}  // namespace gpumem
