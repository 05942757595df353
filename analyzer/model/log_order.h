// The order rules of a log, stated once for `gpumem report` (log_checker) and `gpumem replay` (trace.cc):
// one header per file, and seq growing by exactly one per event.
#pragma once

#include <cstdint>
#include <string>

#include "log_event.h"

namespace gpumem::analysis {

// What one event breaks, if anything.  An error makes the log unusable (frees would pair with
// another process's blocks, or with blocks not yet allocated); the others say events are missing.
struct order_finding {
    enum kind : uint8_t { none, out_of_order, second_header, seq_jump, late_start } what = none;
    uint64_t seq = 0;   // the event's
    uint64_t prev = 0;  // the seq before it (out_of_order, seq_jump)

    bool error() const { return what == out_of_order || what == second_header; }
    // The report's words for it ("" for none): both tools say the same for the same defect.
    std::string message() const;
};

class log_order {
public:
    // Each line after the header, known kind or not, in file order.  After an error the log is
    // refused, so the state is not meant to go on.
    order_finding next(const log_event& e) {
        // The common case inline: the next seq, not a header.
        // (seq 0 after 2^64-1 is last_seq_ + 1 by wrap-around, but a decrease: the slow path says so.)
        if (have_seq_ && e.has(fd_seq) && e.seq == last_seq_ + 1 && e.seq != 0 && !(e.known_kind && e.ev == ev_kind::header)) {
            last_seq_ = e.seq;
            return {};
        }
        return next_slow(e);
    }

private:
    order_finding next_slow(const log_event& e);

    bool have_seq_ = false;
    uint64_t last_seq_ = 0;
};

}  // namespace gpumem::analysis
