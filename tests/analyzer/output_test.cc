// Output writers: the segment bar, the JSON schema's required keys, a self-contained HTML page, a
// loadable Perfetto trace, and the call an OOM failed in.  Byte-exact outputs are covered by the
// golden test.
#include <catch2/catch.hpp>

#include <map>
#include <sstream>

#include "analyze.h"
#include "cli_input.h"
#include "format_util.h"
#include "report_output.h"
#include "test_util.h"
#include "views/report_sites.h"

using namespace gpumem::analysis;
using namespace gpumem::test;

namespace {
// The HTML page and the text report of `ps`, as `gpumem report` writes them without options.
std::string html_of(const std::vector<process_report>& ps) {
    std::ostringstream o;
    write_html(o, ps, combine(ps), {});
    return o.str();
}
std::string text_of(const std::vector<process_report>& ps) {
    std::ostringstream o;
    write_text(o, ps, combine(ps), {});
    return o.str();
}
}  // namespace

TEST_CASE("segment_bar draws blocks to scale", "[output]") {
    segment_view s;
    s.base = 0x1000;
    s.size = 1600;
    s.blocks = {{0x1000, 400}, {0x1000 + 800, 100}};
    // 16 cells of 100 bytes: 4 full, 4 free, 1 full, 7 free.
    CHECK(segment_bar(s, 16) == "####....#.......");
    s.blocks = {{0x1000 + 50, 100}};  // straddles two cells, half of each
    CHECK(segment_bar(s, 16) == "++..............");
}

TEST_CASE("sizes, times and percentages are formatted for people", "[output]") {
    CHECK(fmt_bytes(0) == "0 B");
    CHECK(fmt_bytes(1023) == "1023 B");
    CHECK(fmt_bytes(1536) == "1.50 KiB");
    CHECK(fmt_bytes(2097152) == "2.00 MiB");
    CHECK(fmt_time(950) == "950 ns");
    CHECK(fmt_time(1500000000) == "1.500 s");
    CHECK(fmt_pct(1.0 / 3.0) == "33.3%");
    CHECK(fmt_count(1234567) == "1,234,567");
    CHECK(fmt_where("b.json", 41) == "b.json:41");
    CHECK(fmt_where("b.json", 0) == "b.json");  // no line known
    // Size classes: the upper bound not included, so the class below 1 MiB ends at "1.00 MiB".
    CHECK(fmt_size_class(0) == "0 B-2 B");
    CHECK(fmt_size_class(1) == "2 B-4 B");
    CHECK(fmt_size_class(19) == "512.00 KiB-1.00 MiB");
    CHECK(fmt_size_class(63) == "8.00 EiB-16.00 EiB");
    CHECK(html_escape("<a href=\"x\">&'") == "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
}

TEST_CASE("the JSON report has every documented per-device key", "[output]") {
    std::vector<process_report> ps{analyze_file(data_path("golden/pool_fragmentation.jsonl"), {})};
    auto j = to_json(ps, combine(ps), {});
    CHECK(j["schema"] == "gpumem-report");
    CHECK(j["schema_version"] == k_report_schema_version);
    const auto& d = j["processes"][0]["devices"][0];
    for (const char* key : {"peak_requested_bytes", "peak_reserved_bytes", "peak_allocated_bytes", "end_requested_bytes",
                            "max_external_fragmentation", "n_alloc", "n_free", "n_oom"})
        CHECK(d.contains(key));
    CHECK(d["peak_allocated_bytes"] == 2097152);
    CHECK(d["max_external_fragmentation"] == Approx(0.333333));
    CHECK(d["n_oom"] == 1);
    CHECK(d["ooms"][0]["verdict"] == "fragmentation");
}

TEST_CASE("the JSON report says when the peaks of pending, unmapped and mapped bytes were reached", "[output]") {
    // docs/metrics.md gives every peak with its moment; these three had only their bytes.  Each
    // golden log reaches its peak at a known line: pool_auto's free at seq 8 (dev 0) and 13 (dev 1)
    // left 1 MiB pending, pool_vmm_unmap's second segment_unmap (seq 6) made 8 MiB of holes, and
    // pool_off_kinds's cuMemMap (seq 6) mapped 2 MiB.
    auto dev = [](const char* log, size_t i) {
        std::vector<process_report> ps{analyze_file(data_path(std::string("golden/") + log), {})};
        return to_json(ps, combine(ps), {})["processes"][0]["devices"][i];
    };
    auto when = [](const nlohmann::json& d, const std::string& what) {
        return std::vector<uint64_t>{d.value("peak_" + what + "_bytes", uint64_t(1)), d.value("peak_" + what + "_t_ns", uint64_t(1)),
                                     d.value("peak_" + what + "_seq", uint64_t(1))};
    };
    using v = std::vector<uint64_t>;
    CHECK(when(dev("pool_auto.jsonl", 0), "pending") == v{1048576, 9000, 8});
    CHECK(when(dev("pool_auto.jsonl", 1), "pending") == v{1048576, 14000, 13});
    CHECK(when(dev("pool_vmm_unmap.jsonl", 0), "unmapped") == v{8388608, 7000, 6});
    CHECK(when(dev("pool_off_kinds.jsonl", 1), "mapped") == v{2097152, 7000, 6});
    // No peak: 0 for its moment too.
    CHECK(when(dev("pool_auto.jsonl", 0), "mapped") == v{0, 0, 0});
}

TEST_CASE("the HTML page is self-contained", "[output]") {
    std::vector<process_report> ps{analyze_file(data_path("golden/pool_fragmentation.jsonl"), {})};
    const std::string h = html_of(ps);
    CHECK_THAT(h, Catch::StartsWith("<!DOCTYPE html>"));
    CHECK_THAT(h, !Catch::Contains("<script"));
    CHECK_THAT(h, !Catch::Contains("src="));
    CHECK_THAT(h, !Catch::Contains("<link"));
    CHECK_THAT(h, !Catch::Contains("href="));
    CHECK_THAT(h, !Catch::Contains("@import"));
    CHECK_THAT(h, Catch::Contains("memory over time"));
    CHECK_THAT(h, Catch::Contains("verdict-fragmentation"));
    // The only URL is the SVG namespace name, which browsers never fetch.
    size_t urls = 0;
    for (size_t p = h.find("http"); p != std::string::npos; p = h.find("http", p + 1)) {
        CHECK(h.compare(p, 26, "http://www.w3.org/2000/svg") == 0);
        ++urls;
    }
    CHECK(urls > 0);
}

// Each verdict the OOM diagnosis gives (report_model.h, oom_report::verdict) stands out in the page
// by its own colour; one without a rule showed as plain text beside the explanation.
TEST_CASE("the HTML page styles every OOM verdict", "[output]") {
    std::vector<process_report> ps{analyze_file(data_path("golden/pool_fragmentation.jsonl"), {})};
    const std::string h = html_of(ps);
    for (const char* v : {"capacity", "pending-frees", "fragmentation", "chunk-rounding"})
        CHECK_THAT(h, Catch::Contains(std::string(".verdict-") + v + "{color:"));
}

TEST_CASE("the HTML page's allocation and free counts have thousands separators, as the text report's", "[output]") {
    std::vector<process_report> ps{analyze_file(data_path("golden/pool_off_basic.jsonl"), {})};
    ps[0].devices[0].n_alloc = 1149;
    ps[0].devices[0].n_free = 1127;
    const std::string h = html_of(ps), t = text_of(ps);
    CHECK_THAT(t, Catch::Contains("1,149") && Catch::Contains("1,127"));
    CHECK_THAT(h, Catch::Contains("<td>allocations / frees</td><td>1,149 / 1,127</td>"));
}

TEST_CASE("the HTML page says a log's lost events make its totals approximate, as the text report does", "[output]") {
    // A warning listed first (a blank line) no longer hides the loss: the page said nothing of it.
    std::vector<process_report> ps{analyze_file(data_path("golden/pool_off_basic.jsonl"), {})};
    ps[0].lost = 7;
    ps[0].warnings = {"x.jsonl:2: blank line skipped"};
    ps[0].n_warnings = 2;
    const std::string h = html_of(ps), t = text_of(ps);
    CHECK_THAT(t, Catch::Contains("7 events were lost by the recorder: totals are approximate"));
    CHECK_THAT(h, Catch::Contains("<p class=warn>7 events were lost by the recorder: totals are approximate</p>"));
    ps[0].lost = 1;
    const std::string h1 = html_of(ps);
    CHECK_THAT(h1, Catch::Contains("1 event was lost by the recorder"));
    ps[0].lost = 0;
    const std::string h0 = html_of(ps);
    CHECK_THAT(h0, !Catch::Contains("lost by the recorder"));
}

TEST_CASE("the text report and the HTML page say how a process ended in the same words", "[output]") {
    // Both take process_report::end_text: the page gave a signal's reason without its number.
    std::vector<process_report> ps{analyze_file(data_path("golden/pool_off_basic.jsonl"), {})};
    ps[0].has_end = true;
    ps[0].end_reason = "signal";
    ps[0].end_signal = 9;
    const std::string h = html_of(ps), t = text_of(ps);
    CHECK_THAT(t, Catch::Contains(", ended: signal 9\n"));
    CHECK_THAT(h, Catch::Contains(", ended: signal 9</p>"));
    ps[0].has_end = false;
    const std::string h2 = html_of(ps), t2 = text_of(ps);
    CHECK_THAT(t2, Catch::Contains(", no end line (killed or still running)\n"));
    CHECK_THAT(h2, Catch::Contains(", no end line (killed or still running)</p>"));
}

TEST_CASE("a count of one is written singular in the text and HTML reports", "[output]") {
    // pool_fragmentation has one OOM on one device; the other counts are set to one here.
    std::vector<process_report> ps{analyze_file(data_path("golden/pool_fragmentation.jsonl"), {})};
    process_report& p = ps[0];
    device_report& d = p.devices[0];
    REQUIRE(d.n_oom == 1);
    p.events = 1;
    d.pending.peak = 1;
    d.n_pool_fenced = d.n_pool_sync = d.n_pool_wait = 1;
    REQUIRE(d.at_peak.valid);
    REQUIRE(d.at_peak.segment_map.size() == 1);
    d.at_peak.segment_map.resize(49, d.at_peak.segment_map[0]);  // the HTML draws 48, the text 32
    const std::string h = html_of(ps);
    CHECK_THAT(h, Catch::Contains("<div class=v>1</div><div class=k>OOM</div>"));
    CHECK_THAT(h, Catch::Contains(" 1 event over "));
    CHECK_THAT(h, Catch::Contains("… 1 more segment not drawn."));
    d.at_peak.segment_map.resize(33);
    REQUIRE(d.ooms.size() == 1);
    d.ooms.resize(21, d.ooms[0]);  // the text shows 20
    const std::string t = text_of(ps);
    CHECK_THAT(t, Catch::Contains(" of events, 1 event, "));
    CHECK_THAT(t, Catch::Contains("1 fence release, 1 sync, 1 fence wait"));
    CHECK_THAT(t, Catch::Contains("    ... 1 more segment\n"));
    CHECK_THAT(t, Catch::Contains("  ... 1 more OOM\n"));
    d.n_pool_fenced = 0;
    const std::string t2 = text_of(ps);
    CHECK_THAT(t2, Catch::Contains(", 1 device-wide sync, 1 fence wait"));
    // Warnings past the kept ones, on stderr.
    p.warnings.assign(k_max_warnings, "w");
    p.n_warnings = k_max_warnings + 1;
    CHECK(warning_lines(p, "x.jsonl").back() == "x.jsonl: 1 more warning not shown");
}

TEST_CASE("the text timeline keeps the log's seq order when its times step back", "[output]") {
    // Times 20, 15, 10, 5, 0 ms, then 40 to 100 ms: the points before the first time wrapped past
    // the last row, which came out last as "15.00 ms" with the 100 ms point, while the 20 ms row
    // showed 1 MiB of the 5 MiB allocated by then.  Seq order is the log's: each point belongs at
    // the latest time seen up to it.
    const uint64_t ms = 1000000, ts[] = {20, 15, 10, 5, 0, 40, 60, 80, 100};
    std::string log = k_header_off;
    for (uint64_t i = 0; i < std::size(ts); ++i) {
        std::string line = alloc_line(i, 0x1000000 * (i + 1), 1 << 20);
        const std::string t = "\"t\":" + std::to_string(i * 100 + 100) + ",";
        line.replace(line.find(t), t.size(), "\"t\":" + std::to_string(ts[i] * ms) + ",");
        log += line;
    }
    temp_file f(log, "time_back");
    std::vector<process_report> ps{analyze_file(f.path, {})};
    const std::string text = text_of(ps);
    size_t at = text.find("    from ");
    REQUIRE(at != std::string::npos);
    std::istringstream rows(text.substr(text.find('\n', at) + 1));
    std::vector<std::string> got;
    for (std::string row; std::getline(rows, row) && !row.empty();) got.push_back(row.substr(4, 28));
    CHECK(got == std::vector<std::string>{"20.00 ms        5.00 MiB    ", "40.00 ms        6.00 MiB    ",
                                          "60.00 ms        7.00 MiB    ", "80.00 ms        8.00 MiB    ",
                                          "100.00 ms       9.00 MiB    "});
}

TEST_CASE("the Perfetto trace has counter tracks and OOM markers", "[output]") {
    std::vector<process_report> ps{analyze_file(data_path("golden/pool_fragmentation.jsonl"), {})};
    std::ostringstream o;
    write_perfetto(o, ps);
    auto j = nlohmann::json::parse(o.str());
    REQUIRE(j["traceEvents"].is_array());
    size_t counters = 0, instants = 0;
    for (const auto& e : j["traceEvents"]) {
        if (e["ph"] == "C") {
            ++counters;
            CHECK(e["pid"] == 5001);
            CHECK(e.contains("ts"));
        }
        if (e["ph"] == "i") {
            ++instants;
            CHECK(e["ts"] == Approx(7.0));  // 7000 ns
        }
    }
    CHECK(counters > 0);
    CHECK(instants == 1);
}

TEST_CASE("Perfetto: logs sharing a pid are named by host; no fragmentation track without pool segments", "[output]") {
    // Two logs of pid 7 from two hosts read "gpumem 7 rank 0" twice; a device without pool
    // segments (pool off) drew a flat 0% fragmentation, which reads as "not fragmented".
    time_point t;
    t.t_first = t.t_last = 1000;
    t.events = 1;
    auto proc = [&](const char* host, uint64_t peak_segments) {
        process_report pr;
        pr.pid = 7;
        pr.host = host;
        pr.rank = "0";
        device_report d;
        d.dev = 0;
        d.segment_count.peak = peak_segments;
        d.timeline = {t};
        pr.devices.push_back(d);
        return pr;
    };
    std::ostringstream o;
    write_perfetto(o, {proc("a", 0), proc("b", 3)});
    const auto j = nlohmann::json::parse(o.str());
    std::vector<std::string> names;
    std::map<int64_t, int> frag;  // pid -> fragmentation counter events
    for (const auto& e : j["traceEvents"]) {
        if (e["name"] == "process_name") names.push_back(e["args"]["name"].get<std::string>());
        if (e["ph"] == "C" && e["name"] == "dev0 external fragmentation") ++frag[e["pid"].get<int64_t>()];
    }
    CHECK(names == std::vector<std::string>{"gpumem 7 on a rank 0", "gpumem 7 on b rank 0"});
    CHECK(frag.size() == 1);
    CHECK(frag.count(7) == 0);
}

namespace {

// A timeline point of `events` events from t0 to t1 (ns) whose three byte counts peak at `max`
// and end at `last`.
time_point pt(uint64_t t0, uint64_t t1, uint64_t events, uint64_t max, uint64_t last) {
    time_point p;
    p.t_first = t0;
    p.t_last = t1;
    p.events = events;
    p.requested_max = p.allocated_max = p.reserved_max = max;
    p.requested_last = p.allocated_last = p.reserved_last = last;
    return p;
}

// A process `pid` with one device 0 of this timeline and peak.
process_report timeline_process(int pid, std::vector<time_point> timeline, uint64_t peak = 0) {
    process_report pr;
    pr.pid = pid;
    device_report d;
    d.dev = 0;
    d.timeline = std::move(timeline);
    d.requested.peak = d.allocated.peak = d.reserved.peak = peak;
    pr.devices.push_back(d);
    return pr;
}

// The Perfetto trace's device 0 memory counter: (ts in us, requested bytes), in file order.
std::vector<std::pair<double, uint64_t>> perfetto_memory(const process_report& pr) {
    std::ostringstream o;
    write_perfetto(o, {pr});
    const auto j = nlohmann::json::parse(o.str());
    std::vector<std::pair<double, uint64_t>> memory;
    for (const auto& e : j["traceEvents"])
        if (e["ph"] == "C" && e["name"] == "dev0 memory (bytes)") memory.emplace_back(e["ts"].get<double>(), e["args"]["requested"].get<uint64_t>());
    return memory;
}

}  // namespace

TEST_CASE("a Perfetto timeline point of several events closes with its last values at its end", "[output]") {
    // A downsampled point spans events from t_first to t_last: its maxima go at its start, its
    // last values at its end, so the level between points is right.  A one-event point, or one
    // whose events share a time, has nothing to close.
    const process_report pr =
        timeline_process(7, {pt(1000, 1000, 1, 10, 10), pt(2000, 3000, 2, 50, 20), pt(4000, 4000, 2, 30, 30), pt(5000, 9000, 5, 60, 0)});
    using v = std::vector<std::pair<double, uint64_t>>;
    CHECK(perfetto_memory(pr) == v{{1.0, 10}, {2.0, 50}, {3.0, 20}, {4.0, 30}, {5.0, 60}, {9.0, 0}});
}

TEST_CASE("the Perfetto trace and the HTML chart keep seq order where times step back, and end at the end values", "[output]") {
    // Times 1, 5, 3 us (a thread read the clock before it took its seq): the trace, sorted by time,
    // put the 3 us state before the 5 us one and ended at 5 us's level.  And a last point of two
    // events at one time (an allocation freed within the same ns), max 60 and last 0, was not
    // closed: the trace and the chart ended at 60 where the log ends at 0.
    const process_report pr =
        timeline_process(7, {pt(1000, 1000, 1, 10, 10), pt(5000, 5000, 1, 20, 20), pt(3000, 3000, 1, 40, 40), pt(7000, 7000, 2, 60, 0)}, 60);
    using v = std::vector<std::pair<double, uint64_t>>;
    CHECK(perfetto_memory(pr) == v{{1.0, 10}, {5.0, 20}, {5.0, 40}, {7.0, 60}, {7.0, 0}});
    // The HTML chart: x never goes back, and each line ends at 0 (y 224, the chart's floor).
    std::ostringstream h;
    write_html(h, {pr}, combine({pr}), {});
    const std::string page = h.str();
    const size_t at = page.find("points='");
    REQUIRE(at != std::string::npos);
    std::istringstream pts(page.substr(at + 8, page.find('\'', at + 8) - at - 8));
    std::vector<std::pair<double, double>> xy;
    for (std::string p; pts >> p;) xy.emplace_back(std::stod(p.substr(0, p.find(','))), std::stod(p.substr(p.find(',') + 1)));
    REQUIRE(xy.size() > 2);
    CHECK(std::is_sorted(xy.begin(), xy.end(), [](const auto& a, const auto& b) { return a.first < b.first; }));
    CHECK(xy.back().second == Approx(224.0));
    // The text report's rows place a point at the latest time seen before it too, a point's last
    // time included: the third point (at 3 us, after one spanning 2-9 us) goes at 9 us, as the
    // trace puts it, not back at 3 us (its row then labelled with a time before its predecessor's end).
    const process_report pt2 = timeline_process(8, {pt(1000, 1000, 1, 10, 10), pt(2000, 9000, 2, 20, 20), pt(3000, 3000, 1, 40, 40)}, 40);
    std::ostringstream t;
    write_text(t, {pt2}, combine({pt2}), {});
    const std::string text = t.str();
    CHECK_THAT(text, Catch::Contains("\n    9.00 us "));
    CHECK_THAT(text, !Catch::Contains("\n    3.00 us "));
}

TEST_CASE("--at's map names its log line, as the peak's map and each OOM's do, and as --json gives it", "[output]") {
    const std::string log = data_path("golden/pool_fragmentation.jsonl");
    auto text = run_gpumem("report --no-progress --at 5 " + log);
    REQUIRE(text.rc == 0);
    auto js = run_gpumem("report --no-progress --json --at 5 " + log);
    REQUIRE(js.rc == 0);
    const auto at = nlohmann::json::parse(js.out)["processes"][0]["devices"][0]["at_request"];
    CHECK(at["line"] == 7);
    CHECK_THAT(text.out, Catch::Contains("  Free-block map at --at: after 6.00 us (seq 5), line 7\n"));
}

TEST_CASE("an OOM names the call that asked for the memory, in text and JSON, and from the JSON read back", "[output]") {
    // tests/data/golden/oom_stack.jsonl: a pool refusal (oom, then a pooled alloc_fail naming stack
    // 2) and a pass-through cudaMallocManaged that ran out of memory (alloc_fail naming stack 3,
    // native innermost frame).  The stack is the failing call's, not one of the sites holding memory.
    const std::string log = data_path("golden/oom_stack.jsonl");
    auto text = run_gpumem("report --no-progress " + log);
    REQUIRE(text.rc == 0);
    CHECK_THAT(text.out, Catch::Contains("  OOM #1 at 3.00 us (seq 2), line 6: cudaMalloc of 1.00 GiB (pool)\n"
                                         "    asked for by Attention.forward (model.py:41)\n"
                                         "        called from train_step (train.py:33)\n"
                                         "        called from <module> (train.py:50)\n"
                                         "        (inside Linear.forward (linear.py:125))\n"
                                         "    request 1.00 GiB"));
    CHECK_THAT(text.out, Catch::Contains("cudaMallocManaged of 2.00 GiB (error 2)\n"
                                         "    asked for by evaluate (train.py:61)\n"
                                         "        called from <module> (train.py:52)\n"
                                         "        (inside ? (libtrainer.so+0x1a2b))\n"));
    CHECK(text.err.empty());

    auto js = run_gpumem("report --no-progress --json " + log);
    REQUIRE(js.rc == 0);
    auto j = nlohmann::json::parse(js.out);
    const auto& ooms = j["processes"][0]["devices"][0]["ooms"];
    REQUIRE(ooms.size() == 2);
    CHECK(ooms[0]["asked_by"]["stack"] == 2);
    REQUIRE(ooms[0]["asked_by"]["frames"].size() == 4);
    CHECK(ooms[0]["asked_by"]["frames"][1] == nlohmann::json({{"function", "Attention.forward"}, {"file", "/src/model.py"}, {"line", 41}}));
    CHECK(ooms[1]["asked_by"]["stack"] == 3);
    CHECK(ooms[1]["asked_by"]["frames"][0]["module"] == "/opt/app/libtrainer.so");
    CHECK(ooms[1]["asked_by"]["frames"][1]["line"] == 61);
    // The sites live at the OOM are another list: the memory held, not the call that asked.
    CHECK(ooms[0]["sites"][0]["stack"] == 1);

    // The report read back from its JSON says the same (check, diff and report read it).
    temp_file report(js.out, "report");
    auto again = run_gpumem("report --no-progress " + report.path);
    REQUIRE(again.rc == 0);
    CHECK(again.out.substr(again.out.find('\n')) == text.out.substr(text.out.find('\n')));
    auto gate = run_gpumem("check --max-ooms 0 " + report.path);
    CHECK(gate.rc == 1);
    CHECK_THAT(gate.out, Catch::Contains("first: 1.00 GiB from cudaMalloc at 3.00 us (seq 2), capacity, asked for by "
                                         "Attention.forward (model.py:41) <- train_step (train.py:33) (inside Linear.forward (linear.py:125))"));
}

TEST_CASE("an OOM whose call recorded no stack says so when the log has stacks, and nothing without them", "[output]") {
    auto with = run_gpumem("report --no-progress " + data_path("golden/stacks.jsonl"));
    REQUIRE(with.rc == 0);
    CHECK_THAT(with.out, Catch::Contains("(error 2)\n    asked for by (no stack recorded for the failing call)\n"));
    auto js = run_gpumem("report --no-progress --json " + data_path("golden/stacks.jsonl"));
    CHECK(nlohmann::json::parse(js.out)["processes"][0]["devices"][0]["ooms"][0]["asked_by"].is_null());
    auto without = run_gpumem("report --no-progress " + data_path("golden/pool_fragmentation.jsonl"));
    REQUIRE(without.rc == 0);
    CHECK_THAT(without.out, Catch::Contains("OOM #1"));
    CHECK_THAT(without.out, !Catch::Contains("\n    asked for by"));  // (the legend says "requested = asked for by the program")
    auto wj = run_gpumem("report --no-progress --json " + data_path("golden/pool_fragmentation.jsonl"));
    CHECK_FALSE(nlohmann::json::parse(wj.out)["processes"][0]["devices"][0]["ooms"][0].contains("asked_by"));
}

TEST_CASE("an OOM the pool did not serve uses the driver's free memory its alloc_fail carries", "[output]") {
    // tests/data/emu/fragment_6_60_pool_off.jsonl: the emulated device (600 MiB) alone, filled with
    // 6 MiB blocks (the 101st fails with 0 B free), two of three freed, then 60 MiB blocks until one
    // fails with 36 MiB free.  Without gpu_free on alloc_fail both read as "not recorded".
    const std::string log = data_path("emu/fragment_6_60_pool_off.jsonl");
    auto js = run_gpumem("report --no-progress --json " + log);
    REQUIRE(js.rc == 0);
    auto ooms = nlohmann::json::parse(js.out)["processes"][0]["devices"][0]["ooms"];
    REQUIRE(ooms.size() == 2);
    CHECK(ooms[0]["source"] == "driver");
    CHECK(ooms[0]["gpu_free_bytes"] == 0);
    CHECK(ooms[0]["gpu_total_bytes"] == 629145600);
    CHECK(ooms[1]["size_bytes"] == 62914560);
    CHECK(ooms[1]["gpu_free_bytes"] == 37748736);
    CHECK(ooms[1]["verdict"] == "capacity");
    auto text = run_gpumem("report --no-progress " + log);
    CHECK_THAT(text.out, Catch::Contains("cuMemAlloc_v2 of 60.00 MiB (error 2)\n    request 60.00 MiB | free in segments "
                                         "0 B | largest free block 0 B | free on GPU 36.00 MiB\n    verdict: capacity"));
    // The same failure had the driver said 64 MiB were free: it refused what it could have placed.
    std::string edited = read_all(log);
    const std::string said = "\"gpu_free\":37748736,";
    REQUIRE(edited.find(said) != std::string::npos);
    edited.replace(edited.find(said), said.size(), "\"gpu_free\":67108864,");
    temp_file f(edited, "driver_oom");
    auto frag = run_gpumem("report --no-progress --json " + f.path);
    REQUIRE(frag.rc == 0);
    auto o = nlohmann::json::parse(frag.out)["processes"][0]["devices"][0]["ooms"][1];
    CHECK(o["verdict"] == "fragmentation");
    CHECK_THAT(o["explanation"].get<std::string>(), Catch::Contains("the driver refused the call"));
}

TEST_CASE("an OOM whose driver free memory was not recorded gets its verdict as far as the log says", "[output]") {
    // 1 GiB refused on a 140 GiB GPU with nothing held: "capacity" only because the free memory the
    // alloc_fail did not carry counts as 0 (docs/metrics.md, OOM diagnosis).  The verdict stands,
    // said as the log's, in text, JSON and HTML alike.
    const std::string before = read_all(data_path("cli/before.jsonl"));  // an H200's header
    const std::string header = before.substr(0, before.find('\n') + 1);
    const std::string fail = "{\"ev\":\"alloc_fail\",\"seq\":0,\"t\":1,\"tid\":1,\"dev\":0,\"api\":\"cudaMalloc\",\"kind\":"
                             "\"device\",\"ptr\":\"0x0\",\"size\":1073741824,\"err\":2";
    const std::string unknown = "; the driver's free memory at the failure was not recorded and is counted as 0";
    temp_file f(header + fail + "}\n", "oom_unrecorded");
    auto text = run_gpumem("report --no-progress " + f.path);
    REQUIRE(text.rc == 0);
    CHECK_THAT(text.out, Catch::Contains("free on GPU not recorded\n    verdict: capacity, as far as the log says: the request is "
                                         "larger than all free memory together (free in segments + free on the GPU)" + unknown + "\n"));
    auto js = run_gpumem("report --no-progress --json " + f.path);
    REQUIRE(js.rc == 0);
    auto o = nlohmann::json::parse(js.out)["processes"][0]["devices"][0]["ooms"][0];
    CHECK(o["verdict"] == "capacity");
    CHECK(o["gpu_free_recorded"] == false);
    CHECK_THAT(o["explanation"].get<std::string>(), Catch::EndsWith(unknown));
    temp_file html_out("", "oom_unrecorded_html");
    std::remove(html_out.path.c_str());
    REQUIRE(run_gpumem("report --no-progress --html " + html_out.path + " " + f.path).rc == 0);
    CHECK_THAT(read_all(html_out.path), Catch::Contains("capacity</span>, as far as the log says — the request is larger"));
    CHECK_THAT(read_all(html_out.path), Catch::Contains("at the failure was not recorded and is counted as 0</p>"));
    // And in the Perfetto trace's OOM marker, which said a bare "capacity" (with no free memory of the GPU).
    temp_file trace_out("", "oom_unrecorded_trace");
    std::remove(trace_out.path.c_str());
    REQUIRE(run_gpumem("report --no-progress --perfetto " + trace_out.path + " " + f.path).rc == 0);
    auto oom_marker = [](const std::string& path) {
        const auto trace = nlohmann::json::parse(read_all(path));
        for (const auto& e : trace["traceEvents"])
            if (e["ph"] == "i") return e;
        return nlohmann::json();
    };
    const auto marker = oom_marker(trace_out.path);
    CHECK(marker["name"] == "OOM 1.00 GiB (capacity, as far as the log says)");
    CHECK(marker["args"]["verdict"] == "capacity, as far as the log says");
    CHECK_FALSE(marker["args"].contains("gpu_free"));
    // Read back from its JSON, the report says the same.
    temp_file report(js.out, "oom_unrecorded_report");
    auto again = run_gpumem("report --no-progress " + report.path);
    REQUIRE(again.rc == 0);
    CHECK(again.out.substr(again.out.find('\n')) == text.out.substr(text.out.find('\n')));
    // Recorded (here 2 GiB free of 140 GiB: the driver refused what it said was free), nothing of the kind.
    temp_file rec(header + fail + ",\"gpu_free\":2147483648,\"gpu_total\":150754820096}\n", "oom_recorded");
    auto r = run_gpumem("report --no-progress --json " + rec.path);
    REQUIRE(r.rc == 0);
    auto ro = nlohmann::json::parse(r.out)["processes"][0]["devices"][0]["ooms"][0];
    CHECK(ro["gpu_free_recorded"] == true);
    CHECK(ro["verdict"] == "fragmentation");
    CHECK_THAT(ro["explanation"].get<std::string>(), !Catch::Contains("not recorded"));
    CHECK_THAT(run_gpumem("report --no-progress " + rec.path).out, !Catch::Contains("as far as the log says"));
    temp_file rec_trace("", "oom_recorded_trace");
    std::remove(rec_trace.path.c_str());
    REQUIRE(run_gpumem("report --no-progress --perfetto " + rec_trace.path + " " + rec.path).rc == 0);
    const auto rec_marker = oom_marker(rec_trace.path);
    CHECK(rec_marker["name"] == "OOM 1.00 GiB (fragmentation)");
    CHECK(rec_marker["args"]["gpu_free"] == 2147483648u);
}

TEST_CASE("past the report's 1000 OOMs, a later failure's stack is not given to the last OOM kept", "[output]") {
    // The report keeps the first 1000 OOMs.  A pool refusal (oom) takes its call's stack from the
    // alloc_fail that follows it; one past the cap must not write its stack (or err) onto OOM #1000,
    // which would then name a line that did not ask for its memory.
    std::string log =
        "{\"ev\":\"header\",\"format\":\"gpumem-events\",\"version\":4,\"pid\":1,\"host\":\"h\",\"devices\":[{\"index\":0,"
        "\"name\":\"e\",\"total\":1073741824}],\"config\":{\"pool\":\"on\",\"stacks\":\"python\",\"pool_vmm\":\"off\"}}\n"
        "{\"ev\":\"stack\",\"id\":1,\"frames\":[{\"function\":\"ask\",\"file\":\"/src/a.py\",\"line\":1}]}\n"
        "{\"ev\":\"stack\",\"id\":2,\"frames\":[{\"function\":\"later\",\"file\":\"/src/b.py\",\"line\":2}]}\n";
    uint64_t seq = 0;
    for (int i = 0; i < 1001; ++i) {
        const std::string s = std::to_string(i < 1000 ? 1 : 2);
        log += "{\"ev\":\"oom\",\"seq\":" + std::to_string(seq) + ",\"t\":" + std::to_string(seq + 1) +
               ",\"tid\":1,\"dev\":0,\"api\":\"cudaMalloc\",\"size\":2147483648,\"reserved\":0,\"allocated\":0,"
               "\"requested\":0,\"largest_free\":0,\"free_blocks\":0,\"segments\":0,\"gpu_free\":0,\"gpu_total\":1073741824}\n";
        ++seq;
        log += "{\"ev\":\"alloc_fail\",\"seq\":" + std::to_string(seq) + ",\"t\":" + std::to_string(seq + 1) +
               ",\"tid\":1,\"dev\":0,\"api\":\"cudaMalloc\",\"kind\":\"device\",\"ptr\":\"0x0\",\"size\":2147483648,"
               "\"seg\":\"0x0\",\"pooled\":true,\"err\":2,\"stack\":" + s + "}\n";
        ++seq;
    }
    temp_file f(log, "oom_cap");
    process_report p = analyze_file(f.path, {});
    REQUIRE(p.devices.size() == 1);
    const device_report& d = p.devices[0];
    CHECK(d.n_oom == 1001);
    REQUIRE(d.ooms.size() == 1000);
    CHECK(d.ooms.front().stack == 1);
    CHECK(d.ooms.back().stack == 1);  // its own alloc_fail's, not the 1001st's (stack 2)
    CHECK(d.ooms.back().err == 2);
}

TEST_CASE("past the OOMs shown, the text and HTML reports count the rest from n_oom, past the 1000 kept", "[output]") {
    // The report keeps the first 1000 OOMs of a device and shows 20; the text's "... N more OOMs"
    // counted the kept ones, so 1100 OOMs read "980 more" under a table that said 1,100, and the
    // HTML page said nothing of the OOMs it left out.
    std::vector<process_report> ps{analyze_file(data_path("golden/pool_fragmentation.jsonl"), {})};
    device_report& d = ps[0].devices[0];
    REQUIRE(d.ooms.size() == 1);
    d.ooms.resize(1000, d.ooms[0]);
    d.n_oom = 1100;
    const std::string h = html_of(ps), t = text_of(ps);
    CHECK_THAT(t, Catch::Contains("  ... 1,080 more OOMs\n"));
    CHECK_THAT(h, Catch::Contains("<p class=meta>… 1,080 more OOMs not shown.</p>"));
    d.ooms.resize(20);
    d.n_oom = 20;
    const std::string h20 = html_of(ps);
    CHECK_THAT(h20, !Catch::Contains("more OOM"));
}

TEST_CASE("an OOM line's gpu_free without gpu_total is not recorded, for the verdict as for the text", "[output]") {
    // The recorder writes the two together (gpu_total 0: the driver was not asked).  A log with
    // gpu_free alone must not get a verdict that counts memory the same report calls "not recorded".
    std::string log =
        "{\"ev\":\"header\",\"format\":\"gpumem-events\",\"version\":4,\"pid\":1,\"host\":\"h\",\"devices\":[{\"index\":0,"
        "\"name\":\"e\",\"total\":1073741824}],\"config\":{\"pool\":\"off\"}}\n"
        "{\"ev\":\"alloc_fail\",\"seq\":0,\"t\":1,\"tid\":1,\"dev\":0,\"api\":\"cudaMalloc\",\"kind\":\"device\",\"ptr\":\"0x0\","
        "\"size\":2147483648,\"err\":2,\"gpu_free\":5368709120}\n"
        "{\"ev\":\"alloc_fail\",\"seq\":1,\"t\":2,\"tid\":1,\"dev\":0,\"api\":\"cudaMalloc\",\"kind\":\"device\",\"ptr\":\"0x0\","
        "\"size\":2147483648,\"err\":2,\"gpu_free\":5368709120,\"gpu_total\":0}\n"
        "{\"ev\":\"end\",\"seq\":2,\"t\":3,\"tid\":1,\"reason\":\"exit\"}\n";
    temp_file f(log, "gpu_free_alone");
    process_report p = analyze_file(f.path, {});
    REQUIRE(p.devices.size() == 1);
    REQUIRE(p.devices[0].ooms.size() == 2);
    for (const oom_report& o : p.devices[0].ooms) {
        CHECK(o.gpu_total == 0);
        CHECK(o.gpu_free == 0);
        CHECK(o.verdict == "capacity");
    }
}

TEST_CASE("an address allocated again with no free between ends the first lifetime in the call-site views", "[output]") {
    // A lost free (seq 1 here) leaves an address allocated twice.  The rebuild warns and keeps the
    // second block; the sites must too, or the first call site would hold its bytes
    // to the end: at the peak and among the leaks, beside the block that replaced it.
    auto with_stack = [](std::string line, int stack) {
        return line.insert(line.size() - 2, ",\"stack\":" + std::to_string(stack));
    };
    const uint64_t MiB = 1 << 20;
    std::string log = std::string(k_header_off) +
                      "{\"ev\":\"stack\",\"id\":1,\"frames\":[{\"function\":\"first\",\"file\":\"/src/a.py\",\"line\":1}]}\n"
                      "{\"ev\":\"stack\",\"id\":2,\"frames\":[{\"function\":\"second\",\"file\":\"/src/a.py\",\"line\":2}]}\n"
                      "{\"ev\":\"stack\",\"id\":3,\"frames\":[{\"function\":\"other\",\"file\":\"/src/a.py\",\"line\":3}]}\n" +
                      with_stack(alloc_line(0, 0x10000000, 4 * MiB), 1) + lost_line(150, 1) +
                      with_stack(alloc_line(2, 0x10000000, 1 * MiB), 2) + with_stack(alloc_line(3, 0x20000000, 2 * MiB), 3) +
                      end_line(4, 2);
    temp_file f(log, "realloc_sites");
    process_report p = analyze_file(f.path, {});
    REQUIRE(p.devices.size() == 1);
    const device_report& d = p.devices[0];
    auto bytes_of = [](const std::vector<site_row>& rows) {
        std::vector<std::pair<uint32_t, uint64_t>> out;
        for (const site_row& r : rows) out.emplace_back(r.stack, r.bytes);
        return out;
    };
    using v = std::vector<std::pair<uint32_t, uint64_t>>;
    CHECK(bytes_of(d.leak_sites) == v{{3, 2 * MiB}, {2, 1 * MiB}});
    CHECK(d.requested.peak == 4 * MiB);  // the first block alone; 1 + 2 MiB at the end
    CHECK(bytes_of(d.peak_sites) == v{{1, 4 * MiB}});
}

namespace {
frame_view py_frame_at(const std::string& function, const std::string& file, uint64_t line) {
    frame_view f;
    f.function = function;
    f.file = file;
    f.line = line;
    return f;
}
frame_view native_frame_at(const std::string& function, const std::string& module, uint64_t address) {
    frame_view f;
    f.function = function;
    f.module = module;
    f.address = address;
    return f;
}
}  // namespace

TEST_CASE("a site's name is its innermost frame of the program, packages of any install layout skipped", "[sites]") {
    // "Which line allocated what" names the program's own line: frames in site-packages,
    // dist-packages (Debian's pip and a venv on its python) or the standard library are the
    // library the program called, shown as "inside".
    std::vector<frame_view> fr{py_frame_at("Linear.forward", "/opt/env/dist-packages/torch/nn/linear.py", 125),
                               py_frame_at("Net.forward", "/src/model.py", 41),
                               py_frame_at("<module>", "/src/train.py", 50)};
    CHECK(user_frame(fr) == 1);
    CHECK(site_name(&fr) == "Net.forward (model.py:41) <- <module> (train.py:50) (inside Linear.forward (linear.py:125))");
    // No frame of the program at all: the innermost frame names the site.
    std::vector<frame_view> lib{py_frame_at("f", "/usr/lib/python3.11/threading.py", 9),
                                py_frame_at("g", "/opt/env/site-packages/x.py", 3)};
    CHECK(user_frame(lib) == 0);
    CHECK(site_name(&lib) == "f (threading.py:9) <- g (x.py:3)");
}

TEST_CASE("a symbolized native frame with a source file is not taken for the program's Python line", "[sites]") {
    // libdw gives a native frame its C++ file and line; the site is still the first Python frame
    // of the program, with the native frame as what it ran inside.
    std::vector<frame_view> fr{native_frame_at("at::native::empty_cuda", "/opt/libtorch_cuda.so", 0x1a2b),
                               py_frame_at("Net.forward", "/src/model.py", 41)};
    fr[0].file = "/build/aten/src/ATen/native/cuda/Empty.cpp";
    fr[0].line = 33;
    CHECK(user_frame(fr) == 1);
    CHECK(site_name(&fr) == "Net.forward (model.py:41) (inside at::native::empty_cuda (Empty.cpp:33))");
}

TEST_CASE("names are cut at whole UTF-8 characters, three-byte ones included", "[sites]") {
    // A cut inside a character would put invalid UTF-8 in the text and HTML reports.
    const std::string a = "\xe0\xa4\x85";  // U+0905, lead byte 0xe0
    CHECK(shorten(a + a + a + a, 3) == a + a + "…");
    CHECK(shorten(a + a + a, 3) == a + a + a);
    CHECK(shorten("\xc3\xa9\xc3\xa9\xc3\xa9", 2) == "\xc3\xa9…");
}

TEST_CASE("diff matches a named native frame by its name wherever it was loaded, an unnamed one by address", "[sites]") {
    // Two builds put the same function at another address: matched by name, file and line it is
    // one site.  An unnamed frame has only its address to go by.
    std::vector<frame_view> a{native_frame_at("gemm", "/lib/libx.so", 0x1000), py_frame_at("f", "/src/a.py", 3)};
    std::vector<frame_view> b{native_frame_at("gemm", "/lib/libx.so", 0x2000), py_frame_at("f", "/src/a.py", 3)};
    CHECK(site_key(&a) == site_key(&b));
    a[0].function = b[0].function = "";
    CHECK(site_key(&a) != site_key(&b));
    b[1].line = 4;
    a[0].address = b[0].address;
    CHECK(site_key(&a) != site_key(&b));  // another line is another site
}

TEST_CASE("a site's text: the user frame, three callers, how many more, and the innermost frame it ran inside", "[sites]") {
    std::vector<frame_view> fr{py_frame_at("inner", "/opt/env/site-packages/lib.py", 1),
                               py_frame_at("mid", "/opt/env/site-packages/lib.py", 2),
                               py_frame_at("f0", "/src/a.py", 10)};
    for (int i = 1; i <= 5; ++i) fr.push_back(py_frame_at("f" + std::to_string(i), "/src/a.py", uint64_t(10 + i)));
    std::ostringstream os;
    write_frames_text(os, fr, "    ");
    CHECK(os.str() == "f0 (a.py:10)\n"
                      "    called from f1 (a.py:11)\n"
                      "    called from f2 (a.py:12)\n"
                      "    called from f3 (a.py:13)\n"
                      "    ... 2 more frames in --json\n"
                      "    (inside inner (lib.py:1))\n");
    fr.resize(6);  // f0 and exactly three callers: nothing more to count
    std::ostringstream exact;
    write_frames_text(exact, fr, "    ");
    CHECK(exact.str().find("more frame") == std::string::npos);
}

TEST_CASE("diff lists the largest change first, a shrink as much as a growth", "[sites]") {
    // A site that freed 900 bytes matters more than one that grew by 100: ranked by the size of
    // the change, whatever its sign.
    process_report pa, pb;
    for (process_report* p : {&pa, &pb}) {
        p->stacks.add(1, {py_frame_at("grow", "/src/a.py", 1)});
        p->stacks.add(2, {py_frame_at("shrink", "/src/a.py", 2)});
    }
    const std::vector<site_row> rows_a{{1, 100, 1}, {2, 1000, 1}}, rows_b{{1, 200, 1}, {2, 100, 1}};
    auto d = diff_sites(pa, rows_a, 1100, pb, rows_b, 300);
    REQUIRE(d.size() == 2);
    CHECK(d[0].name == "shrink (a.py:2)");
    CHECK(d[0].delta() == -900.0);
    CHECK(d[1].name == "grow (a.py:1)");
}

TEST_CASE("events are bunched when the middle 80% of them fall within a fifth of the time", "[output]") {
    // One event per point at the given times (ns).
    auto dev = [](std::vector<uint64_t> ts) {
        device_report d;
        for (uint64_t t : ts) {
            time_point p;
            p.t_first = p.t_last = t;
            p.events = 1;
            d.timeline.push_back(p);
        }
        return d;
    };
    const uint64_t s = 1000000000;
    // 10 events: the first at 0, 8 within 7 us at 10 s, the last at 20 s.  The middle 80% are the
    // 8; the first event was taken as one of them, so the rows stayed by time.
    std::vector<uint64_t> ten{0};
    for (uint64_t i = 0; i < 8; ++i) ten.push_back(10 * s + i * 1000);
    ten.push_back(20 * s);
    CHECK(events_bunched(dev(ten)));
    // Evenly spread: not bunched.
    std::vector<uint64_t> even;
    for (uint64_t i = 0; i < 10; ++i) even.push_back(i * s);
    CHECK_FALSE(events_bunched(dev(even)));
    // 9 events (at least 10 are needed), and 52 events in 7 points (at least 8), clustered the same
    // way: not bunched.
    CHECK_FALSE(events_bunched(dev(std::vector<uint64_t>(ten.begin() + 1, ten.end()))));
    device_report seven = dev({0, 10 * s, 10 * s + 1, 10 * s + 2, 10 * s + 3, 10 * s + 4, 20 * s});
    for (size_t i = 1; i + 1 < seven.timeline.size(); ++i) seven.timeline[i].events = 10;
    CHECK_FALSE(events_bunched(seven));
    seven.timeline.insert(seven.timeline.begin() + 3, seven.timeline[3]);  // the eighth point
    CHECK(events_bunched(seven));
    // 100 events over 1 s, the middle 80 (the 11th to the 90th) spread over 0.19 s, then 0.21 s.
    auto spread = [&](uint64_t w) {
        std::vector<uint64_t> ts;
        for (uint64_t i = 0; i < 100; ++i) ts.push_back(i < 10 ? i : i >= 90 ? s - 100 + i : s / 2 + (i - 10) * w / 79);
        return ts;
    };
    CHECK(events_bunched(dev(spread(s * 19 / 100))));
    CHECK_FALSE(events_bunched(dev(spread(s * 21 / 100))));
}
