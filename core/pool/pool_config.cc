// Reads the pool's GPUMEM_* knobs from the environment and describes them for the log header.
#include "core/pool/pool_config.h"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <strings.h>

#include "core/config.h"
#include "core/log_fields.h"
#include "core/size_parse.h"

namespace gpumem {
namespace {

bool is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

constexpr uint64_t k_max_size = 1ull << 48;  // no GPU has more; keeps size arithmetic from overflow

// What a knob's value counts, for the message that refuses one: "expected a size from 1 to ...".
enum class knob_unit { bytes, count, ms };

struct size_knob {
    const char* env;
    uint64_t pool_config::*field;
    uint64_t min;  // smallest accepted value
    bool pow2;     // must be a power of two (alignment-like knobs)
    uint64_t max = k_max_size;  // largest accepted value (check() says the same of the sizes)
    knob_unit unit = knob_unit::bytes;
};

// The table is the single list of numeric knobs: parsing and the header description both use it,
// so a knob cannot be readable but unlogged.
constexpr size_knob k_size_knobs[] = {
    {"GPUMEM_POOL_ROUND", &pool_config::round, 256, true},  // 256: cuMemAlloc's alignment promise
    {"GPUMEM_POOL_SMALL_SIZE", &pool_config::small_size, 1, false},
    {"GPUMEM_POOL_SMALL_SEGMENT", &pool_config::small_segment, 1, false},
    {"GPUMEM_POOL_SMALL_SPLIT", &pool_config::small_split, 1, false},
    {"GPUMEM_POOL_LARGE_SEGMENT", &pool_config::large_segment, 1, false},
    {"GPUMEM_POOL_MIN_LARGE_ALLOC", &pool_config::min_large_alloc, 1, false},
    {"GPUMEM_POOL_LARGE_ROUND", &pool_config::large_round, 1, true},
    {"GPUMEM_POOL_LARGE_SPLIT", &pool_config::large_split, 0, false},
    {"GPUMEM_SYNC_BUDGET", &pool_config::sync_budget, 0, false},
    {"GPUMEM_SYNC_BUDGET_DIV", &pool_config::sync_budget_div, 1, false, k_max_size, knob_unit::count},
    {"GPUMEM_FENCE_BATCH", &pool_config::fence_batch, 1, false, k_max_size, knob_unit::count},
    {"GPUMEM_ORDER_BATCH", &pool_config::order_batch, 0, false},
    {"GPUMEM_STATS_MS", &pool_config::stats_ms, 0, false, k_max_size, knob_unit::ms},
    {"GPUMEM_POOL_TRIM", &pool_config::trim, 0, false},
    {"GPUMEM_POOL_CHUNK", &pool_config::chunk, 0, false, 1ull << 30},
    {"GPUMEM_POOL_HEADROOM", &pool_config::headroom, 0, false},
};

// A bound as people write it: 2^48 and 1 GiB by those names, as docs/pool.md gives them.
std::string bound_text(uint64_t v) {
    if (v == k_max_size) return "2^48";
    if (v >= (1ull << 30) && v % (1ull << 30) == 0) return std::to_string(v >> 30) + "GiB";
    return std::to_string(v);
}

// What a knob accepts, for the warning that refuses a value ("GPUMEM_POOL_ROUND=300: not a valid
// value (expected a power of two from 256 to 2^48 bytes)"): a bare "not a valid value" left the user
// to find the rule in docs/pool.md.
std::string accepted_text(const size_knob& k) {
    const std::string hi = bound_text(k.max);
    const std::string range = "from " + bound_text(k.min) + " to " + hi;
    // "to 1GiB" names its unit already; "to 2^48" and bare numbers take "bytes".
    const std::string bytes = hi.back() == 'B' ? "" : " bytes";
    if (k.pow2) return "a power of two " + range + bytes;
    if (k.unit == knob_unit::count) return "a whole number " + range;
    if (k.unit == knob_unit::ms) return "milliseconds " + range + " (0: never)";
    return "a size " + range + bytes + ", such as 2MiB";
}

// The knobs from_env reads by hand, before the table's: knob_env_names() lists them with it.
constexpr const char* k_reuse_env = "GPUMEM_REUSE";
constexpr const char* k_vmm_env = "GPUMEM_POOL_VMM";
constexpr const char* k_arena_env = "GPUMEM_POOL_ARENA";
constexpr const char* k_stitch_env = "GPUMEM_POOL_STITCH";
constexpr const char* k_stitch_keep_env = "GPUMEM_POOL_STITCH_KEEP";
constexpr const char* k_wait_env = "GPUMEM_FENCE_WAIT";

// Header key of an env var: drop "GPUMEM_", lower-case.
void append_key(std::string& out, const char* env) {
    out += '"';
    for (const char* p = env + 7; *p; ++p) out += char(*p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p);
    out += "\":";
}

}  // namespace

std::vector<std::string> pool_config::knob_env_names() {
    std::vector<std::string> names = {k_reuse_env, k_vmm_env, k_arena_env, k_stitch_env, k_stitch_keep_env, k_wait_env};
    for (const size_knob& k : k_size_knobs) names.push_back(k.env);
    return names;
}

std::string pool_config::check() const {
    // Sizes must be multiples of `round` so every block start stays aligned, the small pool's
    // largest request must fit one small segment, and a request below min_large_alloc must fit one
    // shared large segment.  Hard limit 2^48: no GPU has more, and it keeps size arithmetic far
    // from overflow.
    if (!is_pow2(round) || round < 256) return "round must be a power of two >= 256";
    for (uint64_t v : {small_size, small_segment, large_segment, min_large_alloc, large_round,
                       small_split, large_split, sync_budget, trim, chunk, headroom})
        if (v > k_max_size) return "sizes must be <= 2^48";
    if (small_segment % round || large_segment % round) return "segment sizes must be multiples of round";
    if (large_round % round) return "large_round must be a multiple of round";
    if (small_size > small_segment) return "small_size must be <= small_segment";
    if (small_size >= min_large_alloc) return "small_size must be < min_large_alloc";
    if (large_segment < min_large_alloc) return "large_segment must be >= min_large_alloc";
    if (small_split == 0) return "small_split must be >= 1";
    if (sync_budget_div == 0) return "sync_budget_div must be >= 1";
    // A chunk is the least the pool maps and gives back: larger than a device, every request would
    // fail to map and fall through the whole OOM path to a plain cuMemAlloc (no caching at all).
    if (chunk > (1ull << 30)) return "pool_chunk must be <= 1 GiB";
    return {};
}

pool_config pool_config::from_env(env_lookup get) noexcept {
    pool_config c;
    if (!get) get = [](const char* n) -> const char* { return std::getenv(n); };
    try {
        // Words in any case, as GPUMEM_POOL, GPUMEM_STACKS and GPUMEM_LOG_LEVEL read them:
        // GPUMEM_REUSE=Immediate ran as safe and GPUMEM_POOL_ARENA=OFF with arenas.
        if (const char* v = get(k_reuse_env); v && *v) {
            if (!strcasecmp(v, config_value::reuse_auto)) c.reuse = reuse_mode::automatic;
            else if (!strcasecmp(v, config_value::reuse_safe)) c.reuse = reuse_mode::safe;
            else if (!strcasecmp(v, config_value::reuse_immediate)) c.reuse = reuse_mode::immediate;
            else {
                // A value we cannot read gets the mode that is safe for every program.
                c.reuse = reuse_mode::safe;
                c.warnings += std::string("GPUMEM_REUSE=") + v + ": expected auto, safe or immediate; using safe\n";
            }
        }
        // Switches read as GPUMEM_POOL is (core/config.h parse_bool): on/off, 1/0, true/false, yes/no.
        if (const char* v = get(k_vmm_env); v && *v && !parse_bool(v, &c.vmm))
            c.warnings += std::string("GPUMEM_POOL_VMM=") + v + ": expected on or off; using on\n";
        c.vmm_only = c.vmm;
        if (const char* v = get(k_stitch_env); v && *v && !parse_bool(v, &c.stitch))
            c.warnings += std::string("GPUMEM_POOL_STITCH=") + v + ": expected on or off; using off\n";
        if (const char* v = get(k_stitch_keep_env); v && *v) {
            char* end = nullptr;
            const unsigned long x = std::strtoul(v, &end, 10);
            if (end && !*end && *v >= '0' && *v <= '9' && x <= 16) c.stitch_keep = uint32_t(x);
            else c.warnings += std::string("GPUMEM_POOL_STITCH_KEEP=") + v + ": expected 0-16; using 2\n";
        }
        // Stitching waits for fenced frees (docs/pool.md): with immediate reuse it never runs.
        if (c.stitch && c.reuse == reuse_mode::immediate)
            c.warnings += "GPUMEM_POOL_STITCH=on has no effect with GPUMEM_REUSE=immediate (stitching needs fenced frees)\n";
        if (const char* v = get(k_wait_env); v && *v) {
            if (!strcasecmp(v, "old")) c.wait_any = c.order = false;
            else if (!strcasecmp(v, "any")) c.wait_any = true, c.order = false;
            else if (!strcasecmp(v, "order")) c.order = true;
            else c.warnings += std::string("GPUMEM_FENCE_WAIT=") + v + ": expected order, old or any; using order\n";
        }
        if (const char* v = get(k_arena_env); v && *v) {
            uint64_t x = 0;
            if (!strcasecmp(v, "off")) c.arenas = false;
            else if (!strcasecmp(v, "auto") || !strcasecmp(v, "on")) c.arena = 0;
            else if (parse_size(v, &x) && x > 0 && x <= (1ull << 48)) c.arena = x;
            else c.warnings += std::string("GPUMEM_POOL_ARENA=") + v + ": expected auto, off or a size; using auto\n";
        }
        for (const size_knob& k : k_size_knobs) {
            const char* v = get(k.env);
            if (!v || !*v) continue;
            uint64_t x = 0;
            // Out of range is refused here, knob by knob: found by check() below, it reset every
            // knob, GPUMEM_REUSE=safe included, and lost the warnings.
            // Counts and milliseconds take digits alone: "2MiB" frees is no count.
            const bool parsed = k.unit == knob_unit::bytes ? parse_size(v, &x) : parse_count(v, &x);
            if (!parsed || x < k.min || x > k.max || (k.pow2 && !is_pow2(x))) {
                c.warnings += std::string(k.env) + "=" + v + ": not a valid value (expected " + accepted_text(k) +
                              "); using " + std::to_string(c.*k.field) + "\n";
                continue;
            }
            c.*k.field = x;
        }
        if (std::string why = c.check(); !why.empty()) {
            // A partial mix of user and default sizes could still be inconsistent: start over with
            // every size at its default but keep the non-size choices.
            pool_config d;
            d.reuse = c.reuse;
            d.vmm = c.vmm;
            d.vmm_only = c.vmm_only;
            d.arenas = c.arenas;
            d.arena = c.arena;
            d.stitch = c.stitch;
            d.stitch_keep = c.stitch_keep;
            d.wait_any = c.wait_any;
            d.order = c.order;
            d.order_beside_busy = c.order_beside_busy;
            d.stats_ms = c.stats_ms;
            d.sync_budget = c.sync_budget;
            d.sync_budget_div = c.sync_budget_div;
            d.fence_batch = c.fence_batch;
            d.trim = c.trim;
            d.headroom = c.headroom;
            d.warnings = c.warnings + "pool sizes inconsistent (" + why + "); using the default sizes\n";
            if (!d.check().empty()) {  // cannot happen with every size in range: said, never silent
                pool_config e;
                e.vmm_only = e.vmm;
                e.warnings = d.warnings + "pool settings inconsistent; using the defaults\n";
                return e;
            }
            return d;
        }
    } catch (...) {
        // Only std::bad_alloc can get here (no memory for a warning either); the defaults are
        // always usable.
        pool_config d;
        d.vmm_only = d.vmm;
        return d;
    }
    return c;
}

void pool_config::append_config_json(std::string& out) const noexcept {
    try {
        std::string s;
        s += '"';
        s += config_key::reuse;  // the header's config members: core/log_fields.h
        s += "\":";
        s += '"';
        s += reuse == reuse_mode::immediate ? config_value::reuse_immediate
             : reuse == reuse_mode::safe    ? config_value::reuse_safe
                                            : config_value::reuse_auto;
        s += "\",";
        s += vmm ? "\"pool_vmm\":\"on\"," : "\"pool_vmm\":\"off\",";
        s += "\"pool_arena\":";
        s += !arenas ? std::string("\"off\"") : arena ? std::to_string(arena) : std::string("\"auto\"");
        s += stitch ? ",\"pool_stitch\":\"on\"," : ",\"pool_stitch\":\"off\",";
        s += "\"pool_stitch_keep\":" + std::to_string(stitch_keep) + ",";
        s += order ? "\"fence_wait\":\"order\"," : wait_any ? "\"fence_wait\":\"any\"," : "\"fence_wait\":\"old\",";
        for (const size_knob& k : k_size_knobs) {
            append_key(s, k.env);
            s += std::to_string(this->*k.field);
            s += ',';
        }
        out += s;  // strong guarantee: on failure `out` is unchanged
    } catch (...) {
    }
}

}  // namespace gpumem
