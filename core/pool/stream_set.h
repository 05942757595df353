// The streams a fence must cover: every non-blocking stream the program made through the hooks, by context.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

namespace gpumem {

// The hook layer reports stream creations and destructions (every route that reaches
// cuStreamCreate*), the pools ask which streams of their context a fence must cover.  Blocking
// streams are counted but need no event of their own: the fence's event on the legacy stream
// waits for all earlier work on every blocking stream of the context (per-thread default streams
// included), as the legacy stream's implicit synchronization makes every legacy-stream operation do.
// Thread-safe; contexts are opaque keys (a CUcontext's value).
class stream_set {
  public:
    // A stream made in ctx.
    void created(uint64_t ctx, uint64_t stream, bool non_blocking) noexcept;
    // A stream destroyed: its queued work still runs, but no event can be recorded on it any
    // more, so the next release of ctx's pending frees falls back to one synchronize (which waits
    // for it), after which the destruction is forgotten.
    bool destroyed(uint64_t ctx, uint64_t stream) noexcept;  // true: it was in the set
    // Something no fence can cover appeared (a green context, whose work runs on streams of
    // another context; a stream made while the set had no memory, or in no readable context; ways
    // in gpumem does not watch):
    // from now on every pool releases by synchronize.
    void give_up() noexcept { broken_.store(true, std::memory_order_release); }
    bool usable() const noexcept { return !broken_.load(std::memory_order_acquire); }

    // Held by a pool from fence_streams() until its events are recorded: a stream destroyed in
    // between would have an event recorded on a dead (or reused) handle.  The destroy hook waits
    // on it before the driver destroys the stream.  Lock order: the pool's lock, then this one.
    std::unique_lock<std::mutex> hold() const noexcept { return std::unique_lock<std::mutex>(mu_); }
    // The non-blocking streams of ctx, into out (cleared first), under `held` (hold()).  False when
    // fences cannot cover ctx now: give_up() was called, or a stream of ctx was destroyed since the
    // last forget_destroyed(ctx).  Never throws; false as well when out cannot grow.
    bool fence_streams(uint64_t ctx, std::vector<uint64_t>& out, const std::unique_lock<std::mutex>& held) const noexcept;
    // Live non-blocking streams of ctx: what each fence of its pool asks (for the log's stats).
    uint64_t count(uint64_t ctx) const noexcept;
    // Counts destructions of non-blocking streams: read before a synchronize, passed to
    // forget_destroyed after it.
    uint64_t destroy_count() const noexcept { return destroys_.load(std::memory_order_acquire); }
    // A synchronize of ctx, begun when destroy_count() was `seen`, has returned: the destroyed
    // streams' work has finished.  A stream destroyed during the synchronize (another thread) may
    // have work enqueued after it began, so then nothing is forgotten.
    void forget_destroyed(uint64_t ctx, uint64_t seen) noexcept;
    // ctx was destroyed or reset: its streams died with it, without cuStreamDestroy.  Their handles
    // may come back as new streams (the primary context keeps its handle across a reset).
    void forget_context(uint64_t ctx) noexcept;

    // A fork child: the parent's streams do not exist in it.
    void reset_after_fork() noexcept;

  private:
    struct entry {
        uint64_t ctx, stream;
        bool non_blocking;
    };
    mutable std::mutex mu_;
    std::vector<entry> live_;
    std::vector<uint64_t> destroyed_in_;  // contexts that lost a stream since their last sync
    std::atomic<bool> broken_{false};
    std::atomic<uint64_t> destroys_{0};  // non-blocking streams destroyed, ever
};

}  // namespace gpumem
