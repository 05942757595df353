// Replays the program's allocations from a gpumem log against the pool on the fake device: peak reserved, syncs, segments.
//
// Usage: pool_replay LOG [LOG...]   (pool settings from the usual GPUMEM_* variables)
// Used to tune the pool's policies on real allocation traces recorded on a GPU, without a GPU.
// POOL_REPLAY_LAG_US=L: fences instead of syncs (events on), and a GPU that runs L microseconds of
// the log's time behind the program: the work enqueued at log time t is done at t + L.  The work
// runs on the legacy stream; POOL_REPLAY_STREAMS=N (default 1) idle non-blocking streams exist
// besides (PyTorch makes 32 per priority at its first side stream).  POOL_REPLAY_CAPACITY=M: a device of
// M MiB.  It prints the pool's driver calls per allocation (event records, queries,
// waits), the host-side cost that safe reuse adds, and what the peak is made of (allocated,
// pending and free bytes, and the request that made it).  POOL_REPLAY_HUGE_MIB=T: requests of T MiB
// and more go to a second pool on the same device whose chunks are POOL_REPLAY_HUGE_CHUNK_MIB (8 by
// default), each rounded up to a whole chunk so that no chunk holds two blocks: what a third pool of
// larger handles would save stitching (docs/benchmarks.md, "A pool of 8 MiB handles for large requests");
// POOL_REPLAY_HUGE_BUDGET_MIB=B sends them there only while the rounding live blocks hold stays within B.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <string>
#include <unordered_map>

#include "core/pool/block_pool.h"
#include "core/pool/fake_backend.h"
#include "core/pool/stream_set.h"

using namespace gpumem;

namespace {
struct peak_sink : event_sink {
    uint64_t syncs = 0, segments = 0, seg_bytes = 0, unmap_bytes = 0;
    void emit(event& e) noexcept override {
        if (e.ev == ev_kind::segment_alloc) segments++, seg_bytes += e.b.size;
        if (e.ev == ev_kind::segment_unmap) unmap_bytes += e.b.size;
        if (e.ev == ev_kind::pool_sync) syncs++;
    }
};
}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s LOG...\n", argv[0]);
        return 2;
    }
    pool_config cfg = pool_config::from_env();
    if (!cfg.warnings.empty()) fprintf(stderr, "%s", cfg.warnings.c_str());  // a setting not taken says so
    for (int a = 1; a < argc; ++a) {
        std::ifstream in(argv[a]);
        if (!in) {
            fprintf(stderr, "%s: cannot open\n", argv[a]);
            return 2;
        }
        fake_backend dev;
        peak_sink sink;
        dev.set_vmm(2ull << 20);  // the H200's granularity; GPUMEM_POOL_VMM decides whether the pool uses it
        // POOL_REPLAY_CAPACITY=MiB: a device that holds only that much, to see what the pool pays
        // where the program's peak is near the device's memory (its out-of-memory path at work).
        if (const char* cap = std::getenv("POOL_REPLAY_CAPACITY"); cap && *cap) dev.set_capacity(std::strtoull(cap, nullptr, 10) << 20);
        block_pool pool(cfg, dev, &sink, 0);
        const char* huge_env = std::getenv("POOL_REPLAY_HUGE_MIB");
        const uint64_t huge = huge_env && *huge_env ? std::strtoull(huge_env, nullptr, 10) << 20 : UINT64_MAX;
        pool_config huge_cfg = cfg;
        const char* huge_chunk = std::getenv("POOL_REPLAY_HUGE_CHUNK_MIB");
        huge_cfg.chunk = (huge_chunk && *huge_chunk ? std::strtoull(huge_chunk, nullptr, 10) : 8) << 20;
        block_pool pool2(huge_cfg, dev, &sink, 0);  // unused (no request) without POOL_REPLAY_HUGE_MIB
        const char* budget_env = std::getenv("POOL_REPLAY_HUGE_BUDGET_MIB");
        const uint64_t huge_budget = budget_env && *budget_env ? std::strtoull(budget_env, nullptr, 10) << 20 : UINT64_MAX;
        std::unordered_map<uint64_t, uint64_t> in_pool2;  // replayed pointers pool2 serves -> bytes its rounding adds
        uint64_t rounding = 0, max_rounding = 0, at_peak_rounding = 0;  // held by live blocks of pool2
        const char* lag_env = std::getenv("POOL_REPLAY_LAG_US");
        const bool lagged = lag_env && *lag_env;
        const uint64_t lag_ns = lagged ? std::strtoull(lag_env, nullptr, 10) * 1000 : 0;
        stream_set streams;
        std::deque<std::pair<uint64_t, uint64_t>> work;  // (log time, ticket) not yet done
        if (lagged) {
            dev.enable_events(true);
            dev.set_auto_complete(false);
            const char* ns = std::getenv("POOL_REPLAY_STREAMS");
            const uint64_t n_streams = ns && *ns ? std::strtoull(ns, nullptr, 10) : 1;
            for (uint64_t k = 0; k < n_streams; ++k) streams.created(1, 0x5000 + 0x10 * k, true);
            pool.set_streams(&streams, 1);
            pool2.set_streams(&streams, 1);
        }
        std::unordered_map<std::string, uint64_t> mine;  // logged ptr -> replayed ptr
        uint64_t live = 0, peak_live = 0, n = 0, peak_reserved = 0;
        pool_state at_peak{};
        uint64_t at_peak_pending = 0, at_peak_request = 0;
        std::string line;
        while (std::getline(in, line)) {
            // GPUMEM_REUSE=auto: the recorded program created a stream here, so the replay switches too.
            if (line.find("\"ev\":\"reuse_safe\"") != std::string::npos) {
                pool.enter_safe_reuse(api_id::cuStreamCreate);
                pool2.enter_safe_reuse(api_id::cuStreamCreate);
            }
            if (line.find("\"pooled\":true") == std::string::npos) continue;  // the program's pooled calls only
            nlohmann::json e = nlohmann::json::parse(line, nullptr, false);
            if (e.is_discarded()) continue;
            std::string ev = e["ev"];
            if (lagged) {
                // The program enqueues work at every call; the GPU finishes what is L old.
                const uint64_t t = e.value("t", uint64_t{0});
                while (!work.empty() && work.front().first + lag_ns <= t) {
                    dev.complete_through(work.front().second);
                    work.pop_front();
                }
                work.emplace_back(t, dev.enqueue_work_on(k_stream_legacy));
            }
            if (ev == "alloc") {
                uint64_t p = 0;
                const uint64_t size = e["size"].get<uint64_t>();
                // POOL_REPLAY_HUGE_BUDGET_MIB=B: a request goes to pool2 only while the rounding its
                // live blocks hold stays within B, so that the promise is off by at most B.
                const uint64_t c2 = huge_cfg.chunk, extra = (size + c2 - 1) / c2 * c2 - size;
                const bool to2 = size >= huge && rounding + extra <= huge_budget;
                if ((to2 ? pool2 : pool).allocate(to2 ? size + extra : size, api_id::cuMemAlloc_v2, &p) != 0) {
                    fprintf(stderr, "replay allocation failed at seq %llu\n", (unsigned long long)e["seq"].get<uint64_t>());
                    return 1;
                }
                mine[e["ptr"]] = p;
                if (to2) {
                    in_pool2[p] = extra;
                    rounding += extra;
                    max_rounding = std::max(max_rounding, rounding);
                }
                // The pool's own count: segment_alloc/free alone miss VMM unmaps.  At each new peak,
                // what it is made of: where a policy change would have to save.
                pool_state st = pool.snapshot();
                const pool_state st2 = pool2.snapshot();
                st.reserved += st2.reserved;
                st.allocated += st2.allocated;
                st.requested += st2.requested;
                st.free_blocks += st2.free_blocks;
                st.largest_free = std::max(st.largest_free, st2.largest_free);
                if (st.reserved > peak_reserved) {
                    peak_reserved = st.reserved;
                    at_peak = st;
                    at_peak_pending = pool.pending_bytes() + pool2.pending_bytes();
                    at_peak_rounding = rounding;
                    at_peak_request = e["size"].get<uint64_t>();
                }
                live += e["size"].get<uint64_t>();
                peak_live = std::max(peak_live, live);
                n++;
            } else if (ev == "free") {
                auto it = mine.find(e["ptr"]);
                if (it == mine.end()) continue;
                int r = 0;
                auto r2 = in_pool2.find(it->second);
                const bool two = r2 != in_pool2.end();
                if (two) {
                    rounding -= r2->second;
                    in_pool2.erase(r2);
                }
                (two ? pool2 : pool).deallocate(it->second, api_id::cuMemFree_v2, &r);
                live -= e["size"].get<uint64_t>();
                mine.erase(it);
            }
        }
        printf("%s: reuse %s at the end, %llu allocs, peak requested %.1f MiB, peak reserved %.1f MiB (x%.3f), %llu segments, %llu syncs\n",
               argv[a], pool.reuse_is_immediate() ? "immediate" : "safe", (unsigned long long)n, peak_live / 1048576.0, peak_reserved / 1048576.0,
               peak_live ? double(peak_reserved) / double(peak_live) : 0.0, (unsigned long long)sink.segments,
               (unsigned long long)sink.syncs);
        const double M = 1048576.0;
        printf("  at the peak: %.0f MiB allocated (requested %.0f, the request that made the peak %.0f), %.0f MiB pending, "
               "%.0f MiB free in %llu blocks (largest %.0f MiB)\n",
               at_peak.allocated / M, at_peak.requested / M, at_peak_request / M, at_peak_pending / M,
               (at_peak.reserved - at_peak.allocated - at_peak_pending) / M, (unsigned long long)at_peak.free_blocks,
               at_peak.largest_free / M);
        printf("  driver: %llu segment allocs, %llu segment frees, %llu chunk maps, %llu chunk unmaps; "
               "%.0f MiB in new segments, %.0f MiB unmapped\n",
               (unsigned long long)dev.alloc_calls(), (unsigned long long)dev.free_calls(),
               (unsigned long long)dev.map_calls(), (unsigned long long)dev.unmap_calls(),
               sink.seg_bytes / 1048576.0, sink.unmap_bytes / 1048576.0);
        // What a real driver would charge per chunk and per look (docs/benchmarks.md, "What each
        // virtual-memory call costs"): near the device's memory the out-of-memory path pays these.
        const block_pool::driver_tally t = pool.chunk_driver();
        printf("  the pool's chunk calls: %llu chunks mapped (%llu of them moved: given back and mapped again "
               "without a release), %llu maps refused for memory (%llu chunks made and unmade by them), %llu not "
               "tried (too little free), %llu chunks unmapped, %llu looks at the driver's free memory\n",
               (unsigned long long)t.mapped, (unsigned long long)t.moved, (unsigned long long)t.refused,
               (unsigned long long)dev.undone_chunks(), (unsigned long long)t.foreseen, (unsigned long long)t.unmapped,
               (unsigned long long)t.looks);
        uint64_t made = 0, stitched = 0, dissolved = 0, reused = 0;
        pool.stitch_counts(&made, &stitched, &dissolved, &reused);
        if (huge != UINT64_MAX) {
            uint64_t m2 = 0, s2 = 0, d2 = 0, r2 = 0;
            pool2.stitch_counts(&m2, &s2, &d2, &r2);
            printf("  requests from %llu MiB up, in %llu MiB chunks: %llu chunks mapped, %llu stitched segments (%llu chunks mapped for "
                   "them); the other requests' pool: %llu chunks mapped, %llu stitched segments (%llu chunks)\n",
                   (unsigned long long)(huge >> 20), (unsigned long long)(huge_cfg.chunk >> 20),
                   (unsigned long long)pool2.chunk_driver().mapped, (unsigned long long)m2, (unsigned long long)s2,
                   (unsigned long long)t.mapped, (unsigned long long)made, (unsigned long long)stitched);
            printf("  bytes the rounding to whole chunks added to live blocks: %.1f MiB at the peak, %.1f MiB at most\n",
                   at_peak_rounding / 1048576.0, max_rounding / 1048576.0);
        }
        if (made || huge != UINT64_MAX)  // the device-wide alias counts, whichever pool stitched
            printf("  stitching: %llu stitched segments (%llu on a kept range), %llu chunks mapped for them (%.0f MiB), "
                   "%llu alias chunk maps, %llu alias chunk unmaps, %llu dissolved\n",
                   (unsigned long long)made, (unsigned long long)reused, (unsigned long long)stitched,
                   double(stitched * pool.chunk_size()) / 1048576.0, (unsigned long long)dev.alias_chunks(),
                   (unsigned long long)dev.alias_unmapped_chunks(), (unsigned long long)dissolved);
        if (lagged)
            printf("  GPU %llu us behind: per allocation %.3f event records, %.3f event queries, %.3f stream queries, %.4f waits (%llu waits, %llu context syncs)\n",
                   (unsigned long long)(lag_ns / 1000), double(dev.records()) / double(n ? n : 1),
                   double(dev.queries()) / double(n ? n : 1), double(dev.stream_queries()) / double(n ? n : 1), double(dev.event_syncs()) / double(n ? n : 1),
                   (unsigned long long)dev.event_syncs(), (unsigned long long)dev.sync_calls());
        if (pool.ordered_releases() || pool.order_stopped())
            printf("  ordered releases (GPUMEM_FENCE_WAIT=order): %llu, %llu stream waits (%.3f per allocation)%s\n",
                   (unsigned long long)pool.ordered_releases(), (unsigned long long)dev.stream_waits(),
                   double(dev.stream_waits()) / double(n ? n : 1), pool.order_stopped() ? "; stopped (a stream busy with the program's work, or a failed call)" : "");
    }
    return 0;
}
