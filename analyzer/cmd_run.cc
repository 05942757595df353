// `gpumem run`: runs a command with libgpumem.so preloaded, finds the logs its processes wrote and
// prints a one-screen summary of them.
#include <glob.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "analyze.h"
#include "commands.h"
#include "config.h"
#include "diagnostics.h"
#include "format_util.h"
#include "log_reader.h"
#include "parallel.h"
#include "views/report_sites.h"

#ifndef GPUMEM_BIN_TO_LIBDIR
#define GPUMEM_BIN_TO_LIBDIR "../lib"
#endif

namespace gpumem::analysis {

namespace {

bool is_file(const std::string& p) {
    struct stat st;
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
bool is_dir(const std::string& p) {
    struct stat st;
    return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string dir_of(const std::string& p) {
    size_t s = p.rfind('/');
    if (s == std::string::npos) return ".";
    return s == 0 ? "/" : p.substr(0, s);
}

std::string real_path(const std::string& p) {
    char buf[PATH_MAX];
    return ::realpath(p.c_str(), buf) ? std::string(buf) : p;
}

// ld.so splits LD_PRELOAD at spaces and colons, with no way to quote them: a library path holding
// one is preloaded as two names that do not exist, ld.so prints its own error, and the run records
// nothing.
bool preloadable(const std::string& p) { return p.find_first_of(" :") == std::string::npos; }

// The error for a library whose path LD_PRELOAD cannot carry: what to do instead.
std::string unpreloadable(const std::string& lib) {
    return "libgpumem.so's path '" + lib +
           "' holds a space or a colon, which LD_PRELOAD cannot carry (ld.so splits its list there); link it "
           "from a path of your own without either and name the link in GPUMEM_LIB (e.g. mkdir -p ~/.local/lib && "
           "ln -sfn \"" + lib + "\" ~/.local/lib/libgpumem.so, then set GPUMEM_LIB=~/.local/lib/libgpumem.so; not /tmp, "
           "where another user may have made that name first)";
}

// libgpumem.so: $GPUMEM_LIB, else relative to this executable (install layout, then build tree).
bool find_library(std::string& lib, std::string& error) {
    if (const char* env = std::getenv("GPUMEM_LIB"); env && *env) {
        if (is_file(env)) {
            // A link the user made to get around a space in the real path is kept as given.
            const std::string given = env[0] == '/' ? std::string(env) : std::string();
            lib = !given.empty() && preloadable(given) ? given : real_path(env);
            if (preloadable(lib)) return true;
            error = unpreloadable(lib);
            return false;
        }
        error = std::string("GPUMEM_LIB=") + env + " is not a file";
        return false;
    }
    char exe[PATH_MAX];
    ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        error = "cannot read /proc/self/exe to find libgpumem.so; set GPUMEM_LIB";
        return false;
    }
    exe[n] = 0;
    std::string bindir = dir_of(exe);
    std::string rel = GPUMEM_BIN_TO_LIBDIR;
    std::vector<std::string> tried;
    // An absolute CMAKE_INSTALL_LIBDIR is used as it is; a relative one is relative to bindir.
    tried.push_back((rel.size() && rel[0] == '/' ? rel : bindir + "/" + rel) + "/libgpumem.so");
    tried.push_back(bindir + "/../lib/libgpumem.so");
    tried.push_back(bindir + "/../preload/libgpumem.so");  // build tree: build/analyzer/gpumem
    tried.push_back(bindir + "/libgpumem.so");             // both copied into one folder (--help says so)
    tried.erase(std::unique(tried.begin(), tried.end()), tried.end());  // rel is often ../lib
    for (const std::string& t : tried) {
        if (is_file(t)) {
            lib = real_path(t);
            if (preloadable(lib)) return true;
            error = unpreloadable(lib);
            return false;
        }
    }
    error = "libgpumem.so not found; tried";
    for (const std::string& t : tried) error += " " + t;
    error += " (set GPUMEM_LIB to its path)";
    return false;
}

// The pattern's files as a glob: %p/%r/%h match anything, %% is a '%', glob characters in the
// literal parts are escaped.
std::string pattern_glob(const std::string& pattern) {
    std::string g;
    for (size_t i = 0; i < pattern.size(); ++i) {
        char c = pattern[i];
        if (c == '%' && i + 1 < pattern.size()) {
            char n = pattern[++i];
            if (n == 'p' || n == 'r' || n == 'h') g += '*';
            else if (n == '%') g += '%';
            else {
                g += '%';
                --i;
            }
            continue;
        }
        if (c == '*' || c == '?' || c == '[' || c == '\\') g += '\\';
        g += c;
    }
    return g;
}

struct file_stamp {
    int64_t mtime_ns = 0;
    int64_t size = 0;
    uint64_t inode = 0;
};

std::map<std::string, file_stamp> list_matching(const std::string& pattern) {
    std::map<std::string, file_stamp> out;
    glob_t g{};
    // A name that exists already makes the library write NAME.<pid>.EXT instead (docs/log-format.md,
    // "File safety"): a second process of a pattern without %p, or a program after exec.
    std::string glob = pattern_glob(pattern);
    size_t slash = glob.rfind('/'), dot = glob.rfind('.');
    size_t base = slash == std::string::npos ? 0 : slash + 1;
    if (dot == std::string::npos || dot <= base) dot = glob.size();
    std::string clash_glob = glob.substr(0, dot) + ".*" + glob.substr(dot);
    int rc = ::glob(glob.c_str(), 0, nullptr, &g);
    if (::glob(clash_glob.c_str(), rc == 0 ? GLOB_APPEND : 0, nullptr, &g) == 0 || rc == 0) {
        for (size_t i = 0; i < g.gl_pathc; ++i) {
            struct stat st;
            if (::stat(g.gl_pathv[i], &st) != 0 || !S_ISREG(st.st_mode)) continue;
            out[g.gl_pathv[i]] = {int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec, int64_t(st.st_size),
                                  uint64_t(st.st_ino)};
        }
    }
    ::globfree(&g);
    return out;
}

// What a path that is not a regular file is, for a message: the library writes its log to a
// character device or its user's FIFO as it is (log-format.md, "File safety"), and such a log
// cannot be read back.  Empty for a regular file, a symbolic link (the library never writes
// through one) or a name that does not exist.
std::string non_regular_kind(const std::string& p) {
    struct stat st;
    if (::lstat(p.c_str(), &st) != 0) return {};
    if (S_ISCHR(st.st_mode)) return "a character device";
    if (S_ISFIFO(st.st_mode)) return "a FIFO";
    if (S_ISBLK(st.st_mode)) return "a block device";
    if (S_ISSOCK(st.st_mode)) return "a socket";
    return {};
}

// The pattern's matches that are not regular files (-o /dev/null), with what each is.
std::vector<std::pair<std::string, std::string>> non_regular_matches(const std::string& pattern) {
    std::vector<std::pair<std::string, std::string>> out;
    glob_t g{};
    if (::glob(pattern_glob(pattern).c_str(), 0, nullptr, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; ++i)
            if (std::string kind = non_regular_kind(g.gl_pathv[i]); !kind.empty()) out.emplace_back(g.gl_pathv[i], kind);
    ::globfree(&g);
    return out;
}

// Whether a pattern differs from process to process (%p, %r): two processes' expansions, by the
// library's own rule (core/config.h expand_out_pattern), differ.
bool differs_per_process(const std::string& pattern, const std::string& host) {
    return expand_out_pattern(pattern, 1, host, "0") != expand_out_pattern(pattern, 2, host, "1");
}
// Whether a pattern differs by pid alone (%p; "%%p" is a percent sign and a p), by the same rule.
bool differs_per_pid(const std::string& pattern, const std::string& host) {
    return expand_out_pattern(pattern, 1, host, "") != expand_out_pattern(pattern, 2, host, "");
}

// False with errno set when DIR cannot be made or is something else (a file named like it): the
// library would then write to /tmp (log-format.md, "Fallback"), where run would not find the log.
bool make_dirs(const std::string& dir) {
    if (dir.empty() || is_dir(dir)) return true;
    if (!make_dirs(dir_of(dir))) return false;
    if (::mkdir(dir.c_str(), 0777) == 0) return true;
    if (errno != EEXIST) return false;
    if (is_dir(dir)) return true;  // made by someone else meanwhile
    errno = ENOTDIR;
    return false;
}

volatile sig_atomic_t g_child = 0;

// gpumem stays in the foreground while the command runs: a SIGINT, SIGQUIT, SIGTERM or SIGHUP meant
// for the job is passed to the command (which then ends and is summarized) rather than ending gpumem
// first, as timeout(1) and torchrun do.  Ctrl-C and Ctrl-\ from the terminal (si_code SI_KERNEL)
// already reach the command, which is in the same foreground process group: those are not sent a
// second time.
void forward_signal(int sig, siginfo_t* info, void*) {
    if ((sig == SIGINT || sig == SIGQUIT) && info && info->si_code == SI_KERNEL) return;
    if (g_child > 0) ::kill(pid_t(g_child), sig);
}

constexpr int k_forwarded[] = {SIGINT, SIGQUIT, SIGTERM, SIGHUP};

// The output pattern as a shell glob: %p, %r and %h become a bare *, the rest is quoted.
std::string shell_glob(const std::string& pattern) {
    std::string out, literal;
    for (size_t i = 0; i < pattern.size(); ++i) {
        if (pattern[i] == '%' && i + 1 < pattern.size() && std::strchr("prh%", pattern[i + 1])) {
            char n = pattern[++i];
            if (n == '%') {
                literal += '%';
                continue;
            }
            if (!literal.empty()) out += shell_quote(literal);
            literal.clear();
            out += '*';
            continue;
        }
        literal += pattern[i];
    }
    if (!literal.empty()) out += shell_quote(literal);
    return out;
}

void print_summary(const std::vector<std::string>& logs, unsigned jobs, const progress_flags& progress) {
    // The logs of a long job are read after it has ended: without progress, gpumem would sit
    // silent for as long as `gpumem report` takes on them (seconds per GB).
    analyze_options opt;
    opt.progress = progress.wanted();
    opt.progress_interval_s = progress.every_s;
    // One log per thread, on all cores unless -j says fewer, as `gpumem report` reads them (a job
    // of many ranks leaves many logs, and each log being read holds its rebuilt state); each into
    // its own slot, so rows and warnings come in the order of the logs.
    struct slot {
        std::optional<process_report> rep;
        std::string error;
    };
    std::vector<slot> slots(logs.size());
    parallel_for(logs.size(), jobs_or_cores(jobs), [&](size_t i) {
        try {
            slots[i].rep = analyze_file(logs[i], opt);
        } catch (const std::exception& e) {
            slots[i].error = e.what();
        } catch (...) {  // parallel_for's threads must not throw
            slots[i].error = "unexpected error";
        }
    });
    std::vector<process_report> procs;
    for (size_t i = 0; i < logs.size(); ++i) {
        if (slots[i].rep)
            procs.push_back(std::move(*slots[i].rep));
        else
            spdlog::warn("{}", "cannot summarize " + logs[i] + ": " + slots[i].error);
    }
    if (procs.empty()) return;
    std::fprintf(stderr, "\ngpumem summary (peaks per process and GPU; leaks = still allocated at the end)\n");
    bool unended = false;  // a row whose "leaks" are the live blocks where a log stops
    // The table's cells, heading first, printed once every row is known: a column is as wide as its
    // widest value plus one, at least its usual width, so two spaces always part the columns (a
    // "12,345 / 11.50 GiB *" of leaks, a long rank).
    using table_row = std::array<std::string, 10>;
    std::vector<table_row> table{{"pid", "rank", "dev", "requested", "allocated", "reserved", "frag", "leaks", "OOMs", "ended"}};
    const size_t k_max_rows = 16;  // one screen
    size_t rows = 0, hidden = 0;
    std::vector<std::pair<const process_report*, const oom_report*>> ooms;
    uint64_t n_ooms = 0;
    for (const process_report& p : procs) {
        std::string ended = p.end_text();
        // From the log: shown, never sent to the terminal as is (a NUL would also cut the row).
        const std::string rank = visible(p.rank);
        bool any = false;
        for (const device_report& d : p.devices) {
            for (const oom_report& o : d.ooms) ooms.emplace_back(&p, &o);
            n_ooms += d.oom_count();
            // Host memory rows only when the program pinned any (PyTorch and JAX often leave an
            // empty one behind).
            if (d.dev < 0 && d.reserved.peak == 0 && d.n_leaks == 0 && d.n_oom == 0) continue;
            any = true;
            if (rows >= k_max_rows) {
                ++hidden;
                continue;
            }
            ++rows;
            // Without an end line the process did not exit: what it held then is live, not leaked
            // (docs/metrics.md), and the report calls it so.
            std::string leaks = fmt_count(d.n_leaks) + " / " + fmt_bytes(d.leaked_bytes) + (p.has_end ? "" : " *");
            unended |= !p.has_end;
            // Fragmentation is of free space in gpumem's pool segments: without any (--pool off) it
            // is not measured, and a 0.0% would read as "not fragmented" (docs/metrics.md).
            std::string frag = d.segment_count.peak ? fmt_pct(d.max_external_fragmentation) : "-";
            table.push_back({std::to_string(p.pid), rank, d.dev < 0 ? "host" : std::to_string(d.dev),
                             fmt_bytes(d.requested.peak), fmt_bytes(d.allocated.peak), fmt_bytes(d.reserved.peak), frag,
                             leaks, std::to_string(d.n_oom), visible(ended)});
        }
        if (!any && rows < k_max_rows) {
            ++rows;
            table.push_back({std::to_string(p.pid), rank, "-", "-", "-", "-", "-", "no allocations", "-", visible(ended)});
        }
    }
    // Usual widths: pid, rank and dev left-aligned, the rest right-aligned, "ended" last and unpadded.
    std::array<size_t, 10> width{8, 5, 4, 12, 12, 12, 7, 18, 5, 0};
    for (const table_row& r : table)
        for (size_t c = 0; c + 1 < r.size(); ++c) width[c] = std::max(width[c], r[c].size() + 1);
    for (const table_row& r : table) {
        std::string line = " ";
        for (size_t c = 0; c + 1 < r.size(); ++c) {
            const std::string fill(width[c] - r[c].size(), ' ');
            line += " " + (c < 3 ? r[c] + fill : fill + r[c]);
        }
        std::fprintf(stderr, "%s  %s\n", line.c_str(), r.back().c_str());
    }
    if (hidden) std::fprintf(stderr, "  ... %s: see gpumem report\n", fmt_counted(hidden, "more row", "more rows").c_str());
    if (unended) std::fprintf(stderr, "  * live when the log stops: the process did not exit, so not a leak\n");
    for (size_t i = 0; i < ooms.size() && i < 3; ++i) {
        const oom_report& o = *ooms[i].second;
        // The line that asked, when the log recorded the failing call's stack: what to look at first.
        std::string asked = asked_by_name(*ooms[i].first, o.stack);
        if (!asked.empty()) asked = ", asked for by " + asked;
        std::fprintf(stderr, "  OOM in pid %lld at %s: %s of %s, verdict %s%s%s\n", (long long)ooms[i].first->pid,
                     fmt_time(o.t).c_str(), visible(o.api).c_str(), fmt_bytes(o.size).c_str(), o.verdict.c_str(),
                     o.verdict_caveat(), visible(asked).c_str());
    }
    // Counted from n_oom, as the table's column: ooms holds only the first 1000 of each device.
    if (n_ooms > 3) std::fprintf(stderr, "  ... %s\n", fmt_counted(n_ooms - 3, "more OOM", "more OOMs").c_str());
    if (procs.size() > 1) {
        combined_report c = combine(procs);
        if (c.rows.size() > 1)
            std::fprintf(stderr, "  peak reserved over %zu (process, GPU) pairs: max %s, min %s, imbalance %s\n", c.rows.size(),
                         fmt_bytes(c.max_peak_reserved).c_str(), fmt_bytes(c.min_peak_reserved).c_str(),
                         fmt_pct(c.imbalance).c_str());
    }
}

// gpumem ends as the command ended: killed by the same signal, as timeout(1) does.  A shell that
// ran gpumem got the terminal's Ctrl-C too, and goes on only when its child exited normally (it takes
// it that the child handled the signal): exiting with 130 let a script's loop of `gpumem run` go on
// past Ctrl-C.  A shell still shows 128+N.  gpumem's own core is not dumped (the command's is the one
// to read).  Returns rc for a signal whose default action does not end a process.
int end_as_command(int status, int rc) {
    if (!WIFSIGNALED(status)) return rc;
    const int sig = WTERMSIG(status);
    std::fflush(nullptr);
    ::prctl(PR_SET_DUMPABLE, 0);
    ::signal(sig, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    ::sigprocmask(SIG_UNBLOCK, &set, nullptr);
    ::raise(sig);
    return rc;
}

}  // namespace

struct run_args {
    std::string pattern;  // -o; empty when not given
    std::string pool;
    bool no_summary = false;
    bool tensors = false;
    unsigned jobs = 0;        // the summary's threads; 0: all cores
    progress_flags progress;  // of the summary's reading
    std::vector<std::string> help_only_command;
};

int run_command(run_args& args, const std::vector<std::string>& command_args) {
    // Without -o, a GPUMEM_OUT already set is the pattern, as a GPUMEM_POOL already set is the pool
    // setting without --pool (it was replaced by the default without a word); messages name it.
    std::string pattern = args.pattern, origin = "-o ";
    if (const char* env = std::getenv("GPUMEM_OUT"); pattern.empty() && env && *env) pattern = env, origin = "GPUMEM_OUT=";
    if (pattern.empty()) pattern = config::k_default_out;
    const std::string& pool = args.pool;
    bool summary = !args.no_summary;
    // As for every output option: "-" is no file here, and the log a file of that name in the
    // current directory, where standard output was meant.
    if (pattern == "-")
        return usage_error("run", origin + "-: give a path pattern; standard output is the program's (a file named - is ./-)");
    // The library keeps an unknown token as written (%q, a typo for %p, would name every
    // process's log alike); refused here, before the command starts.
    if (std::string t = unknown_out_token(pattern); !t.empty())
        return usage_error("run", origin + pattern + ": " + (t == "%" ? "a % at the end" : t) +
                                  " is no token; the tokens are " + k_out_tokens);
    if (!pool.empty() && pool != "on" && pool != "off")
        return usage_error("run", "--pool " + pool + ": expected on or off");
    if (command_args.empty()) return usage_error("run", "no command given");
    std::vector<char*> cmd_argv;
    for (const std::string& s : command_args) cmd_argv.push_back(const_cast<char*>(s.c_str()));
    cmd_argv.push_back(nullptr);
    char** cmd = cmd_argv.data();

    std::string lib, error;
    if (!find_library(lib, error)) {
        spdlog::error("{}", error);
        return k_exit_input;
    }

    // A directory gets the library's default name inside it (config::k_default_out; the library
    // applies the same rule to GPUMEM_OUT, core/config.h log_path_for): lstat, as there, so a
    // symlink to a directory counts only with a trailing '/'.
    struct stat st;
    if (pattern.back() == '/' || (::lstat(pattern.c_str(), &st) == 0 && S_ISDIR(st.st_mode)))
        pattern = (pattern.back() == '/' ? pattern : pattern + "/") + config::k_default_out;
    if (pattern[0] != '/') {
        char cwd[PATH_MAX];
        if (!::getcwd(cwd, sizeof cwd)) {
            spdlog::error("cannot read the current directory: {}", std::strerror(errno));
            return k_exit_input;
        }
        // The directory's own % signs are no tokens ("/work/100%p" stays as named): escaped as %%.
        std::string dir_part;
        for (const char* c = cwd; *c; ++c) dir_part += *c == '%' ? std::string("%%") : std::string(1, *c);
        pattern = dir_part + "/" + pattern;
    }
    // The library makes no directory (a missing one sends the log to /tmp, log-format.md
    // "Fallback"), so run makes it now.  %h and %% are the same for every process of the run on this
    // host; %p and %r are each process's own and cannot be made ahead.
    std::string dir = dir_of(pattern);
    char host[256] = "";
    ::gethostname(host, sizeof host - 1);
    if (differs_per_process(dir, host)) {
        spdlog::warn("{}{}: the directory part holds %p or %r, which gpumem run cannot create ahead; a process "
                     "whose directory is missing writes its log to /tmp instead (put %p and %r in the file name: "
                     "DIR/gpumem-%r-%p.jsonl)",
                     origin, pattern);
    } else {
        dir = expand_out_pattern(dir, 0, host, "");
        if (!make_dirs(dir)) {
            spdlog::error("cannot create {}: {}", dir, std::strerror(errno));
            return k_exit_input;
        }
    }
    // A device or FIFO is written to as it is by every process, never under a .PID name.
    if (!differs_per_pid(pattern, host) && non_regular_kind(pattern).empty())
        spdlog::warn("{}{} has no %p: a second process of the same rank writes its log with .PID added to the name", origin,
                     pattern);

    std::map<std::string, file_stamp> before = list_matching(pattern);

    // The library goes first so its symbols win, but a preload the user needs stays.
    std::string preload = lib;
    if (const char* old = std::getenv("LD_PRELOAD"); old && *old) preload += std::string(":") + old;
    ::setenv("LD_PRELOAD", preload.c_str(), 1);
    ::setenv("GPUMEM_OUT", pattern.c_str(), 1);
    // Tensor-level mode without the pool makes every tensor a driver call, which the guide advises
    // against; the run goes on (it is still a valid log), said once before the program's output.
    // --pool wins over a GPUMEM_POOL already set, which the library reads as parse_bool does.
    if (args.tensors) {
        std::string off_by;
        bool on = true;
        if (!pool.empty()) {
            if (pool == "off") off_by = "--pool off";
        } else if (const char* env = std::getenv("GPUMEM_POOL"); parse_bool(env, &on) && !on) {
            off_by = std::string("GPUMEM_POOL=") + env;
        }
        if (!off_by.empty())
            spdlog::warn("--tensors with {}: every tensor is a driver call (220-260 us per iteration of a small loop "
                         "instead of 18-21 us with gpumem's pool; docs/guide.md)",
                         off_by);
    }
    if (!pool.empty()) ::setenv("GPUMEM_POOL", pool.c_str(), 1);
    // Tensor-level mode: PyTorch hands every tensor to cudaMalloc, and gpumem's pool keeps that fast.
    if (args.tensors) ::setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "1", 1);

    // exec failures come back through a close-on-exec pipe: a successful exec closes it unwritten.
    int exec_pipe[2] = {-1, -1};
    if (::pipe2(exec_pipe, O_CLOEXEC) != 0) {
        spdlog::error("pipe: {}", std::strerror(errno));
        return k_exit_input;
    }
    // The signals to forward are blocked from before the fork until the child's pid is known, so
    // none sent in between is lost; the child unblocks them before exec, which resets the handler.
    sigset_t fwd_set, old_mask;
    sigemptyset(&fwd_set);
    for (int sig : k_forwarded) sigaddset(&fwd_set, sig);
    ::sigprocmask(SIG_BLOCK, &fwd_set, &old_mask);
    struct sigaction fwd {}, old_act[std::size(k_forwarded)];
    fwd.sa_sigaction = forward_signal;
    fwd.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&fwd.sa_mask);
    for (size_t i = 0; i < std::size(k_forwarded); ++i) {
        ::sigaction(k_forwarded[i], nullptr, &old_act[i]);
        // A signal gpumem was started with ignored (nohup ignores SIGHUP, a shell's `&` SIGINT and
        // SIGQUIT) stays ignored, and so it reaches the command ignored, as without gpumem: a
        // handler here would be reset to the default action by the child's exec.
        if (!(old_act[i].sa_flags & SA_SIGINFO) && old_act[i].sa_handler == SIG_IGN) continue;
        ::sigaction(k_forwarded[i], &fwd, nullptr);
    }

    // Made before the fork: the child allocates nothing between fork and exec.
    const std::string shown_cmd = visible(cmd[0]);
    std::fflush(nullptr);
    pid_t child = ::fork();
    if (child < 0) {
        spdlog::error("fork: {}", std::strerror(errno));
        for (size_t i = 0; i < std::size(k_forwarded); ++i) ::sigaction(k_forwarded[i], &old_act[i], nullptr);
        ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
        return k_exit_input;
    }
    if (child == 0) {
        ::close(exec_pipe[0]);
        ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
        ::execvp(cmd[0], cmd);
        int e = errno;
        std::fprintf(stderr, "gpumem: error: cannot run %s: %s\n", shown_cmd.c_str(), std::strerror(e));
        ssize_t ignored = ::write(exec_pipe[1], &e, sizeof e);
        (void)ignored;
        ::_exit(e == ENOENT ? 127 : 126);
    }
    g_child = child;
    ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
    ::close(exec_pipe[1]);
    int exec_errno = 0;
    ssize_t got;
    while ((got = ::read(exec_pipe[0], &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR) {
    }
    ::close(exec_pipe[0]);
    bool exec_failed = got == ssize_t(sizeof exec_errno);
    int status = 0;
    while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    for (size_t i = 0; i < std::size(k_forwarded); ++i) ::sigaction(k_forwarded[i], &old_act[i], nullptr);
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
    // The command never ran: its message was printed; no log, and no hint about CUDA calls.
    if (exec_failed) return rc;

    std::vector<std::string> logs;
    for (const auto& [path, st] : list_matching(pattern)) {
        auto it = before.find(path);
        if (it == before.end() || it->second.mtime_ns != st.mtime_ns || it->second.size != st.size ||
            it->second.inode != st.inode)
            logs.push_back(path);
    }
    if (WIFSIGNALED(status))
        std::fprintf(stderr, "\ngpumem run: %s was killed by signal %d (exit code %d)\n", shown_cmd.c_str(), WTERMSIG(status), rc);
    if (logs.empty()) {
        // The log may well have been written, to a file that cannot be read back: say that, and
        // not that the command made no CUDA call.
        std::vector<std::pair<std::string, std::string>> sinks = non_regular_matches(pattern);
        for (const auto& [path, kind] : sinks)
            std::fprintf(stderr,
                         "\ngpumem run: %s is %s, not a regular file: a log written there cannot be read back, so "
                         "there is no log to list or summarize (where a write there failed, as on /dev/full, the log "
                         "moved to /tmp: a message above names it, for gpumem report)\n",
                         visible(path).c_str(), kind.c_str());
        if (!sinks.empty()) return end_as_command(status, rc);
        std::fprintf(stderr,
                     "\ngpumem run: no log matching %s was written: the command made no CUDA call, or cleared "
                     "LD_PRELOAD, or is a setuid program, or its log went to /tmp (a message above then says so)\n",
                     visible(pattern).c_str());
        return end_as_command(status, rc);
    }
    std::fprintf(stderr, "\ngpumem run: %zu log%s (pattern %s):\n", logs.size(), logs.size() == 1 ? "" : "s",
                 visible(pattern).c_str());
    for (const std::string& l : logs) std::fprintf(stderr, "  %s\n", visible(l).c_str());
    // Logs of an earlier run in the same folder (a baseline recorded again with the same -o) are
    // read with this run's by any glob of it: `gpumem report --json gpumem-logs/*.jsonl` then makes
    // a baseline of both runs, its second rank 0 "rank 0#2", which every later run fails as missing.
    std::vector<std::string> earlier;
    for (const auto& [path, st] : list_matching(pattern))
        if (before.count(path) && std::find(logs.begin(), logs.end(), path) == logs.end()) earlier.push_back(path);
    if (!earlier.empty())
        std::fprintf(stderr,
                     "gpumem run: %zu earlier log%s match%s the pattern too, from before this run (%s%s): a glob of "
                     "the folder reads %s with this run's, as more processes (a second rank 0 is \"rank 0#2\"); "
                     "move %s away before a run, or give -o a folder of its own\n",
                     earlier.size(), earlier.size() == 1 ? "" : "s", earlier.size() == 1 ? "es" : "", visible(earlier[0]).c_str(),
                     earlier.size() > 1 ? ", ..." : "", earlier.size() == 1 ? "it" : "them",
                     earlier.size() == 1 ? "it" : "them");
    if (summary) {
        print_summary(logs, args.jobs, args.progress);
        std::string all;
        for (const std::string& l : logs) all += " " + shell_quote(l);
        if (all.size() > 200 && earlier.empty()) all = " " + shell_glob(pattern);  // the glob would take them too
        std::fprintf(stderr, "full report: gpumem report%s\n", all.c_str());
    }
    return end_as_command(status, rc);
}

command add_run(CLI::App& top) {
    auto a = std::make_shared<run_args>();
    CLI::App* app = top.add_subcommand("run", "run a program with libgpumem.so preloaded, then list and summarize its logs");
    app->footer(
        "Runs CMD with libgpumem.so preloaded (added in front of any LD_PRELOAD already set), so every\n"
        "process it starts writes its own log, then lists the logs and prints a summary on stderr.\n"
        "Everything from CMD on (the first argument that is not an option, or the one after --) goes to\n"
        "the program untouched.\n"
        "PATTERN: %p pid, %r rank ($RANK/$LOCAL_RANK), %h host, %% a percent sign; a PATTERN ending in /\n"
        "(or an existing directory) means PATTERN/gpumem-%p.jsonl.  Relative patterns are made absolute,\n"
        "so children that chdir log to the same place; a missing directory is created (one named with\n"
        "%p or %r cannot be: put those in the file name).\n"
        "Without -o, a GPUMEM_OUT already set is the PATTERN.  Other GPUMEM_* settings and the rest\n"
        "of the environment pass through unchanged.\n"
        "libgpumem.so is taken from $GPUMEM_LIB, else found from this gpumem: installed, <prefix>/lib;\n"
        "build tree, build/preload; or copied into the same folder as gpumem.  Its path may hold no\n"
        "space or colon (LD_PRELOAD splits there): link it from one without, named in GPUMEM_LIB.\n"
        "\n"
        "exit codes: the command's own; killed by the same signal N when one killed it, after the summary\n"
        "(a shell shows 128+N); 127 command not found, 126 not executable; 2 for gpumem's own arguments\n"
        "or a missing libgpumem.so.");
    app->add_option("-o,--out", a->pattern,
                    "log path pattern, set as GPUMEM_OUT (default: $GPUMEM_OUT when set, else gpumem-%p.jsonl); see below")
        ->type_name("PATTERN");
    app->add_option("--pool", a->pool,
                    "GPUMEM_POOL: on (the default), gpumem's pool serves cudaMalloc; off, every call goes to the driver")
        ->type_name("on|off");
    app->add_flag("--tensors", a->tensors,
                  "tensor-level mode: sets PYTORCH_NO_CUDA_MEMORY_CACHING=1, so every PyTorch tensor is its own "
                  "allocation with its own call site (gpumem's pool keeps it at native speed; docs/guide.md)");
    app->add_flag("--no-summary", a->no_summary, "list the logs but print no summary");
    add_count_option(app, "-j,--jobs", [a](uint64_t v) { a->jobs = unsigned(v); },
                     "threads that read the logs for the summary, one log each (default: all cores)", 1, k_max_jobs);
    add_progress_flags(app, a->progress);
    // Only for --help: main hands the command to run_command before CLI11 parses the options.
    app->add_option("CMD", a->help_only_command, "the program and its arguments, passed on untouched");
    command c;
    c.app = app;
    c.tail = command::tail_kind::command;
    c.run = [a](const std::vector<std::string>& tail, bool) { return run_command(*a, tail); };
    return c;
}

}  // namespace gpumem::analysis
