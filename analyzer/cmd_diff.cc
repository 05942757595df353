// `gpumem diff`: two runs side by side per process and GPU (peaks, fragmentation, counts) and the
// biggest changes by API, size class and leak.  Each side is one or more logs or report JSON files;
// GPUs are matched by rank and device as `check` matches them.  Works on the report model.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_input.h"
#include "commands.h"
#include "diagnostics.h"
#include "format_util.h"
#include "report_measures.h"
#include "views/report_sites.h"

namespace gpumem::analysis {

namespace {

std::string fmt_unit(measure_unit u, double v) {
    switch (u) {
        case measure_unit::bytes: return fmt_bytes(clamp_to_u64(v));  // v may be 2^64 or NaN: out of range
        case measure_unit::ratio: return fmt_pct(v);
        case measure_unit::count: return fmt_count(clamp_to_u64(v));
    }
    return "";
}

// "+1.50 MiB (+12.0%)", "-3", "+4.1 points", "+0.0067 points", "=" when equal.  Ratios are compared at the 6 decimals
// a report JSON keeps (report_json.cc), so a baseline report against its own logs shows "=", not
// "+0.0 points".
std::string fmt_change(measure_unit u, double a, double b) {
    if (u == measure_unit::ratio && std::round(a * 1e6) == std::round(b * 1e6)) return "=";
    if (a == b) return "=";
    const char* sign = b > a ? "+" : "-";
    double d = std::fabs(b - a);
    std::string s;
    if (u == measure_unit::ratio) {
        // A change under 0.05 points read "+0.0 points", a change of nothing: then to the 6
        // decimals it is compared at ("+0.0067 points").
        d = std::fabs(std::round(b * 1e6) - std::round(a * 1e6)) / 1e6;
        char buf[32];
        std::snprintf(buf, sizeof buf, d * 100 < 0.05 ? "%s%.4f points" : "%s%.1f points", sign, d * 100);
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

void usage_changes(const std::vector<usage_row>& ra, const std::vector<usage_row>& rb, const char* label,
                   std::vector<change>& out) {
    std::map<std::string, std::pair<const usage_row*, const usage_row*>> by_name;
    for (const usage_row& u : ra) by_name[u.name].first = &u;
    for (const usage_row& u : rb) by_name[u.name].second = &u;
    static const usage_row k_none;
    for (const auto& [name, ab] : by_name) {
        const usage_row& a = ab.first ? *ab.first : k_none;
        const usage_row& b = ab.second ? *ab.second : k_none;
        if (a.bytes.peak == b.bytes.peak) continue;
        change c;
        c.what = std::string(label) + " " + name + ": peak live " + fmt_bytes(a.bytes.peak) + " -> " + fmt_bytes(b.bytes.peak);
        c.delta_bytes = double(b.bytes.peak) - double(a.bytes.peak);
        c.detail = "allocations " + fmt_count(a.n_alloc) + " -> " + fmt_count(b.n_alloc);
        out.push_back(std::move(c));
    }
}

void size_class_changes(const size_histogram& ha, const size_histogram& hb, std::vector<change>& out) {
    for (size_t i = 0; i < ha.count.size(); ++i) {
        uint64_t ca = ha.count[i], cb = hb.count[i];
        double ba = double(ha.bytes[i]), bb = double(hb.bytes[i]);
        if (ca == cb && ba == bb) continue;
        change c;
        c.what = "size class " + fmt_size_class(i) + ": " + fmt_count(ca) + " -> " + fmt_count(cb) + " allocations";
        c.delta_bytes = bb - ba;
        c.detail = "bytes allocated over the run " + fmt_bytes(clamp_to_u64(ba)) + " -> " + fmt_bytes(clamp_to_u64(bb));
        out.push_back(std::move(c));
    }
}

// Leaks grouped by API: the bytes of each API still live after the last event, which is what a
// leak is.  Taken from the per-API rows, which count every allocation; the leak list holds only
// the 50 largest, so summing it understated an API's leaks whenever a run left more than 50.
// ended: both processes' logs have an end line; otherwise the bytes are what was live when a log
// stopped, not leaks, and the lines say so.
void leak_changes(const std::vector<usage_row>& ra, const std::vector<usage_row>& rb, bool ended, std::vector<change>& out) {
    std::map<std::string, std::pair<const usage_row*, const usage_row*>> by_name;
    for (const usage_row& u : ra) by_name[u.name].first = &u;
    for (const usage_row& u : rb) by_name[u.name].second = &u;
    static const usage_row k_none;
    for (const auto& [api, ab] : by_name) {
        const usage_row& a = ab.first ? *ab.first : k_none;
        const usage_row& b = ab.second ? *ab.second : k_none;
        if (a.bytes.current == b.bytes.current) continue;
        change c;
        c.what = (ended ? "leaks from " : "live at log end from ") + api + ": " + fmt_bytes(a.bytes.current) + " -> " +
                 fmt_bytes(b.bytes.current);
        c.delta_bytes = double(b.bytes.current) - double(a.bytes.current);
        c.detail = (ended ? "leaked allocations " : "live allocations ") + fmt_count(a.live) + " -> " + fmt_count(b.live);
        out.push_back(std::move(c));
    }
}

// Call sites matched by their frames (stack ids differ between logs): which grew, which shrank.
void print_sites(const char* title, const process_report& pa, const std::vector<site_row>& ra, uint64_t ta,
                 const process_report& pb, const std::vector<site_row>& rb, uint64_t tb, size_t top) {
    if (ra.empty() && rb.empty()) return;
    if (ra.empty() || rb.empty()) {
        std::printf("  %s: only in %s (the other run's log has no stacks, or nothing was live)\n", title, ra.empty() ? "B" : "A");
        return;
    }
    std::vector<site_change> ch = diff_sites(pa, ra, ta, pb, rb, tb);
    size_t grew = 0, shrank = 0, same = 0, unknown = 0;
    for (const site_change& c : ch) {
        if (!c.a_known || !c.b_known) ++unknown;
        else if (c.b_bytes > c.a_bytes) ++grew;
        else if (c.b_bytes < c.a_bytes) ++shrank;
        else ++same;
    }
    std::printf("  %s: %zu grew, %zu shrank, %zu unchanged", title, grew, shrank, same);
    if (unknown) std::printf(", %zu listed on one side only", unknown);
    std::printf("\n");
    auto side = [](bool known, uint64_t bytes, uint64_t count, uint64_t bound) {
        if (!known) return "< " + fmt_bytes(bound) + " (not listed)";
        return fmt_bytes(bytes) + " in " + fmt_counted(count, "allocation", "allocations");
    };
    size_t shown = 0;
    for (const site_change& c : ch) {
        if (c.a_known && c.b_known && c.a_bytes == c.b_bytes) break;  // the unchanged ones come last
        if (shown == top) {
            std::printf("    ... %zu more (--top N)\n", grew + shrank + unknown - shown);
            break;
        }
        ++shown;
        std::string delta = !c.a_known || !c.b_known ? "?" : fmt_change(measure_unit::bytes, double(c.a_bytes), double(c.b_bytes));
        const char* sign = !c.a_known || !c.b_known ? "?" : c.b_bytes > c.a_bytes ? "+" : "-";
        std::printf("    %s %s  %s\n        A %s -> B %s\n", sign, visible(c.name).c_str(), delta.c_str(),
                    side(c.a_known, c.a_bytes, c.a_count, c.a_bound).c_str(), side(c.b_known, c.b_bytes, c.b_count, c.b_bound).c_str());
    }
}

void print_device(const run_input& ra, const device_ref* a, const run_input& rb, const device_ref* b, size_t top) {
    static const device_report k_none;
    const device_report& da = a ? ra.dev(*a) : k_none;
    const device_report& db = b ? rb.dev(*b) : k_none;
    std::printf("\n%s\n", visible(a ? a->key : b->key).c_str());
    std::printf("  A: %s\n  B: %s\n", a ? a->where.c_str() : "(not in A)", b ? b->where.c_str() : "(not in B)");
    // Two GPUs of another model or memory size (a CI runner that changed GPU): the changes below may
    // be that alone.  Said as check --baseline says it (other_gpu), B being the run compared with A.
    if (a && b) {
        const std::string other = other_gpu(rb, *b, ra, *a, "A", "in B", "in A");
        if (!other.empty()) std::printf("  (B %s)\n", visible(other).c_str());
    }
    // A side whose log has no end line (killed, or still running) did not exit: what it had live
    // is not a leak (docs/metrics.md, Leaks), so the leak rows say "live at log end" then.
    const bool ended_a = !a || ra.proc(*a).has_end, ended_b = !b || rb.proc(*b).has_end;
    const bool ended = ended_a && ended_b;
    if (!ended)
        std::printf("  (%s: killed or still running, so what was live at the end is not called a leak)\n",
                    !ended_a && !ended_b ? "neither log has an end line" : !ended_a ? "A's log has no end line" : "B's log has no end line");
    // A side whose recorder lost events has approximate numbers (a lost allocation lowers a peak, a
    // lost free raises one): a change of a few percent may be the loss, which check says on every
    // result and the report at the top; here above the table, or the changes read as exact.
    for (const auto& [side, run, ref] : {std::tuple{"A", &ra, a}, std::tuple{"B", &rb, b}})
        if (ref && run->proc(*ref).lost)
            std::printf("  (%s's log: %s lost by the recorder, so its numbers are approximate)\n", side,
                        fmt_counted(run->proc(*ref).lost, "event was", "events were").c_str());
    std::printf("  %-28s %14s %14s   %s\n", "", "A", "B", "change");
    // Fragmentation is of free space in gpumem's pool segments (docs/metrics.md): on a device that
    // never had one (--pool off) it reads 0, which is no measurement, so it is said as such and
    // never compared.
    auto unmeasured = [](const run_input& run, const device_ref* r, const device_report& d) {
        return r && run.has(*r, device_field::peak_segments) && d.segment_count.peak == 0;
    };
    const bool unmeasured_a = unmeasured(ra, a, da), unmeasured_b = unmeasured(rb, b, db);
    for (const measure& r : k_diff_rows) {
        const bool frag = r.value == device_field::max_external_fragmentation ||
                          r.value == device_field::end_external_fragmentation;
        // A member a report JSON lacks is shown as unknown, never as 0.
        bool ha = a && ra.has(*a, r.value), hb = b && rb.has(*b, r.value);
        double va = measure_value(da, r), vb = measure_value(db, r);
        auto cell = [&](const device_ref* x, bool has, bool not_measured, double v) {
            return !x ? std::string("-") : !has ? std::string("?") : frag && not_measured ? std::string("not measured") : fmt_unit(r.unit, v);
        };
        const bool comparable = ha && hb && !(frag && (unmeasured_a || unmeasured_b));
        std::printf("  %-28s %14s %14s   %s\n", measure_title(r, ended).c_str(), cell(a, ha, unmeasured_a, va).c_str(),
                    cell(b, hb, unmeasured_b, vb).c_str(), comparable ? fmt_change(r.unit, va, vb).c_str() : "");
    }
    if (!a || !b) return;
    // Every site live at the peak, and at the end, when the input was a log; the top ones of a
    // report JSON.
    const process_report &pa = ra.proc(*a), &pb = rb.proc(*b);
    auto all_or_top = [](const std::vector<site_row>& all, const std::vector<site_row>& top_rows) -> const std::vector<site_row>& {
        return all.empty() ? top_rows : all;
    };
    print_sites("call sites at the peak of requested memory", pa, all_or_top(da.peak_sites, da.top_sites),
                da.requested.peak, pb, all_or_top(db.peak_sites, db.top_sites), db.requested.peak, top);
    print_sites(ended ? "leaks by call site" : "live at log end by call site", pa, all_or_top(da.end_sites, da.leak_sites),
                da.leaked_bytes, pb, all_or_top(db.end_sites, db.leak_sites), db.leaked_bytes, top);
    std::vector<change> changes;
    usage_changes(da.by_api, db.by_api, "api", changes);
    usage_changes(da.by_kind, db.by_kind, "kind", changes);
    size_class_changes(da.alloc_sizes, db.alloc_sizes, changes);
    leak_changes(da.by_api, db.by_api, ended, changes);
    std::stable_sort(changes.begin(), changes.end(),
                     [](const change& x, const change& y) { return std::fabs(x.delta_bytes) > std::fabs(y.delta_bytes); });
    if (changes.empty()) {
        std::printf("  no change by API, kind, size class or leak\n");
        return;
    }
    std::printf("  top changes (by bytes)\n");
    for (size_t i = 0; i < changes.size() && i < top; ++i)
        std::printf("    %s%s  [%s%s; %s]\n", changes[i].delta_bytes >= 0 ? "+ " : "- ", changes[i].what.c_str(),
                    changes[i].delta_bytes >= 0 ? "+" : "-", fmt_bytes(clamp_to_u64(std::fabs(changes[i].delta_bytes))).c_str(),
                    changes[i].detail.c_str());
    if (changes.size() > top) std::printf("    ... %zu more (--top N)\n", changes.size() - top);
}

struct diff_args {
    std::vector<std::string> inputs;
    size_t top = 8;
    progress_flags progress;
};

std::string side_name(const std::vector<std::string>& paths) {
    if (paths.size() == 1) return paths[0];
    return paths[0] + " and " + std::to_string(paths.size() - 1) + " more";
}

int run_diff(diff_args& args, const std::vector<std::string>& tail, bool dashdash) {
    // diff BASE... -- NEW...; without --, the first input is A and the rest B (one baseline report
    // against the logs of every rank, as the guide's CI step writes it).
    std::vector<std::string> side_a, side_b;
    if (dashdash) {
        side_a = args.inputs;
        side_b = tail;
    } else if (!args.inputs.empty()) {
        side_a.push_back(args.inputs[0]);
        side_b.assign(args.inputs.begin() + 1, args.inputs.end());
    }
    // `--` parts the two sides; a second one is no input name (A -- B1 -- B2 means three sides).
    if (std::find(side_b.begin(), side_b.end(), "--") != side_b.end())
        return usage_error("diff", "a second --: diff compares two runs, A1 A2... -- B1 B2...");
    // With -- given, a side left empty is said as such: `diff -- A B` (an unset $BASELINES before
    // --) or `diff A B --` gave two runs and was told "needs two runs".
    if (dashdash && side_a.empty() != side_b.empty())
        return usage_error("diff", std::string("needs two runs: nothing ") + (side_a.empty() ? "before" : "after") +
                                       " -- (A1 A2... -- B1 B2...: A's inputs, then --, then B's)");
    if (side_a.empty() || side_b.empty())
        return usage_error("diff", with_stdin_hint("needs two runs: A B, A B1 B2..., or A1 A2... -- B1 B2..."));
    {
        std::vector<std::string*> all;
        for (auto* side : {&side_a, &side_b})
            for (std::string& p : *side) all.push_back(&p);
        if (std::string err; !dash_means_stdin(all, err)) return usage_error("diff", err);
    }
    // Within a side only: a file on both sides is a run compared with itself.
    drop_repeated_inputs(side_a);
    drop_repeated_inputs(side_b);
    run_input ra, rb;
    std::string error;
    pipe_spools spools;  // a side's pipes, compared with its files and read from here
    if (!drop_copies_of_one_log(side_a, spools, args.progress, error) ||
        !drop_copies_of_one_log(side_b, spools, args.progress, error)) {
        spdlog::error("{}", error);
        return k_exit_input;
    }
    if (!load_run(side_a, ra, error, args.progress, "diff") || !load_run(side_b, rb, error, args.progress, "diff")) {
        spdlog::error("{}", error);
        return k_exit_input;
    }
    if (size_t of = 0, not_of = 0; !dashdash && mixes_job_of(rb, ra, of, not_of)) {
        // A glob for A (diff main/*.jsonl mr/*.jsonl) left A its first log and gave B the rest:
        // B's table would pair the main branch's other ranks with nothing, as new GPUs.
        spdlog::error("{}", mixed_job_error(rb, ra, of, not_of, "A's run", "A's") +
                            ": without --, A is the first input alone and every other input is B "
                            "(a glob for A, diff main/*.jsonl mr/*.jsonl, gives B all of A's logs but the first); "
                            "give several inputs per side as A1 A2 ... -- B1 B2 ...");
        return k_exit_input;
    }
    std::printf("gpumem diff\n  A = %s (%zu process%s)\n  B = %s (%zu process%s)\n", visible(side_name(side_a)).c_str(),
                ra.processes.size(), ra.processes.size() == 1 ? "" : "es", visible(side_name(side_b)).c_str(), rb.processes.size(),
                rb.processes.size() == 1 ? "" : "es");
    std::map<std::string, std::pair<const device_ref*, const device_ref*>> keys;
    for (const device_ref& r : ra.devices) keys[r.key].first = &r;
    for (const device_ref& r : rb.devices) keys[r.key].second = &r;
    if (keys.empty()) std::printf("\nno GPU memory activity in either run\n");
    for (const auto& [key, ab] : keys) print_device(ra, ab.first, rb, ab.second, args.top);
    std::fflush(stdout);
    return k_exit_ok;
}

}  // namespace

command add_diff(CLI::App& top) {
    auto a = std::make_shared<diff_args>();
    CLI::App* app = top.add_subcommand("diff", "compare two runs per process and GPU: peaks, counts, biggest changes");
    app->footer(
        "usage: gpumem diff A B            two runs, each a log or a `gpumem report --json` file\n"
        "       gpumem diff A B1 B2 ...    one run (a report of all ranks) against several logs\n"
        "       gpumem diff A1 A2 ... -- B1 B2 ...   several inputs on each side\n"
        "GPUs are matched by rank and device ordinal, as `gpumem check` matches them.  Prints peaks,\n"
        "fragmentation and counts side by side; when the logs have call stacks, the call sites that grew\n"
        "or shrank at the peak and in leaks (matched by their frames); then the largest changes by API,\n"
        "by allocation size class and in leaks.\n"
        "\n"
        "exit codes: 0 compared (whatever the differences); 2 unusable input or arguments (also, without\n"
        "--, logs of A's run among B's, as a glob for A leaves them: give A1 A2 ... -- B1 B2 ...).");
    app->add_option("INPUT", a->inputs, "logs or report JSON files; - reads standard input (one input)");
    add_count_option(app, "--top", [a](uint64_t v) { a->top = size_t(v); }, "how many changes to list per GPU", 1, 100000)
        ->default_str("8");
    add_progress_flags(app, a->progress);
    command c;
    c.app = app;
    c.run = [a](const std::vector<std::string>& tail, bool dashdash) { return run_diff(*a, tail, dashdash); };
    return c;
}

}  // namespace gpumem::analysis
