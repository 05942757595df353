// Shared by the commands: argument parsing of sizes, numbers, ratios and --at moments; and, for
// `gpumem check` and `gpumem diff`, loading a run (logs or `gpumem report --json` output) into the
// report model with a stable key per (process, device).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "metrics/metric.h"  // moment, what --at names
#include "diagnostics.h"
#include "format_util.h"  // fmt_where
#include "input_spool.h"  // pipe_spools
#include "report_fields.h"
#include "report_model.h"

namespace gpumem::analysis {

// "12GiB", "500MB", "1.5 GiB", "4096": core/size_parse.h's parse_size, the rule GPUMEM_* sizes follow.
bool parse_size_arg(const std::string& text, uint64_t& out);
// A number >= 0 as the size rule writes it: digits, optionally '.' and more digits ("2", "0.5").
// No sign, space, exponent ("1e3"), hex, nan or inf: every number argument (sizes, times, ratios,
// counts, seconds) is written alike, and a size's "1e3" is refused.
bool parse_number_arg(const std::string& text, double& out);
// A ratio in [0, 1]: "0.3", "30%" or "30 %".
bool parse_ratio_arg(const std::string& text, double& out);
// A tolerance in percent: "5%", "5 %" or "5" -> 0.05.  Must be >= 0.
bool parse_percent_arg(const std::string& text, double& out);
// An --at moment: an event seq, "1234" or "#1234", or a time since the recorder started, a number
// (parse_number_arg), optionally spaces, and s, ms, us or ns in any letter case: "2.5s", "150ms",
// "3 us", "900NS".
bool parse_moment(const std::string& text, moment& out);

// "-" among the inputs (`zcat LOG.gz | gpumem report -`) is standard input, as for most command-line
// tools: it becomes /dev/stdin, which every command reads (a pipe is spooled, input_spool.h), and
// which messages and reports then name.  Standard input is one stream: a second "-" would read
// nothing, so it is refused (false, with `error`).  `paths`: every input of the command.
bool dash_means_stdin(const std::vector<std::string*>& paths, std::string& error);
// The same over one list of inputs.
bool dash_means_stdin(std::vector<std::string>& paths, std::string& error);

// `msg`, the error of a command given too few logs, with "; to read standard input, pass -" when a
// log is piped or redirected in (`gpumem report < LOG`): standard input is read only when named.
// A pipe, file or socket on standard input counts; a terminal or /dev/null (a CI step's) does not.
std::string with_stdin_hint(std::string msg);

// One file named twice among the inputs of one run (a CI glob and an explicit name, ./x and x, a
// symbolic link and its target, a hard link) would count as two processes, the second "rank 0#2",
// and double every total: each file is read once, at its first name, and a warning names the
// repeat.  The same file is the same device and inode; a name that does not exist is left for the
// reader to refuse.  `paths`: the inputs of one run (each side of `diff` is one run).
void drop_repeated_inputs(std::vector<std::string>& paths);

// Two files that are copies of one log (the original cut at a full disk and the complete copy the
// recorder moved to /tmp; a run folder and its backup) are one process, and read as two they would
// double every total as a repeated file does.  Logs whose headers name the same host, pid and start
// (start_unix_ns, to the nanosecond) in the same line 1 are one process: an exec's new image has the
// pid but starts later, a fork child has a pid of its own.  When the shorter holds the first bytes
// of the longer, the longer alone is read (the first given, of equal ones) and a warning names both;
// when they differ past line 1, which to read cannot be told: false, with `error` naming both and
// the line they part at.  Headers that name one process but differ are two processes (said, and
// both read).  An input that is not a regular file (standard input, <(zcat backup.jsonl.gz)) is
// first spooled into `spools`, which the command keeps until its last read, and compared as a file
// is; a lone input is not (nothing to compare).  A header without a start (a hand-made log's 0)
// names no process.  Report JSON files: two of the same bytes are read once (said); one holding a
// process (same host, pid, start and rank) that another input holds too cannot be compared with
// it: false, with `error` naming both.  `paths`: the inputs of one run, each file named once already
// (drop_repeated_inputs).  `progress`: the command's flags, for the spooling of a long pipe.
bool drop_copies_of_one_log(std::vector<std::string>& paths, pipe_spools& spools, const progress_flags& progress,
                            std::string& error);

// Who a process is, as a log's line 1, a report JSON's "processes" entry or an analyzed
// process_report names it; what the copies rule (drop_copies_of_one_log) and check's warning of a
// run compared with its own report (warn_if_own_baseline) compare.
struct process_identity {
    std::string host, rank;
    int64_t pid = 0;
    uint64_t start_unix_ns = 0;  // 0 in a hand-made log: names no process
};
process_identity identity_of(const process_report& p);
// Whether `a` and `b` name one process: the same host, pid, start (start_unix_ns, to the
// nanosecond: an exec's new image has the pid but starts later) and rank, and a start that is not
// 0.  The one statement of that rule.
bool same_process(const process_identity& a, const process_identity& b);

// Whether files `a` and `b` are one input: the same file (device and inode), files of the same
// bytes (a log or a report JSON copied), or copies of one log (drop_copies_of_one_log's rule: line 1
// is the same header naming a process, and the shorter holds the first bytes of the longer).  For
// `check`, whose --baseline may not be a log it checks under another name.  A pipe is compared by
// its spool (pipe_spools), and is not read without one.  `process`, for one_log: "the log of
// process 1001 on ci01, started ...".
enum class input_sameness { none, same_file, same_bytes, one_log };
input_sameness same_input(const std::string& a, const std::string& b, std::string& process);

// One GPU (dev >= 0) of one process of a run.
struct device_ref {
    size_t process = 0;  // index into run_input::processes
    size_t device = 0;   // index into that process's devices
    // Matches the same device of the same process in another run of the same job: the rank, an
    // occurrence number when several processes share a rank (forked workers, ordered by start
    // time), and the device ordinal.  Pids change between runs, so they are not part of it.
    std::string key;
    std::string where;   // "rank 0 dev 0 (pid 1234, run/gpumem-1234.jsonl)", for messages
};

struct run_input {
    std::vector<process_report> processes;  // over every input, in order
    std::vector<std::string> source;         // per process: the input path it was read from
    // Which scalar members each device has: all of them for an analyzed log; what the file carried
    // for a report JSON.
    std::vector<std::vector<device_fields_read>> fields;
    std::vector<device_ref> devices;  // sorted by key
    const process_report& proc(const device_ref& r) const { return processes[r.process]; }
    const device_report& dev(const device_ref& r) const { return processes[r.process].devices[r.device]; }
    bool has(const device_ref& r, device_field f) const { return fields[r.process][r.device].has(f); }
    std::string why_missing(const device_ref& r, device_field f) const { return fields[r.process][r.device].why_missing(f); }
    // Where a missing member is (device_fields_read::line): "FILE:LINE", or the input's name where no line is known.
    std::string missing_at(const device_ref& r, device_field f) const {
        return fmt_where(source[r.process], fields[r.process][r.device].line(f));
    }
};

// Whether processes `a` and `b` ran in one job: on one host, children of one parent (the same
// ppid, not 0: torchrun's workers, the ranks of one `gpumem run`) or one the other's parent (a child
// a rank forked, whose log may sort first: gpumem-10005 before gpumem-9998), at times that overlap
// (from the start to the last event).  Two runs of one job script do not overlap; logs of other runs whose
// pids repeat (a container's) do not either.
bool same_job(const process_report& a, const process_report& b);
// One run's logs split over two runs: `side` holds a process of the job of a process in `other` (or
// that process itself) and a process of no such job.  A glob given where one file is read
// (`check --baseline main/*.jsonl`, diff's A without --) leaves the first log alone and gives the
// rest of the main branch's ranks to the other run: that run then holds them beside its own, and
// the ranks of one stand in for the missing ranks of the other.  When so, `of` and `not_of` are
// one process of each kind (indexes into side.processes).
bool mixes_job_of(const run_input& side, const run_input& other, size_t& of, size_t& not_of);
// The error for such a side, up to what to do instead: "SOURCE holds a process of `run` (rank R, pid
// P on HOST, a child of parent PP as `owner`, at the same time), and SOURCE one of another run"
// ("the parent of `owner` pid C", "a child of `owner` pid P" for same_job's other kin), or for a
// process `other` holds itself, "(rank R, pid P on HOST, `owner` own process)": without a ppid (0)
// that is how it matched.  check and diff word it alike; `run` and `owner` name the other side
// ("the --baseline's run", "the baseline's").
std::string mixed_job_error(const run_input& side, const run_input& other, size_t of, size_t not_of,
                            const std::string& run, const std::string& owner);

// A GPU of one run compared with one of another (check --baseline, diff) that was another model or
// had another memory size, where both sides record it: "ran on another GPU than OWNER's: NAME (SIZE)
// HERE, NAME (SIZE) THERE: its memory use may differ for that alone" (allocator rounding, cuDNN
// workspaces and the pool's segments all follow the GPU); empty when alike.  check and diff word
// it alike.  Another name is always said; the size alone only past k_other_gpu_size_share of the
// larger: one GPU reports a total that moves a little (a driver's reserve, ECC on a GDDR card takes
// 1/16, 6.25%), while same-named models of other sizes differ by a third or more (an RTX 3060 of 8
// or 12 GB) and a MIG slice by half or more.
constexpr uint64_t k_other_gpu_size_share = 10;  // percent, docs/guide.md
std::string other_gpu(const run_input& run, const device_ref& r, const run_input& owner_run, const device_ref& o,
                      const std::string& owner, const std::string& here, const std::string& there);

// The warnings of one analyzed input as they are logged: every listed warning (file:line: what),
// then "N more warnings not shown" when the report kept fewer than it counted.  Shown by report,
// check and diff alike: a gate must not pass quietly on a log that lost events or was cut short.
std::vector<std::string> warning_lines(const process_report& p, const std::string& path);

// Whether writing the output file `out` (--html, --perfetto, --torch-snapshot, --junit) would
// destroy data: `out` is one of the inputs, or an existing file that holds a gpumem log (plain or
// gzipped) or report JSON.  `gpumem report --html run/*.jsonl` takes the first log as the HTML
// file's name; truncating it would lose that rank and still exit 0.  Fills `why`, which names
// `option` ("--html"), when it would.  "-" is refused too: it is no file to write, and standard
// output carries the command's own text; so are a directory and a name stat cannot follow (a loop
// of links), which the write would refuse only after the whole analysis.
bool output_would_clobber(const std::string& out, const char* option, const std::vector<std::string>& inputs,
                          std::string& why);

// Loads each path: a gpumem log (analyzed) or a `gpumem report --json` file, and shows each one's
// warnings (warning_lines) on stderr.  On failure returns false with a message naming the file;
// never throws.
// progress: the command's --progress flags, for each log's reading (analyze_options::progress).
// command: "check", "check --baseline" or "diff", for messages (analyze_options::command).
bool load_run(const std::vector<std::string>& paths, run_input& out, std::string& error, const progress_flags& progress,
              const char* command);

}  // namespace gpumem::analysis
