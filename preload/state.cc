// Process state of the recorder: lazy start, the log header, and the exit, signal and fork paths.
//
// Nothing here runs in a library constructor except registering the fork handler: the log, its file,
// its thread and the device query all start at the program's first allocation call, so a process
// that never allocates GPU memory is left untouched and no CUDA call happens before the program's own.
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <new>
#include <string>
#include <vector>

#include "config.h"
#include "diag.h"
#include "stacks/stack_table.h"
#include "event_format.h"
#include "stderr_write.h"
#include "gpumem_preload.h"

#ifndef GPUMEM_VERSION
#define GPUMEM_VERSION "0.0.0"
#endif

namespace gpumem {

void pool_configure(const config& cfg, recorder* rec, std::string* config_json) noexcept;
void pool_after_fork() noexcept;
void pool_at_exit() noexcept;

namespace {

// The real _exit, looked up when recording begins: _exit may run in a signal handler, where dlsym
// may not (finish_and_exit below).
std::atomic<void (*)(int)> g_real_exit{nullptr};

// A thread that finds another starting the log waits at most this long (recorder_or_null says why).
constexpr uint64_t k_start_wait_ns = 1000000000ull;
// Set once a wait ran out: until the start ends no call waits again.
std::atomic<bool> g_start_stuck{false};
// Calls that went to the driver unrecorded while the start was stuck, or that a signal handler made
// inside a hook before or during the start (recorder_if_recording), for the log's `lost` count.
std::atomic<uint64_t> g_unrecorded{0};

enum phase_t : int { not_started = 0, starting = 1, recording = 2, disabled = 3 };

struct process_state {
    config cfg;
    event_log* log = nullptr;
    recorder* rec = nullptr;
    std::atomic<int> phase{not_started};
    std::atomic<int> starter_tid{0};
    std::atomic<long> starter_pid{0};  // the process whose thread starts the log (a vfork child is another)
    std::atomic<long> owner_pid{0};  // the process whose log this is
    long forked_from = 0;
};

process_state& state() noexcept {
    // Never destroyed: frees made by other libraries' destructors at exit must still find it.
    alignas(process_state) static unsigned char storage[sizeof(process_state)];
    static process_state* s = new (storage) process_state();
    return *s;
}

// The interned call stacks.  Never destroyed, like the state: late allocations still capture.
stacks::stack_table& stack_table() noexcept {
    alignas(stacks::stack_table) static unsigned char storage[sizeof(stacks::stack_table)];
    static stacks::stack_table* t = new (storage) stacks::stack_table();
    return *t;
}

// Each line of a multi-line warning text as one warning.
void warn_lines(const std::string& text) noexcept {
    size_t b = 0;
    while (b < text.size()) {
        size_t e = text.find('\n', b);
        if (e == std::string::npos) e = text.size();
        if (e > b) GPUMEM_WARN("{}", std::string_view(text.data() + b, e - b));
        b = e + 1;
    }
}

// The process's argv, from /proc (the program's own bytes; format_header escapes them).
std::vector<std::string> read_cmdline() {
    std::vector<std::string> out;
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        std::string raw;
        char buf[4096];
        ssize_t n;
        while ((n = read(fd, buf, sizeof buf)) > 0 && raw.size() < (1u << 20)) raw.append(buf, size_t(n));
        close(fd);
        size_t start = 0;
        for (size_t i = 0; i < raw.size(); ++i) {
            if (raw[i] != '\0') continue;
            out.emplace_back(raw.data() + start, i - start);
            start = i + 1;
        }
    }
    return out;
}

// Devices, as the driver reports them.  Runs inside the program's first allocation call, so cuInit
// has happened; any failure just leaves the list short.
std::vector<header_device> devices() {
    std::vector<header_device> out;
    auto count_fn = GPUMEM_REAL(cuDeviceGetCount);
    auto get_fn = GPUMEM_REAL(cuDeviceGet);
    auto name_fn = GPUMEM_REAL(cuDeviceGetName);
    auto mem_fn = GPUMEM_REAL(cuDeviceTotalMem_v2);
    int n = 0;
    if (count_fn && get_fn && count_fn(&n) == CUDA_SUCCESS) {
        for (int i = 0; i < n && i < 64; ++i) {
            CUdevice d = 0;
            if (get_fn(&d, i) != CUDA_SUCCESS) continue;
            char name[256] = "unknown";
            if (name_fn) name_fn(name, sizeof name, d);
            size_t total = 0;
            if (mem_fn) mem_fn(&total, d);
            header_device hd;
            hd.index = i;
            hd.name.assign(name, strnlen(name, sizeof name));
            hd.total = int64_t(total);
            out.push_back(std::move(hd));
        }
    }
    return out;
}

// Why this process records no Python stacks although GPUMEM_STACKS asks for them: the interpreter
// is one gpumem cannot read ("Python stacks need CPython 3.10 to 3.13 (Python 3.14.0)"); "" when
// it records them, or runs no Python.  In the header, so that a report can say why its sites have
// no stack instead of blaming the thread.
std::string python_stacks_off(const process_state& st) {
    if (st.cfg.stacks != stacks::stack_mode::python && st.cfg.stacks != stacks::stack_mode::all) return "";
    const stacks::python_frames& py = stack_table().python();
    const char* why = py.why_off();
    if (!why || !*why) return "";
    std::string v = py.version();
    v = v.substr(0, v.find(' '));
    return v.empty() ? why : std::string(why) + " (Python " + v + ")";
}

// The header's values; core/event_format.cc writes them in the order of core/log_fields.h.
std::string header_line(const process_state& st, const std::string& pool_json, uint64_t start_unix_ns) {
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    header_values h;
    h.format = k_format_name;
    h.version = k_format_version;
    h.pid = getpid();
    h.ppid = getppid();
    h.host = host;
    h.rank = rank_from_env();
    h.cmdline = read_cmdline();
    h.start_unix_ns = int64_t(start_unix_ns);
    time_t secs = time_t(start_unix_ns / 1000000000ull);
    struct tm tm_utc;
    gmtime_r(&secs, &tm_utc);
    char iso[64];
    snprintf(iso, sizeof iso, "%04d-%02d-%02dT%02d:%02d:%02d.%09lluZ", tm_utc.tm_year + 1900, tm_utc.tm_mon + 1,
             tm_utc.tm_mday, tm_utc.tm_hour, tm_utc.tm_min, tm_utc.tm_sec,
             (unsigned long long)(start_unix_ns % 1000000000ull));
    h.start_time = iso;
    h.devices = devices();
    h.config.pool = st.cfg.pool ? config_value::pool_on : config_value::pool_off;
    h.config.out = st.cfg.out;
    h.config.flush_ms = st.cfg.flush_ms;
    h.config.buffer_events = st.cfg.buffer_events;
    h.config.stacks = stacks::k_stack_mode_names[size_t(st.cfg.stacks)];
    h.config.stack_depth = st.cfg.stack_depth;
    if (const char* r = setting_env("GPUMEM_ROUTES"); r && st.cfg.routes_set) h.config.routes = r;
    h.config.reuse = pool_json;
    h.gpumem_version = GPUMEM_VERSION;
    h.forked_from = st.forked_from;
    h.stacks_off = python_stacks_off(st);
    h.alloc_ctx = true;  // allocations outside the pools carry their context's "ctx"
    return format_header(h);
}

// True when this process owns the running log.  A vfork child (posix_spawn, Python's subprocess)
// shares the parent's memory without running fork handlers: if it calls _exit after a failed exec,
// it must not finish the parent's log.
bool owns_log(const process_state& st) noexcept {
    return st.phase.load() == recording && st.owner_pid.load() == long(getpid());
}

// Waits while another thread starts the log, at most k_start_wait_ns, and not at all once a start
// was found stuck.  The wait is bounded: the start looks up libcuda's functions and the
// interpreter's (dlsym and dlopen take the loader's lock), and a thread inside dlopen, whose
// library's constructor allocates, holds that lock while it waits here.  Unbounded, the two waited
// for each other for ever (integration test "a first allocation while a library's constructor
// allocates").  The first wait past the bound says so on stderr, naming what `after` says happens.
void wait_for_others_start(process_state& st, const char* after) noexcept {
    if (st.phase.load(std::memory_order_acquire) != starting || st.starter_tid.load() == current_tid()) return;
    // A vfork child shares the phase but not the log: its exec or _exit never waits for its parent.
    // (0: the starter has not stored its pid yet, just after it claimed the start: this process's.)
    const long starter = st.starter_pid.load();
    if (starter != 0 && starter != long(getpid())) return;
    if (g_start_stuck.load(std::memory_order_acquire)) return;
    const uint64_t since = monotonic_ns();
    while (st.phase.load(std::memory_order_acquire) == starting) {
        if (monotonic_ns() - since > k_start_wait_ns) {
            if (!g_start_stuck.exchange(true))
                write_stderr({"gpumem: the log's start on another thread takes over 1 s (perhaps waiting for this "
                              "thread, inside dlopen); ", after, "\n"});
            return;
        }
        timespec ts{0, 100000};
        nanosleep(&ts, nullptr);
    }
}

// One call that went to the driver unrecorded while the log was starting.  Counted where the
// starter will add it to the log's `lost` (it takes the count after it sets the phase), or, if
// the start ended meanwhile, added here: one of the two sees the other's store.
void count_unrecorded(process_state& st) noexcept {
    g_unrecorded.fetch_add(1);
    if (st.phase.load() == recording)
        if (uint64_t n = g_unrecorded.exchange(0)) st.log->count_lost(n);
}

// ---------------------------------------------------------------------------------------------
// Signals: flush on the way down; the end line only when the signal really ends the process.
constexpr int k_signals[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
struct sigaction g_old_actions[65];

void on_signal(int sig, siginfo_t* info, void* uctx) {
    int saved_errno = errno;
    process_state& st = state();
    const struct sigaction old = g_old_actions[sig];  // a copy: SA_RESETHAND resets the saved one
    // SIG_DFL and SIG_IGN whatever the flags: sa_handler and sa_sigaction share storage, and the
    // kernel reads 0 and 1 as those even with SA_SIGINFO set (Go's signal.Ignore sets it).
    bool user_handler = old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN;
    if (user_handler) {
        // A one-shot handler (SA_RESETHAND): the kernel would have reset it on this delivery, so the
        // next one takes the default path below, as without gpumem.
        if (old.sa_flags & SA_RESETHAND) {
            struct sigaction dfl;
            memset(&dfl, 0, sizeof dfl);
            dfl.sa_handler = SIG_DFL;
            g_old_actions[sig] = dfl;
        }
        // The program handles this signal and may well go on (Python's SIGINT handler only sets a
        // flag): nothing is written here.  A drain from a handler must treat the process as dying
        // (no heap), and the events it wrote would never enter the live table, so a free after it
        // read as unknown and the end line's totals were wrong.  The writer flushes within
        // GPUMEM_FLUSH_MS as ever, and an exit through the program's handler writes the end line.
        if (old.sa_flags & SA_SIGINFO) old.sa_sigaction(sig, info, uctx);
        else old.sa_handler(sig);
        errno = saved_errno;
        return;
    }
    if (owns_log(st)) {
        pool_frees_left_lost();  // frees a handler left to a pool call that will not come
        st.log->finish(end_reason::signal, sig, unmatched_count(), 200);
    }
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, nullptr);
    bool fault = (sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL) && info && info->si_code > 0;
    // A hardware fault re-executes the faulting instruction and dies with the default action; any
    // other signal is sent again and delivered when we return.
    if (!fault) raise(sig);
    errno = saved_errno;
}

void install_signal_handlers() noexcept {
    for (int sig : k_signals) {
        // Read, then swap in ours and compare what the swap replaced: another thread that installed
        // a handler in between gets it back, and the loop starts over from it (a plain read then
        // write lost that handler, so its signal ended the program instead).
        for (int attempt = 0; attempt < 4; ++attempt) {
            struct sigaction old;
            if (sigaction(sig, nullptr, &old) != 0) break;
        // Ignored stays ignored, SA_SIGINFO or not (Go's signal.Ignore sets it beside SIG_IGN: taken
        // for a handler, it was called at address 1 when the signal came).
            if (old.sa_handler == SIG_IGN) break;
            // Already ours (a forked child starting its own log inherits the parent's handlers): the
            // program's handler saved then stays; saved again, on_signal would call itself for ever.
            if ((old.sa_flags & SA_SIGINFO) && old.sa_sigaction == on_signal) break;
            g_old_actions[sig] = old;
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_sigaction = on_signal;
            sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
            sigemptyset(&sa.sa_mask);
            if (old.sa_handler != SIG_DFL) {
                // The program's handler runs as it was installed: with its mask, and without
                // SA_RESTART where it had none (Python's SIGINT handler: a blocking read must return
                // EINTR so that the interpreter runs its handler; restarted, Ctrl-C did nothing
                // until the read ended), and on the alternate stack only where it asked for it (a
                // small one kept for a stack-overflow handler: a SIGTERM handler that needs more
                // ran off its end and the program died of SIGSEGV, emu_app handler-stack).
                sa.sa_flags = SA_SIGINFO | (old.sa_flags & (SA_RESTART | SA_NODEFER | SA_ONSTACK));
                sa.sa_mask = old.sa_mask;
            }
            struct sigaction replaced;
            if (sigaction(sig, &sa, &replaced) != 0) break;
            if (replaced.sa_handler == old.sa_handler && replaced.sa_flags == old.sa_flags) break;  // no one came between
            sigaction(sig, &replaced, nullptr);  // theirs again; read anew
        }
    }
}

void start_recording(process_state& st) noexcept {
    try {
        std::string warnings;
        st.cfg = config::from_env(&warnings);
        diag::init(st.cfg.log_level);  // from here on, diagnostics go through spdlog
        warn_lines(warnings);
        timespec wall;
        clock_gettime(CLOCK_REALTIME, &wall);
        uint64_t start_unix_ns = uint64_t(wall.tv_sec) * 1000000000ull + uint64_t(wall.tv_nsec);
        if (!st.log) {
            event_log::options o;
            o.capacity = st.cfg.buffer_events;
            o.flush_ms = st.cfg.flush_ms;
            o.wait_ms = st.cfg.wait_ms;
            o.sink_stall_ms = st.cfg.sink_stall_ms;
            st.log = new event_log(o);
            st.rec = new recorder(*st.log);
        }
        if (!st.log->ok()) {
            GPUMEM_WARN("cannot allocate the event buffer; recording is off for this process");
            st.phase.store(disabled);
            return;
        }
        // Call stacks: the interpreter is looked for now, at the first recorded call, never earlier.
        if (st.cfg.stacks != stacks::stack_mode::off) {
            stack_table().init([](const char* name) { return real_dlsym(RTLD_DEFAULT, name); }, st.cfg.stacks,
                               st.cfg.stack_depth);
            if (std::string why = python_stacks_off(st); !why.empty()) GPUMEM_WARN("no Python call stacks: {}", why);
            st.rec->set_stacks(&stack_table());
            st.log->set_stacks(&stack_table());
        }
        std::string pool_json;
        pool_configure(st.cfg, st.rec, &pool_json);
        char host[256] = "";
        gethostname(host, sizeof host - 1);
        std::string path = log_path_for(st.cfg.out, long(getpid()), host, rank_from_env());
        if (!st.log->start(path, header_line(st, pool_json, start_unix_ns))) {
            GPUMEM_WARN("no log file could be created; recording is off for this process");
            st.phase.store(disabled);
            return;
        }
        install_signal_handlers();
        g_real_exit.store(reinterpret_cast<void (*)(int)>(real_dlsym(RTLD_NEXT, "_exit")), std::memory_order_release);
        st.owner_pid.store(long(getpid()));
        st.phase.store(recording);  // sequentially consistent: count_unrecorded's check pairs with it
        if (uint64_t n = g_unrecorded.exchange(0)) st.log->count_lost(n);
        g_start_stuck.store(false);
        GPUMEM_DEBUG("recording to {} (pool {}, ring of {} events, flush every {} ms)", st.log->path(),
                     st.cfg.pool ? "on" : "off", st.cfg.buffer_events, st.cfg.flush_ms);
    } catch (...) {
        GPUMEM_WARN("out of memory while starting; recording is off for this process");
        st.phase.store(disabled);
    }
}

// ---------------------------------------------------------------------------------------------
// fork: the child writes its own file, named by the pattern with its own pid.
void after_fork_child() {
    // The phase fork copied: a parent that was starting its log on another thread (between
    // "starting" and the log's creation, its settings half assigned) leaves a child that must not
    // start one over that state.
    const int parent_phase = state().phase.load(std::memory_order_acquire);
    note_fork();
    diag::after_fork_child();
    process_state& st = state();
    st.forked_from = long(getppid());
    if (st.log) {
        st.log->reset_after_fork();
        // The parent's live table may have been locked by a thread that does not exist here: start
        // a fresh one (the old one is leaked, on purpose).
        st.rec = new (std::nothrow) recorder(*st.log);
    }
    stack_table().unlock_after_fork();
    pool_after_fork();
    st.starter_tid.store(0);
    st.starter_pid.store(0);
    g_start_stuck.store(false);  // the parent's start, and what it missed, are the parent's
    g_unrecorded.store(0);
    // A parent that never recorded (it never touched CUDA, as a multiprocessing parent that forks
    // its workers) leaves no log behind: the child starts its own at its first call, as any
    // process does.  Off only where the child's recorder could not be made.
    st.phase.store((st.log && !st.rec) || (!st.log && parent_phase == starting) ? disabled : not_started);
    GPUMEM_DEBUG("fork: process {} of parent {} writes its own log from its first allocation", long(getpid()),
                 st.forked_from);
}

void on_quick_exit();

__attribute__((constructor)) void gpumem_init() {
    // Registering a fork handler and a quick_exit handler, and keeping the settings' variables
    // (a program that clears its environment before its first allocation keeps them: setting_env),
    // is all the constructor does: no CUDA, no files, no threads.
    snapshot_settings_env();
    pthread_atfork([] { stack_table().lock_for_fork(); }, [] { stack_table().unlock_after_fork(); },
                   after_fork_child);
    // quick_exit skips atexit and destructors and ends through glibc's internal _exit, which never
    // reaches ours: without this the log had no end line and lost every event still in the ring
    // (all of them for a short program).  Registered first, it runs after the program's handlers,
    // so their frees are in the log before the end line.
    at_quick_exit(on_quick_exit);
}

__attribute__((destructor)) void gpumem_fini() {
    // Runs late in exit: after the program's atexit handlers and every C++ static object's
    // destructor registered after startup (a dlopen'd framework module's included), so their last
    // frees are in the log before the end line.  Libraries the program links directly are
    // initialised before a preload and finalised after it, and with glibc before 2.39 so are the
    // ELF destructor functions of dlopen'd modules: their frees follow the end line
    // (event_log::publish writes them; tests: GPUMEM_EMU_LATE_ALLOC).
    process_state& st = state();
    // A log another thread is still starting (its first allocation just before the exit) would
    // otherwise end without its events or an end line, silently: the header alone, under load
    // (integration test "threads still allocating at exit ...").  glibc runs destructors without
    // the loader's lock, so the start can finish meanwhile (not after an exit called inside dlopen,
    // a library constructor's: then the wait ends at its bound).
    wait_for_others_start(st, "the process exits before it ends, and the log has no end line");
    pool_at_exit();
    if (owns_log(st)) {
        st.log->finish(end_reason::exit, 0, unmatched_count(), 200);
        GPUMEM_DEBUG("exit: {} finished with {} events, {} lost", st.log->path(), st.log->totals().events,
                     st.log->lost());
    }
}

}  // namespace

recorder* recorder_or_null(bool count_if_unrecorded) noexcept {
    process_state& st = state();
    int ph = st.phase.load(std::memory_order_acquire);
    if (ph == recording) return st.rec;
    if (ph == disabled) return nullptr;
    int expected = not_started;
    if (ph == not_started && st.phase.compare_exchange_strong(expected, starting)) {
        st.starter_pid.store(long(getpid()));
        st.starter_tid.store(current_tid());
        start_recording(st);
        return st.phase.load() == recording ? st.rec : nullptr;
    }
    // Another thread is starting the log (a few hundred µs at most); the starter itself, re-entering
    // through a hooked call, must not wait for itself.
    if (st.starter_tid.load() == current_tid()) return nullptr;
    // Past the bound the call goes to the driver unrecorded, counted lost, and so does every call
    // until the start ends, without waiting again.
    wait_for_others_start(st, "calls made meanwhile go to the driver unrecorded and are counted lost");
    ph = st.phase.load();
    if (ph == recording) return st.rec;
    if (ph == starting && count_if_unrecorded) count_unrecorded(st);
    return nullptr;
}

recorder* recorder_if_recording() noexcept {
    process_state& st = state();
    const int ph = st.phase.load(std::memory_order_acquire);
    if (ph == recording) return st.rec;
    // Not started, or a start under way (another thread's, or this thread's own, interrupted): this
    // call may neither start the log nor wait for a start (that thread may wait for a lock the
    // interrupted code holds), so it goes unrecorded, counted lost when the start ends.  Outside a
    // hook the same call would have started the log and been in it: an allocation made here would
    // be missing from it, its later free that of an unknown pointer.
    if (ph == not_started || ph == starting) count_unrecorded(st);
    return nullptr;
}

const config& current_config() noexcept { return state().cfg; }

int current_device() noexcept {
    auto fn = GPUMEM_REAL(cuCtxGetDevice);
    CUdevice d = -1;
    if (!fn || fn(&d) != CUDA_SUCCESS) return -1;
    return int(d);
}

// _exit and _Exit skip atexit and destructors; multiprocessing workers end this way.  Finish the log
// first, then exit for real.  _exit is async-signal-safe and programs call it from signal handlers,
// which may have interrupted malloc or the stack table's lock: so the writer thread writes what is
// pending (it may take those locks; this thread waits at most 100 ms for it), finish() then uses no
// heap (end_reason::fast_exit), and the real _exit was looked up when recording began.
static void finish_fast() noexcept {
    process_state& st = state();
    wait_for_others_start(st, "the process exits before it ends, and the log has no end line");  // as gpumem_fini
    if (owns_log(st)) {
        st.log->let_writer_drain(100);
        pool_frees_left_lost();
        st.log->finish(end_reason::fast_exit, 0, unmatched_count(), 200);
    }
}

namespace {
// quick_exit, like _exit, may be called from a signal handler: the same heap-free ending.
void on_quick_exit() { finish_fast(); }
}  // namespace

[[noreturn]] static void finish_and_exit(int status) noexcept {
    finish_fast();
    if (auto real_exit = g_real_exit.load(std::memory_order_acquire)) real_exit(status);
    for (;;) syscall(SYS_exit_group, status);  // what glibc's _exit does
}

}  // namespace gpumem

extern "C" __attribute__((visibility("default"), noreturn)) void _exit(int status) { gpumem::finish_and_exit(status); }
extern "C" __attribute__((visibility("default"), noreturn)) void _Exit(int status) { gpumem::finish_and_exit(status); }

// ---------------------------------------------------------------------------------------------
// exec: the new image keeps the pid but not our memory, so the log is finished first (end line
// with reason "exec").  The new image, if it records, finds the file taken and writes to the
// pattern's name with `.<pid>` added (open_log_file).  If the exec fails the process goes on: the
// end line is taken back and recording continues in the same file.  Only system calls and the
// log's own buffers are used here: no CUDA, no heap.
namespace gpumem {
namespace {

// True when this call finished the log (so the caller must resume it if the exec fails).  A vfork
// child does not own the log and passes straight through; a nested exec (one libc function calling
// another through its PLT) finds the log already finished.
bool finish_for_exec() noexcept {
    process_state& st = state();
    // A log another thread is still starting would end at the exec with its header alone, if
    // that (as at exit, gpumem_fini).
    wait_for_others_start(st, "the exec comes before it ends, and the old image's log has no end line");
    if (!owns_log(st) || st.log->finished()) return false;
    pool_frees_left_lost();  // their blocks stay allocated if the exec fails
    st.log->finish(end_reason::exec, 0, unmatched_count(), 200);
    return true;
}

template <class F>
int around_exec(F&& real_call) noexcept {
    bool finished_here = finish_for_exec();
    int rc = real_call();
    int e = errno;
    if (finished_here) state().log->resume_after_failed_exec();
    errno = e;
    return rc;
}

template <class F>
F real_libc(const char* name) noexcept {
    return reinterpret_cast<F>(real_dlsym(RTLD_NEXT, name));
}

int no_such_function() noexcept {
    errno = ENOSYS;
    return -1;
}

using execve_fn = int (*)(const char*, char* const[], char* const[]);
using execv_fn = int (*)(const char*, char* const[]);
using fexecve_fn = int (*)(int, char* const[], char* const[]);
using execveat_fn = int (*)(int, const char*, char* const[], char* const[], int);

}  // namespace
}  // namespace gpumem

#define GPUMEM_EXPORT extern "C" __attribute__((visibility("default")))

GPUMEM_EXPORT int execve(const char* path, char* const argv[], char* const envp[]) {
    static auto real = gpumem::real_libc<gpumem::execve_fn>("execve");
    return gpumem::around_exec([&] { return real ? real(path, argv, envp) : gpumem::no_such_function(); });
}

GPUMEM_EXPORT int execv(const char* path, char* const argv[]) {
    static auto real = gpumem::real_libc<gpumem::execv_fn>("execv");
    return gpumem::around_exec([&] { return real ? real(path, argv) : gpumem::no_such_function(); });
}

GPUMEM_EXPORT int execvp(const char* file, char* const argv[]) {
    static auto real = gpumem::real_libc<gpumem::execv_fn>("execvp");
    return gpumem::around_exec([&] { return real ? real(file, argv) : gpumem::no_such_function(); });
}

GPUMEM_EXPORT int execvpe(const char* file, char* const argv[], char* const envp[]) {
    static auto real = gpumem::real_libc<gpumem::execve_fn>("execvpe");
    return gpumem::around_exec([&] { return real ? real(file, argv, envp) : gpumem::no_such_function(); });
}

GPUMEM_EXPORT int fexecve(int fd, char* const argv[], char* const envp[]) {
    static auto real = gpumem::real_libc<gpumem::fexecve_fn>("fexecve");
    return gpumem::around_exec([&] { return real ? real(fd, argv, envp) : gpumem::no_such_function(); });
}

GPUMEM_EXPORT int execveat(int dirfd, const char* path, char* const argv[], char* const envp[], int flags) {
    static auto real = gpumem::real_libc<gpumem::execveat_fn>("execveat");
    return gpumem::around_exec([&] { return real ? real(dirfd, path, argv, envp, flags) : gpumem::no_such_function(); });
}

// The execl family takes its arguments as a list: gather them into an argv on the stack (as glibc
// does; the size is the caller's argument count) and go through the hooks above.
#define GPUMEM_GATHER_ARGS(arg0, argv_out, after)                                 \
    size_t argc_ = 1;                                                              \
    {                                                                              \
        va_list ap_;                                                               \
        va_start(ap_, arg0);                                                       \
        while (va_arg(ap_, const char*)) ++argc_;                                  \
        va_end(ap_);                                                               \
    }                                                                              \
    char** argv_out = static_cast<char**>(__builtin_alloca((argc_ + 1) * sizeof(char*))); \
    {                                                                              \
        va_list ap_;                                                               \
        va_start(ap_, arg0);                                                       \
        argv_out[0] = const_cast<char*>(arg0);                                     \
        for (size_t i_ = 1; i_ <= argc_; ++i_) argv_out[i_] = va_arg(ap_, char*);  \
        after;                                                                     \
        va_end(ap_);                                                               \
    }

GPUMEM_EXPORT int execl(const char* path, const char* arg, ...) {
    GPUMEM_GATHER_ARGS(arg, argv, (void)0);
    return execve(path, argv, environ);
}

GPUMEM_EXPORT int execlp(const char* file, const char* arg, ...) {
    GPUMEM_GATHER_ARGS(arg, argv, (void)0);
    return execvp(file, argv);
}

GPUMEM_EXPORT int execle(const char* path, const char* arg, ...) {
    char** envp = nullptr;
    GPUMEM_GATHER_ARGS(arg, argv, envp = va_arg(ap_, char**));
    return execve(path, argv, envp);
}
