// The log's members, each stated once: JSON name, value type, and which event kinds carry and require it.
//
// Everything that writes or reads a member is generated from these tables: the recorder's writer
// (core/event_format.cc: keys, order, types; the end line is an event like any other), the header
// writer (format_header), and the analyzer's member enum, its log_event fields, the required members
// and the fast path's expected keys (analyzer/log_event.h, analyzer/log_reader.cc).  Adding a member
// is one line here plus where its value comes from (the event struct) and where it is used.
// docs/log-format.md describes the same members for users; keep the two in step.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "event_schema.h"

namespace gpumem {

// How a member's value is written.
enum class field_type : uint8_t {
    u64,         // JSON integer >= 0
    i64,         // JSON integer
    dev,         // JSON integer: -1 or a device ordinal
    hex,         // string "0x…": addresses and handles (JSON numbers lose precision past 2^53)
    flag,        // `true`; the member is left out when false
    ev,          // string from k_ev_names
    api,         // string from k_api_names (a reader keeps names it does not know)
    mem_kind,    // string from k_mem_kind_names
    pool,        // string from k_pool_names
    end_reason,  // string from k_end_reason_names
};

// Sets of event kinds, as bit masks over ev_kind.
constexpr uint32_t kind_bit(ev_kind k) { return uint32_t(1) << unsigned(k); }
#define GPUMEM_K(k) ::gpumem::kind_bit(::gpumem::ev_kind::k)
inline constexpr uint32_t k_kinds_all = (uint32_t(1) << unsigned(ev_kind::count_)) - 1;
// Records that are not events (no seq, t or tid): the header and the stack records.
inline constexpr uint32_t k_kinds_records = GPUMEM_K(header) | GPUMEM_K(stack);
inline constexpr uint32_t k_kinds_events = k_kinds_all & ~k_kinds_records;  // every event line
inline constexpr uint32_t k_kinds_ordered = k_kinds_events & ~GPUMEM_K(lost);  // a loss has no seq
inline constexpr uint32_t k_kinds_alloc_free =
    GPUMEM_K(alloc) | GPUMEM_K(alloc_fail) | GPUMEM_K(free) | GPUMEM_K(free_fail);
inline constexpr uint32_t k_kinds_vm = GPUMEM_K(map) | GPUMEM_K(unmap) | GPUMEM_K(reserve) | GPUMEM_K(unreserve);
inline constexpr uint32_t k_kinds_segment = GPUMEM_K(segment_alloc) | GPUMEM_K(segment_free) | GPUMEM_K(segment_unmap) |
                                                 GPUMEM_K(segment_map);
inline constexpr uint32_t k_kinds_pool_state = GPUMEM_K(oom) | GPUMEM_K(stats);
inline constexpr uint32_t k_kinds_counted = GPUMEM_K(pool_sync) | GPUMEM_K(context_reset) | GPUMEM_K(lost);

// Members of every line but the header, in the order the recorder writes them.
// X(id, "json name", type, carried by, required by)
//   carried by:  the kinds on which the recorder writes the member (when the event has it)
//   required by: the kinds a reader rejects without it.  Two requirements depend on other members
//                and are stated in analyzer/log_reader.cc (required_members): "seg" on a pooled
//                alloc, and "size" on a free is excused by "unknown".  A second header line in
//                a log is an event line like any other: it needs "seq" and "t".
#define GPUMEM_LOG_FIELDS(X)                                                                            \
    X(ev, "ev", ev, k_kinds_all, k_kinds_all)                                                             \
    X(seq, "seq", u64, k_kinds_ordered, k_kinds_all & ~GPUMEM_K(lost) & ~GPUMEM_K(stack))                 \
    X(t, "t", u64, k_kinds_events, k_kinds_all & ~GPUMEM_K(lost) & ~GPUMEM_K(stack))                      \
    X(tid, "tid", u64, k_kinds_events, 0)                                                                 \
    X(dev, "dev", dev,                                                                                    \
      k_kinds_alloc_free | k_kinds_vm | k_kinds_segment | k_kinds_pool_state | GPUMEM_K(pool_sync) |      \
          GPUMEM_K(context_reset) | GPUMEM_K(reuse_safe),                                                 \
      GPUMEM_K(alloc) | GPUMEM_K(free) | GPUMEM_K(alloc_fail) | k_kinds_segment | k_kinds_pool_state |    \
          GPUMEM_K(reuse_safe))                                                                           \
    X(ctx, "ctx", u64, GPUMEM_K(alloc) | k_kinds_segment | k_kinds_pool_state | GPUMEM_K(pool_sync) |          \
          GPUMEM_K(context_reset) | GPUMEM_K(reuse_safe), 0)                                             \
    X(api, "api", api, k_kinds_alloc_free | k_kinds_vm | k_kinds_segment | GPUMEM_K(oom) | GPUMEM_K(reuse_safe), \
      GPUMEM_K(alloc) | GPUMEM_K(free) | GPUMEM_K(alloc_fail) | GPUMEM_K(reuse_safe))                     \
    X(kind, "kind", mem_kind, k_kinds_alloc_free, GPUMEM_K(alloc) | GPUMEM_K(free))                       \
    X(ptr, "ptr", hex, k_kinds_alloc_free | k_kinds_vm | k_kinds_segment,                                 \
      GPUMEM_K(alloc) | GPUMEM_K(free) | GPUMEM_K(free_fail) | k_kinds_vm | k_kinds_segment)              \
    X(size, "size", u64, k_kinds_alloc_free | k_kinds_vm | k_kinds_segment | GPUMEM_K(oom),               \
      GPUMEM_K(alloc) | GPUMEM_K(free) | GPUMEM_K(alloc_fail) | k_kinds_vm | k_kinds_segment | GPUMEM_K(oom)) \
    X(asize, "asize", u64, k_kinds_alloc_free | GPUMEM_K(segment_alloc), 0)                             \
    X(seg, "seg", hex, k_kinds_alloc_free | GPUMEM_K(segment_unmap) | GPUMEM_K(segment_map),             \
      GPUMEM_K(segment_unmap) | GPUMEM_K(segment_map))                                                   \
    X(pooled, "pooled", flag, k_kinds_alloc_free, 0)                                                      \
    X(mempool, "mempool", hex, k_kinds_alloc_free, 0)                                                     \
    X(stream, "stream", hex, k_kinds_alloc_free, 0)                                                       \
    X(handle, "handle", hex, GPUMEM_K(map), GPUMEM_K(map))                                                \
    X(offset, "offset", u64, GPUMEM_K(map), 0)                                                            \
    X(unknown, "unknown", flag, GPUMEM_K(free), 0)                                                        \
    X(err, "err", i64, GPUMEM_K(alloc_fail) | GPUMEM_K(free_fail), 0)                                     \
    X(stack, "stack", u64, GPUMEM_K(alloc) | GPUMEM_K(alloc_fail), 0)                                     \
    X(pool, "pool", pool, k_kinds_segment, 0)                                                             \
    X(count, "count", u64, k_kinds_counted, GPUMEM_K(lost))                                               \
    X(fence, "fence", flag, GPUMEM_K(pool_sync), 0)                                                       \
    X(waited, "waited", flag, GPUMEM_K(pool_sync), 0)                                                     \
    X(ordered, "ordered", flag, GPUMEM_K(pool_sync), 0)                                                   \
    X(wait_ns, "wait_ns", u64, GPUMEM_K(pool_sync), 0)                                                    \
    X(fence_ns, "fence_ns", u64, GPUMEM_K(pool_sync), 0)                                                  \
    X(reserved, "reserved", u64, k_kinds_pool_state, 0)                                                   \
    X(allocated, "allocated", u64, k_kinds_pool_state, 0)                                                 \
    X(requested, "requested", u64, k_kinds_pool_state, 0)                                                 \
    X(largest_free, "largest_free", u64, k_kinds_pool_state, 0)                                           \
    X(free_blocks, "free_blocks", u64, k_kinds_pool_state, 0)                                             \
    X(segments, "segments", u64, k_kinds_pool_state, 0)                                                   \
    X(gpu_free, "gpu_free", u64, k_kinds_pool_state | GPUMEM_K(alloc_fail), 0)                            \
    X(gpu_total, "gpu_total", u64, k_kinds_pool_state | GPUMEM_K(alloc_fail), 0)                          \
    X(streams, "streams", u64, k_kinds_pool_state, 0)                                                     \
    X(reason, "reason", end_reason, GPUMEM_K(end), 0)                                                     \
    X(signal, "signal", i64, GPUMEM_K(end), 0)                                                            \
    X(events, "events", u64, GPUMEM_K(end), 0)                                                            \
    X(n_alloc, "n_alloc", u64, GPUMEM_K(end), 0)                                                          \
    X(n_free, "n_free", u64, GPUMEM_K(end), 0)                                                            \
    X(n_fail, "n_fail", u64, GPUMEM_K(end), 0)                                                            \
    X(live_allocs, "live_allocs", u64, GPUMEM_K(end), 0)                                                  \
    X(live_bytes, "live_bytes", u64, GPUMEM_K(end), 0)                                                    \
    X(lost, "lost", u64, GPUMEM_K(end), 0)                                                                \
    X(unmatched, "unmatched", u64, GPUMEM_K(end), 0)                                                      \
    X(stacks_lost, "stacks_lost", u64, GPUMEM_K(end), 0)

enum class log_field : uint8_t {
#define GPUMEM_X(id, name, type, carried, required) id,
    GPUMEM_LOG_FIELDS(GPUMEM_X)
#undef GPUMEM_X
    count_
};
inline constexpr size_t k_log_field_count = size_t(log_field::count_);
static_assert(k_log_field_count <= 64, "readers keep one presence bit per member in a uint64_t");

struct log_field_info {
    const char* name;
    field_type type;
    uint32_t carried_by;
    uint32_t required_by;
};
inline constexpr log_field_info k_log_fields[] = {
#define GPUMEM_X(id, name, type, carried, required) {name, field_type::type, carried, required},
    GPUMEM_LOG_FIELDS(GPUMEM_X)
#undef GPUMEM_X
};
static_assert(sizeof(k_log_fields) / sizeof(k_log_fields[0]) == k_log_field_count);

constexpr bool carries(ev_kind k, log_field f) { return k_log_fields[size_t(f)].carried_by & kind_bit(k); }

// The members kind K carries, in the table's order, "ev" excluded: what the writer writes for K and
// the order in which the analyzer's fast path expects them.  A compile-time list, so both unroll it.
struct kind_member_list {
    std::array<uint8_t, k_log_field_count> f{};
    size_t n = 0;
};
template <ev_kind K>
constexpr kind_member_list make_kind_members() {
    kind_member_list l;
    for (size_t i = size_t(log_field::ev) + 1; i < k_log_field_count; ++i)
        if (k_log_fields[i].carried_by & kind_bit(K)) l.f[l.n++] = uint8_t(i);
    return l;
}
template <ev_kind K>
inline constexpr kind_member_list k_kind_members = make_kind_members<K>();

// The header line's members, in the order the recorder writes them ("ev":"header" first).
// X(id, "json name", type): str, int (JSON integer), strs (array of strings), devices (array of
// objects with the device members below), config (object with the config members below and the
// pool's settings, core/pool/pool_config.cc), opt_int (left out when 0), flag (`true`; left out
// when false).
#define GPUMEM_HEADER_FIELDS(X)                   \
    X(format, "format", str)                      \
    X(version, "version", int)                    \
    X(pid, "pid", int)                            \
    X(ppid, "ppid", int)                          \
    X(host, "host", str)                          \
    X(rank, "rank", str)                          \
    X(cmdline, "cmdline", strs)                   \
    X(start_unix_ns, "start_unix_ns", int)        \
    X(start_time, "start_time", str)              \
    X(devices, "devices", devices)                \
    X(config, "config", config)                   \
    X(gpumem_version, "gpumem_version", str)      \
    X(forked_from, "forked_from", opt_int)        \
    X(stacks_off, "stacks_off", opt_str)          \
    X(alloc_ctx, "alloc_ctx", flag)

// One element of the header's "devices".  X(id, "json name", type)
#define GPUMEM_DEVICE_FIELDS(X) \
    X(index, "index", int)      \
    X(name, "name", str)        \
    X(total, "total", int)

// The members of the header's "config".  X(id, "json name", type); opt_str is left out when empty;
// pool_settings is "reuse" and "pool_vmm" followed by the pool's size settings, named after their environment
// variables (core/pool/pool_config.cc writes them; absent with the pool off).
#define GPUMEM_CONFIG_FIELDS(X)            \
    X(pool, "pool", str)                   \
    X(out, "out", str)                     \
    X(flush_ms, "flush_ms", int)           \
    X(buffer_events, "buffer_events", int) \
    X(routes, "routes", opt_str)           \
    X(stacks, "stacks", str)               \
    X(stack_depth, "stack_depth", int)     \
    X(reuse, "reuse", pool_settings)

// The values of config's "pool" and "reuse" (docs/log-format.md), which a reader needs to rebuild the
// layout: written by preload/state.cc and core/pool/pool_config.cc, read by the analyzer; GPUMEM_REUSE
// takes the same words.
namespace config_value {
inline constexpr const char pool_on[] = "on";
inline constexpr const char pool_off[] = "off";
inline constexpr const char reuse_auto[] = "auto";
inline constexpr const char reuse_safe[] = "safe";
inline constexpr const char reuse_immediate[] = "immediate";
}  // namespace config_value

// The member names as constants, for readers: header_key::pid is "pid".
namespace header_key {
#define GPUMEM_X(id, name, type) inline constexpr const char id[] = name;
GPUMEM_HEADER_FIELDS(GPUMEM_X)
#undef GPUMEM_X
}  // namespace header_key
namespace device_key {
#define GPUMEM_X(id, name, type) inline constexpr const char id[] = name;
GPUMEM_DEVICE_FIELDS(GPUMEM_X)
#undef GPUMEM_X
}  // namespace device_key
namespace config_key {
#define GPUMEM_X(id, name, type) inline constexpr const char id[] = name;
GPUMEM_CONFIG_FIELDS(GPUMEM_X)
#undef GPUMEM_X
}  // namespace config_key

}  // namespace gpumem
