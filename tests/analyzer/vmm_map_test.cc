// Arena segments on virtual memory: segment_alloc's asize (a segment mapped only in part) and
// segment_map (chunks mapped into a hole), checked number by number, and the log errors they can make.
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

constexpr uint64_t seg = 0x40000000;

std::string hx(uint64_t v) {
    char b[24];
    std::snprintf(b, sizeof b, "0x%llx", (unsigned long long)v);
    return b;
}

// segment_alloc of [ptr, +size) with only `asize` bytes mapped.
std::string arena_line(uint64_t seq, uint64_t ptr, uint64_t size, uint64_t asize) {
    return "{\"ev\":\"segment_alloc\",\"seq\":" + std::to_string(seq) + ",\"t\":" + std::to_string(seq * 100 + 100) +
           ",\"tid\":1,\"dev\":0,\"api\":\"cuMemAlloc_v2\",\"ptr\":\"" + hx(ptr) + "\",\"size\":" + std::to_string(size) +
           ",\"asize\":" + std::to_string(asize) + ",\"pool\":\"large\"}\n";
}

// segment_unmap or segment_map of [ptr, +size) in segment `s`.
std::string chunks_line(const char* ev, uint64_t seq, uint64_t ptr, uint64_t size, uint64_t s = seg) {
    return std::string("{\"ev\":\"") + ev + "\",\"seq\":" + std::to_string(seq) + ",\"t\":" + std::to_string(seq * 100 + 100) +
           ",\"tid\":1,\"dev\":0,\"api\":\"cuMemAlloc_v2\",\"ptr\":\"" + hx(ptr) + "\",\"size\":" + std::to_string(size) +
           ",\"seg\":\"" + hx(s) + "\",\"pool\":\"large\"}\n";
}
std::string map_line(uint64_t seq, uint64_t ptr, uint64_t size, uint64_t s = seg) {
    return chunks_line("segment_map", seq, ptr, size, s);
}
std::string chunk_unmap_line(uint64_t seq, uint64_t ptr, uint64_t size) { return chunks_line("segment_unmap", seq, ptr, size); }

std::string stats_line(uint64_t seq, uint64_t reserved, uint64_t free_blocks, uint64_t largest) {
    return "{\"ev\":\"stats\",\"seq\":" + std::to_string(seq) + ",\"t\":" + std::to_string(seq * 100 + 100) +
           ",\"tid\":1,\"dev\":0,\"reserved\":" + std::to_string(reserved) + ",\"allocated\":0,\"requested\":0,"
           "\"largest_free\":" + std::to_string(largest) + ",\"free_blocks\":" + std::to_string(free_blocks) +
           ",\"segments\":1,\"gpu_free\":0,\"gpu_total\":0}\n";
}

// A header with the pool on, immediate reuse (frees merge at once), and segments on virtual memory.
std::string header_vmm() {
    std::string h = header_reuse("immediate");
    h.replace(h.find("\"reuse\":\"immediate\""), 19, "\"reuse\":\"immediate\",\"pool_vmm\":\"on\"");
    return h;
}

}  // namespace

// tests/data/golden/pool_vmm_map.jsonl, by hand (2 MiB chunks, a 16 MiB GPU, one arena segment
// reserving 32 MiB of address space), offsets in MiB:
//   seq 0  segment_alloc [0, 32) with [0, 4) mapped: reserved 4, unmapped 28, free [0, 4)
//   seq 1  A = [0, 3); seq 2 maps [4, 8), which joins the free tail [3, 4): free [3, 8), reserved 8
//   seq 3  B = [3, 8); seq 4 stats (8 MiB reserved, no free block) agrees
//   seq 5  A freed: free [0, 3); seq 6 unmaps [0, 2): reserved 6; seq 7 maps it again: free [0, 3)
//   seq 8  maps [8, 16): reserved 16 (the peak), free [0, 3) and [8, 16), fragmentation 1 - 8/11
//   seq 9  C = [8, 14): free [0, 3) and [14, 16), 1 - 3/5 = 40% (the maximum)
//   seq 10, 11 unmap [0, 2) and [14, 16): reserved 12, free [2, 3) only; the hole [14, 16) touches
//          the segment's never-mapped [16, 32)
//   seq 12 an 8 MiB request fails: 1 MiB free in segments + 4 MiB on the GPU: capacity
//   seq 14 maps [14, 18), across the two touching holes: free [14, 18), reserved 16 again
//   seq 15 D = [14, 18): allocated 15 MiB, the peak; seq 16 stats agrees (1 free block of 1 MiB)
//   seq 17-19 frees; seq 20 segment_free of a segment holding 16 MiB and 16 MiB of holes.
TEST_CASE("segment_map: an arena segment grows into its holes, and reserved follows exactly", "[scenario][vmm]") {
    process_report r = analyze_file(data_path("golden/pool_vmm_map.jsonl"), {});
    REQUIRE(r.devices.size() == 1);
    const device_report& d = r.devices[0];
    CHECK(r.n_warnings == 0);  // both stats lines agree with the rebuilt reserved bytes and free blocks
    CHECK(d.n_segment_alloc == 1);
    CHECK(d.n_segment_map == 4);
    CHECK(d.n_segment_unmap == 3);
    CHECK(d.reserved.peak == 16 * MiB);
    CHECK(d.reserved.peak_seq == 8);
    CHECK(d.reserved.current == 0);
    CHECK(d.unmapped.peak == 28 * MiB);  // the segment's never-mapped tail, at its segment_alloc
    CHECK(d.unmapped.peak_seq == 0);
    CHECK(d.unmapped.current == 0);
    CHECK(d.allocated.peak == 15 * MiB);
    CHECK(d.allocated.peak_seq == 15);
    CHECK(d.max_external_fragmentation == Approx(0.4));
    CHECK(d.max_external_fragmentation_seq == 9);
    CHECK(d.max_free_blocks == 2);

    std::vector<uint64_t> reserved, seqs;
    for (const time_point& p : d.timeline) {
        reserved.push_back(p.reserved_last);
        seqs.push_back(p.seq_last);
    }
    // Every event but the two stats lines makes a point.
    CHECK(seqs == std::vector<uint64_t>{0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 17, 18, 19, 20});
    CHECK(reserved == std::vector<uint64_t>{4 * MiB, 4 * MiB, 8 * MiB, 8 * MiB, 8 * MiB, 6 * MiB, 8 * MiB, 16 * MiB,
                                            16 * MiB, 14 * MiB, 12 * MiB, 12 * MiB, 12 * MiB, 16 * MiB, 16 * MiB,
                                            16 * MiB, 16 * MiB, 16 * MiB, 0});

    // At the peak of allocated bytes: B, C and D; [2, 3) free; holes [0, 2) and [18, 32).
    REQUIRE(d.at_peak.valid);
    const state_snapshot& k = d.at_peak;
    CHECK(k.reserved == 16 * MiB);
    CHECK(k.unmapped == 16 * MiB);
    CHECK(k.free_in_segments == MiB);
    CHECK(k.free_blocks == 1);
    REQUIRE(k.segment_map.size() == 1);
    const segment_view& v = k.segment_map[0];
    CHECK(v.blocks.size() == 3);
    CHECK(v.holes == std::vector<std::pair<uint64_t, uint64_t>>{{seg, 2 * MiB}, {seg + 18 * MiB, 14 * MiB}});
    CHECK(v.size - v.measure().used == MiB);

    REQUIRE(d.ooms.size() == 1);
    const oom_report& o = d.ooms[0];
    CHECK(o.verdict == "capacity");  // 8 MiB > 1 MiB free in segments + 4 MiB on the GPU
    CHECK(o.reserved == 12 * MiB);
    CHECK(o.free_in_segments == MiB);
    CHECK(o.map.unmapped == 20 * MiB);
}

TEST_CASE("segment_alloc with asize: the unmapped rest is a hole, neither reserved nor free", "[scenario][vmm]") {
    // 8 MiB of address space, 2 MiB mapped; a 1 MiB block at its start.
    const std::string head =
        header_vmm() + arena_line(0, seg, 8 * MiB, 2 * MiB) + pooled_line("alloc", 1, seg, MiB, MiB, seg);
    temp_file f(head + stats_line(2, 2 * MiB, 1, MiB) + end_line(3, 1));
    process_report r = analyze_file(f.path, {});
    const device_report& d = r.devices[0];
    CHECK(r.n_warnings == 0);  // the pool's 2 MiB reserved and one 1 MiB free block: as rebuilt
    CHECK(d.reserved.peak == 2 * MiB);
    CHECK(d.unmapped.current == 6 * MiB);
    CHECK(d.end_free_in_segments == MiB);
    CHECK(d.end_largest_free == MiB);
    CHECK(d.end_external_fragmentation == 0);
    CHECK(d.n_segment_map == 0);

    // What the pool would report if the analyzer took the whole segment as mapped.
    temp_file g(head + stats_line(2, 8 * MiB, 1, 7 * MiB) + end_line(3, 1));
    process_report w = analyze_file(g.path, {});
    REQUIRE(w.n_warnings == 1);
    CHECK_THAT(w.warnings[0], Catch::Contains(":4: the pool reports 8388608 bytes reserved in 1 segments; "
                                              "the reconstruction has 2097152 in 1"));

    // A version 3 segment_alloc without asize is wholly mapped, as before.
    temp_file h(header_vmm() + seg_line("segment_alloc", 0, seg, 8 * MiB) + end_line(1));
    process_report old = analyze_file(h.path, {});
    CHECK(old.devices[0].reserved.current == 8 * MiB);
    CHECK(old.devices[0].unmapped.peak == 0);
}

TEST_CASE("segment_map: growth at the end merges with the free tail", "[scenario][vmm]") {
    // [0, 2) mapped, a 1 MiB block at 0: free [1, 2).  Mapping [2, 4) makes free [1, 4): one block.
    const std::string log = header_vmm() + arena_line(0, seg, 8 * MiB, 2 * MiB) +
                            pooled_line("alloc", 1, seg, MiB, MiB, seg) + map_line(2, seg + 2 * MiB, 2 * MiB) +
                            stats_line(3, 4 * MiB, 1, 3 * MiB) + pooled_line("alloc", 4, seg + MiB, 3 * MiB, 3 * MiB, seg) +
                            end_line(5, 2);
    temp_file f(log);
    process_report r = analyze_file(f.path, {});
    const device_report& d = r.devices[0];
    CHECK(r.n_warnings == 0);  // the stats line: 4 MiB reserved, one free block of 3 MiB
    CHECK(d.n_segment_map == 1);
    CHECK(d.reserved.peak == 4 * MiB);
    CHECK(d.reserved.peak_seq == 2);
    CHECK(d.unmapped.current == 4 * MiB);
    CHECK(d.end_free_in_segments == 0);  // the 3 MiB block fills the merged free block exactly
    CHECK(d.end_free_blocks == 0);

    // The text report counts the maps, and reads them back from its own JSON.
    run_result t = run_gpumem("report --no-progress " + f.path);
    REQUIRE(t.rc == 0);
    CHECK_THAT(t.out, Catch::Contains("| Chunks mapped later (maps)               1   holes (no memory) 4.00 MiB"));
    run_result j = run_gpumem("report --no-progress --json " + f.path);
    REQUIRE(j.rc == 0);
    CHECK_THAT(j.out, Catch::Contains("\"n_segment_map\": 1,"));
    temp_file js(j.out);
    run_result back = run_gpumem("report --no-progress " + js.path);
    REQUIRE(back.rc == 0);
    CHECK_THAT(back.out, Catch::Contains("| Chunks mapped later (maps)               1   holes (no memory) 4.00 MiB"));
}

TEST_CASE("segment_map: a hole cut by segment_unmap is mapped again in part", "[scenario][vmm]") {
    // 8 MiB wholly mapped; blocks at [0, 1) and [7, 8); [2, 6) unmapped: free [1, 2) and [6, 7).
    // Mapping [4, 6) joins [6, 7): free [1, 2) and [4, 7); [2, 4) stays a hole.
    const std::string log = header_vmm() + seg_line("segment_alloc", 0, seg, 8 * MiB) +
                            pooled_line("alloc", 1, seg, MiB, MiB, seg) + pooled_line("alloc", 2, seg + 7 * MiB, MiB, MiB, seg) +
                            chunk_unmap_line(3, seg + 2 * MiB, 4 * MiB) + map_line(4, seg + 4 * MiB, 2 * MiB) + end_line(5, 2);
    temp_file f(log);
    process_report r = analyze_file(f.path, {});
    const device_report& d = r.devices[0];
    CHECK(r.n_warnings == 0);
    CHECK(d.reserved.current == 6 * MiB);
    CHECK(d.reserved.peak == 8 * MiB);
    CHECK(d.unmapped.current == 2 * MiB);
    CHECK(d.unmapped.peak == 4 * MiB);
    CHECK(d.end_free_in_segments == 4 * MiB);
    CHECK(d.end_largest_free == 3 * MiB);
    CHECK(d.end_free_blocks == 2);
    CHECK(d.end_external_fragmentation == Approx(0.25));
    // The rest of the hole is still one: a block in it is refused, naming the unmap's line.
    expect_rejected(log.substr(0, log.rfind("{\"ev\":\"end\"")) + pooled_line("alloc", 5, seg + 2 * MiB, 512, 512, seg) +
                        end_line(6, 3),
                    7, "pooled block [0x40200000, +512) overlaps the range [0x40200000, +2097152) unmapped at line 5");
}

TEST_CASE("segment_map: ranges that are not a hole, or not the segment's, are log errors with file:line", "[scenario][vmm]") {
    // 8 MiB of address space, [0, 4) mapped, a 1 MiB block at 0: free [1, 4), hole [4, 8).
    const std::string head =
        header_vmm() + arena_line(0, seg, 8 * MiB, 4 * MiB) + pooled_line("alloc", 1, seg, MiB, MiB, seg);
    SECTION("free bytes") {
        expect_rejected(head + map_line(2, seg + 2 * MiB, 4 * MiB) + end_line(3, 1), 4,
                        "segment_map of [0x40200000, +4194304) covers the free bytes [0x40200000, +2097152) in segment "
                        "0x40000000: only a hole can be mapped");
    }
    SECTION("a live block") {
        expect_rejected(head + map_line(2, seg, 2 * MiB) + end_line(3, 1), 4,
                        "segment_map of [0x40000000, +2097152) covers the live block [0x40000000, +1048576) allocated at line 3");
    }
    SECTION("free bytes that start where a live block ends") {
        // The block [0, 1) ends at the range's start: the range begins in free bytes, not in the block.
        expect_rejected(head + map_line(2, seg + MiB, MiB) + end_line(3, 1), 4,
                        "segment_map of [0x40100000, +1048576) covers the free bytes [0x40100000, +1048576) in segment "
                        "0x40000000: only a hole can be mapped");
    }
    SECTION("the same chunks mapped twice") {
        expect_rejected(head + map_line(2, seg + 4 * MiB, 2 * MiB) + map_line(3, seg + 4 * MiB, 2 * MiB) + end_line(4, 1), 5,
                        "segment_map of [0x40400000, +2097152) covers the free bytes [0x40400000, +2097152)");
    }
    SECTION("a hole and then a live block") {
        // [4, 6) mapped and taken by a block, [2, 4) unmapped: a map of [2, 6) runs from the hole
        // into the block.
        expect_rejected(head + map_line(2, seg + 4 * MiB, 2 * MiB) + pooled_line("alloc", 3, seg + 4 * MiB, 2 * MiB, 2 * MiB, seg) +
                            chunk_unmap_line(4, seg + 2 * MiB, 2 * MiB) + map_line(5, seg + 2 * MiB, 4 * MiB) + end_line(6, 2),
                        7, "segment_map of [0x40200000, +4194304) covers the live block [0x40400000, +2097152) allocated at line 5");
    }
    SECTION("outside its segment") {
        expect_rejected(head + map_line(2, seg + 6 * MiB, 4 * MiB) + end_line(3, 1), 4,
                        "segment_map of [0x40600000, +4194304) lies outside segment [0x40000000, +8388608)");
    }
    SECTION("a segment that is not held") {
        expect_rejected(head + map_line(2, 0x50000000, 2 * MiB, 0x50000000) + end_line(3, 1), 4,
                        "segment_map of [0x50000000, +2097152) in segment 0x50000000, which is not a held segment");
    }
    SECTION("a segment that was given back") {
        expect_rejected(header_vmm() + arena_line(0, seg, 8 * MiB, 4 * MiB) + seg_line("segment_free", 1, seg, 8 * MiB) +
                            map_line(2, seg + 4 * MiB, 2 * MiB) + end_line(3),
                        4, "segment_map of [0x40400000, +2097152) in segment 0x40000000, which is not a held segment");
    }
    SECTION("a block in the never-mapped rest") {
        expect_rejected(head + pooled_line("alloc", 2, seg + 5 * MiB, 512, 512, seg) + end_line(3, 2), 4,
                        "pooled block [0x40500000, +512) overlaps the range [0x40400000, +4194304) not mapped since its "
                        "segment_alloc at line 2");
    }
    SECTION("asize above size") {
        expect_rejected(header_vmm() + arena_line(0, seg, 8 * MiB, 16 * MiB) + end_line(1), 2,
                        "segment_alloc of [0x40000000, +8388608) maps 16777216 bytes (asize), more than the segment");
    }
}

TEST_CASE("segment_map: touching holes are one hole; a context reset drops an arena's holes", "[scenario][vmm]") {
    // [0, 4) mapped of 8 MiB, free; [2, 4) unmapped touches the never-mapped [4, 8).  One map over
    // [2, 6) crosses from one to the other: free [0, 6), holes [6, 8).
    const std::string head = header_vmm() + arena_line(0, seg, 8 * MiB, 4 * MiB) + chunk_unmap_line(1, seg + 2 * MiB, 2 * MiB) +
                             map_line(2, seg + 2 * MiB, 4 * MiB);
    {
        temp_file f(head + stats_line(3, 6 * MiB, 1, 6 * MiB) + end_line(4));
        process_report r = analyze_file(f.path, {});
        const device_report& d = r.devices[0];
        CHECK(r.n_warnings == 0);
        CHECK(d.reserved.current == 6 * MiB);
        CHECK(d.unmapped.current == 2 * MiB);
        CHECK(d.end_free_blocks == 1);
        CHECK(d.end_largest_free == 6 * MiB);
    }
    {
        temp_file f(head + "{\"ev\":\"context_reset\",\"seq\":3,\"t\":400,\"tid\":1,\"dev\":0,\"count\":0}\n" +
                    arena_line(4, seg, 8 * MiB, 2 * MiB) + end_line(5));
        process_report r = analyze_file(f.path, {});
        const device_report& d = r.devices[0];
        CHECK(d.reserved.current == 2 * MiB);  // the new arena's first chunk only
        CHECK(d.unmapped.current == 6 * MiB);  // its own hole; none of the old segment's survives
        CHECK(d.end_free_in_segments == 2 * MiB);
        CHECK(d.end_free_blocks == 1);
    }
}

TEST_CASE("an arena segment makes the OOM verdict one of a pool on virtual memory", "[scenario][vmm]") {
    // No pool_vmm in the header, no segment_unmap: only the arena's hole says the pool is on
    // virtual memory.  A 1 MiB block in [0, 2) mapped, [1, 2) free; a 2 MiB + 1 request with 2 MiB
    // free on the GPU fits the bytes (1 + 2 MiB) but not in whole chunks: chunk rounding.
    const std::string log = std::string(k_header_on) + arena_line(0, seg, 8 * MiB, 2 * MiB) +
                            pooled_line("alloc", 1, seg, MiB, MiB, seg) +
                            oom_line(2, 2 * MiB + 1, {2 * MiB, MiB, MiB, MiB, 1, 1}, 2 * MiB, 8 * MiB) +
                            end_line(3, 1);
    temp_file f(log);
    process_report r = analyze_file(f.path, {});
    REQUIRE(r.devices[0].ooms.size() == 1);
    CHECK(r.devices[0].ooms[0].verdict == "chunk rounding");
}

// segment_free of an arena segment gives back what it held, its mapped bytes, not its whole
// address space: the pool's next stats line (one new 2 MiB segment, one free block) agrees.
TEST_CASE("segment_free of an arena segment takes only its mapped bytes out of reserved", "[scenario][vmm]") {
    temp_file f(header_vmm() + arena_line(0, seg, 8 * MiB, 4 * MiB) + seg_line("segment_free", 1, seg, 8 * MiB) +
                seg_line("segment_alloc", 2, 0x50000000, 2 * MiB) + stats_line(3, 2 * MiB, 1, 2 * MiB) + end_line(4));
    process_report r = analyze_file(f.path, {});
    CHECK(r.n_warnings == 0);
    const device_report& d = r.devices[0];
    CHECK(d.reserved.current == 2 * MiB);
    CHECK(d.unmapped.current == 0);
    CHECK(d.end_free_in_segments == 2 * MiB);
    // The map after it (--at) has no unmapped bytes left of the old segment's hole either.
    analyze_options o;
    REQUIRE(parse_moment("3", o.at));
    process_report at = analyze_file(f.path, o);
    const state_snapshot& s = at.devices[0].at_request;
    REQUIRE(s.valid);
    CHECK(s.reserved == 2 * MiB);
    CHECK(s.unmapped == 0);
}
