// Out-of-memory diagnosis: each failed allocation for lack of memory, with the free memory the
// model holds at that moment, a verdict (capacity, fragmentation or chunk rounding), the failing
// call's stack and, for the first few, the map.
#pragma once

#include <vector>

#include "metrics/metric.h"

namespace gpumem::analysis {

class oom_diagnosis : public metric {
public:
    using metric::metric;
    void new_device(device_state& d) {
        if (pending_.size() <= d.slot) pending_.resize(d.slot + 1);
    }
    void after_event(device_state*, const log_event& e, uint64_t line) {
        switch (e.ev) {
        case ev_kind::alloc: pending_[ctx.model.dev(e.dev).slot].pending = false; break;
        case ev_kind::alloc_fail: on_oom(e, line, false); break;
        case ev_kind::oom: on_oom(e, line, true); break;
        default: break;
        }
    }

private:
    void on_oom(const log_event& e, uint64_t line, bool from_pool);
    uint32_t failing_stack(const log_event& e) const;
    struct pending_oom {
        bool pending = false;  // an "oom" not yet matched by its alloc_fail
        bool kept = false;     // ... that the report keeps (the last of d.rep.ooms): it takes the call's err and stack
        uint64_t size = 0;
    };
    std::vector<pending_oom> pending_;  // by slot
};

}  // namespace gpumem::analysis
