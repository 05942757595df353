// The --perfetto output: Chrome trace JSON with one counter track per device and metric, and an
// instant event per OOM, which ui.perfetto.dev and chrome://tracing both load.  Several logs share
// one clock (each header's start_unix_ns) and get one track group each, ordered by rank.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <numeric>

#include "format_util.h"
#include "report_output.h"
#include "views/report_sites.h"

namespace gpumem::analysis {

void write_perfetto(std::ostream& os, const std::vector<process_report>& procs) {
    using ojson = nlohmann::ordered_json;
    ojson events = ojson::array();
    // Event times are ns since each recorder started; shifting each log by its start_unix_ns minus
    // the earliest one puts ranks and forked children on one time axis.  A log without
    // start_unix_ns (0) stays on its own clock, starting at 0.
    uint64_t t0 = UINT64_MAX;
    for (const process_report& p : procs)
        if (p.start_unix_ns) t0 = std::min(t0, p.start_unix_ns);
    // Track groups in rank order (numeric when the rank is a number), then pid, then file order.
    std::vector<size_t> order(procs.size());
    std::iota(order.begin(), order.end(), size_t(0));
    auto rank_key = [](const std::string& r) {
        char* end = nullptr;
        long v = r.empty() ? -1 : std::strtol(r.c_str(), &end, 10);
        return (r.empty() || *end) ? std::make_pair(1, 0L) : std::make_pair(0, v);
    };
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        auto ka = rank_key(procs[a].rank), kb = rank_key(procs[b].rank);
        return ka != kb ? ka < kb : procs[a].pid < procs[b].pid;
    });
    std::vector<size_t> sort_index(procs.size());
    for (size_t k = 0; k < order.size(); ++k) sort_index[order[k]] = k;
    for (size_t i = 0; i < procs.size(); ++i) {
        const process_report& p = procs[i];
        const uint64_t offset_ns = p.start_unix_ns && t0 != UINT64_MAX ? p.start_unix_ns - t0 : 0;
        // Two logs may carry the same pid (different hosts); the trace needs distinct ones.
        int64_t pid = p.pid > 0 ? p.pid : int64_t(i + 1);
        bool shared_pid = false;  // then the track names say the host, or the two read the same
        for (size_t k = 0; k < procs.size(); ++k)
            if (k != i && procs[k].pid == p.pid) {
                shared_pid = true;
                if (k < i) pid = int64_t(1000000000 + i);
            }
        std::string cmd;
        for (const std::string& a : p.cmdline) cmd += (cmd.empty() ? "" : " ") + a;
        events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid},
                          {"args", {{"name", "gpumem " + std::to_string(p.pid) + (shared_pid && !p.host.empty() ? " on " + p.host : "") +
                                                 (p.rank.empty() ? "" : " rank " + p.rank) +
                                                 (p.forked_from ? " (forked from " + std::to_string(p.forked_from) + ")" : "") +
                                                 (cmd.empty() ? "" : ": " + cmd.substr(0, 80))}}}});
        events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", sort_index[i]}}}});
        for (const device_report& d : p.devices) {
            std::string dev = d.dev < 0 ? "host" : "dev" + std::to_string(d.dev);
            // Fragmentation is of free space in gpumem's pool segments: without any it is not
            // measured, and a flat 0 would read as "not fragmented" (docs/metrics.md).
            const bool pooled = d.segment_count.peak > 0;
            auto ts = [&](uint64_t ns) { return double(offset_ns + ns) / 1000.0; };  // trace time is in us
            auto counter = [&](const std::string& name, double t_us, ojson args) {
                events.push_back({{"name", name}, {"ph", "C"}, {"ts", t_us}, {"pid", pid}, {"args", std::move(args)}});
            };
            // Else the trace, sorted by time, would replay the states out of seq order and end on
            // another level than the log's end.
            timeline_clock clock;
            for (const time_point& t : d.timeline) {
                // A point covers several events: its maxima at its start keep spikes visible, its
                // last values at its end keep the level right between points and after the last
                // one, even where its events share a time (then both at that time, the last after).
                const auto [first, last] = clock.place(t);
                counter(dev + " memory (bytes)", ts(first),
                        {{"requested", t.requested_max}, {"allocated", t.allocated_max}, {"reserved", t.reserved_max}});
                if (pooled)
                    counter(dev + " external fragmentation", ts(first), {{"fragmentation", std::round(t.frag_max * 1e6) / 1e6}});
                if (t.events > 1 && (last != first || t.falls())) {
                    counter(dev + " memory (bytes)", ts(last),
                            {{"requested", t.requested_last}, {"allocated", t.allocated_last}, {"reserved", t.reserved_last}});
                    if (pooled)
                        counter(dev + " external fragmentation", ts(last), {{"fragmentation", std::round(t.frag_last * 1e6) / 1e6}});
                }
            }
            for (const oom_report& o : d.ooms) {
                // The verdict as the text, HTML and check give it: one that counted the driver's
                // free memory as 0, since the log did not record it, says so (docs/metrics.md).
                const std::string verdict = o.verdict + o.verdict_caveat();
                ojson args = {{"device", d.dev}, {"size", o.size}, {"largest_free", o.largest_free},
                              {"free_in_segments", o.free_in_segments}, {"verdict", verdict}};
                if (o.gpu_free_recorded()) args["gpu_free"] = o.gpu_free;
                // The failing call's site, named as gpumem diff names sites, when its stack was recorded.
                if (std::string asked = asked_by_name(p, o.stack); !asked.empty()) args["asked_by"] = asked;
                events.push_back({{"name", "OOM " + fmt_bytes(o.size) + " (" + verdict + ")"}, {"ph", "i"}, {"s", "p"},
                                  {"ts", ts(o.t)}, {"pid", pid}, {"tid", 0}, {"args", args}});
            }
        }
    }
    ojson root;
    root["traceEvents"] = events;
    root["displayTimeUnit"] = "ms";
    os << root.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

}  // namespace gpumem::analysis
