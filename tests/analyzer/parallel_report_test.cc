// `gpumem report` over many logs on many threads (one log each): the same bytes as on one thread,
// on stdout, stderr and in the HTML file, with errors and warnings in the order of the logs.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <string>

#include "test_util.h"

using namespace gpumem::test;

namespace {

struct outputs {
    run_result r;
    std::string html;
};

outputs report(const std::string& args, unsigned jobs) {
    std::string html = "/tmp/gpumem_test_parallel_" + std::to_string(::getpid()) + "_" + std::to_string(jobs) + ".html";
    outputs o{run_gpumem("report --no-progress -j " + std::to_string(jobs) + " --html " + html + " " + args), read_all(html)};
    std::remove(html.c_str());
    return o;
}

}  // namespace

TEST_CASE("report -j N: every thread count gives the output of one thread", "[parallel]") {
    std::string logs;
    size_t n_logs = 0;
    for (const char* f : {"golden/pool_off_basic.jsonl", "golden/pool_fragmentation.jsonl", "golden/pool_auto.jsonl",
                          "golden/pool_off_kinds.jsonl", "golden/killed_truncated.jsonl", "golden/rank0.jsonl",
                          "golden/rank1.jsonl", "golden/pool_vmm_unmap.jsonl", "emu/vmm_fragment_3_60.jsonl",
                          "emu/vmm_fragment_6_60.jsonl"}) {
        logs += " " + data_path(f);
        ++n_logs;
    }
    outputs one = report(logs, 1);
    REQUIRE(one.r.rc == 0);
    CHECK_THAT(one.r.err, Catch::Contains("killed_truncated.jsonl"));  // its warnings come in its place
    CHECK(one.html.size() > 10000);
    for (unsigned j : {2u, 3u, 16u}) {
        INFO("-j " << j);
        outputs many = report(logs, j);
        CHECK(many.r.rc == 0);
        CHECK(many.r.out == one.r.out);
        CHECK(many.r.err == one.r.err);
        CHECK(many.html == one.html);
    }
    run_result json1 = run_gpumem("report --no-progress --json -j 1" + logs);
    run_result json4 = run_gpumem("report --no-progress --json -j 4" + logs);
    CHECK(json1.rc == 0);
    CHECK(json4.out == json1.out);
    // Two empty outputs would be equal too: the one-thread JSON must parse and hold a process per log.
    nlohmann::json j = nlohmann::json::parse(json1.out, nullptr, false);
    REQUIRE(j.is_object());
    CHECK((j.contains("processes") && j["processes"].is_array() && j["processes"].size() == n_logs));
}

TEST_CASE("report -j N: unusable logs among good ones are named in the order given, exit 2", "[parallel]") {
    std::string logs = " " + data_path("golden/rank0.jsonl") + " " + data_path("bad/double_free.jsonl") + " " +
                       data_path("golden/killed_truncated.jsonl") + " " + data_path("bad/out_of_order.jsonl") + " " +
                       data_path("golden/rank1.jsonl");
    run_result one = run_gpumem("report --no-progress -j 1" + logs);
    CHECK(one.rc == 2);
    size_t first = one.err.find("double_free.jsonl:"), second = one.err.find("out_of_order.jsonl:");
    CHECK(first != std::string::npos);
    CHECK(second != std::string::npos);
    CHECK(first < second);
    for (unsigned j : {2u, 5u}) {
        INFO("-j " << j);
        run_result many = run_gpumem("report --no-progress -j " + std::to_string(j) + logs);
        CHECK(many.rc == 2);
        CHECK(many.err == one.err);
        CHECK(many.out == one.out);
    }
}
