// Per-API and per-kind usage rows; see usage.h.
#include "metrics/usage.h"

#include <algorithm>

#include "log_reader.h"

namespace gpumem::analysis {

void usage::new_device(device_state& d) {
    by_api_.resize(std::max(by_api_.size(), size_t(d.slot) + 1));
    by_kind_.resize(by_api_.size());
    auto& k = by_kind_[d.slot];
    k.resize(size_t(mem_kind::count_));
    for (size_t i = 0; i < k.size(); ++i) k[i].name = i == 0 ? "other" : k_mem_kind_names[i];
}

void usage::finish() {
    for (auto& [dev, d] : ctx.model.devices()) {
        auto& apis = by_api_[d.slot];
        for (size_t i = 0; i < apis.size(); ++i)
            if (apis[i].n_alloc) {
                apis[i].name = ctx.names.api_name(uint16_t(i));
                d.rep.by_api.push_back(apis[i]);
            }
        std::sort(d.rep.by_api.begin(), d.rep.by_api.end(),
                  [](const usage_row& a, const usage_row& b) { return a.bytes.peak > b.bytes.peak; });
        for (const usage_row& r : by_kind_[d.slot])
            if (r.n_alloc) d.rep.by_kind.push_back(r);
    }
}

}  // namespace gpumem::analysis
