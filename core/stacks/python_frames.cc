// Reads the calling thread's Python stack in-process: finds CPython by its symbols, walks the
// thread's frames at per-version offsets, and checks the layout once before trusting it.
#include "python_frames.h"

#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace gpumem::stacks {

namespace {

// Per-version layout of the few interpreter structures the walk reads (x86-64 / aarch64 LP64).
// Sources: CPython's Include/cpython/pystate.h (PyThreadState.cframe), Include/cpython/pystate.h
// (_PyCFrame.current_frame) and Include/internal/pycore_frame.h (_PyInterpreterFrame).  The 3.11
// numbers are checked against the 3.11 headers by tests/stacks; all of them are checked at run time
// by check_layout() before the first stack is trusted.
// str objects (Include/cpython/unicodeobject.h): PyASCIIObject lost its wstr member in 3.12.
struct layout {
    int minor;
    size_t ts_cframe, cframe_current, fr_code, fr_previous, fr_instr, fr_owner;
    int owner_cstack;  // frames owned by the C stack are shims, not Python code (-1: none)
    size_t ascii_size, compact_size;
};
constexpr layout k_layouts[] = {
    {11, 56, 8, 32, 48, 56, 69, -1, 48, 72},
    {12, 56, 0, 0, 8, 56, 70, 3, 40, 56},
};
constexpr size_t k_str_state = 32;  // PyASCIIObject.state, after refcount, type, length and hash

// PyTypeObject members read to learn the code object's own layout (stable since CPython 3.0 in the
// public, non-limited PyTypeObject): tp_basicsize is offsetof(PyCodeObject, co_code_adaptive) in
// 3.11+, and tp_members lists the offsets of co_filename and co_qualname.
constexpr size_t k_ob_type = 8, k_tp_basicsize = 32, k_tp_members = 240;
struct py_member_def {  // PyMemberDef
    const char* name;
    int type;
    long offset;
    int flags;
    const char* doc;
};

template <typename T>
T load(uint64_t addr) noexcept {
    T v;
    std::memcpy(&v, reinterpret_cast<const void*>(addr), sizeof v);
    return v;
}

// Reads `n` bytes at `addr` without faulting: process_vm_readv on ourselves returns EFAULT for an
// unmapped address.  Used only while checking the layout, never on the hot path.
bool safe_read(uint64_t addr, void* out, size_t n) noexcept {
    if (addr < 4096) return false;
    iovec local{out, n};
    iovec remote{reinterpret_cast<void*>(addr), n};
    return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == ssize_t(n);
}

// Which frames are checked before the layout is trusted: 0 not yet, 1 good, 2 bad (capture off).
std::atomic<int> g_layout_state{0};

}  // namespace

bool python_frames::init(symbol_lookup lookup) noexcept {
    active_ = false;
    why_off_ = "";
    auto version = reinterpret_cast<const char* (*)()>(lookup("Py_GetVersion"));
    if (!version) return false;  // no interpreter in this process: nothing to say
    const char* v = version();
    if (!v || v[0] != '3' || v[1] != '.') {
        why_off_ = "unrecognised Py_GetVersion";
        return false;
    }
    minor_ = std::atoi(v + 2);
    const layout* lay = nullptr;
    for (const layout& l : k_layouts)
        if (l.minor == minor_) lay = &l;
    if (!lay) {
        why_off_ = "Python stacks need CPython 3.11 or 3.12";
        return false;
    }
    is_initialized_ = reinterpret_cast<int (*)()>(lookup("Py_IsInitialized"));
    tstate_get_ = reinterpret_cast<void* (*)()>(lookup("PyGILState_GetThisThreadState"));
    addr2line_ = reinterpret_cast<int (*)(void*, int)>(lookup("PyCode_Addr2Line"));
    code_type_ = lookup("PyCode_Type");
    if (!is_initialized_ || !tstate_get_ || !addr2line_ || !code_type_) {
        why_off_ = "the interpreter lacks a function gpumem needs";
        return false;
    }
    ts_cframe_ = lay->ts_cframe;
    cframe_current_ = lay->cframe_current;
    fr_code_ = lay->fr_code;
    fr_previous_ = lay->fr_previous;
    fr_instr_ = lay->fr_instr;
    fr_owner_ = lay->fr_owner;
    owner_cstack_ = lay->owner_cstack;
    ascii_size_ = lay->ascii_size;
    compact_size_ = lay->compact_size;

    // The code object's layout, from the type itself.
    uint64_t type = reinterpret_cast<uint64_t>(code_type_);
    co_code_ = size_t(load<long>(type + k_tp_basicsize));
    auto* members = load<const py_member_def*>(type + k_tp_members);
    for (const py_member_def* m = members; m && m->name; ++m) {
        if (!std::strcmp(m->name, "co_filename")) co_filename_ = size_t(m->offset);
        if (!std::strcmp(m->name, "co_qualname")) co_qualname_ = size_t(m->offset);
        if (!std::strcmp(m->name, "co_firstlineno")) co_firstlineno_ = size_t(m->offset);
    }
    if (!co_filename_ || !co_qualname_ || !co_firstlineno_ || co_code_ < 64 || co_code_ > 1024) {
        why_off_ = "unexpected code object layout";
        return false;
    }
    active_ = true;
    return true;
}

// Walks the current thread's frames once with faulting-safe reads and checks that every frame's
// code object is a code object.  One good walk with frames turns the fast walk on.
bool python_frames::check_layout() noexcept {
    uint64_t ts = reinterpret_cast<uint64_t>(tstate_get_());
    uint64_t cframe = 0, frame = 0;
    if (!safe_read(ts + ts_cframe_, &cframe, 8) || !safe_read(cframe + cframe_current_, &frame, 8))
        return false;
    int checked = 0;
    for (int depth = 0; frame && depth < 4096; ++depth) {
        uint64_t code = 0, type = 0, prev = 0;
        if (!safe_read(frame + fr_code_, &code, 8) || !safe_read(code + k_ob_type, &type, 8) ||
            !safe_read(frame + fr_previous_, &prev, 8))
            return false;
        char owner = 0;
        if (!safe_read(frame + fr_owner_, &owner, 1)) return false;
        if (owner != owner_cstack_) {
            if (type != reinterpret_cast<uint64_t>(code_type_)) return false;
            ++checked;
        }
        frame = prev;
    }
    return checked > 0;
}

size_t python_frames::capture(py_frame* out, size_t max) const noexcept {
    if (!active_ || max == 0 || !is_initialized_() || !tstate_get_()) return 0;
    int state = g_layout_state.load(std::memory_order_acquire);
    if (state == 2) return 0;
    if (state == 0) {
        // Several threads may check at once: the walk only reads, and every good walk says the same.
        if (!const_cast<python_frames*>(this)->check_layout()) {
            // No frames yet is not a verdict (a thread in an extension's init): try again later,
            // unless the walk itself went wrong.
            uint64_t ts = reinterpret_cast<uint64_t>(tstate_get_());
            uint64_t cframe = 0, frame = 0;
            bool empty = safe_read(ts + ts_cframe_, &cframe, 8) &&
                         safe_read(cframe + cframe_current_, &frame, 8) && frame == 0;
            if (!empty) g_layout_state.store(2, std::memory_order_release);
            return 0;
        }
        g_layout_state.store(1, std::memory_order_release);
    }
    uint64_t ts = reinterpret_cast<uint64_t>(tstate_get_());
    if (!ts) return 0;
    uint64_t cframe = load<uint64_t>(ts + ts_cframe_);
    uint64_t frame = cframe ? load<uint64_t>(cframe + cframe_current_) : 0;
    size_t n = 0;
    for (int guard = 0; frame && n < max && guard < 100000; ++guard) {
        uint64_t code = load<uint64_t>(frame + fr_code_);
        if (load<char>(frame + fr_owner_) != owner_cstack_ && code) {
            uint64_t instr = load<uint64_t>(frame + fr_instr_);
            int64_t off = int64_t(instr) - int64_t(code + co_code_);
            // A frame that has not run its first instruction yet (prev_instr before the code) is
            // incomplete: CPython itself leaves it out of tracebacks.
            if (off >= 0) {
                uint64_t ident = load<uint64_t>(code + co_filename_) ^ (load<uint64_t>(code + co_qualname_) << 7) ^
                                 uint64_t(load<int32_t>(code + co_firstlineno_));
                out[n++] = py_frame{code, int32_t(off), uint32_t(ident ^ (ident >> 32))};
            }
        }
        frame = load<uint64_t>(frame + fr_previous_);
    }
    return n;
}

int python_frames::line_of(const py_frame& f) const noexcept {
    if (!active_) return 0;
    // prev_instr points at the last instruction started, whose line is the one running.
    return addr2line_(reinterpret_cast<void*>(f.code), f.offset);
}

// A str object's text as UTF-8, read in place: compact strings only (every code object's names
// are), Latin-1, UCS-2 or UCS-4 transcoded.  No allocation inside the interpreter, no reference.
bool python_frames::read_str(uint64_t obj, std::string& out) const noexcept {
    if (!obj) return false;
    uint32_t state = load<uint32_t>(obj + k_str_state);
    unsigned kind = (state >> 2) & 7, compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
    int64_t len = load<int64_t>(obj + 16);
    if (!compact || len < 0 || len > 4096) return false;
    uint64_t data = obj + (ascii ? ascii_size_ : compact_size_);
    try {
        out.clear();
        for (int64_t i = 0; i < len; ++i) {
            uint32_t c = kind == 1 ? load<uint8_t>(data + uint64_t(i))
                         : kind == 2 ? load<uint16_t>(data + 2 * uint64_t(i))
                         : kind == 4 ? load<uint32_t>(data + 4 * uint64_t(i)) : 0xfffd;
            if (c >= 0xd800 && c < 0xe000) c = 0xfffd;  // a lone surrogate has no UTF-8 form
            if (c < 0x80) out += char(c);
            else if (c < 0x800) out += {char(0xc0 | c >> 6), char(0x80 | (c & 0x3f))};
            else if (c < 0x10000) out += {char(0xe0 | c >> 12), char(0x80 | ((c >> 6) & 0x3f)), char(0x80 | (c & 0x3f))};
            else out += {char(0xf0 | c >> 18), char(0x80 | ((c >> 12) & 0x3f)), char(0x80 | ((c >> 6) & 0x3f)),
                         char(0x80 | (c & 0x3f))};
        }
        return true;
    } catch (...) {
        return false;
    }
}

bool python_frames::describe_code(uint64_t code, py_code_info& out) const noexcept {
    if (!active_ || !code) return false;
    if (!read_str(load<uint64_t>(code + co_filename_), out.file)) out.file = "?";
    if (!read_str(load<uint64_t>(code + co_qualname_), out.function)) out.function = "?";
    return true;
}

}  // namespace gpumem::stacks
