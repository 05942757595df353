// The `gpumem` policy: gpumem's own caching pool (core/pool/block_pool) run as a library on its fake device.
#include "gpumem_pool.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpumem::simulate {

namespace {

// pool_config::from_env reads through a plain function pointer: the table it reads is this
// thread's (each log is replayed on one thread).
thread_local const std::map<std::string, std::string>* t_env = nullptr;

const char* lookup(const char* name) {
    if (!t_env) return nullptr;
    std::string key = name;
    if (key.rfind("GPUMEM_", 0) != 0) return nullptr;
    key = key.substr(7);
    std::transform(key.begin(), key.end(), key.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    auto it = t_env->find(key);
    return it == t_env->end() ? nullptr : it->second.c_str();
}

// The header key of a pool env var: GPUMEM_POOL_ROUND -> pool_round.
std::string header_key_of(const std::string& env_name) {
    std::string key = env_name.rfind("GPUMEM_", 0) == 0 ? env_name.substr(7) : env_name;
    std::transform(key.begin(), key.end(), key.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    return key;
}

}  // namespace

std::string gpumem_pool_config(const std::string& log_config_json, const std::string& overrides, pool_config& out) {
    std::map<std::string, std::string> env;
    auto cfg = nlohmann::json::parse(log_config_json, nullptr, false);
    if (cfg.is_object()) {
        // A value of another type (true, -1, null: no recorder writes one) goes in as its JSON
        // text, for the pool to refuse as it refuses any value it cannot read, rather than be
        // dropped for the default.
        for (auto& [k, v] : cfg.items()) env[k] = v.is_string() ? v.get<std::string>() : v.dump();
        // A pooled run whose header has no pool_vmm predates the knob: its segments were cuMemAlloc's.
        if (env.count("pool") && env["pool"] == "on" && !env.count("pool_vmm")) env["pool_vmm"] = "off";
        // And one that stitched with no pool_stitch_keep kept no stitched range.
        if (env.count("pool_stitch") && !env.count("pool_stitch_keep")) env["pool_stitch_keep"] = "0";
    }
    // The knobs an override may set: the pool's env vars as header keys (GPUMEM_POOL_ROUND ->
    // pool_round).  Any other name would be read by nothing, and the replay would quietly run
    // the defaults under a name that says otherwise.
    std::vector<std::string> knobs;
    for (const std::string& env_name : pool_config::knob_env_names()) knobs.push_back(header_key_of(env_name));
    size_t pos = 0;
    while (pos < overrides.size()) {
        size_t comma = overrides.find(',', pos);
        std::string kv = overrides.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        pos = comma == std::string::npos ? overrides.size() : comma + 1;
        if (kv.empty()) continue;
        size_t eq = kv.find('=');
        if (eq == std::string::npos || eq == 0) return "expected KNOB=VALUE, not " + kv;
        std::string key = kv.substr(0, eq);
        std::transform(key.begin(), key.end(), key.begin(), [](unsigned char c) { return char(std::tolower(c)); });
        if (key.rfind("gpumem_", 0) == 0) key = key.substr(7);
        if (std::find(knobs.begin(), knobs.end(), key) == knobs.end()) {
            std::string known;
            for (const std::string& k : knobs) known += (known.empty() ? "" : ", ") + k;
            return "unknown knob " + kv.substr(0, eq) + " (known: " + known + ")";
        }
        // The pool reads an empty value as unset: the replay would run the header's setting (or
        // the default) under a name that says otherwise.
        if (eq + 1 == kv.size()) return kv.substr(0, eq) + ": no value";
        env[key] = kv.substr(eq + 1);
    }
    t_env = &env;
    out = pool_config::from_env(&lookup);
    t_env = nullptr;
    if (out.warnings.empty()) return "";
    // from_env's warnings say what a running program does instead ("GPUMEM_POOL_ROUND=0: not a
    // valid value; using 512"); a replay refuses the setting, so each is cut before its "; using"
    // and names the knob as it is written here.
    std::string why;
    size_t at = 0;
    while (at < out.warnings.size()) {
        size_t nl = out.warnings.find('\n', at);
        std::string w = out.warnings.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
        at = nl == std::string::npos ? out.warnings.size() : nl + 1;
        if (w.empty()) continue;
        if (size_t cut = w.rfind("; using "); cut != std::string::npos) w.resize(cut);
        if (size_t eq = w.find('='); w.rfind("GPUMEM_", 0) == 0 && eq != std::string::npos)
            w = header_key_of(w.substr(0, eq)) + w.substr(eq);
        why += (why.empty() ? "" : "; ") + w;
    }
    return "pool settings rejected: " + why;
}

// The physical chunk of a replayed pool on virtual memory (pool_vmm=on): the log does not say the
// device's granularity; 2 MiB is the H200's and the emulated device's (docs/pool.md).
constexpr uint64_t k_replay_chunk = 2ull << 20;

gpumem_pool_policy::gpumem_pool_policy(const pool_config& cfg, uint64_t capacity)
    : backend_(capacity), pool_(cfg, backend_, nullptr, 0) {
    if (cfg.vmm) backend_.inner.set_vmm(k_replay_chunk);
}

bool gpumem_replay_vmm(const pool_config& cfg) { return cfg.vmm && cfg.round != 0 && k_replay_chunk % cfg.round == 0; }

void gpumem_pool_policy::take_snapshot() noexcept {
    snap_ = pool_.snapshot();
    pending_ = pool_.pending_bytes();
}

bool gpumem_pool_policy::allocate(uint32_t id, uint64_t size, uint16_t) {
    uint64_t ptr = 0;
    if (pool_.allocate(size, api_id::cuMemAlloc_v2, &ptr) != k_cuda_success) {
        take_snapshot();
        return false;
    }
    if (id >= ptrs_.size()) ptrs_.resize(std::max<size_t>(size_t(id) + 1, ptrs_.size() * 2), 0);
    ptrs_[id] = ptr;
    take_snapshot();
    return true;
}

void gpumem_pool_policy::release(uint32_t id) {
    if (id >= ptrs_.size() || !ptrs_[id]) return;
    int result = 0;
    pool_.deallocate(ptrs_[id], api_id::cuMemFree_v2, &result);
    ptrs_[id] = 0;
    take_snapshot();
}

}  // namespace gpumem::simulate
