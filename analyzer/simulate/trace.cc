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

struct device_state {
    device_trace tr;
    analysis::u64_map<uint32_t> live;     // address -> id of a live replayed allocation
    analysis::u64_map<uint16_t> streams;  // stream handle -> dense index (from 1)
};

}  // namespace

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
                ++d.tr.n_freed_twice;
                d.live.erase(e.ptr);
            }
            request r;
            r.size = e.size;
            r.seq = e.seq;
            r.t = e.t;
            r.id = d.tr.n_ids++;
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
