// `gpumem replay`: replays the allocation requests of logs through simulated allocators (analyzer/simulate/) and reports what each would have reserved.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli_input.h"
#include "commands.h"
#include "diagnostics.h"
#include "format_util.h"
#include "log_reader.h"
#include "parallel.h"
#include "simulate/policy.h"
#include "simulate/pytorch_config.h"
#include "simulate/replay.h"
#include "simulate/trace.h"

namespace gpumem::analysis {

namespace {

namespace sim = gpumem::simulate;
using ojson = nlohmann::ordered_json;

struct replay_args {
    std::vector<std::string> logs;
    std::vector<std::string> policies;  // as given, each possibly holding several
    std::vector<std::string> apis;
    std::string capacity_text;
    bool json = false;
    bool suggest = false;
    unsigned jobs = 0;
    progress_flags progress;
};

const char* k_default_policies[] = {"ideal", "pytorch", "pytorch-expandable", "gpumem"};

// A device size for checking a policy's options before any log is read (any nonzero size will do).
constexpr uint64_t k_any_device = uint64_t(80) << 30;

// "--policy pytorch:max_split_size_mb:64,roundup_power2_divisions:4,gpumem": a comma starts a new
// policy only where a policy name follows; otherwise it belongs to the options before it.
std::vector<std::string> split_policies(const std::vector<std::string>& given) {
    std::vector<std::string> out;
    auto starts_policy = [](const std::string& s) {
        std::string base = s.substr(0, s.find(':'));
        return base == "ideal" || base == "pytorch" || base == "pytorch-expandable" || base == "gpumem";
    };
    for (const std::string& g : given) {
        size_t pos = 0;
        std::string cur;
        while (pos <= g.size()) {
            size_t comma = g.find(',', pos);
            std::string piece = g.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
            if (cur.empty()) cur = piece;
            else if (starts_policy(piece)) {
                out.push_back(cur);
                cur = piece;
            } else {
                cur += "," + piece;
            }
            if (comma == std::string::npos) break;
            pos = comma + 1;
        }
        if (!cur.empty()) out.push_back(cur);
    }
    return out;
}

// The configurations --suggest tries: every combination of the options that change the layout.
// garbage_collection_threshold is not among them: it acts only under per_process_memory_fraction
// below 1, a cap on the program that a suggestion must not slip in.
std::vector<sim::pt_config> suggest_grid() {
    std::vector<sim::pt_config> grid;
    const uint64_t mss_mb[] = {0, 32, 64, 128, 256, 512, 1024};
    const uint64_t divs[] = {0, 2, 4, 8, 16};
    for (bool exp : {false, true})
        for (uint64_t m : mss_mb)
            for (uint64_t d : divs) {
                sim::pt_config c;
                c.expandable = exp;
                if (m) c.max_split_size = m << 20;
                c.roundup_divisions.fill(d);
                grid.push_back(c);
            }
    return grid;
}

struct device_job {
    size_t log = 0;
    const sim::device_trace* dev = nullptr;
    std::vector<sim::replay_result> results;  // one per policy, in --policy order
    std::vector<sim::replay_result> grid;     // --suggest: one per suggest_grid() entry
    std::vector<std::string> grid_confs;
};

struct task {
    device_job* job;
    bool grid;
    size_t index;
    std::string name;
    sim::policy_spec spec;
};

std::string moment(uint64_t seq, uint64_t t) { return "#" + std::to_string(seq) + " at " + fmt_time(t); }

// note: sim::policy_note's, for this policy ("" for none).
ojson result_json(const sim::replay_result& r, uint64_t capacity, const std::string& note = {}) {
    ojson j;
    j["policy"] = r.policy;
    if (!note.empty()) j["note"] = note;
    j["peak_reserved_bytes"] = r.peak_reserved;
    j["peak_seq"] = r.peak_seq;
    j["peak_t_ns"] = r.peak_t;
    j["peak_allocated_bytes"] = r.peak_allocated;
    j["segments"] = r.driver_allocs;
    j["segment_frees"] = r.driver_frees;
    j["peak_fragmentation"] = r.peak_fragmentation;
    j["peak_fragmentation_seq"] = r.frag_seq;
    j["peak_fragmentation_free_bytes"] = r.frag_free;
    j["events"] = r.events;
    if (capacity) j["fits"] = r.failure == sim::failure_reason::none;
    // In every mode: a replay that stopped early (a request larger than any device stops it even
    // without --capacity) must not read as a complete one.
    if (r.failure != sim::failure_reason::none) {
        j["failure"] = {{"seq", r.fail_seq},
                        {"t_ns", r.fail_t},
                        {"size", r.fail_size},
                        {"reason", sim::k_failure_reason_names[size_t(r.failure)]},
                        {"reserved_bytes", r.fail_reserved},
                        {"free_in_segments_bytes", r.fail_free_in_segments},
                        {"largest_free_bytes", r.fail_largest_free}};
    }
    return j;
}

// What `best` saves against the defaults, as --suggest prints it ("-9.3%"); "" where that is
// nothing at the printed precision: a setting that saves nothing visible is no advice to change
// one (one driver call fewer made roundup_power2_divisions:16,expandable_segments:True the
// suggestion at the same peak, and 2 MiB less of 40 GiB printed "-0.0%").  The defaults must have
// served every request: a stopped replay's peak is no footprint to measure a saving against.
std::string saving_text(const sim::replay_result& best, const sim::replay_result& def) {
    if (def.failure != sim::failure_reason::none || best.peak_reserved >= def.peak_reserved) return "";
    std::string pct = fmt_pct(1.0 - double(best.peak_reserved) / double(def.peak_reserved));
    return pct == fmt_pct(0) ? "" : "-" + pct;
}

// The grid's best (the grid starts with the defaults): the least peak reserved among the runs that
// fit, then the fewest driver calls, then the fewest options; the defaults unless they stopped or
// it saves something visible (saving_text), for the text and --json alike.
size_t best_of(const device_job& d) {
    size_t best = 0;
    auto key = [&](size_t i) {
        const auto& r = d.grid[i];
        return std::make_tuple(r.failure != sim::failure_reason::none, r.peak_reserved, r.driver_allocs,
                               d.grid_confs[i].size());
    };
    for (size_t i = 1; i < d.grid.size(); ++i)
        if (key(i) < key(best)) best = i;
    if (d.grid[0].failure == sim::failure_reason::none && saving_text(d.grid[best], d.grid[0]).empty()) return 0;
    return best;
}

// notes: sim::policy_note's per log, then per policy in --policy order (as each job's results).
void print_text(const std::vector<sim::trace>& traces, const std::vector<device_job>& jobs, uint64_t capacity,
                bool suggest, const std::vector<std::vector<std::string>>& notes_by_log) {
    for (const device_job& d : jobs) {
        const sim::trace& tr = traces[d.log];
        const std::vector<std::string>& notes = notes_by_log[d.log];
        const sim::device_trace& dt = *d.dev;
        std::printf("== %s: device %d\n", visible(tr.file).c_str(), dt.dev);
        std::string apis;
        for (const std::string& a : tr.apis) apis += (apis.empty() ? "" : ", ") + a;
        std::printf("   %s and %s replayed (%s)", fmt_counted(dt.n_alloc, "allocation", "allocations").c_str(),
                    fmt_counted(dt.n_free, "free", "frees").c_str(), apis.c_str());
        if (tr.skipped_allocs)
            std::printf("; %s of other APIs left out", fmt_counted(tr.skipped_allocs, "allocation", "allocations").c_str());
        if (tr.skipped_managed)
            std::printf("; %s left out", fmt_counted(tr.skipped_managed, "managed allocation", "managed allocations").c_str());
        if (tr.skipped_vmm)
            std::printf("; %s left out", fmt_counted(tr.skipped_vmm, "cuMemCreate allocation", "cuMemCreate allocations").c_str());
        std::printf("\n");
        if (dt.n_streams == 0)
            std::printf("   streams: the log names none (cudaMalloc and cuMemAlloc have no stream): modelled as one stream\n");
        else if (dt.n_no_stream)
            std::printf("   streams: %llu named; %s none and share one more\n", (unsigned long long)dt.n_streams,
                        fmt_counted(dt.n_no_stream, "allocation names", "allocations name").c_str());
        else
            std::printf("   streams: %llu, each with its own free blocks\n", (unsigned long long)dt.n_streams);
        if (dt.n_freed_twice)
            std::printf("   note: %s allocated again without a recorded free; counted as freed\n",
                        fmt_counted(dt.n_freed_twice, "address was", "addresses were").c_str());
        // The policy column fits the longest name given ("pytorch:max_split_size_mb:128,roundup_...")
        // so that the columns after it stay under their headings.
        // Likewise the driver column fits its widest "allocs/frees" (1,234,567/1,234,567 is 19 wide),
        // and at least its heading, which names both counts (under "driver allocs" alone, 42/17
        // read as a fraction).
        int pw = 34, dw = 20;
        auto driver_calls = [](const sim::replay_result& r) {
            return fmt_count(r.driver_allocs) + "/" + fmt_count(r.driver_frees);
        };
        for (const sim::replay_result& r : d.results) {
            pw = std::max(pw, int(std::min<size_t>(r.policy.size(), 200)));
            dw = std::max(dw, int(driver_calls(r).size()));
        }
        std::printf("   %-*s %-26s %-24s %-*s %s\n", pw, "policy", "peak reserved", "at", dw, "driver allocs/frees",
                    "peak ext. frag.");
        for (size_t ri = 0; ri < d.results.size(); ++ri) {
            const sim::replay_result& r = d.results[ri];
            // With the free bytes it is of: 50% of 1 KiB free is no 50% of 70 MiB.
            std::string frag = r.peak_fragmentation > 0 ? fmt_pct(r.peak_fragmentation) + " of " + fmt_bytes(r.frag_free) +
                                                              " at #" + std::to_string(r.frag_seq)
                                                        : "0";
            std::printf("   %-*s %-26s %-24s %-*s %s\n", pw, r.policy.c_str(),
                        (fmt_bytes(r.peak_reserved) + " (" + std::to_string(r.peak_reserved) + ")").c_str(),
                        r.events ? moment(r.peak_seq, r.peak_t).c_str() : "-", dw, driver_calls(r).c_str(), frag.c_str());
            if (ri < notes.size() && !notes[ri].empty()) std::printf("   %-*s ^ note: %s\n", pw, "", notes[ri].c_str());
            // Every stop is printed, with or without --capacity: the numbers above cover only the
            // requests before it.
            if (r.failure == sim::failure_reason::too_large)
                std::printf("   %-*s ^ stopped at %s: the request of %s (%llu bytes) is larger than any device "
                            "(above %s); the replay ends there\n",
                            pw, "", moment(r.fail_seq, r.fail_t).c_str(), fmt_bytes(r.fail_size).c_str(),
                            (unsigned long long)r.fail_size, fmt_bytes(sim::k_max_replay_request).c_str());
            else if (r.failure == sim::failure_reason::too_much)
                std::printf("   %-*s ^ stopped at %s: the request of %s would make it reserve %llu bytes, more than any "
                            "device holds (above %s); the replay ends there\n",
                            pw, "", moment(r.fail_seq, r.fail_t).c_str(), fmt_bytes(r.fail_size).c_str(),
                            (unsigned long long)r.fail_reserved, fmt_bytes(sim::k_max_replay_reserved).c_str());
            else if (r.failure != sim::failure_reason::none)
                std::printf("   %-*s ^ would fail at %s: %s of %s (%s reserved, %s free in segments, largest free %s)\n",
                            pw, "", moment(r.fail_seq, r.fail_t).c_str(), sim::k_failure_reason_names[size_t(r.failure)],
                            fmt_bytes(r.fail_size).c_str(), fmt_bytes(r.fail_reserved).c_str(),
                            fmt_bytes(r.fail_free_in_segments).c_str(), fmt_bytes(r.fail_largest_free).c_str());
            // A free block that would hold the request in bytes, yet did not: it lies where the
            // allocator keeps other sizes, which "largest free" alone would contradict.
            if (r.failure == sim::failure_reason::fragmentation && r.fail_largest_free >= r.fail_size)
                std::printf("   %-*s ^ the free blocks that large are of a kind this request may not take: they belong to "
                            "another stream, or requests up to 1 MiB and larger ones never share a segment (PyTorch "
                            "and gpumem), or PyTorch splits no block above max_split_size_mb for a smaller request\n",
                            pw, "");
        }
        if (capacity) {
            std::string fits, fails;
            for (const sim::replay_result& r : d.results)
                (r.failure == sim::failure_reason::none ? fits : fails) += (std::string(" ") + r.policy);
            std::printf("   with %s: fits:%s%s%s\n", fmt_bytes(capacity).c_str(), fits.empty() ? " none" : fits.c_str(),
                        fails.empty() ? "" : "; fails:", fails.c_str());
        }
        if (suggest && !d.grid.empty()) {
            size_t b = best_of(d);
            const sim::replay_result& best = d.grid[b];
            const sim::replay_result& def = d.grid[0];  // the grid starts with the defaults
            std::printf("   suggestion (least peak reserved of %zu PyTorch settings%s):\n", d.grid.size(),
                        capacity ? " that fit" : "");
            // A replay that stopped has a peak of the requests before the stop only: it is no
            // footprint to beat or to measure a saving against.
            if (best.failure != sim::failure_reason::none && capacity)
                std::printf("     no setting fits in %s\n", fmt_bytes(capacity).c_str());
            else if (best.failure != sim::failure_reason::none)
                std::printf("     no setting serves every request\n");
            else if (d.grid_confs[b].empty())
                std::printf("     the defaults: no PYTORCH_CUDA_ALLOC_CONF beats them (%s)\n", fmt_bytes(def.peak_reserved).c_str());
            else if (def.failure != sim::failure_reason::none)
                std::printf("     PYTORCH_CUDA_ALLOC_CONF=%s\n     peak reserved %s, where the defaults %s at %s (%s)\n",
                            d.grid_confs[b].c_str(), fmt_bytes(best.peak_reserved).c_str(),
                            capacity ? ("do not fit in " + fmt_bytes(capacity) + ": they fail").c_str() : "stop",
                            moment(def.fail_seq, def.fail_t).c_str(), sim::k_failure_reason_names[size_t(def.failure)]);
            else
                std::printf("     PYTORCH_CUDA_ALLOC_CONF=%s\n     peak reserved %s, against %s with the defaults (%s)\n",
                            d.grid_confs[b].c_str(), fmt_bytes(best.peak_reserved).c_str(),
                            fmt_bytes(def.peak_reserved).c_str(), saving_text(best, def).c_str());
            if (!capacity && best.failure != sim::failure_reason::none)
                std::printf("     no setting replays the whole log: this one stops at %s (%s)\n",
                            moment(best.fail_seq, best.fail_t).c_str(),
                            sim::k_failure_reason_names[size_t(best.failure)]);
            // Like the grid's, a stopped replay's peak covers only the requests before its stop.
            for (const sim::replay_result& r : d.results)
                if (r.policy.rfind("gpumem", 0) == 0 || r.policy == "ideal") {
                    if (r.failure != sim::failure_reason::none)
                        std::printf("     %s: does not replay the whole log (stops at %s: %s)\n", r.policy.c_str(),
                                    moment(r.fail_seq, r.fail_t).c_str(), sim::k_failure_reason_names[size_t(r.failure)]);
                    else
                        std::printf("     %s: peak reserved %s, %s\n", r.policy.c_str(), fmt_bytes(r.peak_reserved).c_str(),
                                    fmt_counted(r.driver_allocs, "driver allocation", "driver allocations").c_str());
                }
        }
        std::printf("\n");
    }
}

int run_replay(replay_args& a) {
    if (a.logs.empty()) return usage_error("replay", with_stdin_hint("no log file given"));
    if (std::string err; !dash_means_stdin(a.logs, err)) return usage_error("replay", err);
    drop_repeated_inputs(a.logs);
    pipe_spools spools;  // pipes among several logs, compared with them and read from here
    if (std::string err; !drop_copies_of_one_log(a.logs, spools, a.progress, err)) {
        std::fprintf(stderr, "gpumem: error: %s\n", visible(err).c_str());
        return k_exit_input;
    }
    uint64_t capacity = 0;
    if (!a.capacity_text.empty() && (!parse_size_arg(a.capacity_text, capacity) || capacity == 0))
        return usage_error("replay", "--capacity " + a.capacity_text + ": expected a size such as 80GiB or 141GB");
    // "ideal,,pytorch" or "gpumem,": a slip, not a policy.  The same for --api, where "," would
    // otherwise be no filter at all and replay every API.
    for (const auto& [opt, given] : {std::pair{"--policy ", &a.policies}, std::pair{"--api ", &a.apis}})
        for (const std::string& g : *given)
            if (g.front() == ',' || g.back() == ',' || g.find(",,") != std::string::npos)
                return usage_error("replay", opt + g + ": an empty entry between commas");
    std::vector<std::string> names = split_policies(a.policies);
    if (names.empty()) names.assign(std::begin(k_default_policies), std::end(k_default_policies));
    if (a.suggest && std::find(names.begin(), names.end(), "gpumem") == names.end()) names.push_back("gpumem");
    std::vector<sim::policy_spec> specs;
    for (const std::string& n : names) {
        sim::policy_spec s = sim::parse_policy_name(n);
        std::string err;
        // Only the options are checked here, for any device (the logs give each device's size).
        if (!sim::make_policy(s, capacity, k_any_device, "{}", &err))
            return usage_error("replay", "--policy " + err);
        specs.push_back(s);
    }
    std::vector<std::string> apis;
    for (const std::string& g : a.apis) {
        size_t pos = 0;
        while (pos <= g.size()) {
            size_t c = g.find(',', pos);
            apis.push_back(g.substr(pos, c == std::string::npos ? std::string::npos : c - pos));
            if (c == std::string::npos) break;
            pos = c + 1;
        }
    }
    unsigned jobs = jobs_or_cores(a.jobs);

    // Read the logs, one per thread.
    std::vector<sim::trace> traces(a.logs.size());
    std::vector<std::string> errors(a.logs.size());
    sim::trace_options topt;
    topt.apis = apis;
    topt.progress = a.progress.wanted();
    topt.progress_interval_s = a.progress.every_s;
    parallel_for(a.logs.size(), jobs, [&](size_t i) {
        try {
            traces[i] = sim::load_trace(a.logs[i], topt);
        } catch (const input_error& e) {
            errors[i] = e.what();
        } catch (const std::bad_alloc&) {
            errors[i] = a.logs[i] + ": out of memory while reading";
        } catch (const std::exception& e) {
            // Any other exception is a reader defect met on this input; parallel_for's threads must
            // not throw (std::terminate), so it becomes this file's input error, exit 2.
            errors[i] = a.logs[i] + ": cannot read: " + e.what();
        } catch (...) {
            errors[i] = a.logs[i] + ": cannot read: unknown error";
        }
    });
    int rc = k_exit_ok;
    for (const std::string& e : errors)
        if (!e.empty()) {
            std::fprintf(stderr, "gpumem: error: %s\n", visible(e).c_str());
            rc = k_exit_input;
        }
    if (rc != k_exit_ok) return rc;
    for (const sim::trace& tr : traces)
        if (tr.cut_line)
            std::fprintf(stderr, "gpumem: warning: %s:%llu: the last line is cut short (the log is still being written, or its writer stopped in mid-line); replayed up to the line before\n",
                         visible(tr.file).c_str(), (unsigned long long)tr.cut_line);
    // An --api name no allocation of the log used (a typo, the wrong case) would otherwise replay
    // nothing of that API and print nothing about it, exit 0: a silent empty answer.
    for (const sim::trace& tr : traces)
        for (const std::string& api : apis) {
            if (std::find(tr.apis.begin(), tr.apis.end(), api) != tr.apis.end()) continue;
            std::string used;
            size_t listed = 0;
            for (const std::string& u : tr.log_apis)
                if (++listed <= 20) used += (used.empty() ? "" : ", ") + u;
            if (listed > 20) used += " and " + std::to_string(listed - 20) + " more";  // one readable line
            std::fprintf(stderr, "gpumem: error: %s: --api %s: no device allocation in the log was made through %s; %s\n",
                         visible(tr.file).c_str(), visible(api).c_str(), visible(api).c_str(),
                         used.empty() ? "the log has no device allocations" : visible("the log's APIs are " + used).c_str());
            rc = k_exit_input;
        }
    if (rc != k_exit_ok) return rc;
    // Each policy was understood without a log (above); one that a log's header makes fail reads
    // a setting there (the gpumem policy: config.reuse, pool_round, ...) that it cannot take: the
    // log's fault, named at its line 1.
    for (const sim::trace& tr : traces)
        for (const sim::policy_spec& s : specs) {
            std::string err;
            if (sim::make_policy(s, capacity, k_any_device, tr.config_json, &err)) continue;
            std::fprintf(stderr, "gpumem: error: %s\n",
                         visible(input_error(tr.file, 1, "the header's config cannot be replayed: " + err).what()).c_str());
            rc = k_exit_input;
            break;
        }
    if (rc != k_exit_ok) return rc;
    // Options that cannot act in this replay (garbage_collection_threshold without a memory limit;
    // gpumem's trim or stitches without safe reuse, by the log's settings too) leave that policy's
    // numbers as without them: said beside its results, not left to the guide.
    std::vector<std::vector<std::string>> notes(traces.size());
    for (size_t i = 0; i < traces.size(); ++i)
        for (const sim::policy_spec& s : specs) notes[i].push_back(sim::policy_note(s, traces[i].config_json));
    // A log with no device allocation (cuMemCreate only, as JAX's default allocator and PyTorch's
    // expandable segments make; managed or host memory only; no events) would print nothing and
    // exit 0: said for each such log, and an error when no log has anything to replay, as `check`
    // treats a run with no GPU activity.
    size_t empty = 0;
    for (const sim::trace& tr : traces) empty += tr.devices.empty();
    for (const sim::trace& tr : traces)
        if (tr.devices.empty())
            std::fprintf(stderr,
                         "gpumem: %s: %s: no device allocation to replay (replay takes allocations of kind "
                         "\"device\"; cuMemCreate, managed and host memory are left out)\n",
                         empty == traces.size() ? "error" : "warning", visible(tr.file).c_str());
    if (empty == traces.size()) return k_exit_input;

    // Every (log, device, policy) replay is a task; all cores take them.
    std::vector<device_job> djobs;
    for (size_t i = 0; i < traces.size(); ++i)
        for (const sim::device_trace& d : traces[i].devices) djobs.push_back(device_job{i, &d, {}, {}, {}});
    std::vector<sim::pt_config> grid = a.suggest ? suggest_grid() : std::vector<sim::pt_config>{};
    std::vector<task> tasks;
    for (device_job& d : djobs) {
        d.results.resize(specs.size());
        for (size_t p = 0; p < specs.size(); ++p) tasks.push_back(task{&d, false, p, specs[p].name, specs[p]});
        d.grid.resize(grid.size());
        for (size_t g = 0; g < grid.size(); ++g) {
            std::string conf = grid[g].to_conf();
            d.grid_confs.push_back(conf);
            tasks.push_back(task{&d, true, g, "pytorch" + (conf.empty() ? "" : ":" + conf),
                                 sim::parse_policy_name("pytorch" + (conf.empty() ? "" : ":" + conf))});
        }
    }
    std::vector<std::string> task_errors(tasks.size());
    // Progress: how many replays are done and how many of their requests are replayed, every 2 s by
    // default (--suggest replays a log 70 times; one replay of a large log alone takes seconds).
    const bool progress = a.progress.wanted();
    std::atomic<size_t> done{0};
    std::atomic<uint64_t> replayed{0};
    uint64_t requests = 0;
    for (const task& t : tasks) requests += t.job->dev->ops.size();
    std::mutex progress_mu;
    const auto start = std::chrono::steady_clock::now();
    auto last = start;
    auto show = [&] {
        if (!progress) return;
        std::lock_guard<std::mutex> lk(progress_mu);
        const auto now = std::chrono::steady_clock::now();
        if (std::chrono::duration<double>(now - last).count() < a.progress.every_s) return;
        last = now;
        std::fprintf(stderr, "gpumem: replay: %zu of %zu replays done, %.0f%% of their requests (%s, %.0f s)\n",
                     done.load(), tasks.size(), requests ? 100.0 * double(replayed.load()) / double(requests) : 100.0,
                     fmt_counted(djobs.size(), "device", "devices").c_str(), std::chrono::duration<double>(now - start).count());
    };
    parallel_for(tasks.size(), jobs, [&](size_t i) {
        uint64_t counted = 0;  // this replay's requests in `replayed`
        const uint64_t ops = tasks[i].job->dev->ops.size();
        auto finish = [&] {
            // A replay that failed or stopped early counts its requests as done all the same.
            replayed += ops - counted;
            ++done;
            show();
        };
        struct on_exit {
            decltype(finish)& f;
            ~on_exit() { f(); }
        } finished{finish};
        sim::replay_progress on_requests;
        if (progress)
            on_requests = [&](uint64_t n) {
                counted += n;
                replayed += n;
                show();
            };
        task& t = tasks[i];
        const sim::trace& tr = traces[t.job->log];
        std::string err;
        uint64_t total = t.job->dev->total_bytes;
        // As for reading: an exception must not leave the thread (std::terminate); it fails this file.
        try {
            auto p = sim::make_policy(t.spec, capacity, total, tr.config_json, &err);
            if (!p) {
                // The options were understood above: what fails now is the device the header gives
                // (per_process_memory_fraction of a device of unknown size), named at line 1.
                task_errors[i] = input_error(tr.file, 1, err).what();
                return;
            }
            sim::replay_result r = sim::replay(*t.job->dev, *p, t.name, capacity, on_requests);
            (t.grid ? t.job->grid[t.index] : t.job->results[t.index]) = std::move(r);
        } catch (const std::bad_alloc&) {
            task_errors[i] = tr.file + ": " + t.name + ": out of memory while replaying";
        } catch (const std::exception& e) {
            task_errors[i] = tr.file + ": " + t.name + ": cannot replay: " + e.what();
        } catch (...) {
            task_errors[i] = tr.file + ": " + t.name + ": cannot replay: unknown error";
        }
    });
    for (const std::string& e : task_errors)
        if (!e.empty()) {
            std::fprintf(stderr, "gpumem: error: %s\n", visible(e).c_str());
            rc = k_exit_input;
        }
    if (rc != k_exit_ok) return rc;

    if (a.json) {
        ojson out;
        out["capacity_bytes"] = capacity;
        out["logs"] = ojson::array();
        for (size_t i = 0; i < traces.size(); ++i) {
            ojson l;
            l["file"] = traces[i].file;
            l["apis"] = traces[i].apis;
            l["skipped_allocations"] = traces[i].skipped_allocs;
            l["skipped_managed_allocations"] = traces[i].skipped_managed;
            l["skipped_vmm_allocations"] = traces[i].skipped_vmm;
            l["devices"] = ojson::array();
            for (const device_job& d : djobs) {
                if (d.log != i) continue;
                ojson dj;
                dj["dev"] = d.dev->dev;
                dj["allocations"] = d.dev->n_alloc;
                dj["frees"] = d.dev->n_free;
                dj["streams_known"] = d.dev->n_streams > 0;
                dj["streams"] = d.dev->n_streams;
                dj["allocations_without_stream"] = d.dev->n_no_stream;
                dj["addresses_allocated_again"] = d.dev->n_freed_twice;
                dj["policies"] = ojson::array();
                for (size_t p = 0; p < d.results.size(); ++p)
                    dj["policies"].push_back(result_json(d.results[p], capacity, notes[i][p]));
                if (!d.grid.empty()) {
                    size_t b = best_of(d);
                    ojson s = result_json(d.grid[b], capacity);
                    // None fits (the best stopped too): no setting to apply, as the text says.
                    if (d.grid[b].failure == sim::failure_reason::none) s["pytorch_cuda_alloc_conf"] = d.grid_confs[b];
                    else s["pytorch_cuda_alloc_conf"] = nullptr;
                    s["configurations_tried"] = d.grid.size();
                    dj["suggestion"] = s;
                }
                l["devices"].push_back(dj);
            }
            out["logs"].push_back(l);
        }
        std::cout << out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    } else {
        print_text(traces, djobs, capacity, a.suggest, notes);
    }
    std::fflush(stdout);
    return k_exit_ok;
}

void add_options(CLI::App* app, replay_args& a) {
    app->add_option("LOG", a.logs, "gpumem logs; each is replayed on its own core; - reads standard input");
    app->add_option("--policy", a.policies,
                    "allocators to simulate, comma-separated: ideal, pytorch, pytorch:OPTIONS (PYTORCH_CUDA_ALLOC_CONF "
                    "syntax), pytorch-expandable, gpumem, gpumem:KNOB=VALUE (default: ideal,pytorch,pytorch-expandable,gpumem)")
        ->type_name("P,...")
        ->allow_extra_args(false);  // one value each time (it is comma-separated): `--policy P LOG` keeps LOG a log
    app->add_option("--api", a.apis,
                    "replay only allocations made through these APIs (default: every device allocation; a name "
                    "no allocation of the log used is an error); "
                    "--api cudaMalloc is what PyTorch's allocator sees under PYTORCH_NO_CUDA_MEMORY_CACHING=1")
        ->type_name("NAME,...")
        ->allow_extra_args(false);
    app->add_option("--capacity", a.capacity_text, "device memory: say whether and where each policy runs out")
        ->type_name("SIZE");
    app->add_flag("--json", a.json, "print the results as JSON");
    app->add_flag("--suggest", a.suggest,
                  "search PyTorch's options for the least peak reserved and print the PYTORCH_CUDA_ALLOC_CONF line");
    add_count_option(app, "-j,--jobs", [&a](uint64_t v) { a.jobs = unsigned(v); }, "threads (default: all cores)", 1, k_max_jobs);
    add_progress_flags(app, a.progress);
    app->footer(
        "Replays each device's allocation requests and frees, in seq order, through each policy and\n"
        "reports its peak reserved bytes (with the moment), driver allocations/frees, and peak external\n"
        "fragmentation (docs/metrics.md).  Record the program with PYTORCH_NO_CUDA_MEMORY_CACHING=1 so\n"
        "the log holds every tensor request.  The pytorch policies model c10/cuda/CUDACachingAllocator.cpp;\n"
        "gpumem runs gpumem's own pool; ideal is the peak of the requested bytes.\n"
        "\n"
        "exit codes: 0 replayed; 2 unusable input or arguments.");
}

}  // namespace

command add_replay(CLI::App& top) {
    auto a = std::make_shared<replay_args>();
    CLI::App* app = top.add_subcommand("replay", "what other allocators (PyTorch's with any settings, gpumem's pool) "
                                                 "would have reserved for the requests in these logs");
    add_options(app, *a);
    command c;
    c.app = app;
    c.run = [a](const std::vector<std::string>& tail, bool) {
        a->logs.insert(a->logs.end(), tail.begin(), tail.end());  // `replay -- LOG...`
        return run_replay(*a);
    };
    return c;
}

}  // namespace gpumem::analysis
