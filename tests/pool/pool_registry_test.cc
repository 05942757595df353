// Unit tests of the preload's policy, moved into the core: the context registry and GPUMEM_REUSE=auto's switch, on fake_backend.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "core/pool/pool_registry.h"
#include "core/pool/reuse_switch.h"
#include "pool_test_util.h"

using namespace gpumem;
using namespace gpumem::test;

namespace {

// Hands out fake devices; the "current device" is whatever the test says.
struct fake_factory final : pool_registry::backend_factory {
    int device = 0;
    int made = 0, rebinds = 0;
    uint64_t last_rebind = 0;
    std::vector<std::unique_ptr<fake_backend>> backends;
    int current_device() noexcept override { return device; }
    pool_backend* make_backend(uint64_t, int) noexcept override {
        ++made;
        backends.push_back(std::make_unique<fake_backend>());
        return backends.back().get();
    }
    void rebind(pool_backend&, uint64_t ctx) noexcept override {
        ++rebinds;
        last_rebind = ctx;
    }
    // The registry deletes a backend only when making its pool failed, never here.
};

struct fixture {
    fake_factory factory;
    recording_sink sink;
    pool_config cfg;  // the default: auto
    pool_registry* reg = new pool_registry(factory);
    fixture() { reg->configure(&cfg, &sink); }
    // The preload never frees a pool (late frees must find it); a test does, for the leak checker.
    ~fixture() {
        for (int i = 0; i < pool_registry::k_max_pools; ++i) delete reg->at(i).pool;
        delete reg;
    }
};

uint64_t alloc(block_pool& p, uint64_t size) {
    uint64_t ptr = 0;
    REQUIRE(p.allocate(size, api_id::cuMemAlloc_v2, &ptr) == k_cuda_success);
    return ptr;
}

}  // namespace

TEST_CASE("registry: one pool per context, found again without a lock", "[registry]") {
    fixture f;
    CHECK(f.reg->find_or_create(0) == nullptr);  // no context: the call passes through
    auto* a = f.reg->find_or_create(0x1000);
    REQUIRE(a);
    CHECK(f.reg->find(0x1000) == a);
    CHECK(f.reg->find_or_create(0x1000) == a);
    f.factory.device = 1;
    auto* b = f.reg->find_or_create(0x2000);
    REQUIRE(b);
    CHECK(b != a);
    CHECK(b->device == 1);
    CHECK(f.reg->count() == 2);
    CHECK(f.factory.made == 2);
    CHECK(f.reg->find(0x3000) == nullptr);

    const uint64_t p = alloc(*b->pool, 4096);
    block_pool::block_info bi{};
    CHECK(f.reg->owner_of(p, &bi) == b);
    CHECK(bi.block == p);
    CHECK(f.reg->owner_of(1, nullptr) == nullptr);
}

// A pool's lock may be held long on another thread (a device wait; a green context's pool through
// the driver's whole cuGreenCtxDestroy: pool_hooks.cc, primary_released_by).  A walk over every
// pool (a pointer query, a free of another pool's block) must not wait for it where the address
// is none of its, and must where it is.
TEST_CASE("registry: owner_of passes over a busy pool whose segments do not hold the address, and waits for one whose do", "[registry]") {
    fixture f;
    auto* a = f.reg->find_or_create(0x1000);
    auto* b = f.reg->find_or_create(0x2000);
    REQUIRE(a);
    REQUIRE(b);
    const uint64_t x = alloc(*a->pool, 1000);  // a's small segment (each fake device starts at k_base)
    alloc(*b->pool, 1000);                     // b's, at the same addresses
    const uint64_t y = alloc(*b->pool, 3 * MiB);  // b's large segment: none of a's
    REQUIRE(a->pool->holds(y) == 0);
    REQUIRE(a->pool->holds(x + 4096) == 1);
    std::atomic<int> held{0}, release{0};
    std::thread holder([&] {
        auto lk = a->pool->hold();
        held.store(1);
        while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    while (!held.load()) std::this_thread::yield();
    // Asked on a third thread, so that a walk that waits for a's lock fails the case, not hangs it.
    block_pool::block_info bi{};
    pool_registry::slot *of_y = nullptr, *of_1 = a;
    std::atomic<int> passed{0};
    std::thread walker([&] {
        of_y = f.reg->owner_of(y, &bi);
        of_1 = f.reg->owner_of(1, nullptr);
        passed.store(1);
    });
    for (int i = 0; i < 2000 && !passed.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const bool while_held = passed.load() == 1;
    if (!while_held) release.store(1);
    walker.join();
    REQUIRE(while_held);  // a passed over, its lock still held
    CHECK(of_y == b);
    CHECK(bi.block == y);
    CHECK(of_1 == nullptr);
    int rc = -1;
    CHECK_FALSE(a->pool->deallocate(y, api_id::cuMemFree_v2, &rc, true));
    CHECK(rc == -1);
    // Inside a's segment: the walk waits for a's lock (a comes first), then finds a's block.
    std::atomic<int> done{0};
    pool_registry::slot* found = nullptr;
    std::thread asker([&] {
        found = f.reg->owner_of(x + 4096, nullptr);
        done.store(1);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(done.load() == 0);
    release.store(1);
    holder.join();
    asker.join();
    CHECK(found == a);
}

TEST_CASE("registry: without settings no pool is made", "[registry]") {
    fake_factory factory;
    pool_registry reg(factory);
    CHECK(reg.find_or_create(0x1000) == nullptr);
    CHECK(factory.made == 0);
}

TEST_CASE("registry: a retired context's slot stops matching and is reused for its device", "[registry]") {
    fixture f;
    auto* a = f.reg->find_or_create(0x1000);
    REQUIRE(a);
    alloc(*a->pool, 4096);
    CHECK(f.reg->retire(0x1000));
    CHECK_FALSE(f.reg->retire(0x1000));
    CHECK(f.reg->find(0x1000) == nullptr);
    CHECK(f.sink.count(ev_kind::context_reset) == 1);
    CHECK(a->pool->snapshot().reserved == 0);  // forgotten without a backend call
    CHECK(f.factory.backends[0]->free_calls() == 0);

    f.factory.device = 5;  // another device does not take the retired slot
    auto* other = f.reg->find_or_create(0x1000);
    REQUIRE(other);
    CHECK(other != a);
    CHECK(f.reg->retire(0x1000));

    f.factory.device = 0;  // the handle value comes back for device 0: the first slot serves it
    auto* again = f.reg->find_or_create(0x7000);
    CHECK(again == a);
    CHECK(f.factory.rebinds == 1);
    CHECK(f.factory.last_rebind == 0x7000);
    CHECK(f.factory.made == 2);
}

TEST_CASE("registry: each pool's events name its number among its device's pools, kept by a reused slot", "[registry]") {
    // docs/log-format.md, "ctx": a reader tells two contexts' pools on one device apart by it.
    fixture f;
    auto* a = f.reg->find_or_create(0x1000);   // device 0's first pool
    auto* b = f.reg->find_or_create(0x2000);   // its second
    f.factory.device = 1;
    auto* c = f.reg->find_or_create(0x3000);   // device 1's first
    f.factory.device = 0;
    auto* d = f.reg->find_or_create(0x4000);   // device 0's third
    REQUIRE((a && b && c && d));
    auto ctx_of_segments = [&](block_pool& p) {
        const size_t from = f.sink.events.size();
        alloc(p, 4096);
        std::vector<int> out;
        for (size_t i = from; i < f.sink.events.size(); ++i)
            if (f.sink.events[i].ev == ev_kind::segment_alloc || f.sink.events[i].ev == ev_kind::alloc)
                out.push_back(f.sink.events[i].dev * 100 + f.sink.events[i].ctx);
        return out;
    };
    CHECK(ctx_of_segments(*a->pool) == std::vector<int>{0, 0});
    CHECK(ctx_of_segments(*b->pool) == std::vector<int>{1, 1});
    CHECK(ctx_of_segments(*c->pool) == std::vector<int>{100, 100});
    CHECK(ctx_of_segments(*d->pool) == std::vector<int>{2, 2});
    // A context's end: its context_reset names its pool; the slot's next context keeps the number.
    CHECK(f.reg->retire(0x2000));
    REQUIRE(f.sink.events.back().ev == ev_kind::context_reset);
    CHECK(f.sink.events.back().ctx == 1);
    auto* again = f.reg->find_or_create(0x5000);
    CHECK(again == b);
    CHECK(ctx_of_segments(*again->pool) == std::vector<int>{1, 1});
    // The switch to safe reuse: one reuse_safe per pool, each with its own number.
    f.reg->switch_all_to_safe(api_id::cuStreamCreate);
    std::vector<int> switched;
    for (const event& e : f.sink.events)
        if (e.ev == ev_kind::reuse_safe) switched.push_back(e.dev * 100 + e.ctx);
    std::sort(switched.begin(), switched.end());
    CHECK(switched == std::vector<int>{0, 1, 2, 100});
}

TEST_CASE("registry: the table holds 64 contexts, the 65th passes through", "[registry]") {
    fixture f;
    for (uint64_t i = 1; i <= pool_registry::k_max_pools; ++i) REQUIRE(f.reg->find_or_create(i << 12));
    bool full = false;
    CHECK(f.reg->find_or_create(0x999000, &full) == nullptr);
    CHECK(full);
    CHECK(f.reg->count() == pool_registry::k_max_pools);
}

TEST_CASE("registry: the switch reaches present and future pools once, drains included", "[registry]") {
    fixture f;
    auto* a = f.reg->find_or_create(0x1000);
    auto* empty = f.reg->find_or_create(0x2000);
    REQUIRE(a);
    REQUIRE(empty);
    const uint64_t p = alloc(*a->pool, 4096);
    CHECK(a->pool->reuse_is_immediate());
    CHECK_FALSE(f.reg->switched());

    f.reg->switch_all_to_safe(api_id::cuStreamCreate);
    CHECK(f.reg->switched());
    CHECK(f.reg->switched_by() == api_id::cuStreamCreate);
    CHECK_FALSE(a->pool->reuse_is_immediate());
    CHECK_FALSE(empty->pool->reuse_is_immediate());
    CHECK(f.factory.backends[0]->sync_calls() == 1);  // the drain of the pool that holds memory
    CHECK(f.factory.backends[1]->sync_calls() == 0);  // a pool without memory skips it
    CHECK(f.sink.count(ev_kind::reuse_safe) == 2);

    f.reg->switch_all_to_safe(api_id::cuStreamCreateWithPriority);  // once
    CHECK(f.sink.count(ev_kind::reuse_safe) == 2);
    CHECK(f.reg->switched_by() == api_id::cuStreamCreate);

    // A pool made afterwards starts in safe reuse: reuse_safe is its first event.
    const size_t before = f.sink.events.size();
    auto* later = f.reg->find_or_create(0x3000);
    REQUIRE(later);
    CHECK_FALSE(later->pool->reuse_is_immediate());
    REQUIRE(f.sink.events.size() == before + 1);
    CHECK(f.sink.events[before].ev == ev_kind::reuse_safe);

    // A freed block now waits: it is pending, not free.
    int rc = -1;
    REQUIRE(a->pool->deallocate(p, api_id::cuMemFree_v2, &rc));
    CHECK(a->pool->pending_bytes() > 0);

    f.reg->reset_after_fork();
    CHECK(f.reg->count() == 0);
    CHECK_FALSE(f.reg->switched());
}

TEST_CASE("auto switch: one blocking stream keeps the order, a second, or any non-blocking one, ends it", "[registry]") {
    SECTION("blocking streams") {
        fixture f;
        reuse_switch sw(*f.reg);
        sw.stream_created(api_id::cuStreamCreate, false, false);
        CHECK_FALSE(sw.switched());
        sw.stream_created(api_id::cuStreamCreateWithPriority, false, false);
        CHECK(sw.switched());
        CHECK(f.reg->switched_by() == api_id::cuStreamCreateWithPriority);
    }
    SECTION("a non-blocking stream, first") {
        fixture f;
        reuse_switch sw(*f.reg);
        sw.stream_created(api_id::cuGreenCtxCreate, true, false);
        CHECK(sw.switched());
        CHECK(f.reg->switched_by() == api_id::cuGreenCtxCreate);
    }
    SECTION("from inside gpumem's own code the switch waits for the next pool call") {
        fixture f;
        auto* a = f.reg->find_or_create(0x1000);
        REQUIRE(a);
        reuse_switch sw(*f.reg);
        sw.stream_created(api_id::per_thread_stream, true, true);
        CHECK_FALSE(sw.switched());
        CHECK(a->pool->reuse_is_immediate());
        sw.settle_deferred();
        CHECK(sw.switched());
        CHECK(f.reg->switched_by() == api_id::per_thread_stream);
        CHECK_FALSE(a->pool->reuse_is_immediate());
    }
    SECTION("a fork child starts over") {
        fixture f;
        reuse_switch sw(*f.reg);
        sw.stream_created(api_id::cuStreamCreate, false, false);
        sw.reset_after_fork();
        f.reg->reset_after_fork();
        sw.stream_created(api_id::cuStreamCreate, false, false);  // the child's first blocking stream
        CHECK_FALSE(sw.switched());
    }
}

TEST_CASE("auto switch: threads racing to switch all return after the one drain", "[registry]") {
    fixture f;
    auto* a = f.reg->find_or_create(0x1000);
    REQUIRE(a);
    alloc(*a->pool, 4096);
    reuse_switch sw(*f.reg);
    std::vector<std::thread> ts;
    std::atomic<int> saw_unswitched{0};
    for (int i = 0; i < 8; ++i)
        ts.emplace_back([&] {
            sw.stream_created(api_id::cuStreamCreate, true, false);
            if (!sw.switched() || a->pool->reuse_is_immediate()) ++saw_unswitched;
        });
    for (auto& t : ts) t.join();
    CHECK(saw_unswitched == 0);
    CHECK(f.factory.backends[0]->sync_calls() == 1);
    CHECK(f.sink.count(ev_kind::reuse_safe) == 1);
}
