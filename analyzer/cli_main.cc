// The gpumem command line (main.cc calls it): registers the subcommands (cmd_*.cc) on one CLI11 app,
// splits off the arguments that are not gpumem's, parses the rest and runs the chosen subcommand.
//
// CLI11 (Debian libcli11-dev) gives every subcommand the same conventions: `--flag value` and
// `--flag=value`, `--help`, and errors that name the option; run_gpumem adds one error prefix and exit 2.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "diagnostics.h"

namespace gpumem::analysis {

namespace {

bool is_option(const std::string& a) { return a.size() > 1 && a[0] == '-'; }

// Whether `a` (as written, "--out" or "--out=x") is an option of `app` or of the top-level app that
// takes its value from the next argument.
bool takes_next_value(const CLI::App& app, const CLI::App& top, const std::string& a) {
    if (a.find('=') != std::string::npos) return false;  // "--out=x"
    if (a[1] != '-' && a.size() > 2) return false;        // "-ox": a short option with its value attached
    for (const CLI::App* x : {&app, &top}) {
        const CLI::Option* o = x->get_option_no_throw(a);
        if (o) return o->get_items_expected_min() > 0;
    }
    return false;
}

// Why `next` cannot be the value of `a`, an option that takes the next argument: `--` or one of the
// options, where the value was forgotten (`report --html --json LOG` wrote an HTML file named
// --json); empty when it can be.  A value written with = is taken as written.
std::string not_a_value(const CLI::App& app, const CLI::App& top, const std::string& next) {
    if (next == "--") return "-- ends gpumem's options (for a file named --, write ./--)";
    if (!is_option(next)) return "";
    // "-j2" is -j with its value attached, as takes_next_value reads "-ox".
    const std::string name = next[1] == '-' ? next.substr(0, next.find('=')) : next.substr(0, 2);
    if (app.get_option_no_throw(name)) return name + " is one of gpumem " + app.get_name() + "'s options";
    if (top.get_option_no_throw(name)) return name + " is one of gpumem's options";
    return "";
}

}  // namespace

int run_gpumem(int argc, char** argv) {
    CLI::App app{"gpumem: reads the GPU memory event logs that libgpumem.so writes and reports peaks,\n"
                 "fragmentation, OOM diagnoses and leaks; runs programs under it; gates CI on its numbers.",
                 "gpumem"};
    app.set_version_flag("--version", std::string("gpumem ") + GPUMEM_VERSION_STRING, "print gpumem's version and exit");
    bool verbose = false;
    app.add_flag("-v,--verbose", verbose, "print what gpumem reads and decides on stderr (debug messages)");
    app.require_subcommand(1);
    // -v works after the subcommand too.
    app.fallthrough();
    app.footer("exit codes: 0 done; 1 a `check` limit is broken; 2 unusable input or arguments;\n"
               "`run` returns the program's own code.  Each subcommand has --help.");

    std::vector<command> commands;
    commands.push_back(add_report(app));
    commands.push_back(add_run(app));
    commands.push_back(add_check(app));
    commands.push_back(add_diff(app));
    commands.push_back(add_replay(app));

    // The subcommand is the first argument that is not an option of the top-level app.
    std::vector<std::string> args(argv + 1, argv + argc);
    size_t sub_at = 0;
    for (; sub_at < args.size() && is_option(args[sub_at]); ++sub_at)
        // `gpumem -- report LOG`: after `--` nothing is a command (CLI11 says "A subcommand is
        // required"); the `--` belongs after the command.
        if (args[sub_at] == "--")
            return usage_error("", "'--' before the command: give the command first, then -- "
                                   "(gpumem report -- LOG..., gpumem run -- PROGRAM...)");
    if (args.empty()) return usage_error("", "no command given");
    const command* chosen = nullptr;
    if (sub_at < args.size()) {
        for (const command& c : commands)
            if (c.app->check_name(args[sub_at])) chosen = &c;
        if (!chosen) return usage_error("", "unknown command '" + args[sub_at] + "'");
    }

    // Split off the tail before CLI11 sees it, so that nothing in it is read as gpumem's option.
    std::vector<std::string> head(args.begin(), args.begin() + std::ptrdiff_t(std::min(sub_at + 1, args.size())));
    std::vector<std::string> tail;
    bool dashdash = false;
    if (chosen) {
        size_t i = sub_at + 1;
        for (; i < args.size(); ++i) {
            const std::string& a = args[i];
            if (a == "--") {
                dashdash = true;
                ++i;
                break;
            }
            if (chosen->tail == command::tail_kind::command && !is_option(a)) break;
            head.push_back(a);
            if (takes_next_value(*chosen->app, app, a) && i + 1 < args.size()) {
                const std::string why = not_a_value(*chosen->app, app, args[i + 1]);
                if (!why.empty())
                    return usage_error(chosen->app->get_name(), a + " " + args[i + 1] + ": " + a + " takes a value, and " + why);
                head.push_back(args[++i]);
            }
        }
        tail.assign(args.begin() + std::ptrdiff_t(i), args.end());
    }

    // stdout is an output like --html: `gpumem report --json > r.json` on a full disk would leave a
    // cut file behind and exit 0, for a later `check --baseline r.json` to find broken (and a cut
    // --help, the man page).  A write that failed leaves the stream's error flag set; only a flush
    // that fails here still knows why (the commands' own flushes came first).
    auto stdout_failed = [] {
        errno = 0;
        const bool flush_failed = std::fflush(stdout) != 0;
        const int err = flush_failed ? errno : 0;
        if (!flush_failed && !std::ferror(stdout)) return false;
        std::fprintf(stderr, "gpumem: error: writing to stdout failed (%s): the output is cut short\n",
                     err ? std::strerror(err) : "a full disk, a file size limit or a closed pipe?");
        return true;
    };
    // --help and --version, which CLI11 prints on stdout.
    auto help_exit = [&](const CLI::Error& e) {
        int rc = app.exit(e);
        return stdout_failed() ? k_exit_input : rc;
    };
    std::vector<char*> parse_argv{argv[0]};
    for (std::string& s : head) parse_argv.push_back(s.data());
    try {
        app.parse(int(parse_argv.size()), parse_argv.data());
    } catch (const CLI::CallForHelp& e) {
        return help_exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return help_exit(e);
    } catch (const CLI::CallForVersion& e) {
        return help_exit(e);
    } catch (const CLI::ParseError& e) {
        // CLI11 says an option given twice (a CI script that adds its own --max-peak to one
        // already in a variable) as "--max-peak: At Most 1 required but received 2".
        std::string what = e.what();
        const std::string at_most = ": At Most 1 required but received ";
        if (const size_t k = what.find(at_most); dynamic_cast<const CLI::ArgumentMismatch*>(&e) && k != std::string::npos)
            what = what.substr(0, k) + " is given " + what.substr(k + at_most.size()) + " times: give it once";
        return usage_error(chosen ? chosen->app->get_name() : "", what);
    }
    // The commands take an empty value for an option not given, so `--junit "$UNSET_VAR"` would skip
    // its output (or `--baseline ""` its gate, `--at ""` its map) without a word: refused instead.
    for (const CLI::Option* o : chosen->app->get_options())
        if (o->nonpositional() && o->get_items_expected_min() > 0)
            for (const std::string& r : o->results())
                if (r.empty()) return usage_error(chosen->app->get_name(), o->get_name() + ": empty value");
    init_diagnostics(verbose);
    int rc = chosen->run(tail, dashdash);
    // `run` writes nothing to stdout: the program's output goes straight to the program's stdout,
    // and `run` keeps the program's exit code.
    if (stdout_failed()) return chosen->tail == command::tail_kind::command ? rc : k_exit_input;
    return rc;
}

}  // namespace gpumem::analysis
