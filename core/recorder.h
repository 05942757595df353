// The recorder: what the hook layer calls to log an allocation, a free or a VMM operation.
//
// It turns a hook's facts into events on the event_log.  The size and kind of what a free frees are
// filled in later by the log's writer thread, which sees every event in order (event_log::account),
// so the caller's thread pays for no lookup table.  Ordering rule (see docs/log-format.md): a free claims its
// seq *before* the real free runs and an allocation *after* the real allocation returned, so the
// log's order is the true order for any one address even across threads.
#pragma once

#include <cstdint>

#include "event_log.h"
#include "event_schema.h"
#include "stacks/stack_table.h"

namespace gpumem {

struct call_info {
    api_id api = api_id::none;
    mem_kind kind = mem_kind::device;
    int dev = -1;
    bool has_stream = false;
    uint64_t stream = 0;
    uint64_t mempool = 0;  // cuMemAllocFromPoolAsync only
    // An allocation outside the pools: the number of the pool of the context that made it, its
    // "ctx" (the event's ctx): its context's context_reset drops it (event_log::account).
    uint8_t ctx = 0;
    // A call that ran out of memory: the driver's cuMemGetInfo just after it, on the call's device
    // (gpu_total 0: not asked).  Written on its alloc_fail, so an OOM the pool did not serve says
    // how much the GPU had free, as the pool's own "oom" line does.
    uint64_t gpu_free = 0, gpu_total = 0;
};

class recorder {
  public:
    explicit recorder(event_log& log) noexcept : log_(log) {}

    // A finished allocation call: success (err == 0) or failure.  with_stack false: no stack is
    // captured (a signal handler's call: walking and interning a stack is not async-signal-safe),
    // and the stack table counts one lost where it would have captured one (the end line's
    // stacks_lost).
    void alloc(const call_info& c, int err, uint64_t ptr, uint64_t size, uint64_t asize = 0,
               bool with_stack = true) noexcept;

    // A free in two steps around the real call.
    struct free_ticket {
        event* slot = nullptr;
        uint64_t ptr = 0;
        call_info call;
    };
    free_ticket free_begin(const call_info& c, uint64_t ptr) noexcept;
    void free_end(free_ticket& t, int err) noexcept;

    // map / unmap / reserve / unreserve (successful calls only).
    void vmm(ev_kind ev, const call_info& c, uint64_t ptr, uint64_t size, uint64_t handle = 0,
             uint64_t offset = 0) noexcept;

    // Events built elsewhere (the pool's), published as they are.
    void emit(event& e) noexcept { log_.record(e); }

    // The calling thread's interned stack (0 with GPUMEM_STACKS=off), for the pool's allocations:
    // the hook captures it before entering the pool, so that walking the stack (which may take the
    // loader's lock for native frames) never happens under the pool's lock.
    uint32_t capture_stack() noexcept { return stacks_ ? stacks_->capture() : 0; }

    event_log& log() noexcept { return log_; }

    // Allocations, successful or failed, get the caller's interned stack (GPUMEM_STACKS).  Set once
    // at start.
    void set_stacks(stacks::stack_table* t) noexcept { stacks_ = t; }

  private:
    event_log& log_;
    stacks::stack_table* stacks_ = nullptr;
};

}  // namespace gpumem
