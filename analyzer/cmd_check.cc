// `gpumem check`: the CI gate.  Holds each GPU of each process to absolute limits and/or to a
// baseline run, prints every broken limit with the worst moment, and can write JUnit XML.  Works on
// the report model (logs analyzed, or report JSON read back); what it measures is report_measures.h.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
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
#include "output_file.h"
#include "report_measures.h"
#include "views/report_sites.h"

namespace gpumem::analysis {

namespace {

std::string fmt_value(const measure& m, double v) {
    if (m.unit == measure_unit::count) return std::to_string(clamp_to_u64(v));
    return m.unit == measure_unit::ratio ? fmt_pct(v) : fmt_bytes(clamp_to_u64(v));  // v may be 2^64: out of range
}

// "at 1.23 s (seq 4567)"; for leaks the largest leaked block's allocation, for OOMs the first (and
// the line that asked, when the log recorded its stack).
std::string worst_moment(const measure& m, const process_report& proc, const device_report& dev) {
    if (m.t_ns != device_field::count) {
        // Fragmentation with the free bytes it is of: a maximum on 1 KiB free is no real trouble.
        const bool frag = m.value == device_field::max_external_fragmentation && dev.max_external_fragmentation_free;
        return std::string(frag ? "of " + fmt_bytes(dev.max_external_fragmentation_free) + " free " : "") + "at " +
               fmt_at(uint64_t(field_value(dev, m.t_ns)), uint64_t(field_value(dev, m.seq)));
    }
    if (m.value == device_field::n_oom && !dev.ooms.empty()) {
        const oom_report& o = dev.ooms[0];
        const std::string asked = asked_by_name(proc, o.stack);
        return "first: " + fmt_bytes(o.size) + " from " + o.api + " at " + fmt_at(o.t, o.seq) + ", " + o.verdict + o.verdict_caveat() + (asked.empty() ? "" : ", asked for by " + asked);
    }
    if (m.value != device_field::leaked_bytes || dev.leaks.empty()) return "";
    const block_view& l = dev.leaks[0];
    return "largest: " + fmt_bytes(l.size) + " from " + l.api + " at " + fmt_at(l.t, l.seq);
}

// A log whose recorder lost events has approximate totals (a lost allocation lowers a peak, a lost
// free raises one): every result on it says so where CI shows it, in the line and the JUnit message,
// not only in a warning on stderr that a passing job hides.
std::string lost_note(const process_report& p, const char* whose) {
    const uint64_t n = p.lost;  // the end line's count included (metrics/totals.h)
    if (!n) return "";
    return std::string("; ") + whose + fmt_counted(n, "event was", "events were") + " lost by the recorder: approximate";
}

// The same for a log with no end line (killed, or still running): its peaks are those it reached
// before it stopped, which a later part of the run might have passed.  Said on each result as the
// lost events are, since a job that was killed can still pass its limits.
std::string unended_note(const process_report& p, const char* whose) {
    if (p.has_end) return "";
    return std::string("; ") + whose + "the log has " + k_no_end_line + ": values up to where it stops";
}

struct outcome {
    std::string name;       // testcase name: "max-peak (requested)", "baseline peak reserved"
    std::string where;      // device_ref::where
    std::string key;        // device_ref::key, "rank 0 dev 0": junit_classes names it
    bool passed = true;
    std::string message;    // "1.93 MiB > limit 1.00 MiB (--max-peak); at ..."
    bool approximate = false;  // on a log (or baseline) whose recorder lost events: lost_note
    bool incomplete = false;   // on a log (or baseline) with no end line: unended_note
    bool unmeasured = false;   // fragmentation on a GPU without gpumem pool segments: passes, said as such
};

// Fragmentation is of free space in gpumem's pool segments (docs/metrics.md): a GPU that never had
// one (recorded with --pool off, or a device without virtual memory, which gets no pool) reads 0,
// which is no measurement.  diff and the reports say "not measured"; so does each result line here.
bool frag_unmeasured(const measure& m, const run_input& run, const device_ref& r) {
    return m.value == device_field::max_external_fragmentation && run.has(r, device_field::peak_segments) &&
           run.dev(r).segment_count.peak == 0;
}
constexpr const char* k_not_measured = "not measured (no gpumem pool segments on this GPU)";

// A ratio as the report JSON keeps it (6 decimals): a log and its own report JSON, or a run and a
// baseline JSON of the same run, must compare equal under --tolerance 0 (they read 9.4% > 9.4%).
double at_json_precision(const measure& m, double v) {
    return m.unit == measure_unit::ratio ? std::round(v * 1e6) / 1e6 : v;
}

// A value and its limit that print alike but differ ("198.45 MiB > limit 198.45 MiB", "54.2% >
// baseline 54.2% + 0 points = 54.2%") name no difference, and a failed gate must: then the line
// gives its values exactly, as they were compared: bytes in full ("208,092,672 B"), a ratio to the
// 6 decimals of the report JSON ("54.1667%"), or more where a limit was given with more.  Counts
// always print exactly.
std::string fmt_exact(const measure& m, double v) {
    if (m.unit == measure_unit::bytes) return fmt_count(clamp_to_u64(v)) + " B";  // floor: as compared with whole bytes
    if (m.unit != measure_unit::ratio) return fmt_value(m, v);
    char b[40];
    std::snprintf(b, sizeof b, std::fabs(at_json_precision(m, v) - v) < 1e-12 ? "%.4f%%" : "%.10g%%", v * 100);
    return b;
}
// The format for a line whose compared values are `a` and `b`.
using value_format = std::string (*)(const measure&, double);
value_format formatter(const measure& m, double a, double b) {
    const bool alike = fmt_value(m, a) == fmt_value(m, b) && fmt_exact(m, a) != fmt_exact(m, b);
    return alike ? fmt_exact : fmt_value;
}

// "rank 0#2 dev 1" -> "gpumem.rank_0_2.dev_1": CI viewers group test cases by the dotted parts.
std::string junit_class(const std::string& key) {
    std::string k = key;
    size_t d = k.rfind(" dev ");
    if (d != std::string::npos) k.replace(d, 1, ".");
    std::string c = "gpumem.";
    for (char ch : visible(k))
        if (ch != '"') c += (ch == ' ' || ch == '#') ? '_' : ch;  // a quoted rank's quotes: not in a class name
    return c;
}

// Each device's JUnit class name, one per key: two keys that junit_class spells alike (ranks
// "0#2" and "0_2") get "_2", "_3" after the second's, or a CI viewer would merge their cases.
std::map<std::string, std::string> junit_classes(const std::vector<outcome>& results) {
    std::map<std::string, std::string> by_key;
    std::map<std::string, std::string> taken;  // class name -> key
    for (const outcome& r : results) {
        if (by_key.count(r.key)) continue;
        std::string c = junit_class(r.key);
        for (int n = 2; taken.count(c); ++n) c = junit_class(r.key) + "_" + std::to_string(n);
        taken[c] = r.key;
        by_key[r.key] = c;
    }
    return by_key;
}

// XML 1.0 allows no control characters but tab, newline and carriage return, not even as character
// references; a rank or file name can hold any byte, so they are shown as the text report shows
// them ("^[" for ESC: format_util.h visible), newlines included.
// U+FFFE and U+FFFF are valid UTF-8 but no XML characters (a parser refuses the whole file):
// written as U+FFFD, the replacement character.
std::string xml_text(const std::string& s) {
    std::string t = html_escape(visible(s));
    for (size_t i = 0; (i = t.find("\xEF\xBF", i)) != std::string::npos; i += 3)
        if (i + 2 < t.size() && (t[i + 2] == '\xBE' || t[i + 2] == '\xBF')) t[i + 2] = '\xBD';
    return t;
}

bool write_junit(const std::string& path, const std::vector<outcome>& results) {
    return write_whole(path, "--junit", [&](std::ostream& f) {
        size_t failures = 0;
        for (const outcome& r : results) failures += !r.passed;
        const std::map<std::string, std::string> classes = junit_classes(results);
        f << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
          << "<testsuites tests=\"" << results.size() << "\" failures=\"" << failures << "\">\n"
          << "  <testsuite name=\"gpumem check\" tests=\"" << results.size() << "\" failures=\"" << failures << "\">\n";
        for (const outcome& r : results) {
            f << "    <testcase classname=\"" << xml_text(classes.at(r.key)) << "\" name=\"" << xml_text(r.name) << "\"";
            if (r.passed && !r.approximate && !r.incomplete && !r.unmeasured) {
                f << "/>\n";
                continue;
            }
            if (r.passed) {  // shown by CI viewers beside the passing case
                f << ">\n      <system-out>" << xml_text(r.where + ": " + r.message) << "</system-out>\n    </testcase>\n";
                continue;
            }
            f << ">\n      <failure message=\"" << xml_text(r.message) << "\">" << xml_text(r.where + ": " + r.message)
              << "</failure>\n    </testcase>\n";
        }
        f << "  </testsuite>\n</testsuites>\n";
    });
}

struct limit {
    const char* flag;   // "--max-peak"
    const measure* m;
    std::string name;   // testcase name: "max-peak (requested)"
    bool set = false;
    double value = 0;
    std::string text;   // as written, for messages
};

constexpr size_t k_limits = 5;  // --max-peak, --max-reserved, --max-fragmentation, --max-leak, --max-ooms

struct check_args {
    std::string limit_text[k_limits];  // as written, in the order of run_check's limits
    CLI::Option* limit_opt[k_limits] = {};
    std::string metric = "requested";
    CLI::Option* metric_opt = nullptr;
    CLI::Option* tolerance_opt = nullptr;
    std::string baseline_path, junit_path, tolerance_text = "5%";
    bool quiet = false;
    progress_flags progress;
    std::vector<std::string> logs;
};

// Every device the limits look at must carry every member they read: a report JSON written by
// another tool or edited by hand may lack one, and reading it as 0 would pass any limit.
// Each member is said once per device, though a limit and the baseline both need it (--max-peak
// and the baseline's peak requested printed the same line twice).
bool members_present(const run_input& run, const std::vector<const measure*>& needed, const char* role) {
    bool ok = true;
    for (const device_ref& r : run.devices)
        for (size_t i = 0; i < needed.size(); ++i)
            if (const measure* m = needed[i];
                !run.has(r, m->value) &&
                std::none_of(needed.begin(), needed.begin() + std::ptrdiff_t(i), [&](const measure* e) { return e->value == m->value; })) {
                spdlog::error("{}", role + run.missing_at(r, m->value) + ": " + r.where + " " + run.why_missing(r, m->value) +
                                    ", which " + m->title + " needs");
                ok = false;
            }
    return ok;
}

// A device compared with a baseline recorded on another GPU (a CI runner that changed model, or
// memory size: another SKU, a MIG slice) passed or failed with no word of it, though allocator
// rounding, cuDNN workspaces and the pool's segments all follow the GPU.  Said, naming both
// (other_gpu, as diff says it); the limits still decide the exit code.
void warn_if_other_gpu(const run_input& run, const device_ref& r, const run_input& base, const device_ref& b) {
    const std::string other = other_gpu(run, r, base, b, "the baseline", "here", "in the baseline (" + b.where + ")");
    if (!other.empty())
        spdlog::warn("{}", r.where + " " + other + " (record the baseline on the GPU the check runs on)");
}

// A run whose every process is in the baseline, by the identity the copies rule names a process
// by (same_process: host, pid, start and rank), is compared with itself: the report
// JSON made from its own logs, a different file, which the refusal of a baseline that is the run
// does not catch (a CI job that regenerates the baseline from the run it then checks).  Said, not
// refused: a self-check on purpose (scripts/gpu-e2e-run.sh's check-own-baseline) stays exit 0.
void warn_if_own_baseline(const run_input& run, const run_input& base, const std::string& baseline_path) {
    auto same = [](const process_report& a, const process_report& b) { return same_process(identity_of(a), identity_of(b)); };
    if (run.processes.empty()) return;  // nothing compared: no claim to make
    size_t matched_in_base = 0;
    for (const process_report& b : base.processes)
        matched_in_base += std::any_of(run.processes.begin(), run.processes.end(),
                                       [&](const process_report& r) { return same(r, b); });
    for (const process_report& r : run.processes)
        if (std::none_of(base.processes.begin(), base.processes.end(), [&](const process_report& b) { return same(r, b); }))
            return;
    // Processes of the baseline that the run lacks still fail as missing GPUs: said, so the
    // warning claims no more than is so.
    const size_t others = base.processes.size() - matched_in_base;
    spdlog::warn("{}", "every process of this run is in the --baseline " + baseline_path +
                       " (the same host, pid, start time and rank: a report of this run's own logs?): the run "
                       "is being compared with itself, so the check against the baseline cannot fail" +
                       (others ? " (but for the baseline's " + fmt_counted(others, "process", "processes") +
                                     " missing from the run)"
                               : std::string()) +
                       "; give the baseline of another run (gpumem report --json of the main branch's logs)");
}

int run_check(check_args& args, const std::vector<std::string>& tail) {
    if (args.metric_opt->count() && !args.limit_opt[0]->count())
        return usage_error("check", "--metric says what --max-peak limits; give --max-peak too");
    const measure* peak = peak_measure(args.metric);
    if (!peak) return usage_error("check", "--metric " + args.metric + ": expected requested, allocated or reserved");
    limit limits[k_limits] = {{"--max-peak", peak, std::string("max-peak (") + args.metric + ")", false, 0, ""},
                      {"--max-reserved", &k_peak_reserved, "max-reserved", false, 0, ""},
                      {"--max-fragmentation", &k_max_fragmentation, "max-fragmentation", false, 0, ""},
                      {"--max-leak", &k_leaked, "max-leak", false, 0, ""},
                      {"--max-ooms", &k_ooms, "max-ooms", false, 0, ""}};
    for (size_t i = 0; i < k_limits; ++i) {
        limit& l = limits[i];
        const std::string& v = args.limit_text[i];
        if (args.limit_opt[i]->count() == 0) continue;
        if (l.m->unit == measure_unit::count) {
            if (!parse_number_arg(v, l.value) || l.value > 1e18 || l.value != std::floor(l.value))
                return usage_error("check", std::string(l.flag) + " " + v + ": expected a whole number such as 0");
        } else if (l.m->unit == measure_unit::ratio) {
            if (!parse_ratio_arg(v, l.value))
                return usage_error("check", std::string(l.flag) + " " + v + ": expected a ratio such as 0.3 or 30%");
        } else {
            uint64_t n = 0;
            if (!parse_size_arg(v, n))
                return usage_error("check", std::string(l.flag) + " " + v + ": expected a size such as 4096, 500MB or 1.5GiB");
            l.value = double(n);
        }
        l.set = true;
        l.text = v;
    }
    std::string& baseline_path = args.baseline_path;
    double tolerance = 0.05;
    std::string tolerance_text = args.tolerance_text;
    if (!parse_percent_arg(tolerance_text, tolerance))
        return usage_error("check", "--tolerance " + tolerance_text + ": expected a percentage such as 5% or 0.5%");
    // A bare number is a percentage here but a ratio for --max-fragmentation (0.3 = 30%), so 0.05
    // may be meant as 5%.  Its meaning stays (CI scripts rely on it); the reading is said.
    if (tolerance_text.back() != '%' && tolerance > 0 && tolerance < 0.01) {
        char as_ratio[32];
        std::snprintf(as_ratio, sizeof as_ratio, "%g", tolerance * 10000);  // 0.05 read as a ratio: 5
        spdlog::warn("--tolerance {} means {}%; for {}% write {} or {}%", tolerance_text, tolerance_text, as_ratio,
                     as_ratio, as_ratio);
    }
    // Shown as "5%" in each result (and "5 points"), however it was spaced ("5 %").
    tolerance_text.erase(std::remove_if(tolerance_text.begin(), tolerance_text.end(),
                                        [](char c) { return c == ' ' || c == '\t'; }),
                         tolerance_text.end());
    if (tolerance_text.back() != '%') tolerance_text += "%";
    std::vector<std::string> logs = args.logs;
    logs.insert(logs.end(), tail.begin(), tail.end());
    if (logs.empty()) {
        // `check --junit LOG`: the run's one log was taken as the JUnit file; that is what to say.
        const std::vector<std::string> given = baseline_path.empty() ? logs : std::vector<std::string>{baseline_path};
        if (std::string why; output_would_clobber(args.junit_path, "--junit", given, why)) return usage_error("check", why);
        return usage_error("check", with_stdin_hint("no log file given"));
    }
    {
        std::vector<std::string*> all;
        for (std::string& l : logs) all.push_back(&l);
        if (!baseline_path.empty()) all.push_back(&baseline_path);
        if (std::string err; !dash_means_stdin(all, err)) return usage_error("check", err);
    }
    drop_repeated_inputs(logs);
    pipe_spools spools;  // pipes, compared with the other inputs and read from here
    std::vector<std::string> inputs = logs;  // each compared with the baseline: a lone pipe too
    if (!baseline_path.empty()) inputs.push_back(baseline_path);
    if (std::string err; (inputs.size() > 1 && !spools.add(inputs, args.progress.wanted(), args.progress.every_s, err)) ||
                         !drop_copies_of_one_log(logs, spools, args.progress, err)) {
        spdlog::error("{}", err);
        return k_exit_input;
    }
    // The baseline among the logs, under any name (a glob that matches it too, a link to it, a copy
    // of its bytes, a copy of the same log) would be checked against itself and pass, and take the
    // run's rank key from the run it stands for: left out of the runs, and said.  When every log is
    // the baseline, the run would be compared with itself: a CI gate that cannot fail (a script that
    // names the wrong file) is refused, not passed.
    if (!baseline_path.empty()) {
        std::vector<std::string> others;
        std::vector<std::string> said;  // per log left out: how it is the baseline
        bool cut_copy = false;          // a log and the baseline are copies of one log, not one file's bytes
        for (std::string& p : logs) {
            std::string process;
            const input_sameness how = same_input(p, baseline_path, process);
            if (how == input_sameness::none) {
                others.push_back(std::move(p));
                continue;
            }
            const std::string base = "the --baseline " + baseline_path;
            said.push_back(how == input_sameness::same_file ? p + (p == baseline_path ? " is the --baseline" : " is the same file as " + base)
                           : how == input_sameness::same_bytes ? p + " is a copy of " + base + " (the same bytes)"
                                                                : p + " and " + base + " are copies of " + process);
            cut_copy |= how == input_sameness::one_log;
        }
        if (others.empty()) {
            std::string all;
            for (const std::string& s : said) all += (all.empty() ? "" : "; ") + s;
            // Against a cut copy the run meets its own beginning: that can fail, but says nothing
            // of a change.
            spdlog::error("{}", all + ": the run would be compared with itself" +
                                (cut_copy ? "" : " and pass whatever it holds") +
                                "; give the baseline of another run (gpumem report --json of the main branch's logs)");
            return k_exit_input;
        }
        for (const std::string& s : said) spdlog::warn("{}", s + ": left out of the runs checked");
        logs = std::move(others);
    }
    // The --max-* limits are absolute: a tolerance given for them would silently do nothing.
    if (args.tolerance_opt->count() && baseline_path.empty())
        spdlog::warn("--tolerance {} applies to --baseline only; the --max-* limits are not stretched by it",
                     args.tolerance_text);
    bool any_absolute = false;
    for (const limit& l : limits) any_absolute |= l.set;
    const bool any_limit = any_absolute || !baseline_path.empty();
    if (!any_limit) return usage_error("check", "nothing to check: give a --max-* limit or --baseline");
    inputs = logs;
    if (!baseline_path.empty()) inputs.push_back(baseline_path);
    if (std::string why; output_would_clobber(args.junit_path, "--junit", inputs, why)) return usage_error("check", why);

    run_input run;
    std::string error;
    if (!load_run(logs, run, error, args.progress, "check")) {
        spdlog::error("{}", error);
        return k_exit_input;
    }
    run_input base;
    if (!baseline_path.empty() && !load_run({baseline_path}, base, error, args.progress, "check --baseline")) {
        spdlog::error("baseline: {}", error);
        return k_exit_input;
    }
    if (run.devices.empty()) {
        // Nothing was recorded on any GPU: a gate that passes on it would hide a broken recording.
        spdlog::error("no GPU memory activity in {}", logs.size() == 1 ? logs[0] : std::string("the logs"));
        return k_exit_input;
    }
    if (!baseline_path.empty() && base.devices.empty()) {
        // The same rule for the baseline: with no GPU in it there is nothing to compare against,
        // and every baseline limit would silently vanish (0 limits, exit 0).
        spdlog::error("baseline {}: no GPU memory activity to compare against", baseline_path);
        return k_exit_input;
    }
    if (size_t of = 0, not_of = 0; !baseline_path.empty() && mixes_job_of(run, base, of, not_of)) {
        // The main branch's other ranks would be checked as this run's, with only the --max-*
        // limits, and stand in for its own missing ones: a gate that passes what it should fail.
        spdlog::error("{}", mixed_job_error(run, base, of, not_of, "the --baseline's run", "the baseline's") +
                            ": --baseline takes one file, and the logs after it are the run "
                            "checked (a glob, --baseline main/*.jsonl, leaves all but the first there); give the "
                            "baseline as one report JSON of all its logs (gpumem report --json main/*.jsonl > "
                            "baseline.json)");
        return k_exit_input;
    }
    if (!baseline_path.empty()) warn_if_own_baseline(run, base, baseline_path);
    std::vector<const measure*> needed;
    for (const limit& l : limits)
        if (l.set) needed.push_back(l.m);
    if (!baseline_path.empty()) needed.insert(needed.end(), std::begin(k_baseline_measures), std::end(k_baseline_measures));
    bool usable = members_present(run, needed, "");
    if (!baseline_path.empty())
        usable &= members_present(base, {std::begin(k_baseline_measures), std::end(k_baseline_measures)}, "baseline ");
    if (!usable) return k_exit_input;

    std::vector<outcome> results;
    // The GPUs some --max-* limit really checks: one that cannot fail there (--max-fragmentation on
    // a GPU without pool segments) checks nothing, so a GPU the baseline lacks is not held by it.
    std::set<std::string> held_by_limit;
    for (const device_ref& r : run.devices) {
        const device_report& dev = run.dev(r);
        for (const limit& l : limits) {
            if (!l.set) continue;
            outcome o;
            o.name = l.name;
            o.where = r.where;
            o.key = r.key;
            double measured = measure_value(dev, *l.m);
            o.passed = at_json_precision(*l.m, measured) <= l.value;
            // A device without gpumem pool segments reads 0 fragmentation: no measurement, said.
            o.unmeasured = frag_unmeasured(*l.m, run, r);
            if (o.unmeasured)
                spdlog::warn("{}: --max-fragmentation: no gpumem pool segments on this device (recorded with the pool "
                             "off, or a device without virtual memory?): its fragmentation is not measured, so the "
                             "limit cannot fail",
                             r.where);
            o.passed |= o.unmeasured;  // 0 in any analysis; a report edited by hand is no measurement either
            if (!o.unmeasured) held_by_limit.insert(r.key);
            const auto fmt = formatter(*l.m, at_json_precision(*l.m, measured), l.value);
            o.message = o.unmeasured ? measure_title(*l.m, true) + " " + k_not_measured + ": " + l.flag + " " + l.text +
                                           " cannot fail here"
                                     : measure_title(*l.m, run.proc(r).has_end) + " " + fmt(*l.m, at_json_precision(*l.m, measured)) +
                                           (o.passed ? " <= " : " > ") + "limit " + fmt(*l.m, l.value) + " (" +
                                           l.flag + " " + l.text + ")";
            if (!o.passed) {
                std::string w = worst_moment(*l.m, run.proc(r), dev);
                if (!w.empty()) o.message += "; " + w;
            }
            const std::string note = lost_note(run.proc(r), ""), cut = unended_note(run.proc(r), "");
            o.message += note + cut;
            o.approximate = !note.empty();
            o.incomplete = !cut.empty();
            results.push_back(std::move(o));
        }
    }
    if (!baseline_path.empty()) {
        std::map<std::string, const device_ref*> base_by_key;
        for (const device_ref& b : base.devices) base_by_key[b.key] = &b;
        for (const device_ref& r : run.devices) {
            auto it = base_by_key.find(r.key);
            if (it == base_by_key.end()) {
                if (held_by_limit.count(r.key)) {
                    spdlog::warn("{} is not in the baseline; only absolute limits apply to it", r.where);
                    continue;
                }
                // With no --max-* limit that can fail on it nothing would check this GPU (a rank the
                // baseline run did not have, a data-loader worker that now touches CUDA), yet the
                // total counted it among the GPUs checked and passed: the job changed shape, as for
                // a missing one.  So too where the only limits given cannot fail there
                // (--max-fragmentation on a GPU without gpumem pool segments).
                outcome o;
                o.name = "baseline device present";
                o.where = r.where;
                o.key = r.key;
                o.passed = false;
                o.message = any_absolute
                                ? "not in the baseline, and no --max-* limit given can fail on it (fragmentation is not "
                                  "measured without gpumem pool segments): nothing checks this GPU (record the baseline "
                                  "from a run of this shape, or give another --max-* limit)"
                                : "not in the baseline, and no --max-* limit is given: nothing checks this GPU (record the "
                                  "baseline from a run of this shape, or give a --max-* limit)";
                results.push_back(std::move(o));
                continue;
            }
            const device_report& dev = run.dev(r);
            const device_ref* bref = it->second;
            const device_report& bdev = base.dev(*bref);
            base_by_key.erase(it);
            warn_if_other_gpu(run, r, base, *bref);
            for (const measure* m : k_baseline_measures) {
                outcome o;
                o.name = std::string("baseline ") + m->title;
                o.where = r.where;
                o.key = r.key;
                double measured = measure_value(dev, *m);
                double was = measure_value(bdev, *m);
                // Bytes may grow by the tolerance as a fraction; a ratio by the tolerance in points
                // (a relative tolerance on a baseline fragmentation of 0 would allow nothing).
                bool ratio = m->unit == measure_unit::ratio;
                double allowed = ratio ? was + tolerance : was * (1 + tolerance);
                if (m->unit == measure_unit::count) allowed = std::floor(allowed + 1e-9);  // whole OOMs, as printed
                // Without pool segments on either side the value is no measurement: said, not shown
                // as 0.0%.  The run's passes (nothing to compare); against a baseline without any,
                // the run's fragmentation is held to the tolerance alone, as before.
                o.unmeasured = frag_unmeasured(*m, run, r);
                const bool base_unmeasured = frag_unmeasured(*m, base, *bref);
                // A run without pool segments (--pool off) passes any baseline; said, as for
                // --max-fragmentation, where the baseline measured some.
                if (o.unmeasured && base.has(*bref, device_field::peak_segments) && !base_unmeasured)
                    spdlog::warn("{}: baseline max external fragmentation: no gpumem pool segments on this device "
                                 "(recorded with the pool off, or a device without virtual memory?), where the "
                                 "baseline had some: its fragmentation is not measured, so this limit cannot fail",
                                 r.where);
                o.passed = at_json_precision(*m, measured) <= at_json_precision(*m, allowed) + 1e-9;
                const std::string stretch =
                    " + " + (ratio ? tolerance_text.substr(0, tolerance_text.size() - 1) + " points" : tolerance_text);
                o.passed |= o.unmeasured;
                const auto fmt = formatter(*m, at_json_precision(*m, measured), at_json_precision(*m, allowed));
                if (o.unmeasured)
                    o.message = measure_title(*m, true) + " " + k_not_measured + ": not compared with the baseline's " +
                                (base_unmeasured ? std::string("(not measured either)") : fmt_value(*m, was));
                else
                    o.message = measure_title(*m, run.proc(r).has_end) + " " + fmt(*m, at_json_precision(*m, measured)) +
                                (o.passed ? " <= " : " > ") + "baseline " +
                                (base_unmeasured ? std::string("not measured (no gpumem pool segments there)")
                                                 : fmt(*m, at_json_precision(*m, was))) +
                                stretch + " = " + fmt(*m, at_json_precision(*m, allowed));
                if (!o.passed) {
                    std::string w = worst_moment(*m, run.proc(r), dev);
                    if (!w.empty()) o.message += "; " + w;
                }
                const std::string notes = lost_note(run.proc(r), "") + lost_note(base.proc(*bref), "in the baseline, ");
                const std::string cuts = unended_note(run.proc(r), "") + unended_note(base.proc(*bref), "in the baseline, ");
                o.message += notes + cuts;
                o.approximate = !notes.empty();
                o.incomplete = !cuts.empty();
                results.push_back(std::move(o));
            }
        }
        // A rank or GPU that the baseline had and this run lacks: the job changed shape, which a
        // gate must not wave through.
        for (const auto& [key, b] : base_by_key) {
            outcome o;
            o.name = "baseline device present";
            o.where = visible(key);
            o.key = key;
            o.passed = false;
            o.message = "in the baseline (" + b->where + ") but not in this run";
            results.push_back(std::move(o));
        }
    }

    size_t failed = 0, approximate = 0, incomplete = 0;
    for (const outcome& o : results) failed += !o.passed, approximate += o.approximate, incomplete += o.incomplete;
    std::printf("gpumem check: %zu limit%s on %zu GPU%s of %zu process%s: %zu broken%s%s\n", results.size(),
                results.size() == 1 ? "" : "s", run.devices.size(), run.devices.size() == 1 ? "" : "s",
                run.processes.size(), run.processes.size() == 1 ? "" : "es", failed,
                approximate ? (", " + std::to_string(approximate) + " on logs that lost events (approximate)").c_str() : "",
                incomplete ? (", " + std::to_string(incomplete) + " on logs with no end line (incomplete)").c_str() : "");
    for (const outcome& o : results)
        if (!o.passed) std::printf("  FAIL %s: %s\n", o.where.c_str(), o.message.c_str());
    if (!args.quiet)
        for (const outcome& o : results)
            if (o.passed) std::printf("  ok   %s: %s\n", o.where.c_str(), o.message.c_str());
    std::fflush(stdout);
    if (!args.junit_path.empty() && !write_junit(args.junit_path, results)) return k_exit_input;
    return failed ? k_exit_regression : k_exit_ok;
}

}  // namespace

command add_check(CLI::App& top) {
    auto a = std::make_shared<check_args>();
    CLI::App* app = top.add_subcommand("check", "the CI gate: hold every GPU of every process to limits or a baseline");
    app->footer(
        "Holds every GPU of every process in the logs (or `gpumem report --json` files) to limits;\n"
        "give at least one limit or --baseline.  Against a baseline, peak requested, allocated and\n"
        "reserved and leaked bytes and OOMs may grow by the tolerance (OOMs in whole ones: none over a\n"
        "baseline of 0), fragmentation by the tolerance in points.\n"
        "METRIC (docs/metrics.md): requested = what the program asked for and has not freed, PyTorch's\n"
        "torch.cuda.max_memory_allocated(); allocated = the pool blocks holding it, with the pool's\n"
        "rounding; reserved = held from the driver, PyTorch's max_memory_reserved().\n"
        "SIZE: 4096, 500MB, 1.5GiB, 4 KiB (K/M/G/T = KiB/MiB/GiB/TiB; KB/MB/GB/TB are powers of 1000).\n"
        "\n"
        "exit codes: 0 every limit holds; 1 a limit is broken; 2 unusable input or arguments (also an\n"
        "input that lacks a member a limit needs, a --baseline that is the run itself: the same\n"
        "file or a copy of its logs, a gate that could not fail, and logs of the baseline's run among\n"
        "another run's, as a glob --baseline main/*.jsonl leaves them).");
    app->add_option("LOG", a->logs, "event logs or `gpumem report --json` files; - reads standard input");
    a->limit_opt[0] = app->add_option("--max-peak", a->limit_text[0], "peak bytes of --metric")->type_name("SIZE");
    a->metric_opt = app->add_option("--metric", a->metric, "what --max-peak limits: requested, allocated or reserved")
        ->type_name("METRIC")
        ->default_str("requested");
    a->limit_opt[1] = app->add_option("--max-reserved", a->limit_text[1], "peak reserved bytes (segments + unpooled allocations)")
        ->type_name("SIZE");
    a->limit_opt[2] = app->add_option("--max-fragmentation", a->limit_text[2], "maximum external fragmentation, 0.3 or 30%")
        ->type_name("F");
    a->limit_opt[3] = app->add_option("--max-leak", a->limit_text[3], "bytes still allocated when the log ends")->type_name("SIZE");
    // A program that catches an OOM (a batch-size search, PyTorch's retry after emptying its cache)
    // runs on and exits 0, so only the log says the job reached the device's limit.
    a->limit_opt[4] = app->add_option("--max-ooms", a->limit_text[4], "out-of-memory failures (0: fail a run that had any)")->type_name("N");
    app->add_option("--baseline", a->baseline_path,
                    "an earlier run that this one may not exceed by more than the tolerance: one file, the report JSON of "
                    "all its logs (gpumem report --json LOG... > FILE) or a single log; - reads standard input")
        ->type_name("REPORT.json");
    a->tolerance_opt = app->add_option("--tolerance", a->tolerance_text,
                    "allowed growth over the baseline, in percent: 5 or 5% (a bare 0.05 is 0.05%, with a warning)")
        ->type_name("P%")
        ->default_str("5%");
    app->add_option("--junit", a->junit_path, "also write JUnit XML: one testcase per limit per process and device")
        ->type_name("FILE");
    app->add_flag("-q,--quiet", a->quiet, "print only the broken limits and the one-line total");
    add_progress_flags(app, a->progress);
    command c;
    c.app = app;
    c.run = [a](const std::vector<std::string>& tail, bool) { return run_check(*a, tail); };
    return c;
}

}  // namespace gpumem::analysis
