// A stand-in for libpython, preloaded beside libgpumem.so: it exports the few symbols gpumem looks
// up to find an interpreter, so the integration tests can give it one it must refuse (a version
// it does not know) or one whose frames do not have the layout of its version (FAKE_PY_VERSION).
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace {
struct member_def {  // PyMemberDef
    const char* name;
    int type;
    long offset;
    int flags;
    const char* doc;
};
const member_def k_members[] = {{"co_filename", 0, 104, 0, nullptr},
                                {"co_name", 0, 112, 0, nullptr},
                                {"co_qualname", 0, 120, 0, nullptr},
                                {"co_firstlineno", 0, 72, 0, nullptr},
                                {nullptr, 0, 0, 0, nullptr}};
// A "thread state" whose every word points back into itself: a walk of it finds frames whose
// code objects are not code objects, which the layout check must refuse (and not fault on).
alignas(8) uint64_t g_tstate[512];
}  // namespace

extern "C" {
// PyTypeObject's tp_basicsize at 32 and tp_members at 240, as core/stacks/python_frames.cc reads.
alignas(8) unsigned char PyCode_Type[512];

__attribute__((constructor)) static void fake_python_init() {
    const long basicsize = 200;
    const member_def* members = k_members;
    std::memcpy(PyCode_Type + 32, &basicsize, sizeof basicsize);
    std::memcpy(PyCode_Type + 240, &members, sizeof members);
    for (uint64_t& w : g_tstate) w = reinterpret_cast<uint64_t>(g_tstate);
}

const char* Py_GetVersion() {
    const char* v = std::getenv("FAKE_PY_VERSION");
    return v ? v : "3.14.0 (main, Oct  7 2025, 00:00:00) [GCC 12.2.0]";
}
int Py_IsInitialized() { return 1; }
void* PyGILState_GetThisThreadState() { return g_tstate; }
int PyCode_Addr2Line(void*, int) { return 1; }
}
