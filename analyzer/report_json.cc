// The --json report: a stable, documented schema (docs/report-json.md) for CI and other tools.
#include <cmath>

#include "format_util.h"
#include "report_fields.h"
#include "report_output.h"
#include "views/report_sites.h"

namespace gpumem::analysis {

namespace {

using ojson = nlohmann::ordered_json;

// Ratios rounded to 6 decimals so the output is stable and readable.
double r6(double x) { return std::round(x * 1e6) / 1e6; }

// The writers of report_fields.h's types.
void put_u64(ojson& j, const char* name, uint64_t v) { j[name] = v; }
void put_ratio(ojson& j, const char* name, double v) { j[name] = r6(v); }

ojson block_json(const block_view& b) {
    ojson j;
    j["ptr"] = fmt_hex(b.ptr);
    j["size_bytes"] = b.size;
    j["asize_bytes"] = b.asize;
    j["api"] = b.api;
    j["kind"] = kind_name(b.kind);
    j["pooled"] = b.pooled;
    if (b.pooled) j["seg"] = fmt_hex(b.seg);
    j["alloc_t_ns"] = b.t;
    j["alloc_seq"] = b.seq;
    j["alloc_line"] = b.line;
    return j;
}

ojson histogram_json(const size_histogram& h) {
    ojson a = ojson::array();
    for (size_t i = 0; i < h.count.size(); ++i)
        if (h.count[i]) {
            ojson b;
            b["min_bytes"] = i == 0 ? 0 : uint64_t(1) << i;
            b["max_bytes"] = i == 63 ? UINT64_MAX : (uint64_t(1) << (i + 1)) - 1;
            b["count"] = h.count[i];
            b["bytes"] = h.bytes[i];
            a.push_back(b);
        }
    return a;
}

ojson ranges_json(uint64_t base, const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
    ojson a = ojson::array();
    for (const auto& [ptr, asize] : ranges) a.push_back(ojson::array({ptr - base, asize}));
    return a;
}

ojson snapshot_json(const state_snapshot& s) {
    ojson j;
    j["label"] = s.label;
    j["t_ns"] = s.t;
    j["seq"] = s.seq;
    j["line"] = s.line;
    j["requested_bytes"] = s.requested;
    j["allocated_bytes"] = s.allocated;
    j["reserved_bytes"] = s.reserved;
    j["live_allocs"] = s.live_allocs;
    j["pending_bytes"] = s.pending;
    j["unmapped_bytes"] = s.unmapped;
    j["segments"] = s.segments;
    j["free_in_segments_bytes"] = s.free_in_segments;
    j["largest_free_bytes"] = s.largest_free;
    j["free_blocks"] = s.free_blocks;
    j["external_fragmentation"] = r6(s.external_fragmentation);
    j["reserved_unallocated"] = r6(s.reserved ? 1.0 - double(s.allocated) / double(s.reserved) : 0.0);
    j["rounding_overhead"] = r6(s.allocated ? 1.0 - double(s.requested) / double(s.allocated) : 0.0);
    ojson segs = ojson::array();
    for (const segment_view& v : s.segment_map) {
        const auto [used, largest] = v.measure();
        ojson g;
        g["base"] = fmt_hex(v.base);
        g["size_bytes"] = v.size;
        g["pool"] = pool_name(v.pool);
        g["blocks"] = v.blocks.size();
        g["pending_blocks"] = v.pending.size();
        g["free_bytes"] = v.size - used;
        g["largest_free_bytes"] = largest;
        // Where the blocks lie, as [offset from base, bytes] pairs: the free-block maps are drawn
        // from them when a report is made from this JSON.
        g["block_ranges"] = ranges_json(v.base, v.blocks);
        g["pending_ranges"] = ranges_json(v.base, v.pending);
        g["unmapped_ranges"] = ranges_json(v.base, v.holes);
        segs.push_back(g);
    }
    j["segment_list"] = segs;
    j["free_block_histogram"] = histogram_json(s.free_block_sizes);
    ojson top = ojson::array();
    for (const block_view& b : s.largest_live) top.push_back(block_json(b));
    j["largest_live"] = top;
    return j;
}

ojson usage_json(const std::vector<usage_row>& rows) {
    ojson a = ojson::array();
    for (const usage_row& r : rows) {
        ojson j;
        j["name"] = r.name;
        j["end_requested_bytes"] = r.bytes.current;
        j["peak_requested_bytes"] = r.bytes.peak;
        j["peak_t_ns"] = r.bytes.peak_t;
        j["live_allocs"] = r.live;
        j["n_alloc"] = r.n_alloc;
        j["n_free"] = r.n_free;
        a.push_back(j);
    }
    return a;
}

ojson device_json(const process_report& p, const device_report& d, const output_options& opt) {
    ojson j;
    j["dev"] = d.dev;
    j["name"] = d.name;
#define GPUMEM_X(name, member, type) put_##type(j, #name, d.member);
    GPUMEM_REPORT_DEVICE_FIELDS_A(GPUMEM_X)
    if (d.reuse_safe) {
        ojson r;
        r["seq"] = d.reuse_safe_seq;
        r["t_ns"] = d.reuse_safe_t;
        r["line"] = d.reuse_safe_line;
        r["api"] = d.reuse_safe_api;
        j["reuse_safe"] = r;
    } else {
        j["reuse_safe"] = nullptr;
    }
    GPUMEM_REPORT_DEVICE_FIELDS_B(GPUMEM_X)
    uint64_t dur = d.last_t > d.first_t ? d.last_t - d.first_t : 0;
    j["alloc_rate_per_s"] = dur ? r6(double(d.n_alloc) * 1e9 / double(dur)) : 0.0;
    j["free_rate_per_s"] = dur ? r6(double(d.n_free) * 1e9 / double(dur)) : 0.0;
    GPUMEM_REPORT_DEVICE_FIELDS_C(GPUMEM_X)
#undef GPUMEM_X
    ojson leaks = ojson::array();
    for (const block_view& b : d.leaks) leaks.push_back(block_json(b));
    j["leaks"] = leaks;
    // Call sites only for logs with stack records, so a log without them reads as before.
    if (p.stacks.any()) {
        j["top_sites"] = sites_json(p, d.top_sites);
        j["leak_sites"] = sites_json(p, d.leak_sites);
    }
    j["by_kind"] = usage_json(d.by_kind);
    j["by_api"] = usage_json(d.by_api);
    j["alloc_size_histogram"] = histogram_json(d.alloc_sizes);
    j["at_peak"] = d.at_peak.valid ? snapshot_json(d.at_peak) : ojson(nullptr);
    if (opt.show_at) j["at_request"] = d.at_request.valid ? snapshot_json(d.at_request) : ojson(nullptr);
    ojson ooms = ojson::array();
    for (const oom_report& o : d.ooms) {
        ojson x;
        x["t_ns"] = o.t;
        x["seq"] = o.seq;
        x["line"] = o.line;
        x["size_bytes"] = o.size;
        x["api"] = o.api;
        x["source"] = o.from_pool ? "pool" : "driver";
        x["err"] = o.err;
        x["free_in_segments_bytes"] = o.free_in_segments;
        x["largest_free_bytes"] = o.largest_free;
        x["reserved_bytes"] = o.reserved;
        x["allocated_bytes"] = o.allocated;
        x["requested_bytes"] = o.requested;
        x["pending_bytes"] = o.pending;
        x["pool_vmm"] = o.pool_vmm;
        x["gpu_free_bytes"] = o.gpu_free;
        x["gpu_total_bytes"] = o.gpu_total;
        x["gpu_free_recorded"] = o.gpu_free_recorded();
        x["verdict"] = o.verdict;
        x["explanation"] = o.explanation;
        // The failing call's stack, for logs with stack records (as "sites"); null when it has none.
        if (p.stacks.any()) x["asked_by"] = o.stack ? stack_json(p, o.stack) : ojson(nullptr);
        x["map"] = o.map.valid ? snapshot_json(o.map) : ojson(nullptr);  // only for the first few OOMs
        if (p.stacks.any()) x["sites"] = sites_json(p, o.sites);
        ooms.push_back(x);
    }
    j["ooms"] = ooms;
    ojson tl = ojson::array();
    for (const time_point& t : d.timeline)
        tl.push_back(ojson::array({t.t_first, t.t_last, t.requested_max, t.allocated_max, t.reserved_max, r6(t.frag_max),
                                   t.events, t.seq_last, t.requested_last, t.allocated_last, t.reserved_last,
                                   r6(t.frag_last)}));
    j["timeline_columns"] = ojson::array({"t_first_ns", "t_last_ns", "requested_max_bytes", "allocated_max_bytes",
                                          "reserved_max_bytes", "external_fragmentation_max", "events", "seq_last",
                                          "requested_last_bytes", "allocated_last_bytes", "reserved_last_bytes",
                                          "external_fragmentation_last"});
    j["timeline_events_per_point"] = d.timeline_events_per_point;
    j["timeline"] = tl;
    return j;
}

}  // namespace

nlohmann::ordered_json to_json(const std::vector<process_report>& procs, const combined_report& combined,
                               const output_options& opt) {
    ojson root;
    root["schema"] = "gpumem-report";
    root["schema_version"] = k_report_schema_version;
    ojson ps = ojson::array();
    for (const process_report& p : procs) {
        ojson j;
        j["file"] = p.file;
        j["format_version"] = p.format_version;
        j["pid"] = p.pid;
        j["ppid"] = p.ppid;
        if (p.forked_from) j["forked_from"] = p.forked_from;
        j["host"] = p.host;
        j["rank"] = p.rank;
        j["cmdline"] = p.cmdline;
        j["start_time"] = p.start_time;
        j["start_unix_ns"] = p.start_unix_ns;
        j["gpumem_version"] = p.gpumem_version;
        if (!p.stacks_off.empty()) j["stacks_off"] = p.stacks_off;
        if (p.stacks_lost) j["stacks_lost"] = p.stacks_lost;
        j["pool"] = p.pool_mode;
        j["reuse"] = p.reuse_mode;
        j["lines"] = p.lines;
        j["events"] = p.events;
        j["skipped_unknown_events"] = p.skipped_unknown;
        j["first_t_ns"] = p.first_t;
        j["last_t_ns"] = p.last_t;
        j["duration_ns"] = p.duration_ns();
        j["ended"] = p.has_end;
        j["end_reason"] = p.has_end ? ojson(p.end_reason) : ojson(nullptr);
        if (p.has_end && p.end_reason == "signal") j["end_signal"] = p.end_signal;
        j["truncated_last_line"] = p.truncated_last_line;
        j["lost_events"] = p.lost;
        j["n_reserve"] = p.n_reserve;
        j["n_unreserve"] = p.n_unreserve;
        j["end_va_reserved_bytes"] = p.va_reserved.current;
        j["peak_va_reserved_bytes"] = p.va_reserved.peak;
        j["n_context_reset"] = p.n_context_reset;
        j["n_pool_sync"] = p.n_pool_sync;
        j["n_warnings"] = p.n_warnings;
        j["warnings"] = p.warnings;
        ojson ds = ojson::array();
        for (const device_report& d : p.devices) ds.push_back(device_json(p, d, opt));
        j["devices"] = ds;
        ps.push_back(j);
    }
    root["processes"] = ps;
    ojson c;
    ojson rows = ojson::array();
    for (const combined_row& r : combined.rows) {
        ojson x;
        x["process"] = r.process;
        x["file"] = procs[r.process].file;
        x["rank"] = procs[r.process].rank;
        x["dev"] = r.dev;
        x["peak_requested_bytes"] = r.peak_requested;
        x["peak_allocated_bytes"] = r.peak_allocated;
        x["peak_reserved_bytes"] = r.peak_reserved;
        rows.push_back(x);
    }
    c["rows"] = rows;
    c["max_peak_reserved_bytes"] = combined.max_peak_reserved;
    c["min_peak_reserved_bytes"] = combined.min_peak_reserved;
    c["mean_peak_reserved_bytes"] = r6(combined.mean_peak_reserved);
    c["imbalance"] = r6(combined.imbalance);
    root["combined"] = c;
    return root;
}

}  // namespace gpumem::analysis
