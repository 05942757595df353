// Streams a gpumem log: reads it in large chunks, splits lines, and parses each line into a log_event.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "log_event.h"

namespace gpumem::analysis {

// An input the analyzer cannot use.  `what()` is the full "file:line: message" text; the CLI
// prints it and exits with code 2.
class input_error : public std::runtime_error {
public:
    input_error(const std::string& file, uint64_t line, const std::string& msg);
    std::string file;
    uint64_t line;  // 0 when the problem is the file as a whole
    std::string message;
};

// "cannot open: " and strerror(err) for an input that cannot be opened.  A missing name holding *, ?
// or [ is most likely a glob the shell matched to no file and passed on as written (`gpumem report
// run*/x.jsonl` in the wrong folder): the message says so, since the name alone looks like a typo.
std::string cannot_open_message(const std::string& path, int err);

// A longer line is corruption, not a log line: the reader refuses it, and a spooled pipe
// (input_spool.h) stops there, so /dev/zero ends.
constexpr size_t k_max_line = size_t{64} << 20;

// Reads lines of one file without holding more than one chunk (plus the longest line) in memory.
// The buffer keeps simdjson's padding after its end, so any line handed out can be parsed in place.
// A regular file is read up to the size it had when opened: a log still being written (a running
// job) is read as it stood then, perhaps ending inside a line, rather than followed while it grows,
// which never ends while its writer outpaces the reader (the emulated train writes 90 MB/s).
class line_source {
public:
    // Throws input_error when it cannot be opened.  `limit`: read at most this many bytes (a second
    // pass reads what the first read, though the file has grown since).  A pipe that the command
    // spooled (pipe_spools, input_spool.h) is read from its spool; messages name `path`.
    explicit line_source(const std::string& path, uint64_t limit = UINT64_MAX);
    ~line_source();
    line_source(const line_source&) = delete;
    line_source& operator=(const line_source&) = delete;

    // Next line without its '\n'.  `complete` is false for a last line with no newline (a crashed
    // writer).  Returns false at end of file.  The view stays valid until the next call.
    bool next(std::string_view& line, bool& complete);
    // Bytes readable from `p` on: the line, what follows it and the padding.
    size_t capacity_from(const char* p) const { return size_t(buf_.data() + buf_.size() - p); }
    uint64_t line_number() const { return line_no_; }
    uint64_t bytes_consumed() const { return consumed_; }
    uint64_t file_size() const { return file_size_; }  // a regular file's, at open, within the limit
    const std::string& path() const { return path_; }

private:
    bool fill();  // reads more bytes; false at end of file
    std::string path_;
    int fd_ = -1;
    std::vector<char> buf_;
    size_t begin_ = 0, end_ = 0;  // unread bytes are buf_[begin_, end_)
    bool eof_ = false;
    uint64_t limit_ = UINT64_MAX;  // bytes to read at most
    uint64_t read_ = 0;            // bytes read so far
    uint64_t line_no_ = 0;
    uint64_t consumed_ = 0;
    uint64_t file_size_ = 0;
};

// Reading progress on stderr, at most once per interval: "gpumem: PATH: 37% (120 MB), 1200000
// events, 2.1 M events/s".  One meter for every command that reads logs (report, check and diff
// through analyze.cc, replay through simulate/trace.cc), so they all say it alike.
class reading_meter {
public:
    // `pass`: said after the path (" (peak pass)" for a second read of the same log).
    reading_meter(bool on, double interval_s, std::string path, const char* pass = "");
    // Called once per line read after the header.  The clock is looked at every 4,096 lines only:
    // once per line would cost more than the line's parsing.
    void line(const line_source& src) {
        if ((++lines_ & 0xfff) == 0 && on_) tick(src);
    }

private:
    void tick(const line_source& src);
    bool on_;
    double interval_;
    std::string path_;
    const char* pass_;
    uint64_t lines_ = 0;
    std::chrono::steady_clock::time_point start_, last_;
};

// A line of spaces, tabs or a CRLF log's "\r" only: skipped by every reader (no JSON in it).
inline bool is_blank_line(std::string_view s) {
    for (char c : s)
        if (c != ' ' && c != '\t' && c != '\r') return false;
    return true;
}

// Result of parsing one line.
enum class parse_status { ok, not_json, bad_member };

// Parses event lines with simdjson's on-demand API.  One instance per thread; it keeps the parser's
// buffers and the table of API names seen so far.
class line_parser {
public:
    line_parser();
    ~line_parser();
    line_parser(const line_parser&) = delete;
    line_parser& operator=(const line_parser&) = delete;

    // Parses [p, p+len); `capacity` bytes from p are readable (see line_source::capacity_from).
    // On failure `error` says what was wrong, without file or line.
    // Lines in the recorder's own shape take parse_recorder_line, every other line parse_json.
    parse_status parse(const char* p, size_t len, size_t capacity, log_event& out,
                       std::string& error) {
        if (parse_recorder_line(p, len, capacity, out)) return parse_status::ok;
        return parse_json(p, len, capacity, out, error);
    }
    // The fast path: a line exactly as core/event_format.cc writes it (members in its order and
    // spelling, no whitespace, no escapes, plain integers) is read without a JSON parser.  True
    // when it filled `out` just as parse_json would; false on any deviation, with `out` and the
    // API table untouched, so the caller falls back to parse_json.
    bool parse_recorder_line(const char* p, size_t len, size_t capacity, log_event& out);
    // The generic path: any JSON object, through simdjson on-demand.
    parse_status parse_json(const char* p, size_t len, size_t capacity, log_event& out,
                            std::string& error);
    // Members an event of this kind must have; names the first missing one or returns "".
    static std::string missing_members(const log_event& e);
    // The members an event of this kind must have, as a mask of field bits.
    static uint64_t required_members(const log_event& e);

    // The API that names every one past the 1,024th distinct name of a log.
    static constexpr const char* k_folded_api_name = "(other APIs: more than 1024 names)";
    const std::string& api_name(uint16_t index) const { return api_names_[index]; }
    size_t api_count() const { return api_names_.size(); }
    uint16_t intern_api(std::string_view name);

private:
    struct impl;
    std::unique_ptr<impl> impl_;
    uint16_t intern_api_slow(std::string_view name);
    std::vector<std::string> api_names_;  // api_id names first, then unknown names as seen
    uint16_t last_api_[2] = {0, 0};
};

// Parses "0x1a2b" (1 to 16 hex digits after 0x).  False on anything else.
bool parse_hex(std::string_view s, uint64_t& out);

// "gzip", "zstd", "xz" or "bzip2" when a log's first bytes are those of a compressed file, else
// nullptr: the header readers then say to decompress it rather than that line 1 is not JSON.
const char* compression_of(std::string_view first_line);

// Whether line 1, which did not parse, is a gpumem header that the file ends inside (no newline
// after it: `complete` false): a partial copy, or a disk that filled as it was written.  The header
// readers (report's, replay's) then say k_header_cut_short rather than that it is no gpumem log.
bool header_cut_short(std::string_view first_line, bool complete);
inline constexpr const char* k_header_cut_short =
    "the log ends inside its header line (cut short: a partial copy, or a disk that filled)";

// What to do about a log that compression_of found compressed (`z`), as the header readers say it:
// decompress it, or pipe it into `command` ("report", "check", ...), both spelled out with `path`
// so that the line can be copied.  For "diff", whose other run this cannot name and only one of
// whose inputs can be "-", and for a file an option reads ("check --baseline"): decompress it
// into a file, or give <(zcat ...) in its place.
std::string compressed_log_advice(const char* z, const std::string& path, const char* command);

}  // namespace gpumem::analysis
