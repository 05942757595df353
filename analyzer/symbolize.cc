// Offline symbolization of native frames with libdw (symbolize.h).
#include "symbolize.h"

#include <cxxabi.h>
#include <elfutils/libdwfl.h>

#include <cstdlib>
#include <map>
#include <utility>

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

struct symbolizer::impl {
    // One Dwfl per module: modules are reported at address 0, so each needs its own address space.
    std::map<std::string, std::pair<Dwfl*, Dwfl_Module*>> modules;
    std::map<std::pair<std::string, uint64_t>, symbol_info> cache;
    uint64_t lookups = 0;

    std::pair<Dwfl*, Dwfl_Module*> open(const std::string& path) {
        auto it = modules.find(path);
        if (it != modules.end()) return it->second;
        Dwfl* d = dwfl_begin(&k_callbacks);
        Dwfl_Module* m = nullptr;
        if (d) {
            dwfl_report_begin(d);
            // Base 0: addresses in this module are the ELF file's own virtual addresses, which is
            // what the recorder wrote (return address minus the module's load bias).
            m = dwfl_report_elf(d, path.c_str(), path.c_str(), -1, 0, false);
            dwfl_report_end(d, nullptr, nullptr);
        }
        return modules[path] = {d, m};
    }

    ~impl() {
        for (auto& [path, dm] : modules)
            if (dm.first) dwfl_end(dm.first);
    }
};

symbolizer::symbolizer() : impl_(std::make_unique<impl>()) {}
symbolizer::~symbolizer() = default;

symbol_info symbolizer::lookup(const std::string& module, uint64_t offset, bool return_address) {
    try {
        auto key = std::make_pair(module, offset);
        auto hit = impl_->cache.find(key);
        if (hit != impl_->cache.end()) return hit->second;
        symbol_info out;
        ++impl_->lookups;
        auto [dwfl, mod] = impl_->open(module);
        if (mod) {
            // A return address is the instruction after the call: the call's own line is one byte back.
            GElf_Addr addr = return_address && offset > 0 ? offset - 1 : offset;
            GElf_Sym sym;
            GElf_Off sym_off = 0;
            const char* name = dwfl_module_addrinfo(mod, addr, &sym_off, &sym, nullptr, nullptr, nullptr);
            out.function = demangle(name);
            if (Dwfl_Line* line = dwfl_module_getsrc(mod, addr)) {
                int lineno = 0;
                const char* file = dwfl_lineinfo(line, nullptr, &lineno, nullptr, nullptr, nullptr);
                if (file) out.file = file;
                if (lineno > 0) out.line = uint64_t(lineno);
            }
        }
        impl_->cache.emplace(std::move(key), out);
        return out;
    } catch (...) {
        return {};
    }
}

uint64_t symbolizer::lookups() const { return impl_->lookups; }

}  // namespace gpumem::analysis
