// The stream captures open in the process and the driver's rule for unsafe calls inside them (see capture_table.h).
#include "core/pool/capture_table.h"

namespace gpumem {

namespace {
// CU_STREAM_PER_THREAD: each thread's own stream behind one handle, so its capture is the thread's.
constexpr uint64_t k_per_thread_stream = 0x2;
}  // namespace

void capture_table::opened(uint64_t stream, int tid, int mode) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    for (entry& e : slots_) {
        if (!e.used) {
            e = entry{stream, tid, mode, true};
            return;
        }
    }
    ++overflow_;
}

void capture_table::closed(uint64_t stream, int tid) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    for (entry& e : slots_) {
        if (e.used && e.stream == stream && (stream != k_per_thread_stream || e.tid == tid)) {
            e.used = false;
            return;
        }
    }
    if (overflow_ > 0) --overflow_;  // one the table could not hold
}

bool capture_table::may_refuse(int tid, int thread_mode) const noexcept {
    if (thread_mode == k_relaxed) return false;
    std::lock_guard<std::mutex> lk(mu_);
    if (overflow_ > 0) return true;
    for (const entry& e : slots_) {
        if (!e.used) continue;
        if (e.tid == tid ? e.mode != k_relaxed : thread_mode == k_global && e.mode == k_global) return true;
    }
    return false;
}

void capture_table::clear() noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    for (entry& e : slots_) e.used = false;
    overflow_ = 0;
}

}  // namespace gpumem
