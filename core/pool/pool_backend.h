// The pool's only seam to a device: segments, virtual-memory chunks, synchronize, events and memory info.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gpumem {

// CUresult values the pool produces or interprets.  Plain ints so the pool needs no CUDA header;
// the values are the driver's (cuda.h) and must stay so.
inline constexpr int k_cuda_success = 0;
inline constexpr int k_cuda_invalid_value = 1;  // CUDA_ERROR_INVALID_VALUE
inline constexpr int k_cuda_oom = 2;            // CUDA_ERROR_OUT_OF_MEMORY
inline constexpr int k_cuda_deinitialized = 4;  // CUDA_ERROR_DEINITIALIZED
inline constexpr int k_cuda_not_supported = 801;  // CUDA_ERROR_NOT_SUPPORTED
inline constexpr int k_cuda_not_ready = 600;    // CUDA_ERROR_NOT_READY (an event not reached yet)

// A stream handle as the driver spells it; k_stream_legacy is CU_STREAM_LEGACY, the legacy default
// stream (every blocking stream of the context, per-thread default streams included, waits for it
// and it for them).
inline constexpr uint64_t k_stream_legacy = 0x1;

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
    // The same question again within one pool operation, after may_synchronize() said true: false
    // when a capture the backend sees without a driver call (the preload: one its hooks counted)
    // has opened since.  The pool asks may_synchronize() once per operation and this at every
    // later check of it.  By default, may_synchronize() again.
    virtual bool may_synchronize_again() noexcept { return may_synchronize(); }
    // cuMemGetInfo; both 0 if unknown.  Used for oom and stats events only.
    virtual void mem_info(uint64_t* free_b, uint64_t* total_b) noexcept = 0;

    // ---- Virtual memory (cuMemAddressReserve, cuMemCreate, cuMemMap).  Optional: a backend
    // without it keeps the defaults, and the pool then takes every segment from segment_alloc.
    // The size of one physical chunk (cuMemGetAllocationGranularity, minimum) when the device
    // supports virtual memory management (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED),
    // else 0.  Asked once per pool, at its first segment.
    virtual uint64_t vmm_granularity() noexcept { return 0; }
    // cuMemAddressReserve of `bytes` (a multiple of the granularity) aligned to the granularity:
    // address space only, no physical memory.  0 and *base set, or the driver's error.
    virtual int va_reserve(uint64_t bytes, uint64_t* base) noexcept {
        (void)bytes, (void)base;
        return k_cuda_not_supported;
    }
    // cuMemAddressFree of a whole reservation; every chunk in it is unmapped by then.
    virtual int va_free(uint64_t base, uint64_t bytes) noexcept {
        (void)base, (void)bytes;
        return k_cuda_not_supported;
    }
    // Backs [addr, addr + n * chunk) with n physical chunks: for each, cuMemCreate of `chunk`
    // bytes on the device and cuMemMap at its place; then cuMemSetAccess read/write for the
    // device over the range.  handles[i] receives chunk i's handle (never 0).  All or nothing:
    // on any error it unmaps and releases what it made and returns the error (2 when physical
    // memory ran out).
    virtual int map_chunks(uint64_t addr, uint64_t chunk, size_t n, uint64_t* handles) noexcept {
        (void)addr, (void)chunk, (void)n, (void)handles;
        return k_cuda_not_supported;
    }
    // cuMemUnmap and cuMemRelease of n chunks mapped by map_chunks at [addr, addr + n * chunk).
    // Unlike cuMemFree this does NOT wait for device work: the pool synchronizes first, and calls
    // it only when may_synchronize() is true.  Returns the first error, after trying every chunk.
    virtual int unmap_chunks(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept {
        (void)addr, (void)chunk, (void)n, (void)handles;
        return k_cuda_not_supported;
    }

    // ---- Moves (memory short: docs/pool.md, "When memory is short").  Optional: a backend that
    // keeps these defaults releases what the pool gives back and creates what it maps.
    // cuMemUnmap of n chunks mapped by map_chunks, keeping them allocated: map_kept maps them
    // elsewhere, release_kept gives them back.  The rules of unmap_chunks (no wait for device
    // work).  Returns the first error, after trying every chunk.
    virtual int unmap_keep(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept {
        (void)addr, (void)chunk, (void)n, (void)handles;
        return k_cuda_not_supported;
    }
    // cuMemMap of n kept chunks at [addr, addr + n * chunk), then cuMemSetAccess over the range as
    // map_chunks grants it.  All or nothing: on an error none is mapped and all stay kept.
    virtual int map_kept(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept {
        (void)addr, (void)chunk, (void)n, (void)handles;
        return k_cuda_not_supported;
    }
    // cuMemRelease of n kept chunks (or of chunks an unmap_keep that failed may have left mapped:
    // their memory goes when their mapping does).  Returns the first error.
    virtual int release_kept(uint64_t chunk, size_t n, const uint64_t* handles) noexcept {
        (void)chunk, (void)n, (void)handles;
        return k_cuda_not_supported;
    }

    // ---- Stitching (docs/pool.md, "Stitching").  Optional: a backend that keeps these defaults
    // never stitches.  Maps n chunks the pool made with map_chunks, still mapped where they were,
    // a second time at [addr, addr + n * chunk) of a reservation (cuMemMap of each handle, then one
    // cuMemSetAccess over the range, peers included).  All or nothing.
    virtual int map_alias(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept {
        (void)addr, (void)chunk, (void)n, (void)handles;
        return k_cuda_not_supported;
    }
    // cuMemUnmap of such a second mapping, without releasing the chunks (their first mapping keeps
    // them).  Does not wait for device work: the same rules as unmap_chunks.
    virtual int unmap_alias(uint64_t addr, uint64_t chunk, size_t n) noexcept {
        (void)addr, (void)chunk, (void)n;
        return k_cuda_not_supported;
    }

    // ---- Peer access.  cuCtxEnablePeerAccess makes a context's cuMemAlloc memory usable from
    // another device; cuMemCreate chunks need cuMemSetAccess for that device instead (PyTorch's
    // expandable segments do the same).  Optional: the defaults do nothing.
    // From now on map_chunks grants `device` read/write access too.
    virtual void add_peer(int device) noexcept { (void)device; }
    // The context ended (block_pool::drop_all), and its peer access with it: from now on
    // map_chunks grants no device but its own.  A context the driver makes with the same handle
    // (the registry rebinds the retired slot to it) has enabled none.
    virtual void forget_peers() noexcept {}
    // cuMemSetAccess read/write for `device` over [addr, addr + bytes), whole mapped chunks.
    virtual int set_peer_access(uint64_t addr, uint64_t bytes, int device) noexcept {
        (void)addr, (void)bytes, (void)device;
        return k_cuda_not_supported;
    }

    // ---- Events: the fences of safe reuse (docs/pool.md, "fences").  Optional: a backend that
    // keeps these defaults makes the pool release pending frees with synchronize(), as before.
    // Event handles are the driver's (never 0); the pool recycles them and destroys none.
    // cuEventCreate(CU_EVENT_DISABLE_TIMING) in the backend's context.
    virtual int event_create(uint64_t* ev) noexcept {
        (void)ev;
        return k_cuda_not_supported;
    }
    // cuEventRecord of ev on `stream` (a handle the program made in this context, or
    // k_stream_legacy).  Only called when may_synchronize() is true: a record into a capturing
    // stream would become a graph node instead of a fence.
    virtual int event_record(uint64_t ev, uint64_t stream) noexcept {
        (void)ev, (void)stream;
        return k_cuda_not_supported;
    }
    // cuEventQuery: 0 once all work before the record has finished, k_cuda_not_ready before; never
    // blocks.  Any other value is an error (the pool then falls back to synchronize()).
    virtual int event_query(uint64_t ev) noexcept {
        (void)ev;
        return k_cuda_not_supported;
    }
    // cuEventSynchronize: blocks until the event is reached.  Only when may_synchronize() is true.
    virtual int event_synchronize(uint64_t ev) noexcept {
        (void)ev;
        return k_cuda_not_supported;
    }
    // cuStreamQuery of a non-blocking stream the program made: 0 when all work enqueued on it has
    // finished, k_cuda_not_ready before; anything else means "ask with an event instead".  A fence
    // needs no event on an idle stream, and an event record costs several times a query: PyTorch
    // makes 32 streams per priority at its first side stream, most of them never used.  Only
    // called when may_synchronize() is true (a query of a capturing stream would break the capture).
    virtual int stream_query(uint64_t stream) noexcept {
        (void)stream;
        return k_cuda_not_supported;
    }
    // cuStreamWaitEvent: work enqueued on `stream` (a non-blocking stream the program made, or
    // k_stream_legacy) from now on starts only after ev's record is reached; the host does not
    // wait.  For GPUMEM_FENCE_WAIT=order (docs/pool.md).  Only when may_synchronize() is true (a
    // wait in a capturing stream would become a graph node on an event outside the graph).
    virtual int stream_wait_event(uint64_t stream, uint64_t ev) noexcept {
        (void)stream, (void)ev;
        return k_cuda_not_supported;
    }
};

}  // namespace gpumem
