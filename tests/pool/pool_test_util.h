// Shared helpers of the pool tests: a recording event sink, config shortcuts, checked alloc/free.
#pragma once

#include <catch2/catch.hpp>
#include <mutex>
#include <vector>

#include "core/pool/block_pool.h"
#include "core/pool/event_sink.h"
#include "core/pool/fake_backend.h"
#include "core/pool/pool_config.h"

namespace gpumem::test {

// Keeps every event (seq filled in arrival order, as the event log would).
struct recording_sink final : event_sink {
    std::mutex mu;
    std::vector<event> events;
    void emit(event& e) noexcept override {
        std::lock_guard<std::mutex> lk(mu);
        e.seq = events.size();
        events.push_back(e);
    }
    size_t count(ev_kind k) {
        std::lock_guard<std::mutex> lk(mu);
        size_t n = 0;
        for (const event& e : events) n += e.ev == k;
        return n;
    }
    uint64_t bytes(ev_kind k) {  // the sizes of the events of kind k, summed (segment_unmap: bytes given back)
        std::lock_guard<std::mutex> lk(mu);
        uint64_t n = 0;
        for (const event& e : events) n += e.ev == k ? e.b.size : 0;
        return n;
    }
    std::vector<event> of(ev_kind k) {
        std::lock_guard<std::mutex> lk(mu);
        std::vector<event> r;
        for (const event& e : events)
            if (e.ev == k) r.push_back(e);
        return r;
    }
};

// The library's default is auto (immediate until a stream appears); most tests pin a mode.
// Safe reuse with a release at every miss that pending frees could serve (GPUMEM_ORDER_BATCH=0):
// the tests follow single releases; batches of them have their own tests (fence_test.cc), and
// the property tests draw the batch.
inline pool_config safe_config() {
    pool_config c;
    c.reuse = reuse_mode::safe;
    c.order_batch = 0;
    return c;
}

inline pool_config immediate_config() {
    pool_config c;
    c.reuse = reuse_mode::immediate;
    return c;
}

inline constexpr uint64_t KiB = 1024, MiB = 1024 * 1024;

// Blocks of `size` until the pool refuses one (the device full), appended to *out.
inline void fill_pool(block_pool& pool, uint64_t size, std::vector<uint64_t>* out) {
    for (uint64_t p = 0; pool.allocate(size, api_id::cuMemAlloc_v2, &p) == k_cuda_success;) out->push_back(p);
}

// An allocation that must succeed; its address.
inline uint64_t alloc_ok(block_pool& pool, uint64_t size) {
    uint64_t p = 0;
    REQUIRE(pool.allocate(size, api_id::cuMemAlloc_v2, &p) == k_cuda_success);
    return p;
}

// A free of one of the pool's blocks that must succeed.
inline void free_ok(block_pool& pool, uint64_t p) {
    int rc = -1;
    REQUIRE(pool.deallocate(p, api_id::cuMemFree_v2, &rc));
    REQUIRE(rc == k_cuda_success);
}

}  // namespace gpumem::test
