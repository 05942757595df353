// A fake device for tests and benchmarks: made-up addresses, a capacity, injectable failures, counters.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>
#include <mutex>

#include "core/pool/pool_backend.h"

namespace gpumem {

// Addresses are handed out upwards from a fixed base and never reused, 2 MiB aligned with a
// 2 MiB gap between segments, so a test can tell any two segments apart and a stale address can
// never match a new one by accident.  With set_vmm(granularity) it also offers virtual memory:
// reservations take addresses the same way, and each mapped chunk counts against the capacity
// together with segment_alloc's bytes, as on a real device.  Thread-safe.
class fake_backend final : public pool_backend {
 public:
    static constexpr uint64_t k_base = 0x7f0000000000ull;

    explicit fake_backend(uint64_t capacity = 1ull << 40) noexcept : capacity_(capacity) {}

    int segment_alloc(uint64_t bytes, uint64_t* base) noexcept override;
    int segment_free(uint64_t base) noexcept override;
    int synchronize() noexcept override;
    bool may_synchronize() noexcept override {
        ++capture_asks_;
        const bool may = !capturing_.load() && !capturing_unseen_.load();
        // capture_after_asks: another thread opens a capture just after this answer.
        if (may && asks_before_capture_.load() > 0 && --asks_before_capture_ == 0) capturing_ = true;
        return may;
    }
    // Only the captures a hook would have counted (set_capturing), as the preload's answer is.
    bool may_synchronize_again() noexcept override { return !capturing_.load(); }
    void mem_info(uint64_t* free_b, uint64_t* total_b) noexcept override;
    uint64_t vmm_granularity() noexcept override { return granularity_.load(); }
    int va_reserve(uint64_t bytes, uint64_t* base) noexcept override;
    int va_free(uint64_t base, uint64_t bytes) noexcept override;
    int map_chunks(uint64_t addr, uint64_t chunk, size_t n, uint64_t* handles) noexcept override;
    int unmap_chunks(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept override;
    int map_alias(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept override;
    int unmap_alias(uint64_t addr, uint64_t chunk, size_t n) noexcept override;
    int unmap_keep(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept override;
    int map_kept(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept override;
    int release_kept(uint64_t chunk, size_t n, const uint64_t* handles) noexcept override;
    int event_create(uint64_t* ev) noexcept override;
    int event_record(uint64_t ev, uint64_t stream) noexcept override;
    int event_query(uint64_t ev) noexcept override;
    int event_synchronize(uint64_t ev) noexcept override;
    int stream_query(uint64_t stream) noexcept override;

    // Events, off until enable_events(): the pool then releases by synchronize() as with a driver
    // without them.  The completion model: the device is a clock of work done.  Each record
    // takes the next ticket; an event is reached once the clock passes its ticket.  With
    // auto_complete (the default) the device is idle and every record is reached at once; without
    // it, nothing is reached until complete_all()/complete_through() (the test plays the GPU).
    // event_synchronize() and synchronize() run the clock up to everything recorded.
    void enable_events(bool on) noexcept { events_on_ = on; }
    void set_auto_complete(bool on) noexcept;
    void complete_all() noexcept;
    uint64_t last_ticket() const noexcept;  // the ticket of the latest record
    void complete_through(uint64_t ticket) noexcept;
    void fail_next_records(int n) noexcept;  // the next n event_record calls fail (error 1)
    void fail_queries_after(int n) noexcept;  // n more event_query calls answer, then all fail (error 1)
    // Another thread opens a stream capture right after the next n event_synchronize calls
    // (may_synchronize() turns false then): the pool must notice it between two waits.  unseen:
    // by a route no hook sees (set_capturing_unseen), so only may_synchronize() knows.
    void capture_after_event_syncs(int n, bool unseen = false) noexcept;
    // Another thread opens a stream capture (one a hook counts) just after the n-th next
    // may_synchronize() has said yes: the pool's queries and waits after that check must see it.
    void capture_after_asks(int n) noexcept { asks_before_capture_ = n; }
    // Each event_synchronize and synchronize takes this long (a device still working), so that
    // a test can see the pool report how long it held the program up.
    void set_wait_sleep_ns(uint64_t ns) noexcept { wait_sleep_ns_ = ns; }
    // Each event_record, event_query, stream_query and stream_wait_event takes this long (a
    // driver's call cost), so that a test can see the pool report its calls' time (fence_ns).
    void set_call_sleep_ns(uint64_t ns) noexcept { call_sleep_ns_ = ns; }
    // Each map_chunks, unmap_chunks and mem_info takes this long, so that a test can see the pool
    // report its chunk calls' time (block_pool::chunk_driver).
    void set_chunk_sleep_ns(uint64_t ns) noexcept { chunk_sleep_ns_ = ns; }

    // Peer access: devices granted on every chunk mapped from now on, and a query per chunk.
    void add_peer(int device) noexcept override;
    void forget_peers() noexcept override;
    int set_peer_access(uint64_t addr, uint64_t bytes, int device) noexcept override;
    bool peer_can_access(uint64_t addr, int device) const noexcept;  // the mapping holding addr (first or second)
    // The program enqueues work (a kernel on any stream): it takes the next ticket, reached like
    // an event's.  Returns the ticket.  completed(): the ticket the device has reached.
    uint64_t enqueue_work() noexcept;
    // Work on one stream: stream_query() says that stream is busy until the clock passes it.
    // Work of enqueue_work() (any stream) makes every stream busy until it is done.
    uint64_t enqueue_work_on(uint64_t stream) noexcept;
    uint64_t completed() const noexcept;
    // A non-blocking stream whose work runs long (a copy on a side stream): until resume_stream()
    // (or a synchronize, or a wait on one of its events) it is busy and no event recorded on it is
    // reached, whatever the clock, while the legacy stream's events are (they do not wait for
    // it).  The one clock cannot say that otherwise.
    void stall_stream(uint64_t stream) noexcept;
    void resume_stream(uint64_t stream) noexcept;
    // Stream order, beside the one clock: work enqueued on `stream` now would start after the
    // work with ticket `ticket` on stream `on` (the same stream, or ordered by event waits:
    // stream_wait_event), or that work is done.  What a block handed out before its last owner's
    // work finished relies on (GPUMEM_FENCE_WAIT=order).  Vector clocks: each stream knows the
    // latest ticket of every stream its next work must follow.
    bool ordered_after(uint64_t stream, uint64_t on, uint64_t ticket) const noexcept;
    // A blocking stream (cuStreamCreate without CU_STREAM_NON_BLOCKING, or a per-thread default
    // stream): CUDA's implicit synchronization with the legacy stream.  Anything enqueued on the
    // legacy stream (work, an event record, a wait) follows all earlier work of every blocking
    // stream, and anything enqueued on a blocking stream follows all earlier legacy-stream work.
    void set_blocking(uint64_t stream) noexcept;
    uint64_t stream_waits() const noexcept { return stream_waits_; }
    void fail_next_stream_waits(int n) noexcept;  // the next n stream_wait_event calls fail (error 1)

    // Counters and state.
    void set_capacity(uint64_t bytes) noexcept;
    // The next n segment_alloc / map_chunks calls fail (a map_chunks call fails at its last chunk,
    // after mapping the others, so its unwinding is exercised).
    void fail_next_allocs(int n, int code = k_cuda_oom) noexcept;
    void set_vmm(uint64_t granularity) noexcept { granularity_ = granularity; }  // 0: no VMM
    void set_capturing(bool on) noexcept { capturing_ = on; }      // may_synchronize() returns !on
    // A capture begun by a route no hook sees: only may_synchronize() (the driver's answer) knows.
    void set_capturing_unseen(bool on) noexcept { capturing_unseen_ = on; }
    void end_captures() noexcept { capturing_ = capturing_unseen_ = false; }  // both kinds end
    uint64_t capture_asks() const noexcept { return capture_asks_.load(); }  // may_synchronize() calls
    void set_sync_result(int code) noexcept { sync_result_ = code; }

    // Counters and state.
    uint64_t alloc_calls() const noexcept { return alloc_calls_; }
    uint64_t free_calls() const noexcept { return free_calls_; }
    uint64_t sync_calls() const noexcept { return sync_calls_; }
    // Misuse by the pool: free of an unknown base, sync or unmap during a capture, a map outside
    // a reservation or over a mapped chunk, an unmap of the wrong handle, freeing a reservation
    // that still has mapped chunks.
    uint64_t bad_calls() const noexcept { return bad_calls_; }
    uint64_t map_calls() const noexcept { return map_calls_; }
    uint64_t unmap_calls() const noexcept { return unmap_calls_; }
    // Chunks that map_chunks calls refused in the end made and then unmade (all or nothing), as a
    // driver creates, maps and releases them one by one: what a doomed growth costs.
    uint64_t undone_chunks() const noexcept { return undone_; }
    uint64_t mapped_chunks() const noexcept;   // chunks mapped now
    uint64_t alias_chunks() const noexcept { return alias_chunks_; }  // chunks map_alias mapped, ever
    uint64_t kept_chunks() const noexcept;     // chunks unmap_keep kept and nothing mapped or released since
    uint64_t moved_chunks() const noexcept { return moved_; }  // chunks map_kept mapped, ever
    void set_moves(bool on) noexcept { moves_ = on; }  // off: unmap_keep is not supported (a backend without moves)
    uint64_t alias_unmapped_chunks() const noexcept { return alias_unmapped_; }  // chunks unmap_alias unmapped, ever
    uint64_t aliases() const noexcept;         // second mappings held now
    void fail_unmap_alias(bool on) noexcept { fail_unmap_alias_ = on; }  // unmap_alias refuses (a broken context)
    void fail_next_unmap_alias(int n) noexcept { fail_unmap_alias_n_ = n; }  // the next n unmap_alias calls refuse
    uint64_t reservations() const noexcept;    // reservations held now
    uint64_t va_reserves() const noexcept { return va_reserves_; }  // va_reserve calls that reserved, ever
    uint64_t records() const noexcept { return records_; }
    uint64_t queries() const noexcept { return queries_; }
    uint64_t stream_queries() const noexcept { return stream_queries_; }
    uint64_t event_syncs() const noexcept { return event_syncs_; }
    uint64_t records_on(uint64_t stream) const noexcept;  // how many records named this stream
    uint64_t in_use() const noexcept;
    uint64_t live_segments() const noexcept;
    bool is_live(uint64_t base) const noexcept;

 private:
    mutable std::mutex mu_;
    std::map<uint64_t, uint64_t> live_;  // base -> bytes
    std::map<uint64_t, uint64_t> reserved_;  // VA reservations: base -> bytes
    std::map<uint64_t, uint64_t> chunks_;    // mapped chunks: address -> handle
    std::map<uint64_t, uint64_t> chunk_size_;  // handle -> bytes
    std::map<uint64_t, uint64_t> aliases_;     // second mappings (map_alias): address -> handle
    // A handle unmap_keep unmapped and kept (still in use) has this bit in its chunk_size_ entry, so
    // that keeping one allocates nothing (a move must not fail halfway for the fake's own memory).
    static constexpr uint64_t k_kept = 1ull << 63;
    std::atomic<bool> moves_{true};
    std::map<uint64_t, uint64_t> alias_count_; // handle -> its second mappings
    std::atomic<uint64_t> alias_chunks_{0}, alias_unmapped_{0}, moved_{0}, va_reserves_{0};
    std::atomic<bool> fail_unmap_alias_{false};
    std::atomic<int> fail_unmap_alias_n_{0};
    uint64_t next_handle_ = 1;
    std::atomic<uint64_t> granularity_{0};
    uint64_t capacity_;
    uint64_t in_use_ = 0;
    uint64_t next_ = k_base;
    int fail_n_ = 0, fail_code_ = k_cuda_oom;
    std::atomic<bool> capturing_{false};
    std::atomic<bool> capturing_unseen_{false};
    std::atomic<uint64_t> capture_asks_{0};
    bool capturing() const noexcept { return capturing_ || capturing_unseen_; }  // for bad_calls_
    std::atomic<int> sync_result_{k_cuda_success};
    std::atomic<uint64_t> wait_sleep_ns_{0}, call_sleep_ns_{0}, chunk_sleep_ns_{0};
    static void nap(const std::atomic<uint64_t>& ns) noexcept;  // sleeps that long, if not 0
    std::atomic<uint64_t> alloc_calls_{0}, free_calls_{0}, sync_calls_{0}, bad_calls_{0};
    std::atomic<uint64_t> map_calls_{0}, unmap_calls_{0}, undone_{0};

    bool in_reservation(uint64_t addr, uint64_t bytes) const noexcept;  // mu_ held
    // map_chunks' and map_alias's arguments: granularity, alignment, inside a reservation (mu_ held).
    int check_map(uint64_t addr, uint64_t chunk, size_t n, const void* handles) noexcept;
    // map_alias's and map_kept's checks (mu_ held): check_map, then each handle's chunk_size_ entry
    // equal to `entry` (chunk, or chunk | k_kept) and its place free, then an injected failure.
    // All before anything is mapped (all or nothing).
    int check_handles(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles, uint64_t entry) noexcept;
    // The driver backend's access grant names the peers added so far, as map_chunks' does (mu_ held).
    void grant_peers(uint64_t addr, uint64_t chunk, size_t n) noexcept;
    void unmap_one(uint64_t addr) noexcept;                              // mu_ held
    // The mapped chunk holding addr (a chunk may be several granules), or chunks_.end() (mu_ held).
    std::map<uint64_t, uint64_t>::const_iterator chunk_at(uint64_t addr) const noexcept;
    // Events: handle -> ticket (0: created, never recorded).
    std::atomic<bool> events_on_{false};
    bool auto_complete_ = true;
    std::map<uint64_t, uint64_t> events_;
    std::map<uint64_t, uint64_t> records_by_stream_;
    uint64_t next_event_ = 0x100, ticket_ = 0, done_ = 0;
    int fail_records_ = 0;
    int ok_queries_left_ = -1;  // -1: queries never fail
    int syncs_before_capture_ = -1;  // -1: no capture opens by itself
    std::atomic<int> asks_before_capture_{-1};  // capture_after_asks; -1: none
    bool capture_unseen_next_ = false;  // the capture it opens is an unseen one
    std::vector<int> peers_;                        // add_peer's devices
    std::map<uint64_t, std::vector<int>> access_;   // mapping address (first or second) -> devices granted
    std::atomic<uint64_t> records_{0}, queries_{0}, event_syncs_{0}, stream_queries_{0};
    std::map<uint64_t, uint64_t> work_by_stream_;  // stream -> ticket of its latest work
    std::map<uint64_t, uint64_t> event_stream_;    // event -> the stream of its last record
    std::vector<uint64_t> stalled_;                // stall_stream()'s streams
    bool stalled(uint64_t stream) const noexcept;  // mu_ held
    void unstall(uint64_t stream) noexcept;        // mu_ held
    uint64_t any_work_ = 0;                        // ticket of the latest enqueue_work()
    // ordered_after's vector clocks: stream -> (stream -> latest ticket its next work follows);
    // event -> the clock of the stream it was last recorded on, at the record.
    std::map<uint64_t, std::map<uint64_t, uint64_t>> vc_;
    std::map<uint64_t, std::map<uint64_t, uint64_t>> event_vc_;
    std::vector<uint64_t> blocking_;  // set_blocking()'s streams
    void join_implicit(uint64_t stream);  // under mu_: the legacy stream's implicit order, into vc_[stream]
    std::atomic<uint64_t> stream_waits_{0};
    int fail_stream_waits_ = 0;

 public:
    int stream_wait_event(uint64_t stream, uint64_t ev) noexcept override;
};

}  // namespace gpumem
