// Property tests: thousands of random operations per seed against a reference model, checking the
// pool's promises after every step, and that its event log alone rebuilds every segment's layout.
#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <set>

#include "layout_replayer.h"
#include "pool_test_util.h"

using namespace gpumem;
using namespace gpumem::test;

namespace {

struct live_block { uint64_t size, asize; };

// Bytes the driver holds for live blocks: the chunks (of `chunk` bytes, counted from each
// segment's base) that hold a live byte, and whole cuMemAlloc segments (the OOM path's last
// resort, which a chunk larger than the granularity reaches: a request too small for a free chunk).
uint64_t held_for_live(const std::map<uint64_t, live_block>& live, const block_pool& pool, uint64_t chunk) {
    std::set<std::pair<uint64_t, uint64_t>> seen;
    std::map<uint64_t, uint64_t> plain;
    for (auto& [p, b] : live) {
        block_pool::block_info bi{};
        if (!pool.lookup(p, &bi)) continue;
        if (!bi.vmm) {
            plain[bi.segment] = bi.segment_size;
            continue;
        }
        for (uint64_t k = (p - bi.segment) / chunk; k <= (p + b.asize - 1 - bi.segment) / chunk; ++k)
            seen.insert({bi.segment, k});
    }
    uint64_t n = seen.size() * chunk;
    for (auto& [base, size] : plain) n += size;
    return n;
}

// vmm_chunk != 0: the device offers virtual memory with that granularity, and every OOM outside a
// capture must respect the guarantee: chunks holding live bytes + the request's chunks > capacity.
// Without stitching, also that no hole of the request's pool, joined to its free neighbours, could
// have taken it with the memory the driver had left.
void run_random(uint32_t seed, reuse_mode mode, int ops, uint64_t vmm_chunk = 0, bool stitch = false,
                uint64_t pool_chunk = 0, bool arenas = true) {
    INFO("seed " << seed << " mode " << int(mode) << " vmm chunk " << vmm_chunk << " stitch " << stitch
                 << " pool chunk " << pool_chunk << " arenas " << arenas);
    std::mt19937_64 rng(seed);
    const uint64_t capacity = 320 * MiB;
    fake_backend dev(capacity);  // tight enough that OOM and cache release happen
    dev.set_vmm(vmm_chunk);
    recording_sink sink;
    pool_config cfg = safe_config();
    cfg.reuse = mode;
    cfg.sync_budget = 16 * MiB;
    cfg.vmm = vmm_chunk != 0;  // opt-in (GPUMEM_POOL_VMM=on)
    cfg.stitch = stitch;
    cfg.chunk = pool_chunk;
    cfg.arenas = arenas;
    block_pool pool(cfg, dev, &sink, 0);
    layout_replayer replay;
    replay.immediate = mode != reuse_mode::safe;
    bool safe_now = mode == reuse_mode::safe;  // auto turns safe halfway, as if a stream appeared

    std::map<uint64_t, live_block> live;           // the reference model: what the program holds
    std::map<uint64_t, uint64_t> freed_since_sync;  // safe mode: ranges not to be handed out yet
    uint64_t last_sync = 0;
    uint64_t n_oom = 0, n_alloc = 0, n_free = 0, n_oom_checked = 0;
    auto pick_size = [&]() -> uint64_t {
        const int r = int(rng() % 100);
        if (r < 55) return 1 + rng() % (64 * KiB);
        if (r < 80) return 1 + rng() % MiB;
        if (r < 95) return MiB + 1 + rng() % (11 * MiB);
        return 10 * MiB + rng() % (30 * MiB);
    };

    for (int op = 0; op < ops; ++op) {
        INFO("op " << op);
        if (mode == reuse_mode::automatic && op == ops / 2) {
            pool.enter_safe_reuse(api_id::cuStreamCreate);
            safe_now = true;
            last_sync = dev.sync_calls();
        }
        const int r = int(rng() % 100);
        if (r < 55 || live.empty()) {
            const uint64_t size = pick_size();
            uint64_t p = 0;
            const size_t ev0 = sink.events.size();
            const int rc = pool.allocate(size, api_id::cuMemAlloc_v2, &p);
            if (rc == k_cuda_oom) {
                ++n_oom;
                if (vmm_chunk) {
                    // The pool's limit is the driver's: this request could not have fitted.
                    const uint64_t c = pool.chunk_size();
                    const uint64_t held = held_for_live(live, pool, c);
                    const uint64_t need = held + (size + c - 1) / c * c;
                    INFO("size " << size << " held for live blocks " << held);
                    CHECK(need > capacity);
                    CHECK(dev.in_use() == held);
                    if (!stitch) {
                        replay.catch_up(sink);
                        const uint64_t asize = (size + cfg.round - 1) / cfg.round * cfg.round;
                        const pool_id p = size <= cfg.small_size ? pool_id::small : pool_id::large;
                        CHECK(replay.fewest_hole_bytes(p, asize, c) > capacity - dev.in_use());
                    }
                    ++n_oom_checked;
                }
                REQUIRE(sink.count(ev_kind::oom) == n_oom);
                // Before failing, the pool released all it could: nothing pending (no capture
                // here) and no fully free segment left.
                CHECK(pool.pending_bytes() == 0);
                block_pool::block_info bi{};
                for (auto& ev : sink.events)
                    if (ev.ev == ev_kind::segment_alloc && dev.is_live(ev.b.ptr) && pool.lookup(ev.b.ptr, &bi))
                        CHECK_FALSE((!bi.allocated && bi.block_size == bi.segment_size));
                (void)ev0;
            } else {
                REQUIRE(rc == k_cuda_success);
                ++n_alloc;
                block_pool::block_info bi{};
                REQUIRE(pool.lookup(p, &bi));
                CHECK(bi.block == p);
                CHECK(bi.allocated);
                CHECK(bi.requested == size);
                CHECK(bi.block_size >= size);
                CHECK(p % 512 == 0);
                // Disjoint from every live block.
                auto nx = live.lower_bound(p);
                if (nx != live.end()) CHECK(p + bi.block_size <= nx->first);
                if (nx != live.begin()) CHECK(std::prev(nx)->first + std::prev(nx)->second.asize <= p);
                // Safe mode: nothing freed since the last sync may come back.
                if (safe_now) {
                    if (dev.sync_calls() != last_sync) freed_since_sync.clear(), last_sync = dev.sync_calls();
                    auto f = freed_since_sync.upper_bound(p + bi.block_size - 1);
                    if (f != freed_since_sync.begin()) CHECK(std::prev(f)->second <= p);
                }
                live[p] = {size, bi.block_size};
            }
        } else if (r < 95) {
            auto it = live.begin();
            std::advance(it, rng() % live.size());
            int rc = -1;
            REQUIRE(pool.deallocate(it->first, api_id::cuMemFree_v2, &rc));
            REQUIRE(rc == k_cuda_success);
            ++n_free;
            if (safe_now) {
                if (dev.sync_calls() != last_sync) freed_since_sync.clear(), last_sync = dev.sync_calls();
                freed_since_sync[it->first] = it->first + it->second.asize;
            }
            live.erase(it);
        } else if (r < 97) {
            pool.release_cached();
        } else {
            // A short capture: a few allocations that may neither sync nor free segments.
            dev.set_capturing(true);
            for (int i = 0; i < 3; ++i) {
                uint64_t p = 0;
                const uint64_t size = 1 + rng() % (256 * KiB);
                const int rc = pool.allocate(size, api_id::cuMemAlloc_v2, &p);
                if (rc == k_cuda_success) {
                    block_pool::block_info bi{};
                    REQUIRE(pool.lookup(p, &bi));
                    auto nx = live.lower_bound(p);
                    if (nx != live.end()) CHECK(p + bi.block_size <= nx->first);
                    if (nx != live.begin()) CHECK(std::prev(nx)->first + std::prev(nx)->second.asize <= p);
                    live[p] = {size, bi.block_size};
                    ++n_alloc;
                } else {
                    ++n_oom;
                }
            }
            dev.set_capturing(false);
        }

        std::string why;
        REQUIRE(pool.validate(&why));
        // The reference model's totals equal the pool's counters.
        uint64_t alloc_b = 0, req_b = 0;
        for (auto& [p, b] : live) alloc_b += b.asize, req_b += b.size;
        const pool_state s = pool.snapshot();
        REQUIRE(s.allocated == alloc_b);
        REQUIRE(s.requested == req_b);
        REQUIRE(s.reserved == dev.in_use());
        REQUIRE(s.segments + pool.kept_ranges() == dev.reservations() + dev.live_segments());
        // The log alone gives the same layout.
        replay.catch_up(sink);
        REQUIRE(replay.error == "");
        const pool_state rs = replay.state();
        REQUIRE(rs.reserved == s.reserved);
        REQUIRE(rs.allocated == s.allocated);
        REQUIRE(rs.segments == s.segments);
        REQUIRE(rs.free_blocks == s.free_blocks);
        REQUIRE(rs.largest_free == s.largest_free);
    }
    CHECK(dev.bad_calls() == 0);
    CHECK(sink.count(ev_kind::alloc) == n_alloc);
    CHECK(sink.count(ev_kind::free) == n_free);
    // Free everything and give it all back: nothing may leak.
    for (auto& [p, b] : live) {
        int rc = -1;
        REQUIRE(pool.deallocate(p, api_id::cuMemFree_v2, &rc));
    }
    pool.release_cached();
    CHECK(dev.in_use() == 0);
    CHECK(pool.snapshot().reserved == 0);
    // The run must have exercised the interesting paths, or it proves little.
    CHECK(n_oom > 0);
    CHECK(sink.count(ev_kind::segment_free) > 0);
    if (vmm_chunk) CHECK(sink.count(ev_kind::segment_unmap) > 0);
    if (vmm_chunk) CHECK(n_oom_checked > 0);
    if (vmm_chunk) CHECK(dev.reservations() == 0);
    if (safe_now) CHECK(sink.count(ev_kind::pool_sync) > 0);
    if (mode == reuse_mode::automatic) CHECK(sink.count(ev_kind::reuse_safe) == 1);
    uint64_t stitched = 0, dissolved = 0;
    pool.stitch_counts(&stitched, nullptr, &dissolved);
    if (stitch && mode != reuse_mode::immediate) {
        // Every stitched segment went back to its lenders by the end; in safe mode from the start,
        // stitching must have run (auto stitches only after its switch, and may not need to).
        if (mode == reuse_mode::safe) CHECK(stitched > 0);
        CHECK(dissolved == stitched);
        CHECK(dev.aliases() == 0);
    } else {
        // Off, or under immediate reuse, where a stitched block could not settle without a wait.
        CHECK(stitched == 0);
    }
}

}  // namespace

TEST_CASE("random operations keep every promise (safe reuse)", "[pool][property]") {
    for (uint32_t seed : {1u, 2u, 3u, 42u, 1234u}) run_random(seed, reuse_mode::safe, 3000);
}

TEST_CASE("random operations keep every promise (immediate reuse)", "[pool][property]") {
    for (uint32_t seed : {5u, 6u, 7u, 99u, 4321u}) run_random(seed, reuse_mode::immediate, 3000);
}

TEST_CASE("random operations keep every promise (auto reuse, a stream appears halfway)", "[pool][property]") {
    for (uint32_t seed : {8u, 9u, 77u}) run_random(seed, reuse_mode::automatic, 3000);
}

TEST_CASE("random operations on virtual memory keep every promise and the driver's limit", "[pool][property][vmm]") {
    for (uint32_t seed : {11u, 12u, 13u}) run_random(seed, reuse_mode::safe, 3000, 2 * MiB);
    for (uint32_t seed : {14u, 15u}) run_random(seed, reuse_mode::immediate, 3000, 2 * MiB);
    run_random(16u, reuse_mode::automatic, 3000, 2 * MiB);
    run_random(17u, reuse_mode::immediate, 3000, 4 * MiB);  // a coarser granularity
}

TEST_CASE("random operations on virtual memory without arenas keep every promise and the driver's limit", "[pool][property][vmm]") {
    // GPUMEM_POOL_ARENA=off: segments per growth, whose holes the OOM path maps again.
    for (uint32_t seed : {41u, 42u, 43u}) run_random(seed, reuse_mode::safe, 3000, 2 * MiB, false, 0, false);
    for (uint32_t seed : {44u, 45u}) run_random(seed, reuse_mode::immediate, 3000, 2 * MiB, false, 0, false);
    run_random(46u, reuse_mode::automatic, 3000, 2 * MiB, false, 0, false);
    run_random(47u, reuse_mode::immediate, 3000, 2 * MiB, false, 6 * MiB, false);
}

TEST_CASE("random operations with stitching keep every promise and the driver's limit", "[pool][property][vmm]") {
    for (uint32_t seed : {21u, 22u, 23u}) run_random(seed, reuse_mode::safe, 3000, 2 * MiB, true);
    for (uint32_t seed : {24u, 25u}) run_random(seed, reuse_mode::immediate, 3000, 2 * MiB, true);
    run_random(26u, reuse_mode::automatic, 3000, 2 * MiB, true);
}

TEST_CASE("random operations with GPUMEM_POOL_CHUNK larger than the granularity keep every promise", "[pool][property][vmm]") {
    run_random(31u, reuse_mode::safe, 3000, 2 * MiB, false, 6 * MiB);
    run_random(32u, reuse_mode::safe, 3000, 2 * MiB, true, 6 * MiB);
    run_random(33u, reuse_mode::immediate, 3000, 2 * MiB, false, 10 * MiB);
    run_random(34u, reuse_mode::automatic, 3000, 2 * MiB, true, 4 * MiB);
}

// Stitching on kept ranges (GPUMEM_POOL_STITCH_KEEP 0-3) under what the driver may do to it:
// large requests during captures (no unmap then), refused maps, and (half the seeds) a refused
// second-mapping unmap now and then.  After every operation: the invariants, no misuse of the
// device (an unmap during a capture, a chunk released or an address range freed while still
// mapped), and the reserved bytes the device's; at the end, where nothing was refused, nothing left.
TEST_CASE("random stitching on kept ranges, with captures and refused driver calls, misuses no driver call", "[pool][property][vmm][stitch]") {
    uint64_t stitches = 0, on_kept = 0;
    for (uint32_t seed = 1; seed <= 40; ++seed) {
        std::mt19937_64 rng(seed);
        const bool refuse = seed % 2 == 0;
        fake_backend dev(512 * MiB);
        dev.set_vmm(2 * MiB);
        recording_sink sink;
        pool_config cfg = safe_config();
        cfg.vmm = true;
        cfg.stitch = true;
        cfg.sync_budget = 16 * MiB;
        cfg.stitch_keep = uint32_t(rng() % 4);
        if (seed % 4 < 2) cfg.trim = 32 * MiB;
        INFO("seed " << seed << " keep " << cfg.stitch_keep << " trim " << cfg.trim << " refusals " << refuse);
        block_pool pool(cfg, dev, &sink, 0);
        std::vector<uint64_t> live;
        for (int op = 0; op < 4000; ++op) {
            INFO("op " << op);
            const int r = int(rng() % 100);
            if (r < 50 || live.empty()) {
                const int kind = int(rng() % 10);
                const uint64_t size = kind < 5 ? 1 + rng() % MiB
                                    : kind < 8 ? 2 * MiB + rng() % (10 * MiB)
                                               : 16 * MiB + rng() % (64 * MiB);
                const bool capture = rng() % 10 == 0;
                const int fault = int(rng() % 20);
                if (fault == 0) dev.fail_next_allocs(1, k_cuda_oom);
                if (fault == 1 && refuse) dev.fail_next_unmap_alias(1);
                dev.set_capturing(capture);
                uint64_t p = 0;
                if (pool.allocate(size, api_id::cuMemAlloc_v2, &p) == k_cuda_success) live.push_back(p);
                dev.set_capturing(false);
                dev.fail_next_allocs(0, k_cuda_oom);
                dev.fail_next_unmap_alias(0);
            } else if (r < 95) {
                const size_t k = rng() % live.size();
                int rc = -1;
                REQUIRE(pool.deallocate(live[k], api_id::cuMemFree_v2, &rc));
                live[k] = live.back();
                live.pop_back();
            } else {
                pool.release_cached();
            }
            std::string why;
            REQUIRE(pool.validate(&why));
            REQUIRE(dev.bad_calls() == 0);
            REQUIRE(pool.snapshot().reserved == dev.in_use());
            // A refused unmap leaks its range's address space, with what is mapped in it.
            if (!refuse) REQUIRE(pool.snapshot().segments + pool.kept_ranges() == dev.reservations() + dev.live_segments());
        }
        for (uint64_t p : live) {
            int rc = -1;
            REQUIRE(pool.deallocate(p, api_id::cuMemFree_v2, &rc));
        }
        pool.release_cached();
        CHECK(dev.bad_calls() == 0);
        uint64_t made = 0, reused = 0;
        pool.stitch_counts(&made, nullptr, nullptr, &reused);
        stitches += made;
        on_kept += reused;
        if (!refuse) {
            CHECK(dev.aliases() == 0);
            CHECK(dev.in_use() == 0);
            CHECK(dev.reservations() == 0);
        }
    }
    CHECK(on_kept > 100);  // the runs stitched on kept ranges, or they prove little
    CHECK(stitches > on_kept);
}

// The replayer itself, on events made by hand: it must accept an arena segment's growth and
// refuse a map over memory that is there, or the property runs above prove nothing about maps.
TEST_CASE("the layout replayer: arena segments, segment_map into unmapped bytes only", "[pool][property][vmm]") {
    constexpr uint64_t M = 1 << 20, S = 0x40000000;
    auto ev = [](ev_kind k, uint64_t ptr, uint64_t size, uint64_t asize = 0, uint64_t seg = 0x40000000) {
        event e{};
        e.ev = k;
        e.b.ptr = ptr;
        e.b.size = size;
        e.b.asize = asize;
        e.b.seg = seg;
        return e;
    };
    layout_replayer r;
    r.immediate = true;
    r.apply(ev(ev_kind::segment_alloc, S, 8 * M, 2 * M, 0));  // [0, 2) mapped of 8 MiB
    r.apply(ev(ev_kind::alloc, S, M, M));
    r.apply(ev(ev_kind::segment_map, S + 2 * M, 2 * M));        // joins the free [1, 2)
    REQUIRE(r.error.empty());
    pool_state p = r.state();
    CHECK(p.reserved == 4 * M);
    CHECK(p.free_blocks == 1);
    CHECK(p.largest_free == 3 * M);
    r.apply(ev(ev_kind::segment_unmap, S + 2 * M, 2 * M));      // touches the never-mapped [4, 8)
    r.apply(ev(ev_kind::segment_map, S + 2 * M, 4 * M));        // across both
    REQUIRE(r.error.empty());
    p = r.state();
    CHECK(p.reserved == 6 * M);
    CHECK(p.largest_free == 5 * M);
    layout_replayer again = r;
    again.apply(ev(ev_kind::segment_map, S + 4 * M, 2 * M));    // free bytes now
    CHECK_THAT(again.error, Catch::EndsWith("segment_map of bytes that are not unmapped"));
    again = r;
    again.apply(ev(ev_kind::segment_map, S, 2 * M));            // the live block
    CHECK_THAT(again.error, Catch::EndsWith("segment_map of bytes that are not unmapped"));
    again = r;
    again.apply(ev(ev_kind::segment_map, S + 6 * M, 2 * M, 0, S + 8 * M));  // no such segment
    CHECK_THAT(again.error, Catch::EndsWith("segment_map outside every segment"));
    r.apply(ev(ev_kind::free, S, M, M));
    r.apply(ev(ev_kind::segment_free, S, 8 * M, 0, 0));         // free [0, 6) and unmapped [6, 8)
    CHECK(r.error.empty());
    CHECK(r.state().segments == 0);
}

// Random workloads mixing what the tests above take one at a time: stitching, fences or ordered
// release (fences in batches of 1-4, ordered releases one by one or in batches of up to 32 MiB),
// trimming, a GPU that runs behind, captures opened and closed, and release_cached; validate()
// after every step, no backend call the driver would refuse, and at every OOM outside a capture
// the promise: the chunks under live requests plus the request's exceed the device.
TEST_CASE("random operations with stitching, fences or ordered release, a GPU behind and captures keep every invariant", "[pool][property][vmm]") {
    uint64_t total_oom_checked = 0;
    for (int seed = 1; seed <= 300; ++seed) {
        INFO("seed " << seed);
        std::mt19937_64 rng(seed);
        fake_backend dev(seed % 2 ? 256 * MiB : 1ull << 30);
        dev.set_vmm(2 * MiB);
        dev.enable_events(true);
        dev.set_auto_complete(false);
        recording_sink sink;
        stream_set streams;
        pool_config cfg = safe_config();
        cfg.vmm = true;
        cfg.stitch = true;
        cfg.order = seed % 3 != 0;
        cfg.fence_batch = 1 + seed % 4;
        cfg.order_batch = (seed / 2) % 2 ? 32 * MiB : 0;  // with and without a non-blocking stream
        if (seed % 5 == 0) cfg.trim = 8 * MiB;
        const uint64_t capacity = seed % 2 ? 256 * MiB : 1ull << 30;
        block_pool pool(cfg, dev, &sink, 0);
        const uint64_t st = 0x5000;
        if (seed % 2) streams.created(1, st, true);
        pool.set_streams(&streams, 1);
        std::vector<uint64_t> live;
        std::map<uint64_t, live_block> requests;  // live's requests, for the promise at an OOM
        bool capturing = false;
        for (int op = 0; op < 3000; ++op) {
            const int r = int(rng() % 100);
            if (r < 45) {
                static const uint64_t sizes[] = {512, 4096, 700 * KiB, 1 * MiB, 1536 * KiB, 3 * MiB, 5 * MiB,
                                                 6 * MiB, 9 * MiB, 11 * MiB, 13 * MiB, 21 * MiB, 40 * MiB};
                uint64_t sz = sizes[rng() % (sizeof sizes / sizeof *sizes)];
                if (rng() % 3 == 0) sz += rng() % (512 * KiB);
                uint64_t p = 0;
                const int rc = pool.allocate(sz, api_id::cuMemAlloc_v2, &p);
                const uint64_t asize = (sz + cfg.round - 1) / cfg.round * cfg.round;
                if (rc == k_cuda_success) {
                    live.push_back(p);
                    requests[p] = live_block{sz, asize};
                } else if (rc == k_cuda_oom && !capturing) {
                    // Counted by the requests (rounded to the pool's 512 B), not by the blocks
                    // that hold them: a block's unused rest must not hold a chunk of its own.
                    const uint64_t c = pool.chunk_size();
                    const uint64_t held = held_for_live(requests, pool, c);
                    INFO("op " << op << " size " << sz << " chunks under live requests " << held);
                    CHECK(held + (asize + c - 1) / c * c > capacity);
                    ++total_oom_checked;
                }
            } else if (r < 85) {
                if (live.empty()) continue;
                size_t i = rng() % live.size();
                if (rng() % 2) dev.enqueue_work_on(rng() % 2 ? k_stream_legacy : st);
                int rc = -1;
                requests.erase(live[i]);
                REQUIRE(pool.deallocate(live[i], api_id::cuMemFree_v2, &rc));
                REQUIRE(rc == k_cuda_success);
                live[i] = live.back();
                live.pop_back();
            } else if (r < 92) {
                dev.complete_all();
            } else if (r < 95) {
                capturing = !capturing;
                dev.set_capturing(capturing);
            } else if (r < 97) {
                pool.release_cached();
            } else {
                dev.complete_through(dev.last_ticket() > 3 ? dev.last_ticket() - 3 : 0);
            }
            std::string why;
            REQUIRE(pool.validate(&why));
            REQUIRE(dev.bad_calls() == 0);
        }
    }
    CHECK(total_oom_checked > 100);  // the 256 MiB devices run out, outside captures too
}
