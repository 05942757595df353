// The stream captures open in the process, with their modes and threads: which threads the driver would refuse a cuMemAlloc/cuMemFree.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

namespace gpumem {

// Inside a stream capture the driver refuses "potentially unsafe" calls, cuMemAlloc and cuMemFree
// among them, with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture, from a thread
// that (measured on the H200 for all 36 combinations, tests/gpu/capture_mode_check.py, and as the
// CUDA documentation of cudaStreamCaptureMode says):
//   - is not in relaxed mode (cuThreadExchangeStreamCaptureMode; global by default), and
//   - began a capture that is open and not relaxed, or is in global mode while another thread has
//     a global-mode capture open.
// The pool serves those calls without the driver, so the hooks ask this table first and let the
// driver answer where it might refuse.  Thread-safe; its lock is held inside a critical_section
// (critical_section.h).  Modes are CUstreamCaptureMode's values.
class capture_table {
  public:
    static constexpr int k_global = 0, k_thread_local = 1, k_relaxed = 2;
    static constexpr int k_slots = 64;

    // A capture the driver opened: on `stream` (the per-thread stream's handle for the null stream
    // of a _ptsz call), begun by thread `tid` in `mode`.  It replaces an entry of the same stream
    // (the driver opens no second capture on a capturing stream, so that one ended unseen).
    void opened(uint64_t stream, int tid, int mode) noexcept;
    // A capture on `stream` ended (for the per-thread stream: the one `tid` began).  A capture the
    // table could not hold (more than k_slots open) leaves it unsure until as many ends of streams
    // it does not hold are seen (an end of a capture begun unseen counts too: over 64 open
    // captures, the table may forget one too early).
    void closed(uint64_t stream, int tid) noexcept;
    // Whether the driver may refuse an unsafe call from thread `tid` in mode `thread_mode` now.
    // Unsure (a capture the table could not hold, or a call from inside a critical_section, whose
    // thread may hold the table's lock: a signal handler's): true, so the driver is asked.  No
    // lock while the table is empty, the common case.
    bool may_refuse(int tid, int thread_mode) const noexcept;
    // Whether any capture is open: the hot path's question, one load, before the thread's id and
    // mode are looked up.
    bool any_open() const noexcept { return open_.load(std::memory_order_acquire) != 0; }
    // Fork child: the parent's captures are not its own.  Takes no lock (another thread of the
    // parent may have held it at the fork, and it has no owner in the child).
    void clear_after_fork() noexcept;
    std::mutex& mutex_for_test() noexcept { return mu_; }  // a fork with another thread holding it

  private:
    struct entry {
        uint64_t stream;
        int tid;
        int mode;
        bool used;
    };
    mutable std::mutex mu_;
    entry slots_[k_slots] = {};
    int overflow_ = 0;              // captures opened while every slot was taken
    std::atomic<int> open_{0};      // used slots + overflow_, read without the lock
};

}  // namespace gpumem
