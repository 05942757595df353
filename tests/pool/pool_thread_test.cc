// Multi-threaded stress: 8 threads allocate and free concurrently; exact final counts, no overlap.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <random>
#include <thread>

#include "pool_test_util.h"

using namespace gpumem;
using namespace gpumem::test;

namespace {

struct counting_sink final : event_sink {
    std::atomic<uint64_t> n[size_t(ev_kind::count_)] = {};
    void emit(event& e) noexcept override { n[size_t(e.ev)].fetch_add(1, std::memory_order_relaxed); }
};

void stress(reuse_mode mode) {
    constexpr int k_threads = 8, k_rounds = 4, k_ops = 500;
    fake_backend dev;
    counting_sink sink;
    pool_config cfg = safe_config();
    cfg.reuse = mode;
    cfg.sync_budget = 8 * MiB;
    block_pool pool(cfg, dev, &sink, 0);

    struct held { uint64_t ptr, size; };
    std::vector<std::vector<held>> live(k_threads);
    std::atomic<uint64_t> allocs{0}, frees{0};
    std::atomic<int> failures{0};
    std::string overlap;
    // At each round's end every thread stops with its live blocks held, and one thread checks
    // that all of them, across threads, are pairwise disjoint.
    std::barrier round_end(k_threads, [&]() noexcept {
        std::vector<std::pair<uint64_t, uint64_t>> all;
        for (auto& v : live)
            for (auto& h : v) {
                block_pool::block_info bi{};
                if (!pool.lookup(h.ptr, &bi) || !bi.allocated || bi.block != h.ptr || bi.requested != h.size)
                    overlap = "live block lost";
                all.emplace_back(h.ptr, h.ptr + bi.block_size);
            }
        std::sort(all.begin(), all.end());
        for (size_t i = 1; i < all.size(); ++i)
            if (all[i - 1].second > all[i].first) overlap = "live blocks overlap";
    });

    std::vector<std::thread> threads;
    for (int t = 0; t < k_threads; ++t)
        threads.emplace_back([&, t] {
            std::mt19937 rng(1000 + t);
            auto& mine = live[t];
            for (int round = 0; round < k_rounds; ++round) {
                for (int i = 0; i < k_ops; ++i) {
                    if (mine.empty() || rng() % 100 < 55) {
                        const uint64_t size = rng() % 10 == 0 ? MiB + rng() % (4 * MiB) : 1 + rng() % (128 * KiB);
                        uint64_t p = 0;
                        if (pool.allocate(size, api_id::cuMemAlloc_v2, &p) != k_cuda_success) {
                            ++failures;
                            continue;
                        }
                        mine.push_back({p, size});
                        ++allocs;
                    } else {
                        const size_t k = rng() % mine.size();
                        int rc = -1;
                        if (!pool.deallocate(mine[k].ptr, api_id::cuMemFree_v2, &rc) || rc != 0) ++failures;
                        mine[k] = mine.back();
                        mine.pop_back();
                        ++frees;
                    }
                    if (i % 100 == 0 && t == 0) pool.release_cached();
                }
                round_end.arrive_and_wait();
            }
            for (auto& h : mine) {
                int rc = -1;
                if (!pool.deallocate(h.ptr, api_id::cuMemFree_v2, &rc) || rc != 0) ++failures;
                ++frees;
            }
            mine.clear();
        });
    for (auto& th : threads) th.join();

    CHECK(overlap == "");
    CHECK(failures == 0);
    CHECK(allocs == frees);
    CHECK(sink.n[size_t(ev_kind::alloc)] == allocs);
    CHECK(sink.n[size_t(ev_kind::free)] == frees);
    CHECK(sink.n[size_t(ev_kind::alloc_fail)] == 0);
    const pool_state s = pool.snapshot();
    CHECK(s.allocated == 0);
    CHECK(s.requested == 0);
    CHECK(s.reserved == dev.in_use());
    CHECK(sink.n[size_t(ev_kind::segment_alloc)] - sink.n[size_t(ev_kind::segment_free)] == s.segments);
    if (mode == reuse_mode::safe) CHECK(sink.n[size_t(ev_kind::pool_sync)] == pool.sync_count());
    std::string why;
    CHECK(pool.validate(&why));
    pool.release_cached();
    CHECK(dev.in_use() == 0);
    CHECK(dev.bad_calls() == 0);
}

}  // namespace

TEST_CASE("8 threads, safe reuse", "[pool][threads]") { stress(reuse_mode::safe); }
TEST_CASE("8 threads, immediate reuse", "[pool][threads]") { stress(reuse_mode::immediate); }
