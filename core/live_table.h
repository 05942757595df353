// The live allocations the recorder has seen, so a free can be logged with its size and kind.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "event_schema.h"

namespace gpumem {

struct live_entry {
    uint64_t size = 0;
    uint64_t asize = 0;
    int16_t dev = -1;
    mem_kind kind = mem_kind::none;
};

// Sharded so threads freeing different pointers rarely meet on one mutex.  Every method is noexcept:
// an insert that cannot allocate is dropped (the later free is then logged with "unknown":true).
class live_table {
  public:
    void insert(uint64_t key, const live_entry& e) noexcept;
    // Removes and returns the entry; false when the key is not live.
    bool take(uint64_t key, live_entry* out) noexcept;
    bool find(uint64_t key, live_entry* out) const noexcept;
    size_t size() const noexcept;

  private:
    static constexpr size_t k_shards = 64;
    struct alignas(64) shard {
        mutable std::mutex mu;
        std::unordered_map<uint64_t, live_entry> map;
    };
    static size_t shard_of(uint64_t key) noexcept { return size_t((key >> 9) * 0x9E3779B97F4A7C15ull >> 58); }
    shard shards_[k_shards];
};

}  // namespace gpumem
