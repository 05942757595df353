// The pool's device seam over the real CUDA driver: segments, context syncs, capture checks, memory info.
#include "driver_backend.h"

#include "gpumem_preload.h"

namespace gpumem {


template <class F>
int driver_backend::in_context(F&& f) noexcept {
    auto get_current = GPUMEM_REAL(cuCtxGetCurrent);
    CUcontext want = context();
    CUcontext cur = nullptr;
    if (!get_current || get_current(&cur) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_CONTEXT;
    if (cur == want) return int(f());
    // Another context is current on this thread: borrow ours for the call and give it back, so
    // the program's own context stack is exactly as it was.
    auto push = GPUMEM_REAL(cuCtxPushCurrent_v2);
    auto pop = GPUMEM_REAL(cuCtxPopCurrent_v2);
    if (!push || !pop) return CUDA_ERROR_INVALID_CONTEXT;
    CUresult r = push(want);
    if (r != CUDA_SUCCESS) return int(r);
    int rc = int(f());
    CUcontext popped = nullptr;
    pop(&popped);
    return rc;
}

int driver_backend::segment_alloc(uint64_t bytes, uint64_t* base) noexcept {
    auto alloc = GPUMEM_REAL(cuMemAlloc_v2);
    if (!alloc) return CUDA_ERROR_NOT_INITIALIZED;
    CUdeviceptr p = 0;
    int r = in_context([&] { return alloc(&p, size_t(bytes)); });
    if (r == CUDA_SUCCESS) *base = uint64_t(p);
    return r;
}

int driver_backend::segment_free(uint64_t base) noexcept {
    auto free_fn = GPUMEM_REAL(cuMemFree_v2);
    if (!free_fn) return CUDA_ERROR_NOT_INITIALIZED;
    return in_context([&] { return free_fn(CUdeviceptr(base)); });
}

int driver_backend::synchronize() noexcept {
    auto sync = GPUMEM_REAL(cuCtxSynchronize);
    if (!sync) return CUDA_ERROR_NOT_INITIALIZED;
    return in_context([&] { return sync(); });
}

bool driver_backend::may_synchronize() noexcept {
    if (capture_active()) return false;
    // Second line of defence for captures begun by a route gpumem does not see: a capture on any
    // blocking stream makes a query of the legacy stream answer "implicit capture".  (Captures on
    // non-blocking streams only the counter above sees.)
    auto is_capturing = GPUMEM_REAL(cuStreamIsCapturing);
    if (!is_capturing) return true;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    int r = in_context([&] { return is_capturing(CU_STREAM_LEGACY, &st); });
    if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) return false;
    return r != CUDA_SUCCESS || st == CU_STREAM_CAPTURE_STATUS_NONE;
}

void driver_backend::mem_info(uint64_t* free_b, uint64_t* total_b) noexcept {
    *free_b = *total_b = 0;
    auto mem_get_info = GPUMEM_REAL(cuMemGetInfo_v2);
    if (!mem_get_info) return;
    size_t f = 0, t = 0;
    if (in_context([&] { return mem_get_info(&f, &t); }) == CUDA_SUCCESS) {
        *free_b = f;
        *total_b = t;
    }
}

}  // namespace gpumem
