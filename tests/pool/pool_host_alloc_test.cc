// A steady-state alloc/free loop makes no host allocation, in every reuse mode: counted by a global operator new.
// Standalone (links gpumem_pool), as arena_fault_inject: the counting operator new is the whole binary's.
#include <cstdio>
#include <cstdlib>
#include <new>

#include "core/pool/block_pool.h"
#include "core/pool/fake_backend.h"
#include "core/pool/stream_set.h"

using namespace gpumem;

static long g_news = 0;
void* operator new(std::size_t n) {
    ++g_news;
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
    ++g_news;
    return std::malloc(n ? n : 1);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {
struct null_sink final : event_sink {
    void emit(event&) noexcept override {}
};

// Host allocations in `pairs` alloc+free pairs of `size`, after eight times as many of warm-up.  Safe
// reuse with fences releases pending frees in batches of thousands of small blocks (a fence per
// eighth of the 32 MiB budget), merging them back: their tree nodes and block objects must be
// kept for the next batch's splits, or every pair calls malloc.
// lag: the GPU runs behind, reaching the events only every 16 pairs, so that several fences wait
// at once (with one at a time a deque of fences never crossed a node, and never allocated).
long news_per_loop(reuse_mode mode, uint64_t size, int pairs, bool lag) {
    fake_backend dev;
    null_sink sink;
    pool_config cfg;
    cfg.reuse = mode;
    dev.set_vmm(2 << 20);
    dev.enable_events(true);  // every event reached at once: the GPU keeps up, unless lag
    dev.set_auto_complete(!lag);
    stream_set streams;
    streams.created(0xc0, 0x5000, true);
    block_pool pool(cfg, dev, &sink, 0);
    pool.set_streams(&streams, 0xc0);
    auto loop = [&] {
        for (int i = 0; i < pairs; ++i) {
            uint64_t p = 0;
            int rc = 0;
            if (pool.allocate(size, api_id::cuMemAlloc_v2, &p) != k_cuda_success || !pool.deallocate(p, api_id::cuMemFree_v2, &rc)) {
                std::fprintf(stderr, "pair %d of %llu B failed\n", i, (unsigned long long)size);
                std::exit(1);
            }
            if (lag && i % 16 == 15) dev.complete_all();
        }
    };
    // Warm-up: the pool's spare nodes and blocks, and the events ordered releases keep (up to 64
    // not yet asked, a release at each miss: a few a loop at 512 B), are all made by then.
    for (int w = 0; w < 8; ++w) loop();
    const long before = g_news;
    loop();
    return g_news - before;
}
}  // namespace

int main() {
    int fails = 0;
    for (reuse_mode mode : {reuse_mode::immediate, reuse_mode::safe})
        for (uint64_t size : {512ull, 4096ull, 1ull << 20, 20ull << 20})
            for (bool lag : {false, true}) {
                const long n = news_per_loop(mode, size, 50000, lag);
                std::printf("%s %8llu B%s: %ld host allocations in 50000 pairs\n", mode == reuse_mode::safe ? "safe     " : "immediate",
                            (unsigned long long)size, lag ? ", GPU behind" : "", n);
                fails += n != 0;
            }
    return fails ? 1 : 0;
}
