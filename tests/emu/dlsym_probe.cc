// A program that looks for the CUDA driver the way one with an optional GPU path does: dlsym of RTLD_DEFAULT and of its own handle before and after it loads libcuda.so.1.
//
// It is not linked with libcuda, so before the dlopen no driver is in the process: each probe must
// answer as it does without libgpumem.so (NULL, with dlerror() set), though the preloaded library
// exports the same names.  After loading the emulated driver, a function it has resolves and one
// it lacks (cuLibraryLoadFromFile, as on a driver older than 12.0) does not, and while it is loaded
// RTLD_LOCAL no global lookup finds it.  The program defines a driver name itself
// (cuMemAllocManaged, exported): every lookup of it finds the program's own function.  With
// `plugin PATH` it loads a library linked with the driver RTLD_LOCAL (dlsym_probe_plugin.cc), whose
// own dlsym(RTLD_DEFAULT) finds the driver's functions.  Prints key=value lines.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <utility>

// The program's own definition of a name the driver has.
extern "C" __attribute__((visibility("default"))) int cuMemAllocManaged(unsigned long long*, size_t, unsigned) {
    return 4242;
}

extern "C" void dlsym_next_probe(const char* key, const char* name);  // dlsym_next_lib.cc

namespace {
// Four ways: RTLD_DEFAULT, the program's own handle (dlopen(NULL), as Python's ctypes.CDLL(None)),
// RTLD_NEXT from the program (whose next objects are the preloaded ones), and RTLD_NEXT from a
// library the program links (tests/emu/dlsym_next_lib.cc, after the preloaded ones).  Each also
// says whether the answer is the function of a preloaded interposer (tests/emu/dlsym_interposer.cc).
void probe(const char* key, const char* name) {
    void* self = dlopen(nullptr, RTLD_NOW);
    for (auto [way, handle] :
         {std::pair<const char*, void*>{"default", RTLD_DEFAULT}, {"self", self}, {"next", RTLD_NEXT}}) {
        dlerror();
        void* p = dlsym(handle, name);
        const bool error_set = dlerror() != nullptr;
        Dl_info info{};
        const bool interposer = p && dladdr(p, &info) && info.dli_fname && strstr(info.dli_fname, "dlsym_interposer");
        printf("%s_%s=%d\n%s_%s_dlerror=%d\n%s_%s_interposer=%d\n", key, way, p != nullptr, key, way, error_set, key,
               way, interposer);
    }
    dlsym_next_probe(key, name);
}
// The program's own cuMemAllocManaged, both ways: found, and answering as the program's.
void probe_own(const char* key) {
    void* self = dlopen(nullptr, RTLD_NOW);
    for (auto [way, handle] : {std::pair<const char*, void*>{"default", RTLD_DEFAULT}, {"self", self}}) {
        auto f = reinterpret_cast<int (*)(unsigned long long*, size_t, unsigned)>(dlsym(handle, "cuMemAllocManaged"));
        unsigned long long d = 0;
        printf("%s_%s_is_own=%d\n%s_%s_rc=%d\n", key, way, reinterpret_cast<void*>(f) == reinterpret_cast<void*>(&cuMemAllocManaged),
               key, way, f ? f(&d, 0, 1) : -1);
    }
}
// A library linked with the driver, loaded RTLD_LOCAL, looks with dlsym(RTLD_DEFAULT).
int plugin(const char* path) {
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    printf("plugin_loaded=%d\n", h != nullptr);
    if (!h) return 1;
    auto probe_in = reinterpret_cast<void (*)(const char*, const char*)>(dlsym(h, "plugin_probe"));
    auto alloc_in = reinterpret_cast<void (*)()>(dlsym(h, "plugin_alloc"));
    if (!probe_in || !alloc_in) return 1;
    probe_in("alloc", "cuMemAlloc_v2");
    probe_in("resolver", "cuGetProcAddress_v2");
    probe_in("absent", "cuLibraryLoadFromFile");  // the emulated driver has none
    // The driver is in the plugin's scope, not the program's.
    probe("main_alloc", "cuMemAlloc_v2");
    probe("main_ptsz", "cuStreamQuery_ptsz");
    alloc_in();
    return 0;
}
}  // namespace

int main(int argc, char** argv) {
    if (argc > 2 && !strcmp(argv[1], "plugin")) return plugin(argv[2]);
    probe_own("before_own");
    probe("before_alloc", "cuMemAlloc_v2");
    probe("before_resolver", "cuGetProcAddress_v2");
    probe("before_absent", "cuLibraryLoadFromFile");
    // No libcudart in the process at all: gpumem's runtime exports must not stand in for one (a
    // program that probes for the runtime so would call an export that can only fail).
    probe("no_runtime_malloc", "cudaMalloc");
    probe("no_runtime_entry", "cudaGetDriverEntryPoint");
    probe("no_runtime_entry_v", "cudaGetDriverEntryPointByVersion");
    // Loaded as PyTorch's runtime loads it, RTLD_LOCAL: still outside the global scope.
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    printf("loaded=%d\n", h != nullptr);
    probe("local_alloc", "cuMemAlloc_v2");
    probe("local_ptsz", "cuStreamQuery_ptsz");  // a per-thread variant gpumem watches, not wraps
    // Then made global (a second dlopen promotes it).
    h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    printf("promoted=%d\n", h != nullptr);
    probe("after_alloc", "cuMemAlloc_v2");
    probe("after_absent", "cuLibraryLoadFromFile");
    probe_own("after_own");
    return 0;
}
