// Reads report JSON back into the report model (report_json_read.h); every member name it reads is
// the writer's (report_json.cc), the device scalars through report_fields.h.
#include "report_json_read.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "log_reader.h"
#include "report_output.h"

namespace gpumem::analysis {

namespace {

using json = nlohmann::json;

// Tolerant conversions: a value of another type leaves the model's default and returns false.
bool conv(const json& v, uint64_t& out) {
    if (v.is_number_unsigned()) out = v.get<uint64_t>();
    else if (v.is_number_integer() && v.get<int64_t>() >= 0) out = uint64_t(v.get<int64_t>());
    else if (v.is_number_float() && v.get<double>() >= 0 && v.get<double>() < 1.8e19) out = uint64_t(v.get<double>());
    else return false;
    return true;
}
bool conv(const json& v, int64_t& out) {
    if (!v.is_number_integer()) return false;
    out = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : v.get<int64_t>();
    return true;
}
bool conv(const json& v, int& out) {
    int64_t x = 0;
    if (!conv(v, x) || x < INT32_MIN || x > INT32_MAX) return false;
    out = int(x);
    return true;
}
bool conv(const json& v, std::string& out) {
    if (!v.is_string()) return false;
    out = v.get<std::string>();
    return true;
}
bool conv(const json& v, bool& out) {
    if (!v.is_boolean()) return false;
    out = v.get<bool>();
    return true;
}
// A missing member leaves the model's default and returns false.
template <typename T>
bool get(const json& j, const char* key, T& out) {
    auto it = j.find(key);
    return it != j.end() && conv(*it, out);
}

// "0x7f00" as written by fmt_hex.
bool get_hex(const json& j, const char* key, uint64_t& out) {
    std::string s;
    if (!get(j, key, s) || s.size() < 3 || s.size() > 18 || s[0] != '0' || s[1] != 'x') return false;
    uint64_t v = 0;
    for (size_t i = 2; i < s.size(); ++i) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return false;
        v = v << 4 | uint64_t(d);
    }
    out = v;
    return true;
}

const json& array_of(const json& j, const char* key) {
    static const json k_empty = json::array();
    auto it = j.find(key);
    return it != j.end() && it->is_array() ? *it : k_empty;
}

template <size_t N>
uint8_t index_of(const char* const (&names)[N], const std::string& s) {
    for (size_t i = 0; i < N; ++i)
        if (s == names[i]) return uint8_t(i);
    return 0;
}

block_view read_block(const json& j) {
    block_view b;
    get_hex(j, "ptr", b.ptr);
    get(j, "size_bytes", b.size);
    get(j, "asize_bytes", b.asize);
    get(j, "api", b.api);
    std::string kind;
    if (get(j, "kind", kind)) b.kind = mem_kind(index_of(k_mem_kind_names, kind));
    get(j, "pooled", b.pooled);
    get_hex(j, "seg", b.seg);
    get(j, "alloc_t_ns", b.t);
    get(j, "alloc_seq", b.seq);
    get(j, "alloc_line", b.line);
    return b;
}

void read_histogram(const json& a, size_histogram& h) {
    for (const json& b : a) {
        if (!b.is_object()) continue;
        uint64_t min = 0;
        get(b, "min_bytes", min);
        size_t i = size_t(size_histogram::bucket_of(min));
        get(b, "count", h.count[i]);
        get(b, "bytes", h.bytes[i]);
    }
}

void read_usage(const json& a, std::vector<usage_row>& rows) {
    for (const json& j : a) {
        if (!j.is_object()) continue;
        usage_row r;
        get(j, "name", r.name);
        get(j, "end_requested_bytes", r.bytes.current);
        get(j, "peak_requested_bytes", r.bytes.peak);
        get(j, "peak_t_ns", r.bytes.peak_t);
        get(j, "live_allocs", r.live);
        get(j, "n_alloc", r.n_alloc);
        get(j, "n_free", r.n_free);
        rows.push_back(std::move(r));
    }
}

// Where a member is in the JSON: its keys and array indexes, outermost first ({"devices", "0",
// "n_oom"}), for the line of the message (line_of).
using json_path = std::vector<std::string>;
json_path operator+(json_path a, const json_path& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

// What an analysis never produces and the report writers rely on (a segment's blocks inside it, in
// address order): a report JSON that breaks it is refused, naming the member and its line.
struct bad_member : std::runtime_error {
    bad_member(const std::string& what, json_path where) : std::runtime_error(what), path(std::move(where)) {}
    json_path path;  // from the object being read when thrown; the callers put theirs before it
};

// A ratio (report_fields.h) no analysis writes, outside [0, 1], is refused: taken as it was, 7.5
// was shown as 750% and passed a --baseline.  A value of another type is missing, as ever.
bool conv_ratio(const json& v, double& out, const std::string& member, const json_path& where) {
    if (!v.is_number()) return false;
    const double x = v.get<double>();
    if (!(x >= 0 && x <= 1)) throw bad_member(member + " is " + v.dump() + ", not a ratio from 0 to 1", where);
    out = x;
    return true;
}
bool get_ratio(const json& j, const char* key, double& out) {
    auto it = j.find(key);
    return it != j.end() && conv_ratio(*it, out, std::string("\"") + key + "\"", {key});
}
// A count, size or time of the device's scalars: a negative number (or one past 2^64) read as
// missing, which report showed as 0, and a fraction as the whole number under it (1.5 B as 1 B);
// refused, as no analysis writes either.  A whole number written as a float (1.0) is read.
bool get_u64(const json& j, const char* key, uint64_t& out) {
    auto it = j.find(key);
    if (it == j.end()) return false;
    const bool fraction = it->is_number_float() && std::trunc(it->get<double>()) != it->get<double>();
    if (!fraction && conv(*it, out)) return true;
    if (it->is_number())
        throw bad_member(std::string("\"") + key + "\" is " + it->dump() + ", not a whole number from 0 to 2^64 - 1", {key});
    return false;
}
// A bad_member from inside one of the device's members, with that member named after it (`member`,
// for the message) and put before its path (`where`, for the line).
template <typename F>
void within(const std::string& member, const json_path& where, F&& read) {
    try {
        read();
    } catch (const bad_member& e) {
        throw bad_member(std::string(e.what()) + (member.empty() ? "" : " (in " + member + ")"), where + e.path);
    }
}

void read_ranges(const json& a, uint64_t base, uint64_t size, const char* member,
                 std::vector<std::pair<uint64_t, uint64_t>>& out) {
    uint64_t end_of_last = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        const json& r = a[i];
        uint64_t off = 0, asize = 0;
        if (!(r.is_array() && r.size() == 2 && conv(r[0], off) && conv(r[1], asize)))
            throw bad_member(std::string("a member of \"") + member + "\" is not an [offset, bytes] pair of numbers",
                             {member, std::to_string(i)});
        if (off < end_of_last || off > size || asize > size - off)
            throw bad_member(std::string("\"") + member + "\" of the segment at " + std::to_string(base) +
                                 " holds a block outside the segment or out of address order",
                             {member, std::to_string(i)});
        end_of_last = off + asize;
        out.emplace_back(base + off, asize);
    }
}

void read_snapshot(const json& j, state_snapshot& s) {
    if (!j.is_object()) return;
    s.valid = true;
    get(j, "label", s.label);
    get(j, "t_ns", s.t);
    get(j, "seq", s.seq);
    get(j, "line", s.line);
    get(j, "requested_bytes", s.requested);
    get(j, "allocated_bytes", s.allocated);
    get(j, "reserved_bytes", s.reserved);
    get(j, "live_allocs", s.live_allocs);
    get(j, "pending_bytes", s.pending);
    get(j, "unmapped_bytes", s.unmapped);
    get(j, "segments", s.segments);
    get(j, "free_in_segments_bytes", s.free_in_segments);
    get(j, "largest_free_bytes", s.largest_free);
    get(j, "free_blocks", s.free_blocks);
    get_ratio(j, "external_fragmentation", s.external_fragmentation);
    const json& segments = array_of(j, "segment_list");
    for (size_t i = 0; i < segments.size(); ++i) {
        const json& g = segments[i];
        if (!g.is_object()) continue;
        const json_path where{"segment_list", std::to_string(i)};
        segment_view v;
        get_hex(g, "base", v.base);
        get(g, "size_bytes", v.size);
        std::string pool;
        if (get(g, "pool", pool)) v.pool = pool_id(index_of(k_pool_names, pool));
        if (v.size == 0 || v.base + v.size < v.base)
            throw bad_member("a segment of \"segment_list\" has no \"size_bytes\" or one past the address space",
                             where + json_path{"size_bytes"});
        within("", where, [&] {
            read_ranges(array_of(g, "block_ranges"), v.base, v.size, "block_ranges", v.blocks);
            read_ranges(array_of(g, "pending_ranges"), v.base, v.size, "pending_ranges", v.pending);
            read_ranges(array_of(g, "unmapped_ranges"), v.base, v.size, "unmapped_ranges", v.holes);
        });
        s.segment_map.push_back(std::move(v));
    }
    read_histogram(array_of(j, "free_block_histogram"), s.free_block_sizes);
    for (const json& b : array_of(j, "largest_live"))
        if (b.is_object()) s.largest_live.push_back(read_block(b));
}

// The stack of a SITE row or of an OOM's "asked_by" (views/report_sites.h, stack_json): its id, its
// frames put into `stacks` the first time the id is seen (top_sites, leak_sites and the OOMs repeat a
// stack).  0 for none.
uint32_t read_stack(const json& j, stack_store& stacks) {
    uint64_t id = 0;
    if (!get(j, "stack", id) || id > UINT32_MAX || id == 0) return 0;
    if (stacks.find(uint32_t(id))) return uint32_t(id);
    std::vector<frame_view> frames;
    for (const json& f : array_of(j, "frames")) {
        if (!f.is_object()) continue;
        frame_view v;
        get(f, "function", v.function);
        get(f, "file", v.file);
        get(f, "line", v.line);
        get(f, "module", v.module);
        get_hex(f, "address", v.address);
        frames.push_back(std::move(v));
    }
    // An id no log would use (stack_store refuses ids far past the others) reads as no stack.
    return stacks.add(uint32_t(id), std::move(frames)) ? uint32_t(id) : 0;
}

// SITE rows (views/report_sites.h, sites_json).
void read_sites(const json& a, stack_store& stacks, std::vector<site_row>& rows) {
    for (const json& j : a) {
        if (!j.is_object()) continue;
        site_row r;
        get(j, "bytes", r.bytes);
        get(j, "count", r.count);
        r.stack = read_stack(j, stacks);
        rows.push_back(r);
    }
}

void read_device(const json& j, device_report& d, device_fields_read& fields, stack_store& stacks) {
    get(j, "name", d.name);
    // The scalars, each marked present only when it is there with a usable type; one there with
    // another type is kept as written (past 40 bytes, cut to at most 37 and "..."), for the message that it is missing.
#define GPUMEM_X(name, member, type) fields.present[size_t(device_field::name)] = get_##type(j, #name, d.member);
    GPUMEM_REPORT_DEVICE_FIELDS(GPUMEM_X)
#undef GPUMEM_X
    for (size_t f = 0; f < k_n_device_fields; ++f)
        if (auto it = j.find(field_name(device_field(f))); !fields.present[f] && it != j.end()) {
            std::string found = it->dump();
            if (found.size() > 40) {
                // Cut on a character boundary: half a UTF-8 sequence is not text (log_reader's end_reason).
                size_t n = 37;
                while (n > 0 && (static_cast<unsigned char>(found[n]) & 0xC0) == 0x80) --n;
                found = found.substr(0, n) + "...";
            }
            fields.other_type.emplace_back(device_field(f), std::move(found));
        }
    auto rs = j.find("reuse_safe");
    if (rs != j.end() && rs->is_object()) {
        d.reuse_safe = true;
        get(*rs, "seq", d.reuse_safe_seq);
        get(*rs, "t_ns", d.reuse_safe_t);
        get(*rs, "line", d.reuse_safe_line);
        get(*rs, "api", d.reuse_safe_api);
    }
    for (const json& b : array_of(j, "leaks"))
        if (b.is_object()) d.leaks.push_back(read_block(b));
    if (auto it = j.find("top_sites"); it != j.end() && it->is_array()) stacks.mark_listed();
    read_sites(array_of(j, "top_sites"), stacks, d.top_sites);
    read_sites(array_of(j, "leak_sites"), stacks, d.leak_sites);
    read_usage(array_of(j, "by_kind"), d.by_kind);
    read_usage(array_of(j, "by_api"), d.by_api);
    read_histogram(array_of(j, "alloc_size_histogram"), d.alloc_sizes);
    if (auto it = j.find("at_peak"); it != j.end()) within("\"at_peak\"", {"at_peak"}, [&] { read_snapshot(*it, d.at_peak); });
    if (auto it = j.find("at_request"); it != j.end())
        within("\"at_request\"", {"at_request"}, [&] { read_snapshot(*it, d.at_request); });
    const json& ooms = array_of(j, "ooms");
    for (size_t i = 0; i < ooms.size(); ++i) {
        const json& x = ooms[i];
        if (!x.is_object()) continue;
        oom_report o;
        get(x, "t_ns", o.t);
        get(x, "seq", o.seq);
        get(x, "line", o.line);
        get(x, "size_bytes", o.size);
        get(x, "api", o.api);
        std::string source;
        o.from_pool = get(x, "source", source) && source == "pool";
        get(x, "err", o.err);
        get(x, "free_in_segments_bytes", o.free_in_segments);
        get(x, "largest_free_bytes", o.largest_free);
        get(x, "reserved_bytes", o.reserved);
        get(x, "allocated_bytes", o.allocated);
        get(x, "requested_bytes", o.requested);  // these three absent from a report written before them: 0, false
        get(x, "pending_bytes", o.pending);
        get(x, "pool_vmm", o.pool_vmm);
        get(x, "gpu_free_bytes", o.gpu_free);
        get(x, "gpu_total_bytes", o.gpu_total);
        get(x, "verdict", o.verdict);
        get(x, "explanation", o.explanation);
        if (auto a = x.find("asked_by"); a != x.end() && a->is_object()) o.stack = read_stack(*a, stacks);
        if (auto m = x.find("map"); m != x.end())
            within("\"ooms\" " + std::to_string(i) + ", \"map\"", {"ooms", std::to_string(i), "map"},
                   [&] { read_snapshot(*m, o.map); });
        read_sites(array_of(x, "sites"), stacks, o.sites);
        d.ooms.push_back(std::move(o));
    }
    get(j, "timeline_events_per_point", d.timeline_events_per_point);
    // Timeline rows: the columns of "timeline_columns", in the writer's order.
    const json& timeline = array_of(j, "timeline");
    for (size_t i = 0; i < timeline.size(); ++i) {
        const json& row = timeline[i];
        if (!row.is_array() || row.size() < 6) continue;
        const std::string where = "\"timeline\" row " + std::to_string(i) + ": ";
        time_point t;
        conv(row[0], t.t_first);
        conv(row[1], t.t_last);
        conv(row[2], t.requested_max);
        conv(row[3], t.allocated_max);
        conv(row[4], t.reserved_max);
        const json_path at{"timeline", std::to_string(i)};
        conv_ratio(row[5], t.frag_max, where + "\"external_fragmentation_max\"", at + json_path{"5"});
        // Columns added later; a report without them draws its charts from the maxima.
        t.events = 1;
        if (row.size() >= 12) {
            conv(row[6], t.events);
            conv(row[7], t.seq_last);
            conv(row[8], t.requested_last);
            conv(row[9], t.allocated_last);
            conv(row[10], t.reserved_last);
            conv_ratio(row[11], t.frag_last, where + "\"external_fragmentation_last\"", at + json_path{"11"});
        }
        d.timeline.push_back(t);
    }
}

process_report read_process(const json& j, const std::string& path, std::vector<device_fields_read>& fields) {
    process_report p;
    if (!get(j, "file", p.file)) p.file = path;
    get(j, "format_version", p.format_version);
    get(j, "pid", p.pid);
    get(j, "ppid", p.ppid);
    get(j, "forked_from", p.forked_from);
    get(j, "host", p.host);
    // A rank written by hand as a number (0) reads as its text.
    if (auto r = j.find("rank"); r != j.end() && r->is_number_integer()) p.rank = r->dump();
    else get(j, "rank", p.rank);
    for (const json& a : array_of(j, "cmdline"))
        if (a.is_string()) p.cmdline.push_back(a.get<std::string>());
    get(j, "start_time", p.start_time);
    get(j, "start_unix_ns", p.start_unix_ns);
    get(j, "gpumem_version", p.gpumem_version);
    get(j, "stacks_off", p.stacks_off);
    get(j, "stacks_lost", p.stacks_lost);
    get(j, "pool", p.pool_mode);
    get(j, "reuse", p.reuse_mode);
    get(j, "lines", p.lines);
    get(j, "events", p.events);
    get(j, "skipped_unknown_events", p.skipped_unknown);
    get(j, "first_t_ns", p.first_t);
    get(j, "last_t_ns", p.last_t);
    get(j, "ended", p.has_end);
    get(j, "end_reason", p.end_reason);
    get(j, "end_signal", p.end_signal);
    get(j, "truncated_last_line", p.truncated_last_line);
    get(j, "lost_events", p.lost);
    get(j, "n_reserve", p.n_reserve);
    get(j, "n_unreserve", p.n_unreserve);
    get(j, "end_va_reserved_bytes", p.va_reserved.current);
    get(j, "peak_va_reserved_bytes", p.va_reserved.peak);
    get(j, "n_context_reset", p.n_context_reset);
    get(j, "n_pool_sync", p.n_pool_sync);
    get(j, "n_warnings", p.n_warnings);
    for (const json& w : array_of(j, "warnings"))
        if (w.is_string()) p.warnings.push_back(w.get<std::string>());
    // A device without an integer "dev" cannot be matched with anything, and one left out would be
    // a GPU that a report shows idle and a baseline no longer holds: refused, as is a process
    // without its list (the writer always writes one, empty for a log without GPU activity).
    auto devices = j.find("devices");
    if (devices == j.end() || !devices->is_array()) throw bad_member("it has no \"devices\" list", {"devices"});
    for (const json& dj : *devices) {
        const json_path where{"devices", std::to_string(p.devices.size())};
        int64_t dev = 0;  // as int64, so that 2^40 is named out of range, not "not an integer"
        if (!dj.is_object() || !get(dj, "dev", dev))
            throw bad_member("device " + std::to_string(p.devices.size()) +
                                 " of \"devices\" is not an object with an integer \"dev\", so it cannot be matched with a GPU",
                             where + json_path{"dev"});
        // The log's range (log_reader's "dev"): under -1 would read as host memory, past 65535 as a
        // GPU that no log can name.
        if (dev < -1 || dev > 65535)
            throw bad_member("device " + std::to_string(p.devices.size()) + " of \"devices\" has \"dev\" " +
                                 std::to_string(dev) + ", not -1 (host) or a device ordinal up to 65535",
                             where + json_path{"dev"});
        // One GPU listed twice (an edited report): check and diff would match either with the other
        // run's, and the error named only the process's log, not this file.  Refused here, at its line.
        for (size_t k = 0; k < p.devices.size(); ++k)
            if (p.devices[k].dev == dev)
                throw bad_member("device " + std::to_string(p.devices.size()) + " of \"devices\" has \"dev\" " +
                                     std::to_string(dev) + ", as device " + std::to_string(k) +
                                     " has: one GPU listed twice",
                                 where + json_path{"dev"});
        device_report d;
        d.dev = int(dev);
        device_fields_read pr;
        try {
            read_device(dj, d, pr, p.stacks);
        } catch (const bad_member& e) {
            throw bad_member("device " + std::to_string(p.devices.size()) + " of \"devices\" (dev " + std::to_string(dev) +
                                 "): " + e.what(),
                             where + e.path);
        }
        p.devices.push_back(std::move(d));
        fields.push_back(std::move(pr));
    }
    return p;
}

// The text's characters for nlohmann's parser, recording how far it has read: at each SAX event,
// the token it reports has just been read (a number, and the character after it, which the parser
// reads to see it end).
struct counting_iterator {
    using iterator_category = std::input_iterator_tag;
    using value_type = char;
    using difference_type = std::ptrdiff_t;
    using pointer = const char*;
    using reference = const char&;
    const char* p = nullptr;
    const char** read = nullptr;  // shared by the parser's copies
    reference operator*() const { return *p; }
    counting_iterator& operator++() {
        *read = ++p;
        return *this;
    }
    counting_iterator operator++(int) {
        counting_iterator was = *this;
        ++*this;
        return was;
    }
    bool operator==(const counting_iterator& o) const { return p == o.p; }
    bool operator!=(const counting_iterator& o) const { return p != o.p; }
};

// Follows the path of keys and array indexes through the SAX events and keeps the line of the
// deepest member of `target` found: the member itself (its key's line, in an object), or where it
// is missing, the object that lacks it.
struct member_locator : nlohmann::json_sax<json> {
    const json_path& target;
    const char* begin;
    const char* const* read;
    json_path path;                      // of the open objects and arrays
    std::vector<size_t> next;            // per open array, its next element's index; SIZE_MAX for an object
    std::string last_key;                // the open object's last key
    size_t found = 0;                    // members of `target` matched so far
    uint64_t line = 0;
    member_locator(const json_path& t, const char* b, const char* const* r) : target(t), begin(b), read(r) {}

    // `token` (a key, or an element's index) starts now, its last character `back` characters
    // before where the parser stands; false once the whole target is found, which stops it.
    // Only inside the containers of the target's own path: a matched member that is no container
    // (a device written as 5) leaves `found` at its depth, and a later sibling's member of the
    // target's next name ("dev" of the device after it) must not be taken for the rest.
    bool at(const std::string& token, size_t back) {
        const size_t depth = path.size() + 1;
        if (depth <= found || depth > target.size() || found < path.size() || token != target[depth - 1] ||
            !std::equal(path.begin(), path.end(), target.begin()))
            return true;
        found = depth;
        const char* last = *read - begin < std::ptrdiff_t(back) ? begin : *read - back;
        line = 1 + uint64_t(std::count(begin, last, '\n'));
        return found < target.size();
    }
    // A value starts: an element of an array is matched by its index, a member's by its key (met
    // already, at key()).
    bool value(size_t back) {
        if (next.empty() || next.back() == SIZE_MAX) return true;
        return at(std::to_string(next.back()++), back);
    }
    bool open(bool array) {
        const std::string token =
            next.empty() ? std::string() : next.back() == SIZE_MAX ? last_key : std::to_string(next.back() - 1);
        if (!next.empty()) path.push_back(token);
        next.push_back(array ? 0 : SIZE_MAX);
        return true;
    }
    bool close() {
        next.pop_back();
        // Leaving the deepest object or array of the target found (or the document): it is not
        // further on, where a member of the same name in a sibling would be taken for it.
        if (next.empty() || found >= path.size()) return false;
        path.pop_back();
        return true;
    }
    bool null() override { return value(1); }
    bool boolean(bool) override { return value(1); }
    bool number_integer(number_integer_t) override { return value(2); }
    bool number_unsigned(number_unsigned_t) override { return value(2); }
    bool number_float(number_float_t, const string_t&) override { return value(2); }
    bool string(string_t&) override { return value(1); }
    bool binary(binary_t&) override { return value(1); }
    bool start_object(std::size_t) override { return value(1) && open(false); }
    bool start_array(std::size_t) override { return value(1) && open(true); }
    bool key(string_t& k) override {
        last_key = k;
        return at(k, 1);
    }
    bool end_object() override { return close(); }
    bool end_array() override { return close(); }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};

// The line of the member at `target` in `text` (valid JSON): a second pass, made only for a message.
uint64_t line_of(const std::string& text, const json_path& target) {
    const char* read = text.data();
    member_locator locate(target, text.data(), &read);
    json::sax_parse(counting_iterator{text.data(), &read}, counting_iterator{text.data() + text.size(), &read}, &locate);
    return locate.line;
}

}  // namespace

bool looks_like_report_json(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    char buf[4096];
    f.read(buf, sizeof buf);
    const std::string head(buf, size_t(f.gcount()));
    size_t i = head.compare(0, 3, "\xEF\xBB\xBF") == 0 ? 3 : 0;  // a UTF-8 byte order mark
    while (i < head.size() && (head[i] == ' ' || head[i] == '\t' || head[i] == '\r' || head[i] == '\n')) ++i;
    if (i >= head.size() || head[i] != '{') return false;
    // A report is one object: pretty (a newline after the brace) or with "schema" first, as gpumem
    // writes it.  A log's first line is its header, {"ev":"header", ...}.  Anything else (a report
    // re-serialized with sorted keys, a header with its keys reordered) is told apart by the
    // header's "ev" member, which no report carries.
    for (++i; i < head.size() && (head[i] == ' ' || head[i] == '\t' || head[i] == '\r'); ++i) {
    }
    if (i < head.size() && head[i] == '\n') return true;
    if (head.compare(i, 8, "\"schema\"") == 0) return true;
    if (head.compare(i, 4, "\"ev\"") == 0) return false;
    const std::string first_line = head.substr(0, head.find('\n'));
    return first_line.find("\"ev\":\"header\"") == std::string::npos && first_line.find("\"ev\": \"header\"") == std::string::npos;
}

report_file read_report_json(const std::string& path, const std::string& open_path) {
    std::ifstream f(open_path.empty() ? path : open_path, std::ios::binary);
    if (!f) throw input_error(path, 0, cannot_open_message(path, errno));
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    json j;
    try {
        j = json::parse(text);
    } catch (const json::parse_error& e) {
        // It starts like a report (looks_like_report_json), so say where it stops being JSON: a
        // baseline cut short by a full disk or broken by an edit is found by its line.
        size_t end = std::min<size_t>(e.byte ? e.byte - 1 : 0, text.size());
        uint64_t line = 1 + uint64_t(std::count(text.begin(), text.begin() + std::ptrdiff_t(end), '\n'));
        std::string why = e.what();
        size_t colon = why.find(": ", why.find("column"));
        if (colon != std::string::npos) why = why.substr(colon + 2);  // drop "[json.exception...] at line L, column C"
        throw input_error(path, line, "not valid JSON (" + why + "): neither a gpumem log nor a complete `gpumem report --json` file");
    }
    if (!j.is_object()) throw input_error(path, 0, "neither a gpumem log nor a `gpumem report --json` file");
    std::string schema;
    if (!get(j, "schema", schema) || schema != "gpumem-report")
        throw input_error(path, 0, "not a `gpumem report --json` file (no \"schema\": \"gpumem-report\")");
    // A newer report is read by the newer gpumem that wrote it (regenerating drops nothing either);
    // an older one only by regenerating; a version that is no number is said to be none (a string
    // "1" named as a version this gpumem does not read sent one looking for a version 1).
    const std::string k = std::to_string(k_report_schema_version);
    const std::string regenerate = "regenerate it with this gpumem's `gpumem report --json` on the run's logs";
    const auto version = j.find("schema_version");
    if (version == j.end())
        throw input_error(path, 0, "report schema version (none) is not the " + k + " this gpumem reads: " + regenerate);
    if (!version->is_number())
        throw input_error(path, 0, "report's \"schema_version\" is " + version->dump() + ", not a number (this gpumem reads version " +
                                       k + "): " + regenerate);
    const double v = version->get<double>();  // 1.0 is 1, as whole numbers written as floats are read
    if (v > k_report_schema_version)
        throw input_error(path, 0, "report schema version " + version->dump() + " is newer than the " + k +
                                       " this gpumem reads: read it with the newer gpumem that wrote it, or " + regenerate);
    if (v < k_report_schema_version)
        throw input_error(path, 0, "report schema version " + version->dump() + " is older than the " + k + " this gpumem reads: " + regenerate);
    auto it = j.find("processes");
    if (it == j.end() || !it->is_array()) throw input_error(path, 0, "report has no \"processes\" list");
    // gpumem report --json writes one process per log and takes at least one log: an empty list is
    // no report of a run (report printed nothing at all, diff compared against nothing).
    if (it->empty()) throw input_error(path, 0, "report's \"processes\" list is empty: no run to read");
    report_file out;
    for (const json& p : *it) {
        const json_path where{"processes", std::to_string(out.processes.size())};
        if (!p.is_object()) throw input_error(path, line_of(text, where), "a member of \"processes\" is not an object");
        out.fields.emplace_back();
        try {
            out.processes.push_back(read_process(p, path, out.fields.back()));
        } catch (const bad_member& e) {
            throw input_error(path, line_of(text, where + e.path),
                              "process " + std::to_string(out.processes.size()) + ": " + e.what());
        }
        // Where a member CI gates on is missing, its line (or the device's, which lacks it), for
        // check's error and report's warning: a report edited by hand, found by line as the other
        // refusals are.  Looked up only then: each lookup reads the text again.
        std::vector<device_fields_read>& fields = out.fields.back();
        for (size_t k = 0; k < fields.size(); ++k)
            for (device_field f : k_gated_fields)
                if (!fields[k].has(f)) {
                    json_path at = where + json_path{"devices", std::to_string(k)};
                    if (fields[k].found(f)) at = at + json_path{field_name(f)};
                    fields[k].lines.emplace_back(f, line_of(text, at));
                }
    }
    return out;
}

}  // namespace gpumem::analysis
