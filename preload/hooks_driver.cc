// The driver wrappers: cuMemAlloc*, cuMemFree*, async, VMM and pinned-host calls, recorded once each.
//
// Each wrapper exists twice: a hidden `w_` function that resolvers hand out (ways b, c, d), and the
// exported symbol of the real name (way a), which defers to it when way a is on.
#include <dlfcn.h>

#include "gpumem_preload.h"
#include "diag.h"
#include "driver_backend.h"
#include "handle_table.h"
#include "mempool_kinds.h"
#include "core/pool/context_end.h"
#include "core/pool/critical_section.h"

namespace gpumem {

extern "C" CUresult w_cuGetProcAddress(const char*, void**, int, cuuint64_t);
extern "C" CUresult w_cuGetProcAddress_v2(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

thread_local int guard::depth = 0;
thread_local runtime_scope* runtime_scope::top = nullptr;

call_info make_call(api_id api, int dev) noexcept {
    call_info c;
    c.api = api;
    c.kind = k_api_kinds[size_t(api)];
    c.dev = dev;
    return c;
}

// After a call of c's that ran out of memory (CUDA_ERROR_OUT_OF_MEMORY and cudaErrorMemoryAllocation
// are both 2): the driver's free and total memory, for its alloc_fail, so that the OOM report can
// tell "the GPU is full" (another process, or memory this log does not see) from fragmentation, as
// it can for the pool's own OOMs.  Only where the current context is on the call's device, and
// not while a stream capture gpumem saw is open (a capture is no place for an extra driver call).
static void note_driver_memory(call_info& c, int err) noexcept {
    if (err != 2 || c.dev < 0 || c.kind == mem_kind::host || capture_active()) return;
    auto get_info = GPUMEM_REAL(cuMemGetInfo_v2);
    if (!get_info || current_device() != c.dev) return;
    size_t free_b = 0, total_b = 0;
    if (get_info(&free_b, &total_b) != CUDA_SUCCESS || total_b == 0) return;
    c.gpu_free = free_b;
    c.gpu_total = total_b;
}

static void logged_alloc(recorder* rec, bool with_stack, api_id api, mem_kind kind, int err, uint64_t ptr, uint64_t size,
                         uint64_t asize, bool has_stream, uint64_t stream, uint64_t mempool, int dev) noexcept {
    if (!rec) return;
    call_info c = make_call(api, kind == mem_kind::host ? -1 : dev >= 0 ? dev : current_device());
    c.kind = kind;
    c.has_stream = has_stream;
    c.stream = stream;
    c.mempool = mempool;
    // The context that made it, which frees it when it ends: the current one, whose pool's number
    // the line carries.  A stream-ordered allocation (a stream named) belongs to no context, and
    // host memory is on no device.
    if (err == 0 && !has_stream && c.dev >= 0) c.ctx = pool_ctx_here(c.dev);
    note_driver_memory(c, err);
    rec->alloc(c, err, ptr, size, asize, with_stack);
}

void record_alloc(api_id api, mem_kind kind, int err, uint64_t ptr, uint64_t size, uint64_t asize,
                  bool has_stream, uint64_t stream, uint64_t mempool, int dev) noexcept {
    logged_alloc(recorder_or_null(), true, api, kind, err, ptr, size, asize, has_stream, stream, mempool, dev);
}

// Calls made while this thread is already inside a hook.  gpumem's own driver calls never come
// here: they call libcuda's definitions (real_driver: dlsym on libcuda's handle), not the exports
// nor the pointers the resolvers hand out, so a hook is reached inside a hook only by other code
// that runs on this thread meanwhile: a signal handler that interrupted the hook, or a callback a
// driver runs inside a call (the emulated driver's; a CUPTI subscriber's).  Those calls are the
// program's.  The pool cannot serve or learn of them there (its lock may be this thread's), so they
// go to the driver as before, and each is logged as outside a hook, with atomics alone: a log slot
// is claimed and published with no lock and no heap (a full ring is waited for, 2 s at most, as in
// any hook), an allocation gets no stack (walking and interning one is not async-signal-safe), and
// the log is never started nor waited for there (recorder_if_recording: before or during its
// start the call is counted lost).  The device and, after an OUT_OF_MEMORY, the driver's free
// memory are asked of the driver as outside a hook: on the thread that just made its own call.
static recorder* hook_recorder(bool inside) noexcept { return inside ? recorder_if_recording() : recorder_or_null(); }
static void record_alloc_inside(api_id api, mem_kind kind, int err, uint64_t ptr, uint64_t size, uint64_t asize,
                                bool has_stream, uint64_t stream, uint64_t mempool, int dev = k_current_device) noexcept {
    logged_alloc(recorder_if_recording(), false, api, kind, err, ptr, size, asize, has_stream, stream, mempool, dev);
}

namespace {

// The api name to record for a driver allocation of `bytes`: the runtime call above us, if any.
api_id alloc_api(api_id driver_api, uint64_t bytes) noexcept {
    if (runtime_scope* s = runtime_scope::for_alloc(bytes)) {
        s->recorded = true;
        return s->api;
    }
    return driver_api;
}

}  // namespace

// A free of a block the pool handed out ends in the pool, whichever free call the program used:
// the driver never saw the block.  Recorded under the runtime's name when cudaFree or
// cudaFreeAsync is the caller.  A stream-ordered free (cuMemFreeAsync) is safe as a pool free:
// the block is reused only once the work enqueued before the free, on any stream, is done.  (Not
// during a capture of its stream: GPUMEM_FREE_ASYNC below.)
static bool pooled_free(api_id api, CUdeviceptr p, CUresult* r) noexcept {
    if (runtime_scope* s = runtime_scope::top; s && s->is_free && s->ptr == uint64_t(p)) api = s->api;
    int pr = 0;
    if (!pool_free(api, uint64_t(p), &pr)) return false;
    if (runtime_scope* s = runtime_scope::for_free(uint64_t(p))) s->recorded = true;
    *r = CUresult(pr);
    return true;
}

// Runs a driver free on rec's log with the free ordered before the real call (see recorder.h).
template <class F>
static CUresult logged_free(recorder* rec, api_id api, mem_kind kind, uint64_t ptr, bool has_stream, uint64_t stream,
                            F&& real_call) noexcept {
    if (!rec || ptr == 0) return real_call();
    call_info c = make_call(api, -1);  // the device comes from the allocation's record
    c.kind = kind;
    c.has_stream = has_stream;
    c.stream = stream;
    recorder::free_ticket t = rec->free_begin(c, ptr);
    CUresult r = real_call();
    rec->free_end(t, int(r));
    return r;
}

// A free outside any hook: the runtime wrapper above it records it where there is one.
template <class F>
CUresult recorded_free(api_id api, mem_kind kind, uint64_t ptr, bool has_stream, uint64_t stream, F&& real_call) noexcept {
    runtime_scope* s = runtime_scope::for_free(ptr);
    if (s) {
        // The runtime wrapper above us owns the record of this free.
        s->recorded = true;
        return real_call();
    }
    return logged_free(recorder_or_null(), api, kind, ptr, has_stream, stream, real_call);
}

// A free made while this thread is already inside a hook (record_alloc_inside says whose).  A block
// in a pool's segment waits for the next pool call (pool_free_from_inside); anything else is the
// driver's, and logged as any free (before, it went unrecorded and uncounted: the log kept the
// block live).  The runtime's scope is not asked: the one on top may be the interrupted code's.
template <class F>
static CUresult free_from_inside(api_id api, mem_kind kind, uint64_t p, bool has_stream, uint64_t stream,
                                 F&& real_call) noexcept {
    int pr = 0;
    if (kind == mem_kind::device && pool_free_from_inside(api, p, &pr)) return CUresult(pr);
    return logged_free(recorder_if_recording(), api, kind, p, has_stream, stream, real_call);
}

// A pooled block's free answered by the driver during a capture, logged with the driver's answer (a
// refusal is a free_fail, which leaves the block live in the log, as it is in the pool).  Under
// cudaFree/cudaFreeAsync the runtime wrapper logs it, with the runtime's code: it leaves pooled
// blocks to the pool, so it is told here.
template <class F>
static CUresult captured_free(api_id api, CUdeviceptr p, bool has_stream, CUstream s, F&& real_call) noexcept {
    if (runtime_scope* rs = runtime_scope::for_free(uint64_t(p))) {
        rs->passed = true;
        return real_call();
    }
    return recorded_free(api, mem_kind::device, uint64_t(p), has_stream, uint64_t(s), real_call);
}

// Whether the driver refuses an unsafe call of this thread now, and with what code.  Asked by a
// real cuMemFree(0): inside a capture that forbids the thread such calls the driver refuses it
// with 900 and invalidates the capture, exactly as the program's free would have; elsewhere it is
// a no-op that succeeds (H200, run 94, tests/gpu/capture_mode_check.py "bogus_free"; cuMemAlloc
// and cuMemFree got the same answers in all 36 cases of run 93).  No memory, nothing to undo.
// Any other answer says nothing, and the pool frees the block, as before.
static bool driver_refuses_unsafe_call(CUresult* code) noexcept {
    auto free = real<CUresult (*)(CUdeviceptr)>(drv::cuMemFree_v2);
    if (!free) return false;
    const CUresult r = free(0);
    if (r < CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED || r > CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD) return false;
    *code = r;
    return true;
}

// An allocation the pool does not serve that ran out of memory is made once more after the pools
// of its device gave back what they hold free.  Without gpumem the program's frees would have
// returned that memory to the driver, so another of its allocators (NCCL's cuMemCreate buffers,
// cudaMallocAsync's pool, managed memory) could fail under gpumem where it runs without.  So can a
// module load, or a launch that needs more local memory.  A call that fails with OUT_OF_MEMORY did
// nothing, so making it again is what a retrying program would do.  Not so a function's lazy load:
// after one failed for want of memory, the driver never loads that function again in the context
// (H200 run 105: the retried launch fails with CUDA_ERROR_UNKNOWN, "not loaded", and cuFuncLoad
// does not load it), so first uses are covered beforehand (before_first_use, below).
// r: the call's first answer.
template <class F>
static CUresult retry_if_oom(api_id api, int device, CUresult r, F&& call) noexcept {
    if (r == CUDA_ERROR_OUT_OF_MEMORY && pool_give_back(api, device) != 0) r = call();
    return r;
}
template <class F>
static CUresult retry_after_give_back(api_id api, int device, F&& call) noexcept {
    return retry_if_oom(api, device, call(), call);
}
// The same for a call made before gpumem's guard (launches, module loads: hot paths that only
// compare their answer); r is its answer.
template <class F>
static CUresult retry_unguarded_if_oom(api_id api, CUresult r, F&& call) noexcept {
    if (r != CUDA_ERROR_OUT_OF_MEMORY || guard::active()) return r;
    guard g;
    return retry_if_oom(api, -1, r, call);
}

// Headroom for lazy loads (docs/pool.md, "Headroom for the driver").  While some pool left the
// driver less free memory than its headroom, the first use of each function, kernel, module,
// library or graph handle on a device (a launch, an attribute, an occupancy query, a getter: where
// the driver loads it) first lets that device's pools make room.  Handles are kept in a fixed
// table, touched only while a pool is short, so the hot path is one load; a full table stops the
// cover (never an error).  A slot is claimed as "in progress" (bit 1 clear) until the room is
// made: another thread's first use of the same handle meanwhile makes room too (it queues on the
// pool's lock, and finds the room there), rather than launch before it.
constexpr size_t k_first_use_slots = 1u << 16;
static std::atomic<uintptr_t> g_first_use[k_first_use_slots];
// Bumped at each clear and mixed into every key: a claim made before a clear never matches one
// made after it, even of the same handle in the same slot.
static std::atomic<uintptr_t> g_first_use_gen{0};
// *claim: the value the returned slot holds while room is made (the key with bit 1 clear).
static std::atomic<uintptr_t>* first_use_claim(const void* handle, int device, bool* done, uintptr_t* claim) noexcept {
    constexpr size_t k_probes = 64;
    CUdevice dev = device;
    if (device < 0)
        if (auto get = GPUMEM_REAL(cuCtxGetDevice)) get(&dev);
    // A CUkernel is one handle for every context: the device is part of the key.
    const uintptr_t gen = g_first_use_gen.load(std::memory_order_acquire);
    const uintptr_t key = (reinterpret_cast<uintptr_t>(handle) ^ (uintptr_t(dev) * 0x9E3779B97F4A7C15ull) ^
                           (gen * 0xC2B2AE3D27D4EB4Full)) |
                          3;
    const uintptr_t claimed = key & ~uintptr_t(2);
    size_t i = size_t((key * 0x9E3779B97F4A7C15ull) >> 48);
    for (size_t n = 0; n < k_probes; ++n, i = (i + 1) & (k_first_use_slots - 1)) {
        uintptr_t v = g_first_use[i].load(std::memory_order_acquire);
        if (v == 0 && g_first_use[i].compare_exchange_strong(v, claimed, std::memory_order_acq_rel)) {
            *done = false;
            *claim = claimed;
            return &g_first_use[i];
        }
        if (v == key) break;  // room was made at its first use
        if (v == claimed) {   // another thread makes room now: so does this one
            *done = false;
            return nullptr;
        }
    }
    *done = true;
    return nullptr;
}
// A context went (cuCtxDestroy, cuDevicePrimaryCtxReset): its functions must be loaded again in
// the next, and a new handle may have an old one's value, so every first use counts again.  A
// claim made before the clear is marked done only if its slot still holds it (before_first_use),
// and the generation in the key keeps a later claim of the same handle from looking the same.
static void first_use_forget() noexcept {
    g_first_use_gen.fetch_add(1, std::memory_order_acq_rel);
    for (auto& slot : g_first_use) slot.store(0, std::memory_order_relaxed);
}
// A handle, or a module or library and the name of one of its functions or globals (the getters
// load the one they name: each name is its own first use); and the device it is used on, -1 for
// the current context's (a CUkernel's attribute calls name their device: the load happens there).
struct use_key {
    use_key(const void* h, const char* n = nullptr, int dev = -1) noexcept : handle(h), name(n), device(dev) {}
    const void* handle;
    const char* name;
    int device;
};
static inline void before_first_use(api_id api, use_key k) noexcept {
    if (!pool_headroom_short() || !k.handle || guard::active()) return;
    const void* handle = k.handle;
    if (k.name) {  // FNV-1a of the name, mixed into the container's handle
        uint64_t h = 1469598103934665603ull;
        for (const char* c = k.name; *c; ++c) h = (h ^ uint8_t(*c)) * 1099511628211ull;
        handle = reinterpret_cast<const void*>((reinterpret_cast<uintptr_t>(handle) ^ h) | 4);
    }
    bool done = true;
    uintptr_t claim = 0;
    std::atomic<uintptr_t>* slot = first_use_claim(handle, k.device, &done, &claim);
    if (done) return;
    {
        guard g;
        pool_make_headroom(api, k.device);
    }
    // Done, unless the table was cleared meanwhile (first_use_forget) and another claim took the
    // slot: that one's first use is still making room, and marks its own.
    if (slot) slot->compare_exchange_strong(claim, claim | 2, std::memory_order_release, std::memory_order_relaxed);
}

// ---------------------------------------------------------------------------------------------
// Synchronous device allocations: the pool may serve these.

extern "C" GPUMEM_HIDDEN CUresult w_cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
    auto f = real<CUresult (*)(CUdeviceptr*, size_t)>(drv::cuMemAlloc_v2);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    if (!dptr) return f(dptr, bytes);
    if (guard::active()) {
        const CUresult r = f(dptr, bytes);
        record_alloc_inside(api_id::cuMemAlloc_v2, mem_kind::device, int(r), r == CUDA_SUCCESS ? uint64_t(*dptr) : 0, bytes,
                            0, false, 0, 0);
        return r;
    }
    guard g;
    api_id api = alloc_api(api_id::cuMemAlloc_v2, bytes);
    uint64_t p = 0;
    int pr = 0;
    // Inside a capture that may forbid this thread the call, the driver answers (and invalidates
    // the capture where it refuses), as without gpumem; a block it serves is its own, not pooled.
    if (!capture_may_refuse() && pool_alloc(api, bytes, &p, &pr)) {
        if (pr == 0) *dptr = CUdeviceptr(p);
        return CUresult(pr);
    }
    CUresult r = f(dptr, bytes);
    record_alloc(api, mem_kind::device, int(r), r == CUDA_SUCCESS ? uint64_t(*dptr) : 0, bytes, 0, false, 0, 0);
    return r;
}

extern "C" GPUMEM_HIDDEN CUresult w_cuMemFree_v2(CUdeviceptr dptr) {
    auto f = real<CUresult (*)(CUdeviceptr)>(drv::cuMemFree_v2);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    if (dptr == 0) return f(dptr);
    if (guard::active())
        return free_from_inside(api_id::cuMemFree_v2, mem_kind::device, uint64_t(dptr), false, 0, [&] { return f(dptr); });
    guard g;
    CUresult refusal = CUDA_SUCCESS;
    if (capture_may_refuse() && pool_owns(uint64_t(dptr)) && driver_refuses_unsafe_call(&refusal))
        return captured_free(api_id::cuMemFree_v2, dptr, false, nullptr, [&] { return refusal; });
    CUresult pr = CUDA_SUCCESS;
    if (pooled_free(api_id::cuMemFree_v2, dptr, &pr)) return pr;
    return recorded_free(api_id::cuMemFree_v2, mem_kind::device, uint64_t(dptr), false, 0, [&] { return f(dptr); });
}

extern "C" GPUMEM_HIDDEN CUresult w_cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                                                       unsigned int elem) {
    auto f = real<CUresult (*)(CUdeviceptr*, size_t*, size_t, size_t, unsigned int)>(drv::cuMemAllocPitch_v2);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    if (!dptr || !pitch) return f(dptr, pitch, width, height, elem);
    if (guard::active()) {
        const CUresult r = f(dptr, pitch, width, height, elem);
        record_alloc_inside(api_id::cuMemAllocPitch_v2, mem_kind::device, int(r), r == CUDA_SUCCESS ? uint64_t(*dptr) : 0,
                            uint64_t(width) * height, r == CUDA_SUCCESS ? uint64_t(*pitch) * height : 0, false, 0, 0);
        return r;
    }
    guard g;
    api_id api = alloc_api(api_id::cuMemAllocPitch_v2, uint64_t(width) * height);
    CUresult r = retry_after_give_back(api, -1, [&] { return f(dptr, pitch, width, height, elem); });
    uint64_t asize = r == CUDA_SUCCESS ? uint64_t(*pitch) * height : 0;
    record_alloc(api, mem_kind::device, int(r), r == CUDA_SUCCESS ? uint64_t(*dptr) : 0, uint64_t(width) * height,
                 asize, false, 0, 0);
    return r;
}

extern "C" GPUMEM_HIDDEN CUresult w_cuMemAllocManaged(CUdeviceptr* dptr, size_t bytes, unsigned int flags) {
    auto f = real<CUresult (*)(CUdeviceptr*, size_t, unsigned int)>(drv::cuMemAllocManaged);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    if (!dptr) return f(dptr, bytes, flags);
    if (guard::active()) {
        const CUresult r = f(dptr, bytes, flags);
        record_alloc_inside(api_id::cuMemAllocManaged, mem_kind::managed, int(r), r == CUDA_SUCCESS ? uint64_t(*dptr) : 0,
                            bytes, 0, false, 0, 0);
        return r;
    }
    guard g;
    api_id api = alloc_api(api_id::cuMemAllocManaged, bytes);
    CUresult r = retry_after_give_back(api, -1, [&] { return f(dptr, bytes, flags); });
    record_alloc(api, mem_kind::managed, int(r), r == CUDA_SUCCESS ? uint64_t(*dptr) : 0, bytes, 0, false, 0, 0);
    return r;
}

// A call that puts work on (or captures) a per-thread default stream: the handle
// CU_STREAM_PER_THREAD anywhere, or the null stream in a _ptsz variant.  Noted before the call
// reaches the driver, as for launches (per_thread.cc).
template <bool PTSZ>
inline void note_if_per_thread(CUstream s) noexcept {
    if (s == CU_STREAM_PER_THREAD || (PTSZ && s == nullptr)) note_per_thread_stream();
}
// The stream a call names: in a _ptsz variant the null stream is the calling thread's own.
template <bool PTSZ>
inline CUstream named_stream(CUstream s) noexcept {
    return PTSZ && !s ? CU_STREAM_PER_THREAD : s;
}
constexpr bool is_ptsz(const char* n) noexcept {
    size_t k = 0;
    while (n[k]) ++k;
    return k > 5 && n[k - 5] == '_' && n[k - 4] == 'p' && n[k - 3] == 't' && n[k - 2] == 's' && n[k - 1] == 'z';
}

// ---------------------------------------------------------------------------------------------
// Stream-ordered allocations: the driver's own pools serve them; gpumem records, never pools them.

// cuMemAllocAsync draws from the pool current to its stream's device, which need not be the
// current context's: its record and its give-back name the stream's.
int device_of_stream(void* s) noexcept {
    auto get = real<CUresult (*)(CUstream, CUdevice*)>(drv::cuStreamGetDevice);
    CUdevice d = 0;
    return get && get(CUstream(s), &d) == CUDA_SUCCESS && d >= 0 ? int(d) : k_current_device;
}
// The device a memory pool placed an allocation on (the pool's location, which neither the
// current context nor the stream says); k_current_device when the driver does not answer, and
// while a stream capture gpumem saw is open (the pointer is then a graph allocation's, and a
// capture is no place for an extra driver call).
static int device_of_pointer(CUdeviceptr p) noexcept {
    if (capture_active()) return k_current_device;
    auto get = real<CUresult (*)(void*, CUpointer_attribute, CUdeviceptr)>(drv::cuPointerGetAttribute);
    int d = -1;
    return get && get(&d, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) == CUDA_SUCCESS && d >= 0 ? d : k_current_device;
}

#define GPUMEM_ALLOC_ASYNC(NAME)                                                                      \
    extern "C" GPUMEM_HIDDEN CUresult w_##NAME(CUdeviceptr* dptr, size_t bytes, CUstream s) {          \
        auto f = real<CUresult (*)(CUdeviceptr*, size_t, CUstream)>(drv::NAME);                         \
        if (!f) return CUDA_ERROR_NOT_INITIALIZED;                                                     \
        note_if_per_thread<is_ptsz(#NAME)>(s);                                                         \
        if (!dptr) return f(dptr, bytes, s);                                                           \
        const bool inside = guard::active();                                                           \
        guard g;                                                                                       \
        api_id api = inside ? api_id::NAME : alloc_api(api_id::NAME, bytes);                           \
        const int dev = device_of_stream(named_stream<is_ptsz(#NAME)>(s));                             \
        CUresult r = inside ? f(dptr, bytes, s) : retry_after_give_back(api, dev, [&] { return f(dptr, bytes, s); }); \
        logged_alloc(hook_recorder(inside), !inside, api, mem_kind::device, int(r),                    \
                     r == CUDA_SUCCESS ? uint64_t(*dptr) : 0, bytes, 0, true, uint64_t(s), 0, dev);    \
        return r;                                                                                      \
    }
GPUMEM_ALLOC_ASYNC(cuMemAllocAsync)
GPUMEM_ALLOC_ASYNC(cuMemAllocAsync_ptsz)

// Memory pools the program makes.  What cuMemAllocFromPoolAsync hands out is its pool's memory:
// pinned host memory from a pool of a host location, managed memory from a managed pool (CUDA 13),
// which no pool attribute tells (core/mempool_kinds.h).  So each pool's kind is noted when
// cuMemPoolCreate made it, from the properties it was made with, and dropped at its destroy; and
// when CUDA 13's cuMemGetDefaultMemPool or cuMemGetMemPool hands out a location's pool of a kind
// (the host's, a managed one), from the location and type asked.  These calls go to the driver
// unchanged and are not logged.  A pool imported from another process
// (cuMemPoolImportFromShareableHandle) is not noted: the driver lets no allocation be made from one.
static mempool_kinds g_mempools;

static mem_kind kind_of_pool(CUmemAllocationType type, CUmemLocationType location) noexcept {
    if (type == CU_MEM_ALLOCATION_TYPE_MANAGED) return mem_kind::managed;
    switch (location) {
        case CU_MEM_LOCATION_TYPE_HOST:
        case CU_MEM_LOCATION_TYPE_HOST_NUMA:
        case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: return mem_kind::host;
        default: return mem_kind::device;
    }
}

static void note_pool(CUmemoryPool pool, mem_kind k) noexcept {
    if (g_mempools.note(uint64_t(uintptr_t(pool)), k)) return;
    static std::atomic<bool> said{false};
    GPUMEM_WARN_ONCE(said, "more than {} memory pools of host or managed memory at once: allocations from the ones "
                     "past them are logged as device memory", mempool_kinds::k_slots);
}

// The properties are read after the driver took them: a pointer it refused may be one that cannot
// be read.
extern "C" GPUMEM_HIDDEN CUresult w_cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
    auto f = real<CUresult (*)(CUmemoryPool*, const CUmemPoolProps*)>(drv::cuMemPoolCreate);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    const CUresult r = f(pool, props);
    if (r != CUDA_SUCCESS || !pool || !props) return r;
    note_pool(*pool, kind_of_pool(props->allocType, props->location.type));
    return r;
}

// A location's default or current pool of an allocation type (CUDA 13), noted as one made.
#define GPUMEM_GET_MEMPOOL(NAME)                                                                      \
    extern "C" GPUMEM_HIDDEN CUresult w_##NAME(CUmemoryPool* pool, CUmemLocation* location, CUmemAllocationType type) { \
        auto f = real<CUresult (*)(CUmemoryPool*, CUmemLocation*, CUmemAllocationType)>(drv::NAME);     \
        if (!f) return CUDA_ERROR_NOT_INITIALIZED;                                                     \
        const CUresult r = f(pool, location, type);                                                    \
        if (r == CUDA_SUCCESS && pool && location) note_pool(*pool, kind_of_pool(type, location->type));  \
        return r;                                                                                      \
    }
GPUMEM_GET_MEMPOOL(cuMemGetDefaultMemPool)
GPUMEM_GET_MEMPOOL(cuMemGetMemPool)

// Forgotten before the driver destroys the pool, noted again if refused (handle_table.h): once it
// has, another thread's cuMemPoolCreate may get the same handle back for a pool of its own.
extern "C" GPUMEM_HIDDEN CUresult w_cuMemPoolDestroy(CUmemoryPool pool) {
    auto f = real<CUresult (*)(CUmemoryPool)>(drv::cuMemPoolDestroy);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    const mem_kind k = g_mempools.forget(uint64_t(uintptr_t(pool)));
    const CUresult r = f(pool);
    if (r != CUDA_SUCCESS && k != mem_kind::device) g_mempools.note(uint64_t(uintptr_t(pool)), k);
    return r;
}

// The allocation is of its pool's kind.  Host memory is none of what gpumem's pools hold: no
// give-back before it fails (as for cuMemCreate's), and no device (-1, as cuMemHostAlloc's).
#define GPUMEM_ALLOC_FROM_POOL(NAME)                                                                  \
    extern "C" GPUMEM_HIDDEN CUresult w_##NAME(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool, CUstream s) { \
        auto f = real<CUresult (*)(CUdeviceptr*, size_t, CUmemoryPool, CUstream)>(drv::NAME);           \
        if (!f) return CUDA_ERROR_NOT_INITIALIZED;                                                     \
        note_if_per_thread<is_ptsz(#NAME)>(s);                                                         \
        if (!dptr) return f(dptr, bytes, pool, s);                                                     \
        const bool inside = guard::active();                                                           \
        guard g;                                                                                       \
        api_id api = inside ? api_id::NAME : alloc_api(api_id::NAME, bytes);                           \
        const mem_kind kind = g_mempools.kind_of(uint64_t(uintptr_t(pool)));                           \
        const bool host = kind == mem_kind::host;                                                      \
        /* the memory pool's location may be any device: every pool gives back (not from inside) */    \
        CUresult r = host || inside ? f(dptr, bytes, pool, s)                                          \
                                    : retry_after_give_back(api, -2, [&] { return f(dptr, bytes, pool, s); }); \
        logged_alloc(hook_recorder(inside), !inside,                                                   \
            api, kind, int(r), r == CUDA_SUCCESS ? uint64_t(*dptr) : 0, bytes, 0, true, uint64_t(s), uint64_t(pool), \
            r == CUDA_SUCCESS && !host ? device_of_pointer(*dptr) : k_current_device);                 \
        return r;                                                                                      \
    }
GPUMEM_ALLOC_FROM_POOL(cuMemAllocFromPoolAsync)
GPUMEM_ALLOC_FROM_POOL(cuMemAllocFromPoolAsync_ptsz)

// Whether the driver says stream s is being captured.  There cuMemFreeAsync makes a free node, which
// only a graph allocation may have (its documentation); a pooled block is a cuMemAlloc allocation to
// the program, so such a free is the driver's to answer, and the block stays allocated.  Asked of
// the driver at each stream-ordered free of a pooled block (about 0.05 us on the H200,
// docs/benchmarks.md run 77), never at any other free: the hooks' capture count misses
// captures opened by routes they do not see (GPUMEM_ROUTES, a resolved pointer gpumem cannot wrap), so
// a count of 0 proves nothing.  The legacy stream made unusable by a capture on a blocking stream
// (STREAM_CAPTURE_IMPLICIT) is refused by the driver too.  Any other answer, errors included: the
// pool frees, as before (passed through outside a capture, the free could release the whole
// segment under a pooled block).
// On a stream no capture holds, the free is still a "potentially unsafe" call: where a capture
// forbids this thread such calls, the driver refuses it with 900 and invalidates the capture, in
// the cases where it refuses cuMemFree (H200, run 97, capture_mode_check.py's free_async cases),
// so the pool asks the driver as cuMemFree's hook does before it frees.
// The driver's cuStreamIsCapturing of s (CUDA_ERROR_NOT_FOUND without the entry point).
static CUresult capture_status(CUstream s, CUstreamCaptureStatus* st) noexcept {
    auto is_capturing = real<CUresult (*)(CUstream, CUstreamCaptureStatus*)>(drv::cuStreamIsCapturing);
    *st = CU_STREAM_CAPTURE_STATUS_NONE;
    return is_capturing ? is_capturing(s, st) : CUDA_ERROR_NOT_FOUND;
}

static bool capturing(CUstream s) noexcept {
    CUstreamCaptureStatus st;
    CUresult r = capture_status(s, &st);
    return r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT || (r == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE);
}

#define GPUMEM_FREE_ASYNC(NAME)                                                                       \
    extern "C" GPUMEM_HIDDEN CUresult w_##NAME(CUdeviceptr p, CUstream s) {                            \
        auto f = real<CUresult (*)(CUdeviceptr, CUstream)>(drv::NAME);                                  \
        if (!f) return CUDA_ERROR_NOT_INITIALIZED;                                                     \
        note_if_per_thread<is_ptsz(#NAME)>(s);                                                         \
        if (p == 0) return f(p, s);                                                                    \
        if (guard::active())                                                                           \
            return free_from_inside(api_id::NAME, mem_kind::device, uint64_t(p), true, uint64_t(s), [&] { return f(p, s); }); \
        guard g;                                                                                       \
        if (pool_owns(uint64_t(p)) && capturing(named_stream<is_ptsz(#NAME)>(s)))                        \
            return captured_free(api_id::NAME, p, true, s, [&] { return f(p, s); });                         \
        CUresult refusal = CUDA_SUCCESS;                                                               \
        if (capture_may_refuse() && pool_owns(uint64_t(p)) && driver_refuses_unsafe_call(&refusal))    \
            return captured_free(api_id::NAME, p, true, s, [&] { return refusal; });                   \
        CUresult pr = CUDA_SUCCESS;                                                                    \
        if (pooled_free(api_id::NAME, p, &pr)) return pr;                                              \
        return recorded_free(api_id::NAME, mem_kind::device, uint64_t(p), true, uint64_t(s), [&] { return f(p, s); }); \
    }
GPUMEM_FREE_ASYNC(cuMemFreeAsync)
GPUMEM_FREE_ASYNC(cuMemFreeAsync_ptsz)

// ---------------------------------------------------------------------------------------------
// Virtual memory management: physical handles are the memory; maps and reservations are address space.

extern "C" GPUMEM_HIDDEN CUresult w_cuMemCreate(CUmemGenericAllocationHandle* h, size_t size,
                                                const CUmemAllocationProp* prop, unsigned long long flags) {
    auto f = real<CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long)>(
        drv::cuMemCreate);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    if (!h) return f(h, size, prop, flags);
    const bool inside = guard::active();
    guard g;
    const int dev = prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop->location.id : -1;
    // Host memory (a host location) is not what the pools hold: no retry for it.
    CUresult r = dev >= 0 && !inside
                     ? retry_after_give_back(api_id::cuMemCreate, dev, [&] { return f(h, size, prop, flags); })
                     : f(h, size, prop, flags);
    recorder* rec = hook_recorder(inside);
    if (rec) {
        call_info c = make_call(api_id::cuMemCreate, -1);
        if (dev >= 0) c.dev = dev;
        note_driver_memory(c, int(r));
        rec->alloc(c, int(r), r == CUDA_SUCCESS ? uint64_t(*h) : 0, size, 0, !inside);
    }
    return r;
}

// The extra references cuMemRetainAllocationHandle gave the program: one entry of the handle each
// (its value unused).  cuMemRetainAllocationHandle(&h, addr) hands back the cuMemCreate handle
// itself, with one more reference that a cuMemRelease must take back; the physical memory goes only
// with the handle's last reference (and last unmap).  NCCL frees each cuMem buffer so: retain,
// release, unmap, release.  A release that takes one back is not logged as the handle's free: only
// the release that finds none left is.  Which of the equal calls the program meant as "the
// retained one" does not matter: the last of them frees.
static handle_table g_retained;

// A release that takes back a reference cuMemRetainAllocationHandle gave is no free: the handle
// and its memory live on.  Only the release that finds no extra reference left is logged.
extern "C" GPUMEM_HIDDEN CUresult w_cuMemRelease(CUmemGenericAllocationHandle h) {
    auto f = real<CUresult (*)(CUmemGenericAllocationHandle)>(drv::cuMemRelease);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    const bool inside = guard::active();
    guard g;
    if (g_retained.take(uint64_t(h))) {
        const CUresult r = f(h);
        if (r != CUDA_SUCCESS) g_retained.add(uint64_t(h), 0);  // refused: the reference is still there
        return r;
    }
    if (inside) return free_from_inside(api_id::cuMemRelease, mem_kind::vmm, uint64_t(h), false, 0, [&] { return f(h); });
    return recorded_free(api_id::cuMemRelease, mem_kind::vmm, uint64_t(h), false, 0, [&] { return f(h); });
}

extern "C" GPUMEM_HIDDEN CUresult w_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                             CUmemGenericAllocationHandle h, unsigned long long flags) {
    auto f = real<CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)>(drv::cuMemMap);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    const bool inside = guard::active();
    guard g;
    CUresult r = f(ptr, size, offset, h, flags);
    if (r == CUDA_SUCCESS)
        if (recorder* rec = hook_recorder(inside)) rec->vmm(ev_kind::map, make_call(api_id::cuMemMap, -1), ptr, size, h, offset);
    return r;
}

extern "C" GPUMEM_HIDDEN CUresult w_cuMemUnmap(CUdeviceptr ptr, size_t size) {
    auto f = real<CUresult (*)(CUdeviceptr, size_t)>(drv::cuMemUnmap);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    const bool inside = guard::active();
    guard g;
    // Recorded after the call, only when it succeeded (the format has no failed-unmap event).  So
    // unlike a free, a map of the same range by another thread right after can take an earlier seq.
    // (From inside a hook, only a success is counted lost where it cannot be logged.)
    recorder* rec = inside ? nullptr : recorder_or_null();
    CUresult r = f(ptr, size);
    if (r == CUDA_SUCCESS && inside) rec = recorder_if_recording();
    if (r == CUDA_SUCCESS && rec) rec->vmm(ev_kind::unmap, make_call(api_id::cuMemUnmap, -1), ptr, size);
    return r;
}

extern "C" GPUMEM_HIDDEN CUresult w_cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t align, CUdeviceptr addr,
                                                        unsigned long long flags) {
    auto f = real<CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long)>(drv::cuMemAddressReserve);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    if (!ptr) return f(ptr, size, align, addr, flags);
    const bool inside = guard::active();
    guard g;
    CUresult r = f(ptr, size, align, addr, flags);
    if (r == CUDA_SUCCESS)
        if (recorder* rec = hook_recorder(inside))
            rec->vmm(ev_kind::reserve, make_call(api_id::cuMemAddressReserve, -1), *ptr, size);
    return r;
}

extern "C" GPUMEM_HIDDEN CUresult w_cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    auto f = real<CUresult (*)(CUdeviceptr, size_t)>(drv::cuMemAddressFree);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    const bool inside = guard::active();
    guard g;
    CUresult r = f(ptr, size);
    if (r == CUDA_SUCCESS)
        if (recorder* rec = hook_recorder(inside))
            rec->vmm(ev_kind::unreserve, make_call(api_id::cuMemAddressFree, -1), ptr, size);
    return r;
}

// ---------------------------------------------------------------------------------------------
// Pinned host memory.

extern "C" GPUMEM_HIDDEN CUresult w_cuMemHostAlloc(void** pp, size_t bytes, unsigned int flags) {
    auto f = real<CUresult (*)(void**, size_t, unsigned int)>(drv::cuMemHostAlloc);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    if (!pp) return f(pp, bytes, flags);
    const bool inside = guard::active();
    guard g;
    CUresult r = f(pp, bytes, flags);
    logged_alloc(hook_recorder(inside), !inside, api_id::cuMemHostAlloc, mem_kind::host, int(r),
                 r == CUDA_SUCCESS ? uint64_t(uintptr_t(*pp)) : 0, bytes, 0, false, 0, 0, k_current_device);
    return r;
}

extern "C" GPUMEM_HIDDEN CUresult w_cuMemAllocHost_v2(void** pp, size_t bytes) {
    auto f = real<CUresult (*)(void**, size_t)>(drv::cuMemAllocHost_v2);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    if (!pp) return f(pp, bytes);
    const bool inside = guard::active();
    guard g;
    CUresult r = f(pp, bytes);
    logged_alloc(hook_recorder(inside), !inside, api_id::cuMemAllocHost_v2, mem_kind::host, int(r),
                 r == CUDA_SUCCESS ? uint64_t(uintptr_t(*pp)) : 0, bytes, 0, false, 0, 0, k_current_device);
    return r;
}

extern "C" GPUMEM_HIDDEN CUresult w_cuMemFreeHost(void* p) {
    auto f = real<CUresult (*)(void*)>(drv::cuMemFreeHost);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    if (guard::active())
        return free_from_inside(api_id::cuMemFreeHost, mem_kind::host, uint64_t(uintptr_t(p)), false, 0, [&] { return f(p); });
    guard g;
    return recorded_free(api_id::cuMemFreeHost, mem_kind::host, uint64_t(uintptr_t(p)), false, 0, [&] { return f(p); });
}

// ---------------------------------------------------------------------------------------------
// Pointer queries, IPC, context teardown and stream capture: the pool must answer these for its
// blocks (see pool_hooks.cc); with the pool off they pass straight through.
CUresult pool_get_address_range(CUdeviceptr* base, size_t* size, CUdeviceptr p, bool* handled) noexcept;
CUresult pool_pointer_attribute(void* data, CUpointer_attribute a, CUdeviceptr p, bool* handled) noexcept;
CUresult pool_pointer_attributes(unsigned n, CUpointer_attribute* a, void** data, CUdeviceptr p, bool* handled) noexcept;
CUresult pool_ipc_handle(CUipcMemHandle* h, CUdeviceptr p, bool* handled) noexcept;
CUresult ipc_open(CUdeviceptr* p, const CUipcMemHandle& h, unsigned flags, drv abi, bool* handled) noexcept;
CUresult ipc_close(CUdeviceptr p, bool* handled) noexcept;
CUresult pool_retain_handle(void* addr, bool* handled) noexcept;
void pool_peer_enabled(CUcontext peer) noexcept;
// `when`: whether the call that ends the context comes next or came (block_pool::drop_all).
void pool_context_gone(CUcontext ctx, int dev, context_end when = context_end::coming) noexcept;
bool context_is_primary(CUcontext ctx) noexcept;
CUresult pool_primary_release(CUdevice dev, CUresult (*release)(CUdevice), bool* ended) noexcept;
CUresult pool_primary_retain(CUresult (*retain)(CUcontext*, CUdevice), CUcontext* c, CUdevice dev) noexcept;
CUresult pool_green_create(CUresult (*create)(CUgreenCtx*, CUdevResourceDesc, CUdevice, unsigned int), CUgreenCtx* g,
                           CUdevResourceDesc desc, CUdevice dev, unsigned int flags) noexcept;
CUresult pool_green_destroy(CUdevice dev, CUcontext green, CUresult (*destroy)(CUgreenCtx), CUgreenCtx g, bool* ended) noexcept;
void capture_begin() noexcept;
void capture_begin_failed() noexcept;
void capture_opened(CUstream s, CUstreamCaptureMode mode) noexcept;
void capture_end(CUstream s) noexcept;
void capture_thread_mode(CUstreamCaptureMode mode) noexcept;

extern "C" GPUMEM_HIDDEN CUresult w_cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
    auto f = real<CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr)>(drv::cuMemGetAddressRange_v2);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    bool handled = false;
    CUresult r = pool_get_address_range(base, size, p, &handled);
    return handled ? r : f(base, size, p);
}

// Free memory as the program would see it without gpumem: the driver's free plus what the pools of
// the current device hold free and would give back on demand (whole chunks, idle segments).
// Without gpumem those frees had gone back to the driver, and a program that sizes its work by
// cudaMemGetInfo (vLLM's KV cache, a batch size search) would size it smaller under gpumem.
extern "C" GPUMEM_HIDDEN CUresult w_cuMemGetInfo_v2(size_t* free_b, size_t* total_b) {
    auto f = real<CUresult (*)(size_t*, size_t*)>(drv::cuMemGetInfo_v2);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    if (guard::active()) return f(free_b, total_b);
    guard g;
    // The pools first, the driver right after: memory a give-back of another thread returns
    // meanwhile is then counted twice (capped at the total) rather than not at all.
    const uint64_t giveable = pool_giveable(-1);
    const CUresult r = f(free_b, total_b);
    if (r != CUDA_SUCCESS || !free_b || !total_b) return r;
    *free_b = size_t(std::min<uint64_t>(uint64_t(*free_b) + giveable, *total_b));
    return r;
}

extern "C" GPUMEM_HIDDEN CUresult w_cuPointerGetAttribute(void* data, CUpointer_attribute a, CUdeviceptr p) {
    auto f = real<CUresult (*)(void*, CUpointer_attribute, CUdeviceptr)>(drv::cuPointerGetAttribute);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    bool handled = false;
    CUresult r = pool_pointer_attribute(data, a, p, &handled);
    return handled ? r : f(data, a, p);
}

extern "C" GPUMEM_HIDDEN CUresult w_cuPointerGetAttributes(unsigned n, CUpointer_attribute* a, void** data, CUdeviceptr p) {
    auto f = real<CUresult (*)(unsigned, CUpointer_attribute*, void**, CUdeviceptr)>(drv::cuPointerGetAttributes);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    bool handled = false;
    CUresult r = pool_pointer_attributes(n, a, data, p, &handled);
    return handled ? r : f(n, a, data, p);
}

extern "C" GPUMEM_HIDDEN CUresult w_cuIpcGetMemHandle(CUipcMemHandle* h, CUdeviceptr p) {
    auto f = real<CUresult (*)(CUipcMemHandle*, CUdeviceptr)>(drv::cuIpcGetMemHandle);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    bool handled = false;
    CUresult r = pool_ipc_handle(h, p, &handled);
    return handled ? r : f(h, p);
}

// A gpumem handle (a pooled block another process exported, ipc_share.cc) is opened by gpumem;
// every other handle, and every pointer gpumem did not open, is the driver's, by the ABI the
// program called.  Both ABIs share one prototype: the first is what a resolver hands out for a
// version below 11000 and what a program built against an older cuda.h links.
static CUresult ipc_open_hook(drv abi, CUdeviceptr* p, CUipcMemHandle h, unsigned int flags) noexcept {
    auto f = real<CUresult (*)(CUdeviceptr*, CUipcMemHandle, unsigned int)>(abi);
    // Inside a gpumem lock (a signal handler's call) the importer's lock may be this thread's
    // (ipc_share.cc holds it inside a critical_section): the driver's call, as inside a hook.
    if (guard::active() || critical_section::active()) return f ? f(p, h, flags) : CUDA_ERROR_NOT_INITIALIZED;
    guard g;
    bool handled = false;
    CUresult r = ipc_open(p, h, flags, abi, &handled);
    if (handled) return r;
    return f ? f(p, h, flags) : CUDA_ERROR_NOT_INITIALIZED;
}
extern "C" GPUMEM_HIDDEN CUresult w_cuIpcOpenMemHandle_v2(CUdeviceptr* p, CUipcMemHandle h, unsigned int flags) {
    return ipc_open_hook(drv::cuIpcOpenMemHandle_v2, p, h, flags);
}
extern "C" GPUMEM_HIDDEN CUresult w_cuIpcOpenMemHandle(CUdeviceptr* p, CUipcMemHandle h, unsigned int flags) {
    return ipc_open_hook(drv::cuIpcOpenMemHandle, p, h, flags);
}

extern "C" GPUMEM_HIDDEN CUresult w_cuIpcCloseMemHandle(CUdeviceptr p) {
    auto f = real<CUresult (*)(CUdeviceptr)>(drv::cuIpcCloseMemHandle);
    if (guard::active() || critical_section::active()) return f ? f(p) : CUDA_ERROR_NOT_INITIALIZED;  // as the open
    guard g;
    bool handled = false;
    CUresult r = ipc_close(p, &handled);
    if (handled) return r;
    return f ? f(p) : CUDA_ERROR_NOT_INITIALIZED;
}

// A pooled block is no cuMemCreate allocation to the program (pool_hooks.cc).  Any other handle the
// driver retains is the one cuMemCreate gave, with a reference more: kept, so that the release that
// takes it back is not logged as the handle's free (w_cuMemRelease).
extern "C" GPUMEM_HIDDEN CUresult w_cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* h, void* addr) {
    auto f = real<CUresult (*)(CUmemGenericAllocationHandle*, void*)>(drv::cuMemRetainAllocationHandle);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    bool handled = false;
    CUresult r = pool_retain_handle(addr, &handled);
    if (handled) return r;
    r = f(h, addr);
    // Noted from inside a hook too (a signal handler's), as its release there takes one back.  The
    // warning is not written there: formatting it is not async-signal-safe.
    if (r == CUDA_SUCCESS && h && *h && !g_retained.add(uint64_t(*h), 0) && !guard::active()) {
        static std::atomic<bool> said{false};
        GPUMEM_WARN_ONCE(said, "more than {} references from cuMemRetainAllocationHandle held at once: the release of "
                         "one past them is logged as its handle's free", handle_table::k_slots);
    }
    return r;
}

// Peer access opens the peer context's memory to this context's device: the pool's chunks of
// that context need the same (pool_hooks.cc).
extern "C" GPUMEM_HIDDEN CUresult w_cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
    auto f = real<CUresult (*)(CUcontext, unsigned int)>(drv::cuCtxEnablePeerAccess);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = f(peer, flags);
    if ((r == CUDA_SUCCESS || r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) && !guard::active()) {
        guard g;
        pool_peer_enabled(peer);
    }
    return r;
}

// A context's end, by either ABI of each call (a static cudart 13's cudaDeviceReset calls the first
// cuDevicePrimaryCtxReset, H200 run 112; unseen, the pool kept cuMemAlloc segments the driver had
// freed and handed them out again).  Before the real call: the pool gives back what outlives the
// context and must not touch the rest afterwards.
static CUresult context_ends(drv which, bool by_device, CUcontext ctx, CUdevice dev) noexcept {
    void* f = real_driver(which);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    // As primary_release; and inside a gpumem lock (a signal handler's call, exit()'s atexit
    // handlers), where context_is_primary would wait for the primary-context lock this thread may
    // hold (a retain or release under way: the exit hung), and the pool is not asked anyway.
    if (guard::active() || critical_section::active())
        return by_device ? reinterpret_cast<CUresult (*)(CUdevice)>(f)(dev) : reinterpret_cast<CUresult (*)(CUcontext)>(f)(ctx);
    if (!by_device && context_is_primary(ctx)) {
        // The driver refuses to destroy a primary context (CUDA_ERROR_INVALID_CONTEXT on the
        // H200), which then lives on with all its memory: the pool must not give anything back
        // before the answer.  If a driver does destroy it, the pool gives back afterwards.
        const CUresult r = reinterpret_cast<CUresult (*)(CUcontext)>(f)(ctx);
        if (r == CUDA_SUCCESS) {
            pool_context_gone(ctx, -1, context_end::past);
            first_use_forget();
        }
        return r;
    }
    pool_context_gone(by_device ? nullptr : ctx, by_device ? int(dev) : -1);
    first_use_forget();
    return by_device ? reinterpret_cast<CUresult (*)(CUdevice)>(f)(dev) : reinterpret_cast<CUresult (*)(CUcontext)>(f)(ctx);
}
// A primary context's last release ends it too (H200 run 116: its cuMemAlloc memory is freed, the
// handle stays current; unseen, the pool handed that memory out again and the program's next fill
// failed).  pool_hooks.cc tells the last from the others.
static CUresult primary_release(drv which, CUdevice dev) noexcept {
    auto f = real<CUresult (*)(CUdevice)>(which);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    // From inside gpumem's own code: straight through, as every hook does.  Also exit() from a
    // signal handler that interrupted a hook of this thread: the runtime's exit handler releasing
    // the context must not wait for the pool's lock this thread holds.
    if (guard::active()) return f(dev);
    bool ended = false;
    const CUresult r = pool_primary_release(dev, f, &ended);
    if (ended) first_use_forget();  // a release that was not the last leaves every load in place
    return r;
}
extern "C" GPUMEM_HIDDEN CUresult w_cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    return primary_release(drv::cuDevicePrimaryCtxRelease_v2, dev);
}
extern "C" GPUMEM_HIDDEN CUresult w_cuDevicePrimaryCtxRelease(CUdevice dev) {
    return primary_release(drv::cuDevicePrimaryCtxRelease, dev);
}
extern "C" GPUMEM_HIDDEN CUresult w_cuCtxDestroy_v2(CUcontext ctx) {
    return context_ends(drv::cuCtxDestroy_v2, false, ctx, 0);
}
extern "C" GPUMEM_HIDDEN CUresult w_cuCtxDestroy(CUcontext ctx) { return context_ends(drv::cuCtxDestroy, false, ctx, 0); }
extern "C" GPUMEM_HIDDEN CUresult w_cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    return context_ends(drv::cuDevicePrimaryCtxReset_v2, true, nullptr, dev);
}
extern "C" GPUMEM_HIDDEN CUresult w_cuDevicePrimaryCtxReset(CUdevice dev) {
    return context_ends(drv::cuDevicePrimaryCtxReset, true, nullptr, dev);
}

// The device of each green context made through a hook (its destruction names none).  A full
// table, or a green context made by a route gpumem did not see, leaves its destruction unwatched
// (docs/pool.md).
static handle_table g_green_devices;
// g's entry, replacing any it has: one left by a destruction gpumem did not see (by a way in it
// does not watch, or refused by the driver yet carried out) names the device of the green context
// that had the handle before, and found first, it sent this one's end to that device.  Only the
// creating thread knows a new handle yet, so no destruction looks between the two steps.
static void green_made(CUgreenCtx g, CUdevice dev) noexcept {
    const uint64_t key = uint64_t(uintptr_t(g));
    uint8_t stale = 0;
    g_green_devices.take_all(key, &stale);
    if (dev >= 0 && dev <= 255) g_green_devices.add(key, uint8_t(dev));
}
// The own CUcontext of each green context made through a hook (cuCtxFromGreenCtx), with its
// device: memory allocated while one is current is its primary context's (an H100, driver
// 580.159.04: cuPointerGetAttribute names the primary context, before and after cuGreenCtxDestroy,
// which gives none of it back; tests/gpu/green_free.cu), so a pooled block's context is answered
// so too (pool_hooks.cc).  Kept after the destruction, whose blocks live on; a context made anew
// with the handle (cuCtxCreate, a retain) or another green context takes the entry's place.  The
// value's high bit says the green context was destroyed (green_context_destroyed), so devices past
// 127 are not kept.
static handle_table g_green_contexts;
constexpr uint8_t k_green_dead = 0x80;
static void green_context_named(CUcontext c, int dev) noexcept {
    if (!c) return;
    const uint64_t key = uint64_t(uintptr_t(c));
    g_green_contexts.take_all(key, nullptr);
    if (dev >= 0 && dev < k_green_dead) g_green_contexts.add(key, uint8_t(dev));
}
int green_context_device(CUcontext c) noexcept {
    uint8_t v = 0;
    return c && g_green_contexts.find(uint64_t(uintptr_t(c)), &v) ? int(v & ~k_green_dead) : -1;
}
bool green_context_destroyed(CUcontext c) noexcept {
    uint8_t v = 0;
    return c && g_green_contexts.find(uint64_t(uintptr_t(c)), &v) && (v & k_green_dead);
}
// Takes g's entry out of the table: its device, or -1 where g is not in it.  Taken before the
// driver destroys g and put back if it refuses (handle_table.h): a green context of another device
// that gets g's handle back the moment the driver destroyed g must find its own device.
static int green_take(CUgreenCtx g) noexcept {
    uint8_t dev = 0;
    return g_green_devices.take(uint64_t(uintptr_t(g)), &dev) ? int(dev) : -1;
}

// A context's making: a new context (cuCtxCreate, by every ABI; a primary context's retain that
// makes it, the first or the first after its end or reset; a green context, below) takes device
// memory of its own, which the pools of another context of its device may hold freed (a program
// that made a second context after the first's frees, or retained the primary context again
// beside a context of its own).  Made again after the pools of the device it names give back, as
// the calls the pool does not serve are (retry_if_oom): a failed creation made nothing.  Before
// gpumem's guard: from inside gpumem (whose own retains are the real function's) or a signal
// handler that interrupted a hook, the first answer stands; so does any answer for a device no
// pool can be on.
template <class F>
static CUresult context_made(api_id api, CUdevice dev, F&& call) noexcept {
    const CUresult r = call();
    if (r != CUDA_ERROR_OUT_OF_MEMORY || dev < 0 || guard::active()) return r;
    guard g;
    return retry_if_oom(api, int(dev), r, call);
}
// context_made for a call that makes a CUcontext at *c: a handle a dead green context had is no
// longer that green context's.
template <class F>
static CUresult context_made(api_id api, CUdevice dev, CUcontext* c, F&& call) noexcept {
    const CUresult r = context_made(api, dev, call);
    if (r == CUDA_SUCCESS && c) green_context_named(*c, -1);
    return r;
}
extern "C" GPUMEM_HIDDEN CUresult w_cuCtxCreate(CUcontext* c, unsigned int flags, CUdevice dev) {
    auto f = real<CUresult (*)(CUcontext*, unsigned int, CUdevice)>(drv::cuCtxCreate);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    return context_made(api_id::cuCtxCreate, dev, c, [&] { return f(c, flags, dev); });
}
extern "C" GPUMEM_HIDDEN CUresult w_cuCtxCreate_v2(CUcontext* c, unsigned int flags, CUdevice dev) {
    auto f = real<CUresult (*)(CUcontext*, unsigned int, CUdevice)>(drv::cuCtxCreate_v2);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    return context_made(api_id::cuCtxCreate, dev, c, [&] { return f(c, flags, dev); });
}
extern "C" GPUMEM_HIDDEN CUresult w_cuCtxCreate_v3(CUcontext* c, CUexecAffinityParam* params, int n, unsigned int flags,
                                                   CUdevice dev) {
    auto f = real<CUresult (*)(CUcontext*, CUexecAffinityParam*, int, unsigned int, CUdevice)>(drv::cuCtxCreate_v3);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    return context_made(api_id::cuCtxCreate, dev, c, [&] { return f(c, params, n, flags, dev); });
}
extern "C" GPUMEM_HIDDEN CUresult w_cuCtxCreate_v4(CUcontext* c, CUctxCreateParams* params, unsigned int flags, CUdevice dev) {
    auto f = real<CUresult (*)(CUcontext*, CUctxCreateParams*, unsigned int, CUdevice)>(drv::cuCtxCreate_v4);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    return context_made(api_id::cuCtxCreate, dev, c, [&] { return f(c, params, flags, dev); });
}
// A retain of an active primary context takes no memory and never fails for want of it: the
// retry costs the answer's compare.  Never beside a release's end (pool_primary_retain).
extern "C" GPUMEM_HIDDEN CUresult w_cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice dev) {
    auto f = real<CUresult (*)(CUcontext*, CUdevice)>(drv::cuDevicePrimaryCtxRetain);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    return context_made(api_id::cuDevicePrimaryCtxRetain, dev, c, [&] { return pool_primary_retain(f, c, dev); });
}

// A green context's end: cuGreenCtxDestroy releases the primary context that cuGreenCtxCreate
// retained, which may be its last release (pool_green_destroy).  Its device comes from the table
// its creation filled; its own CUcontext from the driver, before the call.
extern "C" GPUMEM_HIDDEN CUresult w_cuGreenCtxDestroy(CUgreenCtx g) {
    auto f = real<CUresult (*)(CUgreenCtx)>(drv::cuGreenCtxDestroy);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    const int dev = green_take(g);
    if (dev < 0 || guard::active()) {
        // Inside gpumem (a signal handler's call) the destruction is not watched, but its entry
        // goes all the same: a reused handle must not find this one's device.
        const CUresult r = f(g);
        if (dev >= 0 && r != CUDA_SUCCESS) green_made(g, CUdevice(dev));  // refused: g lives on
        return r;
    }
    guard gd;
    CUcontext own = nullptr;
    if (auto from_green = GPUMEM_REAL(cuCtxFromGreenCtx))
        if (from_green(&own, g) != CUDA_SUCCESS) own = nullptr;
    // Its own CUcontext is marked dead before the driver's destroy (unmarked if refused): from
    // then on an allocation made with it current goes to the driver (pool_hooks.cc, current_slot),
    // which refuses it on an H100 (709), rather than to a pool made for it.  Before the destroy,
    // as every note on a handle the driver frees (handle_table.h); a context the driver makes with
    // the handle later takes the entry's place (green_context_named).
    if (own) g_green_contexts.set(uint64_t(uintptr_t(own)), uint8_t(dev | k_green_dead));
    bool ended = false;
    const CUresult r = pool_green_destroy(CUdevice(dev), own, f, g, &ended);
    if (r != CUDA_SUCCESS) {
        green_made(g, CUdevice(dev));
        if (own) g_green_contexts.set(uint64_t(uintptr_t(own)), uint8_t(dev));
    }
    if (ended) first_use_forget();
    return r;
}

// Every capture opener: counted before the driver opens it (no fence may touch a stream once the
// capture opens), uncounted if the driver refuses, else entered in the table with its mode.
template <class F>
static CUresult counted_begin(CUstream key, CUstreamCaptureMode mode, F&& real_call) noexcept {
    capture_begin();
    CUresult r = real_call();
    if (r != CUDA_SUCCESS) capture_begin_failed();
    else capture_opened(key, mode);
    return r;
}

#define GPUMEM_CAPTURE_BEGIN(NAME)                                                       \
    extern "C" GPUMEM_HIDDEN CUresult w_##NAME(CUstream s, CUstreamCaptureMode mode) {    \
        auto f = real<CUresult (*)(CUstream, CUstreamCaptureMode)>(drv::NAME);           \
        if (!f) return CUDA_ERROR_NOT_INITIALIZED;                                      \
        note_if_per_thread<is_ptsz(#NAME)>(s);                                          \
        return counted_begin(named_stream<is_ptsz(#NAME)>(s), mode, [&] { return f(s, mode); }); \
    }
GPUMEM_CAPTURE_BEGIN(cuStreamBeginCapture_v2)
GPUMEM_CAPTURE_BEGIN(cuStreamBeginCapture_v2_ptsz)

// The first ABI (CUDA 10.0), without a mode: the runtimes resolve it too (H200, run 94).  Its
// capture is relaxed: the driver allowed cuMemAlloc in one from its own thread and from another
// (run 95, tests/gpu/capture_mode_check.py "v1_capture").
#define GPUMEM_CAPTURE_BEGIN_V1(NAME)                                                    \
    extern "C" GPUMEM_HIDDEN CUresult w_##NAME(CUstream s) {                              \
        auto f = real<CUresult (*)(CUstream)>(drv::NAME);                                \
        if (!f) return CUDA_ERROR_NOT_INITIALIZED;                                      \
        note_if_per_thread<is_ptsz(#NAME)>(s);                                          \
        return counted_begin(named_stream<is_ptsz(#NAME)>(s), CU_STREAM_CAPTURE_MODE_RELAXED, [&] { return f(s); }); \
    }
GPUMEM_CAPTURE_BEGIN_V1(cuStreamBeginCapture)
GPUMEM_CAPTURE_BEGIN_V1(cuStreamBeginCapture_ptsz)

// A capture into an existing graph (CUDA 12.3+) opens a capture like the others: without this hook
// the pool would record a fence, or synchronize, into it, which invalidates the program's capture.
#define GPUMEM_CAPTURE_TO_GRAPH(NAME)                                                                   \
    extern "C" GPUMEM_HIDDEN CUresult w_##NAME(CUstream s, CUgraph g, const CUgraphNode* deps,          \
                                               const CUgraphEdgeData* data, size_t n, CUstreamCaptureMode mode) { \
        auto f = real<CUresult (*)(CUstream, CUgraph, const CUgraphNode*, const CUgraphEdgeData*, size_t, \
                                   CUstreamCaptureMode)>(drv::NAME);                                   \
        if (!f) return CUDA_ERROR_NOT_INITIALIZED;                                                     \
        note_if_per_thread<is_ptsz(#NAME)>(s);                                                         \
        return counted_begin(named_stream<is_ptsz(#NAME)>(s), mode, [&] { return f(s, g, deps, data, n, mode); }); \
    }
GPUMEM_CAPTURE_TO_GRAPH(cuStreamBeginCaptureToGraph)
GPUMEM_CAPTURE_TO_GRAPH(cuStreamBeginCaptureToGraph_ptsz)

// Whether cuStreamEndCapture's answer r closed a capture.  A success does, and so does an
// invalidated or unjoined one; a stream that was not capturing (ILLEGAL_STATE) leaves the count as
// it was, and any other failure is asked of the stream: an end from the wrong thread is refused
// and ends the capture all the same (measured on the H200, tests/gpu/capture_end_check.py).  The
// count must follow the driver's: too low, a fence could touch a capturing stream; too high, the
// pool would never release or unmap again.
static bool capture_ended(CUresult r, CUstream s) noexcept {
    if (r == CUDA_SUCCESS) return true;
    if (r == CUDA_ERROR_ILLEGAL_STATE) return false;
    CUstreamCaptureStatus st;
    return capture_status(s, &st) != CUDA_SUCCESS || st != CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

#define GPUMEM_CAPTURE_END(NAME)                                                         \
    extern "C" GPUMEM_HIDDEN CUresult w_##NAME(CUstream s, CUgraph* g) {                  \
        auto f = real<CUresult (*)(CUstream, CUgraph*)>(drv::NAME);                      \
        if (!f) return CUDA_ERROR_NOT_INITIALIZED;                                      \
        CUresult r = f(s, g);                                                           \
        CUstream key = named_stream<is_ptsz(#NAME)>(s);                                 \
        if (capture_ended(r, key)) capture_end(key);                                    \
        return r;                                                                       \
    }
GPUMEM_CAPTURE_END(cuStreamEndCapture)
GPUMEM_CAPTURE_END(cuStreamEndCapture_ptsz)

// The calling thread's capture mode, which decides with the open captures whether the driver
// refuses its cuMemAlloc/cuMemFree (core/pool/capture_table.h).  The runtime's
// cudaThreadExchangeStreamCaptureMode sets the same mode (H200, tests/gpu/capture_mode_check.py);
// PyTorch switches to relaxed around its own cudaMalloc calls.
extern "C" GPUMEM_HIDDEN CUresult w_cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
    auto f = real<CUresult (*)(CUstreamCaptureMode*)>(drv::cuThreadExchangeStreamCaptureMode);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    if (!mode) return f(mode);
    const CUstreamCaptureMode want = *mode;
    CUresult r = f(mode);
    if (r == CUDA_SUCCESS) capture_thread_mode(want);
    return r;
}

// Stream creation.  Watched, never changed: under GPUMEM_REUSE=auto the pool reuses freed blocks at
// once only while all device work runs in one issue order: the legacy default stream plus at most
// one blocking stream, which synchronizes with it both ways.  A non-blocking stream or a second
// blocking one ends that; the pool switches before the stream reaches the program.
extern "C" GPUMEM_HIDDEN CUresult w_cuStreamCreate(CUstream* s, unsigned int flags) {
    auto f = real<CUresult (*)(CUstream*, unsigned int)>(drv::cuStreamCreate);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = f(s, flags);
    if (r == CUDA_SUCCESS && s) {
        pool_stream_made(*s, (flags & CU_STREAM_NON_BLOCKING) != 0);
        pool_stream_created(api_id::cuStreamCreate, (flags & CU_STREAM_NON_BLOCKING) != 0);
    }
    return r;
}

extern "C" GPUMEM_HIDDEN CUresult w_cuStreamCreateWithPriority(CUstream* s, unsigned int flags, int priority) {
    auto f = real<CUresult (*)(CUstream*, unsigned int, int)>(drv::cuStreamCreateWithPriority);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = f(s, flags, priority);
    if (r == CUDA_SUCCESS && s) {
        pool_stream_made(*s, (flags & CU_STREAM_NON_BLOCKING) != 0);
        pool_stream_created(api_id::cuStreamCreateWithPriority, (flags & CU_STREAM_NON_BLOCKING) != 0);
    }
    return r;
}

extern "C" GPUMEM_HIDDEN CUresult w_cuGreenCtxStreamCreate(CUstream* s, CUgreenCtx g, unsigned int flags, int priority) {
    auto f = real<CUresult (*)(CUstream*, CUgreenCtx, unsigned int, int)>(drv::cuGreenCtxStreamCreate);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = f(s, g, flags, priority);
    if (r == CUDA_SUCCESS) {
        pool_green_context_made();  // its stream belongs to the green context, not the pool's
        pool_stream_created(api_id::cuGreenCtxStreamCreate, true);  // green streams must be non-blocking
    }
    return r;
}


// A green context can run work beside the primary context's legacy stream without any stream
// created (its own default stream), on the same device's memory: auto switches at its creation.
extern "C" GPUMEM_HIDDEN CUresult w_cuGreenCtxCreate(CUgreenCtx* g, CUdevResourceDesc desc, CUdevice dev, unsigned int flags) {
    auto f = real<CUresult (*)(CUgreenCtx*, CUdevResourceDesc, CUdevice, unsigned int)>(drv::cuGreenCtxCreate);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    // A context's making (context_made, above): retried after its device's pools give back.  Its
    // retain of the primary context never beside a release's end (pool_green_create).
    CUresult r = context_made(api_id::cuGreenCtxCreate, dev, [&] { return pool_green_create(f, g, desc, dev, flags); });
    if (r == CUDA_SUCCESS && g) {
        green_made(*g, dev);
        CUcontext own = nullptr;
        if (auto from_green = GPUMEM_REAL(cuCtxFromGreenCtx))
            if (from_green(&own, *g) == CUDA_SUCCESS) green_context_named(own, int(dev));
    }
    if (r == CUDA_SUCCESS) {
        pool_green_context_made();
        pool_stream_created(api_id::cuGreenCtxCreate, true);
    }
    return r;
}

// Stream destruction: the fences stop recording on the stream (an event cannot be recorded on a
// destroyed stream).  Its queued work still runs; the pool covers it by one synchronize.
extern "C" GPUMEM_HIDDEN CUresult w_cuStreamDestroy_v2(CUstream s) {
    auto f = real<CUresult (*)(CUstream)>(drv::cuStreamDestroy_v2);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    const bool known = pool_stream_destroyed(s);  // before: a handle the driver reuses must not be mistaken for this one
    CUresult r = f(s);
    // Refused: a stream that left the set may live on, where fences no longer cover it, so the
    // pool synchronizes instead from now on.  (An unknown handle, a second destroy: nothing left.)
    if (r != CUDA_SUCCESS && known) pool_stream_destroy_refused();
    return r;
}

// Launches, watched for the handle CU_STREAM_PER_THREAD (see per_thread.cc), and made again after
// a give-back when they run out of memory (retry_if_oom).
// A launch through a per-thread variant is a use of the per-thread default stream, whatever stream
// it names, as a call through any per-thread thunk is (per_thread.cc): which handle a runtime built
// with --default-stream per-thread passes there was never measured.  A plain launch is one when it
// names CU_STREAM_PER_THREAD.
template <bool PTSZ>
inline void note_launch(CUstream s) noexcept {
    if (PTSZ) note_per_thread_stream();
    else note_if_per_thread<false>(s);
}
#define GPUMEM_LAUNCH(NAME)                                                                           \
    extern "C" GPUMEM_HIDDEN CUresult w_##NAME(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,   \
                                               unsigned int bx, unsigned int by, unsigned int bz, unsigned int smem, \
                                               CUstream s, void** params, void** extra) {               \
        auto fn = real<decltype(&w_##NAME)>(drv::NAME);                                                 \
        if (!fn) return CUDA_ERROR_NOT_INITIALIZED;                                                     \
        note_launch<is_ptsz(#NAME)>(s);                                                                 \
        before_first_use(api_id::cuLaunchKernel, f);                                                    \
        return retry_unguarded_if_oom(api_id::cuLaunchKernel, fn(f, gx, gy, gz, bx, by, bz, smem, s, params, extra), \
                                      [&] { return fn(f, gx, gy, gz, bx, by, bz, smem, s, params, extra); }); \
    }
#define GPUMEM_LAUNCH_EX(NAME)                                                                        \
    extern "C" GPUMEM_HIDDEN CUresult w_##NAME(const CUlaunchConfig* config, CUfunction f, void** params, void** extra) { \
        auto fn = real<decltype(&w_##NAME)>(drv::NAME);                                                 \
        if (!fn) return CUDA_ERROR_NOT_INITIALIZED;                                                     \
        note_launch<is_ptsz(#NAME)>(config ? config->hStream : nullptr);                                \
        before_first_use(api_id::cuLaunchKernelEx, f);                                                  \
        return retry_unguarded_if_oom(api_id::cuLaunchKernelEx, fn(config, f, params, extra),           \
                                      [&] { return fn(config, f, params, extra); });                    \
    }
// The per-thread variants (a program built with --default-stream per-thread launches through
// them) are typed wrappers too, not thunks: their first launches need the headroom as much.  The
// log names the plain call.
GPUMEM_LAUNCH(cuLaunchKernel)
GPUMEM_LAUNCH(cuLaunchKernel_ptsz)
GPUMEM_LAUNCH_EX(cuLaunchKernelEx)
GPUMEM_LAUNCH_EX(cuLaunchKernelEx_ptsz)

// Calls that may take device memory of their own: module and library loads, the first use of a
// lazily loaded function (getting it, its attributes, its occupancy; CUDA_MODULE_LOADING=LAZY is
// the default), cooperative and graph launches.  Under the pool a failure there with
// OUT_OF_MEMORY can be the memory the program freed into it (H200 run 102: cublasCreate failed so
// with eager loading, a cuSOLVER call with lazy loading), so each is made again after a give-back;
// those that name a function, kernel, module, library or graph first make headroom at its first
// use (before_first_use; KEY is that handle, nullptr for none: the loads, retried after a
// failure).  The hot path is the call and one compare.  The calls: GPUMEM_OOM_RETRY_CALLS and
// GPUMEM_OOM_RETRY_STREAM_CALLS (gpumem_preload.h), which also put them in the table of driver
// functions.
#define GPUMEM_OOM_RETRY(NAME, PARAMS, ARGS, KEY)                                                      \
    extern "C" GPUMEM_HIDDEN CUresult w_##NAME PARAMS {                                                 \
        auto real_fn = real<CUresult(*) PARAMS>(drv::NAME);                                             \
        if (!real_fn) return CUDA_ERROR_NOT_INITIALIZED;                                               \
        before_first_use(api_id::NAME, KEY);                                                           \
        return retry_unguarded_if_oom(api_id::NAME, real_fn ARGS, [&] { return real_fn ARGS; });      \
    }
GPUMEM_OOM_RETRY_CALLS(GPUMEM_OOM_RETRY)
// Those that name a stream (GPUMEM_OOM_RETRY_STREAM_CALLS), watched as the launches are
// (note_launch): a _ptsz twin is a use of the per-thread default stream at every call, as the
// thunk it replaces was; a plain one when it names CU_STREAM_PER_THREAD.  The log names the plain
// call.
#define GPUMEM_OOM_RETRY_STREAM(NAME, API, PARAMS, ARGS, KEY, STREAM)                                 \
    extern "C" GPUMEM_HIDDEN CUresult w_##NAME PARAMS {                                                 \
        auto real_fn = real<CUresult(*) PARAMS>(drv::NAME);                                             \
        if (!real_fn) return CUDA_ERROR_NOT_INITIALIZED;                                               \
        note_launch<is_ptsz(#NAME)>(STREAM);                                                           \
        before_first_use(api_id::API, KEY);                                                            \
        return retry_unguarded_if_oom(api_id::API, real_fn ARGS, [&] { return real_fn ARGS; });       \
    }
GPUMEM_OOM_RETRY_STREAM_CALLS(GPUMEM_OOM_RETRY_STREAM)

// ---------------------------------------------------------------------------------------------
// Way (a): the exported symbols.  Each defers to its wrapper when way a is on, else calls the real one.
#define GPUMEM_EXPORT_HOOK(NAME, PARAMS, ARGS)                                   \
    GPUMEM_EXPORT CUresult NAME PARAMS {                                         \
        if (route_on(route_a)) return w_##NAME ARGS;                             \
        auto f = real<decltype(&w_##NAME)>(drv::NAME);                           \
        return f ? f ARGS : CUDA_ERROR_NOT_INITIALIZED;                          \
    }

GPUMEM_EXPORT_HOOK(cuMemAlloc_v2, (CUdeviceptr* a, size_t b), (a, b))
GPUMEM_EXPORT_HOOK(cuMemFree_v2, (CUdeviceptr a), (a))
GPUMEM_EXPORT_HOOK(cuMemAllocPitch_v2, (CUdeviceptr* a, size_t* b, size_t c, size_t d, unsigned int e), (a, b, c, d, e))
GPUMEM_EXPORT_HOOK(cuMemAllocManaged, (CUdeviceptr* a, size_t b, unsigned int c), (a, b, c))
GPUMEM_EXPORT_HOOK(cuMemAllocAsync, (CUdeviceptr* a, size_t b, CUstream c), (a, b, c))
GPUMEM_EXPORT_HOOK(cuMemAllocAsync_ptsz, (CUdeviceptr* a, size_t b, CUstream c), (a, b, c))
GPUMEM_EXPORT_HOOK(cuMemFreeAsync, (CUdeviceptr a, CUstream b), (a, b))
GPUMEM_EXPORT_HOOK(cuMemFreeAsync_ptsz, (CUdeviceptr a, CUstream b), (a, b))
GPUMEM_EXPORT_HOOK(cuMemAllocFromPoolAsync, (CUdeviceptr* a, size_t b, CUmemoryPool c, CUstream d), (a, b, c, d))
GPUMEM_EXPORT_HOOK(cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr* a, size_t b, CUmemoryPool c, CUstream d), (a, b, c, d))
GPUMEM_EXPORT_HOOK(cuMemPoolCreate, (CUmemoryPool* a, const CUmemPoolProps* b), (a, b))
GPUMEM_EXPORT_HOOK(cuMemPoolDestroy, (CUmemoryPool a), (a))
GPUMEM_EXPORT_HOOK(cuMemGetDefaultMemPool, (CUmemoryPool* a, CUmemLocation* b, CUmemAllocationType c), (a, b, c))
GPUMEM_EXPORT_HOOK(cuMemGetMemPool, (CUmemoryPool* a, CUmemLocation* b, CUmemAllocationType c), (a, b, c))
GPUMEM_EXPORT_HOOK(cuMemCreate, (CUmemGenericAllocationHandle* a, size_t b, const CUmemAllocationProp* c, unsigned long long d), (a, b, c, d))
GPUMEM_EXPORT_HOOK(cuMemRelease, (CUmemGenericAllocationHandle a), (a))
GPUMEM_EXPORT_HOOK(cuMemMap, (CUdeviceptr a, size_t b, size_t c, CUmemGenericAllocationHandle d, unsigned long long e), (a, b, c, d, e))
GPUMEM_EXPORT_HOOK(cuMemUnmap, (CUdeviceptr a, size_t b), (a, b))
GPUMEM_EXPORT_HOOK(cuMemAddressReserve, (CUdeviceptr* a, size_t b, size_t c, CUdeviceptr d, unsigned long long e), (a, b, c, d, e))
GPUMEM_EXPORT_HOOK(cuMemAddressFree, (CUdeviceptr a, size_t b), (a, b))
GPUMEM_EXPORT_HOOK(cuMemHostAlloc, (void** a, size_t b, unsigned int c), (a, b, c))
GPUMEM_EXPORT_HOOK(cuMemAllocHost_v2, (void** a, size_t b), (a, b))
GPUMEM_EXPORT_HOOK(cuMemFreeHost, (void* a), (a))
GPUMEM_EXPORT_HOOK(cuMemGetAddressRange_v2, (CUdeviceptr* a, size_t* b, CUdeviceptr c), (a, b, c))
GPUMEM_EXPORT_HOOK(cuMemGetInfo_v2, (size_t* a, size_t* b), (a, b))
#define GPUMEM_EXPORT_RETRY(NAME, PARAMS, ARGS, KEY) GPUMEM_EXPORT_HOOK(NAME, PARAMS, ARGS)
GPUMEM_OOM_RETRY_CALLS(GPUMEM_EXPORT_RETRY)
#define GPUMEM_EXPORT_RETRY_STREAM(NAME, API, PARAMS, ARGS, KEY, STREAM) GPUMEM_EXPORT_HOOK(NAME, PARAMS, ARGS)
GPUMEM_OOM_RETRY_STREAM_CALLS(GPUMEM_EXPORT_RETRY_STREAM)
GPUMEM_EXPORT_HOOK(cuPointerGetAttribute, (void* a, CUpointer_attribute b, CUdeviceptr c), (a, b, c))
GPUMEM_EXPORT_HOOK(cuPointerGetAttributes, (unsigned a, CUpointer_attribute* b, void** c, CUdeviceptr d), (a, b, c, d))
GPUMEM_EXPORT_HOOK(cuIpcGetMemHandle, (CUipcMemHandle* a, CUdeviceptr b), (a, b))
GPUMEM_EXPORT_HOOK(cuIpcOpenMemHandle_v2, (CUdeviceptr* a, CUipcMemHandle b, unsigned int c), (a, b, c))
GPUMEM_EXPORT_HOOK(cuIpcOpenMemHandle, (CUdeviceptr* a, CUipcMemHandle b, unsigned int c), (a, b, c))
GPUMEM_EXPORT_HOOK(cuIpcCloseMemHandle, (CUdeviceptr a), (a))
GPUMEM_EXPORT_HOOK(cuCtxEnablePeerAccess, (CUcontext a, unsigned int b), (a, b))
GPUMEM_EXPORT_HOOK(cuMemRetainAllocationHandle, (CUmemGenericAllocationHandle* a, void* b), (a, b))
GPUMEM_EXPORT_HOOK(cuCtxDestroy_v2, (CUcontext a), (a))
GPUMEM_EXPORT_HOOK(cuDevicePrimaryCtxReset_v2, (CUdevice a), (a))
GPUMEM_EXPORT_HOOK(cuCtxDestroy, (CUcontext a), (a))
GPUMEM_EXPORT_HOOK(cuDevicePrimaryCtxReset, (CUdevice a), (a))
GPUMEM_EXPORT_HOOK(cuDevicePrimaryCtxRelease_v2, (CUdevice a), (a))
GPUMEM_EXPORT_HOOK(cuDevicePrimaryCtxRelease, (CUdevice a), (a))
GPUMEM_EXPORT_HOOK(cuStreamBeginCapture_v2, (CUstream a, CUstreamCaptureMode b), (a, b))
GPUMEM_EXPORT_HOOK(cuStreamBeginCapture_v2_ptsz, (CUstream a, CUstreamCaptureMode b), (a, b))
GPUMEM_EXPORT_HOOK(cuStreamBeginCapture, (CUstream a), (a))
GPUMEM_EXPORT_HOOK(cuStreamBeginCapture_ptsz, (CUstream a), (a))
GPUMEM_EXPORT_HOOK(cuStreamBeginCaptureToGraph,
                   (CUstream a, CUgraph b, const CUgraphNode* c, const CUgraphEdgeData* d, size_t e, CUstreamCaptureMode m),
                   (a, b, c, d, e, m))
GPUMEM_EXPORT_HOOK(cuStreamBeginCaptureToGraph_ptsz,
                   (CUstream a, CUgraph b, const CUgraphNode* c, const CUgraphEdgeData* d, size_t e, CUstreamCaptureMode m),
                   (a, b, c, d, e, m))
GPUMEM_EXPORT_HOOK(cuStreamEndCapture, (CUstream a, CUgraph* b), (a, b))
GPUMEM_EXPORT_HOOK(cuStreamEndCapture_ptsz, (CUstream a, CUgraph* b), (a, b))
GPUMEM_EXPORT_HOOK(cuThreadExchangeStreamCaptureMode, (CUstreamCaptureMode * a), (a))
GPUMEM_EXPORT_HOOK(cuStreamCreate, (CUstream* a, unsigned int b), (a, b))
GPUMEM_EXPORT_HOOK(cuStreamCreateWithPriority, (CUstream* a, unsigned int b, int c), (a, b, c))
GPUMEM_EXPORT_HOOK(cuGreenCtxStreamCreate, (CUstream* a, CUgreenCtx b, unsigned int c, int d), (a, b, c, d))
GPUMEM_EXPORT_HOOK(cuGreenCtxCreate, (CUgreenCtx* a, CUdevResourceDesc b, CUdevice c, unsigned int d), (a, b, c, d))
GPUMEM_EXPORT_HOOK(cuCtxCreate, (CUcontext* a, unsigned int b, CUdevice c), (a, b, c))
GPUMEM_EXPORT_HOOK(cuCtxCreate_v2, (CUcontext* a, unsigned int b, CUdevice c), (a, b, c))
GPUMEM_EXPORT_HOOK(cuCtxCreate_v3, (CUcontext* a, CUexecAffinityParam* b, int c, unsigned int d, CUdevice e), (a, b, c, d, e))
GPUMEM_EXPORT_HOOK(cuCtxCreate_v4, (CUcontext* a, CUctxCreateParams* b, unsigned int c, CUdevice d), (a, b, c, d))
GPUMEM_EXPORT_HOOK(cuDevicePrimaryCtxRetain, (CUcontext* a, CUdevice b), (a, b))
GPUMEM_EXPORT_HOOK(cuGreenCtxDestroy, (CUgreenCtx a), (a))
GPUMEM_EXPORT_HOOK(cuLaunchKernel, (CUfunction a, unsigned int b, unsigned int c, unsigned int d, unsigned int e, unsigned int g, unsigned int h, unsigned int i, CUstream j, void** k, void** l), (a, b, c, d, e, g, h, i, j, k, l))
GPUMEM_EXPORT_HOOK(cuLaunchKernelEx, (const CUlaunchConfig* a, CUfunction b, void** c, void** d), (a, b, c, d))
GPUMEM_EXPORT_HOOK(cuLaunchKernel_ptsz, (CUfunction a, unsigned int b, unsigned int c, unsigned int d, unsigned int e, unsigned int g, unsigned int h, unsigned int i, CUstream j, void** k, void** l), (a, b, c, d, e, g, h, i, j, k, l))
GPUMEM_EXPORT_HOOK(cuLaunchKernelEx_ptsz, (const CUlaunchConfig* a, CUfunction b, void** c, void** d), (a, b, c, d))
GPUMEM_EXPORT_HOOK(cuStreamDestroy_v2, (CUstream a), (a))

// The table of every libcuda function gpumem wraps or calls.  Order and names come from
// GPUMEM_DRIVER_HOOKS, GPUMEM_OOM_RETRY_CALLS, GPUMEM_OOM_RETRY_STREAM_CALLS and
// GPUMEM_DRIVER_CALLS, as drv's.
driver_hook* driver_hooks() noexcept {
    static driver_hook table[] = {
#define GPUMEM_X(n) {#n, reinterpret_cast<void*>(&w_##n), {nullptr}, {false}},
        GPUMEM_DRIVER_HOOKS(GPUMEM_X)
        GPUMEM_OOM_RETRY_CALLS(GPUMEM_OOM_RETRY_NAME)
        GPUMEM_OOM_RETRY_STREAM_CALLS(GPUMEM_OOM_RETRY_STREAM_NAME)
#undef GPUMEM_X
#define GPUMEM_X(n) {#n, nullptr, {nullptr}, {false}},
        GPUMEM_DRIVER_CALLS(GPUMEM_X)
#undef GPUMEM_X
    };
    return table;
}

}  // namespace gpumem
