// Call sites: the stacks a log interns (its "stack" records) and the bytes each stack holds live at
// any moment of the log (the peak, an OOM, the end).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "u64_map.h"

namespace gpumem::analysis {

// One frame of a stack record, innermost first (docs/log-format.md, "stack").
struct frame_view {
    std::string function, file;  // "" when unknown (a native frame the symbolizer could not name)
    uint64_t line = 0;           // 0 when unknown
    std::string module;          // native frames only: the ELF file, as recorded
    uint64_t address = 0;        // native frames only: offset in the module (a return address)
    bool native() const { return !module.empty(); }
};

// The bytes one stack holds live at a moment.  stack 0 stands for allocations with no stack (a
// thread without Python frames, or capture off).
struct site_row {
    uint32_t stack = 0;
    uint64_t bytes = 0, count = 0;
};

// Frames kept per stack record: 4x what a recorder writes at most (core/stacks/stack_table.h,
// k_max_depth), so that another writer's deeper stacks still show, and a hostile record's memory is bounded.
inline constexpr size_t k_max_stack_frames = 1024;

// The stacks of one log, by id.
class stack_store {
  public:
    // Every defined stack, for symbolizing native frames in place.
    template <typename F>
    void for_each(F&& f) {
        for (size_t i = 0; i < by_id_.size(); ++i)
            if (defined_[i]) f(uint32_t(i + 1), by_id_[i]);
    }
    // Adds a stack; false when the id is 0 or already defined.
    bool add(uint32_t id, std::vector<frame_view> frames);
    const std::vector<frame_view>* find(uint32_t id) const;
    // The stack an event's "stack" member names (an alloc's or an alloc_fail's) when a record read
    // so far defines it, else 0: the call is shown without a stack (docs/log-format.md, "A reader's
    // rules").
    uint32_t defined(uint64_t id) const { return id <= UINT32_MAX && find(uint32_t(id)) ? uint32_t(id) : 0; }
    size_t size() const { return count_; }
    // Whether the log had stack records, so the report has site tables (possibly of stack 0 only).
    // A report JSON read back has them when it has top_sites, whatever stacks its rows name.
    bool any() const { return count_ > 0 || listed_; }
    void mark_listed() { listed_ = true; }

  private:
    std::vector<std::vector<frame_view>> by_id_;  // index id - 1
    std::vector<bool> defined_;
    size_t count_ = 0;
    bool listed_ = false;
};

// Every successful allocation's lifetime and stack, so the live bytes per stack can be summed at
// any seq after the log is read: one pass, 32 bytes per allocation, no snapshot per peak.
class site_tracker {
  public:
    // `vmm`: ptr is a cuMemCreate handle, which may equal an address; the two are kept apart.
    void on_alloc(uint64_t seq, int dev, uint64_t ptr, bool vmm, uint64_t size, uint32_t stack);
    void on_free(uint64_t seq, int dev, uint64_t ptr, bool vmm);

    // The stacks holding the most bytes on `dev` live just after event `seq`, largest first (ties by
    // stack id), at most `top` of them.  Every row counts, including stack 0.
    std::vector<site_row> live_at(int dev, uint64_t seq, size_t top) const;
    // Whether any allocation carried a stack (a log without stacks gets no site tables).
    bool any_stack() const { return any_stack_; }

  private:
    struct lifetime {
        uint64_t alloc_seq, free_seq, size;
        uint32_t stack;
        int32_t dev;
    };
    static uint64_t key(int dev, uint64_t ptr, bool vmm) {
        return ptr ^ (uint64_t(uint32_t(dev) & 0x7f) << 56) ^ (uint64_t(vmm) << 63);
    }
    std::vector<lifetime> all_;
    u64_map<size_t> open_;  // (dev, ptr) -> index into all_ of the live allocation there
    bool any_stack_ = false;
};

// Reads a `stack` record line (docs/log-format.md).  False, with `error` saying what is wrong,
// when the line is not a well-formed record.
bool parse_stack_record(std::string_view line, uint32_t& id, std::vector<frame_view>& frames, std::string& error);

struct process_report;
// Fills each device's top_sites and peak_sites (at its peak of requested bytes), leak_sites and end_sites (at
// the end) and each OOM's sites from the tracker.  Leaves them empty when no allocation carried a stack.
void summarize_sites(process_report& rep, const site_tracker& sites);
// Names the native frames of every stack with libdw, once per unique module and address.
void symbolize_stacks(process_report& rep);

}  // namespace gpumem::analysis
