// A plain CUDA C++ program built with nvcc's default static cudart: the allocations gpumem must see through the resolver.
//
// Prints the sizes it allocated, then (with "bench [HOLD_MIB]") the mean, median and 90th
// percentile cost of cudaMalloc+cudaFree pairs, and of the driver's cuMemAlloc+cuMemFree pairs
// (the same call gpumem serves, without cudart's own work around it), each pair timed on its own,
// so gpu-e2e.sh and pool_bench.py can compare the same binary with and without gpumem.  HOLD_MIB
// (default 0): live memory held in 64 MiB blocks during the loops, as a training program holds
// its weights and activations while it allocates (a pool's fence batches scale with its size).
// Each line also gives the medians of the allocation and the free alone (the halves of a pair),
// and BENCH_DRIVER_FIRST=1 times the driver's pairs before cudart's, to tell the api from the order.
// With "reset": fills the device, resets it and fills it again (fill_and_free below).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <vector>
#include <cstdio>
#include <cstdlib>
#include <cstring>

__global__ void fill(char* p, size_t n) {
    size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
    if (i < n) p[i] = char(i);
}

#define CHECK(x)                                                                        \
    do {                                                                                \
        cudaError_t e_ = (x);                                                           \
        if (e_ != cudaSuccess) {                                                        \
            fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_));             \
            return 3;                                                                   \
        }                                                                               \
    } while (0)

// "reset": 1 GiB cudaMalloc until the device refuses, all freed, cudaDeviceReset, and the same
// again (tests/gpu/reset_check.py): the second fill must get what the first got.
static int fill_and_free() {
    std::vector<void*> ps;
    for (void* p; cudaMalloc(&p, size_t(1) << 30) == cudaSuccess;) ps.push_back(p);
    cudaGetLastError();  // the refusal is the point, not an error to keep
    for (void* p : ps) cudaFree(p);
    return int(ps.size());
}

int main(int argc, char** argv) {
    if (argc > 1 && !strcmp(argv[1], "reset")) {
        // First cuCtxDestroy of the primary context, which the driver refuses: a block made
        // before it must stay usable (the pool must not have given it back).
        char* live = nullptr;
        CHECK(cudaMalloc(&live, size_t(64) << 20));
        using get_ctx_fn = CUresult (*)(CUcontext*);
        using destroy_fn = CUresult (*)(CUcontext);
        void *g = nullptr, *d = nullptr;
        cudaDriverEntryPointQueryResult qg, qd;
        CHECK(cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &g, 4000, cudaEnableDefault, &qg));
        CHECK(cudaGetDriverEntryPointByVersion("cuCtxDestroy", &d, 4000, cudaEnableDefault, &qd));
        CUcontext ctx = nullptr;
        const int get_rc = g ? int(get_ctx_fn(g)(&ctx)) : -1;
        const int destroy_rc = d && !get_rc ? int(destroy_fn(d)(ctx)) : -1;
        const int memset_rc = int(cudaMemset(live, 1, size_t(64) << 20));
        const int sync_rc = int(cudaDeviceSynchronize());
        printf("destroy_primary=%d memset=%d sync=%d\n", destroy_rc, memset_rc, sync_rc);
        cudaFree(live);
        const int first = fill_and_free();
        CHECK(cudaDeviceReset());
        const int second = fill_and_free();
        printf("reset first=%d second=%d\n", first, second);
        return 0;
    }
    const size_t sizes[] = {1000, 1 << 20, (3 << 20) + 5, 256u << 20};
    char* ptrs[4];
    for (int i = 0; i < 4; ++i) {
        CHECK(cudaMalloc(&ptrs[i], sizes[i]));
        fill<<<unsigned((sizes[i] + 255) / 256), 256>>>(ptrs[i], sizes[i]);
        printf("alloc %zu\n", sizes[i]);
    }
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < 4; ++i) CHECK(cudaFree(ptrs[i]));
    if (argc > 1 && !strcmp(argv[1], "bench")) {
        const size_t hold_mib = argc > 2 ? strtoull(argv[2], nullptr, 10) : 0;
        std::vector<void*> held;
        for (size_t m = 0; m < hold_mib; m += 64) {
            void* h;
            CHECK(cudaMalloc(&h, size_t(64) << 20));
            held.push_back(h);
        }
        // The driver's entry points through cudart, as a static-cudart program reaches them
        // (cuGetProcAddress), so no -lcuda is needed.
        using alloc_fn = CUresult (*)(CUdeviceptr*, size_t);
        using free_fn = CUresult (*)(CUdeviceptr);
        void *a = nullptr, *f = nullptr;
        cudaDriverEntryPointQueryResult qa, qf;
        CHECK(cudaGetDriverEntryPointByVersion("cuMemAlloc", &a, 3020, cudaEnableDefault, &qa));
        CHECK(cudaGetDriverEntryPointByVersion("cuMemFree", &f, 3020, cudaEnableDefault, &qf));
        if (qa != cudaDriverEntryPointSuccess || qf != cudaDriverEntryPointSuccess) {
            fprintf(stderr, "no cuMemAlloc/cuMemFree entry point\n");
            return 3;
        }
        const char* order = getenv("BENCH_DRIVER_FIRST");
        const bool driver_first = order && !strcmp(order, "1");
        using clk = std::chrono::steady_clock;
        auto us_between = [](clk::time_point a, clk::time_point b) {
            return std::chrono::duration<double, std::micro>(b - a).count();
        };
        for (int k = 0; k < 2; ++k) {
            const int api = driver_first ? 1 - k : k;
            for (size_t size : {size_t(512), size_t(1) << 20, size_t(20) << 20}) {
                const int n = 2000;
                std::vector<double> us(n), alloc_us(n), free_us(n);
                for (int i = 0; i < n; ++i) {
                    clk::time_point t0 = clk::now(), t1;
                    if (api == 0) {
                        char* p;
                        CHECK(cudaMalloc(&p, size));
                        t1 = clk::now();
                        CHECK(cudaFree(p));
                    } else {
                        CUdeviceptr p;
                        const bool ok = alloc_fn(a)(&p, size) == CUDA_SUCCESS;
                        t1 = clk::now();
                        if (!ok || free_fn(f)(p) != CUDA_SUCCESS) {
                            fprintf(stderr, "cuMemAlloc/cuMemFree failed\n");
                            return 3;
                        }
                    }
                    const clk::time_point t2 = clk::now();
                    us[i] = us_between(t0, t2);
                    alloc_us[i] = us_between(t0, t1);
                    free_us[i] = us_between(t1, t2);
                }
                double mean = std::accumulate(us.begin(), us.end(), 0.0) / n;
                for (auto* v : {&us, &alloc_us, &free_us}) std::sort(v->begin(), v->end());
                printf("bench api=%s hold_mib=%zu size=%zu pair_us=%.2f median_us=%.2f p90_us=%.2f "
                       "alloc_median_us=%.2f free_median_us=%.2f\n",
                       api == 0 ? "cudaMalloc" : "cuMemAlloc", hold_mib, size, mean, us[n / 2], us[n * 9 / 10],
                       alloc_us[n / 2], free_us[n / 2]);
            }
        }
        for (void* h : held) CHECK(cudaFree(h));
    }
    return 0;
}
