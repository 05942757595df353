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
    // PATH is taken as the shell's `>` takes it (docs/guide.md states the rule): a symbolic link
    // is followed to the file it names, which is replaced (or, for a link to nothing, created) and
    // the link kept; a device or FIFO (/dev/stdout) is written straight through, there being
    // nothing to replace; a directory, or a PATH that cannot be looked up (a loop of links), is
    // refused with a message naming PATH.
    file_replacement(std::string path, std::string what, mode_t mode);
    ~file_replacement();  // not committed: the new file is removed
    file_replacement(const file_replacement&) = delete;
    file_replacement& operator=(const file_replacement&) = delete;

    // False (with an error message): nothing can be written.
    bool ok() const { return fd_ >= 0; }
    // Where to write, by name or by descriptor (both open the same file).
    const std::string& write_path() const { return direct_ ? target_ : tmp_; }
    int fd() const { return fd_; }
    // Flushed to disk and put in place; false (with a message) leaves the target as it was.
    bool commit();

private:
    std::string path_, what_, tmp_;
    std::string target_;  // the file put in place: PATH with its links followed
    int fd_ = -1;
    bool direct_ = false, done_ = false;
};

// The file an output named `path` puts in place, by file_replacement's rule: a link followed to
// the file it names, existing or not.  `path` itself for a device, a directory or a name that
// cannot be looked up.
std::string output_target(const std::string& path);

// A plain output (--html, --perfetto, --junit), created 0600 like the log: the HTML and the trace
// carry the program's command line (docs/guide.md); --torch-snapshot uses file_replacement itself.  `fill` writes the content.
// False, with an error naming `what` and the path, when it could not be written whole.
bool write_whole(const std::string& path, const char* what, const std::function<void(std::ostream&)>& fill);

}  // namespace gpumem::analysis
