// One parsed line of a gpumem event log: the plain record the reader fills and the replay consumes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "event_schema.h"
#include "log_fields.h"

namespace gpumem::analysis {

// Members an event line may carry (core/log_fields.h); `present` has one bit per member so the
// reader can say exactly which required member is missing.
enum field : uint8_t {
#define GPUMEM_X(id, name, type, carried, required) fd_##id,
    GPUMEM_LOG_FIELDS(GPUMEM_X)
#undef GPUMEM_X
    fd_count_
};
static_assert(size_t(fd_count_) == k_log_field_count);

// JSON member names, indexed by `field`.
inline constexpr const char* k_field_names[] = {
#define GPUMEM_X(id, name, type, carried, required) name,
    GPUMEM_LOG_FIELDS(GPUMEM_X)
#undef GPUMEM_X
};
static_assert(sizeof(k_field_names) / sizeof(k_field_names[0]) == fd_count_);

constexpr uint64_t bit(field f) { return uint64_t{1} << f; }

// Members the analysis never uses: the reader passes over them (skipping is cheaper than
// converting), so their log_event members stay at their defaults.  "stream" is read: `gpumem
// replay` gives each stream its own free blocks, as PyTorch's allocator does.  "tid" is read: the
// OOM diagnosis pairs a pool's oom with the alloc_fail of the same thread, and reading it cost no
// measurable time (docs/benchmarks.md, "Analyzer ingestion").
inline constexpr uint64_t k_skipped_fields = bit(fd_mempool) | bit(fd_offset);
// The members of one value type.
constexpr uint64_t fields_of_type(field_type t) {
    uint64_t m = 0;
    for (size_t i = 0; i < k_log_field_count; ++i)
        if (k_log_fields[i].type == t) m |= bit(field(i));
    return m;
}
// Members reset to their defaults at every line, present or not (the replay reads them without
// asking `has`); the others keep their last value and are meaningful only when present.  Every
// flag is among them: the writer leaves a flag out when it is false.  Both parsing paths reset
// exactly these: parse_json through reset_per_line (below), the fast path in store_member.
inline constexpr uint64_t k_reset_fields = fields_of_type(field_type::flag) | bit(fd_wait_ns) | bit(fd_fence_ns) |
                                           bit(fd_asize) | bit(fd_seg) | bit(fd_kind) | bit(fd_pool) | bit(fd_api) |
                                           bit(fd_dev) | bit(fd_ctx) | bit(fd_err);

// The C++ type and default of a member, by its field_type.
#define GPUMEM_LT_u64 uint64_t
#define GPUMEM_LT_i64 int64_t
#define GPUMEM_LT_dev int32_t
#define GPUMEM_LT_hex uint64_t
#define GPUMEM_LT_flag bool
#define GPUMEM_LT_ev ev_kind
#define GPUMEM_LT_api uint16_t  // index into the reader's api name table (api_id values first)
#define GPUMEM_LT_mem_kind mem_kind
#define GPUMEM_LT_pool pool_id
#define GPUMEM_LT_end_reason std::string  // kept as written (at most 64 bytes): a newer writer may add reasons
#define GPUMEM_LD_u64 0
#define GPUMEM_LD_i64 0
#define GPUMEM_LD_dev -1  // unknown device
#define GPUMEM_LD_hex 0
#define GPUMEM_LD_flag false
#define GPUMEM_LD_ev ev_kind::header
#define GPUMEM_LD_api 0
#define GPUMEM_LD_mem_kind mem_kind::none
#define GPUMEM_LD_pool pool_id::none
#define GPUMEM_LD_end_reason std::string()

// A parsed event: one member per entry of GPUMEM_LOG_FIELDS, named as there.  Only members whose
// bit is set in `present` are meaningful (and those in k_reset_fields, at their defaults).
struct log_event {
    uint64_t present = 0;
    bool known_kind = false;  // false: an "ev" this analyzer does not know (skipped by policy)
#define GPUMEM_X(id, name, type, carried, required) GPUMEM_LT_##type id = GPUMEM_LD_##type;
    GPUMEM_LOG_FIELDS(GPUMEM_X)
#undef GPUMEM_X

    bool has(field f) const { return present & bit(f); }
    // Bytes set aside: "asize" when the recorder wrote it, else "size".
    uint64_t set_aside() const { return has(fd_asize) ? asize : size; }
    // The driver's free bytes an oom, stats or alloc_fail line recorded: only as a pair with a
    // non-zero gpu_total, as the recorder writes them (gpu_total 0: the driver was not asked).
    uint64_t recorded_gpu_free() const { return has(fd_gpu_total) && gpu_total && has(fd_gpu_free) ? gpu_free : 0; }
};

// Sets the members of k_reset_fields to their defaults, as a line starts (parse_json).
[[gnu::always_inline]] inline void reset_per_line(log_event& e) {
#define GPUMEM_X(id, name, type, carried, required) \
    if constexpr ((k_reset_fields & bit(fd_##id)) != 0) e.id = GPUMEM_LD_##type;
    GPUMEM_LOG_FIELDS(GPUMEM_X)
#undef GPUMEM_X
}

}  // namespace gpumem::analysis
