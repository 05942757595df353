// Reads the recorder's GPUMEM_* settings; expands the log-path pattern.
#include "config.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

namespace gpumem {

bool parse_bool(const char* s, bool* out) noexcept {
    if (!s) return false;
    if (!strcasecmp(s, "on") || !strcmp(s, "1") || !strcasecmp(s, "true") || !strcasecmp(s, "yes")) {
        *out = true;
        return true;
    }
    if (!strcasecmp(s, "off") || !strcmp(s, "0") || !strcasecmp(s, "false") || !strcasecmp(s, "no")) {
        *out = false;
        return true;
    }
    return false;
}

bool parse_log_level(const char* s, int* out) noexcept {
    if (!s || !*s) return false;
    static const char* const names[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};
    for (int i = 0; i < 7; ++i)
        if (!strcasecmp(s, names[i])) {
            *out = i;
            return true;
        }
    if (!strcasecmp(s, "warning")) return *out = 3, true;
    if (!strcasecmp(s, "err")) return *out = 4, true;
    if (s[0] >= '0' && s[0] <= '6' && !s[1]) return *out = s[0] - '0', true;
    return false;
}

bool parse_routes(const char* s, unsigned* out) noexcept {
    if (!s) return false;
    if (!strcasecmp(s, "all")) return *out = k_all_routes, true;
    unsigned r = 0;
    for (const char* p = s; *p; ++p) {
        char c = char(*p | 0x20);  // lower case for letters
        if (c >= 'a' && c <= 'd') r |= 1u << (c - 'a');
        else if (*p != ',' && *p != ' ') return false;
    }
    if (!r) return false;
    *out = r;
    return true;
}

static void read_u32(const char* name, uint32_t lo, uint32_t hi, uint32_t* field, std::string* warnings) {
    const char* s = setting_env(name);
    if (!s) return;
    uint64_t v = 0;
    // Counts and milliseconds: digits alone (under the size rule "1k" ms read as 1024, silently).
    bool parsed = parse_count(s, &v);
    if (parsed && v >= lo && v <= hi) {
        *field = uint32_t(v);
    } else if (parsed && warnings) {
        // A number out of range is not "not a number": say which bound it broke.
        *warnings += std::string(name) + "='" + s + "' is too " + (v < lo ? "small: the minimum is " : "large: the maximum is ") +
                     std::to_string(v < lo ? lo : hi) + "; using " + std::to_string(*field) + "\n";
    } else if (warnings) {
        *warnings += std::string(name) + "='" + s + "' is not a number in [" + std::to_string(lo) + ", " +
                     std::to_string(hi) + "]; using " + std::to_string(*field) + "\n";
    }
}

config config::from_env(std::string* warnings) noexcept {
    config c;
    try {
        if (const char* s = setting_env("GPUMEM_POOL")) {
            bool b;
            if (parse_bool(s, &b)) c.pool = b;
            else if (warnings) *warnings += std::string("GPUMEM_POOL='") + s + "' is not on/off; using on\n";
        }
        if (const char* s = setting_env("GPUMEM_OUT"); s && *s) {
            c.out = s;
            // Kept as written (a log is still better than none), but a typo for %p would put every
            // process's log under one name: said.
            if (std::string t = unknown_out_token(c.out); !t.empty() && warnings)
                *warnings += std::string("GPUMEM_OUT='") + s + "': " + (t == "%" ? "a % at the end" : t) +
                             " is no token (the tokens are " +
                             k_out_tokens + "); kept as written\n";
        }
        read_u32("GPUMEM_FLUSH_MS", 1, 60000, &c.flush_ms, warnings);
        read_u32("GPUMEM_BUFFER_EVENTS", 1024, 1u << 24, &c.buffer_events, warnings);
        read_u32("GPUMEM_WAIT_MS", 0, 600000, &c.wait_ms, warnings);
        read_u32("GPUMEM_SINK_STALL_MS", 0, 3600000, &c.sink_stall_ms, warnings);
        if (const char* s = setting_env("GPUMEM_STACKS")) {
            bool found = false;
            for (size_t i = 0; i < size_t(stacks::stack_mode::count_); ++i)
                if (!strcasecmp(s, stacks::k_stack_mode_names[i])) {
                    c.stacks = stacks::stack_mode(i);
                    found = true;
                }
            if (!found && warnings)
                *warnings += std::string("GPUMEM_STACKS='") + s + "' is not off, python, native or all; using python\n";
        }
        read_u32("GPUMEM_STACK_DEPTH", 1, 256, &c.stack_depth, warnings);
        if (const char* s = setting_env("GPUMEM_LOG_LEVEL"); s && !parse_log_level(s, &c.log_level) && warnings)
            *warnings += std::string("GPUMEM_LOG_LEVEL='") + s +
                         "' is not trace, debug, info, warn, error, critical, off or 0-6; using warn\n";
        if (const char* s = setting_env("GPUMEM_ROUTES"); s && *s) {
            c.routes_set = parse_routes(s, &c.routes);
            if (!c.routes_set && warnings)
                *warnings += std::string("GPUMEM_ROUTES='") + s +
                             "' is not all or a list of the letters a, b, c, d (such as a,c); using a,b,c,d\n";
        }
        uint32_t cap = 1;
        while (cap < c.buffer_events) cap <<= 1;
        c.buffer_events = cap;
    } catch (...) {
        // Out of memory while building a warning string: the defaults stand.
    }
    return c;
}

namespace {
// The start-up copies: "NAME=value" strings, set once before any reader (snapshot_settings_env).
constexpr size_t k_max_kept = 128;
const char* g_kept[k_max_kept];
size_t g_n_kept = 0;

bool is_setting(const char* entry) noexcept {
    return !strncmp(entry, "GPUMEM_", 7) || !strncmp(entry, "RANK=", 5) || !strncmp(entry, "LOCAL_RANK=", 11);
}
}  // namespace

void snapshot_settings_env() noexcept {
    if (g_n_kept || !environ) return;
    for (char** e = environ; *e && g_n_kept < k_max_kept; ++e)
        if (is_setting(*e))
            if (char* copy = strdup(*e)) g_kept[g_n_kept++] = copy;
}

const char* setting_env(const char* name) noexcept {
    if (const char* now = getenv(name)) return now;
    const size_t n = strlen(name);
    for (size_t i = 0; i < g_n_kept; ++i)
        if (!strncmp(g_kept[i], name, n) && g_kept[i][n] == '=') return g_kept[i] + n + 1;
    return nullptr;
}

std::string rank_from_env() {
    if (const char* r = setting_env("RANK"); r && *r) return r;
    if (const char* r = setting_env("LOCAL_RANK"); r && *r) return r;
    return "0";
}

namespace {

// The one list of GPUMEM_OUT's tokens: %p %h %r %%, in the order expand_out_pattern gives their values.
constexpr char k_out_token_chars[] = "phr%";

// The index of token %n in k_out_token_chars, or -1 for a character that is no token.
int out_token_index(char n) {
    const char* at = n ? std::strchr(k_out_token_chars, n) : nullptr;
    return at ? int(at - k_out_token_chars) : -1;
}

}  // namespace

std::string expand_out_pattern(const std::string& pattern, long pid, const std::string& host,
                               const std::string& rank) {
    const std::string values[] = {std::to_string(pid), host, rank, "%"};
    std::string out;
    out.reserve(pattern.size() + 16);
    for (size_t i = 0; i < pattern.size(); ++i) {
        char c = pattern[i];
        if (c != '%' || i + 1 == pattern.size()) {
            out += c;
            continue;
        }
        char n = pattern[++i];
        if (int k = out_token_index(n); k >= 0) out += values[k];
        else {
            out += '%';  // unknown token: kept as written
            out += n;
        }
    }
    return out;
}

std::string unknown_out_token(const std::string& pattern) {
    for (size_t i = 0; i < pattern.size(); ++i) {
        if (pattern[i] != '%') continue;
        if (i + 1 == pattern.size()) return "%";
        if (out_token_index(pattern[++i]) < 0) return pattern.substr(i - 1, 2);
    }
    return "";
}

std::string log_path_for(const std::string& pattern, long pid, const std::string& host, const std::string& rank) {
    std::string path = expand_out_pattern(pattern, pid, host, rank);
    // lstat: a symlink at the name is not followed, even to a directory (docs/log-format.md, "File
    // safety": one planted at a predictable name in a shared directory would otherwise choose where
    // the log goes).  A trailing '/' asks for the directory, links and all.
    struct stat st;
    bool dir = !path.empty() && (path.back() == '/' || (lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)));
    if (!dir) return path;
    if (path.back() != '/') path += '/';
    return path + expand_out_pattern(config::k_default_out, pid, host, rank);
}

}  // namespace gpumem
