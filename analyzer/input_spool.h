// An input named on the command line that can be read more than once: a regular file is read in
// place; a pipe, /dev/stdin, a FIFO or <(process substitution) is copied once into a private,
// unlinked temporary file.
#pragma once

#include <string>

namespace gpumem::analysis {

// Every command sniffs an input (log or report JSON?) before reading it, and a log may need a
// second pass; a pipe gives its bytes only once, so `cat LOG | gpumem report /dev/stdin` read an
// empty file.  Construct one per input before the first read and open path() for every read;
// messages keep naming the user's path.  Throws input_error when the spool cannot be written.
// `progress`: say on stderr every `interval_s` how much has been copied (the pipe's writer, zcat of
// a large log, may take as long as the reading after it).
class input_spool {
public:
    explicit input_spool(const std::string& path, bool progress = false, double interval_s = 2.0);
    ~input_spool();
    input_spool(const input_spool&) = delete;
    input_spool& operator=(const input_spool&) = delete;
    // What to open: the path itself, or /proc/self/fd/N of the spool.
    const std::string& path() const { return open_path_; }
    bool spooled() const { return fd_ >= 0; }

private:
    void close_spool();
    int fd_ = -1;
    std::string open_path_;
};

}  // namespace gpumem::analysis
