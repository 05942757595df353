// The order rules of a log; see log_order.h.
#include "model/log_order.h"

namespace gpumem::analysis {

std::string order_finding::message() const {
    switch (what) {
    case out_of_order:
        return "events out of order: seq " + std::to_string(seq) + " follows seq " + std::to_string(prev) +
               " (the file must be in seq order)";
    case second_header: return "a second header line: two logs concatenated into one file?";
    case seq_jump:
        return "seq jumps from " + std::to_string(prev) + " to " + std::to_string(seq) + ": " +
               std::to_string(seq - prev - 1) + " event(s) missing";
    case late_start:
        return "the first event has seq " + std::to_string(seq) + ", not 0: earlier events are missing";
    case none: break;
    }
    return {};
}

order_finding log_order::next_slow(const log_event& e) {
    // A stack record is not an event: it has no place in the order (the report never counts one).
    if (e.known_kind && e.ev == ev_kind::stack) return {};
    order_finding f;
    if (e.has(fd_seq)) {  // every kind but "lost" has one
        // Equal is out of order too: two events with one seq are two logs' or a repeated line.
        if (have_seq_ && e.seq <= last_seq_) return {order_finding::out_of_order, e.seq, last_seq_};
        if (have_seq_ && e.seq != last_seq_ + 1) f = {order_finding::seq_jump, e.seq, last_seq_};
        if (!have_seq_ && e.seq != 0) f = {order_finding::late_start, e.seq, 0};
        have_seq_ = true;
        last_seq_ = e.seq;
    }
    // A kind from a newer recorder is skipped by the version policy, whatever it is called.  The
    // error outranks a seq warning found above: a refused log's warnings are never shown.
    if (e.known_kind && e.ev == ev_kind::header) return {order_finding::second_header, e.seq, last_seq_};
    return f;
}

}  // namespace gpumem::analysis
