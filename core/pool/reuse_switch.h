// GPUMEM_REUSE=auto's one-way switch: which stream creations end the single issue order, and when the pools switch.
#pragma once

#include <atomic>

#include "core/event_schema.h"
#include "core/pool/pool_registry.h"

namespace gpumem {

// docs/pool.md ("auto: stream order while there is one issue order") is the rule; this class is
// its only implementation.  The hook layer reports what it saw; the registry does the switch.
class reuse_switch {
  public:
    explicit reuse_switch(pool_registry& r) noexcept : reg_(r) {}

    // The program created a stream (api says how; a green context or a per-thread stream counts
    // as a non-blocking one).  One blocking stream keeps a single issue order: it waits for
    // earlier legacy-stream work, and legacy-stream work waits for it.  Two blocking streams run
    // concurrently with each other, and a non-blocking one with the legacy stream.  Counted for
    // ever, not while alive: a destroyed stream's queued work still runs.
    // `reentrant`: gpumem's own code is on this thread's stack (a chained interposer made the
    // stream from inside one of our calls), so taking a pool lock could deadlock; the switch is
    // then left to the next settle_deferred().  Otherwise returns once the switch is complete.
    void stream_created(api_id api, bool non_blocking, bool reentrant) noexcept;
    // Makes a switch left by a reentrant stream_created.  Called at the top of every pool call.
    void settle_deferred() noexcept {
        if (deferred_.load(std::memory_order_relaxed) == 0) return;
        if (int api = deferred_.exchange(0, std::memory_order_acq_rel)) reg_.switch_all_to_safe(api_id(api));
    }
    // Whether the pools have switched.
    bool switched() const noexcept { return reg_.switched(); }

    // A fork child: the parent's streams do not exist in it.
    void reset_after_fork() noexcept {
        blocking_streams_.store(0);
        deferred_.store(0);
    }

  private:
    pool_registry& reg_;
    std::atomic<int> blocking_streams_{0};
    std::atomic<int> deferred_{0};  // api_id of a switch left for the next pool call; 0: none
};

}  // namespace gpumem
