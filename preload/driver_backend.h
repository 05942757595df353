// The pool's device seam over the real CUDA driver: one driver_backend per (device, context).
#pragma once

#include <cuda.h>
#undef cuGetProcAddress

#include <atomic>
#include <cstdint>

#include "core/pool/pool_backend.h"

namespace gpumem {

// True while a stream capture begun through a hooked cuStreamBeginCapture* is still open anywhere
// in the process (pool_hooks.cc counts them).  A process-wide count, because cuStreamIsCapturing
// needs the stream and the pool never knows which stream a later kernel used.
bool capture_active() noexcept;

// Read/write access for `device`, as cuMemSetAccess takes it: the pool's chunks, the peers granted
// them, and chunks an importer maps (ipc_share.cc).
inline CUmemAccessDesc rw_access(int device) noexcept {
    CUmemAccessDesc a{};
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = device;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return a;
}

// Every call goes straight to libcuda's own function (never through gpumem's wrappers, which
// would record the segment as a program allocation and ask the pool again), with the backend's
// context current: the pool may be driven from a thread whose current context differs (a late
// free never calls the backend, but an allocation's retry or a stats snapshot might).
class driver_backend final : public pool_backend {
  public:
    driver_backend(CUcontext ctx, int device) noexcept : ctx_(ctx), device_(device) {}

    int segment_alloc(uint64_t bytes, uint64_t* base) noexcept override;
    int segment_free(uint64_t base) noexcept override;
    int synchronize() noexcept override;
    bool may_synchronize() noexcept override;
    bool may_synchronize_again() noexcept override;
    void mem_info(uint64_t* free_b, uint64_t* total_b) noexcept override;
    uint64_t vmm_granularity() noexcept override;
    int va_reserve(uint64_t bytes, uint64_t* base) noexcept override;
    int va_free(uint64_t base, uint64_t bytes) noexcept override;
    int map_chunks(uint64_t addr, uint64_t chunk, size_t n, uint64_t* handles) noexcept override;
    int unmap_chunks(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept override;
    int map_alias(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept override;
    int unmap_alias(uint64_t addr, uint64_t chunk, size_t n) noexcept override;
    int unmap_keep(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept override;
    int map_kept(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept override;
    int release_kept(uint64_t chunk, size_t n, const uint64_t* handles) noexcept override;
    void add_peer(int device) noexcept override;
    void forget_peers() noexcept override { n_peers_ = 0; }
    int set_peer_access(uint64_t addr, uint64_t bytes, int device) noexcept override;
    int event_create(uint64_t* ev) noexcept override;
    int event_record(uint64_t ev, uint64_t stream) noexcept override;
    int event_query(uint64_t ev) noexcept override;
    int stream_query(uint64_t stream) noexcept override;
    int stream_wait_event(uint64_t stream, uint64_t ev) noexcept override;
    int event_synchronize(uint64_t ev) noexcept override;

    CUcontext context() const noexcept { return ctx_.load(std::memory_order_acquire); }
    // Chunks are made exportable (legacy IPC of pooled blocks works through ipc_share.cc).
    bool shareable() const noexcept { return shareable_.load(std::memory_order_relaxed); }
    int device() const noexcept { return device_; }
    // The context the pool works in: a context handle the driver reused for a new context of the
    // same device, or a destroyed green context's primary context, whose memory its pool holds
    // (pool_hooks.cc, primary_released_by).
    void set_context(CUcontext c) noexcept { ctx_.store(c, std::memory_order_release); }

  private:
    // Runs f() with ctx_ current on this thread, pushing and popping only when it is not already.
    template <class F>
    int in_context(F&& f) noexcept;
    // cuMemSetAccess read/write over a range just mapped, for device_ and its peers (current context).
    CUresult grant_access(uint64_t addr, uint64_t bytes) noexcept;

    std::atomic<CUcontext> ctx_;
    const int device_;
    uint64_t granularity_ = 0;  // vmm_granularity's answer (the pool asks once, under its lock)
    // Chunks are made exportable as POSIX file descriptors, so that a pooled block can be shared
    // with another process (ipc_share.cc): set where the device supports it, cleared for good the
    // first time the driver refuses such a chunk for any reason but memory.
    std::atomic<bool> shareable_{false};
    bool rdma_ = false;  // chunks flagged gpuDirectRDMACapable, as cudaMalloc memory is, where supported
    // Devices granted access to every chunk besides device_ (peer access enabled to this context).
    // Only touched under the pool's lock, as every backend call is.
    static constexpr int k_max_peers = 16;
    int peers_[k_max_peers] = {};
    int n_peers_ = 0;
};

}  // namespace gpumem
