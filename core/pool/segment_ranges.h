// A pool's segment address ranges in a fixed table that a signal handler can read: written under the pool's lock, read with atomic loads only.
//
// A signal handler that interrupted this thread inside gpumem (a pool's lock held or being taken,
// critical_section.h) cannot ask the pool which block a pointer is; a free it makes must still not
// reach the driver for a pooled block, which the driver never allocated (docs/pool.md,
// Lifecycle).  This table tells it whether the pointer lies in one of the pool's segments, with no
// lock and no heap.  A segment is added once the pool holds it and removed before it goes back to
// the driver, so gpumem's own cuMemFree of a segment (through another interposer, which comes back
// into the hooks) never finds it here.  A walk over every pool (pool_registry::owner_of, a free's
// search) asks it too, to pass over a pool whose lock another thread holds (block_pool::lookup).
#pragma once

#include <atomic>
#include <cstdint>

namespace gpumem {

class segment_ranges {
  public:
    // Segments past this many are not in the table (counted): holds() then cannot say "none".
    static constexpr int k_slots = 4096;

    // The slot that now holds [base, base + size), or -1 (table full: counted untracked).
    int add(uint64_t base, uint64_t size) noexcept {
        int i = -1;
        const int used = used_.load(std::memory_order_relaxed);
        if (n_free_ > 0) i = free_[--n_free_];
        else if (used < k_slots) used_.store((i = used) + 1, std::memory_order_release);
        if (i < 0) {
            untracked_.fetch_add(1, std::memory_order_release);
            return -1;
        }
        end_[i].store(base + size, std::memory_order_relaxed);
        base_[i].store(base, std::memory_order_release);  // published last: a reader sees a whole entry
        return i;
    }
    // Undoes add(); `slot` is what it returned (-1: an untracked segment).
    void remove(int slot) noexcept {
        if (slot < 0) {
            untracked_.fetch_sub(1, std::memory_order_release);
            return;
        }
        base_[slot].store(0, std::memory_order_release);
        free_[n_free_++] = slot;
    }
    // Every segment gone at once (the pool forgot them all).
    void clear() noexcept {
        const int used = used_.load(std::memory_order_relaxed);
        for (int i = 0; i < used; ++i) base_[i].store(0, std::memory_order_release);
        n_free_ = 0;
        used_.store(0, std::memory_order_release);
        untracked_.store(0, std::memory_order_release);
    }

    // 1: p lies in a segment of the table; 0: in none, and every segment is in it; -1: in none of
    // the table's, but some segments are not in it.  Async-signal-safe.  An entry being replaced
    // on another thread meanwhile may be read whole with the wrong end (its base read twice, the
    // same both times); a live block's segment is never replaced, so a live block's answer is exact.
    int holds(uint64_t p) const noexcept {
        const int n = used_.load(std::memory_order_acquire);
        for (int i = 0; i < n; ++i) {
            const uint64_t b = base_[i].load(std::memory_order_acquire);
            if (b == 0 || p < b) continue;
            const uint64_t e = end_[i].load(std::memory_order_acquire);
            if (base_[i].load(std::memory_order_acquire) == b && p < e) return 1;
        }
        return untracked_.load(std::memory_order_acquire) ? -1 : 0;
    }

  private:
    // Every member is written under the pool's lock only; holds() reads the atomic ones from any thread.
    std::atomic<uint64_t> base_[k_slots] = {};  // 0: an empty slot
    std::atomic<uint64_t> end_[k_slots] = {};
    int free_[k_slots];                         // slots emptied by remove(), reused first
    int n_free_ = 0;
    std::atomic<int> used_{0};                  // slots [0, used_) have been used
    std::atomic<uint64_t> untracked_{0};        // segments held that found the table full
};

}  // namespace gpumem
