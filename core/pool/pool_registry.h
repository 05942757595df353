// The process's pools, one per device context: found without a lock, made on first use, retired, walked.
#pragma once

#include <atomic>
#include <cstdint>

#include "core/event_schema.h"
#include "core/pool/block_pool.h"
#include "core/pool/event_sink.h"
#include "core/pool/pool_backend.h"
#include "core/pool/pool_config.h"
#include "core/pool/stream_set.h"

namespace gpumem {

// Contexts are opaque keys here (a CUcontext's value; 0 means none), so the registry and its tests
// need no CUDA header.  The registry never calls the driver itself: a backend_factory makes each
// pool's backend.
class pool_registry {
  public:
    // A handful of contexts is the norm (one primary context per device); a program that creates
    // more gets plain pass-through for the rest, which is always correct.
    static constexpr int k_max_pools = 64;

    struct backend_factory {
        virtual ~backend_factory() = default;
        // The device of the context current on this thread (the one being registered).
        virtual int current_device() noexcept = 0;
        // A backend for (ctx, device), or nullptr when there is no memory for one.
        virtual pool_backend* make_backend(uint64_t ctx, int device) noexcept = 0;
        // A retired slot's backend, now serving a new context whose handle the driver reused.
        virtual void rebind(pool_backend& b, uint64_t ctx) noexcept = 0;
    };

    // One context's pool.  Slots are never freed, only retired (ctx set to 0 when the context is
    // destroyed), so a reader that found a slot without the lock can always use it.
    struct slot {
        std::atomic<uint64_t> ctx{0};
        int device = -1;
        pool_backend* backend = nullptr;
        block_pool* pool = nullptr;
    };

    explicit pool_registry(backend_factory& f) noexcept : factory_(f) {}

    // Settings, event sink and stream set of the pools made from now on (all must outlive the
    // registry).  Without a stream set, pools release pending frees by synchronize only.
    void configure(const pool_config* cfg, event_sink* sink, stream_set* streams = nullptr) noexcept {
        cfg_ = cfg;
        sink_ = sink;
        streams_ = streams;
    }

    // The live slot of ctx, or nullptr.  Lock-free.
    slot* find(uint64_t ctx) const noexcept;
    // The slot of ctx, made on first use (a retired slot of the same device is reused first).
    // nullptr when the table is full (*full set) or there is no memory.  A pool made after the
    // switch to safe reuse starts in safe reuse: its reuse_safe event precedes its first segment.
    slot* find_or_create(uint64_t ctx, bool* full = nullptr) noexcept;
    // The pool holding addr (any address inside one of its segments), and its block.  A pool busy
    // on another thread whose segment table says addr is none of its own is passed over without
    // waiting for its lock (block_pool::lookup, walking).
    slot* owner_of(uint64_t addr, block_pool::block_info* bi) const noexcept;
    // Whether addr lies in a segment of any pool, asked without a lock (block_pool::holds): for a
    // signal handler on a thread inside a pool's lock, where owner_of would wait for ever.
    // 1 yes, 0 no, -1 cannot tell.  Async-signal-safe.
    int holds(uint64_t addr) const noexcept;
    // The context ends: its slot stops matching (under the create lock, so no pool is made for
    // the handle meanwhile), then its pool gives back its virtual memory and forgets the rest
    // (drop_all(when)).  False if none.
    bool retire(uint64_t ctx, context_end when = context_end::coming) noexcept;
    // ctx's slot, pool and all, goes on under another key (to, which no live context has): its
    // context ended but its memory lives on in another (a destroyed green context's pool, its
    // primary context alive), and a context made anew with the handle must get a pool of its own.
    // False if ctx has no slot.
    bool rekey(uint64_t ctx, uint64_t to) noexcept;

    // Switches every pool, present and future, to safe reuse once (block_pool::enter_safe_reuse,
    // drains included).  Returns only when the switch is complete, whoever made it: a thread that
    // lost the race must not see its stream before the winner has drained.
    void switch_all_to_safe(api_id api) noexcept;
    // Whether the switch is complete, and the call that made it.
    bool switched() const noexcept { return safe_api_.load(std::memory_order_acquire) != 0; }
    api_id switched_by() const noexcept {
        const int v = safe_api_.load(std::memory_order_acquire);
        return v ? api_id(v - 1) : api_id::none;
    }

    int count() const noexcept { return count_.load(std::memory_order_acquire); }
    slot& at(int i) noexcept { return slots_[i]; }
    template <class F>
    void for_each(F&& f) noexcept {
        const int n = count();
        for (int i = 0; i < n; ++i) f(slots_[i]);
    }

    // A fork child: the parent's pools belong to contexts that do not exist here.  Forgets them
    // all (the objects are leaked) and the switch with them.
    void reset_after_fork() noexcept;

  private:
    struct create_lock {
        critical_section in;  // before the spin, after the release (members: constructed first)
        explicit create_lock(std::atomic_flag& f) noexcept;
        ~create_lock();
        std::atomic_flag& f;
    };

    backend_factory& factory_;
    const pool_config* cfg_ = nullptr;
    event_sink* sink_ = nullptr;
    stream_set* streams_ = nullptr;
    slot slots_[k_max_pools];
    std::atomic<int> count_{0};  // slots [0, count_) are filled; published with release
    std::atomic_flag create_lock_ = ATOMIC_FLAG_INIT;
    std::atomic<int> safe_api_{0};  // 1 + the api_id that switched every pool to safe reuse; 0 before
};

}  // namespace gpumem
