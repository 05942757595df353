// The streams a fence must cover: every non-blocking stream the program made through the hooks, by context.
#include "core/pool/stream_set.h"

#include <algorithm>
#include <new>

namespace gpumem {

void stream_set::created(uint64_t ctx, uint64_t stream, bool non_blocking) noexcept {
    // A non-blocking stream of no known context (the context could not be read): no pool's fence
    // would name it, so only a synchronize covers its work.
    if (ctx == 0 && non_blocking) {
        give_up();
        return;
    }
    std::lock_guard<std::mutex> lk(mu_);
    try {
        live_.push_back({ctx, stream, non_blocking});
    } catch (...) {
        give_up();  // a stream nobody knows: only a synchronize covers it
    }
}

bool stream_set::destroyed(uint64_t ctx, uint64_t stream) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = std::find_if(live_.begin(), live_.end(), [&](const entry& e) { return e.stream == stream; });
    if (it == live_.end()) return false;  // not one of ours (made before gpumem saw it, or twice destroyed)
    const uint64_t c = it->ctx ? it->ctx : ctx;
    const bool nb = it->non_blocking;
    live_.erase(it);
    // A blocking stream's work is covered by the legacy stream's event even after its destruction.
    if (!nb) return true;
    destroys_.fetch_add(1, std::memory_order_acq_rel);
    try {
        if (std::find(destroyed_in_.begin(), destroyed_in_.end(), c) == destroyed_in_.end()) destroyed_in_.push_back(c);
    } catch (...) {
        give_up();
    }
    return true;
}

bool stream_set::fence_streams(uint64_t ctx, std::vector<uint64_t>& out, const std::unique_lock<std::mutex>& held) const noexcept {
    out.clear();
    if (!usable() || !held.owns_lock() || held.mutex() != &mu_) return false;
    if (std::find(destroyed_in_.begin(), destroyed_in_.end(), ctx) != destroyed_in_.end()) return false;
    try {
        for (const entry& e : live_)
            if (e.ctx == ctx && e.non_blocking) out.push_back(e.stream);
    } catch (...) {
        return false;
    }
    return true;
}

uint64_t stream_set::count(uint64_t ctx) const noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    uint64_t n = 0;
    for (const entry& e : live_) n += e.ctx == ctx && e.non_blocking;
    return n;
}

void stream_set::forget_destroyed(uint64_t ctx, uint64_t seen) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    if (destroys_.load(std::memory_order_acquire) != seen) return;
    destroyed_in_.erase(std::remove(destroyed_in_.begin(), destroyed_in_.end(), ctx), destroyed_in_.end());
}

void stream_set::forget_context(uint64_t ctx) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    live_.erase(std::remove_if(live_.begin(), live_.end(), [&](const entry& e) { return e.ctx == ctx; }), live_.end());
    destroyed_in_.erase(std::remove(destroyed_in_.begin(), destroyed_in_.end(), ctx), destroyed_in_.end());
}

void stream_set::reset_after_fork() noexcept {
    // The child has one thread; a mutex held by a vanished parent thread is re-made in place.
    new (&mu_) std::mutex();
    live_.clear();
    destroyed_in_.clear();
    broken_.store(false);
}

}  // namespace gpumem
