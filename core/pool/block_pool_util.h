// Small helpers shared by the block pool's source files (block_pool*.cc).
#pragma once

#include <chrono>
#include <cstdint>

namespace gpumem {

inline uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// The bytes of `n` requests of `size`, kept between `budget` and twice it; a request of the budget or
// more gets the budget alone.  The floor of both batches, the ordered releases' (order_batch_for) and
// the fences' (deallocate): a loop of one size under the budget waits for n of its requests, yet a
// size just under it never holds n of them (n = 4, 31 MiB requests under 32 MiB: 124 MiB).  The
// product saturates, as GPUMEM_FENCE_BATCH goes up to 2^48.
inline uint64_t requests_within(uint64_t n, uint64_t size, uint64_t budget) noexcept {
    if (size >= budget) return budget;
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(n, size, &bytes) || bytes > 2 * budget) return 2 * budget;
    return bytes > budget ? bytes : budget;
}

// For the pool's own time accounting (waits, fences, driver calls): monotonic, never the log's clock.
inline uint64_t steady_ns() noexcept {
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

}  // namespace gpumem
