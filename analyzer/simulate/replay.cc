// Replays one device's requests through one policy and measures what the allocator would have done.
#include "replay.h"

#include <utility>
#include <vector>

namespace gpumem::simulate {

namespace {
// docs/metrics.md: reserved - allocated - pending (a pending block is not usable yet).
uint64_t free_in_segments(const policy& p) {
    const uint64_t used = p.allocated() + p.pending();
    return p.reserved() > used ? p.reserved() - used : 0;
}
}  // namespace

replay_result replay(const device_trace& tr, policy& p, const std::string& name, uint64_t capacity,
                     const replay_progress& progress) {
    replay_result r;
    r.policy = name;
    // The requested bytes, for the chunk-rounding verdict.
    std::vector<uint64_t> live_size(tr.n_ids, 0);
    uint64_t requested = 0;
    uint64_t n = 0;
    for (const request& q : tr.ops) {
        if ((++n % k_replay_progress_every) == 0 && progress) progress(k_replay_progress_every);
        if (q.is_free) {
            p.release(q.id);
            if (q.id < live_size.size()) requested -= std::exchange(live_size[q.id], 0);
        } else if (q.size > k_max_replay_request || !p.allocate(q.id, q.size, q.stream) ||
                   p.reserved() > k_max_replay_reserved) {
            // The verdict of docs/metrics.md: capacity when even all free bytes in one piece plus
            // the device's untouched memory could not hold the request (for an allocator that
            // unmaps free chunks: plus its rounding, allocated - requested); for such an
            // allocator, chunk rounding when no free block holds it; else fragmentation.  A
            // request no device could hold is not offered to the policy at all.
            const bool chunked = p.unmaps_free_chunks();  // decided by the pool at its first segment
            uint64_t res = p.reserved(), alloc = p.allocated(), free_in = free_in_segments(p);
            // The device's untouched memory: up to the allocator's own limit when it has one
            // below the device (per_process_memory_fraction), else up to --capacity.
            uint64_t bound = capacity;
            if (auto l = p.memory_limit(); l && (!bound || *l < bound)) bound = *l;
            uint64_t gpu_free = bound > res ? bound - res : 0;  // 0 also for a limit of 0
            uint64_t rounding = chunked && alloc > requested ? alloc - requested : 0;
            if (q.size > k_max_replay_request) r.failure = failure_reason::too_large;
            else if (res > k_max_replay_reserved) r.failure = failure_reason::too_much;  // served, and past the bound
            else if (q.size > free_in + gpu_free + rounding) r.failure = failure_reason::capacity;
            else if (chunked && p.largest_free() < q.size) r.failure = failure_reason::chunk_rounding;
            else r.failure = failure_reason::fragmentation;
            r.fail_seq = q.seq;
            r.fail_t = q.t;
            r.fail_size = q.size;
            r.fail_reserved = res;
            r.fail_free_in_segments = free_in;
            r.fail_largest_free = p.largest_free();
            break;
        }
        ++r.events;
        if (!q.is_free && q.id < live_size.size()) requested += live_size[q.id] = q.size;
        uint64_t res = p.reserved(), alloc = p.allocated();
        if (res > r.peak_reserved) {
            r.peak_reserved = res;
            r.peak_seq = q.seq;
            r.peak_t = q.t;
        }
        if (alloc > r.peak_allocated) r.peak_allocated = alloc;
        uint64_t free_in = free_in_segments(p);
        if (free_in > 0) {
            double f = 1.0 - double(p.largest_free()) / double(free_in);
            if (f > r.peak_fragmentation) {
                r.peak_fragmentation = f;
                r.frag_seq = q.seq;
                r.frag_t = q.t;
                r.frag_free = free_in;
            }
        }
    }
    r.driver_allocs = p.driver_allocs();
    r.driver_frees = p.driver_frees();
    return r;
}

}  // namespace gpumem::simulate
