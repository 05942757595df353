// Extra references of VMM handles: a lock-free multiset of handle values (handle_refs.h).
#include "handle_refs.h"

namespace gpumem {

bool handle_refs::add(uint64_t h) noexcept {
    if (h == 0) return false;  // 0 marks an empty slot
    used_.fetch_add(1, std::memory_order_acq_rel);
    for (auto& s : slots_) {
        uint64_t empty = 0;
        if (s.load(std::memory_order_relaxed) == 0 && s.compare_exchange_strong(empty, h, std::memory_order_acq_rel))
            return true;
    }
    used_.fetch_sub(1, std::memory_order_acq_rel);
    return false;
}

bool handle_refs::take(uint64_t h) noexcept {
    if (h == 0 || used_.load(std::memory_order_acquire) == 0) return false;
    for (auto& s : slots_) {
        uint64_t mine = h;
        if (s.load(std::memory_order_relaxed) == h && s.compare_exchange_strong(mine, 0, std::memory_order_acq_rel)) {
            used_.fetch_sub(1, std::memory_order_acq_rel);
            return true;
        }
    }
    return false;
}

}  // namespace gpumem
