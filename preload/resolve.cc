// The resolver ways in: dlsym (b), cuGetProcAddress (c), cudaGetDriverEntryPoint* (d), and real-symbol lookup.
//
// Every CUDA runtime, static or shared, finds libcuda's functions by dlsym-ing cuGetProcAddress_v2
// and asking it for "cuGetProcAddress" itself; everything else is then resolved through the pointer
// that self-lookup returns (measured on the H200; docs/gpu-results.md).  So handing back our resolver there sees every runtime's
// allocations.  Wrappers are chosen by the pointer the real resolver returned, not by name, because
// the ABI variant (_v2, _ptsz) depends on the requested version and flags.
#include <dlfcn.h>
#include <link.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

#include "config.h"
#include "diag.h"
#include "gpumem_preload.h"

namespace gpumem {

// ---------------------------------------------------------------------------------------------
// glibc's dlsym.  dlvsym is not overridden, so it reaches libc directly; asking for the versioned
// definition avoids the loop through our own dlsym.
extern "C" {
GPUMEM_HIDDEN void* gpumem_real_dlsym_ptr = nullptr;
}

static void* load_real_dlsym() noexcept {
    void* p = __atomic_load_n(&gpumem_real_dlsym_ptr, __ATOMIC_ACQUIRE);
    if (p) return p;
    p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!p) p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    __atomic_store_n(&gpumem_real_dlsym_ptr, p, __ATOMIC_RELEASE);
    return p;
}

void* real_dlsym(void* handle, const char* name) noexcept {
    auto f = reinterpret_cast<void* (*)(void*, const char*)>(load_real_dlsym());
    return f ? f(handle, name) : nullptr;
}

static void* libcuda_handle() noexcept {
    static std::atomic<void*> handle{nullptr};
    void* h = handle.load(std::memory_order_acquire);
    if (h) return h;
    // RTLD_NOLOAD: gpumem never loads the driver into a process that did not.
    h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!h) h = dlopen("libcuda.so", RTLD_LAZY | RTLD_NOLOAD);
    if (h) handle.store(h, std::memory_order_release);
    return h;
}

void* real_driver_by_name(const char* name) noexcept {
    void* h = libcuda_handle();
    return h ? real_dlsym(h, name) : nullptr;
}

void* real_driver(drv d) noexcept {
    driver_hook& hk = driver_hooks()[int(d)];
    void* p = hk.real.load(std::memory_order_acquire);
    if (p || hk.looked_up.load(std::memory_order_acquire)) return p;
    p = real_driver_by_name(hk.name);
    if (p) hk.real.store(p, std::memory_order_release);
    // Settled once libcuda is loaded: a symbol it lacks (an older driver) is not looked up again.
    if (p || libcuda_handle()) hk.looked_up.store(true, std::memory_order_release);
    return p;
}

// ---------------------------------------------------------------------------------------------
// GPUMEM_ROUTES by core/config.h's rule; a value it refuses keeps every route on, and is warned of
// when recording starts (config::from_env).
static unsigned routes_from_env() noexcept {
    static_assert(k_all_routes == (route_a | route_b | route_c | route_d));
    unsigned r = k_all_routes;
    parse_routes(setting_env("GPUMEM_ROUTES"), &r);
    return r;
}

bool route_on(route r) noexcept {
    static const unsigned routes = routes_from_env();
    return (routes & r) != 0;
}

// ---------------------------------------------------------------------------------------------
static std::atomic<uint64_t> g_unmatched{0};
uint64_t unmatched_count() noexcept { return g_unmatched.load(std::memory_order_relaxed); }

// The hooked bases through which the pool learns of streams (creation, destruction, green
// contexts, per-thread launches).
static bool is_stream_base(const char* s) noexcept {
    static const char* const bases[] = {"cuStreamCreate", "cuStreamCreateWithPriority", "cuGreenCtxStreamCreate",
                                        "cuGreenCtxCreate", "cuLaunchKernel", "cuLaunchKernelEx", "cuStreamDestroy"};
    for (const char* b : bases)
        if (!strcmp(s, b)) return true;
    return false;
}

// Base names whose variants we wrap; a resolved pointer for one of these that matches no wrapper is
// a hole in our coverage, and is counted on the end line rather than passed over silently.
static bool is_hooked_base(const char* s) noexcept {
    static const char* const bases[] = {
        "cuMemAlloc", "cuMemFree", "cuMemAllocPitch", "cuMemAllocManaged", "cuMemAllocAsync", "cuMemFreeAsync",
        "cuMemAllocFromPoolAsync", "cuMemPoolCreate", "cuMemPoolDestroy", "cuMemGetDefaultMemPool", "cuMemGetMemPool",
        "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap",
        "cuMemAddressReserve", "cuMemAddressFree", "cuMemHostAlloc", "cuMemAllocHost", "cuMemFreeHost",
        "cuGetProcAddress",
        // Captures and capture modes: unseen, the pool could answer a call the driver refuses.
        "cuStreamBeginCapture", "cuStreamBeginCaptureToGraph", "cuStreamEndCapture", "cuThreadExchangeStreamCaptureMode",
        // A context's end: unseen, the pool would hand out memory the driver freed with it.
        "cuCtxDestroy", "cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxRelease", "cuGreenCtxDestroy"};
    for (const char* b : bases)
        if (!strcmp(s, b)) return true;
    return is_stream_base(s);
}

void* wrap_resolved(void* fn, const char* symbol, bool per_thread_lookup) noexcept {
    if (!fn) return fn;
    driver_hook* hooks = driver_hooks();
    for (int i = 0; i < int(drv::count_); ++i) {
        if (!hooks[i].wrapper) continue;        // called by gpumem, not wrapped
        if (hooks[i].wrapper == fn) return fn;  // already ours
        if (real_driver(drv(i)) == fn) return hooks[i].wrapper;
    }
    if (per_thread_lookup || is_per_thread_symbol(symbol)) {
        // Once a per-thread stream was used, libcuda's per-thread variants come back unwatched:
        // still known, not a hole (a runtime that starts later resolves them all).
        bool handled = false;
        void* w = watch_per_thread(fn, &handled);
        if (handled) return w;
    }
    if (symbol && is_hooked_base(symbol)) {
        uint64_t n = g_unmatched.fetch_add(1, std::memory_order_relaxed);
        if (n < 5) {
            // Possibly on a dlsym path while the process starts: before diag::init this is one write(2).
            GPUMEM_WARN("cannot wrap the resolved pointer for {}; its calls go unrecorded", symbol);
        }
        // Streams made, destroyed or launched on through this pointer are unseen: no fence could
        // cover their work and GPUMEM_REUSE=auto could not see them end the single issue order.
        if (is_stream_base(symbol)) pool_stream_route_unseen();
    }
    return fn;
}

// ---------------------------------------------------------------------------------------------
// (b) dlsym.  Written as an assembly trampoline so that, for every name we do not substitute, glibc's
// dlsym is entered by a tail jump and sees the *caller's* return address: RTLD_NEXT then means "next
// after the caller", exactly as without gpumem.
// What gpumem_dlsym_substitute returns for "the answer is NULL": the trampoline below returns NULL
// without calling glibc's dlsym.
static void* const k_dlsym_null = reinterpret_cast<void*>(1);

// The loaded object that holds addr (its link map entry); nullptr if none.
static struct link_map* object_of(void* addr) noexcept {
    Dl_info info{};
    struct link_map* lm = nullptr;
    if (!addr || !dladdr1(addr, &info, reinterpret_cast<void**>(&lm), RTLD_DL_LINKMAP)) return nullptr;
    return lm;
}

// Whether p is in libgpumem.so itself (one of its exports).
static bool in_this_library(void* p) noexcept {
    struct link_map* self = object_of(reinterpret_cast<void*>(&object_of));
    return self && object_of(p) == self;
}

// dlsym on the handle of loaded object l: l and its dependencies.  RTLD_NOLOAD: l is loaded, so
// this only takes a reference, given back.  NULL where l has no name (the program) or nothing is found.
static void* lookup_in_scope_of(struct link_map* l, const char* name) noexcept {
    if (!l || !l->l_name || !l->l_name[0]) return nullptr;
    void* h = dlopen(l->l_name, RTLD_LAZY | RTLD_NOLOAD);
    if (!h) return nullptr;
    void* d = real_dlsym(h, name);
    dlclose(h);
    return d;
}

// What the calling object's own scope defines for name: glibc's dlsym(RTLD_DEFAULT) searches the
// global scope and then, for an object loaded RTLD_LOCAL (a Python extension module), the scope
// it was loaded with, which holds its dependencies (libcuda, where it links the driver).  That
// second part is taken as the caller's own dependencies (a handle to the caller searches them);
// the program's and the preloaded libraries' scope is the global one.  NULL where nothing is found
// or the caller cannot be named; dlerror() then holds glibc's error for this lookup or another.
static void* in_callers_scope(void* caller, const char* name) noexcept {
    if (in_this_library(caller)) return nullptr;
    return lookup_in_scope_of(object_of(caller), name);
}

// glibc's answer to dlsym(handle, name) asked from caller, with libgpumem.so's own exports left
// out.  glibc's lookup finds gpumem's export of the name first where its scope holds the preloaded
// library (RTLD_DEFAULT, the program's own handle dlopen(NULL), which Python's ctypes.CDLL(None)
// uses): then the answer is what lies past libgpumem.so (real_dlsym runs in this library, so
// RTLD_NEXT starts after it), which is NULL where libcuda is not loaded, was loaded RTLD_LOCAL
// (as PyTorch loads it) or lacks the function (an older driver).  RTLD_DEFAULT then also searches
// the caller's own scope, as glibc does.  NULL with dlerror() set where nothing is found.
static void* lookup_past_gpumem(void* handle, const char* name, void* caller) noexcept {
    void* d = real_dlsym(handle, name);
    if (d && in_this_library(d)) d = real_dlsym(RTLD_NEXT, name);
    if (d || handle != RTLD_DEFAULT) return d;
    d = in_callers_scope(caller, name);
    // dlopen/dlclose there may have replaced or cleared the lookup's error: ask again for it.
    if (!d) real_dlsym(RTLD_NEXT, name);
    return d;
}

// Whether b comes after a in the list of loaded objects (load order: the program, the preloaded
// libraries, their dependencies, then what dlopen loaded).
static bool comes_after(const struct link_map* a, const struct link_map* b) noexcept {
    for (const struct link_map* l = a ? a->l_next : nullptr; l; l = l->l_next)
        if (l == b) return true;
    return false;
}

// name as object l itself defines it (not one of its dependencies); nullptr if it does not.
static void* defined_in(struct link_map* l, const char* name) noexcept {
    void* d = lookup_in_scope_of(l, name);
    return d && object_of(d) == l ? d : nullptr;
}

// glibc's answer to dlsym(RTLD_NEXT, name) asked from caller, with libgpumem.so's exports left
// out, where it can be told; *known false where glibc itself must answer (the trampoline then
// lets it, as the caller).  libcuda_fn: libcuda's function of that name (nullptr: none, or not
// wanted).  glibc searches on from the caller's object:
// - from the program, or a library preloaded ahead of gpumem, the objects up to gpumem (the
//   preloads between, all in the global scope), then past it, where gpumem's own exports would
//   come first: real_dlsym's RTLD_NEXT starts after this library.  NULL (with dlerror set, naming
//   libgpumem.so where glibc would name the caller) where nothing defines it;
// - from an object after gpumem, never gpumem's exports: the answer is needed only to wrap
//   libcuda's function, which it is where the global scope past gpumem holds libcuda's as the
//   first definition and libcuda comes after the caller (a dependency of the program, or loaded
//   RTLD_GLOBAL), or where the caller's own scope holds it (a library loaded RTLD_LOCAL with
//   libcuda among its dependencies, whose RTLD_NEXT searches them).  Otherwise glibc answers.
static void* next_answer(const char* name, void* caller, void* libcuda_fn, bool* known) noexcept {
    *known = false;
    struct link_map* self = object_of(reinterpret_cast<void*>(&object_of));
    struct link_map* from = object_of(caller);
    if (!self || !from) return nullptr;
    if (comes_after(from, self)) {
        *known = true;
        for (struct link_map* l = from->l_next; l && l != self; l = l->l_next)
            if (void* d = defined_in(l, name)) return d;
        return real_dlsym(RTLD_NEXT, name);  // the last lookup: its dlerror() stands
    }
    if (!libcuda_fn) return nullptr;
    void* g = real_dlsym(RTLD_NEXT, name);
    *known = (g == libcuda_fn && comes_after(from, object_of(g))) || in_callers_scope(caller, name) == libcuda_fn;
    return *known ? libcuda_fn : nullptr;
}

// A found answer goes back with dlerror() clear, as glibc's own success leaves it: gpumem's
// lookups on the way (a libcuda not loaded, a caller's handle) may have set an error.
static void* found(void* d) noexcept {
    dlerror();
    return d;
}

// What dlsym(handle, name) from caller answers without gpumem, into *out (NULL: nothing found,
// dlerror() set); false where glibc itself must answer (an RTLD_NEXT it alone can resolve).
// lib: libcuda's function of that name, looked up before (its lookup may set dlerror(), which
// must be the answer's).  On a handle, and RTLD_DEFAULT, the lookup leaves gpumem's exports out;
// libcuda's own handle (as JAX asks) answers as it is.
static bool answer_without_gpumem(void* handle, const char* name, void* caller, void* lib, void** out) noexcept {
    if (handle != RTLD_NEXT) {
        *out = lookup_past_gpumem(handle, name, caller);
        return true;
    }
    bool known = false;
    *out = next_answer(name, caller, lib, &known);
    return known;
}

// Whether dlsym(handle, name) of one of gpumem's runtime exports (cudaMalloc and the others of
// hooks_runtime.cc, cudaGetDriverEntryPoint*) from caller must answer NULL: where glibc would find
// gpumem's export and no libcudart past it defines the name.  Without gpumem the answer is NULL
// there (no runtime loaded, one loaded RTLD_LOCAL, or one without the name: cudart 13 has no
// cudaGetDriverEntryPoint), and a program that probes for the runtime so takes its other path;
// gpumem's export, called, could only answer cudaErrorInitializationError.  Where a runtime is
// found, glibc's answer (gpumem's export, which forwards to it) stands.
static bool runtime_export_unbacked(void* handle, const char* name, void* caller) noexcept {
    if (handle == RTLD_NEXT) {
        bool known = false;
        void* d = next_answer(name, caller, nullptr, &known);
        return known && !d;
    }
    void* d = real_dlsym(handle, name);
    return d && in_this_library(d) && !lookup_past_gpumem(handle, name, caller);
}

// caller: the return address of the program's dlsym call (the trampoline passes it).
// Returns NULL to let glibc answer (the trampoline jumps to it, as the caller), k_dlsym_null for a
// NULL answer, or the answer.  Wherever gpumem's own export would be glibc's answer, the answer is
// what the process has without gpumem: libcuda's function, wrapped when the route is watched; any
// other definition (the program's own, an interposer's) as it is.
extern "C" GPUMEM_HIDDEN void* gpumem_dlsym_substitute(void* handle, const char* name, void* caller) noexcept {
    load_real_dlsym();
    if (!name || name[0] != 'c' || name[1] != 'u') return nullptr;
    bool is_resolver = !strncmp(name, "cuGetProcAddress", 16);
    const bool watched = route_on(is_resolver ? route_c : route_b);
    driver_hook* hooks = driver_hooks();
    void* d = nullptr;
    for (int i = 0; i < int(drv::count_); ++i) {
        if (!hooks[i].wrapper || strcmp(hooks[i].name, name) != 0) continue;
        void* lib = watched ? real_driver(drv(i)) : nullptr;
        if (!answer_without_gpumem(handle, name, caller, lib, &d)) return nullptr;
        if (!d) return k_dlsym_null;
        return found(lib && d == lib ? hooks[i].wrapper : d);
    }
    if (is_per_thread_symbol(name)) {
        // A per-thread variant: watched through a thunk, when it is libcuda's.  gpumem exports no
        // such name, so otherwise glibc answers as without gpumem.
        void* lib = watched ? real_driver_by_name(name) : nullptr;
        if (!lib || !answer_without_gpumem(handle, name, caller, lib, &d) || d != lib) return nullptr;
        bool handled = false;
        void* w = watch_per_thread(d, &handled);
        return w != d ? found(w) : nullptr;
    }
    if (name[2] == 'd' && name[3] == 'a' && runtime_export_unbacked(handle, name, caller)) return k_dlsym_null;
    return nullptr;
}

asm(R"(
    .text
    .globl dlsym
    .type dlsym, @function
dlsym:
    .cfi_startproc
    mov (%rsp), %rdx
    push %rdi
    .cfi_adjust_cfa_offset 8
    push %rsi
    .cfi_adjust_cfa_offset 8
    sub $8, %rsp
    .cfi_adjust_cfa_offset 8
    call gpumem_dlsym_substitute
    add $8, %rsp
    .cfi_adjust_cfa_offset -8
    pop %rsi
    .cfi_adjust_cfa_offset -8
    pop %rdi
    .cfi_adjust_cfa_offset -8
    test %rax, %rax
    jnz 1f
    jmp *gpumem_real_dlsym_ptr(%rip)
1:
    cmp $1, %rax
    jne 2f
    xor %eax, %eax
2:
    ret
    .cfi_endproc
    .size dlsym, .-dlsym
)");

// ---------------------------------------------------------------------------------------------
// (c) cuGetProcAddress, both ABIs.
typedef CUresult (*gpa_v1_t)(const char*, void**, int, cuuint64_t);
typedef CUresult (*gpa_v2_t)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

extern "C" GPUMEM_HIDDEN CUresult w_cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
    auto f = real<gpa_v1_t>(drv::cuGetProcAddress);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = f(symbol, pfn, version, flags);
    if (r == CUDA_SUCCESS && pfn && route_on(route_c))
        *pfn = wrap_resolved(*pfn, symbol, (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0);
    return r;
}

extern "C" GPUMEM_HIDDEN CUresult w_cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                                        CUdriverProcAddressQueryResult* status) {
    auto f = real<gpa_v2_t>(drv::cuGetProcAddress_v2);
    if (!f) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = f(symbol, pfn, version, flags, status);
    if (r == CUDA_SUCCESS && pfn && route_on(route_c))
        *pfn = wrap_resolved(*pfn, symbol, (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0);
    return r;
}

GPUMEM_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
    return w_cuGetProcAddress(symbol, pfn, version, flags);
}
GPUMEM_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                           CUdriverProcAddressQueryResult* status) {
    return w_cuGetProcAddress_v2(symbol, pfn, version, flags, status);
}

// ---------------------------------------------------------------------------------------------
// (d) cudaGetDriverEntryPoint*, exported by a shared libcudart (PyTorch's expandable segments use it).
// The real one lives in whichever libcudart the process loaded; find it by RTLD_NEXT, and failing that
// (libcudart loaded RTLD_LOCAL by a Python extension) by walking the loaded objects.  That is the
// rule for a caller that needs no particular libcudart version; real_runtime_for below keeps a
// versioned caller on its own runtime.
// The loaded objects named libcudart*, in load order (paths copied: each is dlopened after the walk,
// not inside it, where dl_iterate_phdr's lock held beside dlopen's could deadlock with another
// thread's dlopen).
struct cudart_search {
    static constexpr int k_max = 8;
    char paths[k_max][512];
    int n = 0;
};

static int find_cudarts(struct dl_phdr_info* info, size_t, void* data) {
    auto* s = static_cast<cudart_search*>(data);
    if (!info->dlpi_name || !strstr(info->dlpi_name, "libcudart")) return 0;
    if (strlen(info->dlpi_name) >= sizeof s->paths[0]) return 0;
    strcpy(s->paths[s->n++], info->dlpi_name);
    return s->n == cudart_search::k_max ? 1 : 0;
}

void* real_runtime(const char* name) noexcept {
    void* p = real_dlsym(RTLD_NEXT, name);
    if (p) return p;
    cudart_search s;
    dl_iterate_phdr(find_cudarts, &s);
    for (int i = 0; i < s.n && !p; ++i) {
        void* h = dlopen(s.paths[i], RTLD_LAZY | RTLD_NOLOAD);
        if (!h) continue;
        p = real_dlsym(h, name);
        dlclose(h);
    }
    return p;
}

// Which runtime a call of one of our cuda* exports goes to.  libcudart versions its symbols
// (cudaMalloc@@libcudart.so.12), so without gpumem the dynamic linker binds each object's reference
// to the runtime that object was linked against, even where a runtime of another soname comes
// first in the global scope (a PyTorch cu130 process's libcudart.so.13 beside a CUDA-12 library's
// libcudart.so.12).  Our unversioned exports catch the references of both; forwarding all of them
// to the first runtime would hand the CUDA-12 library the other runtime's function (and, where the
// driver is too old for that runtime, its errors).  So a caller whose object needs a libcudart
// version (DT_VERNEED) gets that version's definition, as the dynamic linker would have bound it:
// past libgpumem.so in the global scope, else in the loaded object of the needed file (one loaded
// RTLD_LOCAL).  A caller without such a need, or one we cannot identify or read, gets
// real_runtime's answer.  Answers are kept per (caller object, function) in a fixed table, so a
// call costs one scan of it; a miss walks the loaded objects once, with no lock of ours held.
namespace {
constexpr size_t k_name_max = 128;

// A loaded object's span (unrelocated vaddrs of its PT_LOAD segments), load bias and dynamic section.
struct loaded_object {
    ElfW(Addr) bias = 0, lo = ~ElfW(Addr)(0), hi = 0;
    const ElfW(Dyn)* dyn = nullptr;

    explicit loaded_object(const dl_phdr_info* info) noexcept : bias(info->dlpi_addr) {
        for (int i = 0; i < info->dlpi_phnum; ++i) {
            const ElfW(Phdr)& ph = info->dlpi_phdr[i];
            if (ph.p_type == PT_DYNAMIC) dyn = reinterpret_cast<const ElfW(Dyn)*>(bias + ph.p_vaddr);
            if (ph.p_type != PT_LOAD) continue;
            if (ph.p_vaddr < lo) lo = ph.p_vaddr;
            if (ph.p_vaddr + ph.p_memsz > hi) hi = ph.p_vaddr + ph.p_memsz;
        }
    }
    bool contains(uintptr_t a) const noexcept { return lo < hi && a - bias - lo < hi - lo; }
    ElfW(Addr) tag(ElfW(Sxword) t) const noexcept {
        for (const ElfW(Dyn)* d = dyn; d && d->d_tag != DT_NULL; ++d)
            if (d->d_tag == t) return d->d_un.d_val;
        return 0;
    }
    // An address from the dynamic section: glibc relocates some in place (DT_STRTAB, where the
    // section is writable) and not others (DT_VERNEED); one inside the unrelocated span is not yet.
    const char* at(ElfW(Addr) v) const noexcept {
        return reinterpret_cast<const char*>(v - lo < hi - lo ? bias + v : v);
    }
    const char* strtab() const noexcept {
        ElfW(Addr) s = tag(DT_STRTAB);
        return s ? at(s) : nullptr;
    }
};

bool copy_name(char (&to)[k_name_max], const char* from) noexcept {
    size_t n = strnlen(from, k_name_max);
    if (n == k_name_max) return false;
    memcpy(to, from, n + 1);
    return true;
}

struct caller_search {
    uintptr_t addr;
    bool found = false, versioned = false;
    uintptr_t lo = 0, hi = 0;
    char file[k_name_max] = {};     // vn_file: the needed runtime's soname
    char version[k_name_max] = {};  // its version node, "libcudart.so.12"
};

// The object holding the caller, and its libcudart version need: an aux entry named libcudart.so*
// (the file name is not checked: a wheel's repaired copy is renamed, its version node is not).
int find_caller(dl_phdr_info* info, size_t, void* data) noexcept {
    auto* s = static_cast<caller_search*>(data);
    const loaded_object o(info);
    if (!o.contains(s->addr)) return 0;
    s->found = true;
    s->lo = o.bias + o.lo;
    s->hi = o.bias + o.hi;
    const char* str = o.strtab();
    const ElfW(Addr) vn = o.tag(DT_VERNEED);
    ElfW(Addr) count = o.tag(DT_VERNEEDNUM);
    if (!str || !vn) return 1;
    const char* need = o.at(vn);
    for (unsigned i = 0; i < count && i < 256; ++i) {
        auto* v = reinterpret_cast<const ElfW(Verneed)*>(need);
        const char* aux = need + v->vn_aux;
        for (unsigned k = 0; k < v->vn_cnt && k < 256; ++k) {
            auto* a = reinterpret_cast<const ElfW(Vernaux)*>(aux);
            if (!strncmp(str + a->vna_name, "libcudart.so", 12)) {
                s->versioned = copy_name(s->file, str + v->vn_file) && copy_name(s->version, str + a->vna_name);
                return 1;
            }
            if (!a->vna_next) break;
            aux += a->vna_next;
        }
        if (!v->vn_next) break;
        need += v->vn_next;
    }
    return 1;
}

struct soname_search {
    const char* file;
    char path[4096];
    bool found = false;
};

// The loaded object whose soname (or file name) is the needed file; dlopened after the walk, not
// within it.
int find_soname(dl_phdr_info* info, size_t, void* data) noexcept {
    auto* s = static_cast<soname_search*>(data);
    if (!info->dlpi_name || !info->dlpi_name[0]) return 0;
    const char* base = strrchr(info->dlpi_name, '/');
    base = base ? base + 1 : info->dlpi_name;
    if (strcmp(base, s->file) != 0) {
        const loaded_object o(info);
        const char* str = o.strtab();
        const ElfW(Addr) so = o.tag(DT_SONAME);
        if (!str || !so || strcmp(str + so, s->file) != 0) return 0;
    }
    if (strlen(info->dlpi_name) >= sizeof s->path) return 0;
    strcpy(s->path, info->dlpi_name);
    s->found = true;
    return 1;
}

struct runtime_answer {
    std::atomic<const char*> name{nullptr};  // published last; null while being written
    uintptr_t lo = 0, hi = 0;                // the caller object's span
    void* fn = nullptr;
};
constexpr unsigned k_answers = 64;
runtime_answer g_answers[k_answers];
std::atomic<unsigned> g_answers_used{0};

void remember(const char* name, uintptr_t lo, uintptr_t hi, void* fn) noexcept {
    unsigned i = g_answers_used.load(std::memory_order_relaxed);
    do {
        if (i >= k_answers) return;  // full: later misses are looked up each time
    } while (!g_answers_used.compare_exchange_weak(i, i + 1, std::memory_order_acq_rel));
    g_answers[i].lo = lo;
    g_answers[i].hi = hi;
    g_answers[i].fn = fn;
    g_answers[i].name.store(name, std::memory_order_release);
}
}  // namespace

void* real_runtime_for(const char* name, const void* caller) noexcept {
    const uintptr_t a = uintptr_t(caller);
    const unsigned n = g_answers_used.load(std::memory_order_acquire);
    for (unsigned i = 0; i < n && i < k_answers; ++i) {
        const runtime_answer& e = g_answers[i];
        if (e.name.load(std::memory_order_acquire) == name && a - e.lo < e.hi - e.lo) return e.fn;
    }
    caller_search s{a};
    dl_iterate_phdr(find_caller, &s);
    void* p = nullptr;
    if (s.versioned) {
        p = dlvsym(RTLD_NEXT, name, s.version);  // RTLD_NEXT: past libgpumem.so, as real_runtime
        if (!p) {
            soname_search o{s.file, {}};
            dl_iterate_phdr(find_soname, &o);
            if (void* h = o.found ? dlopen(o.path, RTLD_LAZY | RTLD_NOLOAD) : nullptr) {
                p = dlvsym(h, name, s.version);
                dlclose(h);
            }
        }
    }
    if (!p) p = real_runtime(name);
    // An unidentified caller (code outside any object) is kept by its call site.
    if (p) remember(name, s.found ? s.lo : a, s.found ? s.hi : a + 1, p);
    return p;
}

typedef int (*gdep_t)(const char*, void**, unsigned long long, int*);
typedef int (*gdepv_t)(const char*, void**, unsigned int, unsigned long long, int*);

GPUMEM_EXPORT int cudaGetDriverEntryPoint(const char* symbol, void** fn, unsigned long long flags, int* status) {
    auto real_fn = reinterpret_cast<gdep_t>(real_runtime_for("cudaGetDriverEntryPoint", __builtin_return_address(0)));
    if (!real_fn) return 3;  // cudaErrorInitializationError
    int r = real_fn(symbol, fn, flags, status);
    if (r == 0 && fn && route_on(route_d)) *fn = wrap_resolved(*fn, symbol, (flags & 2) != 0);  // cudaEnablePerThreadDefaultStream
    return r;
}

GPUMEM_EXPORT int cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int version,
                                                   unsigned long long flags, int* status) {
    auto real_fn = reinterpret_cast<gdepv_t>(
        real_runtime_for("cudaGetDriverEntryPointByVersion", __builtin_return_address(0)));
    if (!real_fn) return 3;
    int r = real_fn(symbol, fn, version, flags, status);
    if (r == 0 && fn && route_on(route_d)) *fn = wrap_resolved(*fn, symbol, (flags & 2) != 0);  // cudaEnablePerThreadDefaultStream
    return r;
}

}  // namespace gpumem
