// Copies an input that is not a regular file into an unlinked temporary file, so that sniffing and
// a second pass can read it again.
#include "input_spool.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

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

// Whether a stream whose first line is `first` may be a gpumem input at all: a log (its header has
// an "ev" member), a report JSON (a lone brace, or "schema" first), or a compressed file (the
// reader gives advice).  Anything else fails at line 1 whatever follows, so the copy stops there:
// `yes | gpumem report -` copied gigabytes to $TMPDIR and never ended.
bool may_be_input(std::string_view first) {
    if (compression_of(first)) return true;
    if (first.substr(0, 3) == "\xEF\xBB\xBF") first.remove_prefix(3);
    while (!first.empty() && (first.front() == ' ' || first.front() == '\t')) first.remove_prefix(1);
    while (!first.empty() && (first.back() == ' ' || first.back() == '\t' || first.back() == '\r')) first.remove_suffix(1);
    if (first.empty()) return true;  // blank lines first: the reader says what follows
    if (first.front() != '{') return false;
    return first == "{" || first.find("\"schema\"") != std::string_view::npos ||
           first.find("\"ev\"") != std::string_view::npos;
}

}  // namespace

input_spool::input_spool(const std::string& path) : open_path_(path) {
    struct stat st {};
    // A regular file (or one that cannot be stat'ed: the reader then says why) is read in place.
    if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)) return;
    int in = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (in < 0) return;  // the reader says why
    const char* dir = std::getenv("TMPDIR");
    std::string tmpl = std::string(dir && *dir ? dir : "/tmp") + "/gpumem-spool-XXXXXX";
    // mkostemp creates the file 0600 with O_EXCL; unlinked at once, so nothing is left behind
    // and no other user can open it by name.
    fd_ = ::mkostemp(tmpl.data(), O_CLOEXEC);
    if (fd_ < 0) {
        int err = errno;
        ::close(in);
        throw input_error(path, 0, "cannot spool the input to " + tmpl + ": " + std::strerror(err) +
                                       " (it is not a regular file, and it may be read more than once)");
    }
    ::unlink(tmpl.c_str());
    // Copied to its end, or to the first line longer than the reader takes (/dev/zero has no end):
    // the reader then stops at that line with its usual message.
    std::vector<char> buf(size_t{1} << 20);
    uint64_t since_newline = 0;
    std::string first;  // the first line, until it is judged (may_be_input)
    bool judged = false;
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
                                           std::string(dir && *dir ? dir : "/tmp") + ": " + std::strerror(err));
        }
        const char* nl = static_cast<const char*>(::memrchr(buf.data(), '\n', size_t(n)));
        since_newline = nl ? uint64_t(buf.data() + n - nl - 1) : since_newline + uint64_t(n);
        if (since_newline > k_max_line) break;
        if (!judged) {
            const char* end = static_cast<const char*>(std::memchr(buf.data(), '\n', size_t(n)));
            first.append(buf.data(), end ? size_t(end - buf.data()) : size_t(n));
            // A blank first line leaves the judgement to the reader; a long one is judged by its start.
            if (end || first.size() >= (size_t{64} << 10)) {
                judged = true;
                if (!may_be_input(first)) break;
            }
        }
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
