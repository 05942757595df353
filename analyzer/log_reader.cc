// Chunked line reading and simdjson on-demand parsing of gpumem event lines (docs/log-format.md).
#include "log_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cctype>
#include <cstring>
#include <utility>

#include <simdjson.h>

#include "format_util.h"  // shell_quote, for the advice on a compressed log; visible, fmt_count for progress
#include "input_spool.h"  // readable_path

namespace gpumem::analysis {

namespace od = simdjson::ondemand;

input_error::input_error(const std::string& f, uint64_t l, const std::string& msg)
    : std::runtime_error(l ? f + ":" + std::to_string(l) + ": " + msg : f + ": " + msg),
      file(f), line(l), message(msg) {}

std::string cannot_open_message(const std::string& path, int err) {
    std::string msg = std::string("cannot open: ") + std::strerror(err);
    // Worded as an "if": a quoted name holding a '*' reaches here unexpanded too, and is no failed glob.
    if (err == ENOENT && path.find_first_of("*?[") != std::string::npos)
        msg += " (if this is a pattern, no file matched it)";
    return msg;
}

// ---------------------------------------------------------------------------------------------
// line_source

namespace {
constexpr size_t k_chunk = size_t{4} << 20;        // bytes per read(); large reads amortize syscalls
}  // namespace

line_source::line_source(const std::string& path, uint64_t limit) : path_(path), limit_(limit) {
    // A pipe the command spooled to compare it (pipe_spools) is read from its spool: the pipe is drained.
    fd_ = ::open(readable_path(path).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw input_error(path, 0, cannot_open_message(path, errno));
    struct stat st {};
    if (::fstat(fd_, &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            ::close(fd_);
            fd_ = -1;
            throw input_error(path, 0, "is a directory, not a log file");
        }
        file_size_ = uint64_t(st.st_size);
        if (S_ISREG(st.st_mode)) limit_ = std::min(limit_, file_size_);  // a pipe has no size: read to its end
        file_size_ = std::min(file_size_, limit_);
    }
    // Tell the kernel we read front to back so it reads ahead generously.
    ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
    // Small logs get a small buffer (it grows for long lines anyway); big ones read 4 MiB at a time.
    size_t want = file_size_ ? size_t(std::min<uint64_t>(file_size_ + 1, k_chunk)) : k_chunk;
    buf_.resize(std::max<size_t>(want, 4096) + simdjson::SIMDJSON_PADDING);
}

line_source::~line_source() {
    if (fd_ >= 0) ::close(fd_);
}

bool line_source::fill() {
    if (eof_) return false;
    // Keep the unread tail at the front so the line being assembled stays contiguous.
    if (begin_ > 0) {
        std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
        end_ -= begin_;
        begin_ = 0;
    }
    size_t usable = buf_.size() - simdjson::SIMDJSON_PADDING;
    if (end_ == usable) {  // one line fills the whole buffer: grow it, up to the line limit
        if (usable >= k_max_line)
            throw input_error(path_, line_no_ + 1, "line longer than 64 MiB: not a gpumem log");
        buf_.resize(usable * 2 + simdjson::SIMDJSON_PADDING);
        usable = buf_.size() - simdjson::SIMDJSON_PADDING;
    }
    for (;;) {
        const size_t want = size_t(std::min<uint64_t>(usable - end_, limit_ - read_));
        ssize_t n = want ? ::read(fd_, buf_.data() + end_, want) : 0;
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw input_error(path_, 0, std::string("read failed: ") + std::strerror(errno));
        if (n == 0) {
            eof_ = true;
            return false;
        }
        end_ += size_t(n);
        read_ += uint64_t(n);
        // Zero the padding so simdjson never sees stale bytes after the data.
        std::memset(buf_.data() + end_, 0, std::min(simdjson::SIMDJSON_PADDING, buf_.size() - end_));
        return true;
    }
}

bool line_source::next(std::string_view& line, bool& complete) {
    size_t scan_from = begin_;
    for (;;) {
        const char* base = buf_.data();
        const void* nl = std::memchr(base + scan_from, '\n', end_ - scan_from);
        if (nl) {
            size_t pos = size_t(static_cast<const char*>(nl) - base);
            line = std::string_view(base + begin_, pos - begin_);
            consumed_ += pos + 1 - begin_;
            begin_ = pos + 1;
            complete = true;
            ++line_no_;
            return true;
        }
        size_t have = end_ - begin_;
        if (!fill()) {
            if (end_ == begin_) return false;
            // The last line has no newline: the writer is in it or stopped in it (or the file was cut).
            line = std::string_view(buf_.data() + begin_, end_ - begin_);
            consumed_ += end_ - begin_;
            begin_ = end_;
            complete = false;
            ++line_no_;
            return true;
        }
        scan_from = begin_ + have;  // fill() moved the tail to the front
    }
}

// ---------------------------------------------------------------------------------------------
// reading_meter

reading_meter::reading_meter(bool on, double interval_s, std::string path, const char* pass)
    : on_(on), interval_(interval_s), path_(std::move(path)), pass_(pass),
      start_(std::chrono::steady_clock::now()), last_(start_) {}

void reading_meter::tick(const line_source& src) {
    auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - last_).count() < interval_) return;
    last_ = now;
    double secs = std::chrono::duration<double>(now - start_).count();
    double pct = src.file_size() ? 100.0 * double(src.bytes_consumed()) / double(src.file_size()) : 0;
    // Not through spdlog (it is a progress line, shown even without -v): the name made visible here.
    std::fprintf(stderr, "gpumem: %s%s: %.0f%% (%.0f MB), %s events, %.1f M events/s\n", visible(path_).c_str(), pass_, pct,
                 double(src.bytes_consumed()) / 1e6, fmt_count(lines_).c_str(),
                 secs > 0 ? double(lines_) / secs / 1e6 : 0.0);
}

// ---------------------------------------------------------------------------------------------
// line_parser

const char* compression_of(std::string_view l) {
    if (l.size() >= 2 && l[0] == '\x1f' && l[1] == '\x8b') return "gzip";
    if (l.size() >= 4 && l.substr(0, 4) == std::string_view("\x28\xb5\x2f\xfd", 4)) return "zstd";
    if (l.size() >= 6 && l.substr(0, 6) == std::string_view("\xfd" "7zXZ\0", 6)) return "xz";
    // "BZh" and the block size, '1' to '9'.
    if (l.size() >= 4 && l.substr(0, 3) == "BZh" && l[3] >= '1' && l[3] <= '9') return "bzip2";
    return nullptr;
}

bool header_cut_short(std::string_view l, bool complete) {
    // The recorder writes "ev":"header" first (core/log_fields.h); a cut shorter than that is not
    // told from any other broken first line.
    constexpr std::string_view opening = "{\"ev\":\"header\"";
    return !complete && l.substr(0, opening.size()) == opening;
}

std::string compressed_log_advice(const char* z, const std::string& path, const char* command) {
    // Each compression compression_of names: its decompressor to stdout, and its files' extension.
    struct kind_names {
        std::string_view kind;
        const char* cat;
        const char* ext;
    };
    static constexpr kind_names k_kinds[] = {
        {"gzip", "zcat", ".gz"}, {"zstd", "zstdcat", ".zst"}, {"xz", "xzcat", ".xz"}, {"bzip2", "bzcat", ".bz2"}};
    const kind_names* names = &k_kinds[3];
    for (const kind_names& n : k_kinds)
        if (n.kind == z) names = &n;
    const std::string cat = names->cat;
    // "-" is standard input, as the guide teaches it.
    const std::string gpumem = std::string(" | gpumem ") + command + " -";
    const std::string_view cmd(command);
    // The compressed bytes came through a pipe already: the decompressor goes into that pipe, and
    // whatever else the command reads stays where it was: diff's other run on its side (a diff's
    // direction matters), check's logs beside a --baseline read from "-".
    if (path == "/dev/stdin") {
        const std::string in_pipe = std::string("the input is ") + z + "-compressed: decompress it in the pipe";
        if (cmd == "diff")
            return in_pipe + ", each run on its side as before (... | " + cat + " | gpumem diff - B.jsonl, or diff A.jsonl -)";
        if (const size_t sp = cmd.find(' '); sp != std::string_view::npos)
            return in_pipe + ", the logs named as before (... | " + cat + " | gpumem " + std::string(cmd.substr(0, sp)) +
                   " LOG..." + std::string(cmd.substr(sp)) + " -)";
        return in_pipe + " (... | " + cat + gpumem + ")";
    }
    // A process substitution (bash's <(...)) is a pipe the shell named: the decompressor goes inside.
    if (path.rfind("/dev/fd/", 0) == 0 || path.rfind("/proc/self/fd/", 0) == 0)
        return std::string("the input is ") + z + "-compressed: decompress it inside the substitution (<(" + cat + " FILE))";
    const std::string word = shell_quote(path);
    // A command with an option ("check --baseline") reads the file for that option, where "-"
    // would be taken for a log.
    if (cmd != "diff" && cmd.find(' ') == std::string_view::npos)
        return std::string("the file is ") + z + "-compressed: decompress it first, or read it from a pipe (" + cat +
               " " + word + gpumem + ")";
    // diff reads two runs and only one input can be "-", and this advice cannot know the other
    // side's names (nor check's logs beside its baseline): the decompressed copy, or process
    // substitution (a pipe, which every command spools, input_spool.h), goes where the
    // compressed name stood.
    const std::string ext = names->ext;
    const bool has_ext = path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
    const std::string plain = has_ext ? path.substr(0, path.size() - ext.size()) : path + ".jsonl";
    return std::string("the file is ") + z + "-compressed: decompress it first (" + cat + " " + word + " > " +
           shell_quote(plain) + ") and give " + command + " that file, or, in bash, give <(" + cat + " " + word +
           ") in its place";
}

bool parse_hex(std::string_view s, uint64_t& out) {
    if (s.size() < 3 || s.size() > 18 || s[0] != '0' || (s[1] != 'x' && s[1] != 'X')) return false;
    uint64_t v = 0;
    for (size_t i = 2; i < s.size(); ++i) {
        char c = s[i];
        uint64_t d;
        if (c >= '0' && c <= '9') d = uint64_t(c - '0');
        else if (c >= 'a' && c <= 'f') d = uint64_t(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') d = uint64_t(c - 'A' + 10);
        else return false;
        v = (v << 4) | d;
    }
    out = v;
    return true;
}

namespace {

// Key lookup through a small hash table: per-line parsing cost is dominated by member dispatch, so
// one hash and one memcmp per member instead of a scan over all names.
struct key_table {
    static unsigned hash(const char* p, size_t n) {
        return unsigned(n * 5 + unsigned(uint8_t(p[0])) * 3 + unsigned(uint8_t(p[n - 1])) +
                        unsigned(uint8_t(p[n / 2])) * 7) & 255u;
    }
    int8_t slot[256][4];
    key_table() {
        std::memset(slot, -1, sizeof slot);
        for (int i = 0; i < fd_count_; ++i) {
            unsigned h = hash(k_field_names[i], std::strlen(k_field_names[i]));
            for (int8_t& s : slot[h])
                if (s < 0) {
                    s = int8_t(i);
                    break;
                }
        }
    }
    int find(const char* p, size_t n) const {
        if (n == 0 || n > 12) return -1;
        for (int8_t s : slot[hash(p, n)]) {
            if (s < 0) return -1;
            const char* name = k_field_names[s];
            size_t i = 0;  // names are at most 12 bytes: a plain loop beats a memcmp call
            while (i < n && name[i] == p[i]) ++i;
            if (i == n && name[n] == 0) return s;
        }
        return -1;
    }
};
const key_table& keys() {
    static const key_table t;
    return t;
}

// True when the raw string at `a` is exactly `name` (its closing quote follows).
inline bool raw_is(const char* a, const char* limit, const char* name, size_t n) {
    return limit - a > ptrdiff_t(n) && std::memcmp(a, name, n) == 0 && a[n] == '"';
}
template <size_t N>
inline bool raw_is(const char* a, const char* limit, const char (&name)[N]) {
    return raw_is(a, limit, name, N - 1);
}

// Hex digit values; -1 for anything else.
struct hex_table {
    int8_t v[256];
    hex_table() {
        std::memset(v, -1, sizeof v);
        for (int i = 0; i < 10; ++i) v['0' + i] = int8_t(i);
        for (int i = 0; i < 6; ++i) v['a' + i] = v['A' + i] = int8_t(10 + i);
    }
};
const hex_table k_hex;

// Parses "0x<1-16 hex digits>" followed by the closing quote, starting after the opening quote.
bool hex_in_place(const char* a, const char* limit, uint64_t& out) {
    if (limit - a < 4 || a[0] != '0' || (a[1] | 0x20) != 'x') return false;
    uint64_t x = 0;
    const char* q = a + 2;
    const char* end = std::min(limit, a + 18);
    int8_t d;
    while (q < end && (d = k_hex.v[uint8_t(*q)]) >= 0) {
        x = (x << 4) | uint64_t(d);
        ++q;
    }
    if (q == a + 2 || q >= limit || *q != '"') return false;
    out = x;
    return true;
}

// The raw text of a JSON string value, escapes left as they are.  Our enum names, API names and hex
// numbers never need escapes, so a value that has one simply matches nothing.
template <typename Value>
simdjson::error_code raw_string(Value&& v, const char* limit, std::string_view& out) {
    od::raw_json_string r;
    if (auto c = v.get_raw_json_string().get(r)) return c;
    const char* a = r.raw();
    if (a >= limit) return simdjson::UNCLOSED_STRING;
    // Our strings are short: scan inline, stepping over escapes to the real closing quote.  The
    // on-demand parser checks no escape it does not unescape, so each is checked here: "\q" is no
    // JSON, and a line holding one is refused as the fast path's caller promises.
    const char* q = a;
    while (q < limit && *q != '"') {
        if (*q != '\\') {
            ++q;
            continue;
        }
        if (q + 1 >= limit) return simdjson::UNCLOSED_STRING;
        const char c = q[1];
        if (c == 'u') {
            for (int k = 2; k < 6; ++k)
                if (q + k >= limit || !std::isxdigit(static_cast<unsigned char>(q[k]))) return simdjson::STRING_ERROR;
            q += 6;
        } else if (std::strchr("\"\\/bfnrt", c) && c) {
            q += 2;
        } else {
            return simdjson::STRING_ERROR;
        }
    }
    if (q >= limit) return simdjson::UNCLOSED_STRING;
    out = std::string_view(a, size_t(q - a));
    return simdjson::SUCCESS;
}

template <typename Enum, size_t N>
bool lookup_name(std::string_view s, const char* const (&names)[N], Enum& out) {
    for (size_t i = 0; i < N; ++i)
        if (s == names[i]) {
            out = Enum(i);
            return true;
        }
    return false;
}

const char* type_error_text(simdjson::error_code e) {
    switch (e) {
    case simdjson::INCORRECT_TYPE: return "has the wrong type";
    case simdjson::NUMBER_OUT_OF_RANGE: return "is out of range";
    case simdjson::NUMBER_ERROR: return "is not a valid number";
    default: return "is not valid JSON";
    }
}

}  // namespace

struct line_parser::impl {
    od::parser parser;
};

line_parser::line_parser() : impl_(std::make_unique<impl>()) {
    for (size_t i = 0; i < size_t(api_id::count_); ++i) api_names_.emplace_back(k_api_names[i]);
}
line_parser::~line_parser() = default;

uint16_t line_parser::intern_api(std::string_view name) {
    // Logs alternate between a few APIs (cudaMalloc/cudaFree): check the last two hits first.
    if (api_names_[last_api_[0]] == name) return last_api_[0];
    if (api_names_[last_api_[1]] == name) {
        std::swap(last_api_[0], last_api_[1]);
        return last_api_[0];
    }
    uint16_t id = intern_api_slow(name);
    last_api_[1] = last_api_[0];
    last_api_[0] = id;
    return id;
}

uint16_t line_parser::intern_api_slow(std::string_view name) {
    for (size_t i = 0; i < api_names_.size(); ++i)
        if (api_names_[i] == name) return uint16_t(i);
    // A bounded table: a log with thousands of distinct API names is garbage; the rest fold into
    // one entry whose name says so in every report (before, into "none", unsaid).
    constexpr size_t k_max_apis = 1024;
    if (api_names_.size() >= k_max_apis) {
        if (api_names_.size() == k_max_apis) api_names_.emplace_back(k_folded_api_name);
        return uint16_t(k_max_apis);
    }
    api_names_.emplace_back(name);
    return uint16_t(api_names_.size() - 1);
}

// ---------------------------------------------------------------------------------------------
// The recorder's own line shape, read without a JSON parser.
//
// Every line the recorder writes has the members of its kind in one order, with fixed spellings
// and plain values (core/event_format.cc), so reading it needs no member dispatch and no generic
// scanning: compare each expected key, then read its value with a digit or hex loop.  Anything else
// (other order, whitespace, escapes, an unknown member, a number JSON would judge) returns false and
// the line goes through simdjson, which also produces every error message.  Whatever this accepts is
// valid JSON whose parse_json result is what this fills in (checked in fast_path_test.cc and by
// fuzz_parser.cc).

namespace {

// Reads ahead of the current byte by at most the longest key; the line's closing '}' stops every
// scan that has no bound check, since no digit, hex digit or key literal contains it.
struct recorder_cursor {
    const char* q;    // next unread byte
    const char* end;  // the closing '}'

    static uint64_t load8(const char* s) {
        uint64_t v;
        std::memcpy(&v, s, 8);
        return v;
    }
    // Matches a literal such as `,"size":` with one or two 8-byte compares: a libc memcmp call per
    // key was the fast path's largest cost.  Reads up to 16 bytes from q (see above).
    // The expected key of member F: `,"name":` and the opening of its value, built from
    // core/log_fields.h at compile time (see fast_key below).
    template <const auto& K>
    [[gnu::always_inline]] bool key() {
        constexpr size_t n = K.size();
        static_assert(n >= 1 && n <= 16, "keys of this format are at most 16 bytes");
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        // The key's bytes as little-endian words (constant-folded); the first byte is lowest.
        constexpr uint64_t w0 = word(K, 0), w1 = word(K, 8);
        constexpr uint64_t m0 = n >= 8 ? ~uint64_t(0) : (uint64_t(1) << (8 * n)) - 1;
        constexpr uint64_t m1 = n >= 16 ? ~uint64_t(0) : n <= 8 ? 0 : (uint64_t(1) << (8 * (n - 8))) - 1;
        uint64_t diff = (load8(q) ^ w0) & m0;
        if constexpr (n > 8) diff |= (load8(q + 8) ^ w1) & m1;
        if (diff) return false;
#else
        if (std::memcmp(q, K.data(), n) != 0) return false;
#endif
        q += n;
        return true;
    }
    template <size_t N>
    static constexpr uint64_t word(const std::array<char, N>& k, size_t from) {
        uint64_t w = 0;
        for (size_t i = 0; i < 8 && from + i < N; ++i) w |= uint64_t(uint8_t(k[from + i])) << (8 * i);
        return w;
    }
    // A non-negative integer as JSON writes it: no sign, no leading zero, no fraction or exponent
    // (what follows is checked by the next key).  Up to 19 digits, which always fits 64 bits; a
    // longer number is left to simdjson's range check.
    [[gnu::always_inline]] bool u64(uint64_t& v) {
        const char* s = q;
        unsigned d = unsigned(uint8_t(*q)) - '0';
        if (d > 9) return false;
        uint64_t x = d;
        ++q;
        if (d == 0) {
            if (unsigned(uint8_t(*q)) - '0' <= 9) return false;  // leading zero: not JSON
            v = 0;
            return true;
        }
        while ((d = unsigned(uint8_t(*q)) - '0') <= 9) {
            x = x * 10 + d;  // may wrap for a long run of digits, which is rejected below
            ++q;
        }
        if (q - s > 19) return false;
        v = x;
        return true;
    }
    // An integer that fits int64_t, with at most 19 digits; "-0" is left to simdjson.
    bool i64(int64_t& v) {
        bool neg = *q == '-';
        if (neg) {
            ++q;
            if (*q == '0') return false;
        }
        uint64_t x;
        if (!u64(x) || x > uint64_t(INT64_MAX)) return false;
        v = neg ? -int64_t(x) : int64_t(x);
        return true;
    }
    // "dev": -1 or an ordinal up to 65535, the range parse_json accepts.
    bool dev(int32_t& v) {
        if (q[0] == '-' && q[1] == '1' && unsigned(uint8_t(q[2])) - '0' > 9) {
            q += 2;
            v = -1;
            return true;
        }
        uint64_t x;
        if (!u64(x) || x > 65535) return false;
        v = int32_t(x);
        return true;
    }
    // 1 to 16 hex digits after the key's `"0x`, then the closing quote: as hex_in_place reads them.
    [[gnu::always_inline]] bool hex(uint64_t& v) {
        const char* s = q;
        uint64_t x = 0;
        int8_t d;
        while ((d = k_hex.v[uint8_t(*q)]) >= 0) {
            x = (x << 4) | uint64_t(d);
            ++q;
        }
        size_t n = size_t(q - s);
        if (n == 0 || n > 16 || *q != '"') return false;
        ++q;
        v = x;
        return true;
    }
    // A string of printable ASCII without quote or backslash, after its opening quote: the raw text
    // then equals the value, and simdjson would take it as it is.
    [[gnu::always_inline]] bool str(std::string_view& s) {
        const char* a = q;
        while (q < end && uint8_t(*q) >= 0x20 && uint8_t(*q) < 0x7f && *q != '\\' && *q != '"') ++q;
        if (q >= end || *q != '"') return false;
        s = std::string_view(a, size_t(q - a));
        ++q;
        return true;
    }
};

// Member F of a log_event or of fast_fields, by its field id.
template <field F, class S>
[[gnu::always_inline]] inline auto& member(S& s) {
#define GPUMEM_X(id, name, type, carried, required) if constexpr (F == fd_##id) return s.id; else
    GPUMEM_LOG_FIELDS(GPUMEM_X)
#undef GPUMEM_X
    return s.present;
}

constexpr size_t cstrlen(const char* s) {
    size_t n = 0;
    while (s[n]) ++n;
    return n;
}
constexpr bool is_name_type(field_type t) {
    return t == field_type::ev || t == field_type::api || t == field_type::mem_kind || t == field_type::pool ||
           t == field_type::end_reason;
}
// What the recorder writes before member F's value: `,"name":` and `"0x` (hex), `"` (names) or the
// whole value `true` (flags).
template <size_t F>
constexpr auto make_fast_key() {
    constexpr const char* name = k_log_fields[F].name;
    constexpr field_type t = k_log_fields[F].type;
    constexpr const char* open = t == field_type::hex ? "\"0x" : is_name_type(t) ? "\"" : t == field_type::flag ? "true" : "";
    constexpr size_t nn = cstrlen(name), no = cstrlen(open);
    std::array<char, 4 + nn + no> k{};
    size_t i = 0;
    k[i++] = ',';
    k[i++] = '"';
    for (size_t j = 0; j < nn; ++j) k[i++] = name[j];
    k[i++] = '"';
    k[i++] = ':';
    for (size_t j = 0; j < no; ++j) k[i++] = open[j];
    return k;
}
template <size_t F>
inline constexpr auto fast_key = make_fast_key<F>();

// The C++ type of a member as the fast path holds it before storing: names stay raw text.
#define GPUMEM_FT_u64 uint64_t
#define GPUMEM_FT_i64 int64_t
#define GPUMEM_FT_dev int32_t
#define GPUMEM_FT_hex uint64_t
#define GPUMEM_FT_flag bool
#define GPUMEM_FT_ev ev_kind
#define GPUMEM_FT_api std::string_view
#define GPUMEM_FT_mem_kind mem_kind
#define GPUMEM_FT_pool pool_id
#define GPUMEM_FT_end_reason std::string_view
#define GPUMEM_FD_api std::string_view()
#define GPUMEM_FD_end_reason std::string_view()

// What one recorder line says, gathered before anything is stored: a line that deviates late must
// leave the event and the API table as they were.  Defaults are log_event's.
struct fast_fields {
    uint64_t present = bit(fd_ev);
#define GPUMEM_FD_u64 0
#define GPUMEM_FD_i64 0
#define GPUMEM_FD_dev -1
#define GPUMEM_FD_hex 0
#define GPUMEM_FD_flag false
#define GPUMEM_FD_ev ev_kind::header
#define GPUMEM_FD_mem_kind mem_kind::none
#define GPUMEM_FD_pool pool_id::none
#define GPUMEM_X(id, name, type, carried, required) GPUMEM_FT_##type id = GPUMEM_FD_##type;
    GPUMEM_LOG_FIELDS(GPUMEM_X)
#undef GPUMEM_X
};
// This file shares a unity batch with others (analyzer/CMakeLists.txt): its macros end here.
#undef GPUMEM_FT_u64
#undef GPUMEM_FT_i64
#undef GPUMEM_FT_dev
#undef GPUMEM_FT_hex
#undef GPUMEM_FT_flag
#undef GPUMEM_FT_ev
#undef GPUMEM_FT_api
#undef GPUMEM_FT_mem_kind
#undef GPUMEM_FT_pool
#undef GPUMEM_FT_end_reason
#undef GPUMEM_FD_api
#undef GPUMEM_FD_end_reason
#undef GPUMEM_FD_u64
#undef GPUMEM_FD_i64
#undef GPUMEM_FD_dev
#undef GPUMEM_FD_hex
#undef GPUMEM_FD_flag
#undef GPUMEM_FD_ev
#undef GPUMEM_FD_mem_kind
#undef GPUMEM_FD_pool

// Reads member F if it comes next.  Absent is fine (the line then simply lacks it, as parse_json
// would find); present but malformed is a deviation.
template <size_t F>
[[gnu::always_inline]] inline bool fast_member(recorder_cursor& c, fast_fields& f) {
    if (!c.key<fast_key<F>>()) return true;
    constexpr field fd = field(F);
    constexpr field_type t = k_log_fields[F].type;
    auto& v = member<fd>(f);
    if constexpr (t == field_type::u64) {
        uint64_t x;
        if (!c.u64(x)) return false;
        if constexpr (!(k_skipped_fields & bit(fd))) v = x;
    } else if constexpr (t == field_type::i64) {
        if (!c.i64(v)) return false;
    } else if constexpr (t == field_type::dev) {
        if (!c.dev(v)) return false;
    } else if constexpr (t == field_type::hex) {
        uint64_t x;
        if (!c.hex(x)) return false;
        if constexpr (!(k_skipped_fields & bit(fd))) v = x;
    } else if constexpr (t == field_type::flag) {
        v = true;
    } else if constexpr (t == field_type::api || t == field_type::end_reason) {
        if (!c.str(v)) return false;
    } else if constexpr (t == field_type::mem_kind) {
        // An unknown memory kind stays "none", as in parse_json.
        std::string_view s;
        if (!c.str(s)) return false;
        if (s.size() == 6 && std::memcmp(s.data(), "device", 6) == 0) v = mem_kind::device;
        else if (!lookup_name(s, k_mem_kind_names, v)) v = mem_kind::none;
    } else if constexpr (t == field_type::pool) {
        std::string_view s;
        if (!c.str(s)) return false;
        if (!lookup_name(s, k_pool_names, v)) v = pool_id::none;
    } else {
        static_assert(t != field_type::ev, "ev is read before the members");
    }
    if constexpr (!(k_skipped_fields & bit(fd))) f.present |= bit(fd);
    return true;
}

template <ev_kind K, size_t... J>
[[gnu::always_inline]] inline bool fast_members(recorder_cursor& c, fast_fields& f, std::index_sequence<J...>) {
    return (fast_member<k_kind_members<K>.f[J]>(c, f) && ...);
}
template <ev_kind K>
bool fast_kind(recorder_cursor& c, fast_fields& f) {
    return fast_members<K>(c, f, std::make_index_sequence<k_kind_members<K>.n>{});
}

// Stores member F as parse_json would: reset members always, the others when present.
template <size_t F>
[[gnu::always_inline]] inline void store_member(const fast_fields& f, log_event& e, line_parser& p) {
    constexpr field fd = field(F);
    constexpr field_type t = k_log_fields[F].type;
    if constexpr (fd == fd_ev || t == field_type::end_reason || (k_skipped_fields & bit(fd))) {
        return;  // ev: stored by the caller; end lines and skipped members never come this way
    } else if constexpr (t == field_type::api) {
        member<fd>(e) = f.present & bit(fd) ? p.intern_api(member<fd>(f)) : 0;
    } else {
        if ((k_reset_fields & bit(fd)) || (f.present & bit(fd))) member<fd>(e) = member<fd>(f);
    }
}
template <size_t... F>
void store_members(const fast_fields& f, log_event& e, line_parser& p, std::index_sequence<F...>) {
    (store_member<F>(f, e, p), ...);
}

}  // namespace

bool line_parser::parse_recorder_line(const char* p, size_t len, size_t capacity, log_event& e) {
    // 32 bytes of slack past the line cover the longest key compare (see recorder_cursor).
    if (len < 16 || capacity < len + 32 || p[len - 1] != '}' || std::memcmp(p, "{\"ev\":\"", 7) != 0)
        return false;
    recorder_cursor c{p + 7, p + len - 1};
    fast_fields f;
    std::string_view name;
    if (!c.str(name)) return false;
    if (name.size() == 5 && std::memcmp(name.data(), "alloc", 5) == 0) f.ev = ev_kind::alloc;
    else if (name.size() == 4 && std::memcmp(name.data(), "free", 4) == 0) f.ev = ev_kind::free;
    else if (!lookup_name(name, k_ev_names, f.ev)) return false;

    // header, end and stack records: rare, and their strings may need unescaping.
    if (f.ev == ev_kind::header || f.ev == ev_kind::end || f.ev == ev_kind::stack) return false;
    // Each kind's members in the writer's order, each at most once (core/log_fields.h).
    bool ok = false;
    switch (f.ev) {
#define GPUMEM_X(k) \
    case ev_kind::k: ok = fast_kind<ev_kind::k>(c, f); break;
    GPUMEM_EV_KINDS(GPUMEM_X)
#undef GPUMEM_X
    case ev_kind::count_: return false;
    }
    if (!ok || c.q != c.end) return false;  // a malformed value, more members, or bytes after the value

    // Store exactly what parse_json stores for this line: its resets, then each member present.
    e.present = f.present;
    e.known_kind = true;
    e.ev = f.ev;
    store_members(f, e, *this, std::make_index_sequence<k_log_field_count>{});
    return true;
}

parse_status line_parser::parse_json(const char* p, size_t len, size_t capacity, log_event& e,
                                     std::string& error) {
    e.present = 0;
    e.known_kind = false;
    reset_per_line(e);

    od::document doc;
    auto ec = impl_->parser.iterate(p, len, capacity).get(doc);
    if (ec) {
        error = std::string("not JSON (") + simdjson::error_message(ec) + ")";
        return parse_status::not_json;
    }
    od::object obj;
    if ((ec = doc.get_object().get(obj))) {
        error = ec == simdjson::INCORRECT_TYPE ? "not JSON (or not a JSON object)"
                                               : std::string("not JSON (") + simdjson::error_message(ec) + ")";
        return parse_status::not_json;
    }
    const key_table& kt = keys();
    for (auto fr : obj) {
        // Work on the simdjson_result directly: copying out the field and value objects cost
        // store-forwarding stalls that made member access the bottleneck (docs/benchmarks.md).
        od::raw_json_string rk;
        if ((ec = fr.key().get(rk))) {
            error = std::string("not JSON (") + simdjson::error_message(ec) + ")";
            return parse_status::not_json;
        }
        // Keys of this format never contain escapes; a key that does is simply not one of ours.
        const char* kp = rk.raw();
        const char* kq = kp;
        const char* kend = std::min(p + len, kp + 16);  // no key of ours is longer
        while (kq < kend && *kq != '"') ++kq;
        if (kq == kend) kq = static_cast<const char*>(std::memchr(kp, '"', size_t(p + len - kp)));
        if (!kq) {
            error = "not JSON (unterminated key)";
            return parse_status::not_json;
        }
        int id = kt.find(kp, size_t(kq - kp));
        if (id < 0) continue;  // unknown member: skipped, per the version policy
        auto v = fr.value();
        field fid = field(id);
        auto bad = [&](simdjson::error_code c, const char* want) {
            if (c == simdjson::INCORRECT_TYPE)
                error = std::string("member \"") + k_field_names[fid] + "\" should be " + want;
            else
                error = std::string("member \"") + k_field_names[fid] + "\" " + type_error_text(c);
            return c == simdjson::INCORRECT_TYPE || c == simdjson::NUMBER_OUT_OF_RANGE ||
                           c == simdjson::NUMBER_ERROR
                       ? parse_status::bad_member
                       : parse_status::not_json;
        };
        auto get_u64 = [&](uint64_t& dst) -> simdjson::error_code { return v.get_uint64().get(dst); };
        auto get_hex = [&](uint64_t& dst) -> parse_status {
            // Fast path: read the digits straight from the raw string, no separate scan.
            od::raw_json_string r;
            if (!v.get_raw_json_string().get(r) && hex_in_place(r.raw(), p + len, dst)) return parse_status::ok;
            std::string_view s;
            if (auto c = raw_string(v, p + len, s)) return bad(c, "a hex string like \"0x7f00\"");
            if (!parse_hex(s, dst)) {
                error = std::string("member \"") + k_field_names[fid] + "\" is \"" +
                        std::string(s.substr(0, 40)) + "\", expected a hex string like \"0x7f00\"";
                return parse_status::bad_member;
            }
            return parse_status::ok;
        };
        if (k_skipped_fields & bit(fid)) continue;  // not used by the analysis: skipping is cheaper than converting
        // Reads one member into `dst` by its type (core/log_fields.h).
        auto read = [&](auto type_tag, auto& dst) -> parse_status {
            constexpr field_type t = decltype(type_tag)::value;
            simdjson::error_code c = simdjson::SUCCESS;
            if constexpr (t == field_type::u64) {
                c = get_u64(dst);
            } else if constexpr (t == field_type::i64) {
                c = v.get_int64().get(dst);
                if (c) return bad(c, "an integer");
            } else if constexpr (t == field_type::dev) {
                int64_t x = 0;
                if ((c = v.get_int64().get(x))) return bad(c, "an integer");
                if (x < -1 || x > 65535) {
                    error = "member \"dev\" is " + std::to_string(x) + ", expected -1 or a device ordinal";
                    return parse_status::bad_member;
                }
                dst = int32_t(x);
            } else if constexpr (t == field_type::hex) {
                return get_hex(dst);
            } else if constexpr (t == field_type::flag) {
                c = v.get_bool().get(dst);
                if (c) return bad(c, "true or false");
            } else if constexpr (t == field_type::ev) {
                // The two hot kinds are matched on the raw bytes, the rest through the name table.
                od::raw_json_string r;
                if (!v.get_raw_json_string().get(r)) {
                    if (raw_is(r.raw(), p + len, "alloc")) {
                        dst = ev_kind::alloc;
                        e.known_kind = true;
                        return parse_status::ok;
                    }
                    if (raw_is(r.raw(), p + len, "free")) {
                        dst = ev_kind::free;
                        e.known_kind = true;
                        return parse_status::ok;
                    }
                }
                std::string_view s;
                if ((c = raw_string(v, p + len, s))) return bad(c, "a string");
                e.known_kind = lookup_name(s, k_ev_names, dst);
            } else if constexpr (t == field_type::api) {
                od::raw_json_string r;
                if (!v.get_raw_json_string().get(r)) {
                    for (uint16_t id : last_api_) {  // the last two APIs: malloc/free pairs alternate
                        const std::string& name = api_names_[id];
                        if (raw_is(r.raw(), p + len, name.data(), name.size())) {
                            dst = id;
                            return parse_status::ok;
                        }
                    }
                }
                std::string_view s;
                if ((c = raw_string(v, p + len, s))) return bad(c, "a string");
                dst = intern_api(s);
            } else if constexpr (t == field_type::mem_kind) {
                od::raw_json_string r;
                if (!v.get_raw_json_string().get(r) && raw_is(r.raw(), p + len, "device")) {
                    dst = mem_kind::device;
                    return parse_status::ok;
                }
                std::string_view s;
                if ((c = raw_string(v, p + len, s))) return bad(c, "a string");
                // An unknown memory kind stays "none": still counted, never misattributed.
                if (!lookup_name(s, k_mem_kind_names, dst)) dst = mem_kind::none;
            } else if constexpr (t == field_type::pool) {
                std::string_view s;
                if ((c = raw_string(v, p + len, s))) return bad(c, "a string");
                if (!lookup_name(s, k_pool_names, dst)) dst = pool_id::none;
            } else if constexpr (t == field_type::end_reason) {
                std::string_view s;
                if ((c = v.get_string().get(s))) return bad(c, "a string");
                // At most 64 bytes, cut on a character boundary: half a UTF-8 sequence is not text.
                size_t n = std::min<size_t>(s.size(), 64);
                if (n < s.size())
                    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
                dst.assign(s.substr(0, n));
            }
            if (c) return bad(c, "a non-negative integer");
            return parse_status::ok;
        };
        parse_status st = parse_status::ok;
        switch (fid) {
#define GPUMEM_X(id, name, type, carried, required) \
        case fd_##id: st = read(std::integral_constant<field_type, field_type::type>{}, e.id); break;
        GPUMEM_LOG_FIELDS(GPUMEM_X)
#undef GPUMEM_X
        case fd_count_: break;
        }
        if (st != parse_status::ok) return st;
        e.present |= bit(fid);
    }
    // Trailing bytes after the object ("{...} x", two objects on one line) make the line unusable.
    if (!doc.current_location().error()) {
        error = "not JSON (trailing characters after the object)";
        return parse_status::not_json;
    }
    if (!e.has(fd_ev)) {
        error = "missing member \"ev\"";
        return parse_status::bad_member;
    }
    return parse_status::ok;
}

std::string line_parser::missing_members(const log_event& e) {
    uint64_t missing = required_members(e) & ~e.present;
    if (!missing) return "";
    std::string out;
    for (int i = 0; i < fd_count_; ++i)
        if (missing & bit(field(i))) {
            if (!out.empty()) out += ", ";
            out += std::string("\"") + k_field_names[i] + "\"";
        }
    return out;
}

uint64_t line_parser::required_members(const log_event& e) {
    // The members core/log_fields.h says this kind requires, as a mask per kind.
    static constexpr auto by_kind = [] {
        std::array<uint64_t, size_t(ev_kind::count_)> m{};
        for (size_t k = 0; k < m.size(); ++k)
            for (size_t f = 0; f < k_log_field_count; ++f)
                if (k_log_fields[f].required_by & (uint32_t(1) << k)) m[k] |= uint64_t(1) << f;
        return m;
    }();
    // "ev" is how the kind was known; it is checked before this.
    uint64_t need = size_t(e.ev) < by_kind.size() ? by_kind[size_t(e.ev)] & ~bit(fd_ev) : 0;
    // The two requirements that depend on other members (core/log_fields.h says so too).
    if (e.ev == ev_kind::alloc && e.pooled) need |= bit(fd_seg);
    // An unknown pointer has no size to report (it is 0 by design), so only demand it otherwise.
    if (e.ev == ev_kind::free && e.unknown) need &= ~bit(fd_size);
    return need;
}

}  // namespace gpumem::analysis
