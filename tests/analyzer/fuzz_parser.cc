// libFuzzer target: arbitrary bytes as a log, through the line parser, the stack-record reader, the
// whole analysis, every report writer and the PyTorch snapshot export.
// Build with -DGPUMEM_FUZZ=ON and clang; run: fuzz_parser -max_total_time=60 CORPUS_DIR
// tests/data/fuzz_seeds (stack records: Python, native, bad ids, duplicates, references before
// definition, a pooled log with segment_unmap, an arena segment with asize and segment_map) and
// tests/data/golden are good seeds.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <sstream>
#include <cstring>
#include <string>
#include <vector>

#include <fcntl.h>

#include "analyze.h"
#include "log_reader.h"
#include "report_output.h"
#include "metrics/sites.h"
#include "views/pickle_writer.h"
#include "views/torch_snapshot.h"

using namespace gpumem::analysis;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    // 1. Each line on its own through the parser, with the padding simdjson expects, and again
    // through simdjson alone: the recorder-shape fast path must give exactly parse_json's answer.
    {
        static line_parser parser, json_only;
        std::vector<char> buf(size + 64, 0);
        std::memcpy(buf.data(), data, size);
        std::string err, err_json;
        size_t start = 0;
        for (size_t i = 0; i <= size; ++i) {
            if (i == size || buf[i] == '\n') {
                log_event e, ej;
                parse_status st = parser.parse(buf.data() + start, i - start, buf.size() - start, e, err);
                parse_status sj = json_only.parse_json(buf.data() + start, i - start, buf.size() - start, ej, err_json);
                if (st == parse_status::ok) (void)line_parser::missing_members(e);
                bool same = st == sj && (st == parse_status::ok || err == err_json) && e.present == ej.present &&
                            e.known_kind == ej.known_kind && e.ev == ej.ev && e.kind == ej.kind && e.pool == ej.pool &&
                            e.pooled == ej.pooled && e.unknown == ej.unknown && e.dev == ej.dev && e.err == ej.err &&
                            parser.api_name(e.api) == json_only.api_name(ej.api) && e.seq == ej.seq && e.t == ej.t &&
                            e.ptr == ej.ptr && e.size == ej.size && e.asize == ej.asize && e.seg == ej.seg &&
                            e.handle == ej.handle && e.count == ej.count && e.reserved == ej.reserved &&
                            e.allocated == ej.allocated && e.requested == ej.requested &&
                            e.largest_free == ej.largest_free && e.free_blocks == ej.free_blocks &&
                            e.segments == ej.segments && e.gpu_free == ej.gpu_free && e.gpu_total == ej.gpu_total &&
                            e.streams == ej.streams && e.fence == ej.fence && e.waited == ej.waited &&
                            e.ordered == ej.ordered && e.wait_ns == ej.wait_ns && e.fence_ns == ej.fence_ns &&
                            e.reason == ej.reason && e.signal == ej.signal;
                if (!same) __builtin_trap();  // the two paths disagree on this line
                // A stack record: read it alone too, and hold what it yields to the reader's rules.
                if (st == parse_status::ok && e.known_kind && e.ev == gpumem::ev_kind::stack) {
                    uint32_t id = 0;
                    std::vector<frame_view> frames;
                    std::string why;
                    if (parse_stack_record(std::string_view(buf.data() + start, i - start), id, frames, why)) {
                        if (id == 0) __builtin_trap();  // id 0 means "no stack" and must be refused
                        for (const frame_view& f : frames)
                            if (f.function.empty() && f.file.empty() && f.module.empty()) __builtin_trap();
                    } else if (why.empty()) {
                        __builtin_trap();  // a refusal must say why
                    }
                }
                start = i + 1;
            }
        }
    }
    // 2. The whole input as a log file (an in-memory file, so no disk traffic), then every writer.
    int fd = memfd_create("gpumem_fuzz", 0);
    if (fd < 0) return 0;
    if (size && write(fd, data, size) != ssize_t(size)) {
        close(fd);
        return 0;
    }
    std::string path = "/proc/self/fd/" + std::to_string(fd);
    try {
        analyze_options opt;
        opt.at = {moment::by::seq, 3};
        opt.snapshot_budget_fixed = 16;  // exercise the second pass too
        opt.snapshot_budget_per_event = 0;
        std::vector<process_report> ps{analyze_file(path, opt)};
        combined_report c = combine(ps);
        output_options oo;
        oo.show_at = true;
        std::ostringstream sink;
        write_text(sink, ps, c, oo);
        write_html(sink, ps, c, oo);
        write_perfetto(sink, ps);
        sink << to_json(ps, c, oo).dump();
        // The PyTorch snapshot reads the log again: into /dev/null, only that it never crashes.
        int null_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
        if (null_fd >= 0) {
            pickle_writer w(null_fd);
            try {
                (void)write_torch_snapshot(path, ps[0], w);
            } catch (const input_error&) {
            }
            w.flush();
            close(null_fd);
        }
    } catch (const input_error&) {
    }
    close(fd);
    return 0;
}
