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

#include <cstdint>

#include "event_schema.h"
#include "handle_table.h"

namespace gpumem {

// (pool handle, kind) notes in a handle_table: the allocation hooks read it on every
// cuMemAllocFromPoolAsync, and a program that made no such pool pays one load.
class mempool_kinds {
  public:
    static constexpr int k_slots = handle_table::k_slots;

    // Pool `pool`, just made or handed out again, hands out memory of kind k.  A note of the same
    // handle is changed in place (a destroyed pool's handle may come back for a new pool; device
    // drops it): taken out and put back, the pool would read as device meanwhile to a thread
    // allocating from it.  Two threads' first notes at once may make two entries.  False where a
    // kind other than device could not be kept (every slot is taken): that pool's allocations are
    // then device ones.
    bool note(uint64_t pool, mem_kind k) noexcept {
        if (pool == 0) return true;
        if (k == mem_kind::device) {  // the default: a note of the handle's earlier pool goes
            forget(pool);
            return true;
        }
        return table_.set(pool, uint8_t(k)) || table_.add(pool, uint8_t(k));
    }
    // Drops pool's note (each entry of it); returns the kind it had (device where none was kept),
    // so that the caller can note it again if the driver refuses the destroy.
    mem_kind forget(uint64_t pool) noexcept {
        uint8_t k = 0;
        return table_.take_all(pool, &k) ? mem_kind(k) : mem_kind::device;
    }
    // The kind of memory pool hands out: device unless noted otherwise.
    mem_kind kind_of(uint64_t pool) const noexcept {
        uint8_t k = 0;
        return table_.find(pool, &k) ? mem_kind(k) : mem_kind::device;
    }
    // Pools kept now.
    int size() const noexcept { return table_.size(); }

  private:
    handle_table table_;
};

}  // namespace gpumem
