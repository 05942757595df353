// Call-site views shared by the report writers (report_sites.h).
#include "report_sites.h"

#include "format_util.h"

namespace gpumem::analysis {

bool in_library(const std::string& file) {
    return file.find("site-packages/") != std::string::npos || file.find("dist-packages/") != std::string::npos ||
           file.find("/lib/python3") != std::string::npos || file.rfind("<frozen", 0) == 0;
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

std::string frame_text(const frame_view& f) {
    std::string name = f.function.empty() ? "?" : f.function;
    if (!f.file.empty()) return name + " (" + base_name(f.file) + ":" + std::to_string(f.line) + ")";
    if (f.native()) return name + " (" + base_name(f.module) + "+" + fmt_hex(f.address) + ")";
    return name;
}

nlohmann::ordered_json sites_json(const process_report& p, const std::vector<site_row>& rows) {
    using ojson = nlohmann::ordered_json;
    ojson a = ojson::array();
    for (const site_row& r : rows) {
        ojson s;
        s["bytes"] = r.bytes;
        s["count"] = r.count;
        s["stack"] = r.stack;
        ojson frames = ojson::array();
        if (const auto* fr = p.stacks.find(r.stack))
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
        s["frames"] = frames;
        a.push_back(s);
    }
    return a;
}

void write_sites_text(std::ostream& os, const process_report& p, const std::vector<site_row>& rows,
                      const std::string& title) {
    if (rows.empty()) return;
    os << "\n  " << title << "\n";
    for (const site_row& r : rows) {
        os << "    " << fmt_bytes(r.bytes) << " in " << fmt_counted(r.count, "allocation", "allocations") << "  ";
        const auto* fr = p.stacks.find(r.stack);
        if (!fr || fr->empty()) {
            os << "(no stack: a thread with no Python frames, such as the autograd engine's)\n";
            continue;
        }
        size_t u = user_frame(*fr);
        os << frame_text((*fr)[u]) << "\n";
        // The callers above it, up to three, then how many more the JSON report lists.
        size_t shown = 0;
        for (size_t i = u + 1; i < fr->size() && shown < 3; ++i, ++shown)
            os << "        called from " << frame_text((*fr)[i]) << "\n";
        if (u + 1 + shown < fr->size())
            os << "        ... " << fr->size() - (u + 1 + shown) << " more frames in --json\n";
        if (u > 0) os << "        (inside " << frame_text((*fr)[0]) << ")\n";
    }
}

}  // namespace gpumem::analysis
