// The free gaps of a device as a multiset of sizes with its largest and its total, and the one
// routine that walks the gaps of a segment.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "u64_map.h"

namespace gpumem::analysis {

// Calls f(size) for every non-empty free range of the segment [base, base+size) whose occupied
// blocks are `blocks`, a range of (ptr, asize) pairs sorted by ptr.
template <typename Blocks, typename F>
void for_each_gap(uint64_t base, uint64_t size, const Blocks& blocks, F&& f) {
    uint64_t cur = base;
    for (const auto& [p, a] : blocks) {
        if (p > cur) f(p - cur);
        cur = p + a;
    }
    if (base + size > cur) f(base + size - cur);
}

// The free gaps of one device as a multiset of sizes, built for "largest" after every event: a
// hash map of counts plus a max-heap that may hold stale sizes, dropped lazily when they surface.
// This replaced a std::map<size, count>, whose node churn was the replay's largest cost; the counts
// are an open-addressing map since std::unordered_map's nodes were the next largest.
class gap_set {
public:
    void add(uint64_t s) {
        if (!s) return;
        uint32_t& c = count_[s];
        if (c++ == 0) {
            // Stale sizes below the top pile up; rebuild when they outnumber the live ones.
            if (heap_.size() > 2 * count_.size() + 1024) rebuild();
            heap_.push_back(s);
            std::push_heap(heap_.begin(), heap_.end());
        }
        total_ += s;
        ++n_;
    }
    void remove(uint64_t s) {
        if (!s) return;
        uint32_t* c = count_.find(s);
        if (!c) return;  // unreachable while the map is consistent
        if (--*c == 0) {
            count_.erase(s);
            // Only a vanished top makes the answer stale; sizes below it are checked as they surface.
            if (!heap_.empty() && s == heap_.front()) top_stale_ = true;
        }
        total_ -= s;
        --n_;
    }
    // Called after every event, so the common case (the top is still live) does no lookup.
    uint64_t largest() {
        if (top_stale_) {
            while (!heap_.empty() && !count_.contains(heap_.front())) {
                std::pop_heap(heap_.begin(), heap_.end());
                heap_.pop_back();
            }
            top_stale_ = false;
        }
        return heap_.empty() ? 0 : heap_.front();
    }
    void clear() {
        count_.clear();
        heap_.clear();
        total_ = n_ = 0;
        top_stale_ = false;
    }
    uint64_t total() const { return total_; }
    uint64_t count() const { return n_; }

private:
    void rebuild() {
        heap_.clear();
        for (const auto& kv : count_) heap_.push_back(kv.first);
        std::make_heap(heap_.begin(), heap_.end());
        top_stale_ = false;  // every size in the heap is live again
    }

    u64_map<uint32_t> count_;
    std::vector<uint64_t> heap_;
    uint64_t total_ = 0, n_ = 0;
    bool top_stale_ = false;  // heap_.front() may no longer be a live size
};

}  // namespace gpumem::analysis
