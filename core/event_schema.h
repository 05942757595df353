// The gpumem event schema, defined once: event kinds, API names, memory kinds and the in-memory event.
//
// Both the in-process recorder (preload/, core/) and the offline analyzer (analyzer/) include this
// header, so a name written by one is by construction the name read by the other.  The JSON members
// are listed once in core/log_fields.h; docs/log-format.md specifies the format for users.
#pragma once

#include <cstdint>
#include <cstddef>

namespace gpumem {

inline constexpr const char* k_format_name = "gpumem-events";
inline constexpr int k_format_version = 4;  // 2: config.reuse "auto" and reuse_safe; 3: stack records; 4: segment_map

// "ev" values, named as written.  The numeric order is part of no file format; only the names are.
#define GPUMEM_EV_KINDS(X)                                                                          \
    X(header)         /* first line of every log */                                                 \
    X(alloc)          /* a successful allocation the program asked for */                           \
    X(alloc_fail)     /* an allocation that returned an error ("err") */                            \
    X(free)           /* a successful free of a program allocation */                               \
    X(free_fail)      /* a free that returned an error ("err") */                                   \
    X(map)            /* cuMemMap: a physical handle mapped into a VA range */                      \
    X(unmap)          /* cuMemUnmap */                                                              \
    X(reserve)        /* cuMemAddressReserve: a VA range reserved (no physical memory) */           \
    X(unreserve)      /* cuMemAddressFree */                                                        \
    X(segment_alloc)  /* pool: a segment obtained from the driver */                                \
    X(segment_free)   /* pool: a segment returned to the driver */                                  \
    X(segment_unmap)  /* pool: physical chunks of a VMM segment returned (address space kept) */   \
    X(segment_map)    /* pool: physical chunks mapped into a hole of a VMM segment (it grew) */     \
    X(oom)            /* pool: an allocation that failed after the pool released its cache */       \
    X(stats)          /* pool: periodic snapshot of one device's pool */                            \
    X(pool_sync)      /* pool: pending frees released by one synchronize */                         \
    X(context_reset)  /* pool: a context was destroyed or reset; its pool state was dropped */      \
    X(reuse_safe)     /* pool: the device's pool left immediate reuse for safe reuse */             \
    X(lost)           /* the recorder could not record N events (buffer full past the wait budget) */ \
    X(end)            /* last line on a normal or signalled exit */                                 \
    X(stack)          /* not an event: a call stack's frames, written once before its first use (no seq) */

enum class ev_kind : uint8_t {
#define GPUMEM_X(k) k,
    GPUMEM_EV_KINDS(GPUMEM_X)
#undef GPUMEM_X
    count_
};

inline constexpr const char* k_ev_names[] = {
#define GPUMEM_X(k) #k,
    GPUMEM_EV_KINDS(GPUMEM_X)
#undef GPUMEM_X
};
static_assert(sizeof(k_ev_names) / sizeof(k_ev_names[0]) == size_t(ev_kind::count_));

// "kind" values: what sort of memory an allocation is.
enum class mem_kind : uint8_t { none = 0, device, managed, host, vmm, count_ };
inline constexpr const char* k_mem_kind_names[] = {"none", "device", "managed", "host", "vmm"};
static_assert(sizeof(k_mem_kind_names) / sizeof(k_mem_kind_names[0]) == size_t(mem_kind::count_));

// "api" values: the entry point the program called (or, for segment events, the pool's backend).
// X(id, name, kind): kind is the memory the call allocates, except cuMemAllocFromPoolAsync's, which
// is its memory pool's (device unless the pool was made of host or managed memory: hooks_driver.cc).
#define GPUMEM_API_LIST(X)                                          \
    X(none, "none", none)                                          \
    X(cuMemAlloc_v2, "cuMemAlloc_v2", device)                      \
    X(cuMemFree_v2, "cuMemFree_v2", device)                        \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch_v2", device)            \
    X(cuMemAllocManaged, "cuMemAllocManaged", managed)             \
    X(cuMemAllocAsync, "cuMemAllocAsync", device)                  \
    X(cuMemAllocAsync_ptsz, "cuMemAllocAsync_ptsz", device)        \
    X(cuMemFreeAsync, "cuMemFreeAsync", device)                    \
    X(cuMemFreeAsync_ptsz, "cuMemFreeAsync_ptsz", device)          \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", device)  \
    X(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync_ptsz", device) \
    X(cuMemCreate, "cuMemCreate", vmm)                             \
    X(cuMemRelease, "cuMemRelease", vmm)                           \
    X(cuMemMap, "cuMemMap", vmm)                                   \
    X(cuMemUnmap, "cuMemUnmap", vmm)                               \
    X(cuMemAddressReserve, "cuMemAddressReserve", vmm)             \
    X(cuMemAddressFree, "cuMemAddressFree", vmm)                   \
    X(cuMemHostAlloc, "cuMemHostAlloc", host)                      \
    X(cuMemAllocHost_v2, "cuMemAllocHost_v2", host)                \
    X(cuMemFreeHost, "cuMemFreeHost", host)                        \
    X(cudaMalloc, "cudaMalloc", device)                            \
    X(cudaFree, "cudaFree", device)                                \
    X(cudaMallocAsync, "cudaMallocAsync", device)                  \
    X(cudaFreeAsync, "cudaFreeAsync", device)                      \
    X(cudaMallocManaged, "cudaMallocManaged", managed)             \
    X(cudaMallocPitch, "cudaMallocPitch", device)                  \
    X(cuStreamCreate, "cuStreamCreate", none)                      \
    X(cuStreamCreateWithPriority, "cuStreamCreateWithPriority", none) \
    X(cuGreenCtxStreamCreate, "cuGreenCtxStreamCreate", none)    \
    X(cuGreenCtxCreate, "cuGreenCtxCreate", none)                \
    X(per_thread_stream, "CU_STREAM_PER_THREAD", none)           \
    X(cuGetProcAddress, "cuGetProcAddress", none)                 \
    X(cuLaunchKernel, "cuLaunchKernel", none)                     \
    X(cuLaunchKernelEx, "cuLaunchKernelEx", none)                 \
    X(cuModuleLoad, "cuModuleLoad", none)                         \
    X(cuModuleLoadData, "cuModuleLoadData", none)                 \
    X(cuModuleLoadDataEx, "cuModuleLoadDataEx", none)             \
    X(cuModuleLoadFatBinary, "cuModuleLoadFatBinary", none)       \
    X(cuLibraryLoadData, "cuLibraryLoadData", none)               \
    X(cuLibraryLoadFromFile, "cuLibraryLoadFromFile", none)       \
    X(cuModuleGetFunction, "cuModuleGetFunction", none)           \
    X(cuModuleGetGlobal_v2, "cuModuleGetGlobal_v2", none)         \
    X(cuLibraryGetKernel, "cuLibraryGetKernel", none)             \
    X(cuLibraryGetModule, "cuLibraryGetModule", none)             \
    X(cuLibraryGetGlobal, "cuLibraryGetGlobal", none)             \
    X(cuKernelGetFunction, "cuKernelGetFunction", none)           \
    X(cuFuncGetAttribute, "cuFuncGetAttribute", none)             \
    X(cuFuncSetAttribute, "cuFuncSetAttribute", none)             \
    X(cuFuncSetCacheConfig, "cuFuncSetCacheConfig", none)         \
    X(cuKernelGetAttribute, "cuKernelGetAttribute", none)         \
    X(cuKernelSetAttribute, "cuKernelSetAttribute", none)         \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor", none) \
    X(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", none) \
    X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", none) \
    X(cuGraphInstantiateWithParams, "cuGraphInstantiateWithParams", none) \
    X(cuGraphUpload, "cuGraphUpload", none)                       \
    X(cuGraphLaunch, "cuGraphLaunch", none)                       \
    X(cuArrayCreate_v2, "cuArrayCreate_v2", none)                 \
    X(cuArray3DCreate_v2, "cuArray3DCreate_v2", none)             \
    X(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", none)     \
    X(cuCtxSetLimit, "cuCtxSetLimit", none)                       \
    X(cuCtxCreate, "cuCtxCreate", none)                           \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", none) \
    X(cuGreenCtxDestroy, "cuGreenCtxDestroy", none)

enum class api_id : uint8_t {  // 8 bits: the event's spare byte went to "ctx"
#define GPUMEM_X(id, name, kind) id,
    GPUMEM_API_LIST(GPUMEM_X)
#undef GPUMEM_X
    count_
};

inline constexpr const char* k_api_names[] = {
#define GPUMEM_X(id, name, kind) name,
    GPUMEM_API_LIST(GPUMEM_X)
#undef GPUMEM_X
};

inline constexpr mem_kind k_api_kinds[] = {
#define GPUMEM_X(id, name, kind) mem_kind::kind,
    GPUMEM_API_LIST(GPUMEM_X)
#undef GPUMEM_X
};

// "pool" values on segment events.
enum class pool_id : uint8_t { none = 0, small, large, count_ };
inline constexpr const char* k_pool_names[] = {"none", "small", "large"};

// Why the log ended ("reason" on the end line).
enum class end_reason : uint8_t { exit = 0, signal, fast_exit, exec, count_ };
inline constexpr const char* k_end_reason_names[] = {"exit", "signal", "_exit", "exec"};

// The in-memory event.  Each member holds one fact, named after the JSON member it becomes
// (core/log_fields.h lists which kinds write which member).

// Pool state carried by "oom" and "stats" events (docs/log-format.md, docs/metrics.md).
struct pool_state {
    uint64_t size;          // "size": bytes requested by the failing call (oom only)
    uint64_t reserved;      // "reserved": bytes in segments held from the driver
    uint64_t allocated;     // "allocated": bytes in blocks handed to the program (rounded)
    uint64_t requested;     // "requested": bytes the program asked for, summed over live blocks
    uint64_t largest_free;  // "largest_free": biggest free block in any segment
    uint64_t free_blocks;   // "free_blocks": number of free blocks in all segments
    uint64_t gpu_free;      // "gpu_free": cuMemGetInfo free bytes (0 when not asked)
    uint64_t gpu_total;     // "gpu_total": cuMemGetInfo total bytes
    uint32_t segments;      // "segments": number of segments (32 bits: keeps the event at 104 bytes)
    uint32_t streams;       // "streams": live non-blocking streams of the pool's context (each fence covers them)
};

// Alloc/free, map/unmap/reserve/unreserve and segment events.
struct block_fields {
    uint64_t ptr;      // "ptr": address; the VMM handle for kind vmm alloc/free; the segment base
    uint64_t size;     // "size": bytes the program asked for
    uint64_t asize;    // "asize": bytes set aside (pool block size, pitch*height); 0 = same as size
    uint64_t seg;      // "seg": pool segment base (pooled events)
    uint64_t mempool;  // "mempool": the CUmemoryPool of a FromPool allocation; 0 = none
    uint64_t stream;   // "stream": written when flags has ef_has_stream (0 is the legacy stream)
    union {
        struct {
            uint64_t handle;  // "handle": the physical handle of a map
            uint64_t offset;  // "offset": its offset
        };
        struct {  // an alloc_fail that ran out of memory, where gpumem asked the driver after it
            uint64_t gpu_free;   // "gpu_free": cuMemGetInfo's free bytes; 0 when not asked
            uint64_t gpu_total;  // "gpu_total": its total bytes
        };
    };
    uint64_t stack;    // "stack": id of the interned call stack of an alloc or alloc_fail; 0 = none recorded
};

// pool_sync, context_reset and lost.
struct count_fields {
    uint64_t count;    // "count": frees released (pool_sync), 0 (context_reset), events lost (lost)
    uint64_t wait_ns;  // "wait_ns" (pool_sync): ns the program blocked in the pool's waits since the previous pool_sync
    uint64_t fence_ns;  // "fence_ns" (pool_sync): ns in the pool's event and stream calls that do not wait, since then
};

// The end line (event_log::finish).
struct end_fields {
    end_reason reason;     // "reason"
    int16_t signal;        // "signal": written for reason signal (16 bits: keeps the event at 104 bytes)
    // "stacks_lost": allocations recorded without their stack (stack_table::dropped), written
    // when not 0; saturates at 2^32-1.
    uint32_t stacks_lost;
    uint64_t events;       // "events": events recorded, the end line excluded
    uint64_t n_alloc;      // "n_alloc"
    uint64_t n_free;       // "n_free"
    uint64_t n_fail;       // "n_fail"
    uint64_t live_allocs;  // "live_allocs"
    uint64_t live_bytes;   // "live_bytes"
    uint64_t lost;         // "lost"
    uint64_t unmatched;    // "unmatched"
};

// One recorded event, as the hot path fills it.  Plain data with no pointers to strings: the
// writer thread turns it into a JSON line, so the hot path never formats.
struct event {
    uint64_t seq;      // "seq": global order, gap-free in a complete log
    uint64_t t_ns;     // "t": ns since the recorder started
    uint32_t tid;      // "tid": Linux thread id
    int32_t err;       // "err": CUresult / cudaError_t of a failed call (alloc_fail, free_fail)
    int16_t dev;       // "dev": device ordinal, -1 when unknown or host memory
    ev_kind ev;
    mem_kind kind;
    api_id api;
    pool_id pool;
    uint8_t flags;     // event_flags
    // "ctx": which pool of the device a pool event is from, one per context: its ordinal among the
    // device's pools, 0 for the first made (pool_registry::find_or_create).  On an alloc outside
    // the pools, the pool of the context that made it (the current one), where that context has a
    // pool on the allocation's device; 0 for stream-ordered ones (no context owns them) and for
    // other events.
    uint8_t ctx;
    union {            // which one: by `ev`, as core/log_fields.h's "carried by" says
        block_fields b;
        pool_state p;
        count_fields c;
        end_fields x;
    };
};
static_assert(sizeof(event) <= 104, "event should stay compact: it is copied on the hot path");

enum event_flags : uint8_t {
    ef_has_stream = 1 << 0,  // write "stream" (async calls)
    ef_size_unknown = 1 << 1, // free of a pointer the recorder never saw allocated
    ef_pooled = 1 << 2,      // served by gpumem's pool (alloc/free)
    ef_fence = 1 << 3,       // pool_sync: released by fences (events), not a context synchronize
    ef_waited = 1 << 4,      // pool_sync: the program waited on a fence for it (memory was short)
    ef_ordered = 1 << 5,     // pool_sync: handed out by an ordered release (GPUMEM_FENCE_WAIT=order), no wait
};

}  // namespace gpumem
