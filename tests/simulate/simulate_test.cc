// Unit tests of the replay policies: each rule of PyTorch's allocator model, the expandable path,
// OOM at a capacity and its verdict, ideal and gpumem, with hand-computed expectations.
#include <catch2/catch.hpp>

#include <fstream>
#include <random>

#include <unistd.h>

#include "gpumem_pool.h"
#include "ideal.h"
#include "pytorch.h"
#include "replay.h"
#include "trace.h"

using namespace gpumem::simulate;

namespace {
constexpr uint64_t KiB = 1024, MiB = 1024 * KiB;

pt_config conf(const std::string& text) {
    pt_config c;
    std::string err = parse_pt_config(text, c);
    REQUIRE(err == "");
    return c;
}

// Two 30 MiB segments allocated and freed (60 MiB cached), then a 36 MiB request that none of them
// serves: what garbage_collection_threshold acts on, or does not.
void cache_two_then_ask(pytorch_policy& p) {
    REQUIRE(p.allocate(0, 30 * MiB, 0));
    REQUIRE(p.allocate(1, 30 * MiB, 0));
    p.release(0);
    p.release(1);
    REQUIRE(p.allocate(2, 36 * MiB, 0));
}

// A device trace from "+id size" / "-id" steps, seq = position.
device_trace steps(std::initializer_list<std::pair<int64_t, uint64_t>> s) {
    device_trace t;
    t.dev = 0;
    uint64_t seq = 0;
    for (auto [id, size] : s) {
        request r;
        r.seq = seq;
        r.t = seq * 1000;
        ++seq;
        if (id >= 0) {
            r.id = uint32_t(id);
            r.size = size;
            t.n_ids = std::max(t.n_ids, r.id + 1);
        } else {
            r.id = uint32_t(-id - 1);
            r.is_free = true;
        }
        t.ops.push_back(r);
    }
    return t;
}
std::pair<int64_t, uint64_t> A(int64_t id, uint64_t size) { return {id, size}; }
std::pair<int64_t, uint64_t> F(int64_t id) { return {-id - 1, 0}; }
}  // namespace

TEST_CASE("round_size: 512 B steps, or power-of-two divisions per interval") {
    pt_config d;
    CHECK(pytorch_policy::round_size(1, d) == 512);
    CHECK(pytorch_policy::round_size(512, d) == 512);
    CHECK(pytorch_policy::round_size(513, d) == 1024);
    CHECK(pytorch_policy::round_size(1258291, d) == 1258496);  // 1.2 MiB -> next multiple of 512
    pt_config four = conf("roundup_power2_divisions:4");
    // 1.2 MiB lies between 1 and 2 MiB; four steps of 256 KiB: 1.25 MiB.
    CHECK(pytorch_policy::round_size(1258291, four) == 1310720);
    CHECK(pytorch_policy::round_size(2 * MiB, four) == 2 * MiB);          // a power of two stays
    CHECK(pytorch_policy::round_size(1200, four) == 1536);                // not above 512 * 4: plain rounding
    CHECK(pytorch_policy::round_size(5 * MiB + 1, four) == 6 * MiB);      // steps of 1 MiB in [4, 8) MiB
    pt_config list = conf("roundup_power2_divisions:[4:1,8:2,>:8]");
    CHECK(list.divisions_for(1 * MiB) == 1);    // intervals below the first named one take its value
    CHECK(list.divisions_for(5 * MiB) == 1);    // [4, 8) MiB: 1 (no rounding)
    CHECK(list.divisions_for(9 * MiB) == 2);    // [8, 16) MiB keeps its own 2: ">" fills only the intervals after it
    CHECK(list.divisions_for(16 * MiB) == 8);
    CHECK(list.divisions_for(40 * MiB) == 8);
    // Two steps of 4 MiB in [8, 16) MiB: 9 MiB + 1 -> 12 MiB.
    CHECK(pytorch_policy::round_size(9 * MiB + 1, list) == 12 * MiB);
}

TEST_CASE("roundup_power2_divisions list: '>' sets the intervals after the last named one, 0 turns one off") {
    // AcceleratorAllocatorConfig::parseRoundUpPower2Divisions (c10/core/AllocatorConfig.cpp, PyTorch
    // 2.10 on, PR 165304) fills from last_index + 1 for ">": the last named interval keeps its own
    // value.  "[64:8,>:2]": "64:8" sets index 6 (64 MiB) and, being the first, indices 0-5 too;
    // ">:2" then sets 7-15.  A 70 MiB request lies in [64, 128) MiB: 8 steps of 8 MiB, so
    // round_size gives 72 MiB and get_allocation_size a 72 MiB segment (2 steps of 32 MiB, 96 MiB,
    // was the old reading that let ">" overwrite index 6).
    pytorch_policy p(conf("roundup_power2_divisions:[64:8,>:2]"), 0, 0);
    REQUIRE(p.allocate(0, 70 * MiB, 0));
    CHECK(p.block_size(0) == 72 * MiB);
    CHECK(p.reserved() == 72 * MiB);
    REQUIRE(p.allocate(1, 130 * MiB, 0));  // [128, 256) MiB: ">"'s 2 steps of 64 MiB -> 192 MiB
    CHECK(p.block_size(1) == 192 * MiB);
    // A list of only ">" leaves index 0 (every size below 2 MiB) unrounded: last_index starts at 0.
    // 600 KiB stays 614400 B (a multiple of 512), where 4 divisions would make it 640 KiB.
    pytorch_policy q(conf("roundup_power2_divisions:[>:4]"), 0, 0);
    REQUIRE(q.allocate(0, 600 * KiB, 0));
    CHECK(q.block_size(0) == 600 * KiB);
    REQUIRE(q.allocate(1, 3 * MiB + 1, 0));  // [2, 4) MiB: 4 steps of 512 KiB -> 3.5 MiB
    CHECK(q.block_size(1) == 3 * MiB + 512 * KiB);
    // A division of 0 in the list form turns rounding off for its interval ("val == 0 ||
    // isPowerOf2"); the single-value form still wants a power of two.
    pt_config off = conf("roundup_power2_divisions:[1:0,4:0,>:4]");
    CHECK(off.divisions_for(1 * MiB) == 0);
    CHECK(off.divisions_for(2 * MiB) == 0);  // index 1, between two named intervals: untouched, 0
    CHECK(off.divisions_for(5 * MiB) == 0);
    CHECK(off.divisions_for(9 * MiB) == 4);
    CHECK(pytorch_policy::round_size(5 * MiB + 1, off) == 5 * MiB + 512);
    pt_config c;
    CHECK(parse_pt_config("roundup_power2_divisions:0", c) != "");
    // The list form round-trips through to_conf, zeros included.
    pt_config back = conf(off.to_conf());
    CHECK(back.roundup_divisions == off.roundup_divisions);
    pt_config first = conf("roundup_power2_divisions:[64:8]");  // indices 7-15 stay 0
    CHECK(conf(first.to_conf()).roundup_divisions == first.roundup_divisions);
}

TEST_CASE("allocation_size: 2 MiB small segments, 20 MiB below 10 MiB, else rounded to 2 MiB") {
    pytorch_policy p(pt_config{}, 0, 0);
    CHECK(p.allocation_size(512) == 2 * MiB);
    CHECK(p.allocation_size(1 * MiB) == 2 * MiB);
    CHECK(p.allocation_size(1 * MiB + 512) == 20 * MiB);
    CHECK(p.allocation_size(10 * MiB - 512) == 20 * MiB);
    CHECK(p.allocation_size(10 * MiB) == 10 * MiB);
    CHECK(p.allocation_size(11 * MiB + 1) == 12 * MiB);
    // large_segment_size_mb (torch 2.11) sets the 1-10 MiB segment; it must be above 10 MiB.
    pytorch_policy big(conf("large_segment_size_mb:64"), 0, 0);
    CHECK(big.allocation_size(1 * MiB + 512) == 64 * MiB);
    CHECK(big.allocation_size(10 * MiB) == 10 * MiB);
    CHECK(big.allocation_size(1 * MiB) == 2 * MiB);
    pt_config c;
    CHECK(parse_pt_config("large_segment_size_mb:10", c) != "");
    CHECK(parse_pt_config("large_segment_size_mb:11", c) == "");
    CHECK(parse_pt_config("large_segment_size_mb:17592186044415", c) != "");  // no address-space overflow
    CHECK(conf("large_segment_size_mb:40").to_conf() == "large_segment_size_mb:40");
    // An expandable segment's large pages are that size too: one 3 MiB request maps a 64 MiB page.
    pytorch_policy ex(conf("expandable_segments:True,large_segment_size_mb:64"), 0, 1ull << 34);
    REQUIRE(ex.allocate(0, 3 * MiB, 0));
    CHECK(ex.reserved() == 64 * MiB);
}

TEST_CASE("small pool: requests share a 2 MiB segment, remainders of 512 B or more are split off") {
    pytorch_policy p(pt_config{}, 0, 0);
    REQUIRE(p.allocate(0, 1000, 0));
    CHECK(p.block_size(0) == 1024);
    CHECK(p.reserved() == 2 * MiB);
    CHECK(p.largest_free() == 2 * MiB - 1024);
    REQUIRE(p.allocate(1, 1000, 0));
    CHECK(p.driver_allocs() == 1);
    CHECK(p.allocated() == 2048);
    p.release(0);  // a hole before block 1: two free blocks, no merge
    CHECK(p.largest_free() == 2 * MiB - 2048);
    p.release(1);  // merges with both neighbours: the whole segment is one free block again
    CHECK(p.largest_free() == 2 * MiB);
    CHECK(p.allocated() == 0);
}

TEST_CASE("large pool: 1-10 MiB requests share 20 MiB segments, remainders above 1 MiB split") {
    pytorch_policy p(pt_config{}, 0, 0);
    REQUIRE(p.allocate(0, 3 * MiB, 0));
    CHECK(p.reserved() == 20 * MiB);
    CHECK(p.block_size(0) == 3 * MiB);
    REQUIRE(p.allocate(1, 16 * MiB + 512 * KiB, 0));  // fits the 17 MiB rest; 0.5 MiB is not split off
    CHECK(p.block_size(1) == 17 * MiB);
    CHECK(p.driver_allocs() == 1);
    REQUIRE(p.allocate(2, 5 * MiB, 0));               // nothing free: a second 20 MiB segment
    CHECK(p.reserved() == 40 * MiB);
    CHECK(p.live_segments() == 2);
    REQUIRE(p.allocate(3, 12 * MiB + 1, 0));          // fits the second segment's 15 MiB rest
    CHECK(p.block_size(3) == 12 * MiB + 512);
    CHECK(p.reserved() == 40 * MiB);
    REQUIRE(p.allocate(4, 21 * MiB + 1, 0));          // its own segment, rounded up to 2 MiB
    CHECK(p.reserved() == 62 * MiB);
}

TEST_CASE("large pool: a remainder of exactly 1 MiB stays in the block, one of 1 MiB + 512 B is split off") {
    // CUDACachingAllocator's should_split: remaining > kSmallSize for the large pool.
    {
        pytorch_policy p(pt_config{}, 0, 0);
        REQUIRE(p.allocate(0, 20 * MiB, 0));  // a 20 MiB segment of its own
        p.release(0);
        REQUIRE(p.allocate(1, 19 * MiB, 0));
        CHECK(p.block_size(1) == 20 * MiB);
        CHECK(p.largest_free() == 0);
    }
    pytorch_policy p(pt_config{}, 0, 0);
    REQUIRE(p.allocate(0, 20 * MiB, 0));
    p.release(0);
    REQUIRE(p.allocate(1, 19 * MiB - 512, 0));
    CHECK(p.block_size(1) == 19 * MiB - 512);
    CHECK(p.largest_free() == MiB + 512);
}

TEST_CASE("max_split_size: oversize blocks are not split, and serve only requests within 20 MiB") {
    {
        pytorch_policy p(pt_config{}, 0, 0);  // default: a 40 MiB free block is split for 30 MiB
        REQUIRE(p.allocate(0, 40 * MiB, 0));
        p.release(0);
        REQUIRE(p.allocate(1, 30 * MiB, 0));
        CHECK(p.driver_allocs() == 1);
        CHECK(p.block_size(1) == 30 * MiB);
    }
    pytorch_policy p(conf("max_split_size_mb:32"), 0, 0);
    REQUIRE(p.allocate(0, 40 * MiB, 0));
    p.release(0);
    REQUIRE(p.allocate(1, 30 * MiB, 0));  // below max_split_size: the 40 MiB block is refused
    CHECK(p.driver_allocs() == 2);
    REQUIRE(p.allocate(2, 38 * MiB, 0));  // at or above it: taken whole, within 20 MiB of the request
    CHECK(p.driver_allocs() == 2);
    CHECK(p.block_size(2) == 40 * MiB);
    p.release(2);
    REQUIRE(p.allocate(3, 18 * MiB + 1, 0));  // below it again: a new 20 MiB segment, not a piece of the 40
    CHECK(p.driver_allocs() == 3);
    CHECK(p.reserved() == 90 * MiB);
    // max_split_size_mb:20, the least PyTorch takes (>= 20 since 2.9): a 20 MiB segment is itself
    // oversize once whole again.  get_free_block refuses it for a 5 MiB request (5 < 20, block >= 20),
    // so alloc_block makes a second one.
    pytorch_policy twenty(conf("max_split_size_mb:20"), 0, 0);
    REQUIRE(twenty.allocate(0, 5 * MiB, 0));  // split: 5 < 20 and the 15 MiB rest is above 1 MiB
    CHECK(twenty.block_size(0) == 5 * MiB);
    twenty.release(0);
    REQUIRE(twenty.allocate(1, 5 * MiB, 0));
    CHECK(twenty.driver_allocs() == 2);
    CHECK(twenty.reserved() == 40 * MiB);
}

TEST_CASE("max_split_size at its boundaries: a request of exactly max_split_size is not split, a block of exactly request + 20 MiB is refused") {
    // should_split(): size < max_split_size && remaining > kSmallSize.  A request of exactly
    // max_split_size_mb:32 takes a cached 40 MiB block whole (40 < 32 + 20), and the 8 MiB past it
    // stays in the block: split, it would hand out 32 MiB and cache 8.
    pytorch_policy p(conf("max_split_size_mb:32"), 0, 0);
    REQUIRE(p.allocate(0, 40 * MiB, 0));
    p.release(0);
    REQUIRE(p.allocate(1, 32 * MiB, 0));
    CHECK(p.driver_allocs() == 1);
    CHECK(p.block_size(1) == 40 * MiB);
    CHECK(p.largest_free() == 0);
    // get_free_block(): for a request of max_split_size or more, an oversize block is refused once it
    // is >= the request + max_non_split_rounding (20 MiB): 60 MiB for 40 is refused, a new segment comes.
    pytorch_policy q(conf("max_split_size_mb:32"), 0, 0);
    REQUIRE(q.allocate(0, 60 * MiB, 0));
    q.release(0);
    REQUIRE(q.allocate(1, 40 * MiB, 0));
    CHECK(q.driver_allocs() == 2);
    CHECK(q.block_size(1) == 40 * MiB);
    CHECK(q.reserved() == 100 * MiB);
}

TEST_CASE("max_split_size under a capacity: release_available_cached_blocks frees oversize blocks only, before everything cached goes") {
    // malloc(): when alloc_block fails, release_available_cached_blocks runs before
    // release_cached_blocks.  With max_split_size_mb:32 it frees cached blocks of 32 MiB or more,
    // the largest first, until they cover the request; the cached 20 and 16 MiB segments and the
    // small pool's 2 MiB stay.  When the oversize blocks cannot cover it, it frees what it passed and
    // fails, and release_cached_blocks then frees every unsplit cached block.
    auto cache_five = [](pytorch_policy& p) {
        REQUIRE(p.allocate(0, 36 * MiB, 0));  // a 36 MiB segment (oversize)
        REQUIRE(p.allocate(1, 34 * MiB, 0));  // 34 MiB (oversize)
        REQUIRE(p.allocate(2, 5 * MiB, 0));   // a 20 MiB segment, split 5 + 15
        REQUIRE(p.allocate(3, 16 * MiB, 0));  // more than the free 15: a 16 MiB segment
        REQUIRE(p.allocate(4, 1000, 0));      // a 2 MiB small segment
        REQUIRE(p.reserved() == 108 * MiB);
        for (uint32_t id = 0; id < 5; ++id) p.release(id);
    };
    pytorch_policy p(conf("max_split_size_mb:32"), 120 * MiB, 0);
    cache_five(p);
    // 60 MiB: 108 + 60 > 120.  No single block is >= 60, so the 36 and then the 34 go (70 >= 60).
    REQUIRE(p.allocate(5, 60 * MiB, 0));
    CHECK(p.driver_frees() == 2);
    CHECK(p.reserved() == 98 * MiB);  // 20 + 16 + 2 still cached, and the new 60
    pytorch_policy q(conf("max_split_size_mb:32"), 120 * MiB, 0);
    cache_five(q);
    // 80 MiB: 36 + 34 = 70 < 80, and the 20 MiB block is below max_split_size, so the loop stops
    // there: release_cached_blocks frees the 20, the 16 and the 2 too.
    REQUIRE(q.allocate(5, 80 * MiB, 0));
    CHECK(q.driver_frees() == 5);
    CHECK(q.reserved() == 80 * MiB);
}

TEST_CASE("expandable segments grow one mapping in 20 MiB pages and keep blocks contiguous") {
    pytorch_policy p(conf("expandable_segments:True"), 0, 80ull << 30);
    REQUIRE(p.allocate(0, 3 * MiB, 0));
    CHECK(p.reserved() == 20 * MiB);  // one large page
    CHECK(p.driver_allocs() == 1);
    CHECK(p.largest_free() == 17 * MiB);
    // 25 MiB: the free 17 MiB at the end plus one more page; the block starts right after block 0.
    REQUIRE(p.allocate(1, 25 * MiB, 0));
    CHECK(p.reserved() == 40 * MiB);
    CHECK(p.driver_allocs() == 2);
    CHECK(p.block_size(1) == 25 * MiB);
    CHECK(p.largest_free() == 12 * MiB);  // any remainder of 512 B or more is split in expandable mode
    // The small pool grows its own mapping in 2 MiB pages.
    REQUIRE(p.allocate(2, 1000, 0));
    CHECK(p.reserved() == 42 * MiB);
    CHECK(p.driver_allocs() == 3);
    p.release(1);
    p.release(0);
    CHECK(p.largest_free() == 40 * MiB);  // one free block over both pages
}

TEST_CASE("expandable segments: best fit keeps the lower address among free blocks that can grow to the same size") {
    // get_free_block() moves past the first fitting block of an expandable segment only to one whose
    // expandable size (its own plus the unmapped space right after it) is strictly smaller.  Five
    // 4 MiB blocks fill one 20 MiB page; freeing the 2nd and the 4th leaves two 4 MiB holes between
    // allocated blocks.  A 4 MiB request takes the lower hole, so freeing the 1st block leaves 4 MiB
    // pieces only; had it taken the upper one, the 1st would merge with the lower hole into 8 MiB.
    pytorch_policy p(conf("expandable_segments:True"), 0, 1ull << 30);
    for (uint32_t id = 0; id < 5; ++id) REQUIRE(p.allocate(id, 4 * MiB, 0));
    REQUIRE(p.reserved() == 20 * MiB);
    p.release(1);
    p.release(3);
    REQUIRE(p.allocate(5, 4 * MiB, 0));
    p.release(0);
    CHECK(p.largest_free() == 4 * MiB);
}

TEST_CASE("expandable segments: out of memory unmaps the free pages of cached blocks and retries") {
    // release_cached_blocks() -> release_blocks(): a free block of an expandable segment has its
    // whole pages unmapped.  Stream 0 maps two 20 MiB pages for 30 MiB and frees it; stream 1 then
    // needs two pages of its own, which a 60 MiB device has room for only once stream 0's are unmapped.
    pytorch_policy p(conf("expandable_segments:True"), 60 * MiB, 100 * MiB);
    REQUIRE(p.allocate(0, 30 * MiB, 0));
    CHECK(p.reserved() == 40 * MiB);
    p.release(0);
    REQUIRE(p.allocate(1, 30 * MiB, 1));
    CHECK(p.reserved() == 40 * MiB);
    CHECK(p.driver_frees() == 1);  // one unmap
    CHECK(p.driver_allocs() == 2);
}

TEST_CASE("expandable segments: a request that starts in an unmapped hole maps only the hole before the free pages after it") {
    // try_allocate_expandable_block(): the candidate "unmapped -> free" maps min(candidate size,
    // request), then merges with the free block after it; the pages already mapped are not mapped
    // again.  A 100 MiB device allows 0.7 of it (70 MiB, checked against get_allocation_size before
    // mapping) and has six pages of address space.  Three 20 MiB blocks fill pages 0-2; the middle one
    // is freed, and a request that the limit refuses makes release_cached_blocks unmap page 1.
    // Freeing page 2 then leaves: block 0, unmapped page 1, free page 2.  30 MiB starts at page 1:
    // page 1 is mapped again (60 MiB reserved, not 80) and page 2 joins it.
    pytorch_policy p(conf("expandable_segments:True,per_process_memory_fraction:0.7"), 0, 100 * MiB);
    for (uint32_t id = 0; id < 3; ++id) REQUIRE(p.allocate(id, 20 * MiB, 0));
    REQUIRE(p.reserved() == 60 * MiB);
    p.release(1);
    CHECK_FALSE(p.allocate(3, 40 * MiB, 1));  // 60 + 40 > 70, and 40 + 40 still, after page 1 is unmapped
    REQUIRE(p.reserved() == 40 * MiB);
    p.release(2);
    REQUIRE(p.allocate(4, 30 * MiB, 0));      // 40 + 30 <= 70
    CHECK(p.reserved() == 60 * MiB);
    CHECK(p.driver_allocs() == 4);
    CHECK(p.block_size(4) == 30 * MiB);
    CHECK(p.largest_free() == 10 * MiB);
}

TEST_CASE("OOM at capacity: cached unsplit segments are freed and the request retried") {
    pytorch_policy p(pt_config{}, 64 * MiB, 0);
    REQUIRE(p.allocate(0, 30 * MiB, 0));
    REQUIRE(p.allocate(1, 30 * MiB, 0));
    p.release(0);
    REQUIRE(p.allocate(2, 31 * MiB, 0));  // 60 + 32 > 64: the cached 30 MiB segment goes back first
    CHECK(p.driver_frees() == 1);
    CHECK(p.reserved() == 62 * MiB);
    CHECK_FALSE(p.allocate(3, 40 * MiB, 0));
}

TEST_CASE("replay: peak, moment, and the failure verdicts capacity and fragmentation") {
    {
        auto t = steps({A(0, 30 * MiB), A(1, 30 * MiB), F(0), A(2, 40 * MiB)});
        pytorch_policy p(pt_config{}, 64 * MiB, 0);
        replay_result r = replay(t, p, "pytorch", 64 * MiB);
        CHECK(r.failure == failure_reason::capacity);  // 40 MiB > 0 free in segments + 34 MiB untouched
        CHECK(r.fail_seq == 3);
        CHECK(r.peak_reserved == 60 * MiB);
        CHECK(r.peak_seq == 1);
        CHECK(r.driver_frees == 1);
    }
    {
        // Six 6 MiB blocks fill two 20 MiB segments (three each, 2 MiB tails).  Freeing the first
        // and the fifth leaves 16 MiB free in pieces of at most 6 MiB: 10 MiB cannot be served.
        auto t = steps({A(0, 6 * MiB), A(1, 6 * MiB), A(2, 6 * MiB), A(3, 6 * MiB), A(4, 6 * MiB), A(5, 6 * MiB),
                        F(0), F(4), A(6, 10 * MiB)});
        pytorch_policy p(pt_config{}, 40 * MiB, 0);
        replay_result r = replay(t, p, "pytorch", 40 * MiB);
        CHECK(r.failure == failure_reason::fragmentation);
        CHECK(r.fail_seq == 8);
        CHECK(r.fail_free_in_segments == 16 * MiB);
        CHECK(r.fail_largest_free == 6 * MiB);
        // Peak external fragmentation: after F(4), 1 - 6/16.
        CHECK(r.peak_fragmentation == Approx(1.0 - 6.0 / 16.0));
        CHECK(r.frag_seq == 7);
    }
}

TEST_CASE("replay's verdict: a request exactly as large as all free bytes is fragmentation, not capacity") {
    // docs/metrics.md: capacity only when even all free bytes in one piece plus the untouched memory
    // could not hold the request.  The six 6 MiB blocks of the test above with the 1st and 5th freed:
    // 16 MiB free in segments, nothing untouched on a 40 MiB device.  16 MiB would fit in one piece.
    auto t = steps({A(0, 6 * MiB), A(1, 6 * MiB), A(2, 6 * MiB), A(3, 6 * MiB), A(4, 6 * MiB), A(5, 6 * MiB),
                    F(0), F(4), A(6, 16 * MiB)});
    pytorch_policy p(pt_config{}, 40 * MiB, 0);
    replay_result r = replay(t, p, "pytorch", 40 * MiB);
    CHECK(r.fail_seq == 8);
    CHECK(r.fail_free_in_segments == 16 * MiB);
    CHECK(r.failure == failure_reason::fragmentation);
}

TEST_CASE("replay's peak fragmentation is the first event that reached it, as every peak's moment") {
    // docs/metrics.md: "when" is always the first event at which a peak is reached.  Three 6 MiB
    // blocks in one 20 MiB segment; freeing the middle one leaves 6 of 8 free MiB in the largest
    // piece (0.25) at seq 3; the 4th request takes that hole back, and its free (seq 5) makes the
    // same layout again.  The tie must keep seq 3.
    auto t = steps({A(0, 6 * MiB), A(1, 6 * MiB), A(2, 6 * MiB), F(1), A(3, 6 * MiB), F(3)});
    pytorch_policy p(pt_config{}, 0, 0);
    replay_result r = replay(t, p, "pytorch", 0);
    CHECK(r.peak_fragmentation == Approx(0.25));
    CHECK(r.frag_seq == 3);
}

TEST_CASE("ideal: the peak of live requested bytes, failing only past the capacity") {
    auto t = steps({A(0, 100), A(1, 300), F(0), A(2, 250), F(1), F(2)});
    ideal_policy p(0);
    replay_result r = replay(t, p, "ideal", 0);
    CHECK(r.peak_reserved == 550);
    CHECK(r.peak_seq == 3);
    CHECK(r.driver_allocs == 0);
    ideal_policy small(500);
    CHECK(replay(t, small, "ideal", 500).failure == failure_reason::capacity);
}

TEST_CASE("gpumem policy: the pool's own segments, knobs from the header and the command line") {
    gpumem::pool_config cfg;
    // A log of a run without the pool: the pool's defaults, on virtual memory with arenas.  Each
    // pool maps only what its first request needs: a 2 MiB small segment, 4 MiB for 3 MiB.
    REQUIRE(gpumem_pool_config("{\"pool\":\"off\"}", "", cfg) == "");
    CHECK(cfg.vmm);
    gpumem_pool_policy p(cfg, 0);
    REQUIRE(p.allocate(0, 1000, 0));
    REQUIRE(p.allocate(1, 3 * MiB, 0));
    CHECK(p.reserved() == 6 * MiB);
    p.release(0);
    p.release(1);
    CHECK(p.allocated() == 0);
    // A log written with cuMemAlloc segments says so in its header.
    REQUIRE(gpumem_pool_config("{\"pool\":\"on\",\"pool_vmm\":\"off\"}", "", cfg) == "");
    gpumem_pool_policy q(cfg, 0);
    REQUIRE(q.allocate(0, 1000, 0));
    REQUIRE(q.allocate(1, 3 * MiB, 0));
    CHECK(q.reserved() == 22 * MiB);  // a 2 MiB small segment and a 20 MiB large one, as PyTorch
    CHECK(q.driver_allocs() == 2);
    REQUIRE(gpumem_pool_config("{\"pool_large_segment\":20971520}", "pool_large_segment=64MiB", cfg) == "");
    CHECK(cfg.large_segment == 64 * MiB);
    // Stitching's kept ranges: a header from before the knob kept none; a newer one says.
    REQUIRE(gpumem_pool_config("{\"pool_stitch\":\"on\"}", "", cfg) == "");
    CHECK(cfg.stitch);
    CHECK(cfg.stitch_keep == 0);
    REQUIRE(gpumem_pool_config("{\"pool_stitch\":\"on\",\"pool_stitch_keep\":2}", "", cfg) == "");
    CHECK(cfg.stitch_keep == 2);
    REQUIRE(gpumem_pool_config("{\"pool_stitch\":\"on\"}", "pool_stitch_keep=4", cfg) == "");
    CHECK(cfg.stitch_keep == 4);
    CHECK(gpumem_pool_config("{}", "nonsense", cfg) != "");
}

TEST_CASE("PYTORCH_CUDA_ALLOC_CONF parsing: PyTorch's limits, round trip through to_conf") {
    pt_config c;
    // AcceleratorAllocatorConfig::parseMaxSplitSize and parseMaxNonSplitRoundingSize: each must be
    // >= kLargeBuffer / 1 MiB (20); PyTorch up to 2.8 wanted max_split_size_mb > 20.
    CHECK(parse_pt_config("max_split_size_mb:19", c) != "");
    CHECK(parse_pt_config("max_split_size_mb:20", c) == "");
    CHECK(c.max_split_size == 20 * MiB);
    CHECK(parse_pt_config("max_non_split_rounding_mb:19", c) != "");
    CHECK(parse_pt_config("max_non_split_rounding_mb:0", c) != "");
    CHECK(parse_pt_config("max_non_split_rounding_mb:20", c) == "");
    // The tokenizer drops every whitespace character (std::isspace), not only spaces.
    CHECK(parse_pt_config("max_split_size_mb:\t64,\nexpandable_segments: True", c) == "");
    CHECK(c.max_split_size == 64 * MiB);
    CHECK(c.expandable);
    CHECK(parse_pt_config("roundup_power2_divisions:3", c) != "");
    CHECK(parse_pt_config("garbage_collection_threshold:1.5", c) != "");
    // parseGarbageCollectionThreshold: strictly between 0 and 1, both ends refused.
    CHECK(parse_pt_config("garbage_collection_threshold:1", c) != "");
    CHECK(parse_pt_config("garbage_collection_threshold:1.0", c) != "");
    CHECK(parse_pt_config("garbage_collection_threshold:0", c) != "");
    CHECK(parse_pt_config("garbage_collection_threshold:0.99", c) == "");
    CHECK(parse_pt_config("bogus:1", c) != "");
    CHECK(parse_pt_config("backend:cudaMallocAsync", c) != "");
    pt_config d = conf("max_split_size_mb:128,roundup_power2_divisions:4,garbage_collection_threshold:0.8,expandable_segments:True");
    CHECK(d.max_split_size == 128 * MiB);
    CHECK(d.expandable);
    CHECK(d.to_conf() == "max_split_size_mb:128,roundup_power2_divisions:4,garbage_collection_threshold:0.8,expandable_segments:True");
    CHECK(pt_config{}.to_conf() == "");
    // max_non_split_rounding_mb goes back out as its own value (--suggest prints to_conf).
    CHECK(conf("max_non_split_rounding_mb:40").to_conf() == "max_non_split_rounding_mb:40");
    CHECK(conf("max_split_size_mb:64,max_non_split_rounding_mb:30").to_conf() ==
          "max_split_size_mb:64,max_non_split_rounding_mb:30");
}

TEST_CASE("PYTORCH_CUDA_ALLOC_CONF numbers are read as PyTorch reads them (std::stoull, std::stod)") {
    // torch 2.11's ConfigTokenizer::toSizeT is std::stoull of the value, toDouble std::stod: a
    // leading sign and anything after the number are taken, so "64MB" ran as 64 in the program
    // and must replay as 64, with a note; a value torch refuses (no number first, out of range)
    // stays refused.
    pt_config c;
    std::string note;
    CHECK(parse_pt_config("max_split_size_mb:64MB", c, &note) == "");
    CHECK(c.max_split_size == 64 * MiB);
    CHECK(note == "max_split_size_mb:64MB read as 64, as PyTorch reads it");
    CHECK(parse_pt_config("max_split_size_mb:+64", c, &note) == "");
    CHECK(c.max_split_size == 64 * MiB);
    CHECK(note == "max_split_size_mb:+64 read as 64, as PyTorch reads it");
    // stoull negates a '-' value modulo 2^64: -1 is the largest, which torch clamps (unlimited).
    CHECK(parse_pt_config("max_split_size_mb:-1", c, &note) == "");
    CHECK(c.max_split_size == (std::numeric_limits<uint64_t>::max() >> 20) << 20);
    CHECK(note == "max_split_size_mb:-1 read as 18446744073709551615, as PyTorch reads it");
    CHECK(parse_pt_config("max_split_size_mb:64", c, &note) == "");
    CHECK(note == "");  // a plain number needs no note
    CHECK(parse_pt_config("max_non_split_rounding_mb:40mb,large_segment_size_mb:32.5", c, &note) == "");
    CHECK(c.max_non_split_rounding == 40 * MiB);
    CHECK(c.large_segment == 32 * MiB);
    CHECK(note == "max_non_split_rounding_mb:40mb read as 40, large_segment_size_mb:32.5 read as 32, as PyTorch reads them");
    CHECK(parse_pt_config("roundup_power2_divisions:4x", c, &note) == "");
    CHECK(c.divisions_for(64 * MiB) == 4);
    CHECK(parse_pt_config("roundup_power2_divisions:[256MB:2,>:+8]", c, &note) == "");
    CHECK(c.divisions_for(256 * MiB) == 2);
    CHECK(c.divisions_for(1024 * MiB) == 8);
    CHECK(note == "roundup_power2_divisions: 256MB read as 256, roundup_power2_divisions: +8 read as 8, as PyTorch reads them");
    CHECK(parse_pt_config("garbage_collection_threshold:0.5x,per_process_memory_fraction:+0.25", c, &note) == "");
    CHECK(c.gc_threshold == 0.5);
    CHECK(c.memory_fraction == 0.25);
    CHECK(note == "garbage_collection_threshold:0.5x read as 0.5, per_process_memory_fraction:+0.25 read as 0.25, as PyTorch reads them");
    CHECK(parse_pt_config("pinned_num_register_threads:8threads,pinned_reserve_segment_size_mb:1G", c, &note) == "");
    // Read leniently, then checked as torch checks: 19 is still below 20.
    CHECK(parse_pt_config("max_split_size_mb:19MB", c) != "");
    CHECK(parse_pt_config("roundup_power2_divisions:3x", c) != "");
    // What std::stoull / std::stod throw on: torch refuses the config, so does the replay.
    for (const char* bad : {"max_split_size_mb:abc", "max_split_size_mb:MB64", "max_split_size_mb:+", "max_split_size_mb:+-1",
                            "max_split_size_mb:99999999999999999999", "large_segment_size_mb:x",
                            "roundup_power2_divisions:[x:4]", "roundup_power2_divisions:[256:x]", "pinned_num_register_threads:many",
                            "garbage_collection_threshold:.x", "per_process_memory_fraction:abc",
                            "per_process_memory_fraction:1e-400"}) {
        INFO(bad);
        CHECK(parse_pt_config(bad, c) != "");
    }
}

TEST_CASE("a PYTORCH_CUDA_ALLOC_CONF value refused after a lenient read says what it was read as") {
    // torch checks the number std::stoull / std::stod made of the token: "1e2" is 1, below 20, and
    // "-1" is 2^64 - 1.  Said as the token alone, "-1 MiB is larger than any device" and "1e2: too
    // small" read as wrong; a plain number's message stays as it was.
    pt_config c;
    std::string note;
    CHECK(parse_pt_config("max_split_size_mb:19", c) == "max_split_size_mb too small, must be >= 20");
    CHECK(parse_pt_config("max_split_size_mb:1e2", c) ==
          "max_split_size_mb too small, must be >= 20 (max_split_size_mb:1e2 read as 1, as PyTorch reads it)");
    CHECK(parse_pt_config("large_segment_size_mb:-1", c) ==
          "large_segment_size_mb: 18446744073709551615 MiB is larger than any device (at most 1048576 here) "
          "(large_segment_size_mb:-1 read as 18446744073709551615, as PyTorch reads it)");
    CHECK(parse_pt_config("large_segment_size_mb:2097152", c) ==
          "large_segment_size_mb: 2097152 MiB is larger than any device (at most 1048576 here)");
    CHECK(parse_pt_config("roundup_power2_divisions:-4", c) ==
          "roundup_power2_divisions: divisions must be a power of 2: -4 "
          "(roundup_power2_divisions:-4 read as 18446744073709551612, as PyTorch reads it)");
    CHECK(parse_pt_config("roundup_power2_divisions:[3e3:4]", c) ==
          "roundup_power2_divisions: intervals must be powers of 2 (MiB): 3e3 "
          "(roundup_power2_divisions: 3e3 read as 3, as PyTorch reads it)");
    CHECK(parse_pt_config("pinned_reserve_segment_size_mb:-0", c) ==
          "pinned_reserve_segment_size_mb: expected a whole number of MiB above 0, not -0 "
          "(pinned_reserve_segment_size_mb:-0 read as 0, as PyTorch reads it)");
    // A negative number is read as written by std::stod (std::stoull wraps it): nothing to add.
    CHECK(parse_pt_config("per_process_memory_fraction:-0.5", c) == "per_process_memory_fraction: must be between 0.0 and 1.0: -0.5");
    CHECK(parse_pt_config("per_process_memory_fraction:-0", c, &note) == "");
    CHECK(note == "");
    // A token that is no number at all is not "read as" anything.
    CHECK(parse_pt_config("max_split_size_mb:abc", c) == "max_split_size_mb: not a whole number of MiB: abc");
    // The notes of a list's entries come in the order written: the interval, then its divisions.
    CHECK(parse_pt_config("roundup_power2_divisions:[256MB:+4,>:1]", c, &note) == "");
    CHECK(note == "roundup_power2_divisions: 256MB read as 256, roundup_power2_divisions: +4 read as 4, as PyTorch reads them");
}

TEST_CASE("PYTORCH_CUDA_ALLOC_CONF keys without effect on device memory take only the values PyTorch takes") {
    // A config torch refuses at startup (ValueError) must not replay as if it ran: the keys the
    // model skips are checked as CUDAAllocatorConfig / AcceleratorAllocatorConfig check them.
    pt_config c;
    for (const char* key : {"release_lock_on_cudamalloc", "release_lock_on_hipmalloc", "graph_capture_record_stream_reuse",
                            "pinned_use_cuda_host_register", "pinned_use_hip_host_register",
                            "pinned_use_background_threads"}) {
        INFO(key);
        CHECK(parse_pt_config(std::string(key) + ":True", c) == "");
        CHECK(parse_pt_config(std::string(key) + ":False", c) == "");
        CHECK(parse_pt_config(std::string(key) + ":true", c).find("expected True or False") != std::string::npos);
        CHECK(parse_pt_config(std::string(key) + ":1", c) != "");
    }
    // parsePinnedNumRegisterThreads: a power of 2, at most 128 (kPinnedMaxRegisterThreads).
    CHECK(parse_pt_config("pinned_num_register_threads:8", c) == "");
    CHECK(parse_pt_config("pinned_num_register_threads:128", c) == "");
    CHECK(parse_pt_config("pinned_num_register_threads:3", c) != "");
    CHECK(parse_pt_config("pinned_num_register_threads:256", c) != "");
    CHECK(parse_pt_config("pinned_num_register_threads:many", c) != "");
    // parsePinnedReserveSegmentSize: a whole number above 0.
    CHECK(parse_pt_config("pinned_reserve_segment_size_mb:64", c) == "");
    CHECK(parse_pt_config("pinned_reserve_segment_size_mb:0", c) != "");
    CHECK(parse_pt_config("pinned_reserve_segment_size_mb:big", c) != "");
    // An unknown key names the keys there are (a typo is then found in the message).
    std::string e = parse_pt_config("max_split_size:64", c);
    CHECK(e.find("unknown option max_split_size (known: ") == 0);
    CHECK(e.find("max_split_size_mb") != std::string::npos);
    CHECK(e.find("pinned_use_cuda_host_register") != std::string::npos);
}

TEST_CASE("garbage_collection_threshold frees old cached blocks above threshold * the fraction's limit") {
    // A 200 MiB card at fraction 0.5 (a 100 MiB limit), threshold 0.5: after two 30 MiB segments
    // are cached (60 MiB reserved), a request that finds no free block first frees the cached
    // ones down past 50 MiB.
    pytorch_policy gc(conf("garbage_collection_threshold:0.5,per_process_memory_fraction:0.5"), 200 * MiB, 0);
    cache_two_then_ask(gc);
    CHECK(gc.driver_frees() == 2);
    CHECK(gc.reserved() == 36 * MiB);
    pytorch_policy plain(pt_config{}, 100 * MiB, 0);  // without it both stay cached: 96 MiB
    cache_two_then_ask(plain);
    CHECK(plain.reserved() == 96 * MiB);
    // The card's size is no limit: torch 2.11 collects only under a fraction below 1, so a
    // smaller card (--capacity) alone changes nothing.
    pytorch_policy card(conf("garbage_collection_threshold:0.5"), 100 * MiB, 0);
    cache_two_then_ask(card);
    CHECK(card.driver_frees() == 0);
    CHECK(card.reserved() == 96 * MiB);
}

TEST_CASE("garbage_collection_threshold frees blocks at least as old as the average first, and stops once enough is back") {
    // garbage_collect_cached_blocks(): a block's age is the large pool's get_free_block calls since
    // it became free (any stream's); each pass frees the unsplit cached blocks whose age is >= the
    // average, until the excess over threshold * limit is reclaimed.  A 400 MiB card at fraction
    // 0.5 (200 MiB allowed), threshold 0.5: 100 MiB.
    pytorch_policy p(conf("garbage_collection_threshold:0.5,per_process_memory_fraction:0.5"), 400 * MiB, 0);
    REQUIRE(p.allocate(0, 30 * MiB, 0));  // get_free_block calls 1, 2, 3: three 30 MiB segments
    REQUIRE(p.allocate(1, 30 * MiB, 0));
    REQUIRE(p.allocate(2, 30 * MiB, 0));
    p.release(0);                          // free after call 3
    REQUIRE(p.allocate(3, 5 * MiB, 1));    // call 4, stream 1: a 20 MiB segment, 110 MiB reserved
    p.release(1);                          // free after call 4
    // Call 5 (stream 1, no block fits): 110 > 100, 10 MiB to reclaim.  Ages 2 and 1, average 1.5:
    // only block 0 goes, 30 MiB is enough, and block 1 stays cached.
    REQUIRE(p.allocate(4, 30 * MiB, 1));
    CHECK(p.driver_frees() == 1);
    CHECK(p.reserved() == 110 * MiB);
    REQUIRE(p.allocate(5, 30 * MiB, 0));  // block 1, reused
    CHECK(p.driver_allocs() == 5);
}

TEST_CASE("per_process_memory_fraction: the allocator's own limit, which garbage collection needs") {
    // DeviceCachingAllocator's constructor calls setMemoryFraction(per_process_memory_fraction):
    // below 1, allowed_memory_maximum = fraction * totalGlobalMem (the device's memory: the log's,
    // or --capacity's for a smaller card).  alloc_block fails when total_allocated_memory +
    // alloc_size would pass it, before it asks the driver.
    pytorch_policy half(conf("per_process_memory_fraction:0.5"), 0, 100 * MiB);  // 50 MiB allowed
    REQUIRE(half.allocate(0, 30 * MiB, 0));
    CHECK_FALSE(half.allocate(1, 30 * MiB, 0));  // 30 + 30 > 50; nothing cached to free
    CHECK(half.reserved() == 30 * MiB);
    // The limit itself is allowed (alloc_block: total + alloc_size > allowed_memory_maximum fails):
    // two 20 MiB segments fill 40 MiB of 80 exactly; a third segment would not fit.
    pytorch_policy exact(conf("per_process_memory_fraction:0.5"), 0, 80 * MiB);
    REQUIRE(exact.allocate(0, 20 * MiB, 0));
    CHECK(exact.allocate(1, 20 * MiB, 0));
    CHECK(exact.reserved() == 40 * MiB);
    CHECK_FALSE(exact.allocate(2, 2 * MiB, 0));
    pytorch_policy small_card(conf("per_process_memory_fraction:0.5"), 80 * MiB, 100 * MiB);  // 40 MiB
    REQUIRE(small_card.allocate(0, 30 * MiB, 0));
    CHECK_FALSE(small_card.allocate(1, 12 * MiB, 0));  // 30 + 12 fits the card, not 40 (nor is it 50 of the log's 100)
    // The fraction of an unknown device is refused rather than guessed.
    std::string err;
    CHECK_FALSE(make_policy(parse_policy_name("pytorch:per_process_memory_fraction:0.5"), 0, 0, "{}", &err));
    CHECK(err.find("per_process_memory_fraction") != std::string::npos);
    CHECK(make_policy(parse_policy_name("pytorch:per_process_memory_fraction:1"), 0, 0, "{}", &err));
    pt_config c;
    CHECK(parse_pt_config("per_process_memory_fraction:1.5", c) != "");
    CHECK(conf("per_process_memory_fraction:0.25").to_conf() == "per_process_memory_fraction:0.25");

    // garbage_collection_threshold acts once a limit is set (get_free_block counts block ages and
    // malloc calls garbage_collect_cached_blocks only while allowed_memory_maximum has a value),
    // here with no --capacity: 100 MiB allowed of 200, threshold 50 MiB.  Two cached 30 MiB
    // segments (60 MiB reserved, both aged 1 get_free_block call, the average) are freed before
    // the 36 MiB segment is allocated.
    pytorch_policy gc(conf("per_process_memory_fraction:0.5,garbage_collection_threshold:0.5"), 0, 200 * MiB);
    cache_two_then_ask(gc);
    CHECK(gc.driver_frees() == 2);
    CHECK(gc.reserved() == 36 * MiB);
    pytorch_policy no_limit(conf("garbage_collection_threshold:0.5"), 0, 200 * MiB);  // no limit: no GC
    cache_two_then_ask(no_limit);
    CHECK(no_limit.reserved() == 96 * MiB);

    // With expandable segments the limit is still checked against get_allocation_size's
    // alloc_size, not the 20 MiB pages map_block then maps: 55 MiB allowed of 110.
    pytorch_policy exp(conf("expandable_segments:True,per_process_memory_fraction:0.5"), 0, 110 * MiB);
    REQUIRE(exp.allocate(0, 3 * MiB, 0));   // 0 + 20 <= 55: one page; 17 MiB free after the block
    REQUIRE(exp.allocate(1, 25 * MiB, 0));  // 20 + 26 <= 55: the 17 free plus a second page
    CHECK(exp.reserved() == 40 * MiB);
    REQUIRE(exp.allocate(2, 13 * MiB, 0));  // 40 + 14 <= 55: the 12 free plus a third page
    CHECK(exp.reserved() == 60 * MiB);      // above the limit, as in PyTorch
    CHECK(exp.driver_allocs() == 3);
    CHECK_FALSE(exp.allocate(3, 20 * MiB, 0));  // 60 + 20 > 55 (the free 19 MiB is too small)
    // A device of 55 MiB (--capacity) has no page for the third request: the driver says no.
    pytorch_policy card(conf("expandable_segments:True"), 55 * MiB, 110 * MiB);
    REQUIRE(card.allocate(0, 3 * MiB, 0));
    REQUIRE(card.allocate(1, 25 * MiB, 0));
    CHECK_FALSE(card.allocate(2, 13 * MiB, 0));
    CHECK(card.reserved() == 40 * MiB);
}

TEST_CASE("replay's verdict under per_process_memory_fraction counts the memory the limit leaves, not the card's") {
    // 50 MiB allowed of a 100 MiB card: a second 30 MiB segment is refused by the limit, with nothing
    // free in segments.  Free memory, not its layout, is short (capacity), whether or not --capacity
    // names the card: the card's other 50 MiB are not the allocator's to take.
    device_trace t = steps({A(0, 30 * MiB), A(1, 30 * MiB)});
    for (uint64_t capacity : {uint64_t(0), 100 * MiB}) {
        INFO("capacity " << capacity);
        pytorch_policy p(conf("per_process_memory_fraction:0.5"), capacity, 100 * MiB);
        replay_result r = replay(t, p, "pytorch:per_process_memory_fraction:0.5", capacity);
        CHECK(r.fail_seq == 1);
        CHECK(r.fail_free_in_segments == 0);
        CHECK(r.failure == failure_reason::capacity);
    }
    // A fraction of 0 (PyTorch takes it) allows nothing: the first request already fails for capacity.
    pytorch_policy none(conf("per_process_memory_fraction:0"), 100 * MiB, 100 * MiB);
    CHECK(replay(t, none, "pytorch:per_process_memory_fraction:0", 100 * MiB).failure == failure_reason::capacity);
    // Under the limit, what it leaves counts as free (25 MiB allowed): two 4 MiB blocks in one
    // 20 MiB segment leave 12 MiB free in it and 5 MiB the limit still allows, 17 MiB in all, which
    // would hold 14 MiB were it one block (fragmentation, as the OOM diagnosis calls it).
    device_trace f = steps({A(0, 4 * MiB), A(1, 4 * MiB), A(2, 14 * MiB)});
    pytorch_policy q(conf("per_process_memory_fraction:0.25"), 0, 100 * MiB);
    replay_result r = replay(f, q, "pytorch:per_process_memory_fraction:0.25", 0);
    CHECK(r.fail_seq == 2);
    CHECK(r.fail_free_in_segments == 12 * MiB);
    CHECK(r.failure == failure_reason::fragmentation);
}

TEST_CASE("streams: a block freed on one stream is never handed to another") {
    pytorch_policy p(pt_config{}, 0, 0);
    REQUIRE(p.allocate(0, 1000, 1));
    p.release(0);
    REQUIRE(p.allocate(1, 1000, 2));  // stream 2 cannot take stream 1's free segment
    CHECK(p.driver_allocs() == 2);
    CHECK(p.largest_free() == 2 * MiB);  // stream 1's whole free segment: the largest over both streams
    REQUIRE(p.allocate(2, 1000, 1));  // stream 1 reuses its own
    CHECK(p.driver_allocs() == 2);
}

TEST_CASE("a replay stops where it would hold more than any device, so a hostile log cannot take all memory") {
    // gpumem's pool keeps a record per 2 MiB chunk: a request of 2^48 bytes took 17 GB and two
    // minutes, and a few of them got the replay killed.  Above 2 TiB a request stops every policy.
    const uint64_t TiB = MiB * MiB;
    auto one = steps({A(0, 1000), A(1, 3 * TiB)});
    for (const char* name : {"ideal", "pytorch", "pytorch-expandable", "gpumem"}) {
        std::string err;
        auto p = make_policy(parse_policy_name(name), 0, 0, "{}", &err);
        REQUIRE(p);
        replay_result r = replay(one, *p, name, 0);
        CHECK(r.failure == failure_reason::too_large);
        CHECK(r.fail_seq == 1);
        CHECK(r.events == 1);
    }
    // Requests below it each, live one at a time, whose sizes differ: a caching policy's reserved
    // bytes climb by a segment each time (12 TiB, 850 MB of memory for gpumem's pool).  Past 4 TiB
    // reserved the policy stops, at the request that took it there; pytorch-expandable stays at 1 TiB.
    std::vector<std::pair<int64_t, uint64_t>> churn;
    for (int64_t i = 0; i < 12; ++i) {
        churn.push_back(A(2 * i, TiB + uint64_t(i) * 3 * MiB + 12345));
        churn.push_back(A(2 * i + 1, 4096));
        churn.push_back(F(2 * i));
    }
    device_trace t;
    t.dev = 0;
    for (size_t k = 0; k < churn.size(); ++k) {
        request q;
        q.seq = q.t = k;
        q.is_free = churn[k].first < 0;
        q.id = uint32_t(q.is_free ? -churn[k].first - 1 : churn[k].first);
        q.size = q.is_free ? 0 : churn[k].second;
        t.n_ids = std::max(t.n_ids, q.id + 1);
        t.ops.push_back(q);
    }
    for (const char* name : {"pytorch", "gpumem"}) {
        std::string err;
        auto p = make_policy(parse_policy_name(name), 0, 0, "{}", &err);
        REQUIRE(p);
        replay_result r = replay(t, *p, name, 0);
        INFO(name);
        CHECK(r.failure == failure_reason::too_much);
        CHECK(r.fail_seq % 3 == 0);  // one of the 1 TiB requests, where the replay stops
        CHECK(r.fail_size > TiB);
        CHECK(r.fail_reserved > 4 * TiB);
        CHECK(r.peak_reserved <= 4 * TiB);  // the numbers cover the requests before it
        CHECK(r.events == r.fail_seq);
    }
    std::string err;
    auto p = make_policy(parse_policy_name("pytorch-expandable"), 0, 0, "{}", &err);
    CHECK(replay(t, *p, "pytorch-expandable", 0).failure == failure_reason::none);
}

TEST_CASE("a request no device could hold stops every policy, with or without a capacity, without overflow") {
    // Just above gpumem's pool limit and near 2^64: the same verdict for every policy, so none
    // replays past a request another one refused.
    for (uint64_t big : {gpumem::k_max_request + 1, ~uint64_t(0) - 10}) {
        auto t = steps({A(0, 1000), A(1, big)});
        for (uint64_t capacity : {uint64_t(0), uint64_t(80) << 30})
            for (const char* name : {"ideal", "pytorch", "pytorch-expandable", "gpumem"}) {
                std::string err;
                auto p = make_policy(parse_policy_name(name), capacity, 0, "{}", &err);
                REQUIRE(p);
                replay_result r = replay(t, *p, name, capacity);
                CHECK(r.failure == failure_reason::too_large);
                CHECK(r.fail_seq == 1);
                CHECK(r.fail_size == big);
                CHECK(r.events == 1);
            }
    }
}

TEST_CASE("load_trace: an allocation of 0 bytes is no request, and two at one address lose no free") {
    // A 0-byte request gets no memory (the driver answers with an error or a null pointer, and
    // PyTorch's allocator serves 0 bytes with a null pointer), so its alloc line is not replayed:
    // replayed, it would count as an allocation, and the second at address 0 as one whose free was lost.
    const std::string path = "/tmp/gpumem-simulate-zero-" + std::to_string(getpid()) + ".jsonl";
    {
        std::ofstream f(path);
        f << "{\"ev\":\"header\",\"format\":\"gpumem-events\",\"version\":2,\"pid\":1,\"config\":{\"pool\":\"off\"}}\n";
        const char* allocs[][2] = {{"0x0", "0"}, {"0x0", "0"}, {"0x1000", "1024"}};
        int seq = 0;
        for (auto& a : allocs) {
            f << "{\"ev\":\"alloc\",\"seq\":" << seq << ",\"t\":" << seq * 1000
              << ",\"tid\":1,\"dev\":0,\"api\":\"cudaMalloc\",\"kind\":\"device\",\"ptr\":\"" << a[0]
              << "\",\"size\":" << a[1] << "}\n";
            ++seq;
        }
    }
    trace t = load_trace(path, trace_options{});
    std::remove(path.c_str());
    REQUIRE(t.devices.size() == 1);
    const device_trace& d = t.devices[0];
    CHECK(d.n_alloc == 1);
    CHECK(d.n_freed_twice == 0);
    const std::vector<request> ops(d.ops.begin(), d.ops.end());
    REQUIRE(ops.size() == 1);
    CHECK(ops[0].size == 1024);
}

TEST_CASE("load_trace: streams get dense indexes from 1, and 0 stays the requests that name none") {
    // trace.h: stream 0 is the stream of requests without one (cudaMalloc); the first stream a log
    // names, even the legacy default "0x0", is 1.  Were it 0, a cudaMallocAsync block freed on it
    // would serve cudaMalloc requests in the replay.
    const std::string path = "/tmp/gpumem-simulate-streams-" + std::to_string(getpid()) + ".jsonl";
    {
        std::ofstream f(path);
        f << "{\"ev\":\"header\",\"format\":\"gpumem-events\",\"version\":2,\"pid\":1,\"config\":{\"pool\":\"off\"}}\n"
          << "{\"ev\":\"alloc\",\"seq\":0,\"t\":0,\"tid\":1,\"dev\":0,\"api\":\"cudaMalloc\",\"kind\":\"device\",\"ptr\":\"0x1000\",\"size\":1024}\n"
          << "{\"ev\":\"alloc\",\"seq\":1,\"t\":1,\"tid\":1,\"dev\":0,\"api\":\"cudaMallocAsync\",\"kind\":\"device\",\"ptr\":\"0x2000\",\"size\":1024,\"stream\":\"0x0\"}\n"
          << "{\"ev\":\"alloc\",\"seq\":2,\"t\":2,\"tid\":1,\"dev\":0,\"api\":\"cudaMallocAsync\",\"kind\":\"device\",\"ptr\":\"0x3000\",\"size\":1024,\"stream\":\"0x5\"}\n"
          << "{\"ev\":\"alloc\",\"seq\":3,\"t\":3,\"tid\":1,\"dev\":0,\"api\":\"cudaMallocAsync\",\"kind\":\"device\",\"ptr\":\"0x4000\",\"size\":1024,\"stream\":\"0x0\"}\n";
    }
    trace t = load_trace(path, trace_options{});
    std::remove(path.c_str());
    REQUIRE(t.devices.size() == 1);
    const device_trace& d = t.devices[0];
    const std::vector<request> ops(d.ops.begin(), d.ops.end());
    REQUIRE(ops.size() == 4);
    CHECK(ops[0].stream == 0);
    CHECK(ops[1].stream == 1);
    CHECK(ops[2].stream == 2);
    CHECK(ops[3].stream == 1);
    CHECK(d.n_streams == 2);
    CHECK(d.n_no_stream == 1);
}

TEST_CASE("load_trace: a freed allocation's id goes to the next one, so ids stay below the most live at once") {
    // The policies and the replay keep a table by id (trace.h): with an id per allocation of the
    // log they grew with its length, 8 bytes an allocation each (32 million allocations: 256 MB a
    // table, several tables a policy, a policy per core).
    const std::string path = "/tmp/gpumem-simulate-ids-" + std::to_string(getpid()) + ".jsonl";
    {
        std::ofstream f(path);
        f << "{\"ev\":\"header\",\"format\":\"gpumem-events\",\"version\":2,\"pid\":1,\"config\":{\"pool\":\"off\"}}\n";
        int seq = 0;
        auto line = [&](const char* ev, const char* ptr, uint64_t size) {
            f << "{\"ev\":\"" << ev << "\",\"seq\":" << seq << ",\"t\":" << seq * 1000
              << ",\"tid\":1,\"dev\":0,\"api\":\"" << (ev[0] == 'a' ? "cudaMalloc" : "cudaFree")
              << "\",\"kind\":\"device\",\"ptr\":\"" << ptr << "\",\"size\":" << size << "}\n";
            ++seq;
        };
        line("alloc", "0x1000", 4096);  // live to the end
        for (int i = 0; i < 1000; ++i) {
            line("alloc", "0x2000", 1024);
            line("alloc", "0x3000", 2048);
            line("free", "0x3000", 2048);
            line("free", "0x2000", 1024);
        }
        line("alloc", "0x2000", 1024);
        line("alloc", "0x2000", 512);  // its free was lost: the first counts as freed
    }
    trace t = load_trace(path, trace_options{});
    std::remove(path.c_str());
    REQUIRE(t.devices.size() == 1);
    const device_trace& d = t.devices[0];
    CHECK(d.n_alloc == 2003);
    CHECK(d.n_freed_twice == 1);
    CHECK(d.n_ids == 3);  // three live at most
    // Never an id given to two live allocations, nor a free of an id not live.
    std::vector<bool> live(d.n_ids, false);
    for (const request& q : d.ops) {
        REQUIRE(q.id < d.n_ids);
        CHECK(live[q.id] == q.is_free);
        live[q.id] = !q.is_free;
    }
    std::string err;
    auto p = make_policy(parse_policy_name("ideal"), 0, 0, "{}", &err);
    REQUIRE(p);
    replay_result r = replay(d, *p, "ideal", 0);
    CHECK(r.peak_reserved == 4096 + 1024 + 2048);
    CHECK(r.peak_seq == 2);
    CHECK(r.events == d.ops.size());
}

TEST_CASE("request_list: every request reads back as pushed, whatever its values, across chunks") {
    std::mt19937_64 rng(7);
    std::vector<request> in;
    request r;
    for (int i = 0; i < 300000; ++i) {
        if (rng() % 4 == 0) {  // wide fields, backwards too: what a hostile or hand-made trace has
            r.seq = rng();
            r.t = rng();
            r.id = uint32_t(rng());
            r.size = rng();
        } else {
            r.seq += 1 + rng() % 5;
            r.t += rng() % 100000;
            r.id += uint32_t(rng() % 7) - 3;
            r.size = (1 + rng() % 4096) * 512;
        }
        const uint16_t streams[] = {0, 1, 126, 127, 128, 65535, uint16_t(rng())};
        r.stream = streams[rng() % 7];
        r.is_free = rng() % 2;
        if (r.is_free) r.size = 0;
        in.push_back(r);
    }
    request_list list;
    for (const request& q : in) list.push_back(q);
    REQUIRE(list.size() == in.size());
    REQUIRE(list.bytes() > (uint64_t(2) << 20));  // more than one chunk
    size_t i = 0;
    for (const request& q : list) {
        REQUIRE(i < in.size());
        INFO("request " << i);
        CHECK(q.size == in[i].size);
        CHECK(q.seq == in[i].seq);
        CHECK(q.t == in[i].t);
        CHECK(q.id == in[i].id);
        CHECK(q.stream == in[i].stream);
        CHECK(q.is_free == in[i].is_free);
        ++i;
    }
    CHECK(i == in.size());
    CHECK(request_list().begin() == request_list().end());
}

TEST_CASE("request_list: a training loop's requests take a few bytes each, not a struct's 32") {
    // The memory of `gpumem replay` grows with the log by this much a request: 32 bytes as a
    // struct (more while a vector doubled) took 3.2 GB for the 64 million requests of an 11 GB log;
    // docs/benchmarks.md measures 6.4 bytes on that log.  A step of the emulated training loop
    // (tests/emu/emu_app.cc train): eight activations of MiB, each with a temporary freed at once,
    // then the activations freed in reverse; other events between (seq steps by a few), microseconds
    // apart; ids reused as load_trace gives them.
    std::mt19937_64 rng(11);
    request_list list;
    request r;
    std::vector<uint32_t> free_ids;
    uint32_t n_ids = 0;
    auto next = [&] {
        r.seq += 1 + rng() % 3;
        r.t += 1000 + rng() % 20000;
    };
    auto alloc = [&](uint64_t size) {
        next();
        r.is_free = false;
        r.size = size;
        if (free_ids.empty()) r.id = n_ids++;
        else r.id = free_ids.back(), free_ids.pop_back();
        list.push_back(r);
        return r.id;
    };
    auto release = [&](uint32_t id) {
        next();
        r.is_free = true;
        r.size = 0;
        r.id = id;
        free_ids.push_back(id);
        list.push_back(r);
    };
    for (int w = 0; w < 200; ++w) alloc((1 + rng() % 4096) * 4096);  // weights, live throughout
    std::vector<uint32_t> acts;
    while (list.size() < 4000000) {
        for (int layer = 0; layer < 8; ++layer) {
            acts.push_back(alloc((1 + rng() % 64) << 20));
            release(alloc((1 + rng() % 256) << 12));
        }
        while (!acts.empty()) release(acts.back()), acts.pop_back();
    }
    const double per_request = double(list.bytes()) / double(list.size());
    INFO(list.bytes() << " bytes for " << list.size() << " requests");
    CHECK(per_request < 10.0);  // 7.6 here; a record of fixed fields would take 16 or more
}

TEST_CASE("replay of gpumem under safe reuse: pending blocks are neither allocated nor free") {
    // docs/metrics.md: free in segments = reserved - allocated - pending.  Under safe reuse (no GPU
    // in a replay, so no fence is ever reached) a freed block stays pending, and the pool's largest
    // free block leaves it out: counted as free, the freed 8 MiB made the replay's fragmentation
    // 100% (8 MiB free, no free block), which the report of the same log never shows.
    gpumem::pool_config cfg;
    REQUIRE(gpumem_pool_config("{\"reuse\":\"safe\"}", "", cfg) == "");
    gpumem_pool_policy p(cfg, 0);
    device_trace t = steps({A(0, 8 * MiB), A(1, 8 * MiB), F(0), A(2, 2 * MiB)});
    replay_result r = replay(t, p, "gpumem", 0);
    REQUIRE(r.failure == failure_reason::none);
    CHECK(p.pending() == 8 * MiB);
    CHECK(p.largest_free() == 0);
    CHECK(p.reserved() - p.allocated() - p.pending() == 0);
    CHECK(r.peak_fragmentation == 0.0);
}

TEST_CASE("replay's verdict for expandable segments short of one more 20 MiB page is chunk rounding") {
    // A 30 MiB device: 15 MiB maps one 20 MiB page of the large pool; 10 MiB more needs a second
    // page with 5 MiB free in the first and 10 MiB left on the device.  Enough bytes in total
    // (15 MiB), and the driver would place 10 MiB; what fails is the page, as metrics.md's chunk
    // rounding says, not a layout that max_split_size_mb could change (fragmentation).
    device_trace t = steps({A(0, 15 * MiB), A(1, 10 * MiB)});
    std::string err;
    auto p = make_policy(parse_policy_name("pytorch-expandable"), 30 * MiB, 30 * MiB, "{}", &err);
    REQUIRE(p);
    replay_result r = replay(t, *p, "pytorch-expandable", 30 * MiB);
    CHECK(r.failure == failure_reason::chunk_rounding);
    CHECK(r.fail_seq == 1);
    CHECK(r.fail_reserved == 20 * MiB);
    CHECK(r.fail_free_in_segments == 5 * MiB);
    // The default allocator sizes its segments to the request (16 and 10 MiB) and serves both.
    pytorch_policy d(pt_config{}, 30 * MiB, 30 * MiB);
    CHECK(replay(t, d, "pytorch", 30 * MiB).failure == failure_reason::none);
}

TEST_CASE("every key the unknown-option message lists is one the PyTorch config parser takes", "[config]") {
    // The message's list is written apart from the parser's chain of keys: a key listed there but
    // no longer parsed would send the user to a name that is refused in turn.
    pt_config c;
    const std::string err = parse_pt_config("no_such_key:1", c);
    const std::string lead = "unknown option no_such_key (known: ";
    REQUIRE(err.rfind(lead, 0) == 0);
    REQUIRE(err.back() == ')');
    std::string list = err.substr(lead.size(), err.size() - lead.size() - 1);
    size_t n = 0;
    for (size_t pos = 0; pos <= list.size();) {
        const size_t comma = list.find(", ", pos);
        const std::string key = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        pos = comma == std::string::npos ? list.size() + 1 : comma + 2;
        pt_config k;
        INFO(key);
        CHECK(parse_pt_config(key + ":zzz", k).rfind("unknown option", 0) == std::string::npos);
        ++n;
    }
    CHECK(n >= 14);
}
