// The pool on virtual memory: segment_unmap holes (reserved bytes, free blocks, fragmentation, maps),
// the checks on them, and the OOM verdict "chunk rounding", checked number by number.
#include <catch2/catch.hpp>

#include "analyze.h"
#include "cli_input.h"  // parse_moment, --at's argument
#include "expect_rejected.h"
#include "log_reader.h"
#include "report_output.h"
#include "test_util.h"

using namespace gpumem;
using namespace gpumem::analysis;
using namespace gpumem::test;

namespace {


std::string unmap_line(uint64_t seq, uint64_t ptr, uint64_t size, uint64_t seg) {
    char b[400];
    std::snprintf(b, sizeof b,
                  "{\"ev\":\"segment_unmap\",\"seq\":%llu,\"t\":%llu,\"tid\":1,\"dev\":0,\"api\":\"cuMemAlloc_v2\",\"ptr\":\"0x%llx\",\"size\":%llu,\"seg\":\"0x%llx\",\"pool\":\"large\"}\n",
                  (unsigned long long)seq, (unsigned long long)(seq * 100 + 100), (unsigned long long)ptr,
                  (unsigned long long)size, (unsigned long long)seg);
    return b;
}

}  // namespace

// tests/data/golden/pool_vmm_unmap.jsonl, by hand (2 MiB chunks, a 6 MiB GPU, one 12 MiB segment):
//   A = [0, 1) MiB, B = [1, 7), C = [7, 8) fill 8 MiB; B is freed: free [1, 7) and [8, 12),
//   fragmentation 1 - 6/10 = 40%.  The pool unmaps the whole chunks [2, 6) and [8, 12): reserved
//   12 -> 8 -> 4 MiB; the free blocks are [1, 2) and [6, 7) (the holes are not free), 50%.
//   A 3 MiB request then fails: 2 MiB free in segments + 2 MiB free on the GPU would hold it, but
//   A and C each hold a chunk, and the request needs 2 chunks, 4 MiB > 2 MiB: "chunk rounding".
//   Freeing A and C leaves [0, 2) and [6, 8) free: the hole [2, 6) between them does not merge.
//   The segment goes back holding 4 MiB; the same address space taken again is 12 MiB reserved.
TEST_CASE("segment_unmap: holes leave reserved and free space, and the OOM is chunk rounding", "[scenario][vmm]") {
    process_report r = analyze_file(data_path("golden/pool_vmm_unmap.jsonl"), {});
    REQUIRE(r.devices.size() == 1);
    const device_report& d = r.devices[0];
    CHECK(r.n_warnings == 0);  // the stats line's reserved (4 MiB, 1 segment) agrees with the rebuild
    CHECK(r.pool_vmm == "on");
    CHECK(d.n_segment_unmap == 2);
    CHECK(d.unmapped.peak == 8 * MiB);
    CHECK(d.unmapped.current == 0);  // the segments went back
    CHECK(d.reserved.peak == 12 * MiB);
    CHECK(d.reserved.current == 0);
    CHECK(d.max_external_fragmentation == Approx(0.5));
    CHECK(d.max_external_fragmentation_seq == 6);

    REQUIRE(d.ooms.size() == 1);
    const oom_report& o = d.ooms[0];
    CHECK(o.verdict == "chunk rounding");
    CHECK(o.reserved == 4 * MiB);
    CHECK(o.free_in_segments == 2 * MiB);
    CHECK(o.largest_free == MiB);
    CHECK(o.gpu_free == 2 * MiB);
    REQUIRE(o.map.valid);
    CHECK(o.map.reserved == 4 * MiB);
    CHECK(o.map.unmapped == 8 * MiB);
    CHECK(o.map.free_blocks == 2);
    CHECK(o.map.external_fragmentation == Approx(0.5));
    REQUIRE(o.map.segment_map.size() == 1);
    const segment_view& v = o.map.segment_map[0];
    CHECK(v.blocks.size() == 2);  // A and C; the holes are listed apart
    REQUIRE(v.holes.size() == 2);
    CHECK(v.holes[0] == std::make_pair(v.base + 2 * MiB, 4 * MiB));
    CHECK(v.holes[1] == std::make_pair(v.base + 8 * MiB, 4 * MiB));
    const auto [used, largest] = v.measure();
    CHECK(v.size - used == 2 * MiB);
    CHECK(largest == MiB);
    CHECK(o.map.free_block_sizes.count[20] == 2);  // two free blocks of 1 MiB, none for the holes
    CHECK(o.map.free_block_sizes.count[22] == 0);

    // Every event's point of the timeline (the stats line at seq 9 makes none), by its last value:
    // reserved drops at each unmap, and comes back with a new segment over the same address space.
    std::vector<uint64_t> reserved, seqs;
    double frag_after_last_free = -1;
    for (const time_point& p : d.timeline) {
        reserved.push_back(p.reserved_last);
        seqs.push_back(p.seq_last);
        if (p.seq_last == 11) frag_after_last_free = p.frag_last;
    }
    CHECK(seqs == std::vector<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14});
    CHECK(reserved == std::vector<uint64_t>{12 * MiB, 12 * MiB, 12 * MiB, 12 * MiB, 12 * MiB, 8 * MiB, 4 * MiB, 4 * MiB,
                                            4 * MiB, 4 * MiB, 4 * MiB, 0, 12 * MiB, 0});
    // After A and C are freed: two free blocks of 2 MiB with the hole between them.
    CHECK(frag_after_last_free == Approx(0.5));
}

TEST_CASE("segment_unmap: the report JSON keeps the holes and reads them back", "[scenario][vmm]") {
    run_result r = run_gpumem("report --no-progress --json " + data_path("golden/pool_vmm_unmap.jsonl"));
    REQUIRE(r.rc == 0);
    CHECK_THAT(r.out, Catch::Contains("\"verdict\": \"chunk rounding\""));
    CHECK_THAT(r.out, Catch::Contains("\"unmapped_ranges\": [\n"));
    CHECK_THAT(r.out, Catch::Contains("\"n_segment_unmap\": 2"));
    CHECK_THAT(r.out, Catch::Contains("\"peak_unmapped_bytes\": 8388608"));
}

TEST_CASE("segment_unmap: a range that is not free is a log error with file:line", "[scenario][vmm]") {
    const uint64_t seg = 0x40000000;
    const std::string head = std::string(k_header_on) + seg_line("segment_alloc", 0, seg, 8 * MiB) +
                             pooled_line("alloc", 1, seg, MiB, MiB, seg);
    SECTION("a live block") {
        expect_rejected(head + unmap_line(2, seg, 2 * MiB, seg) + end_line(3, 1), 4,
                        "segment_unmap of [0x40000000, +2097152) covers the live block [0x40000000, +1048576) allocated at line 3");
    }
    SECTION("a live block after the range's start") {
        expect_rejected(head + pooled_line("alloc", 2, seg + 3 * MiB, MiB, MiB, seg) + unmap_line(3, seg + 2 * MiB, 2 * MiB, seg) +
                            end_line(4, 2),
                        5, "segment_unmap of [0x40200000, +2097152) covers the live block [0x40300000, +1048576) allocated at line 4");
    }
    SECTION("a range unmapped before") {
        expect_rejected(head + unmap_line(2, seg + 4 * MiB, 2 * MiB, seg) + unmap_line(3, seg + 4 * MiB, 4 * MiB, seg) + end_line(4, 1),
                        5, "segment_unmap of [0x40400000, +4194304) covers the range [0x40400000, +2097152) unmapped at line 4");
    }
    SECTION("a range outside its segment") {
        expect_rejected(head + unmap_line(2, seg + 6 * MiB, 4 * MiB, seg) + end_line(3, 1), 4,
                        "segment_unmap of [0x40600000, +4194304) lies outside segment [0x40000000, +8388608)");
    }
    SECTION("a segment that is not held") {
        expect_rejected(head + unmap_line(2, 0x50000000, 2 * MiB, 0x50000000) + end_line(3, 1), 4,
                        "segment_unmap of [0x50000000, +2097152) in segment 0x50000000, which is not a held segment");
    }
    SECTION("a block made in a hole") {
        expect_rejected(head + unmap_line(2, seg + 4 * MiB, 2 * MiB, seg) + pooled_line("alloc", 3, seg + 4 * MiB, 512, 512, seg) +
                            end_line(4, 2),
                        5, "pooled block [0x40400000, +512) overlaps the range [0x40400000, +2097152) unmapped at line 4");
    }
}

TEST_CASE("segment_unmap of a pending block is an error; after the pool_sync it is fine", "[scenario][vmm]") {
    const uint64_t seg = 0x40000000;
    std::string safe_header = k_header_on;
    safe_header.replace(safe_header.find("\"pool\":\"on\""), 11, "\"pool\":\"on\",\"reuse\":\"safe\"");
    const std::string head = safe_header + seg_line("segment_alloc", 0, seg, 8 * MiB) +
                             pooled_line("alloc", 1, seg, 4 * MiB, 4 * MiB, seg) + pooled_line("free", 2, seg, 4 * MiB, 4 * MiB, seg);
    expect_rejected(head + unmap_line(3, seg, 2 * MiB, seg) + end_line(4), 5,
                    "segment_unmap of [0x40000000, +2097152) covers the pending block [0x40000000, +4194304)");
    temp_file f(head + "{\"ev\":\"pool_sync\",\"seq\":3,\"t\":400,\"tid\":1,\"dev\":0,\"count\":1}\n" +
                unmap_line(4, seg, 8 * MiB, seg) + seg_line("segment_free", 5, seg, 8 * MiB) + end_line(6));
    process_report r = analyze_file(f.path, {});
    const device_report& d = r.devices[0];
    CHECK(r.n_warnings == 0);
    CHECK(d.reserved.current == 0);
    CHECK(d.end_free_in_segments == 0);
    CHECK(d.unmapped.peak == 8 * MiB);
}

TEST_CASE("OOM verdicts on a pool on virtual memory: capacity, chunk rounding, fragmentation", "[scenario][vmm]") {
    // One 8 MiB segment holding a 1 MiB block at 0 and [1, 2) free (its chunk is shared), the rest
    // unmapped; the GPU has `gpu_free` free.
    const uint64_t seg = 0x40000000;
    auto log = [&](uint64_t request, uint64_t gpu_free) {
        return std::string(k_header_on) + seg_line("segment_alloc", 0, seg, 8 * MiB) +
               pooled_line("alloc", 1, seg, MiB, MiB, seg) + unmap_line(2, seg + 2 * MiB, 6 * MiB, seg) +
               oom_line(3, request, {2 * MiB, MiB, MiB, MiB, 1, 1}, gpu_free, 8 * MiB) + end_line(4, 1);
    };
    auto verdict = [&](uint64_t request, uint64_t gpu_free) {
        temp_file f(log(request, gpu_free));
        process_report r = analyze_file(f.path, {});
        REQUIRE(r.devices[0].ooms.size() == 1);
        return r.devices[0].ooms[0].verdict;
    };
    CHECK(verdict(4 * MiB, 2 * MiB) == "capacity");        // 4 MiB > 1 MiB free in segments + 2 MiB
    CHECK(verdict(3 * MiB, 2 * MiB) == "chunk rounding");  // 3 MiB fits 1 + 2, but not in whole chunks
    CHECK(verdict(2 * MiB + 1, 3 * MiB) == "chunk rounding");  // the request's own rounding: 2 chunks > 3 MiB
    CHECK(verdict(MiB, 0) == "fragmentation");  // a free block was large enough: a pool limit refused it
}

TEST_CASE("OOM verdicts: memory short only for pending frees is 'pending frees', not capacity", "[scenario][vmm]") {
    // The header's reuse is safe: a free leaves its block pending (neither free nor live) until a
    // pool_sync, which the pool cannot make during a stream capture.  Memory that would hold the
    // request once the pending blocks count is not the device's capacity.
    const uint64_t seg = 0x40000000;
    auto oom = [&](const std::string& log) {
        temp_file f(log);
        process_report r = analyze_file(f.path, {});
        REQUIRE(r.devices[0].ooms.size() == 1);
        return r.devices[0].ooms[0];
    };
    SECTION("cuMemAlloc segments: 6 MiB pending, 2 MiB free in an 8 MiB segment, nothing free on the GPU") {
        auto log = [&](uint64_t request) {
            return std::string(k_header_on) + seg_line("segment_alloc", 0, seg, 8 * MiB) +
                   pooled_line("alloc", 1, seg, 6 * MiB, 6 * MiB, seg) + pooled_line("free", 2, seg, 6 * MiB, 6 * MiB, seg) +
                   oom_line(3, request, {8 * MiB, 0, 0, 2 * MiB, 1, 1}, 0, 8 * MiB) + end_line(4);
        };
        const oom_report o = oom(log(4 * MiB));
        CHECK(o.verdict == "pending frees");  // 4 MiB > 2 MiB free, but not > 2 + 6 MiB pending
        CHECK(o.pending == 6 * MiB);
        CHECK(o.free_in_segments == 2 * MiB);
        CHECK(oom(log(9 * MiB)).verdict == "capacity");  // more than the 8 MiB free and pending together
        CHECK_THAT(oom(log(9 * MiB)).explanation, Catch::Contains("(free in segments + pending frees + free on the GPU)"));
        CHECK(oom(log(2 * MiB)).verdict == "fragmentation");  // the 2 MiB free block holds it: a pool limit refused it
    }
    SECTION("virtual memory: 1 MiB live, 3 MiB pending, the rest of the segment unmapped, 1 MiB free on the GPU") {
        auto log = [&](uint64_t request) {
            return std::string(k_header_on) + seg_line("segment_alloc", 0, seg, 8 * MiB) +
                   pooled_line("alloc", 1, seg, MiB, MiB, seg) + pooled_line("alloc", 2, seg + MiB, 3 * MiB, 3 * MiB, seg) +
                   unmap_line(3, seg + 4 * MiB, 4 * MiB, seg) + pooled_line("free", 4, seg + MiB, 3 * MiB, 3 * MiB, seg) +
                   oom_line(5, request, {4 * MiB, MiB, MiB, 0, 0, 1}, MiB, 5 * MiB) + end_line(6, 1);
        };
        CHECK(oom(log(2 * MiB)).verdict == "pending frees");  // 2 MiB > 0 free + 1 MiB on the GPU; 3 MiB pending
        CHECK(oom(log(5 * MiB)).verdict == "capacity");       // 1 MiB live + 5 MiB > the 5 MiB device
        CHECK_THAT(oom(log(5 * MiB)).explanation, Catch::Contains("the live bytes plus the request exceed what the driver gives"));
    }
}

TEST_CASE("a pool's oom and the alloc_fail of the same request are one OOM; a failure of another size is its own", "[scenario][vmm]") {
    // The pool writes "oom" when it runs out, then the refused call's alloc_fail (err 2): one OOM,
    // which takes the call's error.  An alloc_fail of another size that follows (a call the pool
    // passed through, failing in the driver) is a second OOM, not part of the pool's.
    const uint64_t seg = 0x40000000;
    auto fail_line = [](uint64_t seq, uint64_t size, bool pooled) {
        return "{\"ev\":\"alloc_fail\",\"seq\":" + std::to_string(seq) + ",\"t\":" + std::to_string(100 * (seq + 1)) +
               ",\"tid\":1,\"dev\":0,\"api\":\"cudaMalloc\",\"kind\":\"device\",\"ptr\":\"0x0\",\"size\":" +
               std::to_string(size) + (pooled ? ",\"pooled\":true" : "") + ",\"err\":2}\n";
    };
    const std::string head = std::string(k_header_on) + seg_line("segment_alloc", 0, seg, 8 * MiB) +
                             pooled_line("alloc", 1, seg, MiB, MiB, seg) + unmap_line(2, seg + 2 * MiB, 6 * MiB, seg) +
                             oom_line(3, 4 * MiB, {2 * MiB, MiB, MiB, MiB, 1, 1}, 0, 8 * MiB);
    SECTION("the same size: one OOM with the call's error") {
        temp_file f(head + fail_line(4, 4 * MiB, true) + end_line(5, 1));
        process_report r = analyze_file(f.path, {});
        const device_report& d = r.devices[0];
        CHECK(d.n_oom == 1);
        REQUIRE(d.ooms.size() == 1);
        CHECK(d.ooms[0].from_pool);
        CHECK(d.ooms[0].err == 2);
    }
    SECTION("another size: two OOMs, the second the driver's") {
        temp_file f(head + fail_line(4, 3 * MiB, false) + end_line(5, 1));
        process_report r = analyze_file(f.path, {});
        const device_report& d = r.devices[0];
        CHECK(d.n_oom == 2);
        REQUIRE(d.ooms.size() == 2);
        CHECK(d.ooms[0].from_pool);
        CHECK(d.ooms[0].size == 4 * MiB);
        CHECK(d.ooms[0].err == 0);  // the pool's own: no call's error attached
        CHECK(!d.ooms[1].from_pool);
        CHECK(d.ooms[1].size == 3 * MiB);
        CHECK(d.ooms[1].err == 2);
    }
    SECTION("the same size twice: the pool's oom takes the first call, the second is an OOM of its own") {
        temp_file f(head + fail_line(4, 4 * MiB, true) + fail_line(5, 4 * MiB, false) + end_line(6, 1));
        process_report r = analyze_file(f.path, {});
        const device_report& d = r.devices[0];
        CHECK(d.n_oom == 2);
        CHECK(d.n_alloc_fail == 2);
        REQUIRE(d.ooms.size() == 2);
        CHECK(d.ooms[0].from_pool);
        CHECK(d.ooms[0].err == 2);
        CHECK(!d.ooms[1].from_pool);
        CHECK(d.ooms[1].seq == 5);
    }
}

// Logs of tests/emu/pool_app's fill/fragment/large program under GPUMEM_POOL_VMM=on on the
// emulated device (600 MiB, 2 MiB chunks; tests/data/emu/README.md).  The device alone serves
// 200 x 3 MiB then 6 x 60 MiB, and 100 x 6 MiB then 6 x 60 MiB.
TEST_CASE("emulated device, pool on virtual memory: the rebuild agrees with the pool, and the OOMs are told apart", "[scenario][vmm]") {
    SECTION("3 MiB blocks astride chunks: both OOMs are chunk rounding") {
        process_report r = analyze_file(data_path("emu/vmm_fragment_3_60.jsonl"), {});
        const device_report& d = r.devices.at(0);
        CHECK(r.n_warnings == 0);  // incl. the pool's stats line against the rebuilt reserved bytes
        CHECK(d.n_alloc == 198 + 5);
        CHECK(d.n_segment_unmap == 96);
        CHECK(d.reserved.peak == 600 * MiB);
        // Reserved = the device less what the driver still has free (36 MiB at the end).
        CHECK(d.reserved.current == 564 * MiB);
        CHECK(d.unmapped.current == 384 * MiB);
        REQUIRE(d.ooms.size() == 2);
        // The 199th 3 MiB block: 594 MiB live in 600 MiB, but the last blocks took whole chunks.
        CHECK(d.ooms[0].size == 3 * MiB);
        CHECK(d.ooms[0].verdict == "chunk rounding");
        CHECK(d.ooms[0].free_in_segments == 0);
        CHECK(d.ooms[0].gpu_free == 0);
        // The 6th 60 MiB block: 64 MiB free in chunks shared with live 3 MiB blocks + 36 MiB on the GPU.
        CHECK(d.ooms[1].size == 60 * MiB);
        CHECK(d.ooms[1].verdict == "chunk rounding");
        CHECK(d.ooms[1].free_in_segments == 64 * MiB);
        CHECK(d.ooms[1].largest_free == MiB);
        CHECK(d.ooms[1].gpu_free == 36 * MiB);
    }
    SECTION("6 MiB blocks on chunk boundaries: both OOMs are capacity, as for the device alone") {
        process_report r = analyze_file(data_path("emu/vmm_fragment_6_60.jsonl"), {});
        const device_report& d = r.devices.at(0);
        CHECK(r.n_warnings == 0);
        CHECK(d.n_alloc == 100 + 6);
        CHECK(d.reserved.current == 564 * MiB);
        CHECK(d.requested.current == 564 * MiB);  // 34 x 6 MiB + 6 x 60 MiB: nothing lost to rounding
        REQUIRE(d.ooms.size() == 2);
        CHECK(d.ooms[0].verdict == "capacity");
        CHECK(d.ooms[1].verdict == "capacity");
        CHECK(d.ooms[1].free_in_segments == 0);
    }
}

TEST_CASE("an OOM on virtual memory shows the block rounding its verdict counted, in text, HTML and JSON", "[scenario][vmm]") {
    // An 8 MiB GPU: A asked 3 MiB and holds a 4 MiB block, B asked 1 MiB and holds 2 MiB, the rest
    // of the segment unmapped, 2 MiB free on the GPU.  A 3 MiB request: nothing free in segments, 2
    // MiB on the GPU; 4 MiB live + 3 MiB would fit in 8 MiB, but 2 MiB of the blocks is rounding:
    // chunk rounding, which the OOM's line must show the numbers of (it showed 0 B + 2 MiB < 3 MiB).
    const uint64_t seg = 0x40000000;
    temp_file f(std::string(k_header_on) + seg_line("segment_alloc", 0, seg, 8 * MiB) +
                pooled_line("alloc", 1, seg, 3 * MiB, 4 * MiB, seg) + pooled_line("alloc", 2, seg + 4 * MiB, MiB, 2 * MiB, seg) +
                unmap_line(3, seg + 6 * MiB, 2 * MiB, seg) + oom_line(4, 3 * MiB, {6 * MiB, 6 * MiB, 4 * MiB, 0, 0, 1}, 2 * MiB, 8 * MiB) +
                end_line(5, 2));
    process_report r = analyze_file(f.path, {});
    REQUIRE(r.devices[0].ooms.size() == 1);
    const oom_report& o = r.devices[0].ooms[0];
    CHECK(o.verdict == "chunk rounding");
    CHECK(o.pool_vmm);
    CHECK(o.requested == 4 * MiB);
    CHECK(o.block_rounding() == 2 * MiB);
    auto text = run_gpumem("report --no-progress " + f.path);
    REQUIRE(text.rc == 0);
    CHECK_THAT(text.out, Catch::Contains("| free on GPU 2.00 MiB | block rounding 2.00 MiB\n    verdict: chunk rounding: "));
    CHECK_THAT(text.out, Catch::Contains("what is left, free bytes that share chunks with live blocks and the blocks' own rounding"));
    auto js = run_gpumem("report --no-progress --json " + f.path);
    REQUIRE(js.rc == 0);
    const auto j = nlohmann::json::parse(js.out)["processes"][0]["devices"][0]["ooms"][0];
    CHECK(j["requested_bytes"] == 4 * MiB);
    CHECK(j["allocated_bytes"] == 6 * MiB);
    CHECK(j["pool_vmm"] == true);
    temp_file report(js.out, "report");
    auto again = run_gpumem("report --no-progress " + report.path);
    REQUIRE(again.rc == 0);
    CHECK_THAT(again.out, Catch::Contains("| free on GPU 2.00 MiB | block rounding 2.00 MiB\n"));
    temp_file html("", "html");
    REQUIRE(run_gpumem("report --no-progress --html " + html.path + " " + f.path).rc == 0);
    CHECK_THAT(read_all(html.path), Catch::Contains("free on GPU <b>2.00 MiB</b> · block rounding <b>2.00 MiB</b><br>verdict"));
    // Without virtual memory the rounding is not counted, and not shown.
    temp_file plain(std::string(k_header_on) + seg_line("segment_alloc", 0, seg, 8 * MiB) +
                    pooled_line("alloc", 1, seg, 3 * MiB, 4 * MiB, seg) +
                    oom_line(2, 5 * MiB, {8 * MiB, 4 * MiB, 3 * MiB, 4 * MiB, 1, 1}, 0, 8 * MiB) + end_line(3, 1));
    auto plain_text = run_gpumem("report --no-progress " + plain.path);
    REQUIRE(plain_text.rc == 0);
    CHECK_THAT(plain_text.out, Catch::Contains("| free on GPU 0 B\n    verdict: capacity"));
}

// tests/emu/pool_app's capture scenario on a 64 MiB emulated device (tests/data/emu/README.md): 4 MiB
// pairs allocated and freed inside a stream capture, where the pool may not wait for a free's work,
// so every free stays pending until the 17th request fails with nothing live.  Said "capacity", the
// report told a program that held nothing that the device was too small.
TEST_CASE("emulated device, frees pending in a stream capture: the OOM is 'pending frees'", "[scenario][vmm]") {
    const std::string log = data_path("emu/capture_64M.jsonl");
    process_report r = analyze_file(log, {});
    const device_report& d = r.devices.at(0);
    CHECK(r.n_warnings == 0);
    REQUIRE(d.ooms.size() == 1);
    const oom_report& o = d.ooms[0];
    CHECK(o.size == 4 * MiB);
    CHECK(o.verdict == "pending frees");
    CHECK(o.pending == 64 * MiB);
    CHECK(o.allocated == 0);
    CHECK(o.free_in_segments == 0);
    CHECK(o.gpu_free == 0);
    auto text = run_gpumem("report --no-progress " + log);
    REQUIRE(text.rc == 0);
    CHECK_THAT(text.out, Catch::Contains("| free on GPU 0 B | pending frees 64.00 MiB | block rounding 0 B\n    verdict: pending frees: "));
    // The line names the failing call's size "request": nothing was live ("requested" 0 B).
    CHECK_THAT(text.out, Catch::Contains("cuMemAlloc_v2 of 4.00 MiB (pool)\n    request 4.00 MiB | free in segments 0 B"));
    CHECK_THAT(text.out, !Catch::Contains("    requested 4.00 MiB |"));
    auto js = run_gpumem("report --no-progress --json " + log);
    REQUIRE(js.rc == 0);
    const auto j = nlohmann::json::parse(js.out)["processes"][0]["devices"][0]["ooms"][0];
    CHECK(j["verdict"] == "pending frees");
    CHECK(j["pending_bytes"] == 64 * MiB);
    // The report JSON prints the same text.
    temp_file report(js.out, "report");
    auto again = run_gpumem("report --no-progress " + report.path);
    REQUIRE(again.rc == 0);
    CHECK(again.out.substr(again.out.find("OOM #1")) == text.out.substr(text.out.find("OOM #1")));
}

TEST_CASE("segment_unmap: a context reset or a segment_free with live blocks drops the holes with the segment", "[scenario][vmm]") {
    const uint64_t seg = 0x40000000;
    const std::string head = std::string(k_header_on) + seg_line("segment_alloc", 0, seg, 8 * MiB) +
                             pooled_line("alloc", 1, seg, MiB, MiB, seg) + unmap_line(2, seg + 2 * MiB, 4 * MiB, seg);
    SECTION("context reset") {
        temp_file f(head + "{\"ev\":\"context_reset\",\"seq\":3,\"t\":400,\"tid\":1,\"dev\":0,\"count\":0}\n" +
                    seg_line("segment_alloc", 4, seg, 8 * MiB) + end_line(5));
        process_report r = analyze_file(f.path, {});
        const device_report& d = r.devices[0];
        CHECK(d.reserved.peak == 8 * MiB);
        CHECK(d.reserved.current == 8 * MiB);  // the new segment, whole: no hole survives the reset
        CHECK(d.unmapped.current == 0);
        CHECK(d.end_free_in_segments == 8 * MiB);
        CHECK(d.end_free_blocks == 1);
    }
    SECTION("segment_free with a live block") {
        temp_file f(head + seg_line("segment_free", 3, seg, 8 * MiB) + end_line(4));
        process_report r = analyze_file(f.path, {});
        const device_report& d = r.devices[0];
        CHECK(r.n_warnings == 1);
        CHECK_THAT(r.warnings.at(0), Catch::Contains("returned to the driver with 1 live and 0 pending block(s)"));
        CHECK(d.reserved.current == 0);
        CHECK(d.unmapped.current == 0);
        CHECK(d.end_free_in_segments == 0);
        CHECK(d.end_free_blocks == 0);
        CHECK(d.allocated.current == 0);
    }
}

TEST_CASE("a stats line is checked against the rebuilt free blocks, holes left out", "[scenario][vmm]") {
    const uint64_t seg = 0x40000000;
    auto stats = [](uint64_t free_blocks, uint64_t largest) {
        return "{\"ev\":\"stats\",\"seq\":3,\"t\":400,\"tid\":1,\"dev\":0,\"reserved\":4194304,\"allocated\":1048576,"
               "\"requested\":1048576,\"largest_free\":" + std::to_string(largest) + ",\"free_blocks\":" +
               std::to_string(free_blocks) + ",\"segments\":1,\"gpu_free\":0,\"gpu_total\":0}\n";
    };
    // One 1 MiB block at the start of an 8 MiB segment, [2, 6) MiB unmapped: free [1, 2) and [6, 8).
    const std::string head = std::string(k_header_on) + seg_line("segment_alloc", 0, seg, 8 * MiB) +
                             pooled_line("alloc", 1, seg, MiB, MiB, seg) + unmap_line(2, seg + 2 * MiB, 4 * MiB, seg);
    {
        temp_file f(head + stats(2, 2 * MiB) + end_line(4, 1));
        CHECK(analyze_file(f.path, {}).n_warnings == 0);
    }
    {
        // What the pool would say if the hole were free: one block of 7 MiB.
        temp_file f(head + stats(1, 7 * MiB) + end_line(4, 1));
        process_report r = analyze_file(f.path, {});
        REQUIRE(r.n_warnings == 1);
        CHECK_THAT(r.warnings[0], Catch::Contains(":5: the pool reports 1 free blocks, the largest 7340032 bytes; "
                                                  "the reconstruction has 2, the largest 2097152"));
    }
}

// A context reset forgets the old segments' holes and counts: after it, a stats line of the pool's
// (one new 8 MiB segment, one free block) agrees with the rebuild, and the map at the end shows no
// unmapped bytes.
TEST_CASE("segment_unmap: after a context reset no hole or segment of the old context is counted", "[scenario][vmm]") {
    const uint64_t seg = 0x40000000;
    const std::string log =
        std::string(k_header_on) + seg_line("segment_alloc", 0, seg, 8 * MiB) + pooled_line("alloc", 1, seg, MiB, MiB, seg) +
        unmap_line(2, seg + 2 * MiB, 4 * MiB, seg) + "{\"ev\":\"context_reset\",\"seq\":3,\"t\":400,\"tid\":1,\"dev\":0,\"count\":0}\n" +
        seg_line("segment_alloc", 4, seg, 8 * MiB) +
        "{\"ev\":\"stats\",\"seq\":5,\"t\":600,\"tid\":1,\"dev\":0,\"reserved\":8388608,\"allocated\":0,\"requested\":0,"
        "\"largest_free\":8388608,\"free_blocks\":1,\"segments\":1,\"gpu_free\":0,\"gpu_total\":0}\n" + end_line(6);
    temp_file f(log);
    analyze_options o;
    REQUIRE(parse_moment("1s", o.at));  // past the end: the map of the end
    process_report r = analyze_file(f.path, o);
    CHECK(r.n_warnings == 0);
    const state_snapshot& s = r.devices[0].at_request;
    REQUIRE(s.valid);
    CHECK(s.unmapped == 0);
    CHECK(s.reserved == 8 * MiB);
    CHECK(s.free_in_segments == 8 * MiB);
    REQUIRE(s.segment_map.size() == 1);
    CHECK(s.segment_map[0].holes.empty());
}
