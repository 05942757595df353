// The end of the log for _exit (and for a signal) makes no heap allocation: counted by a global operator new.
// Standalone (links gpumem_core), as tests/pool/pool_host_alloc_test: the counting operator new is the whole binary's.
#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <string>

#include "event_log.h"

using namespace gpumem;

static std::atomic<bool> g_counting{false};
static std::atomic<long> g_news{0};
void* operator new(std::size_t n) {
    if (g_counting.load(std::memory_order_relaxed)) g_news.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
    if (g_counting.load(std::memory_order_relaxed)) g_news.fetch_add(1, std::memory_order_relaxed);
    return std::malloc(n ? n : 1);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

// Whether every gpumem writer thread of this process sleeps (state S in /proc): after its first
// drain a writer waits the flush interval (60 s here) in a futex.  A fixed sleep was not enough on
// a loaded machine (the first drain came late, while finish() was being counted).
static bool writers_asleep() {
    DIR* d = opendir("/proc/self/task");
    if (!d) return false;
    bool seen = false, asleep = true;
    while (dirent* t = readdir(d)) {
        if (t->d_name[0] == '.') continue;
        std::string dir = std::string("/proc/self/task/") + t->d_name;
        std::ifstream comm(dir + "/comm");
        std::string name;
        if (!std::getline(comm, name) || name != "gpumem-writer") continue;
        seen = true;
        std::ifstream stat(dir + "/stat");
        std::string st;
        std::getline(stat, st);
        const size_t close = st.rfind(')');
        if (close == std::string::npos || close + 2 >= st.size() || st[close + 2] != 'S') asleep = false;
    }
    closedir(d);
    return seen && asleep;
}

// Waits (up to 10 s) until the log's writer has made its first drain and sleeps.
static void wait_for_writer_sleep() {
    for (int i = 0; i < 10000 && !writers_asleep(); ++i) usleep(1000);
}

// _exit may run in a signal handler that interrupted malloc, so finish(fast_exit) must not allocate.
// The writer sleeps a long flush interval here, so the 100 events (each would take a node of the
// live map on the normal path) wait for finish() to drain them.  Returns the failures.
static int check(end_reason why, const char* name) {
    std::string path = "/tmp/gpumem-exit-heap-test-" + std::to_string(getpid()) + "-" + name + ".jsonl";
    event_log::options o;
    o.flush_ms = 60000;
    event_log log(o);
    if (!log.start(path, "{\"ev\":\"header\"}\n")) {
        std::printf("FAIL %s: cannot start the log at %s\n", name, path.c_str());
        return 1;
    }
    // The writer drains once as it starts, then sleeps the flush interval: let that first drain
    // pass, or it could take the events (and the map's nodes) while counting.
    wait_for_writer_sleep();
    for (int i = 0; i < 100; ++i) {
        event e{};
        e.ev = ev_kind::alloc;
        e.b.ptr = 0x1000 + uint64_t(i) * 512;
        e.b.size = 512;
        log.record(e);
    }
    g_news.store(0);
    g_counting.store(true);
    log.finish(why, why == end_reason::signal ? 15 : 0, 0, 0);
    g_counting.store(false);
    long news = g_news.load();
    std::ifstream in(path);
    std::string line, last;
    int lines = 0;
    while (std::getline(in, line)) ++lines, last = line;
    unlink(path.c_str());
    bool ok = news == 0 && lines == 102 && last.find("\"live_allocs\":100") != std::string::npos;
    std::printf("%s %s: %ld operator new calls in finish(), %d lines, end line %s\n", ok ? "ok" : "FAIL", name, news,
                lines, last.c_str());
    return ok ? 0 : 1;
}

int main() {
    int failures = check(end_reason::fast_exit, "_exit") + check(end_reason::signal, "signal");
    // The control: a normal exit keeps the live map, one node per allocation, so the count works.
    {
        std::string path = "/tmp/gpumem-exit-heap-test-" + std::to_string(getpid()) + "-exit.jsonl";
        event_log::options o;
        o.flush_ms = 60000;
        event_log log(o);
        if (log.start(path, "{\"ev\":\"header\"}\n")) {
            wait_for_writer_sleep();  // or its first drain could take the nodes before the count
            event e{};
            e.ev = ev_kind::alloc;
            e.b.size = 512;
            for (int i = 0; i < 100; ++i) e.b.ptr = 0x1000 + uint64_t(i) * 512, log.record(e);
            g_news.store(0);
            g_counting.store(true);
            log.finish(end_reason::exit, 0, 0, 0);
            g_counting.store(false);
        }
        unlink(path.c_str());
        bool ok = g_news.load() >= 100;
        std::printf("%s control: a normal exit's finish() made %ld operator new calls (the map's nodes)\n",
                    ok ? "ok" : "FAIL", g_news.load());
        failures += ok ? 0 : 1;
    }
    return failures ? 1 : 0;
}
