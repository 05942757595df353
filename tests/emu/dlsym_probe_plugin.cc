// Loaded RTLD_LOCAL by emu_dlsym_probe's `plugin` case, as Python loads every extension module:
// it links the (emulated) driver, so libcuda.so.1 is in its own lookup scope and not in the global
// one.  glibc's dlsym(RTLD_DEFAULT) from here searches the global scope and then this library's
// scope, so it finds the driver's functions where a lookup from the program does not.
#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>

extern "C" __attribute__((visibility("default"))) void plugin_probe(const char* key, const char* name) {
    dlerror();
    void* p = dlsym(RTLD_DEFAULT, name);
    const bool error_set = dlerror() != nullptr;
    printf("plugin_%s=%d\nplugin_%s_dlerror=%d\n", key, p != nullptr, key, error_set);
}

// Allocates and frees 1 MiB through the cuMemAlloc_v2/cuMemFree_v2 its dlsym(RTLD_DEFAULT) found.
extern "C" __attribute__((visibility("default"))) void plugin_alloc() {
    auto alloc = reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t)>(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
    auto release = reinterpret_cast<CUresult (*)(CUdeviceptr)>(dlsym(RTLD_DEFAULT, "cuMemFree_v2"));
    CUcontext ctx = nullptr;
    int rc = -1;
    if (alloc && release && cuInit(0) == CUDA_SUCCESS && cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS &&
        cuCtxSetCurrent(ctx) == CUDA_SUCCESS) {
        CUdeviceptr d = 0;
        rc = int(alloc(&d, 1u << 20));
        if (rc == 0) rc = int(release(d));
    }
    printf("plugin_alloc_rc=%d\n", rc);
}
