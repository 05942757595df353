// The pool seam of the hook layer: with GPUMEM_POOL=off every question is answered "not mine, pass through".
#include <string>

#include "config.h"
#include "gpumem_preload.h"

namespace gpumem {

static std::atomic<int> g_captures{0};

void pool_configure(const config&, recorder*, std::string*) noexcept {}
void pool_after_fork() noexcept { g_captures.store(0); }
void pool_at_exit() noexcept {}

bool pool_alloc(api_id, uint64_t, uint64_t*, int*) noexcept { return false; }
bool pool_free(api_id, uint64_t, int*) noexcept { return false; }
bool pool_owns(uint64_t) noexcept { return false; }

CUresult pool_get_address_range(CUdeviceptr*, size_t*, CUdeviceptr, bool* handled) noexcept {
    *handled = false;
    return CUDA_SUCCESS;
}
CUresult pool_pointer_attribute(void*, CUpointer_attribute, CUdeviceptr, bool* handled) noexcept {
    *handled = false;
    return CUDA_SUCCESS;
}
CUresult pool_pointer_attributes(unsigned, CUpointer_attribute*, void**, CUdeviceptr, bool* handled) noexcept {
    *handled = false;
    return CUDA_SUCCESS;
}
CUresult pool_ipc_handle(CUipcMemHandle*, CUdeviceptr, bool* handled) noexcept {
    *handled = false;
    return CUDA_SUCCESS;
}
void pool_context_gone(CUcontext, int) noexcept {}
void capture_begin() noexcept { g_captures.fetch_add(1); }
void capture_end() noexcept {
    if (g_captures.fetch_sub(1) <= 0) g_captures.store(0);
}

}  // namespace gpumem
