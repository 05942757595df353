// Reads a `gpumem report --json` file (docs/report-json.md) back into the report model, the inverse
// of report_json.cc's writer, so that check, diff and report work on process_report/device_report
// whether their input was a log or a report.
#pragma once

#include <string>
#include <vector>

#include "report_fields.h"
#include "report_model.h"

namespace gpumem::analysis {

struct report_file {
    std::vector<process_report> processes;
    // fields[i][k]: the scalar members that device k of process i carried.  A member that is
    // missing (or not a number) reads as 0 in the model; whoever needs it must look here first.
    std::vector<std::vector<device_fields_read>> fields;
};

// Whether the file starts like a report JSON ("{" then a newline or a quote: one pretty-printed or
// compact document) rather than a log (a header object on its own line).  Reads at most 4 KiB.
bool looks_like_report_json(const std::string& path);

// Reads the whole file.  Throws input_error naming the file (and what is wrong) when it is not a
// report of the schema version this gpumem writes, and for a member no analysis writes, its line
// too; members of unexpected types read as missing.
// `open_path`: what to read in place of `path` (input_spool::path() of a pipe).
report_file read_report_json(const std::string& path, const std::string& open_path = {});

}  // namespace gpumem::analysis
