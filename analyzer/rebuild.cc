// The driver: pushes each event through the log checks, the model and the metrics, in order.
#include "rebuild.h"

#include <tuple>

#include "log_reader.h"
#include "metrics/leaks.h"
#include "metrics/oom_diagnosis.h"
#include "metrics/snapshots.h"
#include "metrics/timeline.h"
#include "metrics/totals.h"
#include "metrics/usage.h"
#include "model/address_space.h"
#include "model/log_checker.h"

namespace gpumem::analysis {

// The metrics, called in this order for every hook.  A new metric is a class in metrics/ and one
// entry here.  Order matters where one reads what another writes: totals before the rest (they
// read the byte totals), timeline after oom_diagnosis (a point closes each event).
using metric_list = std::tuple<totals, usage, oom_diagnosis, timeline, leaks>;

struct rebuilder::impl final : model_observer {
    process_report& rep;
    rebuild_options opt;
    log_checker checker;
    address_space model;
    metric_context ctx;
    // Called after the metrics: it notices a new peak once the totals hold it.
    snapshots snaps;
    metric_list metrics;

    template <typename... M>
    static std::tuple<M...> make(metric_context& c, std::tuple<M...>*) {
        return std::tuple<M...>(M(c)...);
    }

    impl(process_report& r, const line_parser& names, rebuild_options o)
        : rep(r), opt(std::move(o)), checker(r), model(r, names, *this, checker),
          ctx{r, model, names, checker, snaps, opt}, snaps(ctx), metrics(make(ctx, static_cast<metric_list*>(nullptr))) {}

    template <typename F>
    void each(F&& f) {
        std::apply([&](auto&... m) { (f(m), ...); }, metrics);
        f(snaps);
    }

    void apply(const log_event& e, uint64_t line) {
        checker.check_order(e, line);
        each([&](auto& m) { m.any_event(e); });
        if (!e.known_kind) return;
        each([&](auto& m) { m.before_event(e, line); });
        model.apply(e, line);
        device_state* d = model.event_device();
        checker.after_event(model, e, line);
        each([&](auto& m) { m.after_event(d, e, line); });
    }

    void finish() {
        snaps.finish();  // first: the last snapshots see the state before the others' end values
        std::apply([&](auto&... m) { (m.finish(), ...); }, metrics);
        checker.finish(model);
        rep.devices.clear();
        for (auto& [k, d] : model.devices()) {
            const device_report& r = d.rep;
            // A device only named by a free of dev -1 or similar, with nothing of its own, is noise.
            if (r.n_alloc + r.n_free + r.n_alloc_fail + r.n_free_fail + r.n_segment_alloc + r.n_map +
                    r.n_unmap + r.n_oom + r.n_leaks == 0)
                continue;
            rep.devices.push_back(d.rep);
        }
    }

    // model_observer: fanned out to the metrics (and the checks that follow the live set).
    void new_device(device_state& d) override {
        each([&](auto& m) { m.new_device(d); });
    }
    void before_change(device_state& d) override { snaps.before_change(d); }
    void placed(device_state& d, const log_event& e, const live_alloc& a, uint64_t line) override {
        checker.placed(a, e.ptr);
        each([&](auto& m) { m.placed(d, e, a, line); });
    }
    void released(device_state& d, const live_alloc& a, bool counted_free) override {
        each([&](auto& m) { m.released(d, a, counted_free); });
    }
    void freed(device_state& d, const log_event& e, const live_alloc* a, uint64_t line) override {
        checker.freed(e, a, line);
        each([&](auto& m) { m.freed(d, e, a, line); });
    }
    void segment_added(device_state& d, const log_event& e, uint64_t mapped, uint64_t line) override {
        each([&](auto& m) { m.segment_added(d, e, mapped, line); });
    }
    void segment_removed(device_state& d, uint64_t size, uint64_t unmapped) override {
        each([&](auto& m) { m.segment_removed(d, size, unmapped); });
    }
    void segment_unmapped(device_state& d, const log_event& e, uint64_t line) override {
        each([&](auto& m) { m.segment_unmapped(d, e, line); });
    }
    void segment_mapped(device_state& d, const log_event& e, uint64_t line) override {
        each([&](auto& m) { m.segment_mapped(d, e, line); });
    }
    void pending_added(device_state& d, uint64_t asize, const log_event& e, uint64_t line) override {
        each([&](auto& m) { m.pending_added(d, asize, e, line); });
    }
    void pending_removed(device_state& d, uint64_t asize) override {
        each([&](auto& m) { m.pending_removed(d, asize); });
    }
    void pending_cleared(device_state& d) override {
        each([&](auto& m) { m.pending_cleared(d); });
    }
    void mapped(device_state& d, const log_event& e, uint64_t line) override {
        each([&](auto& m) { m.mapped(d, e, line); });
    }
    void unmapped(device_state& d, uint64_t size) override {
        each([&](auto& m) { m.unmapped(d, size); });
    }
    void va_reserved(const log_event& e, uint64_t line) override {
        each([&](auto& m) { m.va_reserved(e, line); });
    }
    void va_released(uint64_t size) override {
        each([&](auto& m) { m.va_released(size); });
    }
    void reuse_safe(device_state& d, const log_event& e, uint64_t line) override {
        each([&](auto& m) { m.reuse_safe(d, e, line); });
    }
    void changed(device_state& d, uint64_t t, uint64_t seq) override {
        each([&](auto& m) { m.changed(d, t, seq); });
    }
};

rebuilder::rebuilder(process_report& report, const line_parser& names, rebuild_options options)
    : impl_(std::make_unique<impl>(report, names, std::move(options))) {}
rebuilder::~rebuilder() = default;
void rebuilder::apply(const log_event& e, uint64_t line) { impl_->apply(e, line); }
void rebuilder::finish(uint64_t) { impl_->finish(); }
void rebuilder::warn(uint64_t line, const std::string& message, bool always) {
    if (always) impl_->checker.warn_always(line, message);
    else impl_->checker.warn(line, message);
}
const device_report* rebuilder::device_so_far(int dev) const {
    auto& devs = impl_->model.devices();
    auto it = devs.find(dev);
    return it == devs.end() ? nullptr : &it->second.rep;
}
bool rebuilder::needs_second_pass() const { return impl_->snaps.needs_second_pass(); }
std::map<int, uint64_t> rebuilder::peak_seqs() const { return impl_->snaps.peak_seqs(); }
std::map<int, state_snapshot> rebuilder::take_peak_snapshots() { return impl_->snaps.take_peak_snapshots(); }

}  // namespace gpumem::analysis
