// A fake device for tests and benchmarks: made-up addresses, a capacity, injectable failures, counters.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "core/pool/pool_backend.h"

namespace gpumem {

// Addresses are handed out upwards from a fixed base and never reused, 2 MiB aligned with a
// 2 MiB gap between segments, so a test can tell any two segments apart and a stale address can
// never match a new one by accident.  With set_vmm(granularity) it also offers virtual memory:
// reservations take addresses the same way, and each mapped chunk counts against the capacity
// together with segment_alloc's bytes, as on a real device.  Thread-safe.
class fake_backend final : public pool_backend {
 public:
    static constexpr uint64_t k_base = 0x7f0000000000ull;

    explicit fake_backend(uint64_t capacity = 1ull << 40) noexcept : capacity_(capacity) {}

    int segment_alloc(uint64_t bytes, uint64_t* base) noexcept override;
    int segment_free(uint64_t base) noexcept override;
    int synchronize() noexcept override;
    bool may_synchronize() noexcept override { return !capturing_.load(); }
    void mem_info(uint64_t* free_b, uint64_t* total_b) noexcept override;
    uint64_t vmm_granularity() noexcept override { return granularity_.load(); }
    int va_reserve(uint64_t bytes, uint64_t* base) noexcept override;
    int va_free(uint64_t base, uint64_t bytes) noexcept override;
    int map_chunks(uint64_t addr, uint64_t chunk, size_t n, uint64_t* handles) noexcept override;
    int unmap_chunks(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept override;

    // Knobs.
    void set_capacity(uint64_t bytes) noexcept;
    // The next n segment_alloc / map_chunks calls fail (a map_chunks call fails at its last chunk,
    // after mapping the others, so its unwinding is exercised).
    void fail_next_allocs(int n, int code = k_cuda_oom) noexcept;
    void set_vmm(uint64_t granularity) noexcept { granularity_ = granularity; }  // 0: no VMM
    void set_capturing(bool on) noexcept { capturing_ = on; }      // may_synchronize() returns !on
    void set_sync_result(int code) noexcept { sync_result_ = code; }

    // Counters and state.
    uint64_t alloc_calls() const noexcept { return alloc_calls_; }
    uint64_t free_calls() const noexcept { return free_calls_; }
    uint64_t sync_calls() const noexcept { return sync_calls_; }
    // Misuse by the pool: free of an unknown base, sync or unmap during a capture, a map outside
    // a reservation or over a mapped chunk, an unmap of the wrong handle, freeing a reservation
    // that still has mapped chunks.
    uint64_t bad_calls() const noexcept { return bad_calls_; }
    uint64_t map_calls() const noexcept { return map_calls_; }
    uint64_t unmap_calls() const noexcept { return unmap_calls_; }
    uint64_t mapped_chunks() const noexcept;   // chunks mapped now
    uint64_t reservations() const noexcept;    // reservations held now
    uint64_t in_use() const noexcept;
    uint64_t live_segments() const noexcept;
    bool is_live(uint64_t base) const noexcept;

 private:
    mutable std::mutex mu_;
    std::map<uint64_t, uint64_t> live_;  // base -> bytes
    std::map<uint64_t, uint64_t> reserved_;  // VA reservations: base -> bytes
    std::map<uint64_t, uint64_t> chunks_;    // mapped chunks: address -> handle
    std::map<uint64_t, uint64_t> chunk_size_;  // handle -> bytes
    uint64_t next_handle_ = 1;
    std::atomic<uint64_t> granularity_{0};
    uint64_t capacity_;
    uint64_t in_use_ = 0;
    uint64_t next_ = k_base;
    int fail_n_ = 0, fail_code_ = k_cuda_oom;
    std::atomic<bool> capturing_{false};
    std::atomic<int> sync_result_{k_cuda_success};
    std::atomic<uint64_t> alloc_calls_{0}, free_calls_{0}, sync_calls_{0}, bad_calls_{0};
    std::atomic<uint64_t> map_calls_{0}, unmap_calls_{0};

    bool in_reservation(uint64_t addr, uint64_t bytes) const noexcept;  // mu_ held
    void unmap_one(uint64_t addr) noexcept;                              // mu_ held
};

}  // namespace gpumem
