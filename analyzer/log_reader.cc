// Chunked line reading and simdjson on-demand parsing of gpumem event lines (docs/log-format.md).
#include "log_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <simdjson.h>

namespace gpumem::analysis {

namespace od = simdjson::ondemand;

input_error::input_error(const std::string& f, uint64_t l, const std::string& msg)
    : std::runtime_error(l ? f + ":" + std::to_string(l) + ": " + msg : f + ": " + msg),
      file(f), line(l), message(msg) {}

// ---------------------------------------------------------------------------------------------
// line_source

namespace {
constexpr size_t k_chunk = size_t{4} << 20;        // bytes per read(); large reads amortize syscalls
constexpr size_t k_max_line = size_t{64} << 20;    // a longer line is corruption, not a log line
}  // namespace

line_source::line_source(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw input_error(path, 0, std::string("cannot open: ") + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            ::close(fd_);
            fd_ = -1;
            throw input_error(path, 0, "is a directory, not a log file");
        }
        file_size_ = uint64_t(st.st_size);
    }
    // Tell the kernel we read front to back so it reads ahead generously.
    ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
    buf_.resize(k_chunk + simdjson::SIMDJSON_PADDING);
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
        ssize_t n = ::read(fd_, buf_.data() + end_, usable - end_);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw input_error(path_, 0, std::string("read failed: ") + std::strerror(errno));
        if (n == 0) {
            eof_ = true;
            return false;
        }
        end_ += size_t(n);
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
            // The last line has no newline: the writer died mid-line (or the file was cut).
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
// line_parser

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

// Key lookup bucketed by length: every known key is at most 12 characters.
struct key_table {
    struct entry {
        const char* name;
        field id;
    };
    std::vector<entry> by_len[16];
    key_table() {
        for (int i = 0; i < fd_count_; ++i) {
            size_t n = std::strlen(k_field_names[i]);
            by_len[n].push_back({k_field_names[i], field(i)});
        }
    }
    int find(const char* p, size_t n) const {
        if (n >= 16) return -1;
        for (const entry& e : by_len[n])
            if (e.name[0] == p[0] && std::memcmp(e.name, p, n) == 0) return e.id;
        return -1;
    }
};
const key_table& keys() {
    static const key_table t;
    return t;
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
    for (size_t i = 0; i < api_names_.size(); ++i)
        if (api_names_[i] == name) return uint16_t(i);
    // A bounded table: a log with thousands of distinct API names is garbage, fold them together.
    if (api_names_.size() >= 1024) return 0;
    api_names_.emplace_back(name);
    return uint16_t(api_names_.size() - 1);
}

parse_status line_parser::parse(const char* p, size_t len, size_t capacity, log_event& e,
                                std::string& error) {
    e.present = 0;
    e.known_kind = false;
    e.pooled = e.unknown = false;
    e.asize = e.seg = 0;
    e.kind = mem_kind::none;
    e.pool = pool_id::none;
    e.api = 0;
    e.dev = -1;
    e.err = 0;

    od::document doc;
    auto ec = impl_->parser.iterate(p, len, capacity).get(doc);
    if (ec) {
        error = std::string("not JSON (") + simdjson::error_message(ec) + ")";
        return parse_status::not_json;
    }
    od::object obj;
    if ((ec = doc.get_object().get(obj))) {
        error = ec == simdjson::INCORRECT_TYPE ? "not a JSON object"
                                               : std::string("not JSON (") + simdjson::error_message(ec) + ")";
        return parse_status::not_json;
    }
    const key_table& kt = keys();
    for (auto fr : obj) {
        if ((ec = fr.error())) {
            error = std::string("not JSON (") + simdjson::error_message(ec) + ")";
            return parse_status::not_json;
        }
        od::field f = std::move(fr).value_unsafe();
        // Keys of this format never contain escapes; a key that does is simply not one of ours.
        const char* kp = f.key().raw();
        const char* kq = static_cast<const char*>(std::memchr(kp, '"', size_t(p + len - kp)));
        if (!kq) {
            error = "not JSON (unterminated key)";
            return parse_status::not_json;
        }
        int id = kt.find(kp, size_t(kq - kp));
        if (id < 0) continue;  // unknown member: skipped, per the version policy
        od::value v = f.value();
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
            std::string_view s;
            if (auto c = v.get_string().get(s)) return bad(c, "a hex string like \"0x7f00\"");
            if (!parse_hex(s, dst)) {
                error = std::string("member \"") + k_field_names[fid] + "\" is \"" +
                        std::string(s.substr(0, 40)) + "\", expected a hex string like \"0x7f00\"";
                return parse_status::bad_member;
            }
            return parse_status::ok;
        };
        parse_status st = parse_status::ok;
        simdjson::error_code c = simdjson::SUCCESS;
        switch (fid) {
        case fd_ev: {
            std::string_view s;
            if ((c = v.get_string().get(s))) return bad(c, "a string");
            e.known_kind = lookup_name(s, k_ev_names, e.ev);
            break;
        }
        case fd_seq: c = get_u64(e.seq); break;
        case fd_t: c = get_u64(e.t); break;
        case fd_tid: {
            uint64_t x = 0;
            c = get_u64(x);
            e.tid = uint32_t(x);
            break;
        }
        case fd_dev: {
            int64_t x = 0;
            if (!(c = v.get_int64().get(x)) && (x < -1 || x > 65535)) {
                error = "member \"dev\" is " + std::to_string(x) + ", expected -1 or a device ordinal";
                return parse_status::bad_member;
            }
            e.dev = int32_t(x);
            break;
        }
        case fd_api: {
            std::string_view s;
            if ((c = v.get_string().get(s))) return bad(c, "a string");
            e.api = intern_api(s);
            break;
        }
        case fd_kind: {
            std::string_view s;
            if ((c = v.get_string().get(s))) return bad(c, "a string");
            // An unknown memory kind stays "none": still counted, never misattributed.
            if (!lookup_name(s, k_mem_kind_names, e.kind)) e.kind = mem_kind::none;
            break;
        }
        case fd_pool: {
            std::string_view s;
            if ((c = v.get_string().get(s))) return bad(c, "a string");
            if (!lookup_name(s, k_pool_names, e.pool)) e.pool = pool_id::none;
            break;
        }
        case fd_reason: {
            std::string_view s;
            if ((c = v.get_string().get(s))) return bad(c, "a string");
            e.reason.assign(s.substr(0, 64));
            break;
        }
        case fd_ptr: st = get_hex(e.ptr); break;
        case fd_seg: st = get_hex(e.seg); break;
        case fd_stream: st = get_hex(e.stream); break;
        case fd_mempool: st = get_hex(e.mempool); break;
        case fd_handle: st = get_hex(e.handle); break;
        case fd_size: c = get_u64(e.size); break;
        case fd_asize: c = get_u64(e.asize); break;
        case fd_offset: c = get_u64(e.offset); break;
        case fd_count: c = get_u64(e.count); break;
        case fd_err: c = v.get_int64().get(e.err); break;
        case fd_signal: c = v.get_int64().get(e.signal); break;
        case fd_pooled: c = v.get_bool().get(e.pooled); break;
        case fd_unknown: c = v.get_bool().get(e.unknown); break;
        case fd_reserved: c = get_u64(e.reserved); break;
        case fd_allocated: c = get_u64(e.allocated); break;
        case fd_requested: c = get_u64(e.requested); break;
        case fd_largest_free: c = get_u64(e.largest_free); break;
        case fd_free_blocks: c = get_u64(e.free_blocks); break;
        case fd_segments: c = get_u64(e.segments); break;
        case fd_gpu_free: c = get_u64(e.gpu_free); break;
        case fd_gpu_total: c = get_u64(e.gpu_total); break;
        case fd_events: c = get_u64(e.events); break;
        case fd_n_alloc: c = get_u64(e.n_alloc); break;
        case fd_n_free: c = get_u64(e.n_free); break;
        case fd_n_fail: c = get_u64(e.n_fail); break;
        case fd_live_allocs: c = get_u64(e.live_allocs); break;
        case fd_live_bytes: c = get_u64(e.live_bytes); break;
        case fd_lost: c = get_u64(e.lost); break;
        case fd_unmatched: c = get_u64(e.unmatched); break;
        case fd_count_: break;
        }
        if (c) {
            bool is_bool = fid == fd_pooled || fid == fd_unknown;
            bool is_signed = fid == fd_err || fid == fd_signal || fid == fd_dev;
            return bad(c, is_bool ? "true or false" : is_signed ? "an integer" : "a non-negative integer");
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
    uint64_t need = bit(fd_seq) | bit(fd_t);
    switch (e.ev) {
    case ev_kind::alloc:
        need |= bit(fd_dev) | bit(fd_api) | bit(fd_kind) | bit(fd_ptr) | bit(fd_size);
        if (e.pooled) need |= bit(fd_seg);
        break;
    case ev_kind::free:
        need |= bit(fd_dev) | bit(fd_api) | bit(fd_kind) | bit(fd_ptr);
        // An unknown pointer has no size to report (it is 0 by design), so only demand it otherwise.
        if (!e.unknown) need |= bit(fd_size);
        break;
    case ev_kind::alloc_fail: need |= bit(fd_dev) | bit(fd_api) | bit(fd_size); break;
    case ev_kind::free_fail: need |= bit(fd_ptr); break;
    case ev_kind::map: need |= bit(fd_ptr) | bit(fd_size) | bit(fd_handle); break;
    case ev_kind::unmap:
    case ev_kind::reserve:
    case ev_kind::unreserve: need |= bit(fd_ptr) | bit(fd_size); break;
    case ev_kind::segment_alloc:
    case ev_kind::segment_free: need |= bit(fd_dev) | bit(fd_ptr) | bit(fd_size); break;
    case ev_kind::oom: need |= bit(fd_dev) | bit(fd_size); break;
    case ev_kind::stats: need |= bit(fd_dev); break;
    default: break;
    }
    uint64_t missing = need & ~e.present;
    if (!missing) return "";
    std::string out;
    for (int i = 0; i < fd_count_; ++i)
        if (missing & bit(field(i))) {
            if (!out.empty()) out += ", ";
            out += std::string("\"") + k_field_names[i] + "\"";
        }
    return out;
}

}  // namespace gpumem::analysis
