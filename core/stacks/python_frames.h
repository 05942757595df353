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
// Frames are read at offsets fixed per CPython minor version (3.11, 3.12) and checked once with
// process_vm_readv, so a layout we got wrong turns capture off instead of crashing the program.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gpumem::stacks {

// One Python frame as captured: the code object and the byte offset of the instruction running in
// it.  The line is computed later, once per unique stack (python_frames::describe).
struct py_frame {
    uint64_t code;
    int32_t offset;
    // Identity of the code object beyond its address (its file and name objects, first line):
    // without the GIL no reference is taken, so a freed code object's address may come back as
    // another code object, and this tells the two apart.
    uint32_t ident;
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
    // Why init() turned capture off (empty when active or when there is no interpreter at all).
    const char* why_off() const noexcept { return why_off_; }

    // Fills up to `max` frames of the calling thread, innermost first.  Returns the number filled:
    // 0 when the thread has no Python thread state or no Python frames.
    size_t capture(py_frame* out, size_t max) const noexcept;

    // Line of `f` and the names of its code object, for stacks not seen before, right after
    // capture() on the same thread (the frame, and so its code object, is still live).
    int line_of(const py_frame& f) const noexcept;
    bool describe_code(uint64_t code, py_code_info& out) const noexcept;

  private:
    bool check_layout() noexcept;

    bool active_ = false;
    int minor_ = 0;
    const char* why_off_ = "";

    // Interpreter functions, all public API of CPython 3.11/3.12, none of which allocates or needs
    // the GIL.
    int (*is_initialized_)() = nullptr;
    void* (*tstate_get_)() = nullptr;                 // PyGILState_GetThisThreadState
    int (*addr2line_)(void*, int) = nullptr;          // PyCode_Addr2Line
    void* code_type_ = nullptr;                       // &PyCode_Type

    // Layout, per minor version (python_frames.cc says where each number comes from).
    size_t ts_cframe_ = 0, cframe_current_ = 0, fr_code_ = 0, fr_previous_ = 0, fr_instr_ = 0,
           fr_owner_ = 0, co_code_ = 0;
    int owner_cstack_ = -1;
    // Found at run time in PyCode_Type's member table, so no guess is needed for these.
    size_t co_filename_ = 0, co_qualname_ = 0, co_firstlineno_ = 0;
    // str objects: sizes of PyASCIIObject and PyCompactUnicodeObject, where the characters follow.
    size_t ascii_size_ = 0, compact_size_ = 0;
    bool read_str(uint64_t obj, std::string& out) const noexcept;
};

}  // namespace gpumem::stacks
