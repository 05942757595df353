// Shared helpers of the pool tests: a recording event sink and config shortcuts.
#pragma once

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
    std::vector<event> of(ev_kind k) {
        std::lock_guard<std::mutex> lk(mu);
        std::vector<event> r;
        for (const event& e : events)
            if (e.ev == k) r.push_back(e);
        return r;
    }
};

// The library's default is auto (immediate until a stream appears); most tests pin a mode.
inline pool_config safe_config() {
    pool_config c;
    c.reuse = reuse_mode::safe;
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

}  // namespace gpumem::test
