// Workload program for the pool under LD_PRELOAD: alloc/free loops, OOM, capture, pointer queries, IPC and context resets on the emulated driver.
//
// Linked against the emulated libcuda.so.1 (way a).  Each scenario prints `key=value` lines,
// including the emulated driver's own call counters, which the integration tests compare with the
// log: the driver counts what really reached it, the log what the program saw.
#include <cuda.h>
#undef cuGetProcAddress
#include <dlfcn.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

namespace {

[[noreturn]] void fail(const char* what, int code) {
    fprintf(stderr, "pool_app: %s failed with %d\n", what, code);
    exit(3);
}
#define CHECK(call)                       \
    do {                                  \
        int rc_ = int(call);              \
        if (rc_ != 0) fail(#call, rc_);   \
    } while (0)

// The emulated driver's counter of `name` (calls that reached the driver itself).
unsigned long long driver_count(const char* name) {
    using fn = unsigned long long (*)(const char*);
    static fn f = reinterpret_cast<fn>(dlsym(RTLD_DEFAULT, "gpumem_emu_count"));
    if (!f) fail("dlsym gpumem_emu_count", -1);
    return f(name);
}

// Where the emulated driver says p lands: whose allocation (pid), which (origin: a cuMemAlloc base
// or a chunk's handle) and where in it.  Printed as `<prefix>pid=`, `<prefix>origin=` and
// `<prefix>offset=` (pid -1 when p is not mapped at all).
void print_backing(const char* prefix, CUdeviceptr p, bool with_pid = true) {
    using fn = int (*)(CUdeviceptr, int*, unsigned long long*, unsigned long long*);
    static fn f = reinterpret_cast<fn>(dlsym(RTLD_DEFAULT, "gpumem_emu_backing"));
    if (!f) fail("dlsym gpumem_emu_backing", -1);
    int pid = -1;
    unsigned long long origin = 0, offset = 0;
    if (f(p, &pid, &origin, &offset) != 0) pid = -1, origin = 0, offset = 0;
    if (with_pid) printf("%spid=%d\n", prefix, pid);
    printf("%sorigin=%llu\n%soffset=%llu\n", prefix, origin, prefix, offset);
}

// A pool segment is a cuMemAlloc allocation or (virtual memory) a cuMemAddressReserve range.
// driver_sync: every blocking sync (a context synchronize or a wait on an event); ctx_sync: the
// device-wide ones only; fence_record: events recorded (the pool's fences); stream_query: streams
// asked whether they are idle (an idle stream needs no event in a fence); driver_map: chunks mapped.
// Syncs, event records, queries and waits the emulated driver saw inside a capture (each a bug).
unsigned long long calls_in_capture() {
    return driver_count("cuCtxSynchronize_in_capture") + driver_count("cuEventRecord_in_capture") +
           driver_count("cuStreamQuery_in_capture") + driver_count("cuStreamWaitEvent_in_capture");
}

void print_counts(const char* prefix) {
    printf("%sdriver_alloc=%llu\n%sdriver_free=%llu\n%sdriver_sync=%llu\n%sdriver_sync_in_capture=%llu\n", prefix,
           driver_count("cuMemAlloc_v2") + driver_count("cuMemAddressReserve"), prefix,
           driver_count("cuMemFree_v2") + driver_count("cuMemAddressFree"), prefix,
           driver_count("cuCtxSynchronize") + driver_count("cuEventSynchronize"), prefix, calls_in_capture());
    printf("%sctx_sync=%llu\n%sfence_record=%llu\n%sstream_query=%llu\n", prefix, driver_count("cuCtxSynchronize"), prefix,
           driver_count("cuEventRecord"), prefix, driver_count("cuStreamQuery"));
    printf("%sdriver_map=%llu\n", prefix, driver_count("cuMemMap"));  // chunks mapped (an arena grows by these)
    printf("%sunknown_stream_create=%llu\n", prefix, driver_count("unknown_stream_create"));  // GPUMEM_EMU_UNKNOWN_STREAM_FN
}

CUcontext setup() {
    CHECK(cuInit(0));
    CUcontext ctx;
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));
    return ctx;
}

// n alloc/free pairs of `size` bytes, each freed at once.
void loop(long n, size_t size) {
    setup();
    for (long i = 0; i < n; ++i) {
        CUdeviceptr p;
        CHECK(cuMemAlloc(&p, size));
        CHECK(cuMemFree(p));
    }
    printf("pairs=%ld\n", n);
    print_counts("");
}

// One non-blocking stream, then n alloc/free pairs of `size` bytes (issue 12: 9,999 blocking syncs
// for 100k pairs when safe reuse synchronized the context).
void stream_loop(long n, size_t size) {
    setup();
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    for (long i = 0; i < n; ++i) {
        CUdeviceptr p;
        CHECK(cuMemAlloc(&p, size));
        CHECK(cuMemFree(p));
    }
    printf("pairs=%ld\n", n);
    print_counts("");
}

// What the launch hooks cost (docs/benchmarks.md, "Launch cost and the headroom"): n launches of one
// function, timed in 11 rounds, the median round's ns per launch printed.  `full`: the device is
// first filled with live 4 MiB blocks, so a pool is short of its headroom with nothing to give:
// every launch then asks the device and the table of handles seen (preload/hooks_driver.cc).
void launch_loop(long n, bool full) {
    setup();
    std::vector<CUdeviceptr> live;
    if (full)
        for (CUdeviceptr p; cuMemAlloc(&p, 4u << 20) == CUDA_SUCCESS;) live.push_back(p);
    auto params = reinterpret_cast<void**>(0x1234), extra = reinterpret_cast<void**>(0x5678);
    const auto f = reinterpret_cast<CUfunction>(0x300);
    std::vector<double> ns;
    for (int round = 0; round < 11; ++round) {
        const auto t0 = std::chrono::steady_clock::now();
        for (long i = 0; i < n; ++i) CHECK(cuLaunchKernel(f, 11, 12, 13, 14, 15, 16, 17, nullptr, params, extra));
        ns.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / double(n));
    }
    std::sort(ns.begin(), ns.end());
    printf("launches=%ld\nfull=%d\nlive_blocks=%zu\nns_per_launch=%.1f\n", n, int(full), live.size(), ns[ns.size() / 2]);
    for (auto p : live) CHECK(cuMemFree(p));
    print_counts("");
}

// A kernel fault after a block's free (the emulated driver's function 0xfa17 breaks the context):
// the same size asked again (a pool hit under gpumem), then 64 MiB (a miss), then a synchronize.
// Prints each answer: without gpumem every one is the fault's 700.
void kernel_fault() {
    setup();
    CUdeviceptr a;
    CHECK(cuMemAlloc(&a, 1u << 20));
    CHECK(cuMemFree(a));
    auto params = reinterpret_cast<void**>(0x1234), extra = reinterpret_cast<void**>(0x5678);
    CHECK(cuLaunchKernel(reinterpret_cast<CUfunction>(0xfa17), 11, 12, 13, 14, 15, 16, 17, nullptr, params, extra));
    CUdeviceptr again = 0, big = 0;
    printf("hit_result=%d\n", int(cuMemAlloc(&again, 1u << 20)));
    printf("miss_result=%d\n", int(cuMemAlloc(&big, 64u << 20)));
    printf("sync_result=%d\n", int(cuCtxSynchronize()));
}

// Ordered release through the preload (run with GPUMEM_REUSE=safe): n pairs on the legacy stream
// alone, then a non-blocking stream made, then n pairs more.  Prints the counts of each half
// ("alone_", "streams_") and the stream waits the creation hook made ("made_").
void order_loop(long n, size_t size) {
    setup();
    auto pairs = [&] {
        for (long i = 0; i < n; ++i) {
            CUdeviceptr p;
            CHECK(cuMemAlloc(&p, size));
            CHECK(cuMemFree(p));
        }
    };
    pairs();
    print_counts("alone_");
    printf("alone_event_query=%llu\nalone_stream_wait=%llu\n", driver_count("cuEventQuery"), driver_count("cuStreamWaitEvent"));
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    printf("made_stream_wait=%llu\n", driver_count("cuStreamWaitEvent"));
    pairs();
    print_counts("streams_");
    printf("streams_event_query=%llu\nstreams_stream_wait=%llu\n", driver_count("cuEventQuery"), driver_count("cuStreamWaitEvent"));
}

// Threads x pairs of alloc/free with sizes spread over both pools, some held across iterations.
// With `stream_at` >= 0, thread 0 creates a stream after that many pairs while the others allocate
// and free: the auto reuse switch happens under load.
void threads(int nthreads, long pairs, long stream_at) {
    CUcontext ctx = setup();
    std::vector<std::thread> ts;
    for (int t = 0; t < nthreads; ++t) {
        ts.emplace_back([=] {
            cuCtxSetCurrent(ctx);
            CUdeviceptr held[4] = {};
            for (long i = 0; i < pairs; ++i) {
                if (t == 0 && i == stream_at) {
                    CUstream s;
                    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
                }
                size_t size = 512 + size_t((t * 7919 + i * 104729) % (i % 16 == 0 ? (12 << 20) : 65536));
                CUdeviceptr p;
                CHECK(cuMemAlloc(&p, size));
                CUdeviceptr& slot = held[i % 4];
                if (slot) CHECK(cuMemFree(slot));
                slot = p;
            }
            for (CUdeviceptr p : held)
                if (p) CHECK(cuMemFree(p));
        });
    }
    for (auto& t : ts) t.join();
    printf("allocs=%ld\n", long(nthreads) * pairs);
    print_counts("");
}

// Run with GPUMEM_EMU_CAPACITY=64M: fill the device, fail, then succeed by reusing pending frees
// and by giving cached segments back.
void oom() {
    setup();
    const size_t mb30 = 30u << 20;
    CUdeviceptr a, b, c;
    CHECK(cuMemAlloc(&a, mb30));
    CHECK(cuMemAlloc(&b, mb30));
    int first = int(cuMemAlloc(&c, mb30));           // 60 of 64 MiB in use: out of memory
    CHECK(cuMemFree(a));
    int reuse = int(cuMemAlloc(&c, mb30));           // a's block, once a sync released it
    printf("reused_block=%d\n", c == a);
    CHECK(cuMemFree(b));
    CHECK(cuMemFree(c));
    CUdeviceptr big;
    int bigger = int(cuMemAlloc(&big, 50u << 20));   // only after both cached segments went back
    if (bigger == 0) CHECK(cuMemFree(big));
    printf("first_result=%d\nreuse_result=%d\nbigger_result=%d\n", first, reuse, bigger);
    print_counts("");
}

// Blocks of each size in turn, through cuMemAlloc (pooled), until the device refuses one, all freed
// again: a program that filled the device and gave it all back.  Fails the program when fewer than
// at_least were served (the device was not filled).
void fill_and_free(std::initializer_list<size_t> sizes = {4u << 20}, size_t at_least = 8) {
    std::vector<CUdeviceptr> ps;
    for (size_t size : sizes)
        for (CUdeviceptr p; cuMemAlloc(&p, size) == CUDA_SUCCESS;) ps.push_back(p);
    if (ps.size() < at_least) fail("filling the device", int(ps.size()));
    for (auto p : ps) CHECK(cuMemFree(p));
}

// Memory the program freed, then asked for again by an allocator the pool does not serve: blocks of
// 4 MiB through cuMemAlloc (pooled) fill the device and are freed before each of cuMemAllocAsync,
// cuMemCreate, cuMemAllocManaged and cuMemAllocPitch asks for 192 MiB, and each of cuLaunchKernel
// and cuLaunchKernelEx launches a function whose module needs GPUMEM_EMU_MODULE_BYTES, and
// cuModuleLoadData loads such a module
// (of a 256 MiB device).  Without gpumem each is served; the pool must give the freed memory back.
// cuMemGetInfo's free before and after the first 192 MiB are freed: the same without gpumem.
void other_allocators() {
    setup();
    const size_t big = 192u << 20;
    CUdeviceptr p = 0;
    size_t free0 = 0, free1 = 0, total = 0;
    CHECK(cuMemGetInfo(&free0, &total));
    fill_and_free();
    CHECK(cuMemGetInfo(&free1, &total));
    printf("free_drop_mib=%lld\n", (static_cast<long long>(free0) - static_cast<long long>(free1)) >> 20);
    int rc = int(cuMemAllocAsync(&p, big, nullptr));
    printf("async_rc=%d\n", rc);
    if (rc == 0) CHECK(cuMemFreeAsync(p, nullptr));
    fill_and_free();
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle h = 0;
    rc = int(cuMemCreate(&h, big, &prop, 0));
    printf("create_rc=%d\n", rc);
    if (rc == 0) CHECK(cuMemRelease(h));
    fill_and_free();
    rc = int(cuMemAllocManaged(&p, big, CU_MEM_ATTACH_GLOBAL));
    printf("managed_rc=%d\n", rc);
    if (rc == 0) CHECK(cuMemFree(p));
    fill_and_free();
    size_t pitch = 0;
    rc = int(cuMemAllocPitch(&p, &pitch, 1u << 20, 192, 4));
    printf("pitch_rc=%d\n", rc);
    if (rc == 0) CHECK(cuMemFree(p));
    // A first launch whose lazily loaded module needs memory (GPUMEM_EMU_MODULE_BYTES), by both
    // launch calls: two functions, two modules.
    auto params = reinterpret_cast<void**>(0x1234), extra = reinterpret_cast<void**>(0x5678);
    fill_and_free();
    rc = int(cuLaunchKernel(reinterpret_cast<CUfunction>(0x100), 11, 12, 13, 14, 15, 16, 17, nullptr, params, extra));
    printf("launch_rc=%d\n", rc);
    fill_and_free();
    CUlaunchConfig lc = {};
    lc.gridDimX = 11, lc.gridDimY = 12, lc.gridDimZ = 13, lc.blockDimX = 14, lc.blockDimY = 15, lc.blockDimZ = 16;
    lc.sharedMemBytes = 17;
    rc = int(cuLaunchKernelEx(&lc, reinterpret_cast<CUfunction>(0x200), params, extra));
    printf("launch_ex_rc=%d\n", rc);
    fill_and_free();
    static const char image[] = "an emulated module";
    CUmodule mod;
    rc = int(cuModuleLoadData(&mod, image));
    printf("module_load_rc=%d\n", rc);
    // Last (its null stream is the thread's own, which turns the pool safe): a first launch through
    // the per-thread variant, as a program built with --default-stream per-thread makes.  The three
    // modules loaded so far leave 2 MiB that 4 MiB blocks cannot fill: 2 MiB blocks too.
    fill_and_free({4u << 20, 2u << 20}, 0);
    void* ptsz = nullptr;
    CUdriverProcAddressQueryResult q;
    CHECK(cuGetProcAddress_v2("cuLaunchKernel", &ptsz, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &q));
    using launch_fn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   CUstream, void**, void**);
    rc = int(reinterpret_cast<launch_fn>(ptsz)(reinterpret_cast<CUfunction>(0x300), 11, 12, 13, 14, 15, 16, 17, nullptr,
                                               params, extra));
    printf("launch_ptsz_rc=%d\n", rc);
    print_counts("");
}

// The per-thread twins of the calls retried after a give-back that name a stream, as a program
// built with --default-stream per-thread reaches them (cuGetProcAddress with
// CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM): cuLaunchCooperativeKernel_ptsz,
// cuGraphInstantiateWithParams_ptsz, cuGraphUpload_ptsz and cuGraphLaunch_ptsz, each after the
// program filled the device with 4 MiB blocks and freed them, each needing GPUMEM_EMU_MODULE_BYTES
// of its own.  Without gpumem each is served.  Prints each call's answer and how many calls
// reached each _ptsz function (the resolver handed out the per-thread twin).
void retry_ptsz() {
    setup();
    CUdriverProcAddressQueryResult q;
    auto resolve = [&](const char* name) {
        void* fn = nullptr;
        CHECK(cuGetProcAddress_v2(name, &fn, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &q));
        return fn;
    };
    using coop_fn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void**);
    using inst_fn = CUresult (*)(CUgraphExec*, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS*);
    using run_fn = CUresult (*)(CUgraphExec, CUstream);
    auto coop = reinterpret_cast<coop_fn>(resolve("cuLaunchCooperativeKernel"));
    auto inst = reinterpret_cast<inst_fn>(resolve("cuGraphInstantiateWithParams"));
    auto upload = reinterpret_cast<run_fn>(resolve("cuGraphUpload"));
    auto launch = reinterpret_cast<run_fn>(resolve("cuGraphLaunch"));
    fill_and_free();
    int rc = int(coop(reinterpret_cast<CUfunction>(0x700), 11, 12, 13, 14, 15, 16, 17, nullptr, reinterpret_cast<void**>(0x1234)));
    printf("coop_ptsz_rc=%d\n", rc);
    fill_and_free();
    CUgraphExec exec = nullptr;
    CUDA_GRAPH_INSTANTIATE_PARAMS ip = {};
    rc = int(inst(&exec, reinterpret_cast<CUgraph>(0x710), &ip));
    printf("instantiate_ptsz_rc=%d\n", rc);
    fill_and_free();
    rc = int(upload(reinterpret_cast<CUgraphExec>(0x720), nullptr));
    printf("upload_ptsz_rc=%d\n", rc);
    fill_and_free();
    rc = int(launch(reinterpret_cast<CUgraphExec>(0x730), nullptr));
    printf("graph_launch_ptsz_rc=%d\n", rc);
    for (const char* n : {"cuLaunchCooperativeKernel_ptsz", "cuGraphInstantiateWithParams_ptsz", "cuGraphUpload_ptsz",
                          "cuGraphLaunch_ptsz"})
        printf("calls_%s=%llu\n", n, driver_count(n));
    print_counts("");
}

// Contexts made after the program freed the device's memory into the pool (run with
// GPUMEM_EMU_PRIMARY_REFS=0 and GPUMEM_EMU_CONTEXT_BYTES: each context's making takes memory).
// First a context of the program's own (cuCtxCreate, cuda.h's _v4) on the empty device, filled
// and freed; then the primary context's first retain.  Then, with the primary context current and
// the device filled and freed before each, cuCtxCreate by each ABI as a resolver hands it out
// (v1, v2, v3, v4: each popped and destroyed after), and a green context.  Without gpumem each is
// served.  Prints each call's answer.
void context_create() {
    CHECK(cuInit(0));
    CUcontext mine = nullptr;
    CHECK(cuCtxCreate(&mine, nullptr, 0, 0));  // current now
    fill_and_free();
    CUcontext primary = nullptr;
    int rc = int(cuDevicePrimaryCtxRetain(&primary, 0));
    printf("retain_rc=%d\n", rc);
    if (rc == 0) CHECK(cuCtxPushCurrent(primary));
    using create_fn = CUresult (*)(CUcontext*, unsigned, CUdevice);
    using create_v3_fn = CUresult (*)(CUcontext*, CUexecAffinityParam*, int, unsigned, CUdevice);
    using create_v4_fn = CUresult (*)(CUcontext*, CUctxCreateParams*, unsigned, CUdevice);
    const struct {
        const char* abi;
        int version;
    } abis[] = {{"v1", 3000}, {"v2", 4000}, {"v3", 11040}, {"v4", 12050}};
    for (const auto& a : abis) {
        void* fn = nullptr;
        CUdriverProcAddressQueryResult q;
        CHECK(cuGetProcAddress_v2("cuCtxCreate", &fn, a.version, 0, &q));
        fill_and_free();
        CUcontext c = nullptr;
        const std::string abi = a.abi;
        rc = abi == "v3"   ? int(reinterpret_cast<create_v3_fn>(fn)(&c, nullptr, 0, 0, 0))
             : abi == "v4" ? int(reinterpret_cast<create_v4_fn>(fn)(&c, nullptr, 0, 0))
                           : int(reinterpret_cast<create_fn>(fn)(&c, 0, 0));
        printf("create_%s_rc=%d\n", a.abi, rc);
        if (rc) continue;
        CUcontext popped = nullptr;
        CHECK(cuCtxPopCurrent(&popped));
        if (popped != c) fail("the made context was not current", -1);
        CHECK(cuCtxDestroy(c));
    }
    fill_and_free();
    CUgreenCtx g = nullptr;
    rc = int(cuGreenCtxCreate(&g, nullptr, 0, CU_GREEN_CTX_DEFAULT_STREAM));
    printf("green_rc=%d\n", rc);
    for (const char* n : {"cuCtxCreate", "cuCtxCreate_v2", "cuCtxCreate_v3", "cuCtxCreate_v4"})
        printf("calls_%s=%llu\n", n, driver_count(n));
    print_counts("");
}

// Two contexts on one device, each with its own pool: a context of the program's own
// (cuCtxCreate) fills the device and frees it, then the primary context asks for 192 MiB; then
// the primary context fills and frees, and the program's own context asks for 192 MiB.  Without
// gpumem both are served (the driver freed everything); prints each answer.  `huge`: first, in
// the program's own context, a request of 1 GiB, which no 256 MiB device holds (huge_rc).
void two_pools(bool huge) {
    CHECK(cuInit(0));
    CUcontext mine = nullptr;
    CHECK(cuCtxCreate(&mine, nullptr, 0, 0));  // current now
    fill_and_free();
    CUcontext primary = nullptr;
    CHECK(cuDevicePrimaryCtxRetain(&primary, 0));
    CHECK(cuCtxPushCurrent(primary));
    CUdeviceptr p = 0;
    int rc = int(cuMemAlloc(&p, 192u << 20));
    printf("primary_rc=%d\n", rc);
    if (rc == 0) CHECK(cuMemFree(p));
    fill_and_free();
    CUcontext popped = nullptr;
    CHECK(cuCtxPopCurrent(&popped));  // the program's own again
    if (huge) {
        rc = int(cuMemAlloc(&p, size_t(1) << 30));
        printf("huge_rc=%d\n", rc);
        if (rc == 0) CHECK(cuMemFree(p));
    }
    rc = int(cuMemAlloc(&p, 192u << 20));
    printf("own_rc=%d\n", rc);
    if (rc == 0) CHECK(cuMemFree(p));
    print_counts("");
}

// Two contexts' pools on one device, frees released by fences (run with GPUMEM_REUSE=safe,
// GPUMEM_FENCE_BATCH=1, GPUMEM_ORDER_BATCH=0): a block freed in the program's own context (the
// device's first pool) still pends when the primary context's pool frees its own block and gets it
// back through a fence.  Read with one pending list per device, that fence released the other
// context's block.  Then the program's own context ends, while a block of the primary context's
// pool stays live to the exit: only the ended context's blocks die with it.
void two_pools_fenced() {
    CHECK(cuInit(0));
    CUcontext mine = nullptr, primary = nullptr, popped = nullptr;
    CHECK(cuCtxCreate(&mine, nullptr, 0, 0));  // current now
    const size_t mb20 = 20u << 20;
    CUdeviceptr a = 0, b = 0, c = 0;
    CHECK(cuMemAlloc(&a, mb20));
    CHECK(cuDevicePrimaryCtxRetain(&primary, 0));
    CHECK(cuCtxPushCurrent(primary));
    CHECK(cuMemAlloc(&b, mb20));
    CHECK(cuCtxPopCurrent(&popped));
    CHECK(cuMemFree(a));
    CHECK(cuCtxPushCurrent(primary));
    CHECK(cuMemFree(b));
    CHECK(cuMemAlloc(&c, mb20));
    printf("reused_in_primary=%d\n", c == b);
    CHECK(cuMemFree(c));
    CUdeviceptr kept = 0, dies = 0;
    CHECK(cuMemAlloc(&kept, 4096));  // live at exit: a leak
    CHECK(cuCtxPopCurrent(&popped));
    CHECK(cuMemAlloc(&dies, 4096));  // freed by the driver with its context
    CHECK(cuCtxDestroy(mine));
    print_counts("");
}

// Two contexts on one device, each with a pool (the program's own, the device's first; the
// primary context's, its second) and allocations outside the pools: managed memory in each, and a
// stream-ordered allocation (no context owns it: cuda.h, cuCtxDestroy) made in the primary one.
// The program's own context ends; the primary context's allocations live on, and it frees them.
void two_pools_unpooled() {
    CHECK(cuInit(0));
    CUcontext mine = nullptr, primary = nullptr, popped = nullptr;
    CHECK(cuCtxCreate(&mine, nullptr, 0, 0));  // current now
    CUdeviceptr pooled_mine = 0, managed_mine = 0, pooled_primary = 0, managed_primary = 0, ordered = 0;
    CHECK(cuMemAlloc(&pooled_mine, 1u << 20));
    CHECK(cuMemAllocManaged(&managed_mine, 4096, CU_MEM_ATTACH_GLOBAL));  // dies with its context
    CHECK(cuDevicePrimaryCtxRetain(&primary, 0));
    CHECK(cuCtxPushCurrent(primary));
    CHECK(cuMemAlloc(&pooled_primary, 1u << 20));
    CHECK(cuMemAllocManaged(&managed_primary, 8192, CU_MEM_ATTACH_GLOBAL));
    CHECK(cuMemAllocAsync(&ordered, 12288, nullptr));
    CHECK(cuCtxPopCurrent(&popped));
    CHECK(cuCtxDestroy(mine));
    CHECK(cuCtxPushCurrent(primary));
    CHECK(cuMemFree(managed_primary));
    CHECK(cuMemFreeAsync(ordered, nullptr));
    CHECK(cuMemFree(pooled_primary));
    printf("managed_primary=0x%llx\nordered=0x%llx\nmanaged_mine=0x%llx\n", (unsigned long long)managed_primary,
           (unsigned long long)ordered, (unsigned long long)managed_mine);
    print_counts("");
}

// CUDA arrays and the device malloc heap, after the program freed 192 MiB into the pool (of a
// 256 MiB device): cuArrayCreate, cuArray3DCreate and cuMipmappedArrayCreate of 192 MiB, and
// cuCtxSetLimit of a 192 MiB heap.  Without gpumem each is served.
void arrays() {
    setup();
    CUDA_ARRAY_DESCRIPTOR d2 = {};
    d2.Width = 1u << 20, d2.Height = 48, d2.Format = CU_AD_FORMAT_FLOAT, d2.NumChannels = 1;  // 192 MiB
    CUDA_ARRAY3D_DESCRIPTOR d3 = {};
    d3.Width = 1u << 20, d3.Height = 12, d3.Depth = 4, d3.Format = CU_AD_FORMAT_FLOAT, d3.NumChannels = 1;
    CUDA_ARRAY3D_DESCRIPTOR dm = d3;
    dm.Depth = 2;  // two levels: charged twice its level 0
    fill_and_free();
    CUarray a = nullptr;
    int rc = int(cuArrayCreate(&a, &d2));
    printf("array_rc=%d\n", rc);
    if (rc == 0) CHECK(cuArrayDestroy(a));
    fill_and_free();
    rc = int(cuArray3DCreate(&a, &d3));
    printf("array3d_rc=%d\n", rc);
    if (rc == 0) CHECK(cuArrayDestroy(a));
    fill_and_free();
    CUmipmappedArray m = nullptr;
    rc = int(cuMipmappedArrayCreate(&m, &dm, 2));
    printf("mipmapped_rc=%d\n", rc);
    if (rc == 0) CHECK(cuMipmappedArrayDestroy(m));
    fill_and_free();
    rc = int(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 192u << 20));
    printf("heap_rc=%d\n", rc);
    print_counts("");
}

// A CUkernel's attribute query on device 1 while device 0's context is current (needs
// GPUMEM_EMU_DEVICES=2 and GPUMEM_EMU_MODULE_BYTES): the lazy load happens on device 1, whose
// memory the program filled and freed, so device 1's pool must make the headroom.
void kernel_attr_device() {
    CUcontext c0 = setup();
    CUcontext c1;
    CHECK(cuDevicePrimaryCtxRetain(&c1, 1));
    CHECK(cuCtxSetCurrent(c1));
    fill_and_free();  // device 1's
    CHECK(cuCtxSetCurrent(c0));
    int v = -1;
    const int rc = int(cuKernelGetAttribute(&v, CU_FUNC_ATTRIBUTE_NUM_REGS, reinterpret_cast<CUkernel>(0x300), 1));
    printf("kernel_attr_rc=%d\n", rc);
}

// Stream-ordered allocations on a stream of device 1 while device 0's context is current (needs
// GPUMEM_EMU_DEVICES=2): each draws from device 1, as the driver's do, so its record must name
// device 1, its failure too (a request larger than the device), and the free through the stream.
// The memory pool route as well (the emulated driver places it on the stream's device).
void async_other_device() {
    CUcontext c0 = setup();
    CUcontext c1;
    CHECK(cuDevicePrimaryCtxRetain(&c1, 1));
    CHECK(cuCtxSetCurrent(c1));
    CUstream s1;
    CHECK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    CHECK(cuCtxSetCurrent(c0));
    CUdeviceptr p = 0, q = 0, r = 0;
    printf("async_rc=%d\n", int(cuMemAllocAsync(&p, 64u << 20, s1)));
    printf("async_oom_rc=%d\n", int(cuMemAllocAsync(&q, size_t(1) << 40, s1)));
    printf("from_pool_rc=%d\n", int(cuMemAllocFromPoolAsync(&r, 32u << 20, reinterpret_cast<CUmemoryPool>(0x77), s1)));
    printf("free_rc=%d\n", int(cuMemFreeAsync(p, s1)));
    printf("free_pool_rc=%d\n", int(cuMemFreeAsync(r, s1)));
}

// A function launched first in one context, then again after cuDevicePrimaryCtxReset: the new
// context loads it again (GPUMEM_EMU_MODULE_BYTES), so that launch is a first use as well, each
// time after the program filled the device and freed it all.  With `v1` the reset is the first ABI,
// cuDevicePrimaryCtxReset as a resolver hands it out for an old version (a static cudart 13 calls it).
void reset_launch(bool v1) {
    auto params = reinterpret_cast<void**>(0x1234), extra = reinterpret_cast<void**>(0x5678);
    auto f = reinterpret_cast<CUfunction>(0x100);
    setup();
    fill_and_free();
    printf("launch_rc=%d\n", int(cuLaunchKernel(f, 11, 12, 13, 14, 15, 16, 17, nullptr, params, extra)));
    if (v1) {
        void* fn = nullptr;
        CUdriverProcAddressQueryResult q;
        CHECK(cuGetProcAddress_v2("cuDevicePrimaryCtxReset", &fn, 10000, 0, &q));
        CHECK(reinterpret_cast<CUresult (*)(CUdevice)>(fn)(0));
    } else {
        CHECK(cuDevicePrimaryCtxReset(0));
    }
    setup();
    fill_and_free();
    printf("launch_after_reset_rc=%d\n", int(cuLaunchKernel(f, 11, 12, 13, 14, 15, 16, 17, nullptr, params, extra)));
}

// A primary context's last release ends it (run with GPUMEM_EMU_PRIMARY_REFS=0, so that the
// program's own retains and releases decide): three rounds of retain, fill the device with 4 MiB
// blocks, free them all, release.  Without gpumem every round gets as many blocks as the first; a
// pool that missed the end hands out again memory the driver freed (more), or keeps chunks from
// the next context (fewer).  With `v1` the release is the first ABI, as a resolver hands it out
// for an old version (a static cudart calls it at exit).  Prints the driver's chunk counts last.
int emu_access(CUdeviceptr p, int dev);  // below, with peer access

void release_cycle(bool v1) {
    CHECK(cuInit(0));  // before the resolver below; setup() inits again, harmlessly
    using release_fn = CUresult (*)(CUdevice);
    release_fn release = &cuDevicePrimaryCtxRelease;  // cuda.h names the _v2
    if (v1) {
        void* fn = nullptr;
        CUdriverProcAddressQueryResult q;
        CHECK(cuGetProcAddress_v2("cuDevicePrimaryCtxRelease", &fn, 10000, 0, &q));
        release = reinterpret_cast<release_fn>(fn);
    }
    unsigned long long syncs_in_last_release = 0;
    for (int r = 1; r <= 3; ++r) {
        CUcontext c = setup();
        CHECK(cuDevicePrimaryCtxRetain(&c, 0));  // a second reference: its release is not the last
        CUdeviceptr live = 0;
        CHECK(cuMemAlloc(&live, 1u << 20));
        CHECK(release(0));
        // The context lives on, and so must the block and its pool.
        CUdeviceptr base = 0;
        size_t size = 0;
        const int range_rc = int(cuMemGetAddressRange(&base, &size, live));
        printf("round%d_live_after_first_release=%d\n", r, int(range_rc == 0 && base == live && emu_access(live, 0)));
        CHECK(cuMemFree(live));
        std::vector<CUdeviceptr> ps;
        for (CUdeviceptr p; cuMemAlloc(&p, 4u << 20) == CUDA_SUCCESS;) ps.push_back(p);
        for (auto p : ps) CHECK(cuMemFree(p));
        CUdeviceptr orphan = 0;  // never freed: it dies with the context
        CHECK(cuMemAlloc(&orphan, 1u << 20));
        const unsigned long long syncs = driver_count("cuCtxSynchronize") + driver_count("cuEventSynchronize");
        CHECK(release(0));
        syncs_in_last_release += driver_count("cuCtxSynchronize") + driver_count("cuEventSynchronize") - syncs;
        unsigned flags = 0;
        int active = -1;
        CHECK(cuDevicePrimaryCtxGetState(0, &flags, &active));
        printf("round%d_blocks=%zu\nround%d_active=%d\n", r, ps.size(), r, active);
    }
    printf("chunks_made=%llu\nchunks_released=%llu\nsyncs_in_last_release=%llu\n", driver_count("cuMemCreate_made"),
           driver_count("cuMemRelease"), syncs_in_last_release);
    // The ended context's handle is still current: an allocation there is the driver's to answer
    // (this emulated driver serves it), never a new pool's.
    CUdeviceptr dead = 0;
    printf("dead_alloc_rc=%d\n", int(cuMemAlloc(&dead, 1u << 20)));
}

// After device 1's primary context's end (green-stale, green-reuse): whether it ended, and whether
// a block of the context made anew is the program's (1), not a segment the driver freed with the
// old one.
void report_device1_made_anew() {
    unsigned flags = 0;
    int active = -1;
    CHECK(cuDevicePrimaryCtxGetState(1, &flags, &active));
    printf("dev1_active=%d\n", active);
    CUcontext c = nullptr;
    CHECK(cuDevicePrimaryCtxRetain(&c, 1));  // made anew
    CHECK(cuCtxSetCurrent(c));
    CUdeviceptr b = 0;
    CHECK(cuMemAlloc(&b, 1u << 20));
    printf("new_context_block_access=%d\n", emu_access(b, 1));
    CHECK(cuMemFree(b));
    CHECK(cuDevicePrimaryCtxRelease(1));
}

// A green context's handle that gpumem's table still holds when the driver hands it out again:
// the program destroys a green context of device 0 through a pointer from cuGetProcAddress, which
// gpumem does not see with GPUMEM_ROUTES leaving that way in unwatched (run with
// GPUMEM_ROUTES=a,b,d, GPUMEM_EMU_DEVICES=2, GPUMEM_EMU_PRIMARY_REFS=0, GPUMEM_EMU_GREEN_REUSE=1
// and GPUMEM_POOL_VMM=off), and the driver gives the same handle to its next green context, of
// device 1, which alone holds device 1's primary context.  The program allocates and frees 1 MiB
// there and destroys that green context (seen): its last release, which ends device 1's primary
// context and frees its memory.  Then the context is made anew, and its first allocation must be
// memory of the new context; a destruction that read device 0 from the stale entry missed the end,
// and the pool handed out the segment the driver freed.
void green_stale() {
    setup();  // device 0's primary context, held throughout
    CUcontext c1 = nullptr;
    CHECK(cuDevicePrimaryCtxRetain(&c1, 1));  // its handle; the release ends it
    CHECK(cuDevicePrimaryCtxRelease(1));
    void* fn = nullptr;
    CUdriverProcAddressQueryResult found;
    CHECK(cuGetProcAddress_v2("cuGreenCtxDestroy", &fn, 12040, CU_GET_PROC_ADDRESS_DEFAULT, &found));
    auto unseen_destroy = reinterpret_cast<CUresult (*)(CUgreenCtx)>(fn);
    CUgreenCtx g0 = nullptr, g1 = nullptr;
    CHECK(cuGreenCtxCreate(&g0, nullptr, 0, CU_GREEN_CTX_DEFAULT_STREAM));
    CHECK(unseen_destroy(g0));
    CHECK(cuGreenCtxCreate(&g1, nullptr, 1, CU_GREEN_CTX_DEFAULT_STREAM));
    printf("same_handle=%d\n", int(g1 == g0));
    CHECK(cuCtxSetCurrent(c1));
    CUdeviceptr p = 0;
    CHECK(cuMemAlloc(&p, 1u << 20));
    CHECK(cuMemFree(p));  // cached by device 1's pool
    CHECK(cuGreenCtxDestroy(g1));
    report_device1_made_anew();
}

// Two threads retain the primary contexts of devices 0 and 1 at the same time (run with
// GPUMEM_EMU_DEVICES=2), as a program that sets up each of its GPUs from a thread of its own does;
// the emulated driver's retains wait for each other inside (gpumem_emu_retains_meet, 5 s at most),
// as a real driver's first retains run side by side, each making its context.  Alone both meet; a
// lock of gpumem's held across the retains of both devices keeps them apart.
void retain_meet() {
    setup();
    CUdeviceptr a = 0;
    CHECK(cuMemAlloc(&a, 1u << 20));  // a pool (and the log) exist
    using meet_fn = void (*)(int);
    using met_fn = int (*)();
    auto meet = reinterpret_cast<meet_fn>(dlsym(RTLD_DEFAULT, "gpumem_emu_retains_meet"));
    auto met = reinterpret_cast<met_fn>(dlsym(RTLD_DEFAULT, "gpumem_emu_retains_met"));
    if (!meet || !met) fail("dlsym gpumem_emu_retains_meet", -1);
    meet(5000);
    std::vector<std::thread> ts;
    for (int d = 0; d < 2; ++d)
        ts.emplace_back([d] {
            CUcontext c = nullptr;
            CHECK(cuDevicePrimaryCtxRetain(&c, d));
        });
    for (auto& t : ts) t.join();
    meet(0);
    CHECK(cuDevicePrimaryCtxRelease(0));
    CHECK(cuDevicePrimaryCtxRelease(1));
    CHECK(cuMemFree(a));
    printf("retains_met=%d\n", met());
}

// A primary context's last release while another thread retains it (run with
// GPUMEM_EMU_PRIMARY_REFS=0 and GPUMEM_EMU_RELEASE_GAP_MS, so that the retain lands after the
// driver ended the context and before the release returns): the retain makes the context anew,
// with the same handle, and its first allocation must be memory of the new context.  A pool that
// missed the end (it found the context active again after the release) hands out a segment the
// driver freed with the old context (GPUMEM_POOL_VMM=off).  `green`: the other thread makes a green
// context first, whose creation retains the primary context inside the driver (made anew there).
void release_race(bool green) {
    setup();
    CUdeviceptr a = 0;
    CHECK(cuMemAlloc(&a, 1u << 20));
    CHECK(cuMemFree(a));  // cached by a pool
    int access = -2;
    std::thread other([&] {
        unsigned flags = 0;
        for (int active = 1; active;) CHECK(cuDevicePrimaryCtxGetState(0, &flags, &active));
        CUgreenCtx g = nullptr;
        if (green) CHECK(cuGreenCtxCreate(&g, nullptr, 0, CU_GREEN_CTX_DEFAULT_STREAM));
        CUcontext c = nullptr;
        CHECK(cuDevicePrimaryCtxRetain(&c, 0));
        CHECK(cuCtxSetCurrent(c));
        CUdeviceptr b = 0;
        CHECK(cuMemAlloc(&b, 1u << 20));
        access = emu_access(b, 0);
        CHECK(cuMemFree(b));
        CHECK(cuDevicePrimaryCtxRelease(0));
        if (green) CHECK(cuGreenCtxDestroy(g));
    });
    CHECK(cuDevicePrimaryCtxRelease(0));  // the last: it ends the context
    other.join();
    printf("new_context_block_access=%d\n", access);
}

// The green context that most green cases start from: one of all of device 0's SMs, its own
// CUcontext made current and returned (*g gets the green context).
CUcontext green_current(CUgreenCtx* g) {
    CHECK(cuGreenCtxCreate(g, nullptr, 0, CU_GREEN_CTX_DEFAULT_STREAM));
    CUcontext own = nullptr;
    CHECK(cuCtxFromGreenCtx(&own, *g));
    CHECK(cuCtxSetCurrent(own));
    return own;
}

// Hands `f` to the emulated driver, which calls it inside cuGreenCtxDestroy once the green
// context is dead (nullptr: no more calls): the moment another thread's work must meet.
void on_green_destroyed(void (*f)(CUgreenCtx)) {
    using on_fn = void (*)(void (*)(CUgreenCtx));
    static const auto on = reinterpret_cast<on_fn>(dlsym(RTLD_DEFAULT, "gpumem_emu_on_green_destroyed"));
    if (!on) fail("dlsym gpumem_emu_on_green_destroyed", -1);
    on(f);
}

// How many calls reached a destroyed green context, its events or its streams (the emulated
// driver's counters, fake_libcuda.cc).
void print_dead_green_counts() {
    printf("dead_green_made_current=%llu\ncall_in_dead_green_context=%llu\ncall_on_dead_green_event=%llu\n"
           "call_on_dead_green_stream=%llu\n",
           driver_count("dead_green_made_current"), driver_count("call_in_dead_green_context"),
           driver_count("call_on_dead_green_event"), driver_count("call_on_dead_green_stream"));
}

// A green context's destruction as its primary context's last release (run with
// GPUMEM_EMU_PRIMARY_REFS=0): three rounds of the program's retain, a green context (which
// retains the primary context too) with a non-blocking stream of its own, the program's release
// (not the last), 4 MiB blocks until the device is full, all freed, a 1 MiB block never freed,
// and the green context's destruction, which ends the primary context and frees its memory.  The
// green stream is left undestroyed (a leak, says cuda.h, and every call on it is refused after).
// Prints the blocks each round got, whether the context was active after, what the pool's chunks
// cost and how many calls reached a stream of a destroyed green context.
void green_end() {
    CHECK(cuInit(0));
    for (int r = 1; r <= 3; ++r) {
        CUcontext c = setup();
        (void)c;
        CUgreenCtx g = nullptr;
        CHECK(cuGreenCtxCreate(&g, nullptr, 0, CU_GREEN_CTX_DEFAULT_STREAM));
        CUstream gs = nullptr;
        CHECK(cuGreenCtxStreamCreate(&gs, g, CU_STREAM_NON_BLOCKING, 0));
        CHECK(cuDevicePrimaryCtxRelease(0));  // the green context's reference keeps it
        std::vector<CUdeviceptr> ps;
        for (CUdeviceptr p; cuMemAlloc(&p, 4u << 20) == CUDA_SUCCESS;) ps.push_back(p);
        for (auto p : ps) CHECK(cuMemFree(p));
        CUdeviceptr orphan = 0;  // never freed: it dies with the context
        CHECK(cuMemAlloc(&orphan, 1u << 20));
        CHECK(cuGreenCtxDestroy(g));
        unsigned flags = 0;
        int active = -1;
        CHECK(cuDevicePrimaryCtxGetState(0, &flags, &active));
        printf("round%d_blocks=%zu\nround%d_active=%d\n", r, ps.size(), r, active);
    }
    printf("chunks_made=%llu\nchunks_released=%llu\ndead_green_stream_calls=%llu\n", driver_count("cuMemCreate_made"),
           driver_count("cuMemRelease"), driver_count("call_on_dead_green_stream"));
}

// A green context's handle that the driver hands out again while gpumem still handles its
// destruction (run with GPUMEM_EMU_DEVICES=2, GPUMEM_EMU_PRIMARY_REFS=0, GPUMEM_EMU_GREEN_REUSE=1
// and GPUMEM_POOL_VMM=off): this thread destroys a green context of device 0; the moment the
// driver has, another thread gets the same handle for a green context of device 1, allocates and
// frees 1 MiB in device 1's primary context (which that green context's reference alone holds) and
// destroys it: its last release, which ends device 1's primary context and frees its memory.  Then
// device 1's primary context is made anew, and its first allocation must be memory of the new
// context.  A destruction that took device 0 from the old green context's entry missed the end,
// and the pool handed out the segment the driver freed.  The first thread's destruction waits (5 s
// at most) until the other thread's has begun: it read gpumem's table (its cuCtxFromGreenCtx comes
// after) or, without gpumem, reached the driver.
std::atomic<int> g_reuse_stage{0};
unsigned long long g_reuse_from_green = 0, g_reuse_destroys = 0;
void green_reuse() {
    setup();  // device 0's primary context, held throughout
    CUcontext c1 = nullptr;
    CHECK(cuDevicePrimaryCtxRetain(&c1, 1));  // its handle, for the other thread; the release ends it
    CHECK(cuDevicePrimaryCtxRelease(1));
    CUgreenCtx g0 = nullptr, g1 = nullptr;
    CHECK(cuGreenCtxCreate(&g0, nullptr, 0, CU_GREEN_CTX_DEFAULT_STREAM));
    std::thread other([&] {
        while (g_reuse_stage.load() != 1) std::this_thread::yield();
        CHECK(cuGreenCtxCreate(&g1, nullptr, 1, CU_GREEN_CTX_DEFAULT_STREAM));
        CHECK(cuCtxSetCurrent(c1));
        CUdeviceptr p = 0;
        CHECK(cuMemAlloc(&p, 1u << 20));
        CHECK(cuMemFree(p));  // cached by device 1's pool
        g_reuse_stage.store(2);
        CHECK(cuGreenCtxDestroy(g1));
    });
    g_reuse_from_green = driver_count("cuCtxFromGreenCtx");
    g_reuse_destroys = driver_count("cuGreenCtxDestroy");
    on_green_destroyed([](CUgreenCtx) {
        int first = 0;
        if (!g_reuse_stage.compare_exchange_strong(first, 1)) return;  // the other thread's destruction
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while ((g_reuse_stage.load() != 2 || (driver_count("cuCtxFromGreenCtx") == g_reuse_from_green &&
                                              driver_count("cuGreenCtxDestroy") < g_reuse_destroys + 2)) &&
               std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    CHECK(cuGreenCtxDestroy(g0));
    on_green_destroyed(nullptr);
    other.join();
    printf("same_handle=%d\n", int(g1 == g0));
    report_device1_made_anew();
}

// Memory the program freed into the pool with a green context current, after that green context's
// destruction (the primary context lives on): cuMemAllocAsync of 192 MiB of a 256 MiB device, in
// the primary context.  Without gpumem it is served.
void green_pool() {
    setup();
    CUgreenCtx g = nullptr;
    CHECK(cuGreenCtxCreate(&g, nullptr, 0, CU_GREEN_CTX_DEFAULT_STREAM));
    CUcontext own = nullptr;
    CHECK(cuCtxFromGreenCtx(&own, g));
    CHECK(cuCtxPushCurrent(own));
    fill_and_free();
    CUcontext popped = nullptr;
    CHECK(cuCtxPopCurrent(&popped));
    CHECK(cuGreenCtxDestroy(g));
    CUdeviceptr p = 0;
    const int rc = int(cuMemAllocAsync(&p, 192u << 20, nullptr));
    printf("async_rc=%d\n", rc);
    if (rc == 0) CHECK(cuMemFreeAsync(p, nullptr));
    print_counts("");
}

// A block allocated with a green context current and freed after cuGreenCtxDestroy, its primary
// context living on (tests/gpu/green_free.cu on an H100: the memory is the primary context's, the
// driver names that context as the pointer's, gives nothing back at the destruction and frees the
// block at the late cuMemFree; the driver dies of a double free if the dead green context is made
// current and left, so gpumem's pool must never make it current).  The green context
// has a non-blocking stream of its own; a block is freed while the green context lives, then the
// destruction, the late free, a new block with the primary context current and its free.  Prints the late free's answer, whether the pointer's context was the
// primary context before the destruction, and how many calls reached the dead green context, its
// events or its stream.
// `reset`: then the primary context's reset (its memory goes, the late free's included), a block
// of the context made anew, and most of the device stream-ordered again (its give-back): the block
// must still be the program's (new_block_access 1, as alone).
void green_late_free(bool reset) {
    CUcontext primary = setup();
    CUgreenCtx g = nullptr;
    CHECK(cuGreenCtxCreate(&g, nullptr, 0, CU_GREEN_CTX_DEFAULT_STREAM));
    CUcontext own = nullptr;
    CHECK(cuCtxFromGreenCtx(&own, g));
    CUstream gs = nullptr;
    CHECK(cuGreenCtxStreamCreate(&gs, g, CU_STREAM_NON_BLOCKING, 0));
    CHECK(cuCtxSetCurrent(own));
    CUdeviceptr a = 0, b = 0;
    CHECK(cuMemAlloc(&a, 8u << 20));
    CHECK(cuMemAlloc(&b, 8u << 20));
    CHECK(cuMemFree(b));
    CUcontext owner = nullptr;
    CHECK(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, a));
    CHECK(cuCtxSetCurrent(primary));
    CHECK(cuGreenCtxDestroy(g));
    const int late = int(cuMemFree(a));
    CUdeviceptr c = 0;
    CHECK(cuMemAlloc(&c, 8u << 20));
    CHECK(cuMemFree(c));
    // Most of the device's memory, stream-ordered (GPUMEM_EMU_CAPACITY=64M): the late free's memory
    // must be within reach (a pool holding it gives it back, in a context that lives).
    CUdeviceptr big = 0;
    const int async_rc = int(cuMemAllocAsync(&big, 56u << 20, nullptr));
    if (async_rc == 0) CHECK(cuMemFreeAsync(big, nullptr));
    printf("late_free_rc=%d\nowner_is_primary=%d\nasync_rc=%d\n", late, int(owner == primary), async_rc);
    if (reset) {
        CHECK(cuDevicePrimaryCtxReset(0));
        CHECK(cuDevicePrimaryCtxRetain(&primary, 0));
        CHECK(cuCtxSetCurrent(primary));
        CUdeviceptr d = 0;
        CHECK(cuMemAlloc(&d, 8u << 20));
        const int again_rc = int(cuMemAllocAsync(&big, 44u << 20, nullptr));
        if (again_rc == 0) CHECK(cuMemFreeAsync(big, nullptr));
        printf("again_rc=%d\nnew_block_access=%d\n", again_rc, emu_access(d, 0));
        CHECK(cuMemFree(d));
    }
    print_dead_green_counts();
}

// Another thread's pool work in the moment a green context is dead in the driver and gpumem has
// not moved its pool to the primary context yet (run with GPUMEM_EMU_CAPACITY=64M): a 24 MiB block
// allocated with the green context current and kept, then the green context's destruction (the
// primary context lives on).  Once the driver has marked it dead (gpumem_emu_on_green_destroyed,
// inside cuGreenCtxDestroy), the other thread frees that block and allocates 48 MiB in the primary
// context, which fits only once the block's memory is back: the pool holding it must give it
// back, which waits for its work, in some context.  The destruction waits for the other thread,
// 1 s at most (under gpumem that thread's pool work may wait for the destruction).  Prints the
// free's and the allocation's answers and how many calls reached the dead green context.
std::atomic<int> g_race_stage{0};
void green_destroy_race() {
    const CUcontext primary = setup();
    CUgreenCtx g = nullptr;
    green_current(&g);
    CUdeviceptr a = 0;
    CHECK(cuMemAlloc(&a, 24u << 20));
    CHECK(cuCtxSetCurrent(primary));
    int free_rc = -1, alloc_rc = -1;
    CUdeviceptr big = 0;
    std::thread other([&] {
        CHECK(cuCtxSetCurrent(primary));
        while (g_race_stage.load() != 1) std::this_thread::yield();
        free_rc = int(cuMemFree(a));
        alloc_rc = int(cuMemAlloc(&big, 48u << 20));
        g_race_stage.store(2);
    });
    on_green_destroyed([](CUgreenCtx) {
        g_race_stage.store(1);
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
        while (g_race_stage.load() != 2 && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    const int destroy_rc = int(cuGreenCtxDestroy(g));
    on_green_destroyed(nullptr);
    other.join();
    if (alloc_rc == 0) CHECK(cuMemFree(big));
    printf("destroy_rc=%d\nfree_rc=%d\nalloc_rc=%d\n", destroy_rc, free_rc, alloc_rc);
    print_dead_green_counts();
}

// Other threads' pointer queries, frees and free-memory question, none about a block of the green
// context's pool, in the moment its destruction is under way (gpumem holds that pool's lock across
// the driver's cuGreenCtxDestroy, primary_released_by).  Pools in this order: the primary
// context's (1 MiB kept), the green context's (8 MiB allocated with its CUcontext current, kept),
// a made context's (two 4 MiB blocks: its pool comes after the green one in every walk over the
// pools).  Once the driver has marked the green context dead (gpumem_emu_on_green_destroyed), six
// threads with the primary context current ask at once: the context of a host allocation (no
// pool's), the address range of one cuMemAllocPitch allocation (the driver's own) and the free of
// another, the context of one of the made context's blocks and the free of the other, and
// cuMemGetInfo.  The
// destruction waits until all six have answered, 1 s at most.  Prints each answer and whether it
// came while the destruction was still under way (<name>_during_destroy 1).
std::atomic<int> g_query_stage{0};
std::atomic<int> g_query_done[6];
int g_query_during[6];
void green_destroy_query() {
    const CUcontext primary = setup();
    CUdeviceptr p0 = 0, green_block = 0, made_block = 0, made_freed = 0, pitched = 0, pitch_freed = 0;
    CHECK(cuMemAlloc(&p0, 1u << 20));
    CUgreenCtx g = nullptr;
    green_current(&g);
    CHECK(cuMemAlloc(&green_block, 8u << 20));
    CUcontext made = nullptr;
    CHECK(cuCtxCreate(&made, nullptr, 0, 0));  // current now
    CHECK(cuMemAlloc(&made_block, 4u << 20));
    CHECK(cuMemAlloc(&made_freed, 4u << 20));
    CHECK(cuCtxSetCurrent(primary));
    size_t pitch = 0;
    CHECK(cuMemAllocPitch(&pitched, &pitch, 4096, 16, 4));
    CHECK(cuMemAllocPitch(&pitch_freed, &pitch, 4096, 16, 4));
    void* host = nullptr;
    CHECK(cuMemAllocHost(&host, 4096));
    static const char* const names[6] = {"host_query", "pitch_range", "made_query", "made_free", "pitch_free", "mem_info"};
    int rc[6] = {-1, -1, -1, -1, -1, -1};
    std::vector<std::thread> askers;
    for (int i = 0; i < 6; ++i)
        askers.emplace_back([&, i] {
            CHECK(cuCtxSetCurrent(primary));
            g_query_stage.wait(0);
            CUcontext c = nullptr;
            CUdeviceptr base = 0;
            size_t size = 0, free_b = 0, total_b = 0;
            switch (i) {
                case 0: rc[i] = int(cuPointerGetAttribute(&c, CU_POINTER_ATTRIBUTE_CONTEXT, CUdeviceptr(uintptr_t(host)))); break;
                case 1: rc[i] = int(cuMemGetAddressRange(&base, &size, pitched + 64)); break;
                case 2: rc[i] = int(cuPointerGetAttribute(&c, CU_POINTER_ATTRIBUTE_CONTEXT, made_block)); break;
                case 3: rc[i] = int(cuMemFree(made_freed)); break;
                case 4: rc[i] = int(cuMemFree(pitch_freed)); break;
                default: rc[i] = int(cuMemGetInfo(&free_b, &total_b)); break;
            }
            g_query_done[i].store(1);
        });
    on_green_destroyed([](CUgreenCtx) {
        g_query_stage.store(1);
        g_query_stage.notify_all();
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
        auto all = [] {
            for (auto& d : g_query_done)
                if (!d.load()) return false;
            return true;
        };
        while (!all() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::microseconds(200));
        for (int i = 0; i < 6; ++i) g_query_during[i] = g_query_done[i].load();
    });
    const int destroy_rc = int(cuGreenCtxDestroy(g));
    on_green_destroyed(nullptr);
    for (auto& t : askers) t.join();
    printf("destroy_rc=%d\n", destroy_rc);
    for (int i = 0; i < 6; ++i) printf("%s_rc=%d\n%s_during_destroy=%d\n", names[i], rc[i], names[i], g_query_during[i]);
    CHECK(cuMemFreeHost(host));
    CHECK(cuMemFree(green_block));
    CHECK(cuMemFree(made_block));
    CHECK(cuMemFree(pitched));
    CHECK(cuMemFree(p0));
    CHECK(cuCtxDestroy(made));
}

// Allocations made with a destroyed green context's own CUcontext current (its primary context
// living on): on an H100 (driver 580.159.04, runs 167-168) cuMemAlloc answers
// CUDA_ERROR_CONTEXT_IS_DESTROYED (709) there, and a later cuCtxSetCurrent to another context dies
// inside libcuda, so a real program ends at its next switch; the emulated driver answers 709 and
// lives on.  The green context allocates 8 MiB with its CUcontext current and keeps it (so it had a
// pool), is destroyed, and is made current again: then cuMemAlloc of 8 MiB, cuMemAllocPitch of
// 4 KiB x 1024 rows and, where `cudart` names the emulated runtime's library, its cudaMalloc of
// 8 MiB (its first call made with the primary context current, before the green context: the
// runtime makes its context current once).  Then the primary context current, the frees of what
// was served and of the kept block.  Prints each answer (cudart_rc -1: no runtime) and how many
// times the dead context was made current and called in.
void green_dead_alloc(const char* cudart) {
    const CUcontext primary = setup();
    int (*rt_malloc)(void**, size_t) = nullptr;
    int (*rt_free)(void*) = nullptr;
    if (cudart) {
        // Bound by name in the global scope, as a program linked with the runtime is: under
        // gpumem its export comes first.
        if (!dlopen(cudart, RTLD_NOW | RTLD_GLOBAL)) fail("dlopen of the runtime", -1);
        rt_malloc = reinterpret_cast<int (*)(void**, size_t)>(dlsym(RTLD_DEFAULT, "cudaMalloc"));
        rt_free = reinterpret_cast<int (*)(void*)>(dlsym(RTLD_DEFAULT, "cudaFree"));
        if (!rt_malloc || !rt_free) fail("dlsym cudaMalloc", -1);
        CHECK(rt_free(nullptr));  // the runtime's start
    }
    CUgreenCtx g = nullptr;
    const CUcontext own = green_current(&g);
    CUdeviceptr kept = 0;
    CHECK(cuMemAlloc(&kept, 8u << 20));
    CHECK(cuCtxSetCurrent(primary));
    CHECK(cuGreenCtxDestroy(g));
    CHECK(cuCtxSetCurrent(own));
    CUdeviceptr a = 0, pitched = 0;
    size_t pitch = 0;
    void* r = nullptr;
    const int alloc_rc = int(cuMemAlloc(&a, 8u << 20));
    const int pitch_rc = int(cuMemAllocPitch(&pitched, &pitch, 4096, 1024, 4));
    const int cudart_rc = rt_malloc ? rt_malloc(&r, 8u << 20) : -1;
    CHECK(cuCtxSetCurrent(primary));
    if (alloc_rc == 0) CHECK(cuMemFree(a));
    if (pitch_rc == 0) CHECK(cuMemFree(pitched));
    if (cudart_rc == 0) CHECK(rt_free(r));
    const int kept_free_rc = int(cuMemFree(kept));
    printf("alloc_rc=%d\npitch_rc=%d\ncudart_rc=%d\nkept_free_rc=%d\n", alloc_rc, pitch_rc, cudart_rc, kept_free_rc);
    printf("dead_green_made_current=%llu\ncall_in_dead_green_context=%llu\n", driver_count("dead_green_made_current"),
           driver_count("call_in_dead_green_context"));
}

// A destroyed green context's CUcontext that the driver hands out again (run with
// GPUMEM_EMU_CONTEXT_REUSE=1): two rounds of a green context of device 0 that allocates 8 MiB with
// its own CUcontext current, keeps it, frees another 8 MiB block into its pool, and is destroyed
// (the primary context lives on); the second green context gets the first one's CUcontext again.
// Then cuCtxCreate, which gets that handle a third time, allocates 8 MiB, frees it and is
// destroyed.  Both green contexts' blocks must stay the program's through all of it (their memory
// is the primary context's) and be freed by the late frees; the made context's block is its own.
// Prints whether the handles came back, the blocks' addresses (for the log), the made context's
// free, whether each green block is still mapped after the made context's end (1), and the late
// frees' answers.
void green_handle_again() {
    const CUcontext primary = setup();
    CUdeviceptr kept[2] = {};
    CUcontext own[2] = {};
    for (int i = 0; i < 2; ++i) {
        CUgreenCtx g = nullptr;
        own[i] = green_current(&g);
        CUdeviceptr cached = 0;
        CHECK(cuMemAlloc(&kept[i], 8u << 20));
        CHECK(cuMemAlloc(&cached, 8u << 20));
        CHECK(cuMemFree(cached));
        CHECK(cuCtxSetCurrent(primary));
        CHECK(cuGreenCtxDestroy(g));
    }
    CUcontext made = nullptr;
    CHECK(cuCtxCreate(&made, nullptr, 0, 0));  // current now
    CUdeviceptr m = 0;
    CHECK(cuMemAlloc(&m, 8u << 20));
    printf("green_handle_again=%d\nmade_handle_again=%d\n", int(own[1] == own[0]), int(made == own[0]));
    printf("green0_block=0x%llx\ngreen1_block=0x%llx\nmade_block=0x%llx\n", (unsigned long long)kept[0],
           (unsigned long long)kept[1], (unsigned long long)m);
    printf("made_free_rc=%d\n", int(cuMemFree(m)));
    CHECK(cuCtxDestroy(made));
    CHECK(cuCtxSetCurrent(primary));
    printf("green0_access=%d\ngreen1_access=%d\n", emu_access(kept[0], 0), emu_access(kept[1], 0));
    printf("green0_free_rc=%d\ngreen1_free_rc=%d\n", int(cuMemFree(kept[0])), int(cuMemFree(kept[1])));
}

// A context the driver makes with a green context's CUcontext while the green context's
// destruction is under way (run with GPUMEM_EMU_CONTEXT_REUSE=1): the green context allocates 8 MiB
// with its own CUcontext current and keeps it, and frees another 8 MiB block into its pool.  Inside
// cuGreenCtxDestroy, once the emulated driver has destroyed it, another thread makes a context
// (cuCtxCreate, which gets the dead handle), allocates 8 MiB there, asks whose memory that is and
// frees it; the destruction returns 200 ms after that allocation began.  Then the made context is
// destroyed.  Its block is its own (a GPU names the made context; the emulated driver names every
// cuMemAlloc allocation its device's primary context's); the green context's block stays the
// program's.  Prints whether the handle came back, the answers, the context named for the made
// block, the blocks (for the log), whether the green block is still mapped after the made
// context's end, and its late free.
std::atomic<int> g_window_stage{0};
void green_reuse_window() {
    const CUcontext primary = setup();
    CUgreenCtx g = nullptr;
    const CUcontext own = green_current(&g);
    CUdeviceptr kept = 0, cached = 0;
    CHECK(cuMemAlloc(&kept, 8u << 20));
    CHECK(cuMemAlloc(&cached, 8u << 20));
    CHECK(cuMemFree(cached));
    CHECK(cuCtxSetCurrent(primary));
    CUcontext made = nullptr, named = nullptr;
    CUdeviceptr m = 0;
    int alloc_rc = -1, made_free_rc = -1;
    std::thread other([&] {
        while (g_window_stage.load() != 1) std::this_thread::yield();
        CHECK(cuCtxCreate(&made, nullptr, 0, 0));  // current on this thread
        g_window_stage.store(2);
        alloc_rc = int(cuMemAlloc(&m, 8u << 20));
        if (alloc_rc == 0) CHECK(cuPointerGetAttribute(&named, CU_POINTER_ATTRIBUTE_CONTEXT, m));
        if (alloc_rc == 0) made_free_rc = int(cuMemFree(m));
    });
    on_green_destroyed([](CUgreenCtx) {
        g_window_stage.store(1);
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
        while (g_window_stage.load() != 2 && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the allocation is under way
    });
    const int destroy_rc = int(cuGreenCtxDestroy(g));
    on_green_destroyed(nullptr);
    other.join();
    printf("destroy_rc=%d\nmade_handle_again=%d\nalloc_rc=%d\nnamed_made=%d\nnamed_primary=%d\n", destroy_rc,
           int(made == own), alloc_rc, int(named == made), int(named == primary));
    printf("green_block=0x%llx\nmade_block=0x%llx\nmade_free_rc=%d\n", (unsigned long long)kept, (unsigned long long)m,
           made_free_rc);
    CHECK(cuCtxDestroy(made));
    CHECK(cuCtxSetCurrent(primary));
    printf("green_access=%d\n", emu_access(kept, 0));
    printf("green_free_rc=%d\n", int(cuMemFree(kept)));
}

// A green context's destruction that the driver refuses (run with GPUMEM_EMU_GREEN_DESTROY_REFUSE=1,
// the first refused, and GPUMEM_EMU_CAPACITY=64M): the green context allocates 8 MiB with its own
// CUcontext current and keeps it, and frees another 8 MiB block into its pool; its destruction is
// refused, and it lives on.  With its CUcontext current again the program allocates 8 MiB and
// frees it, frees the kept block, allocates 8 MiB once more and asks whose memory that is and
// where it begins; then, its primary context current, destroys the green context for real, frees
// that last block after and allocates 48 MiB (what the pools hold free must go back for it).
// gpumem moved the green pool to the primary context before the driver's answer and must have
// moved it back.  `fresh`: the green context allocates nothing before the refused destruction (no
// pool yet; gpumem marked its CUcontext dead before the driver's answer, and must have unmarked
// it).  Prints the answers, the blocks (for the log) and the calls that reached a dead green
// context.
void green_destroy_refused(bool fresh) {
    const CUcontext primary = setup();
    CUgreenCtx g = nullptr;
    const CUcontext own = green_current(&g);
    CUdeviceptr kept = 0, cached = 0;
    if (!fresh) {
        CHECK(cuMemAlloc(&kept, 8u << 20));
        CHECK(cuMemAlloc(&cached, 8u << 20));
        CHECK(cuMemFree(cached));
    }
    CHECK(cuCtxSetCurrent(primary));
    const int refused_rc = int(cuGreenCtxDestroy(g));
    CUcontext again = nullptr;
    const int from_green_rc = int(cuCtxFromGreenCtx(&again, g));
    CHECK(cuCtxSetCurrent(own));
    CUdeviceptr a = 0, b = 0;
    const int alloc_rc = int(cuMemAlloc(&a, 8u << 20));
    const int free_rc = alloc_rc == 0 ? int(cuMemFree(a)) : -1;
    const int kept_free_rc = fresh ? -1 : int(cuMemFree(kept));
    const int last_alloc_rc = int(cuMemAlloc(&b, 8u << 20));
    CUcontext named = nullptr;
    CUdeviceptr base = 0;
    size_t size = 0;
    const int named_rc = last_alloc_rc == 0 ? int(cuPointerGetAttribute(&named, CU_POINTER_ATTRIBUTE_CONTEXT, b)) : -1;
    const int range_rc = last_alloc_rc == 0 ? int(cuMemGetAddressRange(&base, &size, b)) : -1;
    printf("refused_rc=%d\nfrom_green_rc=%d\nsame_context=%d\n", refused_rc, from_green_rc, int(again == own));
    printf("alloc_rc=%d\nfree_rc=%d\nkept_free_rc=%d\nlast_alloc_rc=%d\n", alloc_rc, free_rc, kept_free_rc, last_alloc_rc);
    printf("named_rc=%d\nnamed_primary=%d\nrange_rc=%d\nrange_base_is_last=%d\nrange_size=%zu\n", named_rc,
           int(named == primary), range_rc, int(base == b), size);
    printf("kept_block=0x%llx\ncached_block=0x%llx\nnew_block=0x%llx\nlast_block=0x%llx\n", (unsigned long long)kept,
           (unsigned long long)cached, (unsigned long long)a, (unsigned long long)b);
    CHECK(cuCtxSetCurrent(primary));
    printf("destroy_rc=%d\n", int(cuGreenCtxDestroy(g)));
    const int access = emu_access(b, 0);  // before the free: argument order is unspecified
    printf("last_access=%d\nlate_free_rc=%d\nrefusals=%llu\n", access, int(cuMemFree(b)), driver_count("green_destroy_refused"));
    // Most of the device (GPUMEM_EMU_CAPACITY=64M), which every pool must give back its free for.
    CUdeviceptr big = 0;
    const int big_rc = int(cuMemAlloc(&big, 48u << 20));
    printf("big_alloc_rc=%d\nbig_free_rc=%d\n", big_rc, big_rc == 0 ? int(cuMemFree(big)) : -1);
    print_dead_green_counts();
}

// issue 12's fill/fragment/large program: 6 MiB blocks until the device is full, two of every
// three freed, then 60 MiB blocks until one fails.  Prints how many of each were served.  Other
// sizes (MiB) give other layouts: 3 and 60 leave live blocks astride chunks, so that the last
// large request fails for chunk rounding (tests/data/emu, docs/metrics.md).
void fragment(size_t small_mib = 6, size_t big_mib = 60) {
    setup();
    std::vector<CUdeviceptr> small;
    for (;;) {
        CUdeviceptr p;
        if (cuMemAlloc(&p, small_mib << 20) != CUDA_SUCCESS) break;
        small.push_back(p);
    }
    for (size_t i = 0; i < small.size(); ++i)
        if (i % 3 != 0) CHECK(cuMemFree(small[i]));
    size_t big = 0;
    for (;;) {
        CUdeviceptr p;
        if (cuMemAlloc(&p, big_mib << 20) != CUDA_SUCCESS) break;
        ++big;
    }
    printf("small_served=%zu\nbig_served=%zu\ndriver_unmap=%llu\n", small.size(), big, driver_count("cuMemUnmap"));
    print_counts("");
}

// Frees pile up during a capture: the pool must take segments rather than synchronize.  The
// capture is global and the thread relaxed around its allocations, as PyTorch's torch.cuda.graph
// and its caching allocator do (in global mode the driver forbids them: capture_modes below).
// to_graph: the capture is opened by cuStreamBeginCaptureToGraph (into an existing graph).
// stray_end: an end of a capture on a stream that is not capturing, while the real one is open
// (the driver says CUDA_ERROR_ILLEGAL_STATE and the capture stays open).
// wrong_thread: the capture is ended from another thread (the driver refuses with
// CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD and ends it all the same, as on the H200), then by its own
// thread (CUDA_ERROR_ILLEGAL_STATE: nothing left to end).
void capture(bool to_graph, bool stray_end, bool wrong_thread = false) {
    setup();
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));  // as PyTorch's capture streams; switches auto to safe
    const size_t mb4 = 4u << 20;
    auto pairs = [&](int n) {
        for (int i = 0; i < n; ++i) {
            CUdeviceptr p;
            CHECK(cuMemAlloc(&p, mb4));
            CHECK(cuMemFree(p));
        }
    };
    pairs(4);
    print_counts("before_");
    CUstream other = nullptr;
    if (stray_end) CHECK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    if (to_graph) CHECK(cuStreamBeginCaptureToGraph(s, nullptr, nullptr, nullptr, 0, CU_STREAM_CAPTURE_MODE_GLOBAL));
    else CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    if (stray_end) {
        CUgraph none;
        printf("stray_end_result=%d\n", int(cuStreamEndCapture(other, &none)));
    }
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    CHECK(cuThreadExchangeStreamCaptureMode(&mode));
    pairs(64);  // 256 MiB freed: far past the 32 MiB sync budget
    CHECK(cuThreadExchangeStreamCaptureMode(&mode));
    print_counts("during_");
    CUgraph g;
    if (wrong_thread) {
        std::thread([&] {
            CUcontext ctx;
            cuDevicePrimaryCtxRetain(&ctx, 0);
            cuCtxSetCurrent(ctx);
            printf("wrong_thread_end_result=%d\n", int(cuStreamEndCapture(s, &g)));
        }).join();
        printf("own_end_result=%d\n", int(cuStreamEndCapture(s, &g)));
    } else {
        CHECK(cuStreamEndCapture(s, &g));
    }
    pairs(64);
    print_counts("after_");
}

// cuMemAlloc, cuMemFree and cuMemFreeAsync on a stream no capture holds, inside a capture, for
// every capture mode, from the thread that began it or another, in each thread mode
// (tests/gpu/capture_mode_check.py on the H200): the answer, the capture's status after the call
// and its end's answer, `<op>_<capture>_<thread>_<mode>_{rc,status,end}`.
// Where the driver refuses, it must refuse with gpumem too (and the capture be invalidated); where
// it allows, the pool serves.
void capture_modes() {
    CUcontext ctx = setup();
    const char* mode_names[] = {"global", "thread_local", "relaxed"};
    const char* op_names[] = {"alloc_", "free_", "freeasync_"};
    for (int cm : {0, 1, 2})
        for (bool same : {true, false})
            for (int tm : {-1, 1, 2})
                for (int op : {0, 1, 2}) {  // cuMemAlloc, cuMemFree, cuMemFreeAsync
                    const bool alloc = op == 0;
                    CUstream s, other;  // other: freeasync's stream, never captured
                    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
                    CHECK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
                    CUdeviceptr pre = 0, got = 0;
                    if (!alloc) CHECK(cuMemAlloc(&pre, 5000));
                    CHECK(cuStreamBeginCapture(s, CUstreamCaptureMode(cm)));
                    int rc = -1;
                    auto act = [&] {
                        if (!same) cuCtxSetCurrent(ctx);
                        CUstreamCaptureMode old = CUstreamCaptureMode(tm);
                        if (tm >= 0) CHECK(cuThreadExchangeStreamCaptureMode(&old));
                        rc = int(alloc ? cuMemAlloc(&got, 5000) : op == 1 ? cuMemFree(pre) : cuMemFreeAsync(pre, other));
                        if (tm >= 0) CHECK(cuThreadExchangeStreamCaptureMode(&old));
                    };
                    if (same) act();
                    else std::thread(act).join();
                    CUstreamCaptureStatus status;
                    CHECK(cuStreamIsCapturing(s, &status));
                    CUgraph g;
                    const int end = int(cuStreamEndCapture(s, &g));
                    const std::string key = std::string(op_names[op]) + mode_names[cm] +
                                            (same ? "_same_" : "_other_") + (tm < 0 ? "default" : mode_names[tm]);
                    printf("%s_rc=%d\n%s_status=%d\n%s_end=%d\n", key.c_str(), rc, key.c_str(), int(status), key.c_str(), end);
                    if (alloc && rc == 0) CHECK(cuMemFree(got));
                    if (!alloc && rc != 0) CHECK(cuMemFree(pre));  // still the program's block
                    CHECK(cuStreamSynchronize(other));
                    CHECK(cuStreamDestroy(other));
                    CHECK(cuStreamDestroy(s));
                }
    // Captures begun by the first ABI (no mode: relaxed), found as an old program (dlsym) or a
    // runtime asking for an old version (cuGetProcAddress, plain and per-thread) would: allocations
    // are allowed, and the pool must know each capture is open (no sync, event record or query
    // inside it, however many frees pile up).
    using begin_v1 = CUresult (*)(CUstream);
    begin_v1 routes[3] = {reinterpret_cast<begin_v1>(dlsym(RTLD_DEFAULT, "cuStreamBeginCapture")), nullptr, nullptr};
    CHECK(cuGetProcAddress_v2("cuStreamBeginCapture", reinterpret_cast<void**>(&routes[1]), 10000, 0, nullptr));
    CHECK(cuGetProcAddress_v2("cuStreamBeginCapture", reinterpret_cast<void**>(&routes[2]), 10000,
                              CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, nullptr));
    int v1_rc = 0, v1_end = 0;
    for (begin_v1 v1 : routes) {
        if (!v1) fail("the first cuStreamBeginCapture ABI", -1);
        CUstream s;
        CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CHECK(v1(s));
        for (int i = 0; i < 64 && v1_rc == 0; ++i) {  // 256 MiB freed: far past the 32 MiB sync budget
            CUdeviceptr got = 0;
            v1_rc = int(cuMemAlloc(&got, 4u << 20));
            if (v1_rc == 0) v1_rc = int(cuMemFree(got));
        }
        CUgraph g;
        if (int e = int(cuStreamEndCapture(s, &g))) v1_end = e;
    }
    printf("v1_alloc_rc=%d\nv1_end=%d\n", v1_rc, v1_end);
    printf("v1_sync_in_capture=%llu\n", calls_in_capture());
    printf("refused=%llu\ndriver_cuMemAlloc=%llu\n", driver_count("unsafe_call_in_capture"), driver_count("cuMemAlloc_v2"));
}

// Pointer queries, IPC and bad frees on pooled blocks.
// Whether the emulated driver has memory under p (its cuMemAlloc allocation or a mapped chunk):
// printed as `<name>_mapped=`.
void print_mapped(const char* name, CUdeviceptr p) {
    using fn = int (*)(CUdeviceptr, int*, unsigned long long*, unsigned long long*);
    static fn f = reinterpret_cast<fn>(dlsym(RTLD_DEFAULT, "gpumem_emu_backing"));
    if (!f) fail("dlsym gpumem_emu_backing", -1);
    printf("%s_mapped=%d\n", name, f(p, nullptr, nullptr, nullptr) == 0);
}

// A signal handler frees a block while this thread is inside a driver allocation: under gpumem
// inside the pool's growth, its lock held (the emulated driver raises SIGUSR1 at the entry of
// cuMemAlloc_v2, cuMemAddressReserve or cuMemCreate, where a timer's signal may land).  The block
// freed starts a cuMemAlloc segment with GPUMEM_POOL_VMM=off, and another live block shares it.
// Alone the free is the driver's: success, and the other block keeps its memory.  `exit`: the
// handler then calls exit(0), as programs that end from a SIGINT handler do (whose atexit handlers
// free device memory, PyTorch's among them).  `reset`: the program resets the device next, before
// any other allocation or free (as one that stops on a SIGINT handler's flag may), then allocates
// and frees one block in the new context.  The handler also frees a pinned host block, which no
// pool holds (4000 B, cuMemAllocHost).
CUdeviceptr g_handler_a = 0, g_handler_b = 0;
void* g_handler_host = nullptr;
volatile sig_atomic_t g_handler_result = -1, g_handler_host_result = -1;
bool g_handler_exits = false;
void free_in_handler(bool then_exit, bool then_reset) {
    setup();
    g_handler_exits = then_exit;
    CHECK(cuMemAlloc(&g_handler_a, 1000));  // the first block of a small segment
    CHECK(cuMemAlloc(&g_handler_b, 5000));  // the next block of the same segment
    CHECK(cuMemAllocHost(&g_handler_host, 4000));
    signal(SIGUSR1, [](int) {
        g_handler_result = int(cuMemFree(g_handler_a));
        g_handler_host_result = int(cuMemFreeHost(g_handler_host));
        if (!g_handler_exits) return;
        printf("handler_free_result=%d\nhandler_host_free_result=%d\n", int(g_handler_result), int(g_handler_host_result));
        print_mapped("b", g_handler_b);
        exit(0);
    });
    using arm_fn = void (*)(const char*, int);
    auto arm = reinterpret_cast<arm_fn>(dlsym(RTLD_DEFAULT, "gpumem_emu_raise_in"));
    if (!arm) fail("dlsym gpumem_emu_raise_in", -1);
    arm("cuMemAlloc_v2,cuMemAddressReserve,cuMemCreate", SIGUSR1);
    CUdeviceptr c;
    CHECK(cuMemAlloc(&c, 64 << 20));  // no cached block holds it: the driver is asked
    printf("handler_free_result=%d\nhandler_host_free_result=%d\n", int(g_handler_result), int(g_handler_host_result));
    print_mapped("b", g_handler_b);
    if (then_reset) {
        CHECK(cuDevicePrimaryCtxReset(0));  // b and c die with the context; a was freed before
        setup();
        CUdeviceptr d;
        CHECK(cuMemAlloc(&d, 4096));
        CHECK(cuMemFree(d));
        printf("after_reset_ok=1\n");
        return;
    }
    CHECK(cuMemFree(g_handler_b));
    CHECK(cuMemFree(c));
    printf("free_again_result=%d\n", int(cuMemFree(g_handler_a)));  // freed by the handler: an error now
}

// A signal handler that calls exit() lands while this thread retains the primary context (inside
// the driver's cuDevicePrimaryCtxRetain, where gpumem holds its primary-context lock), and the
// program's atexit handler destroys the context it made itself, as a driver-API program that ends
// from a SIGTERM handler may.  Alone the destroy is the driver's: success.  A run that hangs is
// ended by SIGALRM after 10 s.
CUcontext g_own_ctx = nullptr;
void destroy_in_handler() {
    CUcontext primary = setup();
    CUdeviceptr a = 0;
    CHECK(cuMemAlloc(&a, 4096));  // a pool (and the log) exist
    CHECK(cuCtxCreate(&g_own_ctx, nullptr, 0, 0));  // current now
    CHECK(cuCtxSetCurrent(primary));
    alarm(10);
    atexit([] {
        printf("atexit_destroy_result=%d\n", int(cuCtxDestroy(g_own_ctx)));
        fflush(stdout);
    });
    signal(SIGUSR1, [](int) { exit(0); });
    using arm_fn = void (*)(const char*, int);
    auto arm = reinterpret_cast<arm_fn>(dlsym(RTLD_DEFAULT, "gpumem_emu_raise_in"));
    if (!arm) fail("dlsym gpumem_emu_raise_in", -1);
    arm("cuDevicePrimaryCtxRetain", SIGUSR1);
    CUcontext c = nullptr;
    cuDevicePrimaryCtxRetain(&c, 0);
    printf("handler_did_not_run=1\n");
}

// A signal handler that calls exit() lands inside a driver call the pool makes while it holds the
// stream set's lock (a fence's cuEventRecord or cuStreamQuery on the program's non-blocking stream),
// and the program's atexit handler destroys that stream, as a C++ program whose static stream
// object ends at exit may.  Alone no such call is made: the loop ends and the destroy comes at the
// normal exit.  A run that hangs is ended by SIGALRM after 10 s.  Prints whether the exit came from
// the handler (exit_from_handler: 0 alone, 1 where the pool made the call), so a run whose signal
// never landed is told from one that passed through the handler.
CUstream g_exit_stream = nullptr;
volatile sig_atomic_t g_exit_from_handler = 0;
void stream_destroy_in_handler() {
    setup();
    CHECK(cuStreamCreate(&g_exit_stream, CU_STREAM_NON_BLOCKING));
    alarm(10);
    atexit([] {
        printf("atexit_destroy_result=%d\nexit_from_handler=%d\n", int(cuStreamDestroy(g_exit_stream)),
               int(g_exit_from_handler));
        fflush(stdout);
    });
    signal(SIGUSR1, [](int) {
        g_exit_from_handler = 1;
        exit(0);
    });
    using arm_fn = void (*)(const char*, int);
    auto arm = reinterpret_cast<arm_fn>(dlsym(RTLD_DEFAULT, "gpumem_emu_raise_in"));
    if (!arm) fail("dlsym gpumem_emu_raise_in", -1);
    arm("cuEventRecord,cuStreamQuery", SIGUSR1);
    for (int i = 0; i < 200; ++i) {
        CUdeviceptr p;
        CHECK(cuMemAlloc(&p, 1u << 20));
        CHECK(cuMemFree(p));
    }
}

// A signal handler allocates while this thread is inside a hook (the emulated driver raises SIGUSR1
// at the entry of cuMemAlloc_v2, cuMemAddressReserve or cuMemCreate: inside the pool's growth, or
// with GPUMEM_POOL=off inside the hook's own driver call).  It makes one of each allocation and
// VMM call gpumem logs, each of its own size, and undoes some of them there: a handle made and
// released (b), a reference retained on handle a and given back, a second range reserved, mapped,
// unmapped and freed (w).  The program frees the rest afterwards, outside any handler.  `early`:
// the signal lands inside cuMemGetInfo's hook instead, before any allocation started the log.
struct handler_made {
    CUdeviceptr dev = 0, pitch = 0, managed = 0, async = 0, from_pool = 0, va = 0, wa = 0;
    void *host = nullptr, *host2 = nullptr;
    CUmemGenericAllocationHandle a = 0, b = 0, retained = 0;
    size_t pitch_bytes = 0;
};
handler_made g_made;
volatile sig_atomic_t g_made_result = -1, g_made_first_failed = 0;
void alloc_in_handler(bool early) {
    setup();
    signal(SIGUSR1, [](int) {
        CUmemAllocationProp prop = {};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        CUmemoryPool pool = nullptr;
        int step = 0;
        auto ok = [&step](CUresult r) {
            ++step;
            if (r != CUDA_SUCCESS && !g_made_first_failed) g_made_first_failed = step;
        };
        ok(cuMemAlloc(&g_made.dev, 3000));
        ok(cuMemAllocPitch(&g_made.pitch, &g_made.pitch_bytes, 100, 7, 4));
        ok(cuMemAllocManaged(&g_made.managed, 6000, CU_MEM_ATTACH_GLOBAL));
        ok(cuMemAllocAsync(&g_made.async, 7000, nullptr));
        ok(cuDeviceGetDefaultMemPool(&pool, 0));
        ok(cuMemAllocFromPoolAsync(&g_made.from_pool, 7500, pool, nullptr));
        ok(cuMemHostAlloc(&g_made.host, 8000, 0));
        ok(cuMemAllocHost(&g_made.host2, 9000));
        ok(cuMemCreate(&g_made.a, 2u << 20, &prop, 0));
        ok(cuMemAddressReserve(&g_made.va, 2u << 20, 0, 0, 0));
        ok(cuMemMap(g_made.va, 2u << 20, 0, g_made.a, 0));
        ok(cuMemRetainAllocationHandle(&g_made.retained, reinterpret_cast<void*>(g_made.va)));
        ok(cuMemRelease(g_made.retained));  // the reference retained: handle a lives on
        ok(cuMemCreate(&g_made.b, 4u << 20, &prop, 0));
        ok(cuMemAddressReserve(&g_made.wa, 4u << 20, 0, 0, 0));
        ok(cuMemMap(g_made.wa, 4u << 20, 0, g_made.b, 0));
        ok(cuMemUnmap(g_made.wa, 4u << 20));
        ok(cuMemAddressFree(g_made.wa, 4u << 20));
        ok(cuMemRelease(g_made.b));
        ok(cuMemRetainAllocationHandle(&g_made.retained, reinterpret_cast<void*>(g_made.va)));  // given back below
        g_made_result = step;
    });
    using arm_fn = void (*)(const char*, int);
    auto arm = reinterpret_cast<arm_fn>(dlsym(RTLD_DEFAULT, "gpumem_emu_raise_in"));
    if (!arm) fail("dlsym gpumem_emu_raise_in", -1);
    CUdeviceptr c;
    if (early) {
        // Inside cuMemGetInfo's hook, before the program's first allocation has started the log.
        arm("cuMemGetInfo_v2", SIGUSR1);
        size_t free_b = 0, total_b = 0;
        CHECK(cuMemGetInfo(&free_b, &total_b));
        CHECK(cuMemAlloc(&c, 64 << 20));
    } else {
        arm("cuMemAlloc_v2,cuMemAddressReserve,cuMemCreate", SIGUSR1);
        CHECK(cuMemAlloc(&c, 64 << 20));  // no cached block holds it: the driver is asked
    }
    printf("handler_steps=%d\nhandler_first_failed=%d\n", int(g_made_result), int(g_made_first_failed));
    printf("pitch=%zu\n", g_made.pitch_bytes);
    CHECK(cuMemFree(g_made.dev));
    CHECK(cuMemFree(g_made.pitch));
    CHECK(cuMemFree(g_made.managed));
    CHECK(cuMemFreeAsync(g_made.async, nullptr));
    CHECK(cuMemFreeAsync(g_made.from_pool, nullptr));
    CHECK(cuMemFreeHost(g_made.host));
    CHECK(cuMemFreeHost(g_made.host2));
    CHECK(cuMemRelease(g_made.retained));  // the handler's second retain
    CHECK(cuMemUnmap(g_made.va, 2u << 20));
    CHECK(cuMemAddressFree(g_made.va, 2u << 20));
    CHECK(cuMemRelease(g_made.a));  // its last reference: handle a's free
    CHECK(cuMemFree(c));
}

// A signal handler that calls exit() lands inside a driver call the pool makes while it holds its
// lock outside any hook of gpumem's guard (the drain of GPUMEM_REUSE=auto's switch to safe reuse,
// which the program's first non-blocking stream starts: a synchronize, an event recorded or waited
// on), and the program's atexit handler enables device 1's access to device 0's context, whose
// pool that is (run with GPUMEM_EMU_DEVICES=2).  Alone no such call is made: the program ends and
// the enable comes at the normal exit.  A run that hangs is ended by SIGALRM after 10 s.  Prints
// exit_from_handler as stream-destroy-in-handler does.
CUcontext g_peer_c0 = nullptr, g_peer_c1 = nullptr;
void peer_in_handler() {
    g_peer_c0 = setup();
    CHECK(cuDevicePrimaryCtxRetain(&g_peer_c1, 1));
    CUdeviceptr a = 0;
    CHECK(cuMemAlloc(&a, 1u << 20));  // device 0's pool holds a segment: the switch drains it
    alarm(10);
    atexit([] {
        CHECK(cuCtxSetCurrent(g_peer_c1));
        printf("atexit_enable_result=%d\nexit_from_handler=%d\n", int(cuCtxEnablePeerAccess(g_peer_c0, 0)),
               int(g_exit_from_handler));
        fflush(stdout);
    });
    signal(SIGUSR1, [](int) {
        g_exit_from_handler = 1;
        exit(0);
    });
    using arm_fn = void (*)(const char*, int);
    auto arm = reinterpret_cast<arm_fn>(dlsym(RTLD_DEFAULT, "gpumem_emu_raise_in"));
    if (!arm) fail("dlsym gpumem_emu_raise_in", -1);
    arm("cuCtxSynchronize,cuStreamSynchronize,cuEventRecord,cuEventQuery,cuEventSynchronize,cuStreamQuery", SIGUSR1);
    CUstream s = nullptr;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
}

// A signal handler makes a non-blocking stream while this thread is inside the pool's growth (the
// emulated driver raises SIGUSR1 at the entry of cuMemAlloc_v2, cuMemAddressReserve or
// cuMemCreate), where the pool's lock is this thread's.  The program goes on allocating and
// freeing: GPUMEM_REUSE=auto must switch to safe reuse for that stream (reuse_safe in the log), as
// for one made anywhere else.  Prints the handler's cuStreamCreate result.
CUstream g_handler_stream = nullptr;
volatile sig_atomic_t g_handler_stream_result = -1;
void stream_in_handler() {
    setup();
    CUdeviceptr a = 0;
    CHECK(cuMemAlloc(&a, 1u << 20));  // a pool (and the log) exist
    signal(SIGUSR1, [](int) { g_handler_stream_result = int(cuStreamCreate(&g_handler_stream, CU_STREAM_NON_BLOCKING)); });
    using arm_fn = void (*)(const char*, int);
    auto arm = reinterpret_cast<arm_fn>(dlsym(RTLD_DEFAULT, "gpumem_emu_raise_in"));
    if (!arm) fail("dlsym gpumem_emu_raise_in", -1);
    arm("cuMemAlloc_v2,cuMemAddressReserve,cuMemCreate", SIGUSR1);
    CUdeviceptr c = 0;
    CHECK(cuMemAlloc(&c, 64 << 20));  // no cached block holds it: the pool grows
    printf("handler_stream_result=%d\n", int(g_handler_stream_result));
    CHECK(cuMemFree(c));
    CUdeviceptr b = 0;
    CHECK(cuMemAlloc(&b, 1u << 20));  // a pool call after the handler's
    CHECK(cuMemFree(b));
    CHECK(cuMemFree(a));
    CHECK(cuStreamDestroy(g_handler_stream));
}

// Signal handlers free pooled blocks while this thread opens and closes stream captures, over and
// over: a timer signals this thread every 50 us (CLOCK_MONOTONIC, SIGEV_THREAD_ID) until 20,000
// handlers ran, so they land anywhere in the capture hooks, gpumem's capture table's lock among
// them (held while the table notes a capture opened or closed).  A relaxed capture of another
// stream stays open throughout, so a free asks the table every time; the captures are relaxed, so
// the driver lets every free through, and so must gpumem.  Run with GPUMEM_REUSE=immediate (a free
// then makes no driver call).  A handler that waits for the table's lock its thread holds hangs
// the run, which SIGALRM ends after 30 s.  Prints the frees that failed (0) and the handlers run.
constexpr int k_signal_frees = 20000;
CUdeviceptr g_signal_blocks[k_signal_frees];
volatile sig_atomic_t g_signal_failed = 0;
std::atomic<int> g_signals_handled{0};
// Starts the handlers: SIGUSR1 to this thread every 50 us, each handler freeing the next of
// g_signal_blocks (a failed free counted), and alarm(30) to end a hang.
timer_t start_signal_frees() {
    struct sigaction sa = {};
    sa.sa_handler = [](int) {
        const int i = g_signals_handled.load(std::memory_order_relaxed);
        if (i < k_signal_frees && cuMemFree(g_signal_blocks[i]) != CUDA_SUCCESS) g_signal_failed = g_signal_failed + 1;
        g_signals_handled.store(i + 1, std::memory_order_release);
    };
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, nullptr);
    alarm(30);
    sigevent sev = {};
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = SIGUSR1;
    sev._sigev_un._tid = pid_t(syscall(SYS_gettid));  // sigev_notify_thread_id, which glibc 2.36 does not name
    timer_t timer;
    if (timer_create(CLOCK_MONOTONIC, &sev, &timer) != 0) fail("timer_create", errno);
    itimerspec every = {{0, 50000}, {0, 50000}};
    if (timer_settime(timer, 0, &every, nullptr) != 0) fail("timer_settime", errno);
    return timer;
}
// Stops them, then makes a pool call, which carries out the frees a handler left waiting.
void end_signal_frees(timer_t timer) {
    timer_delete(timer);
    CUdeviceptr last = 0;
    CHECK(cuMemAlloc(&last, 256));
    CHECK(cuMemFree(last));
}
void capture_signals() {
    setup();
    for (auto& b : g_signal_blocks) CHECK(cuMemAlloc(&b, 256));
    CUstream s = nullptr, held = nullptr;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamCreate(&held, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamBeginCapture(held, CU_STREAM_CAPTURE_MODE_RELAXED));
    const timer_t timer = start_signal_frees();
    long rounds = 0;
    while (g_signals_handled.load(std::memory_order_acquire) < k_signal_frees) {
        CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
        CUgraph g = nullptr;
        CHECK(cuStreamEndCapture(s, &g));
        ++rounds;
    }
    CUgraph g = nullptr;  // (a handler past the last block frees nothing)
    CHECK(cuStreamEndCapture(held, &g));
    end_signal_frees(timer);
    printf("signal_frees_failed=%d\nsignals_handled_enough=%d\n", int(g_signal_failed),
           int(g_signals_handled.load() >= k_signal_frees));
    fprintf(stderr, "capture rounds: %ld\n", rounds);
}

// A context's end walks the live exports under the exporter's lock (ipc_pool_dropped), from
// cuCtxDestroy, which takes no guard: a timer signals this thread every 50 us while it makes and
// destroys contexts (each with a pool of its own) and 4,000 exports of the primary context's
// blocks stay live; each handler frees a pooled block, which ends its export if any
// (ipc_block_freed, the same lock).  alarm(30) ends a hang.
void ipc_drop_signals() {
    const CUcontext primary = setup();
    for (auto& b : g_signal_blocks) CHECK(cuMemAlloc(&b, 256));
    std::vector<CUdeviceptr> exported(4000);
    int exports_failed = 0;
    for (auto& p : exported) {
        CHECK(cuMemAlloc(&p, 256));
        CUipcMemHandle h;
        if (cuIpcGetMemHandle(&h, p) != CUDA_SUCCESS) ++exports_failed;
    }
    const timer_t timer = start_signal_frees();
    long rounds = 0;
    while (g_signals_handled.load(std::memory_order_acquire) < k_signal_frees) {
        CUcontext c = nullptr;
        CHECK(cuCtxCreate(&c, nullptr, 0, 0));
        CUdeviceptr p = 0;
        CHECK(cuMemAlloc(&p, 256));  // c's own pool: its end drops that pool's exports (none)
        CHECK(cuMemFree(p));
        CHECK(cuCtxDestroy(c));
        CHECK(cuCtxSetCurrent(primary));
        ++rounds;
    }
    end_signal_frees(timer);
    for (CUdeviceptr p : exported) CHECK(cuMemFree(p));
    printf("exports_failed=%d\nsignal_frees_failed=%d\nsignals_handled_enough=%d\n", exports_failed,
           int(g_signal_failed), int(g_signals_handled.load() >= k_signal_frees));
    fprintf(stderr, "context rounds: %ld\n", rounds);
}

void query() {
    setup();
    CUdeviceptr a, b;
    CHECK(cuMemAlloc(&a, 1000));  // the first block of a small segment
    CHECK(cuMemAlloc(&b, 5000));  // the next block of the same segment
    CUdeviceptr base = 0;
    size_t size = 0;
    int r = int(cuMemGetAddressRange(&base, &size, b + 100));
    printf("range_result=%d\nrange_base_is_b=%d\nrange_size=%zu\n", r, base == b, size);
    CUdeviceptr start = 0;
    size_t rsize = 0;
    int ordinal = -1;
    CHECK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, b + 10));
    CHECK(cuPointerGetAttribute(&rsize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, b + 10));
    CHECK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, b + 10));
    printf("attr_start_is_b=%d\nattr_size=%zu\nattr_ordinal=%d\n", start == b, rsize, ordinal);
    CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                   CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    start = 0;
    rsize = 0;
    ordinal = -1;
    void* data[] = {&start, &rsize, &ordinal};
    CHECK(cuPointerGetAttributes(3, attrs, data, a + 1));
    printf("attrs_start_is_a=%d\nattrs_size=%zu\nattrs_ordinal=%d\n", start == a, rsize, ordinal);
    // The mapping a registration would cover: the block, never its segment or one chunk.
    void* map_base = nullptr;
    size_t map_size = 0;
    CHECK(cuPointerGetAttribute(&map_base, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, b + 10));
    CHECK(cuPointerGetAttribute(&map_size, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, b + 10));
    printf("mapping_base_is_b=%d\nmapping_size=%zu\n", map_base == reinterpret_cast<void*>(b), map_size);
    CUpointer_attribute map_attrs[] = {CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, CU_POINTER_ATTRIBUTE_MAPPING_SIZE};
    map_base = nullptr;
    map_size = 0;
    void* map_data[] = {&map_base, &map_size};
    CHECK(cuPointerGetAttributes(2, map_attrs, map_data, a + 1));
    printf("mappings_base_is_a=%d\nmappings_size=%zu\n", map_base == reinterpret_cast<void*>(a), map_size);
    int capable_b = 0;  // the driver writes a boolean: the rest of the int stays 0
    printf("ipc_capable_result=%d\n", int(cuPointerGetAttribute(&capable_b, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, b)));
    printf("ipc_capable_b=%d\n", capable_b);
    CUipcMemHandle h;
    printf("ipc_a_result=%d\n", int(cuIpcGetMemHandle(&h, a)));
    printf("ipc_b_result=%d\n", int(cuIpcGetMemHandle(&h, b)));
    printf("free_interior_result=%d\n", int(cuMemFree(a + 512)));
    CHECK(cuMemFree(b));
    printf("range_after_free_result=%d\n", int(cuMemGetAddressRange(&base, &size, b)));
    printf("double_free_result=%d\n", int(cuMemFree(b)));
    printf("free_null_result=%d\n", int(cuMemFree(0)));
    printf("free_unknown_result=%d\n", int(cuMemFree(CUdeviceptr(0x1000))));
    CHECK(cuMemFree(a));
}

// Answers at the edges, each line the same with and without the pool: requests of 0 bytes and of
// sizes no device holds, and pointer queries at a block's last byte and just past the bytes the
// program asked for, inside the block's rounding (the driver knows no address there).
void edges() {
    const CUcontext current = setup();
    size_t free_b = 0, total = 0;
    CHECK(cuMemGetInfo(&free_b, &total));
    const unsigned long long sizes[] = {0, ~0ull, ~0ull - 255, 1ull << 63, (1ull << 48) + 1, total + 1};
    const char* names[] = {"0", "2^64-1", "2^64-256", "2^63", "2^48+1", "total+1"};
    for (int i = 0; i < 6; ++i) {
        CUdeviceptr p = 0;
        const int r = int(cuMemAlloc(&p, size_t(sizes[i])));
        printf("alloc_%s=%d\n", names[i], r);
        if (r == 0) CHECK(cuMemFree(p));
    }
    CUdeviceptr a, b, e;
    CHECK(cuMemAlloc(&a, 1000));
    CHECK(cuMemAlloc(&b, 1000));
    CHECK(cuMemAlloc(&e, (3u << 20) + 100));
    struct at {
        const char* name;
        CUdeviceptr base, p;
    } points[] = {{"a+0", a, a}, {"a+999", a, a + 999}, {"a+1000", a, a + 1000}, {"a+1023", a, a + 1023},
                  {"e+last", e, e + (3u << 20) + 99}, {"e+size", e, e + (3u << 20) + 100}, {"e+size+411", e, e + (3u << 20) + 511}};
    for (const at& x : points) {
        if (x.p >= b && x.p < b + 1000) continue;  // b's own bytes
        CUdeviceptr base = 0;
        size_t size = 0;
        const int r = int(cuMemGetAddressRange(&base, &size, x.p));
        printf("range_%s=%d base_ok=%d size=%zu\n", x.name, r, r == 0 && base == x.base, r == 0 ? size : 0);
        CUdeviceptr start = 0;
        size_t rsize = 0;
        int ordinal = -1;
        const int r1 = int(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, x.p));
        const int r2 = int(cuPointerGetAttribute(&rsize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, x.p));
        const int r3 = int(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, x.p));
        printf("attr_%s=%d,%d,%d start_ok=%d size=%zu\n", x.name, r1, r2, r3, r1 == 0 && start == x.base, r2 == 0 ? rsize : 0);
        CUpointer_attribute list[] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
        start = 0;
        rsize = 0;
        void* data[] = {&start, &rsize};
        const int r4 = int(cuPointerGetAttributes(2, list, data, x.p));
        printf("attrs_%s=%d start_ok=%d size=%zu\n", x.name, r4, start == x.base, rsize);
        CUipcMemHandle h;
        printf("ipc_%s=%d\n", x.name, int(cuIpcGetMemHandle(&h, x.p)));
        // The context that allocated it, alone and in a list.
        CUcontext ctx = nullptr, listed = nullptr;
        const int r5 = int(cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, x.p));
        CUpointer_attribute ctx_list[] = {CU_POINTER_ATTRIBUTE_CONTEXT};
        void* ctx_data[] = {&listed};
        const int r6 = int(cuPointerGetAttributes(1, ctx_list, ctx_data, x.p));
        printf("ctx_%s=%d,%d is_current=%d,%d\n", x.name, r5, r6, ctx == current, listed == current);
    }
    printf("free_a+1000=%d\n", int(cuMemFree(a + 1000)));
    CHECK(cuMemFree(a));
    CHECK(cuMemFree(b));
    CHECK(cuMemFree(e));
}

// The exporting half of a two-process IPC test: n blocks of `size` bytes, kept, and the last one's
// IPC handle (128 hex digits) with where its first and last bytes lie.  Then it waits for a line on
// stdin (the importer is done: the memory must stay alive until then) and frees everything.
void ipc_export(long n, size_t size) {
    setup();
    if (n < 1 || size < 1) fail("ipc-export arguments", -1);
    std::vector<CUdeviceptr> blocks;
    for (long i = 0; i < n; ++i) {
        CUdeviceptr p;
        CHECK(cuMemAlloc(&p, size));
        blocks.push_back(p);
    }
    // The last block, and (keys with a 2) the one before it: with n >= 3 both lie inside one
    // segment, whose single real handle both must share.
    for (int k = 0; k < (n >= 2 ? 2 : 1); ++k) {
        const CUdeviceptr b = blocks[blocks.size() - 1 - size_t(k)];
        const std::string sfx = k ? "2" : "";
        CUipcMemHandle h;
        memset(&h, 0, sizeof h);
        printf("ipc%s_result=%d\nhandle%s=", sfx.c_str(), int(cuIpcGetMemHandle(&h, b)), sfx.c_str());
        for (size_t i = 0; i < sizeof h.reserved; ++i) printf("%02x", unsigned(static_cast<unsigned char>(h.reserved[i])));
        printf("\n");
        print_backing(("backing" + sfx + "_").c_str(), b);
        print_backing(("backing" + sfx + "_last_").c_str(), b + size - 1, false);
    }
    fflush(stdout);
    char line[256];
    const bool got_line = fgets(line, sizeof line, stdin) != nullptr;
    (void)got_line;  // a line or the end of input: either ends the wait
    int freed = 0;
    for (CUdeviceptr p : blocks) {
        int r = int(cuMemFree(p));
        if (r != 0 && freed == 0) freed = r;
    }
    printf("free_result=%d\n", freed);
}

// The importing half: opens the exporter's handle (`hex`, as ipc-export printed it) and says where
// its first and last bytes (of `size`) land, then closes it.  A refused open is a result, not a
// failure: open_result tells.
CUipcMemHandle parse_handle(const std::string& hex) {
    CUipcMemHandle h;
    if (hex.size() != 2 * sizeof h.reserved) fail("ipc-import handle length", int(hex.size()));
    auto nibble = [&](size_t at) {
        const unsigned char c = static_cast<unsigned char>(hex[at]);
        if (!isxdigit(c)) fail("ipc-import handle digits", int(at));
        return unsigned(isdigit(c) ? c - '0' : tolower(c) - 'a' + 10);
    };
    for (size_t i = 0; i < sizeof h.reserved; ++i) h.reserved[i] = char(nibble(2 * i) << 4 | nibble(2 * i + 1));
    return h;
}

// The driver's first ABI of the open, by its own name (cuda.h renames cuIpcOpenMemHandle to _v2):
// what a program built against a cuda.h before 11.0 links.
extern "C" CUresult cuIpcOpenMemHandle_first_abi(CUdeviceptr*, CUipcMemHandle, unsigned int) __asm__("cuIpcOpenMemHandle");

// With `hex2` (ipc-export's handle2) both are open at once before either closes: keys with a 2.
// `how`: "capture": the first close happens inside a stream capture; "v1": both opens call the
// first ABI by its name; "v1-resolved": through what cuGetProcAddress hands out for CUDA 10.0.
// Each ABI's calls that reached the driver are printed as abi_v1/abi_v2.
void ipc_import(const std::string& hex, size_t size, const std::string& hex2, const std::string& how) {
    setup();
    const bool in_capture = how == "capture";
    using open_fn = CUresult (*)(CUdeviceptr*, CUipcMemHandle, unsigned int);
    open_fn open = &cuIpcOpenMemHandle;  // the _v2
    if (how == "v1") open = &cuIpcOpenMemHandle_first_abi;
    if (how == "v1-resolved") {
        void* fn = nullptr;
        CUdriverProcAddressQueryResult q;
        CHECK(cuGetProcAddress_v2("cuIpcOpenMemHandle", &fn, 10000, 0, &q));
        open = reinterpret_cast<open_fn>(fn);
    }
    CUdeviceptr p = 0, p2 = 0;
    int r = int(open(&p, parse_handle(hex), CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    printf("open_result=%d\n", r);
    int r2 = -1;
    if (!hex2.empty()) {
        r2 = int(open(&p2, parse_handle(hex2), CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
        printf("open2_result=%d\n", r2);
    }
    printf("abi_v1=%llu\nabi_v2=%llu\n", driver_count("cuIpcOpenMemHandle"), driver_count("cuIpcOpenMemHandle_v2"));
    if (r == 0) {
        print_backing("backing_", p);
        print_backing("backing_last_", p + size - 1, false);
    }
    if (r2 == 0) {
        print_backing("backing2_", p2);
        print_backing("backing2_last_", p2 + size - 1, false);
    }
    if (r == 0 && in_capture) {
        // Closed while a stream capture is open: no sync and no unmap may happen in it, and the
        // close must still succeed; the mapping goes once the capture ends.
        CUstream st;
        CHECK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
        CHECK(cuStreamBeginCapture(st, CU_STREAM_CAPTURE_MODE_GLOBAL));
        printf("close_result=%d\n", int(cuIpcCloseMemHandle(p)));
        print_backing("during_capture_", p);
        printf("sync_in_capture=%llu\n", driver_count("cuCtxSynchronize_in_capture"));
        CUgraph g;
        CHECK(cuStreamEndCapture(st, &g));
        print_backing("after_capture_", p);
    } else if (r == 0) {
        printf("close_result=%d\n", int(cuIpcCloseMemHandle(p)));
    }
    if (r2 == 0) {
        print_backing("backing2_after_close_", p2);  // still mapped: the other open holds it
        printf("close2_result=%d\n", int(cuIpcCloseMemHandle(p2)));
    }
}

// A green context's pooled block shared through legacy IPC before the green context's destruction
// and opened by another process after it (its primary context lives on): two 5000 B blocks
// allocated with the green context's CUcontext current, the second exported (an interior block: a
// gpumem handle with the pool on, VMM on or off), the primary context current, cuGreenCtxDestroy,
// then `ipc-import` run in a child process (its own lines: open_result, backing_*, close_result).
// Prints the export's answer, where the block lies (export_backing_*), the child's exit status,
// and how many times this process made the dead green context current or called the driver in
// it from the destruction on (the export server's work included).
void green_ipc_late() {
    const CUcontext primary = setup();
    CUgreenCtx g = nullptr;
    green_current(&g);
    CUdeviceptr a = 0, b = 0;
    CHECK(cuMemAlloc(&a, 5000));
    CHECK(cuMemAlloc(&b, 5000));
    CUipcMemHandle h;
    memset(&h, 0, sizeof h);
    printf("export_ipc_result=%d\n", int(cuIpcGetMemHandle(&h, b)));
    print_backing("export_backing_", b);
    CHECK(cuCtxSetCurrent(primary));
    CHECK(cuGreenCtxDestroy(g));
    const unsigned long long made_current = driver_count("dead_green_made_current");
    const unsigned long long called = driver_count("call_in_dead_green_context");
    std::string hex;
    char digits[3];
    for (size_t i = 0; i < sizeof h.reserved; ++i) {
        snprintf(digits, sizeof digits, "%02x", unsigned(static_cast<unsigned char>(h.reserved[i])));
        hex += digits;
    }
    fflush(stdout);
    const pid_t child = fork();
    if (child < 0) fail("fork", errno);
    if (child == 0) {
        execl("/proc/self/exe", "emu_pool_app", "ipc-import", hex.c_str(), "5000", static_cast<char*>(nullptr));
        _exit(127);
    }
    int status = 0;
    if (waitpid(child, &status, 0) != child) fail("waitpid", errno);
    printf("import_exit=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    printf("dead_green_made_current=%llu\ncall_in_dead_green_context=%llu\n", driver_count("dead_green_made_current") - made_current,
           driver_count("call_in_dead_green_context") - called);
    printf("free_a=%d\nfree_b=%d\n", int(cuMemFree(a)), int(cuMemFree(b)));
}

// Whether a kernel of device `dev` may touch p, as the emulated driver says (1, 0, -1 unmapped).
int emu_access(CUdeviceptr p, int dev) {
    using fn = int (*)(CUdeviceptr, int);
    static fn f = reinterpret_cast<fn>(dlsym(RTLD_DEFAULT, "gpumem_emu_access"));
    if (!f) fail("dlsym gpumem_emu_access", -1);
    return f(p, dev);
}

// Peer access (needs GPUMEM_EMU_DEVICES=2): device 1's context enables access to device 0's, which
// opens device 0's cudaMalloc memory to device 1.  A block device 0 allocated before the enable,
// and one after, must be usable from device 1 then, pooled or not.  And the memory is no
// cuMemCreate allocation to the program: cuMemRetainAllocationHandle refuses it.
// With `early`, the enable comes before device 0's first allocation (before its pool exists).
void peer(bool early) {
    CUcontext c0 = setup();
    CUdeviceptr a, big;
    const size_t big_size = size_t(64) << 20;
    CUcontext c1;
    CHECK(cuDevicePrimaryCtxRetain(&c1, 1));
    if (!early) {
        CHECK(cuMemAlloc(&a, 5000));
        printf("before_access=%d\n", emu_access(a, 1));
    }
    CHECK(cuCtxSetCurrent(c1));
    printf("enable_result=%d\n", int(cuCtxEnablePeerAccess(c0, 0)));
    CHECK(cuCtxSetCurrent(c0));
    if (early) CHECK(cuMemAlloc(&a, 5000));
    CHECK(cuMemAlloc(&big, big_size));
    printf("access_a=%d\naccess_big=%d\naccess_big_last=%d\n", emu_access(a, 1), emu_access(big, 1),
           emu_access(big + big_size - 1, 1));
    CUmemGenericAllocationHandle h = 0;
    printf("retain_result=%d\n", int(cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(uintptr_t(a)))));
    CHECK(cuMemFree(a));
    CHECK(cuMemFree(big));
}

// Peer access to device 0's primary context and a green context's blocks (needs
// GPUMEM_EMU_DEVICES=2): memory allocated with a green context of device 0 current is the primary
// context's (tests/gpu/green_free.cu on an H100), so device 1's context enabling access to the
// primary context opens it to device 1, as it opens the primary context's own.  A block of the
// green context is kept across its destruction (the primary context lives on).  The enable comes
// `when`: "early", before the green context's first allocation; "live", after it, while the green
// context lives; "late", after its destruction.  Prints whether device 1 may touch the block while
// the green context lives (after the enable) and after its destruction, and the late free's answer.
void green_peer(const std::string& when) {
    const CUcontext c0 = setup();
    CUcontext c1 = nullptr;
    CHECK(cuDevicePrimaryCtxRetain(&c1, 1));
    auto enable = [&] {
        CUcontext back = nullptr;
        CHECK(cuCtxGetCurrent(&back));
        CHECK(cuCtxSetCurrent(c1));
        printf("enable_result=%d\n", int(cuCtxEnablePeerAccess(c0, 0)));
        CHECK(cuCtxSetCurrent(back));
    };
    if (when == "early") enable();
    CUgreenCtx g = nullptr;
    green_current(&g);
    CUdeviceptr a = 0;
    CHECK(cuMemAlloc(&a, 4u << 20));
    if (when == "live") enable();
    if (when != "late") printf("live_access=%d\n", emu_access(a, 1));
    CHECK(cuCtxSetCurrent(c0));
    CHECK(cuGreenCtxDestroy(g));
    if (when == "late") enable();
    const int access = emu_access(a, 1);  // before the free: argument order is unspecified
    printf("access=%d\nlate_free_rc=%d\n", access, int(cuMemFree(a)));
}

// Peer access to a context that ends, and the context made next with its handle (run with
// GPUMEM_EMU_DEVICES=2 and GPUMEM_EMU_CONTEXT_REUSE=1): device 1's primary context enables access
// to a context of device 0, which allocates 4 MiB (device 1 may touch it), frees it and ends; the
// next context with the handle allocates 4 MiB, which device 1 may not touch (the emulated driver
// ends peer access with the peer context), until device 1 enables access to that context in turn.  `how`:
//   made:    a context cuCtxCreate made, destroyed; cuCtxCreate gets its handle again.
//   reset:   device 0's primary context, reset; a retain makes it anew (the same handle).
//   release: device 0's primary context, ended by its last release; a retain makes it anew.
//   green:   a green context's own CUcontext is the one named (its memory is the primary
//            context's); the green context is destroyed and cuCtxCreate gets that handle.
// Prints the enables' answers, whether the handle came again and device 1's access to each block.
void peer_reuse(const std::string& how) {
    const CUcontext c0 = setup();
    CUcontext c1 = nullptr;
    CHECK(cuDevicePrimaryCtxRetain(&c1, 1));
    auto enable = [&](const char* key, CUcontext peer) {
        CUcontext back = nullptr;
        CHECK(cuCtxGetCurrent(&back));
        CHECK(cuCtxSetCurrent(c1));
        printf("%s=%d\n", key, int(cuCtxEnablePeerAccess(peer, 0)));
        CHECK(cuCtxSetCurrent(back));
    };
    CUcontext first = c0;
    CUgreenCtx g = nullptr;
    if (how == "made") CHECK(cuCtxCreate(&first, nullptr, 0, 0));  // current now
    if (how == "green") first = green_current(&g);
    enable("first_enable_rc", first);
    CUdeviceptr a = 0, b = 0, c = 0;
    CHECK(cuMemAlloc(&a, 4u << 20));
    printf("first_access=%d\n", emu_access(a, 1));
    CHECK(cuMemFree(a));
    CUcontext next = nullptr;
    if (how == "made") {
        CHECK(cuCtxDestroy(first));
        CHECK(cuCtxCreate(&next, nullptr, 0, 0));
    } else if (how == "green") {
        CHECK(cuCtxSetCurrent(c0));
        CHECK(cuGreenCtxDestroy(g));
        CHECK(cuCtxCreate(&next, nullptr, 0, 0));
    } else {
        if (how == "reset") CHECK(cuDevicePrimaryCtxReset(0));
        else for (int i = 0; i < 2; ++i) CHECK(cuDevicePrimaryCtxRelease(0));  // setup's and the program's
        unsigned flags = 0;
        int active = -1;
        CHECK(cuDevicePrimaryCtxGetState(0, &flags, &active));
        printf("ended=%d\n", int(active == 0));
        CHECK(cuDevicePrimaryCtxRetain(&next, 0));
        CHECK(cuCtxSetCurrent(next));
    }
    printf("same_handle=%d\n", int(next == first));
    CHECK(cuMemAlloc(&b, 4u << 20));
    printf("next_access=%d\n", emu_access(b, 1));
    enable("next_enable_rc", next);
    CHECK(cuMemAlloc(&c, 4u << 20));
    const int b_access = emu_access(b, 1), c_access = emu_access(c, 1);
    printf("next_access_after_enable=%d\nlater_access=%d\n", b_access, c_access);
    CHECK(cuMemFree(b));
    CHECK(cuMemFree(c));
    if (next != c0) CHECK(cuCtxDestroy(next));
}

// The primary context is reset, then destroyed: each time the pool forgets that context's memory
// (the driver freed it) and starts afresh.
void reset() {
    setup();
    CUdeviceptr p, q;
    CHECK(cuMemAlloc(&p, 1 << 20));
    print_counts("before_");
    CHECK(cuDevicePrimaryCtxReset(0));
    CUcontext ctx = setup();
    CHECK(cuMemAlloc(&q, 1 << 20));
    print_counts("after_reset_");
    // p died with the context; its free is the driver's business, as without gpumem.
    printf("free_dead_result=%d\n", int(cuMemFree(p)));
    // A primary context cannot be destroyed (CUDA_ERROR_INVALID_CONTEXT): it lives on, and so must
    // q, which the pool must neither forget nor give back.
    printf("destroy_result=%d\n", int(cuCtxDestroy(ctx)));
    CUdeviceptr base = 0;
    size_t size = 0;
    const int range_rc = int(cuMemGetAddressRange(&base, &size, q));
    printf("live_range_result=%d\nlive_range_is_q=%d\n", range_rc, int(base == q));  // the call first: argument order is unspecified
    printf("live_access=%d\n", emu_access(q, 0));
    printf("live_free_result=%d\n", int(cuMemFree(q)));
    CHECK(cuMemAlloc(&q, 1 << 20));
    CHECK(cuMemFree(q));
    print_counts("after_destroy_");
}

// A primary context reset while its handle stays current (the program keeps its retain): until a
// retain makes the context anew, the driver refuses an allocation and a free there with
// CUDA_ERROR_CONTEXT_IS_DESTROYED (709); after it, both work again.  Each line is the same with and
// without gpumem.  first: the reset comes before the program's first allocation, when no pool
// exists yet (the stale handle's first allocation would make one).
void reset_stale(bool first) {
    const CUcontext ctx = setup();
    CUdeviceptr p = 0, q = 0, r = 0;
    if (!first) {
        CHECK(cuMemAlloc(&p, 1 << 20));
        CHECK(cuMemAlloc(&q, 4096));
        CHECK(cuMemFree(q));  // a cached block, under the pool
    }
    CHECK(cuDevicePrimaryCtxReset(0));
    unsigned flags = 0;
    int active = -1;
    CHECK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    printf("active_after_reset=%d\n", active);
    const int stale_small = int(cuMemAlloc(&q, 4096));
    const int stale_large = int(cuMemAlloc(&r, 64u << 20));
    printf("stale_alloc_result=%d\nstale_large_alloc_result=%d\n", stale_small, stale_large);
    if (!first) printf("stale_free_dead_result=%d\n", int(cuMemFree(p)));
    CUcontext again = nullptr;
    CHECK(cuDevicePrimaryCtxRetain(&again, 0));
    printf("same_handle=%d\n", again == ctx);
    const int after = int(cuMemAlloc(&q, 4096));
    printf("alloc_after_retain_result=%d\n", after);
    if (after == 0) printf("free_after_retain_result=%d\n", int(cuMemFree(q)));
}

// GPUMEM_REUSE=auto: a freed block comes back at once while all work is in one issue order, which
// one blocking stream (cuStreamCreate, flags 0) keeps.  The switching stream comes next, made through
// cuGetProcAddress as a runtime would: a non-blocking one, or with `second` == "blocking" a second
// blocking one.  After it, frees wait for a sync.
void auto_reuse(const std::string& second) {
    setup();
    const size_t mb20 = 20u << 20;
    CUdeviceptr a, b, c, d, e;
    CHECK(cuMemAlloc(&a, mb20));
    CHECK(cuMemFree(a));
    CHECK(cuMemAlloc(&b, mb20));
    printf("reused_before_stream=%d\n", a == b);
    print_counts("before_");
    CUstream s0;
    CHECK(cuStreamCreate(&s0, CU_STREAM_DEFAULT));
    CHECK(cuMemFree(b));
    CHECK(cuMemAlloc(&c, mb20));
    printf("reused_after_blocking=%d\n", c == b);
    print_counts("blocking_");
    void* fn = nullptr;
    CUdriverProcAddressQueryResult q;
    CHECK(cuGetProcAddress_v2("cuStreamCreateWithPriority", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &q));
    CUstream s;
    const unsigned flags = second == "blocking" ? CU_STREAM_DEFAULT : CU_STREAM_NON_BLOCKING;
    CHECK(reinterpret_cast<CUresult (*)(CUstream*, unsigned, int)>(fn)(&s, flags, 0));
    print_counts("stream_");
    CHECK(cuMemFree(c));
    CHECK(cuMemAlloc(&d, mb20));
    printf("reused_after_stream=%d\n", d == c);
    CHECK(cuMemFree(d));
    CHECK(cuMemAlloc(&e, mb20));
    CHECK(cuMemFree(e));
    print_counts("after_");
}

// Two threads make switching streams at once (run with GPUMEM_EMU_SYNC_MS, a slow drain): the one
// that loses the race must not get its stream before the drain is done, or it could queue work
// beside the work the drain waits for.
void switch_race() {
    CUcontext ctx = setup();
    CUdeviceptr a;
    CHECK(cuMemAlloc(&a, 1 << 20));  // the pool holds memory, so the switch drains
    std::atomic<int> first_started{0};
    std::thread t1([&] {
        cuCtxSetCurrent(ctx);
        first_started = 1;
        CUstream s;
        CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    });
    std::thread t2([&] {
        cuCtxSetCurrent(ctx);
        while (!first_started) std::this_thread::yield();
        usleep(5000);  // well inside the first thread's drain
        CUstream s;
        CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        printf("second_saw_syncs=%llu\n", driver_count("cuCtxSynchronize") + driver_count("cuEventSynchronize"));
    });
    t1.join();
    t2.join();
    print_counts("");
}

// Per-thread default streams: resolving the per-thread variants (as every runtime does at start-up)
// changes nothing; using one switches auto to safe before the call reaches the driver.  `how`:
// thunk (call the resolved cuLaunchKernel_ptsz), dlsym (the same found by dlsym), handle
// (cuLaunchKernel on CU_STREAM_PER_THREAD), ex (cuLaunchKernelEx on it), alloc-async-ptsz (the
// resolved cuMemAllocAsync_ptsz on the null stream), free-async-handle (cuMemFreeAsync on
// CU_STREAM_PER_THREAD), capture-ptsz (a capture of the null stream through the _ptsz
// variants), graph-ptsz (the resolved cuGraphLaunch_ptsz), graph-handle (cuGraphLaunch on
// CU_STREAM_PER_THREAD), legacy (stream 0: no switch), alloc-async-ptsz-legacy (the _ptsz variant on
// CU_STREAM_LEGACY: no switch).
void per_thread(const std::string& how) {
    setup();
    const size_t mb = 1u << 20;
    CUdeviceptr a, b, c;
    CHECK(cuMemAlloc(&a, mb));
    CHECK(cuMemFree(a));
    CHECK(cuMemAlloc(&b, mb));
    printf("reused_before=%d\n", a == b);
    using launch_fn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   CUstream, void**, void**);
    void* fn = nullptr;
    CUdriverProcAddressQueryResult q;
    CHECK(cuGetProcAddress_v2("cuLaunchKernel", &fn, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &q));
    print_counts("resolved_");
    void** params = reinterpret_cast<void**>(0x1234);
    void** extra = reinterpret_cast<void**>(0x5678);
    CUresult r = CUDA_SUCCESS;
    if (how == "thunk") {  // the per-thread launch (a typed wrapper), called twice
        r = reinterpret_cast<launch_fn>(fn)(nullptr, 11, 12, 13, 14, 15, 16, 17, nullptr, params, extra);
        r = r ? r : reinterpret_cast<launch_fn>(fn)(nullptr, 11, 12, 13, 14, 15, 16, 17, nullptr, params, extra);
    } else if (how == "thunk-query") {  // a per-thread variant with no typed wrapper: a thunk
        void* qf = nullptr;
        CHECK(cuGetProcAddress_v2("cuStreamQuery", &qf, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &q));
        r = reinterpret_cast<CUresult (*)(CUstream)>(qf)(nullptr);
        r = r ? r : reinterpret_cast<CUresult (*)(CUstream)>(qf)(nullptr);
        printf("query_ptsz_calls=%llu\n", driver_count("cuStreamQuery_ptsz"));
    } else if (how == "dlsym") {
        auto f = reinterpret_cast<launch_fn>(dlsym(RTLD_DEFAULT, "cuLaunchKernel_ptsz"));
        if (!f) fail("dlsym cuLaunchKernel_ptsz", -1);
        r = f(nullptr, 11, 12, 13, 14, 15, 16, 17, nullptr, params, extra);
    } else if (how == "handle" || how == "legacy") {
        r = cuLaunchKernel(nullptr, 11, 12, 13, 14, 15, 16, 17, how == "handle" ? CU_STREAM_PER_THREAD : nullptr, params, extra);
    } else if (how == "alloc-async-ptsz" || how == "alloc-async-ptsz-legacy") {
        // The null stream of a _ptsz variant is the per-thread one; a named stream is not.
        void* af = nullptr;
        CHECK(cuGetProcAddress_v2("cuMemAllocAsync", &af, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &q));
        CUdeviceptr x;
        r = reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t, CUstream)>(af)(&x, 4096,
                                                                               how == "alloc-async-ptsz" ? nullptr : CU_STREAM_LEGACY);
    } else if (how == "capture-ptsz") {  // a capture of the per-thread stream (the null stream, _ptsz)
        void* begin = nullptr;
        void* end = nullptr;
        CHECK(cuGetProcAddress_v2("cuStreamBeginCapture", &begin, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &q));
        CHECK(cuGetProcAddress_v2("cuStreamEndCapture", &end, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &q));
        r = reinterpret_cast<CUresult (*)(CUstream, CUstreamCaptureMode)>(begin)(nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL);
        CUgraph g = nullptr;
        CHECK(reinterpret_cast<CUresult (*)(CUstream, CUgraph*)>(end)(nullptr, &g));
    } else if (how == "free-async-handle") {  // the handle, on a call other than a launch
        CUdeviceptr x;
        CHECK(cuMemAllocAsync(&x, 4096, nullptr));
        r = cuMemFreeAsync(x, CU_STREAM_PER_THREAD);
    } else if (how == "graph-ptsz") {  // the resolved cuGraphLaunch_ptsz (a typed wrapper) on the null stream
        void* gf = nullptr;
        CHECK(cuGetProcAddress_v2("cuGraphLaunch", &gf, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &q));
        r = reinterpret_cast<CUresult (*)(CUgraphExec, CUstream)>(gf)(reinterpret_cast<CUgraphExec>(0x800), nullptr);
        printf("graph_ptsz_calls=%llu\n", driver_count("cuGraphLaunch_ptsz"));
    } else if (how == "graph-handle") {  // the plain cuGraphLaunch on CU_STREAM_PER_THREAD
        r = cuGraphLaunch(reinterpret_cast<CUgraphExec>(0x800), CU_STREAM_PER_THREAD);
    } else if (how == "ex") {
        CUlaunchConfig cfg{};
        cfg.gridDimX = 11, cfg.gridDimY = 12, cfg.gridDimZ = 13, cfg.blockDimX = 14, cfg.blockDimY = 15, cfg.blockDimZ = 16;
        cfg.sharedMemBytes = 17;
        cfg.hStream = CU_STREAM_PER_THREAD;
        r = cuLaunchKernelEx(&cfg, nullptr, params, extra);
    }
    printf("launch_result=%d\nptsz_calls=%llu\n", int(r), driver_count("cuLaunchKernel_ptsz"));
    print_counts("launched_");
    CHECK(cuMemFree(b));
    CHECK(cuMemAlloc(&c, mb));
    printf("reused_after=%d\n", b == c);
    // A runtime that starts now resolves the per-thread variants again: known, not a hole, so the
    // fences stay (a 40 MiB free then allocation, over the sync budget, is released by one).
    void* late = nullptr;
    CHECK(cuGetProcAddress_v2("cuLaunchKernel", &late, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &q));
    CUdeviceptr big;
    CHECK(cuMemAlloc(&big, 40 * mb));
    CHECK(cuMemFree(big));
    CHECK(cuMemAlloc(&big, 40 * mb));
    print_counts("end_");
}

// cuMemFreeAsync of cuMemAlloc memory is legal CUDA (the programming guide's stream-ordered
// allocator section).  a starts a segment, b lies after it in the same segment: what the driver
// frees, and whether b is still the program's afterwards.
void free_async() {
    setup();
    CUdeviceptr a, b;
    CHECK(cuMemAlloc(&a, 1000));
    CHECK(cuMemAlloc(&b, 5000));
    using fn = uint64_t (*)();
    static fn live = reinterpret_cast<fn>(dlsym(RTLD_DEFAULT, "gpumem_emu_live_allocations"));
    if (!live) fail("dlsym gpumem_emu_live_allocations", -1);
    const uint64_t live_before = live();
    printf("free_async_a_result=%d\n", int(cuMemFreeAsync(a, nullptr)));
    printf("live_allocs_lost=%lld\n", (long long)live_before - (long long)live());
    CUdeviceptr base = 0;
    size_t size = 0;
    printf("range_b_after_result=%d\n", int(cuMemGetAddressRange(&base, &size, b)));
    printf("free_b_result=%d\n", int(cuMemFree(b)));
}

// cuMemFreeAsync of a pooled block on a stream being captured.  During a capture the driver makes
// a free node, which only a graph allocation may have: it refuses a cuMemAlloc pointer, and the
// block stays the program's.  `how`: "" (cuMemFreeAsync) or ptsz (the resolved _ptsz variant, on
// the same named stream).  One blocking stream keeps auto reuse immediate, so a block the pool
// took back would be handed out again by the next allocation of its size.
void free_async_capture(const std::string& how) {
    setup();
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_DEFAULT));
    using free_fn = CUresult (*)(CUdeviceptr, CUstream);
    free_fn free_async = cuMemFreeAsync;
    if (how == "ptsz") {
        void* f = nullptr;
        CUdriverProcAddressQueryResult q;
        CHECK(cuGetProcAddress_v2("cuMemFreeAsync", &f, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &q));
        free_async = reinterpret_cast<free_fn>(f);
    }
    CUdeviceptr a, b;
    CHECK(cuMemAlloc(&a, 5000));
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    printf("free_async_capture_result=%d\n", int(free_async(a, s)));
    CUgraph g = nullptr;
    printf("end_capture_result=%d\n", int(cuStreamEndCapture(s, &g)));
    CHECK(cuMemAlloc(&b, 5000));
    printf("realloc_same=%d\n", a == b);
    CUdeviceptr base = 0;
    size_t size = 0;
    const int range = int(cuMemGetAddressRange(&base, &size, a));
    printf("range_a_result=%d\nrange_a_size=%zu\n", range, size);
    printf("a=0x%llx\n", (unsigned long long)a);
}

}  // namespace

int main(int argc, char** argv) {
    std::string s = argc > 1 ? argv[1] : "";
    if (s == "loop") loop(argc > 2 ? atol(argv[2]) : 10000, argc > 3 ? size_t(atol(argv[3])) : 4096);
    else if (s == "threads") threads(argc > 2 ? atoi(argv[2]) : 8, argc > 3 ? atol(argv[3]) : 20000, argc > 4 ? atol(argv[4]) : -1);
    else if (s == "oom") oom();
    else if (s == "fragment") fragment(argc > 2 ? size_t(atol(argv[2])) : 6, argc > 3 ? size_t(atol(argv[3])) : 60);
    else if (s == "capture")
        capture(argc > 2 && std::string(argv[2]) == "to-graph", argc > 2 && std::string(argv[2]) == "stray-end",
                argc > 2 && std::string(argv[2]) == "wrong-thread-end");
    else if (s == "query") query();
    else if (s == "destroy-in-handler") destroy_in_handler();
    else if (s == "retain-meet") retain_meet();
    else if (s == "green-stale") green_stale();
    else if (s == "peer-in-handler") peer_in_handler();
    else if (s == "capture-signals") capture_signals();
    else if (s == "ipc-drop-signals") ipc_drop_signals();
    else if (s == "stream-destroy-in-handler") stream_destroy_in_handler();
    else if (s == "stream-in-handler") stream_in_handler();
    else if (s == "free-in-handler") free_in_handler(argc > 2 && !strcmp(argv[2], "exit"), argc > 2 && !strcmp(argv[2], "reset"));
    else if (s == "alloc-in-handler") alloc_in_handler(argc > 2 && !strcmp(argv[2], "early"));
    else if (s == "edges") edges();
    else if (s == "free-async") free_async();
    else if (s == "free-async-capture") free_async_capture(argc > 2 ? argv[2] : "");
    else if (s == "capture-modes") capture_modes();
    else if (s == "other-allocators") other_allocators();
    else if (s == "arrays") arrays();
    else if (s == "retry-ptsz") retry_ptsz();
    else if (s == "context-create") context_create();
    else if (s == "two-pools") two_pools(argc > 2 && !strcmp(argv[2], "huge"));
    else if (s == "two-pools-fenced") two_pools_fenced();
    else if (s == "two-pools-unpooled") two_pools_unpooled();
    else if (s == "green-end") green_end();
    else if (s == "green-late-free") green_late_free(argc > 2 && !strcmp(argv[2], "reset"));
    else if (s == "green-pool") green_pool();
    else if (s == "green-reuse") green_reuse();
    else if (s == "green-handle-again") green_handle_again();
    else if (s == "green-destroy-race") green_destroy_race();
    else if (s == "green-reuse-window") green_reuse_window();
    else if (s == "green-destroy-refused") green_destroy_refused(argc > 2 && !strcmp(argv[2], "fresh"));
    else if (s == "green-destroy-query") green_destroy_query();
    else if (s == "green-ipc-late") green_ipc_late();
    else if (s == "green-dead-alloc") green_dead_alloc(argc > 2 ? argv[2] : nullptr);
    else if (s == "green-peer") green_peer(argc > 2 ? argv[2] : "late");
    else if (s == "peer-reuse") peer_reuse(argc > 2 ? argv[2] : "made");
    else if (s == "kernel-attr-device") kernel_attr_device();
    else if (s == "async-other-device") async_other_device();
    else if (s == "reset-launch") reset_launch(argc > 2 && !strcmp(argv[2], "v1"));
    else if (s == "reset") reset();
    else if (s == "reset-stale") reset_stale(argc > 2 && !strcmp(argv[2], "first"));
    else if (s == "release-cycle") release_cycle(argc > 2 && !strcmp(argv[2], "v1"));
    else if (s == "release-race") release_race(argc > 2 && !strcmp(argv[2], "green"));
    else if (s == "auto") auto_reuse(argc > 2 ? argv[2] : "nonblocking");
    else if (s == "stream-loop") stream_loop(argc > 2 ? atol(argv[2]) : 100000, argc > 3 ? size_t(atol(argv[3])) : 4096);
    else if (s == "order-loop") order_loop(argc > 2 ? atol(argv[2]) : 1000, argc > 3 ? size_t(atol(argv[3])) : 20u << 20);
    else if (s == "switch-race") switch_race();
    else if (s == "kernel-fault") kernel_fault();
    else if (s == "launch-loop") launch_loop(argc > 2 ? atol(argv[2]) : 1000000, argc > 3 && std::string(argv[3]) == "full");
    else if (s == "per-thread") per_thread(argc > 2 ? argv[2] : "thunk");
    else if (s == "peer") peer(argc > 2 && std::string(argv[2]) == "early");
    else if (s == "ipc-export") ipc_export(argc > 2 ? atol(argv[2]) : 3, argc > 3 ? size_t(atol(argv[3])) : 5000);
    else if (s == "ipc-import" && argc > 2) ipc_import(argv[2], argc > 3 ? size_t(atol(argv[3])) : 5000, argc > 4 ? argv[4] : "",
                                                         argc > 5 ? argv[5] : "");
    else {
        fprintf(stderr, "usage: %s loop [N SIZE] | launch-loop [N [full]] | kernel-fault | stream-loop [N SIZE] | order-loop [N SIZE] | threads [T PAIRS [STREAM_AT]] | oom | fragment [SMALL_MIB BIG_MIB] | capture [to-graph] | query | edges | free-async | free-async-capture [ptsz] | destroy-in-handler | stream-destroy-in-handler | stream-in-handler | free-in-handler [exit|reset] | alloc-in-handler [early] | capture-modes | other-allocators | arrays | retry-ptsz | context-create | two-pools [huge] | two-pools-fenced | two-pools-unpooled | green-end | green-late-free [reset] | green-pool | green-reuse | green-handle-again | green-destroy-race | green-reuse-window | green-destroy-query | green-ipc-late | green-dead-alloc [CUDART_LIB] | green-peer [early|live|late] | release-race [green] | kernel-attr-device | async-other-device | reset-launch [v1] | reset | reset-stale [first] | auto [nonblocking|blocking] | switch-race | per-thread [thunk|dlsym|handle|ex|graph-ptsz|graph-handle|alloc-async-ptsz|free-async-handle|capture-ptsz|legacy|alloc-async-ptsz-legacy] | ipc-export [N SIZE] | ipc-import HEX [SIZE [HEX2 [capture|v1|v1-resolved]]] | peer [early] | retain-meet | peer-in-handler | capture-signals | green-stale | ipc-drop-signals\n", argv[0]);
        return 2;
    }
    return 0;
}
