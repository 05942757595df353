// Small helpers shared by the block pool's source files (block_pool*.cc).
#pragma once

#include <chrono>
#include <cstdint>

namespace gpumem {

inline uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// For the pool's own time accounting (waits, fences, driver calls): monotonic, never the log's clock.
inline uint64_t steady_ns() noexcept {
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

}  // namespace gpumem
