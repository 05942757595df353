// Output files written whole or not at all: the new content goes to a file beside the target and
// replaces it only once complete, so a failed write (a full disk, an error halfway) never leaves a
// half report where the last good one was.
#pragma once

#include <sys/types.h>

#include <functional>
#include <iosfwd>
#include <string>

namespace gpumem::analysis {

class file_replacement {
public:
    // what: the option that names the file, for messages ("--html").  mode: the new file's mode
    // (0600 for one that names the program's files, as the log does; else 0666 less the umask).
    // A target that exists and is not a regular file (/dev/stdout, a FIFO) is written straight
    // through: there is nothing to replace.
    file_replacement(std::string path, std::string what, mode_t mode);
    ~file_replacement();  // not committed: the new file is removed
    file_replacement(const file_replacement&) = delete;
    file_replacement& operator=(const file_replacement&) = delete;

    // False (with an error message): nothing can be written.
    bool ok() const { return fd_ >= 0; }
    // Where to write, by name or by descriptor (both open the same file).
    const std::string& write_path() const { return direct_ ? path_ : tmp_; }
    int fd() const { return fd_; }
    // Flushed to disk and put in place; false (with a message) leaves the target as it was.
    bool commit();

private:
    std::string path_, what_, tmp_;
    int fd_ = -1;
    bool direct_ = false, done_ = false;
};

// A plain output (--html, --perfetto, --junit), created 0600 like the log: the HTML and the trace
// carry the program's command line (docs/guide.md).  `fill` writes the content.
// False, with an error naming `what` and the path, when it could not be written whole.
bool write_whole(const std::string& path, const char* what, const std::function<void(std::ostream&)>& fill);

}  // namespace gpumem::analysis
