// Turns one recorded event into one JSON line, without allocating: safe inside a signal handler.
#include "event_format.h"

#include <cstring>

namespace gpumem {
namespace {

// A bounded, allocation-free appender.  Overflow truncates; callers size buf by k_max_event_line.
struct line {
    char* p;
    char* end;
    void raw(const char* s, size_t n) noexcept {
        if (size_t(end - p) < n) n = size_t(end - p);
        memcpy(p, s, n);
        p += n;
    }
    void raw(const char* s) noexcept { raw(s, strlen(s)); }
    void u64(uint64_t v) noexcept {
        char tmp[24];
        int i = 24;
        do { tmp[--i] = char('0' + v % 10); v /= 10; } while (v);
        raw(tmp + i, size_t(24 - i));
    }
    void i64(int64_t v) noexcept {
        if (v < 0) { raw("-", 1); u64(uint64_t(0) - uint64_t(v)); }
        else u64(uint64_t(v));
    }
    void hex(uint64_t v) noexcept {
        static const char digits[] = "0123456789abcdef";
        char tmp[20];
        int i = 20;
        do { tmp[--i] = digits[v & 15]; v >>= 4; } while (v);
        tmp[--i] = 'x';
        tmp[--i] = '0';
        raw("\"", 1);
        raw(tmp + i, size_t(20 - i));
        raw("\"", 1);
    }
    void key(const char* k) noexcept { raw(",\""); raw(k); raw("\":"); }
    void kstr(const char* k, const char* v) noexcept { key(k); raw("\""); raw(v); raw("\""); }
    void ku(const char* k, uint64_t v) noexcept { key(k); u64(v); }
    void ki(const char* k, int64_t v) noexcept { key(k); i64(v); }
    void kx(const char* k, uint64_t v) noexcept { key(k); hex(v); }
};

template <class E, size_t N>
const char* name_of(const char* const (&names)[N], E v) noexcept {
    size_t i = size_t(v);
    return i < N ? names[i] : "unknown";
}

}  // namespace

size_t format_event(const event& e, char* buf, size_t cap) noexcept {
    if (cap < 2) return 0;
    line l{buf, buf + cap - 1};  // keep one byte for the newline
    l.raw("{\"ev\":\"");
    l.raw(name_of(k_ev_names, e.ev));
    l.raw("\"");
    if (e.ev != ev_kind::lost) l.ku("seq", e.seq);  // a loss occupies no position in the order
    l.ku("t", e.t_ns);
    l.ku("tid", e.tid);
    const block_fields& b = e.b;
    switch (e.ev) {
        case ev_kind::alloc:
        case ev_kind::alloc_fail:
        case ev_kind::free:
        case ev_kind::free_fail:
            l.ki("dev", e.dev);
            l.kstr("api", name_of(k_api_names, e.api));
            l.kstr("kind", name_of(k_mem_kind_names, e.kind));
            l.kx("ptr", b.ptr);
            l.ku("size", b.size);
            if (b.asize && b.asize != b.size) l.ku("asize", b.asize);
            if (e.flags & ef_pooled) {
                l.kx("seg", b.seg);
                l.raw(",\"pooled\":true");
            } else if (b.seg) {
                l.kx("mempool", b.seg);
            }
            if (e.flags & ef_has_stream) l.kx("stream", b.stream);
            if (e.flags & ef_size_unknown) l.raw(",\"unknown\":true");
            if (e.ev == ev_kind::alloc_fail || e.ev == ev_kind::free_fail) l.ki("err", e.err);
            break;
        case ev_kind::map:
        case ev_kind::unmap:
        case ev_kind::reserve:
        case ev_kind::unreserve:
            l.ki("dev", e.dev);
            l.kstr("api", name_of(k_api_names, e.api));
            l.kx("ptr", b.ptr);
            l.ku("size", b.size);
            if (e.ev == ev_kind::map) {
                l.kx("handle", b.seg);
                l.ku("offset", b.stream);
            }
            break;
        case ev_kind::segment_alloc:
        case ev_kind::segment_free:
            l.ki("dev", e.dev);
            l.kstr("api", name_of(k_api_names, e.api));
            l.kx("ptr", b.ptr);
            l.ku("size", b.size);
            l.kstr("pool", name_of(k_pool_names, e.pool));
            break;
        case ev_kind::oom:
        case ev_kind::stats: {
            const pool_state& p = e.p;
            l.ki("dev", e.dev);
            if (e.ev == ev_kind::oom) {
                l.kstr("api", name_of(k_api_names, e.api));
                l.ku("size", p.size);
            }
            l.ku("reserved", p.reserved);
            l.ku("allocated", p.allocated);
            l.ku("requested", p.requested);
            l.ku("largest_free", p.largest_free);
            l.ku("free_blocks", p.free_blocks);
            l.ku("segments", p.segments);
            l.ku("gpu_free", p.gpu_free);
            l.ku("gpu_total", p.gpu_total);
            break;
        }
        case ev_kind::pool_sync:
        case ev_kind::context_reset:
            l.ki("dev", e.dev);
            l.ki("count", e.err);
            break;
        case ev_kind::reuse_safe:
            l.ki("dev", e.dev);
            l.kstr("api", name_of(k_api_names, e.api));
            break;
        case ev_kind::lost:
            l.ku("count", b.size);
            break;
        default:
            break;  // header and end lines are written by event_log, not from an event
    }
    l.raw("}");
    *l.p++ = '\n';
    return size_t(l.p - buf);
}

void append_json_string(std::string& out, const char* s, size_t n) {
    static const char digits[] = "0123456789abcdef";
    out += '"';
    for (size_t i = 0; i < n; ++i) {
        unsigned char c = static_cast<unsigned char>(s[i]);
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (c < 0x20) {
                    out += "\\u00";
                    out += digits[c >> 4];
                    out += digits[c & 15];
                } else {
                    out += char(c);  // UTF-8 passes through; invalid bytes are the program's own argv
                }
        }
    }
    out += '"';
}

}  // namespace gpumem
