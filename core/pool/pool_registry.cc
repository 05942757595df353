// The process's pools, one per device context: found without a lock, made on first use, retired, walked.
#include "core/pool/pool_registry.h"

#include <sched.h>

#include <new>

namespace gpumem {

pool_registry::create_lock::create_lock(std::atomic_flag& flag) noexcept : f(flag) {
    // Counted as a critical section (critical_section.h) from before the spin: a handler's exit()
    // on this thread must not spin on it.
    // Held for a pool's creation or the switch's drains: short, and never by two threads for long.
    while (f.test_and_set(std::memory_order_acquire)) sched_yield();
}
pool_registry::create_lock::~create_lock() { f.clear(std::memory_order_release); }

pool_registry::slot* pool_registry::find(uint64_t ctx) const noexcept {
    if (ctx == 0) return nullptr;
    const int n = count();
    for (int i = 0; i < n; ++i)
        if (slots_[i].ctx.load(std::memory_order_acquire) == ctx) return const_cast<slot*>(&slots_[i]);
    return nullptr;
}

pool_registry::slot* pool_registry::find_or_create(uint64_t ctx, bool* full) noexcept {
    if (full) *full = false;
    if (ctx == 0 || !cfg_) return nullptr;
    create_lock lk(create_lock_);
    if (slot* s = find(ctx)) return s;
    const int dev = factory_.current_device();
    const int n = count_.load(std::memory_order_relaxed);
    // The driver reuses a destroyed context's handle value; a retired slot of the same device is
    // empty (drop_all) and reusable, which keeps programs that cycle contexts within the table.
    for (int i = 0; i < n; ++i) {
        slot& s = slots_[i];
        if (s.ctx.load(std::memory_order_relaxed) == 0 && s.device == dev) {
            factory_.rebind(*s.backend, ctx);
            s.pool->set_streams(streams_, ctx);
            s.ctx.store(ctx, std::memory_order_release);
            return &s;
        }
    }
    if (n >= k_max_pools) {
        if (full) *full = true;
        return nullptr;
    }
    // Its number among the device's pools, "ctx" on its events: a log's reader keeps each pool's
    // pending frees and reuse mode apart by it.  Slots are never freed, so numbers never repeat
    // but for a retired slot's reuse above, after its context_reset.
    int ordinal = 0;
    for (int i = 0; i < n; ++i) ordinal += slots_[i].device == dev;
    pool_backend* b = factory_.make_backend(ctx, dev);
    auto* p = b ? new (std::nothrow) block_pool(*cfg_, *b, sink_, dev, ordinal) : nullptr;
    if (!p) {
        delete b;
        return nullptr;
    }
    // Read under the lock the switch holds: either the switch walked the table before this slot
    // existed and left safe_api_ set, or it will walk this slot.
    p->set_streams(streams_, ctx);
    if (int v = safe_api_.load(std::memory_order_relaxed)) p->enter_safe_reuse(api_id(v - 1));
    slot& s = slots_[n];
    s.device = dev;
    s.backend = b;
    s.pool = p;
    s.ctx.store(ctx, std::memory_order_release);
    count_.store(n + 1, std::memory_order_release);
    return &s;
}

pool_registry::slot* pool_registry::owner_of(uint64_t addr, block_pool::block_info* bi) const noexcept {
    const int n = count();
    for (int i = 0; i < n; ++i)
        if (slots_[i].pool->lookup(addr, bi, true)) return const_cast<slot*>(&slots_[i]);
    return nullptr;
}

int pool_registry::holds(uint64_t addr) const noexcept {
    const int n = count();
    int answer = 0;
    for (int i = 0; i < n; ++i) {
        const int h = slots_[i].pool->holds(addr);
        if (h == 1) return 1;
        if (h < 0) answer = -1;
    }
    return answer;
}

bool pool_registry::retire(uint64_t ctx, context_end when) noexcept {
    if (ctx == 0 || count() == 0) return false;
    create_lock lk(create_lock_);  // no pool is made for this handle while it is being retired
    slot* s = find(ctx);
    if (!s) return false;
    // Retire first, so no new allocation finds the pool; then forget its memory.  Under the lock
    // for all of it (a slow give-back included): a retired slot is reused for a new context, and
    // its pool must be empty by then.
    s->ctx.store(0, std::memory_order_release);
    s->pool->drop_all(when);
    return true;
}

bool pool_registry::rekey(uint64_t ctx, uint64_t to) noexcept {
    if (ctx == 0 || to == 0 || count() == 0) return false;
    create_lock lk(create_lock_);  // as retire: no pool is made for the handle meanwhile
    slot* s = find(ctx);
    if (!s || find(to)) return false;
    s->ctx.store(to, std::memory_order_release);
    return true;
}

void pool_registry::switch_all_to_safe(api_id api) noexcept {
    if (safe_api_.load(std::memory_order_acquire)) return;
    create_lock lk(create_lock_);
    if (safe_api_.load(std::memory_order_relaxed)) return;
    // A retired slot's pool is empty: enter_safe_reuse makes no sync for it.
    for_each([&](slot& s) { s.pool->enter_safe_reuse(api); });
    safe_api_.store(int(api) + 1, std::memory_order_release);
}

void pool_registry::reset_after_fork() noexcept {
    count_.store(0);
    safe_api_.store(0);
    create_lock_.clear();
}

}  // namespace gpumem
