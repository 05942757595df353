// The pool's device seam over the real CUDA driver: segments, context syncs, capture checks, memory info.
#include "driver_backend.h"

#include "gpumem_preload.h"

namespace gpumem {

namespace {

// libcuda functions the backend needs that gpumem does not wrap.  Looked up on first use (inside
// the program's first pooled allocation, so libcuda is loaded and initialised by then).
struct ctx_functions {
    CUresult (*get_current)(CUcontext*);
    CUresult (*push)(CUcontext);
    CUresult (*pop)(CUcontext*);
    CUresult (*synchronize)();
    CUresult (*mem_get_info)(size_t*, size_t*);
    CUresult (*is_capturing)(CUstream, CUstreamCaptureStatus*);
};

const ctx_functions& fns() noexcept {
    static const ctx_functions f = {
        reinterpret_cast<CUresult (*)(CUcontext*)>(real_driver_by_name("cuCtxGetCurrent")),
        reinterpret_cast<CUresult (*)(CUcontext)>(real_driver_by_name("cuCtxPushCurrent_v2")),
        reinterpret_cast<CUresult (*)(CUcontext*)>(real_driver_by_name("cuCtxPopCurrent_v2")),
        reinterpret_cast<CUresult (*)()>(real_driver_by_name("cuCtxSynchronize")),
        reinterpret_cast<CUresult (*)(size_t*, size_t*)>(real_driver_by_name("cuMemGetInfo_v2")),
        reinterpret_cast<CUresult (*)(CUstream, CUstreamCaptureStatus*)>(real_driver_by_name("cuStreamIsCapturing")),
    };
    return f;
}

}  // namespace

template <class F>
int driver_backend::in_context(F&& f) noexcept {
    const ctx_functions& d = fns();
    CUcontext want = context();
    CUcontext cur = nullptr;
    if (!d.get_current || d.get_current(&cur) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_CONTEXT;
    if (cur == want) return int(f());
    // Another context is current on this thread: borrow ours for the call and give it back, so
    // the program's own context stack is exactly as it was.
    if (!d.push || !d.pop) return CUDA_ERROR_INVALID_CONTEXT;
    CUresult r = d.push(want);
    if (r != CUDA_SUCCESS) return int(r);
    int rc = int(f());
    CUcontext popped = nullptr;
    d.pop(&popped);
    return rc;
}

int driver_backend::segment_alloc(uint64_t bytes, uint64_t* base) noexcept {
    auto alloc = real<CUresult (*)(CUdeviceptr*, size_t)>(drv::cuMemAlloc_v2);
    if (!alloc) return CUDA_ERROR_NOT_INITIALIZED;
    CUdeviceptr p = 0;
    int r = in_context([&] { return alloc(&p, size_t(bytes)); });
    if (r == CUDA_SUCCESS) *base = uint64_t(p);
    return r;
}

int driver_backend::segment_free(uint64_t base) noexcept {
    auto free_fn = real<CUresult (*)(CUdeviceptr)>(drv::cuMemFree_v2);
    if (!free_fn) return CUDA_ERROR_NOT_INITIALIZED;
    return in_context([&] { return free_fn(CUdeviceptr(base)); });
}

int driver_backend::synchronize() noexcept {
    const ctx_functions& d = fns();
    if (!d.synchronize) return CUDA_ERROR_NOT_INITIALIZED;
    return in_context([&] { return d.synchronize(); });
}

bool driver_backend::may_synchronize() noexcept {
    if (capture_active()) return false;
    // Second line of defence for captures begun by a route gpumem does not see: a capture on any
    // blocking stream makes a query of the legacy stream answer "implicit capture".  (Captures on
    // non-blocking streams only the counter above sees.)
    const ctx_functions& d = fns();
    if (!d.is_capturing) return true;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    int r = in_context([&] { return d.is_capturing(CU_STREAM_LEGACY, &st); });
    if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) return false;
    return r != CUDA_SUCCESS || st == CU_STREAM_CAPTURE_STATUS_NONE;
}

void driver_backend::mem_info(uint64_t* free_b, uint64_t* total_b) noexcept {
    *free_b = *total_b = 0;
    const ctx_functions& d = fns();
    if (!d.mem_get_info) return;
    size_t f = 0, t = 0;
    if (in_context([&] { return d.mem_get_info(&f, &t); }) == CUDA_SUCCESS) {
        *free_b = f;
        *total_b = t;
    }
}

}  // namespace gpumem
