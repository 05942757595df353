// `gpumem report`: reads event logs (or report JSON written by an earlier `gpumem report --json`)
// and prints a report (text or JSON), and writes HTML and Perfetto files.
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "analyze.h"
#include "cli_input.h"
#include "commands.h"
#include "diagnostics.h"
#include "format_util.h"
#include "input_spool.h"
#include "log_reader.h"
#include "output_file.h"
#include "parallel.h"
#include "report_json_read.h"
#include "report_output.h"
#include "views/pickle_writer.h"
#include "views/torch_snapshot.h"

namespace gpumem::analysis {

namespace {

struct report_args {
    bool json = false;
    progress_flags progress;
    std::string html_path, perfetto_path, torch_path, at;
    std::vector<std::string> logs;
    unsigned jobs = 0;  // threads; 0: all cores
};

// --torch-snapshot: the pickle goes to a new file beside PATH (0600: it names the program's files,
// as the log does) that replaces PATH only once complete, so a failed export leaves no half file;
// a link, a device or a directory at PATH is taken as every output takes it (file_replacement).
bool write_torch_file(const std::string& path, const std::string& log, const process_report& rep) {
    file_replacement out(path, "--torch-snapshot", 0600);
    if (!out.ok()) return false;
    bool ok = false;
    try {
        pickle_writer w(out.fd());
        torch_snapshot_summary sum = write_torch_snapshot(log, rep, w);
        if (w.failed()) {
            spdlog::error("--torch-snapshot {}: writing failed: {}", path, std::strerror(w.error()));
        } else {
            ok = true;
            for (const auto& [dev, d] : sum.devices) {
                uint64_t n = 0;
                for (uint64_t c : d.actions) n += c;
                spdlog::debug("--torch-snapshot: device {}: {} trace entries, {} segments, {} blocks", dev, n,
                              d.segments, d.blocks);
            }
            if (sum.host_events)
                spdlog::warn("--torch-snapshot: {} events of host memory or of no device are not in the snapshot "
                             "(PyTorch's format has GPUs only)", sum.host_events);
            if (sum.unplaced)
                spdlog::warn("--torch-snapshot: {} pooled blocks or frees did not fit the rebuilt pool and are left "
                             "out (the log misses events)", sum.unplaced);
        }
    } catch (const input_error& e) {
        spdlog::error("{}", e.what());
    } catch (const std::exception& e) {
        spdlog::error("{}", "--torch-snapshot " + path + ": " + e.what());
    }
    return ok && out.commit();
}

// Whether two outputs name one file, existing or not ("x.html" and "./x.html", a link and its
// target, a link to a file not there yet and that file's name).
bool same_path(const std::string& x_out, const std::string& y_out) {
    namespace fs = std::filesystem;
    const std::string x = output_target(x_out), y = output_target(y_out);
    // Made absolute first: weakly_canonical leaves a relative path none of whose parts exists as it
    // is ("x.html") but resolves "./x.html" against the working directory, so two names of one new
    // file would differ.
    std::error_code ex, ey;
    fs::path px = fs::absolute(x, ex), py = fs::absolute(y, ey);
    if (!ex) px = fs::weakly_canonical(px, ex);
    if (!ey) py = fs::weakly_canonical(py, ey);
    return x == y || (!ex && !ey && px == py);
}

int run_report(report_args& a, const std::vector<std::string>& tail) {
    analyze_options aopt;
    aopt.progress = a.progress.wanted();
    aopt.progress_interval_s = a.progress.every_s;
    output_options oopt;
    if (!a.at.empty()) {
        if (!parse_moment(a.at, aopt.at))
            return usage_error("report", "--at " + a.at + ": expected an event seq (1234 or #1234) or a time (2.5s, 150ms, 20us, 900ns)");
        oopt.show_at = true;
    }
    std::vector<std::string> logs = a.logs;
    logs.insert(logs.end(), tail.begin(), tail.end());
    const std::pair<const char*, const std::string*> outs[] = {
        {"--html", &a.html_path}, {"--perfetto", &a.perfetto_path}, {"--torch-snapshot", &a.torch_path}};
    if (logs.empty()) {
        // `report --html LOG`: the run's one log was taken as the output's FILE; that is what to say.
        for (const auto& [option, out] : outs)
            if (std::string why; output_would_clobber(*out, option, logs, why)) return usage_error("report", why);
        return usage_error("report", with_stdin_hint("no log file given"));
    }
    if (std::string err; !dash_means_stdin(logs, err)) return usage_error("report", err);
    drop_repeated_inputs(logs);
    pipe_spools pipes;  // pipes among several logs, compared with them and read from here
    if (std::string err; !drop_copies_of_one_log(logs, pipes, a.progress, err)) {
        spdlog::error("{}", err);
        return k_exit_input;
    }

    if (!a.torch_path.empty() && logs.size() != 1)
        return usage_error("report", "--torch-snapshot writes one process's snapshot: give exactly one log");
    for (const auto& [option, out] : outs) {
        std::string why;
        if (output_would_clobber(*out, option, logs, why)) return usage_error("report", why);
    }
    // Two outputs on one file: the second would replace the first, which would be lost unsaid.
    for (size_t i = 0; i < std::size(outs); ++i)
        for (size_t j = i + 1; j < std::size(outs); ++j)
            if (!outs[i].second->empty() && !outs[j].second->empty() && same_path(*outs[i].second, *outs[j].second))
                return usage_error("report", std::string(outs[i].first) + " and " + outs[j].first + " both name " +
                                                 visible(*outs[j].second) + ": give each output its own file");

    // Each log is analyzed on its own thread (all cores, or -j), into its own slot; what it has to
    // say is kept with it and said afterwards in the order of the logs, so the output is the same
    // byte for byte whatever the thread count.
    struct log_slot {
        std::vector<process_report> procs;
        std::vector<std::pair<spdlog::level::level_enum, std::string>> messages;
        bool failed = false, show_at = false;
        void say(spdlog::level::level_enum l, std::string m) { messages.emplace_back(l, std::move(m)); }
    };
    std::vector<log_slot> slots(logs.size());
    // Kept to the end: --torch-snapshot reads its log once more.
    std::vector<std::unique_ptr<input_spool>> spools(logs.size());
    const bool want_at = oopt.show_at;
    parallel_for(logs.size(), jobs_or_cores(a.jobs), [&](size_t i) {
        const std::string& path = logs[i];
        log_slot& out = slots[i];
        try {
            // A pipe is read once, into a file that the reads below (and --torch-snapshot's) can open.
            spools[i] = std::make_unique<input_spool>(path, a.progress.wanted(), a.progress.every_s);
            const input_spool& in = *spools[i];
            if (!a.torch_path.empty() && looks_like_report_json(in.path())) {
                out.say(spdlog::level::err, path + ": --torch-snapshot needs the event log; a report JSON holds no events");
                out.failed = true;
                return;
            }
            if (looks_like_report_json(in.path())) {
                // A `gpumem report --json` file: the same report again (or with other outputs),
                // without the log.  --at needs the log: the report holds only the moments it had.
                out.say(spdlog::level::debug, path + ": reading as a `gpumem report --json` file");
                if (want_at) {
                    out.say(spdlog::level::err,
                            path + ": --at needs the event log; a report JSON holds only the moments it was made with");
                    out.failed = true;
                    return;
                }
                report_file r = read_report_json(path, in.path());
                // A member CI gates on that the file lacks (another tool wrote it, or it was
                // edited) reads as 0 in the model: said, so a 0 shown (or written back by --json)
                // is not taken for a measurement.
                // One there with another type ("12") is said to be what it is, on a line of its own.
                for (size_t i = 0; i < r.processes.size() && i < r.fields.size(); ++i)
                    for (size_t k = 0; k < r.processes[i].devices.size() && k < r.fields[i].size(); ++k) {
                        const device_fields_read& fields = r.fields[i][k];
                        // At the member's line, or the device's where it is not there (device_fields_read::lines).
                        auto who = [&](device_field f) {
                            return fmt_where(path, fields.line(f)) + ": process " +
                                   std::to_string(r.processes[i].pid) + " dev " +
                                   std::to_string(r.processes[i].devices[k].dev) + " ";
                        };
                        std::string missing;
                        device_field first_missing{};
                        for (device_field f : k_gated_fields) {
                            if (fields.has(f)) continue;
                            if (fields.found(f))
                                out.say(spdlog::level::warn, who(f) + fields.why_missing(f) + ": shown as 0, which is no measurement");
                            else {
                                if (missing.empty()) first_missing = f;
                                missing += std::string(missing.empty() ? "" : ", ") + "\"" + field_name(f) + "\"";
                            }
                        }
                        if (!missing.empty())
                            out.say(spdlog::level::warn,
                                    who(first_missing) + "has no " + missing + " (a number): shown as 0, which is no measurement");
                    }
                for (process_report& p : r.processes) {
                    // A report made with --at shows that moment again.
                    for (const device_report& d : p.devices) out.show_at |= d.at_request.valid;
                    for (const std::string& w : warning_lines(p, p.file)) out.say(spdlog::level::warn, w);
                    out.procs.push_back(std::move(p));
                }
                return;
            }
            out.procs.push_back(analyze_file(path, aopt, in.path()));
        } catch (const input_error& e) {
            out.say(spdlog::level::err, e.what());
            out.failed = true;
            return;
        } catch (const std::bad_alloc&) {
            out.say(spdlog::level::err, path + ": out of memory while analyzing");
            out.failed = true;
            return;
        } catch (const std::exception& e) {  // nothing may leave a worker thread
            out.say(spdlog::level::err, path + ": " + e.what());
            out.failed = true;
            return;
        }
        const process_report& p = out.procs.back();
        out.say(spdlog::level::debug, path + ": " + std::to_string(p.lines) + " lines, " +
                                  std::to_string(p.events) + " events, " + std::to_string(p.devices.size()) +
                                  " device(s), " + std::to_string(p.n_warnings) + " warning(s)");
        for (const std::string& w : warning_lines(p, path)) out.say(spdlog::level::warn, w);
    });
    std::vector<process_report> procs;
    int rc = k_exit_ok;
    for (log_slot& s : slots) {
        for (const auto& [level, m] : s.messages) spdlog::log(level, "{}", m);
        if (s.failed) rc = k_exit_input;
        oopt.show_at |= s.show_at;
        for (process_report& p : s.procs) procs.push_back(std::move(p));
    }
    // One unusable log makes the whole job's report untrustworthy (a rank would be missing).
    if (rc != k_exit_ok) return rc;

    // A report JSON edited by hand can hold values no analysis produces; the writers then may throw
    // (a string too long to build, invalid UTF-8 for the JSON writer): unusable input, not a crash.
    try {
        combined_report combined = combine(procs);
        if (a.json) std::cout << to_json(procs, combined, oopt).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
        else write_text(std::cout, procs, combined, oopt);
        std::cout.flush();
        if (!a.html_path.empty() &&
            !write_whole(a.html_path, "--html", [&](std::ostream& o) { write_html(o, procs, combined, oopt); }))
            return k_exit_input;
        if (!a.perfetto_path.empty() && !write_whole(a.perfetto_path, "--perfetto", [&](std::ostream& o) { write_perfetto(o, procs); }))
            return k_exit_input;
        if (!a.torch_path.empty() && !write_torch_file(a.torch_path, spools[0] && spools[0]->spooled() ? spools[0]->path() : logs[0], procs[0])) return k_exit_input;
    } catch (const std::exception& e) {
        std::cout.flush();
        spdlog::error("cannot write the report from these inputs: {}", e.what());
        return k_exit_input;
    }
    return k_exit_ok;
}

}  // namespace

command add_report(CLI::App& top) {
    auto a = std::make_shared<report_args>();
    CLI::App* app = top.add_subcommand("report", "print a report of event logs (text or JSON), write HTML and Perfetto files");
    app->footer(
        "Reads gpumem event logs (JSON Lines, docs/log-format.md) and reports peak memory,\n"
        "fragmentation, free-block maps, OOM diagnoses and leaks.  Several logs (one per process or\n"
        "rank) give a report each and a combined table.\n"
        "Every number is defined in docs/metrics.md, the text report's first lines define requested,\n"
        "allocated and reserved, and each OOM gets a verdict: capacity, pending frees, chunk rounding or\n"
        "fragmentation, with the numbers it was judged on (docs/metrics.md, \"OOM diagnosis\").\n"
        "\n"
        "exit codes: 0 report written; 2 unusable input or arguments.");
    app->add_option("LOG", a->logs, "event logs (gpumem-PID.jsonl) or `gpumem report --json` files; - reads standard input");
    app->add_flag("--json", a->json, "print the report as JSON (schema: docs/report-json.md) instead of text");
    app->add_option("--html", a->html_path, "also write a self-contained HTML report with charts to FILE")->type_name("FILE");
    app->add_option("--perfetto", a->perfetto_path, "also write a Chrome trace JSON with counter tracks (ui.perfetto.dev)")
        ->type_name("FILE");
    app->add_option("--torch-snapshot", a->torch_path,
                    "also write the log as a PyTorch memory snapshot (pickle) for memory_viz: "
                    "python -m torch.cuda._memory_viz trace_plot FILE -o out.html, or pytorch.org/memory_viz")
        ->type_name("FILE");
    app->add_option("--at", a->at,
                    "also show the free-block map at MOMENT: an event seq (1234 or #1234) or a time since the "
                    "recorder started (2.5s, 150ms, 20us or 20 us, 900ns)")
        ->type_name("MOMENT");
    add_count_option(app, "-j,--jobs", [a](uint64_t v) { a->jobs = unsigned(v); },
                     "threads, one log each (default: all cores); the output is the same for any N", 1, k_max_jobs);
    add_progress_flags(app, a->progress);
    command c;
    c.app = app;
    c.run = [a](const std::vector<std::string>& tail, bool) { return run_report(*a, tail); };
    return c;
}

}  // namespace gpumem::analysis
