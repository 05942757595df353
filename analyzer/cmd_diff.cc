// `gpumem diff A B`: two runs side by side per process and GPU (peaks, fragmentation, counts) and
// the biggest changes by API, size class and leak.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_input.h"
#include "commands.h"
#include "diagnostics.h"
#include "format_util.h"

namespace gpumem::analysis {

namespace {

enum class unit { bytes, ratio, count };
struct row_def {
    const char* title;
    const char* member;
    unit u;
};
const row_def k_rows[] = {
    {"peak requested", "peak_requested_bytes", unit::bytes},
    {"peak allocated", "peak_allocated_bytes", unit::bytes},
    {"peak reserved", "peak_reserved_bytes", unit::bytes},
    {"peak segments", "peak_segments", unit::count},
    {"max external fragmentation", "max_external_fragmentation", unit::ratio},
    {"end external fragmentation", "end_external_fragmentation", unit::ratio},
    {"allocations", "n_alloc", unit::count},
    {"frees", "n_free", unit::count},
    {"failed allocations", "n_alloc_fail", unit::count},
    {"OOMs", "n_oom", unit::count},
    {"leaked allocations", "n_leaks", unit::count},
    {"leaked bytes", "leaked_bytes", unit::bytes},
};

std::string fmt_unit(unit u, double v) {
    switch (u) {
        case unit::bytes: return fmt_bytes(uint64_t(std::max(0.0, v)));
        case unit::ratio: return fmt_pct(v);
        case unit::count: return fmt_count(uint64_t(std::max(0.0, v)));
    }
    return "";
}

// "+1.50 MiB (+12.0%)", "-3", "+4.1 points", "=" when equal.
std::string fmt_change(unit u, double a, double b) {
    if (a == b) return "=";
    const char* sign = b > a ? "+" : "-";
    double d = std::fabs(b - a);
    std::string s;
    if (u == unit::ratio) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%s%.1f points", sign, d * 100);
        return buf;
    }
    s = sign + fmt_unit(u, d);
    if (a > 0) {
        char buf[32];
        std::snprintf(buf, sizeof buf, " (%s%.1f%%)", sign, d / a * 100);
        s += buf;
    }
    return s;
}

// One candidate for "top changes": a description and how much it moved, in bytes.
struct change {
    std::string what;
    double delta_bytes = 0;
    std::string detail;
};

void usage_changes(const ojson& da, const ojson& db, const char* member, const char* label, std::vector<change>& out) {
    std::map<std::string, std::pair<const ojson*, const ojson*>> by_name;
    auto collect = [&](const ojson& d, bool second) {
        auto it = d.find(member);
        if (it == d.end() || !it->is_array()) return;
        for (const ojson& u : *it) {
            if (!u.is_object()) continue;
            auto& slot = by_name[get_str(u, "name")];
            (second ? slot.second : slot.first) = &u;
        }
    };
    collect(da, false);
    collect(db, true);
    static const ojson k_empty = ojson::object();
    for (const auto& [name, ab] : by_name) {
        const ojson& a = ab.first ? *ab.first : k_empty;
        const ojson& b = ab.second ? *ab.second : k_empty;
        double pa = double(get_u64(a, "peak_requested_bytes")), pb = double(get_u64(b, "peak_requested_bytes"));
        if (pa == pb) continue;
        change c;
        c.what = std::string(label) + " " + name + ": peak live " + fmt_bytes(uint64_t(pa)) + " -> " + fmt_bytes(uint64_t(pb));
        c.delta_bytes = pb - pa;
        c.detail = "allocations " + fmt_count(get_u64(a, "n_alloc")) + " -> " + fmt_count(get_u64(b, "n_alloc"));
        out.push_back(std::move(c));
    }
}

void size_class_changes(const ojson& da, const ojson& db, std::vector<change>& out) {
    std::map<uint64_t, std::pair<const ojson*, const ojson*>> by_min;
    auto collect = [&](const ojson& d, bool second) {
        auto it = d.find("alloc_size_histogram");
        if (it == d.end() || !it->is_array()) return;
        for (const ojson& b : *it) {
            if (!b.is_object()) continue;
            auto& slot = by_min[get_u64(b, "min_bytes")];
            (second ? slot.second : slot.first) = &b;
        }
    };
    collect(da, false);
    collect(db, true);
    static const ojson k_empty = ojson::object();
    for (const auto& [min, ab] : by_min) {
        const ojson& a = ab.first ? *ab.first : k_empty;
        const ojson& b = ab.second ? *ab.second : k_empty;
        uint64_t ca = get_u64(a, "count"), cb = get_u64(b, "count");
        double ba = double(get_u64(a, "bytes")), bb = double(get_u64(b, "bytes"));
        if (ca == cb && ba == bb) continue;
        uint64_t max = get_u64(ab.first ? a : b, "max_bytes");
        change c;
        c.what = "size class " + fmt_bytes(min) + "-" + fmt_bytes(max + 1) + ": " + fmt_count(ca) + " -> " + fmt_count(cb) +
                 " allocations";
        c.delta_bytes = bb - ba;
        c.detail = "bytes allocated over the run " + fmt_bytes(uint64_t(ba)) + " -> " + fmt_bytes(uint64_t(bb));
        out.push_back(std::move(c));
    }
}

// Leaks grouped by API (the report lists the 50 largest; totals come from leaked_bytes).
void leak_changes(const ojson& da, const ojson& db, std::vector<change>& out) {
    std::map<std::string, std::pair<double, double>> by_api;
    std::map<std::string, std::pair<uint64_t, uint64_t>> counts;
    auto collect = [&](const ojson& d, bool second) {
        auto it = d.find("leaks");
        if (it == d.end() || !it->is_array()) return;
        for (const ojson& l : *it) {
            if (!l.is_object()) continue;
            std::string api = get_str(l, "api");
            (second ? by_api[api].second : by_api[api].first) += double(get_u64(l, "size_bytes"));
            ++(second ? counts[api].second : counts[api].first);
        }
    };
    collect(da, false);
    collect(db, true);
    for (const auto& [api, ab] : by_api) {
        if (ab.first == ab.second) continue;
        change c;
        c.what = "leaks from " + api + ": " + fmt_bytes(uint64_t(ab.first)) + " -> " + fmt_bytes(uint64_t(ab.second));
        c.delta_bytes = ab.second - ab.first;
        c.detail = "listed blocks " + fmt_count(counts[api].first) + " -> " + fmt_count(counts[api].second);
        out.push_back(std::move(c));
    }
}

void print_device(const run_input& ra, const device_ref* a, const run_input& rb, const device_ref* b, size_t top) {
    static const ojson k_empty = ojson::object();
    const ojson& da = a ? ra.dev(*a) : k_empty;
    const ojson& db = b ? rb.dev(*b) : k_empty;
    std::printf("\n%s\n", (a ? a->key : b->key).c_str());
    std::printf("  A: %s\n  B: %s\n", a ? a->where.c_str() : "(not in A)", b ? b->where.c_str() : "(not in B)");
    std::printf("  %-28s %14s %14s   %s\n", "", "A", "B", "change");
    for (const row_def& r : k_rows) {
        double va = r.u == unit::ratio ? get_num(da, r.member) : double(get_u64(da, r.member));
        double vb = r.u == unit::ratio ? get_num(db, r.member) : double(get_u64(db, r.member));
        std::printf("  %-28s %14s %14s   %s\n", r.title, a ? fmt_unit(r.u, va).c_str() : "-",
                    b ? fmt_unit(r.u, vb).c_str() : "-", (a && b) ? fmt_change(r.u, va, vb).c_str() : "");
    }
    if (!a || !b) return;
    std::vector<change> changes;
    usage_changes(da, db, "by_api", "api", changes);
    usage_changes(da, db, "by_kind", "kind", changes);
    size_class_changes(da, db, changes);
    leak_changes(da, db, changes);
    std::stable_sort(changes.begin(), changes.end(),
                     [](const change& x, const change& y) { return std::fabs(x.delta_bytes) > std::fabs(y.delta_bytes); });
    if (changes.empty()) {
        std::printf("  no change by API, kind, size class or leak\n");
        return;
    }
    std::printf("  top changes (by bytes)\n");
    for (size_t i = 0; i < changes.size() && i < top; ++i)
        std::printf("    %s%s  [%s%s; %s]\n", changes[i].delta_bytes >= 0 ? "+ " : "- ", changes[i].what.c_str(),
                    changes[i].delta_bytes >= 0 ? "+" : "-", fmt_bytes(uint64_t(std::fabs(changes[i].delta_bytes))).c_str(),
                    changes[i].detail.c_str());
    if (changes.size() > top) std::printf("    ... %zu more (--top N)\n", changes.size() - top);
}

}  // namespace

struct diff_args {
    std::vector<std::string> inputs;
    size_t top = 8;
};

int run_diff(diff_args& args, const std::vector<std::string>& tail) {
    std::vector<std::string> inputs = args.inputs;
    inputs.insert(inputs.end(), tail.begin(), tail.end());
    size_t top = args.top;
    if (inputs.size() != 2) return usage_error("diff", "needs exactly two inputs, A and B");
    run_input ra, rb;
    std::string error;
    if (!load_run({inputs[0]}, ra, error) || !load_run({inputs[1]}, rb, error)) {
        spdlog::error("{}", error);
        return k_exit_input;
    }
    std::printf("gpumem diff\n  A = %s (%zu process%s)\n  B = %s (%zu process%s)\n", inputs[0].c_str(), ra.processes.size(),
                ra.processes.size() == 1 ? "" : "es", inputs[1].c_str(), rb.processes.size(),
                rb.processes.size() == 1 ? "" : "es");
    std::map<std::string, std::pair<const device_ref*, const device_ref*>> keys;
    for (const device_ref& r : ra.devices) keys[r.key].first = &r;
    for (const device_ref& r : rb.devices) keys[r.key].second = &r;
    if (keys.empty()) std::printf("\nno GPU memory activity in either run\n");
    for (const auto& [key, ab] : keys) print_device(ra, ab.first, rb, ab.second, top);
    std::fflush(stdout);
    return k_exit_ok;
}

command add_diff(CLI::App& top) {
    auto a = std::make_shared<diff_args>();
    CLI::App* app = top.add_subcommand("diff", "compare two runs per process and GPU: peaks, counts, biggest changes");
    app->footer(
        "Compares two runs, each a gpumem log or a `gpumem report --json` file (all ranks of a job in\n"
        "one report).  GPUs are matched by rank and device ordinal.  Prints peaks, fragmentation and\n"
        "counts side by side, then the largest changes by API, by allocation size class and in leaks.\n"
        "\n"
        "exit codes: 0 compared (whatever the differences); 2 unusable input or arguments.");
    app->add_option("INPUT", a->inputs, "logs or report JSON files");
    app->add_option("--top", a->top, "how many changes to list per GPU")->type_name("N")->default_str("8")
        ->check(CLI::Range(size_t(1), size_t(100000)));
    command c;
    c.app = app;
    c.run = [a](const std::vector<std::string>& tail, bool) { return run_diff(*a, tail); };
    return c;
}

}  // namespace gpumem::analysis
