// Validation of a log as it is read: seq order and gaps (the rules are log_order.h's), events after the end line, frees of what
// is not live (double frees named from a bounded table of recent frees), counts the log states
// about itself, and the lenient mode a log enters once it is known to miss events.
#pragma once

#include <cstdint>
#include <string>

#include "log_event.h"
#include "model/address_space.h"
#include "model/log_order.h"
#include "report_model.h"
#include "u64_map.h"

namespace gpumem::analysis {

class log_checker : public model_checks {
public:
    explicit log_checker(process_report& rep) : rep_(rep) {}

    // Before any event is applied, known kind or not.  Throws input_error for a log out of order.
    void check_order(const log_event& e, uint64_t line) {
        if (e.ev != ev_kind::lost || !e.known_kind) ++events_;
        order_finding f = order_.next(e);
        if (f.what != order_finding::none || (after_end_ && e.known_kind)) check_order_slow(f, e, line);
    }
    // After a known event was applied to `model`.
    void after_event(address_space& model, const log_event& e, uint64_t line) {
        if (e.ev == ev_kind::stats || e.ev == ev_kind::lost || e.ev == ev_kind::end) after_event_slow(model, e, line);
    }
    // End of input.
    void finish(const address_space& model);

    // The model's observations the checks need.
    void placed(const live_alloc& a, uint64_t ptr) {
        if (a.kind != mem_kind::vmm) freed_.erase(ptr);
    }
    void freed(const log_event& e, const live_alloc* a, uint64_t line);

    // model_checks
    void warn(uint64_t line, const std::string& message) override;
    void warn_always(uint64_t line, const std::string& message) override;
    void inconsistent(uint64_t line, const std::string& message) override;
    void bad_free(uint64_t line, uint64_t ptr, bool handle) override;
    bool lenient() const override { return lenient_; }

    [[noreturn]] void fail(uint64_t line, const std::string& message);

private:
    void check_order_slow(const order_finding& f, const log_event& e, uint64_t line);
    void after_event_slow(address_space& model, const log_event& e, uint64_t line);

    process_report& rep_;
    log_order order_;
    // After lost events or a seq gap the log is known to be incomplete, so inconsistencies that
    // the missing events could explain become warnings instead of errors.
    bool lenient_ = false;
    bool after_end_ = false;
    uint64_t events_ = 0;          // events the recorder counts in its end line ("lost" records are not)
    u64_map<uint64_t> freed_;      // recently freed address -> line of free
    uint64_t stats_mismatch_warnings_ = 0;
    bool lost_said_ = false;
};

}  // namespace gpumem::analysis
