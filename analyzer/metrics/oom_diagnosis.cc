// Out-of-memory diagnosis; see oom_diagnosis.h.
#include "metrics/oom_diagnosis.h"

#include <algorithm>

#include "log_reader.h"
#include "metrics/snapshots.h"

namespace gpumem::analysis {

void oom_diagnosis::on_oom(const log_event& e, uint64_t line, bool from_pool) {
    device_state& d = ctx.model.dev(e.dev);
    pending_oom& p = pending_[d.slot];
    if (!from_pool) {
        ++d.rep.n_alloc_fail;
        // CUDA_ERROR_OUT_OF_MEMORY and cudaErrorMemoryAllocation are both 2.
        if (!e.has(fd_err) || e.err != 2) return;
        if (p.pending && p.size == e.size) {
            // The pool's "oom" already stands for this failure; attach the call's error.
            p.pending = false;
            if (!d.rep.ooms.empty()) d.rep.ooms.back().err = e.err;
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
    o.free_in_segments = d.free_total();
    o.largest_free = d.largest_free();
    o.reserved = d.rep.reserved.current;
    o.allocated = d.rep.allocated.current;
    o.gpu_free = e.has(fd_gpu_free) ? e.gpu_free : 0;
    o.gpu_total = e.has(fd_gpu_total) ? e.gpu_total : 0;
    // Saturating: the two come from the log and may be anything.
    uint64_t available = o.free_in_segments > UINT64_MAX - o.gpu_free ? UINT64_MAX : o.free_in_segments + o.gpu_free;
    uint64_t biggest = std::max(o.largest_free, o.gpu_free);
    if (o.size > available) {
        o.verdict = "capacity";
        o.explanation = "the request is larger than all free memory together (free in segments + free on the GPU)";
    } else {
        o.verdict = "fragmentation";
        o.explanation = biggest >= o.size
            ? "enough free memory exists, and a free block is large enough, yet the request failed (pool size class or limit)"
            : "enough free memory exists in total, but no single free block is large enough";
    }
    if (d.rep.ooms.size() < k_max_oom_maps) {
        ctx.snaps.settle_peak(d);
        o.map = ctx.snaps.take(d, "oom #" + std::to_string(d.rep.n_oom), e.seq, e.t, line);
    }
    if (from_pool) {
        p.pending = true;
        p.size = e.size;
    }
    if (d.rep.ooms.size() < 1000) d.rep.ooms.push_back(std::move(o));
}

}  // namespace gpumem::analysis
