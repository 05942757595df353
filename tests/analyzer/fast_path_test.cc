// Differential tests of the recorder-shape fast path: parse() and parse_json() (simdjson) must agree field by field.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "event_format.h"
#include "log_reader.h"
#include "test_util.h"

using namespace gpumem;
using namespace gpumem::analysis;
using namespace gpumem::test;

namespace {

// Two parsers fed the same lines in the same order, so their API tables grow alike.
struct twin {
    line_parser fast;  // parse(): fast path, simdjson on any deviation
    line_parser json;  // parse_json() only
    uint64_t lines = 0, fast_taken = 0;

    // Checks one line; returns whether the fast path took it.
    bool check(const std::string& line) {
        std::string buf = line + std::string(64, '\0');  // the padding both paths may read
        log_event probe, ef, ej;
        std::string errf, errj;
        // A scratch parser answers "fast path or not" without touching the twins' API tables.
        line_parser scratch;
        bool took = scratch.parse_recorder_line(buf.data(), line.size(), buf.size(), probe);
        parse_status sf = fast.parse(buf.data(), line.size(), buf.size(), ef, errf);
        parse_status sj = json.parse_json(buf.data(), line.size(), buf.size(), ej, errj);
        INFO("line: " << line);
        REQUIRE(sf == sj);
        if (sf != parse_status::ok) {
            REQUIRE(errf == errj);
        }
        if (took) {
            REQUIRE(sf == parse_status::ok);
        }
        same_event(ef, ej);
        ++lines;
        fast_taken += took;
        return took;
    }

    // Every member of log_event, present or not: both paths start from a default event here, so
    // even a member a path should not have touched must match.
    void same_event(const log_event& a, const log_event& b) {
        CHECK(a.present == b.present);
        CHECK(a.known_kind == b.known_kind);
        CHECK(fast.api_name(a.api) == json.api_name(b.api));
        CHECK(fast.api_count() == json.api_count());
        // Every member of the schema table (core/log_fields.h).
#define GPUMEM_X(id, name, type, carried, required) CHECK(a.id == b.id);
        GPUMEM_LOG_FIELDS(GPUMEM_X)
#undef GPUMEM_X
    }
};

// A value of some magnitude: small, mid, near the 19/20-digit edge, or the extremes.
uint64_t any_u64(std::mt19937_64& rng, bool full_range) {
    switch (rng() % 8) {
    case 0: return 0;
    case 1: return rng() % 10;
    case 2: return rng() % 100000;
    case 3: return full_range ? rng() >> (rng() % 64) : (rng() >> (rng() % 64)) % 10000000000000000000ull;
    case 4: return full_range ? UINT64_MAX - rng() % 3 : 9999999999999999999ull - rng() % 3;
    case 5: return full_range ? 10000000000000000000ull + rng() % 3 : 999999999999999999ull + rng() % 3;
    default: return full_range ? rng() : rng() % 10000000000000000000ull;
    }
}

// A random event as the recorder holds it; `full_range` allows 20-digit numbers and devices the
// analyzer rejects (lines the fast path must leave to simdjson).
event random_event(std::mt19937_64& rng, bool full_range) {
    event e;
    std::memset(&e, 0, sizeof e);
    e.ev = ev_kind(1 + rng() % (size_t(ev_kind::lost)));  // alloc .. lost: what format_event writes
    e.seq = any_u64(rng, full_range);
    e.t_ns = any_u64(rng, full_range);
    e.tid = uint32_t(rng());
    e.err = int32_t(rng() % 3 == 0 ? -int32_t(rng() % 1000) : int32_t(rng() % 2000));
    if (rng() % 8 == 0) e.err = rng() % 2 ? INT32_MIN : INT32_MAX;
    int16_t devs[] = {-1, 0, 1, 7, 32767};
    e.dev = devs[rng() % 5];
    if (full_range && rng() % 6 == 0) e.dev = int16_t(-2 - int(rng() % 100));
    e.kind = mem_kind(rng() % (size_t(mem_kind::count_) + (full_range ? 1 : 0)));
    e.api = api_id(rng() % (size_t(api_id::count_) + 1));  // one past the table writes "unknown"
    e.pool = pool_id(rng() % size_t(pool_id::count_));
    e.ctx = rng() % 2 ? uint8_t(rng()) : 0;  // written for the pool's kinds when not 0
    e.flags = uint8_t(rng() % 64);  // every flag, the pool_sync ones (fence, waited, ordered) too
    if (e.ev == ev_kind::oom || e.ev == ev_kind::stats) {
        uint64_t* p = &e.p.size;
        for (int i = 0; i < 9; ++i) p[i] = any_u64(rng, full_range);
    } else if (e.ev == ev_kind::pool_sync || e.ev == ev_kind::context_reset || e.ev == ev_kind::lost) {
        e.c.count = any_u64(rng, full_range);
        e.c.wait_ns = rng() % 2 ? any_u64(rng, full_range) : 0;  // written for pool_sync only
        e.c.fence_ns = rng() % 2 ? any_u64(rng, full_range) : 0;
    } else {
        e.b.ptr = any_u64(rng, true);  // hex: every 64-bit value is in range
        e.b.size = any_u64(rng, full_range);
        e.b.asize = rng() % 2 ? any_u64(rng, full_range) : 0;
        e.b.seg = rng() % 2 ? any_u64(rng, true) : 0;
        e.b.mempool = rng() % 2 ? any_u64(rng, true) : 0;
        e.b.stream = any_u64(rng, true);
        if (e.ev == ev_kind::alloc_fail) {  // the union's other half: decimal, and absent when gpu_total is 0
            e.b.gpu_free = any_u64(rng, full_range);
            e.b.gpu_total = rng() % 2 ? any_u64(rng, full_range) : 0;
        } else {
            e.b.handle = any_u64(rng, true);
            e.b.offset = any_u64(rng, full_range);
        }
        e.b.stack = rng() % 2 ? any_u64(rng, full_range) : 0;
    }
    return e;
}

std::string format(const event& e) {
    char buf[k_max_event_line];
    size_t n = format_event(e, buf, sizeof buf);
    REQUIRE(n > 1);
    return std::string(buf, n - 1);  // without the newline, as line_source hands lines out
}

// Variations of a valid line that stay valid JSON but leave the recorder's shape.
// Each comes with whether the fast path may still take it (then with parse_json's result).
std::vector<std::pair<std::string, bool>> shape_variations(const std::string& line) {
    std::vector<std::pair<std::string, bool>> out;
    auto add = [&](std::string s, bool may_take = false) { out.emplace_back(std::move(s), may_take); };
    add(" " + line);
    add(line + " ");
    add(line + "\r");
    add("{ " + line.substr(1));
    add(line.substr(0, line.size() - 1) + ",\"zz\":1}");         // unknown member at the end
    add(line.substr(0, line.size() - 1) + ",\"tid\":5}");       // a member twice
    // A space after every comma and colon outside strings, one at a time.
    bool in_str = false;
    for (size_t i = 0; i < line.size(); ++i) {
        if (line[i] == '"') in_str = !in_str;
        if (!in_str && (line[i] == ',' || line[i] == ':')) add(line.substr(0, i + 1) + " " + line.substr(i + 1));
    }
    // Members in another order: the first two after "ev" swapped, and "ev" moved to the end.
    size_t c1 = line.find(',');
    size_t c2 = c1 == std::string::npos ? c1 : line.find(',', c1 + 1);
    size_t c3 = c2 == std::string::npos ? c2 : line.find(',', c2 + 1);
    if (c3 != std::string::npos && line.find('"', c1 + 2) < c2) {
        std::string a = line.substr(c1 + 1, c2 - c1 - 1), b = line.substr(c2 + 1, c3 - c2 - 1);
        add(line.substr(0, c1 + 1) + b + "," + a + line.substr(c3));
        add("{" + line.substr(c1 + 1, line.size() - c1 - 2) + "," + line.substr(1, c1 - 1) + "}");
    }
    // An escaped character in each string value, and upper-case hex.
    for (size_t i = line.find(":\""); i != std::string::npos; i = line.find(":\"", i + 1)) {
        std::string s = line;
        s.insert(i + 2, "\\u0041");
        add(s);
    }
    std::string up = line;
    for (size_t i = up.find("\"0x"); i != std::string::npos; i = up.find("\"0x", i + 1))
        for (size_t j = i + 3; j < up.size() && up[j] != '"'; ++j) up[j] = char(std::toupper(up[j]));
    if (up != line) add(up, true);  // hex_in_place reads both cases alike
    // Numbers JSON spells differently: leading zeros, a fraction, an exponent, a sign.
    for (const char* key : {"\"seq\":", "\"t\":", "\"size\":", "\"dev\":", "\"count\":", "\"err\":"}) {
        size_t k = line.find(key);
        if (k == std::string::npos) continue;
        size_t v = k + std::strlen(key);
        for (const char* ins : {"0", "-0", "+"}) add(line.substr(0, v) + ins + line.substr(v));
        // A minus sign makes a valid negative "err" or "dev":-1 out of "dev":1.
        add(line.substr(0, v) + "-" + line.substr(v), true);
        size_t e = line.find_first_of(",}", v);
        for (const char* app : {".0", "e0"}) add(line.substr(0, e) + app + line.substr(e));
        for (const char* app : {"0", "1"}) add(line.substr(0, e) + app + line.substr(e), true);
    }
    return out;
}

}  // namespace

TEST_CASE("every line the recorder's writer produces takes the fast path, with parse_json's result", "[fastpath]") {
    twin t;
    std::mt19937_64 rng(1);
    for (int i = 0; i < 20000; ++i) {
        std::string line = format(random_event(rng, false));
        INFO(line);
        CHECK(t.check(line));
    }
    CHECK(t.fast_taken == t.lines);
}

TEST_CASE("writer lines with out-of-range values give parse_json's result either way", "[fastpath]") {
    twin t;
    std::mt19937_64 rng(2);
    for (int i = 0; i < 20000; ++i) t.check(format(random_event(rng, true)));
    CHECK(t.fast_taken > 0);
    CHECK(t.fast_taken < t.lines);  // the 20-digit numbers and bad devices fell back
}

TEST_CASE("valid lines out of the recorder's shape fall back to simdjson", "[fastpath]") {
    twin t;
    std::mt19937_64 rng(3);
    for (int i = 0; i < 400; ++i) {
        std::string line = format(random_event(rng, false));
        REQUIRE(t.check(line));
        for (const auto& [v, may_take] : shape_variations(line)) {
            bool took = t.check(v);
            if (!may_take) {
                INFO("variation: " << v);
                CHECK_FALSE(took);
            }
        }
    }
}

TEST_CASE("cut, replaced and inserted bytes give parse_json's status, message and event", "[fastpath]") {
    twin t;
    std::mt19937_64 rng(4);
    const char repl[] = {' ', '"', '\\', '0', '9', 'a', 'A', 'x', '}', '{', ',', ':', '-', '.', '\x01', '\x7f', '\xc3', '\xff'};
    for (int i = 0; i < 120; ++i) {
        std::string line = format(random_event(rng, false));
        for (size_t n = 0; n < line.size(); ++n) t.check(line.substr(0, n));
        for (size_t k = 0; k < line.size(); ++k)
            for (char r : repl) {
                std::string s = line;
                s[k] = r;
                t.check(s);
                t.check(line.substr(0, k) + r + line.substr(k));
            }
    }
}

TEST_CASE("the recorded H200 and golden logs: every event line agrees, and the H200 ones take the fast path", "[fastpath]") {
    for (const char* f : {"h200/torch-2stream-train-pool-on.jsonl", "h200/torch-default-pool-off.jsonl",
                          "h200/torch-default-pool-on.jsonl", "h200/torch-nocache-pool-on.jsonl",
                          "golden/pool_fragmentation.jsonl", "golden/pool_off_basic.jsonl",
                          "golden/pool_off_kinds.jsonl", "golden/rank0.jsonl", "golden/rank1.jsonl",
                          "golden/killed_truncated.jsonl", "golden/pool_auto.jsonl"}) {
        std::ifstream in(data_path(f));
        REQUIRE(in);
        twin t;
        std::string line;
        uint64_t events = 0;
        while (std::getline(in, line)) {
            bool took = t.check(line);
            bool header_or_end = line.rfind("{\"ev\":\"header\"", 0) == 0 || line.rfind("{\"ev\":\"end\"", 0) == 0;
            if (!header_or_end) ++events;
            if (std::string(f).rfind("h200/", 0) == 0 && !header_or_end) {
                INFO(f << ": " << line);
                CHECK(took);
            }
        }
        CHECK(events > 0);
    }
}

TEST_CASE("the fast path leaves the event and the API table alone when it gives up late", "[fastpath]") {
    line_parser p;
    size_t apis = p.api_count();
    log_event e;
    e.size = 123;
    // A new API name, then a deviation at the very end.
    std::string line = "{\"ev\":\"alloc\",\"seq\":1,\"t\":2,\"tid\":3,\"dev\":0,\"api\":\"brandNewApi\",\"kind\":\"device\","
                       "\"ptr\":\"0x10\",\"size\":77,\"zz\":1}";
    std::string buf = line + std::string(64, '\0');
    CHECK_FALSE(p.parse_recorder_line(buf.data(), line.size(), buf.size(), e));
    CHECK(p.api_count() == apis);
    CHECK(e.size == 123);
    CHECK(e.present == 0);
}

TEST_CASE("reuse_safe lines take the fast path with dev and api, as parse_json reads them", "[fastpath]") {
    twin t;
    for (api_id api : {api_id::cuStreamCreate, api_id::cuStreamCreateWithPriority, api_id::cuGreenCtxStreamCreate}) {
        event e;
        std::memset(&e, 0, sizeof e);
        e.ev = ev_kind::reuse_safe;
        e.seq = 17;
        e.t_ns = 123;
        e.tid = 5;
        e.dev = 1;
        e.api = api;
        std::string line = format(e);
        CHECK(line == std::string("{\"ev\":\"reuse_safe\",\"seq\":17,\"t\":123,\"tid\":5,\"dev\":1,\"api\":\"") +
                          k_api_names[size_t(api)] + "\"}");
        CHECK(t.check(line));
        std::string buf = line + std::string(64, '\0');
        log_event out;
        REQUIRE(t.fast.parse_recorder_line(buf.data(), line.size(), buf.size(), out));
        CHECK(out.ev == ev_kind::reuse_safe);
        CHECK(out.dev == 1);
        CHECK(t.fast.api_name(out.api) == k_api_names[size_t(api)]);
        CHECK((line_parser::required_members(out) & ~out.present) == 0);
    }
    // Without "api" or "dev": either path reads the line alike (the fast path takes every member
    // as optional, like parse_json), and the analysis then names the missing member (bad_input_test.cc).
    for (const char* line : {"{\"ev\":\"reuse_safe\",\"seq\":1,\"t\":2,\"tid\":3,\"dev\":0}",
                             "{\"ev\":\"reuse_safe\",\"seq\":1,\"t\":2,\"tid\":3,\"api\":\"cuStreamCreate\"}"}) {
        t.check(line);
        std::string buf = std::string(line) + std::string(64, '\0');
        log_event out;
        std::string err;
        REQUIRE(t.json.parse_json(buf.data(), std::strlen(line), buf.size(), out, err) == parse_status::ok);
        CHECK_FALSE(line_parser::missing_members(out).empty());
    }
}

TEST_CASE("an alloc's optional stack id is written after its other members and read by both paths", "[fastpath]") {
    twin t;
    event e;
    std::memset(&e, 0, sizeof e);
    e.ev = ev_kind::alloc;
    e.seq = 3;
    e.t_ns = 4;
    e.tid = 5;
    e.api = api_id::cudaMalloc;
    e.kind = mem_kind::device;
    e.b.ptr = 0x1000;
    e.b.size = 256;
    std::string plain = format(e);
    CHECK(plain.find("stack") == std::string::npos);  // 0: no stack recorded, no member
    e.b.stack = 42;
    std::string line = format(e);
    CHECK(line == "{\"ev\":\"alloc\",\"seq\":3,\"t\":4,\"tid\":5,\"dev\":0,\"api\":\"cudaMalloc\",\"kind\":\"device\","
                  "\"ptr\":\"0x1000\",\"size\":256,\"stack\":42}");
    CHECK(t.check(line));
    std::string buf = line + std::string(64, '\0');
    log_event out;
    REQUIRE(t.fast.parse_recorder_line(buf.data(), line.size(), buf.size(), out));
    CHECK(out.has(fd_stack));
    CHECK(out.stack == 42);
    // Only allocations carry it: a free's stack stays unwritten.
    e.ev = ev_kind::free;
    CHECK(format(e).find("stack") == std::string::npos);
}

TEST_CASE("a failed allocation's stack id is written after its err and read by both paths", "[fastpath]") {
    // The OOM report names the line that asked (docs/log-format.md, "stack" on alloc_fail).
    twin t;
    event e;
    std::memset(&e, 0, sizeof e);
    e.ev = ev_kind::alloc_fail;
    e.seq = 7;
    e.t_ns = 8;
    e.tid = 9;
    e.api = api_id::cudaMalloc;
    e.kind = mem_kind::device;
    e.flags = ef_pooled;
    e.err = 2;
    e.b.size = 1ull << 40;
    CHECK(format(e).find("stack") == std::string::npos);  // 0: no stack recorded, no member
    e.b.stack = 3;
    std::string line = format(e);
    CHECK(line == "{\"ev\":\"alloc_fail\",\"seq\":7,\"t\":8,\"tid\":9,\"dev\":0,\"api\":\"cudaMalloc\",\"kind\":\"device\","
                  "\"ptr\":\"0x0\",\"size\":1099511627776,\"seg\":\"0x0\",\"pooled\":true,\"err\":2,\"stack\":3}");
    CHECK(t.check(line));  // the recorder's own shape: the fast path takes it
    std::string buf = line + std::string(64, '\0');
    log_event out;
    REQUIRE(t.fast.parse_recorder_line(buf.data(), line.size(), buf.size(), out));
    CHECK(out.has(fd_stack));
    CHECK(out.stack == 3);
    CHECK(out.err == 2);
}

TEST_CASE("a pool_sync without wait_ns, fence_ns, ordered or ctx reads 0 after one with them, on either path", "[fastpath]") {
    // The twins above start every line from a default event; the reader reuses one, so a member
    // the replay sums must be reset by each path (k_reset_fields, parse_json).
    event e;
    std::memset(&e, 0, sizeof e);
    e.ev = ev_kind::pool_sync;
    e.seq = 1;
    e.c.count = 1;
    e.flags = uint8_t(ef_fence | ef_waited | ef_ordered);
    e.c.wait_ns = 777;
    e.c.fence_ns = 555;
    e.ctx = 3;  // the device's fourth pool; the next line is its first's, which leaves "ctx" out
    const std::string with = format(e);
    e.seq = 2;
    e.flags = ef_fence;
    e.c.wait_ns = 0;
    e.c.fence_ns = 0;
    e.ctx = 0;
    const std::string without = format(e);
    REQUIRE(with.find("\"wait_ns\":777") != std::string::npos);
    REQUIRE(with.find("\"fence_ns\":555") != std::string::npos);
    REQUIRE(without.find("fence_ns") == std::string::npos);
    REQUIRE(with.find("\"ordered\":true") != std::string::npos);
    REQUIRE(without.find("wait_ns") == std::string::npos);
    for (bool fast : {true, false}) {
        CAPTURE(fast);
        line_parser p;
        log_event out;
        std::string err;
        for (const std::string* l : {&with, &without}) {
            std::string buf = *l + std::string(64, '\0');
            if (fast) REQUIRE(p.parse_recorder_line(buf.data(), l->size(), buf.size(), out));
            else REQUIRE(p.parse_json(buf.data(), l->size(), buf.size(), out, err) == parse_status::ok);
            if (l == &with) CHECK(out.wait_ns == 777);
            if (l == &with) CHECK(out.fence_ns == 555);
            if (l == &with) CHECK(out.ordered);
            if (l == &with) CHECK(out.ctx == 3);
        }
        CHECK(out.ctx == 0);  // read as the first pool's, not the line before's
        CHECK(out.wait_ns == 0);
        CHECK(out.fence_ns == 0);
        CHECK_FALSE(out.ordered);  // a flag is reset per line too
        CHECK_FALSE(out.waited);
        CHECK_FALSE(out.has(fd_wait_ns));
        CHECK_FALSE(out.has(fd_fence_ns));
    }
}

TEST_CASE("with one event reused line after line, each path reads every line as on a fresh event", "[fastpath]") {
    // The reader reuses one log_event.  Each path must reset every member of k_reset_fields at each
    // line: one it missed would keep the line before's value (parse_json once kept a list of its
    // own, which could drift from k_reset_fields).  The members outside it are meaningful only
    // when present.  A second parser, fed the same lines into a fresh event each time, keeps an
    // API table like the first's.
    const log_event def;
    for (bool fast : {true, false}) {
        CAPTURE(fast);
        std::mt19937_64 rng(5);
        line_parser p, fresh_p;
        log_event out;
        uint64_t exercised = 0;  // reset members left out by a line after a line that set them
        for (int i = 0; i < 20000; ++i) {
            const std::string line = format(random_event(rng, false));
            INFO("line: " << line);
            std::string buf = line + std::string(64, '\0');
            const log_event before = out;
            log_event fresh;
            std::string err;
            if (fast) {
                REQUIRE(p.parse_recorder_line(buf.data(), line.size(), buf.size(), out));
                REQUIRE(fresh_p.parse_recorder_line(buf.data(), line.size(), buf.size(), fresh));
            } else {
                REQUIRE(p.parse_json(buf.data(), line.size(), buf.size(), out, err) == parse_status::ok);
                REQUIRE(fresh_p.parse_json(buf.data(), line.size(), buf.size(), fresh, err) == parse_status::ok);
            }
            REQUIRE(out.present == fresh.present);
            CHECK(out.known_kind == fresh.known_kind);
#define GPUMEM_X(id, name, type, carried, required)                                           \
    if ((k_reset_fields | out.present) & bit(fd_##id)) CHECK(out.id == fresh.id);              \
    if ((k_reset_fields & bit(fd_##id)) && !out.has(fd_##id) && !(before.id == def.id)) exercised |= bit(fd_##id);
            GPUMEM_LOG_FIELDS(GPUMEM_X)
#undef GPUMEM_X
        }
        // Every reset member was put to the test: left out after a line that gave it a value.
        CHECK(exercised == k_reset_fields);
    }
}
