// The analyzer's diagnostics: its spdlog logger, the argument-error line, the shared progress and count options (diagnostics.h).
#include "diagnostics.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

#include <CLI/CLI.hpp>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>

#include "cli_input.h"
#include "commands.h"
#include "format_util.h"

namespace gpumem::analysis {

namespace {
// %V: the message through visible().  Messages name files and quote logs, whose control characters
// (an ESC in a file name, a rank) would act on the terminal; one rule here reaches every message,
// where a visible() per call missed some (an input that cannot be opened).  visible() of its own
// output is the same text, so a message made visible already is unchanged.
class visible_message final : public spdlog::custom_flag_formatter {
public:
    void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
        const std::string text = visible(std::string_view(msg.payload.data(), msg.payload.size()));
        dest.append(text.data(), text.data() + text.size());
    }
    std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<visible_message>(); }
};
}  // namespace

void init_diagnostics(bool verbose) {
    // Single-threaded sink: the analyzer logs from one thread.  stderr is unbuffered, so messages
    // keep their order with the reports written to stdout.
    auto logger = spdlog::stderr_logger_st("gpumem");
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<visible_message>('V').set_pattern("gpumem: %l: %V");
    logger->set_formatter(std::move(formatter));
    logger->set_level(verbose ? spdlog::level::debug : spdlog::level::warn);
    spdlog::set_default_logger(logger);
}

int usage_error(const std::string& sub, const std::string& msg) {
    std::fprintf(stderr, "gpumem: error: %s\n", visible(msg).c_str());
    if (sub.empty()) std::fprintf(stderr, "(gpumem --help lists the commands)\n");
    else std::fprintf(stderr, "(gpumem %s --help lists the options)\n", sub.c_str());
    return k_exit_input;
}

bool progress_flags::wanted() const { return on || (!off && ::isatty(2) == 1); }

void add_progress_flags(CLI::App* app, progress_flags& p) {
    auto* on = app->add_flag("--progress", p.on, "print progress on stderr every 2 s (default when stderr is a terminal)");
    app->add_flag("--no-progress", p.off, "never print progress")->excludes(on);
    // CLI11's own checks would take nan, and a hidden option has no name in CLI11's messages.
    app->add_option_function<std::string>(
           "--progress-every",
           [&p](const std::string& text) {
               double s = 0;
               if (!parse_number_arg(text, s) || s > 3600)
                   throw CLI::ValidationError("--progress-every " + text + ": expected seconds from 0 to 3600, such as 0.5");
               p.every_s = s;
           },
           "seconds between progress lines")
        ->group("");  // hidden: for the tests, which cannot wait 2 s per line
}

CLI::Option* add_count_option(CLI::App* app, const std::string& names, std::function<void(uint64_t)> set,
                              const std::string& description, uint64_t lo, uint64_t hi) {
    const std::string name = names.substr(names.rfind(',') + 1);  // "-j,--jobs": "--jobs"
    return app
        ->add_option_function<std::string>(
            names,
            [set = std::move(set), name, lo, hi](const std::string& text) {
                double v = 0;
                if (!parse_number_arg(text, v) || v != std::floor(v) || v < double(lo) || v > double(hi))
                    throw CLI::ValidationError(name + " " + text + ": expected a whole number from " + std::to_string(lo) +
                                               " to " + std::to_string(hi));
                set(uint64_t(v));
            },
            description)
        ->type_name("N");
}

}  // namespace gpumem::analysis
