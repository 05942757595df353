// Which memory a context's end gives back: cuMemAlloc, cuMemAllocAsync and cuMemCreate memory made while a created context was current, then cuCtxDestroy; and the same under the primary context, then cuDevicePrimaryCtxReset.
//
// gpumem's log model (docs/log-format.md, context_reset; 640a6da) drops a context's cuMemAlloc
// blocks at its end and keeps stream-ordered and cuMemCreate memory, which cuda.h ties to no
// context.  This probe prints, per kind, the device's free memory before, after the allocation
// and after the end (asked in the primary context), and whether the pointer is still known to the
// driver (cuPointerGetAttribute) and can be freed.  Run it alone and under gpumem.
#include <cuda.h>

#include <cstdio>

static const size_t kGiB = size_t(1) << 30;

static long long free_mib(CUcontext primary) {
    CUcontext was = nullptr;
    cuCtxGetCurrent(&was);
    cuCtxSetCurrent(primary);
    size_t f = 0, t = 0;
    long long r = cuMemGetInfo(&f, &t) == CUDA_SUCCESS ? (long long)(f >> 20) : -1;
    cuCtxSetCurrent(was);
    return r;
}

// One GiB of the kind, made with ctx current.
static CUresult make(const char* kind, CUdevice dev, CUdeviceptr* p, CUmemGenericAllocationHandle* h) {
    if (kind[0] == 'a') return cuMemAlloc(p, kGiB);
    if (kind[0] == 's') {
        CUresult r = cuMemAllocAsync(p, kGiB, nullptr);
        return r ? r : cuStreamSynchronize(nullptr);
    }
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    if (CUresult r = cuMemCreate(h, kGiB, &prop, 0)) return r;
    if (CUresult r = cuMemAddressReserve(p, kGiB, 0, 0, 0)) return r;
    if (CUresult r = cuMemMap(*p, kGiB, 0, *h, 0)) return r;
    CUmemAccessDesc acc{};
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return cuMemSetAccess(*p, kGiB, &acc, 1);
}

int main() {
    CUdevice dev = 0;
    CUcontext primary = nullptr;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&primary, dev)) return 1;
    int version = 0;
    cuDriverGetVersion(&version);
    printf("driver version: %d\n", version);
    const char* kinds[] = {"alloc (cuMemAlloc)", "stream-ordered (cuMemAllocAsync)", "vmm (cuMemCreate)"};
    for (int how = 0; how < 2; ++how) {
        for (const char* kind : kinds) {
            CUcontext ctx = nullptr;
            CUresult r = how == 0 ? cuCtxCreate(&ctx, nullptr, 0, dev) : cuCtxSetCurrent(primary);
            if (how == 1) ctx = primary;
            if (r || cuCtxSetCurrent(ctx)) { printf("context: %d\n", int(r)); return 2; }
            long long f0 = free_mib(primary);
            CUdeviceptr p = 0;
            CUmemGenericAllocationHandle h = 0;
            r = make(kind, dev, &p, &h);
            long long f1 = free_mib(primary);
            r = r ? r : (how == 0 ? cuCtxDestroy(ctx) : cuDevicePrimaryCtxReset(dev));
            if (how == 1) {
                cuDevicePrimaryCtxRetain(&primary, dev);  // the reset's context is made anew on the next retain
            }
            cuCtxSetCurrent(primary);
            long long f2 = free_mib(primary);
            CUcontext owner = nullptr;
            CUresult known = cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, p);
            CUresult freed = kind[0] == 'v' ? cuMemUnmap(p, kGiB) : kind[0] == 's' ? cuMemFreeAsync(p, nullptr) : cuMemFree(p);
            if (kind[0] == 'v') {
                CUresult rel = cuMemRelease(h);
                CUresult fr = cuMemAddressFree(p, kGiB);
                printf("  release %d address free %d\n", int(rel), int(fr));
            } else if (kind[0] == 's') {
                cuStreamSynchronize(nullptr);
            }
            long long f3 = free_mib(primary);
            printf("%s, %s: result %d; free MiB before %lld, allocated %lld, after the end %lld, after the free %lld; "
                   "pointer known after the end %d; free after the end %d\n",
                   how == 0 ? "cuCtxDestroy of a created context" : "cuDevicePrimaryCtxReset", kind, int(r), f0, f1, f2, f3,
                   int(known), int(freed));
        }
    }
    return 0;
}
