// libFuzzer target: arbitrary bytes as a log, through the line parser and the whole analysis.
// Build with -DGPUMEM_FUZZ=ON and clang; run: fuzz_parser -max_total_time=60 CORPUS_DIR
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <sstream>
#include <cstring>
#include <string>
#include <vector>

#include "analyze.h"
#include "log_reader.h"
#include "report_output.h"

using namespace gpumem::analysis;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    // 1. Each line on its own through the parser, with the padding simdjson expects.
    {
        static line_parser parser;
        std::vector<char> buf(size + 64, 0);
        std::memcpy(buf.data(), data, size);
        log_event e;
        std::string err;
        size_t start = 0;
        for (size_t i = 0; i <= size; ++i) {
            if (i == size || buf[i] == '\n') {
                if (parser.parse(buf.data() + start, i - start, buf.size() - start, e, err) == parse_status::ok)
                    (void)line_parser::missing_members(e);
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
    } catch (const input_error&) {
    }
    close(fd);
    return 0;
}
