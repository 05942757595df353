// Safe reuse by fences on fake_backend: no block comes back before its fence is reached, and no context synchronize.
#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <vector>

#include "pool_test_util.h"

using namespace gpumem;
using namespace gpumem::test;

namespace {

constexpr uint64_t k_ctx = 0xc0;
constexpr uint64_t k_stream = 0x5000;

// Records events, and for each segment_unmap the ticket the device had reached when the pool
// decided to unmap (the pool emits it before the driver call).
struct clock_sink final : event_sink {
    recording_sink all;
    fake_backend* dev = nullptr;
    std::vector<std::pair<event, uint64_t>> unmaps;  // the event, the ticket reached then
    void emit(event& e) noexcept override {
        if (e.ev == ev_kind::segment_unmap) unmaps.emplace_back(e, dev->completed());
        all.emit(e);
    }
};

// These tests follow single frees: one fence per free over an eighth of the budget
// (GPUMEM_FENCE_BATCH=1).  The default batch of 4 has its own test below.  They follow the waits
// (GPUMEM_FENCE_WAIT=old), which ordered releases (the default) replace until they stop; the
// tests of ordered releases set cfg.order.
pool_config fence_each() {
    pool_config c = safe_config();
    c.fence_batch = 1;
    c.order = false;
    return c;
}

// The same under ordered release (GPUMEM_FENCE_WAIT=order, the default).
pool_config order_each() {
    pool_config c = fence_each();
    c.order = true;
    return c;
}

// Immediate reuse on virtual memory with plain segments (no arenas): a freed segment is wholly
// free, and before it is unmapped the pool must wait for every stream.
pool_config immediate_segments() {
    pool_config c = immediate_config();
    c.vmm = true;
    c.arenas = false;
    return c;
}

struct fenced {
    fake_backend dev;
    clock_sink csink;
    recording_sink& sink = csink.all;
    stream_set streams;
    block_pool pool;
    // side_stream: the program's non-blocking stream k_stream exists from the start.
    explicit fenced(pool_config cfg = fence_each(), uint64_t capacity = 1ull << 40, uint64_t chunk = 0,
                    bool side_stream = true)
        : dev(capacity), pool(cfg, dev, &csink, 0) {
        csink.dev = &dev;
        dev.set_vmm(chunk);
        dev.enable_events(true);
        dev.set_auto_complete(false);  // the GPU runs behind until the test says otherwise
        if (side_stream) streams.created(k_ctx, k_stream, true);
        pool.set_streams(&streams, k_ctx);
    }
    uint64_t alloc(uint64_t size) { return alloc_ok(pool, size); }
    void free(uint64_t p) { free_ok(pool, p); }
};

}  // namespace

TEST_CASE("fences: a block freed while its fence is pending comes back only once the fence is reached", "[fence]") {
    fenced f;
    const uint64_t mb8 = 8 * MiB;
    const uint64_t a = f.alloc(mb8);
    f.dev.enqueue_work();  // a kernel reads a
    f.free(a);
    // One fence, recorded at the free (8 MiB is more than an eighth of the budget): an event on
    // the legacy stream; the program's non-blocking stream, not yet found busy, is asked when the
    // fence releases (the sweep).
    CHECK(f.dev.records_on(k_stream_legacy) == 1);
    CHECK(f.dev.records_on(k_stream) == 0);
    CHECK(f.pool.pending_bytes() == mb8);

    const uint64_t b = f.alloc(mb8);  // the fence is not reached: a new block, no wait
    CHECK(b != a);
    CHECK(f.dev.event_syncs() == 0);
    CHECK(f.pool.pending_bytes() == mb8);

    f.dev.complete_all();  // the GPU catches up
    const uint64_t c = f.alloc(mb8);
    CHECK(c == a);  // released by the fence, without blocking
    CHECK(f.pool.pending_bytes() == 0);
    CHECK(f.dev.sync_calls() == 0);
    CHECK(f.dev.event_syncs() == 0);
    auto syncs = f.sink.of(ev_kind::pool_sync);
    REQUIRE(syncs.size() == 1);
    CHECK((syncs[0].flags & ef_fence) != 0);
    CHECK(syncs[0].c.count == 1);
    std::string why;
    CHECK(f.pool.validate(&why));
}

TEST_CASE("fences: by default a fence covers four frees, or one that reaches the whole budget", "[fence]") {
    pool_config waits = safe_config();  // GPUMEM_FENCE_BATCH=4; the budget is 32 MiB, an eighth 4 MiB
    waits.order = false;                // the fences' own rule (ordered releases: below)
    fenced f(waits);
    uint64_t p[5];
    for (auto& x : p) x = f.alloc(8 * MiB);
    f.dev.enqueue_work();
    for (int i = 0; i < 3; ++i) f.free(p[i]);
    CHECK(f.dev.records_on(k_stream_legacy) == 0);  // three frees, 24 MiB: no fence yet
    f.free(p[3]);
    CHECK(f.dev.records_on(k_stream_legacy) == 1);  // the fourth: one fence over all four
    f.free(p[4]);
    CHECK(f.dev.records_on(k_stream_legacy) == 1);
    const uint64_t big = f.alloc(40 * MiB);
    f.free(big);  // 8 + 40 MiB unfenced: over the whole budget, fenced at once
    CHECK(f.dev.records_on(k_stream_legacy) == 2);
    f.dev.complete_all();
    CHECK(f.alloc(48 * MiB) != 0);
    std::string why;
    CHECK(f.pool.validate(&why));

    // A loop of 20 MiB pairs on an idle GPU: a fence every other free, and the pool holds one
    // block more than the loop needs instead of recording and asking an event at every pair.
    // (Once a fence found no non-blocking stream busy, each free over an eighth is fenced alone,
    // so the miss's fence serves: the count and byte floors below do not apply.)
    fenced g(waits);
    g.dev.set_auto_complete(true);
    const uint64_t reserved0 = g.pool.snapshot().reserved;
    for (int i = 0; i < 100; ++i) g.free(g.alloc(20 * MiB));
    CHECK(g.dev.records_on(k_stream_legacy) <= 51);
    CHECK(g.dev.records_on(k_stream_legacy) >= 49);
    CHECK(g.pool.snapshot().reserved <= reserved0 + 60 * MiB);
    CHECK(g.dev.sync_calls() == 0);
    // Under the default an unfenced free is handed out by an ordered release instead of growing
    // the pool: one event a pair (no non-blocking stream to order), and no block more.
    fenced o(safe_config());
    o.dev.set_auto_complete(true);
    for (int i = 0; i < 100; ++i) o.free(o.alloc(20 * MiB));
    CHECK(o.pool.ordered_releases() >= 98);
    CHECK(o.dev.records_on(k_stream_legacy) <= 100);
    CHECK(o.pool.snapshot().reserved <= o.pool.snapshot().allocated + 20 * MiB + reserved0);
    CHECK(o.dev.sync_calls() == 0);
    CHECK(o.dev.event_syncs() == 0);
}

TEST_CASE("fences: frees under the budget are fenced at GPUMEM_FENCE_BATCH times their size, at most twice the budget", "[fence]") {
    // The budget is 32 MiB.  20 MiB frees passed it every other free; now the bytes must also
    // reach GPUMEM_FENCE_BATCH frees of that size, up to 64 MiB: the 4th free.  With the count
    // rule out of reach (8 frees, or 2^48, whose product saturates), the bytes rule alone decides.
    for (uint64_t n : {uint64_t{8}, uint64_t{1} << 48}) {
        INFO("fence batch " << n);
        pool_config cfg = safe_config();
        cfg.order = false;
        cfg.fence_batch = n;
        fenced f(cfg);
        uint64_t p[5];
        for (auto& x : p) x = f.alloc(20 * MiB);
        f.dev.enqueue_work();                  // the legacy stream busy
        f.dev.enqueue_work_on(k_stream);       // and the program's non-blocking stream
        for (int i = 0; i < 3; ++i) f.free(p[i]);
        CHECK(f.dev.records_on(k_stream_legacy) == 0);  // 60 MiB: over the budget, under 64 MiB
        f.free(p[3]);
        CHECK(f.dev.records_on(k_stream_legacy) == 1);  // 80 MiB: one fence over the four
        const uint64_t big = f.alloc(40 * MiB);
        f.free(p[4]);
        f.free(big);  // 20 + 40 MiB unfenced; a free of the budget or more is fenced at once
        CHECK(f.dev.records_on(k_stream_legacy) == 2);
        f.dev.complete_all();
        std::string why;
        CHECK(f.pool.validate(&why));
    }
}

TEST_CASE("fences: with no non-blocking stream to ask, a fence covers a single free after the first", "[fence]") {
    // GPUMEM_REUSE=safe, or auto switched by a second blocking stream: a fence is one event on the
    // legacy stream, and batching frees under it only delays their reuse (the H200's 20 MiB pool
    // hit with 4 GiB held: 0.84-0.97 us a pair with a fence per free, 1.18-1.67 with batches).
    fake_backend dev;
    recording_sink sink;
    stream_set streams;
    pool_config c = safe_config();
    c.order = false;  // fences (under the default, ordered release stands in for them here: below)
    block_pool pool(c, dev, &sink, 0);
    dev.enable_events(true);
    dev.set_auto_complete(false);
    streams.created(k_ctx, 0x6000, false);  // blocking: covered by the legacy stream's event
    pool.set_streams(&streams, k_ctx);
    uint64_t p[9];
    for (auto& x : p) REQUIRE(pool.allocate(8 * MiB, api_id::cuMemAlloc_v2, &x) == k_cuda_success);
    dev.enqueue_work();
    int rc = 0;
    for (int i = 0; i < 4; ++i) REQUIRE(pool.deallocate(p[i], api_id::cuMemFree_v2, &rc));
    CHECK(dev.records_on(k_stream_legacy) == 1);  // the first fence: a batch of four, as configured
    for (int i = 4; i < 9; ++i) {
        REQUIRE(pool.deallocate(p[i], api_id::cuMemFree_v2, &rc));
        CHECK(dev.records_on(k_stream_legacy) == uint64_t(i - 2));  // then one per free
    }
    CHECK(dev.records() == dev.records_on(k_stream_legacy));
    std::string why;
    CHECK(pool.validate(&why));

    // With a non-blocking stream the batch stays four (the test above).
    fenced f(safe_config());
    uint64_t q[8];
    for (auto& x : q) x = f.alloc(8 * MiB);
    f.dev.enqueue_work_on(k_stream);
    for (auto& x : q) f.free(x);
    CHECK(f.dev.records_on(k_stream_legacy) == 2);
}

TEST_CASE("fences: only the frees before a reached fence come back, oldest first", "[fence]") {
    fenced f;
    const uint64_t a = f.alloc(8 * MiB);
    const uint64_t b = f.alloc(8 * MiB);
    f.free(a);  // fence 1
    const uint64_t t1 = f.dev.last_ticket();
    f.free(b);  // fence 2
    f.dev.complete_through(t1);  // fence 1 reached, fence 2 not
    const uint64_t c = f.alloc(8 * MiB);
    CHECK(c == a);
    CHECK(f.pool.pending_bytes() == 8 * MiB);  // b still waits
    const uint64_t d = f.alloc(8 * MiB);
    CHECK(d != b);
    CHECK(f.dev.sync_calls() == 0);
}

TEST_CASE("fences: when memory is short the pool blocks on a fence, never on the context", "[fence]") {
    fenced f(fence_each(), 24 * MiB);  // room for one 20 MiB segment
    const uint64_t a = f.alloc(8 * MiB);
    f.dev.enqueue_work();
    f.free(a);
    f.alloc(8 * MiB);
    // The third 8 MiB fits only in a's block: the segment is full and the device has no room.
    const uint64_t w = f.dev.last_ticket();
    const uint64_t c = f.alloc(8 * MiB);
    CHECK(c == a);
    CHECK(f.dev.event_syncs() >= 1);
    CHECK(f.dev.completed() >= w);  // the wait let the device reach the fence
    CHECK(f.dev.sync_calls() == 0);
    CHECK(f.pool.fence_wait_count() >= 1);
}

// Two 8 MiB blocks freed behind two fences, each followed by work on the legacy stream, then an
// 8 MiB request on a device with no room for another segment: it must get the first block back
// after a wait for fence 1 alone.  (The work is the legacy stream's: a cold side stream found busy
// by the sweep before the wait would extend it to that stream's whole queue; docs/pool.md,
// "`safe`: fences", the price.)
static void expect_oldest_fence_alone(fenced& f) {
    const uint64_t a = f.alloc(8 * MiB);
    const uint64_t b = f.alloc(8 * MiB);
    f.free(a);  // fence 1
    const uint64_t w1 = f.dev.enqueue_work_on(k_stream_legacy);
    f.free(b);  // fence 2
    const uint64_t w2 = f.dev.enqueue_work_on(k_stream_legacy);
    const uint64_t c = f.alloc(8 * MiB);  // fits only where a or b was; no room for a segment
    CHECK(c == a);
    CHECK(f.dev.completed() < w1);  // fence 1 alone was waited on
    CHECK(f.dev.completed() < w2);
    CHECK(f.pool.pending_bytes() == 8 * MiB);  // b still waits for its fence
    CHECK(f.pool.fence_wait_count() == 1);
    CHECK(f.dev.sync_calls() == 0);
}

TEST_CASE("fences: memory short, the pool waits for the oldest fence that frees enough, not for all queued work", "[fence]") {
    // Waiting for the newest fence would let the device drain its whole queue: on a GPU it then
    // idles while the program queues its next kernels.
    fenced f(fence_each(), 24 * MiB);  // room for one 20 MiB segment
    f.dev.set_wait_sleep_ns(2000000);  // each wait takes 2 ms: the log must say so
    expect_oldest_fence_alone(f);
    // The log says the program waited: the release's pool_sync carries "waited".
    auto syncs = f.sink.of(ev_kind::pool_sync);
    REQUIRE(!syncs.empty());
    CHECK((syncs.back().flags & ef_fence) != 0);
    CHECK((syncs.back().flags & ef_waited) != 0);
    // ... and how long it blocked ("wait_ns"), which the pool also counts in all.
    CHECK(syncs.back().c.wait_ns >= 2000000);
    CHECK(f.pool.wait_ns() == syncs.back().c.wait_ns);
    // A release by a fence already reached is no wait, and carries no time.
    f.dev.complete_all();
    f.alloc(8 * MiB);
    syncs = f.sink.of(ev_kind::pool_sync);
    CHECK((syncs.back().flags & ef_waited) == 0);
    CHECK(syncs.back().c.wait_ns == 0);
    CHECK(f.pool.fence_wait_count() == 1);
}

TEST_CASE("fences: memory short with only recent frees pending, the OOM path waits for the oldest fence that frees enough, not every fence", "[fence]") {
    // No pending block is old enough for a miss to wait for (a 64 MiB budget: 16 MiB of frees
    // must follow one), so the miss grows, the device is full, and the OOM path waits on fences
    // oldest first until the request fits.  Waiting for every fence drains the GPU's queue.
    pool_config cfg = fence_each();
    cfg.sync_budget = 64 * MiB;  // 8 MiB frees still get a fence each (an eighth of the budget)
    fenced f(cfg, 24 * MiB);     // room for one 20 MiB segment
    expect_oldest_fence_alone(f);
    CHECK(f.sink.count(ev_kind::oom) == 0);
}

TEST_CASE("fences: no event is recorded or waited on during a capture", "[fence]") {
    fenced f;
    f.dev.set_capturing(true);
    const uint64_t a = f.alloc(8 * MiB);
    f.free(a);
    CHECK(f.dev.records() == 0);
    const uint64_t b = f.alloc(8 * MiB);
    CHECK(b != a);  // pending through the capture: a new block instead
    CHECK(f.dev.bad_calls() == 0);
    f.dev.set_capturing(false);
    f.dev.enqueue_work_on(k_stream);  // the program's stream has work: its fence needs its event
    f.free(b);  // fenced now, with a: the legacy stream's event; the side stream is asked at the release
    CHECK(f.dev.records() == 1);
    CHECK(f.dev.stream_queries() == 0);
    f.dev.complete_all();
    CHECK(f.alloc(8 * MiB) == a);
    CHECK(f.dev.stream_queries() == 1);
    CHECK(f.dev.sync_calls() == 0);
    CHECK(f.dev.bad_calls() == 0);
}

TEST_CASE("fences: a capture no hook saw stops records and waits too, the driver is asked once per operation", "[fence]") {
    // The preload's may_synchronize() asks the driver (cuStreamIsCapturing) for captures begun by a
    // route gpumem does not see; later checks within one operation use the hooks' count only.
    fenced f;
    f.dev.set_capturing_unseen(true);
    const uint64_t a = f.alloc(8 * MiB);
    f.free(a);
    CHECK(f.alloc(8 * MiB) != a);  // pending through the capture
    CHECK(f.dev.records() == 0);
    CHECK(f.dev.bad_calls() == 0);
    f.dev.set_capturing_unseen(false);

    // A 20 MiB pair loop (the static-cudart program's pool hit): each pair fences its free and asks
    // the fence, one question to the driver per pair, not one per check (three before).
    fenced g(safe_config());
    const uint64_t big = g.alloc(256 * MiB);
    g.free(big);
    g.dev.complete_all();
    g.free(g.alloc(20 * MiB));  // warm: the 256 MiB block is free again, and cut once
    const uint64_t asks = g.dev.capture_asks(), records = g.dev.records();
    for (int i = 0; i < 100; ++i) {
        g.free(g.alloc(20 * MiB));
        g.dev.complete_all();
    }
    CHECK(g.dev.records() - records >= 50);  // the fences this test is about
    CHECK(g.dev.capture_asks() - asks <= 100);
    CHECK(g.dev.sync_calls() == 0);
}

TEST_CASE("fences: each operation asks the driver afresh, an answer kept from the one before would miss a capture opened between them", "[fence]") {
    // The operation before leaves its "no capture" behind (capture_checked_); then a capture no
    // hook sees opens.  Each public operation that may record, wait or sync must ask again.
    const int op = GENERATE(0, 1, 2, 3, 4);
    const char* const names[] = {"deallocate", "allocate", "release_cached", "enter_safe_reuse", "settle_owed_drain"};
    CAPTURE(names[op]);
    pool_config cfg = fence_each();
    if (op >= 3) cfg.reuse = reuse_mode::automatic;  // the switch and its owed drain
    fenced f(cfg);
    const uint64_t a = f.alloc(8 * MiB), b = f.alloc(8 * MiB);
    if (op == 4) {  // a drain owed: the switch came during a capture the hooks saw
        f.dev.set_capturing(true);
        f.pool.enter_safe_reuse(api_id::cuStreamCreate);
        f.dev.set_capturing(false);
    }
    if (op <= 2) {
        f.free(a);  // asks the driver (no capture), records a fence
        if (op == 1) f.free(b);
    } else {
        f.pool.release_cached();  // asks the driver (no capture); nothing to give back
    }
    const uint64_t records = f.dev.records(), waits = f.dev.event_syncs();
    f.dev.set_capturing_unseen(true);
    uint64_t p = 0;
    switch (op) {
        case 0: f.free(b); break;  // over an eighth of the budget: would fence it
        case 1: CHECK(f.pool.allocate(8 * MiB, api_id::cuMemAlloc_v2, &p) == k_cuda_success); break;  // would wait for a's fence
        case 2: f.pool.release_cached(); break;  // would wait for a's fence
        case 3: f.pool.enter_safe_reuse(api_id::cuStreamCreate); break;  // would drain by fence
        case 4: f.pool.settle_owed_drain(); break;  // would drain by fence
    }
    CHECK(f.dev.records() == records);
    CHECK(f.dev.event_syncs() == waits);
    CHECK(f.dev.sync_calls() == 0);
    CHECK(f.dev.bad_calls() == 0);
    f.dev.set_capturing_unseen(false);
}

TEST_CASE("fences: a capture opened during an OOM's waits stops them before the next wait", "[fence]") {
    // Three 20 MiB segments, freed under three fences the GPU has not reached; a 40 MiB request
    // fits in none of them, so memory runs short and the pool waits on the fences oldest first.
    // Another thread opens a capture right after the first wait: a second cuEventSynchronize
    // would invalidate it (and a segment free or a context sync would too).  Opened by a route
    // gpumem's hooks see, or by one they do not (only the driver's answer knows: the pool asks it
    // again after every wait).
    const bool unseen = GENERATE(false, true);
    CAPTURE(unseen);
    fenced f(fence_each(), 64 * MiB);
    const uint64_t a = f.alloc(20 * MiB), b = f.alloc(20 * MiB), c = f.alloc(20 * MiB);
    f.free(a);
    f.free(b);
    f.free(c);
    REQUIRE(f.dev.event_syncs() == 0);
    f.dev.capture_after_event_syncs(1, unseen);
    uint64_t p = 0;
    CHECK(f.pool.allocate(40 * MiB, api_id::cuMemAlloc_v2, &p) == k_cuda_oom);
    CHECK(f.dev.event_syncs() == 1);
    CHECK(f.dev.bad_calls() == 0);
    CHECK(f.dev.sync_calls() == 0);
    // Once the capture ends, the same request is served: the waits resume.
    f.dev.end_captures();
    CHECK(f.pool.allocate(40 * MiB, api_id::cuMemAlloc_v2, &p) == k_cuda_success);
    CHECK(f.dev.bad_calls() == 0);
}

TEST_CASE("fences: a capture opened just after the pool's check gets no event query or wait", "[fence]") {
    // Another thread opens a (hooked) capture right after the pool asked whether it may
    // synchronize: the queries of the fences, and the waits on them, come after that answer and
    // would invalidate the capture.  They run under the stream set's lock, under which a capture
    // is counted as it opens, and ask again there (capture_guard).
    const bool short_of_memory = GENERATE(false, true);
    CAPTURE(short_of_memory);
    fenced f(fence_each(), short_of_memory ? 64 * MiB : 1024 * MiB);
    const uint64_t a = f.alloc(20 * MiB), b = f.alloc(20 * MiB), c = f.alloc(20 * MiB);
    f.free(a);
    f.free(b);
    f.free(c);
    const uint64_t queries = f.dev.queries(), waits = f.dev.event_syncs();
    f.dev.capture_after_asks(1);
    uint64_t p = 0;
    // 8 MiB fits a pending block (a miss that polls the fences, then grows); 40 MiB in 64 MiB fits
    // none (memory short: the waits).  Either way the capture keeps the frees pending.
    const int rc = f.pool.allocate(short_of_memory ? 40 * MiB : 8 * MiB, api_id::cuMemAlloc_v2, &p);
    CHECK(rc == (short_of_memory ? k_cuda_oom : k_cuda_success));
    CHECK(f.dev.queries() == queries);
    CHECK(f.dev.event_syncs() == waits);
    CHECK(f.dev.bad_calls() == 0);
    f.dev.end_captures();
    CHECK(f.pool.allocate(8 * MiB, api_id::cuMemAlloc_v2, &p) == k_cuda_success);
    CHECK(f.dev.bad_calls() == 0);
}

TEST_CASE("fences: a capture opened while an OOM settles immediate frees gets no segment freed or unmapped", "[fence]") {
    // Immediate reuse on virtual memory: a freed 40 MiB segment is wholly free, but its last
    // owner's work may still run, so the OOM path waits for every stream before unmapping it.
    // Another thread opens a capture right after that wait: the segment must stay (cuMemUnmap
    // and cuMemFree during a capture are what the pool never does), whichever route opened it.
    const bool unseen = GENERATE(false, true);
    CAPTURE(unseen);
    fenced f(immediate_segments(), 64 * MiB, 2 * MiB);
    f.free(f.alloc(40 * MiB));
    f.dev.capture_after_event_syncs(1, unseen);
    uint64_t p = 0;
    const uint64_t unmaps = f.dev.unmap_calls();
    CHECK(f.pool.allocate(48 * MiB, api_id::cuMemAlloc_v2, &p) == k_cuda_oom);
    CHECK(f.dev.event_syncs() == 1);  // the wait for the streams
    CHECK(f.dev.unmap_calls() == unmaps);
    CHECK(f.dev.sync_calls() == 0);
    CHECK(f.dev.bad_calls() == 0);
    // Once the capture ends, the segment goes back and the request is served.
    f.dev.end_captures();
    CHECK(f.pool.allocate(48 * MiB, api_id::cuMemAlloc_v2, &p) == k_cuda_success);
    CHECK(f.dev.bad_calls() == 0);
}

TEST_CASE("fences: a capture opened while release_cached settles immediate frees gets no segment freed", "[fence]") {
    // release_cached frees a wholly free segment on virtual memory only after every stream's
    // work is done (a block freed for immediate reuse may still be in use).  A capture opened
    // on another thread right after that wait forbids the cuMemUnmap and cuMemFree that follow:
    // the segment stays cached until the capture ends.
    const bool unseen = GENERATE(false, true);
    CAPTURE(unseen);
    fenced f(immediate_segments(), 64 * MiB, 2 * MiB);
    f.free(f.alloc(40 * MiB));
    const uint64_t held = f.dev.in_use();
    f.dev.capture_after_event_syncs(1, unseen);
    f.pool.release_cached();
    CHECK(f.dev.event_syncs() == 1);  // the wait for the streams
    CHECK(f.dev.in_use() == held);
    CHECK(f.sink.count(ev_kind::segment_free) == 0);
    CHECK(f.dev.sync_calls() == 0);
    CHECK(f.dev.bad_calls() == 0);
    f.dev.end_captures();
    f.pool.release_cached();
    CHECK(f.dev.in_use() == 0);
    CHECK(f.dev.bad_calls() == 0);
}

TEST_CASE("fences: the wait on every stream before unmapping immediate frees is logged with its time", "[fence]") {
    // Immediate reuse: no frees pend, so no release follows to carry the wait's time; its own
    // pool_sync (count 0, by fences, like the drain) must say how long it held the program.
    fenced f(immediate_segments(), 64 * MiB, 2 * MiB);
    // A wait far longer than the calls around it: fence_ns is wall time, and a thread preempted
    // inside a timed call (108 ms once, on a starved CI-like machine) must not pass for the wait.
    constexpr uint64_t k_wait = 250000000;
    f.dev.set_wait_sleep_ns(k_wait);
    f.free(f.alloc(40 * MiB));
    uint64_t p = 0;
    CHECK(f.pool.allocate(48 * MiB, api_id::cuMemAlloc_v2, &p) == k_cuda_success);
    CHECK(f.dev.event_syncs() == 1);  // the wait for the streams
    CHECK(f.dev.sync_calls() == 0);
    auto syncs = f.sink.of(ev_kind::pool_sync);
    REQUIRE(syncs.size() == 1);
    CHECK(syncs[0].c.count == 0);
    CHECK((syncs[0].flags & ef_fence) != 0);
    CHECK((syncs[0].flags & ef_waited) == 0);
    CHECK(syncs[0].c.wait_ns >= k_wait);
    CHECK(f.pool.wait_ns() == syncs[0].c.wait_ns);
    // Its queries and records are fence_ns, the wait is not (no call here sleeps).
    CHECK(f.pool.fence_ns() > 0);
    CHECK(f.pool.fence_ns() < k_wait);
}

TEST_CASE("fences: what no fence covers falls back to one context synchronize", "[fence]") {
    SECTION("a destroyed stream's work") {
        fenced f;
        f.streams.destroyed(k_ctx, k_stream);
        const uint64_t a = f.alloc(40 * MiB);
        f.free(a);
        CHECK(f.dev.records() == 0);
        CHECK(f.alloc(40 * MiB) == a);  // 40 MiB pending is over the budget: one sync releases it
        CHECK(f.dev.sync_calls() == 1);
        // After the sync the destroyed stream is forgotten: fences again.
        f.free(a);
        CHECK(f.dev.records() == 1);  // the legacy stream only: the program has no stream left
    }
    SECTION("a green context, or a backend without events") {
        fenced f;
        f.streams.give_up();
        f.dev.set_wait_sleep_ns(1000000);
        const uint64_t a = f.alloc(40 * MiB);
        f.free(a);
        CHECK(f.alloc(40 * MiB) == a);
        CHECK(f.dev.records() == 0);
        CHECK(f.dev.sync_calls() == 1);
        // The synchronize's pool_sync says how long it held the program (1 ms here).
        auto syncs = f.sink.of(ev_kind::pool_sync);
        REQUIRE(syncs.size() == 1);
        CHECK(syncs[0].c.wait_ns >= 1000000);
    }
    SECTION("a record that fails leaves the free unfenced, to be fenced at the next try") {
        fenced f;
        f.dev.fail_next_records(1);
        const uint64_t a = f.alloc(40 * MiB);
        f.free(a);
        CHECK(f.alloc(40 * MiB) != a);  // fenced now, not reached yet
        f.dev.complete_all();
        CHECK(f.alloc(40 * MiB) == a);
        CHECK(f.dev.sync_calls() == 0);
    }
}

namespace {

// A random program on fake_backend's work clock.  Checks, after every allocation: no block handed
// out over a freed range whose earlier work may still run (unless the pool reuses at once by
// design: immediate, or auto before `switch_at`), and no chunk unmapped under such a range, ever.
// Never a device-wide sync.
void run_property(reuse_mode mode, uint64_t chunk, int switch_at) {
    for (uint64_t seed : {1u, 2u, 3u, 4u}) {
        INFO("seed " << seed);
        pool_config cfg;
        cfg.reuse = mode;
        cfg.vmm = chunk != 0;
        fenced f(cfg, 96 * MiB, chunk);  // tight enough that the pool must sometimes wait (and unmap)
        std::mt19937_64 rng(seed);
        std::map<uint64_t, uint64_t> live;  // addr -> size
        struct freed {
            uint64_t size, ticket;
        };
        std::map<uint64_t, freed> unsafe;  // freed ranges whose earlier work may still run
        size_t unmaps_seen = 0;
        bool reuse_checked = mode == reuse_mode::safe;
        const uint64_t sizes[] = {512, 4096, 100000, MiB, 3 * MiB, 9 * MiB};
        for (int op = 0; op < 20000; ++op) {
            if (op == switch_at) {
                f.pool.enter_safe_reuse(api_id::cuStreamCreate);  // auto: the program made a stream
                reuse_checked = mode == reuse_mode::automatic;
            }
            const uint64_t done = f.dev.completed();
            for (auto it = unsafe.begin(); it != unsafe.end();) it = it->second.ticket <= done ? unsafe.erase(it) : std::next(it);
            const int r = int(rng() % 100);
            if (r < 45 || live.empty()) {
                const uint64_t size = sizes[rng() % 6];
                uint64_t p = 0;
                const int rc = f.pool.allocate(size, api_id::cuMemAlloc_v2, &p);
                // Chunks unmapped during the call: no freed range inside them may have work left.
                for (; unmaps_seen < f.csink.unmaps.size(); ++unmaps_seen) {
                    const auto& [e, reached] = f.csink.unmaps[unmaps_seen];
                    for (const auto& [a, fr] : unsafe) {
                        if (a < e.b.ptr + e.b.size && e.b.ptr < a + fr.size) {
                            INFO("unmapped " << std::hex << e.b.ptr << " over " << a << " before ticket " << std::dec
                                             << fr.ticket << " done " << reached);
                            REQUIRE(fr.ticket <= reached);
                        }
                    }
                }
                if (rc != k_cuda_success) continue;
                // Every freed range this block overlaps must have had its earlier work finish.
                const uint64_t now_done = f.dev.completed();
                for (const auto& [a, fr] : unsafe) {
                    if (reuse_checked && a < p + size && p < a + fr.size) {
                        INFO("reused " << std::hex << a << " before ticket " << std::dec << fr.ticket << " done " << now_done);
                        REQUIRE(fr.ticket <= now_done);
                    }
                }
                live[p] = size;
                f.dev.enqueue_work();  // the new owner's kernel
            } else if (r < 85) {
                auto it = live.begin();
                std::advance(it, rng() % live.size());
                const uint64_t p = it->first, size = it->second;
                live.erase(it);
                const uint64_t t = f.dev.enqueue_work();  // the last kernel that read it, then the free
                f.free(p);
                auto& u = unsafe[p];
                u = {std::max(u.size, size), std::max(u.ticket, t)};
            } else if (r < 98) {
                const uint64_t last = f.dev.last_ticket();
                if (last) f.dev.complete_through(f.dev.completed() + rng() % (last - f.dev.completed() + 1));
            } else {
                f.dev.complete_all();
            }
        }
        std::string why;
        CHECK(f.pool.validate(&why));
        CHECK(f.dev.sync_calls() == 0);  // never a device-wide sync
        CHECK(f.dev.bad_calls() == 0);
        if (mode != reuse_mode::immediate) CHECK(f.sink.count(ev_kind::pool_sync) > 0);
        if (chunk) CHECK(!f.csink.unmaps.empty());  // the test reached the unmapping path
    }
}

}  // namespace

TEST_CASE("fences, property: no reuse before the work enqueued before the free is done, no context sync", "[fence]") {
    SECTION("safe, cuMemAlloc segments") { run_property(reuse_mode::safe, 0, -1); }
    SECTION("safe, virtual memory (chunks unmapped only once their work is done)") { run_property(reuse_mode::safe, 2 * MiB, -1); }
    SECTION("auto, switching mid-run, virtual memory") { run_property(reuse_mode::automatic, 2 * MiB, 5000); }
    SECTION("immediate, virtual memory: unmapping still waits for the work") { run_property(reuse_mode::immediate, 2 * MiB, -1); }
}

// GPUMEM_FENCE_WAIT=order: a random program whose kernels run on three streams.  After every
// allocation the new owner's kernel goes to a random stream, which must start after every earlier
// kernel on the block's memory (fake_backend::ordered_after: stream order, event waits, or done),
// and no chunk is unmapped under work not done.  No device-wide sync.
// side_streams false: the program runs on the legacy stream and two blocking streams (as
// per-thread default streams are) for the first half, where ordered release stands in for fences
// (order_alone) and the legacy stream's implicit synchronization alone orders the blocking
// streams (fake_backend::set_blocking), and makes non-blocking streams in the second.
void run_order_property(uint64_t chunk, bool side_streams = true) {
    const uint64_t k_stream2 = 0x6000;
    for (uint64_t seed : {1u, 2u, 3u}) {
        INFO("seed " << seed);
        // Streams made during the run come in through the creation hook (order_new_stream).
        std::vector<uint64_t> streams = {k_stream_legacy, 0x5100, 0x5110};
        if (side_streams) streams = {k_stream_legacy, k_stream, k_stream2};
        pool_config cfg = safe_config();
        cfg.order = true;
        cfg.order_beside_busy = true;  // the side streams run random work: keep ordering regardless
        cfg.order_batch = seed == 1 ? 0 : seed == 2 ? 32 * MiB : 4 * MiB;  // one by one, or batches
        INFO("order batch " << cfg.order_batch);
        cfg.vmm = chunk != 0;
        fenced f(cfg, 96 * MiB, chunk, side_streams);
        if (side_streams) f.streams.created(k_ctx, k_stream2, true);
        for (uint64_t b : {0x5100ull, 0x5110ull})
            if (!side_streams) {
                f.streams.created(k_ctx, b, false);
                f.dev.set_blocking(b);
            }
        uint64_t alone_releases = 0, alone_queries = 0;
        std::mt19937_64 rng(seed);
        struct work {
            uint64_t addr, size, stream, ticket;
        };
        // addr -> size and every kernel its owner ran on it (on any of the streams): all of them
        // come before its free, not only the last.
        struct owned {
            uint64_t size;
            std::vector<work> kernels;
        };
        std::map<uint64_t, owned> live;
        std::vector<work> earlier;  // kernels on memory freed since
        size_t unmaps_seen = 0;
        const uint64_t sizes[] = {512, 4096, 100000, MiB, 3 * MiB, 9 * MiB};
        for (int op = 0; op < 8000; ++op) {
            const uint64_t done = f.dev.completed();
            earlier.erase(std::remove_if(earlier.begin(), earlier.end(), [&](const work& w) { return w.ticket <= done; }),
                          earlier.end());
            const int r = int(rng() % 100);
            if (r < 45 || live.empty()) {
                const uint64_t size = sizes[rng() % 6];
                uint64_t p = 0;
                const int rc = f.pool.allocate(size, api_id::cuMemAlloc_v2, &p);
                for (; unmaps_seen < f.csink.unmaps.size(); ++unmaps_seen) {
                    const auto& [e, reached] = f.csink.unmaps[unmaps_seen];
                    for (const work& w : earlier)
                        if (w.addr < e.b.ptr + e.b.size && e.b.ptr < w.addr + w.size) REQUIRE(w.ticket <= reached);
                }
                if (rc != k_cuda_success) continue;
                const uint64_t st = streams[rng() % streams.size()];
                for (const work& w : earlier) {
                    if (w.addr < p + size && p < w.addr + w.size) {
                        INFO("reused " << std::hex << w.addr << " on stream " << st << " before ticket " << std::dec << w.ticket
                                       << " of stream " << std::hex << w.stream);
                        REQUIRE(f.dev.ordered_after(st, w.stream, w.ticket));
                    }
                }
                live[p] = owned{size, {{p, size, st, f.dev.enqueue_work_on(st)}}};  // the new owner's kernel
            } else if (r < 85) {
                auto it = live.begin();
                std::advance(it, rng() % live.size());
                const uint64_t p = it->first, size = it->second.size;
                const uint64_t st = streams[rng() % streams.size()];
                it->second.kernels.push_back({p, size, st, f.dev.enqueue_work_on(st)});  // a last kernel on it, then the free
                earlier.insert(earlier.end(), it->second.kernels.begin(), it->second.kernels.end());
                live.erase(it);
                f.free(p);
            } else if (r < 97) {
                const uint64_t last = f.dev.last_ticket();
                if (last) f.dev.complete_through(f.dev.completed() + rng() % (last - f.dev.completed() + 1));
            } else if (r == 97 && streams.size() < 12 && (side_streams || op >= 4000)) {
                if (!side_streams && streams.size() == 3) {  // the half without non-blocking streams ends
                    alone_releases = f.pool.ordered_releases();
                    alone_queries = f.dev.queries() + f.dev.stream_queries();
                }
                const uint64_t made = 0x7000 + streams.size();  // as the creation hook reports it
                f.streams.created(k_ctx, made, true);
                f.pool.order_new_stream(made);
                streams.push_back(made);
            } else {
                f.dev.complete_all();
            }
        }
        std::string why;
        CHECK(f.pool.validate(&why));
        CHECK(f.dev.sync_calls() == 0);
        CHECK(f.dev.bad_calls() == 0);
        CHECK(f.pool.ordered_releases() > 0);  // the test reached ordered releases
        CHECK(streams.size() > 3);             // and made streams after some
        if (!side_streams) {
            CHECK(alone_releases > 0);  // the first half released by ordered releases...
            // ...that asked the driver nothing (on virtual memory the OOM path asks whether the
            // releases' work is done before it unmaps chunks)
            if (!chunk) CHECK(alone_queries == 0);
        }
        if (chunk) CHECK(!f.csink.unmaps.empty());
    }
}

TEST_CASE("fences, property: GPUMEM_FENCE_WAIT=order hands blocks out early only where every stream's next work follows their last owners'", "[fence]") {
    SECTION("cuMemAlloc segments") { run_order_property(0); }
    SECTION("virtual memory (chunks unmapped only once their work is done)") { run_order_property(2 * MiB); }
    SECTION("the legacy and two blocking streams (no fence), then non-blocking streams") { run_order_property(0, false); }
    SECTION("the same on virtual memory") { run_order_property(2 * MiB, false); }
}

TEST_CASE("fences: with no non-blocking stream, ordered release stands in for fences: a free records nothing, a miss one event, no query", "[fence]") {
    pool_config cfg = order_each();
    fenced f(cfg, 24 * MiB, 0, false);  // room for one 20 MiB segment; no side stream
    f.streams.created(k_ctx, 0x6000, false);  // a blocking stream: ordered by the legacy stream's event
    const uint64_t a = f.alloc(8 * MiB);
    const uint64_t b = f.alloc(8 * MiB);
    const uint64_t w = f.dev.enqueue_work_on(k_stream_legacy);  // reads a
    f.free(a);
    CHECK(f.dev.records() == 0);  // no fence: the miss that wants the memory orders it
    CHECK(f.alloc(8 * MiB) == a);  // fits only in a's block
    CHECK(f.dev.records() == 1);   // one event on the legacy stream...
    CHECK(f.dev.records_on(k_stream_legacy) == 1);
    CHECK(f.dev.queries() == 0);   // ...and nothing asked
    CHECK(f.dev.stream_queries() == 0);
    CHECK(f.dev.event_syncs() == 0);
    CHECK(f.dev.sync_calls() == 0);
    CHECK(f.dev.completed() < w);  // handed out before the old work ran
    CHECK(f.pool.ordered_releases() == 1);
    auto syncs = f.sink.of(ev_kind::pool_sync);
    REQUIRE(syncs.size() == 1);
    CHECK((syncs[0].flags & ef_ordered) != 0);
    // A non-blocking stream made now waits for that release's work, and fences come back: the
    // free after it records one (a release would now ask and order every stream).
    const uint64_t made = 0x7000;
    f.streams.created(k_ctx, made, true);
    f.pool.order_new_stream(made);
    CHECK(f.dev.ordered_after(made, k_stream_legacy, w));
    const uint64_t records = f.dev.records();
    f.free(b);
    CHECK(f.dev.records() > records);
    CHECK(f.dev.bad_calls() == 0);
    std::string why;
    CHECK(f.pool.validate(&why));
}

TEST_CASE("fences: ordered releases come in batches of min(8 requests, GPUMEM_ORDER_BATCH), at least 4 requests under it, pending, the pool growing meanwhile", "[fence]") {
    // A loop of one size, the GPU behind throughout: each miss grows the pool while the pending
    // frees are fewer than the batch, then one release hands them all out.  Pending bytes never
    // pass the batch plus a request, so reserved memory stays within that of the loop's block.
    // The frees a release serves, stated apart from the rule: 2 MiB 8 (8 requests are under
    // 32 MiB), 20 MiB 4 (the floor of 4 requests under 32 MiB; 2 before it), 24 and 31 MiB 3 (the
    // floor's 64 MiB cap), 48 MiB 1 (32 MiB).
    for (auto [size, per] : {std::pair{2 * MiB, 8ull}, {20 * MiB, 4ull}, {24 * MiB, 3ull}, {31 * MiB, 3ull},
                             {48 * MiB, 1ull}}) {
        INFO("size " << size);
        pool_config cfg = order_each();
        cfg.order_batch = 32 * MiB;
        fenced f(cfg, 1ull << 40, 2 * MiB, false);  // no side stream: a release is one record
        const uint64_t batch = per * size;
        const int pairs = 400;
        for (int i = 0; i < pairs; ++i) {
            const uint64_t p = f.alloc(size);
            f.dev.enqueue_work_on(k_stream_legacy);  // a kernel on it, never done in this loop
            f.free(p);
            CHECK(f.pool.pending_bytes() <= batch + size);
        }
        // The releases: one per batch, each one record, no query.
        CHECK(f.pool.ordered_releases() >= uint64_t(pairs) / per - 1);
        CHECK(f.pool.ordered_releases() <= uint64_t(pairs) / per + 1);
        CHECK(f.dev.records() == f.pool.ordered_releases());
        CHECK(f.dev.queries() == 0);
        CHECK(f.dev.event_syncs() == 0);
        CHECK(f.dev.sync_calls() == 0);
        CHECK(f.pool.snapshot().reserved <= batch + 2 * size + 20 * MiB);
        CHECK(f.dev.bad_calls() == 0);
        std::string why;
        CHECK(f.pool.validate(&why));
    }
    // GPUMEM_ORDER_BATCH=0: a release at every miss, as before.
    pool_config cfg = order_each();
    fenced f(cfg, 1ull << 40, 2 * MiB, false);
    for (int i = 0; i < 100; ++i) f.free(f.alloc(2 * MiB));
    CHECK(f.pool.ordered_releases() >= 99);
}

TEST_CASE("fences: while a batch gathers, a large request cuts the arena's growth room rather than release a tighter pending block", "[fence]") {
    // The hit path keeps a block over twice a large request whole while a tighter one is pending,
    // by releasing; at the growth room a batch's own growth left at the arena's end that released
    // at every pair of a 20 MiB loop on the H200 (run 142: 1.98 us a pair against 0.97).  Inside
    // the layout the check still holds (replayed, skipping it everywhere cost 1.108x -> 1.122x).
    pool_config cfg = order_each();
    cfg.order_batch = 32 * MiB;
    fenced f(cfg, 1ull << 40, 2 * MiB, false);
    const uint64_t x = f.alloc(20 * MiB);          // the arena's start
    const uint64_t y = f.alloc(80 * MiB);
    f.free(y);                                      // 80 MiB pending: past the batch
    const uint64_t z = f.alloc(20 * MiB);          // the miss releases y (events known from now on)
    CHECK(z == y);                                  // the front of y; its other 60 MiB free, at the end
    const uint64_t releases = f.pool.ordered_releases();
    f.free(x);                                      // 20 MiB pending: the batch gathers
    REQUIRE(f.pool.pending_bytes() == 20 * MiB);
    const uint64_t w = f.alloc(20 * MiB);
    CHECK(w == y + 20 * MiB);                       // cut from the growth room
    CHECK(f.pool.ordered_releases() == releases);  // no release for it
    CHECK(f.pool.pending_bytes() == 20 * MiB);
    CHECK(f.dev.bad_calls() == 0);
    std::string why;
    CHECK(f.pool.validate(&why));
}

TEST_CASE("fences: a batch of pending frees is released before a capture opens, so they serve inside it", "[fence]") {
    // Inside a capture the pool may not release (no event, no wait): frees a batch left pending
    // would serve only after it, and the capture's requests grow the pool or fail.
    for (bool before : {true, false}) {
        INFO("released before the capture: " << before);
        pool_config cfg = order_each();
        cfg.order_batch = 32 * MiB;
        fenced f(cfg, 24 * MiB, 2 * MiB, false);
        f.free(f.alloc(4 * MiB));
        f.alloc(4 * MiB);  // its first release: the pool knows events work now
        std::vector<uint64_t> bs;
        for (int i = 0; i < 4; ++i) bs.push_back(f.alloc(4 * MiB));
        for (uint64_t b : bs) f.free(b);
        CHECK(f.pool.pending_bytes() == 16 * MiB);  // under the batch: still pending
        const uint64_t reserved = f.pool.snapshot().reserved;
        if (before) f.pool.release_before_capture();
        CHECK(f.pool.pending_bytes() == (before ? 0 : 16 * MiB));
        f.dev.set_capturing(true);
        int served = 0;
        for (int i = 0; i < 4; ++i) {
            uint64_t p = 0;
            served += f.pool.allocate(4 * MiB, api_id::cuMemAlloc_v2, &p) == k_cuda_success;
        }
        f.dev.set_capturing(false);
        if (before) {
            CHECK(served == 4);
            CHECK(f.pool.snapshot().reserved == reserved);  // from the released blocks, no growth
        } else {
            CHECK(served < 4);  // the device had room for one more block only
        }
        CHECK(f.dev.bad_calls() == 0);
        std::string why;
        CHECK(f.pool.validate(&why));
    }
}

TEST_CASE("fences: a growth the driver refuses for another reason than memory releases the batch that would serve", "[fence]") {
    // The batch left a free pending and the miss grew instead; a growth refused (an unsupported
    // setting, say: 801) must not be the answer while a release serves the request, as it was
    // not without batches.  A refusal that says a capture is open (900) is the answer, with no
    // event recorded after it.
    for (int code : {k_cuda_oom, 801, 900}) {
        INFO("refused with " << code);
        pool_config cfg = order_each();
        cfg.order_batch = 32 * MiB;
        fenced f(cfg, 1ull << 40, 2 * MiB, false);
        f.free(f.alloc(20 * MiB));
        const uint64_t a = f.alloc(20 * MiB);  // its first release: the pool knows events work now
        CHECK(f.pool.ordered_releases() == 1);
        f.alloc(20 * MiB);      // a second block: the arena now ends at a live one
        f.dev.enqueue_work();   // a kernel on a, never done here
        f.free(a);              // pending, under the batch (20 of 32 MiB)
        f.dev.fail_next_allocs(8, code);
        uint64_t p = 0;
        const uint64_t records = f.dev.records();
        if (code == 900) {
            CHECK(f.pool.allocate(20 * MiB, api_id::cuMemAlloc_v2, &p) == 900);
            CHECK(f.dev.records() == records);
            CHECK(f.pool.pending_bytes() == 20 * MiB);
            continue;
        }
        CHECK(f.pool.allocate(20 * MiB, api_id::cuMemAlloc_v2, &p) == k_cuda_success);
        CHECK(p == a);  // the release handed a out (ordered: no wait)
        CHECK(f.dev.event_syncs() == 0);
        CHECK(f.dev.sync_calls() == 0);
        std::string why;
        CHECK(f.pool.validate(&why));
    }
}

TEST_CASE("fences: with no non-blocking stream, a hit that would cut a larger block while a tighter one is pending releases it by one event, no query", "[fence]") {
    pool_config cfg = order_each();
    fenced f(cfg, 1ull << 40, 0, false);
    const uint64_t big = f.alloc(256 * MiB);
    const uint64_t x = f.alloc(20 * MiB);
    f.dev.enqueue_work_on(k_stream_legacy);
    f.free(big);
    const uint64_t y = f.alloc(20 * MiB);  // a miss: ordered release 1 frees big, y is cut from it
    CHECK(f.pool.ordered_releases() == 1);
    CHECK(y != x);
    f.free(x);  // pending: the tighter block
    const uint64_t z = f.alloc(20 * MiB);  // would cut big's rest: x's release instead
    CHECK(z == x);
    CHECK(f.pool.ordered_releases() == 2);
    CHECK(f.dev.queries() == 0);  // a fence would have been asked (and, not reached, waited for)
    CHECK(f.dev.event_syncs() == 0);
    CHECK(f.dev.records() == 2);
}

TEST_CASE("fences: with no non-blocking stream, a failed record stops ordered releases and fences come back", "[fence]") {
    pool_config cfg = order_each();
    fenced f(cfg, 24 * MiB, 0, false);
    const uint64_t a = f.alloc(8 * MiB);
    const uint64_t b = f.alloc(8 * MiB);
    const uint64_t w = f.dev.enqueue_work_on(k_stream_legacy);
    f.free(a);
    f.dev.fail_next_records(1);
    CHECK(f.alloc(8 * MiB) == a);  // by a wait on a fence instead: nothing handed out early
    CHECK(f.pool.order_stopped());
    CHECK(f.pool.ordered_releases() == 0);
    CHECK(f.dev.completed() >= w);
    const uint64_t records = f.dev.records();
    f.free(b);
    CHECK(f.dev.records() == records + 1);  // the free makes its fence again
}

TEST_CASE("fences: an ordered release with the last one's work not done marks every stream without asking each", "[fence]") {
    // Every stream still waits for the last release's event, so each would be found busy: one
    // stream's query and one event query say so for all (a query costs 1.4 us while the GPU runs).
    pool_config cfg = order_each();
    fenced f(cfg, 24 * MiB);  // k_stream, and three more non-blocking streams
    for (uint64_t st : {0x6000ull, 0x6010ull, 0x6020ull}) f.streams.created(k_ctx, st, true);
    const uint64_t a = f.alloc(8 * MiB);
    const uint64_t b = f.alloc(8 * MiB);
    const uint64_t w = f.dev.enqueue_work_on(k_stream_legacy);  // the GPU stays behind
    f.free(a);
    CHECK(f.alloc(8 * MiB) == a);  // ordered release 1: the four streams wait for its event
    REQUIRE(f.pool.ordered_releases() == 1);
    const uint64_t q = f.dev.stream_queries(), waits = f.dev.stream_waits();
    f.free(b);
    const uint64_t q_free = f.dev.stream_queries() - q;  // the free's fence, if it asks any
    CHECK(f.alloc(8 * MiB) == b);  // ordered release 2, its work not done
    CHECK(f.pool.ordered_releases() == 2);
    CHECK(f.dev.stream_queries() - q - q_free == 1);  // the first stream only
    CHECK(f.dev.stream_waits() - waits == 8);  // the legacy stream on each of the four, each on the new event
    CHECK(f.dev.completed() < w);
    CHECK(!f.pool.order_stopped());
    CHECK(f.dev.event_syncs() == 0);
}

TEST_CASE("fences: the events of 64 unasked ordered releases are found reached with two queries, not 65", "[fence]") {
    pool_config cfg = order_each();
    fenced f(cfg, 24 * MiB, 0, false);
    uint64_t a = f.alloc(8 * MiB);
    f.alloc(8 * MiB);
    for (int i = 0; i < 100; ++i) {
        f.dev.enqueue_work_on(k_stream_legacy);
        f.free(a);
        a = f.alloc(8 * MiB);  // no room for another: ordered release, nothing asked
    }
    REQUIRE(f.pool.ordered_releases() == 100);
    REQUIRE(f.dev.queries() == 0);
    f.dev.complete_all();
    const uint64_t waits = f.dev.stream_waits();
    const uint64_t made = 0x7000;
    f.streams.created(k_ctx, made, true);
    f.pool.order_new_stream(made);  // asks whether the last release's work is done
    CHECK(f.dev.queries() == 2);      // the oldest kept event, then the last release's
    CHECK(f.dev.stream_waits() == waits);  // done: the stream need not wait
    // The GPU behind again: the oldest kept event is not reached, and one query says so.
    f.free(a);
    a = f.alloc(8 * MiB);
    const uint64_t q = f.dev.queries(), waits2 = f.dev.stream_waits();
    const uint64_t made2 = 0x7010;
    f.streams.created(k_ctx, made2, true);
    f.pool.order_new_stream(made2);
    CHECK(f.dev.stream_waits() == waits2 + 1);  // not done: the new stream waits
    CHECK(f.dev.queries() - q <= 1);
}

TEST_CASE("fences: GPUMEM_FENCE_WAIT=order hands a pending block out with no wait, each stream ordered after its last owner", "[fence]") {
    pool_config cfg = order_each();
    fenced f(cfg, 24 * MiB);  // room for one 20 MiB segment
    const uint64_t a = f.alloc(8 * MiB);
    const uint64_t b = f.alloc(8 * MiB);
    const uint64_t w_legacy = f.dev.enqueue_work_on(k_stream_legacy);  // reads a
    f.free(a);
    CHECK(f.alloc(8 * MiB) == a);  // fits only in a's block: no room for a segment
    CHECK(f.dev.completed() < w_legacy);  // the old work has not run yet...
    CHECK(f.dev.ordered_after(k_stream, k_stream_legacy, w_legacy));  // ...but the side stream's next work follows it
    // The side stream, still held by that release's wait, gets work on b; b is freed and wanted.
    const uint64_t w_side = f.dev.enqueue_work_on(k_stream);
    f.free(b);
    CHECK(f.alloc(8 * MiB) == b);
    CHECK(f.dev.event_syncs() == 0);  // the host never waited
    CHECK(f.dev.sync_calls() == 0);
    CHECK(f.dev.completed() < w_side);
    CHECK(f.dev.ordered_after(k_stream_legacy, k_stream, w_side));  // the legacy stream waits for the side stream's work
    // A stream made now is ordered too (the hook calls order_new_stream before the program has it).
    const uint64_t made_later = 0x7000;
    f.streams.created(k_ctx, made_later, true);
    f.pool.order_new_stream(made_later);
    CHECK(f.dev.ordered_after(made_later, k_stream, w_side));
    CHECK(f.dev.ordered_after(made_later, k_stream_legacy, w_legacy));
    CHECK(f.pool.ordered_releases() == 2);
    auto syncs = f.sink.of(ev_kind::pool_sync);
    REQUIRE(!syncs.empty());
    CHECK((syncs.back().flags & ef_fence) != 0);
    CHECK((syncs.back().flags & ef_waited) == 0);
    CHECK((syncs.back().flags & ef_ordered) != 0);  // the log tells an ordered release from a fence's
    CHECK(f.dev.bad_calls() == 0);
    // The context dies (its events with it): a stream made in its successor waits on nothing.
    f.pool.drop_all();
    const uint64_t waits = f.dev.stream_waits();
    f.pool.order_new_stream(0x8000);
    CHECK(f.dev.stream_waits() == waits);
    CHECK(f.pool.ordered_releases() == 0);
}

TEST_CASE("fences: each release's pool_sync line carries the time of the event and stream calls before it (fence_ns), apart from waits", "[fence]") {
    constexpr uint64_t call_ns = 200000;  // a slow driver: 0.2 ms a call
    SECTION("an ordered release") {
        pool_config cfg = order_each();
        fenced f(cfg, 24 * MiB);  // room for one 20 MiB segment
        const uint64_t a = f.alloc(8 * MiB);
        f.alloc(8 * MiB);  // the rest of it
        f.dev.enqueue_work_on(k_stream_legacy);  // the side stream idles: asked, then made to wait
        f.free(a);
        f.dev.set_call_sleep_ns(call_ns);
        const uint64_t calls0 = f.dev.records() + f.dev.queries() + f.dev.stream_queries() + f.dev.stream_waits();
        CHECK(f.alloc(8 * MiB) == a);
        const uint64_t calls = f.dev.records() + f.dev.queries() + f.dev.stream_queries() + f.dev.stream_waits() - calls0;
        REQUIRE(f.pool.ordered_releases() == 1);
        CHECK(calls >= 3);  // the side stream's query, the legacy record, the side stream's wait
        auto syncs = f.sink.of(ev_kind::pool_sync);
        REQUIRE(syncs.size() == 1);
        CHECK((syncs[0].flags & ef_ordered) != 0);
        CHECK(syncs[0].c.fence_ns >= calls * call_ns);  // every call of the release, on its own line
        CHECK(syncs[0].c.wait_ns == 0);  // and none of it counted as a wait
        CHECK(f.pool.fence_ns() == syncs[0].c.fence_ns);
    }
    SECTION("a stream made after a release that the driver will not make wait: the host's wait is wait_ns, not fence_ns") {
        pool_config cfg = order_each();
        fenced f(cfg, 24 * MiB);
        const uint64_t a = f.alloc(8 * MiB);
        f.alloc(8 * MiB);
        f.dev.enqueue_work_on(k_stream_legacy);
        f.free(a);
        CHECK(f.alloc(8 * MiB) == a);
        REQUIRE(f.pool.ordered_releases() == 1);  // its work not done: a new stream must wait for it
        constexpr uint64_t wait = 20000000;
        f.dev.set_wait_sleep_ns(wait);
        f.dev.fail_next_stream_waits(1);  // so the host waits for the release's event instead
        const uint64_t w0 = f.pool.wait_ns(), n0 = f.pool.fence_ns();
        f.streams.created(k_ctx, 0x7000, true);
        f.pool.order_new_stream(0x7000);
        CHECK(f.dev.event_syncs() == 1);
        CHECK(f.pool.wait_ns() - w0 >= wait);
        CHECK(f.pool.fence_ns() - n0 < wait);  // the failed call's time only
    }
    SECTION("fences: the records at the free and the query that releases") {
        fenced f(fence_each(), 24 * MiB);  // each free records its fence
        const uint64_t a = f.alloc(8 * MiB);
        f.alloc(8 * MiB);
        f.dev.enqueue_work_on(k_stream_legacy);
        f.dev.set_call_sleep_ns(call_ns);
        f.free(a);  // its fence's records
        const uint64_t recorded = f.dev.records();
        REQUIRE(recorded >= 1);
        CHECK(f.pool.fence_ns() >= recorded * call_ns);
        CHECK(f.sink.of(ev_kind::pool_sync).empty());  // no line yet: the time waits for one
        f.dev.complete_all();
        const uint64_t queries0 = f.dev.queries();
        CHECK(f.alloc(8 * MiB) == a);  // the fence is asked, reached: released, no wait
        auto syncs = f.sink.of(ev_kind::pool_sync);
        REQUIRE(syncs.size() == 1);
        CHECK((syncs[0].flags & ef_waited) == 0);
        CHECK(syncs[0].c.wait_ns == 0);
        CHECK(syncs[0].c.fence_ns >= (recorded + f.dev.queries() - queries0) * call_ns);
        CHECK(syncs[0].c.fence_ns == f.pool.fence_ns());
    }
}

TEST_CASE("fences: GPUMEM_FENCE_WAIT=order gives way to waits for a stream busy with the program's own work, a failed wait or a capture", "[fence]") {
    pool_config cfg = order_each();
    SECTION("a side stream still running work after the last ordered release's event is reached") {
        fenced f(cfg, 24 * MiB);
        const uint64_t a = f.alloc(8 * MiB);
        const uint64_t b = f.alloc(8 * MiB);
        f.dev.enqueue_work_on(k_stream_legacy);
        f.free(a);
        CHECK(f.alloc(8 * MiB) == a);  // ordered release 1
        REQUIRE(f.pool.ordered_releases() == 1);
        f.dev.complete_all();  // its event is reached: from now on a busy stream is the program's
        const uint64_t w = f.dev.enqueue_work_on(k_stream);  // overlapping work the program wants to keep
        f.free(b);
        CHECK(f.alloc(8 * MiB) == b);  // by a wait this time
        CHECK(f.pool.order_stopped());
        CHECK(f.pool.ordered_releases() == 1);
        CHECK(f.dev.event_syncs() >= 1);
        CHECK(f.dev.completed() >= w);
    }
    SECTION("a stream wait that fails hands nothing out early") {
        fenced f(cfg, 24 * MiB);
        const uint64_t a = f.alloc(8 * MiB);
        f.alloc(8 * MiB);
        const uint64_t w = f.dev.enqueue_work_on(k_stream_legacy);
        f.free(a);
        f.dev.fail_next_stream_waits(1);
        CHECK(f.alloc(8 * MiB) == a);
        CHECK(f.pool.order_stopped());
        CHECK(f.pool.ordered_releases() == 0);
        CHECK(f.dev.completed() >= w);  // waited for, as without ordered release
    }
    SECTION("during a capture nothing is recorded, waited for or released early") {
        fenced f(cfg, 24 * MiB);
        const uint64_t a = f.alloc(8 * MiB);
        f.alloc(8 * MiB);
        f.dev.enqueue_work_on(k_stream_legacy);
        f.free(a);
        f.dev.set_capturing(true);
        uint64_t p = 0;
        (void)f.pool.allocate(8 * MiB, api_id::cuMemAlloc_v2, &p);
        CHECK(p != a);  // a stays pending through the capture (the miss goes to the driver)
        CHECK(f.dev.stream_waits() == 0);
        CHECK(f.dev.bad_calls() == 0);
        f.dev.end_captures();
    }
}

TEST_CASE("fences: GPUMEM_FENCE_WAIT=order whose event record fails still orders later streams after the last release's work", "[fence]") {
    // Release 1 hands a out with its last work queued.  Release 2 fails at the record of its own
    // (fresh) event and stops ordered releases; its miss grows the pool without a wait.  A stream
    // made afterwards must still follow release 1's work: the unrecorded fresh event, which a
    // query calls reached, must not stand in for release 1's.
    pool_config cfg = order_each();
    fenced f(cfg, 1ull << 40, 0, false);  // no side stream: a release records only its event
    const uint64_t a = f.alloc(8 * MiB);
    const uint64_t b = f.alloc(8 * MiB);
    const uint64_t w = f.dev.enqueue_work_on(k_stream_legacy);  // reads a
    f.free(a);
    CHECK(f.alloc(8 * MiB) == a);  // ordered release 1, its event not reached
    REQUIRE(f.pool.ordered_releases() == 1);
    f.free(b);
    f.dev.fail_next_records(1);  // release 2's event
    CHECK(f.alloc(8 * MiB) != b);  // grown: no wait
    CHECK(f.pool.order_stopped());
    CHECK(f.pool.ordered_releases() == 1);
    REQUIRE(f.dev.completed() < w);
    const uint64_t made = 0x7000;
    f.streams.created(k_ctx, made, true);
    f.pool.order_new_stream(made);
    CHECK((f.dev.ordered_after(made, k_stream_legacy, w) || f.dev.completed() >= w));
    f.pool.order_settle();  // a green context: the host waits for release 1's work
    CHECK(f.dev.completed() >= w);
    CHECK(f.dev.bad_calls() == 0);
}

TEST_CASE("fences: GPUMEM_FENCE_WAIT=order asks the driver nothing for a stream made during a capture or at exit", "[fence]") {
    // A stream made on another thread while a capture is open (or made by a static destructor
    // at exit) after an ordered release whose event is not reached: order_new_stream must not
    // query that event.  A cuEventQuery on any thread invalidates a global-mode capture (what
    // PyTorch's NCCL watchdog ran into), and at exit the driver may be gone.
    const bool at_exit = GENERATE(false, true);
    CAPTURE(at_exit);
    pool_config cfg = order_each();
    fenced f(cfg, 24 * MiB);
    const uint64_t a = f.alloc(8 * MiB);
    f.alloc(8 * MiB);
    f.dev.enqueue_work_on(k_stream_legacy);  // reads a, not done
    f.free(a);
    CHECK(f.alloc(8 * MiB) == a);  // an ordered release: its event is not reached
    REQUIRE(f.pool.ordered_releases() == 1);
    if (at_exit) f.pool.release_all_at_exit();
    else f.dev.set_capturing(true);
    const uint64_t queries = f.dev.queries(), waits = f.dev.stream_waits(), syncs = f.dev.event_syncs();
    const uint64_t made = 0x9000;
    f.streams.created(k_ctx, made, true);
    f.pool.order_new_stream(made);
    CHECK(f.dev.queries() == queries);
    CHECK(f.dev.stream_waits() == waits);
    CHECK(f.dev.event_syncs() == syncs);
    CHECK(f.dev.bad_calls() == 0);
    CHECK(f.pool.order_stopped());
    f.dev.end_captures();
}

TEST_CASE("fences: GPUMEM_FENCE_WAIT=order waits for the last release's work when a green context appears", "[fence]") {
    // A green context's streams run beside the pool's context and no stream wait orders them:
    // a block handed out early must not meet them before its last owner's work is done.
    pool_config cfg = order_each();
    fenced f(cfg, 24 * MiB);
    const uint64_t a = f.alloc(8 * MiB);
    f.alloc(8 * MiB);
    f.pool.order_settle();  // no ordered release yet: nothing to wait for
    CHECK(f.dev.queries() == 0);
    const uint64_t w = f.dev.enqueue_work_on(k_stream_legacy);  // reads a
    f.free(a);
    CHECK(f.alloc(8 * MiB) == a);  // handed out early
    REQUIRE(f.dev.completed() < w);
    SECTION("the host waits, once") {
        f.pool.order_settle();
        CHECK(f.dev.completed() >= w);
        CHECK(f.dev.event_syncs() == 1);
        CHECK(f.pool.order_stopped());
        f.pool.order_settle();
        CHECK(f.dev.event_syncs() == 1);
    }
    SECTION("during a capture nothing is asked") {
        f.dev.set_capturing(true);
        const uint64_t q = f.dev.queries();
        f.pool.order_settle();
        CHECK(f.dev.queries() == q);
        CHECK(f.dev.event_syncs() == 0);
        CHECK(f.pool.order_stopped());
        f.dev.end_captures();
    }
    CHECK(f.dev.bad_calls() == 0);
}

namespace {

// Ordered releases on virtual memory with a 2 MiB trim: the two trimming tests below.
pool_config order_trim_config() {
    pool_config cfg = order_each();
    cfg.vmm = true;
    cfg.trim = 2 * MiB;
    return cfg;
}

// One ordered release that leaves a block's rest free but unsettled: its last work, on the legacy
// stream, still runs.  Returns that work's ticket.
uint64_t release_unsettled(fenced& f) {
    const uint64_t x = f.alloc(8 * MiB);
    f.alloc(8 * MiB);
    const uint64_t w = f.dev.enqueue_work_on(k_stream_legacy);
    f.free(x);
    CHECK(f.alloc(4 * MiB) == x);  // an ordered release: x's front, its rest free but unsettled
    REQUIRE(f.pool.ordered_releases() == 1);
    return w;
}

}  // namespace

TEST_CASE("fences: frees of an ordered release count as settled once its event is reached (trimming goes on)", "[fence]") {
    fenced f(order_trim_config(), 1ull << 40, 2 * MiB);
    const uint64_t w = release_unsettled(f);
    f.dev.complete_all();  // the release's event is reached: x's last work is done
    f.alloc(20 * MiB);     // a growth past live + request + trim: the trim gives x's free chunks back
    REQUIRE(!f.csink.unmaps.empty());
    for (const auto& [e, reached] : f.csink.unmaps) CHECK(reached >= w);
    CHECK(f.dev.event_syncs() == 0);  // settled by a query, not a wait
    CHECK(f.dev.bad_calls() == 0);
}

TEST_CASE("fences: a context reset leaves no unsettled free behind (trimming goes on in the next context)", "[fence]") {
    fenced f(order_trim_config(), 1ull << 40, 2 * MiB);
    release_unsettled(f);
    f.pool.drop_all();  // the context dies with the release's event unreached
    f.dev.complete_all();
    const size_t before = f.csink.unmaps.size();
    const uint64_t y = f.alloc(8 * MiB);  // the next context: fences only, no ordered release
    f.alloc(8 * MiB);
    f.free(y);
    f.dev.complete_all();
    f.alloc(20 * MiB);  // releases y by its fence, then trims its chunks before growing
    CHECK(f.pool.ordered_releases() == 0);
    CHECK(f.csink.unmaps.size() > before);
    CHECK(f.dev.bad_calls() == 0);
}

TEST_CASE("fences: auto's drain at its switch settles the frees made for immediate reuse (no second wait before an unmap)", "[fence]") {
    // The drain waits for all work enqueued so far: every block freed before the switch is
    // settled by it, so memory short just after needs no other wait before unmapping.
    pool_config cfg = immediate_config();
    cfg.reuse = reuse_mode::automatic;
    cfg.vmm = true;
    fenced f(cfg, 64 * MiB, 2 * MiB, false);
    const uint64_t a = f.alloc(20 * MiB), b = f.alloc(4 * MiB);
    f.free(a);  // immediate reuse: its last owner's work may still run
    f.dev.enqueue_work_on(k_stream_legacy);
    f.pool.enter_safe_reuse(api_id::cuStreamCreate);
    REQUIRE(f.dev.event_syncs() == 1);  // the drain
    REQUIRE(!f.pool.reuse_is_immediate());
    // 44 MiB past b: a's 20 MiB of free chunks must go back first (the OOM path).
    const uint64_t big = f.alloc(44 * MiB);
    CHECK(f.sink.count(ev_kind::segment_unmap) > 0);
    CHECK(f.dev.event_syncs() == 1);
    CHECK(f.dev.sync_calls() == 0);
    f.free(big);
    f.free(b);
    CHECK(f.dev.bad_calls() == 0);
}

TEST_CASE("fences: GPUMEM_REUSE=immediate waits for every stream's work, not the legacy stream's alone, before unmapping a freed block", "[fence]") {
    // Immediate reuse lets the program run a block's work on any stream: cuMemUnmap does not
    // wait for it, so the OOM path waits for every non-blocking stream too (auto before its
    // switch has one issue order, where the legacy stream's event covers it all).
    fenced f(immediate_segments(), 64 * MiB, 2 * MiB);
    const uint64_t a = f.alloc(40 * MiB);
    f.dev.stall_stream(k_stream);  // a long copy from a on the side stream
    f.free(a);
    const uint64_t unmaps = f.dev.unmap_calls();
    uint64_t p = 0;
    REQUIRE(f.pool.allocate(48 * MiB, api_id::cuMemAlloc_v2, &p) == k_cuda_success);
    CHECK(f.dev.unmap_calls() > unmaps);  // a's segment went back
    CHECK(f.dev.records_on(k_stream) == 1);
    CHECK(f.dev.stream_query(k_stream) == k_cuda_success);  // after a wait on the copy
    CHECK(f.dev.sync_calls() == 0);
    CHECK(f.dev.bad_calls() == 0);
}

TEST_CASE("fences: a non-blocking stream of an unknown context makes every pool fall back to the sync", "[fence]") {
    stream_set st;
    std::vector<uint64_t> out;
    st.created(0xc0, 0x10, false);
    st.created(0, 0x20, false);  // blocking: the legacy stream's event covers it wherever it is
    CHECK(st.fence_streams(0xc0, out, st.hold()));
    CHECK(out.empty());
    st.created(0, 0x30, true);
    CHECK_FALSE(st.usable());
    CHECK_FALSE(st.fence_streams(0xc0, out, st.hold()));
}

TEST_CASE("stream_set: a stream destroyed during a synchronize is not forgotten by it", "[fence]") {
    stream_set st;
    std::vector<uint64_t> out;
    st.created(0xc0, 0x10, true);
    st.created(0xc0, 0x11, true);
    CHECK(st.destroyed(0xc0, 0x10));
    CHECK_FALSE(st.destroyed(0xc0, 0x10));  // twice: nothing left (the hook then gives up nothing)
    CHECK_FALSE(st.destroyed(0xc0, 0x99));  // never made through a hook
    CHECK_FALSE(st.fence_streams(0xc0, out, st.hold()));  // 0x10's work: only a sync covers it
    // A sync begins; meanwhile another thread destroys 0x11, whose work may postdate the sync's start.
    const uint64_t seen = st.destroy_count();
    st.destroyed(0xc0, 0x11);
    st.forget_destroyed(0xc0, seen);
    CHECK_FALSE(st.fence_streams(0xc0, out, st.hold()));  // still owed a sync
    // The next sync, with no destruction during it, settles both.
    st.forget_destroyed(0xc0, st.destroy_count());
    CHECK(st.fence_streams(0xc0, out, st.hold()));
    CHECK(out.empty());
}

TEST_CASE("stream_set: a destroyed blocking stream leaves fences usable", "[fence]") {
    // A blocking stream's work is covered by the legacy stream's event even after its
    // destruction: counted as a destroyed non-blocking stream, every release of its context
    // fell back to a context synchronize until the next one.
    stream_set st;
    std::vector<uint64_t> out;
    st.created(0xc0, 0x10, false);
    st.created(0xc0, 0x11, true);
    CHECK(st.destroyed(0xc0, 0x10));
    CHECK(st.fence_streams(0xc0, out, st.hold()));
    CHECK(out == std::vector<uint64_t>{0x11});
}

TEST_CASE("stream_set: a destroyed or reset context takes its streams with it", "[fence]") {
    stream_set st;
    std::vector<uint64_t> out;
    st.created(0xc0, 0x10, true);
    st.created(0xc1, 0x20, true);
    st.forget_context(0xc0);
    CHECK(st.fence_streams(0xc0, out, st.hold()));
    CHECK(out.empty());  // no event on a stream that died with its context
    CHECK(st.fence_streams(0xc1, out, st.hold()));
    CHECK(out == std::vector<uint64_t>{0x20});
    // The handle comes back as a stream of the reset context, and its destruction is its own.
    st.created(0xc0, 0x10, true);
    st.destroyed(0xc0, 0x10);
    CHECK_FALSE(st.fence_streams(0xc0, out, st.hold()));
}

TEST_CASE("fences: an idle non-blocking stream gets no event, a busy one does, and its work is waited for", "[fence]") {
    // PyTorch makes 32 streams per priority at its first side stream; most never run anything.
    fenced f;
    std::vector<uint64_t> idle;
    for (uint64_t s = 0x9000; s < 0x9000 + 64 * 0x10; s += 0x10) {
        f.streams.created(k_ctx, s, true);
        idle.push_back(s);
    }
    const uint64_t a = f.alloc(8 * MiB);
    f.dev.enqueue_work_on(k_stream);  // only the program's stream is busy
    const uint64_t t_work = f.dev.last_ticket();
    f.free(a);
    // No stream was busy at a check yet: the fence is the legacy stream's event, and the 65
    // non-blocking streams are asked once, when a release needs them.
    CHECK(f.dev.records() == 1);
    CHECK(f.dev.stream_queries() == 0);
    const uint64_t b = f.alloc(8 * MiB);  // the legacy event is not reached: a stays pending
    CHECK(b != a);
    CHECK(f.dev.stream_queries() == 0);
    // The legacy event is reached; the side stream's work, enqueued before it, too: the sweep asks
    // every stream once and finds all idle.
    f.dev.complete_all();
    CHECK(t_work <= f.dev.completed());
    CHECK(f.alloc(8 * MiB) == a);
    CHECK(f.dev.stream_queries() == 65);
    for (uint64_t s : idle) CHECK(f.dev.records_on(s) == 0);

    // Work on the side stream after a free whose legacy event is reached: the sweep cannot tell it
    // from work before the free, so it records an event there and the block waits for it.
    f.free(b);
    f.dev.complete_all();
    f.dev.enqueue_work_on(k_stream);
    const uint64_t c = f.alloc(8 * MiB);
    CHECK(c != b);
    CHECK(f.dev.records_on(k_stream) == 1);
    for (uint64_t s : idle) CHECK(f.dev.records_on(s) == 0);
    CHECK(f.pool.pending_bytes() == 8 * MiB);
    // Busy at its last check, the stream is asked at the next fences: an event at once.
    f.free(c);
    CHECK(f.dev.records_on(k_stream) == 2);
    const uint64_t queries = f.dev.stream_queries();
    f.dev.complete_all();
    f.alloc(64 * MiB);  // a miss: both fences are reached, and c's sweeps the 64 others
    CHECK(f.pool.pending_bytes() == 0);
    CHECK(f.dev.stream_queries() == queries + 65);
    // Idle from now on, it stays hot: asked at every record (an event only when busy), so that a
    // sweep never finds it busy with work it cannot date.
    for (int i = 0; i < 10; ++i) {
        const uint64_t before = f.dev.stream_queries();
        f.free(f.alloc(8 * MiB));
        CHECK(f.dev.stream_queries() == before + 1);  // asked at the record (the sweep comes later)
        f.dev.complete_all();
        f.alloc(64 * MiB);  // release it
    }
    CHECK(f.dev.records_on(k_stream) == 2);
    // Destroyed: the next fence cannot be recorded (a stream destroyed since the last sync), so
    // nothing is recorded on it; the next test follows such frees to their synchronize.
    f.streams.destroyed(k_ctx, k_stream);
    f.free(f.alloc(8 * MiB));
    CHECK(f.dev.records_on(k_stream) == 2);
    CHECK(f.dev.sync_calls() == 0);
    CHECK(f.dev.bad_calls() == 0);
}

TEST_CASE("fences: a cold stream still running work from before the free holds the block past the legacy stream's event", "[fence]") {
    // The hazard sweeps must cover: the fence skipped the side stream (never found busy), its
    // legacy event is reached, and the side stream is still reading the block.
    fenced f;
    const uint64_t a = f.alloc(8 * MiB);
    f.dev.stall_stream(k_stream);  // a long copy from a on the side stream, enqueued before the free
    f.free(a);
    CHECK(f.dev.records_on(k_stream) == 0);  // cold: not asked at the fence
    f.dev.complete_all();                    // the legacy stream's event is reached
    f.alloc(64 * MiB);                       // a miss polls the fence: its sweep finds the side stream busy
    CHECK(f.dev.records_on(k_stream) == 1);
    CHECK(f.pool.pending_bytes() == 8 * MiB);  // a waits for that event
    CHECK(f.alloc(8 * MiB) != a);
    const uint64_t c = f.alloc(8 * MiB);
    f.free(c);                               // a later fence asks it at once: it is hot now
    CHECK(f.dev.records_on(k_stream) == 2);
    f.dev.complete_all();
    f.alloc(64 * MiB);
    CHECK(f.pool.pending_bytes() == 16 * MiB);  // still copying: neither comes back
    f.dev.resume_stream(k_stream);           // the copy ends
    f.alloc(64 * MiB);                       // a miss polls the fences: a and c come back
    CHECK(f.pool.pending_bytes() == 0);
    CHECK(f.dev.sync_calls() == 0);
    CHECK(f.dev.event_syncs() == 0);
    CHECK(f.dev.bad_calls() == 0);
}

TEST_CASE("fences: a sweep that cannot cover a stream releases nothing, the release falls back to a synchronize", "[fence]") {
    // fake_backend's clock reaches the legacy stream's event only after all earlier work on every
    // stream, so the side stream's work here comes after it: work a sweep cannot date, which it
    // must treat as work before the free (a real legacy event does not wait for that stream).
    // 40 MiB: a 20 MiB segment and a 16 MiB one, then no room to grow.
    SECTION("the cold stream is destroyed between the fence and its sweep") {
        fenced f(fence_each(), 40 * MiB);
        const uint64_t a = f.alloc(8 * MiB);
        f.free(a);  // the legacy stream's event; k_stream, cold, is left to the sweep
        REQUIRE(f.dev.records() == 1);
        f.dev.complete_all();  // the legacy event is reached
        const uint64_t t = f.dev.enqueue_work_on(k_stream);
        f.streams.destroyed(k_ctx, k_stream);  // its work still runs; nothing can be asked of it
        CHECK(f.alloc(16 * MiB) != a);  // a miss polls the fence: its sweep fails, a segment instead
        CHECK(f.pool.pending_bytes() == 8 * MiB);
        CHECK(f.dev.sync_calls() == 0);
        CHECK(f.alloc(8 * MiB) != a);  // a hit in the first segment's tail
        CHECK(f.dev.completed() < t);
        CHECK(f.alloc(8 * MiB) == a);  // no room to grow: one synchronize releases a
        CHECK(f.dev.sync_calls() == 1);
        CHECK(f.dev.completed() >= t);
        CHECK(f.dev.bad_calls() == 0);
    }
    SECTION("the sweep's record on the busy cold stream fails") {
        fenced f(fence_each(), 40 * MiB);
        const uint64_t a = f.alloc(8 * MiB);
        f.free(a);
        REQUIRE(f.dev.records() == 1);
        f.dev.complete_all();
        const uint64_t t = f.dev.enqueue_work_on(k_stream);
        f.dev.fail_next_records(1);  // the sweep finds k_stream busy; its event there fails
        CHECK(f.alloc(16 * MiB) != a);
        CHECK(f.dev.stream_queries() == 1);  // the sweep ran
        CHECK(f.pool.pending_bytes() == 8 * MiB);
        CHECK(f.alloc(8 * MiB) != a);
        CHECK(f.dev.completed() < t);
        CHECK(f.alloc(8 * MiB) == a);  // no room to grow: a sweep that records, or a sync, first
        CHECK(f.dev.completed() >= t);
        CHECK(f.dev.bad_calls() == 0);
    }
}

TEST_CASE("fences: a miss does not record a new fence while an older one is not reached", "[fence]") {
    // A new fence cannot be reached before an older one (both wait on the legacy stream), so a
    // record at every miss only costs events.
    fenced f;
    std::vector<uint64_t> live;
    for (int i = 0; i < 6; ++i) live.push_back(f.alloc(8 * MiB));
    for (uint64_t p : live) f.free(p);  // one fence per 8 MiB free (the budget's eighth is 4 MiB)
    f.free(f.alloc(2 * MiB));           // under the eighth: not fenced yet
    // 50 MiB pending: over the 32 MiB budget (a miss polls the fences) and under twice it (no wait
    // for the budget); requests over the 50 MiB pending, so no old pending block serves them either.
    const uint64_t fences = f.dev.records();
    for (int i = 0; i < 20; ++i) f.alloc(64 * MiB);  // misses, nothing reached
    CHECK(f.dev.records() == fences);
    CHECK(f.pool.pending_bytes() == 50 * MiB);
    CHECK(f.pool.fence_wait_count() == 0);
    f.dev.complete_all();
    CHECK(f.alloc(8 * MiB) == live[0]);  // a miss: the fences are reached, the 48 MiB come back
    CHECK(f.pool.pending_bytes() <= 2 * MiB);
    CHECK(f.dev.sync_calls() == 0);
}

TEST_CASE("fences: oom events say how many non-blocking streams each fence covers", "[fence]") {
    fenced f(fence_each(), 24 * MiB);
    for (uint64_t s = 0x9000; s < 0x9030; s += 0x10) f.streams.created(k_ctx, s, true);
    f.streams.created(k_ctx, 0xa000, false);  // a blocking stream: the legacy stream's event covers it
    f.alloc(16 * MiB);
    uint64_t p = 0;
    CHECK(f.pool.allocate(16 * MiB, api_id::cuMemAlloc_v2, &p) == k_cuda_oom);
    auto ooms = f.sink.of(ev_kind::oom);
    REQUIRE(ooms.size() == 1);
    CHECK(ooms[0].p.streams == 4);  // k_stream and the three above
}

TEST_CASE("fences: a miss waits for an old pending block's fence rather than grow, never for a recent one", "[fence]") {
    // The GPU runs behind.  Blocks freed long ago (a quarter budget, 8 MiB, of frees after them)
    // are worth a wait: the work queued after their fence keeps the GPU busy meanwhile.
    fenced f;
    const uint64_t a = f.alloc(16 * MiB), b = f.alloc(16 * MiB), c = f.alloc(16 * MiB);
    f.dev.enqueue_work();  // kernels read a, b and c
    f.free(a);
    f.dev.enqueue_work();
    f.free(b);
    f.dev.enqueue_work();
    f.free(c);
    const uint64_t reserved = f.pool.snapshot().reserved;
    CHECK(f.alloc(16 * MiB) == a);  // a's fence waited for: no growth
    CHECK(f.pool.snapshot().reserved == reserved);
    CHECK(f.pool.fence_wait_count() == 1);
    CHECK(f.pool.pending_bytes() == 32 * MiB);  // b and c: the GPU did not run to the end
    CHECK(f.dev.completed() < f.dev.last_ticket());
    CHECK(f.dev.sync_calls() == 0);

    // Only the newest free (x, 24 MiB) serves a 24 MiB request: waiting for it would drain the
    // GPU's queue, so the pool grows instead.
    const uint64_t x = f.alloc(24 * MiB);
    f.dev.enqueue_work();
    f.free(x);
    const uint64_t waits = f.pool.fence_wait_count();
    CHECK(f.alloc(24 * MiB) != x);
    CHECK(f.pool.fence_wait_count() == waits);
}

TEST_CASE("fences: a miss does not wait for a free with less than a quarter budget of frees after it", "[fence]") {
    // "Old" is a quarter of the sync budget (8 MiB) of frees after a block: x has 4 MiB after it,
    // so the GPU's queue after its fence is short, and a wait there would nearly drain it.
    fenced f;
    const uint64_t x = f.alloc(24 * MiB), y = f.alloc(4 * MiB);
    f.dev.enqueue_work();  // kernels read x and y
    f.free(x);
    f.dev.enqueue_work();
    f.free(y);
    const uint64_t waits = f.pool.fence_wait_count();
    CHECK(f.alloc(24 * MiB) != x);  // grown instead
    CHECK(f.pool.fence_wait_count() == waits);
    CHECK(f.pool.pending_bytes() == 28 * MiB);
    CHECK(f.dev.sync_calls() == 0);
}

TEST_CASE("fences: GPUMEM_FENCE_WAIT=any waits for the newest free too, fencing it first, rather than grow", "[fence]") {
    // The second half of the test above, with any: the newest free's fence (recorded by the miss
    // itself under the default batch of four frees) is waited for, and the pool does not grow.
    pool_config cfg = safe_config();
    cfg.wait_any = true;
    fenced f(cfg);
    const uint64_t x = f.alloc(24 * MiB);
    f.dev.enqueue_work();  // a kernel reads x
    f.free(x);
    const uint64_t reserved = f.pool.snapshot().reserved, records = f.dev.records();
    CHECK(f.alloc(24 * MiB) == x);
    CHECK(f.dev.records() > records);  // the fence the free alone did not make
    CHECK(f.pool.fence_wait_count() == 1);
    CHECK(f.dev.completed() == f.dev.last_ticket());  // the wait let the GPU run to the free
    CHECK(f.pool.snapshot().reserved == reserved);
    CHECK(f.dev.sync_calls() == 0);
}

TEST_CASE("fences: a hit that would cut a large free block waits for an old tighter pending block instead", "[fence]") {
    // auto: frees are immediate until the stream appears, so x is free, not pending.
    pool_config cfg = fence_each();
    cfg.reuse = reuse_mode::automatic;
    fenced f(cfg);
    const uint64_t x = f.alloc(100 * MiB), a = f.alloc(16 * MiB), b = f.alloc(16 * MiB), c = f.alloc(16 * MiB);
    f.free(x);
    f.pool.enter_safe_reuse(api_id::cuStreamCreate);
    const uint64_t waits = f.pool.fence_wait_count();  // the switch's drain
    f.dev.enqueue_work();  // kernels read a, b and c
    f.free(a);
    f.free(b);
    f.free(c);
    const uint64_t reserved = f.pool.snapshot().reserved;
    CHECK(f.alloc(16 * MiB) == a);  // not the front of x
    CHECK(f.pool.fence_wait_count() == waits + 1);
    CHECK(f.pool.pending_bytes() == 32 * MiB);  // b and c still wait
    CHECK(f.alloc(100 * MiB) == x);  // x is still whole
    CHECK(f.pool.snapshot().reserved == reserved);
    CHECK(f.dev.sync_calls() == 0);
}

TEST_CASE("fences: a release that merges the block a hit found, then fails, does not leave the hit a stale block", "[fence]") {
    // The hit would cut b (56 MiB free, beside c); a tighter block waits.  The pool's look for it
    // releases c by a reached fence, which merges b into c's block, then the next query fails and
    // so does the synchronize (a broken context): the hit must look again, not take b.
    pool_config cfg = fence_each();
    cfg.reuse = reuse_mode::automatic;
    fenced f(cfg);
    const uint64_t d = f.alloc(12 * MiB), e = f.alloc(12 * MiB);  // segments of their own
    f.free(f.alloc(80 * MiB));                                     // free: one 80 MiB segment
    const uint64_t a = f.alloc(12 * MiB), c = f.alloc(12 * MiB);   // its front; b is the rest
    REQUIRE(c == a + 12 * MiB);
    f.pool.enter_safe_reuse(api_id::cuStreamCreate);
    f.free(c);  // fence 1
    f.dev.complete_all();
    f.dev.enqueue_work_on(k_stream_legacy);  // the side stream stays idle: its sweep adds no event
    f.free(d);  // fence 2, not reached
    f.free(e);
    f.dev.fail_queries_after(1);  // fence 1 answers, fence 2's query fails
    f.dev.set_sync_result(999);
    uint64_t p = 0;
    const int rc = f.pool.allocate(12 * MiB, api_id::cuMemAlloc_v2, &p);
    std::string why;
    CHECK(f.pool.validate(&why));
    INFO(why);
    CHECK(rc == k_cuda_success);
    CHECK(p == c);  // the front of the merged block
}

TEST_CASE("fences: under ordered release a freed stitched block goes back to its lenders once the release that handed it out is done, not the last", "[fence][stitch]") {
    // With the GPU behind, a release comes every few ms and the last one's event is never reached
    // when asked: the dissolve must wait only for the release that handed the block out.
    pool_config cfg = safe_config();
    cfg.order = true;
    cfg.vmm = true;
    cfg.stitch = true;
    fenced f(cfg, 8ull << 30, 2 * MiB);
    std::vector<uint64_t> six;
    for (int i = 0; i < 100; ++i) six.push_back(f.alloc(6 * MiB));
    uint64_t small[4];
    for (auto& s : small) s = f.alloc(512 * 1024);  // one 2 MiB small segment, full
    for (int i = 0; i < 100; ++i)
        if (i % 3) f.free(six[i]);  // 400 MiB free in 12 MiB pieces between live blocks
    f.dev.complete_all();
    f.pool.release_cached();
    const uint64_t big = f.alloc(60 * MiB);  // fits no piece: stitched from them
    uint64_t made = 0, dissolved = 0;
    f.pool.stitch_counts(&made, nullptr, &dissolved);
    REQUIRE(made == 1);
    const uint64_t w1 = f.dev.enqueue_work_on(k_stream_legacy);  // the last kernel on big
    f.free(big);
    const uint64_t r0 = f.pool.ordered_releases();  // releases so far (the set-up's)
    // Each small miss with a small free pending is a release: every pending free, big's too.
    auto release_via_small = [&](int k) {
        f.free(small[k]);
        small[k] = f.alloc(512 * 1024);
    };
    release_via_small(0);  // release 1 hands big out, after w1
    REQUIRE(f.pool.ordered_releases() == r0 + 1);
    f.pool.stitch_counts(nullptr, nullptr, &dissolved);
    CHECK(dissolved == 0);  // w1 still runs on big's range
    const uint64_t w2 = f.dev.enqueue_work_on(k_stream_legacy);
    release_via_small(1);  // release 2, after w2
    REQUIRE(f.pool.ordered_releases() == r0 + 2);
    f.pool.stitch_counts(nullptr, nullptr, &dissolved);
    CHECK(dissolved == 0);
    f.dev.complete_through(w2 - 1);  // release 1's work is done, release 2's is not
    REQUIRE(f.dev.completed() >= w1);
    release_via_small(2);  // release 3: its dissolve looks at release 1's event
    f.pool.stitch_counts(nullptr, nullptr, &dissolved);
    CHECK(dissolved == 1);
    CHECK(f.dev.completed() < w2);  // the last releases' work still runs
    CHECK(f.pool.kept_ranges() == 1);  // its range kept mapped for the next stitch, idle
    CHECK(f.dev.aliases() == 30);
    CHECK(f.dev.event_syncs() == 0);
    CHECK(f.dev.sync_calls() == 0);
    CHECK(f.dev.bad_calls() == 0);
    std::string why;
    CHECK(f.pool.validate(&why));
}

TEST_CASE("fences: release_cached gives back the segments a freed stitched block borrowed from, its ordered release's work still running", "[fence][stitch]") {
    // release_cached is to give back every segment no live block needs.  A freed stitched block
    // handed out by an ordered release whose work still runs keeps its lenders' chunks lent, so
    // their segment is not idle: release_cached must wait for that work (as before any unmap),
    // dissolve the stitched segment, and then give back the lenders' segment too.
    pool_config cfg = safe_config();
    cfg.order = true;
    cfg.vmm = true;
    cfg.stitch = true;
    fenced f(cfg, 8ull << 30, 2 * MiB);
    std::vector<uint64_t> six;
    for (int i = 0; i < 100; ++i) six.push_back(f.alloc(6 * MiB));
    for (int i = 0; i < 100; ++i)
        if (i % 3) f.free(six[i]);  // 400 MiB free in 12 MiB pieces between live blocks
    f.dev.complete_all();
    f.pool.release_cached();
    const uint64_t big = f.alloc(60 * MiB);  // fits no piece: stitched from them
    uint64_t made = 0, dissolved = 0;
    f.pool.stitch_counts(&made, nullptr, &dissolved);
    REQUIRE(made == 1);
    f.dev.enqueue_work_on(k_stream_legacy);  // the last kernel on big, still running
    f.free(big);
    for (int i = 0; i < 100; i += 3) f.free(six[i]);
    const uint64_t releases = f.pool.ordered_releases();
    f.pool.release_cached();
    REQUIRE(f.pool.ordered_releases() == releases + 1);  // every pending free handed out at once
    f.pool.stitch_counts(nullptr, nullptr, &dissolved);
    CHECK(dissolved == 1);
    CHECK(f.dev.aliases() == 0);
    CHECK(f.dev.in_use() == 0);  // the lenders' arena went back too
    CHECK(f.dev.sync_calls() == 0);
    CHECK(f.dev.bad_calls() == 0);
    std::string why;
    CHECK(f.pool.validate(&why));
}

TEST_CASE("fences: make_headroom settles ordered frees whose event was reached by a query, not a wait", "[fence]") {
    pool_config cfg = order_each();
    cfg.vmm = true;
    cfg.headroom = 4 * MiB;
    fenced f(cfg, 512 * MiB, 2 * MiB, false);  // no non-blocking stream: ordered releases
    std::vector<uint64_t> ps;
    fill_pool(f.pool, 8 * MiB, &ps);
    REQUIRE(ps.size() > 8);
    REQUIRE(f.pool.headroom_short());
    f.dev.enqueue_work_on(k_stream_legacy);
    f.free(ps[0]);
    f.free(ps[1]);
    const uint64_t q = f.alloc(8 * MiB);  // a miss: ordered release of both, one handed out
    INFO("ordered releases " << f.pool.ordered_releases());
    REQUIRE(f.pool.ordered_releases() == 1);
    f.dev.complete_all();  // the release's event is reached: the other free block is settled
    f.dev.enqueue_work_on(k_stream_legacy);  // new work, still queued
    f.free(ps[2]);
    f.free(ps[3]);
    REQUIRE(f.pool.pending_bytes() > 0);
    REQUIRE(f.pool.headroom_short());
    const uint64_t es = f.dev.event_syncs(), sc = f.dev.sync_calls(), rel = f.pool.ordered_releases();
    const uint64_t given = f.pool.make_headroom(api_id::cuLaunchKernel);
    CHECK(given >= 2 * MiB);
    CHECK(f.dev.event_syncs() == es);
    CHECK(f.dev.sync_calls() == sc);
    CHECK(f.pool.ordered_releases() == rel);
    CHECK(f.pool.pending_bytes() > 0);
    (void)q;
    std::string why;
    CHECK(f.pool.validate(&why));
}

TEST_CASE("fences: a capture opened during release_cached's wait keeps the kept stitched range mapped", "[fence][stitch]") {
    // A kept stitched range (idle, mapped) and a free under a fence the GPU has not reached:
    // release_cached waits for that fence, and another thread opens a capture right after the
    // wait.  Unmapping the kept range then (cuMemUnmap does not wait) is what a capture forbids.
    pool_config cfg = fence_each();
    cfg.vmm = true;
    cfg.stitch = true;
    fenced f(cfg, 8ull << 30, 2 * MiB, false);  // one event a fence: the wait is one call
    const uint64_t w = f.alloc(20 * MiB);
    std::vector<uint64_t> six;
    for (int i = 0; i < 100; ++i) six.push_back(f.alloc(6 * MiB));
    uint64_t small[4];
    for (auto& s : small) s = f.alloc(512 * 1024);
    for (int i = 0; i < 100; ++i)
        if (i % 3) f.free(six[i]);
    f.dev.complete_all();
    f.pool.release_cached();
    f.free(f.alloc(60 * MiB));  // stitched, then freed
    f.dev.complete_all();
    f.free(small[0]);
    small[0] = f.alloc(512 * 1024);  // a miss: the fence is reached, the stitched segment dissolves
    REQUIRE(f.pool.kept_ranges() == 1);
    REQUIRE(f.dev.aliases() == 30);
    f.dev.enqueue_work();  // a kernel on w
    f.free(w);
    f.dev.capture_after_event_syncs(1);
    f.pool.release_cached();
    CHECK(f.dev.event_syncs() == 1);
    CHECK(f.dev.bad_calls() == 0);
    CHECK(f.pool.kept_ranges() == 1);
    CHECK(f.dev.aliases() == 30);
    f.dev.end_captures();
    f.pool.release_cached();  // now it goes
    CHECK(f.pool.kept_ranges() == 0);
    CHECK(f.dev.aliases() == 0);
    CHECK(f.dev.bad_calls() == 0);
    std::string why;
    CHECK(f.pool.validate(&why));
}
