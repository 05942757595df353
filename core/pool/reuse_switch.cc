// GPUMEM_REUSE=auto's one-way switch: which stream creations end the single issue order, and when the pools switch.
#include "core/pool/reuse_switch.h"

namespace gpumem {

void reuse_switch::stream_created(api_id api, bool non_blocking, bool reentrant) noexcept {
    if (!non_blocking && blocking_streams_.fetch_add(1, std::memory_order_acq_rel) == 0) return;
    if (reentrant) {
        deferred_.store(int(api), std::memory_order_release);
        return;
    }
    reg_.switch_all_to_safe(api);
}

}  // namespace gpumem
