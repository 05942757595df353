// The runtime wrappers: cudaMalloc and relatives of a shared libcudart (way a), recorded under their own name.
//
// A shared libcudart's cudaMalloc calls cuMemAlloc_v2 through the pointer our resolver gave it, so
// the driver wrapper sees the same allocation.  The runtime_scope set here tells it to record under
// "cudaMalloc" (and to let the pool serve it); if the driver call never reaches us (a route we do
// not cover) the runtime wrapper records the call itself.  Either way: once.
#include "gpumem_preload.h"

namespace gpumem {

namespace {
constexpr int k_cuda_error_initialization = 3;

// The runtime the export's caller would have bound to without gpumem (resolve.cc).
template <class F>
F runtime_fn(const char* name, const void* caller) noexcept {
    return reinterpret_cast<F>(real_runtime_for(name, caller));
}

// A runtime free: recorded here before the real call unless the pool owns the block (the pool
// records it when the driver free underneath reaches it).  A pooled block's free the driver hook left
// to the driver's answer instead (a cudaFreeAsync during a capture of its stream, a cudaFree the
// capture rules forbid) is recorded here after the call, with the runtime's answer; the block
// stays allocated in the pool, so no allocation of it can come between.
template <class F>
int runtime_free(api_id api, uint64_t ptr, bool has_stream, uint64_t stream, F&& real_call) noexcept {
    recorder* rec = recorder_or_null();
    runtime_scope s(api, true, 0, ptr);
    if (!rec) return real_call();
    const bool pooled = pool_owns(ptr);
    call_info c = make_call(api, -1);
    c.has_stream = has_stream;
    c.stream = stream;
    recorder::free_ticket t;
    if (!pooled) t = rec->free_begin(c, ptr);
    int r = real_call();
    if (pooled && s.passed) t = rec->free_begin(c, ptr);
    rec->free_end(t, r);  // no slot claimed: nothing
    return r;
}
}  // namespace

GPUMEM_EXPORT int cudaMalloc(void** p, size_t size) {
    auto f = runtime_fn<int (*)(void**, size_t)>("cudaMalloc", __builtin_return_address(0));
    if (!f) return k_cuda_error_initialization;
    if (!route_on(route_a) || guard::active() || !p || size == 0) return f(p, size);
    runtime_scope s(api_id::cudaMalloc, false, size, 0);
    int r = f(p, size);
    if (!s.recorded) record_alloc(api_id::cudaMalloc, mem_kind::device, r, r == 0 ? uint64_t(uintptr_t(*p)) : 0, size, 0, false, 0, 0);
    return r;
}

GPUMEM_EXPORT int cudaFree(void* p) {
    auto f = runtime_fn<int (*)(void*)>("cudaFree", __builtin_return_address(0));
    if (!f) return k_cuda_error_initialization;
    if (!route_on(route_a) || guard::active() || !p) return f(p);
    return runtime_free(api_id::cudaFree, uint64_t(uintptr_t(p)), false, 0, [&] { return f(p); });
}

GPUMEM_EXPORT int cudaMallocAsync(void** p, size_t size, void* stream) {
    auto f = runtime_fn<int (*)(void**, size_t, void*)>("cudaMallocAsync", __builtin_return_address(0));
    if (!f) return k_cuda_error_initialization;
    if (!route_on(route_a) || guard::active() || !p || size == 0) return f(p, size, stream);
    runtime_scope s(api_id::cudaMallocAsync, false, size, 0);
    int r = f(p, size, stream);
    if (!s.recorded)
        record_alloc(api_id::cudaMallocAsync, mem_kind::device, r, r == 0 ? uint64_t(uintptr_t(*p)) : 0, size, 0, true,
                     uint64_t(uintptr_t(stream)), 0, device_of_stream(stream));
    return r;
}

GPUMEM_EXPORT int cudaFreeAsync(void* p, void* stream) {
    auto f = runtime_fn<int (*)(void*, void*)>("cudaFreeAsync", __builtin_return_address(0));
    if (!f) return k_cuda_error_initialization;
    if (!route_on(route_a) || guard::active() || !p) return f(p, stream);
    return runtime_free(api_id::cudaFreeAsync, uint64_t(uintptr_t(p)), true, uint64_t(uintptr_t(stream)),
                        [&] { return f(p, stream); });
}

GPUMEM_EXPORT int cudaMallocManaged(void** p, size_t size, unsigned int flags) {
    auto f = runtime_fn<int (*)(void**, size_t, unsigned int)>("cudaMallocManaged", __builtin_return_address(0));
    if (!f) return k_cuda_error_initialization;
    if (!route_on(route_a) || guard::active() || !p || size == 0) return f(p, size, flags);
    runtime_scope s(api_id::cudaMallocManaged, false, size, 0);
    int r = f(p, size, flags);
    if (!s.recorded)
        record_alloc(api_id::cudaMallocManaged, mem_kind::managed, r, r == 0 ? uint64_t(uintptr_t(*p)) : 0, size, 0, false, 0, 0);
    return r;
}

GPUMEM_EXPORT int cudaMallocPitch(void** p, size_t* pitch, size_t width, size_t height) {
    auto f = runtime_fn<int (*)(void**, size_t*, size_t, size_t)>("cudaMallocPitch", __builtin_return_address(0));
    if (!f) return k_cuda_error_initialization;
    if (!route_on(route_a) || guard::active() || !p || !pitch || width * height == 0) return f(p, pitch, width, height);
    runtime_scope s(api_id::cudaMallocPitch, false, uint64_t(width) * height, 0);
    int r = f(p, pitch, width, height);
    if (!s.recorded)
        record_alloc(api_id::cudaMallocPitch, mem_kind::device, r, r == 0 ? uint64_t(uintptr_t(*p)) : 0,
                     uint64_t(width) * height, r == 0 ? uint64_t(*pitch) * height : 0, false, 0, 0);
    return r;
}

}  // namespace gpumem
