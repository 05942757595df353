// Host memory failing at every allocation of an arena's growth and unmapping: validate() must hold after each (the pool poisons itself, never breaks).
// Standalone (links gpumem_pool, no invariant abort), global operator new fails on the k-th call once armed.
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>

#include "core/pool/block_pool.h"
#include "core/pool/fake_backend.h"

using namespace gpumem;

static long g_countdown = -1;  // <0: off; 0: fail this one
static bool should_fail() {
    if (g_countdown < 0) return false;
    if (g_countdown-- == 0) return true;
    return false;
}
void* operator new(std::size_t n) {
    if (should_fail()) throw std::bad_alloc();
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
    if (should_fail()) return nullptr;
    return std::malloc(n ? n : 1);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

constexpr uint64_t MiB = 1 << 20;

// scenario 0: arena growth into the tail hole (map_hole).  1: OOM path unmap_free_chunks + remap.
// 2: baseline, arenas off (segments per growth) with the same ops as 1.  3: a stitch
// (GPUMEM_POOL_STITCH) of a 30 MiB request from the free chunks between live 7 MiB blocks.  4: the
// same stitch made, then its block freed and the stitched segment dissolved (the lenders free again).
// 5: that stitch dissolved into its kept range (GPUMEM_POOL_STITCH_KEEP), a lender's chunk taken,
// then the same request again: a stitch on the kept range that remaps that chunk's position.
// 6: arenas off, memory short: the back of a hole a give-back left mapped again, joined to the free
// tail after it (the hole split in two first).
// Every scenario: no misuse of the fake device (a chunk released or a range freed while mapped).
static int run(int scenario, long k, std::string* why, bool* poisoned_like, uint64_t* leaked) {
    const bool stitching = scenario == 3 || scenario == 4 || scenario == 5;
    fake_backend dev(scenario == 0 || stitching ? (1ull << 30) : scenario == 6 ? 64 * MiB : 80 * MiB);
    dev.set_vmm(2 * MiB);
    pool_config cfg;
    cfg.reuse = stitching ? reuse_mode::safe : reuse_mode::immediate;
    cfg.vmm = true;
    cfg.arenas = scenario != 2 && scenario != 6;
    cfg.stitch = stitching;
    if (scenario == 5) {
        cfg.sync_budget = 4 * MiB;
        cfg.sync_budget_div = 1 << 20;
    }
    int fails = 0;
    {
        block_pool pool(cfg, dev, nullptr, 0);
        uint64_t a = 0, b = 0, c = 0, x = 0, y = 0;
        int rc = 0;
        if (scenario == 0) {
            pool.allocate(3 * MiB, api_id::cuMemAlloc_v2, &a);
            g_countdown = k;
            if (pool.allocate(8 * MiB, api_id::cuMemAlloc_v2, &b)) ++fails;
            g_countdown = -1;
        } else if (scenario == 6) {
            // A 20 MiB segment: a (3.75 MiB), two freed 5 MiB blocks, c (6.25 MiB); given back: the
            // hole [4, 12) MiB between a 0.25 MiB head and a 1.75 MiB tail.  With one chunk left,
            // 3.5 MiB fits only at the hole's back.
            pool.allocate(3 * MiB + 3 * MiB / 4, api_id::cuMemAlloc_v2, &a);
            pool.allocate(5 * MiB, api_id::cuMemAlloc_v2, &b);
            pool.allocate(5 * MiB, api_id::cuMemAlloc_v2, &x);
            pool.allocate(6 * MiB + MiB / 4, api_id::cuMemAlloc_v2, &c);
            pool.deallocate(b, api_id::cuMemFree_v2, &rc);
            pool.deallocate(x, api_id::cuMemFree_v2, &rc);
            pool.give_back(api_id::cuMemCreate);
            dev.set_capacity(dev.in_use() + 2 * MiB);
            g_countdown = k;
            if (pool.allocate(3 * MiB + MiB / 2, api_id::cuMemAlloc_v2, &y)) ++fails;
            g_countdown = -1;
            if (k == 59 && fails) {  // the last point is past every allocation: it must be served
                *why = "the hole's back was not mapped";
                return 1;
            }
        } else if (scenario == 5) {
            uint64_t sm[16] = {};
            for (uint64_t& q : sm) pool.allocate(512 * 1024, api_id::cuMemAlloc_v2, &q);
            uint64_t blocks[20] = {};
            for (uint64_t& q : blocks) pool.allocate(7 * MiB, api_id::cuMemAlloc_v2, &q);
            for (int i = 0; i < 20; i += 2) pool.deallocate(blocks[i], api_id::cuMemFree_v2, &rc);
            pool.release_cached();
            pool.allocate(30 * MiB, api_id::cuMemAlloc_v2, &y);
            pool.deallocate(y, api_id::cuMemFree_v2, &rc);
            for (uint64_t& q : sm) pool.deallocate(q, api_id::cuMemFree_v2, &rc);
            pool.allocate(512 * 1024, api_id::cuMemAlloc_v2, &sm[0]);  // a sync: dissolved into its kept range
            if (pool.kept_ranges() != 1) {
                *why = "no kept range";
                return 1;
            }
            pool.allocate(2 * MiB, api_id::cuMemAlloc_v2, &x);  // a lender's chunk taken
            g_countdown = k;
            if (pool.allocate(30 * MiB, api_id::cuMemAlloc_v2, &c)) ++fails;  // on the kept range, remapping
            g_countdown = -1;
            uint64_t reused = 0;
            pool.stitch_counts(nullptr, nullptr, nullptr, &reused);
            if (k == 59 && reused == 0) {
                *why = "the scenario did not stitch on the kept range";
                return 1;
            }
        } else if (stitching) {
            uint64_t blocks[20] = {};
            for (uint64_t& q : blocks) pool.allocate(7 * MiB, api_id::cuMemAlloc_v2, &q);
            for (int i = 0; i < 20; i += 2) pool.deallocate(blocks[i], api_id::cuMemFree_v2, &rc);
            pool.release_cached();  // the frees settle; the stitch needs free chunks
            if (scenario == 3) g_countdown = k;
            if (pool.allocate(30 * MiB, api_id::cuMemAlloc_v2, &y)) ++fails;
            g_countdown = -1;
            uint64_t made = 0, dissolved = 0;
            pool.stitch_counts(&made, nullptr, nullptr);
            if (k == 59 && made == 0) {  // the last point is past every allocation: it must stitch
                *why = "the scenario did not stitch";
                return 1;
            }
            if (scenario == 4) {
                g_countdown = k;
                pool.deallocate(y, api_id::cuMemFree_v2, &rc);
                pool.release_cached();  // the block's release, then the dissolve
                g_countdown = -1;
                pool.stitch_counts(nullptr, nullptr, &dissolved);
                if (k == 59 && dissolved == 0) {
                    *why = "the scenario did not dissolve";
                    return 1;
                }
            }
        } else {
            pool.allocate(12 * MiB, api_id::cuMemAlloc_v2, &c);
            pool.allocate(40 * MiB, api_id::cuMemAlloc_v2, &x);
            pool.deallocate(c, api_id::cuMemFree_v2, &rc);
            g_countdown = k;
            if (pool.allocate(30 * MiB, api_id::cuMemAlloc_v2, &y)) ++fails;  // OOM path: unmap, then map
            g_countdown = -1;
        }
        if (dev.bad_calls()) {
            *why = "a bad backend call";
            return 1;
        }
        const bool ok = pool.validate(why);
        // After a failure mid-update the pool is poisoned: it declines every request, which the
        // hook then passes to the driver (never an OOM of its own); see whether it still leaks on
        // teardown.  A healthy pool serves 512 B from its 80 MiB at least.
        uint64_t p = 0;
        const int last = pool.allocate(512, api_id::cuMemAlloc_v2, &p);
        *poisoned_like = last == k_pool_declined;
        if (last != k_cuda_success && last != k_pool_declined) {
            *why = "a 512 B request after the failure returned " + std::to_string(last);
            return 1;
        }
        if (!ok) return 1;
    }
    *leaked = dev.in_use();
    (void)fails;
    return 0;
}

int main() {
    int total = 0, declined = 0;
    for (int sc = 0; sc < 7; ++sc) {
        int broken = 0;
        for (long k = 0; k < 60; ++k) {
            std::string why;
            bool pz = false;
            uint64_t leaked = 0;
            if (run(sc, k, &why, &pz, &leaked) == 0) {
                declined += pz;
            } else {
                ++broken;
                std::printf("scenario %d: failing allocation #%ld -> invariant broken: %s (poisoned: %d)\n", sc, k, why.c_str(), pz);
            }
        }
        std::printf("scenario %d: %d of 60 injection points break validate()\n", sc, broken);
        total += broken;
    }
    std::printf("%d injection points left a poisoned pool, which declined the next request\n", declined);
    return total != 0 || declined == 0;  // a broken invariant fails the test; so does a scan that poisons nothing
}
