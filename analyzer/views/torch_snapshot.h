// `gpumem report --torch-snapshot`: one log as the dict torch.cuda.memory._snapshot() returns, so that
// PyTorch's memory_viz (python -m torch.cuda._memory_viz, pytorch.org/memory_viz) opens it.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>

#include "report_model.h"
#include "views/pickle_writer.h"

namespace gpumem::analysis {

// The trace actions written (PyTorch's TraceEntry names).
enum class torch_action : uint8_t {
    alloc, free_requested, free_completed, segment_alloc, segment_free, segment_unmap, segment_map, oom, count_
};
inline constexpr const char* k_torch_action_names[] = {"alloc", "free_requested", "free_completed", "segment_alloc",
                                                       "segment_free", "segment_unmap", "segment_map", "oom"};
static_assert(sizeof(k_torch_action_names) / sizeof(k_torch_action_names[0]) == size_t(torch_action::count_));

// What was written, per device, for the caller's summary and for tests.
struct torch_device_summary {
    std::array<uint64_t, size_t(torch_action::count_)> actions{};
    uint64_t segments = 0, blocks = 0;  // in "segments" (the end of the log)
};
struct torch_snapshot_summary {
    std::map<int, torch_device_summary> devices;
    uint64_t host_events = 0;  // events of dev -1 (pinned host memory, unknown device): not in the snapshot
    uint64_t unplaced = 0;     // pooled blocks or frees the rebuild could not place (a log missing events)
};

// Writes the snapshot of the log at `path`, already analyzed as `rep` (whose stacks are
// symbolized), to `w`: "device_traces" with every event of each device, then "segments" with the
// state at the end of the log.  Reads the log again, once per device.  Throws input_error when it
// cannot (the log is not a regular file, or changed since).
torch_snapshot_summary write_torch_snapshot(const std::string& path, const process_report& rep, pickle_writer& w);

}  // namespace gpumem::analysis
