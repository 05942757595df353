// Turns one recorded event into one JSON line, without allocating: safe inside a signal handler.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "event_schema.h"
#include "log_fields.h"

namespace gpumem {

// Largest line format_event can produce.
inline constexpr size_t k_max_event_line = 640;

// Writes the JSON line for `e` (with its trailing '\n') into buf, returns its length.
// Uses no heap, no locale and no stdio, so the crash path can call it.
size_t format_event(const event& e, char* buf, size_t cap) noexcept;

// The header line's values, one member per entry of core/log_fields.h's header tables.
#define GPUMEM_HT_str std::string
#define GPUMEM_HT_opt_str std::string  // left out when empty
#define GPUMEM_HT_int int64_t
#define GPUMEM_HT_opt_int int64_t      // left out when 0
#define GPUMEM_HT_flag bool            // `true`, left out when false
#define GPUMEM_HT_strs std::vector<std::string>
#define GPUMEM_HT_devices std::vector<header_device>
#define GPUMEM_HT_config header_config
// "reuse" and the pool's other settings as `"key":value` members (pool_config::append_config_json;
// a leading or trailing comma is ignored); empty with the pool off.
#define GPUMEM_HT_pool_settings std::string
#define GPUMEM_X(id, name, type) GPUMEM_HT_##type id{};
struct header_device {
    GPUMEM_DEVICE_FIELDS(GPUMEM_X)
};
struct header_config {
    GPUMEM_CONFIG_FIELDS(GPUMEM_X)
};
struct header_values {
    GPUMEM_HEADER_FIELDS(GPUMEM_X)
};
#undef GPUMEM_X

// The header line (with its trailing '\n').  Allocates: called once, when the log starts.
std::string format_header(const header_values& h);

// Appends `s` as a JSON string literal (quotes included) to out.
void append_json_string(std::string& out, const char* s, size_t n);

}  // namespace gpumem
