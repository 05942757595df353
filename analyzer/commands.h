// The gpumem subcommands: each registers its options on the CLI11 app (one convention for every
// subcommand: `--flag value` and `--flag=value`, `--help`, one error prefix, exit 2 on usage errors)
// and returns the function that runs it once the arguments are parsed.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace gpumem::analysis {

// Exit codes shared by every subcommand (`run` returns the program's own code instead).
inline constexpr int k_exit_ok = 0;
inline constexpr int k_exit_regression = 1;  // `check`: a limit was broken
inline constexpr int k_exit_input = 2;       // unusable input or arguments

// One subcommand, as its add_* function registered it on the top-level app.
struct command {
    CLI::App* app = nullptr;
    // Arguments that are not gpumem's own.  main splits them off before CLI11 parses the rest, so
    // nothing in them is ever read as an option:
    //   after_dashdash: everything after the first `--` (report and check: more logs; diff: the new
    //     run, `diff BASE... -- NEW...`);
    //   command: everything from `--` (dropped) or from the first argument that is not an option
    //     or an option's value (`run`: the program and its arguments, passed on untouched).
    enum class tail_kind { after_dashdash, command } tail = tail_kind::after_dashdash;
    // Runs the subcommand: `tail` holds the split-off arguments, `dashdash` whether `--` was given.
    std::function<int(const std::vector<std::string>& tail, bool dashdash)> run;
};

command add_report(CLI::App& top);
command add_run(CLI::App& top);
command add_check(CLI::App& top);
command add_diff(CLI::App& top);
command add_replay(CLI::App& top);  // cmd_replay.cc: allocator simulations over logs

// The whole gpumem command line: parses argv and runs the chosen subcommand; returns the exit code
// (cli_main.cc).
int run_gpumem(int argc, char** argv);

// Prints "gpumem: error: MSG" and a one-line hint to `gpumem SUB --help`; returns k_exit_input
// (diagnostics.cc).
// For argument errors found after parsing (a size that does not parse, a missing input).
int usage_error(const std::string& sub, const std::string& msg);

}  // namespace gpumem::analysis
