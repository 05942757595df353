// The preload's diagnostics: a leaked spdlog logger on stderr after init, one write_stderr before it (preload/diag.h).
#include "diag.h"

#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include <spdlog/logger.h>
#include <spdlog/sinks/stdout_sinks.h>

#include "config.h"
#include "event_log.h"
#include "stderr_write.h"

namespace gpumem::diag {
namespace {

std::atomic<int> g_level{-1};  // -1: GPUMEM_LOG_LEVEL not read yet
// Never destroyed: a free from another library's destructor after ours may still warn.
std::atomic<spdlog::logger*> g_logger{nullptr};
// One message at a time: the _st sink and the pattern formatter are not thread-safe, and a
// lock of our own (unlike the _mt sink's mutex) can be reset in a fork child.
std::atomic<bool> g_busy{false};
thread_local bool t_inside = false;  // this thread is inside a message: do not log again

constexpr const char* k_level_names[] = {"trace", "debug", "info", "warning", "error", "critical", "off"};

void lock() noexcept {
    while (g_busy.exchange(true, std::memory_order_acquire)) sched_yield();
}
void unlock() noexcept { g_busy.store(false, std::memory_order_release); }

}  // namespace

int current_level() noexcept {
    int l = g_level.load(std::memory_order_relaxed);
    if (l >= 0) return l;
    // Before the config is read (a hook reporting while the process starts): the same variable,
    // the same rule, through setting_env alone (no allocation).
    int v = warn;
    if (!parse_log_level(setting_env("GPUMEM_LOG_LEVEL"), &v)) v = warn;
    int expected = -1;
    g_level.compare_exchange_strong(expected, v, std::memory_order_relaxed);
    return g_level.load(std::memory_order_relaxed);
}

void init(int lvl) noexcept {
    g_level.store(lvl < trace ? trace : lvl > off ? off : lvl, std::memory_order_relaxed);
    if (g_logger.load(std::memory_order_acquire)) return;
    lock();
    try {
        if (!g_logger.load(std::memory_order_relaxed)) {
            auto* lg = new spdlog::logger("gpumem", std::make_shared<spdlog::sinks::stderr_sink_st>());
            lg->set_pattern("gpumem[%P] %l: %v");  // no time: localtime would read time zone files
            lg->set_level(spdlog::level::trace);    // the level is checked before formatting, above
            g_logger.store(lg, std::memory_order_release);
        }
    } catch (...) {
        // No memory for the logger: messages keep going out through write(2).
    }
    unlock();
}

void after_fork_child() noexcept {
    g_busy.store(false, std::memory_order_relaxed);
    t_inside = false;
}

void write(level l, const char* msg, size_t n) noexcept {
    if (t_inside || l < trace || l >= off) return;
    t_inside = true;
    sigpipe_guard no_sigpipe;  // a stderr pipe whose reader left must not end the program
    if (spdlog::logger* lg = g_logger.load(std::memory_order_acquire)) {
        lock();
        try {
            lg->log(spdlog::level::level_enum(l), spdlog::string_view_t(msg, n));
        } catch (...) {
        }
        unlock();
    } else {
        // The line spdlog's pattern would make, in pieces: no buffer to outgrow.
        write_stderr({"gpumem[", decimal(getpid()), "] ", k_level_names[l], ": ", std::string_view(msg, n), "\n"});
    }
    t_inside = false;
}

void write_cut(level l, const char* msg, size_t n, size_t whole) noexcept {
    // The marker goes in the same buffer, over the message's last bytes: no memory to spare here.
    char line[1024];
    const size_t mark_max = 64;
    size_t keep = n < sizeof line - mark_max ? n : sizeof line - mark_max;
    // Cut on a UTF-8 character boundary, so the line stays valid text.
    while (keep > 0 && keep < n && (static_cast<unsigned char>(msg[keep]) & 0xC0) == 0x80) --keep;
    memcpy(line, msg, keep);
    decimal cut(static_cast<long long>(whole - keep));
    size_t k = keep;
    for (std::string_view part : {std::string_view("... ("), cut.view(), std::string_view(" bytes cut)")}) {
        memcpy(line + k, part.data(), part.size());
        k += part.size();
    }
    write(l, line, k);
}

}  // namespace gpumem::diag
