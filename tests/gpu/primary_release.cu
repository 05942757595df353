// What a primary context's last cuDevicePrimaryCtxRelease does to memory, and a program that lives through it twice.
//
// `probe`: prints, one fact per line, whether the last release ends the context, frees its
// cuMemAlloc memory, and leaves cuMemCreate memory mapped and usable in the next primary context,
// and whether the virtual-memory calls answer with no context current.
// `fill [rounds]`: each round retains the primary context, fills the device with 1 GiB cuMemAlloc
// blocks until the driver says no, frees them and releases the context (its last reference); prints
// "round R: N GiB".  Without gpumem every round gets the same N; a pool that missed the context's
// end would hand out memory the driver already took back (more) or keep it (less).
#include <cuda.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static int rc(CUresult r) { return int(r); }

static int probe() {
    CUdevice dev = 0;
    CUcontext c = nullptr;
    cuDevicePrimaryCtxRetain(&c, dev);
    cuCtxSetCurrent(c);
    size_t free0 = 0, total = 0;
    cuMemGetInfo(&free0, &total);
    CUdeviceptr a = 0;
    printf("alloc 1 GiB: %d\n", rc(cuMemAlloc(&a, size_t(1) << 30)));
    size_t free1 = 0;
    cuMemGetInfo(&free1, &total);

    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t gran = 0;
    cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    const int n = 32;
    CUdeviceptr va = 0;
    printf("reserve: %d\n", rc(cuMemAddressReserve(&va, gran * n, 0, 0, 0)));
    std::vector<CUmemGenericAllocationHandle> h(n);
    for (int i = 0; i < n; ++i) {
        cuMemCreate(&h[i], gran, &prop, 0);
        cuMemMap(va + gran * i, gran, 0, h[i], 0);
    }
    CUmemAccessDesc acc{};
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    printf("access: %d\n", rc(cuMemSetAccess(va, gran * n, &acc, 1)));
    // One call per statement: printf's arguments are evaluated in no fixed order.
    int r1 = rc(cuMemsetD8(va, 7, gran * n));
    int r2 = rc(cuCtxSynchronize());
    printf("memset vmm before: %d sync %d\n", r1, r2);

    printf("release: %d\n", rc(cuDevicePrimaryCtxRelease(dev)));
    unsigned flags = 0;
    int active = -1;
    r1 = rc(cuDevicePrimaryCtxGetState(dev, &flags, &active));
    printf("state after release: rc %d active %d\n", r1, active);
    CUcontext cur = nullptr;
    cuCtxGetCurrent(&cur);
    printf("current after release: %s\n", cur == nullptr ? "none" : cur == c ? "the old handle" : "another");
    cuCtxSetCurrent(nullptr);
    active = -1;
    r1 = rc(cuDevicePrimaryCtxGetState(dev, &flags, &active));
    printf("state with no context current: rc %d active %d\n", r1, active);
    // With no context current: give back the second half of the chunks.
    const int half = n / 2;
    printf("no context: unmap %d\n", rc(cuMemUnmap(va + gran * half, gran * half)));
    int released = 0;
    for (int i = half; i < n; ++i) released += cuMemRelease(h[i]) == CUDA_SUCCESS;
    printf("no context: released %d of %d\n", released, half);

    CUcontext c2 = nullptr;
    printf("retain again: %d same handle %d\n", rc(cuDevicePrimaryCtxRetain(&c2, dev)), c2 == c);
    cuCtxSetCurrent(c2);
    size_t free2 = 0;
    cuMemGetInfo(&free2, &total);
    printf("free MiB: start %zu, after 1 GiB alloc %zu, in the new context %zu\n", free0 >> 20, free1 >> 20, free2 >> 20);
    printf("old cuMemAlloc pointer: free %d\n", rc(cuMemFree(a)));
    unsigned char byte = 0;
    r1 = rc(cuMemcpyDtoH(&byte, va + 5, 1));
    printf("read back the old value (7): %d value %d\n", r1, int(byte));
    r1 = rc(cuMemsetD8(va, 9, gran * half));
    r2 = rc(cuCtxSynchronize());
    printf("memset vmm first half in new context: %d sync %d\n", r1, r2);
    byte = 0;
    r1 = rc(cuMemcpyDtoH(&byte, va + 5, 1));
    printf("read back the new value (9): %d value %d\n", r1, int(byte));
    printf("unmap first half: %d\n", rc(cuMemUnmap(va, gran * half)));
    released = 0;
    for (int i = 0; i < half; ++i) released += cuMemRelease(h[i]) == CUDA_SUCCESS;
    printf("released %d of %d; address free %d\n", released, half, rc(cuMemAddressFree(va, gran * n)));
    cuDevicePrimaryCtxRelease(dev);
    return 0;
}

static int fill(int rounds) {
    CUdevice dev = 0;
    bool bad = false;
    for (int r = 1; r <= rounds; ++r) {
        CUcontext c = nullptr;
        if (cuDevicePrimaryCtxRetain(&c, dev) != CUDA_SUCCESS || cuCtxSetCurrent(c) != CUDA_SUCCESS) return 1;
        std::vector<CUdeviceptr> blocks;
        for (;;) {
            CUdeviceptr p = 0;
            if (cuMemAlloc(&p, size_t(1) << 30) != CUDA_SUCCESS) break;
            // Each block's own value, read back below: memory that took no write would show.
            if (cuMemsetD8(p, (unsigned char)(r * 16 + blocks.size() % 16), size_t(1) << 30) != CUDA_SUCCESS) return 3;
            blocks.push_back(p);
        }
        const CUresult s = cuCtxSynchronize();
        size_t wrong = 0;
        for (size_t i = 0; i < blocks.size(); ++i) {
            unsigned char first = 0, last = 0;
            cuMemcpyDtoH(&first, blocks[i], 1);
            cuMemcpyDtoH(&last, blocks[i] + (size_t(1) << 30) - 1, 1);
            const unsigned char want = (unsigned char)(r * 16 + i % 16);
            wrong += first != want || last != want;
        }
        printf("round %d: %zu GiB (sync %d), %zu blocks read back wrong\n", r, blocks.size(), rc(s), wrong);
        fflush(stdout);
        if (wrong) bad = true;
        for (CUdeviceptr p : blocks) cuMemFree(p);
        cuCtxSetCurrent(nullptr);
        if (cuDevicePrimaryCtxRelease(dev) != CUDA_SUCCESS) return 2;
        unsigned flags = 0;
        int active = -1;
        cuDevicePrimaryCtxGetState(dev, &flags, &active);
        if (active) return 4;  // the release was not the last: the check would prove nothing
    }
    return bad ? 5 : 0;
}

int main(int argc, char** argv) {
    if (cuInit(0) != CUDA_SUCCESS) return 1;
    if (argc > 1 && !strcmp(argv[1], "probe")) return probe();
    if (argc > 1 && !strcmp(argv[1], "fill")) return fill(argc > 2 ? atoi(argv[2]) : 2);
    fprintf(stderr, "usage: %s probe|fill [rounds]\n", argv[0]);
    return 2;
}
