// Hand-computed scenarios: known peaks, fragmentation, OOM verdicts, leaks and the reconstruction
// of pools, VMM and pool-off logs, checked number by number against analyze_file.
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "analyze.h"
#include "cli_input.h"  // parse_moment, --at's argument
#include "log_reader.h"
#include "metrics/sites.h"
#include "report_output.h"
#include "test_util.h"

using namespace gpumem;
using namespace gpumem::analysis;
using namespace gpumem::test;

namespace {
const device_report& device(const process_report& r, int dev) {
    for (const device_report& d : r.devices)
        if (d.dev == dev) return d;
    FAIL("no device " << dev);
    return r.devices.front();
}
bool has_warning(const process_report& r, const std::string& text) {
    for (const std::string& w : r.warnings)
        if (w.find(text) != std::string::npos) return true;
    return false;
}
}  // namespace

// tests/data/golden/pool_fragmentation.jsonl, by hand:
//   one 2 MiB segment; A = 500000 B in a 512 KiB block, B = 512 KiB, C = 1000000 B in a 1 MiB block
//   fill it exactly (peak at seq 3); freeing A then C leaves free gaps of 512 KiB and 1 MiB:
//   fragmentation 1 - 1 MiB / 1.5 MiB = 1/3; a 1200000 B request then fails with 1.5 MiB free but
//   only 1 MiB contiguous -> "fragmentation"; D = 100000 B in 128 KiB at the segment start leaves
//   gaps 384 KiB and 1 MiB: 1 - 1 MiB / 1.375 MiB = 3/11.
TEST_CASE("pool scenario: peaks, fragmentation, OOM verdict and leaks", "[scenario]") {
    process_report r = analyze_file(data_path("golden/pool_fragmentation.jsonl"), {});
    REQUIRE(r.devices.size() == 1);
    const device_report& d = r.devices[0];
    CHECK(r.pool_mode == "on");
    CHECK(r.has_end);
    CHECK(r.n_warnings == 0);  // the pool's own stats line agrees with the reconstruction
    CHECK(d.requested.peak == 500000 + 524288 + 1000000);
    CHECK(d.requested.peak_seq == 3);
    CHECK(d.allocated.peak == 2097152);
    CHECK(d.allocated.peak_seq == 3);
    CHECK(d.allocated.peak_t == 4000);
    CHECK(d.reserved.peak == 2097152);
    CHECK(d.reserved.peak_seq == 0);
    CHECK(d.segment_count.peak == 1);
    CHECK(d.max_external_fragmentation == Approx(1.0 / 3.0));
    CHECK(d.max_external_fragmentation_seq == 5);
    CHECK(d.end_external_fragmentation == Approx(3.0 / 11.0));
    CHECK(d.end_free_in_segments == 393216 + 1048576);
    CHECK(d.end_largest_free == 1048576);
    CHECK(d.end_free_blocks == 2);
    CHECK(d.requested.current == 624288);
    CHECK(d.allocated.current == 655360);
    // At the peak the segment is full: no free space, rounding overhead 1 - 2024288 / 2097152.
    REQUIRE(d.at_peak.valid);
    CHECK(d.at_peak.seq == 3);
    CHECK(d.at_peak.free_in_segments == 0);
    CHECK(d.at_peak.live_allocs == 3);
    CHECK(d.rounding_overhead_at_peak() == Approx(1.0 - 2024288.0 / 2097152.0));
    CHECK(d.reserved_unallocated_at_peak() == Approx(0.0));
    REQUIRE(d.at_peak.largest_live.size() == 3);
    CHECK(d.at_peak.largest_live[0].ptr == 0x1100000);
    // The pool's oom and the program's alloc_fail are one OOM.
    CHECK(d.n_oom == 1);
    CHECK(d.n_alloc_fail == 1);
    REQUIRE(d.ooms.size() == 1);
    CHECK(d.ooms[0].verdict == "fragmentation");
    CHECK(d.ooms[0].free_in_segments == 1572864);
    CHECK(d.ooms[0].largest_free == 1048576);
    CHECK(d.ooms[0].err == 2);
    REQUIRE(d.ooms[0].map.valid);
    REQUIRE(d.ooms[0].map.segment_map.size() == 1);
    CHECK(d.ooms[0].map.segment_map[0].blocks.size() == 1);
    CHECK(d.n_leaks == 2);
    CHECK(d.leaked_bytes == 624288);
    CHECK(d.leaks[0].ptr == 0x1080000);
    CHECK(d.n_alloc == 4);
    CHECK(d.n_free == 2);
}

// tests/data/golden/pool_off_kinds.jsonl: every memory kind, VMM, an unknown free, an unknown kind.
TEST_CASE("pool-off scenario: kinds, VMM physical bytes, host memory and unknown frees", "[scenario]") {
    process_report r = analyze_file(data_path("golden/pool_off_kinds.jsonl"), {});
    REQUIRE(r.devices.size() == 2);
    const device_report& d = device(r, 0);
    // Peak at seq 5: 4 MiB device + 1 MiB managed + 3000 B pitched (4096 set aside) + 2 MiB vmm.
    CHECK(d.requested.peak == 4194304 + 1048576 + 3000 + 2097152);
    CHECK(d.allocated.peak == 4194304 + 1048576 + 4096 + 2097152);
    CHECK(d.reserved.peak == d.allocated.peak);  // pool off: what is held from the driver
    CHECK(d.requested.peak_seq == 5);
    CHECK(d.requested.current == 1048576 + 3000);
    CHECK(d.max_external_fragmentation == 0);
    CHECK(d.mapped.peak == 2097152);
    CHECK(d.mapped.current == 0);
    CHECK(d.n_map == 1);
    CHECK(d.n_unmap == 1);
    CHECK(d.n_oom == 1);
    REQUIRE(d.ooms.size() == 1);
    CHECK(d.ooms[0].verdict == "capacity");
    CHECK(d.n_leaks == 2);
    bool saw_vmm = false, saw_managed = false;
    for (const usage_row& k : d.by_kind) {
        if (k.name == "vmm") {
            saw_vmm = true;
            CHECK(k.bytes.peak == 2097152);
            CHECK(k.n_free == 1);
        }
        if (k.name == "managed") {
            saw_managed = true;
            CHECK(k.bytes.current == 1048576);
        }
    }
    CHECK(saw_vmm);
    CHECK(saw_managed);
    const device_report& host = device(r, -1);
    CHECK(host.requested.peak == 65536);
    CHECK(host.requested.current == 0);
    CHECK(host.n_unknown_free == 1);
    CHECK(r.va_reserved.peak == 8388608);
    CHECK(r.va_reserved.current == 0);
    CHECK(r.skipped_unknown == 1);
    CHECK(r.n_warnings == 0);
}

TEST_CASE("a killed run: truncated last line and no end line are warnings", "[scenario]") {
    process_report r = analyze_file(data_path("golden/killed_truncated.jsonl"), {});
    CHECK(r.truncated_last_line);
    CHECK_FALSE(r.has_end);
    CHECK(has_warning(r, "killed_truncated.jsonl:5: the last line is cut short"));
    CHECK(has_warning(r, "no end line"));
    const device_report& d = device(r, 0);
    CHECK(d.requested.peak == 3145728);
    CHECK(d.n_leaks == 1);
    CHECK(d.leaked_bytes == 2097152);
}

TEST_CASE("a running job's log, opened while its writer is mid-line: the warning does not say it died", "[scenario]") {
    // A log still being written is read as it stood when opened (line_source): its last line may be
    // cut short with the process alive, so the warning names both causes and claims neither.
    std::string log = std::string(k_header_off) + alloc_line(0, 0x1000, 4096);
    log += alloc_line(1, 0x2000, 4096).substr(0, 30);
    temp_file f(log);
    process_report r = analyze_file(f.path, {});
    CHECK(r.truncated_last_line);
    CHECK(has_warning(r, ":3: the last line is cut short (the log is still being written, or its writer stopped in "
                         "mid-line); ignored"));
    for (const std::string& w : r.warnings) CHECK(w.find("died") == std::string::npos);
    CHECK(device(r, 0).requested.peak == 4096);
}

TEST_CASE("a last line without newline that still parses is used", "[scenario]") {
    std::string log = std::string(k_header_off) + alloc_line(0, 0x1000, 4096) + end_line(1, 1);
    log.pop_back();  // drop the final newline
    temp_file f(log);
    process_report r = analyze_file(f.path, {});
    CHECK(r.has_end);
    CHECK(has_warning(r, "no newline"));
}

TEST_CASE("several ranks: combined peaks and imbalance", "[scenario]") {
    std::vector<process_report> ps;
    ps.push_back(analyze_file(data_path("golden/rank0.jsonl"), {}));
    ps.push_back(analyze_file(data_path("golden/rank1.jsonl"), {}));
    combined_report c = combine(ps);
    REQUIRE(c.rows.size() == 2);
    CHECK(c.rows[0].dev == 0);
    CHECK(c.rows[1].dev == 1);
    CHECK(c.max_peak_reserved == 3221225472ull);
    CHECK(c.min_peak_reserved == 1073741824ull);
    CHECK(c.imbalance == Approx(0.5));  // 3 GiB / mean 2 GiB - 1
}

TEST_CASE("the peak map from a second pass equals the one taken inline", "[scenario]") {
    // A rising sawtooth makes a new peak every few events: the budget-free run copies the state
    // each time, the zero-budget run must fall back to a second pass and find the same moment.
    std::string log = k_header_on;
    uint64_t seq = 0;
    const uint64_t seg = 0x10000000, seg_size = 64 << 20;
    log += seg_line("segment_alloc", seq++, seg, seg_size);
    std::vector<uint64_t> live;
    uint64_t cursor = seg;
    for (int i = 0; i < 400; ++i) {
        for (int k = 0; k < 3; ++k) {
            log += pooled_line("alloc", seq++, cursor, 4000, 4096, seg);
            live.push_back(cursor);
            cursor += 4096;
        }
        log += pooled_line("free", seq++, live[live.size() - 2], 4000, 4096, seg);
        live.erase(live.end() - 2);
    }
    for (uint64_t p : live) log += pooled_line("free", seq++, p, 4000, 4096, seg);
    log += end_line(seq);
    temp_file f(log);
    analyze_options inline_opt;
    inline_opt.snapshot_budget_fixed = UINT64_MAX / 4;
    analyze_options forced;
    forced.snapshot_budget_per_event = 0;
    forced.snapshot_budget_fixed = 0;
    process_report a = analyze_file(f.path, inline_opt), b = analyze_file(f.path, forced);
    const state_snapshot& x = a.devices[0].at_peak;
    const state_snapshot& y = b.devices[0].at_peak;
    REQUIRE(x.valid);
    REQUIRE(y.valid);
    CHECK(a.devices[0].allocated.peak == 801 * 4096);  // 3 allocs then 1 free, 400 times
    CHECK(x.allocated == 801 * 4096);
    CHECK(y.seq == x.seq);
    CHECK(y.allocated == x.allocated);
    CHECK(y.live_allocs == 801);
    CHECK(y.free_in_segments == x.free_in_segments);
    CHECK(y.free_blocks == x.free_blocks);
    CHECK(y.segment_map.size() == 1);
    CHECK(y.segment_map[0].blocks == x.segment_map[0].blocks);
}

TEST_CASE("a map written with dev -1 (recorders before 2026-12-06) is on its handle's device", "[scenario]") {
    // The same log with its map and unmap as the recorder wrote them: cuMemMap names no device.
    // They made a "dev -1" section of maps alone, and --torch-snapshot left every mapping out.
    std::ifstream in(data_path("golden/pool_off_kinds.jsonl"));
    std::stringstream ss;
    ss << in.rdbuf();
    std::string log = ss.str();
    for (const char* ev : {"\"ev\":\"map\"", "\"ev\":\"unmap\""}) {
        size_t at = log.find(ev);
        REQUIRE(at != std::string::npos);
        size_t d = log.find("\"dev\":0", at);
        REQUIRE(d != std::string::npos);
        log.replace(d, 7, "\"dev\":-1");
    }
    temp_file f(log);
    process_report r = analyze_file(f.path, {});
    const device_report& d = device(r, 0);
    CHECK(d.n_map == 1);
    CHECK(d.n_unmap == 1);
    CHECK(d.mapped.peak == 2097152);
    for (const device_report& x : r.devices)
        if (x.dev < 0) CHECK(x.n_map == 0);
}

// The pool's OOM of `request` bytes in one 8 MiB cuMemAlloc segment with 2 MiB live at 0 and at
// 4 MiB (4 MiB free in two 2 MiB blocks) and `gpu_free` (1 MiB) free on the GPU; the OOM as reported.
static oom_report oom_in_two_holes(uint64_t request, uint64_t gpu_free = 1 << 20) {
    const uint64_t seg = 0x40000000, MiB = 1 << 20;
    const std::string log = std::string(k_header_on) + seg_line("segment_alloc", 0, seg, 8 * MiB) +
                            pooled_line("alloc", 1, seg, 2 * MiB, 2 * MiB, seg) +
                            pooled_line("alloc", 2, seg + 4 * MiB, 2 * MiB, 2 * MiB, seg) +
                            oom_line(3, request, {8 * MiB, 4 * MiB, 4 * MiB, 2 * MiB, 2, 1}, gpu_free, 9 * MiB) + end_line(4, 2);
    temp_file f(log);
    process_report r = analyze_file(f.path, {});
    REQUIRE(r.devices[0].ooms.size() == 1);
    return r.devices[0].ooms[0];
}

TEST_CASE("OOM verdicts on a pool of cuMemAlloc segments: all free memory together is the line between capacity and fragmentation", "[scenario]") {
    // 4 MiB free in the segment and 1 MiB on the GPU (oom_in_two_holes).  5 MiB would fit in all of
    // it together: fragmentation.  One byte more does not fit anywhere: capacity.
    const uint64_t MiB = 1 << 20;
    auto verdict = [&](uint64_t request) {
        oom_report o = oom_in_two_holes(request);
        CHECK(o.free_in_segments == 4 * MiB);
        return o.verdict;
    };
    CHECK(verdict(5 * MiB) == "fragmentation");
    CHECK(verdict(5 * MiB + 1) == "capacity");
    CHECK(verdict(3 * MiB) == "fragmentation");
}

TEST_CASE("the timeline stays bounded and keeps the peak", "[scenario]") {
    // One spike, at several places: compaction merges points pairwise, and a maximum kept from
    // one side only would lose a spike that lands in the other (each series is checked).
    for (int spike : {1777, 1778, 1901, 2306}) {
        INFO("spike at allocation " << spike);
        std::string log = k_header_off;
        uint64_t seq = 0;
        for (int i = 0; i < 3000; ++i) {
            uint64_t size = i == spike ? 999999 : 1000;
            log += alloc_line(seq++, 0x1000 + uint64_t(i) * 0x100000, size);
            log += free_line(seq++, 0x1000 + uint64_t(i) * 0x100000, size);
        }
        log += end_line(seq);
        temp_file f(log);
        process_report r = analyze_file(f.path, {});
        const device_report& d = r.devices[0];
        CHECK(d.timeline.size() <= k_timeline_points);
        CHECK(d.timeline.size() >= k_timeline_points / 2);
        uint64_t req = 0, alloc = 0, res = 0;
        for (const time_point& p : d.timeline) {
            req = std::max(req, p.requested_max);
            alloc = std::max(alloc, p.allocated_max);
            res = std::max(res, p.reserved_max);
        }
        CHECK(req == 999999);
        CHECK(d.requested.peak == 999999);
        CHECK(d.requested.peak_seq == uint64_t(2 * spike));
        CHECK(alloc == d.allocated.peak);
        CHECK(res == d.reserved.peak);
        CHECK(res >= 999999);
    }
}

TEST_CASE("after lost events, inconsistencies are warnings, not errors", "[scenario]") {
    std::string log = std::string(k_header_off) + alloc_line(0, 0x1000, 10) +
                      lost_line(150, 3) + free_line(1, 0x9000, 10) + end_line(2);
    temp_file f(log);
    process_report r = analyze_file(f.path, {});
    CHECK(r.lost == 3);
    CHECK(has_warning(r, "3 event(s) were lost"));
    CHECK(has_warning(r, "free of unknown pointer 0x9000"));
    CHECK(has_warning(r, "tolerated"));
}

// docs/log-format.md, asize: never below size.  Tolerated after lost events, the allocation is
// then taken as exactly its size, so allocated never falls below requested (a negative rounding).
TEST_CASE("after lost events, an allocation whose asize is below its size counts as exactly its size", "[scenario]") {
    const std::string pitched =
        "{\"ev\":\"alloc\",\"seq\":0,\"t\":100,\"tid\":1,\"dev\":0,\"api\":\"cuMemAllocPitch_v2\",\"kind\":\"device\","
        "\"ptr\":\"0x1000\",\"size\":1000,\"asize\":10}\n";
    temp_file f(std::string(k_header_off) + lost_line(50, 1) + pitched + end_line(1, 1));
    process_report r = analyze_file(f.path, {});
    CHECK(has_warning(r, ":3: allocation at 0x1000 of 1000 bytes sets aside 10 (asize below size) (tolerated"));
    const device_report& d = device(r, 0);
    CHECK(d.requested.current == 1000);
    CHECK(d.allocated.current == 1000);
    CHECK(d.allocated.peak == 1000);
}

// report_model.h: the report keeps the first k_max_warnings warnings and counts the rest.  The
// first loss is shown even past that cap (the totals are approximate, which "N more warnings"
// would hide); a later one is an ordinary warning.
TEST_CASE("warnings past the cap are counted, not kept, but the first loss is always shown", "[scenario]") {
    std::string log = k_header_off;
    uint64_t seq = 0;
    for (uint64_t i = 0; i < k_max_warnings + 10; ++i) {
        log += alloc_line(seq++, 0x1000 + i * 0x1000, 100);
        log += free_line(seq++, 0x1000 + i * 0x1000, 99);  // another size than allocated: a warning
    }
    temp_file f(log + lost_line(seq * 100, 2) + lost_line(seq * 100 + 50, 3) + end_line(seq));
    process_report r = analyze_file(f.path, {});
    CHECK(r.n_warnings == k_max_warnings + 12);
    REQUIRE(r.warnings.size() == k_max_warnings + 1);
    CHECK_THAT(r.warnings.back(), Catch::Contains("2 event(s) were lost by the recorder"));
    CHECK_FALSE(has_warning(r, "3 event(s) were lost"));
}

// docs/log-format.md: an event after the end line is warned about; a line of a kind this analyzer
// does not know is skipped by the version policy, there too, even where its seq jumps.
TEST_CASE("after the end line, a known event is warned about and an unknown kind is not", "[scenario]") {
    temp_file f(std::string(k_header_off) + alloc_line(0, 0x1000, 4096) + end_line(1, 1) +
                "{\"ev\":\"telemetry\",\"seq\":3,\"t\":400,\"tid\":1}\n" + free_line(4, 0x1000, 4096));
    process_report r = analyze_file(f.path, {});
    CHECK(has_warning(r, ":4: seq jumps from 1 to 3"));
    CHECK_FALSE(has_warning(r, ":4: event after the end line"));
    CHECK(has_warning(r, ":5: event after the end line"));
}

TEST_CASE("events lost with no lost line of their own are counted from the end line", "[scenario]") {
    // The recorder counts in the end line's `lost` an event another thread had begun but not
    // finished by the end (docs/log-format.md): no lost line says it.  Lost lines after the end
    // line add to the end line's count, which already holds those before it.
    auto end_lost = [](uint64_t seq, uint64_t lost) {
        std::string l = end_line(seq);
        l.replace(l.find("\"lost\":0"), 8, "\"lost\":" + std::to_string(lost));
        return l;
    };
    SECTION("the end line alone") {
        temp_file f(std::string(k_header_off) + alloc_line(0, 0x1000, 10) + free_line(1, 0x1000, 10) + end_lost(2, 3));
        process_report r = analyze_file(f.path, {});
        CHECK(r.lost == 3);
        CHECK(r.end_lost == 3);
        CHECK(has_warning(r, "3 event(s) were lost"));
    }
    SECTION("lost lines before the end line are among its count, those after it are not") {
        temp_file f(std::string(k_header_off) + alloc_line(0, 0x1000, 10) + lost_line(150, 2) + free_line(1, 0x1000, 10) +
                    end_lost(2, 5) + lost_line(400, 1));
        process_report r = analyze_file(f.path, {});
        CHECK(r.lost == 6);
    }
    SECTION("counts past 2^64 saturate instead of wrapping to a small number") {
        temp_file f(std::string(k_header_off) + alloc_line(0, 0x1000, 10) + free_line(1, 0x1000, 10) +
                    end_lost(2, UINT64_MAX - 1) + lost_line(400, 5));
        process_report r = analyze_file(f.path, {});
        CHECK(r.lost == UINT64_MAX);
    }
    SECTION("a log without an end line counts its lost lines") {
        temp_file f(std::string(k_header_off) + alloc_line(0, 0x1000, 10) + lost_line(150, 2));
        process_report r = analyze_file(f.path, {});
        CHECK(r.lost == 2);
    }
}

TEST_CASE("a seq gap is a warning and makes the analysis lenient", "[scenario]") {
    std::string log = std::string(k_header_off) + alloc_line(0, 0x1000, 10) + free_line(5, 0x2000, 10) + end_line(6);
    temp_file f(log);
    process_report r = analyze_file(f.path, {});
    CHECK(has_warning(r, "seq jumps from 0 to 5: 4 event(s) missing"));
}

TEST_CASE("a context reset drops the device's segments and blocks", "[scenario]") {
    std::string log = std::string(k_header_on) + seg_line("segment_alloc", 0, 0x100000, 1 << 20) +
                      pooled_line("alloc", 1, 0x100000, 1000, 1024, 0x100000) +
                      "{\"ev\":\"context_reset\",\"seq\":2,\"t\":300,\"tid\":1,\"dev\":0,\"count\":0}\n" +
                      seg_line("segment_alloc", 3, 0x100000, 1 << 20) + end_line(4);
    temp_file f(log);
    process_report r = analyze_file(f.path, {});
    const device_report& d = r.devices[0];
    CHECK(r.n_context_reset == 1);
    CHECK(d.reserved.current == 1 << 20);  // only the new segment
    CHECK(d.allocated.current == 0);
    CHECK(d.n_leaks == 0);
    CHECK(d.end_free_in_segments == 1 << 20);
}

// docs/log-format.md, "Rebuilding the layout" step 6: with the header's alloc_ctx, a context_reset
// takes its own context's allocations outside the pools (their "ctx") and no stream-ordered one;
// without it (a log written before), every allocation of the device outside the pools.
TEST_CASE("a context reset takes only its own context's allocations outside the pools", "[scenario]") {
    std::string header = k_header_on;
    const std::string with_ctx = header.insert(header.rfind('}'), ",\"alloc_ctx\":true");
    auto in_ctx1 = [](std::string line) { return line.insert(line.find(",\"api\""), ",\"ctx\":1"); };
    auto on_stream = [](std::string line) { return line.insert(line.rfind('}'), ",\"stream\":\"0x0\""); };
    auto reset = [](uint64_t seq, int ctx) {
        return "{\"ev\":\"context_reset\",\"seq\":" + std::to_string(seq) + ",\"t\":" + std::to_string(seq * 100 + 100) +
               ",\"tid\":1,\"dev\":0" + (ctx ? ",\"ctx\":" + std::to_string(ctx) : std::string()) + ",\"count\":0}\n";
    };
    const uint64_t a = 0x10000000, b = 0x20000000, c = 0x30000000, d = 0x40000000;
    const std::string allocs = alloc_line(0, a, 1000, 0, "managed", "cuMemAllocManaged") +            // context 0's
                               in_ctx1(alloc_line(1, b, 2000, 0, "managed", "cuMemAllocManaged")) +   // context 1's
                               on_stream(alloc_line(2, c, 3000, 0, "device", "cuMemAllocAsync")) +    // no context's
                               alloc_line(3, d, 4000, 0, "device", "cuMemAllocPitch_v2");             // context 0's
    SECTION("header with alloc_ctx") {
        // Context 1 ends (b dies), context 0 frees a, then context 0 ends (d dies): c stays live.
        temp_file f(with_ctx + allocs + reset(4, 1) + free_line(5, a, 1000, 0, "managed") + reset(6, 0) + end_line(7, 1));
        process_report r = analyze_file(f.path, {});
        INFO((r.warnings.empty() ? std::string() : r.warnings[0]));
        CHECK(r.n_warnings == 0);
        CHECK(r.n_context_reset == 2);
        const device_report& dv = device(r, 0);
        CHECK(dv.n_unknown_free == 0);
        CHECK(dv.n_leaks == 1);
        CHECK(dv.leaked_bytes == 3000);
    }
    SECTION("header without alloc_ctx: the device's allocations outside the pools all end, as before") {
        temp_file f(std::string(k_header_on) + allocs + reset(4, 1) + end_line(5, 0));
        process_report r = analyze_file(f.path, {});
        INFO((r.warnings.empty() ? std::string() : r.warnings[0]));
        CHECK(r.n_warnings == 0);
        CHECK(device(r, 0).n_leaks == 0);
    }
}

TEST_CASE("--at takes the map after the last event at or before the moment", "[scenario]") {
    analyze_options o;
    REQUIRE(parse_moment("5", o.at));
    process_report r = analyze_file(data_path("golden/pool_fragmentation.jsonl"), o);
    const state_snapshot& s = r.devices[0].at_request;
    REQUIRE(s.valid);
    CHECK(s.seq == 5);
    CHECK(s.external_fragmentation == Approx(1.0 / 3.0));
    REQUIRE(parse_moment("2.5us", o.at));
    r = analyze_file(data_path("golden/pool_fragmentation.jsonl"), o);
    CHECK(r.devices[0].at_request.seq == 1);  // t=2000 is the last event at or before 2500 ns
    CHECK(r.devices[0].at_request.allocated == 524288);
    CHECK(r.devices[0].at_request.label == "--at");
    // A moment exactly at an event's time includes that event (seq 1 is at t=2000).
    REQUIRE(parse_moment("2us", o.at));
    r = analyze_file(data_path("golden/pool_fragmentation.jsonl"), o);
    CHECK(r.devices[0].at_request.seq == 1);
    CHECK(r.devices[0].at_request.allocated == 524288);
    // A moment past the last event takes the map at the end, and the label says so.
    REQUIRE(parse_moment("1s", o.at));
    r = analyze_file(data_path("golden/pool_fragmentation.jsonl"), o);
    REQUIRE(r.devices[0].at_request.valid);
    CHECK(r.devices[0].at_request.label == "--at (end of log)");
    CHECK(r.devices[0].at_request.allocated == 655360);
}

TEST_CASE("--at before a device's first event says that device has no map", "[scenario]") {
    // Device 0's first event is at seq 0 (t=100), device 1's at seq 1 (t=200).
    std::string log = std::string(k_header_off) + alloc_line(0, 0x1000, 4096) + alloc_line(1, 0x2000, 8192, 1) + end_line(2, 2);
    temp_file f(log);
    analyze_options o;
    REQUIRE(parse_moment("0", o.at));
    process_report r = analyze_file(f.path, o);
    REQUIRE(r.devices.size() == 2);
    CHECK(r.devices[0].at_request.valid);
    CHECK_FALSE(r.devices[1].at_request.valid);
    CHECK(has_warning(r, "--at seq 0 comes before device 1's first event (at 200 ns): it held no memory then"));
    CHECK_FALSE(has_warning(r, "before device 0's"));
    REQUIRE(parse_moment("50ns", o.at));  // before every event: no map at all, and each device says so
    r = analyze_file(f.path, o);
    CHECK(has_warning(r, "--at 50 ns comes before device 0's first event (at 100 ns)"));
    CHECK(has_warning(r, "--at 50 ns comes before device 1's first event (at 200 ns)"));
}

TEST_CASE("parse_moment understands seqs and times", "[scenario]") {
    moment m;
    REQUIRE(parse_moment("#12", m));
    CHECK((m.kind == moment::by::seq && m.value == 12));
    REQUIRE(parse_moment("1.5s", m));
    CHECK((m.kind == moment::by::time && m.value == 1500000000));
    REQUIRE(parse_moment("20us", m));
    CHECK(m.value == 20000);
    CHECK_FALSE(parse_moment("", m));
    CHECK_FALSE(parse_moment("1.5", m));
    CHECK_FALSE(parse_moment("5h", m));
    CHECK_FALSE(parse_moment("abc", m));
    // The size rule's spaces before a unit and its numbers: no exponent, no bare '.'.
    REQUIRE(parse_moment("3 us", m));
    CHECK((m.kind == moment::by::time && m.value == 3000));
    CHECK_FALSE(parse_moment("5 ", m));
    CHECK_FALSE(parse_moment("1e3us", m));
    CHECK_FALSE(parse_moment(".5s", m));
    CHECK_FALSE(parse_moment("1.s", m));
    REQUIRE(parse_moment("18000000000s", m));  // past 2^63 ns, below 2^64
    CHECK(m.value == 18000000000000000000ull);
    // Units in any letter case, as a size's.
    REQUIRE(parse_moment("2US", m));
    CHECK((m.kind == moment::by::time && m.value == 2000));
    REQUIRE(parse_moment("2 Ms", m));
    CHECK(m.value == 2000000);
}

// docs/pool.md, safe reuse (the default): a freed block stays "pending" in its segment, neither
// allocated nor free, until a pool_sync releases it and it merges with its free neighbours.
TEST_CASE("fence releases are not device-wide syncs; the ones the program waited for are counted, with the time blocked and the time in fence calls", "[scenario]") {
    const uint64_t seg = 0x200000;
    std::string log = std::string(k_header_on) + seg_line("segment_alloc", 0, seg, 4096) +
                      pooled_line("alloc", 1, seg, 1000, 1024, seg) + pooled_line("alloc", 2, seg + 1024, 1000, 1024, seg) +
                      pooled_line("free", 3, seg, 1000, 1024, seg) + pooled_line("free", 4, seg + 1024, 1000, 1024, seg) +
                      "{\"ev\":\"pool_sync\",\"seq\":5,\"t\":60000000100,\"tid\":1,\"dev\":0,\"count\":1,\"fence\":true,\"waited\":true,\"wait_ns\":15000000000,\"fence_ns\":1000000}\n" +
                      "{\"ev\":\"pool_sync\",\"seq\":6,\"t\":120000000100,\"tid\":1,\"dev\":0,\"count\":1,\"fence\":true,\"ordered\":true,\"fence_ns\":2000000}\n" + end_line(7, 0);
    temp_file f(log);
    process_report r = analyze_file(f.path, analyze_options{});
    const device_report& d = r.devices[0];
    CHECK(d.n_pool_sync == 0);
    CHECK(d.n_pool_wait == 1);
    CHECK(d.n_pool_ordered == 1);  // "ordered" is read
    CHECK(d.n_pool_fenced == 2);   // both lines released by fences
    CHECK(d.pool_wait_ns == 15000000000);  // the line without "wait_ns" adds nothing (reset per line)
    CHECK(d.pool_fence_ns == 3000000);
    CHECK(d.pending.current == 0);
    CHECK(r.n_warnings == 0);
    // The text report gives the time blocked and its share of the device's span of events.
    std::vector<process_report> ps{r};
    std::ostringstream o;
    write_text(o, ps, combine(ps), {});
    const std::string t = o.str();
    const size_t row = t.find("Blocked in pool waits");
    REQUIRE(row != std::string::npos);
    const std::string line = t.substr(row, t.find('\n', row) - row);
    INFO(line);
    CHECK_THAT(line, Catch::Contains("15.000 s"));
    CHECK_THAT(line, Catch::Contains("12.5% of the device's 120.000 s of events"));  // events from t=100 ns to 120 s
    CHECK(line.size() <= 92);  // inside the frame (91 columns, then "|"), even for a two-minute log
    const size_t ord = t.find("Ordered releases (no wait)");
    REQUIRE(ord != std::string::npos);
    CHECK_THAT(t.substr(ord, t.find('\n', ord) - ord), Catch::Matches(R"(Ordered releases \(no wait\) +1 +\|?)"));
    const size_t calls = t.find("In pool fence calls");
    REQUIRE(calls != std::string::npos);
    const std::string calls_line = t.substr(calls, t.find('\n', calls) - calls);
    INFO(calls_line);
    CHECK_THAT(calls_line, Catch::Contains("3.00 ms"));
    CHECK(calls_line.size() <= 92);
    CHECK_THAT(calls_line, Catch::Contains("of the device's 120.000 s of events"));
}

TEST_CASE("pending frees are not free space until pool_sync", "[scenario]") {
    const uint64_t seg = 0x200000;
    std::string log = std::string(k_header_on) + seg_line("segment_alloc", 0, seg, 4096) +
                      pooled_line("alloc", 1, seg, 1000, 1024, seg) + pooled_line("alloc", 2, seg + 1024, 1000, 1024, seg) +
                      pooled_line("free", 3, seg, 1000, 1024, seg) +
                      "{\"ev\":\"pool_sync\",\"seq\":4,\"t\":500,\"tid\":1,\"dev\":0,\"count\":1}\n" + end_line(5, 1);
    temp_file f(log);
    analyze_options o;
    REQUIRE(parse_moment("3", o.at));
    process_report r = analyze_file(f.path, o);
    const device_report& d = r.devices[0];
    // After the free (seq 3): 1 KiB pending at the front, 1 KiB allocated, 2 KiB free at the end.
    const state_snapshot& s = d.at_request;
    CHECK(s.allocated == 1024);
    CHECK(s.pending == 1024);
    CHECK(s.free_in_segments == 2048);
    CHECK(s.free_blocks == 1);
    CHECK(s.external_fragmentation == 0.0);
    REQUIRE(s.segment_map.size() == 1);
    CHECK(s.segment_map[0].pending.size() == 1);
    CHECK(segment_bar(s.segment_map[0], 4) == "p#..");
    // After the sync: two free gaps, 1 KiB and 2 KiB -> fragmentation 1 - 2/3.
    CHECK(d.pending.peak == 1024);
    CHECK(d.pending.current == 0);
    CHECK(d.n_pool_sync == 1);
    CHECK(d.end_free_in_segments == 3072);
    CHECK(d.end_free_blocks == 2);
    CHECK(d.end_external_fragmentation == Approx(1.0 / 3.0));
    CHECK(r.n_warnings == 0);
}

// docs/log-format.md, config.reuse "auto": a device's pool frees at once (as "immediate") until
// its reuse_safe event, and from then on its frees pend until a pool_sync (as "safe").
TEST_CASE("auto reuse: frees are immediate before the device's reuse_safe and pending after it", "[scenario][reuse]") {
    const uint64_t seg = 0x200000;
    std::string body = seg_line("segment_alloc", 0, seg, 4096) + pooled_line("alloc", 1, seg, 1000, 1024, seg) +
                       pooled_line("alloc", 2, seg + 1024, 1000, 1024, seg) +
                       pooled_line("free", 3, seg, 1000, 1024, seg) +         // free at once
                       pooled_line("free", 4, seg + 1024, 1000, 1024, seg) +  // merges: one free block
                       pooled_line("alloc", 5, seg, 1000, 1024, seg) +        // the same address, at once
                       reuse_safe_line(6) + pool_sync_line(7, 0) +            // the switch and its drain
                       pooled_line("free", 8, seg, 1000, 1024, seg) +         // pending now
                       pool_sync_line(9, 1) + end_line(10, 0);
    temp_file f(header_reuse("auto") + body);
    auto at = [&](const char* when) {
        analyze_options o;
        REQUIRE(parse_moment(when, o.at));
        process_report r = analyze_file(f.path, o);
        REQUIRE(r.devices.size() == 1);
        return r.devices[0].at_request;
    };
    state_snapshot s = at("3");  // 1 KiB allocated between a 1 KiB and a 2 KiB free block
    CHECK(s.pending == 0);
    CHECK(s.allocated == 1024);
    CHECK(s.free_in_segments == 3072);
    CHECK(s.free_blocks == 2);
    CHECK(s.external_fragmentation == Approx(1.0 / 3.0));
    s = at("4");  // both freed: the segment is one free block again
    CHECK(s.pending == 0);
    CHECK(s.free_in_segments == 4096);
    CHECK(s.free_blocks == 1);
    CHECK(s.external_fragmentation == 0.0);
    s = at("5");
    CHECK(s.allocated == 1024);
    CHECK(s.free_blocks == 1);
    s = at("8");  // after the switch the free pends: not free space
    CHECK(s.allocated == 0);
    CHECK(s.pending == 1024);
    CHECK(s.free_in_segments == 3072);
    CHECK(s.free_blocks == 1);
    REQUIRE(s.segment_map.size() == 1);
    CHECK(s.segment_map[0].pending.size() == 1);
    CHECK(segment_bar(s.segment_map[0], 4) == "p...");

    process_report r = analyze_file(f.path, {});
    const device_report& d = r.devices[0];
    CHECK(r.reuse_mode == "auto");
    CHECK(r.n_warnings == 0);  // both pool_sync counts agree with the per-device pending list
    CHECK(d.reuse_safe);
    CHECK(d.reuse_safe_seq == 6);
    CHECK(d.reuse_safe_line == 8);
    CHECK(d.reuse_safe_api == "cuStreamCreate");
    CHECK(d.pending.peak == 1024);
    CHECK(d.pending.current == 0);
    CHECK(d.n_pool_sync == 2);
    CHECK(d.max_free_blocks == 2);
    CHECK(d.max_external_fragmentation == Approx(1.0 / 3.0));
    CHECK(d.max_external_fragmentation_seq == 3);
    CHECK(d.end_free_blocks == 1);
    CHECK(d.end_free_in_segments == 4096);

    // The same events under "safe" (and with no config.reuse, which means safe): the free at seq 3
    // pends, so the allocation at seq 5 lands in a pending block.
    for (const char* mode : {"safe", ""}) {
        INFO("config.reuse: " << mode);
        temp_file g(header_reuse(mode) + body);
        try {
            analyze_file(g.path, {});
            FAIL("accepted an allocation into a pending block");
        } catch (const input_error& e) {
            CHECK(e.line == 7);
            CHECK_THAT(e.message, Catch::StartsWith("pooled block 0x200000 is already allocated in segment 0x200000"));
        }
    }
}

TEST_CASE("auto reuse: an allocation into a block still pending after reuse_safe is an inconsistency", "[scenario][reuse]") {
    const uint64_t seg = 0x200000;
    std::string log = header_reuse("auto") + seg_line("segment_alloc", 0, seg, 4096) +
                      pooled_line("alloc", 1, seg, 1000, 1024, seg) + reuse_safe_line(2, 0, "cuGreenCtxStreamCreate") +
                      pooled_line("free", 3, seg, 1000, 1024, seg) + pooled_line("alloc", 4, seg, 1000, 1024, seg) +
                      end_line(5, 1);
    temp_file f(log);
    try {
        analyze_file(f.path, {});
        FAIL("accepted an allocation into a pending block");
    } catch (const input_error& e) {
        CHECK(e.line == 6);
        CHECK_THAT(std::string(e.what()), Catch::StartsWith(f.path + ":6: pooled block 0x200000 is already allocated in segment 0x200000"));
    }
    run_result r = run_gpumem("report --no-progress " + f.path);
    CHECK(r.rc == 2);
    CHECK_THAT(r.err, Catch::Contains(f.path + ":6: pooled block 0x200000 is already allocated"));
}

TEST_CASE("auto reuse: each device switches on its own reuse_safe and pool_sync counts are checked per device", "[scenario][reuse]") {
    const uint64_t s0 = 0x200000, s1 = 0x400000;
    std::string log = header_reuse("auto") + seg_line("segment_alloc", 0, s0, 4096, 0) +
                      seg_line("segment_alloc", 1, s1, 4096, 1) + pooled_line("alloc", 2, s0, 1000, 1024, s0, 0) +
                      pooled_line("alloc", 3, s1, 1000, 1024, s1, 1) +
                      reuse_safe_line(4, 0, "cuStreamCreateWithPriority") + pool_sync_line(5, 0, 0) +
                      pooled_line("free", 6, s0, 1000, 1024, s0, 0) +  // device 0: pending
                      pooled_line("free", 7, s1, 1000, 1024, s1, 1) +  // device 1: still immediate
                      pool_sync_line(8, 5, 1) +                        // immediate: count not checked
                      pool_sync_line(9, 1, 0) +                        // device 0's one pending free
                      pooled_line("alloc", 10, s0, 1000, 1024, s0, 0) +
                      pooled_line("free", 11, s0, 1000, 1024, s0, 0) +
                      pool_sync_line(12, 2, 0) +                       // says 2, one is pending
                      end_line(13, 0);
    temp_file f(log);
    process_report r = analyze_file(f.path, {});
    REQUIRE(r.devices.size() == 2);
    const device_report& d0 = device(r, 0);
    const device_report& d1 = device(r, 1);
    CHECK(d0.reuse_safe);
    CHECK(d0.reuse_safe_seq == 4);
    CHECK(d0.reuse_safe_api == "cuStreamCreateWithPriority");
    CHECK(d0.pending.peak == 1024);
    CHECK(d0.pending.current == 0);
    CHECK_FALSE(d1.reuse_safe);
    CHECK(d1.pending.peak == 0);
    CHECK(d1.end_free_blocks == 1);
    CHECK(d1.end_free_in_segments == 4096);
    CHECK(r.n_warnings == 1);
    CHECK(has_warning(r, f.path + ":14: pool_sync releases 2 frees; the reconstruction has 1 pending"));

    // The report says which device switched, when, and through which call.
    std::vector<process_report> ps{r};
    std::ostringstream text;
    write_text(text, ps, combine(ps), {});
    CHECK_THAT(text.str(), Catch::Contains("Reuse                       auto, safe from seq 4 (cuStreamCreateWithPriority)"));
    CHECK_THAT(text.str(), Catch::Contains("Reuse                       auto, immediate throughout"));
    auto j = to_json(ps, combine(ps), {});
    const auto& jd = j["processes"][0]["devices"];
    CHECK(jd[0]["reuse_safe"]["seq"] == 4);
    CHECK(jd[0]["reuse_safe"]["api"] == "cuStreamCreateWithPriority");
    CHECK(jd[0]["reuse_safe"]["line"] == 6);
    CHECK(jd[1]["reuse_safe"].is_null());
    std::ostringstream html;
    write_html(html, ps, combine(ps), {});
    CHECK_THAT(html.str(), Catch::Contains("reuse auto (dev 0: safe from seq 4 by cuStreamCreateWithPriority; dev 1: immediate throughout)"));
}

TEST_CASE("a repeated reuse_safe, or one outside auto mode, is a warning that changes nothing", "[scenario][reuse]") {
    const uint64_t seg = 0x200000;
    SECTION("a second reuse_safe for a device already in safe reuse") {
        std::string log = header_reuse("auto") + seg_line("segment_alloc", 0, seg, 4096) + reuse_safe_line(1) +
                          reuse_safe_line(2, 0, "cuGreenCtxStreamCreate") + end_line(3);
        temp_file f(log);
        process_report r = analyze_file(f.path, {});
        CHECK(r.n_warnings == 1);
        CHECK(has_warning(r, f.path + ":4: reuse_safe (cuGreenCtxStreamCreate) on device 0, which is in safe reuse since seq 1 (line 3); ignored"));
        CHECK(r.devices[0].reuse_safe_seq == 1);
        CHECK(r.devices[0].reuse_safe_api == "cuStreamCreate");
    }
    SECTION("in an immediate log the frees stay immediate") {
        std::string log = header_reuse("immediate") + seg_line("segment_alloc", 0, seg, 4096) +
                          pooled_line("alloc", 1, seg, 1000, 1024, seg) + reuse_safe_line(2) +
                          pooled_line("free", 3, seg, 1000, 1024, seg) + pooled_line("alloc", 4, seg, 1000, 1024, seg) +
                          end_line(5, 1);
        temp_file f(log);
        process_report r = analyze_file(f.path, {});
        CHECK(r.n_warnings == 1);
        CHECK(has_warning(r, f.path + ":4: reuse_safe (cuStreamCreate) on device 0 in a log whose config.reuse is \"immediate\", not \"auto\"; ignored"));
        CHECK_FALSE(r.devices[0].reuse_safe);
        CHECK(r.devices[0].pending.peak == 0);
    }
    SECTION("in a safe log, or one without config.reuse, the frees stay pending") {
        for (const char* mode : {"safe", ""}) {
            INFO("config.reuse: " << mode);
            std::string log = header_reuse(mode) + seg_line("segment_alloc", 0, seg, 4096) +
                              pooled_line("alloc", 1, seg, 1000, 1024, seg) + reuse_safe_line(2) +
                              pooled_line("free", 3, seg, 1000, 1024, seg) + pool_sync_line(4, 1) + end_line(5);
            temp_file f(log);
            process_report r = analyze_file(f.path, {});
            CHECK(r.n_warnings == 1);
            CHECK(has_warning(r, std::string(":4: reuse_safe (cuStreamCreate) on device 0 in a log whose config.reuse is ") +
                                     (*mode ? "\"safe\"" : "absent (safe)") + ", not \"auto\"; ignored"));
            CHECK_FALSE(r.devices[0].reuse_safe);
            CHECK(r.devices[0].pending.peak == 1024);
        }
    }
}

TEST_CASE("auto reuse: a context reset keeps the device in safe reuse", "[scenario][reuse]") {
    // docs/pool.md: the retired pool keeps its mode and serves the next context on the device.
    const uint64_t seg = 0x200000;
    std::string log = header_reuse("auto") + seg_line("segment_alloc", 0, seg, 4096) + reuse_safe_line(1) +
                      "{\"ev\":\"context_reset\",\"seq\":2,\"t\":300,\"tid\":1,\"dev\":0,\"count\":0}\n" +
                      seg_line("segment_alloc", 3, seg, 4096) + pooled_line("alloc", 4, seg, 1000, 1024, seg) +
                      pooled_line("free", 5, seg, 1000, 1024, seg) + end_line(6);
    temp_file f(log);
    process_report r = analyze_file(f.path, {});
    CHECK(r.n_warnings == 0);
    CHECK(r.devices[0].reuse_safe);
    CHECK(r.devices[0].pending.current == 1024);
}

// docs/log-format.md, "ctx": two contexts' pools on device 0 (the program's own, the device's
// first, and the primary context's, ctx 1), each with its own segment, reuse switch and pending
// frees.  Read per device, as before "ctx", the second reuse_safe was a warning, the fence of
// pool 1 (count 1) released pool 0's older free, and the allocation after it landed on pool 1's
// block still pending: the log was refused at line 13.
TEST_CASE("two pools on a device: each pool's pending frees, reuse switch, stats and reset are its own", "[scenario][reuse]") {
    const uint64_t s0 = 0x200000, s1 = 0x400000;
    auto in_pool1 = [](std::string line) { return line.insert(line.find(",\"api\""), ",\"ctx\":1"); };
    auto stats = [](uint64_t seq, int ctx, uint64_t largest_free) {
        return "{\"ev\":\"stats\",\"seq\":" + std::to_string(seq) + ",\"t\":" + std::to_string(seq * 100 + 100) +
               ",\"tid\":1,\"dev\":0" + (ctx ? ",\"ctx\":" + std::to_string(ctx) : std::string()) +
               ",\"reserved\":4096,\"allocated\":1024,\"requested\":1000,\"largest_free\":" + std::to_string(largest_free) +
               ",\"free_blocks\":1,\"segments\":1,\"gpu_free\":0,\"gpu_total\":0}\n";
    };
    std::string log = header_reuse("auto") + seg_line("segment_alloc", 0, s0, 4096) +
                      in_pool1(seg_line("segment_alloc", 1, s1, 4096)) + pooled_line("alloc", 2, s0, 1000, 1024, s0) +
                      pooled_line("alloc", 3, s1, 1000, 1024, s1) +
                      reuse_safe_line(4) + pool_sync_line(5, 0) +                                  // pool 0 switches
                      in_pool1(reuse_safe_line(6, 0, "cuStreamCreate")) +                          // pool 1 switches
                      "{\"ev\":\"pool_sync\",\"seq\":7,\"t\":800,\"tid\":1,\"dev\":0,\"ctx\":1,\"count\":0}\n" +
                      pooled_line("free", 8, s0, 1000, 1024, s0) +                                // pending in pool 0
                      pooled_line("free", 9, s1, 1000, 1024, s1) +                                // pending in pool 1
                      "{\"ev\":\"pool_sync\",\"seq\":10,\"t\":1100,\"tid\":1,\"dev\":0,\"ctx\":1,\"count\":1,\"fence\":true}\n" +
                      pooled_line("alloc", 11, s1, 1000, 1024, s1) +                              // pool 1's block again
                      stats(12, 1, 3072) + stats(13, 0, 3072) +  // pool 0: its block pends, 3 KiB free after it
                      "{\"ev\":\"context_reset\",\"seq\":14,\"t\":1500,\"tid\":1,\"dev\":0,\"ctx\":1,\"count\":0}\n" +
                      pool_sync_line(15, 1) +  // pool 0's free, still pending after pool 1's reset
                      end_line(16, 0);
    temp_file f(log);
    analyze_options o;
    REQUIRE(parse_moment("10", o.at));
    process_report r = analyze_file(f.path, o);
    INFO((r.warnings.empty() ? std::string() : r.warnings[0]));
    CHECK(r.n_warnings == 0);
    const device_report& d = device(r, 0);
    CHECK(d.reuse_safe_seq == 4);  // the device's first switch
    CHECK(d.pending.peak == 2048);
    CHECK(d.pending.current == 0);
    CHECK(d.n_pool_sync == 3);  // seq 5, 7 and 15; the fence at 10 is counted apart
    CHECK(d.n_pool_fenced == 1);
    CHECK(d.end_free_blocks == 1);  // pool 1's segment went with its context: pool 0's is whole again
    CHECK(d.end_free_in_segments == 4096);
    // After the fence (seq 10): pool 0's block pends, pool 1's is free again.
    const state_snapshot& s = d.at_request;
    CHECK(s.pending == 1024);
    CHECK(s.allocated == 0);
    CHECK(s.free_in_segments == 3072 + 4096);
    CHECK(s.free_blocks == 2);
    REQUIRE(s.segment_map.size() == 2);
    CHECK(s.segment_map[0].pending.size() == 1);
    CHECK(s.segment_map[1].pending.empty());
    run_result cli = run_gpumem("report --no-progress " + f.path);
    CHECK(cli.rc == 0);
}

// Each point of the timeline closes with its last event's values, also once compaction has merged
// two points into one.  The log is built so the fragmentation after event i is 1/2 when i is odd
// and 0 when i is even (B alone in the middle of three 1 KiB units leaves two 1 KiB free blocks),
// and 1025 events (one past k_timeline_points) force exactly one compaction: 512 points of two
// events each, then one of the last event alone.  A merged point that kept its first half's last
// values, seq or time, or lost its second half's event count, or a bound checked one point late,
// would each show here.
TEST_CASE("the timeline compacts to half at its bound, each point keeping its last event's values", "[scenario]") {
    const uint64_t seg = 0x200000, A = seg, B = seg + 1024;
    std::string log = header_reuse("immediate") + seg_line("segment_alloc", 0, seg, 3072) +
                      pooled_line("alloc", 1, B, 1024, 1024, seg);
    uint64_t seq = 2;
    while (seq < 1025) {  // from B alone: +A (0), -A (1/2), -B (0), +B (1/2)
        const bool last_half = (seq - 2) % 4 >= 2;
        const char* ev = (seq - 2) % 4 == 0 || (seq - 2) % 4 == 3 ? "alloc" : "free";
        log += pooled_line(ev, seq, last_half ? B : A, 1024, 1024, seg);
        ++seq;
    }
    log += end_line(seq, 0);  // event 1024 is the free of B: nothing is live
    temp_file f(log);
    process_report r = analyze_file(f.path, {});
    REQUIRE(r.devices.size() == 1);
    const device_report& d = r.devices[0];
    CHECK(r.n_warnings == 0);
    CHECK(d.timeline_events_per_point == 2);
    REQUIRE(d.timeline.size() == 513);
    uint64_t events = 0;
    for (size_t k = 0; k < 512; ++k) {
        INFO("point " << k);
        const time_point& p = d.timeline[k];
        events += p.events;
        CHECK(p.events == 2);
        CHECK(p.seq_last == 2 * k + 1);
        CHECK(p.t_first == (2 * k) * 100 + 100);
        CHECK(p.t_last == (2 * k + 1) * 100 + 100);
        CHECK(p.frag_last == 0.5);
        CHECK(p.frag_max == 0.5);
        CHECK(p.requested_last == 1024);  // B alone after every odd event
        CHECK(p.requested_max == (k % 2 == 1 ? 2048u : 1024u));  // A and B both live at its first event, or B
    }
    const time_point& tail = d.timeline.back();
    CHECK(tail.events == 1);
    CHECK(tail.seq_last == 1024);
    CHECK(tail.frag_last == 0.0);
    CHECK(tail.requested_last == 0);
    CHECK(events + tail.events == 1025);
}

// docs/metrics.md: the verdict "fragmentation" says whether a free block (in a segment, or the
// driver's free memory) could hold the request; a block exactly the request's size can.
TEST_CASE("OOM explanations: a free block of exactly the request's size is large enough", "[scenario]") {
    // Free blocks of 2 MiB and 2 MiB in the segment, 1 MiB free on the GPU (oom_in_two_holes): the
    // largest block comes from the segments, not from the GPU's free memory.
    const uint64_t MiB = 1 << 20;
    auto oom = [](uint64_t request) { return oom_in_two_holes(request); };
    oom_report o = oom(2 * MiB);
    CHECK(o.verdict == "fragmentation");
    CHECK(o.largest_free == 2 * MiB);
    CHECK_THAT(o.explanation, Catch::StartsWith("enough free memory exists, and a free block is large enough"));
    o = oom(2 * MiB + 1);
    CHECK(o.verdict == "fragmentation");
    CHECK_THAT(o.explanation, Catch::StartsWith("enough free memory exists in total, but no single free block"));
    // The driver's free memory is such a block: 3 MiB free on the GPU holds the 3 MiB that neither
    // 2 MiB block in the segment can.
    o = oom_in_two_holes(3 * MiB, 3 * MiB);
    CHECK(o.verdict == "fragmentation");
    CHECK(o.largest_free == 2 * MiB);
    CHECK_THAT(o.explanation, Catch::StartsWith("enough free memory exists, and a free block is large enough"));
}

// A call the pool did not serve: when the driver says right after that the request's size is free
// (gpu_free == size, exactly), it refused memory it had, which is its own fragmentation or another
// allocation in between; one byte more than it has free is capacity.
TEST_CASE("OOM explanations: a driver that said the request's exact size was free refused the call itself", "[scenario]") {
    const uint64_t MiB = 1 << 20;
    auto oom = [&](uint64_t request) {
        const std::string log =
            std::string(k_header_off) +
            "{\"ev\":\"alloc_fail\",\"seq\":0,\"t\":100,\"tid\":1,\"dev\":0,\"api\":\"cudaMalloc\",\"kind\":\"device\",\"ptr\":\"0x0\","
            "\"size\":" + std::to_string(request) + ",\"err\":2,\"gpu_free\":" + std::to_string(64 * MiB) +
            ",\"gpu_total\":1073741824}\n" + end_line(1);
        temp_file f(log);
        process_report r = analyze_file(f.path, {});
        REQUIRE(r.devices.size() == 1);
        REQUIRE(r.devices[0].ooms.size() == 1);
        return r.devices[0].ooms[0];
    };
    oom_report o = oom(64 * MiB);
    CHECK(o.gpu_free == 64 * MiB);
    CHECK(o.verdict == "fragmentation");
    CHECK_THAT(o.explanation, Catch::StartsWith("the driver refused the call, yet said just after that this much was free"));
    CHECK(oom(64 * MiB + 1).verdict == "capacity");
}

// The pool writes its "oom" and the refused call's pooled alloc_fail back to back, but another
// pool of the device or a call outside the pools may log in between: the pair is still one OOM,
// and two pools' pairs interleaved are two, each with its own call's stack.  (An alloc_fail without
// "pooled", as hand-written logs have, pairs only as the very next event: the golden logs'.)
TEST_CASE("a pool's oom pairs with its pooled alloc_fail across other pools' lines", "[scenario]") {
    const uint64_t GiB = 1ull << 30, MiB = 1ull << 20;
    auto pooled_fail = [](uint64_t seq, uint64_t size, int stack, uint64_t tid = 1) {
        return "{\"ev\":\"alloc_fail\",\"seq\":" + std::to_string(seq) + ",\"t\":" + std::to_string(seq * 100 + 100) +
               ",\"tid\":" + std::to_string(tid) + ",\"dev\":0,\"api\":\"cudaMalloc\",\"kind\":\"device\",\"ptr\":\"0x0\",\"size\":" +
               std::to_string(size) + ",\"seg\":\"0x0\",\"pooled\":true,\"err\":2,\"stack\":" + std::to_string(stack) + "}\n";
    };
    std::string log = k_header_on;
    for (int id = 1; id <= 2; ++id) log += stack_line(id);
    // The device's report of a finished log (a copy: the process report is the call's own).
    auto device0 = [](const std::string& text) {
        temp_file f(text);
        process_report r = analyze_file(f.path, {});
        return device(r, 0);
    };
    SECTION("another thread's allocation between the two lines") {
        log += seg_line("segment_alloc", 0, 0x9000000, 2 * MiB);
        log += oom_line(1, GiB, {}, 0, GiB);
        log += alloc_line(2, 0x7000000, 4 * MiB, 0, "device", "cuMemAlloc_v2");  // outside the pools
        log += pooled_line("alloc", 3, 0x9000000, MiB, MiB, 0x9000000);      // another pool's hit
        log += pooled_fail(4, GiB, 1);
        log += end_line(5, 2);
        const device_report d = device0(log);
        CHECK(d.n_oom == 1);
        CHECK(d.n_alloc_fail == 1);
        REQUIRE(d.ooms.size() == 1);
        CHECK(d.ooms[0].from_pool);
        CHECK(d.ooms[0].err == 2);
        CHECK(d.ooms[0].stack == 1);
    }
    SECTION("two pools' pairs interleaved") {
        log += oom_line(0, GiB, {}, 0, GiB);
        log += oom_line(1, 512 * MiB, {}, 0, GiB);
        log += pooled_fail(2, 512 * MiB, 2);
        log += pooled_fail(3, GiB, 1);
        log += end_line(4, 0);
        const device_report d = device0(log);
        CHECK(d.n_oom == 2);
        REQUIRE(d.ooms.size() == 2);
        CHECK(d.ooms[0].size == GiB);
        CHECK(d.ooms[0].stack == 1);
        CHECK(d.ooms[1].size == 512 * MiB);
        CHECK(d.ooms[1].stack == 2);
    }
    // The pool writes its oom and its alloc_fail on the failing call's thread: two pools refused
    // the same size at once, their alloc_fails in the other order, each OOM keeps its own stack.
    auto with_tid = [](std::string line, const char* tid) {
        const std::string from = ",\"tid\":1,";
        return line.replace(line.find(from), from.size(), tid);
    };
    SECTION("two pools refused the same size at once: paired by thread") {
        log += with_tid(oom_line(0, GiB, {}, 0, GiB), ",\"tid\":11,");
        log += with_tid(oom_line(1, GiB, {}, 0, GiB), ",\"tid\":22,");
        log += pooled_fail(2, GiB, 2, 22);
        log += pooled_fail(3, GiB, 1, 11);
        log += end_line(4, 0);
        const device_report d = device0(log);
        CHECK(d.n_oom == 2);
        REQUIRE(d.ooms.size() == 2);
        CHECK(d.ooms[0].seq == 0);
        CHECK(d.ooms[0].stack == 1);  // thread 11's call
        CHECK(d.ooms[1].seq == 1);
        CHECK(d.ooms[1].stack == 2);  // thread 22's call
    }
    SECTION("an oom without tid pairs by size alone") {
        log += with_tid(oom_line(0, GiB, {}, 0, GiB), ",");
        log += pooled_fail(1, GiB, 1, 22);
        log += end_line(2, 0);
        const device_report d = device0(log);
        CHECK(d.n_oom == 1);
        REQUIRE(d.ooms.size() == 1);
        CHECK(d.ooms[0].stack == 1);
    }
    SECTION("another thread's pooled alloc_fail of the same size is an OOM of its own") {
        log += with_tid(oom_line(0, GiB, {}, 0, GiB), ",\"tid\":11,");
        log += pooled_fail(1, GiB, 2, 22);
        log += pooled_fail(2, GiB, 1, 11);
        log += end_line(3, 0);
        const device_report d = device0(log);
        CHECK(d.n_oom == 2);
        REQUIRE(d.ooms.size() == 2);
        CHECK(d.ooms[0].from_pool);
        CHECK(d.ooms[0].stack == 1);
        CHECK_FALSE(d.ooms[1].from_pool);
        CHECK(d.ooms[1].stack == 2);
    }
    SECTION("an alloc_fail outside the pools of the same size is an OOM of its own") {
        log += oom_line(0, GiB, {}, 0, GiB);
        log += alloc_line(1, 0x7000000, 4 * MiB, 0, "device", "cuMemAlloc_v2");  // outside the pools
        log += "{\"ev\":\"alloc_fail\",\"seq\":2,\"t\":300,\"tid\":1,\"dev\":0,\"api\":\"cuMemCreate\",\"kind\":\"device\","
               "\"size\":1073741824,\"err\":2}\n";
        log += pooled_fail(3, GiB, 1);
        log += end_line(4, 1);
        const device_report d = device0(log);
        CHECK(d.n_oom == 2);
        REQUIRE(d.ooms.size() == 2);
        CHECK(d.ooms[0].stack == 1);  // the pool's, paired with its own refusal
        CHECK_FALSE(d.ooms[1].from_pool);
    }
}

// A log cut just after the pool's refusals (killed before the program saw them): the device has
// nothing but OOMs and is still reported.  Each OOM's map is a copy of the layout, so only the
// first k_max_oom_maps (8) carry one.
TEST_CASE("a device with only OOMs is reported, and only its first 8 OOMs carry a map", "[scenario]") {
    std::string log = k_header_on;
    for (uint64_t s = 0; s < 9; ++s) log += oom_line(s, 2ull << 30, {}, 0, 1ull << 30);
    temp_file f(log);
    process_report r = analyze_file(f.path, {});
    REQUIRE(r.devices.size() == 1);
    const device_report& d = r.devices[0];
    CHECK(d.n_oom == 9);
    REQUIRE(d.ooms.size() == 9);
    CHECK(d.ooms[7].map.valid);
    CHECK(d.ooms[7].map.label == "oom #8");
    CHECK_FALSE(d.ooms[8].map.valid);
    for (const oom_report& o : d.ooms) CHECK(o.verdict == "capacity");
}

// docs/log-format.md, dev: a free carries its allocation's device, or -1 when it is unknown.  Such
// a free releases the allocation on the allocation's device, without a device-mismatch warning,
// and that device's timeline shows it; a free naming another real device is warned about.
TEST_CASE("a free on device -1 frees on the allocation's device, quietly, and its timeline shows it", "[scenario]") {
    {
        temp_file f(std::string(k_header_off) + alloc_line(0, 0x1000, 4096) + free_line(1, 0x1000, 4096, -1) + end_line(2));
        process_report r = analyze_file(f.path, {});
        CHECK(r.n_warnings == 0);
        REQUIRE(r.devices.size() == 1);  // device -1 named only by the free has nothing of its own
        const device_report& d = device(r, 0);
        CHECK(d.n_free == 1);
        CHECK(d.requested.current == 0);
        CHECK(d.n_leaks == 0);
        REQUIRE(d.timeline.size() == 2);
        CHECK(d.timeline.back().requested_last == 0);
        CHECK(d.timeline.back().seq_last == 1);
    }
    {
        temp_file f(std::string(k_header_off) + alloc_line(0, 0x1000, 4096) + free_line(1, 0x1000, 4096, 1) + end_line(2));
        process_report r = analyze_file(f.path, {});
        CHECK(r.n_warnings == 1);
        CHECK(has_warning(r, ":3: free of 0x1000 on device 1, allocated on device 0 at line 2"));
        CHECK(device(r, 0).requested.current == 0);
    }
}

// docs/log-format.md: at most three warnings per log for stats lines that disagree with the
// rebuilt layout; the fourth says nothing new.
TEST_CASE("stats lines that disagree with the rebuild are warned about three times, not more", "[scenario]") {
    std::string log = std::string(k_header_on) + seg_line("segment_alloc", 0, 0x200000, 1 << 20);
    for (uint64_t s = 1; s <= 4; ++s)
        log += "{\"ev\":\"stats\",\"seq\":" + std::to_string(s) + ",\"t\":" + std::to_string(s * 100 + 100) +
               ",\"tid\":1,\"dev\":0,\"reserved\":0,\"allocated\":0,\"requested\":0,\"largest_free\":0,\"free_blocks\":0,"
               "\"segments\":0,\"gpu_free\":0,\"gpu_total\":0}\n";
    temp_file f(log + end_line(5));
    process_report r = analyze_file(f.path, {});
    CHECK(r.n_warnings == 3);
    CHECK(has_warning(r, ":5: the pool reports 0 bytes reserved in 0 segments; the reconstruction has 1048576 in 1"));
    CHECK_FALSE(has_warning(r, ":6: the pool reports"));
}

// The end line's live count is checked against the rebuild only in a complete log: once events
// are missing (a seq gap), a difference is what the gap explains, not news.
TEST_CASE("the end line's live count is checked in a complete log, and not after a seq gap", "[scenario]") {
    {
        temp_file f(std::string(k_header_off) + alloc_line(0, 0x1000, 10) + end_line(1, 0));
        process_report r = analyze_file(f.path, {});
        CHECK(r.n_warnings == 1);
        CHECK(has_warning(r, "the end line reports 0 live allocations; the reconstruction has 1"));
    }
    {
        temp_file f(std::string(k_header_off) + alloc_line(0, 0x1000, 10) + alloc_line(2, 0x2000, 10) + end_line(3, 0));
        process_report r = analyze_file(f.path, {});
        CHECK(has_warning(r, "seq jumps from 0 to 2: 1 event(s) missing"));
        CHECK_FALSE(has_warning(r, "live allocations"));
    }
}

// A log whose first event is not seq 0 lost its beginning: that is said, and the rest is read
// leniently (a free of an allocation made before the first line is tolerated, not an error).
TEST_CASE("a first event with seq 1 means earlier events are missing, and makes the analysis lenient", "[scenario]") {
    temp_file f(std::string(k_header_off) + free_line(1, 0x9000, 10) + end_line(2));
    process_report r = analyze_file(f.path, {});
    CHECK(has_warning(r, "the first event has seq 1, not 0: earlier events are missing"));
    CHECK(has_warning(r, "free of unknown pointer 0x9000"));
    CHECK(has_warning(r, "tolerated"));
}

// A context reset without dev (the recorder's is always for one device, an older writer's may not
// be) drops every pooled block with its segment, and nothing else: a managed allocation outlives it
// and is a leak at the end.
TEST_CASE("a context reset without dev drops the pooled blocks, not the other allocations", "[scenario]") {
    const uint64_t seg = 0x100000;
    std::string log = std::string(k_header_on) + seg_line("segment_alloc", 0, seg, 1 << 20) +
                      pooled_line("alloc", 1, seg, 1000, 1024, seg) +
                      alloc_line(2, 0x900000, 4096, 0, "managed", "cudaMallocManaged") +
                      "{\"ev\":\"context_reset\",\"seq\":3,\"t\":400,\"tid\":1,\"count\":0}\n" + end_line(4, 1);
    temp_file f(log);
    process_report r = analyze_file(f.path, {});
    const device_report& d = device(r, 0);
    CHECK(r.n_warnings == 0);
    CHECK(d.requested.current == 4096);
    CHECK(d.reserved.current == 4096);  // the managed allocation, held from the driver; the segment is gone
    CHECK(d.n_leaks == 1);
    CHECK(d.leaked_bytes == 4096);
}

// After lost events, a handle allocated again without its release is tolerated: the first
// lifetime ends there, so its bytes are not counted twice.
TEST_CASE("after lost events, a cuMemCreate handle allocated again replaces the first one in the totals", "[scenario]") {
    const uint64_t MiB = 1 << 20;
    temp_file f(std::string(k_header_off) + lost_line(50, 1) +
                alloc_line(0, 0x7000, 2 * MiB, 0, "vmm", "cuMemCreate") +
                alloc_line(1, 0x7000, 4 * MiB, 0, "vmm", "cuMemCreate") + end_line(2, 1));
    process_report r = analyze_file(f.path, {});
    CHECK(has_warning(r, "allocation handle 0x7000 is already live"));
    const device_report& d = device(r, 0);
    CHECK(d.requested.current == 4 * MiB);
    CHECK(d.requested.peak == 4 * MiB);  // the first is released before the second is counted
    CHECK(d.n_leaks == 1);
    CHECK(d.leaked_bytes == 4 * MiB);
}

// A zero-byte allocation returns NULL and holds nothing: two of them are neither an overlap nor
// live allocations that the end line would be missing.
TEST_CASE("zero-byte allocations that return NULL hold nothing", "[scenario]") {
    temp_file f(std::string(k_header_off) + alloc_line(0, 0, 0) + alloc_line(1, 0, 0) + end_line(2, 0));
    process_report r = analyze_file(f.path, {});
    CHECK(r.n_warnings == 0);
    const device_report& d = device(r, 0);
    CHECK(d.n_alloc == 2);
    CHECK(d.n_leaks == 0);
}

// The pool_sync count is checked against the pending frees only in a complete log: after lost
// events the rebuild's pending list is known to be short, and the difference is no news.
TEST_CASE("a pool_sync count that differs from the pending frees is warned about, unless events were lost", "[scenario]") {
    const uint64_t seg = 0x200000;
    const std::string body = seg_line("segment_alloc", 0, seg, 4096) + pooled_line("alloc", 1, seg, 1000, 1024, seg) +
                             pooled_line("free", 2, seg, 1000, 1024, seg) + pool_sync_line(3, 2) + end_line(4);
    {
        temp_file f(k_header_on + body);
        process_report r = analyze_file(f.path, {});
        CHECK(r.n_warnings == 1);
        CHECK(has_warning(r, ":5: pool_sync releases 2 frees; the reconstruction has 1 pending"));
    }
    {
        temp_file f(k_header_on + lost_line(50, 1) + body);
        process_report r = analyze_file(f.path, {});
        CHECK(has_warning(r, "1 event(s) were lost"));
        CHECK_FALSE(has_warning(r, "pool_sync releases"));
        CHECK(r.devices[0].end_free_in_segments == 4096);
    }
    {
        // A count below the pending frees: said, and a pool_sync that is no fence release still
        // releases every pending block (only a fence's count picks the oldest ones).
        temp_file f(k_header_on + seg_line("segment_alloc", 0, seg, 4096) + pooled_line("alloc", 1, seg, 1000, 1024, seg) +
                    pooled_line("alloc", 2, seg + 2048, 1000, 1024, seg) + pooled_line("free", 3, seg, 1000, 1024, seg) +
                    pooled_line("free", 4, seg + 2048, 1000, 1024, seg) + pool_sync_line(5, 1) + end_line(6));
        process_report r = analyze_file(f.path, {});
        CHECK(r.n_warnings == 1);
        CHECK(has_warning(r, ":7: pool_sync releases 1 frees; the reconstruction has 2 pending"));
        CHECK(r.devices[0].end_free_in_segments == 4096);
        CHECK(r.devices[0].end_free_blocks == 1);
    }
}

TEST_CASE("call sites: the tracker holds what is live, and answers exactly at the peak, each OOM and the end", "[scenario]") {
    // A long training job's shape on two devices: a peak early, then steady churn far past it,
    // with OOMs on the way.  Every lifetime is kept here too, to sum the sites the slow way.
    struct life {
        uint64_t a, f, size;
        uint32_t stack;
        int dev;
    };
    std::vector<life> all;
    site_tracker t;
    struct dev_state {
        uint64_t current = 0, peak = 0, peak_seq = 0;
        std::vector<uint64_t> ooms;
        std::vector<std::pair<uint64_t, size_t>> live;  // ptr, index into all
    } devs[2];
    uint64_t seq = 0, next_ptr = 0x10000;
    uint32_t rng = 12345;
    auto rand = [&] { return rng = rng * 1103515245u + 12345u, (rng >> 8) & 0xffff; };
    // `at`: an address still live, allocated again without a free (a free missing from the log):
    // the model releases the first there, and the tracker ends its lifetime.
    auto alloc = [&](int d, uint64_t size, uint32_t stack, size_t at = SIZE_MAX) {
        dev_state& s = devs[d];
        uint64_t ptr = next_ptr += 0x1000;
        if (at != SIZE_MAX) {
            ptr = s.live[at].first;
            all[s.live[at].second].f = seq;
            s.current -= all[s.live[at].second].size;
            s.live.erase(s.live.begin() + std::ptrdiff_t(at));
        }
        s.current += size;
        if (s.current > s.peak) s.peak = s.current, s.peak_seq = seq;  // tracked_bytes: the first time
        all.push_back({seq, UINT64_MAX, size, stack, d});
        s.live.push_back({ptr, all.size() - 1});
        t.on_alloc(seq++, d, ptr, false, size, stack, s.peak_seq);
    };
    auto free_one = [&](int d, size_t which) {
        dev_state& s = devs[d];
        auto [ptr, i] = s.live[which];
        s.live.erase(s.live.begin() + std::ptrdiff_t(which));
        s.current -= all[i].size;
        all[i].f = seq;
        t.on_free(seq++, d, ptr, false, s.peak_seq);
    };
    size_t most_held = 0;
    for (int d = 0; d < 2; ++d)
        for (int k = 0; k < 40; ++k) alloc(d, 1 << 20, 1 + uint32_t(k % 3));  // the peak: 40 MiB each
    for (int d = 0; d < 2; ++d)
        while (devs[d].live.size() > 5) free_one(d, devs[d].live.size() - 1);
    for (int i = 0; i < 400000; ++i) {
        const int d = int(rand() & 1);
        if (i % 997 == 0 && !devs[d].live.empty()) alloc(d, 4096 + rand(), 4 + rand() % 4, rand() % devs[d].live.size());
        else if (devs[d].live.size() < 30 && (rand() & 1)) alloc(d, 4096 + rand(), 4 + rand() % 4);
        else if (devs[d].live.size() > 5) free_one(d, rand() % devs[d].live.size());
        if (i % 50000 == 25000) {  // an OOM: the report asks what was live there
            devs[d].ooms.push_back(seq);
            t.on_oom(d, seq++);
        }
        most_held = std::max(most_held, t.held());
    }
    // All 400,000 events' lifetimes were 32 bytes each before; now those live at a moment the
    // report asks about, and what came since the last compaction.
    CHECK(most_held <= (size_t(1) << 16));
    auto slow = [&](int d, uint64_t at) {
        std::map<uint32_t, site_row> rows;
        for (const life& l : all)
            if (l.dev == d && l.a <= at && at < l.f) {
                site_row& r = rows[l.stack];
                r.stack = l.stack;
                r.bytes += l.size;
                ++r.count;
            }
        std::vector<site_row> v;
        for (auto& [s, r] : rows) v.push_back(r);
        std::sort(v.begin(), v.end(), [](const site_row& x, const site_row& y) {
            return x.bytes != y.bytes ? x.bytes > y.bytes : x.stack < y.stack;
        });
        return v;
    };
    auto same = [](const std::vector<site_row>& x, const std::vector<site_row>& y) {
        REQUIRE(x.size() == y.size());
        for (size_t i = 0; i < x.size(); ++i) {
            CHECK(x[i].stack == y[i].stack);
            CHECK(x[i].bytes == y[i].bytes);
            CHECK(x[i].count == y[i].count);
        }
    };
    for (int d = 0; d < 2; ++d) {
        CHECK(devs[d].peak == 40u << 20);
        same(t.live_at(d, devs[d].peak_seq, 100), slow(d, devs[d].peak_seq));
        CHECK(!devs[d].ooms.empty());
        for (uint64_t o : devs[d].ooms) same(t.live_at(d, o, 100), slow(d, o));
        same(t.live_at(d, UINT64_MAX - 1, 100), slow(d, UINT64_MAX - 1));
    }
}

TEST_CASE("call sites of a log: the early peak, an OOM long after it and the leaks at the end", "[scenario]") {
    // The allocations live at the OOM came after the peak and were freed after the OOM: they are
    // the ones a tracker that forgets what it no longer needs must keep.
    std::string log = std::string(k_header_off).replace(std::string(k_header_off).find("\"version\":1"), 11, "\"version\":4");
    for (int id = 1; id <= 3; ++id) log += stack_line(id);
    auto with_stack = [](std::string line, int id) {
        line.insert(line.size() - 2, ",\"stack\":" + std::to_string(id));
        return line;
    };
    uint64_t seq = 0;
    for (uint64_t k = 0; k < 10; ++k) log += with_stack(alloc_line(seq++, 0x100000 * (k + 1), 1 << 20), 1);
    for (uint64_t k = 0; k < 10; ++k) log += free_line(seq++, 0x100000 * (k + 1), 1 << 20);
    for (int i = 0; i < 200000; ++i) {
        if (i == 100000) {
            log += with_stack(alloc_line(seq++, 0x9000000, 2 << 20), 3);
            log += with_stack(alloc_line(seq++, 0x9400000, 3 << 20), 3);
            log += "{\"ev\":\"alloc_fail\",\"seq\":" + std::to_string(seq) + ",\"t\":" + std::to_string(seq * 100 + 100) +
                   ",\"tid\":1,\"dev\":0,\"api\":\"cudaMalloc\",\"kind\":\"device\",\"ptr\":\"0x0\",\"size\":1073741824,\"err\":2,\"stack\":2}\n";
            ++seq;
        }
        if (i == 100100) log += free_line(seq++, 0x9000000, 2 << 20);
        if (i == 100200) log += free_line(seq++, 0x9400000, 3 << 20);
        log += with_stack(alloc_line(seq++, 0x8000000, 4096), 2);
        log += free_line(seq++, 0x8000000, 4096);
    }
    log += with_stack(alloc_line(seq++, 0x8000000, 8192), 2);  // never freed
    log += end_line(seq, 1);
    temp_file f(log);
    process_report r = analyze_file(f.path, {});
    const device_report& d = device(r, 0);
    CHECK(d.requested.peak == 10u << 20);
    REQUIRE(d.peak_sites.size() == 1);
    CHECK(d.peak_sites[0].stack == 1);
    CHECK(d.peak_sites[0].bytes == 10u << 20);
    CHECK(d.peak_sites[0].count == 10);
    REQUIRE(d.ooms.size() == 1);
    REQUIRE(d.ooms[0].sites.size() == 1);
    CHECK(d.ooms[0].sites[0].stack == 3);
    CHECK(d.ooms[0].sites[0].bytes == 5u << 20);
    CHECK(d.ooms[0].sites[0].count == 2);
    REQUIRE(d.end_sites.size() == 1);
    CHECK(d.end_sites[0].stack == 2);
    CHECK(d.end_sites[0].bytes == 8192);
    CHECK(d.end_sites[0].count == 1);
}
