// A model of PyTorch 2.x's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp), replayed offline.
//
// Each rule below names the function of CUDACachingAllocator.cpp it follows; the model was checked
// against torch.cuda.max_memory_reserved() and num_device_alloc on an H200 (docs/benchmarks.md).
#include "pytorch.h"

#include <algorithm>
#include <bit>

namespace gpumem::simulate {

namespace {
constexpr uint64_t k_addr_gap = 2ull << 20;  // between made-up segments, so none are adjacent
uint64_t round_up(uint64_t x, uint64_t m) { return (x + m - 1) / m * m; }
}  // namespace

pytorch_policy::pytorch_policy(const pt_config& cfg, uint64_t capacity, uint64_t device_total)
    : cfg_(cfg), capacity_(capacity), device_total_(device_total ? device_total : capacity ? capacity : 1ull << 40) {
    small_.small = true;
    // DeviceCachingAllocator's constructor: setMemoryFraction(per_process_memory_fraction) sets
    // allowed_memory_maximum = fraction * totalGlobalMem when the fraction is below 1.  The
    // device replayed is --capacity's when given.
    if (cfg.memory_fraction < 1) {
        has_limit_ = true;
        limit_ = uint64_t(cfg.memory_fraction * double(capacity ? capacity : device_total_));
    }
}

pytorch_policy::~pytorch_policy() {
    // Every block is reachable from a segment chain; collect the heads through the live and free sets.
    std::vector<block*> all;
    for (block* b : by_id_)
        if (b) all.push_back(b);
    for (block_pool* p : {&small_, &large_}) {
        all.insert(all.end(), p->blocks.begin(), p->blocks.end());
        all.insert(all.end(), p->unmapped.begin(), p->unmapped.end());
    }
    for (block* b : all) delete b;
    while (spare_) {
        block* n = spare_->next;
        delete spare_;
        spare_ = n;
    }
    for (exp_segment* es : segments_es_) delete es;
}

pytorch_policy::block* pytorch_policy::new_block() {
    if (!spare_) return new block;
    block* b = spare_;
    spare_ = b->next;
    *b = block{};
    return b;
}

void pytorch_policy::delete_block(block* b) {
    b->next = spare_;
    spare_ = b;
}

// round_size(): below 512 B -> 512; with roundup_power2_divisions set for the size's interval (and
// the size above 512 * divisions) -> the next of `divisions` equal steps between powers of two;
// otherwise up to a multiple of 512.
uint64_t pytorch_policy::round_size(uint64_t size, const pt_config& cfg) {
    if (size < k_pt_min_block) return k_pt_min_block;
    uint64_t div = cfg.divisions_for(size);
    if (div > 1 && size > k_pt_min_block * div) {
        // roundup_power2_next_division()
        if (std::has_single_bit(size)) return size;
        uint64_t floor2 = std::bit_floor(size);
        uint64_t step = floor2 >> (63 - std::countl_zero(div));
        if (step == 0) return floor2 << 1;
        uint64_t down = size & ~(step - 1);
        return down == size ? size : down + step;
    }
    return round_up(size, k_pt_min_block);
}

// get_allocation_size(): small requests get a 2 MiB segment, 1-10 MiB a large segment
// (large_segment_size_mb, 20 MiB by default), larger ones their own size rounded up to 2 MiB.
uint64_t pytorch_policy::allocation_size(uint64_t size) const {
    if (size <= k_pt_small_size) return k_pt_small_buffer;
    if (size < k_pt_min_large_alloc) return cfg_.large_segment;
    return round_up(size, k_pt_round_large);
}

// should_split(): the small pool (and every expandable segment) splits off any remainder of at
// least 512 B; the large pool only a remainder above 1 MiB, and never a block for a request of
// max_split_size or more.
bool pytorch_policy::should_split(const block* b, uint64_t size) const {
    uint64_t remaining = b->size - size;
    if (b->small || cfg_.expandable) return remaining >= k_pt_min_block;
    return size < cfg_.max_split_size && remaining > k_pt_small_size;
}

void pytorch_policy::insert_free(block_pool& p, block* b) {
    b->gc_base = p.gc_calls;  // BlockPool::insert_into_blocks
    p.add(b);
}

uint64_t pytorch_policy::block_size(uint32_t id) const {
    return id < by_id_.size() && by_id_[id] ? by_id_[id]->size : 0;
}

// get_free_block(): the first free block of the stream at least `size` long in (stream, size,
// address) order, with the max_split_size limits and the expandable-segment preference.
pytorch_policy::block* pytorch_policy::get_free_block(block_pool& p, uint16_t stream, uint64_t size) {
    if (gc_on()) ++p.gc_calls;
    block key;
    key.stream = stream;
    key.size = size;
    auto it = p.blocks.lower_bound(&key);
    if (it == p.blocks.end() || (*it)->stream != stream) return nullptr;
    if ((*it)->es && cfg_.expandable) {
        // A block followed by unmapped space counts with the size it can grow to, so a tighter
        // block further on may win.
        auto grow = [](const block* b) { return b->size + (b->next && !b->next->mapped ? b->next->size : 0); };
        auto next = std::next(it);
        while ((*it)->es && next != p.blocks.end() && (*next)->stream == stream && grow(*next) < grow(*it))
            it = next++;
    }
    // No oversize block for a request below max_split_size; an oversize one only within
    // max_non_split_rounding of the request.
    if (size < cfg_.max_split_size && (*it)->size >= cfg_.max_split_size) return nullptr;
    if (size >= cfg_.max_split_size && (*it)->size >= size + cfg_.max_non_split_rounding) return nullptr;
    block* b = *it;
    p.remove(it);
    return b;
}

// alloc_block(): a new segment of alloc_size from the driver (cudaMalloc), or the expandable path.
pytorch_policy::block* pytorch_policy::alloc_block(block_pool& p, uint16_t stream, uint64_t size,
                                                   uint64_t alloc_size) {
    // allowed_memory_maximum is checked against alloc_size on both paths, before the driver is
    // asked (an expandable segment may then map more than alloc_size, past the limit).
    if (has_limit_ && reserved_ + alloc_size > limit_) return nullptr;
    if (cfg_.expandable) return try_allocate_expandable(p, stream, size);
    if (capacity_ && reserved_ + alloc_size > capacity_) return nullptr;  // cudaMalloc: out of memory
    block* b = new_block();
    // Made-up addresses: small segments rise, large ones fall.  Only the order of equal-size free
    // blocks depends on them (best fit breaks ties by address); in the two H200 runs of
    // tests/data/replay the driver mostly placed 2 MiB segments upwards and large ones downwards,
    // and this order reproduced both exactly, where rising addresses for all missed one by 4 MiB.
    uint64_t span = round_up(alloc_size, k_pt_round_large) + k_addr_gap;
    if (p.small) {
        b->addr = next_addr_;
        next_addr_ += span;
    } else {
        next_down_ -= span;
        b->addr = next_down_;
    }
    b->size = alloc_size;
    b->stream = stream;
    b->small = p.small;
    reserved_ += alloc_size;
    ++segments_;
    ++driver_allocs_;
    return b;
}

void pytorch_policy::release_block(block_pool& p, block* b) {
    p.remove(b);
    reserved_ -= b->size;
    --segments_;
    ++driver_frees_;
    delete_block(b);
}

// release_available_cached_blocks(): with max_split_size set, free the smallest oversize cached
// block that covers the request, else the largest oversize ones until enough is freed.
bool pytorch_policy::release_available_cached_blocks(block_pool& p, uint16_t stream, uint64_t size) {
    if (cfg_.max_split_size == std::numeric_limits<uint64_t>::max()) return false;
    block key;
    key.stream = stream;
    key.size = std::max(size, cfg_.max_split_size);
    auto it = p.blocks.lower_bound(&key);
    if (it == p.blocks.end() || (*it)->stream != stream) {
        if (it == p.blocks.begin()) return false;
        uint64_t released = 0;
        --it;
        while (released < key.size && (*it)->size >= cfg_.max_split_size && (*it)->stream == stream) {
            auto cur = it;
            released += (*cur)->size;
            bool first = it == p.blocks.begin();
            if (!first) --it;
            if (!(*cur)->is_split() && !(*cur)->es) release_block(p, *cur);
            if (first) break;
        }
        return released >= key.size;
    }
    if ((*it)->is_split() || (*it)->es) return false;  // PyTorch would cudaFree it; never reached there
    release_block(p, *it);
    return true;
}

// release_blocks(): every unsplit cached segment goes back to the driver; free pages of
// expandable segments are unmapped.
void pytorch_policy::release_blocks(block_pool& p) {
    std::vector<block*> to_unmap;
    for (auto it = p.blocks.begin(); it != p.blocks.end();) {
        block* b = *it++;
        if (b->es) to_unmap.push_back(b);
        else if (!b->is_split()) release_block(p, b);
    }
    for (block* b : to_unmap) {
        unmap_block(b);
        if (!b->mapped && !b->is_split()) release_expandable_segment(b);
    }
}

void pytorch_policy::release_cached_blocks() {
    release_blocks(large_);
    release_blocks(small_);
}

// garbage_collect_cached_blocks(): above threshold * limit, free unsplit large cached blocks
// whose age (get_free_block calls since they became free) is at least the average, until the
// excess is reclaimed.
void pytorch_policy::garbage_collect() {
    uint64_t threshold = uint64_t(cfg_.gc_threshold * double(gc_limit()));
    if (reserved_ <= threshold) return;
    uint64_t target = reserved_ - threshold, reclaimed = 0;
    auto age = [&](const block* b) { return large_.gc_calls - b->gc_base; };
    int64_t total_age = 0, count = 0;
    for (block* b : large_.blocks)
        if (!b->is_split() && !b->es) {
            total_age += age(b);
            ++count;
        }
    if (count == 0) return;
    bool freed = true;
    while (reclaimed < target && freed && count > 0) {
        double threshold_age = double(total_age) / double(count);
        freed = false;
        for (auto it = large_.blocks.begin(); it != large_.blocks.end();) {
            block* b = *it++;
            if (!b->is_split() && !b->es && double(age(b)) >= threshold_age) {
                freed = true;
                reclaimed += b->size;
                total_age -= age(b);
                --count;
                release_block(large_, b);
            }
        }
    }
}

bool pytorch_policy::allocate(uint32_t id, uint64_t orig_size, uint16_t stream) {
    uint64_t size = round_size(orig_size, cfg_);
    block_pool& p = pool_for(size);
    uint64_t alloc_size = allocation_size(size);
    block* b = get_free_block(p, stream, size);
    if (!b) {
        if (gc_on()) garbage_collect();
        b = alloc_block(p, stream, size, alloc_size);
        if (!b && release_available_cached_blocks(p, stream, size)) b = alloc_block(p, stream, size, alloc_size);
        if (!b) {
            release_cached_blocks();
            b = alloc_block(p, stream, size, alloc_size);
        }
        if (!b) return false;
    }
    // alloc_found_block(): split off the remainder as a free block right after the allocation.
    if (should_split(b, size)) {
        block* rest = b;
        b = new_block();
        b->addr = rest->addr;
        b->size = size;
        b->stream = stream;
        b->small = rest->small;
        b->es = rest->es;
        b->prev = rest->prev;
        if (b->prev) b->prev->next = b;
        b->next = rest;
        rest->prev = b;
        rest->addr += size;
        rest->size -= size;
        insert_free(p, rest);
    }
    b->allocated = true;
    allocated_ += b->size;
    if (id >= by_id_.size()) by_id_.resize(std::max<size_t>(size_t(id) + 1, by_id_.size() * 2), nullptr);
    by_id_[id] = b;
    return true;
}

// try_merge_blocks(): absorb a free neighbour of the same mapping state.
uint64_t pytorch_policy::try_merge(block* dst, block* src) {
    if (!src || src->allocated || dst->mapped != src->mapped) return 0;
    block_pool& p = dst->small ? small_ : large_;
    if (dst->prev == src) {
        dst->addr = src->addr;
        dst->prev = src->prev;
        if (dst->prev) dst->prev->next = dst;
    } else {
        dst->next = src->next;
        if (dst->next) dst->next->prev = dst;
    }
    uint64_t n = src->size;
    dst->size += n;
    if (src->mapped) p.remove(src);
    else p.unmapped.erase(src);
    delete_block(src);
    return n;
}

// free_block(): merge with free neighbours, back into the pool's free set.
void pytorch_policy::free_block(block* b) {
    try_merge(b, b->prev);
    try_merge(b, b->next);
    insert_free(b->small ? small_ : large_, b);
}

void pytorch_policy::release(uint32_t id) {
    if (id >= by_id_.size() || !by_id_[id]) return;
    block* b = by_id_[id];
    by_id_[id] = nullptr;
    b->allocated = false;
    allocated_ -= b->size;
    free_block(b);
}

uint64_t pytorch_policy::largest_free() const {
    // Called after every replayed event: one lookup per pool, not one per stream the log named (a
    // log of 20,000 streams replayed in minutes).
    uint64_t best = 0;
    for (const block_pool* p : {&small_, &large_})
        if (!p->sizes.empty()) best = std::max(best, *p->sizes.rbegin());
    return best;
}

}  // namespace gpumem::simulate
