// Loads a gpumem log into each device's sequence of allocation requests and frees, for the allocator simulations.
#include "trace.h"

#include <algorithm>
#include <map>

#include <nlohmann/json.hpp>

#include "log_reader.h"
#include "model/log_order.h"
#include "u64_map.h"

namespace gpumem::simulate {

using analysis::input_error;
using analysis::log_event;
using analysis::order_finding;

namespace {

// The members of line 1 the replay needs; the full validation is the report's (analyze.cc).
// `complete`: line 1 ended with a newline.
void read_header(std::string_view line, bool complete, const std::string& path, trace& out,
                 std::map<int, uint64_t>& totals) {
    if (const char* z = analysis::compression_of(line))
        throw input_error(path, 1, analysis::compressed_log_advice(z, path, "replay"));
    auto h = nlohmann::json::parse(line.begin(), line.end(), nullptr, false);
    if (h.is_discarded() && analysis::header_cut_short(line, complete))
        throw input_error(path, 1, analysis::k_header_cut_short);
    // Each member's type is tested before its value is read: json::value() throws type_error on a
    // member of another type ("ev":5), and a hostile header must be an input error, not an abort.
    auto ev = h.is_object() ? h.find("ev") : h.end();
    if (h.is_discarded() || !h.is_object() || ev == h.end() || !ev->is_string() ||
        ev->get_ref<const std::string&>() != k_ev_names[0]) {
        // A `gpumem report --json` file opens with a lone brace (or "schema" first): said as such,
        // as `gpumem report --torch-snapshot` says it, rather than as a log without its start.
        std::string_view t = line;
        while (!t.empty() && (t.back() == ' ' || t.back() == '\r' || t.back() == '\t')) t.remove_suffix(1);
        if (t == "{" || t.rfind("{\"schema\"", 0) == 0)
            throw input_error(path, 1, "a `gpumem report --json` file holds no events: replay needs the event log");
        throw input_error(path, 1, "line 1 is not a gpumem header: not a gpumem log, or its start is missing");
    }
    auto fmt = h.find("format");
    if (fmt == h.end() || !fmt->is_string() || fmt->get_ref<const std::string&>() != k_format_name)
        throw input_error(path, 1, "unknown format " + (fmt == h.end() ? std::string("(none)") : fmt->dump()) +
                                       " (expected \"" + std::string(k_format_name) + "\")");
    auto ver = h.find("version");
    if (ver == h.end() || !ver->is_number_integer() || ver->get<int64_t>() < 1 ||
        ver->get<int64_t>() > k_format_version)
        throw input_error(path, 1, "unknown log format version (this gpumem reads 1 to " +
                                       std::to_string(k_format_version) + ")");
    auto cfg = h.find("config");
    out.config_json = (cfg != h.end() && cfg->is_object()) ? cfg->dump() : "{}";
    auto devs = h.find("devices");
    if (devs != h.end() && devs->is_array())
        for (const auto& d : *devs)
            if (d.is_object() && d.contains("index") && d["index"].is_number_integer() && d.contains("total") &&
                d["total"].is_number_unsigned())
                totals[d["index"].get<int>()] = d["total"].get<uint64_t>();
}

// request_list's encoding, one request after the other in a chunk (none spans two):
//   tag      byte: bit 0 is_free; bits 1-7 the stream, or 127 and the stream follows as a varint
//   seq, t   zigzag varints of the difference from the request before (mod 2^64: any value fits)
//   id       zigzag varint of the difference from the request before's id (mod 2^32)
//   size     varint, allocations only
// A varint holds 7 bits a byte, low first, the high bit set on all bytes but the last.  A training
// loop's request takes 5 to 10 bytes: seq steps by a few, t by microseconds, ids are reused in
// turn (load_trace), sizes are MiB.
// Chunks double from 4 KiB to 1 MiB: a small log (many at once, or many devices) holds little.
constexpr size_t k_first_chunk_bytes = size_t(4) << 10, k_chunk_bytes = size_t(1) << 20;
constexpr size_t k_max_record = 1 + 3 + 10 + 10 + 5 + 10;
constexpr uint8_t k_stream_escape = 127;

uint8_t* put_varint(uint8_t* p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = uint8_t(v) | 0x80;
        v >>= 7;
    }
    *p++ = uint8_t(v);
    return p;
}
uint64_t get_varint(const uint8_t*& p) {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
        uint8_t b = *p++;
        v |= uint64_t(b & 0x7f) << shift;
        if (!(b & 0x80)) return v;
    }
}
uint64_t zigzag(uint64_t d) { return (d << 1) ^ uint64_t(int64_t(d) >> 63); }
uint64_t unzigzag(uint64_t z) { return (z >> 1) ^ (~(z & 1) + 1); }
uint32_t zigzag32(uint32_t d) { return (d << 1) ^ uint32_t(int32_t(d) >> 31); }
uint32_t unzigzag32(uint32_t z) { return (z >> 1) ^ (~(z & 1) + 1); }

struct device_state {
    device_trace tr;
    analysis::u64_map<uint32_t> live;     // address -> id of a live replayed allocation
    analysis::u64_map<uint16_t> streams;  // stream handle -> dense index (from 1)
    // Ids of freed allocations, for the next ones (last freed, first reused): the policies' tables
    // by id then hold the allocations live at once, not every allocation of the log.
    std::vector<uint32_t> free_ids;
    uint32_t new_id() {
        if (free_ids.empty()) return tr.n_ids++;
        uint32_t id = free_ids.back();
        free_ids.pop_back();
        return id;
    }
};

}  // namespace

void request_list::push_back(const request& r) {
    if (chunks_.empty() || chunks_.back().size - chunks_.back().used < k_max_record) {
        const size_t size = chunks_.empty() ? k_first_chunk_bytes : std::min(2 * chunks_.back().size, k_chunk_bytes);
        chunks_.push_back(chunk{std::make_unique_for_overwrite<uint8_t[]>(size), size, 0});
        held_ += size;
    }
    chunk& c = chunks_.back();
    uint8_t* p = c.data.get() + c.used;
    *p++ = uint8_t(r.is_free) | uint8_t(std::min<uint16_t>(r.stream, k_stream_escape) << 1);
    if (r.stream >= k_stream_escape) p = put_varint(p, r.stream);
    p = put_varint(p, zigzag(r.seq - last_.seq));
    p = put_varint(p, zigzag(r.t - last_.t));
    p = put_varint(p, zigzag32(r.id - last_.id));
    if (!r.is_free) p = put_varint(p, r.size);
    c.used = size_t(p - c.data.get());
    last_ = r;
    ++n_;
}

uint64_t request_list::bytes() const { return held_ + chunks_.capacity() * sizeof(chunk); }

request_list::iterator request_list::begin() const {
    iterator it;
    it.list_ = this;
    it.left_ = n_;
    if (n_) it.decode();
    return it;
}

request_list::iterator& request_list::iterator::operator++() {
    if (--left_) decode();
    return *this;
}

void request_list::iterator::decode() {
    if (pos_ == list_->chunks_[chunk_].used) {
        ++chunk_;
        pos_ = 0;
    }
    const uint8_t* start = list_->chunks_[chunk_].data.get() + pos_;
    const uint8_t* p = start;
    const uint8_t tag = *p++;
    cur_.is_free = tag & 1;
    cur_.stream = tag >> 1;
    if (cur_.stream == k_stream_escape) cur_.stream = uint16_t(get_varint(p));
    cur_.seq += unzigzag(get_varint(p));
    cur_.t += unzigzag(get_varint(p));
    cur_.id += unzigzag32(uint32_t(get_varint(p)));
    cur_.size = cur_.is_free ? 0 : get_varint(p);
    pos_ += size_t(p - start);
}

trace load_trace(const std::string& path, const trace_options& opt) {
    trace out;
    out.file = path;
    analysis::line_source src(path);
    std::string_view line;
    bool complete = true;
    if (!src.next(line, complete)) throw input_error(path, 0, "empty file: a gpumem log starts with a header line");
    std::map<int, uint64_t> totals;
    read_header(line, complete, path, out, totals);

    analysis::line_parser parser;
    // Which interned API indexes are replayed: decided once per index as names are first seen.
    std::vector<int8_t> api_ok;  // -1 unknown yet, 0 no, 1 yes
    auto wanted = [&](const log_event& e) {
        if (e.api >= api_ok.size()) api_ok.resize(size_t(e.api) + 1, -1);
        int8_t& w = api_ok[e.api];
        if (w < 0) {
            const std::string& name = parser.api_name(e.api);
            // First sight of this API: kept for the message when --api names none of the log's.
            if (std::find(out.log_apis.begin(), out.log_apis.end(), name) == out.log_apis.end())
                out.log_apis.push_back(name);
            if (opt.apis.empty()) w = 1;
            else w = std::find(opt.apis.begin(), opt.apis.end(), name) != opt.apis.end();
        }
        return w == 1;
    };
    std::map<int, device_state> devs;
    std::vector<std::string> seen_apis;
    log_event e;
    std::string err;
    analysis::log_order order;
    analysis::reading_meter meter(opt.progress, opt.progress_interval_s, path);
    while (src.next(line, complete)) {
        meter.line(src);
        if (complete && analysis::is_blank_line(line)) continue;  // as the report skips it (with a warning)
        auto st = parser.parse(line.data(), line.size(), src.capacity_from(line.data()), e, err);
        if (st != analysis::parse_status::ok) {
            if (!complete) {  // a writer still in the line, or stopped in it: the rest is not here
                out.cut_line = src.line_number();
                break;
            }
            throw input_error(path, src.line_number(), err);
        }
        // The report's order rules, from the same place (model/log_order.h), so both refuse the same
        // logs with the same words: a second header or a seq not going forward would pair one
        // process's frees with another's blocks.  Its warnings (events missing) are the report's to say.
        if (order_finding f = order.next(e); f.error()) throw input_error(path, src.line_number(), f.message());
        if (!e.known_kind) continue;
        if (e.ev != ev_kind::alloc && e.ev != ev_kind::free) continue;
        if (analysis::line_parser::required_members(e) & ~e.present)
            throw input_error(path, src.line_number(),
                              std::string("\"") + k_ev_names[size_t(e.ev)] + "\" event without " +
                                  analysis::line_parser::missing_members(e));
        device_state& d = devs[e.dev];
        d.tr.dev = e.dev;
        if (e.ev == ev_kind::alloc) {
            if (e.kind != mem_kind::device) {
                // Counted, so that the replay says what it left out of the GPU's memory.
                if (e.kind == mem_kind::managed) ++out.skipped_managed;
                else if (e.kind == mem_kind::vmm) ++out.skipped_vmm;
                continue;
            }
            if (!wanted(e)) {
                ++out.skipped_allocs;
                continue;
            }
            const std::string& name = parser.api_name(e.api);
            if (std::find(seen_apis.begin(), seen_apis.end(), name) == seen_apis.end()) seen_apis.push_back(name);
            if (e.size == 0) continue;  // nothing to serve (the driver returns an error or null)
            if (uint32_t* old = d.live.find(e.ptr)) {
                // Allocated again without a free in between: the free was not recorded.
                d.tr.ops.push_back(request{0, e.seq, e.t, *old, 0, true});
                d.free_ids.push_back(*old);
                ++d.tr.n_freed_twice;
                d.live.erase(e.ptr);
            }
            request r;
            r.size = e.size;
            r.seq = e.seq;
            r.t = e.t;
            r.id = d.new_id();
            if (e.has(analysis::fd_stream)) {
                auto [idx, inserted] = d.streams.try_emplace(e.stream, uint16_t(0));
                if (inserted) *idx = uint16_t(std::min<size_t>(d.streams.size(), 65535));
                r.stream = *idx;
            } else {
                ++d.tr.n_no_stream;
            }
            d.live.insert_or_assign(e.ptr, r.id);
            d.tr.ops.push_back(r);
            ++d.tr.n_alloc;
        } else {
            uint32_t* id = d.live.find(e.ptr);
            if (!id) continue;  // not a replayed allocation (other API, or allocated before the log)
            d.tr.ops.push_back(request{0, e.seq, e.t, *id, 0, true});
            d.free_ids.push_back(*id);
            ++d.tr.n_free;
            d.live.erase(e.ptr);
        }
    }
    for (auto& [dev, d] : devs) {
        if (d.tr.ops.empty()) continue;
        d.tr.n_streams = d.streams.size();
        auto it = totals.find(dev);
        if (it != totals.end()) d.tr.total_bytes = it->second;
        out.devices.push_back(std::move(d.tr));
    }
    out.apis = std::move(seen_apis);
    return out;
}

}  // namespace gpumem::simulate
