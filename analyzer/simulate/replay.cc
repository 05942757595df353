// Replays one device's requests through one policy and measures what the allocator would have done.
#include "replay.h"

namespace gpumem::simulate {

namespace {
// No device holds 2^56 bytes (64 PiB); refusing larger requests keeps every policy's size
// arithmetic (rounding up, adding to reserved) far from overflow on hostile logs.
constexpr uint64_t k_max_request = 1ull << 56;
}  // namespace

replay_result replay(const device_trace& tr, policy& p, const std::string& name, uint64_t capacity) {
    replay_result r;
    r.policy = name;
    for (const request& q : tr.ops) {
        if (q.is_free) {
            p.release(q.id);
        } else if (q.size > k_max_request || !p.allocate(q.id, q.size, q.stream)) {
            // The verdict of docs/metrics.md: capacity when even all free bytes in one piece plus
            // the device's untouched memory could not hold the request.
            uint64_t res = p.reserved(), free_in = res - p.allocated();
            uint64_t gpu_free = capacity > res ? capacity - res : 0;
            r.failure = q.size > free_in + gpu_free ? failure_reason::capacity : failure_reason::fragmentation;
            r.fail_seq = q.seq;
            r.fail_t = q.t;
            r.fail_size = q.size;
            r.fail_reserved = res;
            r.fail_free_in_segments = free_in;
            r.fail_largest_free = p.largest_free();
            break;
        }
        ++r.events;
        uint64_t res = p.reserved(), alloc = p.allocated();
        if (res > r.peak_reserved) {
            r.peak_reserved = res;
            r.peak_seq = q.seq;
            r.peak_t = q.t;
        }
        if (alloc > r.peak_allocated) r.peak_allocated = alloc;
        uint64_t free_in = res - alloc;
        if (free_in > 0) {
            double f = 1.0 - double(p.largest_free()) / double(free_in);
            if (f > r.peak_fragmentation) {
                r.peak_fragmentation = f;
                r.frag_seq = q.seq;
                r.frag_t = q.t;
            }
        }
    }
    r.driver_allocs = p.driver_allocs();
    r.driver_frees = p.driver_frees();
    return r;
}

}  // namespace gpumem::simulate
