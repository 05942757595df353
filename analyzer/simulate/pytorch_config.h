// PyTorch's CUDA caching allocator settings, read from PYTORCH_CUDA_ALLOC_CONF syntax.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

namespace gpumem::simulate {

// The constants of c10/cuda/CUDACachingAllocator.cpp (PyTorch 2.x), stated once for the model.
inline constexpr uint64_t k_pt_min_block = 512;              // kMinBlockSize: every size is rounded to 512 B
inline constexpr uint64_t k_pt_small_size = 1ull << 20;      // kSmallSize: requests <= 1 MiB use the small pool
inline constexpr uint64_t k_pt_small_buffer = 2ull << 20;    // kSmallBuffer: small pool segments are 2 MiB
inline constexpr uint64_t k_pt_large_buffer = 20ull << 20;   // kLargeBuffer: 1-10 MiB requests share 20 MiB segments (large_segment_size_mb's default)
inline constexpr uint64_t k_pt_min_large_alloc = 10ull << 20;  // kMinLargeAlloc: from here a segment is the request
inline constexpr uint64_t k_pt_round_large = 2ull << 20;     // kRoundLarge: ... rounded up to 2 MiB
inline constexpr size_t k_pt_roundup_intervals = 16;         // roundup_power2_divisions: 1 MiB .. 64 GiB, per power of 2

struct pt_config {
    uint64_t max_split_size = std::numeric_limits<uint64_t>::max();  // max_split_size_mb (unlimited)
    uint64_t max_non_split_rounding = k_pt_large_buffer;              // max_non_split_rounding_mb
    // large_segment_size_mb (torch 2.11 takes it; measured on the GPU): the segment of a 1-10 MiB
    // request and the page of a large expandable segment, kLargeBuffer by default.
    uint64_t large_segment = k_pt_large_buffer;
    std::array<uint64_t, k_pt_roundup_intervals> roundup_divisions{};  // roundup_power2_divisions; 0 = off
    double gc_threshold = 0;  // garbage_collection_threshold (acts only under a memory limit, below)
    // per_process_memory_fraction: below 1, the allocator's own limit (allowed_memory_maximum) is
    // this share of the device's memory (--capacity's when given).
    double memory_fraction = 1;
    bool expandable = false;  // expandable_segments

    // Divisions for a request of `size` bytes: the interval is floor(log2(size)) - 20, clamped to 0..15.
    uint64_t divisions_for(uint64_t size) const;
    // The PYTORCH_CUDA_ALLOC_CONF value that sets this configuration ("" for the defaults).
    std::string to_conf() const;
};

// Whether garbage_collection_threshold acts.  PyTorch collects only under its memory limit
// (allowed_memory_maximum), which only per_process_memory_fraction below 1 sets: not the card's
// size, nor a fraction of exactly 1 (measured on torch 2.11: docs/gpu-results.md, run 139), so
// --capacity, a smaller card, does not turn it on either.
inline bool pt_gc_acts(const pt_config& cfg) {
    return cfg.gc_threshold > 0 && cfg.memory_fraction < 1;
}

// Parses "max_split_size_mb:64,roundup_power2_divisions:[256:1,>:4],expandable_segments:True".
// Returns "" on success, else what is wrong (with the same limits PyTorch checks).  The keys that
// cannot change the replayed layout (release_lock_on_cudamalloc, the pinned_ host allocator's,
// graph_capture_record_stream_reuse) are accepted and ignored.  A number is read as PyTorch 2.11
// reads it (std::stoull or std::stod of the value: "64MB" is 64, "+64" is 64; "abc" is refused);
// *note, when given, says which values were read from something other than a plain number
// ("max_split_size_mb:64MB read as 64, as PyTorch reads it"), "" when none.
std::string parse_pt_config(std::string_view text, pt_config& out, std::string* note = nullptr);

}  // namespace gpumem::simulate
