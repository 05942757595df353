// Small formatting helpers shared by the text, HTML and Perfetto writers: sizes, times, ratios.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "event_schema.h"

namespace gpumem::analysis {

// A double as an integer for a label, a bar width or a row index: NaN and values <= 0 give 0,
// values at or past `hi` give `hi`.  Converting an out-of-range double is undefined behaviour, and
// absurd logs (sizes near 2^64, times that wrap, a hand-edited report JSON) produce such doubles.
inline uint64_t clamp_to_u64(double v, uint64_t hi = UINT64_MAX) {
    if (!(v > 0)) return 0;
    if (v >= double(hi)) return hi;  // double(UINT64_MAX) is 2^64: still out of range, so >=
    return uint64_t(v);
}

std::string fmt_bytes(uint64_t n);         // "0 B", "512 B", "1.50 KiB", "2.00 MiB"
// Power-of-two size class i of a size_histogram, from 2^i up to (not including) 2^(i+1), class 0 from
// 0 B: "512.00 KiB-1.00 MiB", "0 B-2 B".  diff and the HTML histograms name classes alike.
std::string fmt_size_class(size_t i);
std::string fmt_time(uint64_t ns);         // "950 ns", "12.50 us", "3.20 ms", "1.234 s"
std::string fmt_at(uint64_t t, uint64_t seq);  // an event's moment: "12.50 us (seq 41)"
std::string fmt_where(const std::string& file, uint64_t line);  // "FILE:LINE", or "FILE" where the line is 0 (not known)
// The moment of a peak: fmt_at, or "-" for a peak of 0, which was never reached (its seq 0 would
// read as the log's first event).
std::string fmt_peak_at(uint64_t peak, uint64_t t, uint64_t seq);
std::string fmt_pct(double ratio);         // 0.1234 -> "12.3%"
std::string fmt_hex(uint64_t v);           // "0x7f3a40000000"
std::string fmt_rate(uint64_t n, uint64_t duration_ns);  // "12.5/s", "450,281/s", "-" for an instant run
std::string fmt_count(uint64_t n);         // "1,234,567"
std::string fmt_counted(uint64_t n, const char* one, const char* many);  // "1 block", "1,024 blocks"
std::string svg_num(double v);             // an SVG coordinate: "12.5" (one decimal is a tenth of a pixel)
// Control characters from a log shown, never sent to a terminal or browser: ^[ for ESC, ^? for DEL
// (as less and git do), <U+009B> for C1 controls, \xFF for a byte that is not UTF-8 (so the result
// is always valid UTF-8); "\n" passes when keep_newlines.
std::string visible(std::string_view s, bool keep_newlines = false);
std::string html_escape(const std::string& s);  // also visible(s, true)
// A path as a shell reads it back, for a command line a message suggests: bare when it holds only
// characters no shell treats specially, else in single quotes (a ' inside becomes '\''); one that
// visible() would change (an ESC, a byte not UTF-8) in bash's $'...' instead ($'a\eb', \xFF), so
// the text is printable and a paste names the file.
std::string shell_quote(const std::string& s);
const char* pool_name(pool_id p);
const char* kind_name(mem_kind k);

// What requested, allocated and reserved mean, with PyTorch's name beside each: stated once for the
// text and HTML reports (docs/metrics.md says the same).
struct metric_meaning {
    const char* name;
    const char* meaning;
    const char* pytorch;
};
inline constexpr metric_meaning k_metric_meanings[] = {
    {"requested", "asked for by the program and not yet freed", "torch.cuda.memory_allocated()"},
    {"allocated", "pool blocks holding them, incl. pool rounding", "no counterpart"},
    {"reserved", "held from the driver: segments + unpooled", "torch.cuda.memory_reserved()"},
};

struct device_report;
// Most events bunched into a small part of the run (a long load, then a burst): the memory-over-time
// views go by event order then, or the burst would be a sliver.  Rule in format_util.cc.
bool events_bunched(const device_report& d);

}  // namespace gpumem::analysis
