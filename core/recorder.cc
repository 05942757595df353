// The recorder: what the hook layer calls to log an allocation, a free or a VMM operation.
#include "recorder.h"

namespace gpumem {

namespace {
void fill_call(event& e, const call_info& c) noexcept {
    e.api = c.api;
    e.kind = c.kind;
    e.dev = int16_t(c.dev);
    if (c.has_stream) {
        e.flags |= ef_has_stream;
        e.b.stream = c.stream;
    }
    e.b.mempool = c.mempool;
    e.ctx = c.ctx;
}
}  // namespace

void recorder::alloc(const call_info& c, int err, uint64_t ptr, uint64_t size, uint64_t asize, bool with_stack) noexcept {
    // The stack is captured before a slot is claimed: a claimed slot holds up the writer until it
    // is published, so nothing slow may sit between claim and publish.  A failed call gets one too
    // (alloc_fail's "stack"): the line that ran out of memory is what an OOM report names first,
    // and failures are rare enough that the capture costs nothing on the hot path.
    uint32_t stack = 0;
    if (stacks_ && with_stack) stack = stacks_->capture();
    else if (stacks_) stacks_->count_uncaptured();
    event* e = log_.claim();
    if (!e) return;
    uint64_t seq = e->seq;
    *e = event{};
    e->seq = seq;
    e->t_ns = log_.now_ns();
    e->tid = uint32_t(current_tid());
    e->ev = err == 0 ? ev_kind::alloc : ev_kind::alloc_fail;
    e->err = err;
    fill_call(*e, c);
    e->b.ptr = err == 0 ? ptr : 0;
    e->b.size = size;
    e->b.asize = asize;
    e->b.stack = stack;
    if (err != 0) {
        e->b.gpu_free = c.gpu_free;
        e->b.gpu_total = c.gpu_total;
    }
    log_.publish(e);
}

recorder::free_ticket recorder::free_begin(const call_info& c, uint64_t ptr) noexcept {
    free_ticket t;
    t.call = c;
    t.ptr = ptr;
    t.slot = log_.claim();
    if (t.slot) {
        uint64_t seq = t.slot->seq;
        *t.slot = event{};
        t.slot->seq = seq;
        t.slot->t_ns = log_.now_ns();
    }
    return t;
}

void recorder::free_end(free_ticket& t, int err) noexcept {
    event* e = t.slot;
    if (!e) return;
    e->tid = uint32_t(current_tid());
    e->ev = err == 0 ? ev_kind::free : ev_kind::free_fail;
    e->err = err;
    fill_call(*e, t.call);
    e->b.ptr = t.ptr;  // size, asize, kind and dev: filled by the writer from the allocation's record
    log_.publish(e);
    t.slot = nullptr;
}

void recorder::vmm(ev_kind ev, const call_info& c, uint64_t ptr, uint64_t size, uint64_t handle,
                   uint64_t offset) noexcept {
    event e{};
    e.ev = ev;
    e.api = c.api;
    e.kind = mem_kind::vmm;
    e.dev = int16_t(c.dev);
    e.b.ptr = ptr;
    e.b.size = size;
    e.b.handle = handle;
    e.b.offset = offset;
    log_.record(e);
}

}  // namespace gpumem
