// The pool on virtual memory: chunks back segments, whole free chunks go back on OOM, the driver's limit holds.
#include <catch2/catch.hpp>

#include <cstring>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "pool_test_util.h"

using namespace gpumem;
using namespace gpumem::test;

namespace {

// Fills `capacity` with 6 MiB blocks, frees two of every three, then asks for `big` blocks until
// one fails.  Returns how many big blocks were served.
// GPUMEM_POOL_VMM=on: virtual-memory segments are opt-in.
pool_config vmm_config() {
    pool_config cfg = immediate_config();
    cfg.vmm = true;
    return cfg;
}

// n blocks of 6 MiB, then two of every three freed (those whose index is not a multiple of 3): the
// fragmented pool several tests start from.  Returns every block's address, freed ones included.
std::vector<uint64_t> fragment_6mib(block_pool& pool, int n) {
    std::vector<uint64_t> small;
    for (int i = 0; i < n; ++i) {
        uint64_t p = 0;
        REQUIRE(pool.allocate(6 * MiB, api_id::cuMemAlloc_v2, &p) == k_cuda_success);
        small.push_back(p);
    }
    for (size_t i = 0; i < small.size(); ++i) {
        int rc = -1;
        if (i % 3 != 0) REQUIRE(pool.deallocate(small[i], api_id::cuMemFree_v2, &rc));
    }
    return small;
}

// The device of a VMM pool's tests: 2 MiB chunks.
fake_backend& with_vmm(fake_backend& d) {
    d.set_vmm(2 * MiB);
    return d;
}

// A pool on virtual memory with stitching and safe reuse (keeping `keep` stitched ranges), n
// blocks of 6 MiB, two of three freed and settled (fragment_6mib): where the stitch tests start.
struct stitch_pool {
    fake_backend dev{8ull << 30};
    recording_sink sink;
    block_pool pool;
    std::vector<uint64_t> six;
    static pool_config config(uint32_t keep, uint64_t sync_budget) {
        pool_config cfg = vmm_config();
        cfg.reuse = reuse_mode::safe;
        cfg.stitch = true;
        cfg.stitch_keep = keep;
        if (sync_budget) cfg.sync_budget = sync_budget;
        return cfg;
    }
    // sync_budget: 0 keeps the default; 4 MiB makes a miss with one 6 MiB free pending release it.
    explicit stitch_pool(int n, uint32_t keep = 2, uint64_t sync_budget = 0)
        : pool(config(keep, sync_budget), with_vmm(dev), &sink, 0) {
        six = fragment_6mib(pool, n);
        pool.release_cached();
    }
};

// Near the device's limit: `capacity` of 2 MiB chunks, a pool on virtual memory whose headroom
// (8 MiB) keeps the count of the driver's free memory and looks at it near the line, and 17 blocks
// of 6 MiB (102 MiB), two of three freed (fragment_6mib): where the tests of the bounded give-back,
// moves and foresight start.
struct full_pool {
    fake_backend dev;
    recording_sink sink;
    block_pool pool;
    static pool_config config() {
        pool_config cfg = vmm_config();
        cfg.headroom = 8 * MiB;
        return cfg;
    }
    explicit full_pool(uint64_t capacity) : dev(capacity), pool(config(), with_vmm(dev), &sink, 0) {
        fragment_6mib(pool, 17);
    }
};

size_t fill_fragment_large(bool vmm, uint64_t capacity, uint64_t big, fake_backend& dev, recording_sink& sink) {
    dev.set_vmm(2 * MiB);
    pool_config cfg = immediate_config();
    cfg.vmm = vmm;
    block_pool pool(cfg, dev, &sink, 0);
    std::vector<uint64_t> small;
    for (;;) {
        uint64_t p = 0;
        if (pool.allocate(6 * MiB, api_id::cuMemAlloc_v2, &p) != k_cuda_success) break;
        small.push_back(p);
    }
    REQUIRE(small.size() >= capacity / (7 * MiB));
    for (size_t i = 0; i < small.size(); ++i) {
        int rc = -1;
        if (i % 3 != 0) REQUIRE(pool.deallocate(small[i], api_id::cuMemFree_v2, &rc));
    }
    size_t served = 0;
    for (;;) {
        uint64_t p = 0;
        if (pool.allocate(big, api_id::cuMemAlloc_v2, &p) != k_cuda_success) break;
        ++served;
    }
    std::string why;
    CHECK(pool.validate(&why));
    CHECK(dev.bad_calls() == 0);
    return served;
}

// Forwards the calls a VMM pool makes to a fake_backend, and can change two answers: mem_info
// that cannot say (0 free of 0, as a driver whose cuMemGetInfo fails), and unmap_keep that
// unmaps and keeps the chunks yet reports an error (`keep_error`: the driver's word).
struct forwarding_backend final : pool_backend {
    fake_backend& d;
    bool blind = false;  // mem_info says 0 of 0
    int keep_error = 0;  // not 0: unmap_keep's answer after the fake has kept the chunks
    explicit forwarding_backend(fake_backend& f) : d(f) {}
    int segment_alloc(uint64_t b, uint64_t* p) noexcept override { return d.segment_alloc(b, p); }
    int segment_free(uint64_t b) noexcept override { return d.segment_free(b); }
    int synchronize() noexcept override { return d.synchronize(); }
    bool may_synchronize() noexcept override { return d.may_synchronize(); }
    void mem_info(uint64_t* f, uint64_t* t) noexcept override {
        if (blind) {
            *f = *t = 0;
            return;
        }
        d.mem_info(f, t);
    }
    uint64_t vmm_granularity() noexcept override { return d.vmm_granularity(); }
    int va_reserve(uint64_t b, uint64_t* p) noexcept override { return d.va_reserve(b, p); }
    int va_free(uint64_t b, uint64_t n) noexcept override { return d.va_free(b, n); }
    int map_chunks(uint64_t a, uint64_t c, size_t n, uint64_t* h) noexcept override { return d.map_chunks(a, c, n, h); }
    int unmap_chunks(uint64_t a, uint64_t c, size_t n, const uint64_t* h) noexcept override {
        return d.unmap_chunks(a, c, n, h);
    }
    int unmap_keep(uint64_t a, uint64_t c, size_t n, const uint64_t* h) noexcept override {
        const int rc = d.unmap_keep(a, c, n, h);
        return rc == k_cuda_success && keep_error ? keep_error : rc;
    }
    int map_kept(uint64_t a, uint64_t c, size_t n, const uint64_t* h) noexcept override { return d.map_kept(a, c, n, h); }
    int release_kept(uint64_t c, size_t n, const uint64_t* h) noexcept override { return d.release_kept(c, n, h); }
};

}  // namespace

TEST_CASE("fill, fragment, then large requests: served as the driver alone would serve them", "[pool][vmm]") {
    const uint64_t capacity = 600 * MiB, big = 60 * MiB;
    fake_backend on(capacity), off(capacity);
    recording_sink s_on, s_off;
    const size_t served = fill_fragment_large(true, capacity, big, on, s_on);
    // The driver alone: the live third of the 6 MiB blocks stays, everything else is free.
    const uint64_t n_small = capacity / (6 * MiB);
    const uint64_t live = (n_small + 2) / 3 * 6 * MiB;
    CHECK(served == (capacity - live) / big);
    CHECK(s_on.count(ev_kind::segment_unmap) > 0);
    // cuMemUnmap does not wait for device work: the pool synchronized before unmapping freed bytes.
    CHECK(on.sync_calls() >= 1);
    // cuMemAlloc segments keep the free thirds locked behind live blocks: far fewer large requests.
    const size_t served_off = fill_fragment_large(false, capacity, big, off, s_off);
    CHECK(served_off < served / 2);
    CHECK(s_off.count(ev_kind::segment_unmap) == 0);
}

TEST_CASE("a segment on virtual memory is whole chunks, mapped at once, and unmapped chunk by chunk", "[pool][vmm]") {
    fake_backend dev(64 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    pool_config cfg = vmm_config();
    cfg.arenas = false;  // GPUMEM_POOL_ARENA=off: a segment per growth, mapped whole
    block_pool pool(cfg, dev, &sink, 0);
    uint64_t a = 0, b = 0, c = 0;
    REQUIRE(pool.allocate(3 * MiB, api_id::cuMemAlloc_v2, &a) == k_cuda_success);  // a 20 MiB segment
    CHECK(pool.chunk_size() == 2 * MiB);
    CHECK(dev.mapped_chunks() == 10);
    CHECK(dev.map_calls() == 1);
    REQUIRE(pool.allocate(8 * MiB, api_id::cuMemAlloc_v2, &b) == k_cuda_success);
    REQUIRE(pool.allocate(3 * MiB, api_id::cuMemAlloc_v2, &c) == k_cuda_success);
    block_pool::block_info bi{};
    REQUIRE(pool.lookup(b, &bi));
    CHECK(bi.vmm);
    int rc = -1;
    REQUIRE(pool.deallocate(b, api_id::cuMemFree_v2, &rc));  // free: [3, 11) and [14, 20) MiB
    // 44 MiB are left on the device.  Whole free chunks: [4, 10) and [14, 20).  Live blocks touch
    // chunks [0, 4) and [10, 14): 8 MiB, so 56 MiB is the most the driver could still give.
    uint64_t d = 0;
    CHECK(pool.allocate(58 * MiB, api_id::cuMemAlloc_v2, &d) == k_cuda_oom);
    const auto unmaps = sink.of(ev_kind::segment_unmap);
    REQUIRE(unmaps.size() == 2);
    CHECK(unmaps[0].b.ptr == bi.segment + 4 * MiB);
    CHECK(unmaps[0].b.size == 6 * MiB);
    CHECK(unmaps[0].b.seg == bi.segment);
    CHECK(unmaps[1].b.ptr == bi.segment + 14 * MiB);
    CHECK(unmaps[1].b.size == 6 * MiB);
    CHECK(dev.mapped_chunks() == 4);
    CHECK(pool.snapshot().reserved == 8 * MiB);
    // Served in fresh address space, to the last byte the driver has.
    REQUIRE(pool.allocate(56 * MiB, api_id::cuMemAlloc_v2, &d) == k_cuda_success);
    CHECK(dev.in_use() == 64 * MiB);
    // The unmapped range is no block anyone gets, and a pointer into it is no allocation.
    REQUIRE(pool.lookup(bi.segment + 5 * MiB, &bi));
    CHECK_FALSE(bi.allocated);
    for (uint64_t p : {a, c, d}) REQUIRE(pool.deallocate(p, api_id::cuMemFree_v2, &rc));
    pool.release_cached();
    CHECK(dev.in_use() == 0);
    CHECK(dev.reservations() == 0);
    CHECK(dev.bad_calls() == 0);
    std::string why;
    CHECK(pool.validate(&why));
}

// Memory short without arenas (GPUMEM_POOL_ARENA=off): a give-back leaves a free head and tail
// beside the hole it makes, and the OOM path maps the hole again joined to one of them, which needs
// fewer chunks than fresh address space.  It asked for a fresh segment of the whole request instead,
// and failed where the driver alone serves the request.
TEST_CASE("arenas off, memory short: a hole is mapped again, joined to the free head or tail beside it", "[pool][vmm]") {
    for (bool back : {false, true}) {
        INFO((back ? "the hole's back, joined to the free tail" : "the hole's front, joined to the free head"));
        fake_backend dev(64 * MiB);
        dev.set_vmm(2 * MiB);
        recording_sink sink;
        pool_config cfg = vmm_config();
        cfg.arenas = false;
        block_pool pool(cfg, dev, &sink, 0);
        // One 20 MiB segment: a, f1, f2, c.  f1 and f2 freed and given back: a free head, the hole
        // [4, 12) MiB, a free tail.  Front: a = 3.25 MiB, so a 0.75 MiB head and no tail.  Back:
        // a = 3.75 MiB and f1 + f2 = 10 MiB, so a 0.25 MiB head and a 1.75 MiB tail.
        const uint64_t a_size = back ? 3 * MiB + 3 * MiB / 4 : 3 * MiB + MiB / 4;
        const uint64_t f_size = back ? 5 * MiB : (12 * MiB - a_size) / 2;
        uint64_t a = 0, f1 = 0, f2 = 0, c = 0, r = 0;
        REQUIRE(pool.allocate(a_size, api_id::cuMemAlloc_v2, &a) == k_cuda_success);
        REQUIRE(pool.allocate(f_size, api_id::cuMemAlloc_v2, &f1) == k_cuda_success);
        REQUIRE(pool.allocate(f_size, api_id::cuMemAlloc_v2, &f2) == k_cuda_success);
        REQUIRE(pool.allocate(20 * MiB - a_size - 2 * f_size, api_id::cuMemAlloc_v2, &c) == k_cuda_success);
        REQUIRE(sink.count(ev_kind::segment_alloc) == 1);
        int rc = -1;
        REQUIRE(pool.deallocate(f1, api_id::cuMemFree_v2, &rc));
        REQUIRE(pool.deallocate(f2, api_id::cuMemFree_v2, &rc));
        REQUIRE(pool.give_back(api_id::cuMemCreate) == 8 * MiB);
        REQUIRE(dev.in_use() == 12 * MiB);
        // The driver has one chunk left.  The live bytes plus the request fit (3.25 + 8 + 2.5 and
        // 3.75 + 6.25 + 3.5 MiB of 14), and one chunk joined to the head (front) or tail (back)
        // holds the request, where fresh address space needs two.
        dev.set_capacity(14 * MiB);
        const uint64_t request = back ? 3 * MiB + MiB / 2 : 2 * MiB + MiB / 2;
        REQUIRE(pool.allocate(request, api_id::cuMemAlloc_v2, &r) == k_cuda_success);
        CHECK(r == (back ? a + 10 * MiB : a + a_size));
        const auto maps = sink.of(ev_kind::segment_map);
        REQUIRE(maps.size() == 1);
        CHECK(maps[0].b.ptr == a + (back ? 10 : 4) * MiB);
        CHECK(maps[0].b.size == 2 * MiB);
        CHECK(maps[0].b.seg == a);
        CHECK(sink.count(ev_kind::segment_alloc) == 1);
        CHECK(dev.in_use() == 14 * MiB);
        std::string why;
        const bool valid = pool.validate(&why);
        INFO(why);
        CHECK(valid);
        for (uint64_t p : {a, c, r}) REQUIRE(pool.deallocate(p, api_id::cuMemFree_v2, &rc));
        pool.release_cached();
        CHECK(dev.in_use() == 0);
        CHECK(dev.reservations() == 0);
        CHECK(dev.bad_calls() == 0);
    }
}

TEST_CASE("arenas off, memory short: the segment of just the request spans a segment's address space, so its rest joins the next request", "[pool][vmm]") {
    fake_backend dev(32 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    pool_config cfg = vmm_config();
    cfg.arenas = false;
    block_pool pool(cfg, dev, &sink, 0);
    std::vector<uint64_t> ps;
    fill_pool(pool, 3 * MiB, &ps);
    // The driver alone serves ten 3 MiB blocks in 32 MiB.  The first 20 MiB segment holds six, and
    // its free last chunk goes back; then a 20 MiB range with the 7th request's 4 MiB mapped, whose
    // 1 MiB rest splits off before the hole, and every later request maps only the chunks the rest
    // lacks.  A segment of 4 MiB kept the rest in its block: three 3 MiB blocks in 12 MiB, nine in all.
    CHECK(ps.size() == 10);
    const auto segs = sink.of(ev_kind::segment_alloc);
    REQUIRE(segs.size() == 2);
    CHECK(segs[1].b.size == 20 * MiB);
    CHECK(segs[1].b.asize == 4 * MiB);
    const auto maps = sink.of(ev_kind::segment_map);
    REQUIRE(maps.size() == 3);
    CHECK(maps[0].b.ptr == segs[1].b.ptr + 4 * MiB);
    CHECK(maps[0].b.size == 2 * MiB);
    for (size_t k = 7; k < ps.size(); ++k) CHECK(ps[k] == ps[6] + (k - 6) * 3 * MiB);
    CHECK(dev.in_use() == 30 * MiB);
    std::string why;
    const bool valid = pool.validate(&why);
    INFO(why);
    CHECK(valid);
    int rc = -1;
    for (uint64_t p : ps) REQUIRE(pool.deallocate(p, api_id::cuMemFree_v2, &rc));
    pool.release_cached();
    CHECK(dev.in_use() == 0);
    CHECK(dev.reservations() == 0);
    CHECK(dev.bad_calls() == 0);
}

TEST_CASE("GPUMEM_POOL_CHUNK: larger chunks, whole granules, given back only whole", "[pool][vmm]") {
    fake_backend dev(100 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    pool_config cfg = vmm_config();
    cfg.chunk = 19 * MiB;  // rounded up to 20 MiB: ten granules
    block_pool pool(cfg, dev, &sink, 0);
    uint64_t a = 0, b = 0, c = 0;
    REQUIRE(pool.allocate(3 * MiB, api_id::cuMemAlloc_v2, &a) == k_cuda_success);
    CHECK(pool.chunk_size() == 20 * MiB);
    CHECK(dev.mapped_chunks() == 1);  // one 20 MiB handle holds the 3 MiB block
    CHECK(dev.in_use() == 20 * MiB);
    REQUIRE(pool.allocate(30 * MiB, api_id::cuMemAlloc_v2, &b) == k_cuda_success);
    REQUIRE(pool.allocate(3 * MiB, api_id::cuMemAlloc_v2, &c) == k_cuda_success);
    int rc = -1;
    REQUIRE(pool.deallocate(b, api_id::cuMemFree_v2, &rc));
    // a [0, 3) and c [33, 36) MiB hold both 20 MiB chunks, and no free chunk is whole: nothing
    // can go back.  60 MiB are left on the device: a request from c's end to 96 MiB fits them
    // exactly, 65 MiB (the same, or a fresh 80 MiB of chunks) does not.
    uint64_t d = 0;
    CHECK(pool.allocate(65 * MiB, api_id::cuMemAlloc_v2, &d) == k_cuda_oom);
    CHECK(sink.of(ev_kind::segment_unmap).empty());
    CHECK(dev.in_use() == 40 * MiB);
    REQUIRE(pool.allocate(60 * MiB, api_id::cuMemAlloc_v2, &d) == k_cuda_success);
    CHECK(d == c + 3 * MiB);
    CHECK(dev.in_use() == 100 * MiB);
    CHECK(dev.mapped_chunks() == 5);
    for (uint64_t p : {a, c, d}) REQUIRE(pool.deallocate(p, api_id::cuMemFree_v2, &rc));
    pool.release_cached();
    CHECK(dev.in_use() == 0);
    CHECK(dev.bad_calls() == 0);
    std::string why;
    CHECK(pool.validate(&why));
}

TEST_CASE("virtual memory: a failing map leaves nothing behind, and a capture gets no unmap and no sync", "[pool][vmm]") {
    fake_backend dev(40 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    block_pool pool(vmm_config(), dev, &sink, 0);
    uint64_t a = 0;
    // The first try (a new arena), the retry after releasing (another arena), a segment of just
    // the request, the last-resort cuMemAlloc segment.
    dev.fail_next_allocs(4, k_cuda_oom);
    CHECK(pool.allocate(12 * MiB, api_id::cuMemAlloc_v2, &a) == k_cuda_oom);
    CHECK(dev.mapped_chunks() == 0);
    CHECK(dev.reservations() == 0);
    REQUIRE(pool.allocate(12 * MiB, api_id::cuMemAlloc_v2, &a) == k_cuda_success);
    uint64_t b = 0;
    REQUIRE(pool.allocate(2 * MiB, api_id::cuMemAlloc_v2, &b) == k_cuda_success);  // a small-pool segment
    int rc = -1;
    REQUIRE(pool.deallocate(a, api_id::cuMemFree_v2, &rc));
    dev.set_capturing(true);
    const uint64_t syncs = dev.sync_calls(), unmaps = dev.unmap_calls();
    uint64_t c = 0;
    CHECK(pool.allocate(30 * MiB, api_id::cuMemAlloc_v2, &c) == k_cuda_oom);
    CHECK(dev.sync_calls() == syncs);
    CHECK(dev.unmap_calls() == unmaps);
    dev.set_capturing(false);
    CHECK(dev.bad_calls() == 0);
    std::string why;
    CHECK(pool.validate(&why));
}

TEST_CASE("virtual memory: a synchronize that fails leaves every chunk freed for immediate reuse mapped", "[pool][vmm]") {
    // cuMemUnmap does not wait for device work, as cuMemFree does: a block freed for immediate
    // reuse may still be in use until a synchronize (or a wait on every stream) succeeds.  In a
    // context whose synchronize fails, the OOM path must unmap none of its chunks.
    fake_backend dev(64 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    block_pool pool(vmm_config(), dev, &sink, 0);  // immediate reuse, no events: settled by a sync
    const uint64_t a = alloc_ok(pool, 20 * MiB);
    const uint64_t b = alloc_ok(pool, 20 * MiB);
    free_ok(pool, a);  // its last owner's work may still run
    dev.set_sync_result(700);  // CUDA_ERROR_ILLEGAL_ADDRESS: a broken context
    const uint64_t unmaps = dev.unmap_calls();
    uint64_t c = 0;
    CHECK(pool.allocate(40 * MiB, api_id::cuMemAlloc_v2, &c) == k_cuda_oom);
    CHECK(dev.unmap_calls() == unmaps);
    CHECK(sink.count(ev_kind::segment_unmap) == 0);
    CHECK(sink.count(ev_kind::segment_free) == 0);
    dev.set_sync_result(k_cuda_success);
    free_ok(pool, b);
    CHECK(dev.bad_calls() == 0);
    std::string why;
    CHECK(pool.validate(&why));
}

TEST_CASE("GPUMEM_POOL_VMM=off and a device without VMM keep cuMemAlloc segments", "[pool][vmm]") {
    fake_backend dev;
    uint64_t p = 0;
    {
        block_pool pool(immediate_config(), dev, nullptr, 0);  // the fake offers no VMM by default
        REQUIRE(pool.allocate(4096, api_id::cuMemAlloc_v2, &p) == k_cuda_success);
        CHECK(pool.chunk_size() == 0);
        CHECK(dev.alloc_calls() == 1);
    }
    dev.set_vmm(2 * MiB);
    pool_config cfg = immediate_config();
    cfg.vmm = false;
    block_pool pool(cfg, dev, nullptr, 0);
    REQUIRE(pool.allocate(4096, api_id::cuMemAlloc_v2, &p) == k_cuda_success);
    CHECK(pool.chunk_size() == 0);
    CHECK(dev.alloc_calls() == 2);
    CHECK(dev.map_calls() == 0);
}

TEST_CASE("GPUMEM_POOL_TRIM: growing gives the excess back first, so reserved follows the live bytes", "[pool][vmm]") {
    // Fragment 600 MiB of 6 MiB blocks (two of three freed), then ask for 60 MiB blocks, with memory
    // to spare: without trim the pool grows past the freed holes; with it, reserved stays within
    // trim + one new segment + chunk rounding of the live blocks.
    auto run = [](uint64_t trim, recording_sink& sink, uint64_t* reserved, uint64_t* allocated) {
        fake_backend dev(8ull << 30);
        dev.set_vmm(2 * MiB);
        pool_config cfg = vmm_config();
        cfg.reuse = reuse_mode::safe;  // frees settle at a sync: the trim may unmap without waiting
        cfg.trim = trim;
        block_pool pool(cfg, dev, &sink, 0);
        fragment_6mib(pool, 100);
        for (int i = 0; i < 5; ++i) {
            uint64_t p = 0;
            REQUIRE(pool.allocate(60 * MiB, api_id::cuMemAlloc_v2, &p) == k_cuda_success);
        }
        std::string why;
        CHECK(pool.validate(&why));
        CHECK(dev.bad_calls() == 0);
        const pool_state s = pool.snapshot();
        CHECK(s.reserved == dev.in_use());
        *reserved = s.reserved;
        *allocated = s.allocated;
    };
    recording_sink s_off, s_on;
    uint64_t res_off = 0, res_on = 0, alloc_off = 0, alloc_on = 0;
    run(0, s_off, &res_off, &alloc_off);
    run(32 * MiB, s_on, &res_on, &alloc_on);
    CHECK(alloc_on == alloc_off);
    CHECK(s_off.count(ev_kind::segment_unmap) == 0);
    CHECK(s_on.count(ev_kind::segment_unmap) > 0);
    // Off: the 600 MiB of small segments stay mapped beside 300 MiB of new ones.
    CHECK(res_off >= 600 * MiB + 300 * MiB);
    // On: each 6 MiB live block keeps at most its own chunks plus a partly used one on each side.
    CHECK(res_on <= alloc_on + 32 * MiB + 60 * MiB + 34 * 2 * (2 * MiB));
    CHECK(res_on < res_off);
}

TEST_CASE("arenas: one address range per pool, mapped as it grows, holes mapped again", "[pool][vmm][arena]") {
    fake_backend dev(80 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    block_pool pool(vmm_config(), dev, &sink, 0);  // GPUMEM_POOL_ARENA=auto: 80 MiB + 1/8 of address space
    uint64_t a = 0, b = 0, c = 0;
    // Requests of 10 MiB or more get segments of their own without arenas: these two could never merge.
    REQUIRE(pool.allocate(12 * MiB, api_id::cuMemAlloc_v2, &a) == k_cuda_success);
    // Only the request's chunks are mapped; the rest of the arena is a hole.
    CHECK(dev.mapped_chunks() == 6);
    const auto segs = sink.of(ev_kind::segment_alloc);
    REQUIRE(segs.size() == 1);
    CHECK(segs[0].b.size == 90 * MiB);
    CHECK(segs[0].b.asize == 12 * MiB);
    CHECK(pool.snapshot().reserved == 12 * MiB);
    // The next request maps 16 MiB right after: no new segment.
    REQUIRE(pool.allocate(16 * MiB, api_id::cuMemAlloc_v2, &b) == k_cuda_success);
    CHECK(b == a + 12 * MiB);
    CHECK(sink.count(ev_kind::segment_alloc) == 1);
    auto maps = sink.of(ev_kind::segment_map);
    REQUIRE(maps.size() == 1);
    CHECK(maps[0].b.ptr == a + 12 * MiB);
    CHECK(maps[0].b.size == 16 * MiB);
    CHECK(maps[0].b.seg == a);
    CHECK(pool.snapshot().reserved == 28 * MiB);
    // Freed neighbours merge across what would have been two segments: 26 MiB fit with no map.
    int rc = -1;
    REQUIRE(pool.deallocate(a, api_id::cuMemFree_v2, &rc));
    REQUIRE(pool.deallocate(b, api_id::cuMemFree_v2, &rc));
    const uint64_t map_calls = dev.map_calls();
    REQUIRE(pool.allocate(26 * MiB, api_id::cuMemAlloc_v2, &c) == k_cuda_success);
    CHECK(c == a);
    CHECK(dev.map_calls() == map_calls);
    // The free 2 MiB left at the end joins the next growth: 38 MiB mapped for 40.
    uint64_t x = 0, y = 0, z = 0;
    REQUIRE(pool.allocate(40 * MiB, api_id::cuMemAlloc_v2, &x) == k_cuda_success);
    CHECK(x == a + 26 * MiB);
    maps = sink.of(ev_kind::segment_map);
    REQUIRE(maps.size() == 2);
    CHECK(maps[1].b.size == 38 * MiB);
    // Short of memory: whole free chunks go back, and later the hole they left is mapped again.
    REQUIRE(pool.deallocate(c, api_id::cuMemFree_v2, &rc));
    REQUIRE(pool.allocate(30 * MiB, api_id::cuMemAlloc_v2, &y) == k_cuda_success);  // 96 MiB > 80 without the unmap
    const auto unmaps = sink.of(ev_kind::segment_unmap);
    REQUIRE(unmaps.size() == 1);
    CHECK(unmaps[0].b.ptr == a);
    CHECK(unmaps[0].b.size == 26 * MiB);
    REQUIRE(pool.allocate(10 * MiB, api_id::cuMemAlloc_v2, &z) == k_cuda_success);  // the hole, the lowest
    CHECK(z == a);
    maps = sink.of(ev_kind::segment_map);
    CHECK(maps.back().b.ptr == a);
    CHECK(maps.back().b.size == 10 * MiB);
    CHECK(maps.back().seq > unmaps[0].seq);
    CHECK(dev.in_use() == 80 * MiB);
    CHECK(pool.snapshot().reserved == 80 * MiB);
    std::string why;
    const bool valid = pool.validate(&why);
    INFO(why);
    CHECK(valid);
    for (uint64_t p : {x, y, z}) REQUIRE(pool.deallocate(p, api_id::cuMemFree_v2, &rc));
    pool.release_cached();
    CHECK(dev.in_use() == 0);
    CHECK(dev.reservations() == 0);
    CHECK(dev.bad_calls() == 0);
}

TEST_CASE("arenas: the rest before a hole splits off, however small, after exit no backend call", "[pool][vmm][arena]") {
    fake_backend dev(64 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    block_pool pool(vmm_config(), dev, &sink, 0);
    // 3 MiB in 4 MiB of chunks: the 1 MiB rest is under large_split, but it borders the arena's
    // hole, so it splits off and the next growth joins it.  Kept in the block, six requests
    // would hold 24 MiB.
    std::vector<uint64_t> ps(6);
    for (auto& p : ps) REQUIRE(pool.allocate(3 * MiB, api_id::cuMemAlloc_v2, &p) == k_cuda_success);
    CHECK(pool.snapshot().reserved == 18 * MiB);
    CHECK(sink.count(ev_kind::segment_map) == 5);
    for (size_t k = 1; k < ps.size(); ++k) CHECK(ps[k] == ps[0] + k * 3 * MiB);
    // The small pool has an arena of its own, one small segment's worth at first.
    uint64_t s1 = 0;
    REQUIRE(pool.allocate(4096, api_id::cuMemAlloc_v2, &s1) == k_cuda_success);
    CHECK(sink.count(ev_kind::segment_alloc) == 2);
    CHECK(pool.snapshot().reserved == 20 * MiB);
    // At exit the driver may be gone: a miss makes no backend call and is declined (the hook asks
    // the driver, as the program would without gpumem).
    pool.release_all_at_exit();
    const uint64_t maps = dev.map_calls(), reserves = dev.reservations();
    uint64_t late = 0;
    CHECK(pool.allocate(8 * MiB, api_id::cuMemAlloc_v2, &late) == k_pool_declined);
    CHECK(dev.map_calls() == maps);
    CHECK(dev.reservations() == reserves);
    std::string why;
    const bool valid = pool.validate(&why);
    INFO(why);
    CHECK(valid);
}

// Memory short with arenas: the growth maps into the lowest hole that fits, and when that one
// needs more chunks than the driver has left, a hole that needs fewer serves (it failed instead).
TEST_CASE("arenas, memory short: when the lowest hole needs more than the driver has, a hole that needs less serves", "[pool][vmm][arena]") {
    fake_backend dev(64 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    block_pool pool(vmm_config(), dev, &sink, 0);
    // a [0, 4) x [4, 8) b [8, 11) c [11, 14) d [14, 17) e [17, 20) MiB, in one arena.
    uint64_t a = 0, x = 0, b = 0, c = 0, d = 0, e = 0, r = 0;
    REQUIRE(pool.allocate(4 * MiB, api_id::cuMemAlloc_v2, &a) == k_cuda_success);
    REQUIRE(pool.allocate(4 * MiB, api_id::cuMemAlloc_v2, &x) == k_cuda_success);
    for (uint64_t* p : {&b, &c, &d, &e}) REQUIRE(pool.allocate(3 * MiB, api_id::cuMemAlloc_v2, p) == k_cuda_success);
    REQUIRE(x == a + 4 * MiB);
    REQUIRE(c == a + 11 * MiB);
    REQUIRE(e == a + 17 * MiB);
    int rc = -1;
    REQUIRE(pool.deallocate(x, api_id::cuMemFree_v2, &rc));
    REQUIRE(pool.deallocate(c, api_id::cuMemFree_v2, &rc));
    // Given back: the holes [4, 8) (no free neighbour) and [12, 14) (the free head [11, 12) before it).
    REQUIRE(pool.give_back(api_id::cuMemCreate) == 6 * MiB);
    REQUIRE(dev.in_use() == 14 * MiB);
    // One chunk left: 3 MiB in the lowest hole needs two, after the head at [11, 12) one.  The
    // driver alone has 16 - 13 MiB for it.
    dev.set_capacity(16 * MiB);
    REQUIRE(pool.allocate(3 * MiB, api_id::cuMemAlloc_v2, &r) == k_cuda_success);
    CHECK(r == c);
    const auto maps = sink.of(ev_kind::segment_map);
    REQUIRE_FALSE(maps.empty());
    CHECK(maps.back().b.ptr == a + 12 * MiB);
    CHECK(maps.back().b.size == 2 * MiB);
    CHECK(dev.in_use() == 16 * MiB);
    std::string why;
    const bool valid = pool.validate(&why);
    INFO(why);
    CHECK(valid);
    for (uint64_t p : {a, b, d, e, r}) REQUIRE(pool.deallocate(p, api_id::cuMemFree_v2, &rc));
    pool.release_cached();
    CHECK(dev.in_use() == 0);
    CHECK(dev.reservations() == 0);
    CHECK(dev.bad_calls() == 0);
}

TEST_CASE("arenas, memory short: the growth's lack goes back first and the other free chunks stay mapped", "[pool][vmm][arena]") {
    // 17 blocks of 6 MiB fill a 102 MiB device; two of three freed: runs of 12 MiB free at 6, 24,
    // ..., 78 MiB (60 MiB), and [96, 102) at the arena's end.
    fake_backend dev(102 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    block_pool pool(vmm_config(), dev, &sink, 0);
    const std::vector<uint64_t> six = fragment_6mib(pool, 17);
    REQUIRE(dev.in_use() == 102 * MiB);
    const uint64_t base = six[0];
    // 20 MiB fits no free block; the growth joins [96, 102) and lacks 14 MiB, which the driver
    // has not.  Only those 14 MiB go back (the first free run and a chunk pair of the next), not
    // all 60: in a program whose peak is near the device's memory the pool would map them again at
    // once, step after step.
    uint64_t big = 0;
    REQUIRE(pool.allocate(20 * MiB, api_id::cuMemAlloc_v2, &big) == k_cuda_success);
    CHECK(big == base + 96 * MiB);
    CHECK(sink.bytes(ev_kind::segment_unmap) == 14 * MiB);
    CHECK(pool.snapshot().reserved == 102 * MiB);
    CHECK(dev.in_use() == 102 * MiB);
    // 40 MiB: again just its lack (the arena's end is taken now), 46 MiB stay free to give; then
    // 8 MiB, when the pool holds 6 MiB free in whole chunks: the driver alone would fail it too.
    uint64_t bigger = 0, more = 0;
    REQUIRE(pool.allocate(40 * MiB, api_id::cuMemAlloc_v2, &bigger) == k_cuda_success);
    CHECK(sink.bytes(ev_kind::segment_unmap) == 54 * MiB);
    CHECK(pool.allocate(8 * MiB, api_id::cuMemAlloc_v2, &more) == k_cuda_oom);
    CHECK(pool.snapshot().reserved <= 102 * MiB);
    std::string why;
    const bool valid = pool.validate(&why);
    INFO(why);
    CHECK(valid);
    CHECK(dev.bad_calls() == 0);
}

TEST_CASE("arenas, memory short: the chunks given back for a growth are moved there, not released and made again", "[pool][vmm][arena]") {
    // The program above: 20 MiB lacks 14 MiB, which go back from free blocks and are mapped at
    // the arena's end.  Moved, they cost an unmap and a map each, no cuMemRelease or cuMemCreate;
    // the layout and the log are those of a release and a create.
    auto run = [](fake_backend& dev, int fail_moves) {
        dev.set_vmm(2 * MiB);
        recording_sink sink;
        block_pool pool(vmm_config(), dev, &sink, 0);
        const std::vector<uint64_t> six = fragment_6mib(pool, 17);
        if (fail_moves) dev.fail_next_allocs(fail_moves);  // the growth's map of the kept chunks
        const uint64_t mapped = sink.bytes(ev_kind::segment_map);
        uint64_t big = 0;
        REQUIRE(pool.allocate(20 * MiB, api_id::cuMemAlloc_v2, &big) == k_cuda_success);
        CHECK(big == six[0] + 96 * MiB);
        CHECK(sink.bytes(ev_kind::segment_unmap) == 14 * MiB);
        CHECK(sink.bytes(ev_kind::segment_map) - mapped == 14 * MiB);  // at the arena's end, joined to [96, 102)
        CHECK(dev.in_use() == 102 * MiB);
        CHECK(dev.kept_chunks() == 0);  // none left kept: moved or released
        CHECK(dev.mapped_chunks() == 51);
        std::string why;
        const bool valid = pool.validate(&why);
        INFO(why);
        CHECK(valid);
        CHECK(dev.bad_calls() == 0);
        return pool.chunk_driver().moved;
    };
    fake_backend dev(102 * MiB);
    CHECK(run(dev, 0) == 7);
    CHECK(dev.moved_chunks() == 7);
    fake_backend plain(102 * MiB);  // a backend without moves: released and made, as before
    plain.set_moves(false);
    CHECK(run(plain, 0) == 0);
    CHECK(plain.moved_chunks() == 0);
    fake_backend refusing(102 * MiB);  // the map of the kept chunks fails: released, then made
    CHECK(run(refusing, 1) == 0);
    CHECK(refusing.moved_chunks() == 0);
}

TEST_CASE("foresight at its edges: a growth one chunk short is not tried, one that fits exactly is tried without a look before it", "[pool][vmm][arena]") {
    // The program above on a device with `spare` MiB beyond the 102 the blocks take: 20 MiB joins
    // [96, 102) at the arena's end and lacks 14 MiB (7 chunks).  The count is exact (no other
    // allocator), so only a count under 14 MiB may stop the growth, and then only after a look.
    SECTION("12 MiB free: one chunk short, not tried, served by moves") {
        full_pool fp(114 * MiB);
        auto& [dev, sink, pool] = fp;
        REQUIRE(dev.in_use() == 102 * MiB);
        uint64_t big = 0;
        REQUIRE(pool.allocate(20 * MiB, api_id::cuMemAlloc_v2, &big) == k_cuda_success);
        const block_pool::driver_tally t = pool.chunk_driver();
        CHECK(t.foreseen == 1);
        CHECK(t.refused == 0);
        CHECK(dev.undone_chunks() == 0);  // tried, it would have made and unmade 6 chunks
        CHECK(t.moved == 7);
        CHECK(sink.bytes(ev_kind::segment_unmap) == 14 * MiB);
        CHECK(dev.in_use() == 102 * MiB);  // the driver's 12 MiB untouched
        std::string why;
        const bool valid = pool.validate(&why);
        INFO(why);
        CHECK(valid);
        CHECK(dev.bad_calls() == 0);
    }
    SECTION("14 MiB free: it fits exactly, tried at once") {
        full_pool fp(116 * MiB);
        auto& [dev, sink, pool] = fp;
        const uint64_t looks = pool.chunk_driver().looks, maps = dev.map_calls();
        uint64_t big = 0;
        REQUIRE(pool.allocate(20 * MiB, api_id::cuMemAlloc_v2, &big) == k_cuda_success);
        const block_pool::driver_tally t = pool.chunk_driver();
        CHECK(t.foreseen == 0);
        CHECK(t.refused == 0);
        CHECK(dev.map_calls() == maps + 1);
        CHECK(sink.bytes(ev_kind::segment_unmap) == 0);
        CHECK(dev.in_use() == 116 * MiB);
        // One look: after_growth's, the count being under twice the headroom's limit now.  The
        // count said the growth fits, so none before it.
        CHECK(t.looks == looks + 1);
        CHECK(dev.bad_calls() == 0);
    }
    SECTION("the count says full, the driver has exactly 14 MiB (freed elsewhere): the look lets it be tried") {
        full_pool fp(102 * MiB);
        auto& [dev, sink, pool] = fp;
        dev.set_capacity(116 * MiB);
        uint64_t big = 0;
        REQUIRE(pool.allocate(20 * MiB, api_id::cuMemAlloc_v2, &big) == k_cuda_success);
        CHECK(pool.chunk_driver().foreseen == 0);
        CHECK(pool.chunk_driver().moved == 0);
        CHECK(sink.bytes(ev_kind::segment_unmap) == 0);  // nothing given back
        CHECK(dev.in_use() == 116 * MiB);
        CHECK(dev.bad_calls() == 0);
    }
    SECTION("the count says 64 MiB free, the driver has 4 MiB (taken elsewhere): tried, 2 chunks made and unmade") {
        full_pool fp(166 * MiB);
        auto& [dev, sink, pool] = fp;
        dev.set_capacity(106 * MiB);
        uint64_t big = 0;
        REQUIRE(pool.allocate(20 * MiB, api_id::cuMemAlloc_v2, &big) == k_cuda_success);
        CHECK(pool.chunk_driver().refused == 1);
        CHECK(pool.chunk_driver().foreseen == 0);
        CHECK(dev.undone_chunks() == 2);  // the 2 that fit, before the third was refused
        CHECK(dev.kept_chunks() == 0);
        CHECK(dev.bad_calls() == 0);
    }
}

TEST_CASE("a driver that cannot say its free memory is asked for the growth, not foreseen to refuse it", "[pool][vmm][arena]") {
    // The count says the device is full; then cuMemGetInfo cannot answer (0 of 0) and another
    // allocator frees 64 MiB.  The foresight's look says nothing, so the growth is tried, and made.
    fake_backend dev(102 * MiB);
    dev.set_vmm(2 * MiB);
    forwarding_backend be(dev);
    recording_sink sink;
    pool_config cfg = vmm_config();
    cfg.headroom = 8 * MiB;
    block_pool pool(cfg, be, &sink, 0);
    fragment_6mib(pool, 17);
    be.blind = true;
    dev.set_capacity(166 * MiB);
    uint64_t big = 0;
    REQUIRE(pool.allocate(20 * MiB, api_id::cuMemAlloc_v2, &big) == k_cuda_success);
    CHECK(pool.chunk_driver().foreseen == 0);
    CHECK(pool.chunk_driver().refused == 0);
    CHECK(sink.bytes(ev_kind::segment_unmap) == 0);  // nothing given back
    CHECK(dev.in_use() == 116 * MiB);
    CHECK(dev.bad_calls() == 0);
}

TEST_CASE("arenas, memory short: chunks a failed unmap_keep left kept are released, and the growth makes new ones", "[pool][vmm][arena]") {
    // The move program (20 MiB lacking 14 on a full 102 MiB device), with every unmap_keep
    // reporting an error after it kept its chunks: they are released at once (as unmap_chunks
    // would have), none is moved, and the growth creates its 7 chunks from the memory freed.
    fake_backend dev(102 * MiB);
    dev.set_vmm(2 * MiB);
    forwarding_backend be(dev);
    recording_sink sink;
    block_pool pool(vmm_config(), be, &sink, 0);
    const std::vector<uint64_t> six = fragment_6mib(pool, 17);
    be.keep_error = 1;  // CUDA_ERROR_INVALID_VALUE
    uint64_t big = 0;
    REQUIRE(pool.allocate(20 * MiB, api_id::cuMemAlloc_v2, &big) == k_cuda_success);
    CHECK(big == six[0] + 96 * MiB);
    CHECK(sink.bytes(ev_kind::segment_unmap) == 14 * MiB);
    CHECK(pool.chunk_driver().moved == 0);
    CHECK(pool.chunk_driver().unmapped == 7);  // released: the pool counts them given back
    CHECK(dev.moved_chunks() == 0);
    CHECK(dev.kept_chunks() == 0);
    CHECK(dev.in_use() == 102 * MiB);
    CHECK(dev.mapped_chunks() == 51);
    std::string why;
    const bool valid = pool.validate(&why);
    INFO(why);
    CHECK(valid);
    CHECK(dev.bad_calls() == 0);
}

TEST_CASE("fake backend: a kept chunk holds its memory, leaves its place, is granted anew where it is mapped, and wrong calls count", "[pool][vmm]") {
    // The fake stands for the driver in every moves test: what it accepts and refuses must be a
    // driver's (cuMemUnmap ends a mapping and its access; cuMemMap needs a free place and a handle
    // that is not mapped; cuMemRelease of a kept handle frees its memory).
    fake_backend dev(64 * MiB);
    dev.set_vmm(2 * MiB);
    uint64_t base = 0;
    REQUIRE(dev.va_reserve(32 * MiB, &base) == k_cuda_success);
    uint64_t h[2] = {0, 0};
    REQUIRE(dev.map_chunks(base, 2 * MiB, 2, h) == k_cuda_success);
    SECTION("moved: the old place's grant goes with its mapping, the peers added so far are granted at the new one") {
        REQUIRE(dev.set_peer_access(base, 4 * MiB, 1) == k_cuda_success);
        REQUIRE(dev.peer_can_access(base, 1));
        REQUIRE(dev.unmap_keep(base, 2 * MiB, 2, h) == k_cuda_success);
        CHECK(dev.kept_chunks() == 2);
        CHECK(dev.mapped_chunks() == 0);
        CHECK(dev.in_use() == 4 * MiB);  // kept: still allocated
        REQUIRE(dev.map_kept(base, 2 * MiB, 1, h) == k_cuda_success);  // the same place, no peer added
        CHECK_FALSE(dev.peer_can_access(base, 1));
        dev.add_peer(1);
        REQUIRE(dev.map_kept(base + 8 * MiB, 2 * MiB, 1, h + 1) == k_cuda_success);
        CHECK(dev.peer_can_access(base + 8 * MiB, 1));
        CHECK(dev.moved_chunks() == 2);
        CHECK(dev.kept_chunks() == 0);
        CHECK(dev.mapped_chunks() == 2);
        CHECK(dev.bad_calls() == 0);
    }
    SECTION("released: the memory goes back") {
        REQUIRE(dev.unmap_keep(base, 2 * MiB, 2, h) == k_cuda_success);
        REQUIRE(dev.release_kept(2 * MiB, 2, h) == k_cuda_success);
        CHECK(dev.in_use() == 0);
        CHECK(dev.kept_chunks() == 0);
        CHECK(dev.bad_calls() == 0);
    }
    SECTION("wrong calls: refused and counted, nothing changed") {
        const uint64_t swapped[2] = {h[1], h[0]};
        CHECK(dev.unmap_keep(base, 2 * MiB, 2, swapped) == k_cuda_invalid_value);  // not the handles mapped there
        CHECK(dev.bad_calls() == 2);
        CHECK(dev.mapped_chunks() == 2);
        CHECK(dev.map_kept(base + 8 * MiB, 2 * MiB, 1, h) == k_cuda_invalid_value);  // h[0] is mapped, not kept
        CHECK(dev.bad_calls() == 3);
        CHECK(dev.release_kept(2 * MiB, 1, h) == k_cuda_invalid_value);  // nor can it be released so
        CHECK(dev.bad_calls() == 4);
        CHECK(dev.in_use() == 4 * MiB);
        REQUIRE(dev.unmap_keep(base + 2 * MiB, 2 * MiB, 1, h + 1) == k_cuda_success);
        CHECK(dev.map_kept(base, 2 * MiB, 1, h + 1) == k_cuda_invalid_value);  // onto h[0]'s mapping
        CHECK(dev.bad_calls() == 5);
        CHECK(dev.kept_chunks() == 1);
        CHECK(dev.mapped_chunks() == 1);
    }
    SECTION("a chunk still mapped a second time (stitched), or unmapped during a capture: counted") {
        REQUIRE(dev.map_alias(base + 8 * MiB, 2 * MiB, 1, h) == k_cuda_success);
        REQUIRE(dev.unmap_keep(base, 2 * MiB, 1, h) == k_cuda_success);
        CHECK(dev.bad_calls() == 1);
        dev.set_capturing(true);
        REQUIRE(dev.unmap_keep(base + 2 * MiB, 2 * MiB, 1, h + 1) == k_cuda_success);
        CHECK(dev.bad_calls() == 2);
        dev.end_captures();
    }
}

TEST_CASE("after a growth the pool looks at the driver only once the count is under twice the headroom's limit", "[pool][vmm][arena]") {
    // 128 MiB device: the limit is 2 MiB (a 64th), the line 4 MiB.  The first growth looks (no
    // count yet); one that leaves exactly 4 MiB counted is not near the line; one under it is.
    fake_backend dev(128 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    pool_config cfg = vmm_config();
    cfg.headroom = 8 * MiB;
    block_pool pool(cfg, dev, &sink, 0);
    uint64_t a = 0, b = 0, c = 0;
    REQUIRE(pool.allocate(60 * MiB, api_id::cuMemAlloc_v2, &a) == k_cuda_success);
    const uint64_t first = pool.chunk_driver().looks;
    CHECK(first >= 1);
    REQUIRE(pool.allocate(64 * MiB, api_id::cuMemAlloc_v2, &b) == k_cuda_success);
    REQUIRE(dev.in_use() == 124 * MiB);
    CHECK(pool.chunk_driver().looks == first);  // 4 MiB counted: on the line, not under it
    REQUIRE(pool.allocate(2 * MiB, api_id::cuMemAlloc_v2, &c) == k_cuda_success);
    CHECK(pool.chunk_driver().looks == first + 1);  // 2 MiB counted: under the line
    CHECK_FALSE(pool.headroom_short());  // 2 MiB free is not under the 2 MiB limit
    CHECK(dev.bad_calls() == 0);
}

TEST_CASE("a request larger than the whole device fails at once and keeps the cache", "[pool][vmm][arena]") {
    // No give-back can make room for more than the device holds; giving back only emptied the
    // cache of a program that probes for the largest allocation that fits (each probe over the
    // device's size cost every cached chunk, mapped again at the next allocations).  The driver
    // answers such a request OUT_OF_MEMORY at once; so does the pool now, once it knows the size.
    // The first allocation's stats event tells the pool the device's size, headroom on or off.
    const uint64_t headroom = GENERATE(8 * MiB, 0);
    INFO("headroom " << headroom);
    fake_backend dev(128 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    pool_config cfg = vmm_config();
    cfg.headroom = headroom;
    block_pool pool(cfg, dev, &sink, 0);
    uint64_t a = 0, big = 0;
    int rc = 0;
    REQUIRE(pool.allocate(60 * MiB, api_id::cuMemAlloc_v2, &a) == k_cuda_success);
    pool.maybe_emit_stats(5);  // as the hooks do after each allocation (pool_hooks.cc): the first emits
    REQUIRE(pool.deallocate(a, api_id::cuMemFree_v2, &rc));
    const uint64_t cached = dev.in_use();
    REQUIRE(cached >= 60 * MiB);
    CHECK(pool.allocate(129 * MiB, api_id::cuMemAlloc_v2, &big) == k_cuda_oom);
    CHECK(dev.in_use() == cached);
    CHECK(sink.bytes(ev_kind::segment_unmap) == 0);
    CHECK(sink.count(ev_kind::segment_free) == 0);
    // A request the device could hold still gets the whole give-back path, and is served.
    REQUIRE(pool.allocate(120 * MiB, api_id::cuMemAlloc_v2, &big) == k_cuda_success);
    CHECK(dev.bad_calls() == 0);
}

TEST_CASE("the pool counts and times its own chunk calls: maps, refusals, unmaps and looks at the driver", "[pool][vmm][arena]") {
    // The bounded give-back's program (above): every growth near the device's limit is refused
    // first, then served after a give-back; the counts must match what the driver and the log saw.
    full_pool fp(102 * MiB);
    auto& [dev, sink, pool] = fp;
    const block_pool::driver_tally filled = pool.chunk_driver();
    CHECK(filled.mapped == 51);  // 102 MiB in 2 MiB chunks
    CHECK(filled.refused == 0);
    CHECK(filled.unmapped == 0);
    CHECK(filled.looks > 0);
    constexpr uint64_t nap = 200000;  // 0.2 ms a call
    dev.set_chunk_sleep_ns(nap);
    const uint64_t calls_before = dev.map_calls() + dev.unmap_calls();
    uint64_t big = 0, bigger = 0, more = 0;
    REQUIRE(pool.allocate(20 * MiB, api_id::cuMemAlloc_v2, &big) == k_cuda_success);
    const block_pool::driver_tally one = pool.chunk_driver();
    CHECK(one.foreseen == filled.foreseen + 1);  // the growth, not tried before the give-back
    CHECK(one.refused == filled.refused);
    REQUIRE(pool.allocate(40 * MiB, api_id::cuMemAlloc_v2, &bigger) == k_cuda_success);
    CHECK(pool.allocate(8 * MiB, api_id::cuMemAlloc_v2, &more) == k_cuda_oom);
    const block_pool::driver_tally t = pool.chunk_driver();
    CHECK(t.refused > one.refused);
    CHECK(t.unmapped * 2 * MiB == sink.bytes(ev_kind::segment_unmap));
    CHECK(t.mapped - t.unmapped == dev.mapped_chunks());
    CHECK(t.looks > filled.looks);
    // Every map and unmap call slept: the time counted is at least theirs (mem_info naps too).
    const uint64_t calls = dev.map_calls() + dev.unmap_calls() - calls_before;
    REQUIRE(dev.alias_chunks() == 0);  // the fake counts stitching's calls too, which do not nap
    CHECK(calls > 0);
    CHECK(t.map_ns + t.unmap_ns - filled.map_ns - filled.unmap_ns >= calls * nap);
    CHECK(t.look_ns - filled.look_ns >= (t.looks - filled.looks) * nap);
    CHECK(dev.bad_calls() == 0);
}

TEST_CASE("a growth the driver cannot hold is not tried, and a count made stale by memory freed elsewhere is looked at again", "[pool][vmm][arena]") {
    // A refused growth makes and unmakes every chunk before the one the driver refuses; the pool
    // counts the driver's free memory and, when that is too little, looks once more and does not
    // try.  The count must never stop a growth the driver would serve: the look decides.
    full_pool fp(102 * MiB);  // the device full: 51 chunks, 66 MiB of them in free blocks
    auto& [dev, sink, pool] = fp;
    const uint64_t maps = dev.map_calls(), looks = pool.chunk_driver().looks;
    uint64_t big = 0;
    REQUIRE(pool.allocate(20 * MiB, api_id::cuMemAlloc_v2, &big) == k_cuda_success);
    CHECK(pool.chunk_driver().foreseen == 1);
    CHECK(pool.chunk_driver().refused == 0);
    CHECK(dev.undone_chunks() == 0);                 // no chunk made and unmade
    CHECK(pool.chunk_driver().looks > looks);        // the look that confirmed it
    CHECK(sink.bytes(ev_kind::segment_unmap) > 0);   // served from the give-back
    CHECK(dev.map_calls() == maps + 1);              // one map: the growth after it
    // Another allocator frees 64 MiB: the pool's count still says the device is full.  A growth
    // the driver can hold now must be made, with nothing given back.
    dev.set_capacity(166 * MiB);
    const uint64_t unmapped = sink.bytes(ev_kind::segment_unmap);
    uint64_t more = 0;
    REQUIRE(pool.allocate(40 * MiB, api_id::cuMemAlloc_v2, &more) == k_cuda_success);
    CHECK(pool.chunk_driver().foreseen == 1);
    CHECK(sink.bytes(ev_kind::segment_unmap) == unmapped);
    std::string why;
    CHECK(pool.validate(&why));
    CHECK(dev.bad_calls() == 0);
}

TEST_CASE("a growth that needs a new arena and that the driver cannot hold reserves no address space before it is declined", "[pool][vmm][arena]") {
    // 32 MiB arenas on an 80 MiB device: two 30 MiB blocks fill one arena each, the first is freed,
    // and a 40 MiB request fits no hole, so its growth needs an arena of its own, 40 MiB, where
    // the driver has 20.  The look declines it before any address space is reserved (a review
    // found the first cut reserving the arena, with a slot per chunk, only to free it); the give-
    // back then makes room and the retry reserves once.
    fake_backend dev(80 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    pool_config cfg = vmm_config();
    cfg.arena = 32 * MiB;
    cfg.headroom = 8 * MiB;
    block_pool pool(cfg, dev, &sink, 0);
    const uint64_t a = alloc_ok(pool, 30 * MiB);
    const uint64_t b = alloc_ok(pool, 30 * MiB);
    REQUIRE(dev.in_use() == 60 * MiB);
    REQUIRE(sink.of(ev_kind::segment_alloc).size() == 2);
    free_ok(pool, a);
    const uint64_t reserves = dev.va_reserves();
    const uint64_t foreseen = pool.chunk_driver().foreseen;
    uint64_t c = 0;
    REQUIRE(pool.allocate(40 * MiB, api_id::cuMemAlloc_v2, &c) == k_cuda_success);
    CHECK(pool.chunk_driver().foreseen == foreseen + 1);
    CHECK(dev.va_reserves() == reserves + 1);  // the retry's arena only
    CHECK(sink.bytes(ev_kind::segment_unmap) == 30 * MiB);  // the freed block went back for it
    CHECK(dev.in_use() == 70 * MiB);
    std::string why;
    const bool valid = pool.validate(&why);
    INFO(why);
    CHECK(valid);
    free_ok(pool, b);
    free_ok(pool, c);
    CHECK(dev.bad_calls() == 0);
}

TEST_CASE("a growth refused where the count said it would fit makes the pool look again, so the next miss does not try", "[pool][vmm][arena]") {
    // Another allocator takes the 64 MiB the pool counts as the driver's: the first miss's growth
    // is tried and refused, served by a move; the look after it must correct the count, or every
    // miss until the next stats look would try a growth the driver refuses (a review found the
    // look gone with the first cut of moves).
    full_pool fp(166 * MiB);
    auto& [dev, sink, pool] = fp;
    dev.set_capacity(102 * MiB);
    uint64_t big = 0, bigger = 0;
    REQUIRE(pool.allocate(20 * MiB, api_id::cuMemAlloc_v2, &big) == k_cuda_success);
    const block_pool::driver_tally one = pool.chunk_driver();
    CHECK(one.refused == 1);
    CHECK(one.moved > 0);
    CHECK(pool.headroom_short());  // the driver has nothing left, under the 8 MiB headroom
    REQUIRE(pool.allocate(40 * MiB, api_id::cuMemAlloc_v2, &bigger) == k_cuda_success);
    CHECK(pool.chunk_driver().refused == one.refused);
    CHECK(pool.chunk_driver().foreseen == one.foreseen + 1);
    std::string why;
    CHECK(pool.validate(&why));
    CHECK(dev.bad_calls() == 0);
}

TEST_CASE("arenas: GPUMEM_POOL_ARENA sizes the address range, off turns arenas off", "[pool][vmm][arena]") {
    const char* env_size[][2] = {{"GPUMEM_POOL_ARENA", "32MiB"}, {nullptr, nullptr}};
    static const char* (*table)[2];
    table = env_size;
    auto get = [](const char* n) -> const char* {
        for (auto* r = table; (*r)[0]; ++r)
            if (!std::strcmp((*r)[0], n)) return (*r)[1];
        return nullptr;
    };
    pool_config cfg = pool_config::from_env(get);
    CHECK(cfg.arenas);
    CHECK(cfg.arena == 32 * MiB);
    const char* env_off[][2] = {{"GPUMEM_POOL_ARENA", "off"}, {nullptr, nullptr}};
    table = env_off;
    CHECK_FALSE(pool_config::from_env(get).arenas);
    const char* env_bad[][2] = {{"GPUMEM_POOL_ARENA", "lots"}, {nullptr, nullptr}};
    table = env_bad;
    const pool_config bad = pool_config::from_env(get);
    CHECK(bad.arenas);
    CHECK(bad.arena == 0);
    CHECK_THAT(bad.warnings, Catch::Contains("GPUMEM_POOL_ARENA=lots"));

    // A request bigger than the arena gets an arena of its own size; the next one a new arena.
    fake_backend dev(256 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    pool_config c = vmm_config();
    c.arena = 32 * MiB;
    block_pool pool(c, dev, &sink, 0);
    uint64_t x = 0, y = 0, z = 0;
    REQUIRE(pool.allocate(40 * MiB, api_id::cuMemAlloc_v2, &x) == k_cuda_success);
    REQUIRE(pool.allocate(20 * MiB, api_id::cuMemAlloc_v2, &y) == k_cuda_success);
    REQUIRE(pool.allocate(20 * MiB, api_id::cuMemAlloc_v2, &z) == k_cuda_success);
    const auto segs = sink.of(ev_kind::segment_alloc);
    REQUIRE(segs.size() == 3);
    CHECK(segs[0].b.size == 40 * MiB);
    CHECK(segs[0].b.asize == 0);  // mapped whole: no asize
    CHECK(segs[1].b.size == 32 * MiB);
    CHECK(segs[1].b.asize == 20 * MiB);
    CHECK(segs[2].b.size == 32 * MiB);  // 12 MiB left in the second arena: not enough
    std::string why;
    CHECK(pool.validate(&why));
    CHECK(dev.bad_calls() == 0);
}

TEST_CASE("arenas: a device that claims more than 1 TiB gets arenas of 1 TiB", "[pool][vmm][arena]") {
    // An arena keeps a handle slot per chunk: for a replay's fake device that claims 16 TiB,
    // 18 TiB of address space would cost 72 MiB of host memory per pool (and a petabyte device
    // 4.5 GiB).  Capped, an arena is at most 1 TiB (4 MiB of slots).
    fake_backend dev(16ull << 40);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    block_pool pool(vmm_config(), dev, &sink, 0);
    const uint64_t p = alloc_ok(pool, 4 * MiB);
    const auto segs = sink.of(ev_kind::segment_alloc);
    REQUIRE(segs.size() == 1);
    CHECK(segs[0].b.size == 1ull << 40);
    CHECK(segs[0].b.asize == 4 * MiB);
    free_ok(pool, p);
    CHECK(dev.bad_calls() == 0);
}

TEST_CASE("arenas: the small pool grows by GPUMEM_POOL_SMALL_SEGMENT, and by one chunk when the driver has less", "[pool][vmm][arena]") {
    // The small pool maps a small segment's worth at a time (fewer driver calls for many small
    // blocks); when the driver cannot give that much, just the chunk the request needs, before
    // any give-back: the OOM path would unmap the pool's cached free chunks for nothing.
    fake_backend dev(64 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    pool_config cfg = vmm_config();
    cfg.small_segment = 8 * MiB;
    block_pool pool(cfg, dev, &sink, 0);
    std::vector<uint64_t> small;
    small.push_back(alloc_ok(pool, 512 * KiB));
    auto segs = sink.of(ev_kind::segment_alloc);
    REQUIRE(segs.size() == 1);
    CHECK(segs[0].b.asize == 8 * MiB);  // the small arena, 8 MiB of it mapped
    const uint64_t a = alloc_ok(pool, 20 * MiB), b = alloc_ok(pool, 20 * MiB), c = alloc_ok(pool, 10 * MiB);
    free_ok(pool, b);  // 20 MiB of free chunks cached in the large arena
    REQUIRE(dev.in_use() == 58 * MiB);  // 6 MiB left for the driver
    while (small.size() < 16) small.push_back(alloc_ok(pool, 512 * KiB));  // the small arena's 8 MiB used
    const size_t maps = sink.count(ev_kind::segment_map);
    small.push_back(alloc_ok(pool, 512 * KiB));
    const auto map_events = sink.of(ev_kind::segment_map);
    REQUIRE(map_events.size() == maps + 1);
    CHECK(map_events.back().b.size == 2 * MiB);
    CHECK(sink.count(ev_kind::segment_unmap) == 0);  // the cached chunks stayed
    CHECK(dev.in_use() == 60 * MiB);
    for (uint64_t p : small) free_ok(pool, p);
    free_ok(pool, a);
    free_ok(pool, c);
    CHECK(dev.bad_calls() == 0);
    std::string why;
    CHECK(pool.validate(&why));
}

TEST_CASE("peer access: a device granted access reaches every chunk mapped before and after", "[pool][vmm]") {
    // cuCtxEnablePeerAccess opens a context's cuMemAlloc memory to another device; chunks need
    // cuMemSetAccess for it, or a kernel of that device faults where it would not without gpumem.
    fake_backend dev(256 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    block_pool pool(vmm_config(), dev, &sink, 0);
    uint64_t a = 0, b = 0, c = 0;
    REQUIRE(pool.allocate(5000, api_id::cuMemAlloc_v2, &a) == k_cuda_success);          // small arena
    REQUIRE(pool.allocate(30 * MiB, api_id::cuMemAlloc_v2, &b) == k_cuda_success);      // large arena
    CHECK_FALSE(dev.peer_can_access(a, 1));
    pool.grant_peer(0);  // its own device: nothing to do
    pool.grant_peer(1);
    CHECK(dev.peer_can_access(a, 1));
    CHECK(dev.peer_can_access(b, 1));
    CHECK(dev.peer_can_access(b + 30 * MiB - 1, 1));
    CHECK_FALSE(dev.peer_can_access(b, 2));
    // Growth after the grant: the new chunks are granted as they are mapped.
    REQUIRE(pool.allocate(50 * MiB, api_id::cuMemAlloc_v2, &c) == k_cuda_success);
    CHECK(dev.peer_can_access(c, 1));
    CHECK(dev.peer_can_access(c + 50 * MiB - 1, 1));
    // Chunks given back, then mapped again: b's chunks go back at the OOM of a 180 MiB request
    // (82 MiB mapped + 180 > 256), and a later 20 MiB request maps part of that hole again.
    int rc = -1;
    REQUIRE(pool.deallocate(b, api_id::cuMemFree_v2, &rc));
    uint64_t big = 0, again = 0;
    REQUIRE(pool.allocate(180 * MiB, api_id::cuMemAlloc_v2, &big) == k_cuda_success);
    CHECK(sink.count(ev_kind::segment_unmap) > 0);
    CHECK(dev.peer_can_access(big, 1));
    CHECK(dev.peer_can_access(big + 180 * MiB - 1, 1));
    REQUIRE(pool.allocate(20 * MiB, api_id::cuMemAlloc_v2, &again) == k_cuda_success);
    CHECK(again < c);  // in b's old place
    CHECK(dev.peer_can_access(again, 1));
    CHECK(dev.peer_can_access(again + 20 * MiB - 1, 1));
    CHECK(dev.bad_calls() == 0);
    std::string why;
    CHECK(pool.validate(&why));
}

TEST_CASE("peer access: a context's end forgets its peers, so chunks the pool maps for the next context grant none", "[pool][vmm]") {
    // Peer access ends with the context; a retired pool serves the next context the driver makes
    // with the same handle (pool_registry).  Before, the backend kept the devices added, and that
    // context's chunks were granted to a device that never enabled access to it.
    fake_backend dev(256 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    block_pool pool(vmm_config(), dev, &sink, 0);
    uint64_t a = 0, b = 0;
    REQUIRE(pool.allocate(30 * MiB, api_id::cuMemAlloc_v2, &a) == k_cuda_success);
    pool.grant_peer(1);
    CHECK(dev.peer_can_access(a, 1));
    pool.drop_all(context_end::coming);
    REQUIRE(pool.allocate(30 * MiB, api_id::cuMemAlloc_v2, &b) == k_cuda_success);
    CHECK_FALSE(dev.peer_can_access(b, 1));
    CHECK_FALSE(dev.peer_can_access(b + 30 * MiB - 1, 1));
    pool.grant_peer(1);  // the new context's own enable
    CHECK(dev.peer_can_access(b, 1));
    CHECK(dev.bad_calls() == 0);
    std::string why;
    CHECK(pool.validate(&why));
}

TEST_CASE("stitching: a request past the high-water mark takes scattered free chunks, given back at its free", "[pool][vmm][stitch]") {
    // 100 blocks of 6 MiB, two of three freed: 400 MiB free in 12 MiB pieces between live blocks.
    // A 60 MiB request fits no piece; growing would lift reserved memory over its high-water mark.
    auto run = [](bool stitch, fake_backend& dev, recording_sink& sink, reuse_mode reuse = reuse_mode::safe) {
        dev.set_vmm(2 * MiB);
        pool_config cfg = vmm_config();
        cfg.reuse = reuse;
        cfg.stitch = stitch;
        block_pool pool(cfg, dev, &sink, 0);
        fragment_6mib(pool, 100);
        pool.release_cached();  // the frees settle (one sync); the arena keeps its live blocks
        const uint64_t before = dev.in_use();
        const pool_state layout = pool.snapshot();
        uint64_t big = 0;
        REQUIRE(pool.allocate(60 * MiB, api_id::cuMemAlloc_v2, &big) == k_cuda_success);
        block_pool::block_info bi{};
        REQUIRE(pool.lookup(big + 60 * MiB - 1, &bi));
        CHECK(bi.allocated);
        CHECK(bi.block == big);
        std::string why;
        CHECK(pool.validate(&why));
        INFO(why);
        const uint64_t grown = dev.in_use() - before;
        // Its free and a settle: a stitched segment goes back to its lenders at once.
        int rc = -1;
        REQUIRE(pool.deallocate(big, api_id::cuMemFree_v2, &rc));
        pool.release_cached();
        CHECK(pool.validate(&why));
        CHECK(dev.bad_calls() == 0);
        CHECK(dev.aliases() == 0);
        CHECK(pool.snapshot().reserved == dev.in_use());
        // With a stitch, the lenders are free blocks again, merged as before: the same layout as
        // before the stitch (without one, the growth's 60 MiB stay as a free block).
        const pool_state after = pool.snapshot();
        if (stitch && reuse == reuse_mode::safe) {
            CHECK(after.reserved == layout.reserved);
            CHECK(after.free_blocks == layout.free_blocks);
            CHECK(after.largest_free == layout.largest_free);
            CHECK(after.segments == layout.segments);
        }
        uint64_t made = 0, chunks = 0, dissolved = 0;
        pool.stitch_counts(&made, &chunks, &dissolved);
        CHECK(made == dissolved);
        return std::make_pair(grown, chunks);
    };
    fake_backend on(8ull << 30), off(8ull << 30);
    recording_sink s_on, s_off;
    const auto [grown_on, chunks_on] = run(true, on, s_on);
    const auto [grown_off, chunks_off] = run(false, off, s_off);
    CHECK(grown_off == 60 * MiB);  // without stitching the arena grows by the request
    CHECK(grown_on == 0);          // with it, no new memory: 30 chunks mapped a second time
    CHECK(chunks_on == 30);
    CHECK(chunks_off == 0);
    CHECK(on.alias_chunks() == 30);
    // Logged as a move: the lenders leave (segment_unmap), the stitched range arrives
    // (segment_alloc) and goes (segment_free), the lenders come back (segment_map).
    // Without stitching, one more map (the growth); with it, one map back per lender.
    CHECK(s_on.count(ev_kind::segment_map) == s_off.count(ev_kind::segment_map) - 1 + s_on.count(ev_kind::segment_unmap));
    CHECK(s_on.count(ev_kind::segment_unmap) >= 5);  // 12 MiB pieces: at least 5 lenders
    CHECK(s_on.count(ev_kind::segment_free) == 1);
    CHECK(s_off.count(ev_kind::segment_unmap) == 0);
    // Under immediate reuse nothing is stitched (a freed stitched block could settle only by a
    // wait on the device): the arena grows, as without stitching.
    fake_backend imm(8ull << 30);
    recording_sink s_imm;
    const auto [grown_imm, chunks_imm] = run(true, imm, s_imm, reuse_mode::immediate);
    CHECK(grown_imm == 60 * MiB);
    CHECK(chunks_imm == 0);
}

TEST_CASE("stitching: a driver that refuses to unmap the second mapping keeps the lenders lent", "[pool][vmm][stitch]") {
    stitch_pool f(30, 0);  // no kept range: the dissolve unmaps (a kept range's refusal: below)
    fake_backend& dev = f.dev;
    block_pool& pool = f.pool;
    const std::vector<uint64_t>& small = f.six;
    int rc = -1;
    uint64_t big = 0;
    REQUIRE(pool.allocate(60 * MiB, api_id::cuMemAlloc_v2, &big) == k_cuda_success);
    REQUIRE(dev.aliases() == 30);
    dev.fail_unmap_alias(true);
    REQUIRE(pool.deallocate(big, api_id::cuMemFree_v2, &rc));
    pool.release_cached();  // releases the block; the dissolve's unmap is refused
    std::string why;
    CHECK(pool.validate(&why));
    INFO(why);
    CHECK(dev.aliases() == 30);  // still mapped twice
    // Out of service: the same request is served elsewhere (a second stitch from the other free
    // pieces), and nothing releases the first one's chunks, not even release_cached with every
    // block free (the fake counts a release of a chunk mapped twice as a bad call).
    dev.fail_unmap_alias(false);
    uint64_t again = 0;
    REQUIRE(pool.allocate(60 * MiB, api_id::cuMemAlloc_v2, &again) == k_cuda_success);
    CHECK(again != big);
    for (size_t i = 0; i < small.size(); i += 3) REQUIRE(pool.deallocate(small[i], api_id::cuMemFree_v2, &rc));
    REQUIRE(pool.deallocate(again, api_id::cuMemFree_v2, &rc));
    pool.release_cached();
    CHECK(pool.validate(&why));
    CHECK(dev.bad_calls() == 0);
    CHECK(dev.aliases() == 30);       // the second stitch dissolved, the first stays
    CHECK(dev.in_use() >= 60 * MiB);  // and so do its lenders' chunks
}

TEST_CASE("stitching: a kept range serves the next stitch, remapping only the positions whose chunks are taken", "[pool][vmm][stitch]") {
    // 16 blocks of 6 MiB: five 12 MiB pieces free between live blocks (A1..A5, by address), the
    // frees settled; a miss with 6 MiB pending releases it (one sync).
    stitch_pool f(16, 2, 4 * MiB);
    fake_backend& dev = f.dev;
    block_pool& pool = f.pool;
    const std::vector<uint64_t>& six = f.six;
    int rc = -1;
    std::string why;
    uint64_t big = 0, again = 0, a1 = 0;
    REQUIRE(pool.allocate(60 * MiB, api_id::cuMemAlloc_v2, &big) == k_cuda_success);
    REQUIRE(dev.alias_chunks() == 30);  // A1..A5
    // Freed, then the same request: the miss releases the free (pending past the sync budget),
    // the stitched segment dissolves into the kept range, and the stitch finds all 30 positions'
    // chunks free again.
    REQUIRE(pool.deallocate(big, api_id::cuMemFree_v2, &rc));
    REQUIRE(pool.allocate(60 * MiB, api_id::cuMemAlloc_v2, &again) == k_cuda_success);
    CHECK(again == big);
    CHECK(dev.alias_chunks() == 30);  // no driver call
    CHECK(dev.alias_unmapped_chunks() == 0);
    uint64_t made = 0, dissolved = 0, reused = 0;
    pool.stitch_counts(&made, nullptr, &dissolved, &reused);
    CHECK(made == 2);
    CHECK(dissolved == 1);
    CHECK(reused == 1);
    CHECK(pool.validate(&why));
    INFO(why);
    // A lender piece taken by the program meanwhile: a 12 MiB request misses, releases the free
    // and takes A1.  Two live blocks freed then give 6 chunks elsewhere: the next stitch keeps
    // A2..A5's 24 positions and remaps A1's 6 to them.
    REQUIRE(pool.deallocate(again, api_id::cuMemFree_v2, &rc));
    REQUIRE(pool.allocate(12 * MiB, api_id::cuMemAlloc_v2, &a1) == k_cuda_success);
    CHECK(a1 == six[1]);
    CHECK(pool.kept_ranges() == 1);
    REQUIRE(pool.deallocate(six[3], api_id::cuMemFree_v2, &rc));
    REQUIRE(pool.deallocate(six[6], api_id::cuMemFree_v2, &rc));
    CHECK(pool.kept_ranges() == 1);
    REQUIRE(pool.allocate(60 * MiB, api_id::cuMemAlloc_v2, &again) == k_cuda_success);
    CHECK(again == big);
    CHECK(dev.alias_chunks() == 36);
    CHECK(dev.alias_unmapped_chunks() == 6);
    uint64_t unmapped = 0, ns = 0;
    pool.stitch_driver(&unmapped, &ns);
    CHECK(unmapped == 6);
    CHECK(ns > 0);
    CHECK(pool.validate(&why));
    CHECK(dev.bad_calls() == 0);
    // Released everything cached: the kept range goes too, before any chunk is released.
    REQUIRE(pool.deallocate(again, api_id::cuMemFree_v2, &rc));
    REQUIRE(pool.deallocate(a1, api_id::cuMemFree_v2, &rc));
    pool.release_cached();
    CHECK(pool.kept_ranges() == 0);
    CHECK(dev.aliases() == 0);
    CHECK(dev.bad_calls() == 0);
    CHECK(pool.validate(&why));
    // Memory short with a kept range: it is unmapped before the free chunks are released.
    REQUIRE(pool.allocate(60 * MiB, api_id::cuMemAlloc_v2, &again) == k_cuda_success);
    REQUIRE(pool.deallocate(again, api_id::cuMemFree_v2, &rc));
    REQUIRE(pool.allocate(60 * MiB, api_id::cuMemAlloc_v2, &again) == k_cuda_success);  // on the kept range
    REQUIRE(pool.deallocate(again, api_id::cuMemFree_v2, &rc));
    pool.stitch_counts(nullptr, nullptr, nullptr, &reused);
    CHECK(reused == 3);
    uint64_t huge = 0;  // more than the device has: the pool releases what it can, then fails
    CHECK(pool.allocate(8ull << 30, api_id::cuMemAlloc_v2, &huge) == k_cuda_oom);
    CHECK(pool.kept_ranges() == 0);
    CHECK(dev.aliases() == 0);
    CHECK(dev.bad_calls() == 0);
    CHECK(pool.validate(&why));
    CHECK(pool.snapshot().reserved == dev.in_use());
}

TEST_CASE("stitching: a kept range of twice the request serves a later, larger stitch", "[pool][vmm][stitch]") {
    // A training loop with varying shapes stitches larger requests later: a range reserved at
    // twice the first request takes them without a new reservation, keeping its mapped positions.
    stitch_pool f(40, 2, 4 * MiB);  // 13 free pieces of 12 MiB; a miss releases a pending 6 MiB
    uint64_t big = alloc_ok(f.pool, 60 * MiB);
    REQUIRE(f.dev.alias_chunks() == 30);
    free_ok(f.pool, big);
    const uint64_t reservations = f.dev.reservations();
    // The miss releases the free, the stitched segment dissolves into its kept range, and the
    // 100 MiB stitch takes that range: 30 positions kept, 20 more mapped.
    const uint64_t larger = alloc_ok(f.pool, 100 * MiB);
    CHECK(larger == big);
    uint64_t made = 0, reused = 0;
    f.pool.stitch_counts(&made, nullptr, nullptr, &reused);
    CHECK(made == 2);
    CHECK(reused == 1);
    CHECK(f.dev.alias_chunks() == 50);
    CHECK(f.dev.reservations() == reservations);
    free_ok(f.pool, larger);
    CHECK(f.dev.bad_calls() == 0);
    std::string why;
    CHECK(f.pool.validate(&why));
}

TEST_CASE("stitching: a peer granted access while a stitched range is idle reaches every position of the next stitch on it", "[pool][vmm][stitch]") {
    // cuMemSetAccess is per mapping: a stitched range's positions are granted when they are mapped,
    // and a kept range's positions stay mapped across stitches.  A peer added while the range was
    // idle must be granted there too, or its kernels fault on the kept positions of the next block.
    stitch_pool f(16, 2, 4 * MiB);  // A1..A5 free, 12 MiB each
    fake_backend& dev = f.dev;
    block_pool& pool = f.pool;
    const std::vector<uint64_t>& six = f.six;
    int rc = -1;
    uint64_t big = 0, again = 0, a1 = 0;
    REQUIRE(pool.allocate(60 * MiB, api_id::cuMemAlloc_v2, &big) == k_cuda_success);
    // In use: the stitched block is granted through its segment.
    pool.grant_peer(2);
    for (uint64_t off = 0; off < 60 * MiB; off += 2 * MiB) CHECK(dev.peer_can_access(big + off, 2));
    REQUIRE(pool.deallocate(big, api_id::cuMemFree_v2, &rc));
    REQUIRE(pool.allocate(12 * MiB, api_id::cuMemAlloc_v2, &a1) == k_cuda_success);  // dissolves, takes A1
    CHECK(a1 == six[1]);
    REQUIRE(pool.kept_ranges() == 1);
    pool.grant_peer(1);  // while the range is idle
    REQUIRE(pool.deallocate(six[3], api_id::cuMemFree_v2, &rc));
    REQUIRE(pool.deallocate(six[6], api_id::cuMemFree_v2, &rc));
    REQUIRE(pool.allocate(60 * MiB, api_id::cuMemAlloc_v2, &again) == k_cuda_success);
    REQUIRE(again == big);  // on the kept range: 24 positions kept, 6 mapped again
    for (uint64_t off = 0; off < 60 * MiB; off += 2 * MiB) {
        INFO("offset " << off / MiB << " MiB");
        CHECK(dev.peer_can_access(again + off, 1));
        CHECK(dev.peer_can_access(again + off, 2));
    }
    CHECK(dev.bad_calls() == 0);
    std::string why;
    CHECK(pool.validate(&why));
    INFO(why);
}

TEST_CASE("stitching: a refused unmap of a kept range stops every chunk release", "[pool][vmm][stitch]") {
    stitch_pool f(30);
    fake_backend& dev = f.dev;
    block_pool& pool = f.pool;
    const std::vector<uint64_t>& six = f.six;
    int rc = -1;
    uint64_t big = 0;
    REQUIRE(pool.allocate(60 * MiB, api_id::cuMemAlloc_v2, &big) == k_cuda_success);
    REQUIRE(pool.deallocate(big, api_id::cuMemFree_v2, &rc));
    dev.fail_unmap_alias(true);
    pool.release_cached();  // dissolves into the kept range, whose unmap is refused
    const uint64_t held = dev.in_use();
    CHECK(held > 0);
    dev.fail_unmap_alias(false);
    for (size_t i = 0; i < six.size(); i += 3) REQUIRE(pool.deallocate(six[i], api_id::cuMemFree_v2, &rc));
    pool.release_cached();  // every block free, but a chunk may be mapped twice: none released
    std::string why;
    CHECK(pool.validate(&why));
    INFO(why);
    CHECK(dev.bad_calls() == 0);  // the fake counts a release of a chunk mapped twice
    CHECK(dev.aliases() == 30);
    CHECK(dev.in_use() == held);
}

TEST_CASE("context end: virtual-memory chunks and address space go back, live blocks and stitches included", "[pool][vmm][stitch]") {
    // cuMemCreate memory belongs to no context: forgetting it at a context's end (as cuMemAlloc
    // segments may be) would keep it from the program's next context.
    stitch_pool f(30);  // live blocks stay
    fake_backend& dev = f.dev;
    block_pool& pool = f.pool;
    const std::vector<uint64_t>& small = f.six;
    uint64_t big = 0;
    REQUIRE(pool.allocate(60 * MiB, api_id::cuMemAlloc_v2, &big) == k_cuda_success);  // a live stitch
    REQUIRE(dev.aliases() == 30);
    REQUIRE(dev.in_use() > 0);
    const uint64_t syncs = dev.sync_calls();
    pool.drop_all();
    CHECK(dev.sync_calls() == syncs + 1);  // the context's work done before any unmap
    CHECK(dev.in_use() == 0);
    CHECK(dev.aliases() == 0);
    CHECK(dev.mapped_chunks() == 0);
    CHECK(dev.reservations() == 0);
    CHECK(dev.bad_calls() == 0);  // aliases unmapped before their chunks were released
    CHECK(f.sink.events.back().ev == ev_kind::context_reset);
    int rc = -1;
    CHECK_FALSE(pool.deallocate(small[0], api_id::cuMemFree_v2, &rc));  // no longer ours
    uint64_t again = 0;
    CHECK(pool.allocate(60 * MiB, api_id::cuMemAlloc_v2, &again) == k_cuda_success);  // usable again
    std::string why;
    CHECK(pool.validate(&why));
}

TEST_CASE("context end during a capture: no synchronize and no unmap, the chunks are left", "[pool][vmm]") {
    // A capture in global mode on another thread would be broken by gpumem's cuCtxSynchronize.
    fake_backend dev(512 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    block_pool pool(vmm_config(), dev, &sink, 0);
    uint64_t a = 0;
    REQUIRE(pool.allocate(30 * MiB, api_id::cuMemAlloc_v2, &a) == k_cuda_success);
    const uint64_t held = dev.in_use(), syncs = dev.sync_calls();
    dev.set_capturing(true);
    pool.drop_all();
    CHECK(dev.sync_calls() == syncs);
    CHECK(dev.in_use() == held);
    CHECK(dev.bad_calls() == 0);
    CHECK(pool.snapshot().reserved == 0);  // forgotten all the same
    CHECK(sink.events.back().ev == ev_kind::context_reset);
}

TEST_CASE("context end after the driver ended it (past): chunks go back without a synchronize", "[pool][vmm]") {
    // A primary context's last release: its work ended with it, and no context is left to sync.
    fake_backend dev(512 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    block_pool pool(vmm_config(), dev, &sink, 0);
    uint64_t a = 0, b = 0;
    REQUIRE(pool.allocate(30 * MiB, api_id::cuMemAlloc_v2, &a) == k_cuda_success);
    REQUIRE(pool.allocate(3 * MiB, api_id::cuMemAlloc_v2, &b) == k_cuda_success);
    int rc = -1;
    REQUIRE(pool.deallocate(b, api_id::cuMemFree_v2, &rc));
    REQUIRE(dev.in_use() > 0);
    const uint64_t syncs = dev.sync_calls();
    pool.drop_all(context_end::past);
    CHECK(dev.sync_calls() == syncs);
    CHECK(dev.in_use() == 0);
    CHECK(dev.mapped_chunks() == 0);
    CHECK(dev.reservations() == 0);
    CHECK(dev.bad_calls() == 0);
    CHECK(sink.events.back().ev == ev_kind::context_reset);
    CHECK(pool.snapshot().reserved == 0);
}

TEST_CASE("context end at process exit (forget): nothing is called", "[pool][vmm]") {
    fake_backend dev(512 * MiB);
    dev.set_vmm(2 * MiB);
    block_pool pool(vmm_config(), dev, nullptr, 0);
    uint64_t a = 0;
    REQUIRE(pool.allocate(30 * MiB, api_id::cuMemAlloc_v2, &a) == k_cuda_success);
    const uint64_t held = dev.in_use(), syncs = dev.sync_calls(), unmaps = dev.unmap_calls();
    pool.drop_all(context_end::forget);
    CHECK(dev.sync_calls() == syncs);
    CHECK(dev.unmap_calls() == unmaps);
    CHECK(dev.in_use() == held);
    CHECK(pool.snapshot().reserved == 0);
}

TEST_CASE("peer access with GPUMEM_POOL_CHUNK: every byte of a chunk larger than the granularity is granted", "[pool][vmm]") {
    fake_backend dev(256 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    pool_config cfg = vmm_config();
    cfg.chunk = 20 * MiB;
    block_pool pool(cfg, dev, &sink, 0);
    uint64_t a = 0, b = 0;
    REQUIRE(pool.allocate(30 * MiB, api_id::cuMemAlloc_v2, &a) == k_cuda_success);
    pool.grant_peer(1);
    CHECK(dev.peer_can_access(a, 1));
    CHECK(dev.peer_can_access(a + 3 * MiB, 1));  // the chunk's second granule
    CHECK(dev.peer_can_access(a + 30 * MiB - 1, 1));
    REQUIRE(pool.allocate(50 * MiB, api_id::cuMemAlloc_v2, &b) == k_cuda_success);  // mapped after the grant
    CHECK(dev.peer_can_access(b + 5 * MiB, 1));
    CHECK(dev.peer_can_access(b + 50 * MiB - 1, 1));
    CHECK(dev.bad_calls() == 0);
}

TEST_CASE("virtual memory refused for another reason than memory: a cuMemAlloc segment, as without gpumem", "[pool][vmm]") {
    fake_backend dev;
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    pool_config cfg = immediate_config();
    cfg.vmm = true;
    block_pool pool(cfg, dev, &sink, 0);
    // The arena and the segment after it both refused (cuMemCreate or cuMemSetAccess saying
    // CUDA_ERROR_NOT_SUPPORTED); cuMemAlloc itself works.
    dev.fail_next_allocs(2, k_cuda_not_supported);
    uint64_t p = 0;
    REQUIRE(pool.allocate(4 * KiB, api_id::cuMemAlloc_v2, &p) == k_cuda_success);
    CHECK(dev.alloc_calls() == 1);  // the plain segment
    int rc = -1;
    REQUIRE(pool.deallocate(p, api_id::cuMemFree_v2, &rc));
    CHECK(rc == k_cuda_success);
    // cuMemAlloc refusing too: its answer is the program's, not an OOM.
    uint64_t q = 0;
    dev.fail_next_allocs(3, k_cuda_not_supported);
    CHECK(pool.allocate(64 * MiB, api_id::cuMemAlloc_v2, &q) == k_cuda_not_supported);
    CHECK(dev.bad_calls() == 0);
    std::string why;
    CHECK(pool.validate(&why));
}

TEST_CASE("give_back: an allocator the pool does not serve gets back every whole free chunk, pending ones included, and giveable_bytes says how much", "[pool][vmm]") {
    fake_backend dev(64 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    pool_config cfg = vmm_config();
    cfg.reuse = reuse_mode::safe;  // frees stay pending until the pool syncs or fences
    block_pool pool(cfg, dev, &sink, 0);
    std::vector<uint64_t> ps(8);
    for (auto& p : ps) REQUIRE(pool.allocate(5 * MiB, api_id::cuMemAlloc_v2, &p) == k_cuda_success);
    int rc = -1;
    for (size_t i = 1; i < ps.size(); ++i) REQUIRE(pool.deallocate(ps[i], api_id::cuMemFree_v2, &rc));
    REQUIRE(pool.pending_bytes() > 0);
    const uint64_t held = dev.in_use();
    // What it can give back, pending blocks merged with their neighbours: all but the live block's chunks.
    CHECK(pool.giveable_bytes() == held - 6 * MiB);
    // During a capture nothing may be waited for or unmapped.
    dev.set_capturing(true);
    CHECK(pool.give_back(api_id::cuMemCreate) == 0);
    CHECK(dev.in_use() == held);
    dev.set_capturing(false);
    const uint64_t back = pool.give_back(api_id::cuMemCreate);
    CHECK(back == held - dev.in_use());
    // The one live 5 MiB block keeps its 3 chunks (6 MiB); every other chunk went back.
    CHECK(dev.in_use() == 6 * MiB);
    CHECK(pool.pending_bytes() == 0);
    bool logged = false;
    for (const auto& e : sink.events)
        if ((e.ev == ev_kind::segment_unmap || e.ev == ev_kind::segment_free) && e.api == api_id::cuMemCreate) logged = true;
    CHECK(logged);
    CHECK(pool.give_back(api_id::cuMemCreate) == 0);  // nothing left to give
    CHECK(pool.giveable_bytes() == 0);
    REQUIRE(pool.deallocate(ps[0], api_id::cuMemFree_v2, &rc));
    CHECK(dev.bad_calls() == 0);
    std::string why;
    CHECK(pool.validate(&why));
}

TEST_CASE("giveable_bytes: a cuMemAlloc segment counts only when every block in it is free or pending", "[pool][vmm]") {
    fake_backend dev(256 * MiB);
    recording_sink sink;
    block_pool pool(immediate_config(), dev, &sink, 0);  // no VMM on this device: cuMemAlloc segments
    uint64_t a = 0, b = 0;
    REQUIRE(pool.allocate(4 * MiB, api_id::cuMemAlloc_v2, &a) == k_cuda_success);
    REQUIRE(pool.allocate(4 * MiB, api_id::cuMemAlloc_v2, &b) == k_cuda_success);
    const uint64_t held = dev.in_use();  // one large segment holds both
    int rc = -1;
    REQUIRE(pool.deallocate(a, api_id::cuMemFree_v2, &rc));
    CHECK(pool.giveable_bytes() == 0);
    REQUIRE(pool.deallocate(b, api_id::cuMemFree_v2, &rc));
    CHECK(pool.giveable_bytes() == held);
    CHECK(pool.give_back(api_id::cuMemAllocAsync) == held);
    CHECK(dev.in_use() == 0);
}

TEST_CASE("giveable_bytes: a live stitched block's borrowed chunks are not giveable until it is freed", "[pool][vmm][stitch]") {
    // The chunks a stitched block borrowed stay mapped under it while it lives: counted as
    // giveable, an allocator the pool does not serve would be told of memory it cannot get.
    stitch_pool t(100);
    const uint64_t before = t.pool.giveable_bytes();
    REQUIRE(before >= 60 * MiB);
    const uint64_t big = alloc_ok(t.pool, 60 * MiB);  // stitched from 30 free chunks
    uint64_t made = 0;
    t.pool.stitch_counts(&made, nullptr, nullptr);
    REQUIRE(made == 1);
    CHECK(t.pool.giveable_bytes() == before - 60 * MiB);
    free_ok(t.pool, big);  // pending: its chunks go back with its release
    CHECK(t.pool.giveable_bytes() == before);
}

TEST_CASE("giveable_bytes never waits for a pool operation that waits on the device", "[pool][vmm]") {
    fake_backend dev(64 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    pool_config cfg = vmm_config();
    cfg.reuse = reuse_mode::safe;
    block_pool pool(cfg, dev, &sink, 0);
    uint64_t a = 0, b = 0;
    REQUIRE(pool.allocate(10 * MiB, api_id::cuMemAlloc_v2, &a) == k_cuda_success);
    REQUIRE(pool.allocate(10 * MiB, api_id::cuMemAlloc_v2, &b) == k_cuda_success);
    int rc = -1;
    REQUIRE(pool.deallocate(b, api_id::cuMemFree_v2, &rc));  // pending: give_back waits for it
    const uint64_t before = pool.giveable_bytes();
    REQUIRE(before > 0);
    dev.set_wait_sleep_ns(1'500'000'000);  // each wait on the device: 1.5 s
    std::atomic<bool> started{false};
    std::thread t([&] {
        started = true;
        pool.give_back(api_id::cuMemCreate);
    });
    while (!started) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // give_back is inside its wait now
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t during = pool.giveable_bytes();
    const auto waited = std::chrono::steady_clock::now() - t0;
    t.join();
    CHECK(waited < std::chrono::milliseconds(1000));  // not the 1.5 s wait (a loaded machine has slack)
    CHECK(during == before);                         // the last count, while the pool is busy
    CHECK(pool.giveable_bytes() == 0);               // and a fresh one after: all given back
    REQUIRE(pool.deallocate(a, api_id::cuMemFree_v2, &rc));
}

TEST_CASE("make_headroom: a pool that left the driver less than its headroom gives back just enough whole free chunks before a lazy load", "[pool][vmm]") {
    fake_backend dev(512 * MiB);  // headroom at most 1/64 of the device: 8 MiB
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    pool_config cfg = vmm_config();
    cfg.headroom = 4 * MiB;
    block_pool pool(cfg, dev, &sink, 0);
    std::vector<uint64_t> ps;
    fill_pool(pool, 5 * MiB, &ps);
    REQUIRE(ps.size() > 90);
    CHECK(pool.headroom_short());  // the device is full
    CHECK(block_pool::any_short());
    int rc = -1;
    for (size_t i = 0; i < ps.size(); i += 2) REQUIRE(pool.deallocate(ps[i], api_id::cuMemFree_v2, &rc));
    const uint64_t held = dev.in_use();
    // During a capture nothing is waited for or unmapped, and the pool stays short.
    dev.set_capturing(true);
    CHECK(pool.make_headroom(api_id::cuLaunchKernel) == 0);
    CHECK(pool.headroom_short());
    dev.set_capturing(false);
    const uint64_t back = pool.make_headroom(api_id::cuLaunchKernel);
    CHECK(back == held - dev.in_use());
    uint64_t free_b = 0, total = 0;
    dev.mem_info(&free_b, &total);
    CHECK(free_b >= 4 * MiB);
    CHECK(back < 8 * MiB);  // just enough: the other free chunks stay mapped for the program
    CHECK(!pool.headroom_short());
    CHECK(!block_pool::any_short());
    CHECK(pool.make_headroom(api_id::cuLaunchKernel) == 0);  // no longer short: nothing done
    bool logged = false;
    for (const auto& e : sink.events)
        if (e.ev == ev_kind::segment_unmap && e.api == api_id::cuLaunchKernel) logged = true;
    CHECK(logged);
    // Growing back to a full device makes it short again.  With every block freed, one free
    // block spans the arena: still just enough of it goes back.
    std::vector<uint64_t> more;
    fill_pool(pool, 5 * MiB, &more);
    CHECK(pool.headroom_short());
    for (size_t i = 1; i < ps.size(); i += 2) REQUIRE(pool.deallocate(ps[i], api_id::cuMemFree_v2, &rc));
    for (auto p : more) REQUIRE(pool.deallocate(p, api_id::cuMemFree_v2, &rc));
    const uint64_t full = dev.in_use();
    const uint64_t given = pool.make_headroom(api_id::cuLaunchKernel);
    CHECK(given == full - dev.in_use());
    CHECK(given >= 2 * MiB);
    CHECK(full - dev.in_use() < 8 * MiB);
    CHECK(!pool.headroom_short());
    CHECK(dev.bad_calls() == 0);
    std::string why;
    CHECK(pool.validate(&why));
}

TEST_CASE("make_headroom: GPUMEM_POOL_HEADROOM=0 never makes a pool short", "[pool][vmm]") {
    fake_backend dev(128 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    pool_config cfg = vmm_config();
    cfg.headroom = 0;
    block_pool pool(cfg, dev, &sink, 0);
    std::vector<uint64_t> ps;
    fill_pool(pool, 5 * MiB, &ps);
    int rc = -1;
    for (auto p : ps) REQUIRE(pool.deallocate(p, api_id::cuMemFree_v2, &rc));
    CHECK(!pool.headroom_short());
    const uint64_t held = dev.in_use();
    CHECK(pool.make_headroom(api_id::cuLaunchKernel) == 0);
    CHECK(dev.in_use() == held);
}

TEST_CASE("make_headroom: the headroom is at most 1/64 of the device, however large GPUMEM_POOL_HEADROOM", "[pool][vmm]") {
    // The default 256 MiB would be a quarter of a 1 GiB device: the pool would give back (and the
    // program make again) memory the driver never needs.  Capped at 16 MiB here.
    fake_backend dev(1ull << 30);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    pool_config cfg = vmm_config();
    REQUIRE(cfg.headroom == 256 * MiB);  // the default
    block_pool pool(cfg, dev, &sink, 0);
    std::vector<uint64_t> ps;
    fill_pool(pool, 4 * MiB, &ps);
    REQUIRE(pool.headroom_short());
    for (auto p : ps) free_ok(pool, p);
    uint64_t before = 0, total = 0;
    dev.mem_info(&before, &total);
    REQUIRE(before < 16 * MiB);
    const uint64_t given = pool.make_headroom(api_id::cuLaunchKernel);
    uint64_t after = 0;
    dev.mem_info(&after, &total);
    CHECK(after >= 16 * MiB);
    CHECK(given <= 16 * MiB);  // just the cap's worth, in whole chunks
    CHECK(!pool.headroom_short());
    CHECK(dev.bad_calls() == 0);
}

TEST_CASE("make_headroom: a growth that brings the driver's free memory under the headroom makes the pool short at once", "[pool][vmm]") {
    // A growth counts what it took from the driver's free memory, and near the line asks the
    // driver again (another allocator may have taken some): the hook layer makes headroom
    // before the program's next lazy load only if the pool knows it is short.
    fake_backend dev(1ull << 30);  // headroom at most 1/64 of the device: 16 MiB
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    pool_config cfg = vmm_config();
    block_pool pool(cfg, dev, &sink, 0);
    std::vector<uint64_t> ps;
    for (int i = 0; i < 100; ++i) ps.push_back(alloc_ok(pool, 10 * MiB));  // 24 MiB left
    CHECK(!pool.headroom_short());
    ps.push_back(alloc_ok(pool, 10 * MiB));  // 14 MiB left
    CHECK(pool.headroom_short());
    for (auto p : ps) free_ok(pool, p);

    // Another allocator took 12 MiB while the pool's count said 34 MiB were free: the growth that
    // leaves 24 MiB by the count (under twice the headroom) asks the driver, which has 12.
    fake_backend dev2(1ull << 30);
    dev2.set_vmm(2 * MiB);
    block_pool pool2(cfg, dev2, &sink, 0);
    ps.clear();
    for (int i = 0; i < 99; ++i) ps.push_back(alloc_ok(pool2, 10 * MiB));
    CHECK(!pool2.headroom_short());
    uint64_t other = 0;
    REQUIRE(dev2.segment_alloc(12 * MiB, &other) == k_cuda_success);
    ps.push_back(alloc_ok(pool2, 10 * MiB));
    CHECK(pool2.headroom_short());
    for (auto p : ps) free_ok(pool2, p);
    REQUIRE(dev2.segment_free(other) == k_cuda_success);
}

TEST_CASE("make_headroom: with no whole chunk to give back, no wait on the device", "[pool][vmm]") {
    // make_headroom runs before the program's lazy loads: a wait there (a synchronize, to settle
    // a free made for immediate reuse) that then gives nothing back only stalls the program.
    fake_backend dev(512 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    pool_config cfg = vmm_config();  // immediate reuse, no events: a settle is a synchronize
    cfg.headroom = 4 * MiB;
    block_pool pool(cfg, dev, &sink, 0);
    const uint64_t s1 = alloc_ok(pool, 512 * KiB);  // a 2 MiB small segment
    const uint64_t s2 = alloc_ok(pool, 512 * KiB);
    std::vector<uint64_t> ps;
    fill_pool(pool, 4 * MiB, &ps);
    REQUIRE(pool.headroom_short());
    free_ok(pool, s2);  // free bytes, but no whole chunk: nothing to give
    CHECK(pool.giveable_bytes() == 0);
    const uint64_t syncs = dev.sync_calls(), waits = dev.event_syncs();
    CHECK(pool.make_headroom(api_id::cuLaunchKernel) == 0);
    CHECK(dev.sync_calls() == syncs);
    CHECK(dev.event_syncs() == waits);
    free_ok(pool, s1);
    for (auto p : ps) free_ok(pool, p);
}

TEST_CASE("make_headroom: cuMemAlloc segments go back only as many as make up the headroom", "[pool][vmm]") {
    fake_backend dev(512 * MiB);  // no VMM: 20 MiB shared segments
    recording_sink sink;
    pool_config cfg = immediate_config();
    cfg.headroom = 4 * MiB;
    block_pool pool(cfg, dev, &sink, 0);
    std::vector<uint64_t> ps;
    fill_pool(pool, 4 * MiB, &ps);
    REQUIRE(pool.headroom_short());
    int rc = -1;
    for (auto p : ps) REQUIRE(pool.deallocate(p, api_id::cuMemFree_v2, &rc));
    const uint64_t held = dev.in_use();
    const uint64_t given = pool.make_headroom(api_id::cuLaunchKernel);
    CHECK(given == held - dev.in_use());
    CHECK(given >= 4 * MiB);
    CHECK(given <= 40 * MiB);  // a segment or two, not the whole cache
    CHECK(!pool.headroom_short());
    std::string why;
    CHECK(pool.validate(&why));
}

TEST_CASE("make_headroom: of the idle cuMemAlloc segments the smallest that covers the lack goes back", "[pool][vmm]") {
    fake_backend dev(512 * MiB);  // no VMM
    recording_sink sink;
    pool_config cfg = immediate_config();
    cfg.headroom = 4 * MiB;
    block_pool pool(cfg, dev, &sink, 0);
    uint64_t big = 0;
    REQUIRE(pool.allocate(200 * MiB, api_id::cuMemAlloc_v2, &big) == k_cuda_success);  // the lowest address
    std::vector<uint64_t> ps;
    fill_pool(pool, 4 * MiB, &ps);  // then 20 MiB segments
    REQUIRE(pool.headroom_short());
    int rc = -1;
    REQUIRE(pool.deallocate(big, api_id::cuMemFree_v2, &rc));
    for (auto p : ps) REQUIRE(pool.deallocate(p, api_id::cuMemFree_v2, &rc));
    const uint64_t held = dev.in_use();
    const uint64_t given = pool.make_headroom(api_id::cuLaunchKernel);
    CHECK(given == held - dev.in_use());
    CHECK(given >= 4 * MiB);
    CHECK(given <= 20 * MiB);  // one small segment; in address order the 200 MiB one went first
    CHECK(sink.count(ev_kind::segment_free) == 1);
    CHECK(!pool.headroom_short());
    std::string why;
    CHECK(pool.validate(&why));
}

TEST_CASE("make_headroom: an idle cuMemAlloc segment of exactly the lack covers it, not a larger one", "[pool][vmm]") {
    // The bounded give-back takes the smallest idle segment that covers what is lacking; one of
    // exactly that size covers it.  Counted as not covering, a larger one went back instead
    // (20 MiB for a 12 MiB lack), memory the program would have to make again.
    fake_backend dev(1ull << 30);  // no VMM; headroom at most 1/64 of the device: 16 MiB
    recording_sink sink;
    pool_config cfg = immediate_config();
    cfg.headroom = 12 * MiB;
    block_pool pool(cfg, dev, &sink, 0);
    const uint64_t big = alloc_ok(pool, 40 * MiB);    // a segment of its own, the lowest address
    const uint64_t exact = alloc_ok(pool, 12 * MiB);  // a segment of its own: the lack, exactly
    std::vector<uint64_t> ps;
    fill_pool(pool, 4 * MiB, &ps);  // 20 MiB segments, then 4 MiB ones: the device full
    REQUIRE(pool.headroom_short());
    uint64_t free_b = 0, total = 0;
    dev.mem_info(&free_b, &total);
    REQUIRE(free_b == 0);  // so the lack is the headroom: 12 MiB
    free_ok(pool, big);
    free_ok(pool, exact);
    for (auto p : ps) free_ok(pool, p);
    const uint64_t held = dev.in_use();
    CHECK(pool.make_headroom(api_id::cuLaunchKernel) == 12 * MiB);
    CHECK(held - dev.in_use() == 12 * MiB);
    const auto frees = sink.of(ev_kind::segment_free);
    REQUIRE(frees.size() == 1);
    CHECK(frees[0].b.ptr == exact);
    CHECK(!pool.headroom_short());
}

TEST_CASE("make_headroom: when no idle cuMemAlloc segment covers the lack, the largest goes first", "[pool][vmm]") {
    // Each segment given back is a cuMemFree (and a device sync): the largest first leaves the
    // least to cover by the next, so the fewest segments go back and the least past the lack.
    // Smallest first freed all three 10 MiB segments, then the 30 MiB one: 60 MiB in 4 calls
    // where 30 + 10 in 2 make up the 35 MiB.
    fake_backend dev(4ull << 30);  // no VMM; headroom at most 1/64 of the device: 64 MiB
    recording_sink sink;
    pool_config cfg = immediate_config();
    cfg.headroom = 35 * MiB;
    block_pool pool(cfg, dev, &sink, 0);
    const uint64_t large = alloc_ok(pool, 30 * MiB);  // segments of their own
    std::vector<uint64_t> tens;
    for (int i = 0; i < 3; ++i) tens.push_back(alloc_ok(pool, 10 * MiB));
    std::vector<uint64_t> ps;
    fill_pool(pool, 4 * MiB, &ps);  // the device full; these stay live
    REQUIRE(pool.headroom_short());
    uint64_t free_b = 0, total = 0;
    dev.mem_info(&free_b, &total);
    REQUIRE(free_b == 0);  // the lack: 35 MiB, more than any idle segment
    free_ok(pool, large);
    for (auto p : tens) free_ok(pool, p);
    CHECK(pool.make_headroom(api_id::cuLaunchKernel) == 40 * MiB);
    const auto frees = sink.of(ev_kind::segment_free);
    REQUIRE(frees.size() == 2);
    CHECK(frees[0].b.ptr == large);
    CHECK(frees[1].b.ptr == tens[0]);  // then the smallest that covers the 5 MiB left, lowest first
    CHECK(!pool.headroom_short());
    for (auto p : ps) free_ok(pool, p);
    std::string why;
    CHECK(pool.validate(&why));
}

TEST_CASE("make_headroom: cuMemAlloc segments beside virtual memory make up only what the free chunks lacked", "[pool][vmm]") {
    // A pool on virtual memory can hold cuMemAlloc segments too (the driver refused virtual
    // memory for another reason).  When whole free chunks give back part of the headroom, the
    // segments must make up only the rest: asked for the whole lack again, the pool gave back a
    // 16 MiB segment where a 10 MiB one completes it (22 MiB for a 16 MiB headroom).
    fake_backend dev(1ull << 30);  // headroom at most 1/64 of the device: 16 MiB
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    pool_config cfg = vmm_config();  // immediate reuse: the frees below are settled by a wait first
    cfg.headroom = 16 * MiB;
    block_pool pool(cfg, dev, &sink, 0);
    dev.fail_next_allocs(2, k_cuda_not_supported);  // the arena and a VMM segment refused
    const uint64_t s10 = alloc_ok(pool, 10 * MiB);   // a cuMemAlloc segment of its own
    dev.fail_next_allocs(2, k_cuda_not_supported);
    const uint64_t s16 = alloc_ok(pool, 16 * MiB);
    REQUIRE(dev.live_segments() == 2);
    std::vector<uint64_t> ps;
    fill_pool(pool, 2 * MiB, &ps);  // the arena, chunk by chunk, to the device's last byte
    REQUIRE(ps.size() > 20);
    uint64_t free_b = 0, total = 0;
    dev.mem_info(&free_b, &total);
    REQUIRE(free_b == 0);  // the lack: the whole 16 MiB
    REQUIRE(pool.headroom_short());
    for (size_t i = 10; i < 13; ++i) free_ok(pool, ps[i]);  // 6 MiB of whole free chunks
    free_ok(pool, s10);
    free_ok(pool, s16);
    const uint64_t held = dev.in_use();
    CHECK(pool.make_headroom(api_id::cuLaunchKernel) == 16 * MiB);
    CHECK(held - dev.in_use() == 16 * MiB);
    const auto frees = sink.of(ev_kind::segment_free);
    REQUIRE(frees.size() == 1);
    CHECK(frees[0].b.ptr == s10);
    CHECK(!pool.headroom_short());
    CHECK(dev.bad_calls() == 0);
    std::string why;
    CHECK(pool.validate(&why));
}

TEST_CASE("make_headroom: settled free chunks go back without a wait on the device, pending frees present or not", "[pool][vmm]") {
    fake_backend dev(512 * MiB);
    dev.set_vmm(2 * MiB);
    recording_sink sink;
    pool_config cfg = vmm_config();
    cfg.reuse = reuse_mode::safe;  // no events on this backend: pending frees wait for a synchronize
    cfg.headroom = 4 * MiB;
    block_pool pool(cfg, dev, &sink, 0);
    std::vector<uint64_t> ps;
    fill_pool(pool, 5 * MiB, &ps);
    REQUIRE(pool.headroom_short());
    int rc = -1;
    for (size_t i = 0; i < ps.size(); i += 4) REQUIRE(pool.deallocate(ps[i], api_id::cuMemFree_v2, &rc));
    pool.release_cached();  // one synchronize: those frees are settled, free blocks now
    for (size_t i = 2; i < ps.size(); i += 4) REQUIRE(pool.deallocate(ps[i], api_id::cuMemFree_v2, &rc));
    REQUIRE(pool.pending_bytes() > 0);  // these wait for the next synchronize
    REQUIRE(pool.headroom_short());
    const uint64_t syncs = dev.sync_calls();
    CHECK(pool.make_headroom(api_id::cuLaunchKernel) >= 2 * MiB);
    CHECK(dev.sync_calls() == syncs);  // the settled free chunks were enough
    CHECK(pool.pending_bytes() > 0);
    CHECK(!pool.headroom_short());
    std::string why;
    CHECK(pool.validate(&why));
}

// A stitching pool on 30 blocks of 6 MiB, two of every three freed (ten 12 MiB pieces P1..P10
// between live blocks), with 16 small blocks of 512 KiB: settle() frees and takes them again, a
// small-pool miss that syncs, so every pending free settles and a freed stitched block dissolves
// into its kept range (release_cached would unmap that range).
namespace {
struct kept_range_setup {
    fake_backend dev{8ull << 30};
    recording_sink sink;
    block_pool pool;
    std::vector<uint64_t> six, sm;
    static pool_config config() {
        pool_config cfg = vmm_config();
        cfg.reuse = reuse_mode::safe;
        cfg.stitch = true;
        cfg.sync_budget = 4 * MiB;
        cfg.sync_budget_div = 1 << 20;  // the budget stays 4 MiB: 8 MiB of small frees sync
        return cfg;
    }
    kept_range_setup() : pool(config(), with_vmm(dev), &sink, 0) {
        sm.resize(16);
        for (uint64_t& q : sm) REQUIRE(pool.allocate(512 * KiB, api_id::cuMemAlloc_v2, &q) == k_cuda_success);
        six = fragment_6mib(pool, 30);
        pool.release_cached();
    }
    void settle() {
        int rc = -1;
        for (uint64_t q : sm) REQUIRE(pool.deallocate(q, api_id::cuMemFree_v2, &rc));
        const uint64_t s0 = dev.sync_calls();
        sm.clear();
        for (int k = 0; k < 64 && (dev.sync_calls() == s0 || sm.size() < 16); ++k) {
            uint64_t q = 0;
            REQUIRE(pool.allocate(512 * KiB, api_id::cuMemAlloc_v2, &q) == k_cuda_success);
            sm.push_back(q);
        }
        REQUIRE(dev.sync_calls() > s0);
    }
    uint64_t alloc(uint64_t size) { return alloc_ok(pool, size); }
    void free(uint64_t p) { free_ok(pool, p); }
    // Frees `rest`, the small blocks and the live 6 MiB ones, then releases everything cached:
    // nothing may stay mapped twice, reserved or allocated.
    void release_all(std::initializer_list<uint64_t> rest) {
        for (uint64_t p : rest) free(p);
        for (uint64_t q : sm) free(q);
        for (size_t i = 0; i < six.size(); i += 3) free(six[i]);
        pool.release_cached();
        CHECK(dev.aliases() == 0);
        CHECK(dev.in_use() == 0);
        CHECK(dev.reservations() == 0);
        CHECK(dev.bad_calls() == 0);
    }
};
}  // namespace

TEST_CASE("stitching: a stitch during a capture on a kept range that maps one chunk twice unmaps nothing", "[pool][vmm][stitch]") {
    kept_range_setup t;
    // A 60 MiB stitch (P1..P5 at positions 0..29), dissolved into its kept range.
    const uint64_t big = t.alloc(60 * MiB);
    REQUIRE(t.dev.alias_chunks() == 30);
    t.free(big);
    t.settle();
    REQUIRE(t.pool.kept_ranges() == 1);
    // P1's first chunk taken: a 24 MiB stitch on the range keeps positions 1..11 and remaps
    // position 0 to the first free chunk elsewhere, P3's, which position 12 (past the stitch)
    // still maps.
    const uint64_t x = t.alloc(2 * MiB);
    CHECK(x == t.six[1]);
    const uint64_t y = t.alloc(24 * MiB);
    CHECK(y == big);
    CHECK(t.dev.alias_chunks() == 31);
    CHECK(t.dev.alias_unmapped_chunks() == 1);
    t.free(y);
    t.free(x);
    t.settle();
    REQUIRE(t.pool.kept_ranges() == 1);
    // During a capture every position of the 60 MiB request still maps a free chunk, but P3's
    // twice: one of the two must be remapped, which needs an unmap: not on this range now.
    t.dev.set_capturing(true);
    uint64_t z = 0;
    CHECK(t.pool.allocate(60 * MiB, api_id::cuMemAlloc_v2, &z) == k_cuda_success);
    t.dev.set_capturing(false);
    CHECK(t.dev.bad_calls() == 0);
    std::string why;
    CHECK(t.pool.validate(&why));
    INFO(why);
}

TEST_CASE("stitching: a failed stitch during a capture on a kept range unmaps nothing", "[pool][vmm][stitch]") {
    kept_range_setup t;
    const uint64_t big = t.alloc(60 * MiB);
    t.free(big);
    t.settle();
    REQUIRE(t.pool.kept_ranges() == 1);
    // A 70 MiB request during a capture: the kept range's 30 positions still map free chunks and
    // 5 more are to be mapped; the driver refuses that map.  The 30 stay mapped (no unmap during
    // a capture), and the request grows instead.
    t.dev.set_capturing(true);
    t.dev.fail_next_allocs(1, k_cuda_oom);
    uint64_t z = 0;
    CHECK(t.pool.allocate(70 * MiB, api_id::cuMemAlloc_v2, &z) == k_cuda_success);
    t.dev.set_capturing(false);
    CHECK(t.dev.bad_calls() == 0);
    CHECK(t.dev.alias_unmapped_chunks() == 0);
    std::string why;
    CHECK(t.pool.validate(&why));
    INFO(why);
    t.release_all({z});
}

TEST_CASE("stitching: a remap's refused unmap leaves its position known as mapped", "[pool][vmm][stitch]") {
    kept_range_setup t;
    const uint64_t big = t.alloc(60 * MiB);
    t.free(big);
    t.settle();
    // P1's first chunk taken: the next 60 MiB stitch on the kept range remaps position 0, and the
    // driver refuses that one unmap.  The stitch fails (the request grows instead), and the range
    // goes: every position still mapped is unmapped first, the refused one included.
    const uint64_t x = t.alloc(2 * MiB);
    REQUIRE(x == t.six[1]);
    t.dev.fail_next_unmap_alias(1);
    const uint64_t z = t.alloc(60 * MiB);
    CHECK(t.dev.bad_calls() == 0);  // no va_free with a position still mapped
    CHECK(t.dev.aliases() == 0);
    CHECK(t.pool.kept_ranges() == 0);
    std::string why;
    CHECK(t.pool.validate(&why));
    INFO(why);
    t.release_all({z, x});
}
