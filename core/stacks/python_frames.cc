// Reads the calling thread's Python stack in-process: finds CPython (3.10 to 3.13) by its symbols,
// walks the thread's frames at per-version offsets, and checks the layout once before trusting it.
#include "python_frames.h"

#include "stderr_write.h"

#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>

namespace gpumem::stacks {

namespace {

// Per-version layout of the few interpreter structures the walk reads (x86-64 / aarch64 LP64).
// Sources: CPython's Include/cpython/pystate.h (PyThreadState), Include/cpython/frameobject.h
// (3.10's PyFrameObject), Include/internal/pycore_frame.h (_PyInterpreterFrame) and
// Include/cpython/unicodeobject.h (str objects: PyASCIIObject lost its wstr member in 3.12).  Every
// number below equals offsetof/sizeof on py-spy's bindgen bindings of those headers
// (src/python_bindings/v3_1x_0.rs), computed with rustc's offset_of!.  Which interpreters they were
// tested on: docs/log-format.md, "stack".  All of them are checked at run time by check_layout()
// before the first stack is trusted.
constexpr size_t k_none = 0;
struct layout {
    int minor;
    py_walk walk;
    // ts_frame: PyThreadState.frame (3.10), .cframe (3.11, 3.12), .current_frame (3.13).
    // fr_code: f_code, or 3.13's f_executable; fr_instr: prev_instr, 3.13's instr_ptr, or 3.10's
    // int f_lasti.  fr_owner: k_none where frames have no owner (3.10).
    size_t ts_frame, cframe_current, fr_code, fr_previous, fr_instr, fr_owner;
    int owner_cstack;  // frames owned by the C stack are shims, not Python code (-1: none)
    // PyCodeObject._co_firsttraceable (3.13: a frame before it has not started; k_none: unused).
    size_t co_firsttraceable;
    size_t ascii_size, compact_size;
};
constexpr layout k_layouts[] = {
    {10, py_walk::frame_object, 24, 0, 32, 24, 96, k_none, -1, k_none, 48, 72},
    {11, py_walk::cframe, 56, 8, 32, 48, 56, 69, -1, k_none, 48, 72},
    {12, py_walk::cframe, 56, 0, 0, 8, 56, 70, 3, k_none, 40, 56},
    {13, py_walk::direct, 72, 0, 0, 8, 56, 70, 3, 184, 40, 56},
};
constexpr size_t k_str_state = 32;   // PyASCIIObject.state, after refcount, type, length and hash
constexpr size_t k_str_length = 16;  // PyASCIIObject.length
// PyBytesObject (co_linetable): ob_size after refcount and type, then ob_shash, then the bytes;
// the same in 3.10 to 3.13 (Include/cpython/bytesobject.h).
constexpr size_t k_bytes_size = 16, k_bytes_data = 32;
constexpr int k_owner_generator = 1;  // FRAME_OWNED_BY_GENERATOR (3.12, 3.13)

// PyTypeObject members read to learn the code object's own layout (stable since CPython 3.0 in the
// public, non-limited PyTypeObject): tp_basicsize is offsetof(PyCodeObject, co_code_adaptive) in
// 3.11+ (sizeof(PyCodeObject) in 3.10, whose instructions are a separate bytes object), and
// tp_members lists the offsets of co_filename, co_qualname (co_name in 3.10) and co_firstlineno.
constexpr size_t k_ob_type = 8, k_tp_basicsize = 32, k_tp_members = 240;
struct py_member_def {  // PyMemberDef
    const char* name;
    int type;
    long offset;
    int flags;
    const char* doc;
};

// 3.13's _Py_DebugOffsets (Include/internal/pycore_runtime.h), at the start of _PyRuntime: what the
// interpreter itself publishes for out-of-process debuggers.  Only the members up to
// unicode_object are read; the static_asserts pin the offsets from the bindings.
struct debug_offsets_313 {
    char cookie[8];  // "xdebugpy"
    uint64_t version;        // PY_VERSION_HEX
    uint64_t free_threaded;  // a free-threaded build moves ob_type: not supported
    struct { uint64_t size, finalizing, interpreters_head; } runtime_state;
    struct {
        uint64_t size, id, next, threads_head, gc, imports_modules, sysdict, builtins, ceval_gil,
            gil_runtime_state, gil_runtime_state_enabled, gil_runtime_state_locked,
            gil_runtime_state_holder;
    } interpreter_state;
    struct {
        uint64_t size, prev, next, interp, current_frame, thread_id, native_thread_id,
            datastack_chunk, status;
    } thread_state;
    struct { uint64_t size, previous, executable, instr_ptr, localsplus, owner; } interpreter_frame;
    struct {
        uint64_t size, filename, name, qualname, linetable, firstlineno, argcount, localsplusnames,
            localspluskinds, co_code_adaptive;
    } code_object;
    struct { uint64_t size, ob_type; } pyobject;
    struct { uint64_t size, tp_name, tp_repr, tp_flags; } type_object;
    struct { uint64_t size, ob_item, ob_size; } tuple_object, list_object;
    struct { uint64_t size, ma_keys, ma_values; } dict_object;
    struct { uint64_t size, ob_fval; } float_object;
    struct { uint64_t size, lv_tag, ob_digit; } long_object;
    struct { uint64_t size, ob_size, ob_sval; } bytes_object;
    struct { uint64_t size, state, length, asciiobject_size; } unicode_object;
};
static_assert(offsetof(debug_offsets_313, thread_state) == 152, "3.13 _Py_DebugOffsets");
static_assert(offsetof(debug_offsets_313, interpreter_frame) == 224, "3.13 _Py_DebugOffsets");
static_assert(offsetof(debug_offsets_313, code_object) == 272, "3.13 _Py_DebugOffsets");
static_assert(offsetof(debug_offsets_313, pyobject) == 352, "3.13 _Py_DebugOffsets");
static_assert(offsetof(debug_offsets_313, unicode_object) == 536, "3.13 _Py_DebugOffsets");
static_assert(offsetof(debug_offsets_313, bytes_object) == 512, "3.13 _Py_DebugOffsets");

template <typename T>
T load(uint64_t addr) noexcept {
    T v;
    std::memcpy(&v, reinterpret_cast<const void*>(addr), sizeof v);
    return v;
}

// The last (up to) 8 bytes of an object's data [begin, end), as one word.  The 8 bytes before `end`
// are always inside the object, since every str and bytes object has a header of 32 bytes or more
// before its data; those of the header are shifted out (little-endian: they are the low bytes),
// since a header changes under us (a cached hash, 3.10's wstr, 3.12's utf8 pointer).
uint64_t tail_word(uint64_t begin, uint64_t end) noexcept {
    const uint64_t n = end - begin;
    if (n == 0) return 0;
    const uint64_t v = load<uint64_t>(end - 8);
    return n >= 8 ? v : v >> (64 - 8 * n);
}

// A compact str's characters [begin, end), from its state and length (the characters follow the
// PyASCIIObject, or the PyCompactUnicodeObject when not ASCII); false for a legacy (non-compact) or
// not-ready string, or a length out of bounds, whose characters are not read.
inline bool str_span(uint64_t obj, uint32_t state, int64_t len, size_t ascii_size, size_t compact_size,
                     uint64_t& begin, uint64_t& end) noexcept {
    const unsigned kind = (state >> 2) & 7, compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
    if (!compact || (kind != 1 && kind != 2 && kind != 4) || len < 0 || len > (int64_t(1) << 28)) return false;
    begin = obj + (ascii ? ascii_size : compact_size);
    end = begin + uint64_t(len) * kind;
    return true;
}

// Reads `n` bytes at `addr` without faulting: process_vm_readv on ourselves returns EFAULT for an
// unmapped address.  Used only while checking the layout, never on the hot path.
bool safe_read(uint64_t addr, void* out, size_t n) noexcept {
    if (addr < 4096) return false;
    iovec local{out, n};
    iovec remote{reinterpret_cast<void*>(addr), n};
    return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == ssize_t(n);
}

}  // namespace

bool python_frames::init(symbol_lookup lookup) noexcept {
    active_ = false;
    debug_offsets_ = false;
    why_off_ = "";
    version_ = "";
    layout_state_.store(0, std::memory_order_release);
    auto version = reinterpret_cast<const char* (*)()>(lookup("Py_GetVersion"));
    if (!version) return false;  // no interpreter in this process: nothing to say
    const char* v = version();
    if (v) version_ = v;  // a static buffer of the interpreter's
    if (!v || v[0] != '3' || v[1] != '.') {
        why_off_ = "unrecognised Py_GetVersion";
        return false;
    }
    minor_ = std::atoi(v + 2);
    const layout* lay = nullptr;
    for (const layout& l : k_layouts)
        if (l.minor == minor_) lay = &l;
    if (!lay) {
        why_off_ = "Python stacks need CPython 3.10 to 3.13";
        return false;
    }
    // A free-threaded build (3.13t) puts ob_type elsewhere in every object header.
    if (std::strstr(v, "free-threading")) {
        why_off_ = "Python stacks need a CPython build with the GIL (not free-threaded)";
        return false;
    }
    is_initialized_ = reinterpret_cast<int (*)()>(lookup("Py_IsInitialized"));
    tstate_get_ = reinterpret_cast<void* (*)()>(lookup("PyGILState_GetThisThreadState"));
    addr2line_ = reinterpret_cast<int (*)(void*, int)>(lookup("PyCode_Addr2Line"));
    code_type_ = lookup("PyCode_Type");
    frame_type_ = lay->walk == py_walk::frame_object ? lookup("PyFrame_Type") : nullptr;
    if (!is_initialized_ || !tstate_get_ || !addr2line_ || !code_type_) {
        why_off_ = "the interpreter lacks a function gpumem needs";
        return false;
    }
    walk_ = lay->walk;
    ts_frame_ = lay->ts_frame;
    cframe_current_ = lay->cframe_current;
    fr_code_ = lay->fr_code;
    fr_previous_ = lay->fr_previous;
    fr_instr_ = lay->fr_instr;
    fr_owner_ = lay->fr_owner;
    owner_cstack_ = lay->owner_cstack;
    co_firsttraceable_ = lay->co_firsttraceable;
    ascii_size_ = lay->ascii_size;
    compact_size_ = lay->compact_size;

    // The code object's layout, from the type itself.
    uint64_t type = reinterpret_cast<uint64_t>(code_type_);
    size_t basicsize = size_t(load<long>(type + k_tp_basicsize));
    co_code_ = walk_ == py_walk::frame_object ? 0 : basicsize;
    auto* members = load<const py_member_def*>(type + k_tp_members);
    size_t qualname = 0, name = 0;
    co_filename_ = co_firstlineno_ = co_linetable_ = 0;
    for (const py_member_def* m = members; m && m->name; ++m) {
        if (!std::strcmp(m->name, "co_filename")) co_filename_ = size_t(m->offset);
        if (!std::strcmp(m->name, "co_linetable")) co_linetable_ = size_t(m->offset);
        if (!std::strcmp(m->name, "co_qualname")) qualname = size_t(m->offset);
        if (!std::strcmp(m->name, "co_name")) name = size_t(m->offset);
        if (!std::strcmp(m->name, "co_firstlineno")) co_firstlineno_ = size_t(m->offset);
    }
    co_name_ = qualname ? qualname : minor_ < 11 ? name : 0;  // 3.10 has no co_qualname
    // Every field read in the hot loop must lie inside the code object's fixed part.
    if (!co_filename_ || !co_name_ || !co_firstlineno_ || basicsize < 64 || basicsize > 1024 ||
        co_filename_ + 8 > basicsize || co_name_ + 8 > basicsize || co_firstlineno_ + 4 > basicsize ||
        co_linetable_ + 8 > basicsize ||
        (co_firsttraceable_ && co_firsttraceable_ + 4 > basicsize)) {
        why_off_ = "unexpected code object layout";
        return false;
    }
    // 3.13 publishes its own offsets: prefer them to our table.  Without the symbol (an interpreter
    // that does not export it) the table stands, still gated by check_layout().
    if (minor_ == 13) {
        void* runtime = lookup("_PyRuntime");
        if (runtime && !apply_debug_offsets(runtime)) return false;
    }
    active_ = true;
    return true;
}

// Takes 3.13's layout from _Py_DebugOffsets, after checking that they describe this interpreter
// and agree with what PyCode_Type says of itself.  False (with why_off_) turns capture off.
bool python_frames::apply_debug_offsets(const void* runtime) noexcept {
    debug_offsets_313 d;
    if (!safe_read(reinterpret_cast<uint64_t>(runtime), &d, sizeof d)) {
        why_off_ = "_PyRuntime is unreadable";
        return false;
    }
    if (std::memcmp(d.cookie, "xdebugpy", 8) != 0) {
        why_off_ = "_PyRuntime does not start with its debug offsets";
        return false;
    }
    if ((d.version >> 16) != (0x0300u | unsigned(minor_))) {
        why_off_ = "_PyRuntime's debug offsets are for another Python version";
        return false;
    }
    if (d.free_threaded) {
        why_off_ = "Python stacks need a CPython build with the GIL (not free-threaded)";
        return false;
    }
    const auto& ts = d.thread_state;
    const auto& fr = d.interpreter_frame;
    const auto& co = d.code_object;
    const auto& str = d.unicode_object;
    // Bounds first: an offset is trusted only inside the structure it belongs to.
    bool sane = ts.size <= 65536 && ts.current_frame + 8 <= ts.size && fr.size <= 1024 &&
                fr.previous + 8 <= fr.size && fr.executable + 8 <= fr.size &&
                fr.instr_ptr + 8 <= fr.size && fr.owner < fr.size &&
                co.co_code_adaptive >= 64 && co.co_code_adaptive <= 1024 &&
                d.pyobject.ob_type == k_ob_type && str.state == k_str_state &&
                str.length == k_str_length && str.asciiobject_size > k_str_state &&
                str.asciiobject_size <= 128;
    // The code object's offsets must agree with PyCode_Type's own tp_members and tp_basicsize.
    bool agree = co.filename == co_filename_ && co.qualname == co_name_ &&
                 co.firstlineno == co_firstlineno_ && co.co_code_adaptive == co_code_ &&
                 (!co_linetable_ || co.linetable == co_linetable_) &&
                 d.bytes_object.ob_size == k_bytes_size && d.bytes_object.ob_sval == k_bytes_data;
    if (!sane || !agree) {
        why_off_ = sane ? "3.13 debug offsets disagree with PyCode_Type" : "unexpected 3.13 debug offsets";
        return false;
    }
    ts_frame_ = size_t(ts.current_frame);
    fr_code_ = size_t(fr.executable);
    fr_previous_ = size_t(fr.previous);
    fr_instr_ = size_t(fr.instr_ptr);
    fr_owner_ = size_t(fr.owner);
    // Not published, derived: PyCodeObject ends with int _co_firsttraceable, void* co_extra and
    // co_code_adaptive, so the first sits 16 bytes before the instructions.
    co_firsttraceable_ = co_code_ - 16;
    ascii_size_ = size_t(str.asciiobject_size);
    compact_size_ = ascii_size_ + 16;  // PyCompactUnicodeObject adds utf8_length and utf8 (3.12+)
    debug_offsets_ = true;
    return true;
}

// The thread's innermost frame, read faulting-safe (check_layout only).
bool python_frames::first_frame(uint64_t ts, uint64_t& frame) const noexcept {
    frame = 0;
    if (walk_ != py_walk::cframe) return safe_read(ts + ts_frame_, &frame, 8);
    uint64_t cframe = 0;
    return safe_read(ts + ts_frame_, &cframe, 8) && safe_read(cframe + cframe_current_, &frame, 8);
}

// Walks the current thread's frames once with faulting-safe reads and checks that every frame's
// code object is a code object (and, on 3.10, every frame a frame object).  One good walk with
// frames turns the fast walk on.
bool python_frames::check_layout(uint64_t ts) const noexcept {
    uint64_t frame = 0;
    if (!first_frame(ts, frame)) return false;
    const uint64_t code_type = reinterpret_cast<uint64_t>(code_type_);
    int checked = 0;
    for (int depth = 0; frame && depth < 4096; ++depth) {
        uint64_t code = 0, prev = 0, type = 0, instr = 0;
        if (!safe_read(frame + fr_code_, &code, 8) || !safe_read(frame + fr_previous_, &prev, 8) ||
            !safe_read(frame + fr_instr_, &instr, walk_ == py_walk::frame_object ? 4 : 8))
            return false;
        char owner = 0;
        if (fr_owner_ != k_none && !safe_read(frame + fr_owner_, &owner, 1)) return false;
        if (frame_type_) {
            uint64_t ft = 0;
            if (!safe_read(frame + k_ob_type, &ft, 8) || ft != reinterpret_cast<uint64_t>(frame_type_))
                return false;
        }
        // C-stack shims need not hold a code object (3.13's entry frame holds None); every other
        // frame must, in every version: CPython 3.13 gives only shims a non-code executable.
        if (owner != owner_cstack_) {
            uint64_t names[2] = {0, 0};
            if (!safe_read(code + k_ob_type, &type, 8) || type != code_type ||
                !safe_read(code + co_filename_, &names[0], 8) || !safe_read(code + co_name_, &names[1], 8) ||
                !check_ident_reads(code))
                return false;
            if (co_firsttraceable_ != k_none) {
                int32_t first = -1;
                if (!safe_read(code + co_firsttraceable_, &first, 4) || first < 0 || first > (1 << 24))
                    return false;
            }
            ++checked;
        }
        frame = prev;
    }
    return checked > 0;
}

// Where ident_of reads a code object's file name and line table, faulting-safe (check_layout): the
// same addresses, so that one good walk vouches for the reads ident_of makes on every capture.
bool python_frames::check_ident_reads(uint64_t code) const noexcept {
    uint64_t file = 0, table = 0, word = 0;
    if (!safe_read(code + co_filename_, &file, 8)) return false;
    if (file) {
        uint32_t state = 0;
        int64_t len = 0;
        if (!safe_read(file + k_str_state, &state, 4) || !safe_read(file + k_str_length, &len, 8)) return false;
        uint64_t begin = 0, end = 0;
        if (str_span(file, state, len, ascii_size_, compact_size_, begin, end) && end > begin &&
            !safe_read(end - 8, &word, 8))
            return false;
    }
    if (!co_linetable_) return true;
    if (!safe_read(code + co_linetable_, &table, 8)) return false;
    if (!table) return true;
    int64_t size = 0;
    if (!safe_read(table + k_bytes_size, &size, 8) || size < 0 || size > (int64_t(1) << 30)) return false;
    return size == 0 || safe_read(table + k_bytes_data + uint64_t(size) - 8, &word, 8);
}

// Without the GIL no reference is taken, so a code object freed after its stack was interned can
// be followed by another at the same address, its file name string too, with the same first line
// (a notebook's cells, compiled and run one after another).  The addresses alone then gave the old
// stack id, with the old cell's file and line.  So the identity also holds what the new object
// says: the file name's length and last 8 bytes of characters, and the line table's size, first
// and last 8 bytes (the first line's offset is coded near its start).  Per frame, that is a few
// loads from objects the frame keeps alive, at offsets check_ident_reads tried once.
// Inlined into the walks (one call per frame, with its spills, cost more than the reads).
[[gnu::always_inline]] inline uint32_t python_frames::ident_of(uint64_t code) const noexcept {
    // The parts are xor-ed, each spread by its own odd constant, and folded once at the end: few
    // instructions and no chain of dependent multiplies (a splitmix64 per part, with ident_of
    // called out of line, cost twice as much as this on a capture 30 frames deep).
    const uint64_t file = load<uint64_t>(code + co_filename_);
    uint64_t h = file ^ (load<uint64_t>(code + co_name_) << 7) ^ uint64_t(uint32_t(load<int32_t>(code + co_firstlineno_)));
    if (file) {
        const int64_t len = load<int64_t>(file + k_str_length);
        uint64_t begin = 0, end = 0;
        if (str_span(file, load<uint32_t>(file + k_str_state), len, ascii_size_, compact_size_, begin, end))
            h ^= (tail_word(begin, end) ^ uint64_t(len) << 48) * 0x9e3779b97f4a7c15ull;
    }
    if (co_linetable_)
        if (const uint64_t table = load<uint64_t>(code + co_linetable_)) {
            const uint64_t size = load<uint64_t>(table + k_bytes_size), begin = table + k_bytes_data;
            if (size - 1 < (uint64_t(1) << 30))  // 1 to 2^30 bytes
                h ^= (tail_word(begin, begin + size) ^ size << 40) * 0xbf58476d1ce4e5b9ull ^
                     (size > 8 ? load<uint64_t>(begin) * 0x94d049bb133111ebull : 0);
        }
    h = (h ^ (h >> 31)) * 0xc4ceb9fe1a85ec53ull;
    return uint32_t(h ^ (h >> 32));
}

size_t python_frames::capture(py_frame* out, size_t max, bool* refused) const noexcept {
    if (!active_ || max == 0 || !is_initialized_()) return 0;
    uint64_t ts = reinterpret_cast<uint64_t>(tstate_get_());
    if (!ts) return 0;
    int state = layout_state_.load(std::memory_order_acquire);
    if (state == 2) {
        if (refused) *refused = true;
        return 0;
    }
    if (state == 0) {
        // Several threads may check at once: the walk only reads, and every good walk says the same.
        if (!check_layout(ts)) {
            // No frames yet is not a verdict (a thread in an extension's init): try again later,
            // unless the walk itself went wrong.
            uint64_t frame = 0;
            bool empty = first_frame(ts, frame) && frame == 0;
            if (!empty) {
                if (refused) *refused = true;
                // Said once, by the thread that turned capture off (a good walk of another
                // thread meanwhile cannot turn it back on: 1 is stored only over 0): the log's
                // end line counts the allocations recorded without their stack from here on.
                int expected = 0;
                if (layout_state_.compare_exchange_strong(expected, 2, std::memory_order_acq_rel))
                    write_stderr({"gpumem: no Python call stacks from here on: this interpreter's frames do not have "
                                  "the layout gpumem reads for CPython 3.", decimal(minor_).view(),
                                  " (its allocations are recorded without stacks; the log's end line counts them)\n"});
            }
            return 0;
        }
        int expected = 0;
        if (!layout_state_.compare_exchange_strong(expected, 1, std::memory_order_acq_rel) && expected == 2) {
            if (refused) *refused = true;  // another thread's walk failed meanwhile: capture is off
            return 0;
        }
    }
    switch (walk_) {
        case py_walk::cframe: return walk_cframe(ts, out, max);
        case py_walk::direct: return walk_direct(ts, out, max);
        case py_walk::frame_object: return walk_frame_objects(ts, out, max);
    }
    return 0;
}

// 3.11, 3.12: ts->cframe->current_frame, then _PyInterpreterFrame.previous.
size_t python_frames::walk_cframe(uint64_t ts, py_frame* out, size_t max) const noexcept {
    uint64_t cframe = load<uint64_t>(ts + ts_frame_);
    uint64_t frame = cframe ? load<uint64_t>(cframe + cframe_current_) : 0;
    size_t n = 0;
    for (int guard = 0; frame && n < max && guard < 100000; ++guard) {
        uint64_t code = load<uint64_t>(frame + fr_code_);
        if (load<char>(frame + fr_owner_) != owner_cstack_ && code) {
            uint64_t instr = load<uint64_t>(frame + fr_instr_);
            int64_t off = int64_t(instr) - int64_t(code + co_code_);
            // A frame that has not run its first instruction yet (prev_instr before the code) is
            // incomplete: CPython itself leaves it out of tracebacks.
            if (off >= 0) out[n++] = py_frame{code, int32_t(off), ident_of(code)};
        }
        frame = load<uint64_t>(frame + fr_previous_);
    }
    return n;
}

// 3.13: ts->current_frame, then previous.  f_executable is checked to be a code object on every
// frame (one load and compare), and instr_ptr is the instruction running, not the last started.
size_t python_frames::walk_direct(uint64_t ts, py_frame* out, size_t max) const noexcept {
    const uint64_t code_type = reinterpret_cast<uint64_t>(code_type_);
    uint64_t frame = load<uint64_t>(ts + ts_frame_);
    size_t n = 0;
    for (int guard = 0; frame && n < max && guard < 100000; ++guard) {
        uint64_t code = load<uint64_t>(frame + fr_code_);
        char owner = load<char>(frame + fr_owner_);
        if (owner != owner_cstack_ && code && load<uint64_t>(code + k_ob_type) == code_type) {
            int64_t off = int64_t(load<uint64_t>(frame + fr_instr_)) - int64_t(code + co_code_);
            // As CPython's _PyFrame_IsIncomplete: a frame not yet past its prelude (before
            // _co_firsttraceable, the first RESUME) has not started, unless a generator owns it.
            int64_t first = owner == k_owner_generator ? 0 : 2 * int64_t(load<int32_t>(code + co_firsttraceable_));
            if (off >= first && off < (int64_t(1) << 31))
                out[n++] = py_frame{code, int32_t(off), ident_of(code)};
        }
        frame = load<uint64_t>(frame + fr_previous_);
    }
    return n;
}

// 3.10: ts->frame, then PyFrameObject.f_back; f_lasti counts 2-byte code units, -1 before the
// frame's first instruction (CPython's own PyFrame_GetLineNumber passes f_lasti * 2).
size_t python_frames::walk_frame_objects(uint64_t ts, py_frame* out, size_t max) const noexcept {
    uint64_t frame = load<uint64_t>(ts + ts_frame_);
    size_t n = 0;
    for (int guard = 0; frame && n < max && guard < 100000; ++guard) {
        uint64_t code = load<uint64_t>(frame + fr_code_);
        int32_t lasti = load<int32_t>(frame + fr_instr_);
        if (code && lasti >= 0 && lasti < (1 << 30)) out[n++] = py_frame{code, lasti * 2, ident_of(code)};
        frame = load<uint64_t>(frame + fr_previous_);
    }
    return n;
}

int python_frames::line_of(const py_frame& f) const noexcept {
    if (!active_) return 0;
    // The offset is of the instruction running: 3.11/3.12's prev_instr (the last started), 3.13's
    // instr_ptr, 3.10's f_lasti * 2.
    return addr2line_(reinterpret_cast<void*>(f.code), f.offset);
}

// A str object's text as UTF-8, read in place: compact strings only (every code object's names
// are), Latin-1, UCS-2 or UCS-4 transcoded.  No allocation inside the interpreter, no reference.
bool python_frames::read_str(uint64_t obj, std::string& out) const noexcept {
    if (!obj) return false;
    const uint32_t state = load<uint32_t>(obj + k_str_state);
    const int64_t len = load<int64_t>(obj + k_str_length);
    uint64_t data = 0, end = 0;
    if (len > 4096 || !str_span(obj, state, len, ascii_size_, compact_size_, data, end)) return false;
    const unsigned kind = (state >> 2) & 7;  // 1, 2 or 4: str_span took no other
    try {
        out.clear();
        for (int64_t i = 0; i < len; ++i) {
            uint32_t c = kind == 1 ? load<uint8_t>(data + uint64_t(i))
                         : kind == 2 ? load<uint16_t>(data + 2 * uint64_t(i))
                                     : load<uint32_t>(data + 4 * uint64_t(i));
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
    if (!read_str(load<uint64_t>(code + co_name_), out.function)) out.function = "?";
    return true;
}

}  // namespace gpumem::stacks
