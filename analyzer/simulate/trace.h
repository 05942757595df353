// Loads a gpumem log into each device's sequence of allocation requests and frees, for the allocator simulations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

namespace gpumem::simulate {

// One request of the program, in seq order.  `id` names a live allocation densely (0, 1, 2, ...),
// so a policy keeps its blocks in a vector indexed by id instead of hashing addresses.  A freed
// allocation's id is given to a later one: ids stay below the most allocations live at once, and so
// do the policies' vectors, however long the log.
struct request {
    uint64_t size = 0;    // bytes asked for (alloc) or 0 (free)
    uint64_t seq = 0, t = 0;
    uint32_t id = 0;
    uint16_t stream = 0;  // dense stream index; 0 = the stream of requests that name none
    bool is_free = false;
};

// A device's requests, kept encoded at a few bytes each rather than as 32-byte structs: a long
// training log has tens of millions of them (64 million took 2 GB as structs, 3.2 GB while the
// vector doubled).  seq, t and id are stored as differences from the request before, size and
// stream as they are, each a varint (7 bits a byte), in chunks that are never moved; they are read
// back in order, which is all a replay does.  Any request round-trips exactly (a free's size is 0).
class request_list {
public:
    void push_back(const request& r);
    uint64_t size() const { return n_; }
    bool empty() const { return n_ == 0; }
    uint64_t bytes() const;  // memory held for the requests

    class iterator {
    public:
        using iterator_category = std::input_iterator_tag;
        using value_type = request;
        using difference_type = std::ptrdiff_t;
        using pointer = const request*;
        using reference = const request&;
        const request& operator*() const { return cur_; }
        const request* operator->() const { return &cur_; }
        iterator& operator++();
        bool operator==(const iterator& o) const { return left_ == o.left_; }
        bool operator!=(const iterator& o) const { return left_ != o.left_; }

    private:
        friend class request_list;
        const request_list* list_ = nullptr;
        uint64_t left_ = 0;  // requests not read yet, the current one included
        size_t chunk_ = 0, pos_ = 0;
        request cur_;
        void decode();
    };
    iterator begin() const;
    iterator end() const { return iterator{}; }

private:
    struct chunk {
        std::unique_ptr<uint8_t[]> data;
        size_t size = 0, used = 0;
    };
    std::vector<chunk> chunks_;
    uint64_t n_ = 0, held_ = 0;
    request last_;  // the request pushed last: the base of the next one's differences
};

struct device_trace {
    int dev = -1;
    request_list ops;
    uint32_t n_ids = 0;                // ids in use (0..n_ids-1): the most allocations live at once
    uint64_t n_alloc = 0, n_free = 0;  // requests replayed
    uint64_t n_no_stream = 0;          // allocations whose API has no stream (cudaMalloc, cuMemAlloc)
    uint64_t n_streams = 0;            // distinct streams named by the log's stream-ordered requests
    uint64_t n_freed_twice = 0;        // an address allocated again before its free: the old one counted as freed
    uint64_t total_bytes = 0;          // the device's memory from the header (0 when not recorded)
};

struct trace {
    std::string file;
    std::vector<device_trace> devices;  // by ascending device ordinal
    std::vector<std::string> apis;      // the allocation APIs that were replayed, as seen
    std::vector<std::string> log_apis;  // every API of the log's device allocations, replayed or not, as seen
    uint64_t skipped_allocs = 0;        // allocations the --api filter left out (and their frees)
    // GPU memory no replayed allocator serves, left out whatever --api says: managed memory
    // (cudaMallocManaged) and cuMemCreate's physical memory (kind "vmm").  Host memory is no GPU's.
    uint64_t skipped_managed = 0, skipped_vmm = 0;
    std::string config_json;            // the header's "config" object, as JSON text ("{}" when absent)
    uint64_t cut_line = 0;              // the last line, cut short (a writer still in it, or stopped in it): not replayed
};

struct trace_options {
    // API names to replay ("cudaMalloc", "cuMemAlloc_v2", ...).  Empty: every allocation of kind
    // "device" (not managed, host or vmm memory).
    std::vector<std::string> apis;
    // Reading progress on stderr (analysis::reading_meter), as report shows it: --progress.
    bool progress = false;
    double progress_interval_s = 2.0;
};

// Reads the whole log.  Throws analysis::input_error (file:line: message) on unusable input.
trace load_trace(const std::string& path, const trace_options& opt);

}  // namespace gpumem::simulate
