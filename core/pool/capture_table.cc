// The stream captures open in the process and the driver's rule for unsafe calls inside them (see capture_table.h).
#include "core/pool/capture_table.h"

#include <new>

#include "core/pool/critical_section.h"

namespace gpumem {

namespace {
// CU_STREAM_PER_THREAD: each thread's own stream behind one handle, so its capture is the thread's.
constexpr uint64_t k_per_thread_stream = 0x2;

bool same_capture(uint64_t a_stream, int a_tid, uint64_t b_stream, int b_tid) noexcept {
    return a_stream == b_stream && (a_stream != k_per_thread_stream || a_tid == b_tid);
}
}  // namespace

// Every hold of mu_ is inside a critical_section, from before the lock until after it (as the
// pools' locks are): a signal handler that interrupts it, and frees a pooled block, finds its
// thread inside gpumem, so may_refuse answers it without the lock and the pool defers its free.
void capture_table::opened(uint64_t stream, int tid, int mode) noexcept {
    critical_section in;
    std::lock_guard<std::mutex> lk(mu_);
    entry* free_slot = nullptr;
    for (entry& e : slots_) {
        if (e.used && same_capture(e.stream, e.tid, stream, tid)) {
            e = entry{stream, tid, mode, true};
            return;
        }
        if (!e.used && !free_slot) free_slot = &e;
    }
    if (free_slot) *free_slot = entry{stream, tid, mode, true};
    else ++overflow_;
    open_.fetch_add(1, std::memory_order_release);
}

void capture_table::closed(uint64_t stream, int tid) noexcept {
    critical_section in;
    std::lock_guard<std::mutex> lk(mu_);
    for (entry& e : slots_) {
        if (e.used && same_capture(e.stream, e.tid, stream, tid)) {
            e.used = false;
            open_.fetch_sub(1, std::memory_order_release);
            return;
        }
    }
    if (overflow_ > 0) {  // perhaps one the table could not hold
        --overflow_;
        open_.fetch_sub(1, std::memory_order_release);
    }
}

bool capture_table::may_refuse(int tid, int thread_mode) const noexcept {
    if (thread_mode == k_relaxed || open_.load(std::memory_order_acquire) == 0) return false;
    // Inside gpumem already (a signal handler's call): the lock may be this thread's, held by the
    // code the handler interrupted.  Unsure, so the driver is asked, as over k_slots.
    if (critical_section::active()) return true;
    critical_section in;
    std::lock_guard<std::mutex> lk(mu_);
    if (overflow_ > 0) return true;
    for (const entry& e : slots_) {
        if (!e.used) continue;
        if (e.tid == tid ? e.mode != k_relaxed : thread_mode == k_global && e.mode == k_global) return true;
    }
    return false;
}

void capture_table::clear_after_fork() noexcept {
    new (&mu_) std::mutex();
    for (entry& e : slots_) e.used = false;
    overflow_ = 0;
    open_.store(0, std::memory_order_relaxed);
}

}  // namespace gpumem
