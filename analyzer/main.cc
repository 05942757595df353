// The gpumem command-line program: `gpumem report` reads event logs and prints or writes reports;
// `run`, `check` and `diff` live in cmd_*.cc.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "analyze.h"
#include "commands.h"
#include "log_reader.h"
#include "report_output.h"

namespace {

using namespace gpumem::analysis;

const char* k_usage =
    "usage: gpumem report [options] LOG...\n"
    "       gpumem run [-o PATTERN] [--pool on|off] [--] CMD ARGS...   (gpumem run --help)\n"
    "       gpumem check LOG... [--max-peak SIZE] [--baseline REPORT.json] ...   (gpumem check --help)\n"
    "       gpumem diff A B                                           (gpumem diff --help)\n"
    "\n"
    "Reads gpumem event logs (JSON Lines, docs/log-format.md) and reports peak memory,\n"
    "fragmentation, free-block maps, OOM diagnoses and leaks.  Several logs (one per process or\n"
    "rank) give a report each and a combined table.\n"
    "\n"
    "options:\n"
    "  --json            print the report as JSON (schema: docs/report-json.md) instead of text\n"
    "  --html FILE       also write a self-contained HTML report with charts to FILE\n"
    "  --perfetto FILE   also write a Chrome trace JSON with counter tracks (ui.perfetto.dev)\n"
    "  --at MOMENT       also show the free-block map at MOMENT: an event seq (1234 or #1234) or a\n"
    "                    time since the recorder started (2.5s, 150ms, 20us, 900ns)\n"
    "  --progress        print progress on stderr every 2 s (default when stderr is a terminal)\n"
    "  --no-progress     never print progress\n"
    "  -h, --help        this help\n"
    "\n"
    "exit codes: 0 report written; 2 unusable input or arguments.\n";

int usage_error(const std::string& msg) {
    std::fprintf(stderr, "gpumem: %s\n%s", msg.c_str(), k_usage);
    return k_exit_input;
}

template <typename F>
bool write_file(const std::string& path, F&& fill) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f) {
        std::fprintf(stderr, "gpumem: error: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
        return false;
    }
    fill(f);
    f.flush();
    if (!f) {
        std::fprintf(stderr, "gpumem: error: writing %s failed\n", path.c_str());
        return false;
    }
    return true;
}

int cmd_report(int argc, char** argv) {
    bool json = false;
    std::string html_path, perfetto_path;
    analyze_options aopt;
    aopt.progress = ::isatty(2) == 1;
    output_options oopt;
    std::vector<std::string> logs;
    for (int i = 0; i < argc; ++i) {
        std::string a = argv[i];
        auto value = [&](const char* name) -> const char* {
            if (i + 1 >= argc) return nullptr;
            (void)name;
            return argv[++i];
        };
        if (a == "--json") json = true;
        else if (a == "--html") {
            const char* v = value("--html");
            if (!v) return usage_error("--html needs a file name");
            html_path = v;
        } else if (a == "--perfetto") {
            const char* v = value("--perfetto");
            if (!v) return usage_error("--perfetto needs a file name");
            perfetto_path = v;
        } else if (a == "--at") {
            const char* v = value("--at");
            if (!v) return usage_error("--at needs a moment (1234, #1234, 2.5s, 150ms, ...)");
            if (!parse_moment(v, aopt.at))
                return usage_error(std::string("--at ") + v + ": expected an event seq (1234 or #1234) or a time (2.5s, 150ms, 20us, 900ns)");
            oopt.show_at = true;
        } else if (a == "--progress") aopt.progress = true;
        else if (a == "--no-progress") aopt.progress = false;
        else if (a == "-h" || a == "--help") {
            std::fputs(k_usage, stdout);
            return k_exit_ok;
        } else if (a == "--") {
            for (++i; i < argc; ++i) logs.emplace_back(argv[i]);
        } else if (a.size() > 1 && a[0] == '-') return usage_error("unknown option " + a);
        else logs.push_back(a);
    }
    if (logs.empty()) return usage_error("no log file given");

    std::vector<process_report> procs;
    int rc = k_exit_ok;
    for (const std::string& path : logs) {
        try {
            procs.push_back(analyze_file(path, aopt));
        } catch (const input_error& e) {
            std::fprintf(stderr, "gpumem: error: %s\n", e.what());
            rc = k_exit_input;
            continue;
        } catch (const std::bad_alloc&) {
            std::fprintf(stderr, "gpumem: error: %s: out of memory while analyzing\n", path.c_str());
            rc = k_exit_input;
            continue;
        }
        const process_report& p = procs.back();
        for (const std::string& w : p.warnings) std::fprintf(stderr, "gpumem: warning: %s\n", w.c_str());
        if (p.n_warnings > p.warnings.size())
            std::fprintf(stderr, "gpumem: warning: %s: %llu more warnings not shown\n", path.c_str(),
                         (unsigned long long)(p.n_warnings - p.warnings.size()));
    }
    // One unusable log makes the whole job's report untrustworthy (a rank would be missing).
    if (rc != k_exit_ok) return rc;

    combined_report combined = combine(procs);
    if (json) std::cout << to_json(procs, combined, oopt).dump(2) << "\n";
    else write_text(std::cout, procs, combined, oopt);
    std::cout.flush();
    if (!html_path.empty() && !write_file(html_path, [&](std::ostream& o) { write_html(o, procs, combined, oopt); }))
        return k_exit_input;
    if (!perfetto_path.empty() && !write_file(perfetto_path, [&](std::ostream& o) { write_perfetto(o, procs); }))
        return k_exit_input;
    return k_exit_ok;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) return usage_error("no command given");
    std::string cmd = argv[1];
    if (cmd == "report") return cmd_report(argc - 2, argv + 2);
    if (cmd == "run") return cmd_run(argc - 2, argv + 2);
    if (cmd == "check") return cmd_check(argc - 2, argv + 2);
    if (cmd == "diff") return cmd_diff(argc - 2, argv + 2);
    if (cmd == "-h" || cmd == "--help" || cmd == "help") {
        std::fputs(k_usage, stdout);
        return k_exit_ok;
    }
    if (cmd == "--version" || cmd == "version") {
        std::printf("gpumem %s\n", GPUMEM_VERSION_STRING);
        return k_exit_ok;
    }
    return usage_error("unknown command " + cmd);
}
