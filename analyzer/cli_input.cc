// Loads runs for `gpumem check` and `gpumem diff` (logs or report JSON) and parses their size and
// ratio arguments.
#include "cli_input.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>

#include "analyze.h"
#include "config.h"
#include "diagnostics.h"
#include "log_reader.h"
#include "report_output.h"

namespace gpumem::analysis {

bool parse_size_arg(const std::string& text, uint64_t& out) {
    uint64_t v = 0;
    if (!gpumem::parse_size(text.c_str(), &v)) return false;
    out = v;
    return true;
}

static bool parse_double(const std::string& text, double& out) {
    if (text.empty() || text[0] == '-' || text[0] == '+' || std::isspace((unsigned char)text[0])) return false;
    errno = 0;
    char* end = nullptr;
    double v = std::strtod(text.c_str(), &end);
    if (errno || end == text.c_str() || *end || !std::isfinite(v)) return false;
    out = v;
    return true;
}

bool parse_ratio_arg(const std::string& text, double& out) {
    double v = 0;
    if (!text.empty() && text.back() == '%') {
        if (!parse_double(text.substr(0, text.size() - 1), v) || v > 100) return false;
        out = v / 100;
        return true;
    }
    if (!parse_double(text, v) || v > 1) return false;
    out = v;
    return true;
}

bool parse_percent_arg(const std::string& text, double& out) {
    std::string t = text;
    if (!t.empty() && t.back() == '%') t.pop_back();
    double v = 0;
    if (!parse_double(t, v)) return false;
    out = v / 100;
    return true;
}

uint64_t get_u64(const ojson& j, const char* key) {
    if (!j.is_object()) return 0;
    auto it = j.find(key);
    if (it == j.end()) return 0;
    if (it->is_number_unsigned()) return it->get<uint64_t>();
    if (it->is_number_integer()) return uint64_t(std::max<int64_t>(0, it->get<int64_t>()));
    if (it->is_number_float()) {
        double d = it->get<double>();
        return d > 0 && d < 1.8e19 ? uint64_t(d) : 0;
    }
    return 0;
}

double get_num(const ojson& j, const char* key) {
    if (!j.is_object()) return 0;
    auto it = j.find(key);
    if (it == j.end() || !it->is_number()) return 0;
    return it->get<double>();
}

std::string get_str(const ojson& j, const char* key) {
    if (!j.is_object()) return "";
    auto it = j.find(key);
    if (it == j.end()) return "";
    if (it->is_string()) return it->get<std::string>();
    if (it->is_number()) return it->dump();
    return "";
}

namespace {

// A log's first line is its header object, with "ev":"header".  A report is one JSON document
// (pretty-printed by `gpumem report --json`), so its first line alone is no complete object.
bool looks_like_log(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::string first;
    if (!f || !std::getline(f, first)) return true;  // let the log reader report the problem
    auto j = nlohmann::json::parse(first, nullptr, false);
    return !j.is_discarded() && j.is_object() && j.contains("ev");
}

bool load_report_json(const std::string& path, ojson& procs, std::string& error) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        error = path + ": cannot open: " + std::strerror(errno);
        return false;
    }
    ojson j = ojson::parse(f, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
        error = path + ": neither a gpumem log nor a `gpumem report --json` file";
        return false;
    }
    if (get_str(j, "schema") != "gpumem-report") {
        error = path + ": not a `gpumem report --json` file (no \"schema\": \"gpumem-report\")";
        return false;
    }
    if (get_u64(j, "schema_version") != uint64_t(k_report_schema_version)) {
        error = path + ": report schema version " + get_str(j, "schema_version") + " is not the " +
                std::to_string(k_report_schema_version) + " this gpumem reads";
        return false;
    }
    auto it = j.find("processes");
    if (it == j.end() || !it->is_array()) {
        error = path + ": report has no \"processes\" list";
        return false;
    }
    for (auto& p : *it) {
        if (!p.is_object()) {
            error = path + ": a member of \"processes\" is not an object";
            return false;
        }
        if (!p.contains("file")) p["file"] = path;
        procs.push_back(std::move(p));
    }
    return true;
}

}  // namespace

bool load_run(const std::vector<std::string>& paths, run_input& out, std::string& error) {
    try {
        for (const std::string& path : paths) {
            if (!looks_like_log(path)) {
                spdlog::debug("{}: reading as a `gpumem report --json` file", path);
                if (!load_report_json(path, out.processes, error)) return false;
                continue;
            }
            spdlog::debug("{}: reading as an event log", path);
            std::vector<process_report> one;
            try {
                one.push_back(analyze_file(path, analyze_options{}));
            } catch (const input_error& e) {
                error = e.what();
                return false;
            }
            ojson j = to_json(one, combine(one), output_options{});
            for (auto& p : j["processes"]) out.processes.push_back(std::move(p));
        }
        // Occurrence numbers for processes that share a rank, in start order.
        std::vector<size_t> order(out.processes.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
            const ojson &pa = out.processes[a], &pb = out.processes[b];
            if (get_str(pa, "rank") != get_str(pb, "rank")) return get_str(pa, "rank") < get_str(pb, "rank");
            return get_u64(pa, "start_unix_ns") < get_u64(pb, "start_unix_ns");
        });
        std::map<std::string, int> seen;
        for (size_t i : order) {
            const ojson& p = out.processes[i];
            std::string rank = get_str(p, "rank");
            int occ = seen[rank]++;
            std::string proc_key = "rank " + (rank.empty() ? std::string("?") : rank) + (occ ? "#" + std::to_string(occ + 1) : "");
            auto devs = p.find("devices");
            if (devs == p.end() || !devs->is_array()) continue;
            for (size_t d = 0; d < devs->size(); ++d) {
                const ojson& dv = (*devs)[d];
                if (!dv.is_object() || !dv.contains("dev") || !dv["dev"].is_number_integer()) continue;
                int64_t ordinal = dv["dev"].get<int64_t>();
                if (ordinal < 0) continue;  // host memory: not what the GPU gates are about
                device_ref r;
                r.process = i;
                r.device = d;
                r.key = proc_key + " dev " + std::to_string(ordinal);
                r.where = r.key + " (pid " + get_str(p, "pid") + ", " + get_str(p, "file") + ")";
                out.devices.push_back(std::move(r));
            }
        }
        std::sort(out.devices.begin(), out.devices.end(),
                  [](const device_ref& a, const device_ref& b) { return a.key < b.key; });
        return true;
    } catch (const std::exception& e) {
        // nlohmann type errors from a hand-edited report, or bad_alloc: unusable input, not a crash.
        error = std::string("cannot read the input: ") + e.what();
        return false;
    }
}

}  // namespace gpumem::analysis
