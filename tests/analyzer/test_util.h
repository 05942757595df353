// Helpers shared by the analyzer tests: temporary log files and running the gpumem binary.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace gpumem::test {

inline constexpr uint64_t MiB = 1 << 20;

inline std::string data_path(const std::string& rel) { return std::string(GPUMEM_TEST_DATA) + "/" + rel; }

// A file under /tmp that removes itself.
struct temp_file {
    std::string path;
    explicit temp_file(const std::string& content, const std::string& tag = "log") {
        static int n = 0;
        path = "/tmp/gpumem_test_" + std::to_string(::getpid()) + "_" + std::to_string(n++) + "_" + tag + ".jsonl";
        std::ofstream f(path, std::ios::binary);
        f << content;
    }
    ~temp_file() { std::remove(path.c_str()); }
};

inline std::string read_all(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

struct run_result {
    int rc;
    std::string out, err;
};

// Runs the built gpumem binary with `args` (shell words) and captures its output.
inline run_result run_gpumem(const std::string& args) {
    static int n = 0;
    std::string base = "/tmp/gpumem_test_run_" + std::to_string(::getpid()) + "_" + std::to_string(n++);
    std::string cmd = std::string(GPUMEM_BINARY) + " " + args + " >" + base + ".out 2>" + base + ".err";
    int st = std::system(cmd.c_str());
    run_result r{WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), read_all(base + ".out"), read_all(base + ".err")};
    std::remove((base + ".out").c_str());
    std::remove((base + ".err").c_str());
    return r;
}

inline const char* k_header_off =
    "{\"ev\":\"header\",\"format\":\"gpumem-events\",\"version\":1,\"pid\":1,\"ppid\":0,\"host\":\"h\",\"rank\":\"0\","
    "\"cmdline\":[\"t\"],\"start_unix_ns\":0,\"start_time\":\"1970-01-01T00:00:00Z\",\"devices\":[{\"index\":0,"
    "\"name\":\"test\",\"total\":1073741824}],\"config\":{\"pool\":\"off\"},\"gpumem_version\":\"0.1.0\"}\n";
inline const char* k_header_on =
    "{\"ev\":\"header\",\"format\":\"gpumem-events\",\"version\":1,\"pid\":1,\"ppid\":0,\"host\":\"h\",\"rank\":\"0\","
    "\"cmdline\":[\"t\"],\"start_unix_ns\":0,\"start_time\":\"1970-01-01T00:00:00Z\",\"devices\":[{\"index\":0,"
    "\"name\":\"test\",\"total\":1073741824}],\"config\":{\"pool\":\"on\"},\"gpumem_version\":\"0.1.0\"}\n";

// Event line builders, in the recorder's member order.
inline std::string alloc_line(uint64_t seq, uint64_t ptr, uint64_t size, int dev = 0, const char* kind = "device",
                              const char* api = "cudaMalloc") {
    char b[400];
    std::snprintf(b, sizeof b,
                  "{\"ev\":\"alloc\",\"seq\":%llu,\"t\":%llu,\"tid\":1,\"dev\":%d,\"api\":\"%s\",\"kind\":\"%s\",\"ptr\":\"0x%llx\",\"size\":%llu}\n",
                  (unsigned long long)seq, (unsigned long long)(seq * 100 + 100), dev, api, kind, (unsigned long long)ptr,
                  (unsigned long long)size);
    return b;
}
inline std::string free_line(uint64_t seq, uint64_t ptr, uint64_t size, int dev = 0, const char* kind = "device",
                             const char* api = "cudaFree") {
    char b[400];
    std::snprintf(b, sizeof b,
                  "{\"ev\":\"free\",\"seq\":%llu,\"t\":%llu,\"tid\":1,\"dev\":%d,\"api\":\"%s\",\"kind\":\"%s\",\"ptr\":\"0x%llx\",\"size\":%llu}\n",
                  (unsigned long long)seq, (unsigned long long)(seq * 100 + 100), dev, api, kind, (unsigned long long)ptr,
                  (unsigned long long)size);
    return b;
}
inline std::string seg_line(const char* ev, uint64_t seq, uint64_t ptr, uint64_t size, int dev = 0) {
    char b[400];
    std::snprintf(b, sizeof b,
                  "{\"ev\":\"%s\",\"seq\":%llu,\"t\":%llu,\"tid\":1,\"dev\":%d,\"api\":\"cuMemAlloc_v2\",\"ptr\":\"0x%llx\",\"size\":%llu,\"pool\":\"large\"}\n",
                  ev, (unsigned long long)seq, (unsigned long long)(seq * 100 + 100), dev, (unsigned long long)ptr,
                  (unsigned long long)size);
    return b;
}
inline std::string pooled_line(const char* ev, uint64_t seq, uint64_t ptr, uint64_t size, uint64_t asize, uint64_t seg,
                               int dev = 0) {
    char b[400];
    std::snprintf(b, sizeof b,
                  "{\"ev\":\"%s\",\"seq\":%llu,\"t\":%llu,\"tid\":1,\"dev\":%d,\"api\":\"%s\",\"kind\":\"device\",\"ptr\":\"0x%llx\",\"size\":%llu,\"asize\":%llu,\"seg\":\"0x%llx\",\"pooled\":true}\n",
                  ev, (unsigned long long)seq, (unsigned long long)(seq * 100 + 100), dev, ev[0] == 'a' ? "cudaMalloc" : "cudaFree",
                  (unsigned long long)ptr, (unsigned long long)size, (unsigned long long)asize, (unsigned long long)seg);
    return b;
}
inline std::string pool_sync_line(uint64_t seq, uint64_t count, int dev = 0) {
    return "{\"ev\":\"pool_sync\",\"seq\":" + std::to_string(seq) + ",\"t\":" + std::to_string(seq * 100 + 100) +
           ",\"tid\":1,\"dev\":" + std::to_string(dev) + ",\"count\":" + std::to_string(count) + "}\n";
}
// A stack record: one frame, function "f<id>" at /src/train.py line <id>.
inline std::string stack_line(int id) {
    return "{\"ev\":\"stack\",\"id\":" + std::to_string(id) + ",\"frames\":[{\"function\":\"f" + std::to_string(id) +
           "\",\"file\":\"/src/train.py\",\"line\":" + std::to_string(id) + "}]}\n";
}
// The pool's oom line: the request, its own account at the moment (reserved, allocated, requested,
// largest free block, free blocks, segments) and what the driver said was free of its total.
struct pool_account {
    uint64_t reserved = 0, allocated = 0, requested = 0, largest_free = 0, free_blocks = 0, segments = 0;
};
inline std::string oom_line(uint64_t seq, uint64_t size, const pool_account& a, uint64_t gpu_free, uint64_t gpu_total) {
    return "{\"ev\":\"oom\",\"seq\":" + std::to_string(seq) + ",\"t\":" + std::to_string(seq * 100 + 100) +
           ",\"tid\":1,\"dev\":0,\"api\":\"cudaMalloc\",\"size\":" + std::to_string(size) +
           ",\"reserved\":" + std::to_string(a.reserved) + ",\"allocated\":" + std::to_string(a.allocated) +
           ",\"requested\":" + std::to_string(a.requested) + ",\"largest_free\":" + std::to_string(a.largest_free) +
           ",\"free_blocks\":" + std::to_string(a.free_blocks) + ",\"segments\":" + std::to_string(a.segments) +
           ",\"gpu_free\":" + std::to_string(gpu_free) + ",\"gpu_total\":" + std::to_string(gpu_total) + "}\n";
}
// The recorder's lost line: `count` events not recorded (no seq of its own), at time t.
inline std::string lost_line(uint64_t t, uint64_t count) {
    return "{\"ev\":\"lost\",\"t\":" + std::to_string(t) + ",\"tid\":1,\"count\":" + std::to_string(count) + "}\n";
}
inline std::string reuse_safe_line(uint64_t seq, int dev = 0, const char* api = "cuStreamCreate") {
    return "{\"ev\":\"reuse_safe\",\"seq\":" + std::to_string(seq) + ",\"t\":" + std::to_string(seq * 100 + 100) +
           ",\"tid\":1,\"dev\":" + std::to_string(dev) + ",\"api\":\"" + api + "\"}\n";
}
// A pool-on header whose config.reuse is `reuse` ("" leaves the member out), with devices 0 and 1.
inline std::string header_reuse(const std::string& reuse) {
    return "{\"ev\":\"header\",\"format\":\"gpumem-events\",\"version\":2,\"pid\":1,\"ppid\":0,\"host\":\"h\",\"rank\":\"0\","
           "\"cmdline\":[\"t\"],\"start_unix_ns\":0,\"start_time\":\"1970-01-01T00:00:00Z\",\"devices\":[{\"index\":0,"
           "\"name\":\"test\",\"total\":1073741824},{\"index\":1,\"name\":\"test\",\"total\":1073741824}],"
           "\"config\":{\"pool\":\"on\"" + (reuse.empty() ? std::string() : ",\"reuse\":\"" + reuse + "\"") +
           "},\"gpumem_version\":\"0.1.0\"}\n";
}
inline std::string end_line(uint64_t seq, uint64_t live = 0) {
    return "{\"ev\":\"end\",\"seq\":" + std::to_string(seq) + ",\"t\":" + std::to_string(seq * 100 + 100) +
           ",\"tid\":1,\"reason\":\"exit\",\"events\":" + std::to_string(seq) + ",\"n_alloc\":0,\"n_free\":0,\"n_fail\":0,\"live_allocs\":" +
           std::to_string(live) + ",\"live_bytes\":0,\"lost\":0,\"unmatched\":0}\n";
}

}  // namespace gpumem::test
