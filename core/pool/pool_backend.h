// The pool's only seam to a device: segment allocation, free, synchronize and memory info.
#pragma once

#include <cstdint>

namespace gpumem {

// CUresult values the pool produces or interprets.  Plain ints so the pool needs no CUDA header;
// the values are the driver's (cuda.h) and must stay so.
inline constexpr int k_cuda_success = 0;
inline constexpr int k_cuda_invalid_value = 1;  // CUDA_ERROR_INVALID_VALUE
inline constexpr int k_cuda_oom = 2;            // CUDA_ERROR_OUT_OF_MEMORY
inline constexpr int k_cuda_deinitialized = 4;  // CUDA_ERROR_DEINITIALIZED

// One device+context's access to real memory.  The preload implements it with the real driver
// (with the context made current around each call), fake_backend with made-up addresses.
// Contract: every function may be called with the pool's lock held, from any thread that calls
// the pool; none may call back into the pool.
struct pool_backend {
    virtual ~pool_backend() = default;
    // cuMemAlloc of a whole segment.  Returns a CUresult: 0 and *base set, or 2 on OOM, or any
    // other driver error (which the pool returns to the program unchanged).
    virtual int segment_alloc(uint64_t bytes, uint64_t* base) noexcept = 0;
    // cuMemFree of a segment base the pool got from segment_alloc.  Only called when
    // may_synchronize() is true: a real cuMemFree synchronizes, which a stream capture forbids.
    virtual int segment_free(uint64_t base) noexcept = 0;
    // Waits for all work on the context (cuCtxSynchronize).  0 on success.
    virtual int synchronize() noexcept = 0;
    // False while a stream capture is active on the context: the pool then never synchronizes
    // and never frees a segment.
    virtual bool may_synchronize() noexcept = 0;
    // cuMemGetInfo; both 0 if unknown.  Used for oom and stats events only.
    virtual void mem_info(uint64_t* free_b, uint64_t* total_b) noexcept = 0;
};

}  // namespace gpumem
