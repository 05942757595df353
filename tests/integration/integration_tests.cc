// Integration tests: real programs under LD_PRELOAD=libgpumem.so on the emulated device, checked line by line.
#include "harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

// Events of one kind, as (api, size) pairs.
std::multiset<std::pair<std::string, uint64_t>> calls(const std::vector<json>& ls, const std::string& ev) {
    std::multiset<std::pair<std::string, uint64_t>> out;
    for (auto& j : ls)
        if (j["ev"] == ev) out.insert({j["api"].get<std::string>(), j.value("size", uint64_t(0))});
    return out;
}

void check_header_and_end(const std::vector<json>& ls, const char* reason = "exit") {
    REQUIRE(ls.size() >= 2);
    CHECK(ls.front()["ev"] == "header");
    CHECK(ls.front()["format"] == "gpumem-events");
    CHECK(ls.front()["version"] == 2);
    CHECK(ls.front()["devices"].size() == 1);
    CHECK(ls.front()["devices"][0]["name"] == "gpumem emulated device 0");
    CHECK(ls.back()["ev"] == "end");
    CHECK(ls.back()["reason"] == reason);
    CHECK(ls.back()["lost"] == 0);
    CHECK(ls.back()["unmatched"] == 0);
    // seq is gap-free and in file order
    uint64_t expect = 0;
    for (size_t i = 1; i + 1 < ls.size(); ++i) CHECK(ls[i]["seq"] == expect++);
}

// What the driver-level basic scenario does, by api and requested size.
const std::multiset<std::pair<std::string, uint64_t>> k_basic_allocs = {
    {"cuMemAlloc_v2", 1000}, {"cuMemAlloc_v2", 1 << 20}, {"cuMemAlloc_v2", (3 << 20) + 5}, {"cuMemAlloc_v2", 64 << 20},
    {"cuMemAllocPitch_v2", 10000}, {"cuMemAllocManaged", 4096}, {"cuMemAllocAsync", 8192},
    {"cuMemHostAlloc", 12345}, {"cuMemAllocHost_v2", 777}};
const std::multiset<std::pair<std::string, uint64_t>> k_basic_frees = {
    {"cuMemFree_v2", 1000}, {"cuMemFree_v2", 1 << 20}, {"cuMemFree_v2", (3 << 20) + 5}, {"cuMemFree_v2", 64 << 20},
    {"cuMemFree_v2", 10000}, {"cuMemFree_v2", 4096}, {"cuMemFreeAsync", 8192},
    {"cuMemFreeHost", 12345}, {"cuMemFreeHost", 777}};

void check_basic_driver(const run_result& r) {
    REQUIRE(WIFEXITED(r.status));
    REQUIRE(WEXITSTATUS(r.status) == 0);
    REQUIRE(r.logs.size() == 1);
    auto ls = lines_of(r.logs[0]);
    check_header_and_end(ls);
    CHECK(calls(ls, "alloc") == k_basic_allocs);
    CHECK(calls(ls, "free") == k_basic_frees);
    REQUIRE(count_ev(ls, "alloc_fail") == 1);
    for (auto& j : ls) {
        if (j["ev"] == "alloc_fail") CHECK(j["err"] == 2);  // CUDA_ERROR_OUT_OF_MEMORY
        if (j["ev"] == "alloc" && j["api"] == "cuMemAllocPitch_v2") CHECK(j["asize"] == 10240);
        if (j["ev"] == "alloc" && j["api"] == "cuMemAllocAsync") CHECK(j["stream"] == "0x5000");
        if (j["ev"] == "alloc" && j["api"] == "cuMemHostAlloc") CHECK(j["kind"] == "host");
        if (j["ev"] == "alloc" && j["api"] == "cuMemAllocManaged") CHECK(j["kind"] == "managed");
        if (j["ev"] == "free" && j["size"] == 4096) CHECK(j["kind"] == "managed");
    }
    CHECK(ls.back()["n_alloc"] == 9);
    CHECK(ls.back()["n_free"] == 9);
    CHECK(ls.back()["n_fail"] == 1);
    CHECK(ls.back()["live_allocs"] == 0);
}

}  // namespace

TEST_CASE("libgpumem.so needs only libc and exports only its hooks") {
    FILE* p = popen("readelf -d -W " GPUMEM_LIB " | grep NEEDED", "r");
    REQUIRE(p);
    char buf[512];
    std::vector<std::string> needed;
    while (fgets(buf, sizeof buf, p)) needed.push_back(buf);
    pclose(p);
    REQUIRE(!needed.empty());
    for (auto& n : needed)
        CHECK((n.find("libc.so.6") != std::string::npos || n.find("ld-linux") != std::string::npos));

    p = popen("readelf --dyn-syms -W " GPUMEM_LIB, "r");
    REQUIRE(p);
    int exported = 0;
    while (fgets(buf, sizeof buf, p)) {
        std::istringstream ss(buf);
        std::string num, value, size, type, bind, vis, ndx, name;
        if (!(ss >> num >> value >> size >> type >> bind >> vis >> ndx >> name)) continue;
        if (ndx == "UND" || bind == "LOCAL" || (type != "FUNC" && type != "OBJECT")) continue;
        INFO("exported symbol: " << name);
        CHECK((name.rfind("cu", 0) == 0 || name == "dlsym" || name == "_exit" || name == "_Exit"));
        CHECK(name.find('@') == std::string::npos);  // unversioned: must interpose versioned references
        exported++;
    }
    pclose(p);
    CHECK(exported >= 40);
    // No C++ runtime symbol versions required: libstdc++ is linked in and hidden.
    p = popen("readelf -V -W " GPUMEM_LIB " | grep -c -E 'GLIBCXX|CXXABI'", "r");
    REQUIRE(fgets(buf, sizeof buf, p));
    pclose(p);
    CHECK(std::string(buf) == "0\n");
}

TEST_CASE("way a: exported driver symbols, program linked against libcuda") {
    check_basic_driver(run({EMU_DRIVER_APP, "basic"}, {{"GPUMEM_ROUTES", "a"}}));
}

TEST_CASE("way a off: the same program records nothing, so way a alone did it") {
    auto r = run({EMU_DRIVER_APP, "basic"}, {{"GPUMEM_ROUTES", "b"}});
    CHECK(WEXITSTATUS(r.status) == 0);
    CHECK(r.logs.empty());
}

TEST_CASE("way b: dlsym on the libcuda handle, as JAX does") {
    check_basic_driver(run({EMU_DRIVER_APP, "basic-dlsym"}, {{"GPUMEM_ROUTES", "b"}}));
    auto off = run({EMU_DRIVER_APP, "basic-dlsym"}, {{"GPUMEM_ROUTES", "a,c,d"}});
    CHECK(off.logs.empty());
}

TEST_CASE("way c: a static runtime resolving through the cuGetProcAddress self-lookup") {
    auto r = run({EMU_RT_STATIC_APP, "basic"}, {{"GPUMEM_ROUTES", "c"}});
    REQUIRE(WEXITSTATUS(r.status) == 0);
    REQUIRE(r.logs.size() == 1);
    auto ls = lines_of(r.logs[0]);
    check_header_and_end(ls);
    // Static cudaMalloc is invisible; what its runtime calls underneath is recorded.
    std::multiset<std::pair<std::string, uint64_t>> allocs = {{"cuMemAlloc_v2", 1 << 20}, {"cuMemAlloc_v2", 5000},
                                                              {"cuMemAllocPitch_v2", 10000}, {"cuMemAllocManaged", 4096},
                                                              {"cuMemAllocAsync", 8192}};
    CHECK(calls(ls, "alloc") == allocs);
    CHECK(count_ev(ls, "free") == 5);
    CHECK(count_ev(ls, "alloc_fail") == 1);
    CHECK(run({EMU_RT_STATIC_APP, "basic"}, {{"GPUMEM_ROUTES", "a,b,d"}}).logs.empty());
}

TEST_CASE("way c picks the _ptsz variant the real resolver chose") {
    auto r = run({EMU_RT_STATIC_APP, "basic"}, {{"GPUMEM_EMU_PTDS", "1"}});
    REQUIRE(r.logs.size() == 1);
    auto ls = lines_of(r.logs[0]);
    CHECK(calls(ls, "alloc").count({"cuMemAllocAsync_ptsz", 8192}) == 1);
    CHECK(calls(ls, "free").count({"cuMemFreeAsync_ptsz", 8192}) == 1);
}

TEST_CASE("way d: VMM functions from cudaGetDriverEntryPointByVersion, as expandable segments do") {
    auto r = run({EMU_RT_SHARED_APP, "vmm"}, {{"GPUMEM_ROUTES", "d"}});
    REQUIRE(WEXITSTATUS(r.status) == 0);
    REQUIRE(r.logs.size() == 1);
    auto ls = lines_of(r.logs[0]);
    check_header_and_end(ls);
    REQUIRE(count_ev(ls, "alloc") == 1);
    for (auto& j : ls) {
        if (j["ev"] == "alloc") {
            CHECK(j["api"] == "cuMemCreate");
            CHECK(j["kind"] == "vmm");
            CHECK(j["size"] == 4 << 20);
            CHECK(j["dev"] == 0);
        }
        if (j["ev"] == "map") {
            CHECK(j["size"] == 4 << 20);
            CHECK(j["offset"] == 0);
        }
        if (j["ev"] == "reserve") CHECK(j["size"] == 64 << 20);
    }
    CHECK(count_ev(ls, "free") == 1);
    CHECK(count_ev(ls, "map") == 1);
    CHECK(count_ev(ls, "unmap") == 1);
    CHECK(count_ev(ls, "reserve") == 1);
    CHECK(count_ev(ls, "unreserve") == 1);
    // The handle the program saw is the one in the log.
    std::string handle = r.out.substr(r.out.find("handle=") + 7);
    handle = handle.substr(0, handle.find('\n'));
    for (auto& j : ls)
        if (j["ev"] == "alloc") CHECK(j["ptr"] == handle);
}

TEST_CASE("shared runtime, every way on: each allocation recorded once, under the runtime's name") {
    auto r = run({EMU_RT_SHARED_APP, "basic"});
    REQUIRE(WEXITSTATUS(r.status) == 0);
    REQUIRE(r.logs.size() == 1);
    auto ls = lines_of(r.logs[0]);
    check_header_and_end(ls);
    std::multiset<std::pair<std::string, uint64_t>> allocs = {{"cudaMalloc", 1 << 20}, {"cudaMalloc", 5000},
                                                              {"cudaMallocPitch", 10000}, {"cudaMallocManaged", 4096},
                                                              {"cudaMallocAsync", 8192}};
    CHECK(calls(ls, "alloc") == allocs);
    std::multiset<std::pair<std::string, uint64_t>> frees = {{"cudaFree", 1 << 20}, {"cudaFree", 5000},
                                                             {"cudaFree", 10000}, {"cudaFree", 4096},
                                                             {"cudaFreeAsync", 8192}};
    CHECK(calls(ls, "free") == frees);
    REQUIRE(count_ev(ls, "alloc_fail") == 1);
    for (auto& j : ls)
        if (j["ev"] == "alloc_fail") CHECK(j["api"] == "cudaMalloc");
}

TEST_CASE("multi-threaded program: 8 threads, 1.6M events, exact counts") {
    // Pass-through: exactly one line per call.  The pooled variant (segment, sync and stats lines
    // besides) is in pool_integration_tests.cc.
    auto r = run({EMU_DRIVER_APP, "stress", "8", "100000"}, {{"GPUMEM_POOL", "off"}});
    REQUIRE(WEXITSTATUS(r.status) == 0);
    REQUIRE(r.logs.size() == 1);
    std::ifstream in(r.logs[0]);
    std::string line, last;
    uint64_t n = 0, allocs = 0, frees = 0;
    while (std::getline(in, line)) {
        n++;
        allocs += line.find("\"ev\":\"alloc\"") != std::string::npos;
        frees += line.find("\"ev\":\"free\"") != std::string::npos;
        last = line;
    }
    CHECK(n == 1 + 1600000 + 1);
    CHECK(allocs == 800000);
    CHECK(frees == 800000);
    json end = json::parse(last);
    CHECK(end["n_alloc"] == 800000);
    CHECK(end["live_allocs"] == 0);
    CHECK(end["lost"] == 0);
}

TEST_CASE("crashes: abort, SIGSEGV and SIGTERM still end the log with every event") {
    for (auto [mode, sig] : {std::pair{"abort", SIGABRT}, {"segv", SIGSEGV}, {"term", SIGTERM}}) {
        INFO(mode);
        auto r = run({EMU_DRIVER_APP, "crash", mode, "1000"});
        REQUIRE(WIFSIGNALED(r.status));
        CHECK(WTERMSIG(r.status) == sig);  // the program still dies of its own signal
        REQUIRE(r.logs.size() == 1);
        auto ls = lines_of(r.logs[0]);
        check_header_and_end(ls, "signal");
        CHECK(ls.back()["signal"] == sig);
        CHECK(count_ev(ls, "alloc") == 1000);
        CHECK(ls.back()["live_allocs"] == 1000);
    }
}

TEST_CASE("SIGKILL: every line is complete JSON and at most the last flush interval is missing") {
    auto r = run({EMU_DRIVER_APP, "crash", "kill", "1000"}, {{"GPUMEM_FLUSH_MS", "20"}});
    REQUIRE(WIFSIGNALED(r.status));
    CHECK(WTERMSIG(r.status) == SIGKILL);
    REQUIRE(r.logs.size() == 1);
    std::string text = slurp(r.logs[0]);
    REQUIRE(!text.empty());
    CHECK(text.back() == '\n');
    auto ls = lines_of(r.logs[0]);  // throws on any partial line
    CHECK(ls.front()["ev"] == "header");
    CHECK(ls.back()["ev"] != "end");
    // The first 1000 were made 300 ms (15 flush intervals) before the kill: all of them are there.
    CHECK(count_ev(ls, "alloc") >= 1000);
}

TEST_CASE("_exit (as multiprocessing workers end) keeps every event") {
    auto r = run({EMU_DRIVER_APP, "crash", "_exit", "500"});
    REQUIRE(WIFEXITED(r.status));
    REQUIRE(r.logs.size() == 1);
    auto ls = lines_of(r.logs[0]);
    check_header_and_end(ls, "_exit");
    CHECK(count_ev(ls, "alloc") == 500);
}

TEST_CASE("fork: the child writes its own complete file and ends with _exit") {
    auto r = run({EMU_DRIVER_APP, "fork", "300"});
    REQUIRE(WEXITSTATUS(r.status) == 0);
    REQUIRE(r.logs.size() == 2);
    std::string child_pid = r.out.substr(r.out.find("child=") + 6);
    child_pid = child_pid.substr(0, child_pid.find('\n'));
    for (auto& path : r.logs) {
        auto ls = lines_of(path);
        if (path.find("gpumem-" + child_pid + ".jsonl") != std::string::npos) {
            check_header_and_end(ls, "_exit");
            CHECK(ls.front().contains("forked_from"));
            CHECK(count_ev(ls, "alloc") == 300);
            CHECK(count_ev(ls, "free") == 300);
        } else {
            check_header_and_end(ls, "exit");
            CHECK(count_ev(ls, "alloc") == 1);
            CHECK(count_ev(ls, "free") == 1);
        }
    }
}

TEST_CASE("GPUMEM_OUT pattern: pid and rank") {
    auto r = run({EMU_DRIVER_APP, "basic"}, {{"GPUMEM_OUT", "run-r%r-%p.jsonl"}, {"RANK", "3"}});
    REQUIRE(r.logs.size() == 1);
    CHECK(r.logs[0].find("/run-r3-") != std::string::npos);
}

TEST_CASE("an unwritable GPUMEM_OUT falls back to /tmp and says so") {
    auto r = run({EMU_DRIVER_APP, "basic"}, {{"GPUMEM_OUT", "/nonexistent-dir/x-%p.jsonl"}});
    CHECK(WEXITSTATUS(r.status) == 0);
    CHECK(r.err.find("cannot create /nonexistent-dir/") != std::string::npos);
    std::string tmp = r.err.substr(r.err.find("/tmp/x-"));
    tmp = tmp.substr(0, tmp.find('\n'));
    auto ls = lines_of(tmp);
    CHECK(ls.back()["ev"] == "end");
    unlink(tmp.c_str());
}

TEST_CASE("a program that never allocates leaves no log") {
    auto r = run({"/bin/true"});
    CHECK(WEXITSTATUS(r.status) == 0);
    CHECK(r.logs.empty());
}

TEST_CASE("a vfork child's _exit does not end the parent's log") {
    auto r = run({EMU_DRIVER_APP, "vfork"}, {{"GPUMEM_POOL", "off"}});
    REQUIRE(WEXITSTATUS(r.status) == 0);
    CHECK(r.out.find("child_status=7") != std::string::npos);
    REQUIRE(r.logs.size() == 1);
    auto ls = lines_of(r.logs[0]);
    check_header_and_end(ls, "exit");
    CHECK(count_ev(ls, "end") == 1);
    CHECK(count_ev(ls, "alloc") == 2);
    CHECK(count_ev(ls, "free") == 2);
}
