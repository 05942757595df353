// Live bytes and call counts per API and per memory kind (the report's "by API" and "by kind").
#pragma once

#include <vector>

#include "metrics/metric.h"

namespace gpumem::analysis {

class usage : public metric {
public:
    using metric::metric;
    void new_device(device_state& d);
    void placed(device_state& d, const log_event& e, const live_alloc& a, uint64_t line) {
        for (usage_row* r : {&api_row(d, a.api), &by_kind_[d.slot][size_t(a.kind)]}) {
            add_bytes(ctx, r->bytes, a.size, e, line);
            ++r->live;
            ++r->n_alloc;
        }
    }
    void released(device_state& d, const live_alloc& a, bool counted_free) {
        for (usage_row* r : {&api_row(d, a.api), &by_kind_[d.slot][size_t(a.kind)]}) {
            r->bytes.sub(a.size);
            if (r->live) --r->live;
            if (counted_free) ++r->n_free;
        }
    }
    void finish();

private:
    usage_row& api_row(device_state& d, uint16_t api) {
        auto& v = by_api_[d.slot];
        if (v.size() <= api) v.resize(size_t(api) + 1);
        return v[api];
    }
    std::vector<std::vector<usage_row>> by_api_, by_kind_;  // by slot, then api index / mem_kind
};

}  // namespace gpumem::analysis
