// The preload's diagnostics under LD_PRELOAD: spdlog on stderr at GPUMEM_LOG_LEVEL, nothing by default.
#include "harness.h"

#include <signal.h>
#include <sys/wait.h>

#include <string>

namespace {
bool ran_ok(const run_result& r) { return WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0; }
// Lines of `text` that start with the diagnostics' prefix, "gpumem[PID] LEVEL: ".
int lines_at(const std::string& text, const std::string& level) {
    int n = 0;
    size_t b = 0;
    while (b < text.size()) {
        size_t e = text.find('\n', b);
        if (e == std::string::npos) e = text.size();
        std::string line = text.substr(b, e - b);
        size_t close = line.find("] ");
        if (line.rfind("gpumem[", 0) == 0 && close != std::string::npos && line.compare(close + 2, level.size() + 1, level + ":") == 0)
            ++n;
        b = e + 1;
    }
    return n;
}
}  // namespace

TEST_CASE("GPUMEM_LOG_LEVEL=debug traces the recorder on stderr, the default says nothing") {
    run_result quiet = run({EMU_DRIVER_APP, "basic"});
    REQUIRE(ran_ok(quiet));
    REQUIRE(quiet.logs.size() == 1);
    CHECK(quiet.err.empty());

    for (const char* lvl : {"debug", "DEBUG", "1"}) {
        INFO(lvl);
        run_result r = run({EMU_DRIVER_APP, "basic"}, {{"GPUMEM_LOG_LEVEL", lvl}});
        REQUIRE(ran_ok(r));
        REQUIRE(r.logs.size() == 1);
        INFO(r.err);
        CHECK(lines_at(r.err, "debug") == 2);  // start and exit
        const std::string file = r.logs[0].substr(r.logs[0].rfind('/') + 1);
        CHECK(r.err.find("debug: recording to " + file) != std::string::npos);
        CHECK(r.err.find("debug: exit: " + file + " finished with ") != std::string::npos);
        CHECK(lines_at(r.err, "warning") == 0);
    }
}

TEST_CASE("warnings show at the default level and go quiet with GPUMEM_LOG_LEVEL=off or error") {
    run_result r = run({EMU_DRIVER_APP, "basic"}, {{"GPUMEM_FLUSH_MS", "lots"}});
    REQUIRE(ran_ok(r));
    INFO(r.err);
    CHECK(lines_at(r.err, "warning") == 1);
    CHECK(r.err.find("warning: GPUMEM_FLUSH_MS='lots'") != std::string::npos);
    CHECK(lines_at(r.err, "debug") == 0);
    for (const char* lvl : {"off", "error", "6"}) {
        run_result q = run({EMU_DRIVER_APP, "basic"}, {{"GPUMEM_FLUSH_MS", "lots"}, {"GPUMEM_LOG_LEVEL", lvl}});
        REQUIRE(ran_ok(q));
        CHECK(q.err.empty());
    }
    // An unreadable level is itself a warning, and the level stays warn.
    run_result b = run({EMU_DRIVER_APP, "basic"}, {{"GPUMEM_LOG_LEVEL", "loud"}});
    REQUIRE(ran_ok(b));
    CHECK(lines_at(b.err, "warning") == 1);
    CHECK(b.err.find("GPUMEM_LOG_LEVEL='loud'") != std::string::npos);
}

TEST_CASE("a warning longer than 1 KiB comes out whole") {
    // diag::log formatted into 1024 bytes and cut there without a word: the end of the warning
    // (what gpumem uses instead) was lost.
    const std::string value(3000, 'x');
    run_result r = run({EMU_DRIVER_APP, "basic"}, {{"GPUMEM_FLUSH_MS", value}});
    REQUIRE(ran_ok(r));
    INFO(r.err);
    CHECK(lines_at(r.err, "warning") == 1);
    CHECK(r.err.find("warning: GPUMEM_FLUSH_MS='" + value + "' is not a number in [1, 60000]; using 20\n") !=
          std::string::npos);
}

TEST_CASE("a warning on a stderr pipe whose reader is gone does not kill the program with SIGPIPE") {
    // Without gpumem the program writes nothing to stderr and exits 0; the warning's write raised
    // SIGPIPE and the program died of it.  The pipe's read end is closed before the program starts.
    char tmpl[] = "/tmp/gpumem-it-XXXXXX";
    REQUIRE(mkdtemp(tmpl));
    run_dirs().push_back(tmpl);
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    close(fds[0]);
    pid_t pid = fork();
    if (pid == 0) {
        if (chdir(tmpl) != 0) _exit(126);
        dup2(fds[1], 2);
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        signal(SIGPIPE, SIG_DFL);
        setenv("LD_LIBRARY_PATH", EMU_DRIVER_DIR ":" EMU_RT_DIR, 1);
        setenv("LD_PRELOAD", GPUMEM_LIB, 1);
        clear_gpumem_settings();
        setenv("GPUMEM_FLUSH_MS", "lots", 1);  // one warning
        execl(EMU_DRIVER_APP, EMU_DRIVER_APP, "basic", (char*)nullptr);
        _exit(127);
    }
    close(fds[1]);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK_FALSE(WIFSIGNALED(status));
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
}
