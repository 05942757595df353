// The event log: a lock-free ring that callers publish into, drained to a JSON Lines file by a writer thread.
#include "event_log.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>
#include <new>
#include <ctime>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "event_format.h"
#include "stderr_write.h"
#include "stacks/stack_table.h"

namespace gpumem {

namespace {
constexpr size_t k_buf_size = 256 * 1024;

void sleep_ns(long ns) noexcept {
    timespec ts{ns / 1000000000L, ns % 1000000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
}

void* map_zeroed(size_t bytes) noexcept {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
}

// O_EXCL makes a planted symlink (or any existing name) fail with EEXIST instead of being followed;
// O_NOFOLLOW adds ELOOP for the same case on file systems that report it so.
constexpr int k_create_flags = O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;

bool is_clash(int err) noexcept { return err == EEXIST || err == ELOOP; }

// An existing name we may write to as it is: a character device (only root makes those) or a FIFO
// of our own user.  Opened non-blocking so a FIFO without a reader cannot hang the program; a FIFO
// stays so: a reader that stops reading must not hold the writer (and the exit that waits for it)
// for ever either (write_all bounds the wait).  A device (a tty under flow control, say) blocks
// as before.  The flag is this open's own: the program's descriptors are untouched.
// *no_reader: set when it is such a FIFO that nobody has open for reading (ENXIO), for the message.
int open_existing_sink(const char* path, bool* no_reader = nullptr) noexcept {
    struct stat st;
    if (lstat(path, &st) != 0) return -1;
    bool ok = S_ISCHR(st.st_mode) || (S_ISFIFO(st.st_mode) && st.st_uid == geteuid());
    if (!ok) return -1;
    int fd = open(path, O_WRONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);  // never the process's terminal
    if (fd < 0) {
        if (no_reader) *no_reader = errno == ENXIO && S_ISFIFO(st.st_mode);
        return -1;
    }
    struct stat got;
    // The name may have been swapped between lstat and open: judge what was opened.
    if (fstat(fd, &got) != 0 || got.st_dev != st.st_dev || got.st_ino != st.st_ino) {
        close(fd);
        return -1;
    }
    if (!S_ISFIFO(st.st_mode)) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}
}  // namespace

// Whether the existing log at `path` is this pid's own, from before an exec: its header names the
// pid, and the new image finds the name taken (docs/log-format.md, "exec").  Only for the message.
static bool header_names_pid(const char* path, long pid) noexcept {
    // A regular file only: opening a FIFO to read would wake (and cut off) its writer.
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) return false;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return false;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return false;
    }
    char head[4096];
    ssize_t n;
    while ((n = read(fd, head, sizeof head - 1)) < 0 && errno == EINTR) {}
    close(fd);
    if (n <= 0) return false;
    head[n] = 0;
    if (char* nl = std::strchr(head, '\n')) *nl = 0;
    if (!std::strstr(head, "{\"ev\":\"header\"")) return false;
    char want[40] = "\"pid\":";
    size_t k = std::strlen(want);
    char digits[24];
    size_t d = 0;
    for (unsigned long v = pid < 0 ? 0 : (unsigned long)pid; d == 0 || v; v /= 10) digits[d++] = char('0' + v % 10);
    while (d) want[k++] = digits[--d];
    want[k] = 0;
    const char* at = std::strstr(head, want);
    return at && (at[k] < '0' || at[k] > '9');
}

int open_log_file(const std::string& path, long pid, std::string* used) noexcept {
    try {
        int fd = open(path.c_str(), k_create_flags, 0600);
        if (fd >= 0) {
            *used = path;
            return fd;
        }
        if (!is_clash(errno)) return -1;
        bool no_reader = false;
        if ((fd = open_existing_sink(path.c_str(), &no_reader)) >= 0) {
            *used = path;
            return fd;
        }
        // Another name in the same directory: `.<pid>` before the extension keeps `*.jsonl` globs working.
        size_t slash = path.rfind('/');
        size_t base = slash == std::string::npos ? 0 : slash + 1;
        size_t dot = path.rfind('.');
        if (dot == std::string::npos || dot <= base) dot = path.size();
        std::string stem = path.substr(0, dot), ext = path.substr(dot);
        std::string pid_s = "." + std::to_string(pid);
        std::string name;
        for (int n = 1; n <= 8 && fd < 0; ++n) {
            name = stem + pid_s + (n > 1 ? "-" + std::to_string(n) : std::string()) + ext;
            fd = open(name.c_str(), k_create_flags, 0600);
            if (fd < 0 && !is_clash(errno)) return -1;
        }
        if (fd < 0) {
            // Every guessable name is taken (planted, say): a random one, created O_EXCL and 0600.
            name = stem + pid_s + "-XXXXXX" + ext;
            fd = mkostemps(name.data(), int(ext.size()), O_CLOEXEC);
            if (fd < 0) return -1;
        }
        if (no_reader)
            write_stderr({"gpumem: ", path, " is a FIFO with no reader (the log does not wait for one: start the "
                          "reader first); this process (pid ", decimal(pid), ") writes its log to ", name, "\n"});
        else if (header_names_pid(path.c_str(), pid))
            write_stderr({"gpumem: ", path, " holds this process's log from before its exec; the new image (pid ",
                          decimal(pid), ") writes its log to ", name, "\n"});
        else
            write_stderr({"gpumem: ", path, " already exists (another process's log, an older log, or a link); "
                          "this process (pid ", decimal(pid), ") writes its log to ", name, "\n"});
        *used = name;
        return fd;
    } catch (...) {
        errno = ENOMEM;
        return -1;
    }
}

sigpipe_guard::sigpipe_guard() noexcept {
    sigset_t pipe_only, pending;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_only, &old_);
    was_pending_ = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
}

sigpipe_guard::~sigpipe_guard() {
    if (!was_pending_) {
        sigset_t pipe_only, pending;
        sigemptyset(&pipe_only);
        sigaddset(&pipe_only, SIGPIPE);
        timespec zero{0, 0};
        if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) sigtimedwait(&pipe_only, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
}

uint64_t monotonic_ns() noexcept {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// Bumped in a fork child (note_fork), so each thread's cached tid is refreshed there: the forking
// thread carries its thread_local cache into the child, where its tid is different.
static std::atomic<uint32_t> g_fork_generation{0};

void note_fork() noexcept { g_fork_generation.fetch_add(1, std::memory_order_relaxed); }

int current_tid() noexcept {
    // Cached per thread: gettid (and getpid) are system calls, and the hot path records the tid on
    // every event.
    static thread_local int tid = 0;
    static thread_local uint32_t generation = 0;
    uint32_t g = g_fork_generation.load(std::memory_order_relaxed);
    if (tid == 0 || generation != g) {
        tid = int(syscall(SYS_gettid));
        generation = g;
    }
    return tid;
}

event_log::event_log(const options& o) noexcept : opt_(o) {
    alloc_ring();
    t0_ = monotonic_ns();
}

event_log::~event_log() {
    // Only tests destroy logs; the process-wide log is leaked on purpose so late frees at exit can
    // still be recorded.
    stop_.store(true);
    wake_writer();
    for (int i = 0; i < 2000 && writer_running_.load(); ++i) sleep_ns(1000000);
    drop_fd();
    if (ring_) munmap(ring_, sizeof(slot) * (mask_ + 1));
    if (buf_) munmap(buf_, k_buf_size);
}

void event_log::alloc_ring() noexcept {
    uint64_t cap = 1;
    while (cap < opt_.capacity) cap <<= 1;
    ring_ = static_cast<slot*>(map_zeroed(sizeof(slot) * cap));
    buf_ = static_cast<char*>(map_zeroed(k_buf_size));
    if (!ring_ || !buf_) {
        ring_ = nullptr;
        return;
    }
    mask_ = cap - 1;
    // Slot states are stored relative to the slot index (see slot::state), so the zeroed pages of a
    // fresh mapping already mean "free for the first lap" and are not touched until used.
}

uint64_t event_log::now_ns() const noexcept { return monotonic_ns() - t0_; }

bool event_log::start(const std::string& path, const std::string& header_line) noexcept {
    if (!ring_ || started_.load()) return started_.load();
    // The end line counts the stacks lost while this log ran: a forked child's table carries its
    // parent's count, for allocations in the parent's log.
    stacks_lost_base_ = stacks_ ? stacks_->dropped() : 0;
    long pid = long(getpid());
    std::string used;
    int fd = open_log_file(path, pid, &used);
    if (fd < 0) {
        int e = errno;
        const char* base = strrchr(path.c_str(), '/');
        std::string fallback;
        try {
            fallback = std::string("/tmp/") + (base ? base + 1 : path.c_str());
        } catch (...) {
            return false;
        }
        fd = open_log_file(fallback, pid, &used);
        write_stderr({"gpumem: cannot create ", path, " (", strerror(e), "); ",
                      fd >= 0 ? "writing the log to " : "also failed: ", fd >= 0 ? used : fallback, "\n"});
        if (fd < 0) return false;
    }
    try {
        path_ = used;
    } catch (...) {
    }
    adopt_fd(fd);
    written_ = 0;
    write_all(header_line.data(), header_line.size());
    started_.store(true, std::memory_order_release);

    // The writer must never receive the program's signals: a process-directed SIGTERM landing on it
    // would run our flush on the thread that holds the output lock.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    writer_running_.store(true);
    if (pthread_create(&th, &attr, &event_log::writer_main, this) != 0) writer_running_.store(false);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return true;
}

void* event_log::writer_main(void* self) noexcept {
    auto* log = static_cast<event_log*>(self);
#ifdef __linux__
    pthread_setname_np(pthread_self(), "gpumem-writer");
#endif
    // Runs until the process ends, idle after finish(): a failed exec takes the end line back and
    // recording resumes (resume_after_failed_exec), and a thread cannot be restarted from there safely.
    while (!log->stop_.load(std::memory_order_acquire)) {
        uint32_t w = log->wake_.load(std::memory_order_acquire);
        log->wake_pending_.store(false, std::memory_order_relaxed);
        // finish() is waiting for the lock: let it have it (it drains everything itself).
        if (log->end_requested_.load(std::memory_order_acquire)) {
            sleep_ns(100000);
            continue;
        }
        if (log->lock_output(lock_wait::forever)) {
            if (!log->finished_.load(std::memory_order_acquire)) log->drain_locked();
            log->unlock_output();
        }
        timespec ts{log->opt_.flush_ms / 1000, long(log->opt_.flush_ms % 1000) * 1000000L};
        syscall(SYS_futex, reinterpret_cast<uint32_t*>(&log->wake_), FUTEX_WAIT_PRIVATE, w, &ts, nullptr, 0);
    }
    log->writer_running_.store(false, std::memory_order_release);
    return nullptr;
}

void event_log::wake_writer() noexcept {
    if (wake_pending_.exchange(true, std::memory_order_relaxed)) return;
    wake_.fetch_add(1, std::memory_order_release);
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&wake_), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}

bool event_log::lock_output(lock_wait how) noexcept {
    int me = current_tid();
    int expected = 0;
    if (out_owner_.compare_exchange_strong(expected, me, std::memory_order_acquire)) return true;
    if (expected == me) return how != lock_wait::forever;  // a signal interrupted our own drain: go on, unlocked
    if (how == lock_wait::forever) {
        // Normal contention (writer vs. a caller draining inline): wait, it only formats and writes.
        for (;;) {
            expected = 0;
            if (out_owner_.compare_exchange_weak(expected, me, std::memory_order_acquire)) return true;
            sleep_ns(20000);
        }
    }
    // The holder is another thread that may be stuck: a crash gives it 500 ms; _exit waits while it
    // makes progress (a slow disk), then 1 s.  Going on unlocked beside a live holder would mix
    // both drains' lines, so it is the last resort.
    uint64_t seen = progress_.load(std::memory_order_relaxed);
    int idle_limit = how == lock_wait::crash ? 5000 : 10000;
    for (int idle = 0; idle < idle_limit; ++idle) {
        expected = 0;
        if (out_owner_.compare_exchange_weak(expected, me, std::memory_order_acquire)) return true;
        sleep_ns(100000);
        uint64_t now = progress_.load(std::memory_order_relaxed);
        if (how == lock_wait::while_progress && now != seen) {
            seen = now;
            idle = 0;
        }
    }
    return true;  // a stuck holder: a messy tail beats no tail
}

void event_log::unlock_output() noexcept {
    int me = current_tid();
    int expected = me;
    out_owner_.compare_exchange_strong(expected, 0, std::memory_order_release);
}

event* event_log::claim() noexcept {
    if (!ring_) {
        lost_.fetch_add(1, std::memory_order_relaxed);
        return nullptr;
    }
    uint64_t pos = head_.load(std::memory_order_relaxed);
    uint64_t waited_since = 0;
    for (;;) {
        slot& s = ring_[pos & mask_];
        uint64_t st = state_of(pos);
        int64_t diff = int64_t(st) - int64_t(pos);
        if (diff == 0) {
            if (head_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
                // Wake the writer every quarter ring so a burst never waits a whole flush interval.
                if ((pos & (mask_ >> 2)) == 0 && pos) wake_writer();
                s.e.seq = pos;
                return &s.e;
            }
        } else if (diff < 0) {
            // Full: the slot still holds an event from one lap ago.  Let the writer catch up; with
            // no writer (not started, or a fork child before its first start) drain here.
            uint64_t now = monotonic_ns();
            if (!waited_since) waited_since = now;
            if (now - waited_since > uint64_t(opt_.wait_ms) * 1000000ull) {
                lost_.fetch_add(1, std::memory_order_relaxed);
                return nullptr;
            }
            if (!writer_running_.load(std::memory_order_acquire) && started_.load(std::memory_order_acquire)) {
                drain(false);
            } else {
                wake_writer();
                sleep_ns(50000);
            }
            pos = head_.load(std::memory_order_relaxed);
        } else {
            pos = head_.load(std::memory_order_relaxed);
        }
    }
}

void event_log::publish(event* e) noexcept {
    mark_published(e->seq);  // e is the event of the slot of its seq
    if (finished_.load(std::memory_order_acquire)) {
        // A late event after the end line (a free from a static destructor that ran after ours):
        // write it now rather than lose it.  An earlier slot still claimed (a thread preempted, or
        // inside a real cuMemFree, between claim and publish) would hold it in the ring, and the
        // process, about to end, would take both with it (CI's loaded 2 cores lost 3 of 6 late
        // lines so): wait for that thread as finish() did, then pass over its slot, counted lost.
        if (lock_output(lock_wait::forever)) {
            drain_through(e->seq + 1, late_wait_ms_, false);
            unlock_output();
        }
    }
}

void event_log::record(const event& e) noexcept {
    event* slot_event = claim();
    if (!slot_event) return;
    uint64_t seq = slot_event->seq;
    *slot_event = e;
    slot_event->seq = seq;
    if (!slot_event->t_ns) slot_event->t_ns = now_ns();
    if (!slot_event->tid) slot_event->tid = uint32_t(current_tid());
    publish(slot_event);
}

// Above the numbers a program's own open() takes first, so that ours is not the one it expects
// (3, after a lazy first allocation) nor the next it is given; within RLIMIT_NOFILE (else kept).
constexpr int k_log_fd_floor = 512;

// The file a descriptor holds, by device and inode.  statx asks for the inode alone and without a
// sync: fstat on NFS writes the file's dirty pages back first (for an exact mtime), which would
// make every write of the log wait for the server.  fstat where the kernel has no statx.
static bool fd_identity(int fd, dev_t* dev, ino_t* ino) noexcept {
    struct statx sx;
    if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_INO, &sx) == 0) {
        *dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
        *ino = ino_t(sx.stx_ino);
        return true;
    }
    if (errno != ENOSYS) return false;  // EBADF: closed
    struct stat st;
    if (fstat(fd, &st) != 0) return false;
    *dev = st.st_dev;
    *ino = st.st_ino;
    return true;
}

bool event_log::holds_log_file(int fd) const noexcept {
    dev_t dev;
    ino_t ino;
    return fd >= 0 && fd_identity(fd, &dev, &ino) && dev == fd_dev_ && ino == fd_ino_;
}

bool event_log::fd_ours() const noexcept { return holds_log_file(fd_); }

void event_log::adopt_fd(int fd) noexcept {
    if (fd >= 0 && fd < k_log_fd_floor) {
        int high = fcntl(fd, F_DUPFD_CLOEXEC, k_log_fd_floor);
        if (high >= 0) {
            close(fd);
            fd = high;
        }
    }
    fd_ = fd;
    if (fd >= 0) fd_identity(fd, &fd_dev_, &fd_ino_);
}

void event_log::drop_fd() noexcept {
    if (fd_ours()) close(fd_);
    fd_ = -1;
}

bool event_log::reopen_lost_fd() noexcept {
    // The number is the program's now (or nothing's): never written, truncated or closed by us
    // again.  The log's own file, opened anew by its name, goes on where it stopped.  open, fstat,
    // lseek and write_stderr are async-signal-safe: a crash handler's last flush may come here.
    fd_ = -1;
    struct stat st;
    int fd = -1;
    if (lstat(path_.c_str(), &st) == 0 && st.st_dev == fd_dev_ && st.st_ino == fd_ino_)
        fd = S_ISREG(st.st_mode) ? open(path_.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC) : open_existing_sink(path_.c_str());
    if (fd >= 0 && (!holds_log_file(fd) || (S_ISREG(st.st_mode) && lseek(fd, off_t(written_), SEEK_SET) != off_t(written_)))) {
        close(fd);
        fd = -1;
    }
    if (fd < 0) {
        write_failed_ = true;
        write_stderr({"gpumem: the program closed or reused the log's descriptor, and ", path_,
                      " cannot be opened again; the log ends there\n"});
        return false;
    }
    adopt_fd(fd);
    write_stderr({"gpumem: the program closed or reused the log's descriptor; ", path_, " was opened again and the log goes on\n"});
    return true;
}

void event_log::write_all(const char* p, size_t n) noexcept {
    sigpipe_guard no_sigpipe;  // a FIFO whose reader left: EPIPE, then the /tmp move
    uint64_t stalled_since = 0;  // a full FIFO (EAGAIN): when it last took a byte
    while (n && fd_ >= 0) {
        // Before every write, a stalled FIFO's and a partial write's next one included: the
        // program may have closed the number, or dup2'ed its own file onto it, meanwhile.
        if (!fd_ours() && !reopen_lost_fd()) return;
        ssize_t w = write(fd_, p, n);
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            // A FIFO sink whose reader is slow waits; one that took nothing for sink_stall_ms
            // (a reader stopped, not gone) is a failed write, so neither the program's
            // allocations nor its exit wait on it for ever.  poll and clock_gettime are
            // async-signal-safe: a crash handler's last flush may come here.
            const uint64_t now = monotonic_ns();
            if (!stalled_since) stalled_since = now;
            if (!opt_.sink_stall_ms || now - stalled_since < uint64_t(opt_.sink_stall_ms) * 1000000ull) {
                pollfd pf{fd_, POLLOUT, 0};
                poll(&pf, 1, 100);
                continue;
            }
            write_stderr({"gpumem: ", path_, " took nothing for ", decimal(long(opt_.sink_stall_ms)),
                          " ms (its reader stopped reading)\n"});
            if (!switch_after_write_error(ETIMEDOUT)) return;
            stalled_since = 0;
            continue;
        }
        if (w < 0 || (w == 0 && n)) {
            int err = w < 0 ? errno : ENOSPC;
            if (err == EINTR) continue;
            if (!switch_after_write_error(err)) return;
            continue;
        }
        stalled_since = 0;
        p += w;
        n -= size_t(w);
        written_ += uint64_t(w);
        progress_.store(progress_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    }
}

bool event_log::switch_after_write_error(int err) noexcept {
    // Moving to a new file builds its name on the heap: not from a signal handler, which may have
    // interrupted malloc.  There the log ends where the write failed, and stderr says so.
    // A write that failed because the number stopped being ours (closed between the check and
    // the write: EBADF) needs the file again, not the /tmp move.  From here on old is ours.
    if (!fd_ours()) return reopen_lost_fd();
    int old = fd_;
    fd_ = -1;
    if (write_failed_) {
        // The fallback failed too (or the log's file was lost): the log ends here, and says so.
        close(old);
        write_stderr({"gpumem: writing ", path_, " failed too (errno ", decimal(err), "); the log ends there\n"});
        return false;
    }
    if (in_signal_) {
        write_failed_ = true;
        close(old);
        write_stderr({"gpumem: writing ", path_, " failed (errno ", decimal(err),
                      ") while the process ended (a signal or _exit); the log ends there\n"});
        return false;
    }
    write_failed_ = true;
    const char* base = strrchr(path_.c_str(), '/');
    std::string fallback, used;
    int fd = -1;
    try {
        fallback = std::string("/tmp/") + (base ? base + 1 : path_.c_str());
        fd = open_log_file(fallback, long(getpid()), &used);
    } catch (...) {
    }
    // Carry over what the first file holds, so the new one starts with the header.
    struct stat st;
    const bool readable = written_ == 0 || (fstat(old, &st) == 0 && S_ISREG(st.st_mode));  // not a FIFO
    bool carried = fd >= 0 && readable;
    if (fd >= 0 && written_ > 0 && carried) {
        char copy[4096];
        for (uint64_t off = 0; off < written_ && carried;) {
            ssize_t r = pread(old, copy, size_t(written_ - off < sizeof copy ? written_ - off : sizeof copy), off_t(off));
            if (r <= 0) carried = false;
            for (ssize_t done = 0; carried && done < r;) {
                ssize_t w = write(fd, copy + done, size_t(r - done));
                if (w < 0 && errno == EINTR) continue;
                if (w <= 0) carried = false;
                else done += w;
            }
            off += uint64_t(r > 0 ? r : 0);
        }
    }
    close(old);
    if (fd >= 0 && carried) {
        write_stderr({"gpumem: writing ", path_, " failed (", strerror(err), "); the log continues in ", used, "\n"});
        adopt_fd(fd);
        try {
            path_ = used;
        } catch (...) {
        }
        return true;
    }
    if (fd >= 0) {
        close(fd);
        unlink(used.c_str());
        if (!readable) {
            // Not the fallback's fault: a FIFO or a device cannot be read back, and a log without
            // its start is no log.
            write_stderr({"gpumem: writing ", path_, " failed (", strerror(err),
                          "); what it took cannot be read back into a new file, so no log is written from here\n"});
            return false;
        }
    }
    write_stderr({"gpumem: writing ", path_, " failed (", strerror(err), "), and so did the fallback ",
                  fallback.empty() ? std::string_view("/tmp") : std::string_view(fallback), "; no log is written\n"});
    return false;
}

void event_log::note_losses() noexcept {
    uint64_t lost_now = lost_.load(std::memory_order_relaxed);
    if (lost_now == lost_reported_) return;
    event l{};
    l.ev = ev_kind::lost;
    l.seq = tail_;
    l.t_ns = now_ns();
    l.tid = uint32_t(current_tid());
    l.c.count = lost_now - lost_reported_;
    lost_reported_ = lost_now;
    lost_in_lines_ += l.c.count;
    buf_len_ += format_event(l, buf_ + buf_len_, k_buf_size - buf_len_);
}

void event_log::account(event& e, bool from_signal) noexcept {
    totals_.events++;
    switch (e.ev) {
        case ev_kind::alloc: {
            totals_.n_alloc++;
            totals_.live_allocs++;
            totals_.live_bytes += e.b.size;
            // No heap work from a signal handler: the process is ending, the map is not needed again.
            if (from_signal) break;
            try {
                (e.kind == mem_kind::vmm ? live_vmm_ : live_)[e.b.ptr] =
                    live_entry{e.b.size, e.b.asize, e.dev, e.kind, (e.flags & ef_pooled) != 0, e.ctx,
                               (e.flags & ef_has_stream) != 0};
            } catch (...) {
                // Out of memory: this allocation's free will be logged "unknown".
            }
            break;
        }
        case ev_kind::free:
        case ev_kind::free_fail: {
            if (e.ev == ev_kind::free) totals_.n_free++;
            else totals_.n_fail++;
            if (e.flags & ef_pooled) {
                // The pool wrote the block's own sizes; only keep the map in step.
                if (e.ev == ev_kind::free && !from_signal) live_.erase(e.b.ptr);
            } else {
                auto& map = e.kind == mem_kind::vmm ? live_vmm_ : live_;
                auto it = map.find(e.b.ptr);
                if (it == map.end()) {
                    if (e.ev == ev_kind::free) e.flags |= ef_size_unknown;
                    break;
                }
                e.b.size = it->second.size;
                e.b.asize = it->second.asize;
                e.kind = it->second.kind;  // cudaFree of managed memory is a managed free
                if (e.dev < 0) e.dev = it->second.dev;
                if (e.ev == ev_kind::free && !from_signal) map.erase(it);
            }
            if (e.ev == ev_kind::free) {
                if (totals_.live_allocs) totals_.live_allocs--;
                totals_.live_bytes -= e.b.size < totals_.live_bytes ? e.b.size : totals_.live_bytes;
            }
            break;
        }
        case ev_kind::alloc_fail:
            totals_.n_fail++;
            break;
        case ev_kind::map: {
            // cuMemMap names no device: the mapped memory is on its handle's (cuMemCreate's location).
            if (e.dev >= 0) break;
            auto it = live_vmm_.find(e.b.handle);
            if (it != live_vmm_.end()) e.dev = it->second.dev;
            break;
        }
        case ev_kind::context_reset: {
            // The context's allocations died with it (docs/log-format.md, layout rule 6): its
            // pool's blocks and its allocations outside the pools, those of its (dev, ctx), but no
            // stream-ordered one, which no context owns.  The analyzer drops the same, so the end
            // line's live counts agree, and a later free of another context's allocation still
            // finds its size here.
            if (from_signal || e.dev < 0) break;
            for (auto it = live_.begin(); it != live_.end();) {
                if (it->second.dev != e.dev || it->second.ctx != e.ctx || it->second.stream_ordered) {
                    ++it;
                    continue;
                }
                if (totals_.live_allocs) totals_.live_allocs--;
                totals_.live_bytes -= it->second.size < totals_.live_bytes ? it->second.size : totals_.live_bytes;
                it = live_.erase(it);
            }
            break;
        }
        default:
            break;
    }
}

void event_log::write_stack_record(event& e, bool from_signal) noexcept {
    if ((e.ev != ev_kind::alloc && e.ev != ev_kind::alloc_fail) || e.b.stack == 0) return;
    uint64_t id = e.b.stack;
    if (id < stack_written_.size() && stack_written_[id]) return;
    if (from_signal || !stacks_) {
        e.b.stack = 0;  // a stack id must never appear before its record
        return;
    }
    try {
        std::string rec;
        if (!stacks_->format_record(uint32_t(id), rec)) {
            e.b.stack = 0;
            return;
        }
        if (id >= stack_written_.size()) stack_written_.resize(id + 1024, false);
        stack_written_[id] = true;
        // Records can be long (256 frames): write what is buffered first, then the record itself.
        write_all(buf_, buf_len_);
        buf_len_ = 0;
        write_all(rec.data(), rec.size());
    } catch (...) {
        e.b.stack = 0;
    }
}

void event_log::drain(bool from_signal) noexcept {
    if (!started_.load(std::memory_order_acquire)) return;
    if (!lock_output(from_signal ? lock_wait::crash : lock_wait::forever)) return;
    drain_locked(0, from_signal);
    unlock_output();
}

void event_log::drain_through(uint64_t end, uint32_t wait_ms, bool from_signal) noexcept {
    drain_locked(0, from_signal);
    for (uint32_t i = 0; i < wait_ms * 10 && tail_ < end; ++i) {
        sleep_ns(100000);
        drain_locked(0, from_signal);
    }
    drain_locked(end, from_signal);
}

void event_log::drain_locked(uint64_t skip_before, bool from_signal) noexcept {
    // With no file left (write_all gave up) the events are still consumed, or the ring would stay
    // full and every producer would wait out its budget.
    if (!ring_ || !buf_) return;
    in_signal_ = from_signal;
    if (n_abandoned_ || abandoned_overflow_) release_abandoned();
    uint64_t t = tail_;
    uint64_t cap = mask_ + 1;
    // At most up to the head seen now: with other threads publishing as fast as this loop writes,
    // an unbounded drain could chase them for seconds (an exit took 1-16 s with two threads
    // allocating without pause); what they publish meanwhile waits for the next drain.
    uint64_t limit = head_.load(std::memory_order_acquire);
    if (skip_before > limit) limit = skip_before;
    buf_len_ = 0;
    note_losses();
    for (; t < limit; ++t) {
        slot& s = ring_[t & mask_];
        uint64_t st = state_of(t);
        if (st != t + 1) {
            if (t >= skip_before) break;
            // Claimed but never published (its thread is stuck or gone): count it, move on, and
            // remember the slot so that it can serve again once its thread lets go of it.
            lost_.fetch_add(1, std::memory_order_relaxed);
            // Before the end line is written its `lost` states this one; after it, a lost line.
            if (end_written_) note_losses();
            else lost_reported_++;
            if (n_abandoned_ < k_max_abandoned) abandoned_[n_abandoned_++] = t;
            else abandoned_overflow_ = true;
            continue;
        }
        progress_.store(progress_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
        account(s.e, from_signal);
        write_stack_record(s.e, from_signal);
        buf_len_ += format_event(s.e, buf_ + buf_len_, k_buf_size - buf_len_);
        make_free_for(t + cap);
        if (k_buf_size - buf_len_ < 2 * k_max_event_line) {
            // Under sustained load this loop may never reach its end: report losses with every
            // buffer written, so a log cut by SIGKILL still states them.
            tail_ = t + 1;
            note_losses();
            write_all(buf_, buf_len_);
            buf_len_ = 0;
        }
    }
    tail_ = t;
    write_all(buf_, buf_len_);
    buf_len_ = 0;
    drained_to_.store(tail_, std::memory_order_release);
}

bool event_log::let_writer_drain(uint32_t wait_ms) noexcept {
    if (!started_.load(std::memory_order_acquire) || finished_.load(std::memory_order_acquire)) return false;
    uint64_t target = head_.load(std::memory_order_acquire);
    for (uint32_t i = 0; i <= wait_ms * 10; ++i) {
        if (drained_to_.load(std::memory_order_acquire) >= target) return true;
        if (!writer_running_.load(std::memory_order_acquire)) return false;
        wake_pending_.store(false, std::memory_order_relaxed);  // this wake must reach the writer
        wake_writer();
        sleep_ns(100000);
    }
    return false;
}

void event_log::release_slot(uint64_t a) noexcept {
    uint64_t cap = mask_ + 1, next = a + cap;
    while (next < tail_) next += cap;
    make_free_for(next);
}

void event_log::release_abandoned() noexcept {
    // A passed-over slot published at last: its event was counted lost already (it cannot go out
    // of seq order); the slot serves again, as drain_locked leaves every slot it consumes.
    int kept = 0;
    for (int i = 0; i < n_abandoned_; ++i) {
        uint64_t a = abandoned_[i];
        if (state_of(a) == a + 1)
            release_slot(a);
        else
            abandoned_[kept++] = a;
    }
    n_abandoned_ = kept;
    if (!abandoned_overflow_) return;
    // More were passed over than the list holds: find them in the ring.  A slot's logical state is
    // its position (free or claimed) or its position + 1 (published); one behind tail_ was passed.
    bool stuck = false;
    for (uint64_t i = 0; i <= mask_; ++i) {
        bool published;
        uint64_t pos = held_position(i, &published);
        if (pos >= tail_) continue;
        if (published) release_slot(pos);
        else stuck = true;
    }
    abandoned_overflow_ = stuck;
}

bool event_log::claim_end_position(uint64_t* pos, bool from_signal, uint32_t wait_ms) noexcept {
    // The end line takes a ring position like any event, so that one another thread claims after
    // it (a thread still allocating while the process exits) gets a later seq and follows the end
    // line in order, instead of sharing its seq (which the analyzer must refuse).
    end_pos_forced_ = false;
    for (uint32_t i = 0; ring_; ++i) {
        uint64_t p = head_.load(std::memory_order_acquire);
        uint64_t st = state_of(p);
        if (st == p && head_.compare_exchange_strong(p, p + 1, std::memory_order_acq_rel)) {
            *pos = p;
            return true;
        }
        if (int64_t(st) - int64_t(p) >= 0) continue;  // another thread took p: try the next
        // Full: the slot still holds an event a lap old, which only this consumer can free.
        if (i < wait_ms * 10) {
            drain_locked(0, from_signal);
            sleep_ns(100000);
            continue;
        }
        // Still full: the oldest slots are claimed by threads that do not publish (stuck in a
        // driver call).  Pass over everything before p (counted lost), then take p even though
        // its slot is such a claim: it stays passed-over, and serves again after its event.
        drain_locked(p, from_signal);
        bool published;
        uint64_t held_for = held_position(p & mask_, &published);
        if (tail_ == p && held_for < p && head_.compare_exchange_strong(p, p + 1, std::memory_order_acq_rel)) {
            *pos = p;
            end_pos_forced_ = true;
            return true;
        }
        if (i > wait_ms * 10 + 64) break;
    }
    *pos = head_.load(std::memory_order_acquire);
    return false;
}

void event_log::finish(end_reason why, int sig, uint64_t unmatched, uint32_t in_flight_wait_ms) noexcept {
    if (!started_.load(std::memory_order_acquire)) return;
    bool from_signal = why == end_reason::signal || why == end_reason::fast_exit;
    // The writer holds off while an end is requested, so that this call gets the output lock; it
    // may go on once this call returns, whichever way.
    struct end_request {
        std::atomic<bool>& flag;
        explicit end_request(std::atomic<bool>& f) noexcept : flag(f) { flag.store(true, std::memory_order_release); }
        ~end_request() { flag.store(false, std::memory_order_release); }
    } requested(end_requested_);
    lock_wait how = why == end_reason::signal      ? lock_wait::crash
                    : why == end_reason::fast_exit ? lock_wait::while_progress
                                                   : lock_wait::forever;
    if (!lock_output(how)) return;
    if (finished_.exchange(true, std::memory_order_acq_rel)) {
        unlock_output();
        return;
    }
    late_wait_ms_ = in_flight_wait_ms;
    drain_locked(0, from_signal);
    uint64_t end_seq = 0;
    end_pos_owned_ = claim_end_position(&end_seq, from_signal, in_flight_wait_ms);
    // Other threads may be between claim() and publish(), e.g. inside a real cuMemFree.
    drain_through(end_seq, in_flight_wait_ms, from_signal);

    // The end line is an event like the others: core/log_fields.h says what it carries.
    event e{};
    e.ev = ev_kind::end;
    e.seq = end_seq;
    e.t_ns = now_ns();
    e.tid = uint32_t(current_tid());
    e.x.reason = why;
    e.x.signal = int16_t(sig);
    e.x.events = totals_.events;
    e.x.n_alloc = totals_.n_alloc;
    e.x.n_free = totals_.n_free;
    e.x.n_fail = totals_.n_fail;
    e.x.live_allocs = totals_.live_allocs;
    e.x.live_bytes = totals_.live_bytes;
    e.x.lost = lost_.load(std::memory_order_relaxed);
    e.x.unmatched = unmatched;
    // Lock-free: the crash path writes this line too.
    e.x.stacks_lost = uint32_t(std::min<uint64_t>(stacks_ ? stacks_->dropped() - stacks_lost_base_ : 0, UINT32_MAX));
    char line[k_max_event_line];
    size_t n = format_event(e, line, sizeof line);
    end_offset_ = fd_ >= 0 ? int64_t(written_) : -1;
    end_len_ = int64_t(n);
    end_pos_ = end_seq;
    write_all(line, n);
    end_written_ = true;
    // The end line states every loss it counts, one a producer gave up on after the last lost line
    // too: a lost line after it states only later ones (the analyzer adds them to its count).
    lost_reported_ = e.x.lost;
    lost_in_lines_at_end_ = lost_in_lines_;
    if (end_pos_owned_) {
        // The end line's slot is consumed like an event's (unless a stuck claim still holds it:
        // release_slot frees it past this position later); events claimed after it go out now.
        if (!end_pos_forced_)
            make_free_for(end_seq + mask_ + 1);
        tail_ = end_seq + 1;
        drain_locked(0, from_signal);
    }
    unlock_output();
}

void event_log::resume_after_failed_exec() noexcept {
    if (!started_.load(std::memory_order_acquire) || !lock_output(lock_wait::forever)) return;
    if (finished_.load(std::memory_order_acquire)) {
        drain_locked();
        // The end line is cut out of the file.  Lines other threads wrote after it stay, moved up
        // over it; if they cannot be moved they are cut too, and counted lost.  A file that cannot
        // be cut (a FIFO) keeps the end line, and the log goes on after it.
        bool cut = false;
        uint64_t late_lines = tail_ > end_pos_ + 1 ? tail_ - end_pos_ - 1 : 0;
        if (fd_ >= 0 && !fd_ours()) reopen_lost_fd();  // never cut a file the program opened under our number
        if (fd_ >= 0 && end_offset_ >= 0 && buf_) {
            uint64_t from = uint64_t(end_offset_ + end_len_), to = uint64_t(end_offset_);
            bool moved = true;
            while (moved && from < written_) {
                size_t n = size_t(std::min<uint64_t>(k_buf_size, written_ - from));
                ssize_t r = pread(fd_, buf_, n, off_t(from));
                moved = r > 0 && pwrite(fd_, buf_, size_t(r), off_t(to)) == r;
                if (moved) from += uint64_t(r), to += uint64_t(r);
            }
            if (!moved) to = uint64_t(end_offset_);
            if (ftruncate(fd_, off_t(to)) == 0 && lseek(fd_, off_t(to), SEEK_SET) == off_t(to)) {
                cut = true;
                written_ = to;
                if (!moved) lost_.fetch_add(late_lines, std::memory_order_relaxed);
                // What only the end line stated (and the late lost lines, when cut with it) is
                // stated again by the next lost line.
                if (!moved) lost_in_lines_ = lost_in_lines_at_end_;
                lost_reported_ = lost_in_lines_;
            }
        }
        if (cut && end_pos_owned_ && !end_pos_forced_ && late_lines == 0) {
            // No event came after the end line: its position goes back, so the log goes on with
            // no gap in seq.  The slot is made free for that position before the head moves back.
            uint64_t cap = mask_ + 1;
            make_free_for(end_pos_);
            uint64_t expect = end_pos_ + 1;
            if (head_.compare_exchange_strong(expect, end_pos_, std::memory_order_acq_rel)) {
                tail_ = end_pos_;
                drained_to_.store(end_pos_, std::memory_order_release);
            } else {
                make_free_for(end_pos_ + cap);
            }
        }
        end_offset_ = -1;
        end_len_ = 0;
        end_pos_owned_ = false;
        end_pos_forced_ = false;
        finished_.store(false, std::memory_order_release);
        end_written_ = false;
    }
    unlock_output();
    wake_writer();
}

void event_log::reset_after_fork() noexcept {
    // Only the forking thread exists in the child; the parent's writer and any half-written slot are
    // gone.  The parent keeps writing its own copy of these events, so the child starts empty.
    drop_fd();  // the parent's file, unless the program's own now holds the number
    slot* old_ring = ring_;
    char* old_buf = buf_;
    uint64_t old_cap = mask_ + 1;
    ring_ = nullptr;
    buf_ = nullptr;
    alloc_ring();
    if (old_ring) munmap(old_ring, sizeof(slot) * old_cap);
    if (old_buf) munmap(old_buf, k_buf_size);
    head_.store(0);
    tail_ = 0;
    drained_to_.store(0);
    out_owner_.store(0);
    wake_.store(0);
    wake_pending_.store(false);
    writer_running_.store(false);
    stop_.store(false);
    finished_.store(false);
    started_.store(false);
    lost_.store(0);
    lost_reported_ = 0;
    lost_in_lines_ = lost_in_lines_at_end_ = 0;
    written_ = 0;
    end_offset_ = -1;
    end_len_ = 0;
    end_pos_owned_ = false;
    end_written_ = false;
    n_abandoned_ = 0;
    abandoned_overflow_ = false;
    end_pos_forced_ = false;
    end_requested_.store(false);
    progress_.store(0);
    write_failed_ = false;
    totals_ = log_totals{};
    // The parent's writer may have been inside these maps when fork() copied them: start new ones
    // and leak the old (destroying them could touch a half-updated structure).
    new (&live_) std::unordered_map<uint64_t, live_entry>();
    new (&live_vmm_) std::unordered_map<uint64_t, live_entry>();
    new (&stack_written_) std::vector<bool>();  // the child's file has no stack records yet
    t0_ = monotonic_ns();
    try {
        path_.clear();
    } catch (...) {
    }
}

}  // namespace gpumem
