// Tests of pool_config: defaults, GPUMEM_* parsing, rejection of bad values, header description.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <string>

#include "core/pool/pool_config.h"
#include "core/size_parse.h"

using namespace gpumem;

namespace {
std::map<std::string, std::string> g_env;
const char* fake_getenv(const char* n) {
    auto it = g_env.find(n);
    return it == g_env.end() ? nullptr : it->second.c_str();
}
pool_config with(std::map<std::string, std::string> env) {
    g_env = std::move(env);
    return pool_config::from_env(fake_getenv);
}
}  // namespace

TEST_CASE("config defaults are the documented ones", "[pool][config]") {
    const pool_config c = with({});
    CHECK(c.reuse == reuse_mode::automatic);
    CHECK(c.round == 512);
    CHECK(c.small_size == 1u << 20);
    CHECK(c.small_segment == 2u << 20);
    CHECK(c.small_split == 512);
    CHECK(c.large_segment == 20u << 20);
    CHECK(c.min_large_alloc == 10u << 20);
    CHECK(c.large_round == 2u << 20);
    CHECK(c.large_split == 1u << 20);
    CHECK(c.sync_budget == 32u << 20);
    CHECK(c.sync_budget_div == 16);
    CHECK(c.fence_batch == 4);
    CHECK(c.stats_ms == 1000);
    CHECK(c.warnings.empty());
    CHECK(c.check().empty());
}

TEST_CASE("config reads values with binary suffixes", "[pool][config]") {
    const pool_config c = with({{"GPUMEM_REUSE", "immediate"},
                                {"GPUMEM_POOL_LARGE_SEGMENT", "64M"},
                                {"GPUMEM_POOL_SMALL_SEGMENT", "4MiB"},
                                {"GPUMEM_POOL_ROUND", "1k"},
                                {"GPUMEM_SYNC_BUDGET", "1G"},
                                {"GPUMEM_STATS_MS", "0"}});
    CHECK(c.warnings.empty());
    CHECK(c.reuse == reuse_mode::immediate);
    CHECK(c.large_segment == 64u << 20);
    CHECK(c.small_segment == 4u << 20);
    CHECK(c.round == 1024);
    CHECK(c.sync_budget == 1u << 30);
    CHECK(c.stats_ms == 0);
}

TEST_CASE("config reads sizes by core/size_parse.h's rule, as the CLI does", "[pool][config]") {
    // "3MB" once meant 3 MiB here and 3,000,000 on the command line (issue 9): now one rule.
    const pool_config c = with({{"GPUMEM_SYNC_BUDGET", "3MB"}, {"GPUMEM_POOL_LARGE_SEGMENT", "1.5 GiB"},
                                {"GPUMEM_POOL_MIN_LARGE_ALLOC", "10MiB"}});
    CHECK(c.warnings.empty());
    uint64_t v = 0;
    REQUIRE(parse_size("3MB", &v));
    CHECK(c.sync_budget == v);
    CHECK(c.sync_budget == 3000000);
    CHECK(c.large_segment == 1536ull << 20);
    // A value the rule rejects keeps the default and says so.
    const pool_config d = with({{"GPUMEM_SYNC_BUDGET", "3 MB/s"}});
    CHECK(d.sync_budget == 32u << 20);
    CHECK(d.warnings.find("GPUMEM_SYNC_BUDGET=3 MB/s") != std::string::npos);
}

TEST_CASE("config reads each reuse mode and writes it to the header", "[pool][config]") {
    for (const char* m : {"auto", "safe", "immediate"}) {
        const pool_config c = with({{"GPUMEM_REUSE", m}});
        CHECK(c.warnings.empty());
        std::string s;
        c.append_config_json(s);
        CHECK(s.find(std::string("\"reuse\":\"") + m + "\",") != std::string::npos);
    }
    CHECK(with({{"GPUMEM_REUSE", "safe"}}).reuse == reuse_mode::safe);
    CHECK(with({{"GPUMEM_REUSE", "auto"}}).reuse == reuse_mode::automatic);
}

TEST_CASE("config keeps defaults for malformed values and says why", "[pool][config]") {
    const pool_config c = with({{"GPUMEM_REUSE", "fast"},
                                {"GPUMEM_POOL_ROUND", "300"},           // not a power of two
                                {"GPUMEM_POOL_LARGE_SEGMENT", "12Q"},   // bad suffix
                                {"GPUMEM_SYNC_BUDGET", "-5"},
                                {"GPUMEM_STATS_MS", "99999999999999999999999"}});  // overflow
    CHECK(c.reuse == reuse_mode::safe);  // unreadable: the mode that is safe for every program
    CHECK(c.round == 512);
    CHECK(c.large_segment == 20u << 20);
    CHECK(c.sync_budget == 32u << 20);
    CHECK(c.stats_ms == 1000);
    CHECK(c.warnings.find("GPUMEM_REUSE=fast") != std::string::npos);
    CHECK(c.warnings.find("GPUMEM_POOL_ROUND=300") != std::string::npos);
    CHECK(c.warnings.find("GPUMEM_POOL_LARGE_SEGMENT=12Q") != std::string::npos);
    CHECK(c.warnings.find("GPUMEM_SYNC_BUDGET=-5") != std::string::npos);
    CHECK(c.warnings.find("GPUMEM_STATS_MS=") != std::string::npos);
}

TEST_CASE("config: counts and milliseconds take digits alone", "[pool][config]") {
    // Under the size rule "2MiB" frees read as 2,097,152 and "1k" ms as 1024, silently.
    const pool_config c = with({{"GPUMEM_FENCE_BATCH", "2MiB"}, {"GPUMEM_STATS_MS", "1k"}, {"GPUMEM_SYNC_BUDGET_DIV", "1.5"}});
    CHECK(c.fence_batch == 4);
    CHECK(c.stats_ms == 1000);
    CHECK(c.sync_budget_div == 16);
    CHECK(c.warnings.find("GPUMEM_FENCE_BATCH=2MiB: not a valid value (expected a whole number from 1 to 2^48); using 4") !=
          std::string::npos);
    CHECK(c.warnings.find("GPUMEM_STATS_MS=1k: not a valid value (expected milliseconds from 0 to 2^48 (0: never)); using 1000") !=
          std::string::npos);
    CHECK(c.warnings.find("GPUMEM_SYNC_BUDGET_DIV=1.5") != std::string::npos);
    const pool_config ok = with({{"GPUMEM_FENCE_BATCH", "8"}, {"GPUMEM_STATS_MS", "250"}, {"GPUMEM_SYNC_BUDGET_DIV", "32"}});
    CHECK(ok.fence_batch == 8);
    CHECK(ok.stats_ms == 250);
    CHECK(ok.sync_budget_div == 32);
    CHECK(ok.warnings.empty());
}

TEST_CASE("config resets sizes that contradict each other", "[pool][config]") {
    // A small pool whose largest request cannot fit a small segment.
    const pool_config c = with({{"GPUMEM_POOL_SMALL_SIZE", "4M"}, {"GPUMEM_STATS_MS", "250"}, {"GPUMEM_FENCE_BATCH", "1"},
                                {"GPUMEM_FENCE_WAIT", "any"}});
    CHECK(c.small_size == 1u << 20);
    CHECK(c.stats_ms == 250);  // not a size: kept
    CHECK(c.fence_batch == 1);  // nor is this
    CHECK(c.wait_any);  // nor this
    CHECK(c.warnings.find("inconsistent") != std::string::npos);
    CHECK(c.check().empty());
    // A chunk larger than any device would turn caching off: refused, and the default kept.
    const pool_config huge = with({{"GPUMEM_POOL_CHUNK", "2GiB"}});
    CHECK(huge.chunk == 0);
    CHECK(huge.warnings.find("GPUMEM_POOL_CHUNK=2GiB: not a valid value (expected a size from 0 to 1GiB, such as 2MiB); using 0") !=
          std::string::npos);
    CHECK(with({{"GPUMEM_POOL_CHUNK", "20MiB"}}).chunk == 20u << 20);
}

TEST_CASE("config: a size out of range is refused alone, and every other choice and the warnings stay", "[pool][config]") {
    // One budget above 2^48 reset the whole configuration, GPUMEM_REUSE=safe included, and
    // dropped every warning: the program ran with reuse auto and nothing said so.
    for (const char* knob : {"GPUMEM_SYNC_BUDGET", "GPUMEM_POOL_TRIM", "GPUMEM_POOL_HEADROOM"}) {
        INFO(knob);
        const pool_config c = with({{"GPUMEM_REUSE", "safe"}, {"GPUMEM_POOL_VMM", "off"}, {"GPUMEM_FENCE_WAIT", "old"},
                                    {"GPUMEM_STATS_MS", "250"}, {knob, "1125899906842624"}});
        CHECK(c.reuse == reuse_mode::safe);
        CHECK(!c.vmm);
        CHECK(!c.order);
        CHECK(c.stats_ms == 250);
        CHECK(c.warnings.find(std::string(knob) + "=1125899906842624: not a valid value (expected a size from 0 to 2^48 bytes") !=
              std::string::npos);
        CHECK(c.check().empty());
    }
}

TEST_CASE("config: a refused value says what the knob accepts", "[pool][config]") {
    // "GPUMEM_POOL_ROUND=300: not a valid value; using 512" left the rule (a power of two >= 256)
    // to docs/pool.md.
    const pool_config c = with({{"GPUMEM_POOL_ROUND", "300"},
                                {"GPUMEM_POOL_SMALL_SPLIT", "0"},
                                {"GPUMEM_FENCE_BATCH", "0"},
                                {"GPUMEM_STATS_MS", "1s"}});
    CHECK(c.warnings.find("GPUMEM_POOL_ROUND=300: not a valid value (expected a power of two from 256 to 2^48 bytes); using 512\n") !=
          std::string::npos);
    CHECK(c.warnings.find("GPUMEM_POOL_SMALL_SPLIT=0: not a valid value (expected a size from 1 to 2^48 bytes, such as 2MiB); "
                          "using 512\n") != std::string::npos);
    CHECK(c.warnings.find("GPUMEM_FENCE_BATCH=0: not a valid value (expected a whole number from 1 to 2^48); using 4\n") !=
          std::string::npos);
    CHECK(c.warnings.find("GPUMEM_STATS_MS=1s: not a valid value (expected milliseconds from 0 to 2^48 (0: never)); using 1000\n") !=
          std::string::npos);
}

TEST_CASE("config: word values in any case, as GPUMEM_POOL and GPUMEM_STACKS take them", "[pool][config]") {
    // GPUMEM_REUSE=Immediate ran as safe, GPUMEM_FENCE_WAIT=Old as order, GPUMEM_POOL_ARENA=OFF with
    // arenas, each with a warning, where GPUMEM_POOL=OFF and GPUMEM_STACKS=Native were taken.
    const pool_config c = with({{"GPUMEM_REUSE", "Immediate"}, {"GPUMEM_FENCE_WAIT", "OLD"}, {"GPUMEM_POOL_ARENA", "Off"}});
    CHECK(c.reuse == reuse_mode::immediate);
    CHECK(!c.order);
    CHECK(!c.wait_any);
    CHECK(!c.arenas);
    CHECK(c.warnings.empty());
    const pool_config d = with({{"GPUMEM_REUSE", "AUTO"}, {"GPUMEM_FENCE_WAIT", "Any"}, {"GPUMEM_POOL_ARENA", "ON"}});
    CHECK(d.reuse == reuse_mode::automatic);
    CHECK(d.wait_any);
    CHECK(d.arenas);
    CHECK(d.arena == 0);
    CHECK(d.warnings.empty());
    CHECK(with({{"GPUMEM_REUSE", "Safe"}}).warnings.empty());
}

TEST_CASE("config describes itself for the log header", "[pool][config]") {
    pool_config c = with({{"GPUMEM_REUSE", "immediate"}});
    std::string s = "{";
    c.append_config_json(s);
    CHECK(s.find("\"reuse\":\"immediate\",") != std::string::npos);
    CHECK(s.find("\"pool_round\":512,") != std::string::npos);
    CHECK(s.find("\"pool_large_segment\":20971520,") != std::string::npos);
    CHECK(s.find("\"sync_budget\":33554432,") != std::string::npos);
    CHECK(s.find("\"stats_ms\":1000,") != std::string::npos);
    CHECK(s.back() == ',');
    CHECK(s.find("\"pool_vmm\":\"on\",") != std::string::npos);
    CHECK(s.find("\"pool_trim\":0,") != std::string::npos);
    CHECK(s.find("\"pool_arena\":\"auto\",") != std::string::npos);
    CHECK(s.find("\"pool_stitch\":\"off\",") != std::string::npos);
    CHECK(s.find("\"fence_batch\":4,") != std::string::npos);
    CHECK(s.find("\"pool_chunk\":0,") != std::string::npos);
    CHECK(s.find("\"fence_wait\":\"order\",") != std::string::npos);
    CHECK(s.find("\"pool_headroom\":268435456,") != std::string::npos);
    CHECK(s.find("\"pool_stitch_keep\":2,") != std::string::npos);
    CHECK(s.find("\"order_batch\":33554432,") != std::string::npos);
    // 5 string knobs + 17 numeric knobs, one comma each.
    CHECK(std::count(s.begin(), s.end(), ',') == 22);
    pool_config kept = with({{"GPUMEM_POOL_STITCH_KEEP", "5"}});
    CHECK(kept.stitch_keep == 5);
    CHECK(kept.warnings.empty());
    for (const char* bad : {"17", "-1", "2x", "x"}) {
        pool_config b = with({{"GPUMEM_POOL_STITCH_KEEP", bad}});
        CHECK(b.stitch_keep == 2);
        CHECK(b.warnings.find("GPUMEM_POOL_STITCH_KEEP") != std::string::npos);
    }
    std::string off = "{", sized = "{";
    with({{"GPUMEM_POOL_ARENA", "off"}}).append_config_json(off);
    with({{"GPUMEM_POOL_ARENA", "64GiB"}}).append_config_json(sized);
    CHECK(off.find("\"pool_arena\":\"off\",") != std::string::npos);
    CHECK(sized.find("\"pool_arena\":68719476736,") != std::string::npos);
    std::string st = "{";
    pool_config stitched = with({{"GPUMEM_POOL_STITCH", "on"}});
    stitched.append_config_json(st);
    CHECK(stitched.stitch);
    CHECK(st.find("\"pool_stitch\":\"on\",") != std::string::npos);
    CHECK_FALSE(with({{"GPUMEM_POOL_STITCH", "maybe"}}).stitch);
    // Switches read as GPUMEM_POOL does: any case, true/false and yes/no too.
    CHECK(with({{"GPUMEM_POOL_STITCH", "YES"}}).stitch);
    CHECK_FALSE(with({{"GPUMEM_POOL_VMM", "Off"}}).vmm);
    CHECK(with({{"GPUMEM_POOL_VMM", "Off"}}).warnings.empty());
    CHECK(with({{"GPUMEM_POOL_STITCH", "on"}, {"GPUMEM_REUSE", "immediate"}}).warnings.find("no effect") != std::string::npos);
    CHECK(with({{"GPUMEM_POOL_STITCH", "on"}}).warnings.empty());
    CHECK(with({{"GPUMEM_POOL_STITCH", "maybe"}}).warnings.find("GPUMEM_POOL_STITCH=maybe") != std::string::npos);
    // GPUMEM_FENCE_WAIT: three words; anything else keeps the default (order) with a warning.
    CHECK_FALSE(pool_config{}.wait_any);
    CHECK(pool_config{}.order);
    CHECK(with({{"GPUMEM_FENCE_WAIT", "any"}}).wait_any);
    CHECK_FALSE(with({{"GPUMEM_FENCE_WAIT", "any"}}).order);
    CHECK_FALSE(with({{"GPUMEM_FENCE_WAIT", "old"}}).wait_any);
    CHECK_FALSE(with({{"GPUMEM_FENCE_WAIT", "old"}}).order);
    CHECK(with({{"GPUMEM_FENCE_WAIT", "order"}}).order);
    const pool_config bad_wait = with({{"GPUMEM_FENCE_WAIT", "always"}});
    CHECK_FALSE(bad_wait.wait_any);
    CHECK(bad_wait.order);
    CHECK(bad_wait.warnings.find("GPUMEM_FENCE_WAIT=always") != std::string::npos);
}

TEST_CASE("GPUMEM_POOL_VMM turns virtual-memory segments off, and warns on nonsense", "[pool][config]") {
    CHECK(pool_config{}.vmm);  // the default, where the device supports it
    CHECK_FALSE(with({{"GPUMEM_POOL_VMM", "off"}}).vmm);
    CHECK(with({{"GPUMEM_POOL_VMM", "on"}}).vmm);
    const pool_config c = with({{"GPUMEM_POOL_VMM", "maybe"}});
    CHECK(c.vmm);
    CHECK(c.warnings.find("GPUMEM_POOL_VMM=maybe") != std::string::npos);
}
