// What each virtual-memory and fence call costs on the GPU, idle and while a kernel runs: the numbers the pool's trim, stitching and fence design rest on.
//
// Prints one line per measurement: "vmm op=NAME chunks=N us_per_chunk=X busy=0|1" (per 2 MiB of
// memory, also for the 20 MiB handles), and "fence op=NAME us_per_call=X busy=0|1".  The busy
// runs keep a spin kernel going on a separate non-blocking stream, to show whether a call waits
// for device work it does not touch (a call that does would turn every trim into a stall).
#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
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

using clk = std::chrono::steady_clock;
static double us_since(clk::time_point t0) {
    return std::chrono::duration<double, std::micro>(clk::now() - t0).count();
}

static int run(int busy, CUdevice dev, cudaStream_t side) {
    const int n = 256;
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t gran = 0;
    CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUmemAccessDesc acc = {};
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
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

int main() {
    if (cudaFree(nullptr) != cudaSuccess) return 3;
    CUdevice dev;
    CK(cuCtxGetDevice(&dev));
    cudaStream_t side;
    if (cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) != cudaSuccess) return 3;
    for (int busy = 0; busy < 2; ++busy)
        if (int rc = run(busy, dev, side)) return rc;
    return 0;
}
