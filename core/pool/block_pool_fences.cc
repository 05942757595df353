// When a freed block may serve again: the synchronize fallback, fences, ordered release and the waits.
#include "core/pool/block_pool.h"

#include <algorithm>
#include <iterator>
#include <new>
#include <vector>

#include "core/pool/block_pool_util.h"

namespace gpumem {

// ---- pending frees -------------------------------------------------------------------------

// One synchronize releases every pending free: work enqueued before any of them has finished.
bool block_pool::sync_release(api_id api) {
    // Every caller checked can_sync(), but a capture may have opened since (on another thread): a
    // synchronize now would invalidate it.  The frees stay pending.
    if (!can_sync()) return false;
    ++syncs_;
    const uint64_t destroys = streams_ ? streams_->destroy_count() : 0;  // before: see forget_destroyed
    const uint64_t t0 = steady_ns();
    const int rc = backend_.synchronize();
    note_wait(t0);
    capture_checked_ = false;  // a wait, even a failed one: a capture may have begun meanwhile (can_sync)
    if (rc != k_cuda_success) return false;  // a broken context: keep them pending
    unsettled_frees_ = 0;
    // Every fence is reached now, and destroyed streams' work has finished.
    forget_fences();
    if (streams_) streams_->forget_destroyed(ctx_, destroys);
    const size_t n = pending_.size();
    for (block* b : pending_) {
        pending_bytes_[pool_index(b->seg->pool)] -= b->size;
        make_free(b);
    }
    pending_.clear();
    pending_large_.clear();
    emit_release(api, n, 0);
    if (n_stitched_) dissolve_free_stitched(api);
    return true;
}

void block_pool::forget_fences() noexcept {
    for (fence& f : fences_) {
        recycle_events(f.events);
        // The emptied list keeps its capacity for the next fence, as poll_fences keeps it: dropped
        // here, an ordered release after fences at frees made record_fence allocate each time.
        if (spare_fence_events_.size() < spare_fence_events_.capacity())
            spare_fence_events_.push_back(std::move(f.events));  // cannot throw: within capacity
    }
    fences_.clear();
    unfenced_bytes_ = 0;
}

// Returns every segment that holds no allocated or pending block: a cuMemAlloc segment that is
// one free block, a VMM segment of free and unmapped blocks.
// ---- fences ---------------------------------------------------------------------------------

void block_pool::set_streams(stream_set* streams, uint64_t ctx) noexcept {
    op_lock lk(*this);
    streams_ = streams;
    ctx_ = ctx;
    try {
        order_marks_.reserve(k_order_marks);  // ordered releases then never grow it
    } catch (...) {
    }
}

bool block_pool::fences_usable() noexcept {
    if (!streams_ || events_state_ < 0 || !streams_->usable()) return false;
    if (events_state_ == 0) {
        // Asked once: a backend (or driver) without events keeps the synchronize path for good.
        uint64_t ev = 0;
        if (backend_.event_create(&ev) != k_cuda_success) {
            events_state_ = -1;
            return false;
        }
        events_state_ = 1;
        try {
            spare_events_.push_back(ev);
        } catch (...) {
        }
    }
    return true;
}

bool block_pool::take_event(uint64_t* ev) noexcept {
    if (!spare_events_.empty()) {
        *ev = spare_events_.back();
        spare_events_.pop_back();
        return true;
    }
    return backend_.event_create(ev) == k_cuda_success;
}

void block_pool::recycle_events(std::vector<uint64_t>& evs) noexcept {
    for (uint64_t ev : evs) recycle_event(ev);
    evs.clear();
}

void block_pool::recycle_event(uint64_t ev) noexcept {
    try {
        spare_events_.push_back(ev);
    } catch (...) {
        // Leaked: a handful of events, once, when host memory ran out.
    }
}

bool block_pool::record_fence() noexcept {
    if (fenced_end() == pending_.size()) return true;
    fence_timer timed(*this);
    if (!fences_usable() || !can_sync()) return false;
    // The set stays locked until every event is recorded: no stream of the list dies meanwhile.
    std::unique_lock<std::mutex> held = streams_->hold();
    // Again under the lock: a capture opened since can_sync() must see no record or query (the
    // capture hooks count it under this lock before the driver opens it).
    if (!can_sync() || !streams_->fence_streams(ctx_, fence_streams_, held)) return false;
    fence f;
    if (!spare_fence_events_.empty()) {  // an emptied list with its capacity: no allocation
        f.events = std::move(spare_fence_events_.back());
        spare_fence_events_.pop_back();
    }
    try {
        // Room for an event per stream at the record and another at the sweep.
        f.events.reserve(2 * fence_streams_.size() + 1);
        hot_scratch_.reserve(fence_streams_.size());
        fences_.emplace_back();
    } catch (...) {
        return false;
    }
    // The legacy stream first: its event covers it and every blocking stream.  Then each hot
    // non-blocking stream (found busy before): an event if it still has work (an idle one has
    // nothing before the fence).  The others never ran anything the pool saw; PyTorch makes
    // 32 streams or more at its first side stream and runs work on one or two, and a cuStreamQuery
    // costs 0.27-1.5 us on the H200 (docs/benchmarks.md), so they are asked once for all the fences
    // recorded until a release needs them (sweep_streams), not at every fence.
    bool ok = true;
    hot_scratch_.clear();
    for (size_t i = 0; ok && i <= fence_streams_.size(); ++i) {
        if (i > 0) {
            const uint64_t st = fence_streams_[i - 1];
            if (!is_hot(st)) {
                f.unswept = true;
                continue;
            }
            hot_scratch_.push_back(st);  // reserved: cannot throw
            if (backend_.stream_query(st) == k_cuda_success) continue;  // idle: nothing before this fence
        }
        uint64_t ev = 0;
        ok = take_event(&ev);
        if (!ok) break;
        f.events.push_back(ev);  // reserved: cannot throw
        ok = backend_.event_record(ev, i == 0 ? k_stream_legacy : fence_streams_[i - 1]) == k_cuda_success;
    }
    if (!ok) {
        recycle_events(f.events);
        fences_.pop_back();
        return false;
    }
    hot_streams_.swap(hot_scratch_);
    f.end = pending_.size();
    fences_.back() = std::move(f);
    unfenced_bytes_ = 0;
    last_fence_streams_ = fence_streams_.size();
    return true;
}

bool block_pool::is_hot(uint64_t stream) const noexcept {
    return std::find(hot_streams_.begin(), hot_streams_.end(), stream) != hot_streams_.end();
}

int block_pool::sweep_streams() noexcept {
    fence_timer timed(*this);
    if (!can_sync()) return k_cuda_not_ready;
    std::unique_lock<std::mutex> held = streams_->hold();
    if (!can_sync()) return k_cuda_not_ready;  // as in record_fence: a capture opened meanwhile
    if (!streams_->fence_streams(ctx_, fence_streams_, held)) return k_cuda_not_supported;
    for (uint64_t st : fence_streams_) {
        if (backend_.stream_query(st) == k_cuda_success) continue;
        // Busy: an event now, after everything it had before those frees, for each fence.
        try {
            if (!is_hot(st)) hot_streams_.push_back(st);
            for (fence& f : fences_) {
                if (!f.unswept) continue;
                f.events.reserve(f.events.size() + 1);  // within the record's reserve unless streams were added since
                uint64_t ev = 0;
                if (!take_event(&ev)) return k_cuda_not_supported;
                f.events.push_back(ev);  // reserved: cannot throw, so the event is never lost
                if (backend_.event_record(ev, st) != k_cuda_success) return k_cuda_not_supported;
            }
        } catch (...) {
            return k_cuda_not_supported;
        }
    }
    for (fence& f : fences_) f.unswept = false;
    return k_cuda_success;
}

int block_pool::poll_fences(api_id api, bool waited) {
    if (fences_.empty()) return k_cuda_success;
    fence_timer timed(*this);
    size_t n = 0;
    int rc = k_cuda_success;
    while (!fences_.empty()) {
        fence& f = fences_.front();
        size_t from = 0;
        for (;;) {
            {
                std::unique_lock<std::mutex> held;
                if (!capture_guard(held)) rc = k_cuda_not_ready;  // a capture opened since the caller's check
                for (size_t k = from; k < f.events.size() && rc == k_cuda_success; ++k) rc = backend_.event_query(f.events[k]);
            }
            if (rc != k_cuda_success || !f.unswept) break;
            // Its events are reached; the streams it did not ask are asked now, once for every
            // fence so far (none is unswept after).  A busy one adds an event to each, which is
            // asked next.  A capture leaves the fences waiting (k_cuda_not_ready: success below).
            from = f.events.size();
            rc = sweep_streams();
        }
        if (rc != k_cuda_success) break;
        n = f.end;
        recycle_events(f.events);
        if (spare_fence_events_.size() < spare_fence_events_.capacity())
            spare_fence_events_.push_back(std::move(f.events));  // cannot throw: within capacity
        fences_.erase(fences_.begin());
    }
    timed.stop();  // the queries belong to the release they make
    if (n) release_prefix(n, api, uint8_t(ef_fence | (waited ? ef_waited : 0)));
    return rc == k_cuda_not_ready ? k_cuda_success : rc;
}

// Every pool_sync line: a release by fences (or a wait on every stream, n = 0), or by a sync (flags
// 0), with the time the pool's waits held the program and its fence calls took since the previous
// pool_sync line.
void block_pool::emit_release(api_id api, size_t n, uint8_t flags) noexcept {
    event e{};
    std::swap(e.c.wait_ns, wait_ns_unlogged_);
    std::swap(e.c.fence_ns, fence_ns_unlogged_);
    if (!sink_) return;
    e.ev = ev_kind::pool_sync;
    e.api = api;
    e.c.count = n;
    e.flags = flags;
    send(e);
}

// The first n pending frees (in free order) become free; the fences after them now count from 0.
void block_pool::release_prefix(size_t n, api_id api, uint8_t flags) {
    for (size_t k = 0; k < n; ++k) {
        block* b = pending_[k];
        pending_bytes_[pool_index(b->seg->pool)] -= b->size;
        if (b->seg->pool == pool_id::large) {
            auto it = pending_large_.find(b->size);
            if (it != pending_large_.end()) pending_large_erase(it);
        }
        make_free(b);
    }
    pending_.erase(pending_.begin(), pending_.begin() + ptrdiff_t(n));
    for (fence& f : fences_) f.end -= n;
    emit_release(api, n, flags);
    // A stitched segment whose block came back goes back to its lenders at once (after the
    // pool_sync line, which frees its block in the log): kept, it would hold its lenders' chunks
    // from every other request (docs/benchmarks.md, "Stitching").
    if (n_stitched_) dissolve_free_stitched(api);
}

bool block_pool::reclaim(api_id api, bool wait, pool_id p, uint64_t asize) {
    if (!fences_usable()) return sync_release(api);
    // GPUMEM_FENCE_WAIT=order: no wait; and where it costs what a fence costs, no fence.
    if ((wait || order_alone()) && order_release(api)) return true;
    const size_t before = pending_.size();
    if (!wait) {
        // Not waiting: only a fence the GPU has reached helps now.  While an older fence is not
        // reached, a new one cannot be either (each waits on the legacy stream after it), so it
        // is recorded only when none is left: on an idle GPU it is reached at once.  Recording
        // at every miss instead cost one event per stream each time (a fence per 4 allocations
        // replaying the H200 GPT-2 log, docs/benchmarks.md).
        if (poll_fences(api) != k_cuda_success) return sync_release(api);
        if (!fences_.empty() || fenced_end() == pending_.size()) return pending_.size() < before;
    }
    if (!record_fence()) return sync_release(api);
    if (poll_fences(api) != k_cuda_success) return sync_release(api);  // a broken event: the old way
    // Memory is short: wait for the oldest fence, then the next, until the request fits.  Waiting
    // for the newest (recorded just now, after all the work the program has queued) would drain
    // the GPU's queue: the device idles while the program queues its next kernels, and a
    // training step under PYTORCH_NO_CUDA_MEMORY_CACHING pays that at every wait.
    while (wait && !fences_.empty() && !(asize && find_free(p, asize))) {
        // A capture opened on another thread since the last wait: no more waits (each would
        // invalidate it), and no fallback sync either; the frees stay pending through it.
        if (!can_sync()) break;
        if (!wait_oldest_fence(api)) return sync_release(api);
    }
    return pending_.size() < before;
}

// Ordered release (GPUMEM_FENCE_WAIT=order; docs/pool.md, "Ordered release").  Instead of the host
// waiting until the GPU reaches a fence, every pending free is handed out now and the device is
// made to order any later use after the work before the frees: the legacy stream waits for the
// work each busy non-blocking stream has queued, then an event E on the legacy stream marks all
// of it, and every non-blocking stream waits for E.  A new owner's work then follows the old
// owner's on whichever stream it runs: on the legacy stream by its order, on a blocking stream by
// its implicit wait for the legacy stream, on a non-blocking stream by its wait for E, on a stream
// made later by order_new_stream.  The price is the device's: each release serializes the
// program's streams, which costs nothing while they idle (PyTorch's 32 pooled streams) and
// would take away the overlap of a stream the program runs beside the legacy one (NCCL).  So a
// stream found busy with E of the last release already reached (its busyness is the program's,
// not a wait of ours) stops ordered releases for good, and the pool waits as before.  False when
// it released nothing; the caller then waits as before.
bool block_pool::order_release(api_id api) {
    if (!cfg_.order || order_off_ || pending_.empty() || immediate_ || !fences_usable()) return false;
    fence_timer timed(*this);
    if (!can_sync()) return false;
    std::unique_lock<std::mutex> held = streams_->hold();  // no stream dies between the list and the waits
    if (!can_sync() || !streams_->fence_streams(ctx_, fence_streams_, held)) return false;
    if ((!order_scratch_ && !take_event(&order_scratch_)) || (!order_event_ && !take_event(&order_event_))) return false;
    // Whether the last release's work is done is asked only at the first busy stream (most
    // releases find every stream idle: no query).  Asked after that stream's query, so a stream
    // found busy then, unless E was known reached before, is asked again: busy after its wait
    // for E is over, it is busy with the program's own work (asked before, it may have been busy
    // only with that wait).  Not done (the GPU behind): every stream still waits for that E (each
    // was made to, at the release or at its creation), so each would be found busy and marked
    // anyway; the rest are marked without their query (1.4 µs while the GPU runs, run 77: 32 of
    // them a release in a PyTorch program).
    int last_reached = -1;  // -1: not asked yet
    bool behind = false;
    bool ok = true;
    for (uint64_t st : fence_streams_) {
        if (!behind && backend_.stream_query(st) == k_cuda_success) continue;  // idle: nothing to wait for
        if (last_reached < 0) {
            const bool known = order_reached_ == ordered_releases_;  // (none yet: nothing to wait for)
            last_reached = known || order_reached(true) == ordered_releases_;
            if (!known && last_reached && backend_.stream_query(st) == k_cuda_success) continue;
            behind = last_reached == 0;
        }
        if (last_reached == 1 && !cfg_.order_beside_busy) {  // busy with the program's own work: leave it its overlap
            order_off_ = true;
            return false;
        }
        // Busy, maybe only with our last wait: the legacy stream waits for whatever it has.
        // (A failure here leaves extra waits at most: the program's work is only delayed.)
        ok = backend_.event_record(order_scratch_, st) == k_cuda_success &&
             backend_.stream_wait_event(k_stream_legacy, order_scratch_) == k_cuda_success;
        if (!ok) break;
    }
    // The last release's event, if not reached yet, is kept to tell when its frees are done; this
    // release records a fresh one (or, with no event to spare, the same one again).  Only once the
    // record succeeded does the fresh one become order_event_: a failed record leaves the last
    // release's event as what new streams wait for (order_new_stream).
    uint64_t ev = order_event_;
    if (ok && ordered_releases_ > order_reached_ && !take_event(&ev)) ev = order_event_;
    ok = ok && backend_.event_record(ev, k_stream_legacy) == k_cuda_success;
    if (ev != order_event_) {
        if (ok) {
            try {
                if (order_marks_.size() == k_order_marks) {
                    recycle_event(order_marks_.front().second);
                    order_marks_.erase(order_marks_.begin());
                }
                order_marks_.emplace_back(ordered_releases_, order_event_);
            } catch (...) {
                recycle_event(order_event_);  // no host memory for the mark: a later release's says as much
            }
            order_event_ = ev;
        } else {
            recycle_event(ev);
        }
    }
    for (size_t i = 0; ok && i < fence_streams_.size(); ++i)
        ok = backend_.stream_wait_event(fence_streams_[i], order_event_) == k_cuda_success;
    if (!ok) {
        // Some streams may wait for E and others not: nothing is handed out early.  Waits from now on.
        order_off_ = true;
        return false;
    }
    held.unlock();
    ++ordered_releases_;
    forget_fences();  // every fence is covered now, as after a synchronize
    // Their last owners' work may still run: no chunk of theirs is unmapped before a wait on every
    // stream (settle_frees), as for frees under immediate reuse.
    const size_t n = pending_.size();
    unsettled_frees_ += n;
    for (size_t k = 0; k < n; ++k)
        if (pending_[k]->seg->stitched()) pending_[k]->seg->settle_gen = ordered_releases_;
    timed.stop();  // its line carries its calls' time
    release_prefix(n, api, uint8_t(ef_fence | ef_ordered));  // its line says "ordered"
    return true;
}

// Ordered release in place of fences: in a context without non-blocking streams a release is one
// event record on the legacy stream (nothing to query, no stream to make wait), as a fence is, and
// it needs no query of its own, while a fence must be asked before its frees serve.  The 20 MiB
// pool hit (a free, then a miss) paid a record and a query a pair; now one record.
bool block_pool::order_alone() noexcept {
    return cfg_.order && !order_off_ && !immediate_ && streams_ && streams_->count(ctx_) == 0;
}

// The frees ordered releases handed out count as unsettled (their last owners' work may still run,
// so no chunk of theirs is unmapped).  Once the last release's event is reached, all work enqueued
// before any of them is done: they are settled without a wait, so trimming and stitching's
// dissolves go on as under fences.  (Frees made for immediate reuse before auto's switch came
// before the first ordered release, whose event covers them too.)  True when no free is unsettled.
// Only where can_sync() holds: an event query may not run during a capture.
bool block_pool::ordered_frees_settled() noexcept {
    if (unsettled_frees_ && ordered_releases_ && !immediate_ && order_reached() == ordered_releases_)
        unsettled_frees_ = 0;
    return unsettled_frees_ == 0;
}

// Asks the kept events oldest first, then the last release's, and stops at the first not reached
// (one query while the GPU is behind).  With half the marks kept or more, once the oldest is
// reached the last release's is asked next: reached, it says every kept one is (events on one
// stream are reached in order), which spares a query per mark where nothing asked for a while (a
// context without non-blocking streams asks none at its releases, and keeps 64; one call asked
// 65 events).  Only where can_sync() holds, as every query.
uint64_t block_pool::order_reached(bool locked) noexcept {
    if (order_marks_.empty() && order_reached_ == ordered_releases_) return order_reached_;  // nothing to ask
    fence_timer timed(*this);
    std::unique_lock<std::mutex> held;
    if (!locked && !capture_guard(held)) return order_reached_;  // a capture opened since the caller's check
    size_t done = 0;
    bool all = false;
    const bool long_list = order_marks_.size() >= k_order_marks / 2;
    while (done < order_marks_.size() && backend_.event_query(order_marks_[done].second) == k_cuda_success) {
        order_reached_ = order_marks_[done].first;
        recycle_event(order_marks_[done].second);
        ++done;
        if (long_list && done == 1 && done < order_marks_.size() && backend_.event_query(order_event_) == k_cuda_success) {
            all = true;
            break;
        }
    }
    if (all) {
        for (size_t k = done; k < order_marks_.size(); ++k) recycle_event(order_marks_[k].second);
        done = order_marks_.size();
        order_reached_ = ordered_releases_;
    }
    order_marks_.erase(order_marks_.begin(), order_marks_.begin() + ptrdiff_t(done));
    if (order_marks_.empty() && order_reached_ < ordered_releases_ && backend_.event_query(order_event_) == k_cuda_success)
        order_reached_ = ordered_releases_;
    return order_reached_;
}

// Whether the last ordered release's work may still run, for a stream or green context the
// program is about to get; `held` gets the stream set's lock, as a fence's records and queries
// hold it (a capture cannot open between the check and the calls: capture_begin counts it under
// this lock).  False when there was none or it is done, and when a capture is open (or at exit):
// then nothing may be asked, a cuEventQuery on any thread invalidating a global-mode capture and
// the driver perhaps gone, so ordered releases stop (a limit: docs/pool.md).
bool block_pool::order_work_pending(std::unique_lock<std::mutex>& held) noexcept {
    if (ordered_releases_ == 0 || !streams_) return false;
    held = streams_->hold();
    if (!can_sync()) {
        order_off_ = true;
        return false;
    }
    return order_reached(true) != ordered_releases_;  // no query when already known done
}

// What cannot be ordered on the device is waited for by the host, once; ordered releases stop.
void block_pool::order_host_wait(std::unique_lock<std::mutex>& held) noexcept {
    held.unlock();  // the wait may be long: streams may come and go meanwhile
    order_off_ = true;
    const uint64_t t0 = steady_ns();
    (void)backend_.event_synchronize(order_event_);
    note_wait(t0);
}

void block_pool::order_new_stream(uint64_t stream) noexcept {
    if (!cfg_.order) return;  // GPUMEM_FENCE_WAIT=old|any: stream creation does not touch the pool (cfg_ is const)
    op_lock lk(*this);
    std::unique_lock<std::mutex> held;
    fence_timer timed(*this);
    if (!order_work_pending(held)) return;
    if (backend_.stream_wait_event(stream, order_event_) == k_cuda_success) return;
    timed.stop();  // what follows is a wait (wait_ns)
    order_host_wait(held);  // the stream cannot be made to wait
}

// A green context (or green stream) runs beside the context's streams, and no wait orders it:
// the host waits for the last ordered release's work before the program gets it.
void block_pool::order_settle() noexcept {
    if (!cfg_.order) return;
    op_lock lk(*this);
    std::unique_lock<std::mutex> held;
    if (order_work_pending(held)) order_host_wait(held);
}

uint64_t block_pool::ordered_releases() const noexcept {
    held lk(*this);
    return ordered_releases_;
}

bool block_pool::order_stopped() const noexcept {
    held lk(*this);
    return order_off_;
}

bool block_pool::wait_oldest_fence(api_id api) {
    // The streams it did not ask first, so that the wait covers them too.  Its callers checked
    // can_sync(), so a refusal here is a capture opened meanwhile or a stream destroyed: both
    // fall back as a broken event does (sync_release, which a capture also stops).
    if (fences_.front().unswept && sweep_streams() != k_cuda_success) return false;
    // Not under the stream set's lock, unlike queries: it is the whole process's, and a wait may
    // last as long as the GPU's queue (another GPU's pool, or a thread that must launch the work
    // waited for, would block on it).  So a capture opened on another thread in the moment
    // between this check and the wait is not seen (docs/pool.md).
    if (!can_sync()) return false;
    const uint64_t t0 = steady_ns();
    bool ok = true;
    ++fence_waits_;
    for (uint64_t ev : fences_.front().events)
        if (backend_.event_synchronize(ev) != k_cuda_success) {
            ok = false;
            break;
        }
    // A wait: the driver is asked again afterwards (can_sync), for a capture opened meanwhile by a
    // route no hook sees.
    capture_checked_ = false;
    note_wait(t0);
    if (!ok) return false;
    const size_t left = fences_.size();
    if (poll_fences(api, true) != k_cuda_success) return false;
    return fences_.size() < left;  // reached but not released: a broken event
}

// A program under PYTORCH_NO_CUDA_MEMORY_CACHING runs far ahead of the GPU: on the H200 GPT-2 run
// the frees the GPU had not yet passed peaked at 12.5 GiB against a live peak of 13.3 GiB, and a
// pool that grows (or cuts a larger free block) whenever no reached free fits reserved 1.47x the
// live peak (docs/benchmarks.md, run 33).  Waiting for the fence of a block freed long ago costs
// the GPU little: the work queued after that fence keeps it busy while the program waits.
// Waiting for one freed just now would drain its queue.  So the wait is for the oldest pending
// block of pool p that serves asize, with the free and old pending blocks around it, among those
// with at least a quarter of the sync budget of frees after them; a request only a recent free
// would serve grows the pool, as before.  A quarter: replaying the H200 GPT-2 log with the GPU
// 2-100 ms behind, peak reserved was 1.22-1.24x the live peak with the whole budget, 1.16-1.19x
// with a quarter, 1.14-1.17x with a sixteenth, whose waits come nearer the tail of the GPU's
// queue (the GPU keeping up: 1.135x; immediate reuse: 1.104x).  On the H200 (runs 34-35):
// 1.14-1.22x.  Variants that looked sounder did worse on average over nine lags of that replay
// (1.21x against 1.18x), the layout being chaotic in the policy: the fit needing the fewest
// releases instead of the oldest, only runs tighter than the block a hit would cut, and old
// counted from the fence instead of the free.  True if it waited and the run it found is free
// now; it may also have released frees when it returns false.
bool block_pool::wait_for_old_fit(api_id api, pool_id p, uint64_t asize) {
    if (pending_bytes_[pool_index(p)] == 0 || !fences_usable() || !can_sync()) return false;
    // GPUMEM_FENCE_WAIT=order: every pending free at once (or, where that cannot be, the waits).
    if (order_release(api)) return true;
    // pending_[0, old): frees with at least `window` bytes freed after them (cum grows along
    // pending_, so a binary search).
    // GPUMEM_FENCE_WAIT=any: the newest frees too, fenced now if no fence covers them yet.
    const bool wait_any = cfg_.wait_any;
    if (wait_any && fenced_end() < pending_.size()) record_fence();
    const uint64_t window = wait_any ? 0 : sync_budget() / 4, newest = pending_.back()->cum;
    size_t old = size_t(std::partition_point(pending_.begin(), pending_.end(),
                                             [&](const block* x) { return newest - x->cum >= window; }) -
                        pending_.begin());
    old = std::min(old, fenced_end());  // a block no fence covers yet cannot be waited for
    if (old == 0) return false;
    // The run of free and old pending blocks around each old pending block of pool p, oldest
    // first, until one run serves asize: need = the frees to release, oldest first, to free it.
    // Bounded (the oldest 256 frees, 16 neighbours a side: at most 8,192 steps) so that a miss
    // stays cheap however many small frees wait; what lies beyond grows the pool as before.
    const uint64_t base = pending_[0]->seq, limit = base + old;
    auto usable = [&](const block* x) {
        return x && (x->state == block_state::free || (x->state == block_state::pending && x->seq < limit));
    };
    size_t need = SIZE_MAX;
    for (size_t k = 0; k < std::min<size_t>(old, 256) && need == SIZE_MAX; ++k) {
        const block* b = pending_[k];
        if (b->seg->pool != p) continue;
        uint64_t room = b->size, last = b->seq;
        int steps = 0;
        for (const block* x = b->prev; room < asize && steps < 16 && usable(x); x = x->prev, ++steps) {
            room += x->size;
            if (x->state == block_state::pending) last = std::max(last, x->seq);
        }
        steps = 0;
        for (const block* x = b->next; room < asize && steps < 16 && usable(x); x = x->next, ++steps) {
            room += x->size;
            if (x->state == block_state::pending) last = std::max(last, x->seq);
        }
        if (room >= asize) need = size_t(last - base) + 1;
    }
    if (need == SIZE_MAX) return false;
    const size_t before = pending_.size();
    while (before - pending_.size() < need && !fences_.empty()) {
        // A capture opened on another thread since the caller looked must see no wait.
        if (!can_sync()) return false;
        if (!wait_oldest_fence(api)) return sync_release(api);
    }
    return before - pending_.size() >= need;
}

// Waits, on events, for all work enqueued so far on every stream of the context: the legacy
// stream (its event waits for every blocking stream, per-thread default streams included) and,
// unless legacy_only, each non-blocking stream.  What a cuCtxSynchronize would wait for, but only
// on those streams: other contexts run on.  False when fences cannot cover the context now (a
// destroyed stream, a green context, no events); the caller then synchronizes.
bool block_pool::wait_all_streams(bool legacy_only) noexcept {
    if (!fences_usable() || !can_sync()) return false;
    std::unique_lock<std::mutex> held = streams_->hold();  // until the records are made (record_fence)
    if (!can_sync() || !streams_->fence_streams(ctx_, fence_streams_, held)) return false;  // as in record_fence
    fence f;  // scratch: every event is recorded first, then all are waited on
    try {
        f.events.reserve(fence_streams_.size() + 1);
    } catch (...) {
        return false;
    }
    const size_t n = legacy_only ? 1 : fence_streams_.size() + 1;
    bool ok = true;
    fence_timer timed(*this);  // the queries and records; the waits below are wait_ns
    for (size_t i = 0; ok && i < n; ++i) {
        if (i > 0 && backend_.stream_query(fence_streams_[i - 1]) == k_cuda_success) continue;  // idle
        uint64_t ev = 0;
        ok = take_event(&ev);
        if (!ok) break;
        f.events.push_back(ev);  // reserved: cannot throw
        ok = backend_.event_record(ev, i == 0 ? k_stream_legacy : fence_streams_[i - 1]) == k_cuda_success;
    }
    timed.stop();
    held.unlock();  // the waits below may be long: streams may come and go meanwhile (wait_oldest_fence)
    const uint64_t t0 = steady_ns();
    for (size_t i = 0; ok && i < f.events.size(); ++i) ok = backend_.event_synchronize(f.events[i]) == k_cuda_success;
    note_wait(t0);
    capture_checked_ = false;  // a wait: ask the driver again afterwards (can_sync)
    recycle_events(f.events);
    if (!ok) return false;
    ++fence_waits_;
    return true;
}

bool block_pool::drain_by_fence(api_id api) {
    // Before the switch all work of the context ran in one issue order: the legacy stream and at
    // most one blocking stream (the stream that ends it is new and has no work yet).  An event on
    // the legacy stream waits for all of it.  A context that lost a stream takes the sync.
    if (!wait_all_streams(true)) return false;
    unsettled_frees_ = 0;
    release_prefix(0, api, ef_fence);  // the drain's pool_sync, count 0
    return true;
}

// The frees made for immediate reuse since the last sync must have no work left before their
// chunks are unmapped.  auto before its switch has one issue order: the legacy stream's event
// covers it; immediate reuse (the program's own choice) may run on any stream.
bool block_pool::settle_frees(api_id api) {
    if (wait_all_streams(immediate_ && cfg_.reuse == reuse_mode::automatic)) {
        unsettled_frees_ = 0;
        // Logged as the drain is (a release of nothing by fences), so that its wait_ns is written
        // now: under immediate reuse no other pool_sync may ever follow to carry it.
        emit_release(api, 0, ef_fence);
        return true;
    }
    return sync_release(api);
}

}  // namespace gpumem
