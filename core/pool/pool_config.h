// The caching pool's thresholds and policies, read once from GPUMEM_* environment variables.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpumem {

// When a freed block may be handed out again.  docs/pool.md states the guarantee of each mode.
enum class reuse_mode : uint8_t {
    automatic,  // "auto" (default): immediate until the program creates a stream, then safe
    safe,       // once the work enqueued before its free is done: fences (events), else one synchronize()
    immediate,  // at once: only correct for programs whose device work is on one stream
};

struct pool_config {
    // Every field has its env var and its key in the log header's "config" object: the key is
    // the env var name without "GPUMEM_", lower-cased.  Sizes are bytes.
    reuse_mode reuse = reuse_mode::automatic;    // GPUMEM_REUSE = auto | safe | immediate
    uint64_t round = 512;                        // GPUMEM_POOL_ROUND: block granularity and alignment
    uint64_t small_size = 1ull << 20;            // GPUMEM_POOL_SMALL_SIZE: requests <= this use the small pool
    uint64_t small_segment = 2ull << 20;         // GPUMEM_POOL_SMALL_SEGMENT: small pool segment size
    uint64_t small_split = 512;                  // GPUMEM_POOL_SMALL_SPLIT: split a small block if remainder >= this
    uint64_t large_segment = 20ull << 20;        // GPUMEM_POOL_LARGE_SEGMENT: shared large segment size
    uint64_t min_large_alloc = 10ull << 20;      // GPUMEM_POOL_MIN_LARGE_ALLOC: requests >= this get their own segment
    uint64_t large_round = 2ull << 20;           // GPUMEM_POOL_LARGE_ROUND: own segments are rounded up to this
    uint64_t large_split = 1ull << 20;           // GPUMEM_POOL_LARGE_SPLIT: split a large block if remainder > this
    uint64_t sync_budget = 32ull << 20;          // GPUMEM_SYNC_BUDGET: pending bytes that justify a sync (floor)
    uint64_t sync_budget_div = 16;               // GPUMEM_SYNC_BUDGET_DIV: budget = max(sync_budget, reserved / div)
    // GPUMEM_FENCE_BATCH: frees a fence covers at least, unless their bytes reach the sync budget
    // and, where the free that brings them there is under the budget, this many times its size up
    // to twice the budget (20 MiB frees reached 32 MiB every other pair, as the ordered releases'
    // batches did, order_batch below).
    // A fence costs a driver call per live stream to record and one to ask (0.79 us on an idle
    // H200); with an eighth of the budget alone every large free made its own.  Batches of 4 cut
    // event records and stream queries per allocation by 40% on a replayed GPT-2 log, for the same
    // peak; 8 and 16 held more memory (docs/benchmarks.md, "Fence batches").  The batch applies
    // while fences have non-blocking streams to ask; once a fence had none (GPUMEM_REUSE=safe, or
    // auto switched by blocking streams), each free over an eighth is fenced alone: the 20 MiB pool
    // hit with 4 GiB held fell from 1.97-2.32 to 1.26-1.55 us on the H200 (run 61).
    uint64_t fence_batch = 4;
    // GPUMEM_FENCE_WAIT = old | any (where ordered releases, below, are off or stop): which
    // pending blocks an allocation waits for rather than grow the pool or cut a larger free
    // block.  old (false): a block with a quarter of
    // the sync budget freed after it, so that the GPU has work queued past its fence.  any (true):
    // any pending block, the newest frees fenced first if they must be.  On the H200 (run 54) any
    // reserved 1.118-1.134x the peak of requested bytes, as PyTorch's expandable_segments (1.119x),
    // against 1.146-1.158x, but its steps took 1.105x native against 1.033x: each wait for a fresh
    // fence lets the GPU run dry (docs/benchmarks.md, "Waiting for any fence").
    bool wait_any = false;
    // GPUMEM_FENCE_WAIT = order (the default since 2026-12-02): where a wait would come, no wait;
    // every pending free is handed out at once and the program's streams are ordered after their
    // work on the device instead (docs/pool.md, "Ordered release").  Run 71 (H200 transformer):
    // steps 0.94-0.95x native as immediate reuse's, 1.121-1.131x the requested peak, no wait;
    // old's waits held each step about 15 ms (run 70) and reserved 1.154-1.173x.
    bool order = true;
    // GPUMEM_ORDER_BATCH: under ordered release, a miss that pending frees of its pool could serve
    // grows the pool instead while they are fewer than a batch: min(8 requests, this many bytes),
    // but for a request under this many bytes at least 4 requests, up to twice the bytes.  So one
    // release hands out a batch: a loop of one size then pays an event record every 8 pairs up to
    // 4 MiB (every 4th at 20 MiB) instead of every pair, for at most a batch (up to twice this
    // setting) and one request more memory held pending (not with trimming, nor near the device's
    // limit: block_pool.cc, order_batch_for).  Replayed over the H200 GPT-2 log, 32 MiB reserves
    // what 0 does with the GPU 0, 2 or 20 ms behind (1.108x / 1.110x / 1.109x the live peak; the
    // 4 requests' floor 1.113x / 1.115x / 1.108x); 64 MiB for every size reserved 1.122x with the
    // GPU keeping up (docs/benchmarks.md, "Ordered releases in batches" and "Run 145").  0 = a
    // release at every such miss, as before 2026-12-04.
    uint64_t order_batch = 32ull << 20;
    // Not a knob (no env var): ordered releases go on beside a stream busy with the program's own
    // work, which they would serialize.  For the tests of their correctness with such streams.
    bool order_beside_busy = false;
    uint64_t stats_ms = 1000;                    // GPUMEM_STATS_MS: stats event interval, 0 = never
    // GPUMEM_POOL_TRIM (virtual memory only): before growing, give whole free chunks back while
    // reserved memory would pass the live blocks plus the request plus this much; 0 = only when the
    // driver is out of memory (the default).  32 MiB gave the least peak of a sweep replayed over an
    // H200 GPT-2 log (1.01x the live peak then, 1.04x with arenas), but doubled its step time on the H200 (run 27: every
    // step maps and unmaps thousands of 2 MiB chunks), so it is a choice for runs short of memory,
    // not a default (docs/benchmarks.md, "Trimming the pool on virtual memory").
    uint64_t trim = 0;
    // GPUMEM_POOL_CHUNK (virtual memory only): the size of one physical chunk (cuMemCreate
    // handle), rounded up to the device's granularity, at most 1 GiB; 0 (the default) = the
    // granularity, 2 MiB on the H200.  Each map, access grant and unmap costs about the same per
    // handle whatever its size (H200: 20 MiB handles remap at 3.5 us per 2 MiB against 33 us for
    // 2 MiB handles, docs/benchmarks.md "Per handle, not per byte"), so larger chunks make
    // stitching and trimming cheaper; but the pool then gives back only whole larger chunks, and
    // its promise rounds live bytes up to them (docs/pool.md).
    uint64_t chunk = 0;
    // GPUMEM_POOL_HEADROOM: device memory the pool leaves the driver for its own needs while it
    // holds free memory of its own (docs/pool.md, "Headroom for the driver"): at most this, and at
    // most 1/64 of the device.  A kernel loaded lazily (CUDA_MODULE_LOADING=LAZY, the default) at
    // its first launch takes device memory; when that load fails for want of memory the driver
    // never loads the function again in that context (H200 run 105: every later launch of it
    // fails with CUDA_ERROR_UNKNOWN, cuFuncLoad too), so a give-back after the failure comes too
    // late.  256 MiB: the first cuSOLVER call after a full device loaded in 254 MiB given back (run
    // 107).  0 = off.
    uint64_t headroom = 256ull << 20;
    // GPUMEM_POOL_VMM = on | off: segments on virtual memory (cuMemCreate chunks) where the device
    // supports it, so that the pool can give back every whole free chunk and never fails a request
    // the driver alone would serve (docs/pool.md).  On by default since legacy IPC of pooled blocks
    // has a fallback (preload/ipc_share.cc); off: cuMemAlloc segments, the only way to pool a
    // device without VMM.
    bool vmm = true;
    // Set by from_env to `vmm`: with virtual memory asked for (the default), a device without it
    // gets no pool at all (every allocation declined, so the driver serves it): cuMemAlloc
    // segments could fail a program the driver alone serves, which only GPUMEM_POOL_VMM=off may
    // choose.  Not an env knob; false in a default-constructed config (the core's tests pool
    // cuMemAlloc segments of the fake device).
    bool vmm_only = false;
    // GPUMEM_POOL_ARENA = auto | off | SIZE (virtual memory only): each of the two pools grows in
    // one reserved address range, an arena, mapping 2 MiB chunks at its end as it needs them, as
    // PyTorch's expandable_segments does, instead of taking a segment per growth.  Freed blocks then
    // merge across what would have been segment boundaries.  auto (0, the default): the device's
    // memory plus an eighth of address space per arena (PyTorch's choice).  off: a segment per growth.
    bool arenas = true;
    uint64_t arena = 0;
    // GPUMEM_POOL_STITCH = on | off (virtual memory with arenas only, and only while frees wait for
    // fences: not under immediate reuse): a large request that no free
    // block fits, and whose growth would lift reserved memory over its high-water mark, is served
    // by mapping whole free chunks, wherever they lie, a second time into one fresh range
    // (GMLake's stitching; docs/pool.md, "Stitching").
    bool stitch = false;
    // GPUMEM_POOL_STITCH_KEEP = N (0-16, default 2): stitched ranges kept mapped after their block
    // came back, so that the next stitch remaps only the chunks no longer free (docs/pool.md,
    // "Stitching").  0: unmapped at once.
    uint32_t stitch_keep = 2;

    // Problems met while reading the environment ("GPUMEM_POOL_ROUND=3: not a power of two >= 256;
    // using 512"), empty when none.  The caller may print or log them; from_env never does.
    std::string warnings;

    using env_lookup = const char* (*)(const char* name);
    // Reads every knob through `get` (getenv by default, a table in tests).  Never throws: a bad
    // value keeps the default and adds a warning; an inconsistent set of sizes resets all sizes.
    static pool_config from_env(env_lookup get = nullptr) noexcept;

    // The env var of every knob from_env reads ("GPUMEM_REUSE", "GPUMEM_POOL_ROUND", ...), for
    // callers that take knobs by name and must refuse one it does not know (`gpumem replay`).
    static std::vector<std::string> knob_env_names();

    // Checks the relations between sizes the allocator relies on.  Empty string when consistent.
    std::string check() const;

    // Appends "key":value, pairs (each followed by a comma) for the header's "config" object.
    // On host allocation failure `out` is left unchanged.
    void append_config_json(std::string& out) const noexcept;
};

}  // namespace gpumem
