// The hooks' notes on driver handles: a fixed lock-free table of (handle, small value) (handle_table.h).
#include "handle_table.h"

namespace gpumem {

bool handle_table::add(uint64_t key, uint8_t value) noexcept {
    if (key == 0 || key == k_busy) return false;
    used_.fetch_add(1, std::memory_order_acq_rel);
    for (int i = 0; i < k_slots; ++i) {
        uint64_t free_slot = 0;
        if (keys_[i].load(std::memory_order_relaxed) != 0 ||
            !keys_[i].compare_exchange_strong(free_slot, k_busy, std::memory_order_acquire, std::memory_order_relaxed))
            continue;
        int h = high_.load(std::memory_order_relaxed);
        while (h < i + 1 && !high_.compare_exchange_weak(h, i + 1, std::memory_order_acq_rel, std::memory_order_relaxed)) {}
        values_[i].store(value, std::memory_order_relaxed);
        keys_[i].store(key, std::memory_order_release);  // the value before the key
        return true;
    }
    used_.fetch_sub(1, std::memory_order_acq_rel);
    return false;
}

bool handle_table::find(uint64_t key, uint8_t* value) const noexcept {
    if (key == 0 || key == k_busy || used_.load(std::memory_order_acquire) == 0) return false;
    const int high = high_.load(std::memory_order_acquire);
    for (int i = 0; i < high; ++i) {
        if (keys_[i].load(std::memory_order_acquire) != key) continue;
        const uint8_t v = values_[i].load(std::memory_order_acquire);
        // Still key's: a take and another key's add in between would have made it the other's value.
        if (keys_[i].load(std::memory_order_acquire) != key) continue;
        *value = v;
        return true;
    }
    return false;
}

bool handle_table::set(uint64_t key, uint8_t value) noexcept {
    if (key == 0 || key == k_busy) return false;
    bool found = false;
    const int high = high_.load(std::memory_order_acquire);
    for (int i = 0; i < high; ++i) {
        if (keys_[i].load(std::memory_order_acquire) != key) continue;
        values_[i].store(value, std::memory_order_release);
        found = true;
    }
    return found;
}

bool handle_table::take_slot(int i, uint64_t key, uint8_t* value) noexcept {
    uint64_t mine = key;
    if (keys_[i].load(std::memory_order_relaxed) != key ||
        !keys_[i].compare_exchange_strong(mine, k_busy, std::memory_order_acquire, std::memory_order_relaxed))
        return false;
    *value = values_[i].load(std::memory_order_acquire);
    keys_[i].store(0, std::memory_order_release);  // the value read before the slot is free
    used_.fetch_sub(1, std::memory_order_acq_rel);
    return true;
}

bool handle_table::take(uint64_t key, uint8_t* value) noexcept {
    if (key == 0 || key == k_busy || used_.load(std::memory_order_acquire) == 0) return false;
    uint8_t v = 0;
    const int high = high_.load(std::memory_order_acquire);
    for (int i = 0; i < high; ++i) {
        if (!take_slot(i, key, &v)) continue;
        if (value) *value = v;
        return true;
    }
    return false;
}

int handle_table::take_all(uint64_t key, uint8_t* value) noexcept {
    if (key == 0 || key == k_busy || used_.load(std::memory_order_acquire) == 0) return 0;
    int taken = 0;
    const int high = high_.load(std::memory_order_acquire);
    for (int i = 0; i < high; ++i) {
        uint8_t v = 0;
        if (take_slot(i, key, &v) && taken++ == 0) *value = v;
    }
    return taken;
}

}  // namespace gpumem
