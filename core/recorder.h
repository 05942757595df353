// The recorder: what the hook layer calls to log an allocation, a free or a VMM operation.
//
// It turns a hook's facts into events on the event_log and keeps the live table, so a free is logged
// with the size and kind of what it frees.  Ordering rule (see docs/log-format.md): a free claims its
// seq *before* the real free runs and an allocation *after* the real allocation returned, so the
// log's order is the true order for any one address even across threads.
#pragma once

#include <cstdint>

#include "event_log.h"
#include "event_schema.h"
#include "live_table.h"

namespace gpumem {

struct call_info {
    api_id api = api_id::none;
    mem_kind kind = mem_kind::device;
    int dev = -1;
    bool has_stream = false;
    uint64_t stream = 0;
    uint64_t mempool = 0;  // cuMemAllocFromPoolAsync only
};

class recorder {
  public:
    explicit recorder(event_log& log) noexcept : log_(log) {}

    // A finished allocation call: success (err == 0) or failure.
    void alloc(const call_info& c, int err, uint64_t ptr, uint64_t size, uint64_t asize = 0) noexcept;

    // A free in two steps around the real call.
    struct free_ticket {
        event* slot = nullptr;
        bool known = false;
        live_entry entry;
        uint64_t key = 0;
        call_info call;
    };
    free_ticket free_begin(const call_info& c, uint64_t ptr) noexcept;
    void free_end(free_ticket& t, int err) noexcept;

    // map / unmap / reserve / unreserve (successful calls only).
    void vmm(ev_kind ev, const call_info& c, uint64_t ptr, uint64_t size, uint64_t handle = 0,
             uint64_t offset = 0) noexcept;

    // Events built elsewhere (the pool's), published as they are.
    void emit(event& e) noexcept { log_.record(e); }

    event_log& log() noexcept { return log_; }
    const live_table& live() const noexcept { return live_; }

  private:
    event_log& log_;
    live_table live_;
    live_table vmm_live_;
};

}  // namespace gpumem
