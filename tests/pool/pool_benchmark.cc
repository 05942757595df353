// Benchmark: median ns of one alloc+free pair served from the pool's cache, event included.
//
// Usage: pool_benchmark [safe|fences|alone|immediate|both|all] [vmm] [HOLD_MIB]   (default both: safe and
// immediate; HOLD_MIB, default 0: live memory held in 64 MiB blocks, as a training program holds
// its weights, which sizes the sync budget and so the fence batches).  POOL_BENCH_SIZE=N: that
// size only.  POOL_BENCH_LAG_PAIRS=L: an event is reached L pairs after its record, as a real
// GPU reaches one on an idle stream some microseconds after it (default 0: at once).
// Each size is warmed up first (segments taken, steady state reached), then timed in batches of
// 256 pairs; the median batch average is printed.  safe: the synchronize fallback (a backend
// without events; the amortized synchronize is free on the fake device).  fences: safe with events
// and one non-blocking stream, as after auto's switch in a real program: the steady state
// includes recording a fence (2 events) per eighth of the budget and polling fences at a miss;
// the fake device reaches every event at once.  alone: events but no stream, as GPUMEM_REUSE=safe
// in a program that makes none (static_cudart_app bench): a miss that pending frees could serve is
// one ordered release, an event record and no query.  vmm: segments on virtual memory (2 MiB chunks).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/pool/block_pool.h"
#include "core/pool/fake_backend.h"
#include "core/pool/stream_set.h"

using namespace gpumem;

namespace {

// Stands in for the event log: touches the event as the real one would copy it.
struct counting_sink final : event_sink {
    std::atomic<uint64_t> n{0};
    uint64_t sum = 0;
    uint64_t pool_syncs = 0;  // fence (or sync) releases: one per batch of frees
    void emit(event& e) noexcept override {
        e.seq = n.fetch_add(1, std::memory_order_relaxed);
        if (e.ev == ev_kind::pool_sync) ++pool_syncs;
        sum += e.b.ptr ^ e.b.size;
    }
};

double median_pair_ns(reuse_mode mode, bool fences, bool vmm, uint64_t size, uint64_t hold_mib, bool alone = false) {
    fake_backend dev;
    counting_sink sink;
    pool_config cfg = pool_config::from_env();  // GPUMEM_SYNC_BUDGET, GPUMEM_FENCE_BATCH, ... apply here too
    cfg.reuse = mode;
    cfg.vmm = vmm;
    if (vmm) dev.set_vmm(2 << 20);
    block_pool pool(cfg, dev, &sink, 0);
    stream_set streams;
    if (fences) {
        dev.enable_events(true);
        if (!alone) streams.created(0xc0, 0x5000, true);
        pool.set_streams(&streams, 0xc0);
    }
    std::vector<uint64_t> held(hold_mib / 64);
    for (auto& h : held) pool.allocate(64ull << 20, api_id::cuMemAlloc_v2, &h);
    // A few long-lived neighbours, so the pair is not alone in its segment.
    uint64_t keep[4];
    for (auto& k : keep) pool.allocate(size, api_id::cuMemAlloc_v2, &k);
    const char* lag_env = std::getenv("POOL_BENCH_LAG_PAIRS");
    const size_t lag = lag_env ? std::strtoull(lag_env, nullptr, 10) : 0;
    std::vector<uint64_t> tickets(lag + 1, 0);
    size_t at = 0;
    if (lag) dev.set_auto_complete(false);
    auto pair = [&] {
        uint64_t p = 0;
        int rc = 0;
        pool.allocate(size, api_id::cuMemAlloc_v2, &p);
        pool.deallocate(p, api_id::cuMemFree_v2, &rc);
        if (lag) {
            tickets[at] = dev.last_ticket();
            at = (at + 1) % tickets.size();
            dev.complete_through(tickets[at]);  // what was recorded L pairs ago
        }
    };
    for (int i = 0; i < 20000; ++i) pair();  // warm-up: reach the steady state
    constexpr int k_batch = 256, k_batches = 400;
    std::vector<double> per_pair;
    per_pair.reserve(k_batches);
    for (int b = 0; b < k_batches; ++b) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < k_batch; ++i) pair();
        const auto t1 = std::chrono::steady_clock::now();
        per_pair.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / k_batch);
    }
    std::nth_element(per_pair.begin(), per_pair.begin() + k_batches / 2, per_pair.end());
    // Per pair, the driver calls a real device charges for (0.26-0.46 us each on the H200; a wait
    // is the event's latency on an idle GPU, microseconds).
    const double pairs = 20000.0 + double(k_batch) * k_batches;
    std::printf("  %-9s %10llu B  %7.1f ns/pair   (syncs %llu, per pair: %.3f event records, %.3f event queries, "
                "%.3f stream queries, %.4f waits; segments taken %llu, events %llu, pool_sync %llu)\n",
                mode == reuse_mode::safe ? (fences ? (alone ? "alone" : "fences") : "safe") : "immediate", (unsigned long long)size,
                per_pair[k_batches / 2], (unsigned long long)dev.sync_calls(), double(dev.records()) / pairs,
                double(dev.queries()) / pairs, double(dev.stream_queries()) / pairs, double(dev.event_syncs()) / pairs,
                (unsigned long long)(dev.alloc_calls() + dev.map_calls()), (unsigned long long)sink.n.load(),
                (unsigned long long)sink.pool_syncs);
    return per_pair[k_batches / 2];
}

}  // namespace

int main(int argc, char** argv) {
    const char* which = argc > 1 ? argv[1] : "both";
    const bool vmm = argc > 2 && !std::strcmp(argv[2], "vmm");
    const uint64_t hold_mib = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 0;
    const char* only = std::getenv("POOL_BENCH_SIZE");
    const uint64_t sizes[] = {512, 4096, 64 << 10, 1 << 20, 2 << 20, 8 << 20, 20 << 20};
    std::printf("pool hit: median ns per alloc+free pair (fake device, counting sink%s, %llu MiB held)\n",
                vmm ? ", virtual memory" : "", (unsigned long long)hold_mib);
    const bool all = !std::strcmp(which, "all");
    const bool both = !std::strcmp(which, "both");
    struct { const char* name; reuse_mode mode; bool fences, in_both, alone; } modes[] = {
        {"safe", reuse_mode::safe, false, true, false}, {"fences", reuse_mode::safe, true, false, false},
        {"alone", reuse_mode::safe, true, false, true}, {"immediate", reuse_mode::immediate, false, true, false}};
    for (const auto& m : modes) {
        if (!all && !(both && m.in_both) && std::strcmp(which, m.name)) continue;
        for (uint64_t s : sizes)
            if (!only || std::strtoull(only, nullptr, 10) == s) median_pair_ns(m.mode, m.fences, vmm, s, hold_mib, m.alone);
    }
    return 0;
}
