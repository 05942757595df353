// Validation of a log as it is read; see log_checker.h.
#include "model/log_checker.h"

#include "format_util.h"
#include "log_reader.h"

namespace gpumem::analysis {

namespace {
// "file:line: message", its control characters shown (they come from the log and end on a terminal).
std::string where(const std::string& file, uint64_t line, const std::string& msg) {
    return visible(fmt_where(file, line) + ": " + msg);
}
}  // namespace

void log_checker::warn(uint64_t line, const std::string& msg) {
    ++rep_.n_warnings;
    if (rep_.warnings.size() < k_max_warnings) rep_.warnings.push_back(where(rep_.file, line, msg));
}

// Past the cap too, so that "N more warnings not shown" never hides it.  Each caller says it once.
void log_checker::warn_always(uint64_t line, const std::string& msg) {
    ++rep_.n_warnings;
    rep_.warnings.push_back(where(rep_.file, line, msg));
}

void log_checker::fail(uint64_t line, const std::string& msg) { throw input_error(rep_.file, line, msg); }

void log_checker::inconsistent(uint64_t line, const std::string& msg) {
    if (lenient_) warn(line, msg + " (tolerated: the log is missing events)");
    else fail(line, msg);
}

void log_checker::bad_free(uint64_t line, uint64_t ptr, bool handle) {
    const char* what = handle ? "handle " : "pointer ";
    if (const uint64_t* f = freed_.find(ptr))
        inconsistent(line, std::string("double free of ") + what + hex(ptr) + ": it was already freed at line " +
                               std::to_string(*f));
    else
        inconsistent(line, std::string("free of unknown ") + what + hex(ptr) +
                               ": never allocated in this log and not marked \"unknown\":true");
}

void log_checker::freed(const log_event& e, const live_alloc* a, uint64_t line) {
    if (!a) return;
    if (a->dev != e.dev && e.dev >= 0)
        warn(line, "free of " + hex(e.ptr) + " on device " + std::to_string(e.dev) + ", allocated on device " +
                       std::to_string(a->dev) + " at line " + std::to_string(a->line));
    if (e.has(fd_size) && e.size != a->size)
        warn(line, "free of " + hex(e.ptr) + " says size " + std::to_string(e.size) + ", allocated with size " +
                       std::to_string(a->size) + " at line " + std::to_string(a->line));
    // Remember recent frees (bounded) so a second free can be named a double free.
    if (freed_.size() >= (size_t(1) << 20)) freed_.clear();
    freed_.insert_or_assign(e.ptr, line);
}

void log_checker::check_order_slow(const order_finding& f, const log_event& e, uint64_t line) {
    if (f.error()) fail(line, f.message());
    if (f.what != order_finding::none) {  // a seq gap: events are missing from here on
        warn(line, f.message());
        lenient_ = true;
    }
    if (after_end_ && e.known_kind) warn(line, "event after the end line");
}

void log_checker::after_event_slow(address_space& model, const log_event& e, uint64_t line) {
    switch (e.ev) {
    case ev_kind::stats: {
        // The line is one pool's ("ctx"): the device's other pools are not in it.
        pool_part& d = model.dev(e.dev).pool(e.ctx);
        // The pool's own account of reserved bytes and segments must match the reconstruction;
        // a difference means events are missing or the recorder and analyzer disagree.
        bool seg_ok = !e.has(fd_segments) || e.segments == d.n_segments;
        bool res_ok = !e.has(fd_reserved) || e.reserved == d.segment_bytes;
        if ((!seg_ok || !res_ok) && stats_mismatch_warnings_++ < 3)
            warn(line, "the pool reports " + std::to_string(e.reserved) + " bytes reserved in " +
                           std::to_string(e.segments) + " segments; the reconstruction has " +
                           std::to_string(d.segment_bytes) + " in " + std::to_string(d.n_segments));
        // Its free blocks too: holes (segment_unmap, an arena segment_alloc's unmapped rest) and pending
        // blocks are in neither count.
        bool blocks_ok = !e.has(fd_free_blocks) || e.free_blocks == d.gaps.count();
        bool largest_ok = !e.has(fd_largest_free) || e.largest_free == d.gaps.largest();
        if (seg_ok && res_ok && (!blocks_ok || !largest_ok) && stats_mismatch_warnings_++ < 3)
            warn(line, "the pool reports " + std::to_string(e.free_blocks) + " free blocks, the largest " +
                           std::to_string(e.largest_free) + " bytes; the reconstruction has " +
                           std::to_string(d.gaps.count()) + ", the largest " + std::to_string(d.gaps.largest()));
        break;
    }
    case ev_kind::lost:
        lenient_ = true;
        if (lost_said_) {
            warn(line, std::to_string(e.count) + " event(s) were lost by the recorder; totals may be off");
        } else {
            lost_said_ = true;
            warn_always(line, std::to_string(e.count) + " event(s) were lost by the recorder; totals may be off");
        }
        break;
    case ev_kind::end:
        after_end_ = true;
        // The end line's `lost` counts every loss so far, those that got no lost line too (an
        // event another thread had begun and not finished by the end; docs/log-format.md).  The
        // checker runs before the totals (rebuild.cc), so rep_.lost is still what the log stated
        // before this line: its lost lines, and an earlier end line's count.
        if (e.lost > rep_.lost) {
            lenient_ = true;
            const std::string n = std::to_string(e.lost - rep_.lost);
            lost_said_ = true;
            warn_always(line, n + " event(s) were lost by the recorder (counted in the end line, with no lost line); totals may be off");
        }
        // The recorder counts the events it recorded; its "lost" records are not among them.
        if (e.has(fd_events) && e.events != events_ - 1)
            warn(line, "the end line counts " + std::to_string(e.events) + " events; the log has " +
                           std::to_string(events_ - 1));
        break;
    default: break;
    }
}

void log_checker::finish(const address_space& model) {
    if (rep_.has_end && !lenient_) {
        uint64_t n_live = model.n_live();
        // The recorder counts live allocations itself; NULL results of 0-byte calls excepted.
        if (rep_.end_live_allocs != n_live)
            warn(0, "the end line reports " + std::to_string(rep_.end_live_allocs) +
                        " live allocations; the reconstruction has " + std::to_string(n_live));
    }
}

}  // namespace gpumem::analysis
