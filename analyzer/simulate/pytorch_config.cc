// PyTorch's CUDA caching allocator settings, read from PYTORCH_CUDA_ALLOC_CONF syntax.
#include "pytorch_config.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace gpumem::simulate {

namespace {

// Every key parse_pt_config takes, for the message of one it does not.
constexpr const char* k_pt_option_names =
    "max_split_size_mb, max_non_split_rounding_mb, large_segment_size_mb, roundup_power2_divisions, "
    "garbage_collection_threshold, per_process_memory_fraction, expandable_segments, backend, "
    "release_lock_on_cudamalloc, graph_capture_record_stream_reuse, pinned_use_cuda_host_register, "
    "pinned_num_register_threads, pinned_reserve_segment_size_mb, pinned_use_background_threads";

// PyTorch 2.11 reads every number of the config with std::stoull (ConfigTokenizer::toSizeT: the
// sizes, roundup_power2_divisions' intervals and divisions, the pinned_ counts) or std::stod
// (toDouble: garbage_collection_threshold, per_process_memory_fraction).  Both take the longest
// prefix strtoull / strtod read, a sign included ("64MB" is 64, "+64" 64, and stoull's "-1" wraps
// to 2^64 - 1), and throw only where no number starts the token or it is out of range: torch then
// refuses the config at startup.  The same C calls here take exactly what torch takes, so a
// program's own setting replays; *as_written is false where the token is not just the number.
bool read_like_stoull(const std::string& s, uint64_t& v, bool* as_written) {
    errno = 0;
    char* end = nullptr;
    unsigned long long r = std::strtoull(s.c_str(), &end, 10);
    if (end == s.c_str() || errno == ERANGE) return false;
    v = r;
    *as_written = *end == '\0' && std::isdigit(static_cast<unsigned char>(s[0]));
    return true;
}

bool read_like_stod(const std::string& s, double& v, bool* as_written) {
    errno = 0;
    char* end = nullptr;
    double r = std::strtod(s.c_str(), &end);
    if (end == s.c_str() || errno == ERANGE) return false;
    v = r;
    // A '-' is the number's own sign here (stoull's wraps): "-0.5" is read as written.
    *as_written = *end == '\0' && s[0] != '+';
    return true;
}

std::string shortest(double d) {
    char buf[32];
    auto r = std::to_chars(buf, buf + sizeof buf, d);
    return std::string(buf, r.ptr);
}

// PyTorch's lexer (ConfigTokenizer, c10/core/AllocatorConfig.h): ',', ':', '[' and ']' are tokens
// of their own, everything between them a word; whitespace (std::isspace) is dropped.
std::vector<std::string> lex(std::string_view text) {
    std::vector<std::string> out;
    std::string word;
    for (char c : text) {
        if (c == ',' || c == ':' || c == '[' || c == ']') {
            if (!word.empty()) out.push_back(std::move(word));
            word.clear();
            out.emplace_back(1, c);
        } else if (!std::isspace(static_cast<unsigned char>(c))) {
            word += c;
        }
    }
    if (!word.empty()) out.push_back(std::move(word));
    return out;
}

}  // namespace

uint64_t pt_config::divisions_for(uint64_t size) const {
    int log_size = 63 - std::countl_zero(size | 1);
    int index = std::clamp(log_size - 20, 0, int(k_pt_roundup_intervals) - 1);
    return roundup_divisions[size_t(index)];
}

std::string pt_config::to_conf() const {
    std::string s;
    auto add = [&](const std::string& kv) { s += (s.empty() ? "" : ",") + kv; };
    if (max_split_size != std::numeric_limits<uint64_t>::max())
        add("max_split_size_mb:" + std::to_string(max_split_size >> 20));
    if (max_non_split_rounding != k_pt_large_buffer)
        add("max_non_split_rounding_mb:" + std::to_string(max_non_split_rounding >> 20));
    if (large_segment != k_pt_large_buffer) add("large_segment_size_mb:" + std::to_string(large_segment >> 20));
    bool uniform = std::all_of(roundup_divisions.begin(), roundup_divisions.end(),
                               [&](uint64_t d) { return d == roundup_divisions[0]; });
    if (uniform && roundup_divisions[0] != 0) {
        add("roundup_power2_divisions:" + std::to_string(roundup_divisions[0]));
    } else if (!uniform) {
        std::string l = "roundup_power2_divisions:[";
        for (size_t i = 0; i < k_pt_roundup_intervals; ++i)
            l += (i ? "," : "") + (i + 1 == k_pt_roundup_intervals ? std::string(">") : std::to_string(1ull << i)) +
                 ":" + std::to_string(roundup_divisions[i]);
        add(l + "]");
    }
    if (gc_threshold > 0) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%g", gc_threshold);
        add(std::string("garbage_collection_threshold:") + buf);
    }
    if (memory_fraction < 1) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%g", memory_fraction);
        add(std::string("per_process_memory_fraction:") + buf);
    }
    if (expandable) add("expandable_segments:True");
    return s;
}

std::string parse_pt_config(std::string_view text, pt_config& out, std::string* note) {
    std::vector<std::string> t = lex(text);
    size_t i = 0;
    // Each value not written as the plain number torch reads from it: "max_split_size_mb:64MB read as 64".
    std::vector<std::string> read_as;
    // The last value read's entry ("" for a plain number), for a refusal of what it was read as:
    // "1e2" is refused as 1, below 20, which the token alone does not say.
    std::string last_read;
    auto u64 = [&](const std::string& where, const std::string& tok, uint64_t& v) {
        bool plain = true;
        last_read.clear();
        if (!read_like_stoull(tok, v, &plain)) return false;
        if (!plain) read_as.push_back(last_read = where + tok + " read as " + std::to_string(v));
        return true;
    };
    auto real = [&](const std::string& key, const std::string& tok, double& v) {
        bool plain = true;
        last_read.clear();
        if (!read_like_stod(tok, v, &plain)) return false;
        if (!plain) read_as.push_back(last_read = key + ":" + tok + " read as " + shortest(v));
        return true;
    };
    auto refused = [&](const std::string& why) {
        return last_read.empty() ? why : why + " (" + last_read + ", as PyTorch reads it)";
    };
    auto expect = [&](const char* tok) {
        if (i >= t.size() || t[i] != tok) return false;
        ++i;
        return true;
    };
    while (i < t.size()) {
        std::string key = t[i++];
        if (!expect(":")) return "expected ':' after " + key;
        if (i >= t.size()) return key + ": no value";
        if (key == "max_split_size_mb" || key == "max_non_split_rounding_mb") {
            uint64_t mb;
            if (!u64(key + ":", t[i], mb)) return key + ": not a whole number of MiB: " + t[i];
            // AcceleratorAllocatorConfig::parseMaxSplitSize / parseMaxNonSplitRoundingSize refuse
            // either below the 20 MiB large-segment size (PyTorch up to 2.8 also refused
            // max_split_size_mb:20 itself).
            if (mb < (k_pt_large_buffer >> 20)) return refused(key + " too small, must be >= 20");
            mb = std::min<uint64_t>(mb, std::numeric_limits<uint64_t>::max() >> 20);
            (key == "max_split_size_mb" ? out.max_split_size : out.max_non_split_rounding) = mb << 20;
            ++i;
        } else if (key == "large_segment_size_mb") {
            // AcceleratorAllocatorConfig::parseLargeSegmentSize: more than kMinLargeAlloc (10 MiB).
            uint64_t mb;
            if (!u64(key + ":", t[i], mb)) return key + ": not a whole number of MiB: " + t[i];
            if (mb <= (k_pt_min_large_alloc >> 20)) return refused(key + " must be > 10");
            // PyTorch takes any size; a page past 1 TiB is more than any device maps, and would
            // overflow the replay's made-up address space.
            if (mb > (1ull << 20))
                return refused(key + ": " + std::to_string(mb) + " MiB is larger than any device (at most 1048576 here)");
            out.large_segment = mb << 20;
            ++i;
        } else if (key == "roundup_power2_divisions") {
            if (t[i] == "[") {
                ++i;
                size_t last = 0;
                bool first = true;
                while (i < t.size() && t[i] != "]") {
                    std::string interval = t[i++];
                    if (!expect(":")) return "roundup_power2_divisions: expected SIZE_MB:DIVISIONS in [...]";
                    uint64_t div;
                    // Read before the interval, as torch reads them (which refusal comes first), but
                    // noted after it, as written.
                    const size_t div_note = read_as.size();
                    // In the list form 0 turns rounding off for the interval.
                    if (i >= t.size() || !u64(key + ": ", t[i], div) || (div != 0 && !std::has_single_bit(div)))
                        return refused("roundup_power2_divisions: divisions must be a power of 2 or 0");
                    ++i;
                    // ">" fills the intervals after the last named one (last_index + 1 in
                    // AcceleratorAllocatorConfig::parseRoundUpPower2Divisions, PyTorch 2.10 on); with
                    // no interval named before it, from the second one: index 0 keeps its value.
                    if (interval == ">") {
                        std::fill(out.roundup_divisions.begin() + std::ptrdiff_t(last + 1), out.roundup_divisions.end(), div);
                    } else {
                        uint64_t mb;
                        if (!u64(key + ": ", interval, mb) || !std::has_single_bit(mb))
                            return refused("roundup_power2_divisions: intervals must be powers of 2 (MiB): " + interval);
                        if (!last_read.empty())
                            std::rotate(read_as.begin() + std::ptrdiff_t(div_note), read_as.end() - 1, read_as.end());
                        size_t idx = std::min<size_t>(size_t(63 - std::countl_zero(mb)), k_pt_roundup_intervals - 1);
                        // The first interval also sets every smaller one.
                        if (first) std::fill(out.roundup_divisions.begin(), out.roundup_divisions.begin() + std::ptrdiff_t(idx), div);
                        out.roundup_divisions[idx] = div;
                        last = idx;
                        first = false;
                    }
                    if (i < t.size() && t[i] == ",") ++i;
                }
                if (!expect("]")) return "roundup_power2_divisions: missing ']'";
            } else {
                uint64_t div;
                if (!u64(key + ":", t[i], div) || !std::has_single_bit(div))
                    return refused("roundup_power2_divisions: divisions must be a power of 2: " + t[i]);
                out.roundup_divisions.fill(div);
                ++i;
            }
        } else if (key == "garbage_collection_threshold") {
            const std::string& v = t[i];
            double d = 0;
            if (!real(key, v, d) || !(d > 0 && d < 1))
                return refused("garbage_collection_threshold: must be between 0.0 and 1.0 (exclusive): " + v);
            out.gc_threshold = d;
            ++i;
        } else if (key == "per_process_memory_fraction") {
            // CUDAAllocatorConfig::parsePerProcessMemoryFraction: [0.0, 1.0].
            const std::string& v = t[i];
            double d = 0;
            if (!real(key, v, d) || !(d >= 0 && d <= 1))
                return refused("per_process_memory_fraction: must be between 0.0 and 1.0: " + v);
            out.memory_fraction = d;
            ++i;
        } else if (key == "expandable_segments") {
            if (t[i] == "True") out.expandable = true;
            else if (t[i] == "False") out.expandable = false;
            else return "expandable_segments: expected True or False, not " + t[i];
            ++i;
        } else if (key == "backend") {
            if (t[i] != "native") return "backend:" + t[i] + " is not modelled (only the native caching allocator)";
            ++i;
        } else if (key == "release_lock_on_cudamalloc" || key == "release_lock_on_hipmalloc" ||
                   key == "graph_capture_record_stream_reuse" || key == "pinned_use_cuda_host_register" ||
                   key == "pinned_use_hip_host_register" || key == "pinned_use_background_threads") {
            // No effect on the replayed device memory layout (no graph capture in a replay), but
            // checked as PyTorch checks it (ConfigTokenizer::toBool): a config torch refuses at
            // startup must not replay as if it ran.
            if (t[i] != "True" && t[i] != "False") return key + ": expected True or False, not " + t[i];
            ++i;
        } else if (key == "pinned_num_register_threads") {
            // parsePinnedNumRegisterThreads: a power of 2, at most kPinnedMaxRegisterThreads (128).
            uint64_t n;
            if (!u64(key + ":", t[i], n) || !std::has_single_bit(n) || n > 128)
                return refused(key + ": expected a power of 2 from 1 to 128, not " + t[i]);
            ++i;
        } else if (key == "pinned_reserve_segment_size_mb") {
            // parsePinnedReserveSegmentSize: greater than 0.
            uint64_t mb;
            if (!u64(key + ":", t[i], mb) || mb == 0)
                return refused(key + ": expected a whole number of MiB above 0, not " + t[i]);
            ++i;
        } else {
            return "unknown option " + key + " (known: " + k_pt_option_names + ")";
        }
        if (i < t.size() && !expect(",")) return "expected ',' before " + t[i];
    }
    if (note) {
        note->clear();
        for (const std::string& r : read_as) *note += (note->empty() ? "" : ", ") + r;
        if (!read_as.empty()) *note += read_as.size() == 1 ? ", as PyTorch reads it" : ", as PyTorch reads them";
    }
    return "";
}

}  // namespace gpumem::simulate
