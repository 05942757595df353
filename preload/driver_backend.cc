// The pool's device seam over the real CUDA driver: segments, VMM chunks, context syncs, events, capture checks, memory info.
#include "driver_backend.h"

#include "diag.h"

#include "gpumem_preload.h"

namespace gpumem {

namespace {

// Pinned memory on the backend's device; exportable as a file descriptor when `shareable`, the only
// way to share cuMemCreate memory with another process (legacy IPC cannot; docs/pool.md, "Sharing
// memory between processes").
// `rdma`: usable by GPUDirect RDMA (an InfiniBand card registering it), as cudaMalloc memory is
// where the device supports that for virtual memory.
CUmemAllocationProp chunk_prop(int device, bool shareable, bool rdma) noexcept {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    if (shareable) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    if (rdma) prop.allocFlags.gpuDirectRDMACapable = 1;
    return prop;
}

}  // namespace

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

// The captures gpumem's hooks counted: no driver call.
bool driver_backend::may_synchronize_again() noexcept { return !capture_active(); }

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

uint64_t driver_backend::vmm_granularity() noexcept {
    if (granularity_) return granularity_;
    auto get_attribute = GPUMEM_REAL(cuDeviceGetAttribute);
    auto granularity = GPUMEM_REAL(cuMemGetAllocationGranularity);
    // Every entry point the VMM path needs, or none of it: an old driver keeps cuMemAlloc segments.
    if (!get_attribute || !granularity || !GPUMEM_REAL(cuMemSetAccess) || !GPUMEM_REAL(cuMemCreate) ||
        !real_driver(drv::cuMemMap) ||
        !real_driver(drv::cuMemUnmap) || !real_driver(drv::cuMemRelease) || !real_driver(drv::cuMemAddressReserve) ||
        !real_driver(drv::cuMemAddressFree))
        return 0;
    int supported = 0;
    if (get_attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, CUdevice(device_)) !=
            CUDA_SUCCESS ||
        !supported)
        return 0;
    int fd_ok = 0;
    shareable_.store(get_attribute(&fd_ok, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                   CUdevice(device_)) == CUDA_SUCCESS &&
                     fd_ok);
    int rdma_ok = 0;
    rdma_ = get_attribute(&rdma_ok, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, CUdevice(device_)) ==
                CUDA_SUCCESS &&
            rdma_ok;
    const CUmemAllocationProp prop = chunk_prop(device_, shareable_.load(), rdma_);
    size_t g = 0;
    if (granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS) return 0;
    granularity_ = g;
    return g;
}

int driver_backend::va_reserve(uint64_t bytes, uint64_t* base) noexcept {
    auto f = GPUMEM_REAL(cuMemAddressReserve);
    if (!f || !granularity_) return CUDA_ERROR_NOT_SUPPORTED;
    CUdeviceptr p = 0;
    const int r = int(f(&p, size_t(bytes), size_t(granularity_), 0, 0));
    if (r == CUDA_SUCCESS) *base = uint64_t(p);
    return r;
}

int driver_backend::va_free(uint64_t base, uint64_t bytes) noexcept {
    auto f = GPUMEM_REAL(cuMemAddressFree);
    if (!f) return CUDA_ERROR_NOT_SUPPORTED;
    return int(f(CUdeviceptr(base), size_t(bytes)));
}

int driver_backend::map_chunks(uint64_t addr, uint64_t chunk, size_t n, uint64_t* handles) noexcept {
    auto create = GPUMEM_REAL(cuMemCreate);
    auto map = GPUMEM_REAL(cuMemMap);
    auto release = GPUMEM_REAL(cuMemRelease);
    if (!create || !map || !release) return CUDA_ERROR_NOT_SUPPORTED;
    CUmemAllocationProp prop = chunk_prop(device_, shareable_.load(std::memory_order_relaxed), rdma_);
    return in_context([&]() -> CUresult {
        size_t done = 0;
        CUresult r = CUDA_SUCCESS;
        for (; done < n; ++done) {
            CUmemGenericAllocationHandle h = 0;
            r = create(&h, size_t(chunk), &prop, 0);
            // A driver (or a container) that says it serves RDMA, or can export, but will not: try
            // without the RDMA flag, then without the handle type, then without both, and keep
            // the first that works for good.  Plain chunks serve the program; only RDMA on them
            // (or sharing them) is lost.  When none works, the error was not the flags': keep them.
            const bool had_rdma = prop.allocFlags.gpuDirectRDMACapable, had_type = prop.requestedHandleTypes != 0;
            for (int drop = 1; r != CUDA_SUCCESS && r != CUDA_ERROR_OUT_OF_MEMORY && drop <= 3; ++drop) {
                const bool no_rdma = drop & 1, no_type = drop & 2;
                if ((no_rdma && !had_rdma) || (no_type && !had_type)) continue;
                CUmemAllocationProp p2 = prop;
                if (no_rdma) p2.allocFlags.gpuDirectRDMACapable = 0;
                if (no_type) p2.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
                r = create(&h, size_t(chunk), &p2, 0);
                if (r != CUDA_SUCCESS) continue;
                prop = p2;
                if (no_rdma) rdma_ = false;
                if (no_type) shareable_.store(false, std::memory_order_relaxed);
            }
            if (r != CUDA_SUCCESS) break;
            r = map(CUdeviceptr(addr + done * chunk), size_t(chunk), 0, h, 0);
            if (r != CUDA_SUCCESS) {
                release(h);
                break;
            }
            handles[done] = uint64_t(h);
        }
        if (r == CUDA_SUCCESS && (r = grant_access(addr, n * chunk)) == CUDA_SUCCESS) return r;
        unmap_chunks(addr, chunk, done, handles);  // all or nothing
        return r;
    });
}

// Read/write access over a newly mapped range, in one call: this device, and every peer granted
// access so far.  The context is current (the caller's in_context).
CUresult driver_backend::grant_access(uint64_t addr, uint64_t bytes) noexcept {
    auto set_access = GPUMEM_REAL(cuMemSetAccess);
    if (!set_access) return CUDA_ERROR_NOT_SUPPORTED;
    CUmemAccessDesc access[1 + k_max_peers] = {};
    for (int i = 0; i <= n_peers_; ++i) access[i] = rw_access(i == 0 ? device_ : peers_[i - 1]);
    CUresult r = set_access(CUdeviceptr(addr), size_t(bytes), access, size_t(1 + n_peers_));
    if (r != CUDA_SUCCESS && n_peers_ > 0 && set_access(CUdeviceptr(addr), size_t(bytes), access, 1) == CUDA_SUCCESS) {
        // A peer the driver will not map these chunks for: the program's own device must
        // never lose memory over it.  Peers are dropped for chunks mapped from now on.
        GPUMEM_WARN("cuMemSetAccess refused a peer device ({}): new pool chunks of device {} are mapped "
                    "for it alone",
                    int(r), device_);
        n_peers_ = 0;
        r = CUDA_SUCCESS;
    }
    return r;
}

// Stitching: the chunks are the pool's own, already mapped once; a second cuMemMap of a handle is
// allowed and takes no memory.
int driver_backend::map_alias(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept {
    auto map = GPUMEM_REAL(cuMemMap);
    auto unmap = GPUMEM_REAL(cuMemUnmap);
    if (!map || !unmap) return CUDA_ERROR_NOT_SUPPORTED;
    return in_context([&]() -> CUresult {
        size_t done = 0;
        CUresult r = CUDA_SUCCESS;
        for (; done < n && r == CUDA_SUCCESS; ++done) {
            r = map(CUdeviceptr(addr + done * chunk), size_t(chunk), 0, CUmemGenericAllocationHandle(handles[done]), 0);
            if (r != CUDA_SUCCESS) break;
        }
        if (r == CUDA_SUCCESS && (r = grant_access(addr, n * chunk)) == CUDA_SUCCESS) return r;
        for (size_t i = 0; i < done; ++i) unmap(CUdeviceptr(addr + i * chunk), size_t(chunk));  // all or nothing
        return r;
    });
}

int driver_backend::unmap_alias(uint64_t addr, uint64_t chunk, size_t n) noexcept {
    auto unmap = GPUMEM_REAL(cuMemUnmap);
    if (!unmap) return CUDA_ERROR_NOT_SUPPORTED;
    int first = CUDA_SUCCESS;
    for (size_t i = 0; i < n; ++i) {  // one mapping per chunk, as in unmap_chunks
        CUresult r = unmap(CUdeviceptr(addr + i * chunk), size_t(chunk));
        if (r != CUDA_SUCCESS && first == CUDA_SUCCESS) first = int(r);
    }
    return first;
}

// Moves: the same driver calls as a stitch's (a kept chunk is a handle mapped nowhere), and a
// release apart.
int driver_backend::unmap_keep(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept {
    (void)handles;
    return unmap_alias(addr, chunk, n);
}

int driver_backend::map_kept(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept {
    return map_alias(addr, chunk, n, handles);
}

int driver_backend::release_kept(uint64_t chunk, size_t n, const uint64_t* handles) noexcept {
    (void)chunk;
    auto release = GPUMEM_REAL(cuMemRelease);
    if (!release) return CUDA_ERROR_NOT_SUPPORTED;
    int first = CUDA_SUCCESS;
    for (size_t i = 0; i < n; ++i) {
        const CUresult r = release(CUmemGenericAllocationHandle(handles[i]));
        if (r != CUDA_SUCCESS && first == CUDA_SUCCESS) first = int(r);
    }
    return first;
}

int driver_backend::unmap_chunks(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept {
    auto unmap = GPUMEM_REAL(cuMemUnmap);
    auto release = GPUMEM_REAL(cuMemRelease);
    if (!unmap || !release) return CUDA_ERROR_NOT_SUPPORTED;
    int first = CUDA_SUCCESS;
    for (size_t i = 0; i < n; ++i) {
        // One mapping per chunk: cuMemUnmap must name whole mappings.
        CUresult r = unmap(CUdeviceptr(addr + i * chunk), size_t(chunk));
        if (r == CUDA_SUCCESS) r = release(CUmemGenericAllocationHandle(handles[i]));
        if (r != CUDA_SUCCESS && first == CUDA_SUCCESS) first = int(r);
    }
    return first;
}

void driver_backend::add_peer(int device) noexcept {
    for (int i = 0; i < n_peers_; ++i)
        if (peers_[i] == device) return;
    if (device == device_) return;
    if (n_peers_ < k_max_peers) peers_[n_peers_++] = device;
    else GPUMEM_WARN("more than {} peer devices of device {}: chunks mapped from now on are not granted to device {}",
                     int(k_max_peers), device_, device);
}

int driver_backend::set_peer_access(uint64_t addr, uint64_t bytes, int device) noexcept {
    auto set_access = GPUMEM_REAL(cuMemSetAccess);
    if (!set_access) return CUDA_ERROR_NOT_SUPPORTED;
    const CUmemAccessDesc access = rw_access(device);
    return in_context([&] { return set_access(CUdeviceptr(addr), size_t(bytes), &access, 1); });
}

// Events for the fences.  Created in the pool's context; recorded on streams of that context.  The
// event functions work on any thread once the event exists (no context needed for query/sync).
int driver_backend::event_create(uint64_t* ev) noexcept {
    auto create = GPUMEM_REAL(cuEventCreate);
    if (!create) return CUDA_ERROR_NOT_SUPPORTED;
    CUevent e = nullptr;
    int r = in_context([&] { return create(&e, CU_EVENT_DISABLE_TIMING); });
    if (r == CUDA_SUCCESS) *ev = uint64_t(uintptr_t(e));
    return r;
}

int driver_backend::event_record(uint64_t ev, uint64_t stream) noexcept {
    auto record = GPUMEM_REAL(cuEventRecord);
    if (!record) return CUDA_ERROR_NOT_SUPPORTED;
    return in_context([&] { return record(CUevent(uintptr_t(ev)), CUstream(uintptr_t(stream))); });
}

int driver_backend::event_query(uint64_t ev) noexcept {
    auto query = GPUMEM_REAL(cuEventQuery);
    return query ? int(query(CUevent(uintptr_t(ev)))) : int(CUDA_ERROR_NOT_SUPPORTED);
}

int driver_backend::stream_query(uint64_t stream) noexcept {
    auto query = GPUMEM_REAL(cuStreamQuery);
    return query ? int(query(CUstream(uintptr_t(stream)))) : int(CUDA_ERROR_NOT_SUPPORTED);
}

int driver_backend::stream_wait_event(uint64_t stream, uint64_t ev) noexcept {
    auto wait = GPUMEM_REAL(cuStreamWaitEvent);
    if (!wait) return CUDA_ERROR_NOT_SUPPORTED;
    return in_context([&] { return wait(CUstream(uintptr_t(stream)), CUevent(uintptr_t(ev)), 0); });
}

int driver_backend::event_synchronize(uint64_t ev) noexcept {
    auto sync = GPUMEM_REAL(cuEventSynchronize);
    return sync ? int(sync(CUevent(uintptr_t(ev)))) : int(CUDA_ERROR_NOT_SUPPORTED);
}

}  // namespace gpumem
