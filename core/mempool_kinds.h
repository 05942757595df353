// The memory kind of each CUDA memory pool the program made that is not device memory: what cuMemAllocFromPoolAsync hands out from it.
//
// cuMemAllocFromPoolAsync names a CUmemoryPool, and what the driver hands out is that pool's
// memory: pinned host memory from a pool made with a host location (CU_MEM_LOCATION_TYPE_HOST,
// _HOST_NUMA), managed memory from one made with CU_MEM_ALLOCATION_TYPE_MANAGED (CUDA 13).  No pool
// attribute says which (cuMemPoolGetAttribute knows none), so the hooks note each pool here when
// cuMemPoolCreate makes it (or CUDA 13's cuMemGetDefaultMemPool / cuMemGetMemPool names a
// location's pool) and drop it when cuMemPoolDestroy destroys it.  Only pools of another
// kind than device are kept: a pool the table does not know (a device's default or current pool, a
// device pool, one past a full table) hands out device memory.
#pragma once

#include <atomic>
#include <cstdint>

#include "event_schema.h"

namespace gpumem {

// A fixed table of (pool handle, kind), without a lock: the allocation hooks read it on every
// cuMemAllocFromPoolAsync, and a program that made no such pool pays one load.
class mempool_kinds {
  public:
    static constexpr int k_slots = 1024;

    // Pool `pool`, just made or handed out again, hands out memory of kind k.  A note of the same
    // handle is changed in place (a destroyed pool's handle may come back for a new pool; device
    // drops it).  False where a kind other than device could not be kept (every slot is taken):
    // that pool's allocations are then device ones.
    bool note(uint64_t pool, mem_kind k) noexcept;
    // Drops pool's note (each entry of it: two threads' first notes at once may make two); returns
    // the kind it had (device where none was kept), so that the caller can note it again if the
    // driver refuses the destroy.
    mem_kind forget(uint64_t pool) noexcept;
    // The kind of memory pool hands out: device unless noted otherwise.
    mem_kind kind_of(uint64_t pool) const noexcept;
    // Pools kept now.
    int size() const noexcept { return used_.load(std::memory_order_acquire); }

  private:
    // A slot is taken by its key (0: free).  Its kind is written after the key and cleared before
    // the key is: a reader that finds the key before its kind reads 0, taken for device, and that
    // can only be a reader that had the handle before a note of it returned (each way the program
    // gets a pool's handle notes it before handing it out).
    std::atomic<uint64_t> keys_[k_slots] = {};
    std::atomic<uint8_t> kinds_[k_slots] = {};
    // Slots below this index have been taken at some time: lookups scan no further, so a program
    // that keeps a few pools pays a few loads.  Free slots are taken lowest first.
    std::atomic<int> high_{0};
    std::atomic<int> used_{0};
};

}  // namespace gpumem
