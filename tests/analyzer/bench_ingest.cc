// Ingestion benchmark: writes a synthetic pool-on log, times splitting, parsing (fast path, simdjson, nlohmann), full analysis.
#include <unistd.h>

#include <time.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "analyze.h"
#include "log_reader.h"

using namespace gpumem::analysis;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// CPU time of this process: on a shared machine it says what one core does, wall time does not.
double cpu_now() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + double(ts.tv_nsec) / 1e9;
}

// A caching-allocator-like workload: 2 MiB segments cut into 64 KiB slots; each alloc takes a free
// slot's start with a 512-byte-rounded size, each free releases a random live block.
uint64_t write_log(const std::string& path, uint64_t n_events) {
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (!f) {
        std::perror(path.c_str());
        std::exit(2);
    }
    std::fprintf(f, "{\"ev\":\"header\",\"format\":\"gpumem-events\",\"version\":1,\"pid\":1,\"ppid\":0,\"host\":\"bench\","
                    "\"rank\":\"0\",\"cmdline\":[\"bench\"],\"start_unix_ns\":0,\"start_time\":\"1970-01-01T00:00:00Z\","
                    "\"devices\":[{\"index\":0,\"name\":\"bench\",\"total\":150000000000}],\"config\":{\"pool\":\"on\",\"reuse\":\"immediate\"},"
                    "\"gpumem_version\":\"bench\"}\n");
    std::mt19937_64 rng(42);
    const uint64_t seg_size = 2 << 20, slot = 64 << 10, slots_per_seg = seg_size / slot, n_segs = 512;
    const uint64_t base = 0x7f0000000000;
    std::vector<uint64_t> free_slots, live_slots;
    std::vector<uint64_t> live_size(n_segs * slots_per_seg, 0);
    uint64_t seq = 0, t = 1000;
    for (uint64_t s = 0; s < n_segs; ++s) {
        std::fprintf(f, "{\"ev\":\"segment_alloc\",\"seq\":%" PRIu64 ",\"t\":%" PRIu64 ",\"tid\":7,\"dev\":0,\"api\":\"cuMemAlloc_v2\",\"ptr\":\"0x%" PRIx64 "\",\"size\":%" PRIu64 ",\"pool\":\"large\"}\n",
                     seq++, t += 150, base + s * seg_size, seg_size);
        for (uint64_t k = 0; k < slots_per_seg; ++k) free_slots.push_back(s * slots_per_seg + k);
    }
    std::shuffle(free_slots.begin(), free_slots.end(), rng);
    while (seq < n_events) {
        bool do_alloc = live_slots.empty() || (!free_slots.empty() && (rng() % 100) < 50);
        t += 80 + rng() % 200;
        if (do_alloc) {
            uint64_t s = free_slots.back();
            free_slots.pop_back();
            uint64_t size = 1 + rng() % slot;
            uint64_t asize = (size + 511) / 512 * 512;
            live_size[s] = size;
            live_slots.push_back(s);
            uint64_t ptr = base + s * slot, seg = base + (s / slots_per_seg) * seg_size;
            std::fprintf(f, "{\"ev\":\"alloc\",\"seq\":%" PRIu64 ",\"t\":%" PRIu64 ",\"tid\":7,\"dev\":0,\"api\":\"cudaMalloc\",\"kind\":\"device\",\"ptr\":\"0x%" PRIx64 "\",\"size\":%" PRIu64 ",\"asize\":%" PRIu64 ",\"seg\":\"0x%" PRIx64 "\",\"pooled\":true}\n",
                         seq++, t, ptr, size, asize, seg);
        } else {
            size_t i = rng() % live_slots.size();
            uint64_t s = live_slots[i];
            live_slots[i] = live_slots.back();
            live_slots.pop_back();
            free_slots.push_back(s);
            uint64_t size = live_size[s], asize = (size + 511) / 512 * 512;
            uint64_t ptr = base + s * slot, seg = base + (s / slots_per_seg) * seg_size;
            std::fprintf(f, "{\"ev\":\"free\",\"seq\":%" PRIu64 ",\"t\":%" PRIu64 ",\"tid\":7,\"dev\":0,\"api\":\"cudaFree\",\"kind\":\"device\",\"ptr\":\"0x%" PRIx64 "\",\"size\":%" PRIu64 ",\"asize\":%" PRIu64 ",\"seg\":\"0x%" PRIx64 "\",\"pooled\":true}\n",
                         seq++, t, ptr, size, asize, seg);
        }
    }
    std::fprintf(f, "{\"ev\":\"end\",\"seq\":%" PRIu64 ",\"t\":%" PRIu64 ",\"tid\":7,\"reason\":\"exit\",\"events\":%" PRIu64 ",\"n_alloc\":0,\"n_free\":0,\"n_fail\":0,\"live_allocs\":%zu,\"live_bytes\":0,\"lost\":0,\"unmatched\":0}\n",
                 seq, t + 100, seq, live_slots.size());
    std::fclose(f);
    return seq + 1;
}

}  // namespace

int main(int argc, char** argv) {
    uint64_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 5000000;
    const char* tmp = std::getenv("TMPDIR");
    std::string path = std::string(tmp ? tmp : "/tmp") + "/gpumem_bench_" + std::to_string(::getpid()) + ".jsonl";
    if (argc > 2) path = argv[2];
    auto t0 = std::chrono::steady_clock::now();
    uint64_t events = write_log(path, n);
    std::ifstream sz(path, std::ios::ate | std::ios::binary);
    double mb = double(sz.tellg()) / 1e6;
    std::printf("log: %s, %" PRIu64 " events, %.0f MB (written in %.1f s)\n", path.c_str(), events, mb, seconds_since(t0));

    {  // 1. reading and splitting lines only
        t0 = std::chrono::steady_clock::now();
        double c0 = cpu_now();
        line_source src(path);
        std::string_view line;
        bool complete;
        uint64_t k = 0;
        while (src.next(line, complete)) k += line.size();
        double s = seconds_since(t0), cpu = cpu_now() - c0;
        std::printf("read+split lines     : %6.2f s wall %6.2f s cpu  %6.2f M events/s (cpu)  %6.0f MB/s\n", s, cpu, double(events) / cpu / 1e6, mb / cpu);
    }
    // 2. Parse of every line into a log_event: as the analysis does it (the recorder-shape fast
    // path, simdjson for other lines), then simdjson on-demand alone for comparison.
    for (bool json_only : {false, true}) {
        t0 = std::chrono::steady_clock::now();
        double c0 = cpu_now();
        line_source src(path);
        line_parser parser;
        std::string_view line;
        bool complete;
        log_event e;
        std::string err;
        src.next(line, complete);  // header
        uint64_t bad = 0;
        while (src.next(line, complete)) {
            size_t cap = src.capacity_from(line.data());
            parse_status st = json_only ? parser.parse_json(line.data(), line.size(), cap, e, err)
                                        : parser.parse(line.data(), line.size(), cap, e, err);
            bad += st != parse_status::ok;
        }
        double s = seconds_since(t0), cpu = cpu_now() - c0;
        std::printf("%s: %6.2f s wall %6.2f s cpu  %6.2f M events/s (cpu)  (%" PRIu64 " bad)\n",
                    json_only ? "simdjson parse only  " : "line parse (fast)    ", s, cpu, double(events) / cpu / 1e6, bad);
    }
    {  // 3. nlohmann parse of the first million lines (it is the slow one; a sample is enough)
        t0 = std::chrono::steady_clock::now();
        double c0 = cpu_now();
        line_source src(path);
        std::string_view line;
        bool complete;
        uint64_t k = 0, sum = 0;
        src.next(line, complete);
        while (k < 1000000 && src.next(line, complete)) {
            auto j = nlohmann::json::parse(line);
            sum += j.value("size", uint64_t(0));
            std::string ptr = j.value("ptr", std::string());
            sum += ptr.size();
            ++k;
        }
        double s = seconds_since(t0), cpu = cpu_now() - c0;
        std::printf("nlohmann parse       : %6.2f s wall %6.2f s cpu  %6.2f M events/s (cpu)  (%" PRIu64 " lines sampled)\n", s, cpu, double(k) / cpu / 1e6, k);
    }
    {  // 4. the full analysis: parse, reconstruct, metrics, snapshots
        t0 = std::chrono::steady_clock::now();
        double c0 = cpu_now();
        analyze_options opt;
        process_report r = analyze_file(path, opt);
        double s = seconds_since(t0), cpu = cpu_now() - c0;
        std::printf("full analysis        : %6.2f s wall %6.2f s cpu  %6.2f M events/s (cpu)  (peak allocated %" PRIu64 " bytes, max frag %.3f)\n", s,
                    cpu, double(events) / cpu / 1e6, r.devices.empty() ? 0 : r.devices[0].allocated.peak,
                    r.devices.empty() ? 0.0 : r.devices[0].max_external_fragmentation);
    }
    if (argc <= 2) std::remove(path.c_str());
    return 0;
}
