// The one rule for sizes written by people (core/size_parse.h): number, optional spaces, unit;
// and for whole counts: digits alone.
#include "size_parse.h"

namespace gpumem {
namespace {

char lower(char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; }

// The unit's multiplier, or 0 when `u` is not a unit.  `u` runs to the end of the string.
uint64_t unit_multiplier(const char* u) {
    if (!*u) return 1;
    char p = lower(u[0]);
    if (p == 'b') return u[1] ? 0 : 1;
    const char* prefixes = "kmgt";
    int power = 0;
    for (int i = 0; prefixes[i]; ++i)
        if (p == prefixes[i]) power = i + 1;
    if (!power) return 0;
    bool binary;
    if (!u[1]) binary = true;                                           // K M G T
    else if (lower(u[1]) == 'i' && lower(u[2]) == 'b' && !u[3]) binary = true;  // KiB MiB GiB TiB
    else if (lower(u[1]) == 'b' && !u[2]) binary = false;              // KB MB GB TB
    else return 0;
    uint64_t m = 1;
    for (int i = 0; i < power; ++i) m *= binary ? 1024 : 1000;
    return m;
}

}  // namespace

bool parse_size(const char* s, uint64_t* out) noexcept {
    if (!s || !out) return false;
    const char* p = s;
    if (*p < '0' || *p > '9') return false;  // no sign, no leading space, not empty
    unsigned __int128 whole = 0;
    for (; *p >= '0' && *p <= '9'; ++p) {
        whole = whole * 10 + unsigned(*p - '0');
        if (whole > UINT64_MAX) return false;
    }
    // The fraction as frac / scale, exact up to 19 digits; later digits are checked and ignored.
    uint64_t frac = 0, scale = 1;
    if (*p == '.') {
        ++p;
        if (*p < '0' || *p > '9') return false;  // "1." and "1.GiB" are not numbers
        for (; *p >= '0' && *p <= '9'; ++p)
            if (scale < 10000000000000000000ull) {
                frac = frac * 10 + uint64_t(*p - '0');
                scale *= 10;
            }
    }
    const char* number_end = p;
    while (*p == ' ' || *p == '\t') ++p;
    if (p != number_end && !*p) return false;  // spaces only between a number and its unit
    uint64_t mult = unit_multiplier(p);
    if (!mult) return false;
    unsigned __int128 v = whole * mult + (unsigned __int128)frac * mult / scale;
    if (v > UINT64_MAX) return false;
    *out = uint64_t(v);
    return true;
}

bool parse_count(const char* s, uint64_t* out) noexcept {
    if (!s || !out || !*s) return false;
    unsigned __int128 v = 0;
    for (const char* p = s; *p; ++p) {
        if (*p < '0' || *p > '9') return false;
        v = v * 10 + unsigned(*p - '0');
        if (v > UINT64_MAX) return false;
    }
    *out = uint64_t(v);
    return true;
}

}  // namespace gpumem
