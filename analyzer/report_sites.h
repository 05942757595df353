// Call-site views shared by the report writers: a site's frames as JSON, and its one-line name.
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "report_model.h"

namespace gpumem::analysis {

// [{"bytes": N, "count": N, "stack": ID, "frames": [...]}, ...]: frames innermost first; Python
// frames {"function","file","line"}, native ones also "module" and "address".  stack 0 (no stack
// recorded) has no frames.
nlohmann::ordered_json sites_json(const process_report& p, const std::vector<site_row>& rows);

// Whether a Python file is an installed package's or the standard library's (site-packages,
// dist-packages, lib/pythonX.Y, <frozen ...>) rather than the program's own.
bool in_library(const std::string& file);

// The frame a reader wants first: the innermost one in the program's own code, skipping frames in
// installed packages and the standard library (site-packages, dist-packages, lib/pythonX.Y), and
// frames with no name.  Falls back to the innermost frame.  Returns an index into `frames`.
size_t user_frame(const std::vector<frame_view>& frames);

// "load_weights (train.py:29)" for a Python frame; "f (lib.so+0x1a2b)" for an unnamed native one.
std::string frame_text(const frame_view& f);

// The text table of `rows` under `title`, each row with its user frame and the callers above it.
void write_sites_text(std::ostream& os, const process_report& p, const std::vector<site_row>& rows,
                      const std::string& title);

}  // namespace gpumem::analysis
