// Real H200 logs (tests/data/h200) checked against what PyTorch itself reported in the same process.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "analyze.h"
#include "test_util.h"

using namespace gpumem::analysis;
using namespace gpumem::test;

namespace {

// What tests/gpu/workloads.py wrote: memory_reserved(), memory_allocated(), memory_stats() keys and
// every live tensor's (data_ptr, nbytes), read just before os._exit(0), i.e. at the log's end.
struct torch_stats {
    uint64_t reserved = 0, allocated = 0, segment_count = 0;
    uint64_t alloc_calls = 0, free_calls = 0;  // num_device_alloc / num_device_free
    std::map<uint64_t, uint64_t> tensors;      // data_ptr -> nbytes
};

torch_stats read_stats(const std::string& rel) {
    std::ifstream f(data_path(rel));
    REQUIRE(f.good());
    nlohmann::json j = nlohmann::json::parse(f);
    torch_stats s;
    s.reserved = j.at("reserved").get<uint64_t>();
    s.allocated = j.at("allocated").get<uint64_t>();
    s.segment_count = j.at("segment_count").get<uint64_t>();
    s.alloc_calls = j.at("alloc_calls").get<uint64_t>();
    s.free_calls = j.at("free_calls").get<uint64_t>();
    for (const auto& t : j.at("tensors")) s.tensors[t.at(0).get<uint64_t>()] = t.at(1).get<uint64_t>();
    return s;
}

// Every allocation live at the end is listed, not only the largest few, so each tensor can be found.
process_report analyze_all_live(const std::string& rel) {
    analyze_options opt;
    opt.max_listed_leaks = SIZE_MAX;
    return analyze_file(data_path(rel), opt);
}

const device_report& gpu0(const process_report& r) {
    for (const device_report& d : r.devices)
        if (d.dev == 0) return d;
    FAIL("no device 0 in " << r.file);
    return r.devices.front();
}

// The row of one API; PyTorch's allocator calls cudaMalloc, while libraries that link their own
// static cudart (cuBLAS, cuDNN) reach the driver as cuMemAlloc_v2 and are not PyTorch's.
const usage_row& api_row(const device_report& d, const std::string& api) {
    for (const usage_row& r : d.by_api)
        if (r.name == api) return r;
    FAIL("no api row " << api);
    return d.by_api.front();
}

std::string joined(const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& w : v) s += w + "\n";
    return s;
}

}  // namespace

// With PyTorch's caching allocator every cudaMalloc is one segment it keeps until exit: the live
// cudaMalloc bytes are memory_reserved() and their number is segment.all.current.  With gpumem's pool
// on, each such cudaMalloc is one pooled block; the same equalities must hold.
TEST_CASE("h200: live cudaMalloc bytes and count equal PyTorch's reserved and segment_count", "[h200]") {
    for (const char* name : {"torch-default-pool-off", "torch-default-pool-on"}) {
        INFO(name);
        torch_stats s = read_stats(std::string("h200/") + name + ".stats.json");
        process_report r = analyze_all_live(std::string("h200/") + name + ".jsonl");
        INFO(joined(r.warnings));
        CHECK(r.n_warnings == 0);
        CHECK(r.has_end);
        CHECK(r.end_reason == "_exit");
        const device_report& d = gpu0(r);
        const usage_row& cm = api_row(d, "cudaMalloc");
        CHECK(cm.bytes.current == s.reserved);
        CHECK(cm.live == s.segment_count);
        CHECK(cm.n_alloc == s.alloc_calls);
        CHECK(cm.n_free == s.free_calls);
        // PyTorch's allocated bytes live inside its reserved segments.
        CHECK(s.allocated <= cm.bytes.current);
        // The leak list agrees with the row: every live cudaMalloc, summed.
        uint64_t listed = 0, n = 0;
        for (const block_view& b : d.leaks)
            if (b.api == "cudaMalloc") {
                listed += b.size;
                ++n;
            }
        CHECK(listed == s.reserved);
        CHECK(n == s.segment_count);
        CHECK(d.n_leaks == r.end_live_allocs);
    }
}

// No caching + pool on: every tensor is its own cudaMalloc, i.e. one pooled block.
TEST_CASE("h200: with no caching, every live tensor is a live cudaMalloc block of its size", "[h200]") {
    torch_stats s = read_stats("h200/torch-nocache-pool-on.stats.json");
    process_report r = analyze_all_live("h200/torch-nocache-pool-on.jsonl");
    INFO(joined(r.warnings));
    CHECK(r.n_warnings == 0);
    REQUIRE(r.pool_mode == "on");
    const device_report& d = gpu0(r);
    REQUIRE(d.leaks.size() == d.n_leaks);  // all listed
    CHECK(d.n_leaks == r.end_live_allocs);

    std::map<uint64_t, const block_view*> live;
    for (const block_view& b : d.leaks) live[b.ptr] = &b;
    REQUIRE(!s.tensors.empty());
    uint64_t tensor_blocks = 0;
    for (const auto& [ptr, nbytes] : s.tensors) {
        INFO("tensor at " << ptr << ", " << nbytes << " bytes");
        auto it = live.find(ptr);
        REQUIRE(it != live.end());
        const block_view& b = *it->second;
        CHECK(b.api == "cudaMalloc");
        CHECK(b.pooled);
        CHECK(b.size >= nbytes);
        CHECK(b.size - nbytes < 512);
        CHECK(b.asize >= b.size);
        tensor_blocks += b.size;
    }
    // The report's end bytes of cudaMalloc are exactly the live cudaMalloc blocks: the tensors'
    // blocks plus those no tensor points at.  The latter is one 32 MiB block: the cuBLAS workspace,
    // which PyTorch allocates through its own allocator (so cudaMalloc here) and holds in no tensor.
    uint64_t all_blocks = 0, other = 0, n_other = 0;
    for (const block_view& b : d.leaks) {
        if (b.api != "cudaMalloc") continue;
        all_blocks += b.size;
        if (!s.tensors.count(b.ptr)) {
            other += b.size;
            ++n_other;
        }
    }
    const usage_row& cm = api_row(d, "cudaMalloc");
    CHECK(cm.bytes.current == all_blocks);
    CHECK(cm.live == s.tensors.size() + n_other);
    CHECK(all_blocks == tensor_blocks + other);
    CHECK(n_other == 1);
    CHECK(other == 32u << 20);
    // PyTorch holds nothing of its own with caching off.
    CHECK(s.reserved == 0);
    CHECK(s.segment_count == 0);
}

// A two-stream training loop with the pool on: the log must replay cleanly and its metrics be sane.
TEST_CASE("h200: the two-stream training log replays cleanly with sane metrics", "[h200]") {
    process_report r = analyze_file(data_path("h200/torch-2stream-train-pool-on.jsonl"), {});
    INFO(joined(r.warnings));
    CHECK(r.n_warnings == 0);
    CHECK(r.has_end);
    CHECK(r.pool_mode == "on");
    CHECK(r.n_pool_sync > 0);
    CHECK(r.lost == 0);
    const device_report& d = gpu0(r);
    CHECK(d.n_pool_sync == r.n_pool_sync);
    CHECK(d.n_alloc > 1000);
    CHECK(d.n_free > 1000);
    CHECK(d.n_oom == 0);
    // The recorder's own count of live allocations covers every device; one is pinned host memory
    // (cuMemHostAlloc, reported under dev -1).
    uint64_t live = 0;
    for (const device_report& x : r.devices) live += x.n_leaks;
    CHECK(live == r.end_live_allocs);
    // Fragmentation is a fraction.
    CHECK(d.max_external_fragmentation >= 0.0);
    CHECK(d.max_external_fragmentation <= 1.0);
    CHECK(d.end_external_fragmentation >= 0.0);
    CHECK(d.end_external_fragmentation <= d.max_external_fragmentation);
    CHECK(d.end_largest_free <= d.end_free_in_segments);
    // Peaks: requested <= allocated <= reserved at every moment, so also at their peaks; no current
    // value exceeds its peak; the peak snapshot is the state at the allocated peak.
    CHECK(d.requested.peak <= d.allocated.peak);
    CHECK(d.allocated.peak <= d.reserved.peak);
    for (const tracked_bytes* t : {&d.requested, &d.allocated, &d.reserved, &d.segment_count, &d.pending})
        CHECK(t->current <= t->peak);
    REQUIRE(d.at_peak.valid);
    CHECK(d.at_peak.allocated == d.allocated.peak);
    CHECK(d.at_peak.seq == d.allocated.peak_seq);
    CHECK(d.at_peak.requested <= d.at_peak.allocated);
    CHECK(d.at_peak.allocated <= d.at_peak.reserved);
    CHECK(d.at_peak.reserved <= d.reserved.peak);
    CHECK(d.at_peak.largest_free <= d.at_peak.free_in_segments);
    // The time series keeps maxima, so its highest point is each peak.
    REQUIRE(!d.timeline.empty());
    uint64_t req = 0, alloc = 0, res = 0;
    double frag = 0;
    for (const time_point& p : d.timeline) {
        req = std::max(req, p.requested_max);
        alloc = std::max(alloc, p.allocated_max);
        res = std::max(res, p.reserved_max);
        frag = std::max(frag, p.frag_max);
        CHECK(p.frag_max >= 0.0);
        CHECK(p.frag_max <= 1.0);
    }
    CHECK(req == d.requested.peak);
    CHECK(alloc == d.allocated.peak);
    CHECK(res == d.reserved.peak);
    CHECK(frag == Approx(d.max_external_fragmentation));
    // Segments are the pool's, in its two classes; their count peaked where the log says.
    CHECK(d.segment_count.peak >= 1);
    CHECK(d.n_segment_alloc >= d.segment_count.peak);
}
