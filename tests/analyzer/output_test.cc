// Output writers: the segment bar, the JSON schema's required keys, a self-contained HTML page and
// a loadable Perfetto trace.  Byte-exact outputs are covered by the golden test.
#include <catch2/catch.hpp>

#include <sstream>

#include "analyze.h"
#include "format_util.h"
#include "report_output.h"
#include "test_util.h"

using namespace gpumem::analysis;
using namespace gpumem::test;

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

TEST_CASE("the HTML page is self-contained", "[output]") {
    std::vector<process_report> ps{analyze_file(data_path("golden/pool_fragmentation.jsonl"), {})};
    std::ostringstream o;
    write_html(o, ps, combine(ps), {});
    std::string h = o.str();
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
