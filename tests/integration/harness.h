// The integration tests' harness: run a program under LD_PRELOAD=libgpumem.so on the emulated device, read its log.
#pragma once

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

using json = nlohmann::json;

// Every run directory of this test process, removed when it exits (a 100k-pair run leaves a log of
// hundreds of MB; thousands were left in /tmp until the disk was full).  GPUMEM_IT_KEEP=1 keeps
// them for a post-mortem.
inline std::vector<std::string>& run_dirs() {
    static std::vector<std::string>* dirs = [] {
        auto* v = new std::vector<std::string>();  // leaked: still alive when atexit runs
        std::atexit([] {
            const char* keep = std::getenv("GPUMEM_IT_KEEP");
            if (keep && *keep && std::string(keep) != "0") return;
            std::error_code ec;
            for (const auto& d : run_dirs()) std::filesystem::remove_all(d, ec);
        });
        return v;
    }();
    return *dirs;
}

struct run_result {
    int status = 0;         // raw wait status
    std::string out;        // stdout
    std::string err;        // stderr
    std::vector<std::string> logs;  // log files in the run's directory
};

inline std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// In a forked child before exec: unsets every inherited GPUMEM_* but the emulated device's
// GPUMEM_EMU_*, so that what the test sets is all gpumem reads.  Every other one changes what a
// test sees: the pool's knobs (GPUMEM_POOL_*, GPUMEM_FENCE_*, GPUMEM_SYNC_BUDGET*,
// GPUMEM_ORDER_BATCH; a CI that exported GPUMEM_POOL_CHUNK=8MiB broke the pinned capacities) and
// the log's (GPUMEM_OUT, GPUMEM_ROUTES, GPUMEM_STACKS, GPUMEM_WAIT_MS, ...).
inline void clear_gpumem_settings() {
    extern char** environ;
    std::vector<std::string> names;
    for (char** e = environ; e && *e; ++e) {
        const std::string kv = *e;
        const std::string name = kv.substr(0, kv.find('='));
        if (name.rfind("GPUMEM_", 0) == 0 && name.rfind("GPUMEM_EMU_", 0) != 0) names.push_back(name);
    }
    for (const auto& n : names) unsetenv(n.c_str());  // after the walk: unsetenv moves environ's entries
}

// Runs `argv` in a fresh directory with LD_PRELOAD and the emulated device, plus `env`.
inline run_result run(std::vector<std::string> argv, std::map<std::string, std::string> env = {}, bool preload = true) {
    // mkdtemp, not a name made of pid and counter: pids are reused, and a directory left by an
    // earlier run with the same pid would add its logs to this run's.
    char tmpl[] = "/tmp/gpumem-it-XXXXXX";
    if (!mkdtemp(tmpl)) {
        run_result bad{};
        bad.status = -1;
        bad.err = "mkdtemp failed";
        return bad;
    }
    const std::string dir = tmpl;
    run_dirs().push_back(dir);
    pid_t pid = fork();
    if (pid == 0) {
        if (chdir(dir.c_str()) != 0) _exit(126);
        int o = open("stdout.txt", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open("stderr.txt", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(o, 1);
        dup2(e, 2);
        setenv("LD_LIBRARY_PATH", EMU_DRIVER_DIR ":" EMU_RT_DIR, 1);
        // Without the preload the program runs alone, even where the tests themselves were started
        // with an LD_PRELOAD (gpumem's, say): the "alone" runs are what gpumem is compared with.
        if (preload) setenv("LD_PRELOAD", GPUMEM_LIB, 1);
        else unsetenv("LD_PRELOAD");
        // gpumem's settings come only from the test (the pool is on by default).
        clear_gpumem_settings();
        unsetenv("RANK");
        unsetenv("LOCAL_RANK");
        for (auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
        std::vector<char*> args;
        for (auto& a : argv) args.push_back(a.data());
        args.push_back(nullptr);
        execv(args[0], args.data());
        _exit(127);
    }
    run_result r;
    waitpid(pid, &r.status, 0);
    r.out = slurp(dir + "/stdout.txt");
    r.err = slurp(dir + "/stderr.txt");
    if (DIR* d = opendir(dir.c_str())) {
        while (dirent* e = readdir(d)) {
            std::string n = e->d_name;
            if (n.size() > 6 && n.substr(n.size() - 6) == ".jsonl") r.logs.push_back(dir + "/" + n);
        }
        closedir(d);
    }
    std::sort(r.logs.begin(), r.logs.end());
    return r;
}

// `key=value` lines a program printed.
inline std::map<std::string, std::string> values(const std::string& out) {
    std::map<std::string, std::string> m;
    std::istringstream in(out);
    std::string line;
    while (std::getline(in, line))
        if (auto eq = line.find('='); eq != std::string::npos) m[line.substr(0, eq)] = line.substr(eq + 1);
    return m;
}

// last_may_be_cut: a thread still writing when the process ended may leave its line cut short
// (the kernel stops a killed thread's write at a page), which the analyzer reads as such; only a
// last line without its newline may be.
inline std::vector<json> lines_of(const std::string& path, bool last_may_be_cut = false) {
    std::ifstream in(path);
    std::vector<json> out;
    std::string line;
    while (std::getline(in, line)) {
        if (last_may_be_cut && in.eof()) {
            json j = json::parse(line, nullptr, false);
            if (!j.is_discarded()) out.push_back(std::move(j));
            break;
        }
        out.push_back(json::parse(line));
    }
    return out;
}

inline size_t count_ev(const std::vector<json>& ls, const std::string& ev) {
    size_t n = 0;
    for (auto& j : ls) n += j["ev"] == ev;
    return n;
}

