// Copies an input that is not a regular file into an unlinked temporary file, so that sniffing and
// a second pass can read it again.
#include "input_spool.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "format_util.h"  // visible, for the pipe's progress line
#include "log_reader.h"

namespace gpumem::analysis {

namespace {

bool write_all(int fd, const char* p, size_t n) {
    while (n) {
        ssize_t w = ::write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= size_t(w);
    }
    return true;
}

// After the line that opens the input (its first non-blank one, a JSON object's): whether more
// lines may follow.  A log's header (it has "ev") and a pretty report's lone brace do; any other
// object can only be a report on one line, after which a second line is an error anyway (and
// `yes '{}'` has no end).
bool lines_may_follow(std::string_view first) {
    while (!first.empty() && (first.back() == ' ' || first.back() == '\t' || first.back() == '\r')) first.remove_suffix(1);
    return first == "{" || first.find("\"ev\"") != std::string_view::npos;
}

bool blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

// The spools pipe_spools holds, by the user's path: what readable_path answers.  Written by the
// command's thread before and after its reads; read by the reads (report's run on threads).
std::mutex spooled_mu;
std::map<std::string, std::string>& spooled() {
    static std::map<std::string, std::string> by_path;
    return by_path;
}

}  // namespace

std::string readable_path(const std::string& path) {
    std::lock_guard<std::mutex> lk(spooled_mu);
    const auto it = spooled().find(path);
    return it == spooled().end() ? path : it->second;
}

bool pipe_spools::add(const std::vector<std::string>& paths, bool progress, double interval_s, std::string& error) {
    for (const std::string& p : paths) {
        struct stat st {};
        if (::stat(p.c_str(), &st) != 0 || S_ISREG(st.st_mode) || readable_path(p) != p) continue;
        try {
            spools_.push_back(std::make_unique<input_spool>(p, progress, interval_s));
        } catch (const input_error& e) {
            error = e.what();
            return false;
        }
        if (!spools_.back()->spooled()) continue;  // not opened: the reader says why
        std::lock_guard<std::mutex> lk(spooled_mu);
        spooled()[p] = spools_.back()->path();
        paths_.push_back(p);
    }
    return true;
}

pipe_spools::~pipe_spools() {
    std::lock_guard<std::mutex> lk(spooled_mu);
    for (const std::string& p : paths_) spooled().erase(p);
}

input_spool::input_spool(const std::string& path, bool progress, double interval_s) : open_path_(path) {
    if (std::string spool = readable_path(path); spool != path) {
        open_path_ = std::move(spool);
        return;
    }
    struct stat st {};
    // A regular file (or one that cannot be stat'ed: the reader then says why) is read in place.
    if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)) return;
    int in = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (in < 0) return;  // the reader says why
    const char* dir = std::getenv("TMPDIR");
    std::string tmpl = std::string(dir && *dir ? dir : "/tmp") + "/gpumem-spool-XXXXXX";
    // Where the folder comes from, so that a user whose /tmp is small or missing knows what to set.
    const std::string fix = std::string(dir && *dir ? "the copy goes to $TMPDIR (" + std::string(dir) + ")"
                                                    : "the copy goes to /tmp (TMPDIR is not set)") +
                            ": set TMPDIR to a folder that exists, with room for the input";
    // mkostemp creates the file 0600 with O_EXCL; unlinked at once, so nothing is left behind
    // and no other user can open it by name.
    fd_ = ::mkostemp(tmpl.data(), O_CLOEXEC);
    if (fd_ < 0) {
        int err = errno;
        ::close(in);
        throw input_error(path, 0, "cannot spool the input to " + tmpl + ": " + std::strerror(err) +
                                       " (it is not a regular file, and it may be read more than once; " + fix + ")");
    }
    ::unlink(tmpl.c_str());
    // Copied to its end, or to the first line longer than the reader takes (/dev/zero has no end):
    // the reader then stops at that line with its usual message.
    std::vector<char> buf(size_t{1} << 20);
    uint64_t since_newline = 0;
    // The stream is judged as it is copied, so that what can only fail stops early: its first
    // non-blank character must open a JSON object (or the stream be compressed: the reader gives
    // advice), or the copy stops (`yes | gpumem report -` copied gigabytes to $TMPDIR and never
    // ended); the line that brace opens says whether more lines may follow (lines_may_follow).
    enum class stage { seek, opening, rest } at = stage::seek;
    std::string first;        // the opening line's first 64 KiB
    bool one_object = false;  // the opening line is a whole object: only blanks may follow
    uint64_t copied = 0;
    const auto start = std::chrono::steady_clock::now();
    auto said = start;
    for (;;) {
        ssize_t n = ::read(in, buf.data(), buf.size());
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int err = errno;
            ::close(in);
            close_spool();
            throw input_error(path, 0, std::string("read failed: ") + std::strerror(err));
        }
        if (n == 0) break;
        if (!write_all(fd_, buf.data(), size_t(n))) {
            int err = errno ? errno : ENOSPC;
            ::close(in);
            close_spool();
            throw input_error(path, 0, "cannot spool the input to a temporary file in " +
                                           std::string(dir && *dir ? dir : "/tmp") + ": " + std::strerror(err) + " (" +
                                           fix + ")");
        }
        const char* nl = static_cast<const char*>(::memrchr(buf.data(), '\n', size_t(n)));
        since_newline = nl ? uint64_t(buf.data() + n - nl - 1) : since_newline + uint64_t(n);
        if (since_newline > k_max_line) break;
        const char* p = buf.data();
        const char* const end = p + n;
        if (copied == 0 && compression_of(std::string_view(p, size_t(n)))) at = stage::rest;  // copied whole
        if (copied == 0 && n >= 3 && std::memcmp(p, "\xEF\xBB\xBF", 3) == 0) p += 3;  // a UTF-8 byte order mark
        copied += uint64_t(n);
        if (progress) {
            const auto now = std::chrono::steady_clock::now();
            if (std::chrono::duration<double>(now - said).count() >= interval_s) {
                said = now;
                std::fprintf(stderr, "gpumem: %s: copying the pipe to a temporary file, %.0f MB so far (%.0f s), then reading it\n",
                             visible(path).c_str(), double(copied) / 1e6, std::chrono::duration<double>(now - start).count());
            }
        }
        if (at == stage::seek) {
            while (p < end && blank(*p)) ++p;
            if (p == end && copied > (uint64_t{64} << 10)) break;  // `yes ''`: no input opens so late
            if (p == end) continue;
            if (*p != '{') break;  // no gpumem input: the reader says so at this line
            at = stage::opening;
        }
        if (at == stage::opening) {
            const char* nl = static_cast<const char*>(std::memchr(p, '\n', size_t(end - p)));
            const size_t room = (size_t{64} << 10) - std::min(first.size(), size_t{64} << 10);
            first.append(p, std::min(room, size_t((nl ? nl : end) - p)));
            if (!nl) continue;
            at = stage::rest;
            one_object = !lines_may_follow(first);
            p = nl + 1;
        }
        if (one_object && std::any_of(p, end, [](char c) { return !blank(c); }))
            break;  // a second line after a one-line object: the reader says so there
    }
    ::close(in);
    open_path_ = "/proc/self/fd/" + std::to_string(fd_);
}

input_spool::~input_spool() { close_spool(); }

void input_spool::close_spool() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
}

}  // namespace gpumem::analysis
