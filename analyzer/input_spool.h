// An input named on the command line that can be read more than once: a regular file is read in
// place; a pipe, /dev/stdin, a FIFO or <(process substitution) is copied once into a private,
// unlinked temporary file.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace gpumem::analysis {

// Every command sniffs an input (log or report JSON?) before reading it, and a log may need a
// second pass; a pipe gives its bytes only once, so `cat LOG | gpumem report /dev/stdin` read an
// empty file.  Construct one per input before the first read and open path() for every read;
// messages keep naming the user's path.  Throws input_error when the spool cannot be written.
// `progress`: say on stderr every `interval_s` how much has been copied (the pipe's writer, zcat of
// a large log, may take as long as the reading after it).
// A path that pipe_spools spooled already is not copied again: path() is that spool.
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

// A command's inputs that are not regular files, spooled before any input is compared with another
// and kept while this lives: the copies rules (drop_copies_of_one_log, check's --baseline) compare a
// pipe's bytes as a file's, and every later read of that path (input_spool, line_source) reads the
// spool, not the drained pipe.  One per command, alive until its last read.
class pipe_spools {
public:
    pipe_spools() = default;
    pipe_spools(const pipe_spools&) = delete;
    pipe_spools& operator=(const pipe_spools&) = delete;
    ~pipe_spools();
    // Spools each of `paths` that is not a regular file (nor spooled already).  False, with `error`
    // naming the input, when one cannot be copied (input_spool's input_error).
    bool add(const std::vector<std::string>& paths, bool progress, double interval_s, std::string& error);

private:
    std::vector<std::unique_ptr<input_spool>> spools_;
    std::vector<std::string> paths_;  // the user's path of each spool
};

// What to open to read `path`: its spool while a pipe_spools holds one, else `path` itself.
std::string readable_path(const std::string& path);

}  // namespace gpumem::analysis
