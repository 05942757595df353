// Fragmentation and the memory-over-time series; see timeline.h.
#include "metrics/timeline.h"

#include <algorithm>

namespace gpumem::analysis {

void timeline::point(device_state& d, uint64_t t, uint64_t seq) {
    double f = d.frag();
    if (f > d.rep.max_external_fragmentation) {
        d.rep.max_external_fragmentation = f;
        d.rep.max_external_fragmentation_t = t;
        d.rep.max_external_fragmentation_seq = seq;
        d.rep.max_external_fragmentation_free = d.free_total();
    }
    d.rep.max_free_blocks = std::max(d.rep.max_free_blocks, d.n_gaps());
    series_[d.slot].add(t, seq, d.rep.requested.current, d.rep.allocated.current, d.rep.reserved.current, f);
}

void timeline::finish() {
    for (auto& [dev, d] : ctx.model.devices()) {
        d.rep.end_free_in_segments = d.free_total();
        d.rep.end_largest_free = d.largest_free();
        d.rep.end_free_blocks = d.n_gaps();
        d.rep.end_external_fragmentation = d.frag();
        d.rep.timeline = series_[d.slot].pts;
        d.rep.timeline_events_per_point = series_[d.slot].per_point;
    }
}

void timeline::series::add(uint64_t t, uint64_t seq, uint64_t req, uint64_t alloc, uint64_t res, double frag) {
    if (pts.empty() || pts.back().events >= per_point) {
        if (pts.size() >= k_timeline_points) compact();
        time_point p;
        p.t_first = t;
        pts.push_back(p);
    }
    time_point& p = pts.back();
    p.t_last = t;
    p.seq_last = seq;
    p.requested_max = std::max(p.requested_max, req);
    p.allocated_max = std::max(p.allocated_max, alloc);
    p.reserved_max = std::max(p.reserved_max, res);
    p.frag_max = std::max(p.frag_max, frag);
    p.requested_last = req;
    p.allocated_last = alloc;
    p.reserved_last = res;
    p.frag_last = frag;
    ++p.events;
}

// Halves the series: neighbouring points merge, keeping maxima and the later "last" values.
void timeline::series::compact() {
    size_t n = 0;
    for (size_t i = 0; i < pts.size(); i += 2) {
        time_point a = pts[i];
        if (i + 1 < pts.size()) {
            const time_point& b = pts[i + 1];
            a.t_last = b.t_last;
            a.seq_last = b.seq_last;
            a.requested_max = std::max(a.requested_max, b.requested_max);
            a.allocated_max = std::max(a.allocated_max, b.allocated_max);
            a.reserved_max = std::max(a.reserved_max, b.reserved_max);
            a.frag_max = std::max(a.frag_max, b.frag_max);
            a.requested_last = b.requested_last;
            a.allocated_last = b.allocated_last;
            a.reserved_last = b.reserved_last;
            a.frag_last = b.frag_last;
            a.events += b.events;
        }
        pts[n++] = a;
    }
    pts.resize(n);
    per_point *= 2;
}

}  // namespace gpumem::analysis
