// The report model: everything `gpumem report` computes about one log, per device.  `check` and
// `diff` reuse it, so it holds numbers and names only, no formatting.
#pragma once

#include <array>
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "event_schema.h"
#include "metrics/sites.h"

namespace gpumem::analysis {

// A byte count with its peak and the moment of the peak (first time it was reached).
struct tracked_bytes {
    uint64_t current = 0;
    uint64_t peak = 0;
    uint64_t peak_t = 0;    // ns since the recorder started
    uint64_t peak_seq = 0;
    uint64_t peak_line = 0;
    void add(uint64_t n, uint64_t t, uint64_t seq, uint64_t line) {
        current += n;
        if (current > peak) {
            peak = current;
            peak_t = t;
            peak_seq = seq;
            peak_line = line;
        }
    }
    void sub(uint64_t n) { current = n > current ? 0 : current - n; }
};

// Power-of-two size histogram: bucket i counts sizes in [2^i, 2^(i+1)); sizes of 0 go to bucket 0.
struct size_histogram {
    std::array<uint64_t, 64> count{};
    std::array<uint64_t, 64> bytes{};
    static int bucket_of(uint64_t size) { return size <= 1 ? 0 : 63 - __builtin_clzll(size); }
    void add(uint64_t size) {
        int b = bucket_of(size);
        ++count[size_t(b)];
        bytes[size_t(b)] += size;
    }
    uint64_t total() const {
        uint64_t n = 0;
        for (uint64_t c : count) n += c;
        return n;
    }
};

// One point of the memory-over-time series.  A point stands for a run of consecutive events
// (the series is downsampled to a bounded length) and keeps the maxima over that run, so a
// short spike is never averaged away.
struct time_point {
    uint64_t t_first = 0, t_last = 0;
    uint64_t seq_last = 0;
    uint64_t requested_max = 0, allocated_max = 0, reserved_max = 0;
    uint64_t requested_last = 0, allocated_last = 0, reserved_last = 0;
    double frag_max = 0, frag_last = 0;  // external fragmentation
    uint64_t events = 0;
    // Its values after its last event are below its maxima: a chart or track must close it with
    // them, even where its events share one time, or the level after it would be its maximum.
    bool falls() const noexcept {
        return requested_last != requested_max || allocated_last != allocated_max || reserved_last != reserved_max ||
               frag_last != frag_max;
    }
};

// Where the text rows, the HTML charts and the Perfetto tracks place timeline points.  Seq order
// is the log's, and t can step back in it (a thread reads the clock before it takes its seq; a
// hand-made log): each point goes at the latest time seen up to it, the earlier points' last times
// included, so a chart never runs back in time and a trace sorted by time keeps seq order.  The
// points are given in timeline order; the report's "when" of a peak keeps the event's own t.
class timeline_clock {
  public:
    struct placed {
        uint64_t first, last;
    };
    placed place(const time_point& p) noexcept {
        const uint64_t first = std::max(seen_, p.t_first);
        seen_ = std::max(first, p.t_last);
        return {first, seen_};
    }

  private:
    uint64_t seen_ = 0;
};

// An allocation as reported (live at a moment, or leaked at the end).
struct block_view {
    uint64_t ptr = 0, size = 0, asize = 0;  // asize = bytes set aside (== size when not rounded)
    uint64_t seq = 0, t = 0, line = 0;      // when it was allocated
    uint64_t seg = 0;                       // pool segment base, 0 when not pooled
    std::string api;
    mem_kind kind = mem_kind::none;
    bool pooled = false;
};

// One pool segment at a moment: its blocks as [ptr, ptr+asize) ranges, sorted by address.
struct segment_view {
    uint64_t base = 0, size = 0;
    pool_id pool = pool_id::none;
    std::vector<std::pair<uint64_t, uint64_t>> blocks;   // (ptr, asize): every occupied block
    std::vector<std::pair<uint64_t, uint64_t>> pending;  // the subset freed but not yet reusable
    // (ptr, size): ranges of a virtual-memory segment without chunks (given back by segment_unmap,
    // or not mapped yet since segment_alloc's asize); no memory behind them, so neither occupied
    // nor free.
    std::vector<std::pair<uint64_t, uint64_t>> holes;

    // Bytes not free (blocks and holes), and the largest gap between them (the segment's largest
    // free block): the free bytes are size - used.
    struct usage {
        uint64_t used = 0, largest_free = 0;
    };
    usage measure() const {
        usage u;
        uint64_t cur = base;
        size_t i = 0, j = 0;
        while (i < blocks.size() || j < holes.size()) {  // both sorted by address: merge them
            bool hole = i == blocks.size() || (j < holes.size() && holes[j].first < blocks[i].first);
            const auto& [p, a] = hole ? holes[j++] : blocks[i++];
            u.used += a;
            if (p > cur) u.largest_free = std::max(u.largest_free, p - cur);
            cur = p + a;
        }
        if (base + size > cur) u.largest_free = std::max(u.largest_free, base + size - cur);
        return u;
    }
    // What a free-block map draws: the segment without a hole at its end.  An arena reserves the
    // device's memory in address space and maps its start as it grows: drawn whole, its memory
    // would be a sliver of a bar of unmapped space.  The hole cut off is tail_unmapped.
    segment_view drawn() const {
        segment_view v = *this;
        // Holes that touch count as one (a given-back range next to the never-mapped end).
        while (!v.holes.empty() && v.holes.back().first + v.holes.back().second == base + v.size &&
               v.holes.back().first > base) {
            v.size = v.holes.back().first - base;
            v.holes.pop_back();
        }
        return v;
    }
    uint64_t tail_unmapped() const { return size - drawn().size; }
};

// The device's state at one moment: totals, the free-block map and the largest live blocks.
struct state_snapshot {
    bool valid = false;
    std::string label;  // "peak", "oom #2", "--at 1.5s"
    uint64_t seq = 0, t = 0, line = 0;
    uint64_t requested = 0, allocated = 0, reserved = 0;
    uint64_t free_in_segments = 0, largest_free = 0, free_blocks = 0, segments = 0;
    uint64_t live_allocs = 0;
    uint64_t pending = 0;  // bytes in pending blocks (freed, not reusable until a pool_sync)
    uint64_t unmapped = 0; // bytes of holes in held segments (segment_unmap, asize): not reserved, not free
    double external_fragmentation = 0;
    std::vector<segment_view> segment_map;
    std::vector<block_view> largest_live;  // at most k_top_blocks, largest first
    size_histogram free_block_sizes;
};

// An out-of-memory moment and its diagnosis.
struct oom_report {
    uint64_t seq = 0, t = 0, line = 0;
    uint64_t size = 0;                 // bytes requested by the failing call
    std::string api;
    bool from_pool = false;            // an "oom" event (pool on) rather than an alloc_fail
    int64_t err = 0;                   // alloc_fail's error code
    uint32_t stack = 0;                // the failing call's stack (alloc_fail's "stack"), 0 when not recorded
    uint64_t free_in_segments = 0;     // reconstructed: free bytes inside reserved segments
    uint64_t largest_free = 0;         // reconstructed: largest free block
    uint64_t reserved = 0, allocated = 0;
    uint64_t requested = 0;            // bytes the live allocations asked for: allocated - requested is their rounding
    uint64_t pending = 0;              // bytes in pending blocks: freed by the program, not yet reusable
    // Whether the verdict took the device's pool as on virtual memory, and so counted the blocks'
    // rounding (allocated - requested) as memory a request could have had (docs/metrics.md).
    bool pool_vmm = false;
    uint64_t block_rounding() const { return allocated > requested ? allocated - requested : 0; }
    uint64_t gpu_free = 0, gpu_total = 0;  // cuMemGetInfo, as recorded (0 when not recorded)
    // Whether the driver's free memory at the failure was recorded (a nonzero gpu_total).  When it
    // was not, the verdict counted it as 0: the views say "as far as the log says".
    bool gpu_free_recorded() const { return gpu_total != 0; }
    // What follows the verdict wherever it is shown (report, run's summary, check): the caveat.
    const char* verdict_caveat() const { return gpu_free_recorded() ? "" : ", as far as the log says"; }
    std::vector<site_row> sites;       // call sites live at that moment, most bytes first
    std::string verdict;               // "capacity", "pending frees", "fragmentation" or "chunk rounding"
    std::string explanation;
    state_snapshot map;                // the map at that moment (only for the first few OOMs)
};

// Live bytes and call counts of one API or one memory kind.
struct usage_row {
    std::string name;
    tracked_bytes bytes;  // requested bytes of live allocations
    uint64_t live = 0, n_alloc = 0, n_free = 0;
};

// Everything the report says about one device (dev -1: host memory / unknown device).
struct device_report {
    int dev = -1;
    std::string name;        // from the header, "" when not listed
    uint64_t total = 0;      // device memory size from the header, 0 when unknown

    tracked_bytes requested, allocated, reserved;
    tracked_bytes segment_count;  // number of pool segments
    tracked_bytes mapped;         // cuMemMap bytes whose physical handle lives on this device
    tracked_bytes pending;        // pooled blocks freed by the program, not yet released by a sync
    tracked_bytes unmapped;       // holes (segment_unmap, segment_alloc's asize) in held segments: address space without memory
    uint64_t n_pool_sync = 0;
    uint64_t n_pool_wait = 0;  // pool_sync events with "waited": the program blocked on a fence
    uint64_t n_pool_ordered = 0;  // pool_sync events with "ordered": ordered releases (no wait)
    uint64_t n_pool_fenced = 0;   // pool_sync events with "fence": releases without a device-wide sync (ordered ones too)
    uint64_t pool_wait_ns = 0;  // sum of pool_sync "wait_ns": how long the pool's waits held the program
    uint64_t pool_fence_ns = 0;  // sum of pool_sync "fence_ns": host time of its event and stream calls that do not wait
    // config.reuse "auto": the device's pool reuses frees at once until its reuse_safe event, and
    // holds them pending from then on.  reuse_safe: that event was seen; the rest describe it.
    bool reuse_safe = false;
    uint64_t reuse_safe_seq = 0, reuse_safe_t = 0, reuse_safe_line = 0;
    std::string reuse_safe_api;  // the stream creation that caused the switch

    uint64_t n_alloc = 0, n_free = 0, n_alloc_fail = 0, n_free_fail = 0, n_oom = 0;
    uint64_t n_unknown_free = 0;
    uint64_t n_segment_alloc = 0, n_segment_free = 0, n_segment_unmap = 0, n_segment_map = 0;
    uint64_t n_map = 0, n_unmap = 0;
    uint64_t first_t = 0, last_t = 0;  // first and last event on this device

    // Fragmentation.
    double max_external_fragmentation = 0;
    uint64_t max_external_fragmentation_t = 0, max_external_fragmentation_seq = 0;
    // Free in segments at that moment: a maximum reached with 1 KiB free means little.
    uint64_t max_external_fragmentation_free = 0;
    double end_external_fragmentation = 0;
    uint64_t end_free_in_segments = 0, end_largest_free = 0, end_free_blocks = 0;
    uint64_t max_free_blocks = 0;

    size_histogram alloc_sizes;  // every successful allocation's requested size

    std::vector<usage_row> by_kind;  // device, managed, host, vmm (and "other")
    std::vector<usage_row> by_api;

    std::vector<time_point> timeline;
    uint64_t timeline_events_per_point = 1;

    state_snapshot at_peak;     // at the peak of allocated bytes
    state_snapshot at_request;  // at --at, when asked
    std::vector<oom_report> ooms;
    // Every OOM of the device, for the "... N more OOMs" past those shown: n_oom, which ooms (the
    // first 1000 only) may fall short of; ooms' size where n_oom is missing (a report JSON).
    uint64_t oom_count() const noexcept { return std::max<uint64_t>(n_oom, ooms.size()); }

    uint64_t n_leaks = 0, leaked_bytes = 0;  // live at the end of the log (requested bytes)
    std::vector<block_view> leaks;           // largest first, at most k_max_listed_leaks
    // Call sites (logs with stack records): the stacks holding the most requested bytes at the peak
    // of requested memory, and the leaks grouped by stack.  Empty when the log has no stacks.
    std::vector<site_row> top_sites;
    std::vector<site_row> leak_sites;
    // Every stack live at that peak (at most k_flame_stacks), for the HTML flame graph, and every
    // one live at the end, for `gpumem diff` (leak_sites keeps the top ones); not in the report
    // JSON, so empty when the report was read back from one.
    std::vector<site_row> peak_sites;
    std::vector<site_row> end_sites;

    // Derived ratios at the peak of allocated bytes and at the end (docs/metrics.md).
    double reserved_unallocated_at_peak() const {
        return at_peak.reserved ? 1.0 - double(at_peak.allocated) / double(at_peak.reserved) : 0.0;
    }
    double rounding_overhead_at_peak() const {
        return at_peak.allocated ? 1.0 - double(at_peak.requested) / double(at_peak.allocated) : 0.0;
    }
};

struct header_device {
    int index = 0;
    std::string name;
    uint64_t total = 0;
};

// What a log without an end line tells of its process (the recorder writes one at exit, _exit, a
// fatal signal it catches, and exec): stated once, for the report (text and HTML), run's summary
// and check's notes.  A last line cut short is warned of apart.
inline constexpr const char* k_no_end_line = "no end line (killed or still running)";

// Everything about one log file.
struct process_report {
    std::string file;
    // Header.
    int format_version = 0;
    int64_t pid = 0, ppid = 0, forked_from = 0;
    std::string host, rank, start_time, gpumem_version, pool_mode;
    // config.reuse: "safe" (frees pend until a pool_sync), "immediate", or "auto" (immediate until the
    // device's reuse_safe event, then safe; see device_report::reuse_safe).  "" when absent (= safe).
    std::string reuse_mode;
    // config.pool_vmm: "on" when the pool puts its segments on virtual memory where the device
    // allows it (docs/pool.md); "" when absent (older logs, pool off).
    std::string pool_vmm;
    uint64_t start_unix_ns = 0;
    // Why the recorder took no Python stacks though asked to (the header's stacks_off): "" when
    // it took them, or the process ran no Python.
    std::string stacks_off;
    // The header's alloc_ctx: allocations outside the pools carry their context's "ctx", and a
    // context_reset ends only its own context's (docs/log-format.md, "Rebuilding the layout").
    bool alloc_ctx = false;
    std::vector<std::string> cmdline;
    std::vector<header_device> header_devices;
    // Body.
    uint64_t lines = 0, events = 0, skipped_unknown = 0;
    uint64_t first_t = 0, last_t = 0;
    uint64_t lost = 0;
    bool truncated_last_line = false;
    // Virtual address ranges (cuMemAddressReserve carries no device, so they are per process).
    tracked_bytes va_reserved;
    uint64_t n_reserve = 0, n_unreserve = 0;
    uint64_t n_context_reset = 0, n_pool_sync = 0;
    // End line.
    bool has_end = false;
    std::string end_reason;
    int64_t end_signal = 0;
    uint64_t end_events = 0, end_n_alloc = 0, end_n_free = 0, end_n_fail = 0;
    uint64_t end_live_allocs = 0, end_live_bytes = 0, end_lost = 0, end_unmatched = 0;
    uint64_t stacks_lost = 0;  // allocations recorded without their stack (the end line's stacks_lost)

    stack_store stacks;                 // the log's stack records, by id
    std::vector<std::string> warnings;  // "file:line: text", the first k_max_warnings
    uint64_t n_warnings = 0;
    std::vector<device_report> devices;  // sorted by dev

    uint64_t duration_ns() const { return last_t > first_t ? last_t - first_t : 0; }
    // How the process ended, as every view says it: the end line's reason ("exit", "signal 9"), or
    // k_no_end_line.
    std::string end_text() const {
        if (!has_end) return k_no_end_line;
        return end_reason + (end_reason == "signal" ? " " + std::to_string(end_signal) : "");
    }
};

// Combined view over several processes (ranks) of one job.
struct combined_row {
    size_t process = 0;  // index into the process list
    int dev = 0;
    uint64_t peak_requested = 0, peak_allocated = 0, peak_reserved = 0;
};
struct combined_report {
    std::vector<combined_row> rows;
    uint64_t max_peak_reserved = 0, min_peak_reserved = 0;
    double mean_peak_reserved = 0;
    double imbalance = 0;  // max / mean - 1 over rows' peak reserved
};

inline constexpr size_t k_top_blocks = 10;
inline constexpr size_t k_top_sites = 10;
inline constexpr size_t k_flame_stacks = 5000;
inline constexpr size_t k_max_listed_leaks = 50;
inline constexpr size_t k_max_warnings = 50;
inline constexpr size_t k_max_oom_maps = 8;
inline constexpr size_t k_timeline_points = 1024;

}  // namespace gpumem::analysis
