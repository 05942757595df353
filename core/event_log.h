// The event log: a lock-free ring that callers publish into, drained to a JSON Lines file by a writer thread.
//
// Why this shape: the hot path must never format JSON or hold a lock across I/O, and the file must
// be in one global order (`seq`).  A bounded multi-producer ring whose slot position *is* the seq
// gives both: producers claim a position with one CAS, fill the slot and publish it; one consumer
// drains positions in order.  Nothing is dropped silently: a producer that finds the ring full waits
// (up to wait_ms) and only then counts the event as lost.  The crash path drains with no heap use.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "event_schema.h"

namespace gpumem {

namespace stacks {
class stack_table;
}

// Totals the consumer derives from the events it writes; they go on the end line.
struct log_totals {
    uint64_t events = 0, n_alloc = 0, n_free = 0, n_fail = 0, live_allocs = 0, live_bytes = 0;
};

class event_log {
  public:
    struct options {
        uint32_t capacity = 65536;  // power of two
        uint32_t flush_ms = 20;
        uint32_t wait_ms = 2000;
        // A FIFO sink that takes nothing this long has a reader that stopped reading: a failed
        // write (docs/log-format.md), so no allocation or exit waits on it for ever.  0: wait.
        uint32_t sink_stall_ms = 10000;
    };

    explicit event_log(const options& o) noexcept;
    ~event_log();
    event_log(const event_log&) = delete;
    event_log& operator=(const event_log&) = delete;

    bool ok() const noexcept { return ring_ != nullptr; }

    // Opens `path` (falling back to /tmp/<basename> if that fails), writes `header_line` and starts the
    // writer thread.  Events published before start() wait in the ring.  Returns false when no file
    // could be opened; events are then counted as lost.  The file is created new (O_EXCL, never
    // through a symlink, mode 0600); a name that exists already gets `.<pid>` before its extension
    // (open_log_file; the rule is in docs/log-format.md, "File safety").
    bool start(const std::string& path, const std::string& header_line) noexcept;
    const std::string& path() const noexcept { return path_; }

    // Two-phase publish.  claim() assigns the seq; the caller fills *slot and calls publish().
    // Returns nullptr (and counts a loss) only if the ring stayed full for wait_ms.
    event* claim() noexcept;
    void publish(event* e) noexcept;

    // One-shot publish of a filled event (seq, t are set here).
    void record(const event& e) noexcept;

    // Writes every published event now (caller's thread).  Async-signal-safe when from_signal.
    void drain(bool from_signal = false) noexcept;

    // Wakes the writer thread and waits up to wait_ms for it to write every event published so far.
    // For _exit, which may be called from a signal handler: the writer, not the calling thread,
    // then does the heap work (stack records), and finish() has little left.  False on a timeout
    // or with no writer thread.
    bool let_writer_drain(uint32_t wait_ms) noexcept;

    // Final drain + end line.  Idempotent: only the first call writes the end line.
    // `in_flight_wait_ms`: how long to wait for claimed-but-unpublished events (another thread inside
    // a real cuMemFree, say) before counting them lost.  Async-signal-safe.  For end_reason::signal
    // and end_reason::fast_exit (_exit, often called from a signal handler) it uses no heap: events
    // it drains itself go out without their stack records, and a failed write ends the log.
    void finish(end_reason why, int sig, uint64_t unmatched, uint32_t in_flight_wait_ms) noexcept;
    bool finished() const noexcept { return finished_.load(std::memory_order_acquire); }

    // After finish(end_reason::exec, ...) when the exec failed and the process goes on: takes the end
    // line back (the file is cut where it began) and recording continues in the same file.
    void resume_after_failed_exec() noexcept;

    // In a child after fork(): forget the parent's ring, file and thread (they belong to the parent).
    void reset_after_fork() noexcept;

    // The interned stacks that alloc and alloc_fail events refer to ("stack"): each one's record is
    // written once, just before the first line that uses it.  Set before start(); never changed
    // afterwards.
    void set_stacks(const stacks::stack_table* t) noexcept { stacks_ = t; }

    uint64_t lost() const noexcept { return lost_.load(std::memory_order_relaxed); }
    // Events that never reached the log (calls passed through unrecorded), stated as lost ones are.
    void count_lost(uint64_t n) noexcept { lost_.fetch_add(n, std::memory_order_relaxed); }
    log_totals totals() const noexcept { return totals_; }
    uint64_t now_ns() const noexcept;

  private:
    struct slot {
        // Logical state, stored minus the slot's index so that zero means "free for lap 0":
        // == pos: free for position pos; == pos+1: published.
        std::atomic<uint64_t> state;
        event e;
    };
    // The slot encoding, stated once.  The logical state of position pos's slot:
    uint64_t state_of(uint64_t pos) const noexcept {
        return ring_[pos & mask_].state.load(std::memory_order_acquire) + (pos & mask_);
    }
    // The slot of pos becomes free for (claimable at) pos, or holds pos's published event.
    void make_free_for(uint64_t pos) noexcept {
        ring_[pos & mask_].state.store(pos - (pos & mask_), std::memory_order_release);
    }
    void mark_published(uint64_t pos) noexcept {
        ring_[pos & mask_].state.store(pos + 1 - (pos & mask_), std::memory_order_release);
    }
    // The position the slot at `index` stands for, free, claimed or (*published) published.
    uint64_t held_position(uint64_t index, bool* published) const noexcept {
        uint64_t v = state_of(index);
        *published = mask_ != 0 && ((v - index) & mask_) == 1;
        return *published ? v - 1 : v;
    }
    static void* writer_main(void* self) noexcept;
    void wake_writer() noexcept;
    // How long to wait for another holder of the output lock: for ever (it only formats and
    // writes), 500 ms (a crash: the holder may be stuck), or while it makes progress and then
    // 1 s more (_exit: perhaps in a signal handler, with the holder blocked on a lock the
    // interrupted thread holds).  A signal that interrupted this thread's own drain goes on
    // unlocked in the last two.
    enum class lock_wait { forever, crash, while_progress };
    bool lock_output(lock_wait how) noexcept;
    void unlock_output() noexcept;
    // Drains published slots in order; stops at the first unpublished one, except that one claimed
    // before `skip_before` (its thread stuck or gone) is counted lost and passed over.
    void drain_locked(uint64_t skip_before = 0, bool from_signal = false) noexcept;
    // Drains every event before `end`: waits up to wait_ms for threads between claim() and
    // publish(), then passes over (counts lost) what is still claimed.  For the end line and for
    // an event published after it.
    void drain_through(uint64_t end, uint32_t wait_ms, bool from_signal) noexcept;
    // Takes the ring position after every event drained so far for the end line (see finish()).
    // Returns false when none could be taken; *pos is then the head, which the next event shares.
    bool claim_end_position(uint64_t* pos, bool from_signal, uint32_t wait_ms) noexcept;
    // Hands back slots passed over by drain_locked whose late event has since been published.
    void release_abandoned() noexcept;
    void write_all(const char* p, size_t n) noexcept;
    // A write failed (disk full, /dev/full, I/O error): say so once and move to /tmp/<basename>,
    // carrying over what the first file holds.  Returns false when there is nowhere to write.
    bool switch_after_write_error(int err) noexcept;
    // Appends a `lost` record for losses not yet reported (consumer only, under the output lock).
    void note_losses() noexcept;
    // Counts the event for the end line and completes frees from the allocation's record.
    void account(event& e, bool from_signal) noexcept;
    void alloc_ring() noexcept;

    options opt_;
    slot* ring_ = nullptr;
    uint64_t mask_ = 0;
    alignas(64) std::atomic<uint64_t> head_{0};
    alignas(64) uint64_t tail_ = 0;             // consumer only, under the output lock
    std::atomic<uint64_t> drained_to_{0};       // tail_ after each drain, for let_writer_drain
    std::atomic<uint64_t> progress_{0};         // bumped per event drained and per write (consumer)
    std::atomic<bool> end_requested_{false};    // finish() waits for the lock: the writer holds off
    std::atomic<int> out_owner_{0};             // tid holding the output lock, 0 = free
    std::atomic<uint32_t> wake_{0};             // futex word the writer sleeps on
    std::atomic<bool> wake_pending_{false};
    std::atomic<bool> writer_running_{false};
    std::atomic<bool> stop_{false};
    std::atomic<bool> finished_{false};
    std::atomic<bool> started_{false};
    std::atomic<uint64_t> lost_{0};
    uint64_t lost_reported_ = 0;                // consumer only
    uint64_t lost_in_lines_ = 0;                // consumer only: the losses lost lines have stated
    uint64_t lost_in_lines_at_end_ = 0;         // consumer only: lost_in_lines_ when the end line went out
    int fd_ = -1;
    // fd_'s file: a program that closes every descriptor (a daemon, a close-all loop) or dup2's
    // over ours may open its own file under the same number, which the log must never write,
    // truncate or close.  Checked (statx) before each write and close: fd_ours.
    dev_t fd_dev_ = 0;
    ino_t fd_ino_ = 0;
    bool holds_log_file(int fd) const noexcept;  // fd holds the file fd_dev_ and fd_ino_ name
    bool fd_ours() const noexcept;               // holds_log_file(fd_)
    void adopt_fd(int fd) noexcept;              // fd_ = fd (moved up, out of the program's way), its file noted
    bool reopen_lost_fd() noexcept;              // fd_ is no longer ours: path_ again, else the log ends (said)
    void drop_fd() noexcept;                     // closes fd_ if ours; fd_ = -1
    uint64_t written_ = 0;                      // bytes in fd_ so far (consumer only)
    int64_t end_offset_ = -1;                   // where the end line begins, for resume_after_failed_exec
    int64_t end_len_ = 0;                       // its length
    uint64_t end_pos_ = 0;                      // its ring position (its seq)
    bool end_pos_owned_ = false;                // the end line took end_pos_ for itself
    bool end_pos_forced_ = false;               // ... while its slot was held by a stuck claim
    bool end_written_ = false;                  // the end line is out: losses now need lost lines
    uint32_t late_wait_ms_ = 0;                 // finish()'s in-flight wait, for events after the end line
    // Positions passed over while their slot was claimed but unpublished (consumer only).  The
    // slot stays "claimed" until its thread publishes: until then the next lap cannot use it, and
    // after that only the consumer can hand it back (release_abandoned), or the ring would jam there.
    static constexpr int k_max_abandoned = 64;
    uint64_t abandoned_[k_max_abandoned];
    int n_abandoned_ = 0;
    bool abandoned_overflow_ = false;           // more than the list holds: scan the ring instead
    // Frees the slot of abandoned position a, whose event is published, for its next position
    // not yet passed (the end line may have taken a + cap).
    void release_slot(uint64_t a) noexcept;
    bool write_failed_ = false;                 // the stderr note and the /tmp move happen once
    bool in_signal_ = false;                    // the current drain runs in a signal handler (no heap)
    std::string path_;
    uint64_t t0_ = 0;
    log_totals totals_;                         // consumer only
    struct live_entry {
        uint64_t size, asize;
        int16_t dev;
        mem_kind kind;
        bool pooled;
        // Its context's pool ("ctx"): only that pool's context_reset drops it.  A stream-ordered
        // allocation belongs to no context (cuda.h, cuCtxDestroy): no context_reset drops it.
        uint8_t ctx;
        bool stream_ordered;
    };
    // Live allocations, consumer only.  VMM handles live in their own map: a handle can equal an address.
    std::unordered_map<uint64_t, live_entry> live_, live_vmm_;
    // Writes the record of e's stack if it is not written yet (consumer only).  From a signal
    // handler the record cannot be formatted (it allocates): the event then goes out without it.
    void write_stack_record(event& e, bool from_signal) noexcept;
    const stacks::stack_table* stacks_ = nullptr;
    uint64_t stacks_lost_base_ = 0;  // stacks_->dropped() when this log started (end line: the difference)
    std::vector<bool> stack_written_;           // consumer only: index = stack id
    char* buf_ = nullptr;                       // consumer's formatting buffer
    size_t buf_len_ = 0;
};

// Creates a new log file for `path` safely: O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC, mode 0600 (the umask
// and a default ACL of the directory still apply).  A name that exists (a file, a planted symlink,
// another process's log) is never opened: the log goes to `<stem>.<pid><ext>`, then
// `<stem>.<pid>-2<ext>` ... and finally a mkostemps name, and stderr says so.  An existing character
// device (/dev/null, /dev/full) or a FIFO of our own user is opened for writing as it is.  Sets
// *used to the name opened; returns -1 with errno set when the directory refuses.
int open_log_file(const std::string& path, long pid, std::string* used) noexcept;

// While it lives, SIGPIPE is blocked on this thread, and one raised by a write in its scope is
// taken back: a message on a stderr pipe whose reader is gone, or a log on such a FIFO, must not
// kill the program (the write fails with EPIPE instead).  Async-signal-safe.
class sigpipe_guard {
  public:
    sigpipe_guard() noexcept;
    ~sigpipe_guard();
    sigpipe_guard(const sigpipe_guard&) = delete;
    sigpipe_guard& operator=(const sigpipe_guard&) = delete;

  private:
    sigset_t old_;
    bool was_pending_ = false;  // the program's own SIGPIPE, pending before: left for it
};

uint64_t monotonic_ns() noexcept;
int current_tid() noexcept;
// Call in a fork child before anything else records: invalidates the per-thread tid caches.
void note_fork() noexcept;

}  // namespace gpumem
