// Reads the calling thread's Python stack (code object, instruction offset) in-process, without
// calling back into Python.
//
// The interpreter is found by its exported symbols; nothing is installed in Python.  Only the
// calling thread's own frames are read, found through its own thread state
// (PyGILState_GetThisThreadState, a thread-local lookup).  They cannot change while we read them:
// this thread is here, inside a CUDA call, not running Python.  The GIL is not required, and that
// matters: PyTorch releases the GIL around every operator it dispatches, so its allocations come
// from threads that do not hold it.  Without the GIL the reader calls nothing in the interpreter
// that allocates or touches reference counts: names are decoded from the string objects in place.
// Frames are read at offsets fixed per CPython minor version (3.10 to 3.13; 3.13's are taken from
// the interpreter's own _Py_DebugOffsets when it publishes them) and checked once with
// process_vm_readv, so a layout we got wrong turns capture off instead of crashing the program.
// Which interpreters each version was tested on: docs/log-format.md, "stack".
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace gpumem::stacks {

// One Python frame as captured: the code object and the byte offset of the instruction running in
// it.  The line is computed later, once per unique stack (python_frames::line_of).  stack_table
// also keeps native frames in this form (offset -1).  No default member initializers: capture keeps
// 2 x 256 of them on the program's stack, and an initializer made every capture zero them first (a
// loop over 8 KiB on every allocation).
struct py_frame {
    uint64_t code;
    int32_t offset;
    // Identity of the code object beyond its address (its file and name objects' addresses, first
    // line, the file name's length and last characters, its line table's size and ends): without
    // the GIL no reference is taken, so a freed code object's address may come back as another
    // code object, and this tells the two apart (python_frames::ident_of).
    uint32_t ident;
};

// How a version's frames are chained, which decides the walk (python_frames.cc, k_layouts).
enum class py_walk : uint8_t {
    frame_object,  // 3.10: PyThreadState.frame, a chain of PyFrameObject; f_lasti in code units
    cframe,        // 3.11, 3.12: PyThreadState.cframe->current_frame, a chain of _PyInterpreterFrame
    direct,        // 3.13: PyThreadState.current_frame; f_executable may be a non-code object
};

// What a code object says about itself, computed once per code object.
struct py_code_info {
    std::string file;
    std::string function;
};

class python_frames {
  public:
    // `lookup` finds a symbol in the process (dlsym(RTLD_DEFAULT, ...)); it is called only from
    // init(), never from a constructor.
    using symbol_lookup = void* (*)(const char* name);

    // Finds the interpreter.  Returns false, and capture() then returns 0, when the process runs no
    // supported CPython.  Safe to call more than once; not thread-safe against capture().
    bool init(symbol_lookup lookup) noexcept;
    bool active() const noexcept { return active_; }
    int minor_version() const noexcept { return minor_; }
    // True when the 3.13 offsets came from the interpreter's _Py_DebugOffsets, not our table.
    bool from_debug_offsets() const noexcept { return debug_offsets_; }
    // Why init() turned capture off (empty when active or when there is no interpreter at all).
    const char* why_off() const noexcept { return why_off_; }
    // Py_GetVersion's text ("3.14.0 (main, ...) [GCC ...]"), empty without an interpreter.
    const char* version() const noexcept { return version_; }

    // Fills up to `max` frames of the calling thread, innermost first.  Returns the number filled:
    // 0 when the thread has no Python thread state or no Python frames.
    // `refused`, when given, is set when the thread has a Python thread state but capture is off
    // because the layout check failed: its frames were there, unread.
    size_t capture(py_frame* out, size_t max, bool* refused = nullptr) const noexcept;

    // Line of `f` and the names of its code object, for stacks not seen before, right after
    // capture() on the same thread (the frame, and so its code object, is still live).
    int line_of(const py_frame& f) const noexcept;
    bool describe_code(uint64_t code, py_code_info& out) const noexcept;

  private:
    bool check_layout(uint64_t ts) const noexcept;
    bool first_frame(uint64_t ts, uint64_t& frame) const noexcept;
    bool apply_debug_offsets(const void* runtime) noexcept;
    // One walk per frame chain (py_walk), chosen once per capture so that no walk pays for another
    // version's tests inside its loop.
    size_t walk_frame_objects(uint64_t ts, py_frame* out, size_t max) const noexcept;
    size_t walk_cframe(uint64_t ts, py_frame* out, size_t max) const noexcept;
    size_t walk_direct(uint64_t ts, py_frame* out, size_t max) const noexcept;
    inline uint32_t ident_of(uint64_t code) const noexcept;  // defined and used in python_frames.cc only
    bool check_ident_reads(uint64_t code) const noexcept;

    bool active_ = false;
    bool debug_offsets_ = false;
    int minor_ = 0;
    const char* why_off_ = "";
    const char* version_ = "";
    py_walk walk_ = py_walk::cframe;
    // Whether the layout was checked before being trusted: 0 not yet, 1 good, 2 bad (capture off).
    // Per instance, reset by init(), so that another interpreter image (the tests') starts unchecked.
    mutable std::atomic<int> layout_state_{0};

    // Interpreter functions, all public API of CPython 3.10 to 3.13, none of which allocates or
    // needs the GIL.
    int (*is_initialized_)() = nullptr;
    void* (*tstate_get_)() = nullptr;                 // PyGILState_GetThisThreadState
    int (*addr2line_)(void*, int) = nullptr;          // PyCode_Addr2Line
    void* code_type_ = nullptr;                       // &PyCode_Type
    void* frame_type_ = nullptr;                      // &PyFrame_Type, checked on 3.10's frames

    // Layout, per minor version (python_frames.cc says where each number comes from).  For 3.10,
    // ts_frame_ is PyThreadState.frame and fr_instr_ is f_lasti; for 3.13, ts_frame_ is
    // current_frame and fr_code_ is f_executable.
    size_t ts_frame_ = 0, cframe_current_ = 0, fr_code_ = 0, fr_previous_ = 0, fr_instr_ = 0,
           fr_owner_ = 0, co_code_ = 0, co_firsttraceable_ = 0;
    int owner_cstack_ = -1;
    // Found at run time in PyCode_Type's member table, so no guess is needed for these.  co_name_
    // is co_qualname, or co_name on 3.10, which has no qualified name.
    size_t co_filename_ = 0, co_name_ = 0, co_firstlineno_ = 0;
    // co_linetable (a bytes object), read for the code object's identity; 0 if the type lacks it.
    size_t co_linetable_ = 0;
    // str objects: sizes of PyASCIIObject and PyCompactUnicodeObject, where the characters follow.
    size_t ascii_size_ = 0, compact_size_ = 0;
    bool read_str(uint64_t obj, std::string& out) const noexcept;
};

}  // namespace gpumem::stacks
