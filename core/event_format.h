// Turns one recorded event into one JSON line, without allocating: safe inside a signal handler.
#pragma once

#include <cstddef>
#include <string>

#include "event_schema.h"

namespace gpumem {

// Largest line format_event can produce.
inline constexpr size_t k_max_event_line = 640;

// Writes the JSON line for `e` (with its trailing '\n') into buf, returns its length.
// Uses no heap, no locale and no stdio, so the crash path can call it.
size_t format_event(const event& e, char* buf, size_t cap) noexcept;

// Appends `s` as a JSON string literal (quotes included) to out.
void append_json_string(std::string& out, const char* s, size_t n);

}  // namespace gpumem
