// Every unusable input gets a precise "file:line: message" and exit code 2; nothing crashes.
#include <catch2/catch.hpp>

#include "analyze.h"
#include "expect_rejected.h"
#include "log_reader.h"
#include "test_util.h"

using namespace gpumem::analysis;
using namespace gpumem::test;

namespace {
struct bad_case {
    const char* file;  // under tests/data/bad
    uint64_t line;     // 0: the file as a whole
    const char* message;
};
const bad_case k_cases[] = {
    {"empty.jsonl", 0, "empty file: a gpumem log starts with a header line"},
    {"not_json.jsonl", 3, "not JSON (or not a JSON object): this is not json"},
    {"missing_size.jsonl", 2, "\"alloc\" event without \"size\""},
    {"unknown_format.jsonl", 1, "unknown format \"heaptrack\" (expected \"gpumem-events\")"},
    {"newer_version.jsonl", 1, "log format version 5 is newer than this analyzer reads (up to 4): use a newer gpumem"},
    {"no_header.jsonl", 1, "line 1 is not a header"},
    {"header_not_object.jsonl", 1, "line 1 is not a JSON object"},
    {"double_free.jsonl", 4, "double free of pointer 0x1000: it was already freed at line 3"},
    {"unknown_free.jsonl", 3, "free of unknown pointer 0x2000: never allocated in this log and not marked \"unknown\":true"},
    {"out_of_order.jsonl", 4, "events out of order: seq 1 follows seq 2"},
    {"repeated_seq.jsonl", 4, "events out of order: seq 1 follows seq 1"},  // equal is out of order too
    // seq 0 after 2^64-1 is a decrease, not the next seq by wrap-around.
    {"seq_wraps.jsonl", 4, "events out of order: seq 0 follows seq 18446744073709551615"},
    {"concatenated.jsonl", 3, "a second header line: two logs concatenated into one file?"},
    {"bad_hex.jsonl", 2, "member \"ptr\" is \"1000\", expected a hex string like \"0x7f00\""},
    {"negative_size.jsonl", 2, "member \"size\" should be a non-negative integer"},
    {"two_objects.jsonl", 2, "not JSON (trailing characters after the object)"},
    // A block holds at least what was asked for: allocated would fall below requested.
    {"asize_below_size.jsonl", 2, "allocation at 0x1000 of 1000 bytes sets aside 10 (asize below size)"},
    {"block_outside_segment.jsonl", 3, "pooled block [0x1f0000, +131072) lies outside segment [0x100000, +1048576)"},
    {"reuse_safe_no_dev.jsonl", 3, "\"reuse_safe\" event without \"dev\""},
    {"reuse_safe_no_api.jsonl", 3, "\"reuse_safe\" event without \"api\""},
    // config.reuse "auto": the reuse at seq 3 is fine (immediate), the one at seq 7 is not (pending).
    {"alloc_into_pending_auto.jsonl", 9, "pooled block 0x100000 is already allocated in segment 0x100000"},
    // The same log with a config.reuse or config.pool the analyzer cannot rebuild by: named at line
    // 1, not as the block "already allocated" that rebuilding by the wrong rule meets at line 9.
    {"header_reuse_not_a_mode.jsonl", 1, "the header's config.reuse is 5, expected \"auto\", \"safe\" or \"immediate\""},
    {"header_pool_not_a_mode.jsonl", 1, "the header's config.pool is \"yes\", expected \"on\" or \"off\""},
    // A pooled block in a segment of another device: its bytes counted on one device, its block
    // drawn on the other's map, exit 0 before.
    {"pooled_block_other_device.jsonl", 3, "pooled block 0x100000 on dev 1 is in segment 0x100000 of dev 0"},
    // Said as what it is, not as an overlap with a segment that does not exist.
    {"segment_past_2_64.jsonl", 2, "segment [0xfffffffffff00000, +1048576) passes the end of the 64-bit address space"},
    // Named at its own line, not at the next block's "which no segment_alloc created".
    {"segment_size_zero.jsonl", 2, "segment_alloc of [0x100000, +0): a segment of 0 bytes"},
    // "\q" is no JSON escape: the on-demand parser never unescaped it, and it was read as written.
    {"bad_escape.jsonl", 2, "member \"api\" is not valid JSON"},
};
}  // namespace

TEST_CASE("each bad input is rejected with file, line and what was found", "[bad]") {
    for (const bad_case& c : k_cases) {
        INFO(c.file);
        std::string path = data_path(std::string("bad/") + c.file);
        try {
            analyze_file(path, {});
            FAIL("accepted " << c.file);
        } catch (const input_error& e) {
            CHECK(e.file == path);
            CHECK(e.line == c.line);
            CHECK_THAT(e.message, Catch::StartsWith(c.message));
            std::string where = c.line ? path + ":" + std::to_string(c.line) + ": " : path + ": ";
            CHECK_THAT(std::string(e.what()), Catch::StartsWith(where));
        }
    }
}

TEST_CASE("the gpumem binary exits 2 with the message on stderr", "[bad][cli]") {
    for (const bad_case& c : k_cases) {
        INFO(c.file);
        std::string path = data_path(std::string("bad/") + c.file);
        run_result r = run_gpumem("report --no-progress " + path);
        CHECK(r.rc == 2);
        CHECK(r.out.empty());
        CHECK_THAT(r.err, Catch::Contains(std::string("gpumem: error: ") + path));
        CHECK_THAT(r.err, Catch::Contains(c.message));
    }
}

// `gpumem replay` reads a log by the report's order rules (model/log_order.h): the same logs are
// refused, exit 2, with the same file:line and message, so the two never disagree about one file.
TEST_CASE("report and replay refuse a second header or a seq not going forward alike", "[bad][cli]") {
    int n = 0;
    for (const bad_case& c : k_cases) {
        std::string file = c.file;
        if (file != "concatenated.jsonl" && file != "out_of_order.jsonl" && file != "repeated_seq.jsonl") continue;
        INFO(file);
        ++n;
        std::string path = data_path("bad/" + file);
        run_result report = run_gpumem("report --no-progress " + path);
        run_result replay = run_gpumem("replay " + path);
        CHECK(report.rc == 2);
        CHECK(replay.rc == 2);
        CHECK(replay.out.empty());
        CHECK_THAT(replay.err, Catch::Contains(path + ":" + std::to_string(c.line) + ": " + c.message));
        CHECK(replay.err == report.err);
    }
    CHECK(n == 3);
}

// A stack record is not an event (docs/log-format.md: it has no seq): a "seq" member on one, from
// another writer or an edited line, takes no place in the order.  The report never hands stack
// records to the order rules; replay does, so log_order itself must pass over them.
TEST_CASE("a seq on a stack record is not part of the order, for report and replay alike", "[bad][cli]") {
    temp_file f(std::string(k_header_off) + alloc_line(0, 0x1000, 4096) +
                "{\"ev\":\"stack\",\"seq\":0,\"id\":1,\"frames\":[{\"function\":\"f\",\"file\":\"/a.py\",\"line\":1}]}\n" +
                alloc_line(1, 0x2000, 4096) + end_line(2, 2));
    process_report r = analyze_file(f.path, {});
    CHECK(r.n_warnings == 0);
    run_result replay = run_gpumem("replay --no-progress --policy ideal " + f.path);
    CHECK(replay.rc == 0);
    CHECK(replay.err.empty());
}

// A kind this analyzer does not know (a newer recorder's) is skipped wherever it stands: as the
// first event after the header too, where it is not a second header.
TEST_CASE("an unknown kind right after the header is skipped, for report and replay alike", "[bad][cli]") {
    temp_file f(std::string(k_header_off) + "{\"ev\":\"telemetry\",\"seq\":0,\"t\":50,\"tid\":1}\n" +
                alloc_line(1, 0x1000, 4096) + end_line(2, 1));
    process_report r = analyze_file(f.path, {});
    REQUIRE(r.devices.size() == 1);
    CHECK(r.devices[0].requested.current == 4096);
    run_result replay = run_gpumem("replay --no-progress --policy ideal " + f.path);
    CHECK(replay.rc == 0);
    CHECK(replay.err.empty());
}

// A double free is named with the line of the free before it, however many other frees came
// between (the checker remembers the last 2^20).
TEST_CASE("a double free is named as one after other frees", "[bad]") {
    std::string log = std::string(k_header_off) + alloc_line(0, 0x1000, 10) + free_line(1, 0x1000, 10);
    uint64_t seq = 2;
    for (uint64_t p = 0x2000; p < 0x12000; p += 0x1000) {
        log += alloc_line(seq++, p, 10);
        log += free_line(seq++, p, 10);
    }
    expect_rejected(log + free_line(seq, 0x1000, 10), seq + 2, "double free of pointer 0x1000: it was already freed at line 3");
}

// A pointer allocated again is no double-free candidate any more: once that allocation is gone
// without a free (here with its context), a free of it is not a second free of the first one.
TEST_CASE("a free after an address was allocated again and dropped is not called a double free", "[bad]") {
    const std::string reset = "{\"ev\":\"context_reset\",\"seq\":3,\"t\":400,\"tid\":1,\"dev\":0,\"count\":0}\n";
    expect_rejected(std::string(k_header_off) + alloc_line(0, 0x1000, 10) + free_line(1, 0x1000, 10) + alloc_line(2, 0x1000, 10) +
                        reset + free_line(4, 0x1000, 10),
                    6, "free of unknown pointer 0x1000");
}

TEST_CASE("command-line mistakes exit 2 with usage", "[bad][cli]") {
    CHECK(run_gpumem("").rc == 2);
    CHECK(run_gpumem("frobnicate").rc == 2);
    run_result r = run_gpumem("report");
    CHECK(r.rc == 2);
    CHECK_THAT(r.err, Catch::Contains("no log file given"));
    r = run_gpumem("report --at 5h " + data_path("golden/pool_off_basic.jsonl"));
    CHECK(r.rc == 2);
    CHECK_THAT(r.err, Catch::Contains("--at 5h"));
    CHECK(run_gpumem("report --bogus x.jsonl").rc == 2);
    CHECK(run_gpumem("report /nonexistent.jsonl").rc == 2);
    r = run_gpumem("report --help");
    CHECK(r.rc == 0);
    // Where the report's numbers and verdicts are defined (also the man page, made from --help).
    CHECK_THAT(r.out, Catch::Contains("docs/metrics.md"));
    CHECK_THAT(r.out, Catch::Contains("capacity, pending frees, chunk rounding or"));
}

TEST_CASE("one bad log among several fails the whole report", "[bad][cli]") {
    run_result r = run_gpumem("report --no-progress " + data_path("golden/rank0.jsonl") + " " + data_path("bad/empty.jsonl"));
    CHECK(r.rc == 2);
    CHECK_THAT(r.err, Catch::Contains("empty file"));
}

TEST_CASE("a log that ends inside its header is said to be cut short, not to be no gpumem log", "[bad][cli]") {
    // A copy cut short or a disk that filled while line 1 was written: "line 1 is not JSON: not a
    // gpumem log" (report) and "not a gpumem header" (replay) sent the reader to the wrong file.
    std::string header = read_all(data_path("golden/pool_fragmentation.jsonl"));
    header = header.substr(0, header.find('\n'));
    for (size_t cut : {size_t(20), header.size() / 2, header.size() - 1}) {
        INFO(cut);
        temp_file f(header.substr(0, cut), "cut-header");
        const std::string what = f.path + ":1: the log ends inside its header line (cut short: a partial copy, or a disk that filled)";
        for (const char* cmd : {"report --no-progress ", "replay --no-progress ", "check --no-progress --max-peak 1GiB "}) {
            INFO(cmd);
            run_result r = run_gpumem(cmd + f.path);
            CHECK(r.rc == 2);
            CHECK_THAT(r.err, Catch::Contains(what));
        }
    }
    // A damaged header line followed by more lines is not cut short: said as before.
    temp_file damaged(header.substr(0, header.size() / 2) + "\n" + header + "\n", "damaged-header");
    run_result r = run_gpumem("report --no-progress " + damaged.path);
    CHECK(r.rc == 2);
    CHECK_THAT(r.err, Catch::Contains(damaged.path + ":1: line 1 is not JSON"));
}

TEST_CASE("random damage to a valid log never crashes the analyzer", "[bad]") {
    // Cheap in-process fuzzing on every build; the libFuzzer target (GPUMEM_FUZZ) goes further.
    std::string good = read_all(data_path("golden/pool_fragmentation.jsonl"));
    uint64_t x = 88172645463325252ull;
    auto rnd = [&] {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        return x;
    };
    int rejected = 0, accepted = 0;
    for (int i = 0; i < 400; ++i) {
        std::string s = good;
        int edits = 1 + int(rnd() % 4);
        for (int k = 0; k < edits && !s.empty(); ++k) {
            size_t at = rnd() % s.size();
            switch (rnd() % 4) {
            case 0: s[at] = char(rnd() % 256); break;
            case 1: s.erase(at, 1 + rnd() % 20); break;
            case 2: s.insert(at, 1, "{}[]\",:0x-9e\n\\"[rnd() % 14]); break;
            case 3: s.resize(at); break;
            }
        }
        temp_file f(s, "damaged");
        try {
            analyze_file(f.path, {});
            ++accepted;
        } catch (const input_error&) {
            ++rejected;
        }
    }
    CHECK(rejected + accepted == 400);
    CHECK(rejected > 0);
}

// Issue 14 #1: a reason cut at 64 bytes inside a multi-byte character made report --json abort.
TEST_CASE("an end-line reason is cut on a UTF-8 boundary", "[bad][cli]") {
    run_result r = run_gpumem("report --no-progress --json " + data_path("bad/end_reason_utf8_cut.jsonl"));
    CHECK(r.rc == 0);
    CHECK_THAT(r.out, Catch::Contains("\"a\\u00e9") || Catch::Contains("\"aé"));
}

// Issue 14 #19: a version of 2^63 was shown as a negative number.
TEST_CASE("a header version of 2^63 is named as written", "[bad][cli]") {
    run_result r = run_gpumem("report --no-progress " + data_path("bad/version_2_63.jsonl"));
    CHECK(r.rc == 2);
    CHECK_THAT(r.err, Catch::Contains("log format version 9223372036854775808 is newer"));
    CHECK_THAT(r.err, !Catch::Contains("-9223372036854775808"));
}

// Issue 14 #20: an ESC from the log reached the terminal through the text report.
TEST_CASE("control characters from a log are shown, not sent to the terminal", "[bad][cli]") {
    run_result r = run_gpumem("report --no-progress " + data_path("bad/control_chars.jsonl"));
    CHECK(r.rc == 0);
    CHECK(r.out.find('\x1b') == std::string::npos);
    CHECK_THAT(r.out, Catch::Contains("h^[[31mred"));
    r = run_gpumem("report --no-progress --html /dev/stdout " + data_path("bad/control_chars.jsonl"));
    CHECK(r.out.find('\x1b') == std::string::npos);
}
