// A plain CUDA C++ program built with nvcc's default static cudart: the allocations gpumem must see through the resolver.
//
// Prints the sizes it allocated, then (with "bench") the mean cost of cudaMalloc+cudaFree pairs so
// gpu-e2e.sh can compare the same binary with and without gpumem.
#include <cuda_runtime.h>

#include <chrono>
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
            auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < n; ++i) {
                char* p;
                CHECK(cudaMalloc(&p, size));
                CHECK(cudaFree(p));
            }
            auto t1 = std::chrono::steady_clock::now();
            printf("bench size=%zu pair_us=%.2f\n", size, std::chrono::duration<double, std::micro>(t1 - t0).count() / n);
        }
    }
    return 0;
}
