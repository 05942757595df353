// Out-of-memory diagnosis: each failed allocation for lack of memory, with the free memory the
// model holds at that moment, a verdict (capacity, pending frees, fragmentation or chunk rounding),
// the failing call's stack and, for the first few, the map.
#pragma once

#include <cstdint>
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
        case ev_kind::alloc_fail: on_oom(e, line, false); break;
        case ev_kind::oom: on_oom(e, line, true); break;
        default: break;
        }
    }

private:
    void on_oom(const log_event& e, uint64_t line, bool from_pool);
    uint32_t failing_stack(const log_event& e) const;
    // A pool's "oom" not yet matched by its pooled alloc_fail.  The pool writes the two back to
    // back, but another pool of the device (another context's, a green context's) or a call outside
    // the pools may log between them, so nothing but that alloc_fail ends the wait, and a device
    // may have several waiting (one per pool), matched by size and thread: the pool writes both
    // lines on the failing call's thread, so two pools refusing the same size at once each get
    // their own call's stack.  Where either line lacks "tid" (a hand-written log), size alone
    // decides, oldest first.  The recorder marks the pool's alloc_fail "pooled"; one without the
    // mark (a hand-written log) pairs only as the event right after the "oom" (next seq).
    struct pending_oom {
        uint64_t size = 0;
        uint64_t seq = 0;
        uint64_t tid = 0;
        bool has_tid = false;
        size_t kept = SIZE_MAX;  // its index in d.rep.ooms, which takes the call's err and stack; SIZE_MAX past the cap
    };
    std::vector<std::vector<pending_oom>> pending_;  // by slot
};

}  // namespace gpumem::analysis
