// Turns one recorded event into one JSON line, without allocating: safe inside a signal handler.
#include "event_format.h"

#include <cstring>
#include <utility>

#include "log_fields.h"

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

// Where each member's value lives in the event, and whether this event has it (members that do
// not apply are left out, never written as null).  Only called for members the kind carries.
[[gnu::always_inline]] inline bool member_value(const event& e, log_field f, uint64_t& v) noexcept {
    const block_fields& b = e.b;
    switch (f) {
        case log_field::ev: v = uint64_t(e.ev); return true;
        case log_field::seq: v = e.seq; return true;
        case log_field::t: v = e.t_ns; return true;
        case log_field::tid: v = e.tid; return true;
        case log_field::dev: v = uint64_t(int64_t(e.dev)); return true;
        // Left out for a device's first pool, and on a pooled alloc (its "seg" names the pool).
        case log_field::ctx: v = e.ctx; return e.ctx != 0 && !(e.ev == ev_kind::alloc && (e.flags & ef_pooled));
        case log_field::api: v = uint64_t(e.api); return true;
        case log_field::kind: v = uint64_t(e.kind); return true;
        case log_field::ptr: v = b.ptr; return true;
        case log_field::size: v = e.ev == ev_kind::oom ? e.p.size : b.size; return true;
        case log_field::asize: v = b.asize; return b.asize && b.asize != b.size;
        case log_field::seg:  // a pooled block's segment, or the segment a segment_unmap/segment_map changes
            v = b.seg;
            return (e.flags & ef_pooled) || e.ev == ev_kind::segment_unmap || e.ev == ev_kind::segment_map;
        case log_field::pooled: v = 1; return e.flags & ef_pooled;
        case log_field::mempool: v = b.mempool; return b.mempool != 0;
        case log_field::stream: v = b.stream; return e.flags & ef_has_stream;
        case log_field::handle: v = b.handle; return true;
        case log_field::offset: v = b.offset; return true;
        case log_field::unknown: v = 1; return e.flags & ef_size_unknown;
        case log_field::err: v = uint64_t(int64_t(e.err)); return true;
        case log_field::stack: v = b.stack; return b.stack != 0;
        case log_field::pool: v = uint64_t(e.pool); return true;
        case log_field::count: v = e.c.count; return true;
        case log_field::fence: v = 1; return e.flags & ef_fence;
        case log_field::waited: v = 1; return e.flags & ef_waited;
        case log_field::ordered: v = 1; return e.flags & ef_ordered;
        case log_field::wait_ns: v = e.c.wait_ns; return e.ev == ev_kind::pool_sync && e.c.wait_ns != 0;
        case log_field::fence_ns: v = e.c.fence_ns; return e.ev == ev_kind::pool_sync && e.c.fence_ns != 0;
        case log_field::reserved: v = e.p.reserved; return true;
        case log_field::allocated: v = e.p.allocated; return true;
        case log_field::requested: v = e.p.requested; return true;
        case log_field::largest_free: v = e.p.largest_free; return true;
        case log_field::free_blocks: v = e.p.free_blocks; return true;
        case log_field::segments: v = e.p.segments; return true;
        // An alloc_fail has them only when gpumem asked the driver after it ran out of memory.
        case log_field::gpu_free:
            v = e.ev == ev_kind::alloc_fail ? b.gpu_free : e.p.gpu_free;
            return e.ev != ev_kind::alloc_fail || b.gpu_total != 0;
        case log_field::gpu_total:
            v = e.ev == ev_kind::alloc_fail ? b.gpu_total : e.p.gpu_total;
            return e.ev != ev_kind::alloc_fail || b.gpu_total != 0;
        case log_field::streams: v = e.p.streams; return true;
        case log_field::reason: v = uint64_t(e.x.reason); return true;
        case log_field::signal: v = uint64_t(int64_t(e.x.signal)); return e.x.reason == end_reason::signal;
        case log_field::events: v = e.x.events; return true;
        case log_field::n_alloc: v = e.x.n_alloc; return true;
        case log_field::n_free: v = e.x.n_free; return true;
        case log_field::n_fail: v = e.x.n_fail; return true;
        case log_field::live_allocs: v = e.x.live_allocs; return true;
        case log_field::live_bytes: v = e.x.live_bytes; return true;
        case log_field::lost: v = e.x.lost; return true;
        case log_field::unmatched: v = e.x.unmatched; return true;
        case log_field::stacks_lost: v = e.x.stacks_lost; return v != 0;
        case log_field::count_: break;
    }
    return false;
}

constexpr size_t cstrlen(const char* s) {
    size_t n = 0;
    while (s[n]) ++n;
    return n;
}
// `,"name":` for member F, built at compile time.
template <size_t F>
constexpr auto make_key() {
    constexpr const char* name = k_log_fields[F].name;
    std::array<char, cstrlen(name) + 4> k{};
    size_t i = 0;
    k[i++] = ',';
    k[i++] = '"';
    for (const char* p = name; *p; ++p) k[i++] = *p;
    k[i++] = '"';
    k[i++] = ':';
    return k;
}
template <size_t F>
inline constexpr auto k_key = make_key<F>();

// Writes member F when the event has it; everything but the value is known at compile time.
template <size_t F>
[[gnu::always_inline]] inline void put_member(line& l, const event& e) noexcept {
    uint64_t v;
    if (!member_value(e, log_field(F), v)) return;
    l.raw(k_key<F>.data(), k_key<F>.size());
    constexpr field_type t = k_log_fields[F].type;
    if constexpr (t == field_type::u64) {
        l.u64(v);
    } else if constexpr (t == field_type::i64 || t == field_type::dev) {
        l.i64(int64_t(v));
    } else if constexpr (t == field_type::hex) {
        l.hex(v);
    } else if constexpr (t == field_type::flag) {
        l.raw("true", 4);
    } else {
        const char* name = t == field_type::ev         ? name_of(k_ev_names, v)
                           : t == field_type::api      ? name_of(k_api_names, v)
                           : t == field_type::mem_kind ? name_of(k_mem_kind_names, v)
                           : t == field_type::pool     ? name_of(k_pool_names, v)
                                                       : name_of(k_end_reason_names, v);
        l.raw("\"", 1);
        l.raw(name);
        l.raw("\"", 1);
    }
}
template <ev_kind K, size_t... J>
void put_members(line& l, const event& e, std::index_sequence<J...>) noexcept {
    (put_member<k_kind_members<K>.f[J]>(l, e), ...);
}

}  // namespace

size_t format_event(const event& e, char* buf, size_t cap) noexcept {
    if (cap < 2) return 0;
    line l{buf, buf + cap - 1};  // keep one byte for the newline
    l.raw("{\"ev\":\"");
    l.raw(name_of(k_ev_names, e.ev));
    l.raw("\"");
    // Each kind's members in the table's order (core/log_fields.h), unrolled per kind.  The header
    // carries none here: format_header writes it.
    switch (e.ev) {
#define GPUMEM_X(k) \
        case ev_kind::k: put_members<ev_kind::k>(l, e, std::make_index_sequence<k_kind_members<ev_kind::k>.n>{}); break;
        GPUMEM_EV_KINDS(GPUMEM_X)
#undef GPUMEM_X
        case ev_kind::count_: break;
    }
    l.raw("}");
    *l.p++ = '\n';
    return size_t(l.p - buf);
}

namespace {
void put(std::string& out, const char* key, const std::string& v, bool optional) {
    if (optional && v.empty()) return;
    out += ",\"";
    out += key;
    out += "\":";
    append_json_string(out, v.data(), v.size());
}
void put(std::string& out, const char* key, int64_t v, bool optional) {
    if (optional && v == 0) return;
    out += ",\"";
    out += key;
    out += "\":";
    out += std::to_string(v);
}
void put(std::string& out, const char* key, bool v, bool) {
    if (!v) return;
    out += ",\"";
    out += key;
    out += "\":true";
}
void put(std::string& out, const char* key, const std::vector<std::string>& v, bool) {
    out += ",\"";
    out += key;
    out += "\":[";
    for (size_t i = 0; i < v.size(); ++i) {
        if (i) out += ',';
        append_json_string(out, v[i].data(), v[i].size());
    }
    out += ']';
}
// The members of one object, generated from its table; the caller adds the braces.
void put_members(std::string& out, const header_device& d) {
#define GPUMEM_X(id, name, type) put(out, name, d.id, false);
    GPUMEM_DEVICE_FIELDS(GPUMEM_X)
#undef GPUMEM_X
}
void put(std::string& out, const char* key, const std::vector<header_device>& v, bool) {
    out += ",\"";
    out += key;
    out += "\":[";
    for (size_t i = 0; i < v.size(); ++i) {
        if (i) out += ',';
        std::string m;
        put_members(m, v[i]);
        out += '{';
        out.append(m, 1);  // without the first member's comma
        out += '}';
    }
    out += ']';
}
void put_pool_settings(std::string& out, const std::string& members) {
    size_t b = !members.empty() && members.front() == ',' ? 1 : 0;
    size_t n = members.size() - b;
    if (n && members.back() == ',') --n;
    if (!n) return;
    out += ',';
    out.append(members, b, n);
}
void put(std::string& out, const char* key, const header_config& c, bool) {
    std::string m;
#define GPUMEM_CFG_str(id, name) put(m, name, c.id, false);
#define GPUMEM_CFG_opt_str(id, name) put(m, name, c.id, true);
#define GPUMEM_CFG_int(id, name) put(m, name, c.id, false);
#define GPUMEM_CFG_pool_settings(id, name) put_pool_settings(m, c.id);
#define GPUMEM_X(id, name, type) GPUMEM_CFG_##type(id, name)
    GPUMEM_CONFIG_FIELDS(GPUMEM_X)
#undef GPUMEM_X
    out += ",\"";
    out += key;
    out += "\":{";
    if (!m.empty()) out.append(m, 1);
    out += '}';
}
}  // namespace

std::string format_header(const header_values& h) {
    std::string out = "{\"ev\":\"";
    out += k_ev_names[size_t(ev_kind::header)];
    out += '"';
#define GPUMEM_OPT_str false
#define GPUMEM_OPT_opt_str true
#define GPUMEM_OPT_int false
#define GPUMEM_OPT_opt_int true
#define GPUMEM_OPT_flag true
#define GPUMEM_OPT_strs false
#define GPUMEM_OPT_devices false
#define GPUMEM_OPT_config false
#define GPUMEM_X(id, name, type) put(out, name, h.id, GPUMEM_OPT_##type);
    GPUMEM_HEADER_FIELDS(GPUMEM_X)
#undef GPUMEM_X
    out += "}\n";
    return out;
}

// The length of the well-formed UTF-8 sequence at p (lead byte >= 0x80), or 0 when it is not one:
// no overlong forms, no surrogates, nothing past U+10FFFF (Unicode's table 3-7).
static size_t utf8_sequence_length(const unsigned char* p, size_t avail) noexcept {
    unsigned char c = p[0];
    size_t len;
    unsigned char lo = 0x80, hi = 0xbf;  // the second byte's range
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else {
        return 0;
    }
    if (avail < len || p[1] < lo || p[1] > hi) return 0;
    for (size_t k = 2; k < len; ++k)
        if (p[k] < 0x80 || p[k] > 0xbf) return 0;
    return len;
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
                } else if (c < 0x80) {
                    out += char(c);
                } else {
                    // The program's argv, $RANK and the host name are bytes, not text: valid UTF-8
                    // passes through, and each byte that is not part of a valid sequence becomes
                    // U+FFFD, so the line stays valid JSON and UTF-8 (docs/log-format.md).
                    size_t len = utf8_sequence_length(reinterpret_cast<const unsigned char*>(s) + i, n - i);
                    if (len) {
                        out.append(s + i, len);
                        i += len - 1;
                    } else {
                        out += "\\ufffd";
                    }
                }
        }
    }
    out += '"';
}

}  // namespace gpumem
