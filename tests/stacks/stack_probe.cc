// Test probe: lets a Python program capture its own stack through gpumem's stack_table and read
// the stack record back, exactly as the log writer would write it.
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "stacks/stack_table.h"

namespace {
gpumem::stacks::stack_table& table() {
    static gpumem::stacks::stack_table t;
    return t;
}
void* lookup(const char* name) { return dlsym(RTLD_DEFAULT, name); }
}  // namespace

extern "C" {
// Sets the depth and finds the interpreter; returns 1 when Python capture is active.
int probe_init(int depth) {
    const char* m = getenv("PROBE_STACKS");
    auto mode = gpumem::stacks::stack_mode::python;
    if (m && !strcmp(m, "native")) mode = gpumem::stacks::stack_mode::native;
    if (m && !strcmp(m, "all")) mode = gpumem::stacks::stack_mode::all;
    table().init(lookup, mode, size_t(depth));
    return table().python().active() ? 1 : 0;
}
// Captures the caller's stack; returns its id (0: none).
unsigned probe_capture() { return table().capture(); }
// Copies the stack record for `id` into out; returns its length, or -1.
int probe_record(unsigned id, char* out, int cap) {
    std::string s;
    if (!table().format_record(id, s) || int(s.size()) >= cap) return -1;
    std::memcpy(out, s.data(), s.size() + 1);
    return int(s.size());
}
unsigned long probe_size() { return table().size(); }
// Captures on a new native thread, which has no Python thread state: must give 0.
unsigned probe_capture_native_thread() {
    unsigned id = 1;
    std::thread t([&] { id = table().capture(); });
    t.join();
    return id;
}
}

// The same call with no capture: the benchmark's baseline.
extern "C" unsigned probe_noop() { return 0; }
