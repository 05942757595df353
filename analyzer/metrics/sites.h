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

// The lifetimes and stacks of the allocations the report can still ask about, so the live bytes per
// stack can be summed after the log is read at the moments it asks: each device's peak of requested
// bytes, each OOM it lists, and the end.  One pass, no snapshot per peak, 32 bytes per lifetime
// held, and memory proportional to what is live: a freed allocation is dropped as soon as no such
// moment can fall inside its lifetime (it was allocated after its device's peak so far, or freed
// before it, and spans no OOM).  A long log holding every allocation took 32 bytes each, whether
// or not the log had stacks (1.2 GB for the 32 million of an 11 GB log).
class site_tracker {
  public:
    // `vmm`: ptr is a cuMemCreate handle, which may equal an address; the two are kept apart.
    // `peak_seq`: the seq of the device's peak of requested bytes so far, this event included
    // (tracked_bytes::peak_seq: the report's, which only moves later); UINT64_MAX when not known,
    // which keeps every lifetime that could matter.
    void on_alloc(uint64_t seq, int dev, uint64_t ptr, bool vmm, uint64_t size, uint32_t stack, uint64_t peak_seq);
    void on_free(uint64_t seq, int dev, uint64_t ptr, bool vmm, uint64_t peak_seq);
    // An OOM the report lists at `seq` on `dev` (device_report::ooms): live_at will be asked there.
    void on_oom(int dev, uint64_t seq);

    // The stacks holding the most bytes on `dev` live just after event `seq`, largest first (ties by
    // stack id), at most `top` of them.  Every row counts, including stack 0.  Exact at the moments
    // above (the final peak, the OOMs given to on_oom, the end); elsewhere allocations already
    // dropped are missing.
    std::vector<site_row> live_at(int dev, uint64_t seq, size_t top) const;
    // Whether any allocation carried a stack (a log without stacks gets no site tables).
    bool any_stack() const { return any_stack_; }
    // Lifetimes held now, open or closed: what the tracker's memory is proportional to.
    size_t held() const { return all_.size(); }

  private:
    struct lifetime {
        uint64_t alloc_seq, free_seq, size;
        uint32_t stack;
        int32_t dev;
    };
    // A device's moments so far: its peak seq, and its OOMs in seq order.
    struct moments {
        int dev;
        uint64_t peak_seq = UINT64_MAX;
        std::vector<uint64_t> ooms;
    };
    static uint64_t key(int dev, uint64_t ptr, bool vmm) {
        return ptr ^ (uint64_t(uint32_t(dev) & 0x7f) << 56) ^ (uint64_t(vmm) << 63);
    }
    moments& of(int dev);
    // Whether a lifetime freed at free_seq may still be asked about (the device's peak so far or an OOM in it).
    bool wanted(const lifetime& l, const moments& m) const;
    // The lifetime at all_[i] has ended at `seq`, an event of `dev` whose peak so far is `peak_seq`:
    // dropped at once when it is the last one and not wanted, else at the next compact().
    void close(size_t i, int dev, uint64_t seq, uint64_t peak_seq);
    // Drops the closed lifetimes no longer wanted once all_ has doubled since the last time.
    void compact();
    std::vector<lifetime> all_;
    u64_map<size_t> open_;  // (dev, ptr) -> index into all_ of the live allocation there
    std::vector<size_t> moved_;  // compact()'s new index of each lifetime
    std::vector<moments> devs_;
    size_t last_dev_ = 0;
    size_t compact_at_ = size_t(1) << 16;
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
