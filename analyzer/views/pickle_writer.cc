// A streaming writer of Python pickles (pickle_writer.h).
#include "views/pickle_writer.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace gpumem::analysis {

namespace {
// Opcodes (CPython Lib/pickletools.py).
constexpr uint8_t k_proto = 0x80, k_stop = '.', k_mark = '(', k_empty_dict = '}', k_setitems = 'u',
                  k_empty_list = ']', k_appends = 'e', k_tuple2 = 0x86, k_binunicode = 'X',
                  k_short_binunicode = 0x8c, k_binint1 = 'K', k_binint2 = 'M', k_binint = 'J', k_long1 = 0x8a,
                  k_binfloat = 'G', k_newtrue = 0x88, k_newfalse = 0x89, k_none = 'N', k_long_binput = 'r',
                  k_long_binget = 'j';
constexpr uint32_t k_batch = 1000;  // CPython's pickler batches APPENDS by 1000 too

// Length of the well-formed UTF-8 sequence at s[i] (Unicode 15, table 3-7), or 0.
size_t utf8_seq(std::string_view s, size_t i) {
    auto at = [&](size_t k) { return i + k < s.size() ? uint8_t(s[i + k]) : uint8_t(0); };
    uint8_t b = at(0);
    if (b < 0x80) return 1;
    auto cont = [](uint8_t c, uint8_t lo = 0x80, uint8_t hi = 0xbf) { return c >= lo && c <= hi; };
    if (b >= 0xc2 && b <= 0xdf) return cont(at(1)) ? 2 : 0;
    if (b == 0xe0) return cont(at(1), 0xa0) && cont(at(2)) ? 3 : 0;
    if ((b >= 0xe1 && b <= 0xec) || b == 0xee || b == 0xef) return cont(at(1)) && cont(at(2)) ? 3 : 0;
    if (b == 0xed) return cont(at(1), 0x80, 0x9f) && cont(at(2)) ? 3 : 0;  // no surrogates
    if (b == 0xf0) return cont(at(1), 0x90) && cont(at(2)) && cont(at(3)) ? 4 : 0;
    if (b >= 0xf1 && b <= 0xf3) return cont(at(1)) && cont(at(2)) && cont(at(3)) ? 4 : 0;
    if (b == 0xf4) return cont(at(1), 0x80, 0x8f) && cont(at(2)) && cont(at(3)) ? 4 : 0;
    return 0;
}
}  // namespace

std::string to_valid_utf8(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        size_t n = utf8_seq(s, i);
        if (n == 0) {
            out += "\xef\xbf\xbd";
            ++i;
        } else {
            out.append(s.substr(i, n));
            i += n;
        }
    }
    return out;
}

pickle_writer::pickle_writer(int fd) : fd_(fd) { buf_.reserve(size_t(1) << 21); }
pickle_writer::~pickle_writer() { flush(); }

void pickle_writer::raw(const void* p, size_t n) { buf_.append(static_cast<const char*>(p), n); }

void pickle_writer::le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) byte(uint8_t(v >> (8 * i)));
}

void pickle_writer::flush() {
    const char* p = buf_.data();
    size_t n = buf_.size();
    while (n && !err_) {
        ssize_t w = ::write(fd_, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            err_ = w < 0 ? errno : EIO;
            break;
        }
        p += w;
        n -= size_t(w);
        written_ += uint64_t(w);
    }
    buf_.clear();
}

void pickle_writer::begin() {
    byte(k_proto);
    byte(4);
}

void pickle_writer::end() {
    byte(k_stop);
    flush();
}

void pickle_writer::value_done() {
    maybe_flush();
    if (open_.empty() || !open_.back().list) return;
    if (++open_.back().items == k_batch) {
        open_.back().items = 0;
        byte(k_appends);
        byte(k_mark);
        maybe_flush();
    }
}

void pickle_writer::begin_dict() {
    byte(k_empty_dict);
    byte(k_mark);
    open_.push_back({false, 0});
}

void pickle_writer::end_dict() {
    byte(k_setitems);
    if (!open_.empty()) open_.pop_back();
    value_done();
}

void pickle_writer::begin_list() {
    byte(k_empty_list);
    byte(k_mark);
    open_.push_back({true, 0});
}

void pickle_writer::end_list() {
    byte(k_appends);
    if (!open_.empty()) open_.pop_back();
    value_done();
}

// Each store comes before value_done: a batch boundary there would leave a MARK, and the memo
// takes the top of the stack, which must still be the value just made.
uint32_t pickle_writer::put() {
    byte(k_long_binput);
    le(next_memo_, 4);
    return next_memo_++;
}

uint32_t pickle_writer::end_list_memo() {
    byte(k_appends);
    uint32_t id = put();
    if (!open_.empty()) open_.pop_back();
    value_done();
    return id;
}

uint32_t pickle_writer::end_dict_memo() {
    byte(k_setitems);
    uint32_t id = put();
    if (!open_.empty()) open_.pop_back();
    value_done();
    return id;
}

void pickle_writer::str_memo(std::string_view s) {
    auto it = str_memo_.find(std::string(s));
    if (it != str_memo_.end()) return get(it->second);
    write_str(s);
    str_memo_.emplace(std::string(s), put());
    value_done();
}

void pickle_writer::int_pair(int64_t a, int64_t b) {
    // Written inside one value_done, so a list's batch boundary never falls between the two.
    write_int(a);
    write_int(b);
    byte(k_tuple2);
    value_done();
}

void pickle_writer::str(std::string_view s) {
    write_str(s);
    value_done();
}

void pickle_writer::write_str(std::string_view s) {
    // Fast check: plain ASCII needs no copy.
    bool ascii = true;
    for (char c : s)
        if (uint8_t(c) >= 0x80) {
            ascii = false;
            break;
        }
    if (!ascii) {
        scratch_ = to_valid_utf8(s);
        s = scratch_;
    }
    if (s.size() < 256) {
        byte(k_short_binunicode);
        byte(uint8_t(s.size()));
    } else {
        // BINUNICODE's length is 4 bytes; a longer string is cut (no frame or name is near 4 GiB).
        if (s.size() > UINT32_MAX) s = s.substr(0, UINT32_MAX);
        byte(k_binunicode);
        le(s.size(), 4);
    }
    raw(s.data(), s.size());
}

void pickle_writer::integer(int64_t v) {
    write_int(v);
    value_done();
}

void pickle_writer::write_int(int64_t v) {
    if (v >= 0 && v < 256) {
        byte(k_binint1);
        byte(uint8_t(v));
    } else if (v >= 0 && v < 65536) {
        byte(k_binint2);
        le(uint64_t(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        byte(k_binint);
        le(uint64_t(uint32_t(int32_t(v))), 4);
    } else {
        // LONG1: the fewest little-endian two's-complement bytes whose top bit carries the sign.
        uint64_t u = uint64_t(v);
        int n = 8;
        while (n > 1) {
            uint8_t top = uint8_t(u >> (8 * (n - 1)));
            uint8_t next_sign = uint8_t(u >> (8 * (n - 2))) & 0x80;
            if ((top == 0x00 && !next_sign) || (top == 0xff && next_sign)) --n;
            else break;
        }
        byte(k_long1);
        byte(uint8_t(n));
        le(u, n);
    }
}

void pickle_writer::uinteger(uint64_t v) {
    if (v <= uint64_t(INT64_MAX)) return integer(int64_t(v));
    // Needs a ninth, zero byte so that the top bit does not read as a sign.
    byte(k_long1);
    byte(9);
    le(v, 8);
    byte(0);
    value_done();
}

void pickle_writer::real(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    byte(k_binfloat);
    for (int i = 7; i >= 0; --i) byte(uint8_t(bits >> (8 * i)));  // big-endian
    value_done();
}

void pickle_writer::boolean(bool v) {
    byte(v ? k_newtrue : k_newfalse);
    value_done();
}

void pickle_writer::none() {
    byte(k_none);
    value_done();
}

void pickle_writer::get(uint32_t id) {
    // LONG_BINGET, not BINGET: MemoryViz.js reads both, and one opcode keeps this simple.
    byte(k_long_binget);
    le(id, 4);
    value_done();
}

}  // namespace gpumem::analysis
