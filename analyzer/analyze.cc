// Drives one log through the reader and the rebuilder, with header validation and progress output.
#include "analyze.h"

#include <algorithm>
#include <cerrno>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <map>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "format_util.h"
#include "input_spool.h"
#include "log_fields.h"
#include "log_reader.h"

namespace gpumem::analysis {

namespace {

using json = nlohmann::json;

template <typename T>
void take(const json& j, const char* key, T& out) {
    auto it = j.find(key);
    if (it == j.end()) return;
    if constexpr (std::is_same_v<T, std::string>) {
        if (it->is_string()) out = it->template get<std::string>();
    } else if constexpr (std::is_same_v<T, bool>) {
        if (it->is_boolean()) out = it->template get<bool>();
    } else if constexpr (std::is_integral_v<T>) {
        if (it->is_number_integer()) out = it->template get<T>();
    }
}

// Validates line 1 and copies what it says about the process into the report.
// `command`: the gpumem command reading it, for the advice on a compressed file.
// `complete`: line 1 ended with a newline.
void read_header(std::string_view line, bool complete, const std::string& path, process_report& rep, const char* command) {
    if (const char* z = compression_of(line)) throw input_error(path, 1, compressed_log_advice(z, path, command));
    json h = json::parse(line.begin(), line.end(), nullptr, false);
    if (h.is_discarded() && header_cut_short(line, complete)) throw input_error(path, 1, k_header_cut_short);
    if (h.is_discarded()) throw input_error(path, 1, "line 1 is not JSON: not a gpumem log");
    if (!h.is_object()) throw input_error(path, 1, "line 1 is not a JSON object: not a gpumem log");
    auto ev = h.find(k_log_fields[size_t(log_field::ev)].name);
    if (ev == h.end() || !ev->is_string() || *ev != k_ev_names[size_t(ev_kind::header)])
        throw input_error(path, 1, "line 1 is not a header (\"ev\":\"header\" expected): not a gpumem log, or its start is missing");
    auto fmt = h.find(header_key::format);
    if (fmt == h.end()) throw input_error(path, 1, std::string("the header has no \"") + header_key::format + "\" member");
    if (!fmt->is_string() || *fmt != k_format_name)
        throw input_error(path, 1, "unknown format " + fmt->dump() + " (expected \"" + k_format_name + "\")");
    auto ver = h.find(header_key::version);
    if (ver == h.end()) throw input_error(path, 1, std::string("the header has no \"") + header_key::version + "\" member");
    if (!ver->is_number_integer())
        throw input_error(path, 1, "unknown format version " + ver->dump() + " (expected an integer)");
    // dump() writes the number as given (2^63 stays positive); get<int64_t> would wrap it.
    if (ver->is_number_unsigned() && ver->get<uint64_t>() > uint64_t(INT64_MAX))
        throw input_error(path, 1, "log format version " + ver->dump() + " is newer than this analyzer reads (up to " +
                                       std::to_string(k_format_version) + "): use a newer gpumem");
    int64_t v = ver->get<int64_t>();
    if (v > k_format_version)
        throw input_error(path, 1, "log format version " + std::to_string(v) + " is newer than this analyzer reads (up to " +
                                       std::to_string(k_format_version) + "): use a newer gpumem");
    if (v < 1) throw input_error(path, 1, "unknown format version " + std::to_string(v));
    rep.format_version = int(v);
    take(h, header_key::pid, rep.pid);
    take(h, header_key::ppid, rep.ppid);
    take(h, header_key::forked_from, rep.forked_from);
    take(h, header_key::host, rep.host);
    take(h, header_key::rank, rep.rank);
    take(h, header_key::start_time, rep.start_time);
    take(h, header_key::start_unix_ns, rep.start_unix_ns);
    take(h, header_key::gpumem_version, rep.gpumem_version);
    take(h, header_key::stacks_off, rep.stacks_off);
    take(h, header_key::alloc_ctx, rep.alloc_ctx);
    auto cmd = h.find(header_key::cmdline);
    if (cmd != h.end() && cmd->is_array())
        for (const json& a : *cmd)
            if (a.is_string()) rep.cmdline.push_back(a.get<std::string>());
    auto devs = h.find(header_key::devices);
    if (devs != h.end() && devs->is_array())
        for (const json& d : *devs) {
            if (!d.is_object()) continue;
            header_device hd;
            take(d, device_key::index, hd.index);
            take(d, device_key::name, hd.name);
            take(d, device_key::total, hd.total);
            rep.header_devices.push_back(hd);
        }
    auto cfg = h.find(header_key::config);
    if (cfg != h.end() && cfg->is_object()) {
        // A reader needs both to rebuild the layout (docs/log-format.md): a value it does not know
        // would rebuild a wrong one, which used to fail lines later on a block "already allocated".
        auto take_word = [&](const char* key, std::initializer_list<const char*> words, std::string& out) {
            auto it = cfg->find(key);
            if (it == cfg->end()) return;
            if (it->is_string())
                for (const char* w : words)
                    if (*it == w) {
                        out = w;
                        return;
                    }
            std::string expected;
            size_t i = 0;
            for (const char* w : words) {
                if (i) expected += i + 1 == words.size() ? " or " : ", ";
                expected += std::string("\"") + w + "\"";
                ++i;
            }
            throw input_error(path, 1, std::string("the header's config.") + key + " is " + it->dump() + ", expected " +
                                           expected + ": not a log this analyzer can rebuild (a newer gpumem's? use a newer gpumem)");
        };
        take_word(config_key::pool, {config_value::pool_on, config_value::pool_off}, rep.pool_mode);
        take_word(config_key::reuse, {config_value::reuse_auto, config_value::reuse_safe, config_value::reuse_immediate},
                  rep.reuse_mode);
        take(*cfg, "pool_vmm", rep.pool_vmm);  // one of the pool's settings (core/pool/pool_config.cc)
    }
}

// One pass over the file, opened as `source` (the spool of a pipe, or the path itself), reading at
// most `limit` bytes; returns the bytes it read.  The caller asks the rebuilder about a second pass.
uint64_t run_pass_from(const std::string& path, const std::string& source, process_report& rep, rebuilder& rp,
                       line_parser& parser, const analyze_options& opt, const char* pass_name, bool first_pass,
                       site_tracker* sites, uint64_t limit) {
    line_source src(source, limit);
    reading_meter meter(opt.progress, opt.progress_interval_s, path, pass_name);
    std::string_view line;
    bool complete = true;
    if (!src.next(line, complete))
        throw input_error(path, 0, "empty file: a gpumem log starts with a header line");
    read_header(line, complete, path, rep, opt.command);
    log_event e;
    std::string err;
    while (src.next(line, complete)) {
        uint64_t ln = src.line_number();
        meter.line(src);
        if (is_blank_line(line)) {
            if (first_pass && complete) rp.warn(ln, "blank line skipped");
            if (complete) continue;
        }
        parse_status st = parser.parse(line.data(), line.size(), src.capacity_from(line.data()), e, err);
        if (!complete) {
            // The writer was in the middle of the line: still writing it (a running job's log is
            // read as it stood when opened), or stopped there (killed, a full disk).  A line that
            // still parses only lost its newline.
            if (st != parse_status::ok) {
                rep.truncated_last_line = true;
                if (first_pass)
                    rp.warn(ln, "the last line is cut short (the log is still being written, or its writer stopped in "
                                "mid-line); ignored");
                break;
            }
            if (first_pass) rp.warn(ln, "the last line has no newline");
        }
        if (st == parse_status::not_json) {
            // Quote the start of the line: it usually shows at once what got into the log.
            std::string snippet(line.substr(0, 60));
            for (char& ch : snippet)
                if (static_cast<unsigned char>(ch) < 0x20) ch = '?';
            throw input_error(path, ln, err + ": " + snippet + (line.size() > 60 ? "..." : ""));
        }
        if (st != parse_status::ok) throw input_error(path, ln, err);
        if (e.known_kind && e.ev == ev_kind::stack) {
            // A stack record: not an event, so it never reaches the rebuild or the event count.
            if (!first_pass) continue;
            uint32_t id = 0;
            std::vector<frame_view> frames;
            if (!parse_stack_record(line, id, frames, err)) {
                rp.warn(ln, err + "; its allocations are shown without a stack");
                continue;
            }
            if (rep.stacks.find(id)) {
                rp.warn(ln, "stack " + std::to_string(id) + " is defined twice; the first record is kept");
                continue;
            }
            // A recorder writes at most 256 frames; far more is a hostile log, bounded here so that
            // its records cannot take memory without end.
            if (frames.size() > k_max_stack_frames) {
                rp.warn(ln, "stack " + std::to_string(id) + " has " + std::to_string(frames.size()) + " frames; the innermost " +
                                std::to_string(k_max_stack_frames) + " are kept");
                frames.resize(k_max_stack_frames);
            }
            if (!rep.stacks.add(id, std::move(frames)))
                rp.warn(ln, "stack " + std::to_string(id) + " is far beyond the " + std::to_string(rep.stacks.size()) +
                                " stacks defined so far (ids count up from 1); ignored");
            continue;
        }
        // A header here is a second log (header lines carry no seq or t): the log checker says so,
        // rather than this check calling it a header without the members events need.
        if (e.known_kind && e.ev != ev_kind::header && (line_parser::required_members(e) & ~e.present)) {
            std::string missing = line_parser::missing_members(e);
            if (!missing.empty())
                throw input_error(path, ln, std::string("\"") + k_ev_names[size_t(e.ev)] + "\" event without " + missing);
        }
        rp.apply(e, ln);  // an alloc_fail's OOM takes its stack there, by the same rule (metrics/oom_diagnosis.cc)
        if (sites && e.known_kind) {
            bool vmm = e.kind == mem_kind::vmm;
            // An allocation's stack, or a failed one's: an id no earlier record defines is said here,
            // once, and the call has no stack.
            const bool failed = e.ev == ev_kind::alloc_fail;
            uint32_t stack = 0;
            if ((e.ev == ev_kind::alloc && e.ptr) || failed) {
                stack = e.has(fd_stack) ? rep.stacks.defined(e.stack) : 0;
                if (e.has(fd_stack) && e.stack && !stack)
                    rp.warn(ln, std::string(failed ? "failed " : "") + "allocation names stack " + std::to_string(e.stack) +
                                    ", which no earlier stack record defines");
            }
            // The moments the report will ask the sites about, so far: the device's peak of
            // requested bytes (this event included) and the OOMs it lists.
            const device_report* d = nullptr;
            if ((e.ev == ev_kind::alloc && e.ptr) || e.ev == ev_kind::free || failed || e.ev == ev_kind::oom)
                d = rp.device_so_far(e.dev);
            const uint64_t peak_seq = d ? d->requested.peak_seq : UINT64_MAX;
            if (e.ev == ev_kind::alloc && e.ptr) {
                sites->on_alloc(e.seq, e.dev, e.ptr, vmm, e.size, stack, peak_seq);
            } else if (e.ev == ev_kind::free) {
                sites->on_free(e.seq, e.dev, e.ptr, vmm, peak_seq);
            } else if ((failed || e.ev == ev_kind::oom) && d && !d->ooms.empty() && d->ooms.back().seq == e.seq) {
                sites->on_oom(e.dev, e.seq);
            }
        }
    }
    rep.lines = src.line_number();
    rp.finish(src.line_number());
    return src.bytes_consumed();
}

uint64_t run_pass(const std::string& path, const std::string& source, process_report& rep, rebuilder& rp,
                  line_parser& parser, const analyze_options& opt, const char* pass_name, bool first_pass,
                  site_tracker* sites, uint64_t limit = UINT64_MAX) {
    try {
        return run_pass_from(path, source, rep, rp, parser, opt, pass_name, first_pass, sites, limit);
    } catch (const input_error& e) {
        if (e.file == path) throw;
        throw input_error(path, e.line, e.message);  // the reader named the spool; the user gave `path`
    }
}

}  // namespace

process_report analyze_file(const std::string& path, const analyze_options& opt, const std::string& open_path) {
    process_report rep;
    rep.file = path;
    line_parser parser;
    rebuild_options ro;
    ro.at = opt.at;
    ro.snapshot_budget_per_event = opt.snapshot_budget_per_event;
    ro.snapshot_budget_fixed = opt.snapshot_budget_fixed;
    ro.max_listed_leaks = opt.max_listed_leaks;
    rebuilder rp(rep, parser, ro);
    site_tracker sites;
    input_spool spool(open_path.empty() ? path : open_path);
    // The log as it stands now: one still being written is read up to its size at open (line_source).
    const uint64_t read = run_pass(path, spool.path(), rep, rp, parser, opt, "", true, &sites);
    if (!rep.has_end)
        rp.warn(0, "no end line: the process was killed (SIGKILL, OOM killer, lost node) or is still running; "
                   "the last flush interval of events may be missing", true);
    // Call sites missing for a reason of the recorder's, not the program's: said, so that "(no
    // stack)" is not read as a thread without Python frames.
    if (!rep.stacks_off.empty()) rp.warn(0, "no Python call stacks in this process: " + rep.stacks_off, true);
    if (rep.stacks_lost)
        rp.warn(0, fmt_counted(rep.stacks_lost, "allocation was", "allocations were") +
                       " recorded without their call stack: the recorder's stack table was full, or the "
                       "interpreter's frames could not be read",
                true);
    if (opt.at.kind != moment::by::none) {
        // --at copies the devices that had events by then; one whose first event comes later held
        // nothing and gets no map.  Said, so that a map asked for is not missing without a word.
        const std::string at = "--at " + (opt.at.kind == moment::by::seq ? "seq " + std::to_string(opt.at.value) : fmt_time(opt.at.value));
        if (rep.devices.empty()) rp.warn(0, at + ": the log has no device memory events, so there is no free-block map to show", true);
        for (const device_report& d : rep.devices)
            if (!d.at_request.valid)
                rp.warn(0, at + " comes before device " + std::to_string(d.dev) + "'s first event (at " + fmt_time(d.first_t) +
                               "): it held no memory then, so it has no free-block map", true);
    }
    if (rp.needs_second_pass()) {
        // The peak moved too often to copy the state at each new peak; rebuild up to it instead.
        process_report again;
        again.file = path;
        line_parser p2;
        rebuild_options r2;
        r2.peak_snapshot_seq = rp.peak_seqs();
        rebuilder rp2(again, p2, r2);
        // The same bytes as the first pass, though a log still being written has grown since.
        run_pass(path, spool.path(), again, rp2, p2, opt, " (peak pass)", false, nullptr, read);
        auto snaps = rp2.take_peak_snapshots();
        for (device_report& d : rep.devices) {
            auto it = snaps.find(d.dev);
            if (it != snaps.end()) d.at_peak = std::move(it->second);
        }
    }
    summarize_sites(rep, sites);
    symbolize_stacks(rep);
    return rep;
}

combined_report combine(const std::vector<process_report>& procs) {
    combined_report c;
    // An image that ended in exec, whose pid records again in another log: the same process
    // before its exec (docs/log-format.md), not a rank of its own to compare with the others.
    // Its later image has the same host, pid and parent and starts after it; a reused pid of an
    // unrelated process, which also ends the search, most often has another parent.
    std::map<std::tuple<std::string, int64_t, int64_t>, std::vector<uint64_t>> starts;  // (host, pid, ppid)
    for (const process_report& p : procs) starts[{p.host, p.pid, p.ppid}].push_back(p.start_unix_ns);
    auto before_exec = [&](size_t i) {
        const process_report& p = procs[i];
        if (!p.has_end || p.end_reason != "exec") return false;
        for (uint64_t s : starts[{p.host, p.pid, p.ppid}])
            if (s > p.start_unix_ns) return true;
        return false;
    };
    for (size_t i = 0; i < procs.size(); ++i) {
        if (before_exec(i)) continue;
        for (const device_report& d : procs[i].devices) {
            if (d.dev < 0) continue;  // host memory is not part of a rank's GPU budget
            c.rows.push_back({i, d.dev, d.requested.peak, d.allocated.peak, d.reserved.peak});
        }
    }
    if (c.rows.empty()) return c;
    c.min_peak_reserved = UINT64_MAX;
    double sum = 0;
    for (const combined_row& r : c.rows) {
        c.max_peak_reserved = std::max(c.max_peak_reserved, r.peak_reserved);
        c.min_peak_reserved = std::min(c.min_peak_reserved, r.peak_reserved);
        sum += double(r.peak_reserved);
    }
    c.mean_peak_reserved = sum / double(c.rows.size());
    c.imbalance = c.mean_peak_reserved > 0 ? double(c.max_peak_reserved) / c.mean_peak_reserved - 1.0 : 0.0;
    return c;
}

}  // namespace gpumem::analysis
