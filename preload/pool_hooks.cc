// The pool seam of the hook layer: one block_pool per CUDA context serves cuMemAlloc_v2/cuMemFree_v2, answers pointer queries for its blocks, and follows contexts, captures, fork and exit.
//
// With GPUMEM_POOL=off (or before the log has started, or when it could not start) every question
// is answered "not mine, pass through", so the preload behaves exactly as it did without a pool.
// docs/pool.md ("In libgpumem.so") states the behaviour chosen for each call.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include "config.h"
#include "diag.h"
#include "core/pool/block_pool.h"
#include "core/pool/capture_table.h"
#include "core/pool/event_sink.h"
#include "core/pool/pool_config.h"
#include "core/pool/pool_registry.h"
#include "core/pool/reuse_switch.h"
#include "core/pool/stream_set.h"
#include "driver_backend.h"
#include "gpumem_preload.h"

namespace gpumem {

// The registry key of a pool whose context ended while its memory lives on in another context
// (a destroyed green context's, its primary context alive): bit 63, which no user-space CUcontext
// has, and its slot's index (primary_released_by, context_gone).  Not the dead handle's bits: a
// driver that hands the handle out again to the next green context moves that one's pool too,
// while the first still lives (emu_pool_app green-handle-again).
constexpr uint64_t k_moved_pool_key = uint64_t(1) << 63;

// ipc_share.cc: pooled blocks shared with other processes.
CUresult ipc_export(CUipcMemHandle* h, const block_pool& pool, const driver_backend& backend, const block_pool::block_info& bi) noexcept;
void ipc_block_freed(uint64_t block) noexcept;
void ipc_pool_dropped(const block_pool* pool) noexcept;
void ipc_after_fork() noexcept;
void ipc_capture_ended() noexcept;
void ipc_context_gone(CUcontext ctx, int device) noexcept;

void apply_peer_grants(pool_registry::slot* s) noexcept;  // below: peer access enabled before a pool existed

namespace {

// The pool's events go to the recorder, which numbers and publishes them like any other.  The
// recorder changes in a fork child (state.cc makes a new one), hence the atomic pointer.
class recorder_sink final : public event_sink {
  public:
    void emit(event& e) noexcept override {
        if (recorder* r = rec_.load(std::memory_order_acquire)) r->emit(e);
    }
    void set(recorder* r) noexcept { rec_.store(r, std::memory_order_release); }
    // Events that will never be written: the log's end line says so.  Async-signal-safe.
    void count_lost(uint64_t n) noexcept {
        if (recorder* r = rec_.load(std::memory_order_acquire)) r->log().count_lost(n);
    }

  private:
    std::atomic<recorder*> rec_{nullptr};
};

// Static storage that is never destroyed: a free from another library's destructor, after ours,
// must still find a live sink and not a destroyed object's vtable.
recorder_sink& sink() noexcept {
    alignas(recorder_sink) static unsigned char storage[sizeof(recorder_sink)];
    static recorder_sink* s = new (storage) recorder_sink();
    return *s;
}

// The preload's backends: the real driver, one per (context, device).
struct driver_factory final : pool_registry::backend_factory {
    int current_device() noexcept override { return gpumem::current_device(); }
    pool_backend* make_backend(uint64_t ctx, int device) noexcept override {
        return new (std::nothrow) driver_backend(CUcontext(ctx), device);
    }
    void rebind(pool_backend& b, uint64_t ctx) noexcept override {
        static_cast<driver_backend&>(b).set_context(CUcontext(ctx));
    }
};

// Static storage that is never destroyed (like sink()): late frees from other libraries'
// destructors must still find the pools.
pool_registry& registry() noexcept {
    static driver_factory factory;
    alignas(pool_registry) static unsigned char storage[sizeof(pool_registry)];
    static pool_registry* r = new (storage) pool_registry(factory);
    return *r;
}

reuse_switch& auto_switch() noexcept {
    alignas(reuse_switch) static unsigned char storage[sizeof(reuse_switch)];
    static reuse_switch* s = new (storage) reuse_switch(registry());
    return *s;
}

// The streams the fences cover.  Fed from the first stream creation on, before the log or any pool
// exists: a stream made before the first allocation is still covered.
stream_set& streams() noexcept {
    alignas(stream_set) static unsigned char storage[sizeof(stream_set)];
    static stream_set* s = new (storage) stream_set();
    return *s;
}

std::atomic<bool> g_enabled{false};    // set by pool_configure when GPUMEM_POOL=on
std::atomic<bool> g_exiting{false};
// Set by an atexit handler registered at the first pool: process exit has begun.  Registered after
// the runtime's own (a runtime starts before its first allocation), it runs before the runtime's
// exit handler, whose cuDevicePrimaryCtxRelease may be the context's last (primary_release).
std::atomic<bool> g_exit_begun{false};
std::atomic<int> g_captures{0};
thread_local int t_capture_mode = capture_table::k_global;  // cuThreadExchangeStreamCaptureMode's, per thread

capture_table& captures() noexcept {
    alignas(capture_table) static unsigned char storage[sizeof(capture_table)];
    static capture_table* t = new (storage) capture_table();
    return *t;
}
pool_config* g_pool_cfg = nullptr;     // read once; leaked, like every pool (see pool_at_exit)


uint64_t current_context() noexcept {
    auto get = GPUMEM_REAL(cuCtxGetCurrent);
    CUcontext c = nullptr;
    if (!get || get(&c) != CUDA_SUCCESS) return 0;
    return uint64_t(uintptr_t(c));
}

bool is_ended_primary(uint64_t ctx) noexcept;  // below, with the contexts

// The pool of the current context, made on first use.
pool_registry::slot* current_slot() noexcept {
    static std::atomic<bool> said_full{false};
    const uint64_t ctx = current_context();
    if (!ctx) return nullptr;  // no context: the driver gives the program its own error
    if (pool_registry::slot* s = registry().find(ctx)) return s;
    if (g_exiting.load() || is_ended_primary(ctx)) return nullptr;  // the driver answers for a dead context
    // So for a destroyed green context's own CUcontext, which stays current where the program left
    // it: the driver refuses an allocation there (709 on an H100, run 168), and a pool made for it
    // served one from fresh chunks on virtual memory, and on cuMemAlloc segments called the driver
    // in the dead context and logged its refusal as the pool's (emu_pool_app green-dead-alloc).
    if (green_context_destroyed(reinterpret_cast<CUcontext>(uintptr_t(ctx)))) return nullptr;
    bool full = false;
    pool_registry::slot* s = registry().find_or_create(ctx, &full);
    if (full) GPUMEM_WARN_ONCE(said_full, "more than 64 CUDA contexts; allocations of the others pass through unpooled");
    if (s) apply_peer_grants(s);  // peer access enabled to this context before its first allocation
    static std::atomic<bool> exit_watched{false};
    if (s && !exit_watched.exchange(true)) atexit([] { g_exit_begun.store(true, std::memory_order_release); });
    return s;
}

// Every pool query and operation of the hooks first asks in_gpumem_lock(): a signal handler (one
// that calls exit(), whose exit handlers call CUDA) running on a thread that holds or is taking a
// gpumem lock passes straight to the driver, never waiting for that lock (critical_section.h);
// only a free of a pooled block does not (pool_free_from_inside).
bool in_gpumem_lock() noexcept { return critical_section::active(); }

// Frees of pooled blocks that a signal handler made while its thread was inside gpumem
// (pool_free_from_inside): the pool could not be asked then, its lock perhaps this thread's, and the
// driver, which never allocated them, must not be (docs/pool.md, Lifecycle).  A fixed table with
// no lock and no heap: a handler claims an empty entry with one CAS; the next pool call, on any
// thread, carries the frees out (and logs them); the log's end counts those still here lost.
class deferred_frees {
  public:
    static constexpr int k_entries = 64;
    // False when every entry is taken.
    bool push(uint64_t ptr, api_id api) noexcept {
        for (entry& e : entries_) {
            uint64_t empty = 0;
            if (!e.ptr.compare_exchange_strong(empty, k_claimed, std::memory_order_acquire)) continue;
            e.api.store(int(api), std::memory_order_relaxed);
            waiting_.fetch_add(1, std::memory_order_relaxed);
            e.ptr.store(ptr, std::memory_order_release);
            return true;
        }
        return false;
    }
    bool any() const noexcept { return waiting_.load(std::memory_order_acquire) > 0; }
    // Takes one waiting free out (false: none).
    bool pop(uint64_t* ptr, api_id* api) noexcept {
        for (entry& e : entries_) {
            uint64_t v = e.ptr.load(std::memory_order_acquire);
            if (v == 0 || v == k_claimed) continue;
            const int a = e.api.load(std::memory_order_relaxed);
            if (!e.ptr.compare_exchange_strong(v, 0, std::memory_order_acq_rel)) continue;
            waiting_.fetch_sub(1, std::memory_order_relaxed);
            *ptr = v;
            *api = api_id(a);
            return true;
        }
        return false;
    }
    void clear() noexcept {  // a fork child: the parent's frees, of the parent's pools
        for (entry& e : entries_) e.ptr.store(0, std::memory_order_relaxed);
        waiting_.store(0, std::memory_order_relaxed);
    }

  private:
    static constexpr uint64_t k_claimed = 1;  // an entry being filled (no block starts at 1)
    struct entry {
        std::atomic<uint64_t> ptr{0};
        std::atomic<int> api{0};
    };
    entry entries_[k_entries];
    std::atomic<int> waiting_{0};
};
constinit deferred_frees g_deferred;
// Frees from inside gpumem the pool could not keep: the table was full, or the pool's exit had
// run (nothing carries them out any more), counted lost at once; or the pools' segment tables
// could not tell (more segments than they hold), passed to the driver.  Said at exit.
std::atomic<uint64_t> g_deferred_dropped{0}, g_deferred_unknown{0};

// Carries out the frees waiting in g_deferred; from a pool call, never inside a gpumem lock.
bool free_in_pools(api_id api, uint64_t ptr, int* result) noexcept;  // below, pool_free's search
void carry_out_deferred_frees() noexcept {
    if (!g_deferred.any()) return;
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
        GPUMEM_INFO("a free that a signal handler made while its thread was inside gpumem is carried out at a later "
                    "pool call (docs/pool.md, Lifecycle)");
    uint64_t ptr = 0;
    api_id api = api_id::none;
    while (g_deferred.pop(&ptr, &api)) {
        int r = 0;
        // Its segment went meanwhile (its context ended): nothing is left to free, nor to log.
        if (!free_in_pools(api, ptr, &r)) GPUMEM_WARN("a free from a signal handler of {:#x} found no pool segment when it was carried out", ptr);
    }
}

// The waiting frees out of the table, counted lost: the log ends before a pool call can carry
// them out.  How many.  Async-signal-safe.
uint64_t deferred_frees_lost() noexcept {
    if (!g_deferred.any()) return 0;
    uint64_t n = 0, ptr = 0;
    api_id api = api_id::none;
    while (g_deferred.pop(&ptr, &api)) ++n;
    if (n) sink().count_lost(n);
    return n;
}

pool_registry::slot* lookup_any(uint64_t addr, block_pool::block_info* bi) noexcept {
    if (in_gpumem_lock()) return nullptr;
    return registry().owner_of(addr, bi);
}

// lookup_any for a pointer query: an allocated block counts as the program's allocation only up to
// the bytes it asked for.  The driver knows a cuMemAlloc allocation that far and no further (past
// it, inside what it charged, cuMemGetAddressRange says CUDA_ERROR_NOT_FOUND and
// cuPointerGetAttribute CUDA_ERROR_INVALID_VALUE: an H100), so the block's rounding (up
// to 511 B, or a large block's tail kept whole) answers as free memory inside a segment does,
// never with a range that does not hold the pointer.
pool_registry::slot* lookup_asked(uint64_t addr, block_pool::block_info* bi) noexcept {
    pool_registry::slot* s = lookup_any(addr, bi);
    if (s && bi->allocated && addr - bi->block >= bi->requested) bi->allocated = false;
    return s;
}

}  // namespace

bool capture_active() noexcept { return g_captures.load(std::memory_order_acquire) > 0; }
bool pool_exiting() noexcept { return g_exiting.load(std::memory_order_acquire); }
bool pool_exit_begun() noexcept {
    return g_exit_begun.load(std::memory_order_acquire) || g_exiting.load(std::memory_order_acquire);
}

void pool_configure(const config& cfg, recorder* rec, std::string* config_json) noexcept {
    sink().set(rec);
    if (!cfg.pool) {
        g_enabled.store(false);
        return;
    }
    try {
        if (!g_pool_cfg) {
            g_pool_cfg = new pool_config(pool_config::from_env(setting_env));
            const std::string& w = g_pool_cfg->warnings;  // one warning a line
            for (size_t b = 0, e; b < w.size(); b = e + 1) {
                e = w.find('\n', b);
                if (e == std::string::npos) e = w.size();
                if (e > b) GPUMEM_WARN("{}", std::string_view(w.data() + b, e - b));
            }
        }
        // auto must see every stream creation; with some ways in unwatched (GPUMEM_ROUTES, a
        // debugging knob) a stream could appear unseen, so it runs as safe.
        if (g_pool_cfg->reuse == reuse_mode::automatic &&
            !(route_on(route_a) && route_on(route_b) && route_on(route_c) && route_on(route_d))) {
            g_pool_cfg->reuse = reuse_mode::safe;
            GPUMEM_WARN("GPUMEM_ROUTES leaves ways in unwatched: GPUMEM_REUSE=auto runs as safe");
        }
        // Fences need to see every stream, as auto does; with ways in unwatched only a
        // synchronize covers them all.
        if (!(route_on(route_a) && route_on(route_b) && route_on(route_c) && route_on(route_d))) streams().give_up();
        registry().configure(g_pool_cfg, &sink(), &streams());
        std::string s;
        g_pool_cfg->append_config_json(s);
        if (!s.empty() && s.back() == ',') s.pop_back();
        // The header appends this right after its own members: hence the leading comma.
        if (!s.empty() && config_json) *config_json = "," + s;
        g_enabled.store(true, std::memory_order_release);
    } catch (...) {
        g_enabled.store(false);  // no memory for the settings: pass through, never half a pool
    }
}

void pool_stream_created(api_id api, bool non_blocking) noexcept {
    // Inside a gpumem lock (a signal handler's stream, made while its thread held a pool's lock) the
    // switch is left for the next pool call, as a reentrant one is (lock-free): dropped, the pools
    // kept immediate reuse beside a stream they never learnt of.
    auto_switch().stream_created(api, non_blocking, guard::active() || in_gpumem_lock());
}

void pool_stream_made(CUstream s, bool non_blocking) noexcept {
    // Inside a gpumem lock the set's lock may be this thread's: the set cannot learn of the stream,
    // so fences give way to synchronizes, which cover every stream (as for a route unseen).
    if (in_gpumem_lock()) {
        streams().give_up();
        return;
    }
    const uint64_t ctx = current_context();
    streams().created(ctx, uint64_t(uintptr_t(s)), non_blocking);
    // GPUMEM_FENCE_WAIT=order: blocks handed out before their last owners' work ended must not
    // meet a stream that runs ahead of that work (block_pool::order_new_stream).  After the set
    // knows the stream, so an ordered release from now on covers it too.
    if (non_blocking)
        if (pool_registry::slot* sl = registry().find(ctx)) sl->pool->order_new_stream(uint64_t(uintptr_t(s)));
}

bool pool_stream_destroyed(CUstream s) noexcept {
    // Inside a gpumem lock (exit() from a signal handler whose atexit handler destroys a stream) the
    // stream set's lock may be this thread's, held by a fence: the exit hung.  The set cannot lose
    // the stream then, so fences give way to synchronizes, which cover every stream.
    if (in_gpumem_lock()) {
        streams().give_up();
        return false;
    }
    return streams().destroyed(current_context(), uint64_t(uintptr_t(s)));
}
void pool_stream_destroy_refused() noexcept { streams().give_up(); }

void pool_green_context_made() noexcept {
    streams().give_up();  // lock-free: inside a gpumem lock too
    if (in_gpumem_lock()) return;
    // GPUMEM_FENCE_WAIT=order: a block handed out before its last owner's work ended relies on
    // every stream that can touch it waiting for that work, and a green context's streams (its
    // own default stream included) run beside this context's, unordered: the host waits for the
    // work before the program has the green context or its stream.
    registry().for_each([](pool_registry::slot& s) { s.pool->order_settle(); });
}

void pool_stream_route_unseen() noexcept {
    // Called from a resolver hook (cuGetProcAddress, cudaGetDriverEntryPoint), perhaps during a
    // runtime's own initialisation: no CUDA call and no pool lock here.  Fences give way to
    // synchronizes at once; auto's switch is left to the next pool call (as for a reentrant
    // stream creation), whose drain waits for whatever the unseen streams queued meanwhile.  A
    // pool call already past that point on another thread may still hand out one block at once.
    streams().give_up();
    auto_switch().stream_created(api_id::cuGetProcAddress, true, true);
}

namespace {
void peer_and_primary_after_fork() noexcept;
}

void pool_after_fork() noexcept {
    // A fork from a handler that interrupted a gpumem lock: the child has its own locks anew.
    critical_section::depth = 0;
    g_deferred.clear();
    // The child has one thread and a copy of the parent's pools, whose segments belong to the
    // parent's contexts (CUDA does not survive fork).  Forget them all; the objects are leaked.
    registry().reset_after_fork();
    peer_and_primary_after_fork();
    ipc_after_fork();
    auto_switch().reset_after_fork();
    streams().reset_after_fork();
    g_captures.store(0);
    captures().clear_after_fork();
}

void pool_at_exit() noexcept {
    // The driver may be unloaded by now: no pool calls it again.  Segments are leaked to the OS;
    // late frees from other destructors still find their blocks.
    g_exiting.store(true);
    bool all_taken = true;
    registry().for_each([&](pool_registry::slot& s) {
        // Not taken: an operation of this thread was interrupted by a handler that called exit(),
        // and the counts below would wait for its lock for ever.
        if (!s.pool->release_all_at_exit()) {
            all_taken = false;
            return;
        }
        // What stitching cost, for a user weighing GPUMEM_POOL_STITCH (at GPUMEM_LOG_LEVEL=info).
        uint64_t made = 0, mapped = 0, dissolved = 0, kept = 0, unmapped = 0, ns = 0;
        s.pool->stitch_counts(&made, &mapped, &dissolved, &kept);
        s.pool->stitch_driver(&unmapped, &ns);
        if (made)
            GPUMEM_INFO("device {}: stitching made {} stitched segments ({} on kept ranges), mapped {} chunks a "
                        "second time and unmapped {}: {:.1f} ms in those driver calls",
                        s.device, made, kept, mapped, unmapped, double(ns) / 1e6);
        // What the pool's own chunks cost: near the device's memory its out-of-memory path
        // cycles them through the driver every step (docs/pool.md, "When memory is short").
        const block_pool::driver_tally t = s.pool->chunk_driver();
        if (t.mapped || t.refused || t.foreseen)
            GPUMEM_INFO("device {}: the pool mapped {} chunks ({} moved from its give-backs, {} maps refused "
                        "for memory, {} not tried: too little free) and unmapped {}: {:.1f} ms mapping, {:.1f} ms "
                        "unmapping; {} looks at the driver's free memory: {:.1f} ms",
                        s.device, t.mapped, t.moved, t.refused, t.foreseen, t.unmapped, double(t.map_ns) / 1e6,
                        double(t.unmap_ns) / 1e6, t.looks, double(t.look_ns) / 1e6);
    });
    // Frees a signal handler left waiting: carried out now where every pool's lock could be taken
    // (late frees still find their blocks), else (exit() from the handler, the pool's lock held by
    // this thread) counted lost, their blocks leaked with the rest.
    if (all_taken && !in_gpumem_lock()) carry_out_deferred_frees();
    const uint64_t lost = deferred_frees_lost();
    const uint64_t dropped = g_deferred_dropped.load(), unknown = g_deferred_unknown.load();
    if (lost + dropped)
        GPUMEM_WARN("{} frees that signal handlers made while gpumem's pool was busy were never carried out (the "
                    "process exited before the pool could, or too many waited): their blocks stayed allocated, "
                    "and the log counts the frees lost",
                    lost + dropped);
    if (unknown)
        GPUMEM_WARN("{} frees made inside gpumem (a signal handler's) went to the driver unasked: the pool holds more "
                    "segments than its table for them ({}), and one of them may have been a pooled block",
                    unknown, segment_ranges::k_slots);
}

namespace {
// f(pool) for every live pool of `device` (-1: the current context's device; -2: every device).
template <class F>
void for_each_pool_of(int device, F&& f) noexcept {
    pool_registry& reg = registry();
    if (reg.count() == 0 || g_exiting.load(std::memory_order_acquire) || in_gpumem_lock()) return;
    if (device == -1) {
        auto get = GPUMEM_REAL(cuCtxGetDevice);
        CUdevice d = 0;
        if (!get || get(&d) != CUDA_SUCCESS) return;
        device = int(d);
    }
    reg.for_each([&](pool_registry::slot& s) {
        if (s.ctx.load(std::memory_order_acquire) != 0 && (device == -2 || s.device == device)) f(*s.pool);
    });
}
}  // namespace

bool pool_alloc(api_id api, uint64_t bytes, uint64_t* ptr, int* result) noexcept {
    if (in_gpumem_lock()) return false;
    carry_out_deferred_frees();
    // The log (and pool_configure) starts on the first allocation.  Without a running log the
    // pool stays off, so its events never wait on a ring that nobody drains.
    recorder* rec = recorder_or_null(false);  // a call turned away is counted by the hook's record_alloc
    if (!rec || !g_enabled.load(std::memory_order_acquire)) return false;
    auto_switch().settle_deferred();
    pool_registry::slot* s = current_slot();
    if (!s) return false;
    const uint32_t stack = rec->capture_stack();
    // Another context's pool on this device (a context of the program's own beside the primary
    // one, a green context's) may hold the memory the request needs, freed into it: the driver
    // alone would serve the request from that memory, so those pools give back before the
    // request fails.  The first answer is then quiet; the second, logged, is the program's.  (A
    // request larger than the device is answered at once, logged: no give-back could serve it.)
    bool others = false;
    if (registry().count() > 1) for_each_pool_of(s->device, [&](block_pool& p) { others |= &p != s->pool; });
    int rc = s->pool->allocate(bytes, api, ptr, stack, others);
    if (rc == k_pool_oom_quiet) {
        for_each_pool_of(s->device, [&](block_pool& p) {
            if (&p != s->pool) p.give_back(api);
        });
        rc = s->pool->allocate(bytes, api, ptr, stack);
    }
    // A poisoned pool, a miss after exit began, a device without virtual memory (block_pool.h):
    // the driver serves, as without gpumem.
    if (rc == k_pool_declined) return false;
    *result = rc;
    s->pool->maybe_emit_stats(monotonic_ns());
    return true;
}


uint64_t pool_give_back(api_id api, int device) noexcept {
    uint64_t n = 0;
    for_each_pool_of(device, [&](block_pool& p) { n += p.give_back(api); });
    return n;
}

bool pool_headroom_short() noexcept { return block_pool::any_short(); }

uint64_t pool_make_headroom(api_id api, int device) noexcept {
    uint64_t n = 0;
    for_each_pool_of(device, [&](block_pool& p) { n += p.make_headroom(api); });
    return n;
}

uint64_t pool_giveable(int device) noexcept {
    // Inside a capture nothing can be given back (give_back neither waits nor unmaps there).
    if (capture_active()) return 0;
    uint64_t n = 0;
    for_each_pool_of(device, [&](block_pool& p) { n += p.giveable_bytes(); });
    return n;
}

namespace {
bool free_in_pools(api_id api, uint64_t ptr, int* result) noexcept {
    pool_registry& reg = registry();
    const int n = reg.count();
    // Most frees come from the allocating context; any pool may own the block, though (another
    // thread, another context current).
    // An export names a live block by its start, so it ends here, before the block can be handed
    // out (and exported) again.
    ipc_block_freed(ptr);
    // The others: one busy on another thread whose segments do not hold ptr is passed over
    // without waiting for its lock (block_pool::deallocate, walking): a green context's pool is
    // held through the driver's whole cuGreenCtxDestroy (primary_released_by), and every free of
    // another pool's block or of the driver's own memory waited for it (emu_pool_app
    // green-destroy-query).  The current context's pool is asked as before: the common free
    // costs what it did (a walk's try-lock costs about 1 ns more than a lock).
    pool_registry::slot* first = reg.find(current_context());
    if (first && first->pool->deallocate(ptr, api, result)) return true;
    for (int i = 0; i < n; ++i) {
        if (&reg.at(i) == first) continue;
        if (reg.at(i).pool->deallocate(ptr, api, result, true)) return true;
    }
    return false;
}
}  // namespace

bool pool_free(api_id api, uint64_t ptr, int* result) noexcept {
    if (registry().count() == 0) return false;
    if (in_gpumem_lock()) return pool_free_from_inside(api, ptr, result);
    auto_switch().settle_deferred();
    carry_out_deferred_frees();
    return free_in_pools(api, ptr, result);
}

bool pool_free_from_inside(api_id api, uint64_t ptr, int* result) noexcept {
    // No pool yet: no table to ask (and none is made here, perhaps in a handler).
    if (ptr == 0 || !g_enabled.load(std::memory_order_acquire)) return false;
    const int held = registry().holds(ptr);
    if (held < 0) g_deferred_unknown.fetch_add(1, std::memory_order_relaxed);
    if (held <= 0) return false;
    // Answered as the driver answers a live allocation's free; a double free or an interior
    // pointer gets its free_fail in the log when carried out.  Once the pool's exit has run no
    // pool call carries a free out reliably: counted lost now, as one the table has no room for.
    if (g_exiting.load(std::memory_order_acquire) || !g_deferred.push(ptr, api)) {
        g_deferred_dropped.fetch_add(1, std::memory_order_relaxed);
        sink().count_lost(1);
    }
    *result = 0;
    return true;
}

void pool_frees_left_lost() noexcept { deferred_frees_lost(); }

bool pool_owns(uint64_t ptr) noexcept {
    // Any address inside a segment: exactly the pointers pool_free answers for (a double free or
    // an interior pointer gets free_fail from the pool, never the driver).  Inside a gpumem lock
    // (a signal handler's call) the segments' table answers, as pool_free does there.
    if (ptr != 0 && in_gpumem_lock()) return g_enabled.load(std::memory_order_acquire) && registry().holds(ptr) == 1;
    return ptr != 0 && lookup_any(ptr, nullptr) != nullptr;
}

uint8_t pool_ctx_here(int dev) noexcept {
    // Without a pool no context_reset is ever written, and no "ctx" is needed.  A context with
    // no pool of its own (it never allocated through one) gets 0, the device's first pool's.
    if (registry().count() == 0 || in_gpumem_lock()) return 0;
    const pool_registry::slot* s = registry().find(current_context());
    return s && s->device == dev ? uint8_t(s->pool->ordinal()) : 0;
}

// ---------------------------------------------------------------------------------------------
// Pointer queries.  For an allocated block the program sees the block as its own allocation:
// start = the block, size = the bytes it asked for.  Inside a segment but outside any allocated
// block (or past the bytes the program asked for: lookup_asked) the answer is the driver's for a
// pointer it does not know.  Every other attribute is the same for a block as for its segment and
// is the driver's answer.

CUresult pool_get_address_range(CUdeviceptr* base, size_t* size, CUdeviceptr p, bool* handled) noexcept {
    block_pool::block_info bi{};
    if (!lookup_asked(uint64_t(p), &bi)) {
        *handled = false;
        return CUDA_SUCCESS;
    }
    *handled = true;
    if (!bi.allocated) return CUDA_ERROR_NOT_FOUND;
    if (base) *base = CUdeviceptr(bi.block);
    if (size) *size = size_t(bi.requested);
    return CUDA_SUCCESS;
}

// Every allocated block can be shared through legacy IPC (ipc_share.cc), as cudaMalloc memory can,
// though the driver says no for a chunk of virtual memory.  The driver has written 0 in the
// attribute's whole width (its docs say a boolean, callers read it into ints), so a 1 in the
// first byte reads as 1 at any width.
void say_ipc_capable(void* data) noexcept {
    if (data) *static_cast<unsigned char*>(data) = 1;
}
// A block whose answer gpumem changes: on virtual memory, with chunks the driver can export.
bool ipc_capable(const pool_registry::slot* owner, const block_pool::block_info& bi) noexcept {
    return owner && bi.allocated && bi.vmm && static_cast<const driver_backend*>(owner->backend)->shareable();
}

// The attributes answered from the block: its range, and its mapping, which on virtual memory the
// driver would give as the one 2 MiB chunk under the pointer (a caller registering a buffer by its
// mapping would cover part of it).  The mapping is the block's bytes in the pool (the request
// rounded up), as cudaMalloc memory's mapping holds at least the allocation.  And its context: the
// driver names the context of a cuMemAlloc allocation, but none for cuMemCreate memory (an
// H100), and a caller that makes the buffer's context current (MPI libraries do) would make
// no context current.
bool block_attribute(CUpointer_attribute a) noexcept {
    return a == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR || a == CU_POINTER_ATTRIBUTE_RANGE_SIZE ||
           a == CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR || a == CU_POINTER_ATTRIBUTE_MAPPING_SIZE ||
           a == CU_POINTER_ATTRIBUTE_CONTEXT;
}
// The context the driver names for memory allocated with `ctx` current: ctx itself, or for a green
// context's own CUcontext its device's primary context (an H100: such memory is the primary
// context's, before and after cuGreenCtxDestroy; hooks_driver.cc, g_green_contexts), while that is
// active.
namespace {
CUcontext primary_if_active(CUdevice dev) noexcept;  // below
}  // namespace
CUcontext memory_context(CUcontext ctx) noexcept {
    const int dev = green_context_device(ctx);
    if (dev < 0) return ctx;
    const CUcontext primary = primary_if_active(CUdevice(dev));
    return primary ? primary : ctx;
}
void say_block_attribute(void* data, CUpointer_attribute a, const block_pool::block_info& bi, const pool_registry::slot* owner) noexcept {
    switch (a) {
        case CU_POINTER_ATTRIBUTE_CONTEXT:
            *static_cast<CUcontext*>(data) = memory_context(static_cast<const driver_backend*>(owner->backend)->context());
            break;
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *static_cast<CUdeviceptr*>(data) = CUdeviceptr(bi.block); break;
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *static_cast<size_t*>(data) = size_t(bi.requested); break;
        case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: *static_cast<void**>(data) = reinterpret_cast<void*>(uintptr_t(bi.block)); break;
        case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: *static_cast<size_t*>(data) = size_t(bi.block_size); break;
        default: break;
    }
}

CUresult pool_pointer_attribute(void* data, CUpointer_attribute a, CUdeviceptr p, bool* handled) noexcept {
    *handled = false;
    if (!block_attribute(a)) {
        // Free or pending memory inside a segment is no allocation of the program's.
        block_pool::block_info bi{};
        pool_registry::slot* owner = lookup_asked(uint64_t(p), &bi);
        if (owner && !bi.allocated) {
            *handled = true;
            return CUDA_ERROR_INVALID_VALUE;
        }
        if (a == CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE && ipc_capable(owner, bi)) {
            auto f = real<CUresult (*)(void*, CUpointer_attribute, CUdeviceptr)>(drv::cuPointerGetAttribute);
            *handled = true;
            CUresult r = f ? f(data, a, p) : CUDA_ERROR_NOT_INITIALIZED;
            if (r == CUDA_SUCCESS) say_ipc_capable(data);
            return r;
        }
        return CUDA_SUCCESS;
    }
    block_pool::block_info bi{};
    const pool_registry::slot* owner = lookup_asked(uint64_t(p), &bi);
    if (!owner) return CUDA_SUCCESS;
    *handled = true;
    if (!bi.allocated || !data) return CUDA_ERROR_INVALID_VALUE;
    say_block_attribute(data, a, bi, owner);
    return CUDA_SUCCESS;
}

CUresult pool_pointer_attributes(unsigned n, CUpointer_attribute* a, void** data, CUdeviceptr p, bool* handled) noexcept {
    block_pool::block_info bi{};
    pool_registry::slot* owner = a && data ? lookup_asked(uint64_t(p), &bi) : nullptr;
    if (!owner) {
        *handled = false;
        return CUDA_SUCCESS;
    }
    *handled = true;
    const bool capable = ipc_capable(owner, bi);
    auto f = real<CUresult (*)(unsigned, CUpointer_attribute*, void**, CUdeviceptr)>(drv::cuPointerGetAttributes);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    // Not an allocation of the program's: the driver's answer for a pointer it does not know
    // (cuPointerGetAttributes fills in defaults rather than failing), asked about address 0.
    if (!bi.allocated) return f(n, a, data, 0);
    CUresult r = f(n, a, data, p);
    if (r != CUDA_SUCCESS) return r;
    for (unsigned i = 0; i < n; ++i) {
        if (!data[i]) continue;
        if (block_attribute(a[i])) say_block_attribute(data[i], a[i], bi, owner);
        if (a[i] == CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE && capable) say_ipc_capable(data[i]);
    }
    return r;
}

// cuMemRetainAllocationHandle names the cuMemCreate allocation under an address.  The program
// allocated a pooled block with cudaMalloc/cuMemAlloc, whose memory has no such handle: it gets
// the driver's answer for that memory, never one of the pool's 2 MiB chunks (a caller mapping
// "the allocation" elsewhere would map one chunk of it).
CUresult pool_retain_handle(void* addr, bool* handled) noexcept {
    *handled = pool_owns(uint64_t(uintptr_t(addr)));
    return CUDA_ERROR_INVALID_VALUE;
}

// cuCtxEnablePeerAccess(peer) succeeded on the current context: its device may now use the
// peer context's memory, which for the pool's chunks takes cuMemSetAccess (block_pool::grant_peer).
// Remembered for a pool the peer context makes later, too.  A grant reaches every pool whose
// memory is the peer context's (memory_context): memory allocated with a green context current is
// its primary context's, so a grant to either reaches the primary context's pool, the green
// contexts' own and those of destroyed green contexts that went on in the primary context
// (primary_released_by), whose key names no context.  Before, it reached the pool keyed by the
// peer's handle alone, and device 1 could not touch a pooled block of a green context of device
// 0 after enabling access to device 0's primary context (emu_pool_app green-peer).
// A grant is remembered by the context whose memory it opens (a green context's own CUcontext
// stands for its primary context, so a green context's end leaves it) and forgotten when that
// context ends (context_gone: cuCtxDestroy, a reset, a last release), as its pool forgets the
// devices it granted (block_pool::drop_all): peer access is enabled to a context (cuda.h), and a
// context the driver makes later with the same handle is another, to which nothing was enabled
// (so the emulated driver says; unmeasured on a GPU).  Before, both outlived it, and
// that context's pool granted the device its chunks where the driver alone would not (by the
// green context's handle, a context made with it; emu_pool_app peer-reuse).
namespace {
struct peer_grant {
    uint64_t ctx;
    int device;
};
std::mutex g_peer_mu;
peer_grant g_peer_grants[64];
int g_n_peer_grants = 0;

void forget_peer_grants(uint64_t ctx) noexcept {
    if (!ctx) return;
    // A signal handler on this thread that exits runs the last primary release, which comes here:
    // it must pass, not wait for the lock this frame holds (critical_section.h).
    critical_section in;
    std::lock_guard<std::mutex> lk(g_peer_mu);
    int kept = 0;
    for (int i = 0; i < g_n_peer_grants; ++i)
        if (g_peer_grants[i].ctx != ctx) g_peer_grants[kept++] = g_peer_grants[i];
    g_n_peer_grants = kept;
}
}  // namespace

void pool_peer_enabled(CUcontext peer) noexcept {
    // Inside a gpumem lock (exit() from a signal handler that interrupted a pool's drain, whose
    // atexit handler enables peer access) the peer context's pool's lock may be this thread's: the
    // grant waited for it, and the exit hung.  The driver's enable stands; the pool's chunks stay
    // closed to the device, and the grant is not remembered (docs/pool.md, Peer access).
    if (in_gpumem_lock()) return;
    auto get_device = GPUMEM_REAL(cuCtxGetDevice);
    CUdevice dev = 0;
    if (!peer || !get_device || get_device(&dev) != CUDA_SUCCESS) return;
    // Outside the lock: memory_context may retain and release a primary context.
    const CUcontext memory = memory_context(peer);
    const uint64_t ctx = uint64_t(uintptr_t(memory));
    {
        critical_section in;  // before the lock, released after it (critical_section.h)
        std::lock_guard<std::mutex> lk(g_peer_mu);
        bool known = false;
        for (int i = 0; i < g_n_peer_grants; ++i) known |= g_peer_grants[i].ctx == ctx && g_peer_grants[i].device == int(dev);
        if (!known && g_n_peer_grants < 64) g_peer_grants[g_n_peer_grants++] = {ctx, int(dev)};
        else if (!known) GPUMEM_WARN("more than 64 peer-access pairs: a pool made later for context {} will not grant device {}",
                                     static_cast<const void*>(peer), int(dev));
    }
    registry().for_each([&](pool_registry::slot& s) {
        if (s.ctx.load(std::memory_order_acquire) != 0 &&
            memory_context(static_cast<driver_backend*>(s.backend)->context()) == memory)
            s.pool->grant_peer(int(dev));
    });
}

void apply_peer_grants(pool_registry::slot* s) noexcept {
    peer_grant grants[64];
    int n = 0;
    {
        critical_section in;  // before the lock, released after it (critical_section.h)
        std::lock_guard<std::mutex> lk(g_peer_mu);
        for (int i = 0; i < g_n_peer_grants; ++i) grants[n++] = g_peer_grants[i];
    }
    if (n == 0) return;
    // Outside the lock: memory_context may retain and release a primary context.
    const CUcontext memory = memory_context(static_cast<driver_backend*>(s->backend)->context());
    for (int i = 0; i < n; ++i)
        if (memory_context(CUcontext(uintptr_t(grants[i].ctx))) == memory) s->pool->grant_peer(grants[i].device);
}

// An IPC handle names a whole driver allocation, and the importer's cuIpcOpenMemHandle returns
// that allocation's base.  For a block at offset 0 of a cuMemAlloc segment the base *is* the
// block, so the real handle is right (the importer maps the rest of the segment too, unseen), and
// an importer without gpumem can open it.  Any other pooled block has no handle of its own (a
// virtual-memory block has no legacy handle at all): ipc_share.cc hands out a gpumem handle,
// which an importer under gpumem opens.
CUresult pool_ipc_handle(CUipcMemHandle* h, CUdeviceptr p, bool* handled) noexcept {
    block_pool::block_info bi{};
    // Past the bytes the block's owner asked for, the driver exports nothing (CUDA_ERROR_INVALID_VALUE
    // one byte past a cuMemAlloc allocation, inside its rounding: an H100, run 164), so those bytes
    // answer as free memory inside a segment, a segment's first block's too.
    pool_registry::slot* s = lookup_asked(uint64_t(p), &bi);
    if (!s || (bi.allocated && bi.block == bi.segment && !bi.vmm)) {
        *handled = false;
        return CUDA_SUCCESS;
    }
    *handled = true;
    if (!bi.allocated || !h) return CUDA_ERROR_INVALID_VALUE;  // free memory inside a segment: no allocation
    return ipc_export(h, *s->pool, *static_cast<const driver_backend*>(s->backend), bi);
}

// ---------------------------------------------------------------------------------------------
// Contexts and captures.

namespace {

// gpumem's own retain/release pairs (primary_if_active) and the hooked releases of a device, one at
// a time: a pair of gpumem's beside a program's last release on another thread could make the
// context anew and end it itself, unseen by either (a review's emulated driver with delays: 27-40 of
// 300 rounds kept their chunks, and gpumem made and ended 51-53 contexts of its own).  One lock per
// device: the race is one device's, and nothing under the lock is another device's (the pools,
// streams and IPC tables it touches have locks of their own), while a program that makes its
// contexts on 8 GPUs from 8 threads at once (a first retain takes hundreds of ms) must not wait for
// them one by one (emu_pool_app retain-meet).  Devices past the array share the last lock.
constexpr int k_tracked_devices = 64;
std::mutex g_primary_mu[k_tracked_devices + 1];
std::mutex& primary_mu(CUdevice dev) noexcept {
    return g_primary_mu[dev >= 0 && dev < k_tracked_devices ? int(dev) : k_tracked_devices];
}

bool primary_active(CUdevice dev) noexcept {
    auto get_state = GPUMEM_REAL(cuDevicePrimaryCtxGetState);
    unsigned flags = 0;
    int active = 1;
    return !get_state || get_state(dev, &flags, &active) != CUDA_SUCCESS || active;
}

CUcontext primary_if_active_locked(CUdevice dev) noexcept {
    auto retain = GPUMEM_REAL(cuDevicePrimaryCtxRetain);
    auto release = GPUMEM_REAL(cuDevicePrimaryCtxRelease_v2);
    if (!primary_active(dev) || !retain || !release) return nullptr;
    CUcontext primary = nullptr;
    if (retain(&primary, dev) != CUDA_SUCCESS) return nullptr;
    release(dev);
    return primary;
}

// Primary contexts a last release ended, by device.  Their handle stays current on the thread
// (H200 run 116), and a pool made for it would serve from chunks no context owns where the driver
// would refuse; so none is made while the device's primary context is inactive, and the entry goes
// once it is active again (a retain may give the new one the same handle).
std::atomic<uint64_t> g_ended_primary[k_tracked_devices];

bool is_ended_primary(uint64_t ctx) noexcept {
    for (int d = 0; d < k_tracked_devices; ++d) {
        if (g_ended_primary[d].load(std::memory_order_acquire) != ctx) continue;
        if (!primary_active(CUdevice(d))) return true;
        g_ended_primary[d].store(0, std::memory_order_release);
    }
    return false;
}

// The handle of dev's primary context while it is active, else nullptr (an inactive one has no
// memory to lose, and a retain would make it anew).  Retain+release of an active one changes nothing.
CUcontext primary_if_active(CUdevice dev) noexcept {
    critical_section in;
    std::lock_guard<std::mutex> lk(primary_mu(dev));
    return primary_if_active_locked(dev);
}

// A lock held by a parent's thread at the fork stays held in the child, which has only the forking
// thread: re-made in place, as the other locks are (a child's first primary-context release hung).
// The peer grants name the parent's contexts, which the child does not have.
void peer_and_primary_after_fork() noexcept {
    for (std::mutex& m : g_primary_mu) new (&m) std::mutex();
    new (&g_peer_mu) std::mutex();
    g_n_peer_grants = 0;
}

}  // namespace

bool context_is_primary(CUcontext ctx) noexcept {
    auto push = GPUMEM_REAL(cuCtxPushCurrent_v2);
    auto pop = GPUMEM_REAL(cuCtxPopCurrent_v2);
    auto get_device = GPUMEM_REAL(cuCtxGetDevice);
    if (!ctx || !push || !pop || !get_device || push(ctx) != CUDA_SUCCESS) return false;
    CUdevice dev = 0;
    const CUresult r = get_device(&dev);
    CUcontext popped = nullptr;
    pop(&popped);
    return r == CUDA_SUCCESS && primary_if_active(dev) == ctx;
}

namespace {
// pool_context_gone's work; pool_primary_release calls it inside its own critical section.
void context_gone(CUcontext ctx, int dev, context_end when) noexcept {
    ipc_context_gone(ctx, dev);  // IPC memory opened in it, pool or no pool
    // cuDevicePrimaryCtxReset names a device: its primary context's handle, if active.  The handle
    // stays current on every thread that had it, and until a retain makes the context anew (with
    // the same handle) the driver refuses an allocation there with CUDA_ERROR_CONTEXT_IS_DESTROYED
    // (an H100): no pool is made for it meanwhile, as after a last release, or one on
    // virtual memory would serve from fresh chunks.  Entered before the driver's reset: the entry
    // counts only while the context is inactive (is_ended_primary), so a refused reset leaves none.
    // Entered with no pool yet, too: the stale handle's first allocation would make one
    // (emu_pool_app reset-stale first).
    if (!ctx && dev >= 0) {
        ctx = primary_if_active(CUdevice(dev));
        if (ctx && dev < k_tracked_devices) g_ended_primary[dev].store(uint64_t(uintptr_t(ctx)), std::memory_order_release);
    }
    // Peer access to it ends with it, pool or no pool yet (pool_peer_enabled).
    forget_peer_grants(uint64_t(uintptr_t(ctx)));
    if (!ctx || registry().count() == 0) return;
    // Its streams died with it, without cuStreamDestroy: fences must not record on their handles,
    // which new streams may reuse (the primary context keeps its handle across a reset).
    streams().forget_context(uint64_t(uintptr_t(ctx)));
    if (pool_registry::slot* s = registry().find(uint64_t(uintptr_t(ctx)))) ipc_pool_dropped(s->pool);
    registry().retire(uint64_t(uintptr_t(ctx)), when);
    // Destroyed green contexts' pools that went on in this context (primary_released_by): their
    // memory was this context's and goes with it.
    const uint64_t ended = uint64_t(uintptr_t(ctx));
    registry().for_each([&](pool_registry::slot& s) {
        const uint64_t key = s.ctx.load(std::memory_order_acquire);
        if ((key & k_moved_pool_key) && uint64_t(uintptr_t(static_cast<driver_backend*>(s.backend)->context())) == ended) {
            ipc_pool_dropped(s.pool);
            registry().retire(key, when);
        }
    });
}
}  // namespace

void pool_context_gone(CUcontext ctx, int dev, context_end when) noexcept {
    if (in_gpumem_lock()) return;
    // Frees a signal handler left waiting, first: their blocks' segments may go with the context,
    // and a free carried out after it would find no pool (never logged), or another context's
    // block at the same address.
    carry_out_deferred_frees();
    context_gone(ctx, dev, when);
}

// A primary context's release, by `release` (either ABI).  No call says which release is the last,
// so the handle is read before it, while the context is active, and only the state after it (a
// retain then would make the context anew).  If it ended (*ended), its pool is retired after the
// driver's end: the chunks go back without a synchronize, or, once process exit has begun, not at all.
namespace {
// A call that releases dev's primary context (`release()`), under dev's primary_mu: if it was
// the last release (*ended), the context's pool is retired after the driver's end, and so is
// `also`'s (a green context's own, whose memory was the primary context's), if any.
template <class F>
CUresult primary_released_by(CUdevice dev, F&& release, CUcontext also, bool* ended) noexcept {
    critical_section in;  // before the lock, released after it (critical_section.h)
    std::unique_lock<std::mutex> lk(primary_mu(dev));
    const CUcontext before = primary_if_active_locked(dev);
    // The green context's own pool, which goes on in the primary context: moved before the
    // driver's destruction, and moved back if the driver refuses.  Its slot goes on under a key no
    // context has (bit 63: no user-space handle), so that a context the driver makes with the dead
    // handle gets a pool of its own rather than this one; the key names the slot, never the
    // handle: keyed by the handle, a second green context given the same CUcontext found the key
    // taken, kept the dead handle, and served the next context made with it, whose end then
    // dropped the live blocks of the green context before it (emu_pool_app green-handle-again).
    // Before the destruction: moved after it, a context another thread made with the handle in
    // between found this pool by that handle, was served from it in the primary context, and its
    // end could retire it, live blocks and all (emu_pool_app green-reuse-window).  Meanwhile no
    // pool is made for the handle: it is marked dead from before this call (current_slot).
    // The pool's lock is held from then until the driver's answer, so no other thread's pool work
    // (a give-back when memory ran out, a free's release, a drain) makes the dead green context
    // current and calls the driver in it (emu_pool_app green-destroy-race).  Locks in order:
    // primary_mu, the registry's create lock (rekey, retire), which switch_all_to_safe holds while
    // it takes every pool's, the pool's, the stream set's (forget_context); nothing under a pool's
    // lock takes primary_mu (a pool calls only the real driver, its sink, the stream set and an IPC
    // export's visitor).  Not taken once the pools' exit has run: they call no backend then, and a
    // lock an interrupted thread holds would never come.
    pool_registry::slot* own = also && before && registry().count() != 0 ? registry().find(uint64_t(uintptr_t(also))) : nullptr;
    const uint64_t moved = own ? k_moved_pool_key | uint64_t(own - &registry().at(0)) : 0;
    if (own && !registry().rekey(uint64_t(uintptr_t(also)), moved)) own = nullptr;
    auto* own_backend = own ? static_cast<driver_backend*>(own->backend) : nullptr;
    std::unique_lock<std::mutex> own_held;
    if (own && !g_exiting.load(std::memory_order_acquire)) own_held = own->pool->hold();
    // Its memory is the primary context's (an H100: the driver names that context as its owner
    // and frees a block at a late cuMemFree), so the pool works there from now on; and the
    // primary context's end retires it with its own (context_gone).
    const CUcontext was = own_backend ? own_backend->context() : nullptr;
    if (own_backend) own_backend->set_context(before);
    const CUresult r = release();
    if (r != CUDA_SUCCESS) {
        if (own_backend) own_backend->set_context(was);
        if (own_held) own_held.unlock();  // before the create lock
        if (own) registry().rekey(moved, uint64_t(uintptr_t(also)));
        return r;
    }
    // The green context's streams died with it (cuStreamDestroy of one now fails): fences must not
    // record on their handles, which new streams may reuse.
    if (also) streams().forget_context(uint64_t(uintptr_t(also)));
    if (own_held) own_held.unlock();
    // The green context's own pool lives on in the primary context, moved above.  The dead green
    // context can still be made current (the H100 said 0 to cuCtxSetCurrent of it), but must
    // never be: a program that made it current and then another context current died of a double
    // free inside libcuda, without gpumem (docs/gpu-results.md, runs 167-168), so the pool's own
    // calls must not go there.
    if (!before || primary_active(dev)) return r;
    // The primary context ended too: its end below retires the green context's pool with its own.
    *ended = true;
    if (dev >= 0 && dev < k_tracked_devices) g_ended_primary[dev].store(uint64_t(uintptr_t(before)), std::memory_order_release);
    const context_end how = pool_exit_begun() ? context_end::forget : context_end::past;
    if (also && also != before) context_gone(also, -1, how);
    context_gone(before, -1, how);
    return r;
}
}  // namespace

CUresult pool_primary_release(CUdevice dev, CUresult (*release)(CUdevice), bool* ended) noexcept {
    *ended = false;
    if (in_gpumem_lock()) return release(dev);
    carry_out_deferred_frees();  // before a last release ends their context (pool_context_gone)
    return primary_released_by(dev, [&] { return release(dev); }, nullptr, ended);
}

// A call that retains dev's primary context (`retain()`), under dev's primary_mu: a retain in the
// moment after another thread's last release ended the context (before that release's look at the
// state) would make the context anew, and the release would find it active and keep the old pool,
// whose cuMemAlloc segments the driver freed (emu_pool_app release-race).  Waiting for the release's
// look costs a retain nothing else: a program retains a few times in its life.
namespace {
template <class F>
CUresult primary_retained_by(CUdevice dev, F&& retain) noexcept {
    if (in_gpumem_lock()) return retain();
    critical_section in;  // before the lock, released after it (critical_section.h)
    std::lock_guard<std::mutex> lk(primary_mu(dev));
    return retain();
}
}  // namespace

// A program's retain of a primary context.
CUresult pool_primary_retain(CUresult (*retain)(CUcontext*, CUdevice), CUcontext* c, CUdevice dev) noexcept {
    return primary_retained_by(dev, [&] { return retain(c, dev); });
}

// A green context's creation retains its device's primary context inside the driver (cuda.h),
// making it anew if it has ended: the same moment as a program's retain (emu_pool_app release-race
// green).
CUresult pool_green_create(CUresult (*create)(CUgreenCtx*, CUdevResourceDesc, CUdevice, unsigned int), CUgreenCtx* g,
                           CUdevResourceDesc desc, CUdevice dev, unsigned int flags) noexcept {
    return primary_retained_by(dev, [&] { return create(g, desc, dev, flags); });
}

// A green context's destruction releases the primary context of its device, which cuGreenCtxCreate
// retained (cuda.h): it may be that context's last release, which ends it and frees its memory, as
// cuDevicePrimaryCtxRelease's does.  `green` is the green context's own CUcontext
// (cuCtxFromGreenCtx), nullptr if unknown: where the program allocated with it current, its pool
// gives back what it holds free first, while its context can still be made current (a dead one
// cannot: that memory would stay out of every other allocator's reach).  Its blocks still live
// stay the program's: their memory is the primary context's, which outlives the green context
// unless this was its last release.
CUresult pool_green_destroy(CUdevice dev, CUcontext green, CUresult (*destroy)(CUgreenCtx), CUgreenCtx g,
                            bool* ended) noexcept {
    *ended = false;
    if (in_gpumem_lock()) return destroy(g);
    carry_out_deferred_frees();  // before a last release ends their context (pool_context_gone)
    if (green && registry().count() != 0 && !g_exiting.load(std::memory_order_acquire))
        if (pool_registry::slot* s = registry().find(uint64_t(uintptr_t(green)))) s->pool->give_back(api_id::cuGreenCtxDestroy);
    return primary_released_by(dev, [&] { return destroy(g); }, green, ended);
}

// Called before the driver opens a capture, under the stream set's lock: a fence being recorded
// holds that lock and checks capture_active() inside it, so it either finishes before the capture
// opens or sees it and records, queries and synchronizes nothing (a cuStreamQuery or cuEventRecord
// on a capturing stream would invalidate the program's capture).
void capture_begin() noexcept {
    // First (before the stream set's lock, which a release takes after the pool's): the current
    // context's batch of pending frees, which inside the capture could not be released.
    if (pool_registry::slot* sl = registry().find(current_context())) sl->pool->release_before_capture();
    critical_section in;  // before the lock, released after it: a handler's stream destroy passes it by
    std::unique_lock<std::mutex> held = streams().hold();
    g_captures.fetch_add(1, std::memory_order_acq_rel);
}
// The driver refused to open it: no capture after all, and no drain owed by it.
void capture_begin_failed() noexcept {
    if (g_captures.fetch_sub(1, std::memory_order_acq_rel) <= 0) g_captures.store(0);
}
// The driver opened it: its mode and thread decide which threads' cuMemAlloc/cuMemFree it refuses.
void capture_opened(CUstream s, CUstreamCaptureMode mode) noexcept {
    captures().opened(uint64_t(uintptr_t(s)), current_tid(), int(mode));
}
void capture_thread_mode(CUstreamCaptureMode mode) noexcept { t_capture_mode = int(mode); }

// The table's own count, not g_captures: an end of a capture begun unseen brings that one down
// while a capture the table holds is still open.
// Asked at every cuMemAlloc/cuMemFree: without an open capture it costs one load (the thread's id
// and mode are thread-locals, which a preloaded library reaches through __tls_get_addr: about
// 15 ns a call on the emulated device, measured before this check came first).
bool capture_may_refuse() noexcept {
    capture_table& t = captures();
    return t.any_open() && t.may_refuse(current_tid(), t_capture_mode);
}

void capture_end(CUstream s) noexcept {
    captures().closed(uint64_t(uintptr_t(s)), current_tid());
    if (g_captures.fetch_sub(1, std::memory_order_acq_rel) <= 0) g_captures.store(0);
    // A switch to safe reuse during the capture could not drain (no sync inside a capture); the
    // drain it owes comes now, before the program can launch the graph or anything else.
    if (g_captures.load(std::memory_order_acquire) == 0) {
        registry().for_each([](pool_registry::slot& s) { s.pool->settle_owed_drain(); });
        ipc_capture_ended();
    }
}

}  // namespace gpumem
