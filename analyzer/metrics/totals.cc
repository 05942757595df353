// Byte totals and event counts; see totals.h.
#include "metrics/totals.h"

#include <algorithm>

#include "log_reader.h"

namespace gpumem::analysis {

void totals::new_device(device_state& d) {
    for (const header_device& h : ctx.proc.header_devices)
        if (h.index == d.dev) {
            d.rep.name = h.name;
            d.rep.total = h.total;
        }
    if (seen_.size() <= d.slot) seen_.resize(d.slot + 1);
}

void totals::reuse_safe(device_state& d, const log_event& e, uint64_t line) {
    d.rep.reuse_safe = true;
    d.rep.reuse_safe_seq = e.seq;
    d.rep.reuse_safe_t = e.t;
    d.rep.reuse_safe_line = line;
    d.rep.reuse_safe_api = ctx.names.api_name(e.api);
}

}  // namespace gpumem::analysis
