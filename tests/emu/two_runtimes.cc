// Two CUDA runtimes of different sonames in one process: libcudart.so.13 loaded first, into the global scope, then a library linked against libcudart.so.12.
//
// Usage: emu_two_runtimes LIBCUDART13 CUDA12_USER global|local.  The .13 runtime is dlopened
// RTLD_GLOBAL (as a PyTorch cu130 process has it), then the CUDA-12 library (cuda12_user.cc) with
// the given mode, which brings in libcudart.so.12 after it.  For each runtime function the library
// calls, prints NAME_by=12|13|both|none (whose served counter moved) and NAME_rc; then the
// program's own unversioned calls through dlsym(RTLD_DEFAULT), which bind to the first runtime in
// the global scope (.13), as default_NAME_by.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <initializer_list>

namespace {
unsigned long* c12 = nullptr;
unsigned long* c13 = nullptr;

template <class F>
void served(const char* key, F&& call) {
    const unsigned long a = *c12, b = *c13;
    const int rc = call();
    const bool by12 = *c12 != a, by13 = *c13 != b;
    printf("%s_by=%s\n%s_rc=%d\n", key, by12 && by13 ? "both" : by12 ? "12" : by13 ? "13" : "none", key, rc);
}
}  // namespace

int main(int argc, char** argv) {
    if (argc != 4) return 2;
    void* h13 = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    void* user = dlopen(argv[2], RTLD_NOW | (strcmp(argv[3], "local") ? RTLD_GLOBAL : RTLD_LOCAL));
    void* h12 = dlopen("libcudart.so.12", RTLD_NOW | RTLD_NOLOAD);
    printf("loaded=%d%d%d\n", h13 != nullptr, user != nullptr, h12 != nullptr);
    if (!h13 || !user || !h12) return 3;
    c12 = static_cast<unsigned long*>(dlsym(h12, "gpumem_emu_cudart_served"));
    c13 = static_cast<unsigned long*>(dlsym(h13, "gpumem_emu_cudart_served"));
    auto call = reinterpret_cast<int (*)(const char*)>(dlsym(user, "cuda12_user"));
    if (!c12 || !c13 || !call) return 4;
    for (const char* name : {"cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync", "cudaMallocManaged", "cudaFree",
                             "cudaMallocPitch", "cudaFree", "cudaGetDriverEntryPoint", "cudaGetDriverEntryPointByVersion"}) {
        static int n = 0;
        char key[80];
        snprintf(key, sizeof key, "%d_%s", n++, name);
        served(key, [&] { return call(name); });
    }
    auto m = reinterpret_cast<int (*)(void**, size_t)>(dlsym(RTLD_DEFAULT, "cudaMalloc"));
    auto f = reinterpret_cast<int (*)(void*)>(dlsym(RTLD_DEFAULT, "cudaFree"));
    if (!m || !f) return 5;
    void* p = nullptr;
    served("default_cudaMalloc", [&] { return m(&p, 4096); });
    served("default_cudaFree", [&] { return f(p); });
    return 0;
}
