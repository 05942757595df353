// Leaks at the end of the log; see leaks.h.
#include "metrics/leaks.h"

#include <algorithm>
#include <map>
#include <vector>

namespace gpumem::analysis {

void leaks::finish() {
    std::map<int, std::vector<const address_space::live_entry*>> by_dev;
    ctx.model.for_each_live([&](const address_space::live_entry& kv) { by_dev[kv.second.dev].push_back(&kv); });
    for (auto& [k, v] : by_dev) {
        device_state& d = ctx.model.dev(k);
        d.rep.n_leaks = v.size();
        for (auto* p : v) d.rep.leaked_bytes += std::min(p->second.size, UINT64_MAX - d.rep.leaked_bytes);
        size_t n = std::min(v.size(), ctx.options.max_listed_leaks);
        std::partial_sort(v.begin(), v.begin() + ptrdiff_t(n), v.end(), [](auto* a, auto* b) {
            return a->second.size != b->second.size ? a->second.size > b->second.size : a->second.seq < b->second.seq;
        });
        for (size_t i = 0; i < n; ++i) d.rep.leaks.push_back(address_space::view(v[i]->first, v[i]->second, ctx.names));
    }
}

}  // namespace gpumem::analysis
