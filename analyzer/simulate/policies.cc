// Builds the simulated allocator a --policy name selects.
#include "gpumem_pool.h"
#include "ideal.h"
#include "policy.h"
#include "pytorch.h"

namespace gpumem::simulate {

policy_spec parse_policy_name(const std::string& text) {
    policy_spec s;
    s.name = text;
    size_t colon = text.find(':');
    if (colon != std::string::npos) s.options = text.substr(colon + 1);
    return s;
}

std::string policy_note(const policy_spec& spec, const std::string& log_config_json) {
    std::string base = spec.name.substr(0, spec.name.find(':'));
    if (base == "gpumem") {
        pool_config cfg;
        if (!gpumem_pool_config(log_config_json, spec.options, cfg).empty() || !(cfg.trim || cfg.stitch)) return "";
        // Both unmap or alias chunks: on cuMemAlloc segments they never act, with reuse=safe too
        // (the note below alone sent the user to a reuse=safe that changed nothing, silently).
        if (!gpumem_replay_vmm(cfg))
            return "pool_trim and pool_stitch act only on virtual memory, which this policy runs without "
                   "(pool_vmm off, or a pool_round 2 MiB is no multiple of)";
        // The replay runs one stream and never switches `auto` to safe reuse; the trim and the
        // stitches wait for frees that fences settle (block_pool::grow), so under immediate reuse
        // they never act and the numbers are the defaults'.
        if (cfg.reuse != reuse_mode::safe)
            return "pool_trim and pool_stitch act only once frees wait for fences, which this replay (one stream) "
                   "reaches only with reuse=safe: add it";
        // Stitches take chunks from arenas only (block_pool::grow); the trim needs none.
        if (cfg.stitch && !cfg.arenas) return "pool_stitch acts only with arenas, which this policy runs without (pool_arena off)";
        return "";
    }
    if (base != "pytorch" && base != "pytorch-expandable") return "";
    pt_config cfg;
    // A value written otherwise than as its number ("max_split_size_mb:64MB") replays as torch read
    // it, which the user may not have meant: said, not taken silently.
    std::string read_as;
    if (!parse_pt_config(spec.options, cfg, &read_as).empty()) return "";
    std::string gc;
    if (cfg.gc_threshold > 0 && !pt_gc_acts(cfg))
        gc = "garbage_collection_threshold has no effect here: PyTorch collects only under a memory limit; "
             "add per_process_memory_fraction below 1";
    return read_as + (read_as.empty() || gc.empty() ? "" : "; ") + gc;
}

std::unique_ptr<policy> make_policy(const policy_spec& spec, uint64_t capacity, uint64_t device_total,
                                    const std::string& log_config_json, std::string* error) {
    std::string base = spec.name.substr(0, spec.name.find(':'));
    if (base == "ideal" && spec.options.empty()) return std::make_unique<ideal_policy>(capacity);
    if (base == "pytorch" || base == "pytorch-expandable") {
        pt_config cfg;
        cfg.expandable = base == "pytorch-expandable";
        std::string e = parse_pt_config(spec.options, cfg);
        if (!e.empty()) {
            *error = spec.name + ": " + e;
            return nullptr;
        }
        if (cfg.memory_fraction < 1 && !capacity && !device_total) {
            *error = spec.name + ": per_process_memory_fraction: the device's memory is unknown (the log's header "
                                 "does not give it): give --capacity";
            return nullptr;
        }
        return std::make_unique<pytorch_policy>(cfg, capacity, device_total);
    }
    if (base == "gpumem") {
        pool_config cfg;
        std::string e = gpumem_pool_config(log_config_json, spec.options, cfg);
        if (!e.empty()) {
            *error = spec.name + ": " + e;
            return nullptr;
        }
        return std::make_unique<gpumem_pool_policy>(cfg, capacity);
    }
    *error = spec.name + ": unknown policy (known: " + k_policy_names + ")";
    return nullptr;
}

}  // namespace gpumem::simulate
