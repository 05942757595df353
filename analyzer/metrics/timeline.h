// Fragmentation over time and the memory-over-time series: one point after every event that
// changes a device, downsampled to at most k_timeline_points per device, keeping maxima.
#pragma once

#include <vector>

#include "metrics/metric.h"

namespace gpumem::analysis {

class timeline : public metric {
public:
    using metric::metric;
    void new_device(device_state& d) {
        if (series_.size() <= d.slot) series_.resize(d.slot + 1);
    }
    void after_event(device_state* d, const log_event& e, uint64_t) {
        if (d && e.ev != ev_kind::stats && e.ev != ev_kind::end) point(*d, e.t, e.seq);
    }
    void changed(device_state& d, uint64_t t, uint64_t seq) { point(d, t, seq); }
    void finish();

private:
    struct series {
        std::vector<time_point> pts;
        uint64_t per_point = 1;
        void add(uint64_t t, uint64_t seq, uint64_t req, uint64_t alloc, uint64_t res, double frag);
        void compact();
    };
    void point(device_state& d, uint64_t t, uint64_t seq);
    std::vector<series> series_;  // by slot
};

}  // namespace gpumem::analysis
