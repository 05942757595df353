// The memory kind of the program's non-device CUDA memory pools: a lock-free table (mempool_kinds.h).
#include "mempool_kinds.h"

namespace gpumem {

bool mempool_kinds::note(uint64_t pool, mem_kind k) noexcept {
    if (pool == 0) return true;  // 0 marks a free slot
    if (k == mem_kind::device) {  // the default: a note of the handle's earlier pool goes
        forget(pool);
        return true;
    }
    // Noted already (another thread's cuMemGetDefaultMemPool of the same pool, a handle that came
    // back): its kind is set in place.  Taken out and put back, the pool read as device meanwhile
    // to a thread allocating from it, and two threads' notes at once left two entries, of which
    // its destroy forgot one.
    bool found = false;
    const int high = high_.load(std::memory_order_acquire);
    for (int i = 0; i < high; ++i) {
        if (keys_[i].load(std::memory_order_acquire) != pool) continue;
        kinds_[i].store(uint8_t(k), std::memory_order_release);
        found = true;
    }
    if (found) return true;
    used_.fetch_add(1, std::memory_order_acq_rel);
    for (int i = 0; i < k_slots; ++i) {
        uint64_t empty = 0;
        if (keys_[i].load(std::memory_order_relaxed) != 0 ||
            !keys_[i].compare_exchange_strong(empty, pool, std::memory_order_acq_rel))
            continue;
        int h = high_.load(std::memory_order_relaxed);
        while (h < i + 1 && !high_.compare_exchange_weak(h, i + 1, std::memory_order_acq_rel)) {}
        kinds_[i].store(uint8_t(k), std::memory_order_release);
        return true;
    }
    used_.fetch_sub(1, std::memory_order_acq_rel);
    return false;
}

mem_kind mempool_kinds::forget(uint64_t pool) noexcept {
    if (pool == 0 || used_.load(std::memory_order_acquire) == 0) return mem_kind::device;
    // Every entry of the handle: two threads' first notes at once may have made two.
    mem_kind was = mem_kind::device;
    const int high = high_.load(std::memory_order_acquire);
    for (int i = 0; i < high; ++i) {
        if (keys_[i].load(std::memory_order_acquire) != pool) continue;
        const uint8_t k = kinds_[i].exchange(0, std::memory_order_acq_rel);
        uint64_t mine = pool;
        if (!keys_[i].compare_exchange_strong(mine, 0, std::memory_order_acq_rel)) continue;
        used_.fetch_sub(1, std::memory_order_acq_rel);
        if (k && was == mem_kind::device) was = mem_kind(k);
    }
    return was;
}

mem_kind mempool_kinds::kind_of(uint64_t pool) const noexcept {
    if (pool == 0 || used_.load(std::memory_order_acquire) == 0) return mem_kind::device;
    const int high = high_.load(std::memory_order_acquire);
    for (int i = 0; i < high; ++i) {
        if (keys_[i].load(std::memory_order_acquire) != pool) continue;
        const uint8_t k = kinds_[i].load(std::memory_order_acquire);
        return k ? mem_kind(k) : mem_kind::device;
    }
    return mem_kind::device;
}

}  // namespace gpumem
