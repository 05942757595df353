// The --html report: one self-contained page (inline CSS and SVG, no scripts, no network) with
// memory and fragmentation over time, segment maps at the peak and at each OOM, and histograms.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "format_util.h"
#include "log_fields.h"
#include "report_flame.h"
#include "report_output.h"
#include "views/report_sites.h"

namespace gpumem::analysis {

namespace {

const char* k_css = R"(body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 6px;border-bottom:1px solid #ccc}h3{font-size:15px;margin:18px 0 6px}
.meta{color:#555;font-size:13px}.warn{color:#a15c00}
table{border-collapse:collapse;font-size:13px;margin:6px 0}td,th{padding:3px 10px;border-bottom:1px solid #e4e4e4;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:10px 0}.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:150px}
.card .v{font-size:20px;font-weight:600}.card .k{font-size:12px;color:#666}
.verdict-fragmentation{color:#b00020;font-weight:600}.verdict-capacity{color:#8a4b00;font-weight:600}.verdict-chunk-rounding{color:#6a3d9a;font-weight:600}.verdict-pending-frees{color:#00695c;font-weight:600}
svg text{font-family:system-ui,sans-serif}code{font-size:12px}
)";

const char* k_requested_color = "#2ca02c";
const char* k_allocated_color = "#1f77b4";
const char* k_reserved_color = "#ff7f0e";
const char* k_frag_color = "#d62728";
const char* k_pending_color = "#e6a700";

struct series {
    std::string name, color;
    std::vector<std::pair<uint64_t, double>> pts;  // (x, value); x is t in ns, or an event index
};

// The charts' x axis.  Time by default; event order when a quiet stretch (a program loading, then
// training) would squeeze all the activity into a sliver at one edge.  Ticks always show times.
struct x_axis {
    bool by_event = false;
    std::vector<std::pair<uint64_t, uint64_t>> event_time;  // (event index, t), ascending
    std::string label(uint64_t x) const {
        if (!by_event) return fmt_time(x);
        auto it = std::upper_bound(event_time.begin(), event_time.end(), std::make_pair(x, UINT64_MAX));
        return it == event_time.begin() ? fmt_time(0) : fmt_time(std::prev(it)->second);
    }
};

// A step chart: memory is constant between events, so each value holds until the next point.
std::string line_chart(std::vector<series> ss, bool percent, const std::string& title, const x_axis& ax) {
    // Series with the same points are one line: draw it once, and name them together in the legend
    // ("reserved = allocated = requested"), so the legend lists exactly the lines one can see.
    for (size_t i = 0; i < ss.size(); ++i)
        for (size_t j = i + 1; j < ss.size();)
            if (ss[j].pts == ss[i].pts) {
                ss[i].name += " = " + ss[j].name;
                ss.erase(ss.begin() + std::ptrdiff_t(j));
            } else {
                ++j;
            }
    const double W = 980, H = 260, L = 80, R = 40, T = 28, B = 36;
    uint64_t t0 = UINT64_MAX, t1 = 0;
    double ymax = 0;
    for (const series& s : ss)
        for (const auto& [t, v] : s.pts) {
            t0 = std::min(t0, t);
            t1 = std::max(t1, t);
            ymax = std::max(ymax, v);
        }
    if (t0 == UINT64_MAX) return "<p class=meta>no data</p>";
    if (t1 == t0) t1 = t0 + 1;
    if (percent) ymax = std::max(ymax, 0.05);
    if (ymax <= 0) ymax = 1;
    ymax *= 1.05;
    auto X = [&](uint64_t t) { return L + (W - L - R) * double(t - t0) / double(t1 - t0); };
    auto Y = [&](double v) { return T + (H - T - B) * (1.0 - v / ymax); };
    std::ostringstream o;
    o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H << "' viewBox='0 0 " << W << ' ' << H
      << "' role='img' aria-label='" << html_escape(title) << "'>\n";
    o << "<rect x='" << L << "' y='" << T << "' width='" << W - L - R << "' height='" << H - T - B
      << "' fill='#fafafa' stroke='#ccc'/>\n";
    for (int i = 0; i <= 4; ++i) {
        double v = ymax / 1.05 * i / 4;
        double y = Y(v);
        o << "<line x1='" << L << "' x2='" << W - R << "' y1='" << svg_num(y) << "' y2='" << svg_num(y) << "' stroke='#e2e2e2'/>"
          << "<text x='" << L - 6 << "' y='" << svg_num(y + 4) << "' font-size='11' text-anchor='end'>"
          << (percent ? fmt_pct(v) : fmt_bytes(clamp_to_u64(v))) << "</text>\n";
    }
    for (int i = 0; i <= 5; ++i) {
        uint64_t t = t0 + clamp_to_u64(double(t1 - t0) * i / 5, t1 - t0);  // double(t1 - t0) may round up past it
        o << "<text x='" << svg_num(X(t)) << "' y='" << H - B + 16 << "' font-size='11' text-anchor='middle'>" << ax.label(t)
          << "</text>\n";
    }
    o << "<text x='" << L << "' y='18' font-size='13' font-weight='600'>" << html_escape(title) << "</text>\n";
    double lx = W - R - 10;
    for (auto it = ss.rbegin(); it != ss.rend(); ++it) {  // legend, right-aligned
        lx -= 8 + 7.0 * double(it->name.size()) + 18;
        o << "<rect x='" << svg_num(lx) << "' y='9' width='12' height='12' fill='" << it->color << "'/><text x='" << svg_num(lx + 16)
          << "' y='19' font-size='12'>" << html_escape(it->name) << "</text>\n";
    }
    // Drawn first = widest: where lines run together (allocated = requested between two spikes) each
    // one still shows as an edge of its own colour around the next.
    for (size_t i = 0; i < ss.size(); ++i) {
        const series& s = ss[i];
        if (s.pts.empty()) continue;
        o << "<polyline fill='none' stroke='" << s.color << "' stroke-width='" << svg_num(1.6 + 1.5 * double(ss.size() - 1 - i))
          << "' points='";
        double prev_y = Y(0);
        o << svg_num(X(s.pts.front().first)) << ',' << svg_num(prev_y) << ' ';
        for (const auto& [t, v] : s.pts) {
            double x = X(t), y = Y(v);
            o << svg_num(x) << ',' << svg_num(prev_y) << ' ' << svg_num(x) << ',' << svg_num(y) << ' ';
            prev_y = y;
        }
        o << svg_num(X(t1)) << ',' << svg_num(prev_y) << "'/>\n";
    }
    o << "</svg>\n";
    return o.str();
}

void timeline_series(const device_report& d, std::vector<series>& mem, std::vector<series>& frag, x_axis& ax) {
    series rq{"requested", k_requested_color, {}}, al{"allocated", k_allocated_color, {}},
        rs{"reserved", k_reserved_color, {}}, fr{"external fragmentation", k_frag_color, {}};
    ax = x_axis{};
    ax.by_event = events_bunched(d);
    uint64_t n = 0;  // events of this device before the point
    timeline_clock clock;  // a step chart drawn back in time would cross itself
    for (const time_point& p : d.timeline) {
        const auto [t_first, t_last] = clock.place(p);
        uint64_t x_first = ax.by_event ? n : t_first;
        uint64_t x_last = ax.by_event ? n + p.events - 1 : t_last;
        if (ax.by_event) {
            ax.event_time.push_back({x_first, t_first});
            if (p.events > 1) ax.event_time.push_back({x_last, t_last});
        }
        n += p.events;
        rq.pts.push_back({x_first, double(p.requested_max)});
        al.pts.push_back({x_first, double(p.allocated_max)});
        rs.pts.push_back({x_first, double(p.reserved_max)});
        fr.pts.push_back({x_first, p.frag_max});
        // Its last values close a point of several events, even at its first time: else the level
        // after it (the chart's end, after the last point) would be its maximum.
        if (p.events > 1 && (x_last != x_first || p.falls())) {
            rq.pts.push_back({x_last, double(p.requested_last)});
            al.pts.push_back({x_last, double(p.allocated_last)});
            rs.pts.push_back({x_last, double(p.reserved_last)});
            fr.pts.push_back({x_last, p.frag_last});
        }
    }
    mem = {rs, al, rq};
    frag = {fr};
}

// A class name from a verdict: only letters, digits and '-' survive, because a report JSON read back
// (`gpumem report r.json --html`) may carry any string there.
std::string css_class(std::string v) {
    std::string out;
    for (char c : v) {
        if (c == ' ') out += '-';
        else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-') out += c;
    }
    return out;
}

// Segments as bars to scale; allocated runs in blue over a grey free background.
std::string segment_map_svg(const state_snapshot& s) {
    if (s.segment_map.empty())
        return "<p class=meta>No pool segments on this device: with the pool off each allocation is its own driver "
               "allocation, so there is no free space inside reserved memory to map.</p>\n";
    const double W = 980, label = 230, bar_w = W - label - 10, row = 16;
    const size_t max_rows = 48;
    uint64_t biggest = 0;  // arenas to their mapped end (segment_view::drawn)
    for (const segment_view& v : s.segment_map) biggest = std::max(biggest, v.drawn().size);
    size_t rows = std::min(max_rows, s.segment_map.size());
    double H = double(rows) * row + 24;
    std::ostringstream o;
    o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H << "' viewBox='0 0 " << W << ' ' << H
      << "' role='img' aria-label='segment map'>\n";
    o << "<text x='0' y='12' font-size='12' fill='#555'>widest bar = " << fmt_bytes(biggest)
      << "; blue = allocated, amber = pending free (reusable after a sync), grey = free"
      << (std::any_of(s.segment_map.begin(), s.segment_map.end(), [](const segment_view& v) { return !v.holes.empty(); })
              ? ", white = unmapped (no memory behind it)"
              : "")
      << "</text>\n";
    double px_per_byte = bar_w / double(biggest);
    for (size_t i = 0; i < rows; ++i) {
        const segment_view v = s.segment_map[i].drawn();
        const uint64_t tail = s.segment_map[i].size - v.size;
        double y = 20 + double(i) * row;
        double w = std::max(1.0, double(v.size) * px_per_byte);
        const auto [used, largest] = v.measure();
        o << "<g><title>" << fmt_hex(v.base) << ": " << fmt_bytes(v.size) << " (" << pool_name(v.pool) << "), "
          << fmt_counted(v.blocks.size(), "block", "blocks") << ", " << fmt_bytes(v.size - used) << " free, largest free " << fmt_bytes(largest)
          << (tail ? ", then " + fmt_bytes(tail) + " of address space not mapped" : std::string()) << "</title>\n";
        o << "<text x='0' y='" << svg_num(y + 11) << "' font-size='11'>" << fmt_hex(v.base) << " " << fmt_bytes(v.size) << "</text>";
        o << "<rect x='" << label << "' y='" << svg_num(y) << "' width='" << svg_num(w) << "' height='" << row - 3
          << "' fill='#e3e3e3' stroke='#999' stroke-width='0.5'/>\n";
        // Merge blocks closer than half a pixel into one run, so a segment of thousands of small
        // blocks stays a handful of rectangles.
        double run_x0 = -1, run_x1 = -1;
        // Holes first (white), then blocks over them, then pending frees over blocks: a block is
        // never hidden under the white of a hole it touches within half a pixel.
        const char* fill = "#ffffff";
        auto flush = [&] {
            if (run_x0 < 0) return;
            o << "<rect x='" << svg_num(label + run_x0) << "' y='" << svg_num(y) << "' width='" << svg_num(std::max(0.6, run_x1 - run_x0))
              << "' height='" << row - 3 << "' fill='" << fill << "'/>";
        };
        for (const auto* list : {&v.holes, &v.blocks, &v.pending}) {
            run_x0 = run_x1 = -1;
            for (const auto& [p, a] : *list) {
                double x0 = double(p - v.base) * px_per_byte, x1 = double(p + a - v.base) * px_per_byte;
                if (run_x0 >= 0 && x0 - run_x1 < 0.5) {
                    run_x1 = x1;
                    continue;
                }
                flush();
                run_x0 = x0;
                run_x1 = x1;
            }
            flush();
            fill = fill == k_allocated_color ? k_pending_color : k_allocated_color;
        }
        o << "</g>\n";
    }
    o << "</svg>\n";
    if (s.segment_map.size() > max_rows)
        o << "<p class=meta>… " << fmt_counted(s.segment_map.size() - max_rows, "more segment", "more segments")
          << " not drawn.</p>\n";
    return o.str();
}

// Axis labels for power-of-two buckets: "512", "4K", "2M", "1G".
std::string short_bytes(uint64_t v) {
    const char* u[] = {"", "K", "M", "G", "T", "P", "E"};
    int k = 0;
    while (v >= 1024 && k < 6) {
        v /= 1024;
        ++k;
    }
    return std::to_string(v) + u[k];
}

std::string histogram_svg(const size_histogram& h, const std::string& title, const char* color) {
    int lo = -1, hi = -1;
    uint64_t top = 0;
    for (int i = 0; i < 64; ++i)
        if (h.count[size_t(i)]) {
            if (lo < 0) lo = i;
            hi = i;
            top = std::max(top, h.count[size_t(i)]);
        }
    if (lo < 0) return "<p class=meta>" + html_escape(title) + ": none.</p>\n";
    const double W = 480, H = 220, L = 44, B = 40, T = 24;
    int n = hi - lo + 1;
    double bw = (W - L - 10) / n;
    std::ostringstream o;
    o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H << "' viewBox='0 0 " << W << ' ' << H
      << "' role='img' aria-label='" << html_escape(title) << "'>\n";
    o << "<text x='0' y='14' font-size='13' font-weight='600'>" << html_escape(title) << "</text>\n";
    o << "<text x='" << L - 4 << "' y='" << T + 8 << "' font-size='10' text-anchor='end'>" << top << "</text>";
    o << "<text x='" << L - 4 << "' y='" << H - B << "' font-size='10' text-anchor='end'>0</text>\n";
    for (int i = lo; i <= hi; ++i) {
        uint64_t c = h.count[size_t(i)];
        double bh = (H - T - B) * double(c) / double(top);
        double x = L + (i - lo) * bw;
        o << "<rect x='" << svg_num(x + 1) << "' y='" << svg_num(H - B - bh) << "' width='" << svg_num(std::max(1.0, bw - 2))
          << "' height='" << svg_num(bh) << "' fill='" << color << "'><title>" << fmt_size_class(size_t(i)) << ": " << c
          << "</title></rect>\n";
        if (n <= 16 || (i - lo) % ((n + 15) / 16) == 0)
            o << "<text x='" << svg_num(x + bw / 2) << "' y='" << H - B + 14 << "' font-size='10' text-anchor='middle'>"
              << short_bytes(i ? uint64_t(1) << i : 0) << "</text>\n";
    }
    o << "<text x='" << L << "' y='" << H - 6 << "' font-size='10' fill='#555'>size bucket (lower bound, powers of two)</text>\n";
    o << "</svg>\n";
    return o.str();
}

void blocks_table(std::ostream& o, const std::vector<block_view>& bs) {
    o << "<table><tr><th>address</th><th>requested</th><th>set aside</th><th>api</th><th>kind</th><th>allocated at</th><th>log line</th></tr>\n";
    for (const block_view& b : bs)
        o << "<tr><td><code>" << fmt_hex(b.ptr) << "</code></td><td>" << fmt_bytes(b.size) << "</td><td>" << fmt_bytes(b.asize)
          << "</td><td>" << html_escape(b.api) << "</td><td>" << kind_name(b.kind) << "</td><td>" << fmt_time(b.t) << " (seq "
          << b.seq << ")</td><td>" << b.line << "</td></tr>\n";
    o << "</table>\n";
}

void card(std::ostream& o, const std::string& k, const std::string& v) {
    o << "<div class=card><div class=v>" << html_escape(v) << "</div><div class=k>" << html_escape(k) << "</div></div>";
}

void snapshot_block(std::ostream& o, const state_snapshot& s) {
    o << "<p class=meta>requested " << fmt_bytes(s.requested) << ", allocated " << fmt_bytes(s.allocated) << ", reserved "
      << fmt_bytes(s.reserved);
    if (!s.segment_map.empty() || s.segments)
        o << "; free in segments " << fmt_bytes(s.free_in_segments) << " in " << fmt_counted(s.free_blocks, "block", "blocks")
          << ", largest " << fmt_bytes(s.largest_free) << ", external fragmentation " << fmt_pct(s.external_fragmentation);
    o << "</p>\n";
    o << segment_map_svg(s);
}

// ", reuse <mode>" for the header line when the pool is on; under "auto" each pool device's switch,
// since the mode then differs by device and over time.
std::string reuse_text(const process_report& p) {
    if (p.pool_mode == config_value::pool_off || p.reuse_mode.empty()) return "";
    std::string s = ", reuse " + html_escape(p.reuse_mode);
    if (p.reuse_mode != config_value::reuse_auto) return s;
    std::string devs;
    for (const device_report& d : p.devices) {
        if (!d.n_segment_alloc && !d.reuse_safe) continue;
        devs += (devs.empty() ? "" : "; ") + std::string("dev ") + std::to_string(d.dev) +
                (d.reuse_safe ? ": safe from seq " + std::to_string(d.reuse_safe_seq) + " by " + html_escape(d.reuse_safe_api)
                              : std::string(": immediate throughout"));
    }
    return devs.empty() ? s : s + " (" + devs + ")";
}

void device_html(std::ostream& o, const process_report& p, const device_report& d, const output_options& opt) {
    std::string title = d.dev < 0 ? "Host memory / unknown device" : "Device " + std::to_string(d.dev);
    if (!d.name.empty()) title += ": " + d.name;
    if (d.total) title += " (" + fmt_bytes(d.total) + ")";
    o << "<h2>" << html_escape(title) << "</h2>\n<div class=cards>";
    card(o, "peak requested", fmt_bytes(d.requested.peak));
    card(o, "peak allocated", fmt_bytes(d.allocated.peak));
    card(o, "peak reserved", fmt_bytes(d.reserved.peak));
    // Free space and fragmentation are about pool segments: none where the pool held none.
    const bool pooled = d.segment_count.peak > 0;
    if (pooled) card(o, "max external fragmentation", fmt_pct(d.max_external_fragmentation));
    card(o, d.n_oom == 1 ? "OOM" : "OOMs", fmt_count(d.n_oom));
    card(o, p.has_end ? "leaked at end" : "live when log stops", fmt_bytes(d.leaked_bytes) + " in " + std::to_string(d.n_leaks));
    o << "</div>\n";
    const state_snapshot& k = d.at_peak;
    o << "<table><tr><th>metric</th><th>at end</th><th>peak / at peak</th><th>when</th></tr>\n";
    auto row = [&](const std::string& m, const std::string& a, const std::string& b, const std::string& c) {
        o << "<tr><td>" << m << "</td><td>" << a << "</td><td>" << b << "</td><td>" << c << "</td></tr>\n";
    };
    auto peak_when = [](const tracked_bytes& m) { return fmt_peak_at(m.peak, m.peak_t, m.peak_seq); };
    row("requested", fmt_bytes(d.requested.current), fmt_bytes(d.requested.peak), peak_when(d.requested));
    row("allocated", fmt_bytes(d.allocated.current), fmt_bytes(d.allocated.peak), peak_when(d.allocated));
    row("reserved", fmt_bytes(d.reserved.current), fmt_bytes(d.reserved.peak), peak_when(d.reserved));
    if (pooled) {
        row("segments", std::to_string(d.segment_count.current), std::to_string(d.segment_count.peak), "");
        row("largest free block", fmt_bytes(d.end_largest_free), fmt_bytes(k.largest_free), "at peak allocated");
        row("external fragmentation", fmt_pct(d.end_external_fragmentation), fmt_pct(k.external_fragmentation) + " (max " +
            fmt_pct(d.max_external_fragmentation) + ")", d.max_external_fragmentation > 0
                 ? "max" + (d.max_external_fragmentation_free ? " of " + fmt_bytes(d.max_external_fragmentation_free) + " free" : std::string()) +
                       " at " + fmt_at(d.max_external_fragmentation_t, d.max_external_fragmentation_seq)
                 : "");
    }
    row("reserved but unallocated", "", fmt_pct(d.reserved_unallocated_at_peak()), "at peak allocated");
    row("rounding overhead", "", fmt_pct(d.rounding_overhead_at_peak()), "at peak allocated");
    uint64_t dur = d.last_t > d.first_t ? d.last_t - d.first_t : 0;
    row("allocations / frees", fmt_count(d.n_alloc) + " / " + fmt_count(d.n_free),
        fmt_rate(d.n_alloc, dur) + " / " + fmt_rate(d.n_free, dur), "");
    o << "</table>\n";

    std::vector<series> mem, frag;
    x_axis ax;
    timeline_series(d, mem, frag, ax);
    o << "<h3>Memory over time</h3>\n";
    if (ax.by_event)
        o << "<p class=meta>The x axis is event order, not time: long stretches without events would squeeze the "
             "activity into a sliver. Tick labels give the time of that event.</p>\n";
    o << line_chart(mem, false, "memory over time (maximum per interval)", ax);
    if (pooled)
        o << "<h3>External fragmentation over time</h3>\n"
          << line_chart(frag, true, "1 − largest free block / free bytes in segments", ax);
    o << call_sites_html(p, d);
    if (k.valid) {
        o << "<h3>Segment map at the peak of allocated memory — " << fmt_time(k.t) << ", seq " << k.seq << "</h3>\n";
        snapshot_block(o, k);
    }
    if (opt.show_at && d.at_request.valid) {
        o << "<h3>Segment map at " << html_escape(d.at_request.label) << " — " << fmt_time(d.at_request.t) << ", seq "
          << d.at_request.seq << "</h3>\n";
        snapshot_block(o, d.at_request);
    }
    for (size_t i = 0; i < d.ooms.size() && i < 20; ++i) {
        const oom_report& x = d.ooms[i];
        o << "<h3>OOM #" << i + 1 << " at " << fmt_time(x.t) << " (seq " << x.seq << ", line " << x.line << "): "
          << html_escape(x.api) << " of " << fmt_bytes(x.size) << "</h3>\n";
        o << asked_for_html(p, x.stack);  // the failing call's line first, as in the text report
        o << "<p>request <b>" << fmt_bytes(x.size) << "</b> · free in segments <b>" << fmt_bytes(x.free_in_segments)
          << "</b> · largest free block <b>" << fmt_bytes(x.largest_free) << "</b> · free on GPU <b>"
          << (x.gpu_total ? fmt_bytes(x.gpu_free) : std::string("not recorded")) << "</b>"
          << (x.pending ? " · pending frees <b>" + fmt_bytes(x.pending) + "</b>" : std::string())
          << (x.pool_vmm ? " · block rounding <b>" + fmt_bytes(x.block_rounding()) + "</b>" : std::string())
          << "<br>verdict: <span class='verdict-"
          << css_class(x.verdict) << "'>" << html_escape(x.verdict) << "</span>"
          << x.verdict_caveat() << " — " << html_escape(x.explanation) << "</p>\n";
        if (x.map.valid) o << segment_map_svg(x.map);
        o << sites_table_html(p, x.sites, "Call sites live at this OOM");
    }
    // As the text report says it, counted from oom_count(): ooms keeps only the first 1000.
    if (const uint64_t all = d.oom_count(); all > 20)
        o << "<p class=meta>… " << fmt_counted(all - 20, "more OOM", "more OOMs") << " not shown.</p>\n";
    o << "<h3>Size histograms</h3>\n<div style='display:flex;flex-wrap:wrap;gap:12px'>"
      << histogram_svg(d.alloc_sizes, "allocation request sizes (whole run)", k_allocated_color)
      << histogram_svg(k.free_block_sizes, "free block sizes at the peak", "#7f7f7f") << "</div>\n";
    if (!k.largest_live.empty()) {
        o << "<h3>Largest live blocks at the peak (" << k.largest_live.size() << " of " << k.live_allocs << ")</h3>\n";
        blocks_table(o, k.largest_live);
    }
    if (d.n_leaks) {
        o << "<h3>" << (p.has_end ? "Leaks: never freed" : "Live when the log stops") << " — " << fmt_counted(d.n_leaks, "allocation", "allocations") << ", "
          << fmt_bytes(d.leaked_bytes) << "</h3>\n";
        blocks_table(o, d.leaks);
        o << sites_table_html(p, d.leak_sites, leak_sites_title(p),
                             p.has_end ? "of the leaked bytes" : "of the bytes live then", d.leaked_bytes);
    }
}

}  // namespace

void write_html(std::ostream& o, const std::vector<process_report>& procs, const combined_report& combined,
                const output_options& opt) {
    o << "<!DOCTYPE html>\n<html lang=en><head><meta charset='utf-8'><title>gpumem report</title>\n"
      << "<meta name='viewport' content='width=device-width,initial-scale=1'>\n<style>" << k_css << "</style></head><body>\n";
    o << "<h1>gpumem report</h1>\n<p class=meta>";
    for (const metric_meaning& m : k_metric_meanings)
        o << "<b>" << m.name << "</b> = " << html_escape(m.meaning) << " (PyTorch: "
          << (std::string(m.pytorch).starts_with("torch.") ? "<code>" + std::string(m.pytorch) + "</code>" : m.pytorch) << ")<br>";
    o << "</p>\n";
    if (procs.size() > 1) {
        o << "<h2>Combined: " << procs.size() << " processes</h2>\n<table><tr><th>log</th><th>rank</th><th>dev</th>"
          << "<th>peak requested</th><th>peak allocated</th><th>peak reserved</th></tr>\n";
        for (const combined_row& r : combined.rows)
            o << "<tr><td>" << html_escape(procs[r.process].file) << "</td><td>" << html_escape(procs[r.process].rank)
              << "</td><td>" << r.dev << "</td><td>" << fmt_bytes(r.peak_requested) << "</td><td>" << fmt_bytes(r.peak_allocated)
              << "</td><td>" << fmt_bytes(r.peak_reserved) << "</td></tr>\n";
        o << "</table><p>peak reserved: max " << fmt_bytes(combined.max_peak_reserved) << ", mean "
          << fmt_bytes(clamp_to_u64(combined.mean_peak_reserved)) << "; imbalance (max/mean − 1) <b>" << fmt_pct(combined.imbalance)
          << "</b></p>\n";
    }
    for (const process_report& p : procs) {
        std::string cmd;
        for (const std::string& a : p.cmdline) cmd += (cmd.empty() ? "" : " ") + a;
        if (procs.size() > 1) o << "<h1 style='margin-top:36px'>" << html_escape(p.file) << "</h1>\n";
        o << "<p class=meta>" << html_escape(p.file) << " · process " << p.pid << (p.host.empty() ? "" : " on " + html_escape(p.host))
          << (p.rank.empty() ? "" : ", rank " + html_escape(p.rank)) << (cmd.empty() ? "" : " · <code>" + html_escape(cmd) + "</code>")
          << "<br>gpumem " << html_escape(p.gpumem_version) << ", pool " << html_escape(p.pool_mode) << reuse_text(p) << ", "
          << fmt_counted(p.events, "event", "events") << " over " << fmt_time(p.duration_ns()) << ", "
          << (p.has_end ? "ended: " : "") << html_escape(p.end_text()) << "</p>\n";
        // Said as the text report says it: the first warning shown below may be another one (a blank
        // line), and a page without it gave a lossy log's totals as exact.
        if (p.lost)
            o << "<p class=warn>" << fmt_counted(p.lost, "event was", "events were")
              << " lost by the recorder: totals are approximate</p>\n";
        // A report JSON may count warnings it does not list (a tool cut the list): only the count then.
        if (p.n_warnings)
            o << "<p class=warn>" << fmt_counted(p.n_warnings, "warning", "warnings")
              << (p.warnings.empty() ? "" : "; the first: " + html_escape(p.warnings.front())) << "</p>\n";
        if (p.devices.empty()) o << "<p>No device memory events.</p>\n";
        // GPUs first: host memory (dev -1) is usually a few pinned buffers and would push the
        // device a reader came for below the first screen.
        for (const device_report& d : p.devices)
            if (d.dev >= 0) device_html(o, p, d, opt);
        for (const device_report& d : p.devices)
            if (d.dev < 0) device_html(o, p, d, opt);
    }
    o << "<p class=meta style='margin-top:30px'>Metrics are defined in docs/metrics.md of gpumem.</p>\n</body></html>\n";
}

}  // namespace gpumem::analysis
