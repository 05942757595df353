// The one rule for sizes (and whole counts) written by people: GPUMEM_* environment variables and
// the CLI's arguments.
#pragma once

#include <cstdint>

namespace gpumem {

// Parses a size in bytes: a decimal number, then optionally spaces and a unit.
//   number: digits, optionally a '.' and more digits ("4096", "1.5"); no sign, no exponent.
//   unit (any letter case): none or B = bytes;
//     KiB MiB GiB TiB, and the bare K M G T, are powers of 1024 (K = KiB, as in "64M");
//     KB MB GB TB are powers of 1000.
//   A fraction of a byte is rounded down ("1.1KiB" is 1126).  Returns false, leaving *out as it
//   was, on anything else and on values past 2^64-1.
// Examples: "4096", "4 KiB" (4096), "512MB" (512000000), "1.5GiB" (1610612736), "64M" (67108864).
// Allocation-free and locale-free: safe to call while the preload starts.
bool parse_size(const char* s, uint64_t* out) noexcept;

// Parses a whole count (a number of frees, milliseconds): decimal digits only, no unit, no
// fraction, up to 2^64-1.  A knob counted in frees or milliseconds read "2MiB" as 2,097,152 under
// the size rule, silently.  Returns false, leaving *out as it was, on anything else.
bool parse_count(const char* s, uint64_t* out) noexcept;

}  // namespace gpumem
