// The `gpumem` policy: gpumem's own caching pool (core/pool/block_pool) run as a library on its fake device.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/pool/block_pool.h"
#include "core/pool/fake_backend.h"
#include "policy.h"

namespace gpumem::simulate {

// The pool's settings for a replay: the log header's "config" keys (pool_round, reuse, ...: the
// GPUMEM_* names lower-cased without the prefix), then `overrides` ("pool_large_segment=64MiB,
// reuse=immediate").  Returns "" or what is wrong; `warnings` gets the pool's own complaints.
std::string gpumem_pool_config(const std::string& log_config_json, const std::string& overrides, pool_config& out);

// Whether a replayed pool of these settings runs on virtual memory: pool_vmm on and a pool_round
// the replay's 2 MiB chunk is a multiple of (block_pool::use_vmm's rule), else cuMemAlloc segments.
bool gpumem_replay_vmm(const pool_config& cfg);

class gpumem_pool_policy final : public policy {
public:
    gpumem_pool_policy(const pool_config& cfg, uint64_t capacity);
    bool allocate(uint32_t id, uint64_t size, uint16_t stream) override;
    void release(uint32_t id) override;
    uint64_t reserved() const override { return snap_.reserved; }
    uint64_t allocated() const override { return snap_.allocated; }
    uint64_t largest_free() const override { return snap_.largest_free; }
    uint64_t pending() const override { return pending_; }
    uint64_t driver_allocs() const override { return backend_.allocs; }
    uint64_t driver_frees() const override { return backend_.frees; }
    bool unmaps_free_chunks() const override { return pool_.chunk_size() != 0; }

private:
    // Counts the driver calls that succeeded; the fake device counts every call.  On virtual
    // memory each mapping of physical chunks is one driver allocation and each unmapping one free,
    // as PyTorch's expandable segments count theirs: a segment maps once, an arena at its start
    // and at every segment_map.
    struct counting_backend final : pool_backend {
        explicit counting_backend(uint64_t capacity) : inner(capacity ? capacity : 1ull << 50) {}
        int segment_alloc(uint64_t bytes, uint64_t* base) noexcept override {
            int r = inner.segment_alloc(bytes, base);
            allocs += r == k_cuda_success;
            return r;
        }
        int segment_free(uint64_t base) noexcept override {
            int r = inner.segment_free(base);
            frees += r == k_cuda_success;
            return r;
        }
        int synchronize() noexcept override { return inner.synchronize(); }
        bool may_synchronize() noexcept override { return inner.may_synchronize(); }
        void mem_info(uint64_t* f, uint64_t* t) noexcept override { inner.mem_info(f, t); }
        uint64_t vmm_granularity() noexcept override { return inner.vmm_granularity(); }
        int va_reserve(uint64_t bytes, uint64_t* base) noexcept override { return inner.va_reserve(bytes, base); }
        int va_free(uint64_t base, uint64_t bytes) noexcept override { return inner.va_free(base, bytes); }
        int map_chunks(uint64_t addr, uint64_t chunk, size_t n, uint64_t* handles) noexcept override {
            int r = inner.map_chunks(addr, chunk, n, handles);
            allocs += r == k_cuda_success;
            return r;
        }
        int unmap_chunks(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept override {
            int r = inner.unmap_chunks(addr, chunk, n, handles);
            frees += r == k_cuda_success;
            return r;
        }
        // Stitching (pool_stitch=on): a second mapping of chunks counts as a mapping, its unmap
        // as an unmapping.
        int map_alias(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept override {
            int r = inner.map_alias(addr, chunk, n, handles);
            allocs += r == k_cuda_success;
            return r;
        }
        int unmap_alias(uint64_t addr, uint64_t chunk, size_t n) noexcept override {
            int r = inner.unmap_alias(addr, chunk, n);
            frees += r == k_cuda_success;
            return r;
        }
        fake_backend inner;
        uint64_t allocs = 0, frees = 0;
    };
    counting_backend backend_;
    block_pool pool_;
    std::vector<uint64_t> ptrs_;
    pool_state snap_{};
    uint64_t pending_ = 0;
    void take_snapshot() noexcept;  // snap_ and pending_ after each call
};

}  // namespace gpumem::simulate
