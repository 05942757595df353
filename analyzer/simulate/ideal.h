// The `ideal` policy: memory equal to the bytes the program holds at each moment, the bound no allocator beats.
#pragma once

#include <vector>

#include "policy.h"

namespace gpumem::simulate {

// Reserved = requested bytes of the live allocations: no rounding, no segments, no fragmentation.
// With a capacity it fails exactly when the live bytes would exceed it.
class ideal_policy final : public policy {
public:
    explicit ideal_policy(uint64_t capacity) : capacity_(capacity) {}
    bool allocate(uint32_t id, uint64_t size, uint16_t) override {
        if (capacity_ && live_ + size > capacity_) return false;
        if (id >= sizes_.size()) sizes_.resize(std::max<size_t>(size_t(id) + 1, sizes_.size() * 2), 0);
        sizes_[id] = size;
        live_ += size;
        return true;
    }
    void release(uint32_t id) override {
        if (id < sizes_.size()) {
            live_ -= sizes_[id];
            sizes_[id] = 0;
        }
    }
    uint64_t reserved() const override { return live_; }
    uint64_t allocated() const override { return live_; }
    uint64_t largest_free() const override { return 0; }
    uint64_t driver_allocs() const override { return 0; }
    uint64_t driver_frees() const override { return 0; }

private:
    uint64_t capacity_;
    uint64_t live_ = 0;
    std::vector<uint64_t> sizes_;
};

}  // namespace gpumem::simulate
