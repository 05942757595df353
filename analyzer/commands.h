// The gpumem subcommands besides `report`: each takes the arguments after its name and returns the
// process exit code.
#pragma once

namespace gpumem::analysis {

// Exit codes shared by every subcommand (`run` returns the program's own code instead).
inline constexpr int k_exit_ok = 0;
inline constexpr int k_exit_regression = 1;  // `check`: a limit was broken
inline constexpr int k_exit_input = 2;       // unusable input or arguments

int cmd_run(int argc, char** argv);
int cmd_check(int argc, char** argv);
int cmd_diff(int argc, char** argv);

}  // namespace gpumem::analysis
