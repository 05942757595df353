// The emulated CUDA runtime: finds the driver exactly as real runtimes do, through the cuGetProcAddress self-lookup.
//
// Built twice: as a shared library (like PyTorch's libcudart.so.13, whose cudaMalloc can be
// interposed by symbol) and as a static archive linked into a program (like nvcc's default
// -cudart static, whose cudaMalloc cannot).  Either way it dlopens libcuda.so.1, dlsyms
// cuGetProcAddress_v2, asks it for "cuGetProcAddress" and resolves everything else through the
// pointer that returns.  GPUMEM_EMU_PTDS=1 asks for per-thread default-stream (_ptsz) variants.
// Built a third and fourth time as libcudart.so.12 and libcudart.so.13, with version nodes named
// like their sonames as the real ones have, and GPUMEM_EMU_CUDART_ID set: each then counts the
// calls it served in gpumem_emu_cudart_served, so a test can tell which runtime answered.
#include <cuda.h>
#undef cuGetProcAddress
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

#ifdef GPUMEM_EMU_CUDART_SHARED
#define RT_EXPORT extern "C" __attribute__((visibility("default")))
#else
#define RT_EXPORT extern "C"
#endif

namespace {
typedef CUresult (*gpa_t)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

struct driver_table {
    gpa_t gpa = nullptr;
    CUresult (*init)(unsigned) = nullptr;
    CUresult (*retain)(CUcontext*, CUdevice) = nullptr;
    CUresult (*release)(CUdevice) = nullptr;
    CUresult (*set_current)(CUcontext) = nullptr;
    CUresult (*sync)() = nullptr;
    CUresult (*mem_get_info)(size_t*, size_t*) = nullptr;
    CUresult (*alloc)(CUdeviceptr*, size_t) = nullptr;
    CUresult (*free)(CUdeviceptr) = nullptr;
    CUresult (*alloc_pitch)(CUdeviceptr*, size_t*, size_t, size_t, unsigned) = nullptr;
    CUresult (*alloc_managed)(CUdeviceptr*, size_t, unsigned) = nullptr;
    CUresult (*alloc_async)(CUdeviceptr*, size_t, CUstream) = nullptr;
    CUresult (*free_async)(CUdeviceptr, CUstream) = nullptr;
    CUresult (*host_alloc)(void**, size_t, unsigned) = nullptr;
    CUresult (*free_host)(void*) = nullptr;
    CUresult (*pool_create)(CUmemoryPool*, const CUmemPoolProps*) = nullptr;
    CUresult (*pool_destroy)(CUmemoryPool) = nullptr;
    CUresult (*alloc_from_pool)(CUdeviceptr*, size_t, CUmemoryPool, CUstream) = nullptr;
    bool ok = false;
};

driver_table g_drv;
std::once_flag g_once;
cuuint64_t g_flags = CU_GET_PROC_ADDRESS_LEGACY_STREAM;

template <class F>
void get(const char* name, F* out, int version) {
    void* p = nullptr;
    CUdriverProcAddressQueryResult st;
    if (g_drv.gpa(name, &p, version, g_flags, &st) == CUDA_SUCCESS) *out = reinterpret_cast<F>(p);
}

void init_once() {
    if (const char* p = getenv("GPUMEM_EMU_PTDS"); p && *p == '1') g_flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    auto boot = reinterpret_cast<gpa_t>(dlsym(h, "cuGetProcAddress_v2"));
    if (!boot) return;
    void* self = nullptr;
    CUdriverProcAddressQueryResult st;
    if (boot("cuGetProcAddress", &self, 13000, 0, &st) != CUDA_SUCCESS || !self) return;
    g_drv.gpa = reinterpret_cast<gpa_t>(self);
    get("cuInit", &g_drv.init, 2000);
    get("cuDevicePrimaryCtxRetain", &g_drv.retain, 7000);
    get("cuDevicePrimaryCtxRelease", &g_drv.release, 7000);  // the first ABI, as a static cudart 13's
    get("cuCtxSetCurrent", &g_drv.set_current, 4000);
    get("cuCtxSynchronize", &g_drv.sync, 2000);
    get("cuMemGetInfo", &g_drv.mem_get_info, 3020);
    get("cuMemAlloc", &g_drv.alloc, 3020);
    get("cuMemFree", &g_drv.free, 3020);
    get("cuMemAllocPitch", &g_drv.alloc_pitch, 3020);
    get("cuMemAllocManaged", &g_drv.alloc_managed, 6000);
    get("cuMemAllocAsync", &g_drv.alloc_async, 11020);
    get("cuMemFreeAsync", &g_drv.free_async, 11020);
    get("cuMemHostAlloc", &g_drv.host_alloc, 2020);
    get("cuMemFreeHost", &g_drv.free_host, 2000);
    get("cuMemPoolCreate", &g_drv.pool_create, 11020);
    get("cuMemPoolDestroy", &g_drv.pool_destroy, 11020);
    get("cuMemAllocFromPoolAsync", &g_drv.alloc_from_pool, 11020);
    if (!g_drv.init || g_drv.init(0) != CUDA_SUCCESS) return;
    CUcontext ctx = nullptr;
    if (!g_drv.retain || g_drv.retain(&ctx, 0) != CUDA_SUCCESS) return;
    if (!g_drv.set_current || g_drv.set_current(ctx) != CUDA_SUCCESS) return;
    // The runtime's reference goes at exit, from a handler registered now, before the program's
    // first allocation (the last reference when GPUMEM_EMU_PRIMARY_REFS=0: the context ends then).
    if (g_drv.release) atexit([] { g_drv.release(0); });
    g_drv.ok = true;
}

bool ready() {
    std::call_once(g_once, init_once);
    return g_drv.ok;
}

// cudaError_t values the tests rely on.
constexpr int k_success = 0, k_invalid_value = 1, k_memory_allocation = 2, k_initialization = 3;
int to_rt(CUresult r) {
    switch (r) {
        case CUDA_SUCCESS: return k_success;
        case CUDA_ERROR_OUT_OF_MEMORY: return k_memory_allocation;
        case CUDA_ERROR_INVALID_VALUE: return k_invalid_value;
        default: return int(r);
    }
}
}  // namespace

#ifdef GPUMEM_EMU_CUDART_ID
RT_EXPORT unsigned long gpumem_emu_cudart_served;  // declared, then defined: no "initialized and extern" warning
unsigned long gpumem_emu_cudart_served = 0;
RT_EXPORT int gpumem_emu_cudart_id() { return GPUMEM_EMU_CUDART_ID; }
#define SERVED() __atomic_add_fetch(&gpumem_emu_cudart_served, 1, __ATOMIC_RELAXED)
#else
#define SERVED() ((void)0)
#endif

RT_EXPORT int cudaMalloc(void** p, size_t size) {
    SERVED();
    if (!ready()) return k_initialization;
    if (!p) return k_invalid_value;
    if (size == 0) {
        *p = nullptr;
        return k_success;
    }
    CUdeviceptr d = 0;
    CUresult r = g_drv.alloc(&d, size);
    *p = r == CUDA_SUCCESS ? reinterpret_cast<void*>(d) : nullptr;
    return to_rt(r);
}
RT_EXPORT int cudaFree(void* p) {
    SERVED();
    if (!ready()) return k_initialization;
    if (!p) return k_success;
    return to_rt(g_drv.free(CUdeviceptr(p)));
}
RT_EXPORT int cudaMallocPitch(void** p, size_t* pitch, size_t width, size_t height) {
    SERVED();
    if (!ready()) return k_initialization;
    CUdeviceptr d = 0;
    CUresult r = g_drv.alloc_pitch(&d, pitch, width, height, 4);
    *p = r == CUDA_SUCCESS ? reinterpret_cast<void*>(d) : nullptr;
    return to_rt(r);
}
RT_EXPORT int cudaMallocManaged(void** p, size_t size, unsigned flags) {
    SERVED();
    if (!ready()) return k_initialization;
    CUdeviceptr d = 0;
    CUresult r = g_drv.alloc_managed(&d, size, flags ? flags : 1);
    *p = r == CUDA_SUCCESS ? reinterpret_cast<void*>(d) : nullptr;
    return to_rt(r);
}
RT_EXPORT int cudaMallocAsync(void** p, size_t size, void* stream) {
    SERVED();
    if (!ready()) return k_initialization;
    CUdeviceptr d = 0;
    CUresult r = g_drv.alloc_async(&d, size, static_cast<CUstream>(stream));
    *p = r == CUDA_SUCCESS ? reinterpret_cast<void*>(d) : nullptr;
    return to_rt(r);
}
RT_EXPORT int cudaFreeAsync(void* p, void* stream) {
    SERVED();
    if (!ready()) return k_initialization;
    return to_rt(g_drv.free_async(CUdeviceptr(p), static_cast<CUstream>(stream)));
}
// The memory pool calls.  cudaMemPoolProps has CUmemPoolProps' layout; the driver's is taken here.
RT_EXPORT int cudaMemPoolCreate(void** pool, const CUmemPoolProps* props) {
    SERVED();
    if (!ready()) return k_initialization;
    if (!g_drv.pool_create) return k_initialization;
    return to_rt(g_drv.pool_create(reinterpret_cast<CUmemoryPool*>(pool), props));
}
RT_EXPORT int cudaMemPoolDestroy(void* pool) {
    SERVED();
    if (!ready()) return k_initialization;
    if (!g_drv.pool_destroy) return k_initialization;
    return to_rt(g_drv.pool_destroy(static_cast<CUmemoryPool>(pool)));
}
RT_EXPORT int cudaMallocFromPoolAsync(void** p, size_t size, void* pool, void* stream) {
    SERVED();
    if (!ready()) return k_initialization;
    if (!p || !g_drv.alloc_from_pool) return k_invalid_value;
    CUdeviceptr d = 0;
    CUresult r = g_drv.alloc_from_pool(&d, size, static_cast<CUmemoryPool>(pool), static_cast<CUstream>(stream));
    *p = r == CUDA_SUCCESS ? reinterpret_cast<void*>(d) : nullptr;
    return to_rt(r);
}
RT_EXPORT int cudaMallocHost(void** p, size_t size) {
    SERVED();
    if (!ready()) return k_initialization;
    return to_rt(g_drv.host_alloc(p, size, 0));
}
RT_EXPORT int cudaFreeHost(void* p) {
    SERVED();
    if (!ready()) return k_initialization;
    return to_rt(g_drv.free_host(p));
}
RT_EXPORT int cudaDeviceSynchronize() {
    SERVED();
    if (!ready()) return k_initialization;
    return to_rt(g_drv.sync());
}
RT_EXPORT int cudaMemGetInfo(size_t* f, size_t* t) {
    SERVED();
    if (!ready()) return k_initialization;
    return to_rt(g_drv.mem_get_info(f, t));
}
RT_EXPORT int cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned version, unsigned long long flags,
                                              int* status) {
    SERVED();
    if (!ready()) return k_initialization;
    CUdriverProcAddressQueryResult st;
    CUresult r = g_drv.gpa(symbol, fn, int(version), flags, &st);
    if (status) *status = int(st);
    return to_rt(r);
}
RT_EXPORT int cudaGetDriverEntryPoint(const char* symbol, void** fn, unsigned long long flags, int* status) {
    SERVED();
    return cudaGetDriverEntryPointByVersion(symbol, fn, 13000, flags, status);
}
