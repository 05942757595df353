// The interface every simulated allocator implements, and the names that select one.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace gpumem::simulate {

// An allocator replayed over a trace.  The driver (replay.h) calls allocate/release in seq order
// and reads the counters after each call; a policy never sees addresses of the log.
class policy {
public:
    virtual ~policy() = default;
    // Serves allocation `id` of `size` bytes on `stream`.  False: out of memory (after whatever the
    // allocator does to recover, e.g. freeing its cache); the run would have failed here.
    virtual bool allocate(uint32_t id, uint64_t size, uint16_t stream) = 0;
    // Frees allocation `id` (always one that allocate served).
    virtual void release(uint32_t id) = 0;

    // Bytes obtained from the driver and not returned (segments, or mapped pages).
    virtual uint64_t reserved() const = 0;
    // Bytes in blocks handed to the program (after rounding).
    virtual uint64_t allocated() const = 0;
    // The largest free block inside reserved memory (docs/metrics.md, external fragmentation).
    virtual uint64_t largest_free() const = 0;
    // Bytes freed but not yet reusable (gpumem's pool under safe reuse: frees whose fences are
    // not reached): neither allocated nor free, so free in segments is reserved - allocated - this.
    virtual uint64_t pending() const { return 0; }
    // Driver calls: allocations (cudaMalloc, or cuMemMap of new pages) and frees.
    virtual uint64_t driver_allocs() const = 0;
    virtual uint64_t driver_frees() const = 0;
    // True for an allocator that gives back every whole free chunk of physical memory before it
    // fails (gpumem's pool on virtual memory, PyTorch's expandable segments with their 2 and
    // 20 MiB pages): its failures can be "chunk rounding".
    virtual bool unmaps_free_chunks() const { return false; }
    // A limit the allocator keeps itself to below the device's memory (PyTorch's
    // per_process_memory_fraction), in bytes (0 refuses every segment); none when it has none.
    // What it leaves, not the card's free memory, is what a failure's verdict may count on.
    virtual std::optional<uint64_t> memory_limit() const { return std::nullopt; }
};

// What a policy name selects; see make_policy for the names.
struct policy_spec {
    std::string name;     // as the user wrote it: "pytorch", "pytorch:max_split_size_mb:64", ...
    std::string options;  // the part after the first ':' ("" if none)
};

// Builds the policy a name selects, for one device of `capacity` bytes (0 = unlimited) whose
// size is `device_total` (0 = unknown).  `log_config_json` is the log header's "config" object
// (the gpumem policy reads its knobs).  Returns null and sets *error when the name or its options
// are not understood.
std::unique_ptr<policy> make_policy(const policy_spec& spec, uint64_t capacity, uint64_t device_total,
                                    const std::string& log_config_json, std::string* error);

// What the replay must say beside a policy whose options cannot act (garbage_collection_threshold
// without a memory limit; gpumem's pool_trim or pool_stitch without virtual memory or safe reuse,
// pool_stitch without arenas, read with the log's header settings), so that a number unchanged by them is not read as their effect,
// or whose PyTorch values were read as torch reads them from something other than a plain number
// ("max_split_size_mb:64MB read as 64, as PyTorch reads it"): ""
// when there is nothing to say (or the name is not understood: make_policy says why).
std::string policy_note(const policy_spec& spec, const std::string& log_config_json = "{}");

// "pytorch:roundup_power2_divisions:4" -> {"pytorch:roundup_power2_divisions:4", "roundup_power2_divisions:4"}.
policy_spec parse_policy_name(const std::string& text);

// The names --policy accepts, for help and error messages.
inline constexpr const char* k_policy_names = "ideal, pytorch, pytorch:OPTIONS, pytorch-expandable, gpumem, gpumem:KNOBS";

}  // namespace gpumem::simulate
