// The text report on stdout, laid out like torch.cuda.memory_summary(): one framed table per device.
#include "report_output.h"
#include "views/report_sites.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "format_util.h"
#include "log_fields.h"

namespace gpumem::analysis {

namespace {

constexpr int k_width = 92;  // inner width of the framed tables
constexpr size_t k_map_width = 64;
constexpr size_t k_max_map_rows = 32;
constexpr size_t k_time_rows = 16;

std::string pad(std::string s, size_t n, bool right = false) {
    if (s.size() >= n) return s;
    return right ? std::string(n - s.size(), ' ') + s : s + std::string(n - s.size(), ' ');
}

void rule(std::ostream& os, char c) { os << '|' << std::string(k_width, c) << "|\n"; }
void framed(std::ostream& os, const std::string& s) { os << "| " << pad(s, k_width - 1) << "|\n"; }

void row4(std::ostream& os, const std::string& a, const std::string& b, const std::string& c,
          const std::string& d) {
    framed(os, pad(a, 28) + pad(b, 14, true) + pad(c, 14, true) + "   " + d);
}

std::string cmdline_text(const process_report& p) {
    std::string s;
    for (const std::string& a : p.cmdline) s += (s.empty() ? "" : " ") + a;
    if (s.size() > 200) s = s.substr(0, 197) + "...";
    return s;
}

}  // namespace

std::string segment_bar(const segment_view& s, size_t width) {
    std::string bar(width, '.');
    if (width == 0 || s.size == 0) return bar;
    // Allocated bytes per cell, from the blocks' overlap with each cell's byte range.
    std::vector<double> used(width, 0.0), pend(width, 0.0), hole(width, 0.0);
    double per_cell = double(s.size) / double(width);
    auto cover = [&](const std::vector<std::pair<uint64_t, uint64_t>>& blocks, std::vector<double>& acc) {
        for (const auto& [p, a] : blocks) {
            double lo = double(p - s.base), hi = lo + double(a);
            size_t c0 = size_t(clamp_to_u64(lo / per_cell, width - 1));
            size_t c1 = size_t(clamp_to_u64(hi / per_cell, width - 1));
            for (size_t c = c0; c <= c1; ++c) {
                double cl = double(c) * per_cell, ch = cl + per_cell;
                double ov = std::min(hi, ch) - std::max(lo, cl);
                if (ov > 0) acc[c] += ov;
            }
        }
    };
    cover(s.blocks, used);
    cover(s.pending, pend);
    cover(s.holes, hole);
    for (size_t c = 0; c < width; ++c) {
        // A cell that is mostly unmapped shows '_': address space with no memory behind it.
        if (hole[c] > 0.5 * per_cell) {
            bar[c] = '_';
            continue;
        }
        double f = (used[c] + hole[c]) / per_cell;
        // A fully occupied cell that is mostly pending frees shows 'p': not free, not in use.
        bar[c] = f >= 0.999 ? (pend[c] > 0.5 * used[c] ? 'p' : '#') : f <= 0.001 ? '.' : '+';
    }
    return bar;
}

namespace {

void write_map(std::ostream& os, const state_snapshot& s) {
    if (s.segment_map.empty()) {
        os << "    no pool segments on this device (pool off or not yet used): each allocation is its own\n"
              "    driver allocation, so there is no free space to map.\n";
        return;
    }
    // Arenas are drawn to their mapped end (segment_view::drawn), so their memory stays visible.
    uint64_t biggest = 0;
    for (const segment_view& v : s.segment_map) biggest = std::max(biggest, v.drawn().size);
    os << "    each segment to scale (widest = " << fmt_bytes(biggest) << "); '#' allocated, 'p' pending free, '+' partly, '.' free"
       << (std::any_of(s.segment_map.begin(), s.segment_map.end(), [](const segment_view& v) { return !v.holes.empty(); })
               ? ", '_' unmapped\n"
               : "\n");
    size_t n = 0;
    for (const segment_view& whole : s.segment_map) {
        if (n++ == k_max_map_rows) {
            os << "    ... " << fmt_counted(s.segment_map.size() - k_max_map_rows, "more segment", "more segments") << "\n";
            break;
        }
        const segment_view v = whole.drawn();
        size_t w = std::max<size_t>(1, size_t(clamp_to_u64(double(k_map_width) * double(v.size) / double(biggest) + 0.5, k_map_width)));
        const auto [used, largest] = v.measure();
        const uint64_t tail = whole.size - v.size;
        os << "    " << pad(fmt_hex(v.base), 16) << pad(fmt_bytes(v.size), 11, true) << ' '
           << pad(pool_name(v.pool), 5) << " |" << pad(segment_bar(v, w), k_map_width) << "| "
           << fmt_counted(v.blocks.size(), "block", "blocks") << ", " << fmt_bytes(v.size - used) << " free, largest "
           << fmt_bytes(largest) << (tail ? ", then " + fmt_bytes(tail) + " not mapped" : std::string()) << "\n";
    }
}

void write_snapshot_totals(std::ostream& os, const state_snapshot& s) {
    os << "    requested " << fmt_bytes(s.requested) << ", allocated " << fmt_bytes(s.allocated)
       << ", reserved " << fmt_bytes(s.reserved) << ", " << fmt_counted(s.live_allocs, "live allocation", "live allocations")
       << "\n";
    if (s.segment_map.empty() && !s.segments) return;  // no pool segments: no free space to speak of
    os << "    free in segments " << fmt_bytes(s.free_in_segments) << " in " << fmt_counted(s.free_blocks, "block", "blocks")
       << ", largest " << fmt_bytes(s.largest_free) << ", external fragmentation " << fmt_pct(s.external_fragmentation)
       << "\n";
}

// The last column is the allocation's line in the log file, named so beside call sites' source
// lines ("train.py:29"), for which a bare "line" would be taken.
void write_blocks(std::ostream& os, const std::vector<block_view>& blocks) {
    os << "    " << pad("address", 16) << pad("requested", 12, true) << pad("set aside", 12, true) << "  "
       << pad("api", 22) << pad("kind", 8) << pad("allocated at", 22) << "log line\n";
    for (const block_view& b : blocks)
        os << "    " << pad(fmt_hex(b.ptr), 16) << pad(fmt_bytes(b.size), 12, true)
           << pad(fmt_bytes(b.asize), 12, true) << "  " << pad(b.api, 22) << pad(kind_name(b.kind), 8)
           << pad(fmt_at(b.t, b.seq), 22) << b.line << "\n";
}

void write_timeline(std::ostream& os, const device_report& d) {
    if (d.timeline.empty()) return;
    // Regroup the stored series into at most k_time_rows rows of equal time span, keeping maxima;
    // of equal event count instead when the events are bunched (else one row would hold them all).
    // A point is placed, and its row labelled, where timeline_clock places it, so rows stay in seq
    // order (a point before the first time wrapped past the last row, which then came out last,
    // labelled with that earlier time).
    uint64_t t0 = d.timeline.front().t_first, t1 = t0;
    for (const time_point& p : d.timeline) t1 = std::max({t1, p.t_first, p.t_last});
    size_t rows = std::min(k_time_rows, d.timeline.size());
    std::vector<time_point> out(rows);
    std::vector<bool> used(rows, false);
    const bool by_event = events_bunched(d);
    uint64_t total = 0, before = 0;
    for (const time_point& p : d.timeline) total += p.events;
    timeline_clock clock;
    for (const time_point& p : d.timeline) {
        const uint64_t now = clock.place(p).first;
        // Clamped: a report JSON can hold 0 events (0/0), and t1 - t0 + 1 wraps to 0 when the times
        // span 2^64 - 1.
        size_t r = by_event ? size_t(clamp_to_u64(double(before) * double(rows) / double(total), rows - 1))
                 : t1 > t0  ? size_t(clamp_to_u64(double(now - t0) * double(rows) / (double(t1 - t0) + 1.0), rows - 1))
                            : 0;
        before += p.events;
        time_point& o = out[r];
        if (!used[r]) {
            o = p;
            o.t_first = now;
            used[r] = true;
            continue;
        }
        o.t_last = p.t_last;
        o.requested_max = std::max(o.requested_max, p.requested_max);
        o.allocated_max = std::max(o.allocated_max, p.allocated_max);
        o.reserved_max = std::max(o.reserved_max, p.reserved_max);
        o.frag_max = std::max(o.frag_max, p.frag_max);
    }
    uint64_t top = std::max<uint64_t>(1, d.reserved.peak);
    os << "\n  Memory over time (maximum in each interval; bar: '=' allocated, '-' reserved only)\n";
    if (by_event) os << "    rows of equal event count, not time: most events fall in a short part of the run\n";
    const bool pooled = d.segment_count.peak > 0;  // fragmentation is about free space in pool segments
    os << "    " << pad("from", 12) << pad("requested", 12, true) << pad("allocated", 12, true)
       << pad("reserved", 12, true) << (pooled ? pad("frag", 8, true) : "") << "  \n";
    for (size_t r = 0; r < rows; ++r) {
        if (!used[r]) continue;
        const time_point& p = out[r];
        size_t wa = size_t(clamp_to_u64(30.0 * double(p.allocated_max) / double(top) + 0.5, 30));
        size_t wr = size_t(clamp_to_u64(30.0 * double(p.reserved_max) / double(top) + 0.5, 30));
        wr = std::max(wr, wa);
        os << "    " << pad(fmt_time(p.t_first), 12) << pad(fmt_bytes(p.requested_max), 12, true)
           << pad(fmt_bytes(p.allocated_max), 12, true) << pad(fmt_bytes(p.reserved_max), 12, true)
           << (pooled ? pad(fmt_pct(p.frag_max), 8, true) : "") << "  |" << std::string(wa, '=') << std::string(wr - wa, '-')
           << std::string(30 - wr, ' ') << "|\n";
    }
}

void write_device(std::ostream& os, const process_report& p, const device_report& d, const output_options& opt) {
    rule(os, '=');
    std::string title = d.dev < 0 ? "host memory / unknown device (dev -1)" : "device " + std::to_string(d.dev);
    if (!d.name.empty()) title += ": " + d.name;
    if (d.total) title += ", " + fmt_bytes(d.total);
    framed(os, title);
    rule(os, '-');
    row4(os, "Metric", "At end", "Peak", "Peak at");
    rule(os, '-');
    auto peak_at = [](const tracked_bytes& m) { return fmt_peak_at(m.peak, m.peak_t, m.peak_seq); };
    row4(os, "Requested memory", fmt_bytes(d.requested.current), fmt_bytes(d.requested.peak), peak_at(d.requested));
    row4(os, "Allocated memory", fmt_bytes(d.allocated.current), fmt_bytes(d.allocated.peak), peak_at(d.allocated));
    row4(os, "Reserved memory", fmt_bytes(d.reserved.current), fmt_bytes(d.reserved.peak), peak_at(d.reserved));
    // The pool's free-space metrics only mean something where the pool held segments.
    const bool pooled = d.segment_count.peak > 0;
    if (pooled)
        row4(os, "Segments", std::to_string(d.segment_count.current), std::to_string(d.segment_count.peak),
             fmt_at(d.segment_count.peak_t, d.segment_count.peak_seq));
    rule(os, '-');
    row4(os, "Metric", "At end", "At peak alloc", "Maximum");
    rule(os, '-');
    const state_snapshot& k = d.at_peak;
    if (pooled) {
        row4(os, "Free in segments", fmt_bytes(d.end_free_in_segments), fmt_bytes(k.free_in_segments), "");
        row4(os, "Largest free block", fmt_bytes(d.end_largest_free), fmt_bytes(k.largest_free), "");
        row4(os, "Free blocks", std::to_string(d.end_free_blocks), std::to_string(k.free_blocks),
             std::to_string(d.max_free_blocks));
        // The maximum's free bytes and moment take a row each: one cell held both only up to a
        // 7-digit seq, and a large percentage of a few KiB free must not read as the run's worst.
        const bool worst = d.max_external_fragmentation > 0;
        row4(os, "External fragmentation", fmt_pct(d.end_external_fragmentation), fmt_pct(k.external_fragmentation),
             fmt_pct(d.max_external_fragmentation) +
                 (worst ? " of " + fmt_bytes(d.max_external_fragmentation_free) + " free" : ""));
        if (worst) row4(os, "", "", "", "at " + fmt_at(d.max_external_fragmentation_t, d.max_external_fragmentation_seq));
    }
    double end_ru = d.reserved.current ? 1.0 - double(d.allocated.current) / double(d.reserved.current) : 0;
    double end_ro = d.allocated.current ? 1.0 - double(d.requested.current) / double(d.allocated.current) : 0;
    row4(os, "Reserved but unallocated", fmt_pct(end_ru), fmt_pct(d.reserved_unallocated_at_peak()), "");
    row4(os, "Rounding overhead", fmt_pct(end_ro), fmt_pct(d.rounding_overhead_at_peak()), "");
    rule(os, '-');
    uint64_t dur = d.last_t > d.first_t ? d.last_t - d.first_t : 0;
    framed(os, pad("Allocations", 28) + pad(fmt_count(d.n_alloc), 14, true) + "   " + fmt_rate(d.n_alloc, dur));
    framed(os, pad("Frees", 28) + pad(fmt_count(d.n_free), 14, true) + "   " + fmt_rate(d.n_free, dur) +
                   (d.n_unknown_free ? ", " + std::to_string(d.n_unknown_free) + " of unknown pointers" : ""));
    framed(os, pad("Failed allocations / OOMs", 28) + pad(std::to_string(d.n_alloc_fail), 14, true) + " / " +
                   std::to_string(d.n_oom));
    if (d.n_segment_alloc || d.n_segment_free)
        framed(os, pad("Segments taken / returned", 28) + pad(std::to_string(d.n_segment_alloc), 14, true) + " / " +
                       std::to_string(d.n_segment_free));
    // Holes are address space without memory (given back, or an arena's not yet mapped): said
    // once, on the unmap row when there is one.
    // An arena's peak is merely the address space it reserved, so the peak is said for unmaps only.
    const std::string holes = "   holes (no memory) " + fmt_bytes(d.unmapped.current);
    if (d.n_segment_unmap)
        framed(os, pad("Chunks given back (unmaps)", 28) + pad(std::to_string(d.n_segment_unmap), 14, true) + holes +
                       (d.n_segment_map ? std::string() : ", peak " + fmt_bytes(d.unmapped.peak)));
    if (d.n_segment_map || (d.unmapped.peak && !d.n_segment_unmap))
        framed(os, pad("Chunks mapped later (maps)", 28) + pad(std::to_string(d.n_segment_map), 14, true) +
                       (d.n_segment_unmap ? std::string() : holes));
    // Under "auto" the mode is per device and changes once; "safe"/"immediate" hold for the whole log.
    if (p.reuse_mode == config_value::reuse_auto && (d.n_segment_alloc || d.reuse_safe))
        framed(os, pad("Reuse", 28) + "auto, " +
                       (d.reuse_safe ? "safe from seq " + std::to_string(d.reuse_safe_seq) + " (" + d.reuse_safe_api + ")"
                                     : std::string("immediate throughout")));
    if (d.pending.peak)
        framed(os, pad("Pending frees (unreleased)", 28) + pad(fmt_bytes(d.pending.current), 14, true) + "   peak " +
                       fmt_bytes(d.pending.peak) + ", " +
                       (d.n_pool_fenced ? fmt_counted(d.n_pool_fenced, "fence release", "fence releases") + ", " +
                                              fmt_counted(d.n_pool_sync, "sync", "syncs")
                                        : fmt_counted(d.n_pool_sync, "device-wide sync", "device-wide syncs")) +
                       (d.n_pool_wait ? ", " + fmt_counted(d.n_pool_wait, "fence wait", "fence waits") : std::string()));
    // Releases that ordered the streams instead of waiting (GPUMEM_FENCE_WAIT=order): a row of
    // their own, as the pending row is full.
    if (d.n_pool_ordered)
        framed(os, pad("Ordered releases (no wait)", 28) + pad(std::to_string(d.n_pool_ordered), 14, true));
    // What the waits cost the program, against the time the log covers on this device: the
    // share a user weighs against GPUMEM_REUSE=immediate (one-stream programs) or more memory.
    // The same for the calls that make reuse safe without a wait (events, stream queries and
    // waits): the host time safe reuse costs besides its waits.
    const uint64_t span = d.last_t > d.first_t ? d.last_t - d.first_t : 0;
    auto time_row = [&](const char* label, uint64_t ns) {
        framed(os, pad(label, 28) + pad(fmt_time(ns), 14, true) +
                       (span ? "   " + fmt_pct(double(ns) / double(span)) + " of the device's " + fmt_time(span) + " of events"
                             : std::string()));
    };
    if (d.pool_wait_ns) time_row("Blocked in pool waits", d.pool_wait_ns);
    if (d.pool_fence_ns) time_row("In pool fence calls", d.pool_fence_ns);
    if (d.n_map || d.n_unmap)
        framed(os, pad("Maps / unmaps", 28) + pad(std::to_string(d.n_map), 14, true) + " / " +
                       std::to_string(d.n_unmap) + ", mapped now " + fmt_bytes(d.mapped.current) + ", peak " +
                       fmt_bytes(d.mapped.peak));
    framed(os, pad(p.has_end ? "Leaked (live at end)" : "Live when the log stops", 28) +
                   pad(std::to_string(d.n_leaks), 14, true) + "   " + fmt_bytes(d.leaked_bytes));
    rule(os, '=');

    if (!d.by_kind.empty() || !d.by_api.empty()) {
        os << "\n  Live memory by kind and API (requested bytes)\n";
        os << "    " << pad("", 30) << pad("at end", 12, true) << pad("peak", 12, true) << pad("allocs", 10, true)
           << pad("frees", 10, true) << "\n";
        for (const auto* rows : {&d.by_kind, &d.by_api})
            for (const usage_row& r : *rows)
                os << "    " << pad((rows == &d.by_kind ? "kind " : "api  ") + r.name, 30)
                   << pad(fmt_bytes(r.bytes.current), 12, true) << pad(fmt_bytes(r.bytes.peak), 12, true)
                   << pad(std::to_string(r.n_alloc), 10, true) << pad(std::to_string(r.n_free), 10, true) << "\n";
    }

    write_timeline(os, d);

    write_sites_text(os, p, d.top_sites,
                     "Top call sites at the peak of requested memory (" + fmt_bytes(d.requested.peak) + ", " +
                         fmt_at(d.requested.peak_t, d.requested.peak_seq) + ")");
    if (k.valid) {
        os << "\n  Free-block map at the peak of allocated memory, " << fmt_at(k.t, k.seq) << ", line " << k.line << "\n";
        write_snapshot_totals(os, k);
        write_map(os, k);
        if (!k.largest_live.empty()) {
            os << "\n  Largest live blocks at the peak (" << k.largest_live.size() << " of " << k.live_allocs << ")\n";
            write_blocks(os, k.largest_live);
        }
    }
    if (opt.show_at && d.at_request.valid) {
        const state_snapshot& a = d.at_request;
        os << "\n  Free-block map at " << a.label << ": after " << fmt_at(a.t, a.seq) << ", line " << a.line << "\n";
        write_snapshot_totals(os, a);
        write_map(os, a);
        if (!a.largest_live.empty()) {
            os << "    largest live blocks:\n";
            write_blocks(os, a.largest_live);
        }
    }
    for (size_t i = 0; i < d.ooms.size(); ++i) {
        const oom_report& o = d.ooms[i];
        os << "\n  OOM #" << i + 1 << " at " << fmt_at(o.t, o.seq) << ", line " << o.line << ": "
           << (o.api.empty() ? "a request" : o.api) << " of " << fmt_bytes(o.size)
           << (o.from_pool ? " (pool)" : " (error " + std::to_string(o.err) + ")") << "\n";
        // The line that asked first: what a reader of an OOM looks for (logs with stack records only).
        if (p.stacks.any()) {
            const auto* fr = p.stacks.find(o.stack);
            os << "    asked for by ";
            if (fr && !fr->empty()) write_frames_text(os, *fr, "        ");
            else os << k_no_failing_stack << "\n";
        }
        // "request", not "requested": the legend's "requested" is the live bytes asked for.
        os << "    request " << fmt_bytes(o.size) << " | free in segments " << fmt_bytes(o.free_in_segments)
           << " | largest free block " << fmt_bytes(o.largest_free) << " | free on GPU "
           << (o.gpu_total ? fmt_bytes(o.gpu_free) : std::string("not recorded"))
           << (o.pending ? " | pending frees " + fmt_bytes(o.pending) : std::string())
           << (o.pool_vmm ? " | block rounding " + fmt_bytes(o.block_rounding()) : std::string()) << "\n";
        os << "    verdict: " << o.verdict << o.verdict_caveat() << ": "
           << o.explanation << "\n";
        if (o.map.valid) write_map(os, o.map);
        write_sites_text(os, p, o.sites, "call sites live at this OOM:", 4);
        // The rest counted from oom_count(): ooms keeps only the first 1000 of a device.
        if (const uint64_t all = d.oom_count(); i + 1 == 20 && all > 20) {
            os << "\n  ... " << fmt_counted(all - 20, "more OOM", "more OOMs") << "\n";
            break;
        }
    }
    if (d.n_leaks) {
        os << "\n  " << (p.has_end ? "Leaks: allocations never freed" : "Live when the log stops") << ": "
           << fmt_counted(d.n_leaks, "allocation", "allocations") << ", " << fmt_bytes(d.leaked_bytes) << " requested";
        if (d.leaks.size() < d.n_leaks) os << " (largest " << d.leaks.size() << " listed)";
        os << "\n";
        write_blocks(os, d.leaks);
        write_sites_text(os, p, d.leak_sites, leak_sites_title(p));
    }
    os << "\n";
}

}  // namespace

namespace {
void write_text_unfiltered(std::ostream& os, const std::vector<process_report>& procs, const combined_report& combined,
                           const output_options& opt) {
    for (const process_report& p : procs) {
        os << "gpumem report: " << p.file << "\n";
        os << "  process " << p.pid;
        if (p.ppid) os << " (parent " << p.ppid << ")";
        if (p.forked_from) os << ", forked from " << p.forked_from;
        if (!p.host.empty()) os << " on " << p.host;
        if (!p.rank.empty()) os << ", rank " << p.rank;
        std::string cmd = cmdline_text(p);
        if (!cmd.empty()) os << ": " << cmd;
        os << "\n  gpumem " << (p.gpumem_version.empty() ? "?" : p.gpumem_version) << ", pool "
           << (p.pool_mode.empty() ? "?" : p.pool_mode);
        if (!p.start_time.empty()) os << ", started " << p.start_time;
        os << ", " << fmt_time(p.duration_ns()) << " of events, " << fmt_counted(p.events, "event", "events") << ", ";
        os << (p.has_end ? "ended: " : "") << p.end_text() << "\n";
        if (p.lost)
            os << "  " << fmt_counted(p.lost, "event was", "events were") << " lost by the recorder: totals are approximate\n";
        if (p.n_reserve)
            os << "  virtual address ranges: " << p.n_reserve << " reserved, " << p.n_unreserve << " freed, "
               << fmt_bytes(p.va_reserved.current) << " held at end, peak " << fmt_bytes(p.va_reserved.peak) << "\n";
        if (p.n_warnings) os << "  " << fmt_counted(p.n_warnings, "warning", "warnings") << ", printed on stderr\n";
        if (p.devices.empty()) os << "  no device memory events\n";
        os << "\n";
        if (&p == &procs.front() && !p.devices.empty()) {
            for (const metric_meaning& m : k_metric_meanings)
                os << "  " << pad(m.name, 9) << " = " << pad(m.meaning, 46) << " (PyTorch: " << m.pytorch << ")\n";
            os << "\n";
        }
        for (const device_report& d : p.devices) write_device(os, p, d, opt);
    }
    if (procs.size() > 1) {
        os << "Combined: " << procs.size() << " processes\n";
        os << "  " << pad("process", 40) << pad("rank", 6) << pad("dev", 5) << pad("peak requested", 16, true)
           << pad("peak allocated", 16, true) << pad("peak reserved", 16, true) << "\n";
        for (const combined_row& r : combined.rows) {
            const process_report& p = procs[r.process];
            std::string name = p.file + " (" + std::to_string(p.pid) + ")";
            if (name.size() > 38) name = "..." + name.substr(name.size() - 35);
            os << "  " << pad(name, 40) << pad(p.rank.empty() ? "-" : p.rank, 6) << pad(std::to_string(r.dev), 5)
               << pad(fmt_bytes(r.peak_requested), 16, true) << pad(fmt_bytes(r.peak_allocated), 16, true)
               << pad(fmt_bytes(r.peak_reserved), 16, true) << "\n";
        }
        if (!combined.rows.empty())
            os << "  peak reserved: max " << fmt_bytes(combined.max_peak_reserved) << ", min "
               << fmt_bytes(combined.min_peak_reserved) << ", mean " << fmt_bytes(clamp_to_u64(combined.mean_peak_reserved))
               << "; imbalance (max/mean - 1) " << fmt_pct(combined.imbalance) << "\n";
    }
}

}  // namespace

// Names, paths and reasons come from the log: their control characters are shown, not sent to the
// terminal (an ESC would start an escape sequence).
void write_text(std::ostream& os, const std::vector<process_report>& procs, const combined_report& combined,
                const output_options& opt) {
    std::ostringstream text;
    write_text_unfiltered(text, procs, combined, opt);
    os << visible(text.str(), true);
}

}  // namespace gpumem::analysis
