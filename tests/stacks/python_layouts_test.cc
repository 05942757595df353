// python_frames walked over synthetic CPython 3.10 and 3.13 images built in memory: the check of
// those two versions that runs everywhere (CI's python3 may be neither; python_stacks_test.py is
// the real-interpreter test).
//
// Every offset below is written out here, independently of core/stacks/python_frames.cc, from
// offsetof/sizeof on py-spy's bindgen bindings of the CPython headers
// (src/python_bindings/v3_10_0.rs, v3_13_0.rs; computed with rustc's offset_of!).  So a wrong
// number in python_frames.cc's table or in its reading of _Py_DebugOffsets makes these tests
// fail.  What they cannot show is that a real 3.10 or 3.13 interpreter matches those bindings, or
// what PyCode_Addr2Line answers: that is python_stacks_test.py's (docs/log-format.md, "stack",
// says on which interpreters it ran).
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "stacks/python_frames.h"
#include "stacks/stack_table.h"

using gpumem::stacks::py_code_info;
using gpumem::stacks::py_frame;
using gpumem::stacks::python_frames;

namespace {

// Owns zeroed, 16-byte-aligned blocks standing for interpreter objects.
struct image {
    std::vector<std::unique_ptr<uint64_t[]>> blocks;
    uint8_t* alloc(size_t bytes) {
        blocks.emplace_back(new uint64_t[(bytes + 15) / 8 + 1]());
        return reinterpret_cast<uint8_t*>(blocks.back().get());
    }
};
template <typename T>
void put(uint8_t* obj, size_t off, T v) {
    std::memcpy(obj + off, &v, sizeof v);
}
uint64_t addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

// The fake interpreter's exported symbols, as python_frames::init finds them through `lookup`.
std::map<std::string, void*> g_syms;
std::string g_version;
void* g_tstate = nullptr;
std::map<uint64_t, int> g_first_line;  // code object -> the line its offset 0 maps to

const char* fake_version() { return g_version.c_str(); }
int fake_initialized() { return 1; }
void* fake_tstate() { return g_tstate; }
// Stands in for PyCode_Addr2Line: one line per code unit after the code object's first line, so
// that a wrong code object or a wrong byte offset gives a wrong line.
int fake_addr2line(void* code, int offset) {
    auto it = g_first_line.find(addr(code));
    return it == g_first_line.end() ? -1 : it->second + offset / 2;
}
void* lookup(const char* name) {
    auto it = g_syms.find(name);
    return it == g_syms.end() ? nullptr : it->second;
}
template <typename F>
void* fn(F* f) {
    return reinterpret_cast<void*>(f);
}

// PyTypeObject (the public, non-limited one): tp_basicsize at 32, tp_members at 240; PyMemberDef.
constexpr size_t k_tp_basicsize = 32, k_tp_members = 240, k_type_size = 416;
struct member_def {
    const char* name;
    int type;
    long offset;
    int flags;
    const char* doc;
};

// PyASCIIObject: refcount, type, length (16), hash, state bit field (32: interned:2, kind:3,
// compact:1, ascii:1), then 3.10's wstr.  ASCII characters follow the PyASCIIObject; other compact
// strings follow the PyCompactUnicodeObject.  Only Latin-1 text here (kind 1).
uint8_t* make_str(image& im, const std::string& latin1, size_t ascii_size, size_t compact_size) {
    bool ascii = true;
    for (unsigned char c : latin1) ascii = ascii && c < 0x80;
    size_t head = ascii ? ascii_size : compact_size;
    uint8_t* s = im.alloc(head + latin1.size() + 1);
    put<int64_t>(s, 0, 1);
    put<int64_t>(s, 16, int64_t(latin1.size()));
    put<int64_t>(s, 24, -1);
    put<uint32_t>(s, 32, (1u << 2) | (1u << 5) | (ascii ? 1u << 6 : 0u) | (1u << 7));
    std::memcpy(s + head, latin1.data(), latin1.size());
    return s;
}

// PyBytesObject: refcount, type, ob_size (16), ob_shash (24), then the bytes (32).  A code object's
// co_linetable.
uint8_t* make_bytes(image& im, const std::string& data) {
    uint8_t* b = im.alloc(32 + data.size() + 1);
    put<int64_t>(b, 0, 1);
    put<int64_t>(b, 16, int64_t(data.size()));
    put<int64_t>(b, 24, -1);
    std::memcpy(b + 32, data.data(), data.size());
    return b;
}

// A compact non-ASCII str of kind 2 (UCS-2) or 4 (UCS-4): its code points follow the
// PyCompactUnicodeObject, 2 or 4 bytes each.
uint8_t* make_wide_str(image& im, const std::u32string& text, unsigned kind, size_t compact_size) {
    uint8_t* s = im.alloc(compact_size + kind * (text.size() + 1));
    put<int64_t>(s, 0, 1);
    put<int64_t>(s, 16, int64_t(text.size()));
    put<int64_t>(s, 24, -1);
    put<uint32_t>(s, 32, (kind << 2) | (1u << 5) | (1u << 7));
    for (size_t i = 0; i < text.size(); ++i) {
        if (kind == 2) put<uint16_t>(s, compact_size + 2 * i, uint16_t(text[i]));
        else put<uint32_t>(s, compact_size + 4 * i, uint32_t(text[i]));
    }
    return s;
}

// ---- CPython 3.10 --------------------------------------------------------------------------
// PyThreadState.frame 24.  PyFrameObject: ob_type 8, f_back 24, f_code 32, f_lasti 96 (int, in
// code units, -1 before the first instruction); sizeof 360.  PyCodeObject: co_firstlineno 40,
// co_code 48 (a bytes object), co_filename 104, co_name 112, no co_qualname, co_linetable 120;
// sizeof 176 (its tp_basicsize).  PyASCIIObject 48 bytes, PyCompactUnicodeObject 72.
struct py310 {
    image im;
    uint8_t* code_type;
    uint8_t* frame_type;
    uint8_t* ts;
    std::vector<uint8_t*> frames;  // innermost first
    std::vector<member_def> members;

    py310() {
        code_type = im.alloc(k_type_size);
        frame_type = im.alloc(k_type_size);
        members = {{"co_argcount", 1, 16, 1, nullptr},  {"co_code", 16, 48, 1, nullptr},
                   {"co_filename", 16, 104, 1, nullptr}, {"co_name", 16, 112, 1, nullptr},
                   {"co_firstlineno", 1, 40, 1, nullptr}, {"co_linetable", 16, 120, 1, nullptr},
                   {nullptr, 0, 0, 0, nullptr}};
        put<long>(code_type, k_tp_basicsize, 176);
        put(code_type, k_tp_members, members.data());
        ts = im.alloc(400);
        g_version = "3.10.14 (main, Mar 19 2024, 21:46:16) [GCC 12.2.0]";
        g_tstate = ts;
        g_first_line.clear();
        g_syms = {{"Py_GetVersion", fn(fake_version)},
                  {"Py_IsInitialized", fn(fake_initialized)},
                  {"PyGILState_GetThisThreadState", fn(fake_tstate)},
                  {"PyCode_Addr2Line", fn(fake_addr2line)},
                  {"PyCode_Type", code_type},
                  {"PyFrame_Type", frame_type}};
    }
    uint8_t* code(const std::string& file, const std::string& name, int firstline) {
        uint8_t* c = im.alloc(176);
        put<int64_t>(c, 0, 1);
        put(c, 8, code_type);
        put<int32_t>(c, 40, firstline);
        put(c, 104, make_str(im, file, 48, 72));
        put(c, 112, make_str(im, name, 48, 72));
        put(c, 120, make_bytes(im, std::string("\x0a\x00", 2)));
        g_first_line[addr(c)] = firstline;
        return c;
    }
    // Pushes a frame outside the ones pushed before (pushes go from innermost to outermost).
    uint8_t* frame(uint8_t* code, int32_t lasti) {
        uint8_t* f = im.alloc(360);
        put<int64_t>(f, 0, 1);
        put(f, 8, frame_type);
        put(f, 32, code);
        put<int32_t>(f, 96, lasti);
        put<int32_t>(f, 100, 999);  // f_lineno: not what the walk reads
        if (frames.empty()) put(ts, 24, f);
        else put(frames.back(), 24, f);
        frames.push_back(f);
        return f;
    }
};

// ---- CPython 3.13 --------------------------------------------------------------------------
// PyThreadState.current_frame 72 (sizeof 304).  _PyInterpreterFrame: f_executable 0, previous 8,
// instr_ptr 56 (the instruction running), owner 70 (char; FRAME_OWNED_BY_GENERATOR 1,
// FRAME_OWNED_BY_CSTACK 3), localsplus 72; sizeof 80.  PyCodeObject: co_argcount 52,
// co_firstlineno 68, co_localsplusnames 96, co_localspluskinds 104, co_filename 112, co_name 120,
// co_qualname 128, co_linetable 136, _co_firsttraceable 184 (int, in code units),
// co_code_adaptive 200 (= tp_basicsize).  PyASCIIObject 40 bytes, PyCompactUnicodeObject 56.
// _Py_DebugOffsets at the start of _PyRuntime: cookie "xdebugpy", version (PY_VERSION_HEX) 8,
// free_threaded 16, thread_state 152, interpreter_frame 224, code_object 272, pyobject 352,
// bytes_object 512, unicode_object 536; every member a uint64_t.
struct frame_offsets {  // where a 3.13 image puts a frame's fields (varied to test the debug offsets)
    size_t current_frame = 72, executable = 0, previous = 8, instr_ptr = 56, owner = 70;
};
struct py313 {
    image im;
    frame_offsets at;
    uint8_t* code_type;
    uint8_t* none;  // Py_None, what 3.13's entry frame holds as its executable
    uint8_t* ts;
    uint8_t* runtime;
    std::vector<uint8_t*> frames;
    std::vector<member_def> members;

    explicit py313(frame_offsets o = {}) : at(o) {
        code_type = im.alloc(k_type_size);
        members = {{"co_argcount", 1, 52, 1, nullptr},     {"co_filename", 16, 112, 1, nullptr},
                   {"co_name", 16, 120, 1, nullptr},       {"co_qualname", 16, 128, 1, nullptr},
                   {"co_firstlineno", 1, 68, 1, nullptr},  {"co_linetable", 16, 136, 1, nullptr},
                   {nullptr, 0, 0, 0, nullptr}};
        put<long>(code_type, k_tp_basicsize, 200);
        put(code_type, k_tp_members, members.data());
        uint8_t* none_type = im.alloc(k_type_size);
        none = im.alloc(16);
        put<int64_t>(none, 0, 1);
        put(none, 8, none_type);
        ts = im.alloc(304);
        runtime = im.alloc(4096);
        std::memcpy(runtime, "xdebugpy", 8);
        put<uint64_t>(runtime, 8, 0x030D01F0);  // 3.13.1 final
        put<uint64_t>(runtime, 16, 0);
        put<uint64_t>(runtime, 152 + 0, 304);  // thread_state.size
        put<uint64_t>(runtime, 152 + 32, at.current_frame);
        put<uint64_t>(runtime, 224 + 0, 80);   // interpreter_frame.size
        put<uint64_t>(runtime, 224 + 8, at.previous);
        put<uint64_t>(runtime, 224 + 16, at.executable);
        put<uint64_t>(runtime, 224 + 24, at.instr_ptr);
        put<uint64_t>(runtime, 224 + 32, 72);  // localsplus
        put<uint64_t>(runtime, 224 + 40, at.owner);
        const uint64_t code_object[] = {208, 112, 120, 128, 136, 68, 52, 96, 104, 200};
        for (size_t i = 0; i < 10; ++i) put<uint64_t>(runtime, 272 + 8 * i, code_object[i]);
        put<uint64_t>(runtime, 512, 40);  // bytes_object.size
        put<uint64_t>(runtime, 520, 16);  // .ob_size
        put<uint64_t>(runtime, 528, 32);  // .ob_sval
        put<uint64_t>(runtime, 352, 16);  // pyobject.size
        put<uint64_t>(runtime, 360, 8);   // pyobject.ob_type
        put<uint64_t>(runtime, 536, 56);  // unicode_object.size
        put<uint64_t>(runtime, 544, 32);  // .state
        put<uint64_t>(runtime, 552, 16);  // .length
        put<uint64_t>(runtime, 560, 40);  // .asciiobject_size
        g_version = "3.13.1 (main, Dec  4 2024, 08:54:15) [GCC 12.2.0]";
        g_tstate = ts;
        g_first_line.clear();
        g_syms = {{"Py_GetVersion", fn(fake_version)},
                  {"Py_IsInitialized", fn(fake_initialized)},
                  {"PyGILState_GetThisThreadState", fn(fake_tstate)},
                  {"PyCode_Addr2Line", fn(fake_addr2line)},
                  {"PyCode_Type", code_type},
                  {"_PyRuntime", runtime}};
    }
    uint8_t* code(const std::string& file, const std::string& qualname, const std::string& name,
                  int firstline, int32_t firsttraceable = 0) {
        uint8_t* c = im.alloc(200 + 256);
        put<int64_t>(c, 0, 1);
        put(c, 8, code_type);
        put<int64_t>(c, 16, 128);  // ob_size: code units
        put<int32_t>(c, 68, firstline);
        put(c, 112, make_str(im, file, 40, 56));
        put(c, 120, make_str(im, name, 40, 56));
        put(c, 128, make_str(im, qualname, 40, 56));
        put(c, 136, make_bytes(im, std::string("\x80\x00\xd8\x04\x09\x80\x45\x81\x47\x84\x47", 11)));
        put<int32_t>(c, 184, firsttraceable);
        g_first_line[addr(c)] = firstline;
        return c;
    }
    // Pushes a frame outside those pushed before; `offset` is instr_ptr's byte offset in the code.
    uint8_t* frame(uint8_t* executable, int offset, char owner) {
        uint8_t* f = im.alloc(80);
        put(f, at.executable, executable);
        put(f, at.instr_ptr, executable + 200 + offset);
        put(f, at.owner, owner);
        if (frames.empty()) put(ts, at.current_frame, f);
        else put(frames.back(), at.previous, f);
        frames.push_back(f);
        return f;
    }
};

std::string function_of(const python_frames& pf, const py_frame& f) {
    py_code_info info;
    REQUIRE(pf.describe_code(f.code, info));
    return info.function;
}
std::string file_of(const python_frames& pf, const py_frame& f) {
    py_code_info info;
    REQUIRE(pf.describe_code(f.code, info));
    return info.file;
}

// The stack record (the log's "stack" line) of one capture on this thread, through the recorder's
// own stack table in `mode`, against the fake interpreter.
std::string record_of_capture(gpumem::stacks::stack_mode mode) {
    gpumem::stacks::stack_table table;
    table.init(lookup, mode, 64);
    const uint32_t id = table.capture();
    REQUIRE(id != 0);
    std::string rec;
    REQUIRE(table.format_record(id, rec));
    return rec;
}

}  // namespace

TEST_CASE("3.10 (synthetic): PyFrameObject chain, co_name, f_lasti in code units, unstarted skipped") {
    py310 py;
    uint8_t* unstarted = py.code("/srv/app/model.py", "helper", 5);
    uint8_t* inner = py.code("/srv/app/model.py", "inner", 10);
    uint8_t* outer = py.code("/srv/app/model.py", "outer", 30);
    uint8_t* module = py.code("/srv/caf\xe9/main.py", "<module>", 1);  // Latin-1: a compact non-ASCII str
    py.frame(unstarted, -1);  // pushed, not started: CPython leaves it out of tracebacks too
    py.frame(inner, 6);
    py.frame(outer, 20);
    py.frame(module, 0);  // at its first instruction: started

    python_frames pf;
    REQUIRE(pf.init(lookup));
    CHECK(pf.active());
    CHECK(pf.minor_version() == 10);
    CHECK_FALSE(pf.from_debug_offsets());
    py_frame out[16];
    size_t n = pf.capture(out, 16);
    REQUIRE(n == 3);
    CHECK(out[0].code == addr(inner));
    CHECK(out[0].offset == 12);
    CHECK(out[1].code == addr(outer));
    CHECK(out[1].offset == 40);
    CHECK(out[2].code == addr(module));
    CHECK(out[2].offset == 0);
    CHECK(function_of(pf, out[0]) == "inner");  // no co_qualname in 3.10
    CHECK(function_of(pf, out[1]) == "outer");
    CHECK(file_of(pf, out[0]) == "/srv/app/model.py");
    CHECK(file_of(pf, out[2]) == "/srv/caf\xc3\xa9/main.py");
    CHECK(pf.line_of(out[0]) == 16);
    CHECK(pf.line_of(out[1]) == 50);
    CHECK(pf.line_of(out[2]) == 1);
    CHECK(out[0].ident != out[1].ident);

    // The depth limit keeps the innermost frames.
    CHECK(pf.capture(out, 2) == 2);
    CHECK(out[1].code == addr(outer));
}

TEST_CASE("3.10 (synthetic): a frame that is not a frame object turns capture off, without a fault") {
    py310 py;
    py.frame(py.code("/a.py", "f", 1), 3);
    uint8_t* bad = py.frame(py.code("/a.py", "<module>", 1), 0);
    put<uint64_t>(bad, 8, 0x10);  // ob_type: not PyFrame_Type, and not even readable memory
    python_frames pf;
    REQUIRE(pf.init(lookup));
    py_frame out[8];
    CHECK(pf.capture(out, 8) == 0);
    put(bad, 8, py.frame_type);  // once judged bad, the layout stays off
    CHECK(pf.capture(out, 8) == 0);
}

TEST_CASE("3.13 (synthetic): current_frame chain from the debug offsets, shims and unstarted frames skipped") {
    py313 py;
    uint8_t* inner = py.code("/srv/app/model.py", "Net.forward", "forward", 10);
    uint8_t* cells = py.code("/srv/app/model.py", "Net.cells", "cells", 20, 2);  // MAKE_CELL, COPY_FREE_VARS, RESUME
    uint8_t* gen = py.code("/srv/app/model.py", "batches", "batches", 40, 2);
    uint8_t* module = py.code("/srv/caf\xe9/main.py", "<module>", "<module>", 1);
    py.frame(py.none, 0, 3);   // FRAME_OWNED_BY_CSTACK: the interpreter's entry shim
    uint8_t* f_inner = py.frame(inner, 12, 0);
    py.frame(cells, 0, 0);     // before _co_firsttraceable: not started
    py.frame(gen, 2, 1);       // a generator's frame is never incomplete (_PyFrame_IsIncomplete)
    py.frame(py.none, 0, 3);
    py.frame(module, 40, 0);

    python_frames pf;
    REQUIRE(pf.init(lookup));
    CHECK(pf.minor_version() == 13);
    CHECK(pf.from_debug_offsets());
    py_frame out[16];
    size_t n = pf.capture(out, 16);
    REQUIRE(n == 3);
    CHECK(out[0].code == addr(inner));
    CHECK(out[0].offset == 12);
    CHECK(out[1].code == addr(gen));
    CHECK(out[1].offset == 2);
    CHECK(out[2].code == addr(module));
    CHECK(out[2].offset == 40);
    CHECK(function_of(pf, out[0]) == "Net.forward");  // the qualified name
    CHECK(file_of(pf, out[0]) == "/srv/app/model.py");
    CHECK(file_of(pf, out[2]) == "/srv/caf\xc3\xa9/main.py");
    CHECK(pf.line_of(out[0]) == 16);
    CHECK(pf.line_of(out[1]) == 41);
    CHECK(pf.line_of(out[2]) == 21);

    // Once the layout is trusted, the hot loop still skips an executable that is not code.
    put(f_inner, py.at.executable, py.none);
    put(f_inner, py.at.instr_ptr, py.none);
    n = pf.capture(out, 16);
    REQUIRE(n == 2);
    CHECK(out[0].code == addr(gen));
}

TEST_CASE("3.13 (synthetic): a code object at a freed one's addresses differs by file name and line table") {
    // A notebook cell's code object and file name are freed after the cell runs, and the next cell's
    // can take the same addresses, with the same first line: the identity reads what they hold.
    py313 py;
    uint8_t* cell = py.code("/tmp/ipykernel_1/12.py", "<module>", "<module>", 1);
    py.frame(cell, 4, 0);
    python_frames pf;
    REQUIRE(pf.init(lookup));
    py_frame out[4];
    REQUIRE(pf.capture(out, 4) == 1);
    const uint32_t first = out[0].ident;
    auto ident_now = [&] {
        REQUIRE(pf.capture(out, 4) == 1);
        return out[0].ident;
    };
    CHECK(ident_now() == first);  // stable while nothing changes
    uint8_t* file = reinterpret_cast<uint8_t*>(*reinterpret_cast<uint64_t*>(cell + 112));
    uint8_t* table = reinterpret_cast<uint8_t*>(*reinterpret_cast<uint64_t*>(cell + 136));
    put<int64_t>(file, 24, 12345);  // the str's cached hash: a header field, not what the str holds
    CHECK(ident_now() == first);
    std::memcpy(file + 40, "/tmp/ipykernel_1/13.py", 22);  // another cell's name, same length
    const uint32_t other_file = ident_now();
    CHECK(other_file != first);
    put<int64_t>(file, 16, 21);  // a shorter name: "/tmp/ipykernel_1/13.p"
    CHECK(ident_now() != other_file);
    std::memcpy(file + 40, "/tmp/ipykernel_1/12.py", 22);
    put<int64_t>(file, 16, 22);
    CHECK(ident_now() == first);
    table[32 + 3] = 0x0a;  // the same file, another first statement's line: its line table's start
    CHECK(ident_now() != first);
    table[32 + 3] = 0x04;
    table[32 + 10] = 0x48;  // its end
    CHECK(ident_now() != first);
    table[32 + 10] = 0x47;
    CHECK(ident_now() == first);

    // A short file name (under 8 bytes): only its characters count, not the header before them.
    uint8_t* small = py.code("<cell>", "<module>", "<module>", 1);
    py.frames.clear();
    py.frame(small, 4, 0);
    const uint32_t s0 = ident_now();
    uint8_t* sfile = reinterpret_cast<uint8_t*>(*reinterpret_cast<uint64_t*>(small + 112));
    put<uint32_t>(sfile, 36, 0xdeadbeef);  // padding after the state, before the characters
    CHECK(ident_now() == s0);
    sfile[40 + 1] = 'd';
    CHECK(ident_now() != s0);
}

TEST_CASE("3.10 (synthetic): a code object's identity holds its file name's characters and line table") {
    py310 py;
    uint8_t* cell = py.code("/tmp/ipykernel_1/3.py", "<module>", 1);
    py.frame(cell, 2);
    python_frames pf;
    REQUIRE(pf.init(lookup));
    py_frame out[4];
    REQUIRE(pf.capture(out, 4) == 1);
    const uint32_t first = out[0].ident;
    uint8_t* file = reinterpret_cast<uint8_t*>(*reinterpret_cast<uint64_t*>(cell + 104));
    uint8_t* table = reinterpret_cast<uint8_t*>(*reinterpret_cast<uint64_t*>(cell + 120));
    put<uint64_t>(file, 40, 0x1234);  // 3.10's wstr, filled in lazily: not what the str holds
    REQUIRE(pf.capture(out, 4) == 1);
    CHECK(out[0].ident == first);
    file[48 + 17] = '4';  // "/tmp/ipykernel_1/4.py"
    REQUIRE(pf.capture(out, 4) == 1);
    CHECK(out[0].ident != first);
    file[48 + 17] = '3';
    table[32 + 1] = 0x05;  // a 2-byte line table: another line delta
    REQUIRE(pf.capture(out, 4) == 1);
    CHECK(out[0].ident != first);
}

TEST_CASE("3.13 (synthetic): without _PyRuntime the fixed table is used, and check_layout gates it") {
    SECTION("the published layout") {
        py313 py;
        g_syms.erase("_PyRuntime");
        uint8_t* f = py.code("/a.py", "K.f", "f", 7);
        py.frame(py.none, 0, 3);
        py.frame(f, 4, 0);
        python_frames pf;
        REQUIRE(pf.init(lookup));
        CHECK_FALSE(pf.from_debug_offsets());
        py_frame out[4];
        REQUIRE(pf.capture(out, 4) == 1);
        CHECK(out[0].offset == 4);
        CHECK(function_of(pf, out[0]) == "K.f");
        CHECK(pf.line_of(out[0]) == 9);
    }
    SECTION("another layout: the debug offsets describe it, the table does not") {
        frame_offsets moved;
        moved.executable = 16;
        moved.previous = 24;
        moved.instr_ptr = 0;
        moved.owner = 71;
        moved.current_frame = 80;
        py313 py(moved);
        uint8_t* f = py.code("/a.py", "K.f", "f", 7);
        py.frame(py.none, 0, 3);
        py.frame(f, 4, 0);
        put(py.ts, 72, py.frames[0]);  // so that the table's walk finds the frames too
        python_frames with_offsets;
        REQUIRE(with_offsets.init(lookup));
        CHECK(with_offsets.from_debug_offsets());
        py_frame out[4];
        REQUIRE(with_offsets.capture(out, 4) == 1);
        CHECK(out[0].code == addr(f));
        CHECK(with_offsets.line_of(out[0]) == 9);

        g_syms.erase("_PyRuntime");
        python_frames table_only;
        REQUIRE(table_only.init(lookup));
        CHECK(table_only.capture(out, 4) == 0);  // the check walk sees the mismatch: off, no fault
        CHECK(table_only.capture(out, 4) == 0);
    }
}

TEST_CASE("3.13 (synthetic): debug offsets that do not fit this interpreter turn capture off") {
    py313 py;
    py.frame(py.code("/a.py", "f", "f", 1), 0, 0);
    python_frames pf;
    SECTION("no cookie") {
        std::memcpy(py.runtime, "xdebugpz", 8);
        CHECK_FALSE(pf.init(lookup));
        CHECK(std::string(pf.why_off()).find("debug offsets") != std::string::npos);
    }
    SECTION("another version") {
        put<uint64_t>(py.runtime, 8, 0x030C07F0);
        CHECK_FALSE(pf.init(lookup));
    }
    SECTION("a free-threaded build") {
        put<uint64_t>(py.runtime, 16, 1);
        CHECK_FALSE(pf.init(lookup));
        CHECK(std::string(pf.why_off()).find("free-threaded") != std::string::npos);
    }
    SECTION("a free-threaded build, by its version string") {
        g_version = "3.13.1 experimental free-threading build (main, Dec  4 2024) [GCC 12.2.0]";
        CHECK_FALSE(pf.init(lookup));
    }
    SECTION("code object offsets that disagree with PyCode_Type's members") {
        put<uint64_t>(py.runtime, 272 + 24, 136);  // code_object.qualname
        CHECK_FALSE(pf.init(lookup));
        CHECK(std::string(pf.why_off()).find("disagree") != std::string::npos);
    }
    SECTION("a frame offset outside the frame") {
        put<uint64_t>(py.runtime, 224 + 24, 4096);  // interpreter_frame.instr_ptr
        CHECK_FALSE(pf.init(lookup));
    }
    py_frame out[4];
    CHECK(pf.capture(out, 4) == 0);
}

TEST_CASE("3.13 (synthetic): a frame exactly at _co_firsttraceable has started and is kept") {
    // _PyFrame_IsIncomplete is instr_ptr < _co_firsttraceable: the RESUME itself running (a GC
    // callback allocating from it) is a started frame, and the stack must still name it.
    py313 py;
    uint8_t* inner = py.code("/srv/app/model.py", "Net.forward", "forward", 10);
    uint8_t* cells = py.code("/srv/app/model.py", "Net.cells", "cells", 20, 2);
    py.frame(inner, 12, 0);
    py.frame(cells, 4, 0);  // instr_ptr at its RESUME, 2 code units in
    python_frames pf;
    REQUIRE(pf.init(lookup));
    py_frame out[8];
    REQUIRE(pf.capture(out, 8) == 2);
    CHECK(out[1].code == addr(cells));
    CHECK(out[1].offset == 4);
}

TEST_CASE("3.13 (synthetic): a thread with no frames yet gets its stacks once it has some") {
    // A thread that allocates before running any Python (an extension's init) has no frames: that
    // is no verdict on the layout, so the next capture, with frames, must still walk them.
    py313 py;
    uint8_t* f = py.code("/a.py", "K.f", "f", 7);
    python_frames pf;
    REQUIRE(pf.init(lookup));
    py_frame out[4];
    CHECK(pf.capture(out, 4) == 0);  // current_frame is NULL
    py.frame(f, 4, 0);
    REQUIRE(pf.capture(out, 4) == 1);
    CHECK(out[0].code == addr(f));
}

TEST_CASE("3.12 (synthetic): cframe chain, a frame at its first instruction kept, unstarted skipped") {
    // 3.12 is the 3.13 image without _PyRuntime, reached through ts->cframe (56) and
    // cframe->current_frame (0), with prev_instr (56) the last instruction started: offset 0 is a
    // started frame, prev_instr before the code (-2) one not started yet.
    py313 py;
    g_version = "3.12.7 (main, Oct  1 2024, 08:52:12) [GCC 12.2.0]";
    g_syms.erase("_PyRuntime");
    uint8_t* unstarted = py.code("/srv/app/model.py", "helper", "helper", 5);
    uint8_t* inner = py.code("/srv/app/model.py", "Net.forward", "forward", 10);
    uint8_t* module = py.code("/srv/app/main.py", "<module>", "<module>", 1);
    py.frame(unstarted, -2, 0);
    py.frame(inner, 0, 0);
    py.frame(py.none, 0, 3);
    py.frame(module, 40, 0);
    uint8_t* cframe = py.im.alloc(64);
    put(cframe, 0, py.frames[0]);
    put(py.ts, 56, cframe);
    python_frames pf;
    REQUIRE(pf.init(lookup));
    CHECK(pf.minor_version() == 12);
    py_frame out[8];
    REQUIRE(pf.capture(out, 8) == 2);
    CHECK(out[0].code == addr(inner));
    CHECK(out[0].offset == 0);
    CHECK(pf.line_of(out[0]) == 10);
    CHECK(out[1].code == addr(module));
    CHECK(function_of(pf, out[0]) == "Net.forward");
}

TEST_CASE("3.13 (synthetic): a Python frame with no line (PyCode_Addr2Line -1) stays a Python frame in its record") {
    // CPython 3.11+ gives some instructions no line: PyCode_Addr2Line answers -1.  The stack record
    // must still name the function and file (line 0, which the analyzer reads), not take the frame
    // for a native one and read a module that does not exist.
    py313 py;
    uint8_t* f = py.code("/srv/app/model.py", "Net.forward", "forward", 10);
    uint8_t* module = py.code("/srv/app/main.py", "<module>", "<module>", 1);
    py.frame(f, 4, 0);
    py.frame(module, 8, 0);
    g_first_line.erase(addr(f));  // fake_addr2line answers -1 for it
    const std::string rec = record_of_capture(gpumem::stacks::stack_mode::python);
    CHECK(rec == "{\"ev\":\"stack\",\"id\":1,\"frames\":[{\"function\":\"Net.forward\",\"file\":\"/srv/app/model.py\",\"line\":0},"
                 "{\"function\":\"<module>\",\"file\":\"/srv/app/main.py\",\"line\":5}]}\n");
}

TEST_CASE("3.13 (synthetic): UCS-2 and UCS-4 names come out as UTF-8, a lone surrogate as U+FFFD") {
    // Names outside Latin-1 (CJK identifiers, an emoji in a path) are stored 2 or 4 bytes a code
    // point; each must be read at its own width and encoded at the right UTF-8 length, and a
    // surrogate, which has no UTF-8 form, replaced so that the log stays valid UTF-8.
    py313 py;
    uint8_t* c = py.code("/a.py", "x", "x", 3);
    put(c, 128, make_wide_str(py.im, std::u32string{0x7f51, 0x800, 0x7ff, 0xe9, 0xdc00, U'z'}, 2, 56));
    put(c, 112, make_wide_str(py.im, U"/srv/\U0001f600/\U0000ffff.py", 4, 56));
    py.frame(c, 0, 0);
    python_frames pf;
    REQUIRE(pf.init(lookup));
    py_frame out[4];
    REQUIRE(pf.capture(out, 4) == 1);
    CHECK(function_of(pf, out[0]) == "\xe7\xbd\x91\xe0\xa0\x80\xdf\xbf\xc3\xa9\xef\xbf\xbdz");
    CHECK(file_of(pf, out[0]) == "/srv/\xf0\x9f\x98\x80/\xef\xbf\xbf.py");
}

TEST_CASE("3.13 (synthetic): a frame whose executable is not a code object is skipped even where its offset looks started") {
    // The hot loop trusts f_executable only after comparing its type with PyCode_Type: without
    // that, a non-code executable whose instr_ptr happens to lie past its "instructions" would be
    // read as code (names and line from the wrong object).
    py313 py;
    uint8_t* inner = py.code("/srv/app/model.py", "Net.forward", "forward", 10);
    uint8_t* module = py.code("/srv/app/main.py", "<module>", "<module>", 1);
    uint8_t* other = py.im.alloc(200 + 256);  // an object of another type, sized like a code object
    put<int64_t>(other, 0, 1);
    put(other, 8, py.im.alloc(k_type_size));
    py.frame(inner, 12, 0);
    uint8_t* f_mid = py.frame(module, 6, 0);
    py.frame(module, 40, 0);
    python_frames pf;
    REQUIRE(pf.init(lookup));
    py_frame out[8];
    REQUIRE(pf.capture(out, 8) == 3);  // the layout is checked and trusted on a good walk
    put(f_mid, py.at.executable, other);
    put(f_mid, py.at.instr_ptr, other + 200 + 6);
    REQUIRE(pf.capture(out, 8) == 2);
    CHECK(out[0].code == addr(inner));
    CHECK(out[1].code == addr(module));
    CHECK(out[1].offset == 40);
}

TEST_CASE("3.13 (synthetic): GPUMEM_STACKS=all records the native frames, then the thread's Python frames") {
    // docs/log-format.md: "all" is native frames, then the Python frames of the same thread.  The
    // test binary's own frames are gpumem's (it links the core statically) and are left out;
    // libc's start-up frames remain, so the record has native frames before the Python ones.
    py313 py;
    py.frame(py.code("/srv/app/model.py", "Net.forward", "forward", 10), 4, 0);
    py.frame(py.code("/srv/app/main.py", "<module>", "<module>", 1), 8, 0);
    const std::string rec = record_of_capture(gpumem::stacks::stack_mode::all);
    INFO(rec);
    const std::string py_frames = "{\"function\":\"Net.forward\",\"file\":\"/srv/app/model.py\",\"line\":12},"
                                  "{\"function\":\"<module>\",\"file\":\"/srv/app/main.py\",\"line\":5}]}\n";
    REQUIRE(rec.size() > py_frames.size());
    CHECK(rec.compare(rec.size() - py_frames.size(), py_frames.size(), py_frames) == 0);
    size_t module = rec.find("{\"module\":");
    CHECK(module != std::string::npos);
    CHECK(module < rec.find("Net.forward"));
}

TEST_CASE("versions outside 3.10 to 3.13 are refused with a reason") {
    py313 py;
    python_frames pf;
    for (const char* v : {"3.9.18 (main) [GCC]", "3.14.0 (main) [GCC]", "2.7.18"}) {
        g_version = v;
        CHECK_FALSE(pf.init(lookup));
        CHECK_FALSE(pf.active());
    }
    g_version = "3.14.0 (main) [GCC]";
    pf.init(lookup);
    CHECK(std::string(pf.why_off()) == "Python stacks need CPython 3.10 to 3.13");
}
