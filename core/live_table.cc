// The live allocations the recorder has seen, so a free can be logged with its size and kind.
#include "live_table.h"

namespace gpumem {

void live_table::insert(uint64_t key, const live_entry& e) noexcept {
    shard& s = shards_[shard_of(key)];
    try {
        std::lock_guard<std::mutex> g(s.mu);
        s.map[key] = e;
    } catch (...) {
        // Out of memory: the free of this pointer will be logged as unknown, not lost.
    }
}

bool live_table::take(uint64_t key, live_entry* out) noexcept {
    shard& s = shards_[shard_of(key)];
    std::lock_guard<std::mutex> g(s.mu);
    auto it = s.map.find(key);
    if (it == s.map.end()) return false;
    *out = it->second;
    s.map.erase(it);
    return true;
}

bool live_table::find(uint64_t key, live_entry* out) const noexcept {
    const shard& s = shards_[shard_of(key)];
    std::lock_guard<std::mutex> g(s.mu);
    auto it = s.map.find(key);
    if (it == s.map.end()) return false;
    *out = it->second;
    return true;
}

size_t live_table::size() const noexcept {
    size_t n = 0;
    for (const shard& s : shards_) {
        std::lock_guard<std::mutex> g(s.mu);
        n += s.map.size();
    }
    return n;
}

}  // namespace gpumem
