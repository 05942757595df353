// A fake device for tests and benchmarks: made-up addresses, a capacity, injectable failures, counters.
#include "core/pool/fake_backend.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <new>

namespace gpumem {

namespace {
// into[s] = max(into[s], from[s]) for every stream s: the later of two vector clocks.
void merge_clock(std::map<uint64_t, uint64_t>& into, const std::map<uint64_t, uint64_t>& from) {
    for (const auto& [s, t] : from) into[s] = std::max(into[s], t);
}

// Calls f for each stream whose earlier work an operation on `stream` follows by CUDA's implicit
// synchronization: every blocking stream for the legacy stream, the legacy stream for a blocking one.
template <class F>
void for_each_implicit(const std::vector<uint64_t>& blocking, uint64_t stream, F f) {
    if (stream == k_stream_legacy) {
        for (uint64_t b : blocking) f(b);
    } else if (std::find(blocking.begin(), blocking.end(), stream) != blocking.end()) {
        f(k_stream_legacy);
    }
}
}  // namespace

int fake_backend::segment_alloc(uint64_t bytes, uint64_t* base) noexcept {
    ++alloc_calls_;
    std::lock_guard<std::mutex> lk(mu_);
    if (fail_n_ > 0) {
        --fail_n_;
        return fail_code_;
    }
    if (bytes == 0) return k_cuda_invalid_value;
    if (in_use_ > capacity_ || bytes > capacity_ - in_use_) return k_cuda_oom;
    constexpr uint64_t k_align = 2ull << 20;
    const uint64_t b = next_;
    try {
        live_.emplace(b, bytes);
    } catch (...) {
        return k_cuda_oom;
    }
    next_ += (bytes + k_align - 1) / k_align * k_align + k_align;  // leave a gap: segments never touch
    in_use_ += bytes;
    *base = b;
    return k_cuda_success;
}

int fake_backend::segment_free(uint64_t base) noexcept {
    ++free_calls_;
    std::lock_guard<std::mutex> lk(mu_);
    auto it = live_.find(base);
    // A real cuMemFree synchronizes: calling it during a capture is a pool bug, counted as such.
    if (it == live_.end() || capturing()) {
        ++bad_calls_;
        return k_cuda_invalid_value;
    }
    in_use_ -= it->second;
    live_.erase(it);
    return k_cuda_success;
}

void fake_backend::nap(const std::atomic<uint64_t>& ns) noexcept {
    if (const uint64_t n = ns.load()) std::this_thread::sleep_for(std::chrono::nanoseconds(n));
}

int fake_backend::synchronize() noexcept {
    ++sync_calls_;
    nap(wait_sleep_ns_);
    if (capturing()) ++bad_calls_;
    if (sync_result_ == k_cuda_success) {
        complete_all();
        std::lock_guard<std::mutex> lk(mu_);
        stalled_.clear();  // the context's work, stalled streams' too, is done
    }
    return sync_result_;
}

void fake_backend::stall_stream(uint64_t stream) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    try {
        stalled_.push_back(stream);
    } catch (...) {
    }
}

void fake_backend::resume_stream(uint64_t stream) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    unstall(stream);
}

bool fake_backend::stalled(uint64_t stream) const noexcept {
    return std::find(stalled_.begin(), stalled_.end(), stream) != stalled_.end();
}

void fake_backend::unstall(uint64_t stream) noexcept {
    stalled_.erase(std::remove(stalled_.begin(), stalled_.end(), stream), stalled_.end());
}

int fake_backend::event_create(uint64_t* ev) noexcept {
    if (!events_on_) return k_cuda_not_supported;
    std::lock_guard<std::mutex> lk(mu_);
    try {
        events_.emplace(next_event_, 0);
    } catch (...) {
        return k_cuda_oom;
    }
    *ev = next_event_++;
    return k_cuda_success;
}

int fake_backend::event_record(uint64_t ev, uint64_t stream) noexcept {
    if (!events_on_) return k_cuda_not_supported;
    nap(call_sleep_ns_);
    ++records_;
    std::lock_guard<std::mutex> lk(mu_);
    if (capturing()) ++bad_calls_;  // a record into a capture is a graph node, not a fence
    auto it = events_.find(ev);
    if (it == events_.end() || stream == 0) {
        ++bad_calls_;
        return k_cuda_invalid_value;
    }
    if (fail_records_ > 0) {
        --fail_records_;
        return k_cuda_invalid_value;
    }
    it->second = ++ticket_;
    if (auto_complete_) done_ = ticket_;
    try {
        ++records_by_stream_[stream];
        event_stream_[ev] = stream;
        join_implicit(stream);
        event_vc_[ev] = vc_[stream];  // what the event's wait will order after
    } catch (...) {
    }
    return k_cuda_success;
}

int fake_backend::stream_wait_event(uint64_t stream, uint64_t ev) noexcept {
    if (!events_on_) return k_cuda_not_supported;
    nap(call_sleep_ns_);
    ++stream_waits_;
    std::lock_guard<std::mutex> lk(mu_);
    if (capturing()) ++bad_calls_;  // a wait on an outside event inside a capture
    auto it = events_.find(ev);
    if (it == events_.end() || stream == 0) {
        ++bad_calls_;
        return k_cuda_invalid_value;
    }
    if (fail_stream_waits_ > 0) {
        --fail_stream_waits_;
        return k_cuda_invalid_value;
    }
    try {
        join_implicit(stream);
        merge_clock(vc_[stream], event_vc_[ev]);
        // The stream is busy until the event is reached, as a real stream waiting on it is.
        uint64_t& w = work_by_stream_[stream];
        w = std::max(w, it->second);
    } catch (...) {
        return k_cuda_oom;  // no host memory for the clocks
    }
    return k_cuda_success;
}

void fake_backend::set_blocking(uint64_t stream) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    try {
        blocking_.push_back(stream);
    } catch (...) {
    }
}

// Before an operation on `stream` takes its place: the legacy stream follows every blocking
// stream's work so far, a blocking stream the legacy stream's (vector clocks merged).  May throw
// (host memory): the callers' own try blocks take it.
void fake_backend::join_implicit(uint64_t stream) {
    for_each_implicit(blocking_, stream, [&](uint64_t from) {
        auto it = vc_.find(from);
        if (it != vc_.end()) merge_clock(vc_[stream], it->second);
    });
}

bool fake_backend::ordered_after(uint64_t stream, uint64_t on, uint64_t ticket) const noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    if (ticket <= done_ && !stalled(on)) return true;
    // The clock work enqueued on `stream` now would get: its own, and what the implicit
    // synchronization adds (join_implicit) when it is the legacy or a blocking stream.
    auto follows = [&](uint64_t s) {
        auto it = vc_.find(s);
        if (it == vc_.end()) return false;
        auto t = it->second.find(on);
        return t != it->second.end() && t->second >= ticket;
    };
    bool yes = follows(stream);
    for_each_implicit(blocking_, stream, [&](uint64_t from) { yes = yes || follows(from); });
    return yes;
}

void fake_backend::fail_next_stream_waits(int n) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    fail_stream_waits_ = n;
}

int fake_backend::event_query(uint64_t ev) noexcept {
    nap(call_sleep_ns_);
    ++queries_;
    std::lock_guard<std::mutex> lk(mu_);
    if (capturing()) ++bad_calls_;  // during a global-mode capture a cuEventQuery invalidates it
    auto it = events_.find(ev);
    if (it == events_.end()) {
        ++bad_calls_;
        return k_cuda_invalid_value;
    }
    if (ok_queries_left_ == 0) return k_cuda_invalid_value;  // a broken context (fail_queries_after)
    if (ok_queries_left_ > 0) --ok_queries_left_;
    auto st = event_stream_.find(ev);
    if (st != event_stream_.end() && stalled(st->second)) return k_cuda_not_ready;
    return it->second <= done_ ? k_cuda_success : k_cuda_not_ready;
}

int fake_backend::event_synchronize(uint64_t ev) noexcept {
    ++event_syncs_;
    nap(wait_sleep_ns_);
    std::lock_guard<std::mutex> lk(mu_);
    if (capturing()) ++bad_calls_;
    auto it = events_.find(ev);
    if (it == events_.end()) {
        ++bad_calls_;
        return k_cuda_invalid_value;
    }
    if (it->second > done_) done_ = it->second;  // the device works up to the event
    auto st = event_stream_.find(ev);  // and its stream's stalled work finishes meanwhile
    if (st != event_stream_.end()) unstall(st->second);
    if (syncs_before_capture_ > 0 && --syncs_before_capture_ == 0) (capture_unseen_next_ ? capturing_unseen_ : capturing_) = true;
    return k_cuda_success;
}

void fake_backend::capture_after_event_syncs(int n, bool unseen) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    syncs_before_capture_ = n;
    capture_unseen_next_ = unseen;
}

void fake_backend::set_auto_complete(bool on) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    auto_complete_ = on;
}

void fake_backend::complete_all() noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    done_ = ticket_;
}

uint64_t fake_backend::last_ticket() const noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    return ticket_;
}

void fake_backend::complete_through(uint64_t t) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    if (t > done_) done_ = t;
}

uint64_t fake_backend::enqueue_work() noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    any_work_ = ++ticket_;
    if (auto_complete_) done_ = ticket_;
    return ticket_;
}

uint64_t fake_backend::enqueue_work_on(uint64_t stream) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    ++ticket_;
    try {
        work_by_stream_[stream] = ticket_;
        join_implicit(stream);
        vc_[stream][stream] = ticket_;
    } catch (...) {
        any_work_ = ticket_;  // no host memory: every stream busy, the safe answer
    }
    if (auto_complete_) done_ = ticket_;
    return ticket_;
}

int fake_backend::stream_query(uint64_t stream) noexcept {
    if (!events_on_) return k_cuda_not_supported;
    nap(call_sleep_ns_);
    ++stream_queries_;
    std::lock_guard<std::mutex> lk(mu_);
    if (capturing()) ++bad_calls_;  // a query of a capturing stream would invalidate the capture
    if (stalled(stream)) return k_cuda_not_ready;
    auto it = work_by_stream_.find(stream);
    const uint64_t last = std::max(any_work_, it == work_by_stream_.end() ? 0 : it->second);
    return last <= done_ ? k_cuda_success : k_cuda_not_ready;
}

uint64_t fake_backend::completed() const noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    return done_;
}

void fake_backend::fail_queries_after(int n) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    ok_queries_left_ = n;
}

void fake_backend::fail_next_records(int n) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    fail_records_ = n;
}

uint64_t fake_backend::records_on(uint64_t stream) const noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = records_by_stream_.find(stream);
    return it == records_by_stream_.end() ? 0 : it->second;
}

void fake_backend::mem_info(uint64_t* free_b, uint64_t* total_b) noexcept {
    nap(chunk_sleep_ns_);
    std::lock_guard<std::mutex> lk(mu_);
    *free_b = capacity_ > in_use_ ? capacity_ - in_use_ : 0;
    *total_b = capacity_;
}

void fake_backend::set_capacity(uint64_t bytes) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    capacity_ = bytes;
}

void fake_backend::fail_next_allocs(int n, int code) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    fail_n_ = n;
    fail_code_ = code;
}

int fake_backend::va_reserve(uint64_t bytes, uint64_t* base) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    const uint64_t g = granularity_.load();
    if (g == 0) return k_cuda_not_supported;
    if (bytes == 0 || bytes % g) return k_cuda_invalid_value;
    const uint64_t b = (next_ + g - 1) / g * g;
    try {
        reserved_.emplace(b, bytes);
    } catch (...) {
        return k_cuda_oom;
    }
    next_ = b + bytes + g;  // a gap, as between segments
    ++va_reserves_;
    *base = b;
    return k_cuda_success;
}

int fake_backend::va_free(uint64_t base, uint64_t bytes) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = reserved_.find(base);
    if (it == reserved_.end() || it->second != bytes) {
        ++bad_calls_;
        return k_cuda_invalid_value;
    }
    auto c = chunks_.lower_bound(base);
    auto a = aliases_.lower_bound(base);
    if ((c != chunks_.end() && c->first < base + bytes) || (a != aliases_.end() && a->first < base + bytes)) {
        ++bad_calls_;  // the driver refuses to free address space that is still mapped
        return k_cuda_invalid_value;
    }
    reserved_.erase(it);
    return k_cuda_success;
}

bool fake_backend::in_reservation(uint64_t addr, uint64_t bytes) const noexcept {
    auto it = reserved_.upper_bound(addr);
    if (it == reserved_.begin()) return false;
    --it;
    return addr - it->first <= it->second && bytes <= it->second - (addr - it->first);
}

void fake_backend::unmap_one(uint64_t addr) noexcept {
    access_.erase(addr);
    auto it = chunks_.find(addr);
    auto sz = chunk_size_.find(it->second);
    in_use_ -= sz->second;
    chunk_size_.erase(sz);
    chunks_.erase(it);
}

int fake_backend::check_map(uint64_t addr, uint64_t chunk, size_t n, const void* handles) noexcept {
    const uint64_t g = granularity_.load();
    if (g == 0) return k_cuda_not_supported;
    if (n == 0 || chunk == 0 || chunk % g || addr % g || !handles) return k_cuda_invalid_value;
    if (!in_reservation(addr, chunk * n)) {
        ++bad_calls_;
        return k_cuda_invalid_value;
    }
    return k_cuda_success;
}

int fake_backend::map_chunks(uint64_t addr, uint64_t chunk, size_t n, uint64_t* handles) noexcept {
    ++map_calls_;
    nap(chunk_sleep_ns_);
    std::lock_guard<std::mutex> lk(mu_);
    if (int bad = check_map(addr, chunk, n, handles)) return bad;
    int rc = k_cuda_success;
    size_t done = 0;
    for (; done < n; ++done) {
        const uint64_t a = addr + done * chunk;
        if (done + 1 == n && fail_n_ > 0) {
            --fail_n_;
            rc = fail_code_;
            break;
        }
        if (chunks_.count(a) || aliases_.count(a)) {
            ++bad_calls_;
            rc = k_cuda_invalid_value;
            break;
        }
        if (in_use_ > capacity_ || chunk > capacity_ - in_use_) {
            rc = k_cuda_oom;
            break;
        }
        try {
            chunks_.emplace(a, next_handle_);
            try {
                chunk_size_.emplace(next_handle_, chunk);
            } catch (...) {
                chunks_.erase(a);
                throw;
            }
        } catch (...) {
            rc = k_cuda_oom;
            break;
        }
        in_use_ += chunk;
        handles[done] = next_handle_++;
        if (!peers_.empty()) {
            try {
                access_[a] = peers_;
            } catch (...) {
            }
        }
    }
    if (rc != k_cuda_success) {
        for (size_t i = 0; i < done; ++i) unmap_one(addr + i * chunk);  // all or nothing
        undone_ += done;
        return rc;
    }
    return k_cuda_success;
}

int fake_backend::unmap_chunks(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept {
    ++unmap_calls_;
    nap(chunk_sleep_ns_);
    std::lock_guard<std::mutex> lk(mu_);
    // cuMemUnmap does not wait for device work: unmapping during a capture is a pool bug.
    if (capturing()) ++bad_calls_;
    int rc = k_cuda_success;
    for (size_t i = 0; i < n; ++i) {
        auto it = chunks_.find(addr + i * chunk);
        if (it == chunks_.end() || it->second != handles[i] || chunk_size_[it->second] != chunk) {
            ++bad_calls_;
            rc = k_cuda_invalid_value;
            continue;
        }
        // Releasing a chunk that is still mapped a second time: its memory would live on there
        // (the driver frees it only at the last unmap), but the pool would have counted it gone.
        if (alias_count_.count(handles[i])) ++bad_calls_;
        unmap_one(addr + i * chunk);
    }
    return rc;
}

int fake_backend::check_handles(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles,
                                uint64_t entry) noexcept {
    if (int bad = check_map(addr, chunk, n, handles)) return bad;
    for (size_t i = 0; i < n; ++i) {
        const uint64_t a = addr + i * chunk;
        auto sz = chunk_size_.find(handles[i]);
        if (sz == chunk_size_.end() || sz->second != entry || chunks_.count(a) || aliases_.count(a)) {
            ++bad_calls_;
            return k_cuda_invalid_value;
        }
    }
    if (fail_n_ > 0) {  // an injected failure, before anything is mapped (all or nothing)
        --fail_n_;
        return fail_code_;
    }
    return k_cuda_success;
}

void fake_backend::grant_peers(uint64_t addr, uint64_t chunk, size_t n) noexcept {
    if (peers_.empty()) return;
    try {
        for (size_t i = 0; i < n; ++i) access_[addr + i * chunk] = peers_;
    } catch (...) {
        for (size_t i = 0; i < n; ++i) access_.erase(addr + i * chunk);  // mapped for the device alone
    }
}

int fake_backend::map_alias(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept {
    ++map_calls_;
    std::lock_guard<std::mutex> lk(mu_);
    if (int rc = check_handles(addr, chunk, n, handles, chunk)) return rc;
    size_t done = 0;
    try {
        for (; done < n; ++done) {
            aliases_.emplace(addr + done * chunk, handles[done]);
            ++alias_count_[handles[done]];
        }
    } catch (...) {
        aliases_.erase(addr + done * chunk);  // mapped before its count failed, if it was
        for (size_t i = 0; i < done; ++i) {
            aliases_.erase(addr + i * chunk);
            if (--alias_count_[handles[i]] == 0) alias_count_.erase(handles[i]);
        }
        return k_cuda_oom;
    }
    grant_peers(addr, chunk, n);
    alias_chunks_ += n;
    return k_cuda_success;
}

int fake_backend::unmap_alias(uint64_t addr, uint64_t chunk, size_t n) noexcept {
    ++unmap_calls_;
    if (fail_unmap_alias_) return k_cuda_invalid_value;  // refused before anything is unmapped
    if (fail_unmap_alias_n_.load() > 0 && fail_unmap_alias_n_.fetch_sub(1) > 0) return k_cuda_invalid_value;
    std::lock_guard<std::mutex> lk(mu_);
    if (capturing()) ++bad_calls_;  // as unmap_chunks: cuMemUnmap does not wait for device work
    int rc = k_cuda_success;
    for (size_t i = 0; i < n; ++i) {
        auto it = aliases_.find(addr + i * chunk);
        if (it == aliases_.end()) {
            ++bad_calls_;
            rc = k_cuda_invalid_value;
            continue;
        }
        auto c = alias_count_.find(it->second);
        if (c != alias_count_.end() && --c->second == 0) alias_count_.erase(c);
        aliases_.erase(it);
        access_.erase(addr + i * chunk);  // a later mapping there is granted anew
        ++alias_unmapped_;
    }
    return rc;
}

int fake_backend::unmap_keep(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept {
    if (!moves_) return k_cuda_not_supported;
    ++unmap_calls_;
    nap(chunk_sleep_ns_);
    std::lock_guard<std::mutex> lk(mu_);
    if (capturing()) ++bad_calls_;  // as unmap_chunks: cuMemUnmap does not wait for device work
    int rc = k_cuda_success;
    for (size_t i = 0; i < n; ++i) {
        const uint64_t a = addr + i * chunk;
        auto it = chunks_.find(a);
        auto sz = it == chunks_.end() ? chunk_size_.end() : chunk_size_.find(it->second);
        if (it == chunks_.end() || it->second != handles[i] || sz == chunk_size_.end() || sz->second != chunk) {
            ++bad_calls_;
            rc = k_cuda_invalid_value;
            continue;
        }
        // A chunk moved while a stitched range still maps it would serve two blocks at once.
        if (alias_count_.count(handles[i])) ++bad_calls_;
        sz->second |= k_kept;
        access_.erase(a);
        chunks_.erase(it);
    }
    return rc;
}

int fake_backend::map_kept(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept {
    ++map_calls_;
    nap(chunk_sleep_ns_);
    std::lock_guard<std::mutex> lk(mu_);
    if (int rc = check_handles(addr, chunk, n, handles, chunk | k_kept)) return rc;
    size_t done = 0;
    try {
        for (; done < n; ++done) chunks_.emplace(addr + done * chunk, handles[done]);
    } catch (...) {
        for (size_t i = 0; i < done; ++i) chunks_.erase(addr + i * chunk);
        return k_cuda_oom;
    }
    for (size_t i = 0; i < n; ++i) chunk_size_[handles[i]] = chunk;  // found above: no insertion
    grant_peers(addr, chunk, n);
    moved_ += n;
    return k_cuda_success;
}

int fake_backend::release_kept(uint64_t chunk, size_t n, const uint64_t* handles) noexcept {
    ++unmap_calls_;
    std::lock_guard<std::mutex> lk(mu_);
    int rc = k_cuda_success;
    for (size_t i = 0; i < n; ++i) {
        auto sz = chunk_size_.find(handles[i]);
        if (sz == chunk_size_.end() || sz->second != (chunk | k_kept)) {
            ++bad_calls_;  // not kept: mapped, released already, or never made
            rc = k_cuda_invalid_value;
            continue;
        }
        in_use_ -= chunk;
        chunk_size_.erase(sz);
    }
    return rc;
}

uint64_t fake_backend::kept_chunks() const noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    uint64_t n = 0;
    for (const auto& [h, size] : chunk_size_) n += (size & k_kept) != 0;
    return n;
}

uint64_t fake_backend::aliases() const noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    return aliases_.size();
}

uint64_t fake_backend::mapped_chunks() const noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    return chunks_.size();
}

uint64_t fake_backend::reservations() const noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    return reserved_.size();
}

uint64_t fake_backend::in_use() const noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    return in_use_;
}

uint64_t fake_backend::live_segments() const noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    return live_.size();
}

bool fake_backend::is_live(uint64_t base) const noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    return live_.count(base) != 0;
}

void fake_backend::forget_peers() noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    peers_.clear();
}

void fake_backend::add_peer(int device) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    try {
        peers_.push_back(device);
    } catch (...) {
    }
}

std::map<uint64_t, uint64_t>::const_iterator fake_backend::chunk_at(uint64_t addr) const noexcept {
    auto it = chunks_.upper_bound(addr);
    if (it == chunks_.begin()) return chunks_.end();
    --it;
    auto sz = chunk_size_.find(it->second);
    return sz != chunk_size_.end() && addr - it->first < sz->second ? it : chunks_.end();
}

int fake_backend::set_peer_access(uint64_t addr, uint64_t bytes, int device) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    const uint64_t g = granularity_.load();
    if (!g || addr % g || bytes % g || !bytes) {
        ++bad_calls_;
        return k_cuda_invalid_value;
    }
    // Whole mappings only (a chunk may be several granules: GPUMEM_POOL_CHUNK), every byte mapped:
    // first mappings (map_chunks) or second ones (map_alias: a stitched range).
    auto mapping_at = [&](uint64_t x) -> uint64_t {  // the size of the mapping starting at x, or 0
        auto c = chunk_at(x);
        if (c != chunks_.end() && c->first == x) return chunk_size_.find(c->second)->second;
        auto al = aliases_.find(x);
        if (al != aliases_.end()) return chunk_size_.find(al->second)->second;
        return 0;
    };
    uint64_t a = addr;
    while (a < addr + bytes) {
        const uint64_t sz = mapping_at(a);
        if (!sz) break;
        a += sz;
    }
    if (a != addr + bytes) {
        ++bad_calls_;
        return k_cuda_invalid_value;
    }
    try {
        for (a = addr; a < addr + bytes; a += mapping_at(a)) access_[a].push_back(device);
    } catch (...) {
        return k_cuda_oom;
    }
    return k_cuda_success;
}

bool fake_backend::peer_can_access(uint64_t addr, int device) const noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    uint64_t start = 0;
    auto c = chunk_at(addr);
    if (c != chunks_.end()) {
        start = c->first;
    } else {  // a second mapping (its handle's size: GPUMEM_POOL_CHUNK)
        auto al = aliases_.upper_bound(addr);
        if (al == aliases_.begin()) return false;
        --al;
        if (addr - al->first >= chunk_size_.find(al->second)->second) return false;
        start = al->first;
    }
    auto it = access_.find(start);
    if (it == access_.end()) return false;
    for (int d : it->second)
        if (d == device) return true;
    return false;
}

}  // namespace gpumem
