// Output files written whole or not at all (output_file.h).
#include "output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include "diagnostics.h"

namespace gpumem::analysis {

namespace {
// A link to nothing (stat's ENOENT, lstat's link): the name `>` would create, its links followed
// as the kernel follows them, a relative one from the link's own directory.  Any other name as it is.
std::string dangling_target(std::string p) {
    for (int hops = 0; hops < 40; ++hops) {  // the kernel's limit: stat said ENOENT, not ELOOP
        struct stat ls {};
        std::error_code ec;
        if (::lstat(p.c_str(), &ls) != 0 || !S_ISLNK(ls.st_mode)) break;
        const std::filesystem::path to = std::filesystem::read_symlink(p, ec);
        if (ec) break;
        const size_t slash = p.rfind('/');
        p = to.is_absolute() || slash == std::string::npos ? to.string() : p.substr(0, slash + 1) + to.string();
    }
    return p;
}
}  // namespace

std::string output_target(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return errno == ENOENT ? dangling_target(path) : path;
    if (!S_ISREG(st.st_mode)) return path;
    char* real = ::realpath(path.c_str(), nullptr);
    if (!real) return path;
    std::string r = real;
    std::free(real);
    return r;
}

file_replacement::file_replacement(std::string path, std::string what, mode_t mode)
    : path_(std::move(path)), what_(std::move(what)), target_(path_) {
    struct stat st {};
    const bool exists = ::stat(path_.c_str(), &st) == 0;
    if (!exists && errno != ENOENT) {
        // ELOOP (a loop of links), EACCES, ENOTDIR: `>` fails there too.  Replacing the name would
        // turn a link into a plain file unsaid.
        spdlog::error("{} {}: cannot write: {}", what_, path_, std::strerror(errno));
        return;
    }
    if (exists && S_ISDIR(st.st_mode)) {
        spdlog::error("{} {}: is a directory; not written", what_, path_);
        return;
    }
    if (exists && !S_ISREG(st.st_mode)) {
        direct_ = true;
        fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC | O_TRUNC);
        if (fd_ < 0) spdlog::error("{} {}: cannot write: {}", what_, path_, std::strerror(errno));
        return;
    }
    // A regular file, perhaps through links (/dev/stdout redirected to one among them), or none
    // yet: the file the links name is replaced or created, the links stay.
    target_ = output_target(path_);
    const size_t slash = target_.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : target_.substr(0, slash + 1);
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
    if (::rename(tmp_.c_str(), target_.c_str()) != 0) {
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
