// Unit tests of capture_table: the driver's rule for cuMemAlloc/cuMemFree inside stream captures, case by case as measured on the H200 (run 93).
#include <catch2/catch.hpp>

#include "core/pool/capture_table.h"
#include "core/pool/critical_section.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GPUMEM_CLANG_TSAN 1
#endif
#endif
#ifndef GPUMEM_CLANG_TSAN
#define GPUMEM_CLANG_TSAN 0
#endif

using namespace gpumem;

namespace {
constexpr int G = capture_table::k_global, T = capture_table::k_thread_local, R = capture_table::k_relaxed;
constexpr int me = 100, other = 200;
constexpr uint64_t s1 = 0x1000, s2 = 0x2000, per_thread = 0x2;
}  // namespace

TEST_CASE("capture table: the 36 cases of tests/gpu/capture_mode_check.py, as the H200 answered them") {
    // capture mode x calling thread (the one that began it, or another) x that thread's mode:
    // refused (900) exactly where the H200 refused both cuMemAlloc and cuMemFree.
    struct row {
        int capture, caller, thread_mode;
        bool refused;
    };
    const row rows[] = {
        {G, me, G, true},     {G, me, T, true},     {G, me, R, false},
        {G, other, G, true},  {G, other, T, false}, {G, other, R, false},
        {T, me, G, true},     {T, me, T, true},     {T, me, R, false},
        {T, other, G, false}, {T, other, T, false}, {T, other, R, false},
        {R, me, G, false},    {R, me, T, false},    {R, me, R, false},
        {R, other, G, false}, {R, other, T, false}, {R, other, R, false},
    };
    for (const row& r : rows) {
        INFO("capture mode " << r.capture << ", caller " << (r.caller == me ? "same" : "other") << ", thread mode "
                             << r.thread_mode);
        capture_table t;
        CHECK_FALSE(t.may_refuse(r.caller, r.thread_mode));  // no capture: never
        t.opened(s1, me, r.capture);
        CHECK(t.may_refuse(r.caller, r.thread_mode) == r.refused);
        t.closed(s1, me);
        CHECK_FALSE(t.may_refuse(r.caller, r.thread_mode));
    }
}

TEST_CASE("capture table: ends from any thread, several captures, the per-thread stream, overflow, fork") {
    capture_table t;
    SECTION("an end from another thread closes the capture (the driver ends it, refusing the call)") {
        t.opened(s1, me, G);
        t.closed(s1, other);
        CHECK_FALSE(t.may_refuse(me, G));
    }
    SECTION("two captures: each counts until its own end") {
        t.opened(s1, me, R);
        t.opened(s2, other, G);
        CHECK(t.may_refuse(me, G));        // another thread's global capture
        CHECK_FALSE(t.may_refuse(me, T));  // ... ignored in thread-local mode
        t.closed(s2, other);
        CHECK_FALSE(t.may_refuse(me, G));  // only my relaxed one is left
        t.closed(s1, me);
    }
    SECTION("per-thread streams share one handle: an end closes the ending thread's capture") {
        t.opened(per_thread, me, T);
        t.opened(per_thread, other, T);
        t.closed(per_thread, other);
        CHECK(t.may_refuse(me, G));  // mine is still open
        CHECK_FALSE(t.may_refuse(other, G));
        t.closed(per_thread, me);
        CHECK_FALSE(t.may_refuse(me, G));
    }
    SECTION("more captures than slots: unsure, so the driver is asked, until as many ends") {
        for (int i = 0; i < capture_table::k_slots + 2; ++i) t.opened(0x10000 + uint64_t(i), me, R);
        CHECK(t.may_refuse(other, G));      // two captures of unknown mode
        CHECK_FALSE(t.may_refuse(me, R));   // relaxed threads are never refused
        t.closed(0x10000, me);              // a held one: still unsure
        CHECK(t.may_refuse(other, G));
        t.closed(0x99999, me);
        t.closed(0x99998, me);              // the two it could not hold
        CHECK_FALSE(t.may_refuse(other, G));
    }
    SECTION("a fork child starts with none, even with the lock held in the parent at the fork") {
        t.opened(s1, me, G);
#if !defined(__SANITIZE_THREAD__) && !GPUMEM_CLANG_TSAN
        // ThreadSanitizer follows the mutex across clear_after_fork's placement new and calls
        // the next lock a double lock: in its builds (gcc's __SANITIZE_THREAD__, clang's
        // __has_feature) the lock is not left held.
        std::thread([&] {
            // Another thread in may_refuse at the moment of the fork: its lock is copied held.
            t.mutex_for_test().lock();
        }).join();
#endif
        t.clear_after_fork();
        CHECK_FALSE(t.may_refuse(me, G));
        t.opened(s1, me, G);  // and the table works again
        CHECK(t.may_refuse(me, G));
    }
    SECTION("a second begin on a stream replaces its entry: the first capture ended unseen") {
        t.opened(s1, me, G);
        t.opened(s1, other, R);
        CHECK_FALSE(t.may_refuse(me, G));  // only other's relaxed capture is open
        t.closed(s1, other);
        CHECK_FALSE(t.may_refuse(other, G));
        t.closed(s1, other);  // one end too many: nothing to close, nothing changes
        CHECK_FALSE(t.may_refuse(me, G));
    }
}

TEST_CASE("capture table: inside a critical section (a signal handler's call) it answers unsure without its lock") {
    // A handler's free that interrupted this thread while it held the table's lock (noting a
    // capture opened or closed) must not wait for that lock: here another thread holds it, for
    // 2 s at most, and the answer must come while it is held.  Unsure is true, so the driver is
    // asked; a relaxed thread and a table with no capture open need no lock and say false.
    capture_table t;
    t.opened(s1, me, R);  // read under the lock, this capture refuses no one
    std::atomic<bool> held{false}, answered{false}, gave_up{false};
    std::thread holder([&] {
        std::lock_guard<std::mutex> lk(t.mutex_for_test());
        held = true;
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
        while (!answered && std::chrono::steady_clock::now() < until) std::this_thread::yield();
        gave_up = !answered;  // released before the answer came: the answer waited for the lock
    });
    while (!held) std::this_thread::yield();
    bool unsure = false, relaxed = true;
    {
        critical_section in;
        unsure = t.may_refuse(other, G);
        relaxed = t.may_refuse(other, R);
    }
    answered = true;
    holder.join();
    CHECK(unsure);
    CHECK_FALSE(relaxed);
    CHECK_FALSE(gave_up);
    CHECK_FALSE(t.may_refuse(other, G));  // outside one, the table's own answer
    t.closed(s1, me);
    critical_section in;
    CHECK_FALSE(t.may_refuse(other, G));  // none open
}
