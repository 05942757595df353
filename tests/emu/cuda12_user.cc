// A library linked against the emulated libcudart.so.12, as a CUDA-12 extension in a process whose main runtime is 13.
//
// Its references are versioned (cudaMalloc@libcudart.so.12, ...), so without gpumem the dynamic
// linker binds them to libcudart.so.12 even where libcudart.so.13 comes first in the global scope.
// cuda12_user(name) makes one call of the named runtime function and returns its answer.
#include <cstddef>
#include <cstring>

extern "C" {
int cudaMalloc(void**, size_t);
int cudaFree(void*);
int cudaMallocAsync(void**, size_t, void*);
int cudaFreeAsync(void*, void*);
int cudaMallocManaged(void**, size_t, unsigned);
int cudaMallocPitch(void**, size_t*, size_t, size_t);
int cudaGetDriverEntryPoint(const char*, void**, unsigned long long, int*);
int cudaGetDriverEntryPointByVersion(const char*, void**, unsigned, unsigned long long, int*);

__attribute__((visibility("default"))) int cuda12_user(const char* name) {
    static void* p = nullptr;
    size_t pitch = 0;
    void* fn = nullptr;
    int status = 0;
    if (!strcmp(name, "cudaMalloc")) return cudaMalloc(&p, 4096);
    if (!strcmp(name, "cudaFree")) return cudaFree(p);
    if (!strcmp(name, "cudaMallocAsync")) return cudaMallocAsync(&p, 8192, nullptr);
    if (!strcmp(name, "cudaFreeAsync")) return cudaFreeAsync(p, nullptr);
    if (!strcmp(name, "cudaMallocManaged")) return cudaMallocManaged(&p, 4096, 1);
    if (!strcmp(name, "cudaMallocPitch")) return cudaMallocPitch(&p, &pitch, 100, 100);
    if (!strcmp(name, "cudaGetDriverEntryPoint")) return cudaGetDriverEntryPoint("cuMemAlloc", &fn, 0, &status);
    if (!strcmp(name, "cudaGetDriverEntryPointByVersion"))
        return cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 3020, 0, &status);
    return -1;
}
}
