// Replays the program's allocations from a gpumem log against the pool on the fake device: peak reserved, syncs, segments.
//
// Usage: pool_replay LOG [LOG...]   (pool settings from the usual GPUMEM_* variables)
// Used to tune the pool's policies on real allocation traces recorded on a GPU, without a GPU.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <unordered_map>

#include "core/pool/block_pool.h"
#include "core/pool/fake_backend.h"

using namespace gpumem;

namespace {
struct peak_sink : event_sink {
    uint64_t reserved = 0, peak = 0, syncs = 0, segments = 0;
    void emit(event& e) noexcept override {
        if (e.ev == ev_kind::segment_alloc) reserved += e.b.size, segments++;
        if (e.ev == ev_kind::segment_free) reserved -= e.b.size;
        if (e.ev == ev_kind::pool_sync) syncs++;
        if (reserved > peak) peak = reserved;
    }
};
}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s LOG...\n", argv[0]);
        return 2;
    }
    pool_config cfg = pool_config::from_env();
    for (int a = 1; a < argc; ++a) {
        std::ifstream in(argv[a]);
        if (!in) {
            fprintf(stderr, "%s: cannot open\n", argv[a]);
            return 2;
        }
        fake_backend dev;
        peak_sink sink;
        block_pool pool(cfg, dev, &sink, 0);
        std::unordered_map<std::string, uint64_t> mine;  // logged ptr -> replayed ptr
        uint64_t live = 0, peak_live = 0, n = 0;
        std::string line;
        while (std::getline(in, line)) {
            // GPUMEM_REUSE=auto: the recorded program created a stream here, so the replay switches too.
            if (line.find("\"ev\":\"reuse_safe\"") != std::string::npos) pool.enter_safe_reuse(api_id::cuStreamCreate);
            if (line.find("\"pooled\":true") == std::string::npos) continue;  // the program's pooled calls only
            nlohmann::json e = nlohmann::json::parse(line, nullptr, false);
            if (e.is_discarded()) continue;
            std::string ev = e["ev"];
            if (ev == "alloc") {
                uint64_t p = 0;
                if (pool.allocate(e["size"], api_id::cuMemAlloc_v2, &p) != 0) {
                    fprintf(stderr, "replay allocation failed at seq %llu\n", (unsigned long long)e["seq"].get<uint64_t>());
                    return 1;
                }
                mine[e["ptr"]] = p;
                live += e["size"].get<uint64_t>();
                peak_live = std::max(peak_live, live);
                n++;
            } else if (ev == "free") {
                auto it = mine.find(e["ptr"]);
                if (it == mine.end()) continue;
                int r = 0;
                pool.deallocate(it->second, api_id::cuMemFree_v2, &r);
                live -= e["size"].get<uint64_t>();
                mine.erase(it);
            }
        }
        printf("%s: reuse %s at the end, %llu allocs, peak requested %.1f MiB, peak reserved %.1f MiB (x%.3f), %llu segments, %llu syncs\n",
               argv[a], pool.reuse_is_immediate() ? "immediate" : "safe", (unsigned long long)n, peak_live / 1048576.0, sink.peak / 1048576.0,
               peak_live ? double(sink.peak) / double(peak_live) : 0.0, (unsigned long long)sink.segments,
               (unsigned long long)sink.syncs);
    }
    return 0;
}
