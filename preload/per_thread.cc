// Sees a program's first use of a per-thread default stream, which GPUMEM_REUSE=auto cannot allow.
//
// Per-thread default streams are made by the driver, implicitly, one per host thread: no stream
// creation call shows them.  Every runtime resolves the per-thread variants (`_ptsz`, `_ptds`) of
// about 40 launch, copy and event functions at start-up whether it uses them or not
// (docs/gpu-results.md, run 14), so resolving proves nothing; calling one does.  Each resolved
// per-thread variant gpumem has no typed wrapper for (all but the launches, graph launches,
// uploads and instantiations, and the stream-ordered allocation and capture calls,
// hooks_driver.cc) is handed out as a thunk: a few instructions
// that, on the first call through any thunk, switch the pools to safe reuse and then jump to the
// real function with every argument register untouched, whatever the function's signature.  The
// other way in, the handle CU_STREAM_PER_THREAD passed to an ordinary launch, is checked by the
// launch hooks.
#include <dlfcn.h>

#include <atomic>
#include <cstring>

#include "gpumem_preload.h"

namespace gpumem {

namespace {
constexpr int k_thunks = 256;  // distinct per-thread entry points; the driver has about 60
}  // namespace

extern "C" {
// Read by the thunks (assembly below): the real function of each thunk, and whether a per-thread
// call was seen already (then a thunk is one compare and one jump).
GPUMEM_HIDDEN void* gpumem_pt_target[k_thunks];
GPUMEM_HIDDEN unsigned char gpumem_pt_seen = 0;
void gpumem_pt_thunk_0();
}

static std::atomic<int> g_thunks_used{0};
static std::atomic_flag g_thunk_lock = ATOMIC_FLAG_INIT;

void note_per_thread_stream() noexcept {
    if (__atomic_exchange_n(&gpumem_pt_seen, 1, __ATOMIC_ACQ_REL)) return;
    // A per-thread stream behaves as a blocking stream, but another thread's is another stream;
    // without knowing how many threads use theirs, this counts as a stream that ends the single
    // issue order.
    pool_stream_created(api_id::per_thread_stream, true);
}

// Called by a thunk on its first use, with every argument register saved around the call.
extern "C" GPUMEM_HIDDEN void gpumem_pt_first_call() noexcept { note_per_thread_stream(); }

// Thunk i is at gpumem_pt_thunk_0 + i * 16 (each padded to 16 bytes; endbr64 for CET): it puts
// i in %r11 (not an argument register) and goes to the common part: check the flag, call the note
// once, jump to the target.  At entry %rsp is 8 mod 16; seven pushes and 128 bytes of xmm
// keep the call aligned.
asm(R"(
    .text
    .p2align 4
    .globl gpumem_pt_thunk_0
    .hidden gpumem_pt_thunk_0
    .type gpumem_pt_thunk_0, @function
gpumem_pt_thunk_0:
    .set gpumem_pt_i, 0
    .rept 256
    .p2align 4
    endbr64
    movl $gpumem_pt_i, %r11d
    jmp gpumem_pt_common
    .set gpumem_pt_i, gpumem_pt_i + 1
    .endr
    .size gpumem_pt_thunk_0, .-gpumem_pt_thunk_0

    .p2align 4
    .type gpumem_pt_common, @function
gpumem_pt_common:
    cmpb $0, gpumem_pt_seen(%rip)
    jne 1f
    push %rdi
    push %rsi
    push %rdx
    push %rcx
    push %r8
    push %r9
    push %r11
    sub $128, %rsp
    movdqu %xmm0, 0(%rsp)
    movdqu %xmm1, 16(%rsp)
    movdqu %xmm2, 32(%rsp)
    movdqu %xmm3, 48(%rsp)
    movdqu %xmm4, 64(%rsp)
    movdqu %xmm5, 80(%rsp)
    movdqu %xmm6, 96(%rsp)
    movdqu %xmm7, 112(%rsp)
    call gpumem_pt_first_call
    movdqu 0(%rsp), %xmm0
    movdqu 16(%rsp), %xmm1
    movdqu 32(%rsp), %xmm2
    movdqu 48(%rsp), %xmm3
    movdqu 64(%rsp), %xmm4
    movdqu 80(%rsp), %xmm5
    movdqu 96(%rsp), %xmm6
    movdqu 112(%rsp), %xmm7
    add $128, %rsp
    pop %r11
    pop %r9
    pop %r8
    pop %rcx
    pop %rdx
    pop %rsi
    pop %rdi
1:
    lea gpumem_pt_target(%rip), %rax
    jmp *(%rax,%r11,8)
    .size gpumem_pt_common, .-gpumem_pt_common
)");

bool is_per_thread_symbol(const char* s) noexcept {
    const size_t n = s ? strlen(s) : 0;
    return n > 5 && (!strcmp(s + n - 5, "_ptsz") || !strcmp(s + n - 5, "_ptds"));
}

void* watch_per_thread(void* fn, bool* handled) noexcept {
    *handled = false;
    if (!fn) return fn;
    // Only libcuda's exported per-thread variants: the pointer must be exactly such a symbol.
    Dl_info info;
    if (!dladdr(fn, &info) || info.dli_saddr != fn || !is_per_thread_symbol(info.dli_sname)) return fn;
    *handled = true;
    if (__atomic_load_n(&gpumem_pt_seen, __ATOMIC_ACQUIRE)) return fn;  // seen already: nothing left to watch
    while (g_thunk_lock.test_and_set(std::memory_order_acquire)) {
    }
    const int n = g_thunks_used.load(std::memory_order_relaxed);
    int i = 0;
    while (i < n && gpumem_pt_target[i] != fn) ++i;
    if (i == n && n < k_thunks) {
        gpumem_pt_target[i] = fn;
        g_thunks_used.store(n + 1, std::memory_order_release);
    }
    g_thunk_lock.clear(std::memory_order_release);
    if (i == k_thunks) {
        // Out of thunks: this entry point cannot be watched, so assume it will be used.
        note_per_thread_stream();
        return fn;
    }
    return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(&gpumem_pt_thunk_0) + uintptr_t(i) * 16);
}

}  // namespace gpumem
