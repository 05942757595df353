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
    e.b.seg = c.mempool;
}
}  // namespace

void recorder::alloc(const call_info& c, int err, uint64_t ptr, uint64_t size, uint64_t asize) noexcept {
    if (err == 0) {
        live_entry le{size, asize, int16_t(c.dev), c.kind};
        (c.kind == mem_kind::vmm ? vmm_live_ : live_).insert(ptr, le);
    }
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
    log_.publish(e);
}

recorder::free_ticket recorder::free_begin(const call_info& c, uint64_t ptr) noexcept {
    free_ticket t;
    t.call = c;
    t.key = ptr;
    t.known = (c.kind == mem_kind::vmm ? vmm_live_ : live_).take(ptr, &t.entry);
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
    if (err != 0 && t.known) {
        // The free failed, so the allocation is still live.
        (t.call.kind == mem_kind::vmm ? vmm_live_ : live_).insert(t.key, t.entry);
    }
    event* e = t.slot;
    if (!e) return;
    e->tid = uint32_t(current_tid());
    e->ev = err == 0 ? ev_kind::free : ev_kind::free_fail;
    e->err = err;
    call_info c = t.call;
    if (t.known) {
        c.kind = t.entry.kind;  // cudaFree of managed memory is a managed free
        if (c.dev < 0) c.dev = t.entry.dev;
    }
    fill_call(*e, c);
    e->b.ptr = t.key;
    e->b.size = t.known ? t.entry.size : 0;
    e->b.asize = t.known ? t.entry.asize : 0;
    if (!t.known && t.key != 0) e->flags |= ef_size_unknown;
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
    e.b.seg = handle;
    e.b.stream = offset;
    log_.record(e);
}

}  // namespace gpumem
