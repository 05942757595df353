// A streaming writer of Python pickles (protocol 4 opcodes, no frames): just the types PyTorch's
// memory snapshot uses, written straight to a file descriptor in 1 MiB pieces, never built whole.
//
// Written by hand rather than through a library: the subset is small (dict, list, tuple, str, int,
// float, bool, None, the memo), its byte format is fixed by CPython's Lib/pickletools.py, and
// PyTorch's viewer (MemoryViz.js) reads only these opcodes: EMPTY_DICT/EMPTY_LIST + MARK ...
// SETITEMS/APPENDS, (SHORT_)BINUNICODE, BININT1/BININT2/BININT/LONG1 (at most 8 bytes), NEWTRUE/
// NEWFALSE, NONE, BINFLOAT, TUPLE2, LONG_BINPUT/LONG_BINGET.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace gpumem::analysis {

class pickle_writer {
  public:
    // Writes to `fd` (not owned).  Nothing is written until the first call.
    explicit pickle_writer(int fd);
    ~pickle_writer();  // flushes what is left (errors then go unsaid: call flush() first)
    pickle_writer(const pickle_writer&) = delete;
    pickle_writer& operator=(const pickle_writer&) = delete;

    void begin();  // PROTO 4
    void end();    // STOP, then flush

    // Containers.  Items (and key, value pairs) go between begin_* and end_*; lists are appended
    // in batches of 1000, as CPython's pickler does, so that no reader needs one huge mark.
    void begin_dict();
    void end_dict();
    void begin_list();
    void end_list();
    void int_pair(int64_t a, int64_t b);  // the tuple (a, b)

    // Values.
    void str(std::string_view s);  // bytes that are not UTF-8 become U+FFFD: Python must decode it
    void key(const char* k) { str(k); }
    void integer(int64_t v);
    void uinteger(uint64_t v);  // past INT64_MAX: a 9-byte LONG1 (Python reads it; MemoryViz.js does not)
    void real(double v);
    void boolean(bool v);
    void none();

    // The memo, numbered 0, 1, 2, ... in the order values are stored: end_list_memo() and
    // end_dict_memo() close a container as end_list()/end_dict() do and store it; get(id) writes a
    // stored value again (read back, both are one object).  str_memo() writes a string that
    // repeats (a key, an action name) once and refers to it after that.
    uint32_t end_list_memo();
    uint32_t end_dict_memo();
    void get(uint32_t id);
    void str_memo(std::string_view s);

    void flush();  // writes the buffer out now
    bool failed() const { return err_ != 0; }
    int error() const { return err_; }  // errno of the first failed write, 0 when none
    uint64_t bytes_written() const { return written_ + buf_.size(); }

  private:
    void byte(uint8_t b) { buf_.push_back(char(b)); }
    void raw(const void* p, size_t n);
    void le(uint64_t v, int n);
    void write_int(int64_t v);  // the opcode and bytes only  // n bytes, little-endian
    void maybe_flush() {
        if (buf_.size() >= (size_t(1) << 20)) flush();
    }

    int fd_;
    int err_ = 0;
    uint64_t written_ = 0;
    std::string buf_;
    void value_done();  // one value complete: counts toward its list's batch
    struct open_container {
        bool list;
        uint32_t items;  // lists: items since the last APPENDS
    };
    std::vector<open_container> open_;
    std::string scratch_;               // a string made valid UTF-8
    uint32_t next_memo_ = 0;
    std::unordered_map<std::string, uint32_t> str_memo_;
    void write_str(std::string_view s);  // the opcode and bytes only
    uint32_t put();                      // LONG_BINPUT of the next id
};

// `s` as valid UTF-8: each byte that is not part of a well-formed sequence (overlong forms and
// encoded surrogates included) becomes U+FFFD.  Exposed for tests.
std::string to_valid_utf8(std::string_view s);

}  // namespace gpumem::analysis
