// Call-site views shared by the report writers: a site's frames as JSON and as text, and its one-line name.
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

// {"stack": ID, "frames": [...]}: one stack as a SITE lists it, without bytes and count (an OOM's
// failing call, "asked_by").
nlohmann::ordered_json stack_json(const process_report& p, uint32_t stack);

// Whether a Python file is not the program's own: an installed package's or the standard
// library's (site-packages, dist-packages, lib/pythonX.Y, <frozen ...>), or code generated at run
// time by torch.compile (TorchInductor's output modules under a torchinductor_* directory,
// torch.fx's "<eval_with_key>.N").
bool in_library(const std::string& file);

// The frame a reader wants first: the innermost one in the program's own code, skipping frames
// in_library() names, and frames with no name.  Falls back to the innermost frame.  Returns an
// index into `frames`.
size_t user_frame(const std::vector<frame_view>& frames);

// "load_weights (train.py:29)" for a Python frame; "f (lib.so+0x1a2b)" for an unnamed native one.
// A function name past k_name_chars characters (a C++ template's can run to thousands) and a file
// name past k_file_chars are cut with "…"; the JSON report and the HTML hover titles keep them whole.
inline constexpr size_t k_name_chars = 120, k_file_chars = 80;
std::string frame_text(const frame_view& f);

// At most `n` characters (code points) of `s`, with "…" when cut; never splits a UTF-8 sequence.
std::string shorten(const std::string& s, size_t n);

// The text table of `rows` under `title` (indented by `indent`), each row with its user frame and
// the callers above it.
void write_sites_text(std::ostream& os, const process_report& p, const std::vector<site_row>& rows,
                      const std::string& title, size_t indent = 2);

// One stack as the text tables show a site: its user frame ending the current line, then up to
// three callers ("called from") and the innermost frame when that is another ("inside"), each on a
// line of its own starting with `sub`.  `frames` is not empty.
void write_frames_text(std::ostream& os, const std::vector<frame_view>& frames, const std::string& sub);

// The title of the leak sites' table, text and HTML: a process killed before its end line never
// got to free what is live at the log's last line, so that is not called a leak.
const char* leak_sites_title(const process_report& p);

// A site's identity across runs: its frames (function, file, line, module; an unnamed native frame
// also by address), since stack ids are numbered per log.  "" for no stack.
std::string site_key(const std::vector<frame_view>* frames);

// "load_weights (train.py:12) <- <module> (train.py:40)": the user frame and its caller, and
// "(inside ...)" the innermost frame when that is another; "(no stack)" when there is none.
std::string site_name(const std::vector<frame_view>* frames);

// An OOM's failing call, named as site_name names it, for one-line messages (run's summary, check,
// Perfetto); "" when its stack was not recorded.
std::string asked_by_name(const process_report& p, uint32_t stack);
// What the text and HTML reports say of a failing call without a stack in a log that has stacks.
inline constexpr const char* k_no_failing_stack = "(no stack recorded for the failing call)";

// One site in two runs (`gpumem diff`).  A side's value is known when the site is listed there or
// that side lists every site (then an unlisted one has 0 bytes); otherwise it is below `bound`,
// the smallest bytes that side lists.
struct site_change {
    std::string key, name;
    uint64_t a_bytes = 0, b_bytes = 0, a_count = 0, b_count = 0;
    bool a_known = true, b_known = true;
    uint64_t a_bound = 0, b_bound = 0;
    double delta() const { return double(b_bytes) - double(a_bytes); }
};
// The sites of rows_a (of process pa) and rows_b (of pb) matched by site_key, the changed ones
// first by the size of the change (unknown changes last), then the unchanged ones.  `total_*`: the
// bytes the rows are part of (the peak, the leaked bytes), to tell whether a side lists them all.
std::vector<site_change> diff_sites(const process_report& pa, const std::vector<site_row>& rows_a, uint64_t total_a,
                                    const process_report& pb, const std::vector<site_row>& rows_b, uint64_t total_b);

}  // namespace gpumem::analysis
