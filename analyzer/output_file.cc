// Output files written whole or not at all (output_file.h).
#include "output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <utility>

#include "diagnostics.h"

namespace gpumem::analysis {

file_replacement::file_replacement(std::string path, std::string what, mode_t mode)
    : path_(std::move(path)), what_(std::move(what)) {
    struct stat st {};
    const bool exists = ::stat(path_.c_str(), &st) == 0;
    if (exists && S_ISREG(st.st_mode)) {
        // A link to a regular file: its target is replaced, the link stays (as writing through it did).
        char* real = ::realpath(path_.c_str(), nullptr);
        if (real) {
            path_ = real;
            std::free(real);
        }
    }
    if (exists && !S_ISREG(st.st_mode)) {
        direct_ = true;
        fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC | O_TRUNC);
        if (fd_ < 0) spdlog::error("{} {}: cannot write: {}", what_, path_, std::strerror(errno));
        return;
    }
    const size_t slash = path_.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : path_.substr(0, slash + 1);
    tmp_ = (slash == std::string::npos ? std::string() : dir) + ".gpumem-out-XXXXXX";
    fd_ = ::mkostemp(tmp_.data(), O_CLOEXEC);
    if (fd_ < 0) {
        spdlog::error("{} {}: cannot create a file in {}: {}", what_, path_, dir, std::strerror(errno));
        return;
    }
    // mkostemp makes 0600; a plain output gets what a new file would have had (0666 less the umask).
    if (mode != 0600) {
        const mode_t mask = ::umask(0);
        ::umask(mask);
        mode &= ~mask;
    }
    ::fchmod(fd_, mode);
}

file_replacement::~file_replacement() {
    if (fd_ >= 0) ::close(fd_);
    if (!done_ && !direct_ && !tmp_.empty() && fd_ >= 0) ::unlink(tmp_.c_str());
}

bool file_replacement::commit() {
    if (fd_ < 0) return false;
    // EINVAL: a descriptor that cannot sync (a pipe, a device): there is nothing to flush.
    if (::fsync(fd_) != 0 && errno != EINVAL) {
        spdlog::error("{} {}: writing failed: {}", what_, path_, std::strerror(errno));
        return false;
    }
    if (direct_) return done_ = true;
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
        spdlog::error("{} {}: cannot replace it: {}", what_, path_, std::strerror(errno));
        return false;
    }
    return done_ = true;
}

bool write_whole(const std::string& path, const char* what, const std::function<void(std::ostream&)>& fill) {
    file_replacement out(path, what, 0600);
    if (!out.ok()) return false;
    {
        std::ofstream f(out.write_path(), std::ios::binary | std::ios::trunc);
        if (f) fill(f);
        f.flush();
        if (!f) {
            spdlog::error("{} {}: writing failed", what, path);
            return false;
        }
    }
    return out.commit();
}

}  // namespace gpumem::analysis
