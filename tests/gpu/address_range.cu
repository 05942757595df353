// What cuMemGetAddressRange, cuPointerGetAttribute(RANGE_*) and cuIpcGetMemHandle answer for allocations of sizes that
// are not multiples of anything, asked at their start, inside them and one byte past them: run once alone and once
// under libgpumem.so (pool on), the two outputs must be the same (scripts/gpu-e2e.sh, base).
#include <cstdio>

#include <cuda.h>
#include <cuda_runtime.h>

int main() {
    const size_t sizes[] = {1, 1000, 4096, 100000, 1 << 20, (1 << 20) + 1, 3000000, 20u << 20, (20u << 20) + 7};
    cudaFree(nullptr);  // the primary context
    int bad = 0;
    for (size_t s : sizes) {
        void* p = nullptr;
        if (cudaMalloc(&p, s) != cudaSuccess) {
            std::printf("size=%zu cudaMalloc failed\n", s);
            bad = 1;
            continue;
        }
        const CUdeviceptr d = CUdeviceptr(p);
        // s: one byte past what was asked, inside the pool's rounding or the driver's own.
        for (size_t off : {size_t(0), s / 2, s - 1, s}) {
            CUdeviceptr base = 0;
            size_t size = 0;
            CUresult r = cuMemGetAddressRange(&base, &size, d + off);
            CUdeviceptr abase = 0;
            size_t asize = 0;
            CUresult r2 = cuPointerGetAttribute(&abase, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, d + off);
            CUresult r3 = cuPointerGetAttribute(&asize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, d + off);
            // Legacy IPC export at that byte: whether the driver hands out a handle there.
            CUipcMemHandle h;
            CUresult r4 = cuIpcGetMemHandle(&h, d + off);
            std::printf("size=%zu off=%zu range rc=%d base_is_ptr=%d size=%zu attr rc=%d,%d start_is_ptr=%d attr_size=%zu ipc rc=%d\n",
                        s, off, int(r), int(base == d), size, int(r2), int(r3), int(abase == d), asize, int(r4));
        }
        cudaFree(p);
    }
    return bad;
}
