// The HTML report's call-site views: the flame graph of the bytes live at the peak of requested
// memory by call stack, drawn as an icicle (outermost frame at the top) in self-contained SVG with a
// hover <title> per frame; the site tables; and the call an OOM failed in.
#pragma once

#include <string>

#include "report_model.h"

namespace gpumem::analysis {

// A frame narrower than this share of the peak is not drawn on its own: the narrow frames under one
// caller become one "…" box, drawn when together they reach it.  0.5% of the 980-pixel graph is
// about 5 pixels, below which a box can hold neither a label nor a mouse.
inline constexpr double k_flame_min_share = 0.005;
// Levels drawn, outermost first: the deepest stack the capture keeps (GPUMEM_STACK_DEPTH <= 256).
inline constexpr size_t k_flame_max_depth = 256;

// The device's call-site section of the HTML report: a heading, the flame graph's <svg> (from
// d.peak_sites, or from d.top_sites when the report was read back from JSON, which lists only
// those) with a note saying what it leaves out, and the table of the top sites.  "" when the log
// has no stacks or nothing was live at the peak.
std::string call_sites_html(const process_report& p, const device_report& d);

// A table of `rows` (the leaks by site, the sites live at an OOM) under a caption; with `share_of`
// (a column heading) each row's bytes also as a share of `total`.  "" when the log has no stacks or
// `rows` is empty.
std::string sites_table_html(const process_report& p, const std::vector<site_row>& rows, const std::string& caption,
                             const char* share_of = nullptr, uint64_t total = 0);

// An OOM's failing call as a paragraph: "asked for by" its site and callers, as the site tables name
// them; a line saying it has none when the log has stacks but that call none; "" for a log without
// stacks.
std::string asked_for_html(const process_report& p, uint32_t stack);

}  // namespace gpumem::analysis
