// What `gpumem check` holds to limits and `gpumem diff` compares: named measures of one device,
// each a field of the report model (report_fields.h) with the moment it was reached.  The commands
// use these and never spell a report member themselves.
#pragma once

#include <string>

#include "report_fields.h"

namespace gpumem::analysis {

enum class measure_unit { bytes, ratio, count };

struct measure {
    const char* title;   // "peak allocated", as messages and JUnit names say it
    measure_unit unit;
    device_field value;
    // When the value was reached; device_field::count when the measure has no single moment.
    device_field t_ns = device_field::count;
    device_field seq = device_field::count;
    // The name for a process whose log has no end line (killed, or still running), where the
    // measure counts leaks: such a process did not exit, so its live bytes are not a leak
    // (docs/metrics.md, Leaks).  nullptr: the title serves either way.
    const char* unended_title = nullptr;
};

// A measure's name for a process; log_ended: its log has an end line.
inline std::string measure_title(const measure& m, bool log_ended) {
    return !log_ended && m.unended_title ? m.unended_title : m.title;
}

inline constexpr measure k_peak_requested{"peak requested", measure_unit::bytes, device_field::peak_requested_bytes,
                                          device_field::peak_requested_t_ns, device_field::peak_requested_seq};
inline constexpr measure k_peak_allocated{"peak allocated", measure_unit::bytes, device_field::peak_allocated_bytes,
                                          device_field::peak_allocated_t_ns, device_field::peak_allocated_seq};
inline constexpr measure k_peak_reserved{"peak reserved", measure_unit::bytes, device_field::peak_reserved_bytes,
                                         device_field::peak_reserved_t_ns, device_field::peak_reserved_seq};
inline constexpr measure k_max_fragmentation{"max external fragmentation", measure_unit::ratio,
                                             device_field::max_external_fragmentation,
                                             device_field::max_external_fragmentation_t_ns,
                                             device_field::max_external_fragmentation_seq};
inline constexpr measure k_leaked{.title = "leaked", .unit = measure_unit::bytes, .value = device_field::leaked_bytes,
                                  .unended_title = "live when the log stops"};
inline constexpr measure k_ooms{"OOMs", measure_unit::count, device_field::n_oom};

// --max-peak's --metric: the three byte counts of docs/metrics.md, by the name the reports use.
// Returns nullptr for any other name.
inline const measure* peak_measure(const std::string& metric) {
    if (metric == "requested") return &k_peak_requested;
    if (metric == "allocated") return &k_peak_allocated;
    if (metric == "reserved") return &k_peak_reserved;
    return nullptr;
}

// What a baseline holds a run to, in this order.  OOMs too: a program that catches one (PyTorch
// empties its cache and retries) runs on and exits 0, and only the count says it reached the limit.
inline constexpr const measure* k_baseline_measures[] = {&k_peak_requested, &k_peak_allocated, &k_peak_reserved,
                                                         &k_max_fragmentation, &k_leaked, &k_ooms};

// The rows `gpumem diff` prints side by side, in this order.
inline constexpr measure k_diff_rows[] = {
    k_peak_requested,
    k_peak_allocated,
    k_peak_reserved,
    {"peak segments", measure_unit::count, device_field::peak_segments},
    k_max_fragmentation,
    {"end external fragmentation", measure_unit::ratio, device_field::end_external_fragmentation},
    {"allocations", measure_unit::count, device_field::n_alloc},
    {"frees", measure_unit::count, device_field::n_free},
    {"failed allocations", measure_unit::count, device_field::n_alloc_fail},
    k_ooms,
    {.title = "leaked allocations", .unit = measure_unit::count, .value = device_field::n_leaks,
     .unended_title = "live allocations at log end"},
    {.title = "leaked bytes", .unit = measure_unit::bytes, .value = device_field::leaked_bytes,
     .unended_title = "live bytes at log end"},
};

inline double measure_value(const device_report& d, const measure& m) { return field_value(d, m.value); }

}  // namespace gpumem::analysis
