// A fake device for tests and benchmarks: made-up addresses, a capacity, injectable failures, counters.
#include "core/pool/fake_backend.h"

#include <new>

namespace gpumem {

int fake_backend::segment_alloc(uint64_t bytes, uint64_t* base) noexcept {
    ++alloc_calls_;
    std::lock_guard<std::mutex> lk(mu_);
    if (fail_n_ > 0) {
        --fail_n_;
        return fail_code_;
    }
    if (bytes == 0) return k_cuda_invalid_value;
    if (in_use_ > capacity_ || bytes > capacity_ - in_use_) return k_cuda_oom;
    constexpr uint64_t k_align = 2ull << 20;
    const uint64_t b = next_;
    try {
        live_.emplace(b, bytes);
    } catch (...) {
        return k_cuda_oom;
    }
    next_ += (bytes + k_align - 1) / k_align * k_align + k_align;  // leave a gap: segments never touch
    in_use_ += bytes;
    *base = b;
    return k_cuda_success;
}

int fake_backend::segment_free(uint64_t base) noexcept {
    ++free_calls_;
    std::lock_guard<std::mutex> lk(mu_);
    auto it = live_.find(base);
    // A real cuMemFree synchronizes: calling it during a capture is a pool bug, counted as such.
    if (it == live_.end() || capturing_) {
        ++bad_calls_;
        return k_cuda_invalid_value;
    }
    in_use_ -= it->second;
    live_.erase(it);
    return k_cuda_success;
}

int fake_backend::synchronize() noexcept {
    ++sync_calls_;
    if (capturing_) ++bad_calls_;
    return sync_result_;
}

void fake_backend::mem_info(uint64_t* free_b, uint64_t* total_b) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    *free_b = capacity_ > in_use_ ? capacity_ - in_use_ : 0;
    *total_b = capacity_;
}

void fake_backend::set_capacity(uint64_t bytes) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    capacity_ = bytes;
}

void fake_backend::fail_next_allocs(int n, int code) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    fail_n_ = n;
    fail_code_ = code;
}

uint64_t fake_backend::in_use() const noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    return in_use_;
}

uint64_t fake_backend::live_segments() const noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    return live_.size();
}

bool fake_backend::is_live(uint64_t base) const noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    return live_.count(base) != 0;
}

}  // namespace gpumem
