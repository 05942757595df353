// Speed of `gpumem replay`: replayed events per second of each policy, on one core, over a synthetic training loop.
//
// Usage: replay_bench [EVENTS]  (default 4,000,000).  The trace imitates tests/gpu/replay_truth.py:
// persistent weights, then per step activations whose sizes scale with a varying batch, freed
// mostly in reverse order, with small temporaries in between.  Prints one line per policy.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "policy.h"
#include "replay.h"
#include "trace.h"

using namespace gpumem::simulate;

namespace {

device_trace synthetic(uint64_t n_events) {
    device_trace t;
    std::mt19937_64 rng(42);
    uint64_t seq = 0;
    auto alloc = [&](uint64_t size) {
        request r;
        r.size = size;
        r.seq = r.t = seq++;
        r.id = t.n_ids++;
        t.ops.push_back(r);
        return r.id;
    };
    auto release = [&](uint32_t id) {
        request r;
        r.is_free = true;
        r.id = id;
        r.seq = r.t = seq++;
        t.ops.push_back(r);
    };
    for (int i = 0; i < 200; ++i) alloc(uint64_t(1 + rng() % 4096) * 4096);  // weights
    const uint64_t batches[] = {8, 16, 4, 12, 24, 6, 20, 10};
    std::vector<uint32_t> stack;
    for (uint64_t step = 0; t.ops.size() < n_events; ++step) {
        uint64_t b = batches[step % 8];
        for (int layer = 0; layer < 64 && t.ops.size() < n_events; ++layer) {
            stack.push_back(alloc(b * (64 + rng() % 4096) * 256));
            uint32_t tmp = alloc(64 + rng() % 8192);  // a small temporary
            if (rng() % 3) release(tmp);
            else stack.push_back(tmp);
        }
        while (!stack.empty() && t.ops.size() < n_events) {
            // Mostly reverse order, sometimes one out of order.
            size_t k = stack.size() > 1 && rng() % 5 == 0 ? stack.size() - 2 : stack.size() - 1;
            release(stack[k]);
            stack.erase(stack.begin() + std::ptrdiff_t(k));
        }
    }
    return t;
}

}  // namespace

int main(int argc, char** argv) {
    uint64_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 4000000;
    device_trace t = synthetic(n);
    std::printf("replay_bench: %zu events (synthetic training loop), one core\n", t.ops.size());
    for (const char* name : {"ideal", "pytorch", "pytorch:roundup_power2_divisions:4,max_split_size_mb:64",
                             "pytorch-expandable", "gpumem"}) {
        std::string err;
        auto p = make_policy(parse_policy_name(name), 0, 80ull << 30, "{}", &err);
        if (!p) {
            std::fprintf(stderr, "%s\n", err.c_str());
            return 2;
        }
        auto t0 = std::chrono::steady_clock::now();
        replay_result r = replay(t, *p, name, 0);
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("  %-58s %6.2f M events/s  (%.3f s; peak reserved %llu, %llu driver allocs)\n", name,
                    double(r.events) / s / 1e6, s, (unsigned long long)r.peak_reserved,
                    (unsigned long long)r.driver_allocs);
    }
    return 0;
}
