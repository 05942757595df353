// Call-site views shared by the report writers (report_sites.h).
#include "views/report_sites.h"

#include "format_util.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace gpumem::analysis {

namespace {
// TorchInductor's output module: "<dir>/torchinductor_<user>/<2 characters>/c<hash>.py", so a
// user's own tree that merely has "torchinductor_" in a folder name stays the user's.
bool inductor_output(const std::string& file) {
    const size_t at = file.rfind("torchinductor_");
    if (at == std::string::npos || (at > 0 && file[at - 1] != '/')) return false;
    const size_t user_end = file.find('/', at);
    if (user_end == std::string::npos) return false;
    const size_t dir_end = file.find('/', user_end + 1);
    if (dir_end != user_end + 3 || file.find('/', dir_end + 1) != std::string::npos) return false;
    const std::string name = file.substr(dir_end + 1);
    return name.size() > 4 && name[0] == 'c' && name.compare(name.size() - 3, 3, ".py") == 0;
}
}  // namespace

bool in_library(const std::string& file) {
    auto has = [&](const char* s) { return file.find(s) != std::string::npos; };
    auto starts = [&](const char* s) { return file.rfind(s, 0) == 0; };
    if (has("site-packages/") || has("dist-packages/") || has("/lib/python3") || starts("<frozen")) return true;
    // Generated code is no line the user wrote, though its file is outside any package: under
    // torch.compile the innermost such frame is TorchInductor's output module (its cache,
    // /tmp/torchinductor_<user>/xx/cxxxx.py by default) or torch.fx's GraphModule code
    // ("<eval_with_key>.N"), and the user's line is the one that called the compiled model.
    if (inductor_output(file) || starts("<eval_with_key>")) return true;
    // Other "<...>" pseudo-files stay the user's: "<string>" is what `python -c` and exec() of
    // source text name the program's own code (as "<stdin>" and IPython's "<ipython-input-N-...>"
    // are), and where it is generated instead (a dataclass's __init__), the row still shows its
    // caller next to it.
    return false;
}

namespace {
std::string base_name(const std::string& path) {
    size_t s = path.rfind('/');
    return s == std::string::npos ? path : path.substr(s + 1);
}
}  // namespace

size_t user_frame(const std::vector<frame_view>& frames) {
    for (size_t i = 0; i < frames.size(); ++i)
        if (!frames[i].native() && !frames[i].file.empty() && !in_library(frames[i].file)) return i;
    return 0;
}

std::string shorten(const std::string& s, size_t n) {
    size_t chars = 0, i = 0;
    while (i < s.size()) {
        size_t len = 1;
        unsigned char c = static_cast<unsigned char>(s[i]);
        if (c >= 0xf0) len = 4;
        else if (c >= 0xe0) len = 3;
        else if (c >= 0xc0) len = 2;
        if (chars + 1 == n && i + len < s.size()) return s.substr(0, i) + "…";
        i += len;
        ++chars;
    }
    return s;
}

std::string frame_text(const frame_view& f) {
    std::string name = f.function.empty() ? "?" : shorten(f.function, k_name_chars);
    if (!f.file.empty()) return name + " (" + shorten(base_name(f.file), k_file_chars) + ":" + std::to_string(f.line) + ")";
    if (f.native()) return name + " (" + shorten(base_name(f.module), k_file_chars) + "+" + fmt_hex(f.address) + ")";
    return name;
}

namespace {
// A stack's frames, innermost first: what a SITE's "frames" holds.
nlohmann::ordered_json frames_json(const process_report& p, uint32_t stack) {
    using ojson = nlohmann::ordered_json;
    ojson frames = ojson::array();
    if (const auto* fr = p.stacks.find(stack))
        for (const frame_view& f : *fr) {
            ojson j;
            j["function"] = f.function;
            j["file"] = f.file;
            j["line"] = f.line;
            if (f.native()) {
                j["module"] = f.module;
                j["address"] = fmt_hex(f.address);
            }
            frames.push_back(j);
        }
    return frames;
}
}  // namespace

nlohmann::ordered_json sites_json(const process_report& p, const std::vector<site_row>& rows) {
    using ojson = nlohmann::ordered_json;
    ojson a = ojson::array();
    for (const site_row& r : rows) {
        ojson s;
        s["bytes"] = r.bytes;
        s["count"] = r.count;
        s["stack"] = r.stack;
        s["frames"] = frames_json(p, r.stack);
        a.push_back(s);
    }
    return a;
}

nlohmann::ordered_json stack_json(const process_report& p, uint32_t stack) {
    nlohmann::ordered_json s;
    s["stack"] = stack;
    s["frames"] = frames_json(p, stack);
    return s;
}

const char* leak_sites_title(const process_report& p) {
    return p.has_end ? "Leaks by call site" : "Live when the log stops, by call site";
}

std::string site_key(const std::vector<frame_view>* frames) {
    std::string k;
    if (!frames) return k;
    for (const frame_view& f : *frames) {
        k += f.function + '\x1f' + f.file + '\x1f' + std::to_string(f.line) + '\x1f' + f.module + '\x1f';
        if (f.function.empty()) k += fmt_hex(f.address);
        k += '\x1e';
    }
    return k;
}

std::string asked_by_name(const process_report& p, uint32_t stack) {
    const auto* fr = p.stacks.find(stack);
    return fr && !fr->empty() ? site_name(fr) : "";
}

std::string site_name(const std::vector<frame_view>* frames) {
    if (!frames || frames->empty()) return "(no stack)";
    size_t u = user_frame(*frames);
    std::string s = frame_text((*frames)[u]);
    if (u + 1 < frames->size()) s += " <- " + frame_text((*frames)[u + 1]);
    if (u > 0) s += " (inside " + frame_text((*frames)[0]) + ")";
    return s;
}

std::vector<site_change> diff_sites(const process_report& pa, const std::vector<site_row>& rows_a, uint64_t total_a,
                                    const process_report& pb, const std::vector<site_row>& rows_b, uint64_t total_b) {
    auto sum = [](const std::vector<site_row>& rows, uint64_t& smallest) {
        uint64_t n = 0;
        for (const site_row& r : rows) {
            n = r.bytes > UINT64_MAX - n ? UINT64_MAX : n + r.bytes;
            smallest = std::min(smallest, r.bytes);
        }
        return n;
    };
    uint64_t small_a = UINT64_MAX, small_b = UINT64_MAX;
    const bool all_a = sum(rows_a, small_a) >= total_a, all_b = sum(rows_b, small_b) >= total_b;
    std::map<std::string, site_change> by_key;  // ordered: ties come out the same on every run
    for (const site_row& r : rows_a) {
        const auto* fr = pa.stacks.find(r.stack);
        site_change& c = by_key[site_key(fr)];
        if (c.name.empty()) c.name = site_name(fr);
        c.a_bytes += r.bytes;
        c.a_count += r.count;
    }
    for (const site_row& r : rows_b) {
        const auto* fr = pb.stacks.find(r.stack);
        site_change& c = by_key[site_key(fr)];
        if (c.name.empty()) c.name = site_name(fr);
        c.b_bytes += r.bytes;
        c.b_count += r.count;
    }
    std::vector<site_change> out;
    for (auto& [key, c] : by_key) {
        c.key = key;
        // Listed on one side only: on the other it is 0 when that side lists every site, else below
        // the smallest it lists.
        if (!c.a_count && !c.a_bytes && !all_a) {
            c.a_known = false;
            c.a_bound = small_a;
        }
        if (!c.b_count && !c.b_bytes && !all_b) {
            c.b_known = false;
            c.b_bound = small_b;
        }
        out.push_back(std::move(c));
    }
    auto rank = [](const site_change& c) { return !c.a_known || !c.b_known ? 1 : c.a_bytes == c.b_bytes ? 2 : 0; };
    std::stable_sort(out.begin(), out.end(), [&](const site_change& x, const site_change& y) {
        if (rank(x) != rank(y)) return rank(x) < rank(y);
        return std::fabs(x.delta()) > std::fabs(y.delta());
    });
    return out;
}

void write_sites_text(std::ostream& os, const process_report& p, const std::vector<site_row>& rows,
                      const std::string& title, size_t indent) {
    if (rows.empty()) return;
    const std::string in(indent, ' '), row = in + "  ", sub = in + "      ";
    os << "\n" << in << title << "\n";
    for (const site_row& r : rows) {
        os << row << fmt_bytes(r.bytes) << " in " << fmt_counted(r.count, "allocation", "allocations") << "  ";
        const auto* fr = p.stacks.find(r.stack);
        if (!fr || fr->empty()) {
            // Why: the recorder's own reason when the header gives one (an interpreter it cannot
            // read), else the usual one.
            if (!p.stacks_off.empty()) os << "(no stack: " << visible(p.stacks_off) << ")\n";
            else if (p.stacks_lost)
                os << "(no stack: a thread with no Python frames, such as the autograd engine's, or one of the "
                   << fmt_count(p.stacks_lost) << " allocations the recorder could not record a stack for)\n";
            else os << "(no stack: a thread with no Python frames, such as the autograd engine's)\n";
            continue;
        }
        write_frames_text(os, *fr, sub);
    }
}

void write_frames_text(std::ostream& os, const std::vector<frame_view>& frames, const std::string& sub) {
    size_t u = user_frame(frames);
    os << frame_text(frames[u]) << "\n";
    // The callers above it, up to three, then how many more the JSON report lists.
    size_t shown = 0;
    for (size_t i = u + 1; i < frames.size() && shown < 3; ++i, ++shown)
        os << sub << "called from " << frame_text(frames[i]) << "\n";
    if (u + 1 + shown < frames.size())
        os << sub << "... " << fmt_counted(frames.size() - (u + 1 + shown), "more frame", "more frames") << " in --json\n";
    if (u > 0) os << sub << "(inside " << frame_text(frames[0]) << ")\n";
}

}  // namespace gpumem::analysis
