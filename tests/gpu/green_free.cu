// What the driver does with memory allocated while a green context was current, once cuGreenCtxDestroy destroyed that green context (its primary context living on).
//
// `probe`: prints, one fact per line, the answers of the calls a program might make on such memory:
// does cuGreenCtxDestroy give a cuMemAlloc block back (cuMemGetInfo), which context owns it before,
// can it be written and freed after, and the same for cuMemCreate memory mapped with the green
// context current.  gpumem's pool must answer a later cuMemFree of a pooled block as the driver
// answers this one (docs/pool.md, "cuGreenCtxDestroy"); run it with and without LD_PRELOAD.  Round 2
// frees late, then resets the primary context.
#include <cuda.h>

#include <cstdio>
#include <cstring>

static int rc(CUresult r) { return int(r); }

static long long free_mib() {
    size_t f = 0, t = 0;
    if (cuMemGetInfo(&f, &t) != CUDA_SUCCESS) return -1;
    return (long long)(f >> 20);
}

// A green context of all of dev's SMs, or its creation's error.
static CUresult make_green(CUdevice dev, CUgreenCtx* g) {
    CUdevResource sm{};
    if (CUresult r = cuDeviceGetDevResource(dev, &sm, CU_DEV_RESOURCE_TYPE_SM)) return r;
    CUdevResourceDesc desc = nullptr;
    if (CUresult r = cuDevResourceGenerateDesc(&desc, &sm, 1)) return r;
    return cuGreenCtxCreate(g, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM);
}

static int probe() {
    setvbuf(stdout, nullptr, _IONBF, 0);  // every line out before a crash
    int version = 0;
    cuDriverGetVersion(&version);
    printf("driver version: %d\n", version);
    CUdevice dev = 0;
    CUcontext primary = nullptr;
    if (cuDevicePrimaryCtxRetain(&primary, dev) != CUDA_SUCCESS || cuCtxSetCurrent(primary) != CUDA_SUCCESS) return 1;
    const size_t gib = size_t(1) << 30;
    CUcontext last_green = nullptr;  // does the driver hand a destroyed green context's handle out again?
    for (int round = 0; round < 2; ++round) {
        // Round 0: the free comes with the primary context current; round 1: with none current.
        printf("-- round %d: free with %s current\n", round, round == 0 ? "the primary context" : "no context");
        CUgreenCtx g = nullptr;
        int r1 = rc(make_green(dev, &g));
        printf("green create: %d\n", r1);
        if (r1) return 2;
        CUcontext own = nullptr;
        printf("ctx from green: %d same as primary %d, same as the last destroyed green context's %d\n",
               rc(cuCtxFromGreenCtx(&own, g)), int(own == primary), int(own && own == last_green));
        last_green = own;
        printf("set green current: %d\n", rc(cuCtxSetCurrent(own)));
        const long long f0 = free_mib();
        CUdeviceptr a = 0, a2 = 0;
        r1 = rc(cuMemAlloc(&a, gib));
        printf("alloc 1 GiB in green: %d, free fell %lld MiB\n", r1, f0 - free_mib());
        printf("alloc a second 1 GiB in green (freed before the destroy): %d\n", rc(cuMemAlloc(&a2, gib)));
        printf("free it in green: %d\n", rc(cuMemFree(a2)));
        CUcontext owner = nullptr;
        r1 = rc(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, a));
        printf("owner before: %d green %d primary %d\n", r1, int(owner == own), int(owner == primary));
        r1 = rc(cuMemsetD8(a, 7, gib));
        int r2 = rc(cuCtxSynchronize());
        printf("memset in green: %d sync %d\n", r1, r2);

        // VMM memory mapped with the green context current.
        CUmemAllocationProp prop{};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = dev;
        size_t gran = 0;
        cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        const size_t vbytes = gran * 256;
        CUdeviceptr va = 0;
        CUmemGenericAllocationHandle h = 0;
        r1 = rc(cuMemAddressReserve(&va, vbytes, 0, 0, 0));
        r2 = rc(cuMemCreate(&h, vbytes, &prop, 0));
        int r3 = rc(cuMemMap(va, vbytes, 0, h, 0));
        CUmemAccessDesc acc{};
        acc.location = prop.location;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        int r4 = rc(cuMemSetAccess(va, vbytes, &acc, 1));
        printf("vmm %zu MiB in green: reserve %d create %d map %d access %d\n", vbytes >> 20, r1, r2, r3, r4);
        r1 = rc(cuMemsetD8(va, 5, vbytes));
        r2 = rc(cuCtxSynchronize());
        printf("memset vmm in green: %d sync %d\n", r1, r2);

        printf("set primary current: %d\n", rc(cuCtxSetCurrent(primary)));
        const long long f1 = free_mib();
        printf("green destroy: %d\n", rc(cuGreenCtxDestroy(g)));
        printf("free rose at the destroy by %lld MiB\n", free_mib() - f1);
        owner = nullptr;
        r1 = rc(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, a));
        printf("owner after: %d green %d primary %d\n", r1, int(owner == own), int(owner == primary));
        CUdeviceptr base = 0;
        size_t size = 0;
        r1 = rc(cuMemGetAddressRange(&base, &size, a));
        printf("address range after: %d size %zu MiB\n", r1, size >> 20);
        r1 = rc(cuMemsetD8(a, 9, gib));
        r2 = rc(cuCtxSynchronize());
        printf("memset cuMemAlloc block after, in primary: %d sync %d\n", r1, r2);
        r1 = rc(cuMemsetD8(va, 9, vbytes));
        r2 = rc(cuCtxSynchronize());
        printf("memset vmm after, in primary: %d sync %d\n", r1, r2);
        if (round == 1) cuCtxSetCurrent(nullptr);
        const long long f2 = round == 1 ? -1 : free_mib();
        r1 = rc(cuMemFree(a));
        cuCtxSetCurrent(primary);
        printf("cuMemFree after: %d, free rose by %lld MiB\n", r1, round == 1 ? -1 : free_mib() - f2);
        printf("cuMemFree again: %d\n", rc(cuMemFree(a)));
        printf("cuMemFree of the block freed before the destroy: %d\n", rc(cuMemFree(a2)));
        const long long f3 = free_mib();
        r1 = rc(cuMemUnmap(va, vbytes));
        r2 = rc(cuMemRelease(h));
        r3 = rc(cuMemAddressFree(va, vbytes));
        printf("vmm after: unmap %d release %d address free %d, free rose by %lld MiB\n", r1, r2, r3, free_mib() - f3);
        fflush(stdout);
    }
    // Round 2: a cuMemAlloc made with the destroyed green context current, then the primary
    // context's reset after the late free, then a fresh primary context that must allocate as before.
    printf("-- round 2: the late free, then the primary reset\n");
    CUgreenCtx g = nullptr;
    if (make_green(dev, &g) != CUDA_SUCCESS) return 2;
    CUcontext own = nullptr;
    cuCtxFromGreenCtx(&own, g);
    printf("same handle as the last destroyed green context's: %d\n", int(own == last_green));
    cuCtxSetCurrent(own);
    const size_t mib64 = size_t(64) << 20;
    CUdeviceptr a = 0;
    printf("alloc 64 MiB in green: %d\n", rc(cuMemAlloc(&a, mib64)));
    cuCtxSetCurrent(primary);
    printf("green destroy: %d\n", rc(cuGreenCtxDestroy(g)));
    printf("late free of the green block: %d\n", rc(cuMemFree(a)));
    printf("primary reset: %d\n", rc(cuDevicePrimaryCtxReset(dev)));
    CUcontext again = nullptr;
    int r1 = rc(cuDevicePrimaryCtxRetain(&again, dev));
    printf("primary retain after the reset: %d same handle %d set current %d\n", r1, int(again == primary),
           rc(cuCtxSetCurrent(again)));
    const long long f4 = free_mib();
    CUdeviceptr c = 0;
    r1 = rc(cuMemAlloc(&c, gib));
    printf("alloc 1 GiB in the new primary: %d, free fell %lld MiB\n", r1, f4 - free_mib());
    r1 = rc(cuMemsetD8(c, 1, gib));
    printf("memset it: %d sync %d free %d\n", r1, rc(cuCtxSynchronize()), rc(cuMemFree(c)));
    cuDevicePrimaryCtxRelease(dev);
    cuDevicePrimaryCtxRelease(dev);
    printf("probe done\n");
    return 0;
}

// `dead-current`: makes a destroyed green context current, allocates there (cuMemAlloc and
// cuMemAllocPitch), then makes the primary context current again.  On an H100 (driver 580.159.04) the last call died of a double free inside
// libcuda's cuCtxSetCurrent, without gpumem: so gpumem must never make a destroyed green context
// current (pool_hooks.cc, primary_released_by), and `probe` above no longer does.
static int dead_current() {
    setvbuf(stdout, nullptr, _IONBF, 0);
    CUdevice dev = 0;
    CUcontext primary = nullptr;
    if (cuDevicePrimaryCtxRetain(&primary, dev) != CUDA_SUCCESS || cuCtxSetCurrent(primary) != CUDA_SUCCESS) return 1;
    CUgreenCtx g = nullptr;
    if (make_green(dev, &g) != CUDA_SUCCESS) return 2;
    CUcontext own = nullptr;
    cuCtxFromGreenCtx(&own, g);
    printf("green destroy: %d\n", rc(cuGreenCtxDestroy(g)));
    printf("set the dead green context current: %d\n", rc(cuCtxSetCurrent(own)));
    CUdeviceptr b = 0;
    printf("alloc 64 MiB with it current: %d\n", rc(cuMemAlloc(&b, size_t(64) << 20)));
    // The pitched route is not pooled: gpumem passes it to the driver, so both answers must match.
    CUdeviceptr p = 0;
    size_t pitch = 0;
    printf("pitched alloc 4096 x 1024 with it current: %d\n", rc(cuMemAllocPitch(&p, &pitch, 4096, 1024, 16)));
    printf("set the primary context current again: %d\n", rc(cuCtxSetCurrent(primary)));
    printf("dead-current done\n");
    return 0;
}

int main(int argc, char** argv) {
    if (cuInit(0) != CUDA_SUCCESS) return 1;
    if (argc > 1 && !strcmp(argv[1], "probe")) return probe();
    if (argc > 1 && !strcmp(argv[1], "dead-current")) return dead_current();
    fprintf(stderr, "usage: %s probe|dead-current\n", argv[0]);
    return 2;
}
