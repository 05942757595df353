// A model of PyTorch 2.x's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp), replayed offline.
#pragma once

#include <cstdint>
#include <set>
#include <vector>

#include "policy.h"
#include "pytorch_config.h"

namespace gpumem::simulate {

// Mirrors DeviceCachingAllocator for one device: the same rounding, pools, segment sizes, best-fit
// order (stream, size, address), split and merge rules, max_split_size, roundup_power2_divisions,
// garbage_collection_threshold, per_process_memory_fraction's limit and OOM path (free cached
// unsplit segments, retry).  With
// cfg.expandable the large and small pools each grow one mapping per stream instead
// (pytorch_expandable.cc).  Addresses are made up (see alloc_block for their order).
class pytorch_policy final : public policy {
public:
    // capacity: the device's memory (0 = unlimited).
    // device_total: the device's size, for the address space of an expandable segment and, where
    // no capacity is given, the memory per_process_memory_fraction takes its share of (make_policy
    // refuses that fraction when neither is known).
    pytorch_policy(const pt_config& cfg, uint64_t capacity, uint64_t device_total);
    ~pytorch_policy() override;

    bool allocate(uint32_t id, uint64_t size, uint16_t stream) override;
    void release(uint32_t id) override;
    uint64_t reserved() const override { return reserved_; }
    uint64_t allocated() const override { return allocated_; }
    uint64_t largest_free() const override;
    uint64_t driver_allocs() const override { return driver_allocs_; }
    uint64_t driver_frees() const override { return driver_frees_; }
    // Expandable segments unmap every free page before an out-of-memory fails (release_cached_blocks):
    // a failure with the driver's memory too small for one more page is their page rounding.
    bool unmaps_free_chunks() const override { return cfg_.expandable; }
    std::optional<uint64_t> memory_limit() const override {
        return has_limit_ ? std::optional<uint64_t>(limit_) : std::nullopt;
    }

    // The allocator's size rules, exposed for tests.
    static uint64_t round_size(uint64_t size, const pt_config& cfg);  // round_size()
    uint64_t allocation_size(uint64_t size) const;                     // get_allocation_size()
    uint64_t live_segments() const { return segments_; }
    // Size of the block serving a live allocation (0 if none).
    uint64_t block_size(uint32_t id) const;

private:
    // ExpandableSegment: a reserved address range whose pages (2 MiB in the small pool, 20 MiB
    // in the large one, as the source's find_expandable_block sets them) are mapped on demand.
    struct exp_segment {
        uint64_t base = 0, granule = 0, n_pages = 0;
    };
    struct block {
        uint64_t addr = 0, size = 0;
        block* prev = nullptr;
        block* next = nullptr;
        exp_segment* es = nullptr;  // expandable segment, or null for a cudaMalloc segment
        int64_t gc_base = 0;        // the pool's get_free_block count when the block became free
        uint16_t stream = 0;
        bool allocated = false;
        bool mapped = true;
        bool small = false;
        bool is_split() const { return prev || next; }
    };
    struct by_stream_size_addr {
        bool operator()(const block* a, const block* b) const {
            if (a->stream != b->stream) return a->stream < b->stream;
            if (a->size != b->size) return a->size < b->size;
            return a->addr < b->addr;
        }
    };
    struct by_stream_addr {
        bool operator()(const block* a, const block* b) const {
            if (a->stream != b->stream) return a->stream < b->stream;
            return a->addr < b->addr;
        }
    };
    struct block_pool {
        bool small = false;
        std::set<block*, by_stream_size_addr> blocks;  // free, mapped: change through add/remove
        std::multiset<uint64_t> sizes;                 // of `blocks`: the largest at once, whatever the streams
        std::set<block*, by_stream_addr> unmapped;     // expandable address space without pages
        int64_t gc_calls = 0;                          // get_free_blocks_call_count
        void add(block* b) {
            blocks.insert(b);
            sizes.insert(b->size);
        }
        void remove(std::set<block*, by_stream_size_addr>::iterator it) {
            sizes.erase(sizes.find((*it)->size));
            blocks.erase(it);
        }
        void remove(block* b) {
            if (auto it = blocks.find(b); it != blocks.end()) remove(it);
        }
    };

    block_pool& pool_for(uint64_t size) { return size <= k_pt_small_size ? small_ : large_; }
    void insert_free(block_pool& p, block* b);
    block* get_free_block(block_pool& p, uint16_t stream, uint64_t size);
    block* alloc_block(block_pool& p, uint16_t stream, uint64_t size, uint64_t alloc_size);
    bool should_split(const block* b, uint64_t size) const;
    bool release_available_cached_blocks(block_pool& p, uint16_t stream, uint64_t size);
    void release_cached_blocks();
    void release_blocks(block_pool& p);
    void release_block(block_pool& p, block* b);
    void garbage_collect();
    void free_block(block* b);
    uint64_t try_merge(block* dst, block* src);
    block* new_block();
    void delete_block(block* b);

    // Expandable segments (pytorch_expandable.cc).
    block* try_allocate_expandable(block_pool& p, uint16_t stream, uint64_t size);
    block* find_expandable_block(block_pool& p, uint16_t stream, uint64_t size);
    bool map_block(block* b, uint64_t size);
    void unmap_block(block* b);
    void release_expandable_segment(block* b);

    // garbage_collection_threshold is on only under per_process_memory_fraction's limit.
    bool gc_on() const { return pt_gc_acts(cfg_); }
    uint64_t gc_limit() const { return limit_; }

    const pt_config cfg_;
    const uint64_t capacity_;
    const uint64_t device_total_;
    bool has_limit_ = false;  // per_process_memory_fraction below 1: allowed_memory_maximum ...
    uint64_t limit_ = 0;      // ... of this many bytes
    block_pool small_, large_;
    std::vector<block*> by_id_;
    std::vector<exp_segment*> segments_es_;
    uint64_t reserved_ = 0, allocated_ = 0, segments_ = 0;
    uint64_t driver_allocs_ = 0, driver_frees_ = 0;
    uint64_t next_addr_ = 0x100000000000ull;  // small segments and expandable ranges, upwards
    uint64_t next_down_ = 0x7f0000000000ull;  // large segments, downwards
    block* spare_ = nullptr;  // recycled blocks, linked through next
};

}  // namespace gpumem::simulate
