// Out-of-memory diagnosis; see oom_diagnosis.h.
#include "metrics/oom_diagnosis.h"

#include <algorithm>

#include "log_reader.h"
#include "metrics/snapshots.h"

namespace gpumem::analysis {

// The stack the failing call names, when a record read so far defines it (analyze.cc warns of an
// id that none does).
uint32_t oom_diagnosis::failing_stack(const log_event& e) const {
    return e.has(fd_stack) ? ctx.proc.stacks.defined(e.stack) : 0;
}

void oom_diagnosis::on_oom(const log_event& e, uint64_t line, bool from_pool) {
    device_state& d = ctx.model.dev(e.dev);
    std::vector<pending_oom>& waiting = pending_[d.slot];
    if (!from_pool) {
        ++d.rep.n_alloc_fail;
        // CUDA_ERROR_OUT_OF_MEMORY and cudaErrorMemoryAllocation are both 2.
        if (!e.has(fd_err) || e.err != 2) return;
        auto it = std::find_if(waiting.begin(), waiting.end(), [&](const pending_oom& p) {
            return p.size == e.size && (e.pooled || p.seq + 1 == e.seq) &&
                   (!p.has_tid || !e.has(fd_tid) || p.tid == e.tid);
        });
        if (it != waiting.end()) {
            // The pool's "oom" already stands for this failure; attach the call's error and stack
            // (past the report's cap the "oom" was counted but not kept).
            if (it->kept < d.rep.ooms.size()) {
                d.rep.ooms[it->kept].err = e.err;
                d.rep.ooms[it->kept].stack = failing_stack(e);
            }
            waiting.erase(it);
            return;
        }
    }
    ++d.rep.n_oom;
    oom_report o;
    o.seq = e.seq;
    o.t = e.t;
    o.line = line;
    o.size = e.size;
    o.api = e.has(fd_api) ? ctx.names.api_name(e.api) : "";
    o.from_pool = from_pool;
    o.err = from_pool ? 0 : e.err;
    o.stack = from_pool ? 0 : failing_stack(e);  // the pool's: on the alloc_fail that follows
    o.free_in_segments = d.free_total();
    o.largest_free = d.largest_free();
    o.reserved = d.rep.reserved.current;
    o.allocated = d.rep.allocated.current;
    // A gpu_free without its gpu_total is not counted, or the verdict would use memory the report
    // calls "not recorded" (log_event::recorded_gpu_free).
    o.gpu_total = e.has(fd_gpu_total) ? e.gpu_total : 0;
    o.gpu_free = e.recorded_gpu_free();
    // Saturating: the two come from the log and may be anything.
    auto sum = [](uint64_t x, uint64_t y) { return x > UINT64_MAX - y ? UINT64_MAX : x + y; };
    uint64_t available = sum(o.free_in_segments, o.gpu_free);
    uint64_t biggest = std::max(o.largest_free, o.gpu_free);
    // A pool on virtual memory gives back every whole free chunk before it fails (docs/pool.md), so
    // it fails only when the live bytes rounded up to whole chunks, plus the request, exceed what
    // the driver gives.  What the rounding costs is the free bytes left in chunks that hold live
    // blocks plus the blocks' own rounding (allocated - requested: a block of whole chunks made for
    // a request).  The header says the pool may use virtual memory; a hole shows it does (a
    // segment_unmap, or an arena segment_alloc that mapped only part of its range).
    bool vmm_pool = d.rep.n_segment_unmap != 0 || d.rep.unmapped.peak != 0 ||
                    (ctx.proc.pool_vmm == "on" && d.rep.n_segment_alloc != 0);
    o.requested = d.rep.requested.current;
    o.pending = d.rep.pending.current;
    o.pool_vmm = vmm_pool;
    const uint64_t rounding = o.block_rounding();
    // Pending blocks (freed by the program, not reusable until the pool's next sync) are neither
    // free nor live.  The pool waits for them before it fails, except where it may not wait (a
    // stream capture, a broken context): memory short only for them is not the device's capacity.
    const uint64_t usable = vmm_pool ? sum(available, rounding) : available;
    const std::string pending_term = o.pending ? " + pending frees" : "";
    if (o.size > sum(usable, o.pending)) {
        o.verdict = "capacity";
        o.explanation = vmm_pool ? "the live bytes plus the request exceed what the driver gives, even without the "
                                   "pool's rounding to whole chunks (free in segments" + pending_term +
                                       " + block rounding + free on the GPU)"
                                 : "the request is larger than all free memory together (free in segments" + pending_term +
                                       " + free on the GPU)";
    } else if (o.size > usable) {
        o.verdict = "pending frees";
        o.explanation = "the request is larger than the free memory, but not once the pending frees count: blocks the "
                        "program freed that the pool could not reuse yet, since a freed block waits for the work queued "
                        "before its free (the pool makes no wait during a stream capture, nor in a broken context)";
    } else if (vmm_pool && o.largest_free < o.size) {
        o.verdict = "chunk rounding";
        o.explanation = "the pool gave back every whole free chunk; what is left, free bytes that share chunks with "
                        "live blocks and the blocks' own rounding, cannot hold a new block: the live bytes rounded up "
                        "to whole chunks plus the request (also rounded up) exceed what the driver gives, though the "
                        "bytes themselves would fit";
    } else {
        o.verdict = "fragmentation";
        if (!from_pool && o.gpu_total && o.gpu_free >= o.size)
            o.explanation = "the driver refused the call, yet said just after that this much was free: its own "
                            "fragmentation or limits, or other allocations (another thread's or process's) came between";
        else
            o.explanation = biggest >= o.size
                ? "enough free memory exists, and a free block is large enough, yet the request failed (pool size class or limit)"
                : "enough free memory exists in total, but no single free block is large enough";
    }
    // The verdict counted the driver's free memory as 0: a log that did not record it (an older
    // recorder, another device's context, a stream capture) may hold a verdict that it would change.
    if (!o.gpu_free_recorded())
        o.explanation += "; the driver's free memory at the failure was not recorded and is counted as 0";
    if (d.rep.ooms.size() < k_max_oom_maps) {
        ctx.snaps.settle_peak(d);
        o.map = ctx.snaps.take(d, "oom #" + std::to_string(d.rep.n_oom), e.seq, e.t, line);
    }
    const bool kept = d.rep.ooms.size() < 1000;
    // A log cut between the two lines leaves an entry waiting; a few per device is all a run has
    // (one per pool), so an unbounded list means a malformed log: the oldest goes.
    if (from_pool) {
        if (waiting.size() >= 64) waiting.erase(waiting.begin());
        waiting.push_back({e.size, e.seq, e.tid, e.has(fd_tid), kept ? d.rep.ooms.size() : SIZE_MAX});
    }
    if (kept) d.rep.ooms.push_back(std::move(o));
}

}  // namespace gpumem::analysis
