// Extra references of VMM handles (cuMemRetainAllocationHandle): which cuMemRelease of a handle is its last, the free.
//
// cuMemRetainAllocationHandle(&h, addr) hands back the cuMemCreate handle itself, with one more
// reference that a cuMemRelease must take back; the physical memory goes only with the handle's last
// reference (and last unmap).  NCCL frees each cuMem buffer so: retain, release, unmap, release.  The
// hooks keep the extra references here, so that a release that takes one back is not logged as the
// handle's free: only the release that finds none left is.  Which of the equal calls the program meant
// as "the retained one" does not matter: the last of them frees.
#pragma once

#include <atomic>
#include <cstdint>

namespace gpumem {

// A fixed multiset of handle values, one slot per extra reference, without a lock (a release may
// come from a signal handler's exit path, where a lock this thread holds would never be given back).
class handle_refs {
  public:
    static constexpr int k_slots = 1024;

    // One more reference of h.  False where it cannot be kept (h is 0, or every slot is taken): the
    // release that takes it back is then taken for the handle's last.
    bool add(uint64_t h) noexcept;
    // Takes back one reference of h, if one is kept: true then (that release is not the last).
    bool take(uint64_t h) noexcept;
    // References kept now.
    int size() const noexcept { return used_.load(std::memory_order_acquire); }

  private:
    std::atomic<uint64_t> slots_[k_slots] = {};
    // Counted before a slot is filled and after one is emptied: 0 means none is kept, so a release
    // of a program that never retains costs one load.
    std::atomic<int> used_{0};
};

}  // namespace gpumem
