// Loads runs for `gpumem check` and `gpumem diff` (logs or report JSON) into the report model and
// parses the commands' size, number, ratio and --at arguments.
#include "cli_input.h"

#include "format_util.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>

#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "analyze.h"
#include "config.h"
#include "diagnostics.h"
#include "input_spool.h"
#include "log_fields.h"
#include "log_reader.h"
#include "output_file.h"
#include "report_json_read.h"

namespace gpumem::analysis {

bool parse_size_arg(const std::string& text, uint64_t& out) {
    uint64_t v = 0;
    if (!gpumem::parse_size(text.c_str(), &v)) return false;
    out = v;
    return true;
}

bool parse_number_arg(const std::string& text, double& out) {
    // The number of core/size_parse.h's rule, so that a size, a time, a ratio and a count are all
    // written alike: digits, optionally '.' and more digits.  strtod alone also took "1e2" (where a
    // size refused "1e3"), ".5", hex, "inf" and "nan".
    size_t i = 0;
    while (i < text.size() && std::isdigit((unsigned char)text[i])) ++i;
    if (i == 0) return false;
    if (i < text.size() && text[i] == '.') {
        const size_t fraction = ++i;
        while (i < text.size() && std::isdigit((unsigned char)text[i])) ++i;
        if (i == fraction) return false;  // "1." as the size rule: not a number
    }
    if (i != text.size()) return false;
    errno = 0;
    double v = std::strtod(text.c_str(), nullptr);
    if (errno || !std::isfinite(v)) return false;  // 400 digits: past a double
    out = v;
    return true;
}

namespace {

// "30%" or "30 %" -> "30" (a unit may stand after spaces, as a size's does: core/size_parse.h);
// false, leaving `t` as it was, without a '%'.
bool strip_percent(std::string& t) {
    if (t.empty() || t.back() != '%') return false;
    t.pop_back();
    while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.pop_back();
    return true;
}

}  // namespace

bool parse_ratio_arg(const std::string& text, double& out) {
    std::string t = text;
    double v = 0;
    if (strip_percent(t)) {
        if (!parse_number_arg(t, v) || v > 100) return false;
        out = v / 100;
        return true;
    }
    if (!parse_number_arg(t, v) || v > 1) return false;
    out = v;
    return true;
}

bool parse_percent_arg(const std::string& text, double& out) {
    std::string t = text;
    strip_percent(t);
    double v = 0;
    if (!parse_number_arg(t, v)) return false;
    out = v / 100;
    return true;
}

bool parse_moment(const std::string& text, moment& out) {
    std::string s = text;
    if (s.empty()) return false;
    if (s[0] == '#') s = s.substr(1);
    size_t i = 0;
    while (i < s.size() && (std::isdigit((unsigned char)s[i]) || s[i] == '.')) ++i;
    if (i == 0) return false;
    const std::string num = s.substr(0, i);
    // Spaces may stand between the number and its unit, as in a size ("3 us" as "1.5 GiB").
    size_t u = i;
    while (u < s.size() && (s[u] == ' ' || s[u] == '\t')) ++u;
    // In any letter case, as a size's unit ("2US" as "1gib").
    std::string unit = s.substr(u);
    for (char& c : unit) c = char(std::tolower((unsigned char)c));
    if (unit.empty()) {
        if (u != i || num.find('.') != std::string::npos) return false;  // "5 ", "1.5": no seq
        errno = 0;
        char* end = nullptr;
        unsigned long long v = std::strtoull(num.c_str(), &end, 10);
        if (errno || *end) return false;
        out = {moment::by::seq, v};
        return true;
    }
    double scale;
    if (unit == "s") scale = 1e9;
    else if (unit == "ms") scale = 1e6;
    else if (unit == "us") scale = 1e3;
    else if (unit == "ns") scale = 1;
    else return false;
    double v = 0;
    if (!parse_number_arg(num, v) || v * scale > 1.8e19) return false;
    out = {moment::by::time, uint64_t(std::round(v * scale))};  // below 2^64: llround stops at 2^63
    return true;
}

bool dash_means_stdin(const std::vector<std::string*>& paths, std::string& error) {
    int seen = 0;
    for (std::string* p : paths)
        if (*p == "-") {
            if (++seen > 1) {
                error = "- (standard input) is given more than once; it can be read only once (a file named - is ./-)";
                return false;
            }
            *p = "/dev/stdin";
        }
    return true;
}

bool dash_means_stdin(std::vector<std::string>& paths, std::string& error) {
    std::vector<std::string*> all;
    for (std::string& p : paths) all.push_back(&p);
    return dash_means_stdin(all, error);
}

std::string with_stdin_hint(std::string msg) {
    struct stat st {};
    if (::fstat(0, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISREG(st.st_mode) || S_ISSOCK(st.st_mode)))
        msg += "; to read standard input, pass -";
    return msg;
}

void drop_repeated_inputs(std::vector<std::string>& paths) {
    // One per kept input that exists: the file (device and inode) and its first name, kept[first].
    struct kept_file {
        dev_t dev;
        ino_t ino;
        size_t first;
    };
    std::vector<std::string> kept;
    std::vector<kept_file> files;
    for (std::string& p : paths) {
        struct stat st {};
        if (::stat(p.c_str(), &st) == 0) {
            const auto it = std::find_if(files.begin(), files.end(), [&st](const kept_file& f) {
                return f.dev == st.st_dev && f.ino == st.st_ino;
            });
            if (it != files.end()) {
                const std::string& first = kept[it->first];
                spdlog::warn("{}", first == p ? p + " is given more than once: read once"
                                              : p + " is the same file as " + first + ": read once");
                continue;
            }
            files.push_back({st.st_dev, st.st_ino, kept.size()});
        }
        kept.push_back(std::move(p));
    }
    paths = std::move(kept);
}

process_identity identity_of(const process_report& p) {
    process_identity id;
    id.host = p.host;
    id.rank = p.rank;
    id.pid = p.pid;
    id.start_unix_ns = p.start_unix_ns;
    return id;
}

bool same_process(const process_identity& a, const process_identity& b) {
    return a.start_unix_ns != 0 && a.host == b.host && a.pid == b.pid && a.start_unix_ns == b.start_unix_ns &&
           a.rank == b.rank;
}

bool same_job(const process_report& a, const process_report& b) {
    if (a.host != b.host || a.start_unix_ns == 0 || b.start_unix_ns == 0) return false;
    const bool siblings = a.ppid != 0 && a.ppid == b.ppid;
    const bool parent_and_child = (a.ppid != 0 && a.ppid == b.pid) || (b.ppid != 0 && b.ppid == a.pid);
    if (!siblings && !parent_and_child) return false;
    return a.start_unix_ns <= b.start_unix_ns + b.last_t && b.start_unix_ns <= a.start_unix_ns + a.last_t;
}

bool mixes_job_of(const run_input& side, const run_input& other, size_t& of, size_t& not_of) {
    bool got_of = false, got_not_of = false;
    for (size_t i = 0; i < side.processes.size(); ++i) {
        const process_report& p = side.processes[i];
        const bool in_job = std::any_of(other.processes.begin(), other.processes.end(), [&p](const process_report& o) {
            return same_job(p, o) || same_process(identity_of(p), identity_of(o));
        });
        if (in_job && !got_of) of = i, got_of = true;
        if (!in_job && !got_not_of) not_of = i, got_not_of = true;
    }
    return got_of && got_not_of;
}

std::string mixed_job_error(const run_input& side, const run_input& other, size_t of, size_t not_of,
                            const std::string& run, const std::string& owner) {
    const process_report& p = side.processes[of];
    // How it is of that run, said as mixes_job_of found it: the process itself, or same_job's sibling,
    // parent or child of one of its processes.
    std::string how;
    for (const process_report& o : other.processes)
        if (same_process(identity_of(p), identity_of(o))) {
            how = owner + " own process";
            break;
        }
    for (size_t i = 0; i < other.processes.size() && how.empty(); ++i) {
        const process_report& o = other.processes[i];
        if (!same_job(p, o)) continue;
        if (p.ppid != 0 && p.ppid == o.ppid)
            how = "a child of parent " + std::to_string(p.ppid) + " as " + owner + ", at the same time";
        else if (o.ppid == p.pid)
            how = "the parent of " + owner + " pid " + std::to_string(o.pid) + ", at the same time";
        else
            how = "a child of " + owner + " pid " + std::to_string(o.pid) + ", at the same time";
    }
    return side.source[of] + " holds a process of " + run + " (rank " + p.rank + ", pid " + std::to_string(p.pid) + " on " +
           p.host + ", " + how + "), and " + side.source[not_of] + " one of another run";
}

namespace {

// What line 1 of a regular file says of its process, for drop_copies_of_one_log.
struct log_identity : process_identity {
    bool known = false;  // a gpumem header with a host, a pid and a start
    std::string start;   // start_time, for messages
    std::string header;  // line 1, whole
    uint64_t size = 0;  // the file's, when looked at: a log still being written is compared so far
};

log_identity identity_of(const std::string& path) {
    log_identity id;
    struct stat st {};
    const std::string in = readable_path(path);  // a pipe: its spool (pipe_spools)
    if (::stat(in.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return id;
    std::ifstream f(in, std::ios::binary);
    // A header is some hundreds of bytes; a command line of thousands of arguments makes it longer.
    constexpr size_t k_max_header = size_t(1) << 20;
    std::string line;
    char buf[65536];
    while (f && line.size() < k_max_header && line.find('\n') == std::string::npos) {
        f.read(buf, sizeof buf);
        line.append(buf, size_t(f.gcount()));
    }
    const size_t nl = line.find('\n');
    if (nl == std::string::npos) return id;  // no whole line 1: the analysis says what is wrong
    line.resize(nl);
    const nlohmann::json h = nlohmann::json::parse(line, nullptr, false);
    if (!h.is_object()) return id;
    auto is = [&h](const char* key, const char* value) {
        auto it = h.find(key);
        return it != h.end() && it->is_string() && *it == value;
    };
    if (!is(k_log_fields[size_t(log_field::ev)].name, k_ev_names[size_t(ev_kind::header)]) ||
        !is(header_key::format, k_format_name))
        return id;
    auto host = h.find(header_key::host), pid = h.find(header_key::pid), start = h.find(header_key::start_unix_ns);
    if (host == h.end() || !host->is_string() || pid == h.end() || !pid->is_number_integer() || start == h.end() ||
        !start->is_number_unsigned() || start->get<uint64_t>() == 0)
        return id;
    id.known = true;
    id.header = line;
    id.host = host->get<std::string>();
    id.pid = pid->get<int64_t>();
    id.start_unix_ns = start->get<uint64_t>();
    if (auto rank = h.find(header_key::rank); rank != h.end() && rank->is_string()) id.rank = rank->get<std::string>();
    auto time = h.find(header_key::start_time);
    id.start = time != h.end() && time->is_string() ? time->get<std::string>() : std::to_string(id.start_unix_ns) + " ns";
    id.size = uint64_t(st.st_size);
    return id;
}

// Whether the first `n` bytes of files a and b are the same; if not, `line` is the line of a where
// they first differ (1 is the first).  A file shorter than `n` now (cut since it was looked at)
// differs where it ends.
bool same_start(const std::string& a, const std::string& b, uint64_t n, uint64_t& line) {
    std::ifstream fa(readable_path(a), std::ios::binary), fb(readable_path(b), std::ios::binary);
    std::vector<char> ba(size_t(1) << 20), bb(ba.size());
    line = 1;
    for (uint64_t done = 0; done < n;) {
        const size_t want = size_t(std::min<uint64_t>(n - done, ba.size()));
        fa.read(ba.data(), std::streamsize(want));
        fb.read(bb.data(), std::streamsize(want));
        const size_t ga = size_t(fa.gcount()), gb = size_t(fb.gcount());
        const size_t same = size_t(std::mismatch(ba.begin(), ba.begin() + std::min(ga, gb), bb.begin()).first - ba.begin());
        line += uint64_t(std::count(ba.begin(), ba.begin() + same, '\n'));
        if (same < want) return false;
        done += want;
    }
    return true;
}

// The processes a `gpumem report --json` file holds, each as a log's header would name it (host, pid,
// start, rank), for drop_copies_of_one_log; `is_report` says whether it is one, `size` its size.  A
// process without a start (a hand-made log's 0) names none; a report that does not parse holds none
// (its reader says what is wrong).
std::vector<log_identity> report_processes(const std::string& path, bool& is_report, uint64_t& size) {
    std::vector<log_identity> out;
    const std::string in = readable_path(path);  // a pipe: its spool (pipe_spools)
    struct stat st {};
    is_report = ::stat(in.c_str(), &st) == 0 && S_ISREG(st.st_mode) && looks_like_report_json(in);
    if (!is_report) return out;
    size = uint64_t(st.st_size);
    std::ifstream f(in, std::ios::binary);
    const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
    auto procs = j.is_object() ? j.find("processes") : j.end();
    if (!j.is_object() || procs == j.end() || !procs->is_array()) return out;
    for (const nlohmann::json& p : *procs) {
        if (!p.is_object()) continue;
        auto host = p.find("host"), pid = p.find("pid"), start = p.find("start_unix_ns");
        if (host == p.end() || !host->is_string() || pid == p.end() || !pid->is_number_integer() || start == p.end() ||
            !start->is_number_unsigned() || start->get<uint64_t>() == 0)
            continue;
        log_identity id;
        id.known = true;
        id.host = host->get<std::string>();
        id.pid = pid->get<int64_t>();
        id.start_unix_ns = start->get<uint64_t>();
        if (auto rank = p.find("rank"); rank != p.end() && rank->is_string()) id.rank = rank->get<std::string>();
        auto time = p.find("start_time");
        id.start = time != p.end() && time->is_string() ? time->get<std::string>() : std::to_string(id.start_unix_ns) + " ns";
        out.push_back(std::move(id));
    }
    return out;
}

// "the log of process 1001 on ci01, started 2026-11-30T03:40:00.000000000Z", for messages.
std::string process_named(const log_identity& id) {
    return "the log of process " + std::to_string(id.pid) + " on " + id.host + ", started " + id.start;
}

}  // namespace

input_sameness same_input(const std::string& a, const std::string& b, std::string& process) {
    struct stat sa {}, sb {};
    if (::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0) return input_sameness::none;
    if (sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino) return input_sameness::same_file;
    // A pipe is compared by its spool (pipe_spools), or not at all: reading it here would drain it.
    if (::stat(readable_path(a).c_str(), &sa) != 0 || ::stat(readable_path(b).c_str(), &sb) != 0 ||
        !S_ISREG(sa.st_mode) || !S_ISREG(sb.st_mode))
        return input_sameness::none;
    uint64_t line = 0;
    if (sa.st_size == sb.st_size && same_start(a, b, uint64_t(sa.st_size), line)) return input_sameness::same_bytes;
    const log_identity ia = identity_of(a), ib = identity_of(b);
    if (!ia.known || !ib.known || ia.header != ib.header) return input_sameness::none;
    const bool a_shorter = ia.size <= ib.size;
    if (!same_start(a_shorter ? a : b, a_shorter ? b : a, a_shorter ? ia.size : ib.size, line)) return input_sameness::none;
    process = process_named(ia);
    return input_sameness::one_log;
}

bool drop_copies_of_one_log(std::vector<std::string>& paths, pipe_spools& spools, const progress_flags& progress,
                            std::string& error) {
    // One input has nothing to be compared with: a lone pipe is left to its reader (replay streams it).
    if (paths.size() < 2) return true;
    if (!spools.add(paths, progress.wanted(), progress.every_s, error)) return false;
    std::vector<log_identity> ids;
    for (const std::string& p : paths) ids.push_back(identity_of(p));
    // The recorder writes line 1 once, so every copy of a log has the same one (and names one process).
    auto copies_of_one = [&ids](size_t a, size_t b) {
        return ids[a].known && ids[b].known && ids[a].header == ids[b].header && same_process(ids[a], ids[b]);
    };
    std::vector<bool> seen(paths.size()), drop(paths.size());
    std::vector<size_t> kept_files;  // the file read of each set of copies
    for (size_t i = 0; i < paths.size(); ++i) {
        if (!ids[i].known || seen[i]) continue;
        std::vector<size_t> copies;
        for (size_t j = i; j < paths.size(); ++j)
            if (copies_of_one(i, j)) {
                copies.push_back(j);
                seen[j] = true;
            }
        size_t keep = i;  // the longest; of equal ones the first given
        for (size_t j : copies)
            if (ids[j].size > ids[keep].size) keep = j;
        kept_files.push_back(keep);
        const std::string process = process_named(ids[i]);
        for (size_t j : copies) {
            if (j == keep) continue;
            uint64_t line = 0;
            if (!same_start(paths[j], paths[keep], ids[j].size, line)) {
                error = visible(paths[j] + " and " + paths[keep] + " both hold " + process + ", but differ from line " +
                                std::to_string(line) + " on: one of them was edited or damaged, and which to read "
                                "cannot be told; give one of them");
                return false;
            }
            spdlog::warn("{}", paths[j] + (ids[j].size == ids[keep].size ? " is a copy of " : " is a shorter copy of ") +
                               paths[keep] + " (" + process + "): read once, from " + paths[keep]);
            drop[j] = true;
        }
    }
    // Headers that differ but name one process: two processes that share these three (pid
    // namespaces under one host name, and a clock too coarse to part them), or logs made by hand.
    // Read as two, as they are; said, as copies would double the totals.  A rank that differs is
    // among what differs in them (hand-edited ones), so it does not part them here.
    for (size_t a = 0; a < kept_files.size(); ++a)
        for (size_t b = a + 1; b < kept_files.size(); ++b) {
            const log_identity& id = ids[kept_files[a]];
            process_identity other = ids[kept_files[b]];
            other.rank = id.rank;
            if (same_process(id, other))
                spdlog::warn("{}", paths[kept_files[b]] + " and " + paths[kept_files[a]] + " both name process " +
                                   std::to_string(id.pid) + " on " + id.host + ", started " + id.start +
                                   ", in headers that differ: read as two processes");
        }
    // Report JSON files, which no line 1 names: two of the same bytes are one, read once; one that
    // holds a process another input holds too (a log globbed beside the report made from it, the
    // reports of two overlapping sets of logs) would read it twice, as "rank 0#2", and a report
    // cannot be compared with a log: which to read cannot be told.
    std::vector<std::vector<log_identity>> held(paths.size());  // the processes each input holds
    std::vector<bool> report(paths.size());
    std::vector<uint64_t> size(paths.size());  // a report's
    for (size_t i = 0; i < paths.size(); ++i) {
        bool is_report = false;
        held[i] = ids[i].known ? std::vector<log_identity>{ids[i]} : report_processes(paths[i], is_report, size[i]);
        report[i] = is_report;
    }
    for (size_t b = 0; b < paths.size(); ++b)
        for (size_t a = 0; a < b && report[b] && !drop[b]; ++a) {
            uint64_t line = 0;
            if (!report[a] || drop[a] || size[a] != size[b] || !same_start(paths[a], paths[b], size[a], line)) continue;
            spdlog::warn("{}", paths[b] + " is a copy of " + paths[a] + " (the same bytes): read once, from " + paths[a]);
            drop[b] = true;
        }
    for (size_t a = 0; a < paths.size(); ++a)
        for (size_t b = a + 1; b < paths.size(); ++b) {
            if (drop[a] || drop[b] || (!report[a] && !report[b])) continue;
            for (const log_identity& x : held[a])
                for (const log_identity& y : held[b])
                    if (same_process(x, y)) {
                        error = visible(paths[a] + " and " + paths[b] + " both hold process " + std::to_string(x.pid) + " on " +
                                        x.host + ", started " + x.start + "; a report JSON is not compared with a log or "
                                        "another report, so which to read cannot be told: give one of them");
                        return false;
                    }
        }
    std::vector<std::string> kept;
    for (size_t i = 0; i < paths.size(); ++i)
        if (!drop[i]) kept.push_back(std::move(paths[i]));
    paths = std::move(kept);
    return true;
}

std::string other_gpu(const run_input& run, const device_ref& r, const run_input& owner_run, const device_ref& o,
                      const std::string& owner, const std::string& here, const std::string& there) {
    const device_report &d = run.dev(r), &od = owner_run.dev(o);
    const bool has_total = run.has(r, device_field::total_bytes) && owner_run.has(o, device_field::total_bytes) &&
                           d.total != 0 && od.total != 0;
    const bool other_name = !d.name.empty() && !od.name.empty() && d.name != od.name;
    // In 128 bits: a total near 2^64 (a hand-edited report) must not wrap the comparison.
    const uint64_t larger = std::max(d.total, od.total), gap = larger - std::min(d.total, od.total);
    const bool other_size = has_total && (unsigned __int128)gap * 100 > (unsigned __int128)larger * k_other_gpu_size_share;
    if (!other_name && !other_size) return "";
    auto gpu = [](const device_report& x) {
        return (x.name.empty() ? std::string("an unnamed GPU") : x.name) + (x.total ? " (" + fmt_bytes(x.total) + ")" : "");
    };
    return "ran on another GPU than " + owner + "'s: " + gpu(d) + " " + here + ", " + gpu(od) + " " + there +
           ": its memory use may differ for that alone";
}

std::vector<std::string> warning_lines(const process_report& p, const std::string& path) {
    // Logged, so their control characters are shown made visible (diagnostics.cc): a warning names
    // its log, and one read back from a report JSON is whatever text the file held.
    std::vector<std::string> lines(p.warnings.begin(), p.warnings.end());
    if (p.n_warnings > p.warnings.size())
        lines.push_back(path + ": " + fmt_counted(p.n_warnings - p.warnings.size(), "more warning", "more warnings") +
                        " not shown");
    return lines;
}

bool output_would_clobber(const std::string& out, const char* option, const std::vector<std::string>& inputs,
                          std::string& why) {
    // "-" reads standard input everywhere else; as an output it would be a file named "-" in the
    // working directory, and standard output already carries the command's own text.
    if (out == "-") {
        why = std::string(option) + " -: give a file name (standard output carries the command's own output)";
        return true;
    }
    struct stat o {};
    if (out.empty()) return false;
    // What the write at the end would refuse (file_replacement, same words), said before the whole
    // analysis runs rather than after it: on a log of gigabytes that is minutes lost.
    if (::stat(out.c_str(), &o) != 0) {
        if (errno == ENOENT) {
            // New, or a link to a file not there yet: file_replacement creates it in the folder of
            // the name the links lead to, which must be there and writable, as for `>`.
            const std::string target = output_target(out);
            const size_t slash = target.rfind('/');
            const std::string dir = slash == std::string::npos ? "." : target.substr(0, slash + 1);
            if (::access(dir.c_str(), W_OK | X_OK) == 0) return false;
            why = std::string(option) + " " + out + ": cannot create a file in " + dir + ": " + std::strerror(errno);
            return true;
        }
        why = std::string(option) + " " + out + ": cannot write: " + std::strerror(errno);
        return true;
    }
    if (S_ISDIR(o.st_mode)) {
        why = std::string(option) + " " + out + ": is a directory; not written";
        return true;
    }
    if (!S_ISREG(o.st_mode)) return false;  // a device or a pipe: written through
    for (const std::string& in : inputs) {
        struct stat i {};
        if (::stat(in.c_str(), &i) == 0 && i.st_dev == o.st_dev && i.st_ino == o.st_ino) {
            why = std::string(option) + " " + out + ": is also an input";
            return true;
        }
    }
    std::ifstream f(out, std::ios::binary);
    char buf[256];
    f.read(buf, sizeof buf);
    const std::string head(buf, size_t(f.gcount()));
    const std::string first_line = head.substr(0, head.find('\n'));
    const char* packed = compression_of(head);  // a log kept compressed, as tests/data keeps them
    const bool log = first_line.find("\"ev\":\"header\"") != std::string::npos ||
                     first_line.find(std::string("\"") + k_format_name + "\"") != std::string::npos;
    const bool report = head.find("\"schema\": \"gpumem-report\"") != std::string::npos ||
                        head.find("\"schema\":\"gpumem-report\"") != std::string::npos;
    if (!packed && !log && !report) return false;
    why = std::string(option) + " " + out + ": holds a gpumem " +
          (report ? "report" : packed ? std::string(packed) + "-compressed file (a log?)" : "log") + ", which " + option +
          " would overwrite (did it take an input as its FILE? give " + option + " a new file's name)";
    return true;
}

bool load_run(const std::vector<std::string>& paths, run_input& out, std::string& error, const progress_flags& progress,
              const char* command) {
    try {
        for (const std::string& path : paths) {
            // A pipe is read once, into a file both reads below can open.
            input_spool in(path, progress.wanted(), progress.every_s);
            if (looks_like_report_json(in.path())) {
                spdlog::debug("{}: reading as a `gpumem report --json` file", path);
                report_file r = read_report_json(path, in.path());
                for (size_t i = 0; i < r.processes.size(); ++i) {
                    for (const std::string& w : warning_lines(r.processes[i], r.processes[i].file)) spdlog::warn("{}", w);
                    out.processes.push_back(std::move(r.processes[i]));
                    out.fields.push_back(std::move(r.fields[i]));
                    out.source.push_back(path);
                }
                continue;
            }
            spdlog::debug("{}: reading as an event log", path);
            analyze_options opt;
            opt.progress = progress.wanted();
            opt.progress_interval_s = progress.every_s;
            opt.command = command;
            out.processes.push_back(analyze_file(path, opt, in.path()));
            for (const std::string& w : warning_lines(out.processes.back(), path)) spdlog::warn("{}", w);
            out.fields.emplace_back(out.processes.back().devices.size(), device_fields_read{device_fields_present().set(), {}, {}});
            out.source.push_back(path);
        }
        // Occurrence numbers for processes with a GPU that share a rank, in start order.
        std::vector<size_t> order(out.processes.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
            const process_report &pa = out.processes[a], &pb = out.processes[b];
            if (pa.rank != pb.rank) return pa.rank < pb.rank;
            return pa.start_unix_ns < pb.start_unix_ns;
        });
        // A rank is named bare when it is plain ([A-Za-z0-9_.-], as RANK always is), else in quotes:
        // an empty rank is "?", so a rank of "?" or "0#2" (a tool's, or an edit) cannot take
        // another process's key, whose GPU diff and check would then silently overwrite.
        auto rank_name = [](const std::string& rank) -> std::string {
            if (rank.empty()) return "?";
            bool plain = true;
            for (unsigned char c : rank) plain &= std::isalnum(c) || c == '_' || c == '.' || c == '-';
            return plain ? rank : "\"" + rank + "\"";  // control characters: shown by visible() as ^X
        };
        std::map<std::string, int> seen;
        for (size_t i : order) {
            const process_report& p = out.processes[i];
            // Only a process with a GPU takes a number: one with none (pinned host memory alone, a log
            // cut before its first allocation) has nothing to match, and numbered it made the GPU
            // process after it "rank 0#2", missing from a baseline that holds it as "rank 0".
            if (std::none_of(p.devices.begin(), p.devices.end(), [](const device_report& d) { return d.dev >= 0; }))
                continue;
            int occ = seen[p.rank]++;
            std::string proc_key = "rank " + rank_name(p.rank) + (occ ? "#" + std::to_string(occ + 1) : "");
            for (size_t d = 0; d < p.devices.size(); ++d) {
                if (p.devices[d].dev < 0) continue;  // host memory: not what the GPU gates are about
                device_ref r;
                r.process = i;
                r.device = d;
                r.key = proc_key + " dev " + std::to_string(p.devices[d].dev);
                r.where = visible(r.key + " (pid " + std::to_string(p.pid) + ", " + p.file + ")");
                out.devices.push_back(std::move(r));
            }
        }
        std::sort(out.devices.begin(), out.devices.end(),
                  [](const device_ref& a, const device_ref& b) { return a.key < b.key; });
        // Still two of one key: one process listing a GPU twice (a report JSON edited by hand).
        for (size_t k = 1; k < out.devices.size(); ++k)
            if (out.devices[k].key == out.devices[k - 1].key) {
                error = out.devices[k].where + ": " + out.devices[k].key + " appears twice (one process lists this GPU twice?)";
                return false;
            }
        return true;
    } catch (const input_error& e) {
        error = e.what();
        return false;
    } catch (const std::exception& e) {
        // bad_alloc or anything unforeseen in a hand-edited report: unusable input, not a crash.
        error = std::string("cannot read the input: ") + e.what();
        return false;
    }
}

}  // namespace gpumem::analysis
