// The scalar members of a device in the report JSON (docs/report-json.md), each once: its JSON
// name, the device_report field it holds and its type.  The writer (report_json.cc), the reader
// (report_json_read.cc) and the measures that check and diff compare (report_measures.h) are all
// generated from this table, so a member is renamed or added here and nowhere else.
#pragma once

#include <bitset>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "report_model.h"

namespace gpumem::analysis {

// X(json name, device_report member, type): u64 is an unsigned byte count, count or time; ratio a
// double in [0, 1] written rounded to 6 decimals.  Three runs, in the order the writer emits them
// (the "reuse_safe" object comes between the first and the second, the rates between the second
// and the third).
#define GPUMEM_REPORT_DEVICE_FIELDS_A(X)                                                    \
    X(total_bytes, total, u64)                                                               \
    X(peak_requested_bytes, requested.peak, u64)                                             \
    X(peak_requested_t_ns, requested.peak_t, u64)                                            \
    X(peak_requested_seq, requested.peak_seq, u64)                                           \
    X(peak_allocated_bytes, allocated.peak, u64)                                             \
    X(peak_allocated_t_ns, allocated.peak_t, u64)                                            \
    X(peak_allocated_seq, allocated.peak_seq, u64)                                           \
    X(peak_reserved_bytes, reserved.peak, u64)                                               \
    X(peak_reserved_t_ns, reserved.peak_t, u64)                                              \
    X(peak_reserved_seq, reserved.peak_seq, u64)                                             \
    X(end_requested_bytes, requested.current, u64)                                           \
    X(end_allocated_bytes, allocated.current, u64)                                           \
    X(end_reserved_bytes, reserved.current, u64)                                             \
    X(max_external_fragmentation, max_external_fragmentation, ratio)                         \
    X(max_external_fragmentation_t_ns, max_external_fragmentation_t, u64)                    \
    X(max_external_fragmentation_seq, max_external_fragmentation_seq, u64)                   \
    X(max_external_fragmentation_free_bytes, max_external_fragmentation_free, u64)           \
    X(end_external_fragmentation, end_external_fragmentation, ratio)                         \
    X(end_free_in_segments_bytes, end_free_in_segments, u64)                                 \
    X(end_largest_free_bytes, end_largest_free, u64)                                         \
    X(end_free_blocks, end_free_blocks, u64)                                                 \
    X(max_free_blocks, max_free_blocks, u64)                                                 \
    X(end_segments, segment_count.current, u64)                                              \
    X(peak_segments, segment_count.peak, u64)                                                \
    X(peak_segments_t_ns, segment_count.peak_t, u64)                                         \
    X(peak_segments_seq, segment_count.peak_seq, u64)                                        \
    X(n_alloc, n_alloc, u64)                                                                 \
    X(n_free, n_free, u64)                                                                   \
    X(n_alloc_fail, n_alloc_fail, u64)                                                       \
    X(n_free_fail, n_free_fail, u64)                                                         \
    X(n_oom, n_oom, u64)                                                                     \
    X(n_unknown_free, n_unknown_free, u64)                                                   \
    X(n_segment_alloc, n_segment_alloc, u64)                                                 \
    X(n_segment_free, n_segment_free, u64)                                                   \
    X(n_segment_unmap, n_segment_unmap, u64)                                                 \
    X(n_segment_map, n_segment_map, u64)                                                     \
    X(end_unmapped_bytes, unmapped.current, u64)                                             \
    X(peak_unmapped_bytes, unmapped.peak, u64)                                               \
    X(peak_unmapped_t_ns, unmapped.peak_t, u64)                                              \
    X(peak_unmapped_seq, unmapped.peak_seq, u64)                                             \
    X(n_map, n_map, u64)                                                                     \
    X(n_unmap, n_unmap, u64)                                                                 \
    X(end_pending_bytes, pending.current, u64)                                               \
    X(peak_pending_bytes, pending.peak, u64)                                                 \
    X(peak_pending_t_ns, pending.peak_t, u64)                                                \
    X(peak_pending_seq, pending.peak_seq, u64)                                               \
    X(n_pool_sync, n_pool_sync, u64)                                                         \
    X(n_pool_wait, n_pool_wait, u64)                                                         \
    X(n_pool_ordered, n_pool_ordered, u64)                                                   \
    X(n_pool_fenced, n_pool_fenced, u64)                                                     \
    X(pool_wait_ns, pool_wait_ns, u64)                                                       \
    X(pool_fence_ns, pool_fence_ns, u64)
#define GPUMEM_REPORT_DEVICE_FIELDS_B(X)                                                    \
    X(end_mapped_bytes, mapped.current, u64)                                                 \
    X(peak_mapped_bytes, mapped.peak, u64)                                                   \
    X(peak_mapped_t_ns, mapped.peak_t, u64)                                                  \
    X(peak_mapped_seq, mapped.peak_seq, u64)                                                 \
    X(first_t_ns, first_t, u64)                                                              \
    X(last_t_ns, last_t, u64)
#define GPUMEM_REPORT_DEVICE_FIELDS_C(X)                                                    \
    X(n_leaks, n_leaks, u64)                                                                 \
    X(leaked_bytes, leaked_bytes, u64)
#define GPUMEM_REPORT_DEVICE_FIELDS(X) \
    GPUMEM_REPORT_DEVICE_FIELDS_A(X) GPUMEM_REPORT_DEVICE_FIELDS_B(X) GPUMEM_REPORT_DEVICE_FIELDS_C(X)

enum class device_field : unsigned {
#define GPUMEM_X(name, member, type) name,
    GPUMEM_REPORT_DEVICE_FIELDS(GPUMEM_X)
#undef GPUMEM_X
    count
};
inline constexpr size_t k_n_device_fields = size_t(device_field::count);

// Which members a device of a report JSON carried (a device analyzed from a log has them all).
using device_fields_present = std::bitset<k_n_device_fields>;

// What a device of a report JSON carried of its scalars: those there with a usable type, and what
// stood in place of each found with another type ("12", null), as JSON, so that a message says what
// was found rather than that the member is missing.
struct device_fields_read {
    device_fields_present present;
    std::vector<std::pair<device_field, std::string>> other_type;
    bool has(device_field f) const { return present[size_t(f)]; }
    // What stood in place of `f`, when it was there with another type; else nullptr.
    const std::string* found(device_field f) const {
        for (const auto& [field, text] : other_type)
            if (field == f) return &text;
        return nullptr;
    }
    // Why `f` reads as missing: `has no "NAME" (a number)` or `has "NAME": "12", not a number`.
    std::string why_missing(device_field f) const;
    // For a member of k_gated_fields that is missing: the line of the member in the report JSON, or
    // of the device's object where it is not there at all; 0 when not known (a member outside
    // k_gated_fields, a device analyzed from a log).
    std::vector<std::pair<device_field, uint64_t>> lines;
    uint64_t line(device_field f) const {
        for (const auto& [field, at] : lines)
            if (field == f) return at;
        return 0;
    }
};

// The members CI gates on (bold in docs/report-json.md): what check's limits and baseline read, and
// what `gpumem report` of a report JSON warns of when one is missing.  Their line is looked up when
// one is missing (device_fields_read::lines), so messages can say where.
inline constexpr device_field k_gated_fields[] = {
    device_field::peak_requested_bytes, device_field::peak_allocated_bytes, device_field::peak_reserved_bytes,
    device_field::end_requested_bytes,  device_field::max_external_fragmentation, device_field::n_alloc,
    device_field::n_free,               device_field::n_oom,                  device_field::n_leaks,
    device_field::leaked_bytes};

// The member's name as the report JSON spells it.
inline const char* field_name(device_field f) {
    static const char* const k_names[] = {
#define GPUMEM_X(name, member, type) #name,
        GPUMEM_REPORT_DEVICE_FIELDS(GPUMEM_X)
#undef GPUMEM_X
    };
    return k_names[size_t(f)];
}

inline std::string device_fields_read::why_missing(device_field f) const {
    if (const std::string* text = found(f)) return std::string("has \"") + field_name(f) + "\": " + *text + ", not a number";
    return std::string("has no \"") + field_name(f) + "\" (a number)";
}

// The field's value in the model, as a double (exact for counts below 2^53).
inline double field_value(const device_report& d, device_field f) {
    switch (f) {
#define GPUMEM_X(name, member, type) \
    case device_field::name: return double(d.member);
        GPUMEM_REPORT_DEVICE_FIELDS(GPUMEM_X)
#undef GPUMEM_X
    case device_field::count: break;
    }
    return 0;
}

}  // namespace gpumem::analysis
