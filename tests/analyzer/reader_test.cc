// Tests of the line reader and the line parser: chunk boundaries, truncated lines, every member type.
#include <catch2/catch.hpp>

#include <fstream>

#include "log_reader.h"
#include "test_util.h"

using namespace gpumem;
using namespace gpumem::analysis;
using namespace gpumem::test;

namespace {
parse_status parse_str(line_parser& p, const std::string& s, log_event& e, std::string& err) {
    std::string buf = s + std::string(64, '\0');  // simdjson reads padding past the line
    return p.parse(buf.data(), s.size(), buf.size(), e, err);
}
}  // namespace

TEST_CASE("parse_hex accepts 0x followed by 1 to 16 hex digits only", "[reader]") {
    uint64_t v = 0;
    CHECK(parse_hex("0x7f3a40000000", v));
    CHECK(v == 0x7f3a40000000ull);
    CHECK(parse_hex("0xFFFFFFFFFFFFFFFF", v));
    CHECK(v == UINT64_MAX);
    CHECK_FALSE(parse_hex("0x", v));
    CHECK_FALSE(parse_hex("7f00", v));
    CHECK_FALSE(parse_hex("0x1g", v));
    CHECK_FALSE(parse_hex("0x11112222333344445", v));  // 17 digits overflow 64 bits
}

TEST_CASE("an alloc line is parsed member by member", "[reader]") {
    line_parser p;
    log_event e;
    std::string err;
    REQUIRE(parse_str(p, "{\"ev\":\"alloc\",\"seq\":7,\"t\":81234,\"tid\":42,\"dev\":1,\"api\":\"cuMemAllocPitch_v2\","
                         "\"kind\":\"device\",\"ptr\":\"0x7f3a40000000\",\"size\":3000,\"asize\":4096,"
                         "\"seg\":\"0x7f3a00000000\",\"pooled\":true,\"stream\":\"0x5\"}",
                      e, err) == parse_status::ok);
    CHECK(e.known_kind);
    CHECK(e.ev == ev_kind::alloc);
    CHECK(e.seq == 7);
    CHECK(e.t == 81234);
    CHECK(e.dev == 1);
    CHECK(p.api_name(e.api) == "cuMemAllocPitch_v2");
    CHECK(e.api == uint16_t(api_id::cuMemAllocPitch_v2));
    CHECK(e.kind == mem_kind::device);
    CHECK(e.ptr == 0x7f3a40000000ull);
    CHECK(e.size == 3000);
    CHECK(e.set_aside() == 4096);
    CHECK(e.seg == 0x7f3a00000000ull);
    CHECK(e.pooled);
    CHECK(line_parser::missing_members(e).empty());
}

TEST_CASE("unknown members and kinds are skipped, known ones still read", "[reader]") {
    line_parser p;
    log_event e;
    std::string err;
    REQUIRE(parse_str(p, "{\"ev\":\"free\",\"new\":{\"a\":[1,{\"b\":null}]},\"seq\":1,\"t\":2,\"dev\":0,\"api\":\"cudaFree\","
                         "\"kind\":\"device\",\"ptr\":\"0x10\",\"size\":5,\"zzz\":\"x\"}",
                      e, err) == parse_status::ok);
    CHECK(e.ev == ev_kind::free);
    CHECK(e.size == 5);
    REQUIRE(parse_str(p, "{\"ev\":\"telemetry\",\"seq\":3,\"t\":4}", e, err) == parse_status::ok);
    CHECK_FALSE(e.known_kind);
    // An API this analyzer does not know is kept by name.
    REQUIRE(parse_str(p, "{\"ev\":\"alloc\",\"seq\":1,\"t\":2,\"dev\":0,\"api\":\"cuMemAllocV3\",\"kind\":\"device\","
                         "\"ptr\":\"0x10\",\"size\":5}",
                      e, err) == parse_status::ok);
    CHECK(p.api_name(e.api) == "cuMemAllocV3");
}

TEST_CASE("malformed lines are rejected with the reason", "[reader]") {
    line_parser p;
    log_event e;
    std::string err;
    CHECK(parse_str(p, "{\"ev\":\"alloc\",\"seq\":1", e, err) == parse_status::not_json);
    CHECK(parse_str(p, "garbage", e, err) == parse_status::not_json);
    CHECK(parse_str(p, "{\"ev\":\"alloc\"} {}", e, err) == parse_status::not_json);
    CHECK_THAT(err, Catch::Contains("trailing"));
    CHECK(parse_str(p, "{\"ev\":\"alloc\",\"size\":\"12\"}", e, err) == parse_status::bad_member);
    CHECK(err == "member \"size\" should be a non-negative integer");
    CHECK(parse_str(p, "{\"ev\":\"alloc\",\"ptr\":\"12\"}", e, err) == parse_status::bad_member);
    CHECK_THAT(err, Catch::Contains("expected a hex string"));
    CHECK(parse_str(p, "{\"ev\":\"alloc\",\"dev\":-7}", e, err) == parse_status::bad_member);
    CHECK(parse_str(p, "{\"ev\":\"alloc\",\"pooled\":1}", e, err) == parse_status::bad_member);
    CHECK(err == "member \"pooled\" should be true or false");
    CHECK(parse_str(p, "{\"seq\":1}", e, err) == parse_status::bad_member);
    CHECK(err == "missing member \"ev\"");
}

TEST_CASE("missing members are named per event kind", "[reader]") {
    line_parser p;
    log_event e;
    std::string err;
    REQUIRE(parse_str(p, "{\"ev\":\"alloc\",\"seq\":1,\"t\":2,\"dev\":0,\"api\":\"cudaMalloc\",\"kind\":\"device\"}", e, err) ==
            parse_status::ok);
    CHECK(line_parser::missing_members(e) == "\"ptr\", \"size\"");
    // A free of an unknown pointer legitimately has size 0 and may omit nothing else.
    REQUIRE(parse_str(p, "{\"ev\":\"free\",\"seq\":1,\"t\":2,\"dev\":-1,\"api\":\"cudaFree\",\"kind\":\"device\",\"ptr\":\"0x1\",\"unknown\":true}",
                      e, err) == parse_status::ok);
    CHECK(line_parser::missing_members(e).empty());
    // "lost" carries no seq (a loss occupies no position in the order).
    REQUIRE(parse_str(p, "{\"ev\":\"lost\",\"t\":2,\"tid\":1,\"count\":9}", e, err) == parse_status::ok);
    CHECK(line_parser::missing_members(e).empty());
    REQUIRE(parse_str(p, "{\"ev\":\"alloc\",\"seq\":1,\"t\":2,\"dev\":0,\"api\":\"cudaMalloc\",\"kind\":\"device\",\"ptr\":\"0x1\",\"size\":1,\"pooled\":true}",
                      e, err) == parse_status::ok);
    CHECK(line_parser::missing_members(e) == "\"seg\"");
}

TEST_CASE("line_source splits lines across chunk boundaries and grows for long lines", "[reader]") {
    // A 5 MiB line is longer than one 4 MiB read, so the buffer must grow and keep it whole.
    std::string long_line = "{\"ev\":\"x\",\"pad\":\"" + std::string(5 << 20, 'a') + "\"}";
    std::string content = "first\n" + long_line + "\nthird\nlast-no-newline";
    temp_file f(content);
    line_source src(f.path);
    std::string_view line;
    bool complete = false;
    REQUIRE(src.next(line, complete));
    CHECK(line == "first");
    CHECK(complete);
    REQUIRE(src.next(line, complete));
    CHECK(line.size() == long_line.size());
    CHECK(line.substr(line.size() - 4) == "aa\"}");
    REQUIRE(src.next(line, complete));
    CHECK(line == "third");
    CHECK(src.line_number() == 3);
    REQUIRE(src.next(line, complete));
    CHECK(line == "last-no-newline");
    CHECK_FALSE(complete);
    CHECK_FALSE(src.next(line, complete));
    CHECK(src.bytes_consumed() == content.size());
}

TEST_CASE("line_source reads a growing file as it stood when opened", "[reader]") {
    // A running job's log, its writer in the middle of a line when the report opens it.
    temp_file f("header\nfirst\nsecond-cut");
    line_source src(f.path);
    std::string_view line;
    bool complete = false;
    REQUIRE(src.next(line, complete));
    CHECK(line == "header");
    {
        std::ofstream more(f.path, std::ios::binary | std::ios::app);
        more << "-rest\nthird\n";  // written after the open: not part of this reading
    }
    REQUIRE(src.next(line, complete));
    CHECK(line == "first");
    REQUIRE(src.next(line, complete));
    CHECK(line == "second-cut");
    CHECK_FALSE(complete);
    CHECK_FALSE(src.next(line, complete));
    CHECK(src.file_size() == 23);

    // A second pass reads what the first read (its limit), though the file has grown since.
    line_source again(f.path, src.bytes_consumed());
    uint64_t n = 0;
    while (again.next(line, complete)) ++n;
    CHECK(n == 3);
    CHECK(line == "second-cut");
    CHECK_FALSE(complete);
    line_source all(f.path);  // opened now: everything written so far
    n = 0;
    while (all.next(line, complete)) ++n;
    CHECK(n == 4);
    CHECK(line == "third");
}

TEST_CASE("line_source reports files it cannot open", "[reader]") {
    CHECK_THROWS_WITH(line_source("/nonexistent/gpumem.jsonl"), Catch::Contains("cannot open"));
    CHECK_THROWS_WITH(line_source("/tmp"), Catch::Contains("is a directory"));
}
