// Formatting helpers: human-readable sizes, durations, percentages, escaping and shell quoting.
#include "format_util.h"

#include "report_model.h"

#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace gpumem::analysis {

std::string fmt_bytes(uint64_t n) {
    static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (n < 1024) return std::to_string(n) + " B";
    double v = double(n);
    int u = 0;
    while (v >= 1024 && u < 6) {
        v /= 1024;
        ++u;
    }
    char b[32];
    std::snprintf(b, sizeof b, "%.2f %s", v, units[u]);
    return b;
}

std::string fmt_size_class(size_t i) {
    const uint64_t lo = i == 0 ? 0 : uint64_t(1) << i;
    return fmt_bytes(lo) + "-" + (i >= 63 ? std::string("16.00 EiB") : fmt_bytes(uint64_t(1) << (i + 1)));  // 2^64: no uint64_t
}

std::string fmt_time(uint64_t ns) {
    char b[32];
    if (ns < 1000) std::snprintf(b, sizeof b, "%" PRIu64 " ns", ns);
    else if (ns < 1000000) std::snprintf(b, sizeof b, "%.2f us", double(ns) / 1e3);
    else if (ns < 1000000000) std::snprintf(b, sizeof b, "%.2f ms", double(ns) / 1e6);
    else std::snprintf(b, sizeof b, "%.3f s", double(ns) / 1e9);
    return b;
}

std::string fmt_at(uint64_t t, uint64_t seq) { return fmt_time(t) + " (seq " + std::to_string(seq) + ")"; }

std::string fmt_where(const std::string& file, uint64_t line) { return line ? file + ":" + std::to_string(line) : file; }

std::string fmt_peak_at(uint64_t peak, uint64_t t, uint64_t seq) { return peak ? fmt_at(t, seq) : "-"; }

std::string fmt_pct(double r) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f%%", r * 100.0);
    return b;
}

std::string fmt_hex(uint64_t v) {
    char b[24];
    std::snprintf(b, sizeof b, "0x%" PRIx64, v);
    return b;
}

std::string fmt_rate(uint64_t n, uint64_t duration_ns) {
    if (duration_ns == 0) return "-";
    // Whole numbers with separators from 100/s up: a tenth of a call per second says nothing there.
    double r = double(n) * 1e9 / double(duration_ns);
    if (r >= 100) return fmt_count(uint64_t(r + 0.5)) + "/s";
    char b[32];
    std::snprintf(b, sizeof b, "%.1f/s", r);
    return b;
}

std::string svg_num(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f", v);
    return b;
}

std::string fmt_count(uint64_t n) {
    std::string s = std::to_string(n), out;
    int k = 0;
    for (auto it = s.rbegin(); it != s.rend(); ++it) {
        if (k && k % 3 == 0) out.push_back(',');
        out.push_back(*it);
        ++k;
    }
    return {out.rbegin(), out.rend()};
}

std::string fmt_counted(uint64_t n, const char* one, const char* many) {
    return fmt_count(n) + " " + (n == 1 ? one : many);
}

namespace {
// Appends c (a control character) as less and git show it: ^[ for ESC, ^? for DEL.
void caret(std::string& o, unsigned char c) {
    o.push_back('^');
    o.push_back(c == 0x7f ? '?' : char(c + 0x40));
}

// Length of the well-formed UTF-8 sequence at s[i] (Unicode's table 3-7: no overlong forms, no
// surrogates, nothing past U+10FFFF), or 0 when the bytes there are not one.
size_t utf8_length(std::string_view s, size_t i) {
    auto at = [&](size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0u; };
    const unsigned c = at(0);
    auto cont = [&](size_t k, unsigned lo = 0x80, unsigned hi = 0xbf) { return at(k) >= lo && at(k) <= hi; };
    if (c >= 0xc2 && c <= 0xdf) return cont(1) ? 2 : 0;
    if (c == 0xe0) return cont(1, 0xa0) && cont(2) ? 3 : 0;
    if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef) return cont(1) && cont(2) ? 3 : 0;
    if (c == 0xed) return cont(1, 0x80, 0x9f) && cont(2) ? 3 : 0;
    if (c == 0xf0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
    if (c >= 0xf1 && c <= 0xf3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
    if (c == 0xf4) return cont(1, 0x80, 0x8f) && cont(2) && cont(3) ? 4 : 0;
    return 0;
}
}  // namespace

std::string visible(std::string_view s, bool keep_newlines) {
    std::string o;
    o.reserve(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
        unsigned char c = static_cast<unsigned char>(s[i]);
        if ((c < 0x20 && !(keep_newlines && c == '\n')) || c == 0x7f) {
            caret(o, c);
        } else if (c == 0xc2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
                   static_cast<unsigned char>(s[i + 1]) <= 0x9f) {
            // C1 controls (U+0080..U+009F; U+009B is a one-character CSI on some terminals).
            char b[12];
            std::snprintf(b, sizeof b, "<U+%04X>", unsigned(static_cast<unsigned char>(s[++i])));
            o += b;
        } else if (c < 0x80) {
            o.push_back(char(c));
        } else if (size_t n = utf8_length(s, i)) {
            o.append(s.substr(i, n));
            i += n - 1;
        } else {
            // Not UTF-8 (a Latin-1 file name, a cut sequence): shown as \xNN, so that the text stays
            // valid UTF-8 (JUnit XML parsers reject the raw byte) and the byte can still be read.
            char b[8];
            std::snprintf(b, sizeof b, "\\x%02X", c);
            o += b;
        }
    }
    return o;
}

std::string html_escape(const std::string& s) {
    std::string o;
    o.reserve(s.size());
    for (char c : visible(s, true)) {
        switch (c) {
        case '&': o += "&amp;"; break;
        case '<': o += "&lt;"; break;
        case '>': o += "&gt;"; break;
        case '"': o += "&quot;"; break;
        case '\'': o += "&#39;"; break;
        default: o.push_back(c);
        }
    }
    return o;
}

const char* pool_name(pool_id p) { return size_t(p) < size_t(pool_id::count_) ? k_pool_names[size_t(p)] : "none"; }
const char* kind_name(mem_kind k) { return size_t(k) < size_t(mem_kind::count_) ? k_mem_kind_names[size_t(k)] : "none"; }

// True when the middle 80% of the events (by count) happened within a fifth of the time shown, with
// enough points that event order shows more than time does.
bool events_bunched(const device_report& d) {
    if (d.timeline.size() < 8) return false;
    uint64_t t0 = d.timeline.front().t_first, t1 = d.timeline.back().t_last, total = 0;
    for (const time_point& p : d.timeline) total += p.events;
    if (t1 <= t0 || total < 10) return false;
    // Time at which the cumulative event count first reaches `n`.
    auto time_of = [&](uint64_t n) {
        uint64_t seen = 0;
        for (const time_point& p : d.timeline) {
            seen += p.events;
            if (seen >= n) return p.t_first;
        }
        return t1;
    };
    // The middle 80% runs from the event after the first tenth to the last before the final tenth
    // (time_of(total / 10) took the first tenth's last event: 10 events, 8 of them within
    // microseconds, read as spread over the run).
    uint64_t a = time_of(total / 10 + 1), b = time_of(total - total / 10);
    return b >= a && (b - a) < (t1 - t0) / 5;  // not (b - a) * 5: it wraps when times span near 2^64
}

std::string shell_quote(const std::string& s) {
    bool plain = !s.empty();
    for (unsigned char c : s)
        plain &= std::isalnum(c) || std::strchr("_./%+,:=@-", c) != nullptr;
    if (plain) return s;
    if (visible(s) != s) {
        // A byte visible() would change (a control, a C1 control, a byte not UTF-8) can be neither
        // printed as is (an ESC reaches the terminal) nor shown as ^[ (the pasted command names
        // another file): bash's $'...' writes it in printable escapes that read back as the byte.
        std::string q = "$'";
        for (size_t i = 0; i < s.size(); ++i) {
            const unsigned char c = static_cast<unsigned char>(s[i]);
            const size_t n = c >= 0x80 ? utf8_length(s, i) : 1;
            const bool c1 = c == 0xc2 && n == 2 && static_cast<unsigned char>(s[i + 1]) <= 0x9f;
            if (c == '\\' || c == '\'') {
                q += '\\';
                q += char(c);
            } else if (c == 0x1b) {
                q += "\\e";
            } else if (c == '\n') {
                q += "\\n";
            } else if (c == '\t') {
                q += "\\t";
            } else if (c < 0x20 || c == 0x7f || n == 0 || c1) {
                // Always two digits: bash reads up to two, so a hex digit after it stays itself.
                for (size_t k = 0; k < (c1 ? 2 : 1); ++k) {
                    char b[8];
                    std::snprintf(b, sizeof b, "\\x%02X", unsigned(static_cast<unsigned char>(s[i + k])));
                    q += b;
                }
                i += c1 ? 1 : 0;
            } else {
                q.append(s, i, n);
                i += n - 1;
            }
        }
        return q + "'";
    }
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

}  // namespace gpumem::analysis
