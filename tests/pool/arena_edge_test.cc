// Arenas at the edges: after exit no backend call, a trim that spares what the growth maps, holes mapped from either side.
#include <catch2/catch.hpp>

#include <atomic>
#include <string>

#include "pool_test_util.h"

using namespace gpumem;
using namespace gpumem::test;

namespace {

constexpr api_id A = api_id::cuMemAlloc_v2;
constexpr api_id F = api_id::cuMemFree_v2;

pool_config arena_config() {
    pool_config cfg = immediate_config();
    cfg.vmm = true;  // arenas: auto (the default)
    return cfg;
}

// An arena pool under safe reuse with GPUMEM_POOL_TRIM=trim, whose 1 MiB sync budget makes each
// miss release the pending frees by one synchronize: the set-up of the trim tests below.
struct trimming_arena {
    fake_backend dev{1ull << 30};
    recording_sink sink;
    block_pool pool;
    static pool_config config(uint64_t trim) {
        pool_config cfg = arena_config();
        cfg.reuse = reuse_mode::safe;
        cfg.sync_budget = 1 * MiB;
        cfg.trim = trim;
        return cfg;
    }
    // dev is made first (declared first) and given 2 MiB chunks before the pool asks for them.
    explicit trimming_arena(uint64_t trim) : pool((dev.set_vmm(2 * MiB), config(trim)), dev, &sink, 0) {}
};

// Forwards to a fake_backend and counts every call, whatever it is.
struct counting_backend final : pool_backend {
    fake_backend& d;
    std::atomic<uint64_t> calls{0};
    explicit counting_backend(fake_backend& f) : d(f) {}
    int segment_alloc(uint64_t b, uint64_t* p) noexcept override { ++calls; return d.segment_alloc(b, p); }
    int segment_free(uint64_t b) noexcept override { ++calls; return d.segment_free(b); }
    int synchronize() noexcept override { ++calls; return d.synchronize(); }
    bool may_synchronize() noexcept override { return d.may_synchronize(); }  // a flag read, not a driver call
    void mem_info(uint64_t* f, uint64_t* t) noexcept override { ++calls; d.mem_info(f, t); }
    uint64_t vmm_granularity() noexcept override { ++calls; return d.vmm_granularity(); }
    int va_reserve(uint64_t b, uint64_t* p) noexcept override { ++calls; return d.va_reserve(b, p); }
    int va_free(uint64_t b, uint64_t n) noexcept override { ++calls; return d.va_free(b, n); }
    int map_chunks(uint64_t a, uint64_t c, size_t n, uint64_t* h) noexcept override { ++calls; return d.map_chunks(a, c, n, h); }
    int unmap_chunks(uint64_t a, uint64_t c, size_t n, const uint64_t* h) noexcept override {
        ++calls;
        return d.unmap_chunks(a, c, n, h);
    }
};

}  // namespace

// docs/pool.md, Lifecycle: after release_all_at_exit "the pool makes no backend call at all" and
// an allocation that the cache cannot serve is declined (the hook passes it to the driver).  With arenas a miss
// maps chunks into the arena's tail (map_hole has no exiting_ check): cuMemCreate/cuMemMap on a
// driver that may already be unloaded.
TEST_CASE("arenas: after release_all_at_exit a miss maps nothing and is declined", "[pool][vmm][arena]") {
    fake_backend dev(1ull << 30);
    dev.set_vmm(2 * MiB);
    counting_backend be(dev);
    block_pool pool(arena_config(), be, nullptr, 0);
    uint64_t a = 0, p = 0;
    REQUIRE(pool.allocate(3 * MiB, A, &a) == k_cuda_success);  // a new arena: 4 MiB mapped, the rest a hole
    pool.release_all_at_exit();
    const uint64_t calls = be.calls.load(), maps = dev.map_calls();
    CHECK(pool.allocate(64 * MiB, A, &p) == k_pool_declined);  // more than the arena's mapped start
    CHECK(dev.map_calls() == maps);                                // got one more
    CHECK(be.calls.load() == calls);
}

// The same promise for a pool that never grew before exit: grow() now calls use_arenas() before
// new_segment()'s exiting_ check, and that asks the backend for the granularity and cuMemGetInfo.
TEST_CASE("arenas: a first miss after release_all_at_exit asks the driver nothing", "[pool][vmm][arena]") {
    fake_backend dev(1ull << 30);
    dev.set_vmm(2 * MiB);
    counting_backend be(dev);
    block_pool pool(arena_config(), be, nullptr, 0);
    pool.release_all_at_exit();
    uint64_t p = 0;
    CHECK(pool.allocate(4096, A, &p) == k_pool_declined);
    CHECK(be.calls.load() == 0);  // got 2: vmm_granularity, mem_info
}

// GPUMEM_POOL_TRIM with arenas: trim sizes the excess as if growth mapped round_up(request) in
// fresh space, so it unmaps the free block just before the arena's tail, which arena_grow then maps
// again as part of the same request: chunks unmapped and re-created for nothing (same final
// reserved as without the unmap).
TEST_CASE("arenas: the trim spares the free block the growth joins", "[pool][vmm][arena]") {
    trimming_arena t(2 * MiB);  // safe reuse; each miss below releases the pending free by one sync
    recording_sink& sink = t.sink;
    block_pool& pool = t.pool;
    uint64_t a = 0, b = 0, c = 0;
    REQUIRE(pool.allocate(12 * MiB, A, &a) == k_cuda_success);  // [0, 12) of the arena
    REQUIRE(pool.allocate(16 * MiB, A, &b) == k_cuda_success);  // [12, 28)
    int rc = -1;
    REQUIRE(pool.deallocate(b, F, &rc));                         // pending
    REQUIRE(pool.allocate(20 * MiB, A, &c) == k_cuda_success);  // [12, 32): 4 MiB of new chunks suffice
    CHECK(c == a + 12 * MiB);
    CHECK(pool.snapshot().reserved == 32 * MiB);
    // Sizing the trim for 20 MiB of fresh chunks unmapped the free 16 MiB; mapped: 16 + 4, not 16 + 20.
    CHECK(sink.bytes(ev_kind::segment_unmap) == 0);
    CHECK(sink.bytes(ev_kind::segment_map) == 20 * MiB);
    std::string why;
    CHECK(pool.validate(&why));
}

TEST_CASE("arenas: the trim spares the free block after a hole the growth maps whole", "[pool][vmm][arena]") {
    // A hole whose free block after it makes up the request is mapped whole, joined to that
    // block.  The trim must keep that block mapped too, or it unmaps what the growth joins and
    // the growth maps it straight back (8 MiB unmapped, 12 mapped, for 8 of new chunks).
    trimming_arena t(2 * MiB);  // safe reuse; each miss below releases the pending free by one sync
    recording_sink& sink = t.sink;
    block_pool& pool = t.pool;
    uint64_t a = 0, x = 0, y = 0, b = 0, z = 0, r = 0;
    REQUIRE(pool.allocate(4 * MiB, A, &a) == k_cuda_success);  // [0, 4) of the arena
    REQUIRE(pool.allocate(8 * MiB, A, &x) == k_cuda_success);  // [4, 12)
    REQUIRE(pool.allocate(8 * MiB, A, &y) == k_cuda_success);  // [12, 20)
    REQUIRE(pool.allocate(4 * MiB, A, &b) == k_cuda_success);  // [20, 24)
    int rc = -1;
    REQUIRE(pool.deallocate(x, F, &rc));
    REQUIRE(pool.allocate(12 * MiB, A, &z) == k_cuda_success);  // [24, 36); the trim unmaps x: a hole at [4, 12)
    CHECK(z == a + 24 * MiB);
    REQUIRE(sink.count(ev_kind::segment_unmap) == 1);
    REQUIRE(pool.deallocate(y, F, &rc));
    const size_t unmaps = sink.count(ev_kind::segment_unmap), maps = sink.count(ev_kind::segment_map);
    // 12 MiB: the hole [4, 12) mapped whole and the free [12, 20) after it.
    REQUIRE(pool.allocate(12 * MiB, A, &r) == k_cuda_success);
    CHECK(r == a + 4 * MiB);
    CHECK(sink.count(ev_kind::segment_unmap) == unmaps);  // y's chunks stayed mapped
    uint64_t mapped = 0;
    const auto map_events = sink.of(ev_kind::segment_map);
    for (size_t k = maps; k < map_events.size(); ++k) mapped += map_events[k].b.size;
    CHECK(mapped == 8 * MiB);  // just the hole
    std::string why;
    CHECK(pool.validate(&why));
}

TEST_CASE("arenas: the trim gives back whole free blocks, not just the excess", "[pool][vmm][arena]") {
    // Cut to the excess, the trim leaves a free block's rest mapped, to be unmapped at the next
    // growth: on the replayed GPT-2 log that raised the peak from 13.67 to 13.80 GiB
    // (block_pool_giveback.cc, unmap_free_chunks).  A 40 MiB free block against a 24 MiB excess
    // goes back whole.
    trimming_arena t(16 * MiB);  // safe reuse; each miss below releases the pending free by one sync
    recording_sink& sink = t.sink;
    block_pool& pool = t.pool;
    uint64_t a = 0, x = 0, b = 0, r = 0;
    REQUIRE(pool.allocate(4 * MiB, A, &a) == k_cuda_success);   // [0, 4)
    REQUIRE(pool.allocate(40 * MiB, A, &x) == k_cuda_success);  // [4, 44)
    REQUIRE(pool.allocate(4 * MiB, A, &b) == k_cuda_success);   // [44, 48)
    int rc = -1;
    REQUIRE(pool.deallocate(x, F, &rc));
    // 48 MiB at the arena's end: reserved would be 96 MiB against 8 live + 48 + 16 of trim.
    REQUIRE(pool.allocate(48 * MiB, A, &r) == k_cuda_success);
    CHECK(r == a + 48 * MiB);
    CHECK(sink.bytes(ev_kind::segment_unmap) == 40 * MiB);
    CHECK(pool.snapshot().reserved == 56 * MiB);
    std::string why;
    CHECK(pool.validate(&why));
}

// Probes (expected to pass): paths the commit's tests do not reach.
TEST_CASE("arenas: a hole mapped whole joins the free block after it, a failing map leaves the hole, tail lookups", "[pool][vmm][arena]") {
    fake_backend dev(80 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    block_pool pool(arena_config(), dev, &sink, 0);
    uint64_t a = 0, b = 0, c = 0, d = 0, x = 0;
    int rc = -1;
    REQUIRE(pool.allocate(12 * MiB, A, &a) == k_cuda_success);  // [0,12)
    REQUIRE(pool.allocate(12 * MiB, A, &b) == k_cuda_success);  // [12,24)
    REQUIRE(pool.allocate(12 * MiB, A, &c) == k_cuda_success);  // [24,36)
    REQUIRE(pool.allocate(40 * MiB, A, &d) == k_cuda_success);  // [36,76)
    // free a and c; keep b.  OOM path on a 13 MiB request? first make a hole at [0,12) via an OOM.
    REQUIRE(pool.deallocate(a, F, &rc));
    REQUIRE(pool.deallocate(d, F, &rc));
    uint64_t y = 0;
    REQUIRE(pool.allocate(60 * MiB, A, &y) != k_cuda_success);  // 12+12+60 > 80: OOM, frees unmapped
    std::string why;
    REQUIRE(pool.validate(&why));
    // Holes now: [0,12) and [36, 90) merged with the tail.  b [12,24) and c [24,36) live.
    REQUIRE(pool.deallocate(c, F, &rc));                           // free [24,36)? no: unmapped on next OOM only
    // A request of 20 MiB: hole [0,12) has before=0, after=0 (b live) -> skip; tail hole: before = c's 12 MiB free
    REQUIRE(pool.allocate(20 * MiB, A, &x) == k_cuda_success);
    CHECK(x == c);
    CHECK(pool.validate(&why));
    // Lookup/deallocate inside the never-mapped tail of the arena.
    block_pool::block_info bi{};
    const uint64_t tail = a + 85 * MiB;
    REQUIRE(pool.lookup(tail, &bi));
    CHECK_FALSE(bi.allocated);
    CHECK(bi.requested == 0);
    rc = -1;
    CHECK(pool.deallocate(tail, F, &rc));
    CHECK(rc == k_cuda_invalid_value);
    // A failing map into a hole leaves no handle behind.
    dev.fail_next_allocs(1, k_cuda_oom);
    uint64_t z = 0;
    const int zr = pool.allocate(6 * MiB, A, &z);  // the hole [0,12): map fails once, OOM path retries
    INFO("rc " << zr);
    CHECK(pool.validate(&why));
    INFO(why);
    CHECK(dev.bad_calls() == 0);
}
