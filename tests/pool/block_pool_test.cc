// Unit tests of block_pool against fake_backend: sizes, splitting, best fit, coalescing, events,
// hand-computed fragmentation outcomes, OOM and retry, reuse safety, capture, lifecycle.
#include <chrono>
#include <memory>
#include <catch2/catch.hpp>

#include "pool_test_util.h"

using namespace gpumem;
using namespace gpumem::test;

namespace {
constexpr uint64_t B = fake_backend::k_base;  // the fake's first segment base
constexpr api_id A = api_id::cuMemAlloc_v2;
constexpr api_id F = api_id::cuMemFree_v2;

uint64_t must_alloc(block_pool& p, uint64_t size) {
    uint64_t ptr = 0;
    REQUIRE(p.allocate(size, A, &ptr) == k_cuda_success);
    return ptr;
}
void must_free(block_pool& p, uint64_t ptr) {
    int rc = -1;
    REQUIRE(p.deallocate(ptr, F, &rc));
    REQUIRE(rc == k_cuda_success);
}
block_pool::block_info info(const block_pool& p, uint64_t addr) {
    block_pool::block_info i{};
    REQUIRE(p.lookup(addr, &i));
    return i;
}
}  // namespace

TEST_CASE("a small request is rounded to 512 B in a 2 MiB small segment, and logged", "[pool]") {
    fake_backend dev;
    recording_sink sink;
    block_pool pool(immediate_config(), dev, &sink, 3);
    const uint64_t p = must_alloc(pool, 1);
    CHECK(p == B);
    pool_state s = pool.snapshot();
    CHECK(s.reserved == 2 * MiB);
    CHECK(s.allocated == 512);
    CHECK(s.requested == 1);
    CHECK(s.segments == 1);
    CHECK(s.free_blocks == 1);
    CHECK(s.largest_free == 2 * MiB - 512);

    REQUIRE(sink.events.size() == 2);
    const event& seg = sink.events[0];
    CHECK(seg.ev == ev_kind::segment_alloc);
    CHECK(seg.b.ptr == B);
    CHECK(seg.b.size == 2 * MiB);
    CHECK(seg.pool == pool_id::small);
    CHECK(seg.api == A);
    CHECK(seg.dev == 3);
    const event& al = sink.events[1];
    CHECK(al.ev == ev_kind::alloc);
    CHECK(al.b.ptr == B);
    CHECK(al.b.size == 1);
    CHECK(al.b.asize == 512);
    CHECK(al.b.seg == B);
    CHECK(al.flags == ef_pooled);
    CHECK(al.kind == mem_kind::device);
    CHECK(al.api == A);
    CHECK(al.dev == 3);

    must_free(pool, p);
    const event& fr = sink.events.back();
    CHECK(fr.ev == ev_kind::free);
    CHECK(fr.b.ptr == B);
    CHECK(fr.b.size == 1);
    CHECK(fr.b.asize == 512);
    CHECK(fr.b.seg == B);
    CHECK(fr.api == F);
    CHECK(fr.flags == ef_pooled);
    CHECK(pool.snapshot().free_blocks == 1);
    CHECK(pool.snapshot().largest_free == 2 * MiB);
}

TEST_CASE("size zero is invalid, as for cuMemAlloc", "[pool]") {
    fake_backend dev;
    recording_sink sink;
    block_pool pool(safe_config(), dev, &sink, 0);
    uint64_t p = 77;
    CHECK(pool.allocate(0, A, &p) == k_cuda_invalid_value);
    CHECK(p == 77);
    CHECK(dev.alloc_calls() == 0);
    REQUIRE(sink.count(ev_kind::alloc_fail) == 1);
    CHECK(sink.events[0].err == k_cuda_invalid_value);
}

TEST_CASE("large pool: shared 20 MiB segments below 10 MiB, own rounded segments above", "[pool]") {
    fake_backend dev;
    recording_sink sink;
    block_pool pool(immediate_config(), dev, &sink, 0);

    // 1 MiB + 1: large pool, rounded to 512, in a 20 MiB segment; the rest (> 1 MiB) is split off.
    const uint64_t a = must_alloc(pool, MiB + 1);
    block_pool::block_info ia = info(pool, a);
    CHECK(ia.segment_size == 20 * MiB);
    CHECK(ia.block_size == MiB + 512);
    CHECK(ia.requested == MiB + 1);

    // 9 MiB + 512 fits the rest of the same segment (best fit, no new segment).
    const uint64_t b = must_alloc(pool, 9 * MiB + 512);
    CHECK(info(pool, b).segment == ia.segment);
    CHECK(b == a + MiB + 512);
    CHECK(dev.alloc_calls() == 1);

    // Exactly 10 MiB: its own 10 MiB segment, nothing left over.
    const uint64_t c = must_alloc(pool, 10 * MiB);
    CHECK(info(pool, c).segment_size == 10 * MiB);
    CHECK(info(pool, c).block_size == 10 * MiB);

    // 10 MiB + 1: a 12 MiB segment; the 2 MiB - 512 rest is > 1 MiB so it is split off.
    const uint64_t d = must_alloc(pool, 10 * MiB + 1);
    CHECK(info(pool, d).segment_size == 12 * MiB);
    CHECK(info(pool, d).block_size == 10 * MiB + 512);

    // 19 MiB: a 20 MiB segment whose 1 MiB rest is not > 1 MiB: the block keeps it (asize 20 MiB).
    const uint64_t e = must_alloc(pool, 19 * MiB);
    CHECK(info(pool, e).segment_size == 20 * MiB);
    CHECK(info(pool, e).block_size == 20 * MiB);
    CHECK(sink.of(ev_kind::alloc).back().b.asize == 20 * MiB);

    const pool_state s = pool.snapshot();
    CHECK(s.segments == 4);
    CHECK(s.reserved == 62 * MiB);
    CHECK(s.allocated == (MiB + 512) + (9 * MiB + 512) + 10 * MiB + (10 * MiB + 512) + 20 * MiB);
    // Free: 20 MiB - (MiB+512) - (9MiB+512) in segment 1, 2 MiB - 512 in the 12 MiB segment.
    CHECK(s.free_blocks == 2);
    CHECK(s.largest_free == 10 * MiB - 1024);
    for (const event& ev : sink.of(ev_kind::segment_alloc)) CHECK(ev.pool == pool_id::large);
}

TEST_CASE("small pool split threshold", "[pool]") {
    fake_backend dev;
    pool_config cfg = immediate_config();
    SECTION("default: a 512 B remainder is split off") {
        block_pool pool(cfg, dev, nullptr, 0);
        must_alloc(pool, MiB);
        must_alloc(pool, MiB - 1024);
        CHECK(pool.snapshot().free_blocks == 1);
        CHECK(pool.snapshot().largest_free == 1024);
        must_alloc(pool, 512);
        CHECK(pool.snapshot().largest_free == 512);
        must_alloc(pool, 512);
        CHECK(pool.snapshot().free_blocks == 0);
        CHECK(pool.snapshot().segments == 1);
    }
    SECTION("GPUMEM_POOL_SMALL_SPLIT=4096: a 1 KiB remainder stays in the block") {
        cfg.small_split = 4096;
        block_pool pool(cfg, dev, nullptr, 0);
        must_alloc(pool, MiB);
        const uint64_t p = must_alloc(pool, MiB - 1024);
        CHECK(info(pool, p).block_size == MiB);
        CHECK(pool.snapshot().free_blocks == 0);
        CHECK(pool.snapshot().allocated == 2 * MiB);
    }
}

TEST_CASE("fragmentation: best fit, lowest address, and three-way coalescing", "[pool][frag]") {
    fake_backend dev;
    block_pool pool(immediate_config(), dev, nullptr, 0);
    // Tile one 2 MiB small segment exactly: A 256K | B 64K | C 128K | D 64K | E 1M | F 512K.
    const uint64_t a = must_alloc(pool, 256 * KiB), b = must_alloc(pool, 64 * KiB), c = must_alloc(pool, 128 * KiB),
                   d = must_alloc(pool, 64 * KiB), e = must_alloc(pool, 1024 * KiB), f = must_alloc(pool, 512 * KiB);
    CHECK(a == B);
    CHECK(b == B + 256 * KiB);
    CHECK(c == B + 320 * KiB);
    CHECK(d == B + 448 * KiB);
    CHECK(e == B + 512 * KiB);
    CHECK(f == B + 1536 * KiB);
    CHECK(pool.snapshot().free_blocks == 0);
    CHECK(dev.alloc_calls() == 1);

    must_free(pool, b);
    must_free(pool, d);
    must_free(pool, f);
    pool_state s = pool.snapshot();
    CHECK(s.free_blocks == 3);
    CHECK(s.largest_free == 512 * KiB);

    // 60K: both 64K holes fit; best fit takes the lower one and splits off 4K.
    const uint64_t g = must_alloc(pool, 60 * KiB);
    CHECK(g == b);
    // 100K: only the 512K hole fits.
    const uint64_t h = must_alloc(pool, 100 * KiB);
    CHECK(h == f);
    s = pool.snapshot();
    CHECK(s.free_blocks == 3);  // 4K @316K, 64K @448K, 412K @1636K
    CHECK(s.largest_free == 412 * KiB);

    // Freeing C merges 4K + 128K + 64K into one block of 196K at 316K.
    must_free(pool, c);
    const block_pool::block_info m = info(pool, B + 400 * KiB);
    CHECK_FALSE(m.allocated);
    CHECK(m.block == B + 316 * KiB);
    CHECK(m.block_size == 196 * KiB);
    s = pool.snapshot();
    CHECK(s.free_blocks == 2);
    CHECK(s.largest_free == 412 * KiB);
    CHECK(s.allocated == 256 * KiB + 60 * KiB + 1024 * KiB + 100 * KiB);

    // Free everything: one block covering the whole segment, still cached.
    for (uint64_t p : {a, g, e, h}) must_free(pool, p);
    s = pool.snapshot();
    CHECK(s.free_blocks == 1);
    CHECK(s.largest_free == 2 * MiB);
    CHECK(s.reserved == 2 * MiB);
    CHECK(dev.free_calls() == 0);
    std::string why;
    CHECK(pool.validate(&why));
}

TEST_CASE("fragmentation: a large request cannot use scattered small holes", "[pool][frag]") {
    fake_backend dev;
    block_pool pool(immediate_config(), dev, nullptr, 0);
    // Ten 2 MiB large blocks in one 20 MiB segment; free every other one.
    uint64_t p[10];
    for (auto& x : p) x = must_alloc(pool, 2 * MiB);
    CHECK(dev.alloc_calls() == 1);
    for (int i = 0; i < 10; i += 2) must_free(pool, p[i]);
    pool_state s = pool.snapshot();
    CHECK(s.free_blocks == 5);
    CHECK(s.largest_free == 2 * MiB);
    CHECK(s.allocated == 10 * MiB);
    // 10 MiB free in total, but 3 MiB does not fit any hole: a new segment.
    const uint64_t q = must_alloc(pool, 3 * MiB);
    CHECK(info(pool, q).segment != info(pool, p[0]).segment);
    CHECK(dev.alloc_calls() == 2);
    s = pool.snapshot();
    CHECK(s.segments == 2);
    CHECK(s.free_blocks == 6);
    CHECK(s.largest_free == 17 * MiB);
}

TEST_CASE("deallocate: foreign, interior, double and pending pointers", "[pool]") {
    fake_backend dev;
    recording_sink sink;
    block_pool pool(safe_config(), dev, &sink, 0);
    const uint64_t p = must_alloc(pool, 4096);
    const size_t n0 = sink.events.size();
    int rc = -1;

    CHECK_FALSE(pool.deallocate(0x1000, F, &rc));            // not ours: the caller asks the driver
    CHECK_FALSE(pool.deallocate(B + 2 * MiB, F, &rc));       // just past the segment
    CHECK(sink.events.size() == n0);

    CHECK(pool.deallocate(p + 512, F, &rc));                 // inside a live block
    CHECK(rc == k_cuda_invalid_value);
    CHECK(pool.deallocate(B + MiB, F, &rc));                 // inside a free block
    CHECK(rc == k_cuda_invalid_value);
    REQUIRE(sink.count(ev_kind::free_fail) == 2);
    CHECK(sink.events.back().err == k_cuda_invalid_value);
    CHECK(sink.events.back().b.ptr == B + MiB);

    must_free(pool, p);
    CHECK(pool.pending_bytes() == 4096);
    CHECK(pool.deallocate(p, F, &rc));                       // double free of a pending block
    CHECK(rc == k_cuda_invalid_value);
    CHECK(pool.pending_bytes() == 4096);
    CHECK(dev.free_calls() == 0);
}

TEST_CASE("lookup answers for any address inside a block", "[pool]") {
    fake_backend dev;
    block_pool pool(immediate_config(), dev, nullptr, 0);
    const uint64_t p = must_alloc(pool, 1000), q = must_alloc(pool, 3000);
    block_pool::block_info i{};
    REQUIRE(pool.lookup(q + 2999, &i));
    CHECK(i.block == q);
    CHECK(i.block_size == 3072);
    CHECK(i.requested == 3000);
    CHECK(i.allocated);
    CHECK(i.segment == B);
    CHECK(i.segment_size == 2 * MiB);
    REQUIRE(pool.lookup(p + 1023, &i));
    CHECK(i.block == p);
    REQUIRE(pool.lookup(B + MiB, &i));
    CHECK_FALSE(i.allocated);
    CHECK_FALSE(pool.lookup(B - 1, &i));
    CHECK_FALSE(pool.lookup(B + 2 * MiB, &i));
}

TEST_CASE("safe reuse: a freed block is not handed out again before a synchronize", "[pool][safety]") {
    fake_backend dev;
    recording_sink sink;
    pool_config cfg = safe_config();
    cfg.sync_budget = 4 * MiB;
    cfg.sync_budget_div = 1u << 30;  // budget stays 4 MiB
    block_pool pool(cfg, dev, &sink, 0);

    // 1 MiB blocks (small pool): each free goes pending; while pending < 4 MiB a miss takes a new
    // segment instead of syncing.
    std::vector<uint64_t> seen;
    for (int i = 0; i < 4; ++i) {
        const uint64_t p = must_alloc(pool, MiB);
        for (uint64_t s : seen) CHECK(p != s);  // never an address freed before (no sync yet)
        seen.push_back(p);
        must_free(pool, p);
    }
    CHECK(dev.sync_calls() == 0);
    CHECK(pool.pending_bytes() == 4 * MiB);
    CHECK(pool.snapshot().segments == 2);  // each 2 MiB segment held two of them

    // Now pending has reached the budget: the next miss syncs once and reuses the lowest block.
    const uint64_t p = must_alloc(pool, MiB);
    CHECK(dev.sync_calls() == 1);
    CHECK(pool.sync_count() == 1);
    CHECK(p == seen[0]);
    CHECK(pool.pending_bytes() == 0);
    REQUIRE(sink.count(ev_kind::pool_sync) == 1);
    const event ps = sink.of(ev_kind::pool_sync)[0];
    CHECK(ps.c.count == 4);         // frees released by this sync
    CHECK(ps.api == A);
    // The pool_sync event comes before the alloc that reused the block.
    CHECK(sink.events.back().ev == ev_kind::alloc);
    CHECK(sink.events[sink.events.size() - 2].ev == ev_kind::pool_sync);
    CHECK(pool.snapshot().free_blocks == 2);  // the two segments, each coalesced; one now split
}

TEST_CASE("safe reuse: a miss syncs instead of taking a segment bigger than the budget", "[pool][safety]") {
    fake_backend dev;
    pool_config cfg = safe_config();
    cfg.sync_budget_div = 1u << 30;  // the budget is exactly cfg.sync_budget
    // A 9 MiB block and a 9 MiB block fill a shared 20 MiB large segment but for 2 MiB.
    auto run = [&](uint64_t budget) {
        cfg.sync_budget = budget;
        block_pool pool(cfg, dev, nullptr, 0);
        const uint64_t a = must_alloc(pool, 9 * MiB);
        must_alloc(pool, 9 * MiB);
        must_free(pool, a);  // 9 MiB pending
        return std::pair{a, must_alloc(pool, 9 * MiB)};
    };
    SECTION("budget 16 MiB: a new 20 MiB segment would exceed it, and 9 MiB pending may fit") {
        auto [a, b] = run(16 * MiB);
        CHECK(b == a);
        CHECK(dev.sync_calls() == 1);
        CHECK(dev.alloc_calls() == 1);
    }
    SECTION("budget 32 MiB: 9 MiB pending is below it and a 20 MiB segment is cheaper than a sync") {
        auto [a, b] = run(32 * MiB);
        CHECK(b != a);
        CHECK(dev.sync_calls() == 0);
        CHECK(dev.alloc_calls() == 2);
    }
}

TEST_CASE("immediate reuse hands a freed block out at once, without syncs", "[pool][safety]") {
    fake_backend dev;
    block_pool pool(immediate_config(), dev, nullptr, 0);
    const uint64_t p = must_alloc(pool, MiB);
    must_free(pool, p);
    CHECK(pool.pending_bytes() == 0);
    CHECK(must_alloc(pool, MiB) == p);
    CHECK(dev.sync_calls() == 0);
    CHECK(dev.alloc_calls() == 1);
}

TEST_CASE("stream capture: no sync and no segment free ever, allocation as the driver would", "[pool][capture]") {
    fake_backend dev(56 * MiB);  // room for 10 small segments (20 MiB) and one large one (20 MiB)
    recording_sink sink;
    pool_config cfg = safe_config();
    cfg.sync_budget = 2 * MiB;
    block_pool pool(cfg, dev, &sink, 0);
    dev.set_capturing(true);
    for (int i = 0; i < 20; ++i) must_free(pool, must_alloc(pool, MiB));  // would sync out of capture
    CHECK(dev.sync_calls() == 0);
    CHECK(pool.pending_bytes() == 20 * MiB);
    // Fill the device: the pool must fail as the driver would, still without syncing or freeing.
    uint64_t q = 0;
    int rc = 0;
    for (int i = 0; i < 40 && rc == 0; ++i) rc = pool.allocate(8 * MiB, A, &q);
    CHECK(rc == k_cuda_oom);
    pool.release_cached();
    CHECK(dev.sync_calls() == 0);
    CHECK(dev.free_calls() == 0);
    CHECK(dev.bad_calls() == 0);
    CHECK(sink.count(ev_kind::oom) == 1);

    // Capture over: the next release syncs once and returns the empty segments.
    dev.set_capturing(false);
    pool.release_cached();
    CHECK(dev.sync_calls() == 1);
    CHECK(pool.pending_bytes() == 0);
    // The ten small segments went back.  The large one holds two live 8 MiB blocks, and the last
    // 16 MiB of the device went to two more as segments of their own (the last resort before an
    // OOM): the driver alone would have served them too.
    CHECK(dev.free_calls() == 10);
    CHECK(dev.live_segments() == 3);
    CHECK(pool.snapshot().reserved == 36 * MiB);
    CHECK(pool.snapshot().allocated == 32 * MiB);
}

TEST_CASE("OOM: cached segments are released and the allocation retried", "[pool][oom]") {
    fake_backend dev(24 * MiB);
    recording_sink sink;
    block_pool pool(immediate_config(), dev, &sink, 1);
    const uint64_t a = must_alloc(pool, 12 * MiB);
    must_free(pool, a);  // cached: 12 MiB segment held, free
    CHECK(dev.in_use() == 12 * MiB);

    // 16 MiB needs a 16 MiB segment: 12 + 16 > 24 fails, the cached 12 MiB goes back, retry works.
    const uint64_t b = must_alloc(pool, 16 * MiB);
    CHECK(dev.free_calls() == 1);
    CHECK_FALSE(dev.is_live(a));
    CHECK(dev.in_use() == 16 * MiB);
    REQUIRE(sink.count(ev_kind::segment_free) == 1);
    const event sf = sink.of(ev_kind::segment_free)[0];
    CHECK(sf.b.ptr == a);
    CHECK(sf.b.size == 12 * MiB);
    CHECK(sf.api == A);
    CHECK(sink.count(ev_kind::oom) == 0);

    // True OOM: 10 MiB more cannot fit and nothing is cached.
    uint64_t c = 0;
    CHECK(pool.allocate(10 * MiB, api_id::cudaMalloc, &c) == k_cuda_oom);
    REQUIRE(sink.count(ev_kind::oom) == 1);
    const event o = sink.of(ev_kind::oom)[0];
    CHECK(o.api == api_id::cudaMalloc);
    CHECK(o.dev == 1);
    CHECK(o.p.size == 10 * MiB);
    CHECK(o.p.reserved == 16 * MiB);
    CHECK(o.p.allocated == 16 * MiB);
    CHECK(o.p.requested == 16 * MiB);
    CHECK(o.p.largest_free == 0);
    CHECK(o.p.free_blocks == 0);
    CHECK(o.p.segments == 1);
    CHECK(o.p.gpu_free == 8 * MiB);
    CHECK(o.p.gpu_total == 24 * MiB);
    REQUIRE(sink.events.back().ev == ev_kind::alloc_fail);
    CHECK(sink.events.back().err == k_cuda_oom);
    CHECK(sink.events.back().b.size == 10 * MiB);
    must_free(pool, b);
}

TEST_CASE("safe reuse: a large request syncs when pending bytes cover it twice, even under the budget", "[pool][safety]") {
    fake_backend dev;
    pool_config cfg = safe_config();
    cfg.sync_budget = 1ull << 30;  // far above anything pending here
    cfg.sync_budget_div = 1u << 30;
    block_pool pool(cfg, dev, nullptr, 0);
    const uint64_t a = must_alloc(pool, 60 * MiB);
    must_free(pool, a);  // 60 MiB pending
    CHECK(must_alloc(pool, 40 * MiB) != a);  // 60 < 2 x 40: a new 40 MiB segment, no sync
    CHECK(dev.sync_calls() == 0);
    CHECK(must_alloc(pool, 30 * MiB) == a);  // 60 >= 2 x 30: reused after one sync
    CHECK(dev.sync_calls() == 1);
    CHECK(dev.alloc_calls() == 2);
    const uint64_t c = must_alloc(pool, 8 * MiB);  // medium: below the budget it grows instead
    must_free(pool, c);
    must_alloc(pool, 8 * MiB);
    CHECK(dev.sync_calls() == 1);
}

TEST_CASE("safe reuse: a large request that would use under half a free block syncs for a tighter pending one", "[pool][safety]") {
    fake_backend dev;
    pool_config cfg = safe_config();
    cfg.sync_budget = 1ull << 30;  // only the large-request rules may sync here
    cfg.sync_budget_div = 1u << 30;
    auto setup = [&](block_pool& pool, uint64_t pending_size, uint64_t* seg_a, uint64_t* seg_b) {
        *seg_a = must_alloc(pool, 60 * MiB);
        *seg_b = must_alloc(pool, pending_size);
        must_free(pool, *seg_a);
        must_alloc(pool, 16 * MiB);  // miss, 60 MiB pending covers it: sync 1, cut from segment A
        must_free(pool, *seg_b);     // pending; A has 44 MiB free
        REQUIRE(dev.sync_calls() == 1);
    };
    SECTION("16 MiB would take under half of the 44 MiB block: sync, and the 20 MiB block is used") {
        block_pool pool(cfg, dev, nullptr, 0);
        uint64_t a, b;
        setup(pool, 20 * MiB, &a, &b);
        CHECK(must_alloc(pool, 16 * MiB) == b);
        CHECK(dev.sync_calls() == 2);
    }
    SECTION("22 MiB would take half of it: no sync, cut from segment A though 24 MiB waits") {
        block_pool pool(cfg, dev, nullptr, 0);
        uint64_t a, b;
        setup(pool, 24 * MiB, &a, &b);
        const uint64_t d = must_alloc(pool, 22 * MiB);
        CHECK(d >= a);
        CHECK(d < a + 60 * MiB);
        CHECK(dev.sync_calls() == 1);
    }
}

TEST_CASE("OOM in safe mode: pending frees are released by one sync before failing", "[pool][oom]") {
    fake_backend dev(20 * MiB);
    pool_config cfg = safe_config();
    cfg.min_large_alloc = 16 * MiB;  // 12 MiB is a medium request: no sync before the OOM retry
    block_pool pool(cfg, dev, nullptr, 0);
    const uint64_t a = must_alloc(pool, 12 * MiB);
    must_free(pool, a);  // pending, below the budget
    const uint64_t b = must_alloc(pool, 12 * MiB);  // new segment fails -> sync -> reuse
    CHECK(b == a);
    CHECK(dev.sync_calls() == 1);
    CHECK(dev.alloc_calls() == 2);
    CHECK(dev.free_calls() == 0);
}

TEST_CASE("OOM in safe mode: pending small blocks are synced and their segment freed for a large request", "[pool][oom]") {
    fake_backend dev(22 * MiB);
    block_pool pool(safe_config(), dev, nullptr, 0);
    const uint64_t a = must_alloc(pool, 4096);
    must_free(pool, a);  // the small segment is pending-only
    const uint64_t b = must_alloc(pool, 20 * MiB + 1);  // needs 22 MiB: only after freeing the small segment
    CHECK(b != 0);
    CHECK(dev.sync_calls() == 1);
    CHECK(dev.free_calls() == 1);
    CHECK(pool.snapshot().segments == 1);
}

TEST_CASE("driver errors other than OOM are returned unchanged, without an oom event", "[pool][oom]") {
    fake_backend dev;
    recording_sink sink;
    block_pool pool(safe_config(), dev, &sink, 0);
    dev.fail_next_allocs(1, 900);  // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    uint64_t p = 0;
    CHECK(pool.allocate(100, A, &p) == 900);
    CHECK(sink.count(ev_kind::oom) == 0);
    CHECK(sink.events.back().ev == ev_kind::alloc_fail);
    CHECK(sink.events.back().err == 900);
    CHECK(pool.allocate(100, A, &p) == k_cuda_success);
}

TEST_CASE("a refused allocation's alloc_fail carries the caller's stack id, as alloc does", "[pool][oom]") {
    // The OOM report names the line that asked (docs/log-format.md, "stack" on alloc_fail): the pool
    // was given the stack for every call but logged it only when it served one.
    fake_backend dev(24 * MiB);
    recording_sink sink;
    block_pool pool(immediate_config(), dev, &sink, 0);
    uint64_t p = 0;
    REQUIRE(pool.allocate(4 * MiB, A, &p, 5) == k_cuda_success);
    CHECK(sink.events.back().ev == ev_kind::alloc);
    CHECK(sink.events.back().b.stack == 5);
    uint64_t q = 0;
    CHECK(pool.allocate(64 * MiB, api_id::cudaMalloc, &q, 7) == k_cuda_oom);  // out of memory: oom, then alloc_fail
    REQUIRE(sink.count(ev_kind::oom) == 1);
    REQUIRE(sink.events.back().ev == ev_kind::alloc_fail);
    CHECK(sink.events.back().b.stack == 7);
    CHECK(sink.events.back().err == k_cuda_oom);
    CHECK(pool.allocate(0, A, &q, 9) == k_cuda_invalid_value);  // refused without the driver
    CHECK(sink.events.back().ev == ev_kind::alloc_fail);
    CHECK(sink.events.back().b.stack == 9);
    CHECK(pool.allocate(1 * MiB, A, &q) == k_cuda_success);  // no stack given: none logged
    CHECK(sink.events.back().b.stack == 0);
    // A driver error other than out of memory.
    fake_backend dev2;
    recording_sink sink2;
    block_pool pool2(safe_config(), dev2, &sink2, 0);
    dev2.fail_next_allocs(1, 900);
    CHECK(pool2.allocate(100, A, &q, 11) == 900);
    REQUIRE(sink2.events.back().ev == ev_kind::alloc_fail);
    CHECK(sink2.events.back().b.stack == 11);
    must_free(pool, p);
}

TEST_CASE("a failing synchronize keeps the frees pending", "[pool][safety]") {
    fake_backend dev(4 * MiB);
    block_pool pool(safe_config(), dev, nullptr, 0);
    const uint64_t a = must_alloc(pool, MiB);
    must_free(pool, a);
    dev.set_sync_result(700);  // CUDA_ERROR_ILLEGAL_ADDRESS: the context is broken
    for (int i = 0; i < 3; ++i) must_alloc(pool, MiB);  // the rest of segment 1, then all of segment 2
    CHECK(pool.pending_bytes() == MiB);
    uint64_t p = 0;
    int rc = k_cuda_success;
    for (int i = 0; i < 8 && rc == k_cuda_success; ++i) {
        rc = pool.allocate(MiB, A, &p);
        if (rc == k_cuda_success) CHECK(p != a);
    }
    CHECK(rc == k_cuda_oom);
    CHECK(pool.pending_bytes() == MiB);
    CHECK(dev.sync_calls() >= 1);
}

TEST_CASE("release_cached syncs pending frees once and returns empty segments", "[pool]") {
    fake_backend dev;
    recording_sink sink;
    block_pool pool(safe_config(), dev, &sink, 0);
    const uint64_t a = must_alloc(pool, 100), b = must_alloc(pool, 5 * MiB), c = must_alloc(pool, 200);
    must_free(pool, a);
    must_free(pool, b);
    pool.release_cached();
    CHECK(dev.sync_calls() == 1);
    CHECK(dev.free_calls() == 1);       // the large segment; the small one still holds c
    CHECK(dev.live_segments() == 1);
    CHECK(pool.snapshot().reserved == 2 * MiB);
    CHECK(sink.of(ev_kind::pool_sync)[0].c.count == 2);
    CHECK(sink.of(ev_kind::segment_free)[0].api == api_id::none);
    must_free(pool, c);
    pool.release_cached();
    CHECK(dev.live_segments() == 0);
    CHECK(pool.snapshot().reserved == 0);
    CHECK(dev.bad_calls() == 0);
}

TEST_CASE("drop_all forgets cuMemAlloc segments without calling the backend: the driver frees them with the context", "[pool]") {
    fake_backend dev;  // no VMM
    recording_sink sink;
    block_pool pool(safe_config(), dev, &sink, 2);
    const uint64_t a = must_alloc(pool, 100);
    must_alloc(pool, 30 * MiB);
    must_free(pool, a);
    const uint64_t calls = dev.alloc_calls() + dev.free_calls() + dev.sync_calls();
    pool.drop_all();
    CHECK(dev.alloc_calls() + dev.free_calls() + dev.sync_calls() == calls);
    const pool_state s = pool.snapshot();
    CHECK(s.reserved == 0);
    CHECK(s.segments == 0);
    CHECK(pool.pending_bytes() == 0);
    CHECK(sink.events.back().ev == ev_kind::context_reset);
    CHECK(sink.events.back().dev == 2);
    int rc = 0;
    CHECK_FALSE(pool.deallocate(a, F, &rc));  // no longer ours
    CHECK(must_alloc(pool, 100) != a);        // usable again, on a new segment
}

TEST_CASE("after release_all_at_exit the pool never calls the backend", "[pool]") {
    fake_backend dev;
    block_pool pool(immediate_config(), dev, nullptr, 0);
    const uint64_t a = must_alloc(pool, 100), b = must_alloc(pool, 100);
    CHECK(pool.release_all_at_exit());
    const uint64_t calls = dev.alloc_calls() + dev.free_calls() + dev.sync_calls();
    must_free(pool, a);                       // a late free from a static destructor still works
    CHECK(must_alloc(pool, 100) == a);        // served from the cache
    uint64_t p = 0;
    // Would need a segment: declined, so the hook asks the driver, as without gpumem (a late
    // static destructor's allocation got CUDA_ERROR_DEINITIALIZED from the pool before).
    CHECK(pool.allocate(64 * MiB, A, &p) == k_pool_declined);
    pool.release_cached();
    must_free(pool, b);
    CHECK(dev.alloc_calls() + dev.free_calls() + dev.sync_calls() == calls);
    CHECK(dev.live_segments() == 1);          // leaked on purpose
}

// exit() called by a signal handler that interrupted this thread inside a pool operation: the
// destructor's release_all_at_exit ran with the pool's lock held by the same thread and waited for
// it for ever (a program that exits from a SIGALRM handler hung at exit 16 times in 20).  Here the
// sink, which the pool calls with its lock held, stands in for the handler.
TEST_CASE("release_all_at_exit from inside a pool operation of the same thread returns, and the exit holds", "[pool]") {
    struct exiting_sink final : event_sink {
        block_pool* pool = nullptr;
        bool fired = false, locked = true;
        std::chrono::nanoseconds took{0};
        void emit(event& e) noexcept override {
            if (e.ev != ev_kind::alloc || fired || !pool) return;
            fired = true;
            const auto t0 = std::chrono::steady_clock::now();
            locked = pool->release_all_at_exit();
            took = std::chrono::steady_clock::now() - t0;
        }
    } sink;
    fake_backend dev;
    block_pool pool(immediate_config(), dev, &sink, 0);
    sink.pool = &pool;
    const uint64_t a = must_alloc(pool, 100);  // its alloc event calls release_all_at_exit
    REQUIRE(sink.fired);
    CHECK(sink.took < std::chrono::seconds(2));
    CHECK(!sink.locked);  // said, so the exit hook asks the pool nothing more
    const uint64_t calls = dev.alloc_calls() + dev.free_calls() + dev.sync_calls();
    must_free(pool, a);
    CHECK(must_alloc(pool, 100) == a);  // the cache still serves
    uint64_t p = 0;
    CHECK(pool.allocate(64 * MiB, A, &p) == k_pool_declined);  // the exit took effect at this operation
    CHECK(dev.alloc_calls() + dev.free_calls() + dev.sync_calls() == calls);
}

// A signal handler's free on a thread inside a pool operation cannot ask the pool (its lock may be
// this thread's): holds() answers from the segments' table, without the lock.  Here the sink,
// which the pool calls with its lock held, stands in for the handler.
TEST_CASE("holds: a segment's addresses while the pool holds it, asked inside its own operation, and none after it goes back", "[pool]") {
    struct asking_sink final : event_sink {
        block_pool* pool = nullptr;
        uint64_t ask = 0;
        int answer = -2;
        void emit(event& e) noexcept override {
            if (e.ev == ev_kind::alloc && pool && answer == -2) answer = pool->holds(ask);
        }
    } sink;
    fake_backend dev;
    block_pool pool(safe_config(), dev, &sink, 0);
    const uint64_t a = must_alloc(pool, 1000);
    CHECK(pool.holds(a) == 1);
    CHECK(pool.holds(a + 2 * MiB - 1) == 1);  // the small segment's last byte
    CHECK(pool.holds(a + 2 * MiB) == 0);
    CHECK(pool.holds(a - 1) == 0);
    sink.pool = &pool;
    sink.ask = a + 4096;
    const uint64_t b = must_alloc(pool, 1000);  // its alloc event asks, the lock held
    CHECK(sink.answer == 1);
    const uint64_t c = must_alloc(pool, 3 * MiB);  // a large segment
    CHECK(pool.holds(c + 3 * MiB) == 1);           // free memory inside it: still the pool's
    must_free(pool, a);
    must_free(pool, b);
    must_free(pool, c);
    pool.release_cached();  // both segments go back to the driver
    CHECK(dev.live_segments() == 0);
    CHECK(pool.holds(a) == 0);
    CHECK(pool.holds(c) == 0);
    const uint64_t d = must_alloc(pool, 1000);  // a new segment (fresh addresses), in an emptied slot
    CHECK(d != a);
    CHECK(pool.holds(d) == 1);
    CHECK(pool.holds(a) == 0);
}

TEST_CASE("segment_ranges: a full table counts the rest and can no longer say none", "[pool]") {
    auto r = std::make_unique<segment_ranges>();
    std::vector<int> slots;
    for (int i = 0; i < segment_ranges::k_slots; ++i) slots.push_back(r->add(0x1000000ull * (i + 1), 0x1000));
    CHECK(r->holds(0x1000000ull * 7 + 0xfff) == 1);
    CHECK(r->holds(0x1000000ull * 7 + 0x1000) == 0);
    const int over = r->add(0x1000000ull * (segment_ranges::k_slots + 1), 0x1000);
    CHECK(over == -1);
    CHECK(r->holds(0x1000000ull * 7 + 0x1000) == -1);  // maybe the untracked one's
    CHECK(r->holds(0x1000000ull * 7) == 1);
    r->remove(over);
    CHECK(r->holds(0x1000000ull * 7 + 0x1000) == 0);
    r->remove(slots[6]);
    CHECK(r->holds(0x1000000ull * 7) == 0);
    CHECK(r->add(0x5000000000ull, 0x2000) == slots[6]);  // the emptied slot first
    CHECK(r->holds(0x5000000000ull + 0x1fff) == 1);
    r->clear();
    CHECK(r->holds(0x5000000000ull) == 0);
    CHECK(r->holds(0x1000000ull) == 0);
}

TEST_CASE("stats events at the configured interval", "[pool]") {
    fake_backend dev(100 * MiB);
    recording_sink sink;
    pool_config cfg = safe_config();
    cfg.stats_ms = 1000;
    block_pool pool(cfg, dev, &sink, 0);
    must_alloc(pool, 3 * MiB);
    const size_t n = sink.events.size();
    pool.maybe_emit_stats(5);              // first call: emits, next due at 1'000'000'005
    pool.maybe_emit_stats(999'999'999);
    pool.maybe_emit_stats(1'000'000'004);
    pool.maybe_emit_stats(1'000'000'005);  // due: emits
    REQUIRE(sink.events.size() == n + 2);
    const event st = sink.events.back();
    CHECK(st.ev == ev_kind::stats);
    CHECK(st.p.reserved == 20 * MiB);
    CHECK(st.p.allocated == 3 * MiB);
    CHECK(st.p.segments == 1);
    CHECK(st.p.gpu_total == 100 * MiB);
    CHECK(st.p.gpu_free == 80 * MiB);

    cfg.stats_ms = 0;
    recording_sink none;
    block_pool off(cfg, dev, &none, 0);
    off.maybe_emit_stats(0);
    off.maybe_emit_stats(1ull << 40);
    CHECK(none.events.empty());
}

TEST_CASE("auto reuse: immediate until a stream appears, then one drain and safe", "[pool][auto]") {
    fake_backend dev;
    recording_sink sink;
    pool_config cfg;  // the default
    REQUIRE(cfg.reuse == reuse_mode::automatic);
    block_pool pool(cfg, dev, &sink, 1);
    CHECK(pool.reuse_is_immediate());

    // Before any stream: a freed block is reusable at once, without a sync.
    const uint64_t a = must_alloc(pool, 20 * MiB);
    must_free(pool, a);
    CHECK(pool.pending_bytes() == 0);
    CHECK(must_alloc(pool, 20 * MiB) == a);
    CHECK(dev.sync_calls() == 0);

    // The switch: reuse_safe, then one drain (a pool_sync releasing nothing).
    const size_t before = sink.events.size();
    pool.enter_safe_reuse(api_id::cuStreamCreate);
    CHECK_FALSE(pool.reuse_is_immediate());
    CHECK(dev.sync_calls() == 1);
    REQUIRE(sink.events.size() == before + 2);
    CHECK(sink.events[before].ev == ev_kind::reuse_safe);
    CHECK(sink.events[before].api == api_id::cuStreamCreate);
    CHECK(sink.events[before].dev == 1);
    CHECK(sink.events[before + 1].ev == ev_kind::pool_sync);
    CHECK(sink.events[before + 1].c.count == 0);

    // After it: frees pend until a sync, as in safe mode.
    must_free(pool, a);
    CHECK(pool.pending_bytes() == 20 * MiB);
    CHECK(info(pool, a).allocated == false);
    const uint64_t b = must_alloc(pool, 20 * MiB);
    CHECK(b != a);  // the pending block is not handed out; a new segment is
    std::string why;
    CHECK(pool.validate(&why));

    // A second switch changes nothing and logs nothing.
    const size_t n = sink.events.size();
    pool.enter_safe_reuse(api_id::cuStreamCreateWithPriority);
    CHECK(sink.events.size() == n);
    CHECK(dev.sync_calls() == 1);
}

TEST_CASE("auto reuse: an empty pool switches without a sync, and no sync during a capture", "[pool][auto]") {
    fake_backend dev;
    recording_sink sink;
    SECTION("empty pool") {
        block_pool pool(pool_config{}, dev, &sink, 0);
        pool.enter_safe_reuse(api_id::cuStreamCreate);
        CHECK_FALSE(pool.reuse_is_immediate());
        CHECK(dev.sync_calls() == 0);
        REQUIRE(sink.events.size() == 1);
        CHECK(sink.events[0].ev == ev_kind::reuse_safe);
    }
    SECTION("capture open: the drain is owed until the capture ends") {
        block_pool pool(pool_config{}, dev, &sink, 0);
        const uint64_t a = must_alloc(pool, 4096);
        dev.set_capturing(true);
        pool.enter_safe_reuse(api_id::cuStreamCreate);
        CHECK_FALSE(pool.reuse_is_immediate());
        CHECK(dev.sync_calls() == 0);
        pool.settle_owed_drain();  // still capturing: still owed
        must_free(pool, a);
        must_alloc(pool, 4096);    // an allocation inside the capture does not sync either
        CHECK(dev.sync_calls() == 0);
        dev.set_capturing(false);
        pool.settle_owed_drain();  // what capture_end does
        CHECK(dev.sync_calls() == 1);
        CHECK(sink.of(ev_kind::pool_sync).back().c.count == 1);  // it also released the pending free
        pool.settle_owed_drain();  // paid: nothing more
        CHECK(dev.sync_calls() == 1);
        CHECK(dev.bad_calls() == 0);
    }
    SECTION("capture open: the next allocation after it pays the drain") {
        block_pool pool(pool_config{}, dev, &sink, 0);
        must_alloc(pool, 4096);
        dev.set_capturing(true);
        pool.enter_safe_reuse(api_id::cuStreamCreate);
        dev.set_capturing(false);
        must_alloc(pool, 4096);
        CHECK(dev.sync_calls() == 1);
    }
    SECTION("a poisoned or exiting pool does not drain") {
        block_pool pool(pool_config{}, dev, &sink, 0);
        must_alloc(pool, 4096);
        pool.release_all_at_exit();
        pool.enter_safe_reuse(api_id::cuStreamCreate);
        CHECK(dev.sync_calls() == 0);
    }
}

TEST_CASE("explicit safe and immediate modes ignore the stream switch", "[pool][auto]") {
    fake_backend dev;
    block_pool imm(immediate_config(), dev, nullptr, 0);
    imm.enter_safe_reuse(api_id::cuStreamCreate);
    CHECK(imm.reuse_is_immediate());
    block_pool safe(safe_config(), dev, nullptr, 0);
    CHECK_FALSE(safe.reuse_is_immediate());
    must_alloc(safe, 4096);
    safe.enter_safe_reuse(api_id::cuStreamCreate);
    CHECK(dev.sync_calls() == 0);
}
