// Replays one device's requests through one policy and measures what the allocator would have done.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/pool/block_pool.h"
#include "policy.h"
#include "trace.h"

namespace gpumem::simulate {

// Why a run fails at an event (docs/metrics.md, OOM diagnosis); too_large: the request is above
// k_max_replay_request, which no device could serve, so every policy stops there, with or without a
// capacity; too_much: the policy's reserved bytes would pass k_max_replay_reserved.
enum class failure_reason : uint8_t { none, capacity, fragmentation, chunk_rounding, too_large, too_much };
inline constexpr const char* k_failure_reason_names[] = {"none", "capacity", "fragmentation", "chunk rounding",
                                                         "larger than any device", "more than any device holds"};

// What a replay simulates at most, far above any device's memory (an H200 has 141 GB): a request of
// 2 TiB, and 4 TiB reserved by one policy.  gpumem's pool on virtual memory keeps a record per 2 MiB
// chunk, so a hostile log's requests of 2^48 bytes took 17 GB and minutes each, and a few of them,
// or requests of one size after another that the pool caches, got the replay killed for memory.
// Within the bounds it takes a few hundred MB.  The request bound is one limit for all policies, so
// they all stop at the same request, and it keeps every policy's size arithmetic (rounding up,
// adding to reserved) far from overflow; it is below gpumem's pool's own k_max_request.
inline constexpr uint64_t k_max_replay_request = uint64_t(1) << 41;
inline constexpr uint64_t k_max_replay_reserved = uint64_t(1) << 42;
static_assert(k_max_replay_request < k_max_request, "the pool must serve every request a replay makes");

struct replay_result {
    std::string policy;
    uint64_t peak_reserved = 0, peak_seq = 0, peak_t = 0;
    uint64_t peak_allocated = 0;  // block bytes at their own peak
    uint64_t driver_allocs = 0, driver_frees = 0;
    double peak_fragmentation = 0;  // max over events of 1 - largest free / free in segments
    uint64_t frag_seq = 0, frag_t = 0;
    uint64_t frag_free = 0;         // free in segments then: a maximum on 1 KiB free means little
    uint64_t events = 0;            // requests replayed (up to the failure, if any)
    // The first request the allocator could not serve, where the replay stopped: with a capacity,
    // for want of memory; in every mode, a request above k_max_replay_request, or one after which
    // the policy would reserve more than k_max_replay_reserved.
    failure_reason failure = failure_reason::none;
    uint64_t fail_seq = 0, fail_t = 0, fail_size = 0;
    uint64_t fail_reserved = 0, fail_free_in_segments = 0, fail_largest_free = 0;
};

// Told how many more requests were replayed, every k_replay_progress_every of them: one replay of a
// large log takes seconds, and `gpumem replay --progress` says how far it is.
using replay_progress = std::function<void(uint64_t requests)>;
inline constexpr uint64_t k_replay_progress_every = 4096;

// Runs `p` over `tr`.  `capacity` (0 = unlimited) is only used to tell a capacity failure from a
// fragmentation one; the policy itself enforces it.
replay_result replay(const device_trace& tr, policy& p, const std::string& name, uint64_t capacity,
                     const replay_progress& progress = {});

}  // namespace gpumem::simulate
