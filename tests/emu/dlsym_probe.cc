// A program that looks for the CUDA driver the way one with an optional GPU path does: dlsym of RTLD_DEFAULT and of its own handle before and after it loads libcuda.so.1.
//
// It is not linked with libcuda, so before the dlopen no driver is in the process: each probe must
// answer as it does without libgpumem.so (NULL, with dlerror() set), though the preloaded library
// exports the same names.  After loading the emulated driver, a function it has resolves and one
// it lacks (cuGreenCtxCreate, as on a driver older than 12.4) does not, and while it is loaded
// RTLD_LOCAL no global lookup finds it.  Prints key=value lines.
#include <dlfcn.h>

#include <cstdio>
#include <utility>

namespace {
// Both ways: RTLD_DEFAULT, and the program's own handle (dlopen(NULL), as Python's ctypes.CDLL(None)).
void probe(const char* key, const char* name) {
    void* self = dlopen(nullptr, RTLD_NOW);
    for (auto [way, handle] : {std::pair<const char*, void*>{"default", RTLD_DEFAULT}, {"self", self}}) {
        dlerror();
        void* p = dlsym(handle, name);
        const bool error_set = dlerror() != nullptr;
        printf("%s_%s=%d\n%s_%s_dlerror=%d\n", key, way, p != nullptr, key, way, error_set);
    }
}
}  // namespace

int main() {
    probe("before_alloc", "cuMemAlloc_v2");
    probe("before_resolver", "cuGetProcAddress_v2");
    probe("before_green", "cuGreenCtxCreate");
    // Loaded as PyTorch's runtime loads it, RTLD_LOCAL: still outside the global scope.
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    printf("loaded=%d\n", h != nullptr);
    probe("local_alloc", "cuMemAlloc_v2");
    // Then made global (a second dlopen promotes it).
    h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    printf("promoted=%d\n", h != nullptr);
    probe("after_alloc", "cuMemAlloc_v2");
    probe("after_green", "cuGreenCtxCreate");
    return 0;
}
