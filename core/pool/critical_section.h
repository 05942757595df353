// A thread's count of gpumem locks it holds or is taking, so that code a signal handler runs on the same thread never waits for one of them.
//
// exit() called by a handler that interrupted this thread inside gpumem (a pool operation, a
// primary context's release) runs the runtime's exit handler and gpumem's destructor on the same
// thread: any of them that waited for a lock this thread holds would wait for ever (programs that
// exit from a timer's handler hung at exit, docs/pool.md, Lifecycle).  The count rises before the
// lock is taken and falls after it is released, so no instant in between escapes it.  The hooks
// pass straight through while it is not zero (but for a free of a pooled block, which waits for a
// later pool call: pool_free_from_inside), and release_all_at_exit does not wait.
#pragma once

namespace gpumem {

struct critical_section {
    static thread_local int depth;  // defined in block_pool.cc
    critical_section() noexcept { ++depth; }
    ~critical_section() { --depth; }
    critical_section(const critical_section&) = delete;
    critical_section& operator=(const critical_section&) = delete;
    static bool active() noexcept { return depth > 0; }
};

}  // namespace gpumem
