// The pool seam of the hook layer: one block_pool per CUDA context serves cuMemAlloc_v2/cuMemFree_v2, answers pointer queries for its blocks, and follows contexts, captures, fork and exit.
//
// With GPUMEM_POOL=off (or before the log has started, or when it could not start) every question
// is answered "not mine, pass through", so the preload behaves exactly as it did without a pool.
// docs/pool.md ("In libgpumem.so") states the behaviour chosen for each call.
#include <unistd.h>

#include <cstring>
#include <new>
#include <string>

#include "config.h"
#include "diag.h"
#include "core/pool/block_pool.h"
#include "core/pool/event_sink.h"
#include "core/pool/pool_config.h"
#include "driver_backend.h"
#include "gpumem_preload.h"

namespace gpumem {

namespace {

// The pool's events go to the recorder, which numbers and publishes them like any other.  The
// recorder changes in a fork child (state.cc makes a new one), hence the atomic pointer.
class recorder_sink final : public event_sink {
  public:
    void emit(event& e) noexcept override {
        if (recorder* r = rec_.load(std::memory_order_acquire)) r->emit(e);
    }
    void set(recorder* r) noexcept { rec_.store(r, std::memory_order_release); }

  private:
    std::atomic<recorder*> rec_{nullptr};
};

// One context's pool.  Slots are never freed, only retired (key set to nullptr when the context is
// destroyed), so a reader that found a slot without the lock can always use it.
struct pool_slot {
    std::atomic<CUcontext> ctx{nullptr};
    int device = -1;
    driver_backend* backend = nullptr;
    block_pool* pool = nullptr;
};

// A handful of contexts is the norm (one primary context per device); a program that creates more
// than this gets plain pass-through for the rest, which is always correct.
constexpr int k_max_pools = 64;
pool_slot g_slots[k_max_pools];
std::atomic<int> g_count{0};           // slots [0, g_count) are filled; published with release
std::atomic_flag g_create_lock = ATOMIC_FLAG_INIT;
std::atomic<bool> g_enabled{false};    // set by pool_configure when GPUMEM_POOL=on
std::atomic<bool> g_exiting{false};
std::atomic<int> g_captures{0};
// GPUMEM_REUSE=auto: the api_id of the call that switched the pools to safe reuse, stored once
// the switch is complete (0 before); the blocking streams made so far; and a switch that came while
// gpumem's own code was on the stack, left for the next pool call to make.
std::atomic<int> g_stream_api{0};
std::atomic<int> g_blocking_streams{0};
std::atomic<int> g_pending_switch{0};
pool_config* g_pool_cfg = nullptr;     // read once; leaked, like every pool (see pool_at_exit)

// Static storage that is never destroyed: a free from another library's destructor, after ours,
// must still find a live sink and not a destroyed object's vtable.
recorder_sink& sink() noexcept {
    alignas(recorder_sink) static unsigned char storage[sizeof(recorder_sink)];
    static recorder_sink* s = new (storage) recorder_sink();
    return *s;
}

void say_once(std::atomic<bool>& said, const char* msg) noexcept {
    if (!said.exchange(true)) GPUMEM_WARN("{}", msg);
}

CUcontext current_context() noexcept {
    static std::atomic<void*> fn{nullptr};
    void* f = fn.load(std::memory_order_acquire);
    if (!f) {
        f = real_driver_by_name("cuCtxGetCurrent");
        if (!f) return nullptr;
        fn.store(f, std::memory_order_release);
    }
    CUcontext c = nullptr;
    if (reinterpret_cast<CUresult (*)(CUcontext*)>(f)(&c) != CUDA_SUCCESS) return nullptr;
    return c;
}

pool_slot* find_slot(CUcontext ctx) noexcept {
    const int n = g_count.load(std::memory_order_acquire);
    for (int i = 0; i < n; ++i)
        if (g_slots[i].ctx.load(std::memory_order_acquire) == ctx) return &g_slots[i];
    return nullptr;
}

struct create_lock {
    create_lock() noexcept {
        while (g_create_lock.test_and_set(std::memory_order_acquire)) usleep(10);
    }
    ~create_lock() { g_create_lock.clear(std::memory_order_release); }
};

// The pool of `ctx`, made on first use.  Runs inside the program's allocation call with ctx
// current, so cuCtxGetDevice answers for it.
pool_slot* create_slot(CUcontext ctx) noexcept {
    static std::atomic<bool> said_full{false};
    create_lock lk;
    if (pool_slot* s = find_slot(ctx)) return s;
    const int dev = current_device();
    const int n = g_count.load(std::memory_order_relaxed);
    // The driver reuses a destroyed context's handle value; a retired slot of the same device is
    // empty (drop_all) and reusable, which keeps programs that cycle contexts within the table.
    for (int i = 0; i < n; ++i) {
        pool_slot& s = g_slots[i];
        if (s.ctx.load(std::memory_order_relaxed) == nullptr && s.device == dev) {
            s.backend->set_context(ctx);
            s.ctx.store(ctx, std::memory_order_release);
            return &s;
        }
    }
    if (n >= k_max_pools) {
        say_once(said_full, "more than 64 CUDA contexts; allocations of the others pass through unpooled");
        return nullptr;
    }
    auto* b = new (std::nothrow) driver_backend(ctx, dev);
    auto* p = b ? new (std::nothrow) block_pool(*g_pool_cfg, *b, &sink(), dev) : nullptr;
    if (!p) {
        delete b;
        return nullptr;
    }
    // A stream already exists: this pool starts in safe reuse (its reuse_safe event comes before
    // its first segment, so a reader of the log knows the mode of every free).
    if (int api = g_stream_api.load(std::memory_order_acquire)) p->enter_safe_reuse(api_id(api));
    pool_slot& s = g_slots[n];
    s.device = dev;
    s.backend = b;
    s.pool = p;
    s.ctx.store(ctx, std::memory_order_release);
    g_count.store(n + 1, std::memory_order_release);
    return &s;
}

// The pool holding addr, and its block, if any pool does.
pool_slot* lookup_any(uint64_t addr, block_pool::block_info* bi) noexcept {
    const int n = g_count.load(std::memory_order_acquire);
    for (int i = 0; i < n; ++i)
        if (g_slots[i].pool->lookup(addr, bi)) return &g_slots[i];
    return nullptr;
}

}  // namespace

bool capture_active() noexcept { return g_captures.load(std::memory_order_acquire) > 0; }

void pool_configure(const config& cfg, recorder* rec, std::string* config_json) noexcept {
    sink().set(rec);
    if (!cfg.pool) {
        g_enabled.store(false);
        return;
    }
    try {
        if (!g_pool_cfg) {
            g_pool_cfg = new pool_config(pool_config::from_env());
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

// Switches every pool to safe reuse, once.  Every caller returns only after the switch is complete,
// drains included: a thread whose stream creation lost the race must not get its stream before
// the winner has drained (the new stream would not wait for work queued before it).  Under the
// create lock, so a pool being made right now either sees g_stream_api or is in the table walked.
static void switch_to_safe(api_id api) noexcept {
    if (g_stream_api.load(std::memory_order_acquire)) return;
    create_lock lk;
    if (g_stream_api.load(std::memory_order_relaxed)) return;
    const int n = g_count.load(std::memory_order_acquire);
    for (int i = 0; i < n; ++i) g_slots[i].pool->enter_safe_reuse(api);  // a retired slot's pool is empty: no sync
    g_stream_api.store(int(api), std::memory_order_release);
}

// A switch that arrived under the guard is made here, at the top of a pool call.
static void settle_pending_switch() noexcept {
    if (g_pending_switch.load(std::memory_order_relaxed) == 0) return;
    if (int api = g_pending_switch.exchange(0, std::memory_order_acq_rel)) switch_to_safe(api_id(api));
}

void pool_stream_created(api_id api, bool non_blocking) noexcept {
    // One blocking stream keeps a single issue order: it waits for earlier legacy-stream work, and
    // legacy-stream work waits for it.  (cuBLASLt makes one such stream on its first matmul.)  Two
    // blocking streams run concurrently with each other, and a non-blocking one with the legacy
    // stream.  Counted for ever, not while alive: a destroyed stream's queued work still runs.
    if (!non_blocking && g_blocking_streams.fetch_add(1, std::memory_order_acq_rel) == 0) return;
    if (guard::active()) {
        // gpumem's own code is on the stack (a chained interposer made the stream from inside one of
        // our calls): taking a pool lock here could deadlock.  The next pool call makes the switch.
        g_pending_switch.store(int(api), std::memory_order_release);
        return;
    }
    switch_to_safe(api);
}

void pool_after_fork() noexcept {
    // The child has one thread and a copy of the parent's pools, whose segments belong to the
    // parent's contexts (CUDA does not survive fork).  Forget them all; the objects are leaked.
    g_count.store(0);
    g_captures.store(0);
    g_stream_api.store(0);  // the parent's streams do not exist in the child
    g_blocking_streams.store(0);
    g_pending_switch.store(0);
    g_create_lock.clear();
}

void pool_at_exit() noexcept {
    // The driver may be unloaded by now: no pool calls it again.  Segments are leaked to the OS;
    // late frees from other destructors still find their blocks.
    g_exiting.store(true);
    const int n = g_count.load(std::memory_order_acquire);
    for (int i = 0; i < n; ++i) g_slots[i].pool->release_all_at_exit();
}

bool pool_alloc(api_id api, uint64_t bytes, uint64_t* ptr, int* result) noexcept {
    // The log (and pool_configure) starts on the first allocation.  Without a running log the
    // pool stays off, so its events never wait on a ring that nobody drains.
    if (!recorder_or_null() || !g_enabled.load(std::memory_order_acquire)) return false;
    settle_pending_switch();
    CUcontext ctx = current_context();
    if (!ctx) return false;  // no context: the driver gives the program its own error
    pool_slot* s = find_slot(ctx);
    if (!s) {
        if (g_exiting.load()) return false;
        s = create_slot(ctx);
        if (!s) return false;
    }
    *result = s->pool->allocate(bytes, api, ptr);
    s->pool->maybe_emit_stats(monotonic_ns());
    return true;
}

bool pool_free(api_id api, uint64_t ptr, int* result) noexcept {
    const int n = g_count.load(std::memory_order_acquire);
    if (n == 0) return false;
    settle_pending_switch();
    // Most frees come from the allocating context; any pool may own the block, though (another
    // thread, another context current).
    CUcontext ctx = current_context();
    pool_slot* first = ctx ? find_slot(ctx) : nullptr;
    if (first && first->pool->deallocate(ptr, api, result)) return true;
    for (int i = 0; i < n; ++i) {
        if (&g_slots[i] == first) continue;
        if (g_slots[i].pool->deallocate(ptr, api, result)) return true;
    }
    return false;
}

bool pool_owns(uint64_t ptr) noexcept {
    // Any address inside a segment: exactly the pointers pool_free answers for (a double free or
    // an interior pointer gets free_fail from the pool, never the driver).
    return ptr != 0 && lookup_any(ptr, nullptr) != nullptr;
}

// ---------------------------------------------------------------------------------------------
// Pointer queries.  For an allocated block the program sees the block as its own allocation:
// start = the block, size = the bytes it asked for.  Inside a segment but outside any allocated
// block the answer is the driver's for a pointer it does not know.  Every other attribute is the
// same for a block as for its segment and is the driver's answer.

CUresult pool_get_address_range(CUdeviceptr* base, size_t* size, CUdeviceptr p, bool* handled) noexcept {
    block_pool::block_info bi{};
    if (!lookup_any(uint64_t(p), &bi)) {
        *handled = false;
        return CUDA_SUCCESS;
    }
    *handled = true;
    if (!bi.allocated) return CUDA_ERROR_NOT_FOUND;
    if (base) *base = CUdeviceptr(bi.block);
    if (size) *size = size_t(bi.requested);
    return CUDA_SUCCESS;
}

CUresult pool_pointer_attribute(void* data, CUpointer_attribute a, CUdeviceptr p, bool* handled) noexcept {
    *handled = false;
    if (a != CU_POINTER_ATTRIBUTE_RANGE_START_ADDR && a != CU_POINTER_ATTRIBUTE_RANGE_SIZE) {
        // Free or pending memory inside a segment is no allocation of the program's.
        block_pool::block_info bi{};
        if (lookup_any(uint64_t(p), &bi) && !bi.allocated) {
            *handled = true;
            return CUDA_ERROR_INVALID_VALUE;
        }
        return CUDA_SUCCESS;
    }
    block_pool::block_info bi{};
    if (!lookup_any(uint64_t(p), &bi)) return CUDA_SUCCESS;
    *handled = true;
    if (!bi.allocated || !data) return CUDA_ERROR_INVALID_VALUE;
    if (a == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) *static_cast<CUdeviceptr*>(data) = CUdeviceptr(bi.block);
    else *static_cast<size_t*>(data) = size_t(bi.requested);
    return CUDA_SUCCESS;
}

CUresult pool_pointer_attributes(unsigned n, CUpointer_attribute* a, void** data, CUdeviceptr p, bool* handled) noexcept {
    block_pool::block_info bi{};
    if (!a || !data || !lookup_any(uint64_t(p), &bi)) {
        *handled = false;
        return CUDA_SUCCESS;
    }
    *handled = true;
    auto f = real<CUresult (*)(unsigned, CUpointer_attribute*, void**, CUdeviceptr)>(drv::cuPointerGetAttributes);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    // Not an allocation of the program's: the driver's answer for a pointer it does not know
    // (cuPointerGetAttributes fills in defaults rather than failing), asked about address 0.
    if (!bi.allocated) return f(n, a, data, 0);
    CUresult r = f(n, a, data, p);
    if (r != CUDA_SUCCESS) return r;
    for (unsigned i = 0; i < n; ++i) {
        if (!data[i]) continue;
        if (a[i] == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) *static_cast<CUdeviceptr*>(data[i]) = CUdeviceptr(bi.block);
        if (a[i] == CU_POINTER_ATTRIBUTE_RANGE_SIZE) *static_cast<size_t*>(data[i]) = size_t(bi.requested);
    }
    return r;
}

// An IPC handle names a whole driver allocation, and the importer's cuIpcOpenMemHandle returns
// that allocation's base.  For a block at offset 0 of its segment the base *is* the block, so the
// real handle is right (the importer maps the rest of the segment too, unseen).  For any other
// block the importer would get the segment's base, a silently wrong pointer, while this process's
// cuMemGetAddressRange says the block starts elsewhere: refuse instead, loudly.
CUresult pool_ipc_handle(CUipcMemHandle* h, CUdeviceptr p, bool* handled) noexcept {
    static std::atomic<bool> said{false};
    block_pool::block_info bi{};
    if (!lookup_any(uint64_t(p), &bi) || (bi.allocated && bi.block == bi.segment)) {
        *handled = false;
        return CUDA_SUCCESS;
    }
    *handled = true;
    if (bi.allocated)
        say_once(said, "cuIpcGetMemHandle on a pooled block that shares its segment returns "
                       "CUDA_ERROR_INVALID_VALUE; run with GPUMEM_POOL=off to share memory between processes");
    return CUDA_ERROR_INVALID_VALUE;
}

// ---------------------------------------------------------------------------------------------
// Contexts and captures.

void pool_context_gone(CUcontext ctx, int dev) noexcept {
    if (g_count.load(std::memory_order_acquire) == 0) return;
    if (!ctx && dev >= 0) {
        // cuDevicePrimaryCtxReset names a device: find its primary context's handle, if the
        // primary context is active (an inactive one has no pool memory to lose).
        using state_fn = CUresult (*)(CUdevice, unsigned*, int*);
        using retain_fn = CUresult (*)(CUcontext*, CUdevice);
        using release_fn = CUresult (*)(CUdevice);
        auto get_state = reinterpret_cast<state_fn>(real_driver_by_name("cuDevicePrimaryCtxGetState"));
        auto retain = reinterpret_cast<retain_fn>(real_driver_by_name("cuDevicePrimaryCtxRetain"));
        auto release = reinterpret_cast<release_fn>(real_driver_by_name("cuDevicePrimaryCtxRelease_v2"));
        unsigned flags = 0;
        int active = 1;
        if (get_state && get_state(CUdevice(dev), &flags, &active) == CUDA_SUCCESS && !active) return;
        if (!retain || !release) return;
        CUcontext primary = nullptr;
        if (retain(&primary, CUdevice(dev)) != CUDA_SUCCESS) return;
        release(CUdevice(dev));  // retain+release of an active context changes nothing
        ctx = primary;
    }
    if (!ctx) return;
    create_lock lk;  // no pool is made for this handle while it is being retired
    if (pool_slot* s = find_slot(ctx)) {
        // Retire first, so no new allocation finds the pool; then forget its memory, which the
        // driver frees with the context.
        s->ctx.store(nullptr, std::memory_order_release);
        s->pool->drop_all();
    }
}

void capture_begin() noexcept { g_captures.fetch_add(1, std::memory_order_acq_rel); }
void capture_end() noexcept {
    if (g_captures.fetch_sub(1, std::memory_order_acq_rel) <= 0) g_captures.store(0);
    // A switch to safe reuse during the capture could not drain (no sync inside a capture); the
    // drain it owes comes now, before the program can launch the graph or anything else.
    if (g_captures.load(std::memory_order_acquire) == 0) {
        const int n = g_count.load(std::memory_order_acquire);
        for (int i = 0; i < n; ++i) g_slots[i].pool->settle_owed_drain();
    }
}

}  // namespace gpumem
