// The hooks' notes on driver handles: a fixed lock-free table of (handle, small value) (handle_table.h).
#include "handle_table.h"

namespace gpumem {

namespace {
// A slot's word: its value in the low byte, its generation above it.
constexpr uint64_t k_generation = 0x100;
constexpr uint64_t generation_of(uint64_t word) { return word >> 8; }
}  // namespace

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
        // A new generation: no set that read the slot's word before can write this entry's.  Busy,
        // the slot's word changes by no one else's hand (a set's exchange needs the key it read).
        const uint64_t word = words_[i].load(std::memory_order_relaxed);
        words_[i].store((word & ~uint64_t(0xff)) + k_generation + value, std::memory_order_release);
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
        const uint64_t word = words_[i].load(std::memory_order_acquire);
        // Still key's, in the same generation: a take and another key's add in between (or the
        // key's own, taken and added again) would have moved it on.
        if (keys_[i].load(std::memory_order_acquire) != key ||
            generation_of(words_[i].load(std::memory_order_acquire)) != generation_of(word))
            continue;
        *value = uint8_t(word);
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
        uint64_t word = words_[i].load(std::memory_order_acquire);
        // The word read, then the key still there: the word is of a generation of key's, and the
        // exchange writes only into that generation (a take ends it first).  A failed exchange
        // reads the word again (another set's value, or a new generation), and the key is looked at
        // again after it.
        while (keys_[i].load(std::memory_order_acquire) == key) {
            if (words_[i].compare_exchange_weak(word, (word & ~uint64_t(0xff)) | value, std::memory_order_acq_rel,
                                                std::memory_order_acquire)) {
                found = true;
                break;
            }
        }
    }
    return found;
}

bool handle_table::take_slot(int i, uint64_t key, uint8_t* value) noexcept {
    uint64_t mine = key;
    if (keys_[i].load(std::memory_order_relaxed) != key ||
        !keys_[i].compare_exchange_strong(mine, k_busy, std::memory_order_acquire, std::memory_order_relaxed))
        return false;
    // The generation ends as the value is read, in one step: a set after it fails, one before it
    // is the value taken.
    *value = uint8_t(words_[i].fetch_add(k_generation, std::memory_order_acq_rel));
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
        if (take_slot(i, key, &v) && taken++ == 0 && value) *value = v;
    }
    return taken;
}

}  // namespace gpumem
