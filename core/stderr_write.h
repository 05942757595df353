// The one way core/ and preload/ write to stderr: whole messages, in pieces, under sigpipe_guard.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <string_view>

namespace gpumem {

// Writes `parts` to stderr in order, as one message: a single writev where the kernel takes it all
// (a pipe takes up to PIPE_BUF bytes at once), continued after a partial write or EINTR, given up on
// any other error.  No heap and no fixed-size buffer, so a message of any length comes out whole.
// SIGPIPE is held off while it writes (sigpipe_guard, core/event_log.h): a stderr pipe whose reader
// has gone makes the write fail with EPIPE instead of ending the program.  Async-signal-safe.
// core_tests checks that core/ and preload/ reach stderr through nothing else (diag.cc's spdlog sink
// aside, which writes under its own sigpipe_guard).
void write_stderr(std::initializer_list<std::string_view> parts) noexcept;

// A number as decimal text, formatted on the stack (async-signal-safe, unlike snprintf).
class decimal {
  public:
    explicit decimal(long long v) noexcept;
    std::string_view view() const noexcept { return {buf_ + start_, sizeof buf_ - start_}; }
    operator std::string_view() const noexcept { return view(); }

  private:
    char buf_[24];
    size_t start_ = sizeof buf_;
};

}  // namespace gpumem
