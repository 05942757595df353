// Symbolization of a log's native frames, timed, and (--compare) checked name by name against
// libdw's own dwfl_module_addrinfo, which the symbolizer's sorted symbol tables replace.
// Usage: bench_symbolize LOG [--compare]; prints what it measured; exit 1 on a mismatch.
#include <elfutils/libdwfl.h>
#include <cxxabi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "log_reader.h"
#include "metrics/sites.h"
#include "symbolize.h"

using namespace gpumem::analysis;

namespace {
const Dwfl_Callbacks k_callbacks = {dwfl_build_id_find_elf, dwfl_standard_find_debuginfo, dwfl_offline_section_address,
                                    nullptr};

// libdw's answer, the way the symbolizer asked before it kept its own tables.
std::string reference_name(const std::string& module, uint64_t addr) {
    static std::map<std::string, std::pair<Dwfl*, Dwfl_Module*>> mods;
    auto it = mods.find(module);
    if (it == mods.end()) {
        Dwfl* d = dwfl_begin(&k_callbacks);
        dwfl_report_begin(d);
        Dwfl_Module* m = dwfl_report_elf(d, module.c_str(), module.c_str(), -1, 0, false);
        dwfl_report_end(d, nullptr, nullptr);
        Dwarf_Addr bias = 0;
        if (m) dwfl_module_getdwarf(m, &bias);  // as once a line was looked up: the debug file's symbols
        it = mods.emplace(module, std::make_pair(d, m)).first;
    }
    if (!it->second.second) return {};
    GElf_Sym sym;
    GElf_Off off = 0;
    const char* name = dwfl_module_addrinfo(it->second.second, addr, &off, &sym, nullptr, nullptr, nullptr);
    if (!name) return {};
    int status = 0;
    char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    std::string s = status == 0 && d ? d : name;
    std::free(d);
    return s;
}
}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: bench_symbolize LOG [--compare]\n");
        return 2;
    }
    bool compare = argc > 2 && std::strcmp(argv[2], "--compare") == 0;
    std::vector<std::vector<frame_view>> stacks;
    line_source src(argv[1]);
    std::string_view line;
    bool complete;
    std::string err;
    while (src.next(line, complete))
        if (line.find("\"ev\":\"stack\"") != std::string_view::npos) {
            uint32_t id;
            std::vector<frame_view> frames;
            if (parse_stack_record(line, id, frames, err)) stacks.push_back(std::move(frames));
        }
    uint64_t frames = 0;
    std::set<std::pair<std::string, uint64_t>> unique;
    for (const auto& s : stacks)
        for (const frame_view& f : s)
            if (f.native()) {
                ++frames;
                unique.insert({f.module, f.address});
            }
    auto t0 = std::chrono::steady_clock::now();
    symbolizer sym;
    uint64_t named = 0;
    std::map<std::pair<std::string, uint64_t>, std::string> got;
    for (const auto& s : stacks)
        for (const frame_view& f : s)
            if (f.native()) {
                symbol_info i = sym.lookup(f.module, f.address, true);
                named += !i.function.empty();
                if (compare) got[{f.module, f.address}] = i.function;
            }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%zu stacks, %llu native frames, %zu unique addresses, %llu libdw lookups, %.3f s (%.2f us per unique address)\n",
                stacks.size(), (unsigned long long)frames, unique.size(), (unsigned long long)sym.lookups(), secs,
                unique.empty() ? 0.0 : secs * 1e6 / double(unique.size()));
    if (!compare) return 0;
    uint64_t mismatches = 0, checked = 0;
    for (const auto& [key, name] : got) {
        std::string ref = reference_name(key.first, key.second ? key.second - 1 : 0);
        ++checked;
        if (ref != name && ++mismatches <= 10)
            std::printf("mismatch %s+0x%llx: symbolizer \"%s\", dwfl_module_addrinfo \"%s\"\n", key.first.c_str(),
                        (unsigned long long)key.second, name.c_str(), ref.c_str());
    }
    std::printf("compared %llu unique addresses with dwfl_module_addrinfo: %llu differ\n", (unsigned long long)checked,
                (unsigned long long)mismatches);
    return mismatches ? 1 : 0;
}
