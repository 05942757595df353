// Interns call stacks: each unique stack gets a small id once, and the log writer writes its
// frames once, before the first event that uses the id.
//
// The caller's thread pays only for the capture, a hash and one table probe; file names, function
// names, lines and modules are worked out once per new stack.  Memory is bounded: past
// `max_stacks` unique stacks or `max_frames` frames in all, capture() returns 0 ("no stack") and
// counts the overflow instead of growing.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "python_frames.h"
#include "stack_mode.h"

namespace gpumem::stacks {

class stack_table {
  public:
    // GPUMEM_STACK_DEPTH is capped here.  It bounds native and Python frames each, so a capture
    // under GPUMEM_STACKS=all holds up to twice as many frames.
    static constexpr size_t k_max_depth = 256;

    // The table's bounds: unique stacks, and frames kept over all of them (each kept twice, as
    // captured and as described, 32 bytes in all: 8M frames are 256 MiB of the program's memory,
    // up to twice that while a vector grows).  1M stacks of 64 frames would have been 2 GiB.
    explicit stack_table(size_t max_stacks = 1u << 20, size_t max_frames = 1u << 23) noexcept
        : max_stacks_(max_stacks), max_frames_(max_frames) {}

    // Finds the interpreter (lazily, on the first allocation, never from a constructor).
    void init(python_frames::symbol_lookup lookup, stack_mode mode, size_t depth) noexcept;

    // Captures the calling thread's stack and returns its id (1, 2, …), or 0 when the thread has no
    // frames of the kinds asked for, capture is off, or the table is full.
    uint32_t capture() noexcept;

    // Writes the stack record for `id` as one JSON line (with '\n') to `out`; false if `id` is
    // unknown.  Called by the log writer.
    bool format_record(uint32_t id, std::string& out) const noexcept;

    // fork() must not copy the table's lock while another thread holds it: the preload takes it in
    // pthread_atfork's prepare handler and releases it in both processes afterwards.
    void lock_for_fork() noexcept { mu_.lock(); }
    void unlock_after_fork() noexcept { mu_.unlock(); }

    size_t size() const noexcept;
    // Captures that gave "no stack" though the thread had frames: the table was full, or the
    // thread's Python frames went unread (the layout check had turned Python capture off) and it
    // had no native ones.  Lock-free, for the end line, which the crash path writes while another
    // thread may hold the table's lock.
    uint64_t dropped() const noexcept { return lost_.load(std::memory_order_relaxed); }
    // An allocation recorded without a capture (a signal handler's, inside a hook: walking and
    // interning are not async-signal-safe): counted in dropped() where capture() would have looked
    // for frames.  Lock-free.
    void count_uncaptured() noexcept {
        if (!ready_.load(std::memory_order_acquire) || mode_ == stack_mode::off) return;
        if (mode_ == stack_mode::python && !py_.active()) return;
        lost_.fetch_add(1, std::memory_order_relaxed);
    }
    const python_frames& python() const noexcept { return py_; }

  private:
    // A frame as captured: a py_frame, so that Python frames are captured straight into the key
    // buffer (no second buffer on the capturing thread's stack).  Python: the code object, the byte
    // offset of its instruction and the code object's identity (py_frame::ident).  Native: the
    // return address in `code`, offset -1, ident 0.
    using raw_frame = py_frame;
    static bool native(const raw_frame& f) { return f.offset < 0; }
    // A frame as described.  Python: `text` indexes codes_ and `line` is set.  Native: `text`
    // indexes modules_, `line` is -1 and `address` is the offset in the module.
    struct frame_info {
        uint32_t text;
        int32_t line;
        uint64_t address;
        bool operator==(const frame_info& o) const {
            return text == o.text && line == o.line && address == o.address;
        }
    };
    struct key_entry {  // one captured shape
        uint32_t first;  // index into keys_
        uint32_t count;
        uint32_t id;
    };
    struct stack_entry {  // one described stack: what the log's record says
        uint32_t first;  // index into frames_
        uint32_t count;
    };
    // Where a native frame's pc lies: its module's path ("?" when unknown) and the offset in it.
    struct native_place {
        std::string module;
        uint64_t offset = 0;
    };
    uint32_t find_locked(const raw_frame* f, size_t n, uint64_t hash) const;  // 0: not seen
    // places: the first frames' (the native ones') places, looked up before mu_ was taken.
    uint32_t intern_locked(const raw_frame* f, size_t n, uint64_t hash, const native_place* places);
    uint32_t describe_locked(const raw_frame* f, size_t n, const native_place* places);
    frame_info describe_frame_locked(const raw_frame& f, const native_place* place);

    python_frames py_;
    stack_mode mode_ = stack_mode::off;
    size_t depth_ = 64;
    size_t max_stacks_;
    size_t max_frames_;
    // Whether a new capture of n frames would pass a bound: it is then recorded without a stack.
    bool full_locked(size_t n) const { return key_entries_.size() >= max_stacks_ || keys_.size() + n > max_frames_; }
    std::atomic<bool> ready_{false};

    mutable std::mutex mu_;
    // Two captures can differ only in instruction offsets that map to the same lines (two calls
    // on one line): they get the same id, so the log holds each described stack once.
    std::unordered_multimap<uint64_t, uint32_t> by_key_;   // hash of the capture -> key_entries_
    std::unordered_multimap<uint64_t, uint32_t> by_text_;  // hash of the description -> id
    std::vector<key_entry> key_entries_;
    std::vector<raw_frame> keys_;
    std::vector<stack_entry> stacks_;  // id - 1 -> its frames
    std::vector<frame_info> frames_;
    std::map<std::pair<uint64_t, uint32_t>, uint32_t> code_ids_;  // (code object, identity) -> codes_ index
    std::vector<py_code_info> codes_;
    std::unordered_map<std::string, uint32_t> module_ids_;  // module path -> index into modules_
    std::vector<std::string> modules_;
    std::atomic<uint64_t> lost_{0};  // dropped(); read without mu_
};

}  // namespace gpumem::stacks
