// Offline symbolization of native frames with libdw (symbolize.h).
#include "symbolize.h"

#include <cxxabi.h>
#include <elfutils/libdwfl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <unordered_map>
#include <utility>
#include <vector>

namespace gpumem::analysis {

namespace {
const Dwfl_Callbacks k_callbacks = {
    dwfl_build_id_find_elf,
    dwfl_standard_find_debuginfo,
    dwfl_offline_section_address,
    nullptr,
};

std::string demangle(const char* name) {
    if (!name) return {};
    int status = 0;
    char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    if (status != 0 || !d) return name;
    std::string s(d);
    std::free(d);
    return s;
}
}  // namespace

// One ELF file: its libdw handles, and its function symbols sorted by address.
//
// dwfl_module_addrinfo scans the whole symbol table on every call (elfutils 0.188): 68% of the time
// of symbolizing 100,000 unique addresses (docs/benchmarks.md, "Symbolizing native stacks").  The
// table is read once per module instead, and each address is a binary search.
struct module_symbols {
    struct sym {
        uint64_t start, size;
        uint32_t name;  // offset into `names`
        uint8_t rank;   // binding: global 2, weak 1, local 0 (an alias with a better binding wins)
        int index;      // in the symbol table: between equal aliases the first wins, as in libdw
    };
    Dwfl* dwfl = nullptr;
    Dwfl_Module* mod = nullptr;
    std::vector<sym> syms;  // by start
    std::string names;
    std::unordered_map<uint64_t, symbol_info> cache[2];  // [return_address]: offset -> result

    void load() {
        // The separate debug file first (build id, .gnu_debuglink): its .symtab names the local
        // functions a stripped library's .dynsym lacks, and libdw reads the symbols from it once found.
        Dwarf_Addr bias = 0;
        dwfl_module_getdwarf(mod, &bias);
        int n = dwfl_module_getsymtab(mod);
        for (int i = 1; i < n; ++i) {
            GElf_Sym s;
            GElf_Addr addr = 0;
            GElf_Word shndx = 0;
            const char* name = dwfl_module_getsym_info(mod, i, &s, &addr, &shndx, nullptr, nullptr);
            if (!name || !*name || s.st_shndx == SHN_UNDEF || s.st_size == 0) continue;
            int type = GELF_ST_TYPE(s.st_info);
            if (type != STT_FUNC && type != STT_GNU_IFUNC && type != STT_NOTYPE) continue;
            int bind = GELF_ST_BIND(s.st_info);
            uint8_t rank = bind == STB_GLOBAL ? 2 : bind == STB_WEAK ? 1 : 0;
            syms.push_back({addr, s.st_size, uint32_t(names.size()), rank, i});
            names.append(name);
            names.push_back('\0');
        }
        std::sort(syms.begin(), syms.end(), [](const sym& a, const sym& b) {
            if (a.start != b.start) return a.start < b.start;
            return a.rank != b.rank ? a.rank > b.rank : a.index < b.index;
        });
    }

    // The function holding `addr`: of the symbols that contain it, the one starting closest below
    // it, the best binding among aliases.  nullptr when none does.
    const char* find(uint64_t addr) const {
        auto it = std::upper_bound(syms.begin(), syms.end(), addr, [](uint64_t a, const sym& s) { return a < s.start; });
        // Walk down past symbols that end before addr: a nested or neighbouring one may, an
        // enclosing one further down may still hold it.  Bounded: real tables nest little.
        for (int steps = 0; it != syms.begin() && steps < 64; ++steps) {
            --it;
            uint64_t start = it->start;
            // Aliases at one start are sorted best binding first: go to the first of them.
            while (it != syms.begin() && std::prev(it)->start == start) --it;
            for (auto a = it; a != syms.end() && a->start == start; ++a)
                if (addr - start < a->size) return names.c_str() + a->name;
        }
        return nullptr;
    }
};

struct symbolizer::impl {
    // One Dwfl per module: modules are reported at address 0, so each needs its own address space.
    std::unordered_map<std::string, std::unique_ptr<module_symbols>> modules;
    uint64_t lookups = 0;

    module_symbols& open(const std::string& path) {
        auto it = modules.find(path);
        if (it != modules.end()) return *it->second;
        auto m = std::make_unique<module_symbols>();
        // The path comes from the log, and names a file on this machine: libdw would open a FIFO or
        // a terminal too, and wait on it for ever.  Only a regular file can be an ELF module.
        struct stat st {};
        if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return *(modules[path] = std::move(m));
        m->dwfl = dwfl_begin(&k_callbacks);
        if (m->dwfl) {
            dwfl_report_begin(m->dwfl);
            // Base 0: addresses in this module are the ELF file's own virtual addresses, which is
            // what the recorder wrote (return address minus the module's load bias).
            m->mod = dwfl_report_elf(m->dwfl, path.c_str(), path.c_str(), -1, 0, false);
            dwfl_report_end(m->dwfl, nullptr, nullptr);
            if (m->mod) m->load();
        }
        return *(modules[path] = std::move(m));
    }

    ~impl() {
        for (auto& [path, m] : modules)
            if (m->dwfl) dwfl_end(m->dwfl);
    }
};

symbolizer::symbolizer() : impl_(std::make_unique<impl>()) {}
symbolizer::~symbolizer() = default;

symbol_info symbolizer::lookup(const std::string& module, uint64_t offset, bool return_address) {
    try {
        module_symbols& m = impl_->open(module);
        auto& cache = m.cache[return_address ? 1 : 0];
        auto hit = cache.find(offset);
        if (hit != cache.end()) return hit->second;
        symbol_info out;
        ++impl_->lookups;
        if (m.mod) {
            // A return address is the instruction after the call: the call's own line is one byte back.
            GElf_Addr addr = return_address && offset > 0 ? offset - 1 : offset;
            out.function = demangle(m.find(addr));
            if (Dwfl_Line* line = dwfl_module_getsrc(m.mod, addr)) {
                int lineno = 0;
                const char* file = dwfl_lineinfo(line, nullptr, &lineno, nullptr, nullptr, nullptr);
                if (file) out.file = file;
                if (lineno > 0) out.line = uint64_t(lineno);
            }
        }
        cache.emplace(offset, out);
        return out;
    } catch (...) {
        return {};
    }
}

uint64_t symbolizer::lookups() const { return impl_->lookups; }

}  // namespace gpumem::analysis
