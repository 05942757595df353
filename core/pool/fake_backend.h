// A fake device for tests and benchmarks: made-up addresses, a capacity, injectable failures, counters.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>

#include "core/pool/pool_backend.h"

namespace gpumem {

// Addresses are handed out upwards from a fixed base and never reused, 2 MiB aligned with a
// 2 MiB gap between segments, so a test can tell any two segments apart and a stale address can
// never match a new one by accident.  Thread-safe.
class fake_backend final : public pool_backend {
 public:
    static constexpr uint64_t k_base = 0x7f0000000000ull;

    explicit fake_backend(uint64_t capacity = 1ull << 40) noexcept : capacity_(capacity) {}

    int segment_alloc(uint64_t bytes, uint64_t* base) noexcept override;
    int segment_free(uint64_t base) noexcept override;
    int synchronize() noexcept override;
    bool may_synchronize() noexcept override { return !capturing_.load(); }
    void mem_info(uint64_t* free_b, uint64_t* total_b) noexcept override;

    // Knobs.
    void set_capacity(uint64_t bytes) noexcept;
    void fail_next_allocs(int n, int code = k_cuda_oom) noexcept;  // the next n segment_alloc calls fail
    void set_capturing(bool on) noexcept { capturing_ = on; }      // may_synchronize() returns !on
    void set_sync_result(int code) noexcept { sync_result_ = code; }

    // Counters and state.
    uint64_t alloc_calls() const noexcept { return alloc_calls_; }
    uint64_t free_calls() const noexcept { return free_calls_; }
    uint64_t sync_calls() const noexcept { return sync_calls_; }
    uint64_t bad_calls() const noexcept { return bad_calls_; }  // free of an unknown base, sync during capture
    uint64_t in_use() const noexcept;
    uint64_t live_segments() const noexcept;
    bool is_live(uint64_t base) const noexcept;

 private:
    mutable std::mutex mu_;
    std::map<uint64_t, uint64_t> live_;  // base -> bytes
    uint64_t capacity_;
    uint64_t in_use_ = 0;
    uint64_t next_ = k_base;
    int fail_n_ = 0, fail_code_ = k_cuda_oom;
    std::atomic<bool> capturing_{false};
    std::atomic<int> sync_result_{k_cuda_success};
    std::atomic<uint64_t> alloc_calls_{0}, free_calls_{0}, sync_calls_{0}, bad_calls_{0};
};

}  // namespace gpumem
