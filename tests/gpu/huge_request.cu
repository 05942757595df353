// A request larger than the whole device, after the program freed memory the pool caches: it must
// fail as the driver fails it, and leave the device's free memory as it was (the pool keeps its
// cache, as the driver keeps nothing to give back).  Run alone and under libgpumem.so; the outputs
// must be the same (scripts/gpu-e2e-answers.sh).
#include <cstdio>

#include <cuda_runtime.h>

int main() {
    cudaFree(nullptr);  // the primary context
    size_t free0 = 0, total = 0;
    if (cudaMemGetInfo(&free0, &total) != cudaSuccess) return 1;
    // 32 blocks of 64 MiB, every other one freed: 1 GiB the pool caches (and the driver frees).
    void* p[32] = {};
    for (auto& q : p)
        if (cudaMalloc(&q, 64u << 20) != cudaSuccess) return 1;
    for (int i = 0; i < 32; i += 2) {
        cudaFree(p[i]);
        p[i] = nullptr;
    }
    cudaDeviceSynchronize();
    size_t before = 0, after = 0;
    cudaMemGetInfo(&before, &total);
    int bad = 0;
    // The device's total plus 2 MiB, and 2^50 bytes: nothing could make room for either.
    for (size_t want : {total + (2u << 20), size_t(1) << 50}) {
        void* q = nullptr;
        const cudaError_t r = cudaMalloc(&q, want);
        cudaGetLastError();
        cudaMemGetInfo(&after, &total);
        // Free memory may move by a little (the driver's own bookkeeping); a cache given back
        // would move it by about 1 GiB.
        const long long moved_mib = (static_cast<long long>(after) - static_cast<long long>(before)) >> 20;
        std::printf("request=total+2MiB|2^50 rc=%d free_moved_under_64MiB=%d\n", int(r), int(moved_mib < 64 && moved_mib > -64));
        if (r == cudaSuccess) {
            cudaFree(q);
            bad = 1;
        }
    }
    // The program goes on: the freed 1 GiB serves again.
    for (int i = 0; i < 32; i += 2)
        if (cudaMalloc(&p[i], 64u << 20) != cudaSuccess) bad = 1;
    std::printf("after: 16 x 64 MiB again %s\n", bad ? "FAILED" : "ok");
    for (auto q : p) cudaFree(q);
    return bad;
}
