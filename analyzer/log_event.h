// One parsed line of a gpumem event log: the plain record the reader fills and the replay consumes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "event_schema.h"

namespace gpumem::analysis {

// Members an event line may carry; `present` has one bit per member so the reader can say exactly
// which required member is missing.
enum field : uint8_t {
    fd_ev = 0, fd_seq, fd_t, fd_tid, fd_dev, fd_api, fd_kind, fd_ptr, fd_size, fd_asize, fd_seg,
    fd_pooled, fd_stream, fd_mempool, fd_handle, fd_offset, fd_err, fd_unknown, fd_pool, fd_count,
    fd_reserved, fd_allocated, fd_requested, fd_largest_free, fd_free_blocks, fd_segments,
    fd_gpu_free, fd_gpu_total, fd_reason, fd_signal, fd_events, fd_n_alloc, fd_n_free, fd_n_fail,
    fd_live_allocs, fd_live_bytes, fd_lost, fd_unmatched,
    fd_count_
};

// JSON member names, indexed by `field`.  The recorder's names come from the same schema document.
inline constexpr const char* k_field_names[] = {
    "ev", "seq", "t", "tid", "dev", "api", "kind", "ptr", "size", "asize", "seg",
    "pooled", "stream", "mempool", "handle", "offset", "err", "unknown", "pool", "count",
    "reserved", "allocated", "requested", "largest_free", "free_blocks", "segments",
    "gpu_free", "gpu_total", "reason", "signal", "events", "n_alloc", "n_free", "n_fail",
    "live_allocs", "live_bytes", "lost", "unmatched",
};
static_assert(sizeof(k_field_names) / sizeof(k_field_names[0]) == fd_count_);

constexpr uint64_t bit(field f) { return uint64_t{1} << f; }

// A parsed event.  Only members whose bit is set in `present` are meaningful.
struct log_event {
    uint64_t present = 0;
    bool known_kind = false;     // false: an "ev" this analyzer does not know (skipped by policy)
    ev_kind ev = ev_kind::header;
    mem_kind kind = mem_kind::none;
    pool_id pool = pool_id::none;
    bool pooled = false;
    bool unknown = false;        // free of a pointer the recorder never saw allocated
    uint16_t api = 0;            // index into the reader's api name table (api_id values first)
    int32_t dev = -1;
    uint32_t tid = 0;
    int64_t err = 0;
    int64_t signal = 0;
    uint64_t seq = 0, t = 0;
    uint64_t ptr = 0, size = 0, asize = 0, seg = 0, handle = 0, offset = 0, stream = 0, mempool = 0;
    uint64_t count = 0;
    // oom / stats
    uint64_t reserved = 0, allocated = 0, requested = 0, largest_free = 0, free_blocks = 0,
             segments = 0, gpu_free = 0, gpu_total = 0;
    // end
    std::string reason;
    uint64_t events = 0, n_alloc = 0, n_free = 0, n_fail = 0, live_allocs = 0, live_bytes = 0,
             lost = 0, unmatched = 0;

    bool has(field f) const { return present & bit(f); }
    // Bytes set aside: "asize" when the recorder wrote it, else "size".
    uint64_t set_aside() const { return has(fd_asize) ? asize : size; }
};

}  // namespace gpumem::analysis
