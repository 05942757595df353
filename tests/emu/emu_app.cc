// Workload programs for the emulated device: each way into libgpumem.so, the stress, crash and fork cases, and the benchmark.
//
// One source, three programs: EMU_APP_DRIVER links the driver (libcuda.so.1) directly; EMU_APP_RUNTIME
// links the emulated runtime, shared or static.  The first argument picks a scenario; each prints
// what it did as `key=value` lines that the integration tests compare with the log.
#include <cuda.h>
#undef cuGetProcAddress
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#ifdef EMU_APP_RUNTIME
extern "C" {
int cudaMalloc(void**, size_t);
int cudaFree(void*);
int cudaMallocPitch(void**, size_t*, size_t, size_t);
int cudaMallocManaged(void**, size_t, unsigned);
int cudaMallocAsync(void**, size_t, void*);
int cudaFreeAsync(void*, void*);
int cudaGetDriverEntryPointByVersion(const char*, void**, unsigned, unsigned long long, int*);
int cudaDeviceSynchronize();
}
#endif

namespace {

int fail(const char* what, int code) {
    fprintf(stderr, "emu_app: %s failed with %d\n", what, code);
    exit(3);
}
#define CHECK(call)                                   \
    do {                                              \
        int rc_ = int(call);                          \
        if (rc_ != 0) fail(#call, rc_);               \
    } while (0)

// Driver entry points, either bound directly (way a) or looked up with dlsym (way b).
struct driver_api {
    CUresult (*init)(unsigned);
    CUresult (*retain)(CUcontext*, CUdevice);
    CUresult (*set_current)(CUcontext);
    CUresult (*alloc)(CUdeviceptr*, size_t);
    CUresult (*free)(CUdeviceptr);
    CUresult (*alloc_pitch)(CUdeviceptr*, size_t*, size_t, size_t, unsigned);
    CUresult (*alloc_managed)(CUdeviceptr*, size_t, unsigned);
    CUresult (*alloc_async)(CUdeviceptr*, size_t, CUstream);
    CUresult (*free_async)(CUdeviceptr, CUstream);
    CUresult (*host_alloc)(void**, size_t, unsigned);
    CUresult (*alloc_host)(void**, size_t);
    CUresult (*free_host)(void*);
    CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*address_free)(CUdeviceptr, size_t);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*retain_handle)(CUmemGenericAllocationHandle*, void*);
    CUresult (*pool_create)(CUmemoryPool*, const CUmemPoolProps*);
    CUresult (*pool_destroy)(CUmemoryPool);
    CUresult (*alloc_from_pool)(CUdeviceptr*, size_t, CUmemoryPool, CUstream);
    CUresult (*default_pool)(CUmemoryPool*, CUdevice);
    CUresult (*location_default_pool)(CUmemoryPool*, CUmemLocation*, CUmemAllocationType);
    CUresult (*location_current_pool)(CUmemoryPool*, CUmemLocation*, CUmemAllocationType);
};

#ifdef EMU_APP_DRIVER
driver_api direct_api() {
    return driver_api{cuInit, cuDevicePrimaryCtxRetain, cuCtxSetCurrent, cuMemAlloc_v2, cuMemFree_v2, cuMemAllocPitch_v2,
                      cuMemAllocManaged, cuMemAllocAsync, cuMemFreeAsync, cuMemHostAlloc, cuMemAllocHost_v2, cuMemFreeHost,
                      cuMemCreate, cuMemRelease, cuMemAddressReserve, cuMemAddressFree, cuMemMap, cuMemUnmap,
                      cuMemRetainAllocationHandle, cuMemPoolCreate, cuMemPoolDestroy, cuMemAllocFromPoolAsync,
                      cuDeviceGetDefaultMemPool, cuMemGetDefaultMemPool, cuMemGetMemPool};
}
#endif

template <class F>
void sym(void* h, const char* name, F* out) {
    *out = reinterpret_cast<F>(dlsym(h, name));
    if (!*out) fail(name, -1);
}

// As JAX does: dlopen the driver and dlsym every function by name.
[[maybe_unused]] driver_api dlsym_api() {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) fail("dlopen libcuda.so.1", -1);
    driver_api a{};
    sym(h, "cuInit", &a.init);
    sym(h, "cuDevicePrimaryCtxRetain", &a.retain);
    sym(h, "cuCtxSetCurrent", &a.set_current);
    sym(h, "cuMemAlloc_v2", &a.alloc);
    sym(h, "cuMemFree_v2", &a.free);
    sym(h, "cuMemAllocPitch_v2", &a.alloc_pitch);
    sym(h, "cuMemAllocManaged", &a.alloc_managed);
    sym(h, "cuMemAllocAsync", &a.alloc_async);
    sym(h, "cuMemFreeAsync", &a.free_async);
    sym(h, "cuMemHostAlloc", &a.host_alloc);
    sym(h, "cuMemAllocHost_v2", &a.alloc_host);
    sym(h, "cuMemFreeHost", &a.free_host);
    sym(h, "cuMemCreate", &a.create);
    sym(h, "cuMemRelease", &a.release);
    sym(h, "cuMemAddressReserve", &a.reserve);
    sym(h, "cuMemAddressFree", &a.address_free);
    sym(h, "cuMemMap", &a.map);
    sym(h, "cuMemUnmap", &a.unmap);
    sym(h, "cuMemRetainAllocationHandle", &a.retain_handle);
    sym(h, "cuMemPoolCreate", &a.pool_create);
    sym(h, "cuMemPoolDestroy", &a.pool_destroy);
    sym(h, "cuMemAllocFromPoolAsync", &a.alloc_from_pool);
    sym(h, "cuDeviceGetDefaultMemPool", &a.default_pool);
    sym(h, "cuMemGetDefaultMemPool", &a.location_default_pool);
    sym(h, "cuMemGetMemPool", &a.location_current_pool);
    return a;
}

void setup(const driver_api& a) {
    CHECK(a.init(0));
    CUcontext ctx;
    CHECK(a.retain(&ctx, 0));
    CHECK(a.set_current(ctx));
}

// The basic scenario: every kind of allocation once, all freed, and one OOM.  Totals printed.
[[maybe_unused]] void basic_driver(const driver_api& a) {
    setup(a);
    const size_t sizes[] = {1000, 1 << 20, (3 << 20) + 5, 64 << 20};
    std::vector<CUdeviceptr> ptrs;
    size_t total = 0;
    for (size_t s : sizes) {
        CUdeviceptr p;
        CHECK(a.alloc(&p, s));
        ptrs.push_back(p);
        total += s;
    }
    CUdeviceptr pitched;
    size_t pitch;
    CHECK(a.alloc_pitch(&pitched, &pitch, 1000, 10, 4));
    CUdeviceptr managed;
    CHECK(a.alloc_managed(&managed, 4096, CU_MEM_ATTACH_GLOBAL));
    CUdeviceptr async_p;
    CHECK(a.alloc_async(&async_p, 8192, reinterpret_cast<CUstream>(0x5000)));
    void* host1;
    void* host2;
    CHECK(a.host_alloc(&host1, 12345, 0));
    CHECK(a.alloc_host(&host2, 777));
    memset(host1, 1, 12345);  // pinned host memory is real memory
    CUdeviceptr too_big;
    CUresult oom = a.alloc(&too_big, size_t(1) << 50);
    for (CUdeviceptr p : ptrs) CHECK(a.free(p));
    CHECK(a.free(pitched));
    CHECK(a.free(managed));
    CHECK(a.free_async(async_p, reinterpret_cast<CUstream>(0x5000)));
    CHECK(a.free_host(host1));
    CHECK(a.free_host(host2));
    printf("device_allocs=%zu\ndevice_bytes=%zu\npitch=%zu\noom_result=%d\n", ptrs.size(), total, pitch, int(oom));
}

void vmm_driver(const driver_api& a) {
    setup(a);
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle h;
    CHECK(a.create(&h, 4 << 20, &prop, 0));
    CUdeviceptr va;
    CHECK(a.reserve(&va, 64 << 20, 0, 0, 0));
    CHECK(a.map(va, 4 << 20, 0, h, 0));
    CHECK(a.unmap(va, 4 << 20));
    CHECK(a.release(h));
    CHECK(a.address_free(va, 64 << 20));
    printf("handle=0x%llx\nva=0x%llx\n", (unsigned long long)h, (unsigned long long)va);
}

// NCCL's cuMem buffers (ncclCuMemAlloc / ncclCuMemFree): the handle is kept while the buffer
// lives, and the free finds it again from the address with cuMemRetainAllocationHandle, which
// takes a new reference: release that one, unmap, release the handle, free the range.  The memory
// goes at the second release.  Two buffers, so a wrong count in either shows.
[[maybe_unused]] void vmm_retain_driver(const driver_api& a) {
    setup(a);
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    const size_t sizes[] = {4 << 20, 8 << 20};
    CUmemGenericAllocationHandle hs[2];
    CUdeviceptr vas[2];
    for (int i = 0; i < 2; ++i) {
        CHECK(a.create(&hs[i], sizes[i], &prop, 0));
        CHECK(a.reserve(&vas[i], sizes[i], 0, 0, 0));
        CHECK(a.map(vas[i], sizes[i], 0, hs[i], 0));
    }
    for (int i = 0; i < 2; ++i) {
        CUmemGenericAllocationHandle h = 0;
        CHECK(a.retain_handle(&h, reinterpret_cast<void*>(uintptr_t(vas[i]))));
        if (h != hs[i]) fail("cuMemRetainAllocationHandle gave another handle", 1);
        CHECK(a.release(h));
        CHECK(a.unmap(vas[i], sizes[i]));
        CHECK(a.release(h));
        CHECK(a.address_free(vas[i], sizes[i]));
    }
    // A third release of a handle gone is the driver's error, and the log's free_fail.
    const CUresult again = a.release(hs[0]);
    printf("handle0=0x%llx\nhandle1=0x%llx\nrelease_again=%d\n", (unsigned long long)hs[0], (unsigned long long)hs[1],
           int(again));
}

// Memory pools of each kind the driver makes, one allocation from each (its size says which pool),
// then one from the device's default pool.  The host pool is destroyed and its handle comes back
// (the emulated driver gives it to the next pool made) for a device pool.  A pool the driver refuses
// to make, and a destroy it refuses (the default pool), pass through.  Last, CUDA 13's location
// pools: the host's default pool, the managed default pool of no location, and device 0's current
// pool (its default) as cuMemGetMemPool names it.  Pool handles printed.
[[maybe_unused]] void mempools_driver(const driver_api& a) {
    setup(a);
    const auto s = reinterpret_cast<CUstream>(0x5000);
    auto props = [](CUmemAllocationType type, CUmemLocationType loc, int id) {
        CUmemPoolProps p{};
        p.allocType = type;
        p.location.type = loc;
        p.location.id = id;
        return p;
    };
    const CUmemPoolProps host = props(CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_HOST, 0);
    const CUmemPoolProps numa = props(CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_HOST_NUMA, 0);
    const CUmemPoolProps device = props(CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_DEVICE, 0);
    const CUmemPoolProps managed = props(CU_MEM_ALLOCATION_TYPE_MANAGED, CU_MEM_LOCATION_TYPE_NONE, 0);
    const CUmemPoolProps current = props(CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, 0);
    CUmemoryPool ph, pn, pd, pm, pdef, bad = nullptr;
    CHECK(a.pool_create(&ph, &host));
    CHECK(a.pool_create(&pn, &numa));
    CHECK(a.pool_create(&pd, &device));
    CHECK(a.pool_create(&pm, &managed));
    CHECK(a.default_pool(&pdef, 0));
    const CUresult bad_rc = a.pool_create(&bad, &current);
    CUdeviceptr h, n, d, m, def;
    CHECK(a.alloc_from_pool(&h, 1000, ph, s));
    CHECK(a.alloc_from_pool(&n, 2000, pn, s));
    CHECK(a.alloc_from_pool(&d, 3000, pd, s));
    CHECK(a.alloc_from_pool(&m, 4000, pm, s));
    CHECK(a.alloc_from_pool(&def, 5000, pdef, s));
    memset(reinterpret_cast<void*>(uintptr_t(h)), 1, 1000);  // host memory: the program writes it
    memset(reinterpret_cast<void*>(uintptr_t(n)), 1, 2000);
    for (CUdeviceptr p : {h, n, d, m, def}) CHECK(a.free_async(p, s));
    CHECK(a.pool_destroy(ph));
    CUmemoryPool again;
    CHECK(a.pool_create(&again, &device));
    CUdeviceptr r;
    CHECK(a.alloc_from_pool(&r, 6000, again, s));
    CHECK(a.free_async(r, s));
    const CUresult default_destroy_rc = a.pool_destroy(pdef);
    for (CUmemoryPool p : {pn, pd, pm, again}) CHECK(a.pool_destroy(p));
    CUmemLocation at_host{CU_MEM_LOCATION_TYPE_HOST, 0}, nowhere{CU_MEM_LOCATION_TYPE_NONE, 0},
        at_device{CU_MEM_LOCATION_TYPE_DEVICE, 0};
    CUmemoryPool lh, lm, ld;
    CHECK(a.location_default_pool(&lh, &at_host, CU_MEM_ALLOCATION_TYPE_PINNED));
    CHECK(a.location_default_pool(&lm, &nowhere, CU_MEM_ALLOCATION_TYPE_MANAGED));
    CHECK(a.location_current_pool(&ld, &at_device, CU_MEM_ALLOCATION_TYPE_PINNED));
    CUdeviceptr l1, l2, l3;
    CHECK(a.alloc_from_pool(&l1, 700, lh, s));
    CHECK(a.alloc_from_pool(&l2, 800, lm, s));
    CHECK(a.alloc_from_pool(&l3, 900, ld, s));
    memset(reinterpret_cast<void*>(uintptr_t(l1)), 1, 700);
    for (CUdeviceptr p : {l1, l2, l3}) CHECK(a.free_async(p, s));
    printf("host_default_pool=%p\nmanaged_default_pool=%p\ndevice_current_pool=%p\n", static_cast<void*>(lh),
           static_cast<void*>(lm), static_cast<void*>(ld));
    printf("host_pool=%p\nnuma_pool=%p\ndevice_pool=%p\nmanaged_pool=%p\ndefault_pool=%p\nagain_pool=%p\n",
           static_cast<void*>(ph), static_cast<void*>(pn), static_cast<void*>(pd), static_cast<void*>(pm),
           static_cast<void*>(pdef), static_cast<void*>(again));
    printf("bad_pool_rc=%d\ndefault_destroy_rc=%d\n", int(bad_rc), int(default_destroy_rc));
}

#ifdef EMU_APP_RUNTIME
extern "C" {
int cudaMemPoolCreate(void**, const CUmemPoolProps*);
int cudaMemPoolDestroy(void*);
int cudaMallocFromPoolAsync(void**, size_t, void*, void*);
}

// cudaMallocFromPoolAsync from a pool of host memory, and from a device pool, through the runtime.
void mempools_runtime() {
    CUmemPoolProps host{};
    host.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    host.location.type = CU_MEM_LOCATION_TYPE_HOST;
    CUmemPoolProps device = host;
    device.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    void* ph;
    void* pd;
    CHECK(cudaMemPoolCreate(&ph, &host));
    CHECK(cudaMemPoolCreate(&pd, &device));
    void* h;
    void* d;
    CHECK(cudaMallocFromPoolAsync(&h, 1000, ph, reinterpret_cast<void*>(0x5000)));
    CHECK(cudaMallocFromPoolAsync(&d, 3000, pd, reinterpret_cast<void*>(0x5000)));
    memset(h, 1, 1000);
    CHECK(cudaFreeAsync(h, reinterpret_cast<void*>(0x5000)));
    CHECK(cudaFreeAsync(d, reinterpret_cast<void*>(0x5000)));
    CHECK(cudaMemPoolDestroy(ph));
    CHECK(cudaMemPoolDestroy(pd));
    printf("host_pool=%p\ndevice_pool=%p\n", ph, pd);
}
#endif

#ifdef EMU_APP_RUNTIME
void basic_runtime() {
    void* a;
    void* b;
    void* c;
    CHECK(cudaMalloc(&a, 1 << 20));
    CHECK(cudaMalloc(&b, 5000));
    size_t pitch;
    CHECK(cudaMallocPitch(&c, &pitch, 1000, 10));
    void* m;
    CHECK(cudaMallocManaged(&m, 4096, 1));
    void* s;
    CHECK(cudaMallocAsync(&s, 8192, reinterpret_cast<void*>(0x5000)));
    void* oom_p;
    int oom = cudaMalloc(&oom_p, size_t(1) << 50);
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFree(c));
    CHECK(cudaFree(m));
    CHECK(cudaFreeAsync(s, reinterpret_cast<void*>(0x5000)));
    CHECK(cudaFree(nullptr));
    printf("pitch=%zu\noom_result=%d\n", pitch, oom);
}

// The demo workload: a toy training loop through the runtime.  Weights stay, activations of a
// batch-dependent size come and go, and every tenth step keeps a checkpoint: enough churn for the
// report to show segments, fragmentation and a leak.
// exit-in-handler through the runtime: a timer's handler calls exit() inside cudaMalloc/cudaFree;
// the runtime's exit handler then releases the primary context, which reached the pool's lock
// that this thread held.
void exit_in_handler_runtime() {
    static std::atomic<int> ticks{0};
    signal(SIGALRM, [](int) {
        if (++ticks == 50) exit(0);
    });
    void* warm = nullptr;
    CHECK(cudaMalloc(&warm, 4096));  // the runtime starts (and registers its exit handler)
    itimerval it{{0, 200}, {0, 200}};
    setitimer(ITIMER_REAL, &it, nullptr);
    for (long i = 0;; ++i) {
        void* p = nullptr;
        if (cudaMalloc(&p, 512 + size_t(i * 4099) % (8 << 20)) == 0) cudaFree(p);
    }
}

void train_runtime(int steps) {
    std::vector<void*> weights;
    for (int i = 0; i < 8; ++i) {
        void* w;
        CHECK(cudaMalloc(&w, size_t(4 + i) << 20));
        weights.push_back(w);
    }
    std::vector<void*> checkpoints;
    for (int step = 0; step < steps; ++step) {
        size_t batch = 16 + size_t((step * 37) % 48);
        std::vector<void*> acts;
        for (int layer = 0; layer < 8; ++layer) {
            void* a;
            CHECK(cudaMalloc(&a, batch * (size_t(layer % 3) + 1) * 24576));
            acts.push_back(a);
            void* tmp;
            CHECK(cudaMalloc(&tmp, 4096 + size_t(layer) * 512));
            CHECK(cudaFree(tmp));
        }
        for (auto it = acts.rbegin(); it != acts.rend(); ++it) CHECK(cudaFree(*it));
        if (step % 10 == 9) {
            void* c;
            CHECK(cudaMalloc(&c, 3 << 20));
            checkpoints.push_back(c);  // never freed: the leak the report should point at
        }
    }
    for (void* w : weights) CHECK(cudaFree(w));
    printf("steps=%d\ncheckpoints_leaked=%zu\n", steps, checkpoints.size());
}

// As PyTorch's expandable segments do: VMM functions from cudaGetDriverEntryPointByVersion.
void vmm_runtime() {
    void* dummy;
    CHECK(cudaMalloc(&dummy, 512));  // initialises the runtime
    CHECK(cudaFree(dummy));
    driver_api a{};
    int st;
    CHECK(cudaGetDriverEntryPointByVersion("cuInit", reinterpret_cast<void**>(&a.init), 12000, 0, &st));
    CHECK(cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxRetain", reinterpret_cast<void**>(&a.retain), 12000, 0, &st));
    CHECK(cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", reinterpret_cast<void**>(&a.set_current), 12000, 0, &st));
    CHECK(cudaGetDriverEntryPointByVersion("cuMemCreate", reinterpret_cast<void**>(&a.create), 12000, 0, &st));
    CHECK(cudaGetDriverEntryPointByVersion("cuMemRelease", reinterpret_cast<void**>(&a.release), 12000, 0, &st));
    CHECK(cudaGetDriverEntryPointByVersion("cuMemAddressReserve", reinterpret_cast<void**>(&a.reserve), 12000, 0, &st));
    CHECK(cudaGetDriverEntryPointByVersion("cuMemAddressFree", reinterpret_cast<void**>(&a.address_free), 12000, 0, &st));
    CHECK(cudaGetDriverEntryPointByVersion("cuMemMap", reinterpret_cast<void**>(&a.map), 12000, 0, &st));
    CHECK(cudaGetDriverEntryPointByVersion("cuMemUnmap", reinterpret_cast<void**>(&a.unmap), 12000, 0, &st));
    vmm_driver(a);
}

// cudaFreeAsync of a cudaMalloc block on a stream being captured: the driver refuses it (a free
// node needs a graph allocation).  The stream and capture functions come from
// cudaGetDriverEntryPointByVersion (the emulated runtime has no capture API).
void free_async_capture_runtime() {
    void* a;
    void* b;
    CHECK(cudaMalloc(&a, 5000));  // initialises the runtime
    CUresult (*create)(CUstream*, unsigned);
    CUresult (*begin)(CUstream, CUstreamCaptureMode);
    CUresult (*end)(CUstream, CUgraph*);
    int st;
    CHECK(cudaGetDriverEntryPointByVersion("cuStreamCreate", reinterpret_cast<void**>(&create), 12000, 0, &st));
    CHECK(cudaGetDriverEntryPointByVersion("cuStreamBeginCapture", reinterpret_cast<void**>(&begin), 12000, 0, &st));
    CHECK(cudaGetDriverEntryPointByVersion("cuStreamEndCapture", reinterpret_cast<void**>(&end), 12000, 0, &st));
    CUstream s;
    CHECK(create(&s, CU_STREAM_DEFAULT));  // one blocking stream: auto reuse stays immediate
    CHECK(begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    printf("free_async_capture_result=%d\n", cudaFreeAsync(a, s));
    CUgraph g = nullptr;
    printf("end_capture_result=%d\n", int(end(s, &g)));
    CHECK(cudaMalloc(&b, 5000));
    printf("realloc_same=%d\na=0x%llx\n", a == b, (unsigned long long)uintptr_t(a));
}
#endif

#ifdef EMU_APP_DRIVER
// Threads x pairs alloc/free pairs, each thread with its own sizes, exact totals printed.
void stress(int threads, long pairs) {
    driver_api a = direct_api();
    setup(a);
    CUcontext ctx;
    a.retain(&ctx, 0);
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
        ts.emplace_back([&, t] {
            a.set_current(ctx);
            for (long i = 0; i < pairs; ++i) {
                CUdeviceptr p;
                size_t size = 512 + size_t((t * 131 + i * 7) % 4096);
                CHECK(a.alloc(&p, size));
                CHECK(a.free(p));
            }
        });
    }
    for (auto& t : ts) t.join();
    printf("threads=%d\npairs=%ld\nallocs=%ld\n", threads, pairs, threads * pairs);
}

// exit-in-handler: a timer's handler calls exit() (as many C programs' SIGINT handlers do), so it
// lands inside cuMemAlloc/cuMemFree, often with gpumem's pool lock held by this very thread.
void exit_in_handler(driver_api a) {
    static std::atomic<int> ticks{0};  // lock-free: safe in a handler
    signal(SIGALRM, [](int) {
        if (++ticks == 50) exit(0);
    });
    itimerval it{{0, 200}, {0, 200}};
    setitimer(ITIMER_REAL, &it, nullptr);
    for (long i = 0;; ++i) {
        CUdeviceptr p;
        if (a.alloc(&p, 512 + size_t(i * 4099) % (8 << 20)) == CUDA_SUCCESS) {
            // A pointer query takes the pool's lock too, outside any allocation (a hang's other way).
            CUdeviceptr base = 0;
            size_t size = 0;
            cuMemGetAddressRange_v2(&base, &size, p + 1);
            a.free(p);
        }
    }
}

// Allocates n blocks and keeps them, then dies the requested way.
void crash(const char* how, int n) {
    driver_api a = direct_api();
    setup(a);
    for (int i = 0; i < n; ++i) {
        CUdeviceptr p;
        CHECK(a.alloc(&p, 4096 + size_t(i)));
    }
    fflush(stdout);
    if (!strcmp(how, "abort")) abort();
    if (!strcmp(how, "segv")) {
        volatile int* bad = reinterpret_cast<volatile int*>(uintptr_t(getenv("GPUMEM_NEVER_SET_THIS") ? 1 : 16));
        *bad = 1;
    }
    if (!strcmp(how, "term")) {
        kill(getpid(), SIGTERM);
        pause();
    }
    if (!strcmp(how, "kill")) {
        // Give the writer many flush intervals for the first n, then n more that may be lost.  One
        // second, not 300 ms: on a dev machine running a CI and a ctest at once (load 5 on 2
        // cores) the writer thread once went 300 ms without a turn.
        usleep(1000000);
        for (int i = 0; i < n; ++i) {
            CUdeviceptr p;
            CHECK(a.alloc(&p, 8192 + size_t(i)));
        }
        kill(getpid(), SIGKILL);
        pause();
    }
    if (!strcmp(how, "exit")) exit(0);
    if (!strcmp(how, "exit-in-handler")) exit_in_handler(a);
    if (!strcmp(how, "_exit")) _exit(0);
    if (!strcmp(how, "quick_exit")) {
        // The program's own at_quick_exit handler frees one more block on the way out.
        static driver_api api = a;
        static CUdeviceptr last = 0;
        CHECK(a.alloc(&last, 1 << 20));
        at_quick_exit([] { api.free(last); });
        quick_exit(0);
    }
    fail("unknown crash mode", -1);
}

// The parent allocates; a forked child allocates n and frees them, and ends with _exit as a
// multiprocessing worker would.
// The child allocates and frees n times, then ends with _exit, or with raise(SIGTERM) when
// `signal`: a recording child must die of it, with its own log's end line (gpumem's handler,
// inherited from the parent, was once saved as the "program's" handler and called itself until
// the stack overflowed).
void fork_case(int n, bool signal) {
    driver_api a = direct_api();
    setup(a);
    CUdeviceptr p;
    CHECK(a.alloc(&p, 1 << 20));
    pid_t child = fork();
    if (child == 0) {
        for (int i = 0; i < n; ++i) {
            CUdeviceptr q;
            CHECK(a.alloc(&q, 2048));
            CHECK(a.free(q));
        }
        if (signal) raise(SIGTERM);
        _exit(signal ? 7 : 0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    CHECK(a.free(p));
    printf("child=%d\nchild_status=%d\nchild_signaled=%d\nchild_termsig=%d\n", int(child), status,
           int(WIFSIGNALED(status)), WIFSIGNALED(status) ? WTERMSIG(status) : -1);
}

// A signal the program handles and goes on after (Python's SIGINT handler sets a flag): the
// allocation before it and its free after it stay one live block, freed.
void handled_signal_case() {
    signal(SIGINT, [](int) {});
    driver_api a = direct_api();
    setup(a);
    CUdeviceptr p;
    CHECK(a.alloc(&p, 1 << 20));
    raise(SIGINT);
    CHECK(a.free(p));
    printf("done=1\n");
}

// A signal the program ignores, as Go's signal.Ignore sets it: SIG_IGN with SA_SIGINFO in the
// flags (the handler and sa_sigaction share storage, so sa_sigaction reads as 1).  It must stay
// ignored under gpumem; a handler installed over it called address 1.
void set_action(int sig, void (*handler)(int), int flags) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
}

void ignored_signal_case() {
    set_action(SIGHUP, SIG_IGN, SA_SIGINFO);
    driver_api a = direct_api();
    setup(a);
    CUdeviceptr p;
    CHECK(a.alloc(&p, 4096));
    raise(SIGHUP);
    CHECK(a.free(p));
    printf("done=1\n");
}

// The program's SIGINT handler as Python installs it: without SA_RESTART, so that a blocking read
// returns EINTR and the interpreter gets to run its handler; with `resethand` also SA_RESETHAND, so
// that the second SIGINT ends the program.  A write to the pipe after 3 s ends a read that was
// restarted instead.  The signal goes to the main thread once it is blocked in that read (its
// /proc syscall entry says so): a fixed delay lost the race on a starved machine, where the
// handler then ran before the read and the read waited out the 3 s.
void handler_flags_case(bool resethand) {
    set_action(SIGINT, [](int) {}, resethand ? SA_RESETHAND : 0);
    driver_api a = direct_api();
    setup(a);
    CUdeviceptr p;
    CHECK(a.alloc(&p, 4096));
    static int fds[2];
    if (pipe(fds) != 0) fail("pipe", errno);
    static pid_t main_tid;
    main_tid = pid_t(syscall(SYS_gettid));
    std::thread([] {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/task/%d/syscall", int(main_tid));
        for (int i = 0; i < 10000; ++i) {  // 10 s at most; no /proc: 100 ms, as before
            usleep(1000);
            FILE* f = fopen(path, "r");
            long nr = -1;
            if (f) {
                if (fscanf(f, "%ld", &nr) != 1) nr = -1;
                fclose(f);
            }
            if (nr == SYS_read || (!f && i >= 100)) break;
        }
        syscall(SYS_tgkill, getpid(), main_tid, SIGINT);
        usleep(3000000);
        (void)!write(fds[1], "x", 1);
    }).detach();
    char b;
    ssize_t r = read(fds[0], &b, 1);
    printf("read=%zd\nread_eintr=%d\n", r, int(r < 0 && errno == EINTR));
    fflush(stdout);
    CHECK(a.free(p));
    if (resethand) raise(SIGINT);  // the handler is gone: the default action ends the program
}

// A program with a small alternate signal stack (for its stack-overflow handler, say) and a SIGTERM
// handler installed without SA_ONSTACK, which needs 256 KiB of stack: it runs on the thread's own
// stack, as the program asked.  Below the 16 KiB alternate stack lies 1 MiB of PROT_NONE, so a
// handler run there faults.
void handler_stack_case() {
    const size_t guard = 1u << 20, alt = 16u << 10;
    char* region = static_cast<char*>(mmap(nullptr, guard + alt, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (region == MAP_FAILED || mprotect(region + guard, alt, PROT_READ | PROT_WRITE) != 0) fail("mmap", errno);
    stack_t ss{};
    ss.ss_sp = region + guard;
    ss.ss_size = alt;
    if (sigaltstack(&ss, nullptr) != 0) fail("sigaltstack", errno);
    static volatile int handled = 0;
    set_action(SIGTERM, [](int) {
        volatile char big[256 << 10];
        big[0] = 1;
        big[sizeof big - 1] = 1;
        handled = big[0] + big[sizeof big - 1];
    }, 0);
    driver_api a = direct_api();
    setup(a);
    CUdeviceptr p;
    CHECK(a.alloc(&p, 4096));  // the log starts: gpumem's handlers go in front of the program's
    raise(SIGTERM);
    printf("handled=%d\n", int(handled));
    CHECK(a.free(p));
}

// A thread retains and releases the primary context in a loop (gpumem's hook holds its primary-
// context lock across the driver's release, slowed by GPUMEM_EMU_LATENCY_NS) while the main thread
// forks; each child releases once too and must not wait for a lock its parent's thread held at the
// fork.  A child still blocked after 3 s dies of SIGALRM; "hung" counts those.
void fork_primary_case(int forks) {
    driver_api a = direct_api();
    setup(a);
    CUdeviceptr p;
    CHECK(a.alloc(&p, 4096));
    static std::atomic<bool> stop{false};
    std::thread t([] {
        while (!stop.load()) {
            CUcontext c;
            if (cuDevicePrimaryCtxRetain(&c, 0) == CUDA_SUCCESS) cuDevicePrimaryCtxRelease(0);
        }
    });
    int hung = 0;
    for (int i = 0; i < forks; ++i) {
        usleep(1000);
        pid_t child = fork();
        if (child == 0) {
            alarm(3);
            CUcontext c;
            if (cuDevicePrimaryCtxRetain(&c, 0) == CUDA_SUCCESS) cuDevicePrimaryCtxRelease(0);
            _exit(0);
        }
        int status = 0;
        waitpid(child, &status, 0);
        hung += WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM;
    }
    stop.store(true);
    t.join();
    CHECK(a.free(p));
    printf("hung=%d\n", hung);
}

// A thread loads a library (argv: its path) whose constructor allocates 300 ms in, holding the
// loader's lock all along; meanwhile this thread allocates from a call site not seen before.  With
// native stacks both captures describe new frames (dladdr1, which takes the loader's lock): the
// program must finish, and a hang ends by SIGALRM after 5 s.
// 8 KiB allocated and freed while another thread is inside dlopen(lib), its constructor running.
void alloc_during_dlopen(driver_api& a, const char* lib) {
    std::thread t([lib] {
        if (!dlopen(lib, RTLD_NOW)) fail(dlerror(), -1);
    });
    usleep(100000);  // the loader is in the constructor now
    CUdeviceptr q;
    CHECK(a.alloc(&q, 8192));
    t.join();
    CHECK(a.free(q));
}

void stacks_in_dlopen_case(const char* lib) {
    alarm(5);
    driver_api a = direct_api();
    setup(a);
    CUdeviceptr p;
    CHECK(a.alloc(&p, 4096));
    alloc_during_dlopen(a, lib);
    CHECK(a.free(p));
    printf("done=1\n");
}

// The process's first recorded allocation while another thread is inside dlopen, whose library's
// constructor allocates meanwhile (tests/emu/alloc_in_ctor.cc: it sleeps 300 ms, then allocates).
// The driver's functions are resolved first, as a runtime's initialisation does (cudaFree(0)), so
// the first allocation goes straight to starting the log, which looks up libcuda functions of its
// own and so needs the loader's lock that the constructor's thread holds.  The program must
// finish; a hang ends by SIGALRM after 5 s.
void start_in_dlopen_case(const char* lib) {
    alarm(5);
    driver_api a = direct_api();
    setup(a);
    void* fn = nullptr;
    CUdriverProcAddressQueryResult q;
    CHECK(cuGetProcAddress_v2("cuMemAlloc", &fn, 12000, 0, &q));  // every hook's real function found
    alloc_during_dlopen(a, lib);
    printf("done=1\n");
}

// A parent that never touches CUDA forks workers that do (multiprocessing with fork): each child
// records its own log from its first allocation.
void fork_first_case(int n) {
    pid_t child = fork();
    if (child == 0) {
        driver_api a = direct_api();
        setup(a);
        for (int i = 0; i < n; ++i) {
            CUdeviceptr q;
            CHECK(a.alloc(&q, 2048));
            CHECK(a.free(q));
        }
        _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    printf("child=%d\nchild_status=%d\n", int(child), status);
}

// A program that scrubs its environment before its first allocation (a sandbox, a launcher):
// the settings it was started with still hold.
void clearenv_case() {
    clearenv();
    driver_api a = direct_api();
    setup(a);
    CUdeviceptr p;
    CHECK(a.alloc(&p, 1 << 20));
    CHECK(a.free(p));
    printf("done=1\n");
}

// A program that closes every descriptor past stderr after its first allocation (a daemon, a
// close_fds loop) and opens a file of its own, which may get the log's old number: its file must
// hold only what it wrote, and, with "fork", a forked child must still write to it.
// With "dup2", the program's file is dup2'ed onto the log's own number instead (found in
// /proc/self/fd), so the number stays open but holds another file.
void fd_reuse_case(const char* path, bool with_fork, bool onto_log) {
    driver_api a = direct_api();
    setup(a);
    CUdeviceptr p;
    CHECK(a.alloc(&p, 1 << 20));
    usleep(50000);  // the writer has flushed the header
    int fd = -1;
    if (onto_log) {
        int log_fd = -1;
        for (int i = 3; i < 4096 && log_fd < 0; ++i) {
            char link[64], target[4096];
            snprintf(link, sizeof link, "/proc/self/fd/%d", i);
            ssize_t n = readlink(link, target, sizeof target - 1);
            if (n > 6 && !memcmp(target + n - 6, ".jsonl", 6)) log_fd = i;
        }
        if (log_fd < 0) fail("no .jsonl descriptor", 0);
        int mine = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
        if (mine < 0 || dup2(mine, log_fd) != log_fd) fail("dup2", errno);
        close(mine);
        fd = log_fd;
        printf("log_fd=%d\n", log_fd);
    } else {
        for (int i = 3; i < 1024; ++i) close(i);
        fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    }
    if (fd < 0) fail("open", errno);
    if (write(fd, "A\n", 2) != 2) fail("write A", errno);
    for (int i = 0; i < 200; ++i) {
        CUdeviceptr q;
        CHECK(a.alloc(&q, 4096));
        CHECK(a.free(q));
    }
    usleep(100000);  // several flushes of the log
    if (with_fork) {
        pid_t child = fork();
        if (child == 0) _exit(write(fd, "C\n", 2) == 2 ? 0 : 1);
        int status = 0;
        waitpid(child, &status, 0);
        printf("child_status=%d\n", status);
    }
    if (write(fd, "B\n", 2) != 2) fail("write B", errno);
    CHECK(a.free(p));
    char got[4096] = {};
    ssize_t n = pread(fd, got, sizeof got - 1, 0);
    close(fd);
    const char* want = with_fork ? "A\nC\nB\n" : "A\nB\n";
    printf("file_ok=%d\nfile_bytes=%zd\n", n >= 0 && !strcmp(got, want), n);
}

// A vfork child shares the parent's memory and runs no fork handlers; Python's subprocess ends such
// a child with _exit when exec fails.  The parent's log must not be ended by it.
void vfork_case() {
    driver_api a = direct_api();
    setup(a);
    CUdeviceptr p;
    CHECK(a.alloc(&p, 4096));
    pid_t child = vfork();
    if (child == 0) _exit(7);
    int status = 0;
    waitpid(child, &status, 0);
    CUdeviceptr q;
    CHECK(a.alloc(&q, 8192));
    CHECK(a.free(q));
    CHECK(a.free(p));
    printf("child_status=%d\n", WEXITSTATUS(status));
}

// Allocates n blocks (kept), then replaces itself with `emu_driver_app basic` through the exec
// function named by `how`; "fail" first tries a program that does not exist and goes on allocating.
void exec_case(const char* self, const char* how, int n) {
    driver_api a = direct_api();
    setup(a);
    for (int i = 0; i < n; ++i) {
        CUdeviceptr p;
        CHECK(a.alloc(&p, 4096 + size_t(i)));
    }
    printf("pid=%d\n", int(getpid()));
    fflush(stdout);
    char arg0[] = "emu_driver_app", arg1[] = "basic";
    char* argv[] = {arg0, arg1, nullptr};
    if (!strcmp(how, "execv")) execv(self, argv);
    else if (!strcmp(how, "execve")) execve(self, argv, environ);
    else if (!strcmp(how, "execl")) execl(self, "emu_driver_app", "basic", (char*)nullptr);
    else if (!strcmp(how, "execle")) execle(self, "emu_driver_app", "basic", (char*)nullptr, environ);
    else if (!strcmp(how, "execvp")) execvp(self, argv);
    else if (!strcmp(how, "fail")) {
        int rc = execv("/nonexistent/gpumem-no-such-program", argv);
        printf("exec_rc=%d\n", rc);
        for (int i = 0; i < n; ++i) {
            CUdeviceptr p;
            CHECK(a.alloc(&p, 8192));
            CHECK(a.free(p));
        }
        return;
    }
    fail("exec", errno);
}

// `threads` threads allocate and free without pause; after ms milliseconds the process SIGKILLs
// itself, with the writer still behind.
// `threads` threads allocate and free without pause; after `ms` the process is killed (SIGKILL)
// or, with `end_by_exit`, calls exit() while they still allocate (their last events come after
// the end line).
void sustain(int threads, int ms, bool end_by_exit = false) {
    driver_api a = direct_api();
    setup(a);
    CUcontext ctx;
    a.retain(&ctx, 0);
    for (int t = 0; t < threads; ++t) {
        std::thread([&a, ctx, t] {
            a.set_current(ctx);
            for (long i = 0;; ++i) {
                CUdeviceptr p;
                if (a.alloc(&p, 512 + size_t((t * 131 + i * 7) % 4096)) == CUDA_SUCCESS) a.free(p);
            }
        }).detach();
    }
    usleep(useconds_t(ms) * 1000);
    if (end_by_exit) exit(0);
    kill(getpid(), SIGKILL);
    pause();
}

// The process exits while another thread is starting the log: a worker makes the process's first
// allocation, and main exits once gpumem's start is under way on it (it asks the device's name for
// the header; GPUMEM_EMU_SLOW_NAME_MS holds it there), or execs /bin/true then (`exec`).
// Without gpumem nothing asks: main exits after 5 s, the worker's pair long done.
void exit_in_start(bool by_exec) {
    driver_api a = direct_api();
    setup(a);
    CUcontext ctx;
    a.retain(&ctx, 0);
    std::thread([&a, ctx] {
        a.set_current(ctx);
        CUdeviceptr p;
        if (a.alloc(&p, 4096) == CUDA_SUCCESS) a.free(p);
    }).detach();
    auto asked = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "gpumem_emu_names_asked"));
    for (int i = 0; i < 5000 && asked && asked() == 0; ++i) usleep(1000);
    printf("names_asked=%d\n", asked ? asked() : -1);
    fflush(stdout);
    if (by_exec) execl("/bin/true", "true", static_cast<char*>(nullptr));  // a program without CUDA
    exit(0);
}

// Median cost of one alloc+free pair, in ns, over `rounds` rounds of `batch` pairs.  Between rounds
// the program pauses `pause_ms`, as real programs do between allocation bursts: that measures the
// recording cost on the caller's thread rather than the writer thread's sustained throughput.
void bench(long rounds, long batch, size_t size, long pause_ms) {
    driver_api a = direct_api();
    setup(a);
    std::vector<double> per_pair;
    for (long r = 0; r < rounds; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        for (long i = 0; i < batch; ++i) {
            CUdeviceptr p;
            a.alloc(&p, size);
            a.free(p);
        }
        auto t1 = std::chrono::steady_clock::now();
        per_pair.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / double(batch));
        if (pause_ms) usleep(useconds_t(pause_ms * 1000));
    }
    std::sort(per_pair.begin(), per_pair.end());
    printf("size=%zu\nmedian_pair_ns=%.1f\nmin_pair_ns=%.1f\n", size, per_pair[per_pair.size() / 2], per_pair.front());
}
#endif

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s SCENARIO [ARGS]\n", argv[0]);
        return 2;
    }
    std::string s = argv[1];
#ifdef EMU_APP_DRIVER
    if (s == "basic") basic_driver(direct_api());
    else if (s == "basic-dlsym") basic_driver(dlsym_api());
    else if (s == "vmm") vmm_driver(direct_api());
    else if (s == "vmm-dlsym") vmm_driver(dlsym_api());
    else if (s == "vmm-retain") vmm_retain_driver(direct_api());
    else if (s == "vmm-retain-dlsym") vmm_retain_driver(dlsym_api());
    else if (s == "mempools") mempools_driver(direct_api());
    else if (s == "mempools-dlsym") mempools_driver(dlsym_api());
    else if (s == "stress") stress(argc > 2 ? atoi(argv[2]) : 8, argc > 3 ? atol(argv[3]) : 100000);
    else if (s == "crash") crash(argc > 2 ? argv[2] : "abort", argc > 3 ? atoi(argv[3]) : 100);
    else if (s == "fork") fork_case(argc > 2 ? atoi(argv[2]) : 100, false);
    else if (s == "vfork") vfork_case();
    else if (s == "fork-first") fork_first_case(argc > 2 ? atoi(argv[2]) : 100);
    else if (s == "clearenv") clearenv_case();
    else if (s == "fd-reuse" && argc > 2)
        fd_reuse_case(argv[2], argc > 3 && strstr(argv[3], "fork"), argc > 3 && strstr(argv[3], "dup2"));
    else if (s == "stacks-in-dlopen" && argc > 2) stacks_in_dlopen_case(argv[2]);
    else if (s == "start-in-dlopen" && argc > 2) start_in_dlopen_case(argv[2]);
    else if (s == "fork-primary") fork_primary_case(argc > 2 ? atoi(argv[2]) : 10);
    else if (s == "fork-signal") fork_case(1, true);
    else if (s == "handled-signal") handled_signal_case();
    else if (s == "ignored-signal") ignored_signal_case();
    else if (s == "handler-flags") handler_flags_case(argc > 2 && !strcmp(argv[2], "resethand"));
    else if (s == "handler-stack") handler_stack_case();
    else if (s == "exec") exec_case(argv[0], argc > 2 ? argv[2] : "execv", argc > 3 ? atoi(argv[3]) : 100);
    else if (s == "sustain") sustain(argc > 2 ? atoi(argv[2]) : 4, argc > 3 ? atoi(argv[3]) : 1000);
    else if (s == "exit-in-start") exit_in_start(argc > 2 && !strcmp(argv[2], "exec"));
    else if (s == "sustain-exit") sustain(argc > 2 ? atoi(argv[2]) : 4, argc > 3 ? atoi(argv[3]) : 1000, true);
    else if (s == "bench")
        bench(argc > 2 ? atol(argv[2]) : 51, argc > 3 ? atol(argv[3]) : 20000, argc > 4 ? size_t(atol(argv[4])) : 4096,
              argc > 5 ? atol(argv[5]) : 0);
#else
    if (s == "basic") basic_runtime();
    else if (s == "vmm") vmm_runtime();
    else if (s == "train") train_runtime(argc > 2 ? atoi(argv[2]) : 200);
    else if (s == "exit-in-handler") exit_in_handler_runtime();
    else if (s == "free-async-capture") free_async_capture_runtime();
    else if (s == "mempools") mempools_runtime();
#endif
    else {
        fprintf(stderr, "unknown scenario %s\n", s.c_str());
        return 2;
    }
    return 0;
}
