// The emulated CUDA driver: a stand-in libcuda.so.1 with made-up device addresses, a capacity, real OOM codes, IPC between processes and call counters.
//
// It is what gpumem's tests and demo run against on machines with no GPU.  Device memory is never
// backed (addresses are only numbers, as the tests never touch device memory); pinned host memory is
// real malloc memory, because programs do write to it.  Settings:
//   GPUMEM_EMU_CAPACITY   bytes per device (K/M/G suffixes), default 16G
//   GPUMEM_EMU_DEVICES    device count, default 1
//   GPUMEM_EMU_LATENCY_NS busy-wait added to every allocation and free (to mimic a real driver)
//   GPUMEM_EMU_VMM        0: a driver without virtual memory management (the VMM calls answer
//                         CUDA_ERROR_NOT_SUPPORTED, the device attribute says 0); default 1
//   GPUMEM_EMU_IPC_FD     0: chunks cannot be exported as POSIX file descriptors (the device
//                         attribute says 0, cuMemCreate refuses to make exportable chunks), as on a
//                         driver or container without them; any other value or unset: they can,
//                         when GPUMEM_EMU_VMM is on
//   GPUMEM_EMU_LATE_ALLOC N alloc/free pairs made by this library's destructor at exit (below)
//   GPUMEM_EMU_LATE_ALLOC_SIZE  their size in bytes (4096)
//   GPUMEM_EMU_RELEASE_GAP_MS   a primary context's last release sleeps this long after ending it,
//                         before it returns: the moment in which another thread's retain makes
//                         the context anew, as a real driver's may
//   GPUMEM_EMU_SLOW_NAME_MS     cuDeviceGetName sleeps this long (a log start slowed by a loaded
//                         machine: gpumem asks every device's name for the log's header);
//                         gpumem_emu_names_asked() says how many calls began
//   GPUMEM_EMU_CONTEXT_REUSE    1: a destroyed context's CUcontext (cuCtxCreate's, or a green
//                         context's own) is handed out again by the device's next such context,
//                         last destroyed first, as a driver whose context objects come from malloc
//                         may (below, next_context_handle)
//   GPUMEM_EMU_GREEN_DESTROY_REFUSE  N: the Nth cuGreenCtxDestroy of a live green context (counted
//                         from 1 over the process) is refused with CUDA_ERROR_INVALID_VALUE and
//                         destroys nothing: the green context lives on, as after any refused call
//                         (a refusal the driver may give for any reason; which one, if any, a
//                         real driver gives for a valid green context is not measured)
//
// Virtual memory follows the driver's rules, with its error codes: physical chunks (cuMemCreate)
// are whole multiples of the 2 MiB granularity and count against the capacity together with
// cuMemAlloc; a map must lie inside a reservation and over no other mapping; an unmap must cover
// whole mappings; a released handle's memory is freed once its last mapping goes; access must be
// set on mapped bytes only.
//
// Memory pools (cuMemPoolCreate) keep the location and allocation type they were made with, and
// cuMemAllocFromPoolAsync hands out their memory: real malloc memory from a pool of a host
// location (pinned host memory, which programs write), managed memory from a managed pool, device
// memory from a device pool; a destroyed pool's handle is given to the next pool made, as a heap
// would give back its address.  A location's default pool of a type (CUDA 13's
// cuMemGetDefaultMemPool, and cuMemGetMemPool, which answers the same: there is no cuMemSetMemPool
// here) hands out its location's memory too, and cannot be destroyed.  A pool handle the emulated
// driver did not make (a made-up one) is a device pool of the stream's device, as a device's default
// pool (cuDeviceGetDefaultMemPool) is.
//
// IPC works between real processes, though no memory is shared: what crosses is the name of the
// exporter's memory, so that a test can ask (gpumem_emu_backing) which process's allocation, and
// where in it, an importer's pointer lands.  A chunk made exportable is exported as a real memfd
// holding {pid, handle, size, device}; a legacy IPC handle holds {base, size, pid}.  Imported and
// opened memory belongs to the exporter and is not charged to the importer's capacity.
#include <cuda.h>
#include <dlfcn.h>
#undef cuGetProcAddress
#undef cuIpcOpenMemHandle  // the header renames it to _v2; the driver exports both names
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#define EMU_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

struct allocation {
    uint64_t size;
    int dev;
    int kind;  // 0 device, 1 managed, 2 vmm handle, 3 opened legacy IPC memory
    // The bytes the program asked for (device and managed memory): what pointer queries see.  The
    // driver answers a cuMemAlloc allocation's own size (1000 for 1000 bytes) and knows no address
    // past it, though it charged more: cuMemGetAddressRange there is CUDA_ERROR_NOT_FOUND and
    // cuPointerGetAttribute CUDA_ERROR_INVALID_VALUE (an H100, 2026-12-06).
    uint64_t requested = 0;
    // Device memory: the context whose memory it is (the one current at the allocation, a
    // green context's own standing for its primary context's), for peer access.
    uint64_t ctx = 0;
};

struct vmm_handle {
    uint64_t size;
    int dev;
    int mappings;   // live mappings of it
    bool released;  // every reference was released: freed when mappings reaches 0
    int extra_refs = 0;  // cuMemRetainAllocationHandle's references, each taken back by a cuMemRelease
    bool exportable = false;     // made with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (or imported)
    bool imported = false;       // another handle's memory, maybe another process's: never charged here
    int origin_pid = 0;          // whose chunk it is: this process and this handle for a local one,
    uint64_t origin_handle = 0;  // the first exporter's for an imported one (re-exports keep it)
};

struct vmm_mapping {
    uint64_t size;
    uint64_t handle;
    uint64_t offset;  // into the handle's chunk (cuMemMap's offset)
    uint32_t access = 0;  // devices granted read/write by cuMemSetAccess, one bit each
};

// Another process's cuMemAlloc allocation, opened here by cuIpcOpenMemHandle.  Opening the same
// allocation again returns the same address and counts a reference, as the driver does.
struct opened_ipc {
    uint64_t size;
    int dev;
    int refs;
    int origin_pid;
    uint64_t origin_base;
};

struct emu_state {
    std::mutex mu;
    std::map<uint64_t, allocation> device_allocs;     // base -> allocation
    std::map<uint64_t, vmm_handle> handles;           // VMM handle -> physical allocation
    std::map<uint64_t, uint64_t> reservations;        // VA base -> size
    std::map<uint64_t, vmm_mapping> mappings;         // VA -> mapping
    std::map<uint64_t, opened_ipc> opened;            // VA base -> another process's allocation
    // Peer access: a context (a green context's own names its primary context) -> the devices
    // whose contexts enabled access to its memory; gone when that context ends.
    std::map<uint64_t, uint32_t> peer_access;
    uint64_t next_reserve_va = 0x600000000000ull;     // reservations: below every device's cuMemAlloc range
    uint64_t next_opened_va = 0x500000000000ull;      // opened IPC memory: below the reservations
    uint64_t used[16] = {};
    uint64_t next_va[16] = {};
    uint64_t next_handle = 0x1000;
    uint64_t capacity = 16ull << 30;
    int devices = 1;
    uint64_t latency_ns = 0;
    uint64_t release_gap_ms = 0;
    bool initialized = false;
    bool vmm = true;
    bool ipc_fd = true;
    std::atomic<int> capturing{0};  // open captures, process-wide (the driver's global mode)
    std::mutex capture_mu;
    struct capture_rec {
        long tid;  // the thread that began it
        int mode;  // CUstreamCaptureMode
        bool invalidated;
    };
    std::map<CUstream, capture_rec> capturing_streams;  // which streams capture
    std::map<uint64_t, int> graph_allocs;       // stream-ordered allocations made during a capture
    // A stream's device (the current one at its creation), for cuStreamGetDevice and the
    // stream-ordered allocations, which draw from their stream's device as the driver's do.
    std::map<CUstream, int> stream_devices;
    // Memory pools made by cuMemPoolCreate, by handle; handles of destroyed ones, given out again
    // lowest first; and the host memory their allocations got, by address (its bytes).
    std::map<uint64_t, CUmemPoolProps> mem_pools;
    std::map<uint64_t, CUmemPoolProps> default_pools;  // CUDA 13's location defaults other than a device's
    std::set<uint64_t> free_pool_handles;
    uint64_t next_pool_handle = 0xB000;
    std::map<uint64_t, uint64_t> host_pool_allocs;
};

emu_state& st() {
    static emu_state* s = [] {
        auto* e = new emu_state();
        if (const char* c = getenv("GPUMEM_EMU_CAPACITY")) {
            char* end = nullptr;
            uint64_t v = strtoull(c, &end, 10);
            if (end && (*end == 'k' || *end == 'K')) v <<= 10;
            if (end && (*end == 'm' || *end == 'M')) v <<= 20;
            if (end && (*end == 'g' || *end == 'G')) v <<= 30;
            e->capacity = v;
        }
        if (const char* d = getenv("GPUMEM_EMU_DEVICES")) e->devices = std::max(1, std::min(16, atoi(d)));
        if (const char* l = getenv("GPUMEM_EMU_LATENCY_NS")) e->latency_ns = strtoull(l, nullptr, 10);
        if (const char* g = getenv("GPUMEM_EMU_RELEASE_GAP_MS")) e->release_gap_ms = strtoull(g, nullptr, 10);
        if (const char* v = getenv("GPUMEM_EMU_VMM")) e->vmm = atoi(v) != 0;
        if (const char* f = getenv("GPUMEM_EMU_IPC_FD")) e->ipc_fd = strcmp(f, "0") != 0;
        for (int i = 0; i < 16; ++i) e->next_va[i] = 0x7f0000000000ull + uint64_t(i) * 0x10000000000ull;
        return e;
    }();
    return *s;
}

// Call counters, read by tests through gpumem_emu_count().
struct counter {
    const char* name;
    std::atomic<uint64_t> n;
};
counter g_counters[] = {
    {"cuMemAlloc_v2", {0}}, {"cuMemFree_v2", {0}}, {"cuMemAllocPitch_v2", {0}}, {"cuMemAllocManaged", {0}},
    {"cuMemAllocAsync", {0}}, {"cuMemFreeAsync", {0}}, {"cuMemAllocFromPoolAsync", {0}}, {"cuMemCreate", {0}},
    {"cuMemRelease", {0}}, {"cuMemMap", {0}}, {"cuMemUnmap", {0}}, {"cuMemAddressReserve", {0}},
    {"cuMemAddressFree", {0}}, {"cuMemHostAlloc", {0}}, {"cuMemAllocHost_v2", {0}}, {"cuMemFreeHost", {0}},
    {"cuCtxSynchronize", {0}}, {"cuStreamSynchronize", {0}}, {"cuGetProcAddress", {0}}, {"cuMemGetInfo_v2", {0}},
    {"cuIpcGetMemHandle", {0}}, {"cuMemGetAddressRange_v2", {0}}, {"cuPointerGetAttribute", {0}},
    {"cuCtxSynchronize_in_capture", {0}},  // syncs refused because a capture was open (a bug in any caller)
    {"cuLaunchKernel", {0}}, {"cuLaunchKernel_ptsz", {0}}, {"cuLaunchKernelEx", {0}}, {"launch_on_per_thread_handle", {0}},
    {"cuMemSetAccess", {0}}, {"cuMemGetAllocationGranularity", {0}}, {"cuDeviceGetAttribute", {0}},
    {"cuEventCreate", {0}}, {"cuEventRecord", {0}}, {"cuEventQuery", {0}}, {"cuEventSynchronize", {0}},
    {"cuEventRecord_in_capture", {0}},  // a record into an open capture: a graph node, not a fence (a bug)
    {"cuStreamWaitEvent", {0}}, {"cuStreamWaitEvent_in_capture", {0}},
    {"cuStreamDestroy_v2", {0}}, {"cuStreamQuery", {0}}, {"cuStreamQuery_ptsz", {0}}, {"cuCtxEnablePeerAccess", {0}},
    {"unknown_stream_create", {0}},
    {"cuMemRetainAllocationHandle", {0}},
    {"cuStreamQuery_in_capture", {0}},  // a query of a capturing stream breaks the capture (a bug)
    {"cuMemExportToShareableHandle", {0}}, {"cuMemImportFromShareableHandle", {0}},
    {"cuIpcOpenMemHandle_v2", {0}}, {"cuIpcOpenMemHandle", {0}},  // each ABI's calls
    {"cuIpcCloseMemHandle", {0}}, {"cuStreamIsCapturing", {0}},
    {"unsafe_call_in_capture", {0}},  // cuMemAlloc/cuMemFree refused inside a capture (900)
    {"cuMemCreate_made", {0}},        // the cuMemCreate calls that made a chunk
    {"primary_context_ended", {0}}, {"cuDevicePrimaryCtxRelease", {0}},
    {"cuMemPoolCreate", {0}}, {"cuMemPoolDestroy", {0}},
    {"cuLaunchCooperativeKernel", {0}}, {"cuLaunchCooperativeKernel_ptsz", {0}}, {"cuGraphInstantiateWithParams", {0}},
    {"cuGraphInstantiateWithParams_ptsz", {0}}, {"cuGraphUpload", {0}}, {"cuGraphUpload_ptsz", {0}}, {"cuGraphLaunch", {0}},
    {"cuGraphLaunch_ptsz", {0}},
    {"cuCtxCreate", {0}}, {"cuCtxCreate_v2", {0}}, {"cuCtxCreate_v3", {0}}, {"cuCtxCreate_v4", {0}},
    {"cuGreenCtxCreate", {0}}, {"cuGreenCtxDestroy", {0}}, {"call_on_dead_green_stream", {0}},
    {"dead_green_made_current", {0}}, {"call_in_dead_green_context", {0}}, {"call_on_dead_green_event", {0}},
    {"cuCtxFromGreenCtx", {0}}, {"cuDevicePrimaryCtxRetain", {0}},
    {"green_destroy_refused", {0}},  // GPUMEM_EMU_GREEN_DESTROY_REFUSE's refusals
};
// gpumem_emu_raise_in: the functions whose next call raises a signal, and which signal (0: none).
char g_raise_names[256];
std::atomic<int> g_raise_sig{0};
bool named_in(const char* list, const char* name) {
    const size_t n = strlen(name);
    for (const char* p = list; *p;) {
        const char* e = strchr(p, ',');
        const size_t len = e ? size_t(e - p) : strlen(p);
        if (len == n && !strncmp(p, name, n)) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

// Counts a call; called at a function's entry, before any lock of the emulated driver's.
void bump(const char* name) {
    for (auto& c : g_counters)
        if (!strcmp(c.name, name)) c.n.fetch_add(1, std::memory_order_relaxed);
    if (g_raise_sig.load(std::memory_order_acquire) && named_in(g_raise_names, name))
        if (int sig = g_raise_sig.exchange(0)) raise(sig);
}

void spin_latency() {
    uint64_t ns = st().latency_ns;
    if (!ns) return;
    auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(ns);
    while (std::chrono::steady_clock::now() < until) {}
}

thread_local int t_ctx_dev = -1;   // device of this thread's current context
thread_local uintptr_t t_ctx_made = 0;  // the current context when it is one cuCtxCreate made (0: the primary one)
std::atomic<int> g_default_dev{-1};  // a context made current on any thread (lenient, like a runtime would)

int current_dev() {
    if (t_ctx_dev >= 0) return t_ctx_dev;
    return g_default_dev.load();
}

// A primary context's handle is 0xC0000 + its device; a context cuCtxCreate made (and a green
// context's, cuCtxFromGreenCtx) adds a multiple of 0x100, so the low byte still names the device.
CUcontext ctx_of(int dev) { return reinterpret_cast<CUcontext>(uintptr_t(0xC0000 + dev)); }
int dev_of(CUcontext c) { return int((reinterpret_cast<uintptr_t>(c) - 0xC0000) & 0xFF); }
bool is_made(CUcontext c) { return c && ((reinterpret_cast<uintptr_t>(c) - 0xC0000) >> 8) != 0; }

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// dev: the device to allocate on; -1, the current context's.
// A reset primary context is inactive, its retains notwithstanding, until the next retain makes it
// anew with the same handle; meanwhile an allocation or a free with the old handle current is
// refused with CUDA_ERROR_CONTEXT_IS_DESTROYED (709) (an H100, 2026-12-06).
static std::atomic<bool>* primary_reset() {
    static std::atomic<bool>* r = new std::atomic<bool>[16]();
    return r;
}
uint64_t memory_context_now(int dev);  // below, with the contexts
CUresult device_alloc(CUdeviceptr* p, uint64_t size, int kind, int dev = -1) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    if (!st().initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0) dev = current_dev();
    if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (primary_reset()[dev].load()) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    spin_latency();
    const uint64_t ctx = memory_context_now(dev);
    emu_state& s = st();
    std::lock_guard<std::mutex> g(s.mu);
    // Sizes near 2^64 would wrap in the rounding: out of memory, as the driver says (2 for 2^64-1,
    // 2^63 and 2^48+1 on an H100).
    if (size > s.capacity) return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t charged = align_up(size, 512);
    if (s.used[dev] + charged > s.capacity) return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t align = size >= (1u << 20) ? (2u << 20) : 512;
    uint64_t base = align_up(s.next_va[dev], align);
    s.next_va[dev] = base + charged;
    s.used[dev] += charged;
    s.device_allocs[base] = allocation{charged, dev, kind, size, ctx};
    *p = CUdeviceptr(base);
    return CUDA_SUCCESS;
}

CUresult device_free(CUdeviceptr p) {
    if (p == 0) return CUDA_SUCCESS;
    if (const int dev = current_dev(); dev >= 0 && primary_reset()[dev].load()) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    spin_latency();
    emu_state& s = st();
    std::lock_guard<std::mutex> g(s.mu);
    auto it = s.device_allocs.find(uint64_t(p));
    if (it == s.device_allocs.end()) return CUDA_ERROR_INVALID_VALUE;
    s.used[it->second.dev] -= it->second.size;
    s.device_allocs.erase(it);
    return CUDA_SUCCESS;
}

// The allocation containing p, if any: a cuMemAlloc allocation or (with_vmm) a VMM mapping or
// opened IPC memory.  asked: as a pointer query sees it, a cuMemAlloc allocation only up to the
// bytes the program asked for (allocation::requested).
bool find_alloc(uint64_t p, uint64_t* base, allocation* out, bool with_vmm = true, bool asked = false) {
    emu_state& s = st();
    std::lock_guard<std::mutex> g(s.mu);
    auto it = s.device_allocs.upper_bound(p);
    if (it != s.device_allocs.begin()) {
        --it;
        if (p < it->first + (asked && it->second.requested ? it->second.requested : it->second.size)) {
            *base = it->first;
            *out = it->second;
            return true;
        }
    }
    if (!with_vmm) return false;
    auto o = s.opened.upper_bound(p);
    if (o != s.opened.begin()) {
        --o;
        if (p < o->first + o->second.size) {
            *base = o->first;
            *out = allocation{o->second.size, o->second.dev, 3};
            return true;
        }
    }
    auto m = s.mappings.upper_bound(p);
    if (m == s.mappings.begin()) return false;
    --m;
    if (p >= m->first + m->second.size) return false;
    auto h = s.handles.find(m->second.handle);
    *base = m->first;
    *out = allocation{m->second.size, h != s.handles.end() ? h->second.dev : 0, 2};
    return true;
}

}  // namespace

// ---- Counters for tests --------------------------------------------------------------------------
EMU_EXPORT uint64_t gpumem_emu_count(const char* name) {
    for (auto& c : g_counters)
        if (!strcmp(c.name, name)) return c.n.load();
    return 0;
}
EMU_EXPORT uint64_t gpumem_emu_used(int dev) {
    std::lock_guard<std::mutex> g(st().mu);
    return dev >= 0 && dev < 16 ? st().used[dev] : 0;
}
EMU_EXPORT uint64_t gpumem_emu_live_allocations() {
    std::lock_guard<std::mutex> g(st().mu);
    return st().device_allocs.size();
}
// The next call of one of `names` (comma-separated counter names, at most 255 bytes) raises `sig`
// at its entry, before any lock of this driver's, once: a signal that lands inside a driver call,
// as a timer's may, here on purpose (pool_app free-in-handler: inside the pool's growth).
EMU_EXPORT void gpumem_emu_raise_in(const char* names, int sig) {
    snprintf(g_raise_names, sizeof g_raise_names, "%s", names ? names : "");
    g_raise_sig.store(sig, std::memory_order_release);
}
// Physical VMM handles not yet freed, mappings and reservations held (leak checks).
EMU_EXPORT uint64_t gpumem_emu_live_vmm(const char* what) {
    std::lock_guard<std::mutex> g(st().mu);
    if (!strcmp(what, "handles")) return st().handles.size();
    if (!strcmp(what, "mappings")) return st().mappings.size();
    if (!strcmp(what, "reservations")) return st().reservations.size();
    if (!strcmp(what, "ipc_opened")) return st().opened.size();  // opened legacy IPC memory not yet closed
    return 0;
}

// GPUMEM_EMU_EXIT_COUNTS=1: this library's destructor, after every atexit handler, prints what the
// exit cost the driver (chunks released, primary contexts ended) to stderr.
__attribute__((destructor)) static void counts_at_exit() {
    const char* e = getenv("GPUMEM_EMU_EXIT_COUNTS");
    if (!e || strcmp(e, "1") != 0) return;
    fprintf(stderr, "emu_exit cuMemRelease=%llu primary_context_ended=%llu\n",
            (unsigned long long)gpumem_emu_count("cuMemRelease"), (unsigned long long)gpumem_emu_count("primary_context_ended"));
}

// ---- Initialisation, devices, contexts ------------------------------------------------------------
// GPUMEM_EMU_LATE_ALLOC=N: N alloc/free pairs of 4 KiB from this library's destructor, through the
// cuMemAlloc_v2/cuMemFree_v2 the process finds first (gpumem's, under LD_PRELOAD), in the current
// context.  A library the program links is initialised before a preloaded one and finalised after
// it, so these calls come after gpumem's end line, as a framework's static destructors freeing
// device memory at exit do.
__attribute__((destructor)) static void late_alloc_at_exit() {
    const char* n = getenv("GPUMEM_EMU_LATE_ALLOC");
    if (!n) return;
    using alloc_fn = CUresult (*)(CUdeviceptr*, size_t);
    using free_fn = CUresult (*)(CUdeviceptr);
    auto alloc = reinterpret_cast<alloc_fn>(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
    auto release = reinterpret_cast<free_fn>(dlsym(RTLD_DEFAULT, "cuMemFree_v2"));
    if (!alloc || !release) return;
    // GPUMEM_EMU_LATE_ALLOC_SIZE: bytes of each (4096 by default); a size no cached block holds
    // must reach the driver, as without gpumem.  What the calls returned goes to stderr.
    const char* sz = getenv("GPUMEM_EMU_LATE_ALLOC_SIZE");
    const size_t bytes = sz ? size_t(strtoull(sz, nullptr, 10)) : 4096;
    int ok = 0, failed = 0;
    for (int i = 0, k = atoi(n); i < k; ++i) {
        CUdeviceptr p = 0;
        if (alloc(&p, bytes) == CUDA_SUCCESS) {
            ++ok;
            release(p);
        } else {
            ++failed;
        }
    }
    fprintf(stderr, "emu_late_alloc ok=%d failed=%d\n", ok, failed);
}

EMU_EXPORT CUresult cuInit(unsigned int) {
    st().initialized = true;
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuDriverGetVersion(int* v) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = 13000;
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuDeviceGetCount(int* n) {
    if (!st().initialized) return CUDA_ERROR_NOT_INITIALIZED;
    *n = st().devices;
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuDeviceGet(CUdevice* d, int ordinal) {
    if (!st().initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= st().devices) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}
static std::atomic<int> g_names_asked{0};
// Not a driver function: lets a program wait until the log's start is under way (emu_app exit-in-start).
EMU_EXPORT int gpumem_emu_names_asked() { return g_names_asked.load(); }
EMU_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
    g_names_asked.fetch_add(1);
    if (d < 0 || d >= st().devices) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, size_t(len), "gpumem emulated device %d", d);
    if (const char* ms = getenv("GPUMEM_EMU_SLOW_NAME_MS")) usleep(useconds_t(atoi(ms)) * 1000);
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice d) {
    if (d < 0 || d >= st().devices) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = st().capacity;
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) {
    bump("cuDeviceGetAttribute");
    if (!st().initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= st().devices) return CUDA_ERROR_INVALID_DEVICE;
    switch (a) {
        case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *v = st().vmm ? 1 : 0; break;
        case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: *v = st().vmm && st().ipc_fd ? 1 : 0; break;
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
        case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
        default:
            if (int(a) <= 0 || int(a) >= int(CU_DEVICE_ATTRIBUTE_MAX)) return CUDA_ERROR_INVALID_VALUE;
            *v = 0;
    }
    return CUDA_SUCCESS;
}
// Primary contexts are counted, as the driver counts them: each starts with one reference, the
// program's setup (GPUMEM_EMU_PRIMARY_REFS=0: none, so that its own retains and releases decide),
// and the release that takes the last ends it, its memory freed and its modules unloaded
// (H200 run 116; its handle stays current on the thread, and a retain makes it anew).
static void drop_device_memory(int dev);
static void forget_modules(int dev);
static std::atomic<int>* primary_refs() {
    static std::atomic<int>* refs = [] {
        auto* r = new std::atomic<int>[16];
        const char* e = getenv("GPUMEM_EMU_PRIMARY_REFS");
        for (int i = 0; i < 16; ++i) r[i].store(e && *e ? atoi(e) : 1);
        return r;
    }();
    return refs;
}
// GPUMEM_EMU_CONTEXT_BYTES (default 0): device memory each context's making takes: cuCtxCreate (every
// ABI), a primary context made by a retain (one that finds it without references, or reset) and a
// green context (besides the primary context it retains).  Failed for want of memory, the call made
// nothing.  Given back when the context ends (a primary context's that the program's setup holds
// from the start was never taken).
static uint64_t context_bytes() {
    static const uint64_t b = getenv("GPUMEM_EMU_CONTEXT_BYTES") ? strtoull(getenv("GPUMEM_EMU_CONTEXT_BYTES"), nullptr, 10) : 0;
    return b;
}
static CUresult take_context_bytes(int dev) {
    emu_state& s = st();
    std::lock_guard<std::mutex> g(s.mu);
    if (s.used[dev] + context_bytes() > s.capacity) return CUDA_ERROR_OUT_OF_MEMORY;
    s.used[dev] += context_bytes();
    return CUDA_SUCCESS;
}
static void give_context_bytes(int dev) {
    emu_state& s = st();
    std::lock_guard<std::mutex> g(s.mu);
    s.used[dev] -= std::min(s.used[dev], context_bytes());
}
static std::atomic<bool>* primary_charged() {  // whether the primary context's making took its bytes
    static std::atomic<bool>* c = new std::atomic<bool>[16]();
    return c;
}
static std::mutex g_retain_mu;  // a retain's check and making, one at a time
// gpumem_emu_retains_meet(ms): from then on (0: no more) a cuDevicePrimaryCtxRetain waits at its
// entry, before this driver's lock, up to ms for a second retain to be inside at the same time, as a
// real driver's first retains of two devices run side by side, each making its context (hundreds
// of ms); gpumem_emu_retains_met() counts the retains that had another inside with them.  A retain
// that finds one inside counts at once; one that finds none waits until another comes in (counted
// inside before it counts as come), so two retains that overlap both count, whatever the timing,
// and two held apart count none.
static std::atomic<int> g_retain_meet_ms{0}, g_retains_inside{0}, g_retains_come{0}, g_retains_met{0};
EMU_EXPORT void gpumem_emu_retains_meet(int ms) { g_retain_meet_ms.store(ms); }
EMU_EXPORT int gpumem_emu_retains_met() { return g_retains_met.load(); }
static void retain_meet() {
    const int ms = g_retain_meet_ms.load();
    if (ms <= 0) return;
    bool met = g_retains_inside.fetch_add(1) >= 1;
    const int me = g_retains_come.fetch_add(1) + 1;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (!met && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        met = g_retains_come.load() > me;
    }
    if (met) g_retains_met.fetch_add(1);
    g_retains_inside.fetch_sub(1);
}
// A destroyed green context's CUcontext, and a stream of a destroyed green context (below).
static bool dead_green_context(CUcontext c);
static bool on_dead_green_stream(CUstream s);
EMU_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
    bump("cuDevicePrimaryCtxRetain");
    if (d < 0 || d >= st().devices) return CUDA_ERROR_INVALID_DEVICE;
    retain_meet();
    std::lock_guard<std::mutex> lk(g_retain_mu);
    if (primary_refs()[d].load() <= 0 || primary_reset()[d].load()) {  // made anew
        if (CUresult r = take_context_bytes(d)) return r;
        if (primary_charged()[d].exchange(true)) give_context_bytes(d);  // a reset one's bytes: taken once
    }
    primary_reset()[d].store(false);
    primary_refs()[d].fetch_add(1);
    *c = ctx_of(d);
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    if (d < 0 || d >= st().devices) return CUDA_ERROR_INVALID_DEVICE;
    spin_latency();  // GPUMEM_EMU_LATENCY_NS: a release as slow as a real one, for lock races
    int n = primary_refs()[d].load();
    do {
        if (n <= 0) return CUDA_ERROR_INVALID_CONTEXT;  // not retained
    } while (!primary_refs()[d].compare_exchange_weak(n, n - 1));
    if (n == 1) {
        bump("primary_context_ended");
        drop_device_memory(d);
        forget_modules(d);
        if (primary_charged()[d].exchange(false)) give_context_bytes(d);
        if (st().release_gap_ms) std::this_thread::sleep_for(std::chrono::milliseconds(st().release_gap_ms));
    }
    return CUDA_SUCCESS;
}
// The first ABI, what a static cudart calls at exit.
EMU_EXPORT CUresult cuDevicePrimaryCtxRelease_v1(CUdevice d) __asm__("cuDevicePrimaryCtxRelease");
EMU_EXPORT CUresult cuDevicePrimaryCtxRelease_v1(CUdevice d) {
    bump("cuDevicePrimaryCtxRelease");
    return cuDevicePrimaryCtxRelease_v2(d);
}
EMU_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned int* flags, int* active) {
    if (d < 0 || d >= st().devices) return CUDA_ERROR_INVALID_DEVICE;
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    *flags = 0;
    *active = primary_refs()[d].load() > 0 && !primary_reset()[d].load();
    return CUDA_SUCCESS;
}
// A destroyed green context's CUcontext is made current without a word (an H100, driver
// 580.159.04: cuCtxSetCurrent answered 0, tests/gpu/green_free.cu); each such making is counted, and
// so is each call made while it is current (in_dead_green_context): on an H100 a program that made
// it current and then another context current died of a double free inside libcuda, without
// gpumem (docs/gpu-results.md, runs 167-168), so gpumem's pool must never make it current.
static bool in_dead_green_context();
EMU_EXPORT CUresult cuCtxSetCurrent(CUcontext c) {
    if (dead_green_context(c)) bump("dead_green_made_current");
    t_ctx_dev = c ? dev_of(c) : -1;
    t_ctx_made = is_made(c) ? reinterpret_cast<uintptr_t>(c) : 0;
    if (c) {
        int expected = -1;
        g_default_dev.compare_exchange_strong(expected, dev_of(c));
    }
    return CUDA_SUCCESS;
}
// The context stack: push makes c current and remembers the one before; pop restores it.
thread_local int t_ctx_stack[16];
thread_local uintptr_t t_ctx_made_stack[16];
thread_local int t_ctx_depth = 0;
static CUcontext current_handle() {
    if (t_ctx_dev >= 0 && t_ctx_made) return reinterpret_cast<CUcontext>(t_ctx_made);
    const int d = current_dev();
    return d >= 0 ? ctx_of(d) : nullptr;
}
EMU_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c) {
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    if (dead_green_context(c)) bump("dead_green_made_current");
    if (t_ctx_depth == 16) return CUDA_ERROR_INVALID_VALUE;
    t_ctx_made_stack[t_ctx_depth] = t_ctx_made;
    t_ctx_stack[t_ctx_depth++] = t_ctx_dev;
    t_ctx_dev = dev_of(c);
    t_ctx_made = is_made(c) ? reinterpret_cast<uintptr_t>(c) : 0;
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* c) {
    if (t_ctx_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (c) *c = t_ctx_dev >= 0 ? current_handle() : nullptr;
    t_ctx_dev = t_ctx_stack[--t_ctx_depth];
    t_ctx_made = t_ctx_made_stack[t_ctx_depth];
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuCtxGetCurrent(CUcontext* c) {
    *c = current_handle();
    return CUDA_SUCCESS;
}
// Contexts cuCtxCreate made, live (their handles; the device is the low byte).  Each made one takes
// GPUMEM_EMU_CONTEXT_BYTES and is pushed current, as the driver's are.  The emulated device keeps
// memory by device, not context: a made context's destruction gives back its own bytes only.
static std::mutex g_made_mu;
static std::set<uintptr_t> g_made;
static std::atomic<uintptr_t> g_next_made{1};
// GPUMEM_EMU_CONTEXT_REUSE=1: handles of destroyed contexts (made or green), under g_made_mu.
static std::vector<uintptr_t> g_context_free;
static bool context_reuse() {
    static const bool r = getenv("GPUMEM_EMU_CONTEXT_REUSE") && !strcmp(getenv("GPUMEM_EMU_CONTEXT_REUSE"), "1");
    return r;
}
static void context_handle_freed(CUcontext c) {
    if (!context_reuse()) return;
    std::lock_guard<std::mutex> lk(g_made_mu);
    g_context_free.push_back(reinterpret_cast<uintptr_t>(c));
}
static void forget_dead_green(CUcontext c);  // below, with the green contexts
// A new made or green context's handle: with GPUMEM_EMU_CONTEXT_REUSE=1 the device's last freed
// one (the low byte names the device), else a new one.  Never called under g_green_mu.
static CUcontext next_context_handle(int dev) {
    if (context_reuse()) {
        uintptr_t h = 0;
        {
            std::lock_guard<std::mutex> lk(g_made_mu);
            for (auto it = g_context_free.rbegin(); it != g_context_free.rend(); ++it)
                if (dev_of(reinterpret_cast<CUcontext>(*it)) == dev) {
                    h = *it;
                    g_context_free.erase(std::next(it).base());
                    break;
                }
        }
        if (h) {
            forget_dead_green(reinterpret_cast<CUcontext>(h));  // the handle is a live context's again
            return reinterpret_cast<CUcontext>(h);
        }
    }
    return reinterpret_cast<CUcontext>(uintptr_t(0xC0000 + dev) + (g_next_made.fetch_add(1) << 8));
}
static CUresult make_context(const char* name, CUcontext* c, CUdevice d) {
    bump(name);
    if (!st().initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= st().devices) return CUDA_ERROR_INVALID_DEVICE;
    if (CUresult r = take_context_bytes(d)) return r;
    const CUcontext made = next_context_handle(d);
    {
        std::lock_guard<std::mutex> lk(g_made_mu);
        g_made.insert(reinterpret_cast<uintptr_t>(made));
    }
    *c = made;
    return cuCtxPushCurrent_v2(made);
}
EMU_EXPORT CUresult cuCtxCreate_v1(CUcontext* c, unsigned int, CUdevice d) __asm__("cuCtxCreate");
EMU_EXPORT CUresult cuCtxCreate_v1(CUcontext* c, unsigned int, CUdevice d) { return make_context("cuCtxCreate", c, d); }
EMU_EXPORT CUresult cuCtxCreate_v2(CUcontext* c, unsigned int, CUdevice d) { return make_context("cuCtxCreate_v2", c, d); }
EMU_EXPORT CUresult cuCtxCreate_v3(CUcontext* c, CUexecAffinityParam*, int, unsigned int, CUdevice d) {
    return make_context("cuCtxCreate_v3", c, d);
}
EMU_EXPORT CUresult cuCtxCreate_v4(CUcontext* c, CUctxCreateParams*, unsigned int, CUdevice d) {
    return make_context("cuCtxCreate_v4", c, d);
}
// A kernel that faults (a launch of function 0xfa17): as on the driver, its launch succeeds and the
// context is broken from then on.  On the driver every later call that reaches the device answers
// 700 (CUDA_ERROR_ILLEGAL_ADDRESS, sticky); here only three do, what a program's synchronize and
// the pool's growth call: cuCtxSynchronize, cuMemAlloc_v2, cuMemCreate.  Every other call
// (cuMemGetInfo_v2, cuMemMap, cuLaunchKernel, ...) answers as before the fault.
static constexpr uintptr_t k_faulting_function = 0xfa17;
static std::atomic<bool> g_context_faulted{false};
EMU_EXPORT CUresult cuCtxGetDevice(CUdevice* d) {
    int dev = current_dev();
    if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
    *d = dev;
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuCtxSynchronize() {
    if (in_dead_green_context()) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (g_context_faulted.load()) return CUDA_ERROR_ILLEGAL_ADDRESS;
    if (st().capturing.load()) {
        bump("cuCtxSynchronize_in_capture");
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    // GPUMEM_EMU_SYNC_MS: a device that takes this long to drain (the counter moves when it is done).
    static const long sync_ms = getenv("GPUMEM_EMU_SYNC_MS") ? atol(getenv("GPUMEM_EMU_SYNC_MS")) : 0;
    if (sync_ms > 0) usleep(useconds_t(sync_ms) * 1000);
    bump("cuCtxSynchronize");
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuStreamSynchronize(CUstream) {
    bump("cuStreamSynchronize");
    return CUDA_SUCCESS;
}
// Context teardown frees the context's memory and closes the IPC memory opened in it, as the real
// driver does.  Called at a primary context's end (a last release, a reset, a destroy), whose
// peer access goes with it: a context made anew with its handle has none.
static void drop_device_memory(int dev) {
    emu_state& s = st();
    std::lock_guard<std::mutex> g(s.mu);
    s.peer_access.erase(reinterpret_cast<uintptr_t>(ctx_of(dev)));
    for (auto it = s.device_allocs.begin(); it != s.device_allocs.end();) {
        if (it->second.dev == dev) {
            s.used[dev] -= it->second.size;
            it = s.device_allocs.erase(it);
        } else {
            ++it;
        }
    }
    for (auto it = s.opened.begin(); it != s.opened.end();) it = it->second.dev == dev ? s.opened.erase(it) : std::next(it);
}
// The first ABIs (the names cuda.h renames): what a resolver asked for an old version hands out,
// and what a static cudart 13 calls for cudaDeviceReset (H200 run 112).
EMU_EXPORT CUresult cuCtxDestroy_v1(CUcontext c) __asm__("cuCtxDestroy");
EMU_EXPORT CUresult cuDevicePrimaryCtxReset_v1(CUdevice d) __asm__("cuDevicePrimaryCtxReset");
EMU_EXPORT CUresult cuCtxDestroy_v1(CUcontext c) {
    bump("cuCtxDestroy");
    return cuCtxDestroy_v2(c);
}
EMU_EXPORT CUresult cuDevicePrimaryCtxReset_v1(CUdevice d) {
    bump("cuDevicePrimaryCtxReset");
    return cuDevicePrimaryCtxReset_v2(d);
}
// Every emulated context is its device's primary one, which the driver refuses to destroy
// (CUDA_ERROR_INVALID_CONTEXT on the H200): it lives on, with its memory.  GPUMEM_EMU_DESTROY_PRIMARY=1
// emulates a driver that destroys it (its memory freed, its modules unloaded).
EMU_EXPORT CUresult cuCtxDestroy_v2(CUcontext c) {
    if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    if (is_made(c)) {  // a context cuCtxCreate made: its bytes go back, and it is no longer current here
        {
            std::lock_guard<std::mutex> lk(g_made_mu);
            if (!g_made.erase(reinterpret_cast<uintptr_t>(c))) return CUDA_ERROR_INVALID_CONTEXT;
        }
        {
            std::lock_guard<std::mutex> g(st().mu);
            st().peer_access.erase(reinterpret_cast<uintptr_t>(c));  // a context made with the handle has none
        }
        context_handle_freed(c);
        give_context_bytes(dev_of(c));
        if (t_ctx_made == reinterpret_cast<uintptr_t>(c)) {
            if (t_ctx_depth > 0) cuCtxPopCurrent_v2(nullptr);
            else t_ctx_dev = -1, t_ctx_made = 0;
        }
        return CUDA_SUCCESS;
    }
    static const bool destroys = getenv("GPUMEM_EMU_DESTROY_PRIMARY") && !strcmp(getenv("GPUMEM_EMU_DESTROY_PRIMARY"), "1");
    if (!destroys) return CUDA_ERROR_INVALID_CONTEXT;
    drop_device_memory(dev_of(c));
    forget_modules(dev_of(c));
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) {
    drop_device_memory(d);
    forget_modules(d);
    if (d >= 0 && d < 16) primary_reset()[d].store(true);
    return CUDA_SUCCESS;
}
static CUresult make_stream(CUstream* s) {
    static std::atomic<uintptr_t> next{0x5000};
    *s = reinterpret_cast<CUstream>(next.fetch_add(0x10));
    std::lock_guard<std::mutex> lk(st().capture_mu);
    st().stream_devices[*s] = current_dev();
    return CUDA_SUCCESS;
}
// The device of a stream: the legacy, per-thread and null streams are the current context's.
static int stream_device(CUstream s) {
    if (s && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD) {
        std::lock_guard<std::mutex> lk(st().capture_mu);
        auto it = st().stream_devices.find(s);
        if (it != st().stream_devices.end()) return it->second;
    }
    return current_dev();
}
EMU_EXPORT CUresult cuStreamGetDevice(CUstream s, CUdevice* d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    const int dev = stream_device(s);
    if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
    *d = dev;
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuStreamCreate(CUstream* s, unsigned int) { return make_stream(s); }
EMU_EXPORT CUresult cuStreamCreateWithPriority(CUstream* s, unsigned int, int) { return make_stream(s); }
// What the resolver hands out for cuStreamCreateWithPriority under GPUMEM_EMU_UNKNOWN_STREAM_FN=1:
// a function the interposer has never seen (a newer driver's variant), so it cannot wrap it.
static CUresult unknown_stream_create_with_priority(CUstream* s, unsigned int, int) {
    bump("unknown_stream_create");
    return make_stream(s);
}
EMU_EXPORT CUresult cuStreamDestroy_v2(CUstream) {
    bump("cuStreamDestroy_v2");
    return CUDA_SUCCESS;
}
// Green contexts (CUDA 12.4).  cuGreenCtxCreate takes GPUMEM_EMU_CONTEXT_BYTES of its own and
// retains the device's primary context (making it, with its bytes, when it has no reference), as
// the driver documents; cuGreenCtxDestroy gives its bytes back and releases the primary context,
// which may be that context's last release (its end, as by cuDevicePrimaryCtxRelease).
// cuCtxFromGreenCtx gives the green context's own CUcontext (a made context's kind of handle, on
// its device); cuGreenCtxStreamCreate makes a stream of it.  The resource descriptor is not read.
struct green_ctx {
    int dev;
    CUcontext ctx;
    bool live;
};
static std::mutex g_green_mu;
static std::map<uintptr_t, green_ctx> g_greens;            // handle -> green context (destroyed ones kept, not live)
static std::map<CUstream, uintptr_t> g_green_streams;      // stream -> its green context
// GPUMEM_EMU_GREEN_REUSE=1: cuGreenCtxCreate hands out the handle of the green context destroyed
// last, as a driver whose green context objects come from malloc may (a stream of the old one then
// reads as the new one's: no scenario uses both).  gpumem_emu_on_green_destroyed(fn): fn(g) runs
// inside each cuGreenCtxDestroy once g is dead, so that another thread's cuGreenCtxCreate may get
// its handle back, before the primary context's release and with no lock of this driver's held.
static std::vector<uintptr_t> g_green_free;                // destroyed handles, reused last first
static std::atomic<void (*)(CUgreenCtx)> g_on_green_destroyed{nullptr};
EMU_EXPORT void gpumem_emu_on_green_destroyed(void (*fn)(CUgreenCtx)) { g_on_green_destroyed.store(fn); }
static bool green_of(CUgreenCtx g, green_ctx* out) {
    std::lock_guard<std::mutex> lk(g_green_mu);
    auto it = g_greens.find(reinterpret_cast<uintptr_t>(g));
    if (it == g_greens.end() || !it->second.live) return false;
    *out = it->second;
    return true;
}
// The context whose memory an allocation on dev made now is: a context cuCtxCreate made, if
// current (on dev); else dev's primary context, a green context's own CUcontext current included
// (an H100: such memory is the primary context's, tests/gpu/green_free.cu).
namespace {
uint64_t memory_context_now(int dev) {
    if (t_ctx_made && dev_of(reinterpret_cast<CUcontext>(t_ctx_made)) == dev) {
        std::lock_guard<std::mutex> lk(g_made_mu);
        if (g_made.count(t_ctx_made)) return t_ctx_made;
    }
    return reinterpret_cast<uintptr_t>(ctx_of(dev));
}
}  // namespace
// The context whose memory peer access to c opens: c, or for a green context's own CUcontext
// its primary context (its memory is that one's).
static uint64_t peer_memory_context(CUcontext c) {
    std::lock_guard<std::mutex> lk(g_green_mu);
    for (auto& [h, gc] : g_greens)
        if (gc.ctx == c) return reinterpret_cast<uintptr_t>(ctx_of(gc.dev));
    return reinterpret_cast<uintptr_t>(c);
}
EMU_EXPORT CUresult cuGreenCtxCreate(CUgreenCtx* g, CUdevResourceDesc, CUdevice dev, unsigned int) {
    bump("cuGreenCtxCreate");
    if (!st().initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= st().devices) return CUDA_ERROR_INVALID_DEVICE;
    if (CUresult r = take_context_bytes(dev)) return r;
    CUcontext primary = nullptr;
    if (CUresult r = cuDevicePrimaryCtxRetain(&primary, dev)) {
        give_context_bytes(dev);
        return r;
    }
    static std::atomic<uintptr_t> next{0xE0000};
    const CUcontext own = next_context_handle(dev);  // before the lock: it may take it
    std::lock_guard<std::mutex> lk(g_green_mu);
    uintptr_t h = 0;
    if (!g_green_free.empty()) {
        h = g_green_free.back();
        g_green_free.pop_back();
    } else {
        h = next.fetch_add(0x10);
    }
    g_greens[h] = green_ctx{dev, own, true};
    *g = reinterpret_cast<CUgreenCtx>(h);
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuGreenCtxDestroy(CUgreenCtx g) {
    bump("cuGreenCtxDestroy");
    int dev = -1;
    CUcontext own = nullptr;
    {
        std::lock_guard<std::mutex> lk(g_green_mu);
        auto it = g_greens.find(reinterpret_cast<uintptr_t>(g));
        if (it == g_greens.end() || !it->second.live) return CUDA_ERROR_INVALID_CONTEXT;
        // GPUMEM_EMU_GREEN_DESTROY_REFUSE=N: the Nth destroy of a live one is refused, nothing done.
        static const long refuse_nth = getenv("GPUMEM_EMU_GREEN_DESTROY_REFUSE") ? atol(getenv("GPUMEM_EMU_GREEN_DESTROY_REFUSE")) : 0;
        static long live_destroys = 0;  // under g_green_mu
        if (++live_destroys == refuse_nth) {
            bump("green_destroy_refused");
            return CUDA_ERROR_INVALID_VALUE;
        }
        it->second.live = false;
        dev = it->second.dev;
        own = it->second.ctx;
        static const bool reuse = getenv("GPUMEM_EMU_GREEN_REUSE") && !strcmp(getenv("GPUMEM_EMU_GREEN_REUSE"), "1");
        if (reuse) g_green_free.push_back(it->first);
    }
    context_handle_freed(own);
    if (auto fn = g_on_green_destroyed.load()) fn(g);
    give_context_bytes(dev);
    return cuDevicePrimaryCtxRelease_v2(dev);
}
EMU_EXPORT CUresult cuCtxFromGreenCtx(CUcontext* c, CUgreenCtx g) {
    bump("cuCtxFromGreenCtx");
    green_ctx gc;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    if (!green_of(g, &gc)) return CUDA_ERROR_INVALID_CONTEXT;
    *c = gc.ctx;
    return CUDA_SUCCESS;
}
// After its green context's destruction a stream of it is refused by every call but its
// destruction (CUDA_ERROR_CONTEXT_IS_DESTROYED, cuda.h 13.0), each such call counted: an event
// recorded, a query or a wait there by the pool would be a bug.
static bool dead_green_context(CUcontext c) {
    if (!is_made(c)) return false;
    std::lock_guard<std::mutex> lk(g_green_mu);
    for (auto& [h, gc] : g_greens)
        if (gc.ctx == c) return !gc.live;
    return false;
}
static bool in_dead_green_context() {
    if (!t_ctx_made || !dead_green_context(reinterpret_cast<CUcontext>(t_ctx_made))) return false;
    bump("call_in_dead_green_context");
    return true;
}
// Events made while a green context was current: after its destruction each use is counted and
// refused, as for its streams.
static std::map<uintptr_t, CUcontext> g_green_events;  // event -> the green context's CUcontext, under g_green_mu
// A dead green context's CUcontext handed out again (GPUMEM_EMU_CONTEXT_REUSE): the old entry, and
// the events made in it, no longer name the handle, which is now a live context's.
static void forget_dead_green(CUcontext c) {
    std::lock_guard<std::mutex> lk(g_green_mu);
    for (auto& [h, gc] : g_greens)
        if (gc.ctx == c && !gc.live) gc.ctx = nullptr;
    for (auto it = g_green_events.begin(); it != g_green_events.end();) it = it->second == c ? g_green_events.erase(it) : std::next(it);
}
static bool dead_green_event(CUevent e) {
    std::lock_guard<std::mutex> lk(g_green_mu);
    auto it = g_green_events.find(reinterpret_cast<uintptr_t>(e));
    if (it == g_green_events.end()) return false;
    for (auto& [h, gc] : g_greens)
        if (gc.ctx == it->second && !gc.live) {
            bump("call_on_dead_green_event");
            return true;
        }
    return false;
}
static bool on_dead_green_stream(CUstream s) {
    std::lock_guard<std::mutex> lk(g_green_mu);
    auto it = g_green_streams.find(s);
    if (it == g_green_streams.end()) return false;
    auto g = g_greens.find(it->second);
    if (g == g_greens.end() || g->second.live) return false;
    bump("call_on_dead_green_stream");
    return true;
}
EMU_EXPORT CUresult cuGreenCtxStreamCreate(CUstream* s, CUgreenCtx g, unsigned int, int) {
    green_ctx gc;
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    if (!green_of(g, &gc)) return CUDA_ERROR_INVALID_CONTEXT;
    make_stream(s);
    std::lock_guard<std::mutex> lk(g_green_mu);
    g_green_streams[*s] = reinterpret_cast<uintptr_t>(g);
    return CUDA_SUCCESS;
}
// Events.  The emulated device runs nothing, so every event is reached the moment it is recorded:
// queries say done (unless GPUMEM_EMU_EVENTS_PENDING=1, below) and a synchronize returns at once
// (each counted, so tests see who blocks).
EMU_EXPORT CUresult cuEventCreate(CUevent* e, unsigned int) {
    static std::atomic<uintptr_t> next{0x9000};
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    if (current_dev() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (in_dead_green_context()) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    bump("cuEventCreate");
    *e = reinterpret_cast<CUevent>(next.fetch_add(0x10));
    if (t_ctx_made) {
        std::lock_guard<std::mutex> lk(g_green_mu);
        for (auto& [h, gc] : g_greens)
            if (gc.live && gc.ctx == reinterpret_cast<CUcontext>(t_ctx_made)) g_green_events[reinterpret_cast<uintptr_t>(*e)] = gc.ctx;
    }
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuEventRecord(CUevent e, CUstream s) {
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    if (on_dead_green_stream(s) || dead_green_event(e) || in_dead_green_context()) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (st().capturing.load()) {
        bump("cuEventRecord_in_capture");
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
    bump("cuEventRecord");
    return CUDA_SUCCESS;
}
// A stream made to wait for an event (the pool's ordered release): every event is reached, so the
// wait is over at once; counted so that tests see which streams were ordered.
EMU_EXPORT CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int) {
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    if (on_dead_green_stream(s) || dead_green_event(e) || in_dead_green_context()) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (st().capturing.load()) {
        bump("cuStreamWaitEvent_in_capture");
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
    bump("cuStreamWaitEvent");
    return CUDA_SUCCESS;
}
// GPUMEM_EMU_EVENTS_PENDING=1: a device that never catches up while the host only asks: every
// query says not reached (a synchronize still returns, as the host then waited), so the pool's
// ordered releases stay pending and a stream made after one must be made to wait.
EMU_EXPORT CUresult cuEventQuery(CUevent e) {
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    if (dead_green_event(e)) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    bump("cuEventQuery");
    static const bool pending = getenv("GPUMEM_EMU_EVENTS_PENDING") && !strcmp(getenv("GPUMEM_EMU_EVENTS_PENDING"), "1");
    return pending ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
// The emulated device runs nothing: every stream is idle, unless GPUMEM_EMU_STREAMS_BUSY=1 says
// every stream still has work (so fences need an event on each).  A query during a capture is
// counted as misuse (on a real driver it invalidates the capture).
// A per-thread variant gpumem has no typed wrapper for (its resolved pointer becomes a thunk).
EMU_EXPORT CUresult cuStreamQuery_ptsz(CUstream) {
    bump("cuStreamQuery_ptsz");
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuStreamQuery(CUstream s) {
    if (on_dead_green_stream(s)) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (st().capturing.load()) {
        bump("cuStreamQuery_in_capture");
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    bump("cuStreamQuery");
    static const bool busy = getenv("GPUMEM_EMU_STREAMS_BUSY") && !strcmp(getenv("GPUMEM_EMU_STREAMS_BUSY"), "1");
    return busy ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuEventSynchronize(CUevent e) {
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    if (dead_green_event(e)) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    // GPUMEM_EMU_SYNC_MS: as for cuCtxSynchronize, a device that takes this long to get there.
    static const long sync_ms = getenv("GPUMEM_EMU_SYNC_MS") ? atol(getenv("GPUMEM_EMU_SYNC_MS")) : 0;
    if (sync_ms > 0) usleep(useconds_t(sync_ms) * 1000);
    bump("cuEventSynchronize");
    return CUDA_SUCCESS;
}
// Launches run nothing.  They check that every argument arrived as the test program passed it
// (grid 11 12 13, block 14 15 16, 17 bytes, params 0x1234, extra 0x5678), which a thunk or
// wrapper between the two must not disturb, and count the stream kinds they saw.
// Lazy loading (CUDA_MODULE_LOADING=LAZY, the default): the first launch of a function loads its
// module, which takes device memory; with too little left the launch fails with OUT_OF_MEMORY and
// launches nothing, and, as on the H200 (run 105), the function is never loaded again: each later
// launch of it fails with CUDA_ERROR_UNKNOWN ("not loaded").  An explicit module load that failed
// may be made again.  GPUMEM_EMU_MODULE_BYTES (default 0: no memory) is each module's size.
// A context's end (cuCtxDestroy, cuDevicePrimaryCtxReset) unloads its modules: the next context
// loads them again.  Loaded and lost modules, with their device; g_mod_mu before st().mu.
static std::mutex g_mod_mu;
static std::map<const void*, int> g_loaded, g_failed;
static void forget_modules(int dev) {
    std::lock_guard<std::mutex> lk(g_mod_mu);
    for (auto* m : {&g_loaded, &g_failed})
        for (auto it = m->begin(); it != m->end();) it = it->second == dev ? m->erase(it) : std::next(it);
}
static CUresult load_module_of(const void* f, bool lazy) {
    static const uint64_t bytes = getenv("GPUMEM_EMU_MODULE_BYTES") ? strtoull(getenv("GPUMEM_EMU_MODULE_BYTES"), nullptr, 10) : 0;
    if (bytes == 0) return CUDA_SUCCESS;
    std::lock_guard<std::mutex> lk(g_mod_mu);
    if (g_loaded.count(f)) return CUDA_SUCCESS;
    if (g_failed.count(f)) return CUDA_ERROR_UNKNOWN;
    CUdeviceptr code = 0;
    if (CUresult r = device_alloc(&code, bytes, 0)) {
        if (lazy) g_failed.emplace(f, current_dev());
        return r;
    }
    bump("module_loaded");  // kept: the module stays loaded
    g_loaded.emplace(f, current_dev());
    return CUDA_SUCCESS;
}
static CUresult emu_launch(const char* name, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                           unsigned bz, unsigned smem, CUstream s, void** params, void** extra) {
    bump(name);
    if (s == CU_STREAM_PER_THREAD) bump("launch_on_per_thread_handle");
    const bool ok = gx == 11 && gy == 12 && gz == 13 && bx == 14 && by == 15 && bz == 16 && smem == 17 &&
                    params == reinterpret_cast<void**>(0x1234) && extra == reinterpret_cast<void**>(0x5678);
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    if (reinterpret_cast<uintptr_t>(f) == k_faulting_function) {
        g_context_faulted = true;
        return CUDA_SUCCESS;
    }
    return load_module_of(f, true);
}
// A CUkernel is one handle for every device, loaded lazily on each device it is used on; its
// attribute query loads it on the device it names, not the current context's (as on the driver).
EMU_EXPORT CUresult cuKernelGetAttribute(int* pi, CUfunction_attribute attrib, CUkernel k, CUdevice dev) {
    bump("cuKernelGetAttribute");
    (void)attrib;
    if (!pi || !k || dev < 0 || dev >= st().devices) return CUDA_ERROR_INVALID_VALUE;
    const int saved = t_ctx_dev;
    t_ctx_dev = dev;  // device_alloc takes the module's memory on the current device
    const CUresult r = load_module_of(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(k) + (uintptr_t(dev) << 40)), true);
    t_ctx_dev = saved;
    if (r == CUDA_SUCCESS) *pi = 0;
    return r;
}
// A module load (cuModuleLoadData) takes the same memory at once; the handle is the image.
EMU_EXPORT CUresult cuModuleLoadData(CUmodule* m, const void* image) {
    bump("cuModuleLoadData");
    if (!m || !image) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = load_module_of(image, false)) return r;
    *m = reinterpret_cast<CUmodule>(const_cast<void*>(image));
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                   unsigned smem, CUstream s, void** params, void** extra) {
    return emu_launch("cuLaunchKernel", f, gx, gy, gz, bx, by, bz, smem, s, params, extra);
}
EMU_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                        unsigned bz, unsigned smem, CUstream s, void** params, void** extra) {
    return emu_launch("cuLaunchKernel_ptsz", f, gx, gy, gz, bx, by, bz, smem, s, params, extra);
}
EMU_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* c, CUfunction f, void** params, void** extra) {
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    return emu_launch("cuLaunchKernelEx", f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
                      c->sharedMemBytes, c->hStream, params, extra);
}
// Cooperative launches and graphs (each with its per-thread twin, counted apart): a graph's
// instantiation, and an executable graph's first upload or launch, take memory of their own
// (GPUMEM_EMU_MODULE_BYTES, kept, once per handle), and so does a cooperative launch of a function
// (its grid's).  Failed for want of memory they did nothing and may be made again.  A cooperative
// launch checks its arguments as the launches do; an instantiation's executable graph is its graph.
static CUresult emu_cooperative(const char* name, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                unsigned by, unsigned bz, unsigned smem, CUstream s, void** params) {
    bump(name);
    if (s == CU_STREAM_PER_THREAD) bump("launch_on_per_thread_handle");
    const bool ok = gx == 11 && gy == 12 && gz == 13 && bx == 14 && by == 15 && bz == 16 && smem == 17 &&
                    params == reinterpret_cast<void**>(0x1234);
    return ok ? load_module_of(f, false) : CUDA_ERROR_INVALID_VALUE;
}
EMU_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                              unsigned bz, unsigned smem, CUstream s, void** params) {
    return emu_cooperative("cuLaunchCooperativeKernel", f, gx, gy, gz, bx, by, bz, smem, s, params);
}
EMU_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                                   unsigned by, unsigned bz, unsigned smem, CUstream s, void** params) {
    return emu_cooperative("cuLaunchCooperativeKernel_ptsz", f, gx, gy, gz, bx, by, bz, smem, s, params);
}
static CUresult emu_instantiate(const char* name, CUgraphExec* e, CUgraph g) {
    bump(name);
    if (!e || !g) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = load_module_of(g, false)) return r;
    *e = reinterpret_cast<CUgraphExec>(g);
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec* e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS*) {
    return emu_instantiate("cuGraphInstantiateWithParams", e, g);
}
EMU_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec* e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS*) {
    return emu_instantiate("cuGraphInstantiateWithParams_ptsz", e, g);
}
static CUresult emu_graph_run(const char* name, CUgraphExec e) {
    bump(name);
    return e ? load_module_of(e, false) : CUDA_ERROR_INVALID_VALUE;
}
EMU_EXPORT CUresult cuGraphUpload(CUgraphExec e, CUstream) { return emu_graph_run("cuGraphUpload", e); }
EMU_EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec e, CUstream) { return emu_graph_run("cuGraphUpload_ptsz", e); }
EMU_EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
    if (s == CU_STREAM_PER_THREAD) bump("launch_on_per_thread_handle");
    return emu_graph_run("cuGraphLaunch", e);
}
EMU_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream) { return emu_graph_run("cuGraphLaunch_ptsz", e); }
EMU_EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
    std::lock_guard<std::mutex> lk(st().capture_mu);
    if (!st().capturing_streams.emplace(s, emu_state::capture_rec{long(syscall(SYS_gettid)), int(mode), false}).second)
        return CUDA_ERROR_ILLEGAL_STATE;  // already capturing
    st().capturing.fetch_add(1);
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode m) { return cuStreamBeginCapture_v2(s, m); }
// The first ABI, without a mode (CUDA 10.0): a relaxed capture, as on the H200 (run 95).
EMU_EXPORT CUresult cuStreamBeginCapture_v1(CUstream s) __asm__("cuStreamBeginCapture");
EMU_EXPORT CUresult cuStreamBeginCapture_v1(CUstream s) { return cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED); }
EMU_EXPORT CUresult cuStreamBeginCapture_v1_ptsz(CUstream s) __asm__("cuStreamBeginCapture_ptsz");
EMU_EXPORT CUresult cuStreamBeginCapture_v1_ptsz(CUstream s) { return cuStreamBeginCapture_v1(s); }
EMU_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph, const CUgraphNode*, const CUgraphEdgeData*, size_t,
                                                CUstreamCaptureMode m) {
    return cuStreamBeginCapture_v2(s, m);
}
EMU_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode* d, const CUgraphEdgeData* e,
                                                     size_t n, CUstreamCaptureMode m) {
    return cuStreamBeginCaptureToGraph(s, g, d, e, n, m);
}
EMU_EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph* g) {
    std::lock_guard<std::mutex> lk(st().capture_mu);
    auto it = st().capturing_streams.find(s);
    if (it == st().capturing_streams.end()) return CUDA_ERROR_ILLEGAL_STATE;  // not capturing: no capture ends
    // (A relaxed capture may be ended by any thread, says the CUDA documentation.)
    bool wrong_thread = it->second.tid != long(syscall(SYS_gettid)) && it->second.mode != CU_STREAM_CAPTURE_MODE_RELAXED;
    bool invalidated = it->second.invalidated;
    st().capturing_streams.erase(it);
    st().capturing.fetch_sub(1);
    // An end from another thread than the one that began the capture is refused, and the capture
    // ends all the same: measured on the H200 (tests/gpu/capture_end_check.py, global mode; the
    // thread that began it then gets CUDA_ERROR_ILLEGAL_STATE).
    if (wrong_thread) return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    if (g) *g = nullptr;
    return invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph* g) { return cuStreamEndCapture(s, g); }
// Streams are keyed as the program passed them (no per-thread or legacy mapping, and no implicit
// capture of the legacy stream): what the tests' scenarios need.
EMU_EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* status) {
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    bump("cuStreamIsCapturing");
    std::lock_guard<std::mutex> lk(st().capture_mu);
    auto it = st().capturing_streams.find(s);
    *status = it == st().capturing_streams.end() ? CU_STREAM_CAPTURE_STATUS_NONE
              : it->second.invalidated           ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                                 : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    return CUDA_SUCCESS;
}
// The calling thread's capture mode (cuThreadExchangeStreamCaptureMode; global by default).
static thread_local int t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
EMU_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
    if (!mode) return CUDA_ERROR_INVALID_VALUE;
    int old = t_capture_mode;
    t_capture_mode = int(*mode);
    *mode = CUstreamCaptureMode(old);
    return CUDA_SUCCESS;
}
// cuMemAlloc, cuMemFree and cuMemFreeAsync on a stream not captured are "potentially unsafe"
// inside a capture: refused with
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, invalidating the captures that forbid them, for a thread
// not in relaxed mode whose own capture is not relaxed, or in global mode while any thread has a
// global capture open (the H200's answers, tests/gpu/capture_mode_check.py, runs 93 and 97).
static bool unsafe_call_refused() {
    if (!st().capturing.load() || t_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return false;
    const long me = long(syscall(SYS_gettid));
    std::lock_guard<std::mutex> lk(st().capture_mu);
    bool refused = false;
    for (auto& [stream, c] : st().capturing_streams) {
        const bool forbids = c.tid == me ? c.mode != CU_STREAM_CAPTURE_MODE_RELAXED
                                         : t_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                                               c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
        if (forbids) refused = c.invalidated = true;
    }
    if (refused) bump("unsafe_call_in_capture");
    return refused;
}
static bool stream_capturing(CUstream s) {
    std::lock_guard<std::mutex> lk(st().capture_mu);
    return st().capturing_streams.count(s) != 0;
}
EMU_EXPORT CUresult cuGetErrorString(CUresult e, const char** s) {
    *s = e == CUDA_SUCCESS ? "no error" : e == CUDA_ERROR_OUT_OF_MEMORY ? "out of memory" : "emulated error";
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuGetErrorName(CUresult e, const char** s) {
    *s = e == CUDA_SUCCESS ? "CUDA_SUCCESS" : e == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_UNKNOWN";
    return CUDA_SUCCESS;
}

// ---- Memory --------------------------------------------------------------------------------------
EMU_EXPORT CUresult cuMemGetInfo_v2(size_t* free_b, size_t* total_b) {
    bump("cuMemGetInfo_v2");
    int dev = current_dev();
    if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (in_dead_green_context()) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    std::lock_guard<std::mutex> g(st().mu);
    *free_b = st().capacity - st().used[dev];
    *total_b = st().capacity;
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t size) {
    bump("cuMemAlloc_v2");
    if (unsafe_call_refused()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (in_dead_green_context()) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (g_context_faulted.load()) return CUDA_ERROR_ILLEGAL_ADDRESS;
    return device_alloc(p, size, 0);
}
static bool host_pool_free(CUdeviceptr p);
EMU_EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
    bump("cuMemFree_v2");
    if (unsafe_call_refused()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (host_pool_free(p)) return CUDA_SUCCESS;
    return device_free(p);
}
EMU_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* p, size_t* pitch, size_t width, size_t height, unsigned int) {
    bump("cuMemAllocPitch_v2");
    if (!pitch) return CUDA_ERROR_INVALID_VALUE;
    *pitch = align_up(width, 512);
    return device_alloc(p, *pitch * height, 0);
}
EMU_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* p, size_t size, unsigned int) {
    bump("cuMemAllocManaged");
    return device_alloc(p, size, 1);
}
// CUDA arrays (textures): device memory of width x height x depth elements of 4 bytes a channel
// (every format is charged as a float), the handle the allocation's address.  A mipmapped array
// is charged its level 0 twice.  Failed for want of memory, they did nothing.
static CUresult array_alloc(void* handle_out, size_t w, size_t h, size_t d, unsigned channels, size_t times) {
    if (!handle_out) return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr p = 0;
    const uint64_t bytes = uint64_t(w) * (h ? h : 1) * (d ? d : 1) * (channels ? channels : 1) * 4 * times;
    if (CUresult r = device_alloc(&p, bytes, 0)) return r;
    *static_cast<void**>(handle_out) = reinterpret_cast<void*>(uintptr_t(p));
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuArrayCreate_v2(CUarray* a, const CUDA_ARRAY_DESCRIPTOR* d) {
    bump("cuArrayCreate_v2");
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    return array_alloc(a, d->Width, d->Height, 0, d->NumChannels, 1);
}
EMU_EXPORT CUresult cuArray3DCreate_v2(CUarray* a, const CUDA_ARRAY3D_DESCRIPTOR* d) {
    bump("cuArray3DCreate_v2");
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    return array_alloc(a, d->Width, d->Height, d->Depth, d->NumChannels, 1);
}
EMU_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray* a, const CUDA_ARRAY3D_DESCRIPTOR* d, unsigned int levels) {
    bump("cuMipmappedArrayCreate");
    if (!d || levels == 0) return CUDA_ERROR_INVALID_VALUE;
    return array_alloc(a, d->Width, d->Height, d->Depth, d->NumChannels, levels > 1 ? 2 : 1);
}
EMU_EXPORT CUresult cuArrayDestroy(CUarray a) { return device_free(CUdeviceptr(reinterpret_cast<uintptr_t>(a))); }
EMU_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) {
    return device_free(CUdeviceptr(reinterpret_cast<uintptr_t>(a)));
}
// cuCtxSetLimit's malloc heap (CU_LIMIT_MALLOC_HEAP_SIZE) is device memory of its size, per device;
// the old heap goes when a new one is made.  Other limits take nothing.
EMU_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
    bump("cuCtxSetLimit");
    if (limit != CU_LIMIT_MALLOC_HEAP_SIZE) return CUDA_SUCCESS;
    static std::mutex mu;
    static CUdeviceptr heap[16] = {};
    const int dev = current_dev();
    if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
    std::lock_guard<std::mutex> lk(mu);
    CUdeviceptr p = 0;
    if (value)
        if (CUresult r = device_alloc(&p, value, 0)) return r;
    if (heap[dev]) device_free(heap[dev]);
    heap[dev] = p;
    return CUDA_SUCCESS;
}
// A stream-ordered allocation on a capturing stream is a graph allocation, which the capture may free
// (freed at once here: the emulated device launches no graph).
static CUresult ordered_alloc(CUdeviceptr* p, size_t size, CUstream s) {
    CUresult r = device_alloc(p, size, 0, stream_device(s));
    if (r == CUDA_SUCCESS && stream_capturing(s)) {
        std::lock_guard<std::mutex> lk(st().capture_mu);
        st().graph_allocs[uint64_t(*p)] = 1;
    }
    return r;
}
EMU_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* p, size_t size, CUstream s) {
    bump("cuMemAllocAsync");
    return ordered_alloc(p, size, s);
}
EMU_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* p, size_t size, CUstream s) { return cuMemAllocAsync(p, size, s); }
// During a capture of its stream the free becomes a free node, which only a graph allocation may
// have (cuMemFreeAsync's documentation): any other pointer is refused and nothing is freed.  The
// real driver's code for this is unverified on a machine without a GPU: CUDA_ERROR_INVALID_VALUE
// here, and the capture is not marked invalidated (the emulated captures have no such state).
EMU_EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
    bump("cuMemFreeAsync");
    if (stream_capturing(s)) {
        std::lock_guard<std::mutex> lk(st().capture_mu);
        if (!st().graph_allocs.erase(uint64_t(p))) return CUDA_ERROR_INVALID_VALUE;
    } else if (unsafe_call_refused()) {
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // on a stream no capture holds: as cuMemFree (H200, run 97)
    }
    if (host_pool_free(p)) return CUDA_SUCCESS;
    return device_free(p);
}
EMU_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return cuMemFreeAsync(p, s); }
// A device's default pool: one handle per device, never made nor destroyed by the program.
static CUmemoryPool default_pool(int dev) { return reinterpret_cast<CUmemoryPool>(uintptr_t(0xD000 + dev)); }
EMU_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice dev) {
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    if (!st().initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= st().devices) return CUDA_ERROR_INVALID_DEVICE;
    *pool = default_pool(dev);
    return CUDA_SUCCESS;
}
// The driver's rules for a pool's properties (cuda.h, cuMemPoolCreate): a pinned pool on a device,
// the host (handleTypes 0: not IPC capable) or a host NUMA node; a managed pool anywhere of those or
// nowhere (CU_MEM_LOCATION_TYPE_NONE).  HOST_NUMA_CURRENT is refused.
static bool pool_props_valid(const CUmemPoolProps& p) {
    const int loc = p.location.type;
    if (p.allocType == CU_MEM_ALLOCATION_TYPE_MANAGED && loc == CU_MEM_LOCATION_TYPE_NONE) return true;
    if (p.allocType != CU_MEM_ALLOCATION_TYPE_PINNED && p.allocType != CU_MEM_ALLOCATION_TYPE_MANAGED) return false;
    if (loc == CU_MEM_LOCATION_TYPE_DEVICE) return p.location.id >= 0 && p.location.id < st().devices;
    if (loc == CU_MEM_LOCATION_TYPE_HOST) return p.handleTypes == CU_MEM_HANDLE_TYPE_NONE;
    return loc == CU_MEM_LOCATION_TYPE_HOST_NUMA && p.location.id >= 0;
}
EMU_EXPORT CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
    bump("cuMemPoolCreate");
    if (!pool || !props || !pool_props_valid(*props)) return CUDA_ERROR_INVALID_VALUE;
    if (!st().initialized) return CUDA_ERROR_NOT_INITIALIZED;
    emu_state& s = st();
    std::lock_guard<std::mutex> g(s.mu);
    uint64_t h = s.next_pool_handle;
    if (!s.free_pool_handles.empty()) {
        h = *s.free_pool_handles.begin();
        s.free_pool_handles.erase(s.free_pool_handles.begin());
    } else {
        s.next_pool_handle += 0x10;
    }
    s.mem_pools[h] = *props;
    *pool = reinterpret_cast<CUmemoryPool>(uintptr_t(h));
    return CUDA_SUCCESS;
}
// Outstanding allocations stay valid, as the driver's do (freed once the last goes).
EMU_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    bump("cuMemPoolDestroy");
    emu_state& s = st();
    std::lock_guard<std::mutex> g(s.mu);
    auto it = s.mem_pools.find(uint64_t(uintptr_t(pool)));
    if (it == s.mem_pools.end()) return CUDA_ERROR_INVALID_VALUE;  // a default pool, or none
    s.free_pool_handles.insert(it->first);
    s.mem_pools.erase(it);
    return CUDA_SUCCESS;
}
// A location's default pool of a type: the device's own for pinned memory on a device (as
// cuDeviceGetDefaultMemPool), else one handle per location and type, made at the first ask.
static CUresult location_default_pool(CUmemoryPool* pool, const CUmemLocation* location, CUmemAllocationType type) {
    if (!pool || !location) return CUDA_ERROR_INVALID_VALUE;
    if (!st().initialized) return CUDA_ERROR_NOT_INITIALIZED;
    CUmemPoolProps props{};
    props.allocType = type;
    props.location = *location;
    if (location->type == CU_MEM_LOCATION_TYPE_HOST) props.location.id = 0;
    if (!pool_props_valid(props)) return CUDA_ERROR_INVALID_VALUE;
    if (type == CU_MEM_ALLOCATION_TYPE_PINNED && location->type == CU_MEM_LOCATION_TYPE_DEVICE) {
        *pool = default_pool(location->id);
        return CUDA_SUCCESS;
    }
    emu_state& s = st();
    std::lock_guard<std::mutex> g(s.mu);
    uint64_t h = 0;
    for (const auto& [handle, p] : s.default_pools)
        if (p.allocType == type && p.location.type == props.location.type && p.location.id == props.location.id) h = handle;
    if (!h) {
        h = 0xE000 + 0x10 * s.default_pools.size();
        s.default_pools[h] = props;
    }
    *pool = reinterpret_cast<CUmemoryPool>(uintptr_t(h));
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuMemGetDefaultMemPool(CUmemoryPool* pool, CUmemLocation* location, CUmemAllocationType type) {
    return location_default_pool(pool, location, type);
}
EMU_EXPORT CUresult cuMemGetMemPool(CUmemoryPool* pool, CUmemLocation* location, CUmemAllocationType type) {
    return location_default_pool(pool, location, type);
}
// Whether pool is one cuMemPoolCreate made or a location's default one, and its properties.
static bool made_pool(CUmemoryPool pool, CUmemPoolProps* out) {
    std::lock_guard<std::mutex> g(st().mu);
    for (const auto* pools : {&st().mem_pools, &st().default_pools}) {
        auto it = pools->find(uint64_t(uintptr_t(pool)));
        if (it == pools->end()) continue;
        *out = it->second;
        return true;
    }
    return false;
}
// Host memory from a pool: freed by the stream-ordered free or cuMemFree, like the pool's device
// memory.  True if p was such memory.
static bool host_pool_free(CUdeviceptr p) {
    std::lock_guard<std::mutex> g(st().mu);
    auto it = st().host_pool_allocs.find(uint64_t(p));
    if (it == st().host_pool_allocs.end()) return false;
    free(reinterpret_cast<void*>(uintptr_t(it->first)));
    st().host_pool_allocs.erase(it);
    return true;
}
EMU_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* p, size_t size, CUmemoryPool pool, CUstream s) {
    bump("cuMemAllocFromPoolAsync");
    CUmemPoolProps props{};
    if (!made_pool(pool, &props)) return ordered_alloc(p, size, s);
    if (!p || size == 0) return CUDA_ERROR_INVALID_VALUE;
    const int loc = props.location.type;
    if (props.allocType == CU_MEM_ALLOCATION_TYPE_MANAGED)
        return device_alloc(p, size, 1, loc == CU_MEM_LOCATION_TYPE_DEVICE ? props.location.id : stream_device(s));
    if (loc == CU_MEM_LOCATION_TYPE_DEVICE) return device_alloc(p, size, 0, props.location.id);
    void* h = malloc(size);
    if (!h) return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard<std::mutex> g(st().mu);
    st().host_pool_allocs[uint64_t(uintptr_t(h))] = size;
    *p = CUdeviceptr(uintptr_t(h));
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* p, size_t size, CUmemoryPool pool, CUstream s) {
    return cuMemAllocFromPoolAsync(p, size, pool, s);
}
EMU_EXPORT CUresult cuMemHostAlloc(void** pp, size_t size, unsigned int) {
    bump("cuMemHostAlloc");
    if (!pp) return CUDA_ERROR_INVALID_VALUE;
    *pp = malloc(size ? size : 1);
    return *pp ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
EMU_EXPORT CUresult cuMemAllocHost_v2(void** pp, size_t size) {
    bump("cuMemAllocHost_v2");
    if (!pp) return CUDA_ERROR_INVALID_VALUE;
    *pp = malloc(size ? size : 1);
    return *pp ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
EMU_EXPORT CUresult cuMemFreeHost(void* p) {
    bump("cuMemFreeHost");
    free(p);
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
    bump("cuMemGetAddressRange_v2");
    uint64_t b;
    allocation a;
    if (!find_alloc(uint64_t(p), &b, &a, true, true)) return CUDA_ERROR_NOT_FOUND;
    if (base) *base = CUdeviceptr(b);
    if (size) *size = a.requested ? a.requested : a.size;
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attr, CUdeviceptr p) {
    bump("cuPointerGetAttribute");
    uint64_t b;
    allocation a;
    if (!find_alloc(uint64_t(p), &b, &a, true, true)) return CUDA_ERROR_INVALID_VALUE;
    switch (attr) {
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *static_cast<CUdeviceptr*>(data) = CUdeviceptr(b); return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *static_cast<size_t*>(data) = a.requested ? a.requested : a.size; return CUDA_SUCCESS;
        // The mapping: the allocation itself here (one cuMemAlloc, or one cuMemCreate chunk mapped).
        case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: *static_cast<void**>(data) = reinterpret_cast<void*>(b); return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: *static_cast<size_t*>(data) = a.size; return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(data) = a.dev; return CUDA_SUCCESS;
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *static_cast<unsigned*>(data) = CU_MEMORYTYPE_DEVICE; return CUDA_SUCCESS;
        // cuMemCreate memory belongs to no context: the driver answers success and not the context
        // that mapped it (an H100), where a cuMemAlloc allocation names its own.
        case CU_POINTER_ATTRIBUTE_CONTEXT: *static_cast<CUcontext*>(data) = a.kind == 2 ? nullptr : ctx_of(a.dev); return CUDA_SUCCESS;
        // A boolean: cuMemAlloc memory can be shared through legacy IPC, cuMemCreate chunks cannot.
        case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: *static_cast<bool*>(data) = a.kind == 0; return CUDA_SUCCESS;
        default: return CUDA_ERROR_NOT_SUPPORTED;
    }
}
EMU_EXPORT CUresult cuPointerGetAttributes(unsigned n, CUpointer_attribute* attrs, void** data, CUdeviceptr p) {
    for (unsigned i = 0; i < n; ++i) {
        CUresult r = cuPointerGetAttribute(data[i], attrs[i], p);
        if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_SUPPORTED) return r;
    }
    return CUDA_SUCCESS;
}
// An IPC handle names the whole cuMemAlloc allocation holding p.  The emulated one holds, in
// `reserved`: [0,8) its base, [8,16) its size, [16,20) the exporter's pid, [20,28) a magic, so that
// a handle of zeros or garbage is refused; the rest zero.  Legacy IPC does not cover cuMemCreate
// memory, nor memory opened from another process: the driver refuses them, and so does this.
namespace {
constexpr uint64_t k_ipc_magic = 0x4350494d454d5047ull;  // "GPMEMIPC" read little-endian
}
EMU_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle* h, CUdeviceptr p) {
    bump("cuIpcGetMemHandle");
    uint64_t b;
    allocation a;
    // Up to the bytes asked for, as the pointer queries: one byte past a 1000 B cuMemAlloc, inside
    // the driver's rounding, is CUDA_ERROR_INVALID_VALUE (an H100, run 164).
    if (!h || !find_alloc(uint64_t(p), &b, &a, false, true)) return CUDA_ERROR_INVALID_VALUE;
    const int32_t pid = int32_t(getpid());
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, &b, sizeof b);
    memcpy(h->reserved + 8, &a.size, sizeof a.size);
    memcpy(h->reserved + 16, &pid, sizeof pid);
    memcpy(h->reserved + 20, &k_ipc_magic, sizeof k_ipc_magic);
    return CUDA_SUCCESS;
}
// Maps another process's allocation into this context, at a fresh address: no memory is charged
// here (it is the exporter's).  A second open of the same allocation is refused
// (CUDA_ERROR_ALREADY_MAPPED), and so is a handle of this very process, as the driver does.
static CUresult ipc_open(const char* abi, CUdeviceptr* p, const CUipcMemHandle& h, unsigned flags) {
    bump(abi);
    if (!st().initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!p || (flags & ~unsigned(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))) return CUDA_ERROR_INVALID_VALUE;
    const int dev = current_dev();
    if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t base, size, magic;
    int32_t pid;
    memcpy(&base, h.reserved, sizeof base);
    memcpy(&size, h.reserved + 8, sizeof size);
    memcpy(&pid, h.reserved + 16, sizeof pid);
    memcpy(&magic, h.reserved + 20, sizeof magic);
    if (magic != k_ipc_magic || base == 0 || size == 0 || pid <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (pid == int32_t(getpid())) return CUDA_ERROR_INVALID_VALUE;
    emu_state& s = st();
    std::lock_guard<std::mutex> g(s.mu);
    // The driver opens a handle once per context: a second open is refused, not counted (UCX and
    // numba met CUDA_ERROR_ALREADY_MAPPED there), so a caller that shares one must count itself.
    for (auto& [va, o] : s.opened)
        if (o.origin_pid == pid && o.origin_base == base && o.dev == dev) return CUDA_ERROR_ALREADY_MAPPED;
    const uint64_t va = align_up(s.next_opened_va, 2u << 20);
    s.next_opened_va = va + align_up(size, 2u << 20) + (2u << 20);  // a gap: opened ranges never touch
    s.opened[va] = opened_ipc{size, dev, 1, pid, base};
    *p = CUdeviceptr(va);
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* p, CUipcMemHandle h, unsigned int flags) {
    return ipc_open("cuIpcOpenMemHandle_v2", p, h, flags);
}
// The first ABI (cudaTypedefs.h's PFN_cuIpcOpenMemHandle_v4010, the same prototype as the _v2's):
// what a program built against an older cuda.h links, and a resolver hands out below 11000.
EMU_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr* p, CUipcMemHandle h, unsigned int flags) {
    return ipc_open("cuIpcOpenMemHandle", p, h, flags);
}
// Only an address cuIpcOpenMemHandle returned; the close unmaps it.
EMU_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
    bump("cuIpcCloseMemHandle");
    emu_state& s = st();
    std::lock_guard<std::mutex> g(s.mu);
    auto it = s.opened.find(uint64_t(p));
    if (it == s.opened.end()) return CUDA_ERROR_INVALID_VALUE;
    if (--it->second.refs == 0) s.opened.erase(it);
    return CUDA_SUCCESS;
}

// ---- Virtual memory management -------------------------------------------------------------------
namespace {
constexpr uint64_t k_granularity = 2u << 20;

// A property the driver accepts: pinned device memory on an existing device.
CUresult check_prop(const CUmemAllocationProp* prop) {
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.id < 0 || prop->location.id >= st().devices) return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;
}

// Frees a handle's memory once it is released and unmapped everywhere (s.mu held).  An imported
// handle was never charged here: only the handle goes.
void maybe_free_handle(emu_state& s, std::map<uint64_t, vmm_handle>::iterator it) {
    if (!it->second.released || it->second.mappings > 0) return;
    if (!it->second.imported) s.used[it->second.dev] -= it->second.size;
    s.handles.erase(it);
}

// What an exported chunk's memfd holds: the chunk's first owner, so that an importer (and whoever
// it exports to again) names the same memory.
struct fd_record {
    uint64_t magic;
    int32_t pid;
    int32_t dev;
    uint64_t handle;
    uint64_t size;
};
constexpr uint64_t k_fd_magic = 0x4b4e4843554d4547ull;  // "GEMUCHNK" read little-endian
}  // namespace

EMU_EXPORT CUresult cuMemGetAllocationGranularity(size_t* g, const CUmemAllocationProp* prop,
                                                  CUmemAllocationGranularity_flags) {
    bump("cuMemGetAllocationGranularity");
    if (!st().initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_prop(prop)) return r;
    if (!st().vmm) return CUDA_ERROR_NOT_SUPPORTED;
    *g = k_granularity;
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* h, size_t size, const CUmemAllocationProp* prop,
                                unsigned long long flags) {
    bump("cuMemCreate");
    if (!st().initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (g_context_faulted.load()) return CUDA_ERROR_ILLEGAL_ADDRESS;
    if (!h || flags != 0 || size == 0 || size % k_granularity) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_prop(prop)) return r;
    if (!st().vmm) return CUDA_ERROR_NOT_SUPPORTED;
    // The one exportable kind emulated is a POSIX file descriptor, and only where the device
    // attribute says so (as a driver does, which refuses types its platform lacks).
    const auto types = prop->requestedHandleTypes;
    if (types != CU_MEM_HANDLE_TYPE_NONE && (types != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !st().ipc_fd))
        return CUDA_ERROR_NOT_SUPPORTED;
    spin_latency();
    int dev = prop->location.id;
    emu_state& s = st();
    std::lock_guard<std::mutex> g(s.mu);
    if (s.used[dev] + size > s.capacity) return CUDA_ERROR_OUT_OF_MEMORY;
    s.used[dev] += size;
    uint64_t handle = s.next_handle++;
    vmm_handle vh{size, dev, 0, false};
    vh.exportable = types == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    vh.origin_pid = int(getpid());
    vh.origin_handle = handle;
    s.handles[handle] = vh;
    *h = handle;
    bump("cuMemCreate_made");
    return CUDA_SUCCESS;
}
// A real file descriptor (a memfd) naming the chunk's first owner; the caller owns and closes it.
// A handle released but still mapped is still in the table, and is exported too (kept simple).
EMU_EXPORT CUresult cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle h,
                                                 CUmemAllocationHandleType type, unsigned long long flags) {
    bump("cuMemExportToShareableHandle");
    if (!st().initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!shareable || flags != 0 || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
    fd_record rec{};
    {
        emu_state& s = st();
        std::lock_guard<std::mutex> g(s.mu);
        auto it = s.handles.find(h);
        if (it == s.handles.end()) return CUDA_ERROR_INVALID_VALUE;
        if (!it->second.exportable) return CUDA_ERROR_NOT_PERMITTED;
        rec = fd_record{k_fd_magic, int32_t(it->second.origin_pid), int32_t(it->second.dev), it->second.origin_handle,
                        it->second.size};
    }
    const int fd = memfd_create("gpumem-emu-chunk", MFD_CLOEXEC);
    if (fd < 0) return CUDA_ERROR_OPERATING_SYSTEM;
    if (pwrite(fd, &rec, sizeof rec, 0) != ssize_t(sizeof rec)) {
        close(fd);
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    *static_cast<int*>(shareable) = fd;
    return CUDA_SUCCESS;
}
// A new handle here for the chunk the descriptor names; the descriptor stays open (the caller's to
// close, as with the driver).  It is mapped and released like a local one, but its memory is the
// exporter's: never charged against this process's capacity.
EMU_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* h, void* os_handle,
                                                   CUmemAllocationHandleType type) {
    bump("cuMemImportFromShareableHandle");
    if (!st().initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!st().vmm) return CUDA_ERROR_NOT_SUPPORTED;
    if (!h || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
    const int fd = int(reinterpret_cast<uintptr_t>(os_handle));
    fd_record rec{};
    if (pread(fd, &rec, sizeof rec, 0) != ssize_t(sizeof rec) || rec.magic != k_fd_magic) return CUDA_ERROR_INVALID_VALUE;
    if (rec.size == 0 || rec.size % k_granularity || rec.pid <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (rec.dev < 0 || rec.dev >= st().devices) return CUDA_ERROR_INVALID_DEVICE;
    emu_state& s = st();
    std::lock_guard<std::mutex> g(s.mu);
    uint64_t handle = s.next_handle++;
    vmm_handle vh{rec.size, int(rec.dev), 0, false};
    vh.exportable = true;
    vh.imported = true;
    vh.origin_pid = int(rec.pid);
    vh.origin_handle = rec.handle;
    s.handles[handle] = vh;
    *h = handle;
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    bump("cuMemRelease");
    emu_state& s = st();
    std::lock_guard<std::mutex> g(s.mu);
    auto it = s.handles.find(h);
    if (it == s.handles.end() || it->second.released) return CUDA_ERROR_INVALID_VALUE;
    // As the driver counts them: the handle goes with its last reference (cuMemCreate's, or a
    // cuMemRetainAllocationHandle's), whichever call releases it last.
    if (it->second.extra_refs > 0) {
        --it->second.extra_refs;
        return CUDA_SUCCESS;
    }
    it->second.released = true;
    maybe_free_handle(s, it);
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* p, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags) {
    bump("cuMemAddressReserve");
    if (!st().initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!st().vmm) return CUDA_ERROR_NOT_SUPPORTED;
    if (!p || size == 0 || size % k_granularity || flags != 0 || (align & (align - 1))) return CUDA_ERROR_INVALID_VALUE;
    (void)addr;  // a hint only, as for the driver
    emu_state& s = st();
    std::lock_guard<std::mutex> g(s.mu);
    uint64_t base = align_up(s.next_reserve_va, std::max<uint64_t>(align, k_granularity));
    s.next_reserve_va = base + size + k_granularity;  // a gap: reservations never touch
    s.reservations[base] = size;
    *p = CUdeviceptr(base);
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
    bump("cuMemAddressFree");
    emu_state& s = st();
    std::lock_guard<std::mutex> g(s.mu);
    auto it = s.reservations.find(uint64_t(p));
    if (it == s.reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
    auto m = s.mappings.lower_bound(uint64_t(p));
    if (m != s.mappings.end() && m->first < uint64_t(p) + size) return CUDA_ERROR_INVALID_VALUE;  // still mapped
    s.reservations.erase(it);
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags) {
    bump("cuMemMap");
    emu_state& s = st();
    std::lock_guard<std::mutex> g(s.mu);
    auto hit = s.handles.find(h);
    if (hit == s.handles.end() || hit->second.released) return CUDA_ERROR_INVALID_HANDLE;
    const uint64_t a = uint64_t(p);
    if (flags != 0 || size == 0 || size % k_granularity || a % k_granularity || offset % k_granularity ||
        offset + size > hit->second.size)
        return CUDA_ERROR_INVALID_VALUE;
    auto r = s.reservations.upper_bound(a);
    if (r == s.reservations.begin()) return CUDA_ERROR_INVALID_VALUE;
    --r;
    if (a + size > r->first + r->second) return CUDA_ERROR_INVALID_VALUE;  // outside every reservation
    auto m = s.mappings.upper_bound(a);
    if (m != s.mappings.end() && m->first < a + size) return CUDA_ERROR_INVALID_VALUE;
    if (m != s.mappings.begin() && std::prev(m)->first + std::prev(m)->second.size > a) return CUDA_ERROR_INVALID_VALUE;
    s.mappings[a] = vmm_mapping{size, h, uint64_t(offset)};
    ++hit->second.mappings;
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
    bump("cuMemUnmap");
    emu_state& s = st();
    std::lock_guard<std::mutex> g(s.mu);
    const uint64_t a = uint64_t(p);
    // The range must be made of whole mappings, the first starting at p.
    auto m = s.mappings.find(a);
    if (m == s.mappings.end() || size == 0) return CUDA_ERROR_INVALID_VALUE;
    uint64_t at = a;
    for (auto it = m; at < a + size; ++it) {
        if (it == s.mappings.end() || it->first != at || at + it->second.size > a + size) return CUDA_ERROR_INVALID_VALUE;
        at += it->second.size;
    }
    while (m != s.mappings.end() && m->first < a + size) {
        auto h = s.handles.find(m->second.handle);
        if (h != s.handles.end()) {
            --h->second.mappings;
            maybe_free_handle(s, h);
        }
        m = s.mappings.erase(m);
    }
    return CUDA_SUCCESS;
}
EMU_EXPORT CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc* desc, size_t count) {
    bump("cuMemSetAccess");
    if (!desc || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; ++i)
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 || desc[i].location.id >= st().devices)
            return CUDA_ERROR_INVALID_DEVICE;
    emu_state& s = st();
    std::lock_guard<std::mutex> g(s.mu);
    // Every byte of the range must be mapped.
    const uint64_t a = uint64_t(p);
    auto m = s.mappings.upper_bound(a);
    if (m == s.mappings.begin()) return CUDA_ERROR_INVALID_VALUE;
    --m;
    uint64_t at = a;
    auto first = m;
    for (; at < a + size; ++m) {
        if (m == s.mappings.end() || m->first > at || m->first + m->second.size <= at) return CUDA_ERROR_INVALID_VALUE;
        at = m->first + m->second.size;
    }
    for (m = first; m != s.mappings.end() && m->first < a + size; ++m)
        for (size_t i = 0; i < count; ++i) {
            const uint32_t bit = 1u << desc[i].location.id;
            if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) m->second.access |= bit;
            else m->second.access &= ~bit;
        }
    return CUDA_SUCCESS;
}

// Peer access from the current context's device to `peer`'s: cuMemAlloc memory of the peer
// context becomes usable from this device (cuMemCreate memory does not: that takes cuMemSetAccess),
// until the peer context ends (cuCtxDestroy, a primary context's reset or last release); a context
// made with its handle later has none.  The end of the context that enabled it takes nothing
// away here (not emulated).
EMU_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
    bump("cuCtxEnablePeerAccess");
    const int dev = current_dev();
    if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (!peer || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    const int owner = dev_of(peer);
    if (owner < 0 || owner >= st().devices || owner == dev) return CUDA_ERROR_INVALID_DEVICE;
    const uint64_t key = peer_memory_context(peer);
    emu_state& s = st();
    std::lock_guard<std::mutex> g(s.mu);
    if (s.peer_access[key] & (1u << dev)) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    s.peer_access[key] |= 1u << dev;
    return CUDA_SUCCESS;
}

// The cuMemCreate handle mapped at addr, the same value cuMemCreate returned, with a new reference
// that a cuMemRelease must take back (NCCL's free releases it, unmaps, and releases the handle
// again); CUDA_ERROR_INVALID_VALUE for memory that is not mapped from one, cuMemAlloc memory included.
EMU_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* h, void* addr) {
    bump("cuMemRetainAllocationHandle");
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    emu_state& s = st();
    std::lock_guard<std::mutex> g(s.mu);
    const uint64_t a = uint64_t(uintptr_t(addr));
    auto m = s.mappings.upper_bound(a);
    if (m == s.mappings.begin()) return CUDA_ERROR_INVALID_VALUE;
    --m;
    if (a - m->first >= m->second.size) return CUDA_ERROR_INVALID_VALUE;
    auto hit = s.handles.find(m->second.handle);
    if (hit == s.handles.end()) return CUDA_ERROR_INVALID_VALUE;
    // A reference again, also where every earlier one was released (the mapping kept the memory).
    if (hit->second.released) hit->second.released = false;
    else ++hit->second.extra_refs;
    *h = CUmemGenericAllocationHandle(m->second.handle);
    return CUDA_SUCCESS;
}

// ---- Test queries --------------------------------------------------------------------------------
// May a kernel of device `dev` touch p?  A VMM mapping: if cuMemSetAccess granted dev; a cuMemAlloc
// allocation: on its own device, or once dev's context enabled peer access to the context whose
// memory it is, while that context lives.  1 yes, 0 no,
// -1 when p is not mapped.
EMU_EXPORT int gpumem_emu_access(CUdeviceptr p, int dev) {
    emu_state& s = st();
    if (dev < 0 || dev >= s.devices) return -1;
    std::lock_guard<std::mutex> g(s.mu);
    const uint64_t a = uint64_t(p);
    auto m = s.mappings.upper_bound(a);
    if (m != s.mappings.begin()) {
        --m;
        if (a - m->first < m->second.size) return (m->second.access >> dev) & 1;
    }
    auto d = s.device_allocs.upper_bound(a);
    if (d != s.device_allocs.begin()) {
        --d;
        if (a - d->first < d->second.size && d->second.kind == 0) {
            if (d->second.dev == dev) return 1;
            auto peer = s.peer_access.find(d->second.ctx);
            return peer != s.peer_access.end() && ((peer->second >> dev) & 1) ? 1 : 0;
        }
    }
    return -1;
}

// Whose memory p lands on: the process that owns it (pid), its allocation there (origin: a chunk's
// handle for virtual memory, a cuMemAlloc allocation's base otherwise) and p's offset in it.  For a
// VMM mapping it is the mapped chunk's first owner, through any export and import; for opened IPC
// memory the exporter's allocation; for this process's own cuMemAlloc memory itself.  0, or 1 when
// p is not mapped.  Null out-pointers are skipped.
EMU_EXPORT int gpumem_emu_backing(CUdeviceptr p, int* pid, unsigned long long* origin, unsigned long long* offset) {
    emu_state& s = st();
    std::lock_guard<std::mutex> g(s.mu);
    const uint64_t a = uint64_t(p);
    auto answer = [&](int who, uint64_t from, uint64_t off) {
        if (pid) *pid = who;
        if (origin) *origin = from;
        if (offset) *offset = off;
        return 0;
    };
    auto m = s.mappings.upper_bound(a);
    if (m != s.mappings.begin() && a < std::prev(m)->first + std::prev(m)->second.size) {
        --m;
        auto h = s.handles.find(m->second.handle);  // a mapped handle is always in the table
        if (h == s.handles.end()) return 1;
        return answer(h->second.origin_pid, h->second.origin_handle, m->second.offset + (a - m->first));
    }
    auto o = s.opened.upper_bound(a);
    if (o != s.opened.begin() && a < std::prev(o)->first + std::prev(o)->second.size) {
        --o;
        return answer(o->second.origin_pid, o->second.origin_base, a - o->first);
    }
    auto d = s.device_allocs.upper_bound(a);
    if (d != s.device_allocs.begin() && a < std::prev(d)->first + std::prev(d)->second.size) {
        --d;
        return answer(int(getpid()), d->first, a - d->first);
    }
    return 1;
}

// ---- The resolver --------------------------------------------------------------------------------
// Like the real driver: a base name plus a version and flags picks the ABI variant (_v2 from the
// version that introduced it, _ptsz under per-thread default-stream flags).  Looked up in a table of
// this library's own functions, never through dlsym, so gpumem's dlsym cannot colour the answer.
EMU_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                        CUdriverProcAddressQueryResult* status);
EMU_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags);

namespace {
struct fn_entry {
    const char* name;
    void* fn;
};
#define E(n) {#n, reinterpret_cast<void*>(&n)}
const fn_entry k_functions[] = {
    E(cuInit), E(cuDriverGetVersion), E(cuDeviceGetCount), E(cuDeviceGetAttribute), E(cuDeviceGet), E(cuDeviceGetName), E(cuDeviceTotalMem_v2),
    E(cuDevicePrimaryCtxRetain), E(cuDevicePrimaryCtxRelease_v2), E(cuDevicePrimaryCtxGetState), E(cuCtxSetCurrent), E(cuCtxGetCurrent),
    E(cuCtxPushCurrent_v2), E(cuCtxPopCurrent_v2),
    E(cuCtxGetDevice), E(cuCtxSynchronize), E(cuStreamSynchronize), E(cuCtxDestroy_v2), E(cuDevicePrimaryCtxReset_v2),
    E(cuStreamCreate), E(cuStreamCreateWithPriority), E(cuStreamDestroy_v2), E(cuStreamGetDevice), E(cuLaunchKernel), E(cuLaunchKernel_ptsz),
    E(cuModuleLoadData), E(cuKernelGetAttribute), E(cuLaunchCooperativeKernel), E(cuLaunchCooperativeKernel_ptsz),
    E(cuGraphInstantiateWithParams), E(cuGraphInstantiateWithParams_ptsz), E(cuGraphUpload), E(cuGraphUpload_ptsz),
    E(cuGraphLaunch), E(cuGraphLaunch_ptsz),
    E(cuLaunchKernelEx), E(cuStreamBeginCapture_v2), E(cuStreamBeginCapture_v2_ptsz), E(cuStreamBeginCaptureToGraph),
    E(cuStreamBeginCaptureToGraph_ptsz), {"cuStreamBeginCapture", reinterpret_cast<void*>(&cuStreamBeginCapture_v1)},
    {"cuStreamBeginCapture_ptsz", reinterpret_cast<void*>(&cuStreamBeginCapture_v1_ptsz)},
    {"cuCtxDestroy", reinterpret_cast<void*>(&cuCtxDestroy_v1)},
    {"cuCtxCreate", reinterpret_cast<void*>(&cuCtxCreate_v1)}, E(cuCtxCreate_v2), E(cuCtxCreate_v3), E(cuCtxCreate_v4),
    E(cuGreenCtxCreate), E(cuGreenCtxDestroy), E(cuCtxFromGreenCtx), E(cuGreenCtxStreamCreate),
    {"cuDevicePrimaryCtxReset", reinterpret_cast<void*>(&cuDevicePrimaryCtxReset_v1)},
    {"cuDevicePrimaryCtxRelease", reinterpret_cast<void*>(&cuDevicePrimaryCtxRelease_v1)},
    E(cuStreamEndCapture), E(cuStreamEndCapture_ptsz), E(cuStreamIsCapturing), E(cuThreadExchangeStreamCaptureMode), E(cuGetErrorString), E(cuGetErrorName), E(cuMemGetInfo_v2),
    E(cuMemAlloc_v2), E(cuMemFree_v2), E(cuMemAllocPitch_v2), E(cuMemAllocManaged), E(cuMemAllocAsync),
    E(cuMemAllocAsync_ptsz), E(cuMemFreeAsync), E(cuMemFreeAsync_ptsz), E(cuMemAllocFromPoolAsync),
    E(cuMemAllocFromPoolAsync_ptsz), E(cuMemPoolCreate), E(cuMemPoolDestroy), E(cuDeviceGetDefaultMemPool),
    E(cuMemGetDefaultMemPool), E(cuMemGetMemPool), E(cuMemHostAlloc), E(cuMemAllocHost_v2), E(cuMemFreeHost),
    E(cuMemGetAddressRange_v2), E(cuPointerGetAttribute), E(cuPointerGetAttributes), E(cuIpcGetMemHandle),
    E(cuIpcOpenMemHandle_v2), E(cuIpcOpenMemHandle), E(cuIpcCloseMemHandle), E(cuCtxEnablePeerAccess), E(cuMemRetainAllocationHandle),
    E(cuMemGetAllocationGranularity), E(cuMemCreate), E(cuMemRelease), E(cuMemAddressReserve), E(cuMemAddressFree),
    E(cuMemMap), E(cuMemUnmap), E(cuMemSetAccess), E(cuMemExportToShareableHandle), E(cuMemImportFromShareableHandle),
    E(cuGetProcAddress), E(cuGetProcAddress_v2),
    E(cuEventCreate), E(cuEventRecord), E(cuEventQuery), E(cuEventSynchronize), E(cuStreamQuery), E(cuStreamQuery_ptsz),
    E(cuStreamWaitEvent),
};
#undef E
struct v2_rule {
    const char* base;
    int since;
};
const v2_rule k_v2[] = {
    {"cuMemAlloc", 3020}, {"cuMemFree", 3020}, {"cuMemAllocPitch", 3020}, {"cuMemAllocHost", 3020},
    {"cuMemGetInfo", 3020}, {"cuMemGetAddressRange", 3020}, {"cuDeviceTotalMem", 3020}, {"cuCtxDestroy", 4000},
    {"cuDevicePrimaryCtxReset", 11000}, {"cuDevicePrimaryCtxRelease", 11000}, {"cuStreamBeginCapture", 10010},
    {"cuStreamDestroy", 4000}, {"cuGetProcAddress", 12000}, {"cuIpcOpenMemHandle", 11000},
};

void* lookup(const std::string& name) {
    for (const auto& f : k_functions)
        if (name == f.name) return f.fn;
    return nullptr;
}

CUresult resolve(const char* symbol, void** pfn, int version, cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
    bump("cuGetProcAddress");
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    std::string name = symbol;
    // cuCtxCreate has four ABIs: _v2 from 3.2, _v3 (affinity) from 11.4, _v4 (parameters) from 12.5.
    if (name == "cuCtxCreate")
        name = version >= 12050 ? "cuCtxCreate_v4" : version >= 11040 ? "cuCtxCreate_v3" : version >= 3020 ? "cuCtxCreate_v2" : name;
    for (const auto& r : k_v2) {
        if (name != r.base) continue;
        if (version < r.since && (name == "cuStreamBeginCapture" || name == "cuCtxDestroy" || name == "cuDevicePrimaryCtxReset" ||
                                     name == "cuDevicePrimaryCtxRelease" || (name == "cuIpcOpenMemHandle" && version >= 4010)))
            break;  // the first ABI is still there
        if (version < r.since) {
            *pfn = nullptr;
            if (status) *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
            return CUDA_ERROR_NOT_FOUND;
        }
        name += "_v2";
    }
    void* fn = nullptr;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) fn = lookup(name + "_ptsz");
    if (!fn) fn = lookup(name);
    static const bool unknown = getenv("GPUMEM_EMU_UNKNOWN_STREAM_FN") && !strcmp(getenv("GPUMEM_EMU_UNKNOWN_STREAM_FN"), "1");
    if (unknown && name == "cuStreamCreateWithPriority") fn = reinterpret_cast<void*>(&unknown_stream_create_with_priority);
    *pfn = fn;
    if (status) *status = fn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return fn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
}  // namespace

EMU_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                        CUdriverProcAddressQueryResult* status) {
    return resolve(symbol, pfn, version, flags, status);
}
EMU_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
    return resolve(symbol, pfn, version, flags, nullptr);
}
