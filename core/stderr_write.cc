// Whole messages on stderr under sigpipe_guard (core/stderr_write.h).
#include "stderr_write.h"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>

#include "event_log.h"  // sigpipe_guard

namespace gpumem {

void write_stderr(std::initializer_list<std::string_view> parts) noexcept {
    constexpr size_t k_max_iov = 16;  // more parts go out in further writev calls
    sigpipe_guard no_sigpipe;
    const std::string_view* p = parts.begin();
    const std::string_view* end = parts.end();
    size_t done_in_first = 0;  // bytes of *p already written
    while (p != end) {
        iovec iov[k_max_iov];
        int n = 0;
        for (const std::string_view* q = p; q != end && n < int(k_max_iov); ++q) {
            size_t skip = q == p ? done_in_first : 0;
            if (q->size() == skip) continue;
            iov[n].iov_base = const_cast<char*>(q->data() + skip);
            iov[n].iov_len = q->size() - skip;
            ++n;
        }
        if (n == 0) return;  // only empty parts left
        ssize_t w = writev(2, iov, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;  // EPIPE, EBADF, a full disk: nothing to report it with
        // Step over what was written: whole parts, then into the one it stopped in.
        size_t left = size_t(w);
        while (p != end && left >= p->size() - done_in_first) {
            left -= p->size() - done_in_first;
            done_in_first = 0;
            ++p;
        }
        done_in_first += left;
    }
}

decimal::decimal(long long v) noexcept {
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do {
        buf_[--start_] = char('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) buf_[--start_] = '-';
}

}  // namespace gpumem
