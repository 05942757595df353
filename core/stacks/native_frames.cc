// Native stack capture with the linked-in unwinder, and module lookup for new stacks only.
#include "native_frames.h"

#include <atomic>

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>
#include <unwind.h>

namespace gpumem::stacks {

namespace {
struct walk {
    uint64_t* out;
    size_t max, n;
    uint64_t self_lo, self_hi;  // our own module's text: frames there are gpumem's, not the program's
};

_Unwind_Reason_Code step(_Unwind_Context* ctx, void* arg) {
    auto* w = static_cast<walk*>(arg);
    uint64_t pc = _Unwind_GetIP(ctx);
    if (pc == 0) return _URC_END_OF_STACK;
    if (pc >= w->self_lo && pc < w->self_hi) return _URC_NO_REASON;
    if (w->n >= w->max) return _URC_END_OF_STACK;
    w->out[w->n++] = pc;
    return _URC_NO_REASON;
}

// The address range of the object this function is in, found once.  Atomics, not a static
// initializer: its guard would be held across dladdr1 (the loader's lock), which a thread in a
// library's constructor holds while its own allocation comes here.  Two first captures at once
// both look it up and store the same range; `done` is published after it, so no thread reads a
// range of 0 and records gpumem's own frames.
void self_range(uint64_t& lo, uint64_t& hi) {
    static std::atomic<uint64_t> s_lo{0}, s_hi{0};
    static std::atomic<bool> done{false};
    if (!done.load(std::memory_order_acquire)) {
        Dl_info info{};
        link_map* lm = nullptr;
        if (dladdr1(reinterpret_cast<void*>(&self_range), &info, reinterpret_cast<void**>(&lm),
                    RTLD_DL_LINKMAP) && lm) {
            // Every PT_LOAD segment of our own object.
            struct ctx_t { uint64_t base, lo, hi; } c{uint64_t(lm->l_addr), ~0ull, 0};
            dl_iterate_phdr(
                [](dl_phdr_info* p, size_t, void* a) -> int {
                    auto* c = static_cast<ctx_t*>(a);
                    if (uint64_t(p->dlpi_addr) != c->base) return 0;
                    for (int i = 0; i < p->dlpi_phnum; ++i) {
                        if (p->dlpi_phdr[i].p_type != PT_LOAD) continue;
                        uint64_t s = p->dlpi_addr + p->dlpi_phdr[i].p_vaddr;
                        if (s < c->lo) c->lo = s;
                        if (s + p->dlpi_phdr[i].p_memsz > c->hi) c->hi = s + p->dlpi_phdr[i].p_memsz;
                    }
                    return 1;
                },
                &c);
            if (c.hi > c.lo) {
                s_lo.store(c.lo, std::memory_order_relaxed);
                s_hi.store(c.hi, std::memory_order_relaxed);
            }
        }
        done.store(true, std::memory_order_release);
    }
    lo = s_lo.load(std::memory_order_relaxed);
    hi = s_hi.load(std::memory_order_relaxed);
}
}  // namespace

size_t capture_native(uint64_t* pcs, size_t max) noexcept {
    walk w{pcs, max, 0, 0, 0};
    self_range(w.self_lo, w.self_hi);
    _Unwind_Backtrace(step, &w);
    return w.n;
}

bool describe_native(uint64_t pc, std::string& module, uint64_t& offset) noexcept {
    Dl_info info{};
    link_map* lm = nullptr;
    if (!dladdr1(reinterpret_cast<void*>(pc), &info, reinterpret_cast<void**>(&lm), RTLD_DL_LINKMAP) || !lm)
        return false;
    try {
        module = lm->l_name && lm->l_name[0] ? lm->l_name : "";
        if (module.empty()) {
            // The main program's link_map has no name: /proc/self/exe says where it came from.
            char buf[4096];
            ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
            module.assign(buf, n > 0 ? size_t(n) : 0);
        }
    } catch (...) {
        return false;
    }
    offset = pc - uint64_t(lm->l_addr);
    return true;
}

}  // namespace gpumem::stacks
