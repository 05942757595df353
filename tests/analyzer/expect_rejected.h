// The analyzer tests' check that a log is refused: by analyze_file, and by the gpumem binary with exit 2 and file:line.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include "analyze.h"
#include "log_reader.h"
#include "test_util.h"

namespace gpumem::test {

// Expects analyze_file to reject the log at `line` with a message starting with `what`, and the
// binary to exit 2 naming file:line.
inline void expect_rejected(const std::string& log, uint64_t line, const std::string& what) {
    temp_file f(log);
    try {
        analysis::analyze_file(f.path, {});
        FAIL("accepted: " << what);
    } catch (const analysis::input_error& e) {
        CHECK(e.line == line);
        CHECK_THAT(std::string(e.what()), Catch::StartsWith(f.path + ":" + std::to_string(line) + ": " + what));
    }
    run_result r = run_gpumem("report --no-progress " + f.path);
    CHECK(r.rc == 2);
    CHECK_THAT(r.err, Catch::Contains(f.path + ":" + std::to_string(line) + ": " + what));
}

}  // namespace gpumem::test
