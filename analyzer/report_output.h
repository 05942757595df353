// The report writers: text (stdout), JSON (docs/report-json.md), self-contained HTML, Perfetto trace.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "report_model.h"

namespace gpumem::analysis {

struct output_options {
    bool show_at = false;  // --at was given: print the map at that moment
};

void write_text(std::ostream& os, const std::vector<process_report>& procs, const combined_report& combined,
                const output_options& opt);
nlohmann::ordered_json to_json(const std::vector<process_report>& procs, const combined_report& combined,
                               const output_options& opt);
void write_html(std::ostream& os, const std::vector<process_report>& procs, const combined_report& combined,
                const output_options& opt);
void write_perfetto(std::ostream& os, const std::vector<process_report>& procs);

// The free-block map of one segment as characters, `width` wide: '#' all allocated, '.' all free,
// '+' partly allocated.  Exposed for tests.
std::string segment_bar(const segment_view& s, size_t width);

// Version of the --json schema (docs/report-json.md).  Bumped only for incompatible changes.
inline constexpr int k_report_schema_version = 1;

}  // namespace gpumem::analysis
