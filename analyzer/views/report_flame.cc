// The HTML report's call-site section: an icicle of the bytes live at the peak by stack, the top
// sites as a table, and an OOM's failing call (report_flame.h).  Every name from the log goes
// through html_escape.
#include "report_flame.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include "format_util.h"
#include "views/report_sites.h"

namespace gpumem::analysis {

namespace {

constexpr double k_svg_width = 980, k_row = 17, k_top = 4;

// A colour from a small palette, the same for the same function: Python frames of the program warm,
// of installed packages and the standard library pale, native frames blue; grey for what is no frame.
const char* colour_of(const frame_view& f) {
    static const char* const k_user[] = {"#f2a65a", "#ee8f4f", "#f5b971", "#e9804a", "#f0995f"};
    static const char* const k_lib[] = {"#f3d98b", "#efd27a", "#f6e09e", "#ecca6c", "#f1d684"};
    static const char* const k_native[] = {"#8fbce6", "#7aaedf", "#a3c8ea", "#6fa3d6", "#98c1e8"};
    uint32_t h = 2166136261u;  // FNV-1a
    for (char c : f.function) h = (h ^ uint8_t(c)) * 16777619u;
    size_t i = h % 5;
    if (f.native()) return k_native[i];
    return in_library(f.file) ? k_lib[i] : k_user[i];
}
const char* k_no_stack_colour = "#c9c9c9";
const char* k_other_colour = "#e4e4e4";

// The stacks as a tree by frame, outermost frame at the root; each node sums the bytes of the stacks
// that pass through it.
struct flame_tree {
    enum : uint32_t { no_stack = UINT32_MAX, other = UINT32_MAX - 1, root = UINT32_MAX - 2 };
    struct node {
        uint32_t frame = root;  // index into frames, or no_stack / other / root
        uint64_t bytes = 0, count = 0;
        std::vector<uint32_t> children;
    };
    std::vector<node> nodes{node{}};
    std::vector<const frame_view*> frames;  // one per distinct frame
    std::unordered_map<std::string, uint32_t> frame_ids;
    std::unordered_map<uint64_t, uint32_t> child_of;  // parent << 32 | frame -> node
    bool cut_deep = false;                              // a stack deeper than k_flame_max_depth

    uint32_t frame_id(const frame_view& f) {
        // Frames are one box when a reader could not tell them apart: same name, file, line and
        // module (an unnamed native frame by its address).
        std::string k = f.function + '\x1f' + f.file + '\x1f' + std::to_string(f.line) + '\x1f' + f.module;
        if (f.function.empty()) k += '\x1f' + std::to_string(f.address);
        auto [it, fresh] = frame_ids.emplace(std::move(k), uint32_t(frames.size()));
        if (fresh) frames.push_back(&f);
        return it->second;
    }
    uint32_t child(uint32_t parent, uint32_t frame) {
        auto [it, fresh] = child_of.emplace(uint64_t(parent) << 32 | frame, uint32_t(nodes.size()));
        if (fresh) {
            nodes.push_back(node{frame, 0, 0, {}});
            nodes[parent].children.push_back(it->second);
        }
        return it->second;
    }
    void add(uint32_t n, uint64_t bytes, uint64_t count) {
        node& x = nodes[n];
        x.bytes = bytes > UINT64_MAX - x.bytes ? UINT64_MAX : x.bytes + bytes;
        x.count += count;
    }
    void add_stack(const std::vector<frame_view>* fr, uint64_t bytes, uint64_t count) {
        add(0, bytes, count);
        if (!fr || fr->empty()) return add(child(0, no_stack), bytes, count);
        uint32_t at = 0;
        size_t depth = 0;
        for (auto it = fr->rbegin(); it != fr->rend(); ++it, ++depth) {
            if (depth == k_flame_max_depth) {
                cut_deep = true;
                break;
            }
            at = child(at, frame_id(*it));
            add(at, bytes, count);
        }
    }
};

struct flame_box {
    double x = 0, w = 0;
    size_t depth = 0;
    std::string label, title;  // raw text; escaped when written
    const char* fill = "";
};

struct flame_layout {
    const flame_tree& t;
    double px_per_byte;
    uint64_t min_bytes, peak;
    std::string other_why;  // the hover title's first line for "(other stacks)"
    std::vector<flame_box> boxes;
    size_t depth = 0;   // rows used
    bool merged_any = false, omitted_any = false;

    std::string amount(uint64_t bytes, uint64_t count) const {
        // count 0: the stacks a report JSON leaves out, whose allocations it does not count.
        return fmt_bytes(bytes) + " (" + fmt_pct(peak ? double(bytes) / double(peak) : 0.0) + " of the peak)" +
               (count ? " in " + fmt_counted(count, "allocation", "allocations") : std::string());
    }

    void place(uint32_t n, double x, size_t level) {
        std::vector<uint32_t> kids = t.nodes[n].children;
        // Largest first; ties by name then id, so the drawing never depends on hash order.
        auto name = [&](uint32_t c) { return t.nodes[c].frame < t.frames.size() ? frame_text(*t.frames[t.nodes[c].frame]) : ""; };
        std::sort(kids.begin(), kids.end(), [&](uint32_t a, uint32_t b) {
            if (t.nodes[a].bytes != t.nodes[b].bytes) return t.nodes[a].bytes > t.nodes[b].bytes;
            std::string na = name(a), nb = name(b);
            return na != nb ? na < nb : a < b;
        });
        uint64_t small_bytes = 0, small_count = 0;
        size_t small_n = 0;
        for (uint32_t c : kids) {
            const flame_tree::node& k = t.nodes[c];
            if (k.bytes < min_bytes) {
                small_bytes = k.bytes > UINT64_MAX - small_bytes ? UINT64_MAX : small_bytes + k.bytes;
                small_count += k.count;
                ++small_n;
                continue;
            }
            flame_box b;
            b.x = x;
            b.w = double(k.bytes) * px_per_byte;
            b.depth = level;
            if (k.frame == flame_tree::no_stack) {
                b.label = "(no stack)";
                b.title = "no stack recorded: a thread with no Python frames, such as the autograd engine's, or "
                          "stacks off or lost (the report's warnings say which)\n" + amount(k.bytes, k.count);
                b.fill = k_no_stack_colour;
            } else if (k.frame == flame_tree::other) {
                b.label = "(other stacks)";
                b.title = other_why + "\n" + amount(k.bytes, k.count);
                b.fill = k_other_colour;
            } else {
                const frame_view& f = *t.frames[k.frame];
                b.label = frame_text(f);
                b.title = f.function.empty() ? "?" : f.function;
                if (!f.file.empty()) b.title += "\n" + f.file + ":" + std::to_string(f.line);
                if (f.native()) b.title += "\n" + f.module + "+" + fmt_hex(f.address);
                b.title += "\n" + amount(k.bytes, k.count);
                b.fill = colour_of(f);
            }
            boxes.push_back(std::move(b));
            depth = std::max(depth, level + 1);
            place(c, x, level + 1);
            x += double(k.bytes) * px_per_byte;
        }
        if (small_n == 0) return;
        if (small_bytes < min_bytes) {
            omitted_any = true;
            return;
        }
        merged_any = true;
        flame_box b;
        b.x = x;
        b.w = double(small_bytes) * px_per_byte;
        b.depth = level;
        b.label = "… " + std::to_string(small_n) + " smaller";
        b.title = std::to_string(small_n) + " call paths, each under " + fmt_pct(k_flame_min_share) + " of the peak\n" +
                  amount(small_bytes, small_count);
        b.fill = k_other_colour;
        boxes.push_back(std::move(b));
        depth = std::max(depth, level + 1);
    }
};

std::string flame_svg(const process_report& p, const device_report& d, bool from_json) {
    const std::vector<site_row>& rows = from_json ? d.top_sites : d.peak_sites;
    flame_tree t;
    t.frames.reserve(64);
    uint64_t listed = 0;
    for (const site_row& r : rows) {
        t.add_stack(p.stacks.find(r.stack), r.bytes, r.count);
        listed = r.bytes > UINT64_MAX - listed ? UINT64_MAX : listed + r.bytes;
    }
    const uint64_t peak = d.requested.peak;
    // Stacks beyond those listed (a report JSON keeps the top ones) still take their width.
    if (peak > listed) {
        t.add(t.child(0, flame_tree::other), peak - listed, 0);
        t.add(0, peak - listed, 0);
    }
    // A log's stacks beyond the k_flame_stacks largest (sites.cc live_at) are not drawn either;
    // with exactly that many, every byte is listed and nothing was left out.
    const bool cut_many = !from_json && rows.size() >= k_flame_stacks && peak > listed;
    const std::string other_why = from_json ? "stacks not listed: the report JSON keeps only the top sites"
                                  : cut_many ? "stacks not drawn: only the " + fmt_count(k_flame_stacks) + " with the most bytes are"
                                             : "bytes at the peak that no drawn stack holds";
    const uint64_t total = std::max<uint64_t>(t.nodes[0].bytes, 1);
    flame_layout lay{t, k_svg_width / double(total), std::max<uint64_t>(1, uint64_t(double(total) * k_flame_min_share)), peak, other_why, {}, 0};
    lay.place(0, 0, 0);
    if (lay.boxes.empty()) return "";

    std::ostringstream o;
    const double H = k_top + double(lay.depth) * k_row;
    o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << k_svg_width << "' height='" << H << "' viewBox='0 0 " << k_svg_width
      << ' ' << H << "' role='img' aria-label='flame graph of the bytes live at the peak by call stack'>\n";
    for (const flame_box& b : lay.boxes) {
        double y = k_top + double(b.depth) * k_row;
        o << "<g><title>" << html_escape(b.title) << "</title><rect x='" << svg_num(b.x) << "' y='" << svg_num(y) << "' width='"
          << svg_num(std::max(0.5, b.w - 0.5)) << "' height='" << k_row - 1 << "' fill='" << b.fill << "'/>";
        // About 6.2 px per character at 11 px: a label only where at least three characters fit.
        size_t fit = b.w > 6 ? size_t((b.w - 6) / 6.2) : 0;
        if (fit >= 3)
            o << "<text x='" << svg_num(b.x + 3) << "' y='" << svg_num(y + 12) << "' font-size='11'>" << html_escape(shorten(b.label, fit))
              << "</text>";
        o << "</g>\n";
    }
    o << "</svg>\n";
    std::ostringstream note;
    note << "<p class=meta>Width: requested bytes live at the peak (" << fmt_bytes(peak) << " at " << fmt_time(d.requested.peak_t)
         << ", seq " << d.requested.peak_seq << "), by call stack; the outermost frame at the top, the frames it called below. "
         << "Orange: the program's Python frames; yellow: installed packages and the standard library; blue: native frames. "
         << "Hover a frame for its file, line and bytes.";
    if (lay.merged_any || lay.omitted_any)
        note << " Frames under " << fmt_pct(k_flame_min_share) << " of the peak (" << fmt_bytes(lay.min_bytes)
             << ") are merged into one “…” box per caller, drawn when together they reach that much"
             << (lay.omitted_any ? "; smaller remainders are left out" : "") << ".";
    if (from_json && peak > listed)
        note << " Drawn from the report JSON, which lists only the top " << rows.size() << " sites; the rest is “(other stacks)”.";
    else if (cut_many)
        note << " Only the " << fmt_count(k_flame_stacks) << " stacks with the most bytes are drawn; the rest is “(other stacks)”.";
    if (t.cut_deep) note << " Frames deeper than " << k_flame_max_depth << " levels are not drawn.";
    note << "</p>\n";
    return note.str() + o.str();
}

// A stack as the HTML tables show a site: its user frame (inside the innermost when that is another)
// and up to three callers, outermost last.  "(no stack)" and no callers for a stack not recorded.
void site_cells(const std::vector<frame_view>* fr, std::string& site, std::string& callers) {
    site = "(no stack)";
    callers.clear();
    if (!fr || fr->empty()) return;
    size_t u = user_frame(*fr);
    site = frame_text((*fr)[u]);
    if (u > 0) site += " inside " + frame_text((*fr)[0]);
    for (size_t i = u + 1; i < fr->size() && i < u + 4; ++i) callers += (callers.empty() ? "" : " ← ") + frame_text((*fr)[i]);
    if (u + 4 < fr->size()) callers += " ← …";
}

// share_of: the heading of the share column (of `total`); nullptr for none.
void sites_table(std::ostream& o, const process_report& p, const std::vector<site_row>& rows, uint64_t total,
                 const char* share_of) {
    o << "<table><tr><th>site (the program's innermost frame)</th><th>bytes</th>";
    if (share_of) o << "<th>" << share_of << "</th>";
    o << "<th>allocations</th><th style='text-align:left'>called from</th></tr>\n";
    for (const site_row& r : rows) {
        std::string site, callers;
        site_cells(p.stacks.find(r.stack), site, callers);
        o << "<tr><td><code>" << html_escape(site) << "</code></td><td style='white-space:nowrap'>" << fmt_bytes(r.bytes) << "</td>";
        if (share_of) o << "<td>" << fmt_pct(total ? double(r.bytes) / double(total) : 0.0) << "</td>";
        o << "<td>" << fmt_count(r.count) << "</td><td style='text-align:left'><code>" << html_escape(callers)
          << "</code></td></tr>\n";
    }
    o << "</table>\n";
}

}  // namespace

std::string call_sites_html(const process_report& p, const device_report& d) {
    if (!p.stacks.any() || d.top_sites.empty() || d.requested.peak == 0) return "";
    std::ostringstream o;
    o << "<h3>Call stacks at the peak of requested memory — " << fmt_bytes(d.requested.peak) << " at "
      << fmt_time(d.requested.peak_t) << ", seq " << d.requested.peak_seq << "</h3>\n";
    o << flame_svg(p, d, d.peak_sites.empty());
    o << "<p class=meta>Top call sites at the peak (every frame of each is in <code>--json</code>, <code>top_sites</code>):</p>\n";
    sites_table(o, p, d.top_sites, d.requested.peak, "of the peak");
    return o.str();
}

std::string asked_for_html(const process_report& p, uint32_t stack) {
    if (!p.stacks.any()) return "";
    const auto* fr = p.stacks.find(stack);
    if (!fr || fr->empty()) return std::string("<p>asked for by ") + k_no_failing_stack + "</p>\n";
    std::string site, callers;
    site_cells(fr, site, callers);
    return "<p>asked for by <code>" + html_escape(site) + "</code>" +
           (callers.empty() ? std::string() : " ← called from <code>" + html_escape(callers) + "</code>") + "</p>\n";
}

std::string sites_table_html(const process_report& p, const std::vector<site_row>& rows, const std::string& caption,
                             const char* share_of, uint64_t total) {
    if (!p.stacks.any() || rows.empty()) return "";
    std::ostringstream o;
    o << "<p class=meta>" << html_escape(caption) << ":</p>\n";
    sites_table(o, p, rows, total, share_of);
    return o.str();
}

}  // namespace gpumem::analysis
