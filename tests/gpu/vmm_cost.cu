// What each virtual-memory and fence call costs on the GPU, idle and while a kernel runs: the numbers the pool's trim, stitching and fence design rest on.
//
// Prints one line per measurement: "vmm op=NAME chunks=N us_per_chunk=X busy=0|1" (per 2 MiB of
// memory, also for the 20 MiB handles), and "fence op=NAME us_per_call=X busy=0|1".  The busy
// runs keep a spin kernel going on a separate non-blocking stream, to show whether a call waits
// for device work it does not touch (a call that does would turn every trim into a stall).
// "stall mode=NAME ..." lines (argument "stall", or no argument) ask the other half of that
// question: whether remaps slow down device work that is queued or running, which host timings
// cannot show (stitching cost more step time than its calls' CPU time, docs/benchmarks.md run 52).
// "parallel threads=N ..." lines (argument "parallel", or no argument): whether remaps from
// several threads overlap.  No argument runs everything; "stall" or "parallel" runs just that.
// "calls" (only by name): "call op=NAME us_per_call=X busy=0|1" for the driver calls of one pool
// operation under safe reuse (the context and capture checks, an ordered release's record and wait).
// "calls MIB vmm|malloc" times them with MIB of memory held, as mapped 2 MiB chunks (the pool's
// layout) or as cuMemAlloc blocks of 64 MiB (a program without gpumem): the lines gain
// "held_mib=MIB held_as=KIND".  The safe 20 MiB pair cost 0.5 us more with 4 GiB held (run 142),
// and counting its calls on the emulated device put the difference in the driver.
// "background" (only by name): "background worker=NAME ..." lines: whether remaps on a helper
// thread slow the program's own thread (a loop of a tiny launch, an event record and query, as a
// pool operation under safe reuse makes), and whether they break a global-mode stream capture on
// the program's thread ("capture worker=NAME end=RESULT").
// "order" (only by name): "order variant=NAME streams=N gpu_us_per_iter=X host_us_per_iter=Y" for
// what an ordered release costs the device, not the host: a chain of small kernels on the legacy
// stream, alone or with a release's calls after each (each idle stream marked and made to wait, or
// only made to wait), queued behind a long kernel so that the device runs the queue back to back.
// "offset" (only by name): whether a handle maps from a nonzero offset, and what a piece costs.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#define CK(x)                                                                            \
    do {                                                                                 \
        CUresult r_ = (x);                                                               \
        if (r_ != CUDA_SUCCESS) {                                                        \
            const char* s_ = nullptr;                                                    \
            cuGetErrorString(r_, &s_);                                                   \
            fprintf(stderr, "%s failed: %s\n", #x, s_ ? s_ : "?");                       \
            return 3;                                                                    \
        }                                                                                \
    } while (0)

__global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

// Memory traffic, so that a TLB invalidation or a stalled memory system would show in its time.
__global__ void touch(float* p, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) p[i] += 1.f;
}

using clk = std::chrono::steady_clock;
static double us_since(clk::time_point t0) {
    return std::chrono::duration<double, std::micro>(clk::now() - t0).count();
}

// Pinned device chunks as the pool makes them (plain, no export), the device's minimum
// granularity, and read/write access for the device: what every measurement below maps.
struct chunk_kind {
    CUmemAllocationProp prop = {};
    CUmemAccessDesc acc = {};
    size_t gran = 0;
    CUresult init(CUdevice dev) {
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = dev;
        acc.location = prop.location;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        return cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    }
};

static int run(int busy, CUdevice dev, cudaStream_t side) {
    const int n = 256;
    chunk_kind ck;
    CK(ck.init(dev));
    const CUmemAllocationProp& prop = ck.prop;
    const CUmemAccessDesc& acc = ck.acc;
    const size_t gran = ck.gran;
    if (busy) spin<<<1, 1, 0, side>>>(4LL * 1000 * 1000 * 1000);  // about 2 s at 2 GHz: outlasts the VMM calls
    std::vector<CUmemGenericAllocationHandle> h(n);
    auto t = clk::now();
    for (int i = 0; i < n; ++i) CK(cuMemCreate(&h[i], gran, &prop, 0));
    printf("vmm op=create chunks=%d us_per_chunk=%.2f busy=%d\n", n, us_since(t) / n, busy);
    CUdeviceptr va = 0, va2 = 0;
    t = clk::now();
    CK(cuMemAddressReserve(&va, gran * n, 0, 0, 0));
    printf("vmm op=reserve chunks=%d us_per_call=%.2f busy=%d\n", n, us_since(t), busy);
    CK(cuMemAddressReserve(&va2, gran * n, 0, 0, 0));
    t = clk::now();
    for (int i = 0; i < n; ++i) CK(cuMemMap(va + i * gran, gran, 0, h[i], 0));
    printf("vmm op=map chunks=%d us_per_chunk=%.2f busy=%d\n", n, us_since(t) / n, busy);
    t = clk::now();
    for (int i = 0; i < n; ++i) CK(cuMemSetAccess(va + i * gran, gran, &acc, 1));
    printf("vmm op=set_access_each chunks=%d us_per_chunk=%.2f busy=%d\n", n, us_since(t) / n, busy);
    t = clk::now();
    CK(cuMemSetAccess(va, gran * n, &acc, 1));
    printf("vmm op=set_access_range chunks=%d us_per_chunk=%.2f busy=%d\n", n, us_since(t) / n, busy);
    t = clk::now();
    for (int i = 0; i < n; ++i) CK(cuMemUnmap(va + i * gran, gran));
    printf("vmm op=unmap_each chunks=%d us_per_chunk=%.2f busy=%d\n", n, us_since(t) / n, busy);
    // Recycling: the same physical chunks mapped at another address (no create, no release).
    t = clk::now();
    for (int i = 0; i < n; ++i) CK(cuMemMap(va2 + i * gran, gran, 0, h[i], 0));
    CK(cuMemSetAccess(va2, gran * n, &acc, 1));
    printf("vmm op=remap_range chunks=%d us_per_chunk=%.2f busy=%d\n", n, us_since(t) / n, busy);
    t = clk::now();
    CK(cuMemUnmap(va2, gran * n));
    printf("vmm op=unmap_range chunks=%d us_per_chunk=%.2f busy=%d\n", n, us_since(t) / n, busy);
    t = clk::now();
    for (int i = 0; i < n; ++i) CK(cuMemRelease(h[i]));
    printf("vmm op=release chunks=%d us_per_chunk=%.2f busy=%d\n", n, us_since(t) / n, busy);
    CK(cuMemAddressFree(va, gran * n));
    CK(cuMemAddressFree(va2, gran * n));
    // Is a map's cost per handle or per byte?  The same memory in 20 MiB handles (PyTorch's page
    // for expandable segments' large pool): a stitch or trim of fewer, larger handles.
    // (H200, first try: mapping them into the range the 2 MiB chunks had used failed with
    // CUDA_ERROR_INVALID_VALUE, so they get a fresh range; a failure here is printed, not fatal.)
    {
        const int big = 10, nb = n / big;
        std::vector<CUmemGenericAllocationHandle> hb(nb);
        t = clk::now();
        for (int i = 0; i < nb; ++i) CK(cuMemCreate(&hb[i], gran * big, &prop, 0));
        printf("vmm op=create_20mib_handles chunks=%d us_per_chunk=%.2f busy=%d\n", nb * big, us_since(t) / (nb * big), busy);
        CUdeviceptr vb = 0;
        CK(cuMemAddressReserve(&vb, gran * big * nb, 0, 0, 0));
        t = clk::now();
        CUresult r = CUDA_SUCCESS;
        int mapped = 0;
        for (; mapped < nb && r == CUDA_SUCCESS; ++mapped) r = cuMemMap(vb + size_t(mapped) * big * gran, gran * big, 0, hb[mapped], 0);
        if (r != CUDA_SUCCESS) --mapped;  // the last one failed
        if (r == CUDA_SUCCESS) r = cuMemSetAccess(vb, gran * big * nb, &acc, 1);
        if (r == CUDA_SUCCESS) {
            printf("vmm op=remap_range_20mib_handles chunks=%d us_per_chunk=%.2f busy=%d\n", nb * big, us_since(t) / (nb * big), busy);
            t = clk::now();
            CK(cuMemUnmap(vb, gran * big * nb));
            printf("vmm op=unmap_range_20mib_handles chunks=%d us_per_chunk=%.2f busy=%d\n", nb * big, us_since(t) / (nb * big), busy);
        } else {
            printf("vmm op=remap_range_20mib_handles failed=%d busy=%d\n", int(r), busy);
            for (int i = 0; i < mapped; ++i) CK(cuMemUnmap(vb + size_t(i) * big * gran, gran * big));
        }
        for (int i = 0; i < nb; ++i) CK(cuMemRelease(hb[i]));
        CK(cuMemAddressFree(vb, gran * big * nb));
    }
    // A fence's calls (core/pool/block_pool.cc record_fence, poll_fences): an event recorded on the
    // legacy stream, asked once reached, and an idle stream asked.  Mean over 20,000 calls.
    {
        const int k = 20000;
        CUevent ev;
        CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
        CUstream idle;
        CK(cuStreamCreate(&idle, CU_STREAM_NON_BLOCKING));
        t = clk::now();
        for (int i = 0; i < k; ++i) CK(cuEventRecord(ev, CU_STREAM_LEGACY));
        printf("fence op=event_record_legacy us_per_call=%.3f busy=%d\n", us_since(t) / k, busy);
        CK(cuEventSynchronize(ev));
        t = clk::now();
        for (int i = 0; i < k; ++i) (void)cuEventQuery(ev);
        printf("fence op=event_query_reached us_per_call=%.3f busy=%d\n", us_since(t) / k, busy);
        t = clk::now();
        for (int i = 0; i < k; ++i) (void)cuStreamQuery(idle);
        printf("fence op=stream_query_idle us_per_call=%.3f busy=%d\n", us_since(t) / k, busy);
        t = clk::now();
        for (int i = 0; i < k; ++i) {
            CK(cuEventRecord(ev, CU_STREAM_LEGACY));
            (void)cuEventQuery(ev);
        }
        printf("fence op=record_then_query us_per_call=%.3f busy=%d\n", us_since(t) / k, busy);
        // How soon is a fence recorded on an idle legacy stream seen reached?  Share of first
        // queries that say so, and µs until one does.
        {
            int first = 0;
            double wait_us = 0, worst = 0;
            const int m = 2000;
            for (int i = 0; i < m; ++i) {
                CK(cuEventRecord(ev, CU_STREAM_LEGACY));
                auto t0 = clk::now();
                CUresult q = cuEventQuery(ev);
                if (q == CUDA_SUCCESS) ++first;
                else
                    while (q == CUDA_ERROR_NOT_READY) q = cuEventQuery(ev);
                CK(q);  // an error would otherwise spin for ever
                const double w = us_since(t0);
                wait_us += w;
                if (w > worst) worst = w;
            }
            printf("fence op=event_reached first_query_share=%.3f us_until_reached=%.3f worst_us=%.1f busy=%d\n", double(first) / m,
                   wait_us / m, worst, busy);
        }
        // The other way to say "reached": the stream writes a sequence number into pinned host
        // memory (cuStreamWriteValue32 after the work), and the pool reads the word, no driver call.
        {
            unsigned* word = nullptr;
            CUdeviceptr dword = 0;
            CK(cuMemHostAlloc((void**)&word, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
            CK(cuMemHostGetDevicePointer(&dword, word, 0));
            *(volatile unsigned*)word = 0;
            t = clk::now();
            for (int i = 1; i <= k; ++i) CK(cuStreamWriteValue32(CU_STREAM_LEGACY, dword, unsigned(i), 0));
            printf("fence op=write_value_legacy us_per_call=%.3f busy=%d\n", us_since(t) / k, busy);
            // The legacy stream only: a cuCtxSynchronize would wait for the spin kernel on the
            // non-blocking side stream, and every busy=1 line after this one would run idle.
            CK(cuStreamSynchronize(CU_STREAM_LEGACY));
            const int m = 2000;
            int first = 0;
            double wait_us = 0, worst = 0;
            for (int i = 1; i <= m; ++i) {
                const unsigned v = unsigned(k + i);
                CK(cuStreamWriteValue32(CU_STREAM_LEGACY, dword, v, 0));
                auto t1 = clk::now();  // seen how long after the call returned
                if (*(volatile unsigned*)word == v) ++first;
                else
                    while (*(volatile unsigned*)word != v) {
                    }
                const double w = std::chrono::duration<double, std::micro>(clk::now() - t1).count();
                wait_us += w;
                if (w > worst) worst = w;
            }
            printf("fence op=write_value_reached first_read_share=%.3f us_until_seen=%.3f worst_us=%.1f busy=%d\n", double(first) / m,
                   wait_us / m, worst, busy);
            CK(cuMemFreeHost(word));
        }
        CK(cuStreamDestroy(idle));
        CK(cuEventDestroy(ev));
    }
    if (busy) {
        // Did the spin kernel survive all of the above without anyone waiting for it?
        printf("vmm spin_still_running=%d\n", cudaStreamQuery(side) == cudaErrorNotReady ? 1 : 0);
    }
    // For scale: cuMemAlloc/cuMemFree of one chunk's size (cuMemFree may wait for the spin kernel).
    t = clk::now();
    for (int i = 0; i < 64; ++i) {
        CUdeviceptr p;
        CK(cuMemAlloc(&p, gran));
        CK(cuMemFree(p));
    }
    printf("vmm op=memalloc_free_pair chunks=64 us_per_chunk=%.2f busy=%d\n", us_since(t) / 64, busy);
    return 0;
}

// Does remapping slow the device down?  A chain of memory-bound kernels (1 GiB read and written
// each) runs on `side` while the host (a) only waits, (b) remaps kept handles over and over, as a
// stitch and its return do (map each handle into a fresh range, one access grant, one unmap over
// the range), or (c) the same with 20 MiB handles.  The chain's time between two events says
// whether the device paid for the host's remaps; the host's count says how many it made meanwhile.
// Then "interleave": the host launches one kernel, remaps once, and so on, as a program whose
// allocation path stitches between launches; wall time of the whole against launches alone.
static int stall(CUdevice dev, cudaStream_t side) {
    const size_t n_floats = size_t(256) << 20;  // 1 GiB
    float* buf = nullptr;
    if (cudaMalloc(&buf, n_floats * sizeof(float)) != cudaSuccess) return 3;
    cudaMemset(buf, 0, n_floats * sizeof(float));
    chunk_kind ck;
    CK(ck.init(dev));
    const CUmemAllocationProp& prop = ck.prop;
    const CUmemAccessDesc& acc = ck.acc;
    const size_t gran = ck.gran;
    // 64 MiB per remap cycle: 32 handles of 2 MiB, or 4 of 16 MiB (a multiple of the granularity
    // that divides 64 MiB; the 20 MiB handles above would not).
    const int small_n = 32, big_n = 4, big_mult = 8;
    std::vector<CUmemGenericAllocationHandle> hs(small_n), hb(big_n);
    for (auto& h : hs) CK(cuMemCreate(&h, gran, &prop, 0));
    for (auto& h : hb) CK(cuMemCreate(&h, gran * big_mult, &prop, 0));
    const size_t cycle_bytes = gran * small_n;
    CUdeviceptr va = 0;
    CK(cuMemAddressReserve(&va, cycle_bytes, 0, 0, 0));
    auto remap = [&](int mode) -> CUresult {
        const auto& h = mode == 1 ? hs : hb;
        const size_t sz = mode == 1 ? gran : gran * big_mult;
        for (size_t i = 0; i < h.size(); ++i)
            if (CUresult r = cuMemMap(va + i * sz, sz, 0, h[i], 0)) return r;
        if (CUresult r = cuMemSetAccess(va, cycle_bytes, &acc, 1)) return r;
        return cuMemUnmap(va, cycle_bytes);
    };
    const int kernels = 120;
    const char* names[] = {"wait", "remap_2mib", "remap_16mib"};
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int round = 0; round < 3; ++round) {
        for (int mode = 0; mode < 3; ++mode) {
            cudaEventRecord(e0, side);
            for (int k = 0; k < kernels; ++k) touch<<<1056, 512, 0, side>>>(buf, n_floats);
            cudaEventRecord(e1, side);
            int cycles = 0;
            auto t = clk::now();
            while (cudaEventQuery(e1) == cudaErrorNotReady) {
                if (mode == 0) continue;
                CK(remap(mode));
                ++cycles;
            }
            double host_us = us_since(t);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            printf("stall mode=%s round=%d gpu_ms=%.2f remaps=%d host_us_per_remap=%.1f\n", names[mode], round, ms, cycles,
                   cycles ? host_us / cycles : 0.0);
        }
        for (int mode = 0; mode < 3; ++mode) {
            cudaDeviceSynchronize();
            auto t = clk::now();
            cudaEventRecord(e0, side);
            for (int k = 0; k < kernels; ++k) {
                touch<<<1056, 512, 0, side>>>(buf, n_floats);
                if (mode) CK(remap(mode));
            }
            cudaEventRecord(e1, side);
            cudaEventSynchronize(e1);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            printf("interleave mode=%s round=%d wall_ms=%.2f gpu_ms=%.2f remaps=%d\n", names[mode], round, us_since(t) / 1000, ms,
                   mode ? kernels : 0);
        }
    }
    CK(cuMemAddressFree(va, cycle_bytes));
    for (auto& h : hs) CK(cuMemRelease(h));
    for (auto& h : hb) CK(cuMemRelease(h));
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(buf);
    return 0;
}

// Do remaps from several host threads overlap, or does the driver serialize them?  The same 64
// handles of 2 MiB remapped 40 times (map each into its slice of one range, one access grant over
// the slice, one unmap of the slice) by 1, 2, 4 and 8 threads, each with its own slice.  A stitch
// of 1 GiB is 512 such handles (about 25 ms from one thread, run 65).
static int parallel(CUdevice dev, CUcontext ctx) {
    chunk_kind ck;
    CK(ck.init(dev));
    const CUmemAllocationProp& prop = ck.prop;
    const CUmemAccessDesc& acc = ck.acc;
    const size_t gran = ck.gran;
    const int n = 64, cycles = 40;
    std::vector<CUmemGenericAllocationHandle> h(n);
    for (auto& x : h) CK(cuMemCreate(&x, gran, &prop, 0));
    CUdeviceptr va = 0;
    CK(cuMemAddressReserve(&va, gran * n, 0, 0, 0));
    for (int round = 0; round < 2; ++round) {
        for (int threads : {1, 2, 4, 8}) {
            std::vector<std::thread> pool;
            std::vector<int> rc(threads, 0);
            const int per = n / threads;
            auto t = clk::now();
            for (int k = 0; k < threads; ++k) {
                pool.emplace_back([&, k] {
                    if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) { rc[k] = 1; return; }
                    const CUdeviceptr base = va + size_t(k) * per * gran;
                    for (int c = 0; c < cycles && !rc[k]; ++c) {
                        for (int i = 0; i < per && !rc[k]; ++i)
                            if (cuMemMap(base + size_t(i) * gran, gran, 0, h[k * per + i], 0)) rc[k] = 2;
                        if (!rc[k] && cuMemSetAccess(base, per * gran, &acc, 1)) rc[k] = 3;
                        if (!rc[k] && cuMemUnmap(base, per * gran)) rc[k] = 4;
                    }
                });
            }
            for (auto& th : pool) th.join();
            int bad = 0;
            for (int r : rc) bad = bad ? bad : r;
            const double us = us_since(t);
            printf("parallel threads=%d round=%d handles=%d wall_us_per_handle=%.2f failed=%d\n", threads, round, n * cycles,
                   us / (n * cycles), bad);
        }
    }
    CK(cuMemAddressFree(va, gran * n));
    for (auto& x : h) CK(cuMemRelease(x));
    return 0;
}

// The driver calls of one pool operation under GPUMEM_REUSE=safe (core/pool/block_pool.cc,
// preload/driver_backend.cc): the context check every backend call makes (cuCtxGetCurrent), the
// capture check once per operation (cuStreamIsCapturing of the legacy stream), an ordered
// release's record on the legacy stream, and its wait of a non-blocking stream for that event.
// Mean µs over 20,000 calls, with the side stream idle and then running a long kernel.
int calls(cudaStream_t side, CUdevice dev, size_t held_mib, const std::string& held_as) {
    const int k = 20000;
    // The memory held while the calls are timed, taken before and given back after.
    std::vector<CUmemGenericAllocationHandle> chunks;
    std::vector<CUdeviceptr> blocks;
    CUdeviceptr va = 0;
    size_t va_bytes = 0;
    if (held_mib && held_as == "vmm") {
        chunk_kind ck;
        CK(ck.init(dev));
        const size_t n = (held_mib << 20) / ck.gran;
        va_bytes = n * ck.gran;
        CK(cuMemAddressReserve(&va, va_bytes, 0, 0, 0));
        chunks.resize(n);
        for (size_t i = 0; i < n; ++i) {  // one mapping per chunk, as the pool maps them
            CK(cuMemCreate(&chunks[i], ck.gran, &ck.prop, 0));
            CK(cuMemMap(va + i * ck.gran, ck.gran, 0, chunks[i], 0));
        }
        CK(cuMemSetAccess(va, va_bytes, &ck.acc, 1));
    } else if (held_mib) {
        for (size_t m = 0; m < held_mib; m += 64) {
            CUdeviceptr b = 0;
            CK(cuMemAlloc(&b, size_t(64) << 20));
            blocks.push_back(b);
        }
    }
    char held[64] = "";
    if (held_mib) snprintf(held, sizeof held, " held_mib=%zu held_as=%s", held_mib, held_as.c_str());
    CUevent ev;
    CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    std::vector<CUevent> ring(64);
    for (CUevent& e : ring) CK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    CUstream other;
    CK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    for (int busy = 0; busy < 2; ++busy) {
        if (busy) spin<<<1, 1, 0, side>>>(2LL * 1000 * 1000 * 1000);
        auto t = clk::now();
        CUcontext c;
        for (int i = 0; i < k; ++i) CK(cuCtxGetCurrent(&c));
        printf("call op=ctx_get_current us_per_call=%.3f busy=%d%s\n", us_since(t) / k, busy, held);
        CUstreamCaptureStatus st;
        t = clk::now();
        for (int i = 0; i < k; ++i) CK(cuStreamIsCapturing(CU_STREAM_LEGACY, &st));
        printf("call op=stream_is_capturing_legacy us_per_call=%.3f busy=%d%s\n", us_since(t) / k, busy, held);
        t = clk::now();
        for (int i = 0; i < k; ++i) CK(cuEventRecord(ev, CU_STREAM_LEGACY));
        printf("call op=event_record_legacy us_per_call=%.3f busy=%d%s\n", us_since(t) / k, busy, held);
        // The pool records a fresh event at each ordered release and keeps up to 64 (k_order_marks):
        // the same record over 64 events in turn.
        t = clk::now();
        for (int i = 0; i < k; ++i) CK(cuEventRecord(ring[i % ring.size()], CU_STREAM_LEGACY));
        printf("call op=event_record_ring64 us_per_call=%.3f busy=%d%s\n", us_since(t) / k, busy, held);
        CK(cuStreamSynchronize(CU_STREAM_LEGACY));
        t = clk::now();
        for (int i = 0; i < k; ++i) CK(cuStreamWaitEvent(other, ev, 0));
        printf("call op=stream_wait_event us_per_call=%.3f busy=%d%s\n", us_since(t) / k, busy, held);
        t = clk::now();
        for (int i = 0; i < k; ++i) (void)cuStreamQuery(other);
        printf("call op=stream_query_other us_per_call=%.3f busy=%d%s\n", us_since(t) / k, busy, held);
        t = clk::now();
        for (int i = 0; i < k; ++i) (void)cuStreamQuery(CUstream(side));
        printf("call op=stream_query_side us_per_call=%.3f busy=%d%s\n", us_since(t) / k, busy, held);
    }
    CK(cuStreamSynchronize(CUstream(side)));
    CK(cuStreamDestroy(other));
    CK(cuEventDestroy(ev));
    for (CUevent e : ring) CK(cuEventDestroy(e));
    for (size_t i = 0; i < chunks.size(); ++i) CK(cuMemUnmap(va + i * (va_bytes / chunks.size()), va_bytes / chunks.size()));
    for (CUmemGenericAllocationHandle h : chunks) CK(cuMemRelease(h));
    if (va) CK(cuMemAddressFree(va, va_bytes));
    for (CUdeviceptr b : blocks) CK(cuMemFree(b));
    return 0;
}

// Remaps on a helper thread while the program's thread runs a launch/record/query loop: does the
// driver make the program wait for them (a lock held across a remap)?  Worker modes: none, busy
// (remapping 64 handles of 2 MiB back to back), half (a remap, then a sleep as long as it took).
static int background(CUdevice dev, CUcontext ctx) {
    chunk_kind ck;
    CK(ck.init(dev));
    const size_t gran = ck.gran;
    const int n = 64;
    std::vector<CUmemGenericAllocationHandle> h(n);
    for (auto& x : h) CK(cuMemCreate(&x, gran, &ck.prop, 0));
    CUdeviceptr va = 0;
    CK(cuMemAddressReserve(&va, gran * n, 0, 0, 0));
    CUevent ev;
    CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    CUstream other;
    CK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    const char* names[] = {"none", "busy", "half"};
    const int iters = 20000;
    for (int round = 0; round < 3; ++round) {
        for (int mode = 0; mode < 3; ++mode) {
            std::atomic<bool> stop{false};
            std::atomic<long> remaps{0};
            std::atomic<int> bad{0};
            std::thread worker;
            if (mode)
                worker = std::thread([&] {
                    if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) { bad = 1; return; }
                    while (!stop.load()) {
                        auto t = clk::now();
                        for (int i = 0; i < n; ++i)
                            if (cuMemMap(va + size_t(i) * gran, gran, 0, h[i], 0)) bad = 2;
                        if (cuMemSetAccess(va, n * gran, &ck.acc, 1)) bad = 3;
                        if (cuMemUnmap(va, n * gran)) bad = 4;
                        remaps += n;
                        if (mode == 2) std::this_thread::sleep_for(clk::now() - t);
                    }
                });
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            std::vector<double> per(iters);
            auto t0 = clk::now();
            for (int k = 0; k < iters; ++k) {
                auto t = clk::now();
                spin<<<1, 1>>>(100);
                CK(cuEventRecord(ev, CU_STREAM_LEGACY));
                (void)cuEventQuery(ev);
                (void)cuStreamQuery(other);
                per[k] = us_since(t);
            }
            const double total = us_since(t0);
            const long done = remaps.load();
            stop = true;
            if (worker.joinable()) worker.join();
            CK(cuCtxSynchronize());
            std::sort(per.begin(), per.end());
            printf("background worker=%s round=%d main_us_per_iter=%.2f median=%.2f p99=%.2f max=%.1f worker_handles=%ld "
                   "worker_us_per_handle=%.1f failed=%d\n",
                   names[mode], round, total / iters, per[iters / 2], per[iters * 99 / 100], per.back(), done,
                   done ? total / done : 0.0, bad.load());
        }
    }
    // A global-mode capture on this thread while the helper remaps: does the capture survive?
    for (int mode = 0; mode < 2; ++mode) {
        std::atomic<bool> stop{false};
        std::atomic<long> refused{0}, calls{0};
        std::thread worker;
        CUstream cs;
        CK(cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING));
        if (mode)
            worker = std::thread([&] {
                if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) return;
                while (!stop.load()) {
                    for (int i = 0; i < n; ++i) refused += cuMemMap(va + size_t(i) * gran, gran, 0, h[i], 0) != CUDA_SUCCESS;
                    refused += cuMemSetAccess(va, n * gran, &ck.acc, 1) != CUDA_SUCCESS;
                    refused += cuMemUnmap(va, n * gran) != CUDA_SUCCESS;
                    calls += n + 2;
                }
            });
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        CUresult begin = cuStreamBeginCapture(cs, CU_STREAM_CAPTURE_MODE_GLOBAL);
        for (int k = 0; k < 200; ++k) spin<<<1, 1, 0, cudaStream_t(cs)>>>(100);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        CUgraph g = nullptr;
        CUresult end = cuStreamEndCapture(cs, &g);
        stop = true;
        if (worker.joinable()) worker.join();
        printf("capture worker=%s begin=%d end=%d worker_calls=%ld refused=%ld\n", names[mode], int(begin), int(end),
               calls.load(), refused.load());
        if (g) cuGraphDestroy(g);
        (void)cuCtxSynchronize();
        (void)cudaGetLastError();
        CK(cuStreamDestroy(cs));
    }
    CK(cuMemAddressFree(va, gran * n));
    for (auto& x : h) CK(cuMemRelease(x));
    CK(cuEventDestroy(ev));
    CK(cuStreamDestroy(other));
    return 0;
}

// The device's side of an ordered release (block_pool::order_release) with PyTorch's 32 idle pooled
// streams: legacy-stream waits for each stream's mark, an event, each stream's wait for it.
static int order(cudaStream_t) {
    constexpr int n_streams = 32, iters = 300;
    std::vector<CUstream> st(n_streams);
    std::vector<CUevent> mark(n_streams);
    for (int i = 0; i < n_streams; ++i) {
        CK(cuStreamCreate(&st[i], CU_STREAM_NON_BLOCKING));
        CK(cuEventCreate(&mark[i], CU_EVENT_DISABLE_TIMING));
    }
    CUevent e, a, b;
    CK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    CK(cuEventCreate(&a, CU_EVENT_DEFAULT));
    CK(cuEventCreate(&b, CU_EVENT_DEFAULT));
    const char* names[] = {"kernels_only", "release_wait_only", "release_marks_and_waits"};
    for (int round = 0; round < 3; ++round) {
        for (int v = 0; v < 3; ++v) {
            CK(cuCtxSynchronize());
            spin<<<1, 1>>>(200000000LL);  // about 100 ms: the host queues everything meanwhile
            CK(cuEventRecord(a, CU_STREAM_LEGACY));
            const auto t0 = clk::now();
            for (int k = 0; k < iters; ++k) {
                spin<<<1, 1>>>(1000);
                if (v == 2)
                    for (int i = 0; i < n_streams; ++i) {
                        CK(cuEventRecord(mark[i], st[i]));
                        CK(cuStreamWaitEvent(CU_STREAM_LEGACY, mark[i], 0));
                    }
                if (v >= 1) {
                    CK(cuEventRecord(e, CU_STREAM_LEGACY));
                    for (int i = 0; i < n_streams; ++i) CK(cuStreamWaitEvent(st[i], e, 0));
                }
            }
            const double host = us_since(t0);
            CK(cuEventRecord(b, CU_STREAM_LEGACY));
            const bool queued_in_time = cuEventQuery(a) == CUDA_ERROR_NOT_READY;  // the host was done before the device began
            CK(cuEventSynchronize(b));
            float ms = 0;
            CK(cuEventElapsedTime(&ms, a, b));
            printf("order variant=%s streams=%d round=%d gpu_us_per_iter=%.3f host_us_per_iter=%.3f queued_in_time=%d\n",
                   names[v], n_streams, round, 1000.0 * ms / iters, host / iters, int(queued_in_time));
        }
    }
    CK(cuCtxSynchronize());
    for (int i = 0; i < n_streams; ++i) {
        CK(cuStreamDestroy(st[i]));
        CK(cuEventDestroy(mark[i]));
    }
    CK(cuEventDestroy(e));
    CK(cuEventDestroy(a));
    CK(cuEventDestroy(b));
    return 0;
}

// "offset" (only by name): can one physical handle be mapped in part, from a nonzero offset
// (cuMemMap's offset argument; cuda.h 13.0 describes it, and its parameter note still says
// "currently must be zero")?  A pool could then create large handles (fewer calls to grow and to
// stitch) and still lend their free 2 MiB pieces one by one, keeping its promise at 2 MiB.
// Prints "offset map rc=R", "offset alias ok=0|1" (the piece reads and writes the handle's second
// granule, and the whole mapping sees it), and "offset op=NAME pieces=N us_per_piece=X" for
// map + access + unmap of single granules: whole small handles against pieces of one large one,
// and runs of 4 granules as one piece.
static int offset(CUdevice dev) {
    chunk_kind ck;
    CK(ck.init(dev));
    const size_t g = ck.gran, units = 32, big = units * g;
    CUmemGenericAllocationHandle h;
    CK(cuMemCreate(&h, big, &ck.prop, 0));
    CUdeviceptr whole = 0, piece = 0;
    CK(cuMemAddressReserve(&whole, big, 0, 0, 0));
    CK(cuMemAddressReserve(&piece, big, 0, 0, 0));
    CK(cuMemMap(whole, big, 0, h, 0));
    CK(cuMemSetAccess(whole, big, &ck.acc, 1));
    for (size_t u = 0; u < units; ++u) CK(cuMemsetD32(whole + u * g, unsigned(0x1000 + u), g / 4));
    CUresult rc = cuMemMap(piece, g, g, h, 0);
    printf("offset map rc=%d\n", int(rc));
    if (rc != CUDA_SUCCESS) {  // run 143 (H200, driver 580.159.04): 801, CUDA_ERROR_NOT_SUPPORTED
        CK(cuMemUnmap(whole, big));
        CK(cuMemRelease(h));
        CK(cuMemAddressFree(whole, big));
        CK(cuMemAddressFree(piece, big));
        return 0;
    }
    CK(cuMemSetAccess(piece, g, &ck.acc, 1));
    unsigned v = 0, w = 0;
    CK(cuMemcpyDtoH(&v, piece + 8, 4));
    CK(cuMemsetD32(piece, 0xbeef, g / 4));
    CK(cuMemcpyDtoH(&w, whole + g + 8, 4));
    unsigned first = 0;
    CK(cuMemcpyDtoH(&first, whole + 8, 4));
    printf("offset alias ok=%d read=0x%x wrote_through=0x%x unit0=0x%x\n", int(v == 0x1001 && w == 0xbeef && first == 0x1000), v, w,
           first);
    CK(cuMemUnmap(piece, g));
    // Costs: n single granules, as whole small handles, then as pieces of h; then runs of 4.
    const int n = int(units);
    std::vector<CUmemGenericAllocationHandle> small(n);
    for (auto& s : small) CK(cuMemCreate(&s, g, &ck.prop, 0));
    for (int round = 0; round < 3; ++round) {
        auto t0 = clk::now();
        for (int i = 0; i < n; ++i) CK(cuMemMap(piece + i * g, g, 0, small[i], 0));
        CK(cuMemSetAccess(piece, n * g, &ck.acc, 1));
        CK(cuMemUnmap(piece, n * g));
        printf("offset op=small_handles pieces=%d us_per_piece=%.2f round=%d\n", n, us_since(t0) / n, round);
        // Pieces of one handle in reverse order, so that no two neighbours could merge.
        t0 = clk::now();
        for (int i = 0; i < n; ++i) CK(cuMemMap(piece + i * g, g, size_t(n - 1 - i) * g, h, 0));
        CK(cuMemSetAccess(piece, n * g, &ck.acc, 1));
        CK(cuMemUnmap(piece, n * g));
        printf("offset op=pieces_of_one pieces=%d us_per_piece=%.2f round=%d\n", n, us_since(t0) / n, round);
        t0 = clk::now();
        for (int i = 0; i < n; i += 4) CK(cuMemMap(piece + i * g, 4 * g, size_t(n - 4 - i) * g, h, 0));
        CK(cuMemSetAccess(piece, n * g, &ck.acc, 1));
        CK(cuMemUnmap(piece, n * g));
        printf("offset op=runs_of_4 pieces=%d us_per_piece=%.2f us_per_granule=%.2f round=%d\n", n / 4, us_since(t0) / (n / 4),
               us_since(t0) / n, round);
    }
    for (auto& s : small) CK(cuMemRelease(s));
    CK(cuMemUnmap(whole, big));
    CK(cuMemRelease(h));
    CK(cuMemAddressFree(whole, big));
    CK(cuMemAddressFree(piece, big));
    return 0;
}

int main(int argc, char** argv) {
    if (cudaFree(nullptr) != cudaSuccess) return 3;
    CUdevice dev;
    CK(cuCtxGetDevice(&dev));
    cudaStream_t side;
    if (cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) != cudaSuccess) return 3;
    const std::string only = argc > 1 ? argv[1] : "";
    if (only == "calls") return calls(side, dev, argc > 2 ? strtoull(argv[2], nullptr, 10) : 0, argc > 3 ? argv[3] : "vmm");
    if (only == "order") return order(side);
    if (only == "offset") return offset(dev);
    if (only == "background") {
        CUcontext c;
        CK(cuCtxGetCurrent(&c));
        return background(dev, c);
    }
    if (only.empty())
        for (int busy = 0; busy < 2; ++busy)
            if (int rc = run(busy, dev, side)) return rc;
    if (only.empty() || only == "stall")
        if (int rc = stall(dev, side)) return rc;
    CUcontext ctx;
    CK(cuCtxGetCurrent(&ctx));
    if (only.empty() || only == "parallel") return parallel(dev, ctx);
    return 0;
}
