// Where the pool's events go: an interface the event log implements (and tests count).
#pragma once

#include "core/event_schema.h"

namespace gpumem {

// The event log fills seq, t_ns and tid; the pool fills the rest (ev, dev, api, kind, pool, flags,
// err and b or p).  emit() is called with the pool's lock held, so the order of a pool's events in
// the log is the order of its state changes; emit must not call back into the pool.
struct event_sink {
    virtual ~event_sink() = default;
    virtual void emit(event& e) noexcept = 0;
};

}  // namespace gpumem
