// Shared by the preload's files: the driver-function table, the recorder's process state, and the guards.
//
// The hook layer is thin: each wrapper finds its real function here, asks the state whether to
// record, and forwards the facts to the core (recorder / pool).  Nothing here may throw.
#pragma once

#include <cuda.h>
#undef cuGetProcAddress  // cuda.h renames it to cuGetProcAddress_v2; we define both ABIs
#undef cuStreamBeginCapture  // likewise (to _v2); the first ABI, without a mode, is wrapped too
#undef cuStreamBeginCapture_ptsz
#undef cuCtxDestroy  // the first ABIs of a context's end: a static cudart 13's cudaDeviceReset
#undef cuDevicePrimaryCtxReset  // calls cuDevicePrimaryCtxReset, not its _v2 (H200 run 112)
#undef cuDevicePrimaryCtxRelease  // and a primary context's last release ends it too
#undef cuCtxCreate  // cuda.h 13 renames it to _v4; every ABI of a context's creation is wrapped
#undef cuIpcOpenMemHandle  // renamed to _v2; the first ABI (same prototype) is wrapped too
extern "C" CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream);
extern "C" CUresult CUDAAPI cuStreamBeginCapture_ptsz(CUstream hStream);
extern "C" CUresult CUDAAPI cuCtxDestroy(CUcontext ctx);
extern "C" CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev);
extern "C" CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev);
extern "C" CUresult CUDAAPI cuCtxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev);
extern "C" CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int flags);
extern "C" CUresult CUDAAPI cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev);
extern "C" CUresult CUDAAPI cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* params, int n, unsigned int flags,
                                           CUdevice dev);

#include <atomic>
#include <cstdint>

#include "event_schema.h"
#include "recorder.h"

#define GPUMEM_EXPORT extern "C" __attribute__((visibility("default")))
#define GPUMEM_HIDDEN __attribute__((visibility("hidden")))

namespace gpumem {

// Every driver entry point gpumem wraps.  X(name): the exported symbol `name` in libgpumem.so, the
// hidden wrapper `w_name`, and a table slot that holds the real libcuda function.
#define GPUMEM_DRIVER_HOOKS(X)                                                          \
    X(cuMemAlloc_v2) X(cuMemFree_v2) X(cuMemAllocPitch_v2) X(cuMemAllocManaged)         \
    X(cuMemAllocAsync) X(cuMemAllocAsync_ptsz) X(cuMemFreeAsync) X(cuMemFreeAsync_ptsz) \
    X(cuMemAllocFromPoolAsync) X(cuMemAllocFromPoolAsync_ptsz) X(cuMemPoolCreate) X(cuMemPoolDestroy) \
    X(cuMemGetDefaultMemPool) X(cuMemGetMemPool)                                        \
    X(cuMemCreate) X(cuMemRelease) X(cuMemMap) X(cuMemUnmap) X(cuMemAddressReserve)     \
    X(cuMemAddressFree) X(cuMemHostAlloc) X(cuMemAllocHost_v2) X(cuMemFreeHost)         \
    X(cuMemGetAddressRange_v2) X(cuPointerGetAttribute) X(cuPointerGetAttributes)       \
    X(cuMemGetInfo_v2)                                                                  \
    X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle_v2) X(cuIpcOpenMemHandle) X(cuIpcCloseMemHandle) \
    X(cuCtxEnablePeerAccess) X(cuMemRetainAllocationHandle)                             \
    X(cuCtxDestroy_v2) X(cuDevicePrimaryCtxReset_v2) X(cuCtxDestroy) X(cuDevicePrimaryCtxReset) \
    X(cuDevicePrimaryCtxRelease_v2) X(cuDevicePrimaryCtxRelease)                        \
    X(cuStreamBeginCapture_v2) X(cuStreamBeginCapture_v2_ptsz) X(cuStreamEndCapture)    \
    X(cuStreamBeginCapture) X(cuStreamBeginCapture_ptsz)                                \
    X(cuStreamBeginCaptureToGraph) X(cuStreamBeginCaptureToGraph_ptsz)                  \
    X(cuStreamEndCapture_ptsz) X(cuThreadExchangeStreamCaptureMode)                     \
    X(cuStreamCreate) X(cuStreamCreateWithPriority)                                     \
    X(cuGreenCtxStreamCreate) X(cuGreenCtxCreate) X(cuLaunchKernel) X(cuLaunchKernelEx)     \
    X(cuCtxCreate) X(cuCtxCreate_v2) X(cuCtxCreate_v3) X(cuCtxCreate_v4) X(cuDevicePrimaryCtxRetain) \
    X(cuGreenCtxDestroy)                                                                \
    X(cuLaunchKernel_ptsz) X(cuLaunchKernelEx_ptsz)                                     \
    X(cuStreamDestroy_v2) X(cuGetProcAddress) X(cuGetProcAddress_v2)

// Calls that may need device memory of their own, wrapped too (after GPUMEM_DRIVER_HOOKS in the
// table): made again after the pools give back (hooks_driver.cc, GPUMEM_OOM_RETRY; those that name
// a stream below, GPUMEM_OOM_RETRY_STREAM_CALLS).
// X(name, (params), (args), key): key is the handle whose first use makes headroom, nullptr for none
// (a use_key when a name or a device other than the current context's is part of it).
#define GPUMEM_OOM_RETRY_CALLS(X) \
    X(cuModuleLoad, (CUmodule* a, const char* b), (a, b), nullptr) \
    X(cuModuleLoadData, (CUmodule* a, const void* b), (a, b), nullptr) \
    X(cuModuleLoadDataEx, (CUmodule* a, const void* b, unsigned int c, CUjit_option* d, void** e), (a, b, c, d, e), nullptr) \
    X(cuModuleLoadFatBinary, (CUmodule* a, const void* b), (a, b), nullptr) \
    X(cuLibraryLoadData, (CUlibrary* a, const void* b, CUjit_option* c, void** d, unsigned int e, CUlibraryOption* o, void** p, unsigned int q), (a, b, c, d, e, o, p, q), nullptr) \
    X(cuLibraryLoadFromFile, (CUlibrary* a, const char* b, CUjit_option* c, void** d, unsigned int e, CUlibraryOption* o, void** p, unsigned int q), (a, b, c, d, e, o, p, q), nullptr) \
    X(cuModuleGetFunction, (CUfunction* a, CUmodule b, const char* c), (a, b, c), use_key(b, c)) \
    X(cuModuleGetGlobal_v2, (CUdeviceptr* a, size_t* b, CUmodule c, const char* d), (a, b, c, d), use_key(c, d)) \
    X(cuLibraryGetKernel, (CUkernel* a, CUlibrary b, const char* c), (a, b, c), use_key(b, c)) \
    X(cuLibraryGetModule, (CUmodule* a, CUlibrary b), (a, b), b) \
    X(cuLibraryGetGlobal, (CUdeviceptr* a, size_t* b, CUlibrary c, const char* d), (a, b, c, d), use_key(c, d)) \
    X(cuKernelGetFunction, (CUfunction* a, CUkernel b), (a, b), b) \
    X(cuFuncGetAttribute, (int* a, CUfunction_attribute b, CUfunction c), (a, b, c), c) \
    X(cuFuncSetAttribute, (CUfunction a, CUfunction_attribute b, int c), (a, b, c), a) \
    X(cuFuncSetCacheConfig, (CUfunction a, CUfunc_cache b), (a, b), a) \
    X(cuKernelGetAttribute, (int* a, CUfunction_attribute b, CUkernel c, CUdevice d), (a, b, c, d), use_key(c, nullptr, d)) \
    X(cuKernelSetAttribute, (CUfunction_attribute a, int b, CUkernel c, CUdevice d), (a, b, c, d), use_key(c, nullptr, d)) \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor, (int* a, CUfunction b, int c, size_t d), (a, b, c, d), b) \
    X(cuGraphInstantiateWithFlags, (CUgraphExec* a, CUgraph b, unsigned long long c), (a, b, c), b) \
    X(cuArrayCreate_v2, (CUarray* a, const CUDA_ARRAY_DESCRIPTOR* b), (a, b), nullptr) \
    X(cuArray3DCreate_v2, (CUarray* a, const CUDA_ARRAY3D_DESCRIPTOR* b), (a, b), nullptr) \
    X(cuMipmappedArrayCreate, (CUmipmappedArray* a, const CUDA_ARRAY3D_DESCRIPTOR* b, unsigned int c), (a, b, c), nullptr) \
    X(cuCtxSetLimit, (CUlimit a, size_t b), (a, b), nullptr)
#define GPUMEM_OOM_RETRY_NAME(NAME, PARAMS, ARGS, KEY) GPUMEM_X(NAME)

// The same for the calls that name a stream, each with its per-thread twin (cuda.h's
// __CUDA_API_PTSZ: what a program built with --default-stream per-thread calls, and what
// cuGetProcAddress hands out under CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM).
// X(name, api logged (the plain call's), (params), (args), key, the stream it names).
#define GPUMEM_OOM_RETRY_STREAM_CALLS(X) \
    X(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel, (CUfunction a, unsigned int b, unsigned int c, unsigned int d, unsigned int e, unsigned int o, unsigned int p, unsigned int q, CUstream i, void** j), (a, b, c, d, e, o, p, q, i, j), a, i) \
    X(cuLaunchCooperativeKernel_ptsz, cuLaunchCooperativeKernel, (CUfunction a, unsigned int b, unsigned int c, unsigned int d, unsigned int e, unsigned int o, unsigned int p, unsigned int q, CUstream i, void** j), (a, b, c, d, e, o, p, q, i, j), a, i) \
    X(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams, (CUgraphExec* a, CUgraph b, CUDA_GRAPH_INSTANTIATE_PARAMS* c), (a, b, c), b, c ? c->hUploadStream : nullptr) \
    X(cuGraphInstantiateWithParams_ptsz, cuGraphInstantiateWithParams, (CUgraphExec* a, CUgraph b, CUDA_GRAPH_INSTANTIATE_PARAMS* c), (a, b, c), b, c ? c->hUploadStream : nullptr) \
    X(cuGraphUpload, cuGraphUpload, (CUgraphExec a, CUstream b), (a, b), a, b) \
    X(cuGraphUpload_ptsz, cuGraphUpload, (CUgraphExec a, CUstream b), (a, b), a, b) \
    X(cuGraphLaunch, cuGraphLaunch, (CUgraphExec a, CUstream b), (a, b), a, b) \
    X(cuGraphLaunch_ptsz, cuGraphLaunch, (CUgraphExec a, CUstream b), (a, b), a, b)
#define GPUMEM_OOM_RETRY_STREAM_NAME(NAME, API, PARAMS, ARGS, KEY, STREAM) GPUMEM_X(NAME)

// Every other libcuda function gpumem itself calls (pool backend, contexts, device facts).  Not
// wrapped: the program's calls to them go straight to the driver.  One table with the hooks
// above, so every libcuda entry point the library calls is found and cached in one place.
#define GPUMEM_DRIVER_CALLS(X)                                                           \
    X(cuCtxGetCurrent) X(cuCtxGetDevice) X(cuCtxPushCurrent_v2) X(cuCtxPopCurrent_v2)   \
    X(cuCtxSynchronize) X(cuStreamIsCapturing) X(cuStreamGetDevice)                     \
    X(cuDevicePrimaryCtxGetState) X(cuCtxFromGreenCtx)                                  \
    X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceTotalMem_v2)          \
    X(cuDeviceGetAttribute) X(cuMemGetAllocationGranularity) X(cuMemSetAccess)          \
    X(cuEventCreate) X(cuEventRecord) X(cuEventQuery) X(cuEventSynchronize) X(cuStreamQuery) X(cuStreamWaitEvent) \
    X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle)

enum class drv : int {
#define GPUMEM_X(n) n,
    GPUMEM_DRIVER_HOOKS(GPUMEM_X)
    GPUMEM_OOM_RETRY_CALLS(GPUMEM_OOM_RETRY_NAME)
    GPUMEM_OOM_RETRY_STREAM_CALLS(GPUMEM_OOM_RETRY_STREAM_NAME)
    GPUMEM_DRIVER_CALLS(GPUMEM_X)
#undef GPUMEM_X
    count_
};

struct driver_hook {
    const char* name;
    void* wrapper;              // the hidden w_ function handed out by dlsym / cuGetProcAddress;
                                // nullptr for GPUMEM_DRIVER_CALLS (called, never wrapped)
    std::atomic<void*> real;    // libcuda's function; resolved lazily, on first use
    std::atomic<bool> looked_up;
};
driver_hook* driver_hooks() noexcept;  // array of drv::count_

// The real libcuda function, or nullptr when libcuda is not loaded / lacks it.  Resolved on first
// use (never from a constructor or from dlsym), then cached.
void* real_driver(drv d) noexcept;
template <class F>
F real(drv d) noexcept { return reinterpret_cast<F>(real_driver(d)); }
// The same, typed by cuda.h's declaration: GPUMEM_REAL(cuCtxSynchronize)().
#define GPUMEM_REAL(name) (reinterpret_cast<decltype(&::name)>(::gpumem::real_driver(::gpumem::drv::name)))

// A libcuda symbol by name, uncached: only for names known at run time (a _ptsz variant asked for
// through dlsym); every function gpumem calls itself is in the table above.
void* real_driver_by_name(const char* name) noexcept;

// glibc's own dlsym (ours overrides the public one).
void* real_dlsym(void* handle, const char* name) noexcept;

// Which ways in substitute wrappers (GPUMEM_ROUTES, default "a,b,c,d"): a = exported symbols,
// b = dlsym, c = cuGetProcAddress, d = cudaGetDriverEntryPoint*.
enum route : unsigned { route_a = 1, route_b = 2, route_c = 4, route_d = 8 };
bool route_on(route r) noexcept;

// Maps a driver function pointer returned by a real resolver to gpumem's wrapper for it.
// `symbol` is the name the program asked for (used only to count pointers we could not wrap).
// `per_thread_lookup`: the resolver was asked for per-thread variants, so an unwrapped pointer
// may be one, to be watched (per_thread.cc).
void* wrap_resolved(void* real_fn, const char* symbol, bool per_thread_lookup = false) noexcept;

// per_thread.cc: per-thread default stream use switches auto pools to safe reuse.
void note_per_thread_stream() noexcept;
bool is_per_thread_symbol(const char* name) noexcept;
// fn itself, or a thunk that notes the first call, if fn is one of libcuda's per-thread variants;
// *handled says whether it is one (watched, or seen already), so the caller need not wrap it.
void* watch_per_thread(void* fn, bool* handled) noexcept;
uint64_t unmatched_count() noexcept;

// Process state.  recorder_or_null() starts the log on first use (lazily: no CUDA before the
// program's own first allocation call) and returns nullptr when recording is impossible.  A call
// that finds another thread's start stuck (over 1 s) returns nullptr too, and counts one event
// lost unless `count_if_unrecorded` is false: pool_alloc passes false, since the hook that asked
// records the call (or counts it) after the driver's answer.
recorder* recorder_or_null(bool count_if_unrecorded = true) noexcept;
// The recorder for a call made while this thread is inside a hook (a signal handler's): never
// starts the log nor waits for a start, neither of which is async-signal-safe.  nullptr before the
// log starts and while a start is under way, the call then counted lost (added to the log's `lost`
// when the start ends).  Async-signal-safe.
recorder* recorder_if_recording() noexcept;
int current_device() noexcept;
// The device of the green context whose own CUcontext is c (made through a hook, destroyed or
// not), else -1 (hooks_driver.cc).
int green_context_device(CUcontext c) noexcept;
// Whether c is the own CUcontext of a green context that was destroyed (its cuGreenCtxDestroy
// under way or done, through a hook), and no context made since has its handle (hooks_driver.cc).
bool green_context_destroyed(CUcontext c) noexcept;

// Re-entrancy guard: set while gpumem's own code runs.  A hooked call made while it is set comes
// from other code on this thread (a signal handler, a driver's callback: gpumem calls libcuda's
// definitions, never a hook) and skips the pool, the runtime's scope and the log's start, none of
// which is async-signal-safe; what it allocates or frees is still logged (hooks_driver.cc).
struct guard {
    static thread_local int depth;
    guard() noexcept { ++depth; }
    ~guard() { --depth; }
    static bool active() noexcept { return depth > 0; }
};

// Set by a runtime wrapper (cudaMalloc, …) around its real call, so the driver call the runtime
// makes underneath is recorded once, under the runtime's name.
struct runtime_scope {
    api_id api;
    bool is_free;
    uint64_t size;   // alloc: bytes asked for
    uint64_t ptr;    // free: the pointer
    bool recorded = false;
    bool passed = false;  // free: a pooled block the driver hook passed to the driver (in a capture)
    runtime_scope* prev;
    static thread_local runtime_scope* top;
    runtime_scope(api_id a, bool f, uint64_t s, uint64_t p) noexcept : api(a), is_free(f), size(s), ptr(p), prev(top) {
        top = this;
    }
    ~runtime_scope() { top = prev; }
    // The scope a driver alloc of `bytes` / free of `p` belongs to, if any.
    static runtime_scope* for_alloc(uint64_t bytes) noexcept {
        runtime_scope* s = top;
        return s && !s->is_free && !s->recorded && s->size == bytes ? s : nullptr;
    }
    static runtime_scope* for_free(uint64_t p) noexcept {
        runtime_scope* s = top;
        return s && s->is_free && !s->recorded && s->ptr == p ? s : nullptr;
    }
};

// Shared by the wrappers: the call_info for an api, and one allocation record (success or failure).
call_info make_call(api_id api, int dev) noexcept;
// dev: the device the memory is on, where the call names it (a stream's, a memory pool's);
// k_current_device: the current context's (host memory: none).
constexpr int k_current_device = -1;
void record_alloc(api_id api, mem_kind kind, int err, uint64_t ptr, uint64_t size, uint64_t asize,
                  bool has_stream, uint64_t stream, uint64_t mempool, int dev = k_current_device) noexcept;
// The device a stream-ordered allocation on stream s draws from: the stream's (cuStreamGetDevice,
// CUDA 12.8), else k_current_device.
int device_of_stream(void* s) noexcept;
// The real function of a shared libcudart (RTLD_NEXT, else any loaded libcudart*).
void* real_runtime(const char* name) noexcept;
// The real function for a call of our export `name` (a string literal: the key) returning to
// `caller` (__builtin_return_address(0) in the export): the runtime the caller's object would have
// bound to without gpumem, else real_runtime's answer.  resolve.cc says why.
void* real_runtime_for(const char* name, const void* caller) noexcept;

// The pool seam: the driver wrappers ask it first; it answers false to pass through.
bool pool_alloc(api_id api, uint64_t bytes, uint64_t* ptr, int* result) noexcept;
bool pool_free(api_id api, uint64_t ptr, int* result) noexcept;
bool pool_owns(uint64_t ptr) noexcept;
// The "ctx" of an allocation outside the pools, made now on `dev` in the current context: the
// number of that context's pool where it has one on dev, else 0 (docs/log-format.md).  No driver
// call without a pool.
uint8_t pool_ctx_here(int dev) noexcept;
// A free that cannot reach the pool now: this thread is inside gpumem (a hook's guard, so a signal
// handler's free or a driver callback's).  True, with *result = 0, when ptr lies in a pool's
// segment: the driver never allocated it, so the free waits for the next pool call (docs/pool.md,
// Lifecycle).  False: the driver's.  Async-signal-safe.
bool pool_free_from_inside(api_id api, uint64_t ptr, int* result) noexcept;
// The log ends (a signal, _exit, exec): frees still waiting for a pool call are counted lost.
// Async-signal-safe.
void pool_frees_left_lost() noexcept;
// A call the pools do not serve ran out of memory: every pool of `device` (-1: of the current
// context's device; -2: of every device) gives back the memory it holds free (block_pool::give_back).
// Returns the bytes given back, 0 when none was (then a retry would fail the same way).
uint64_t pool_give_back(api_id api, int device) noexcept;
// What pool_give_back could return now (block_pool::giveable_bytes), without a driver call and
// without waiting; 0 during a stream capture.
uint64_t pool_giveable(int device) noexcept;
// Headroom for the driver (block_pool::make_headroom): whether any pool found the driver short of
// its headroom, in one load; and, before the first use of a function or kernel on a device while
// one is, that device's pools (-1: the current context's device) make room.  The launch hooks call
// before_first_use; it filters on a table of handles seen while short (hooks_driver.cc).
bool pool_headroom_short() noexcept;
uint64_t pool_make_headroom(api_id api, int device = -1) noexcept;
// Whether an open stream capture may make the driver refuse this thread's cuMemAlloc/cuMemFree
// (core/pool/capture_table.h).  The pool does not serve such calls: the driver answers.
bool capture_may_refuse() noexcept;
// The program created a stream (api says how).  GPUMEM_REUSE=auto pools switch to safe reuse at the
// first non-blocking stream or the second blocking one (docs/pool.md).
void pool_stream_created(api_id api, bool non_blocking) noexcept;
// The fences' view of streams (pool_hooks.cc): a stream made in the current context, one destroyed,
// and a green context (whose work no fence of the primary context's pool covers).
void pool_stream_made(CUstream s, bool non_blocking) noexcept;
bool pool_stream_destroyed(CUstream s) noexcept;  // true: the stream was in the pool's set
// cuStreamDestroy refused a stream that left the set: fences give way to synchronizes from now on.
void pool_stream_destroy_refused() noexcept;
void pool_green_context_made() noexcept;
// A resolved pointer of a stream-making, -destroying or launching function could not be wrapped:
// streams may come and go unseen, so fences give way to synchronizes and auto switches to safe.
void pool_stream_route_unseen() noexcept;

}  // namespace gpumem
