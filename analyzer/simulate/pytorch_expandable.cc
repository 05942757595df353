// PyTorch's expandable_segments:True path: per stream and pool, one reserved address range whose pages are mapped as it grows.
//
// Follows find_expandable_block, try_allocate_expandable_block, map_block, unmap_block and
// release_expandable_segment of c10/cuda/CUDACachingAllocator.cpp.  Each map_block call counts as
// one driver allocation (PyTorch's num_device_alloc), each unmap as one free.
#include <algorithm>

#include "pytorch.h"

namespace gpumem::simulate {

namespace {
uint64_t div_up(uint64_t x, uint64_t m) { return (x + m - 1) / m; }
}  // namespace

// The lowest address of this stream's segments where free and unmapped blocks in a row add up to
// `size`, starting at an unmapped block (or the free block just before it); else a new segment of
// 1 1/8 the device's memory in address space.
pytorch_policy::block* pytorch_policy::find_expandable_block(block_pool& p, uint16_t stream, uint64_t size) {
    auto allocatable = [](const block* b) { return b && !b->allocated; };
    auto has_room = [&](const block* b) {
        uint64_t bytes = 0;
        while (bytes < size && allocatable(b)) {
            bytes += b->size;
            b = b->next;
        }
        return bytes >= size;
    };
    block key;
    key.stream = stream;
    for (auto it = p.unmapped.lower_bound(&key); it != p.unmapped.end() && (*it)->stream == stream; ++it) {
        block* c = *it;
        if (allocatable(c->prev)) c = c->prev;
        if (has_room(c)) return c;
    }
    auto* es = new exp_segment;
    es->granule = p.small ? k_pt_small_buffer : cfg_.large_segment;
    es->n_pages = div_up(device_total_ + device_total_ / 8, es->granule);
    es->base = next_addr_;
    next_addr_ += es->n_pages * es->granule + es->granule;
    segments_es_.push_back(es);
    block* c = new_block();
    c->addr = es->base;
    c->size = es->n_pages * es->granule;
    c->stream = stream;
    c->small = p.small;
    c->es = es;
    c->mapped = false;
    p.unmapped.insert(c);
    return c;
}

// Maps the pages under [b->addr, b->addr + size) of an unmapped block, splits off the unmapped
// rest, and merges the new pages with free neighbours.  False when the device is full (PyTorch
// releases the handles it created for this call and maps nothing).
bool pytorch_policy::map_block(block* b, uint64_t size) {
    exp_segment* es = b->es;
    uint64_t begin = (b->addr - es->base) / es->granule;
    uint64_t end = div_up(b->addr + size - es->base, es->granule);
    if (end <= begin) return false;
    uint64_t bytes = (end - begin) * es->granule;
    if (capacity_ && reserved_ + bytes > capacity_) return false;
    block_pool& p = b->small ? small_ : large_;
    p.unmapped.erase(b);
    b->mapped = true;
    if (bytes < b->size) {
        block* rest = new_block();
        rest->addr = b->addr + bytes;
        rest->size = b->size - bytes;
        rest->stream = b->stream;
        rest->small = b->small;
        rest->es = es;
        rest->mapped = false;
        rest->prev = b;
        rest->next = b->next;
        if (b->next) b->next->prev = rest;
        b->next = rest;
        p.unmapped.insert(rest);
        b->size = bytes;
    }
    try_merge(b, b->prev);
    try_merge(b, b->next);
    insert_free(p, b);
    reserved_ += bytes;
    ++driver_allocs_;
    return true;
}

pytorch_policy::block* pytorch_policy::try_allocate_expandable(block_pool& p, uint16_t stream, uint64_t size) {
    block* c = find_expandable_block(p, stream, size);
    if (!c->mapped && !map_block(c, std::min(c->size, size))) return nullptr;
    // c may have merged into its neighbours: find the block that now holds its start.
    while (c->size < size) {
        block* next = c->next;
        if (!next || next->mapped || next->allocated) return nullptr;  // the source asserts this never happens
        if (!map_block(next, std::min(size - c->size, next->size))) return nullptr;
        c = next;  // map_block merged c into next
    }
    p.remove(c);
    return c;
}

// Unmaps the whole pages inside a free block; the partial pages at its ends stay mapped as free blocks.
void pytorch_policy::unmap_block(block* b) {
    exp_segment* es = b->es;
    uint64_t begin = div_up(b->addr - es->base, es->granule);
    uint64_t end = (b->addr + b->size - es->base) / es->granule;
    if (begin >= end) return;
    block_pool& p = b->small ? small_ : large_;
    p.remove(b);
    uint64_t start = es->base + begin * es->granule, bytes = (end - begin) * es->granule;
    uint64_t before = start - b->addr, after = b->size - before - bytes;
    if (before > 0) {
        block* f = new_block();
        f->addr = b->addr;
        f->size = before;
        f->stream = b->stream;
        f->small = b->small;
        f->es = es;
        f->prev = b->prev;
        if (f->prev) f->prev->next = f;
        f->next = b;
        b->prev = f;
        insert_free(p, f);
    }
    if (after > 0) {
        block* f = new_block();
        f->addr = start + bytes;
        f->size = after;
        f->stream = b->stream;
        f->small = b->small;
        f->es = es;
        f->next = b->next;
        if (f->next) f->next->prev = f;
        f->prev = b;
        b->next = f;
        insert_free(p, f);
    }
    b->addr = start;
    b->size = bytes;
    b->mapped = false;
    try_merge(b, b->prev);
    try_merge(b, b->next);
    p.unmapped.insert(b);
    reserved_ -= bytes;
    ++driver_frees_;
}

// A segment with no page mapped any more gives back its address range.
void pytorch_policy::release_expandable_segment(block* b) {
    block_pool& p = b->small ? small_ : large_;
    p.unmapped.erase(b);
    auto it = std::find(segments_es_.begin(), segments_es_.end(), b->es);
    if (it != segments_es_.end()) {
        delete *it;
        segments_es_.erase(it);
    }
    delete_block(b);
}

}  // namespace gpumem::simulate
