// The gpumem program: the command line itself is in gpumem_cli (cli_main.cc), compiled in one unit
// with the subcommands so that CLI11's header is compiled once (docs/benchmarks.md).
#include "commands.h"

int main(int argc, char** argv) { return gpumem::analysis::run_gpumem(argc, argv); }
