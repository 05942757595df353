// A plain CUDA C++ program built with nvcc's default static cudart: the allocations gpumem must see through the resolver.
//
// Prints the sizes it allocated, then (with "bench") the mean, median and 90th percentile cost of
// cudaMalloc+cudaFree pairs, each pair timed on its own, so
// gpu-e2e.sh can compare the same binary with and without gpumem.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <vector>
#include <cstdio>
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

int main(int argc, char** argv) {
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
        for (size_t size : {size_t(512), size_t(1) << 20, size_t(20) << 20}) {
            const int n = 2000;
            std::vector<double> us(n);
            for (int i = 0; i < n; ++i) {
                auto t0 = std::chrono::steady_clock::now();
                char* p;
                CHECK(cudaMalloc(&p, size));
                CHECK(cudaFree(p));
                us[i] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
            }
            double mean = std::accumulate(us.begin(), us.end(), 0.0) / n;
            std::sort(us.begin(), us.end());
            printf("bench size=%zu pair_us=%.2f median_us=%.2f p90_us=%.2f\n", size, mean, us[n / 2], us[n * 9 / 10]);
        }
    }
    return 0;
}
