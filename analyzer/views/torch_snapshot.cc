// PyTorch's memory snapshot of one log (torch_snapshot.h).
//
// How the log maps onto PyTorch's allocator, whose viewer replays "device_traces" backwards from
// "segments" (so the two must agree exactly):
//   - a pool segment (segment_alloc/segment_free) is a PyTorch segment, and each pooled block in it
//     a block; a pooled free is "free_requested", and "free_completed" follows when the block is
//     free for reuse: at once, or at the pool_sync that releases it (pending = PyTorch's
//     active_pending_free);
//   - memory PyTorch cannot see as blocks (cudaMalloc/cuMemAlloc without the pool, NCCL, cuBLAS,
//     cuMemMap'd ranges of JAX or PyTorch's expandable segments) is a segment of one block:
//     segment_alloc + alloc, and free_requested + free_completed + segment_free;
//   - segment_unmap (the pool gave back chunks of a virtual-memory segment) and segment_map (it
//     mapped chunks into a hole: an arena segment grew) are PyTorch's own segment_unmap and
//     segment_map, as its expandable segments write them.  An arena is such a segment all through:
//     what it mapped at first (asize) is a segment_map, and its segment_free a segment_unmap per
//     mapped piece.  At the end a segment with holes is listed as its mapped pieces, which
//     memory_viz splits and joins again as it replays those two;
//   - an "oom" line, or an alloc_fail with the out-of-memory code and no "oom" line before it, is
//     "oom" (the rule of the report's OOM list, metrics/oom_diagnosis.cc), with the failing call's
//     frames (its alloc_fail's stack; a pool's "oom" entry waits for the alloc_fail after it) and
//     the driver's free bytes when the log has them.
// Frames are the allocation's stack, innermost first, as PyTorch lists them; a free carries the
// frames of its allocation, as PyTorch's free entries do when the free itself has no context.
#include "views/torch_snapshot.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "format_util.h"
#include "log_fields.h"
#include "log_reader.h"

namespace gpumem::analysis {

namespace {

// A device ordinal past this is a hostile log, not a machine: the list of traces is indexed by it.
constexpr int k_max_device = 4095;

struct block {
    uint64_t asize, size, stream;
    uint32_t stack;
    bool pending;
    // Its trace entries' size: the requested bytes, as PyTorch's (record_trace's orig_size and
    // requested_size), never past the block (a hostile log).
    uint64_t shown() const { return std::min(size, asize); }
};

struct pool_segment {
    uint64_t size;
    pool_id pool;
    uint64_t ctx;                           // its pool on the device (segment_alloc's "ctx")
    std::map<uint64_t, block> blocks;       // ptr -> block
    std::map<uint64_t, uint64_t> holes;     // ranges without chunks (segment_unmap, asize): start -> size
    bool had_holes;                         // ever: an expandable segment to PyTorch
    bool arena = false;                     // mapped as it grew: only segment_map/segment_unmap, as PyTorch's
};

// An allocation outside the pool, or a mapped range: a segment holding one block.
struct whole {
    uint64_t size, requested, stream;
    uint32_t stack;
    // An allocation outside the pools: its line's "ctx", and whether it named a stream (no
    // context owns a stream-ordered one): which context_reset ends it, as in the report's model.
    uint64_t ctx = 0;
    bool stream_ordered = false;
    uint64_t shown() const { return std::min(requested, size); }  // as block::shown
};

// What the pickle's memo holds, shared by every device's pass: stack id -> its frame list, and each
// frame (file, line, name) -> its dict.
struct frame_memo {
    std::unordered_map<uint32_t, uint32_t> stacks;
    std::unordered_map<std::string, uint32_t> frames;
};

class device_export {
  public:
    device_export(int dev, const process_report& rep, pickle_writer& w, frame_memo& memo, torch_device_summary& sum,
                  torch_snapshot_summary& all)
        : dev_(dev), rep_(rep), w_(w), memo_(memo), sum_(sum), all_(all) {
        time_base_us_ = rep.start_unix_ns / 1000;
    }

    void apply(const log_event& e) {
        // A pool's "oom" entry is held for the alloc_fail of the same call, which names its stack;
        // anything else in between writes it without frames first, so the trace keeps log order.
        if (held_oom_ && !(e.ev == ev_kind::alloc_fail && e.dev == dev_)) write_held_oom(0);
        switch (e.ev) {
        case ev_kind::alloc: on_alloc(e); break;
        case ev_kind::free: on_free(e); break;
        case ev_kind::map: {
            // On its handle's device: logs before 2026-12-06 wrote dev -1 on every map.
            auto h = handles_.find(e.handle);
            if ((e.dev >= 0 ? e.dev : h == handles_.end() ? -1 : h->second.dev) != dev_) break;
            if (maps_.count(e.ptr)) close_whole(maps_, e.ptr, e.t);
            {
                whole m{e.size, e.size, 0, h == handles_.end() ? 0u : h->second.stack};
                maps_[e.ptr] = m;
                open_whole(e.ptr, m, e.t);
            }
            break;
        }
        case ev_kind::unmap:
            if (maps_.count(e.ptr)) close_whole(maps_, e.ptr, e.t);
            break;
        case ev_kind::segment_alloc: {
            if (e.dev != dev_) break;
            if (segs_.count(e.ptr)) drop_segment(e.ptr, e.t);
            // An arena segment starts with its first asize bytes mapped (the report rejects more).
            const uint64_t mapped = std::min(e.set_aside(), e.size);
            pool_segment& s = segs_[e.ptr] = pool_segment{e.size, e.pool, e.ctx, {}, {}, mapped < e.size, mapped < e.size};
            if (mapped < e.size) s.holes[e.ptr + mapped] = e.size - mapped;
            // An arena is PyTorch's expandable segment, which never writes segment_alloc: its first
            // chunks are a segment_map, so memory_viz's segment timeline counts them (it pairs
            // segment_alloc with segment_free only).  Nothing mapped yet: nothing to write.
            if (mapped) entry(s.arena ? torch_action::segment_map : torch_action::segment_alloc, e.ptr, mapped, 0, e.t, 0);
            break;
        }
        case ev_kind::segment_free:
            if (e.dev == dev_ && segs_.count(e.ptr)) drop_segment(e.ptr, e.t);
            break;
        case ev_kind::segment_unmap: {
            if (e.dev != dev_) break;
            auto s = segs_.find(e.seg);
            if (s == segs_.end() || e.ptr < e.seg || e.size > s->second.size || e.ptr - e.seg > s->second.size - e.size) {
                ++all_.unplaced;
                break;
            }
            s->second.holes[e.ptr] = e.size;
            s->second.had_holes = true;
            entry(torch_action::segment_unmap, e.ptr, e.size, 0, e.t, 0);
            break;
        }
        case ev_kind::segment_map: {
            if (e.dev != dev_) break;
            auto s = segs_.find(e.seg);
            if (s == segs_.end() || !fill_holes(s->second, e.ptr, e.size)) {
                ++all_.unplaced;
                break;
            }
            entry(torch_action::segment_map, e.ptr, e.size, 0, e.t, 0);
            break;
        }
        case ev_kind::pool_sync:
            // A release by fences frees the first `count` pending blocks of its pool, in free order
            // (as the report's model reads it, analyzer/model/address_space.cc); a synchronize frees
            // all of them.
            if (e.dev == dev_) {
                pool_pend& p = pools_[e.ctx];
                complete_pending(p, e.t,
                                 e.fence && e.has(fd_count) && e.count <= p.pending.size() ? size_t(e.count) : p.pending.size());
            }
            break;
        case ev_kind::context_reset:
            // As the report's model: a reset drops its pool's memory and its context's memory
            // outside the pools (with the header's alloc_ctx; before it, all of the device's), a
            // reset of no device the pools of every device.
            if (e.dev == dev_ || e.dev < 0) {
                for (auto& [c, p] : pools_)
                    if (e.dev < 0 || c == e.ctx) complete_pending(p, e.t);
                for (auto it = segs_.begin(); it != segs_.end();) {
                    const uint64_t base = it++->first;  // drop_segment erases it
                    if (e.dev < 0 || segs_.at(base).ctx == e.ctx) drop_segment(base, e.t);
                }
                if (e.dev == dev_) {
                    std::vector<uint64_t> ending;
                    for (const auto& [ptr, w] : plain_)
                        if (!rep_.alloc_ctx || (!w.stream_ordered && w.ctx == e.ctx)) ending.push_back(ptr);
                    for (uint64_t ptr : ending) close_whole(plain_, ptr, e.t);
                }
            }
            break;
        case ev_kind::reuse_safe:
            if (e.dev == dev_) pools_[e.ctx].reuse_safe = true;
            break;
        case ev_kind::oom:
            if (e.dev != dev_) break;
            held_oom_ = true;
            held_ = oom_fields{e.size, e.recorded_gpu_free(), e.t};
            break;
        case ev_kind::alloc_fail: {
            if (e.dev != dev_ || !e.has(fd_err) || e.err != 2) {
                if (held_oom_) write_held_oom(0);
                break;
            }
            const uint32_t stack = stack_of(e);
            if (held_oom_ && held_.size == e.size) {
                write_held_oom(stack);  // the pool's "oom" line stands for this failure
                break;
            }
            if (held_oom_) write_held_oom(0);
            oom_entry(e.size, e.recorded_gpu_free(), e.t, stack);
            break;
        }
        default: break;
        }
    }

    // The device's segments at the end of the log, by address.
    void write_segments() {
        struct item {
            uint64_t addr;
            const pool_segment* seg;  // else `w`
            uint64_t end;             // a pool segment's piece: [addr, end)
            const whole* w;
        };
        std::vector<item> items;
        for (const auto& [base, s] : segs_) {
            uint64_t cur = base;
            for (const auto& [hs, hn] : s.holes) {
                if (hs > cur) items.push_back({cur, &s, hs, nullptr});
                cur = std::max(cur, hs + hn);
            }
            if (base + s.size > cur) items.push_back({cur, &s, base + s.size, nullptr});
        }
        for (const auto* m : {&plain_, &maps_})
            for (const auto& [p, x] : *m) items.push_back({p, nullptr, 0, &x});
        std::sort(items.begin(), items.end(), [](const item& a, const item& b) { return a.addr < b.addr; });
        for (const item& it : items) {
            if (it.seg) write_piece(it.addr, it.end, *it.seg);
            else write_whole_segment(it.addr, *it.w);
        }
    }

    // The end of the log: a pool's "oom" entry still held goes out without frames.
    void finish() {
        if (held_oom_) write_held_oom(0);
    }

  private:
    // Takes [p, p+n) out of the segment's holes, which must cover it (touching holes count as one,
    // as in the report's model); false, and nothing changed, when they do not.
    static bool fill_holes(pool_segment& s, uint64_t p, uint64_t n) {
        if (n == 0 || p > UINT64_MAX - n) return false;
        const uint64_t q = p + n;
        auto first = s.holes.upper_bound(p);
        if (first == s.holes.begin()) return false;
        --first;
        auto it = first;
        uint64_t cur = first->first;
        while (it != s.holes.end() && it->first == cur && cur < q) {
            cur += it->second;
            ++it;
        }
        if (p >= first->first + first->second || cur < q) return false;
        const uint64_t h0 = first->first;
        const auto last = std::prev(it);
        const uint64_t h1 = last->first + last->second;
        s.holes.erase(first, it);
        if (h0 < p) s.holes[h0] = p - h0;
        if (q < h1) s.holes[q] = h1 - q;
        return true;
    }

    // One pool of the device ("ctx"): its pending frees and its reuse switch.
    struct pool_pend {
        std::deque<std::pair<uint64_t, uint64_t>> pending;  // (segment base, block), in free order
        bool reuse_safe = false;
    };

    bool pends(const pool_pend& p) const {
        if (rep_.reuse_mode == config_value::reuse_immediate) return false;
        if (rep_.reuse_mode == config_value::reuse_auto) return p.reuse_safe;
        return true;  // "safe", or a log from before "auto"
    }

    uint64_t time_us(uint64_t t) const { return time_base_us_ + t / 1000; }

    void frames(uint32_t stack) {
        const std::vector<frame_view>* fr = stack ? rep_.stacks.find(stack) : nullptr;
        if (!fr) {
            w_.begin_list();
            w_.end_list();
            return;
        }
        // Each stack's list, and each frame, is written once and referred to after that: stacks
        // repeat across allocations and frames across stacks (a 200,000-allocation log with native
        // stacks: 235 MB without, docs/benchmarks.md).
        if (auto m = memo_.stacks.find(stack); m != memo_.stacks.end()) return w_.get(m->second);
        w_.begin_list();
        std::string key;
        for (const frame_view& f : *fr) {
            const std::string& file = !f.file.empty() ? f.file : f.module;
            // An unnamed native frame is its address in the module, as PyTorch shows one.
            std::string name = !f.function.empty() ? f.function : f.native() ? fmt_hex(f.address) : std::string("??");
            key.assign(file).append(1, '\0').append(std::to_string(f.line)).append(1, '\0').append(name);
            if (auto m = memo_.frames.find(key); m != memo_.frames.end()) {
                w_.get(m->second);
                continue;
            }
            w_.begin_dict();
            w_.str_memo("filename");
            w_.str(file);
            w_.str_memo("line");
            w_.uinteger(f.line);
            w_.str_memo("name");
            w_.str(name);
            memo_.frames.emplace(key, w_.end_dict_memo());
        }
        memo_.stacks.emplace(stack, w_.end_list_memo());
    }

    void entry(torch_action a, uint64_t addr, uint64_t size, uint64_t stream, uint64_t t, uint32_t stack) {
        w_.begin_dict();
        w_.str_memo("action");
        w_.str_memo(k_torch_action_names[size_t(a)]);
        w_.str_memo("addr");
        w_.uinteger(addr);
        w_.str_memo("size");
        w_.uinteger(size);
        w_.str_memo("stream");
        w_.uinteger(stream);
        w_.str_memo("time_us");
        w_.uinteger(time_us(t));
        w_.str_memo("frames");
        frames(stack);
        w_.end_dict();
        ++sum_.actions[size_t(a)];
    }

    void oom_entry(uint64_t size, uint64_t device_free, uint64_t t, uint32_t stack) {
        // PyTorch's oom entry has the device's free bytes where others have "addr".
        w_.begin_dict();
        w_.str_memo("action");
        w_.str_memo("oom");
        w_.str_memo("size");
        w_.uinteger(size);
        w_.str_memo("device_free");
        w_.uinteger(device_free);
        w_.str_memo("stream");
        w_.uinteger(0);
        w_.str_memo("time_us");
        w_.uinteger(time_us(t));
        w_.str_memo("frames");
        frames(stack);
        w_.end_dict();
        ++sum_.actions[size_t(torch_action::oom)];
    }

    void write_held_oom(uint32_t stack) {
        held_oom_ = false;
        oom_entry(held_.size, held_.device_free, held_.t, stack);
    }

    // Trace entries of blocks carry the requested size, as PyTorch's record_trace(ALLOC, ..., orig_size)
    // and its frees' block->requested_size; segments their whole size.
    void open_whole(uint64_t ptr, const whole& x, uint64_t t) {
        entry(torch_action::segment_alloc, ptr, x.size, x.stream, t, x.stack);
        entry(torch_action::alloc, ptr, x.shown(), x.stream, t, x.stack);
    }

    void close_whole(std::unordered_map<uint64_t, whole>& m, uint64_t ptr, uint64_t t) {
        auto it = m.find(ptr);
        if (it == m.end()) return;
        const whole& x = it->second;
        entry(torch_action::free_requested, ptr, x.shown(), x.stream, t, x.stack);
        entry(torch_action::free_completed, ptr, x.shown(), x.stream, t, x.stack);
        entry(torch_action::segment_free, ptr, x.size, x.stream, t, x.stack);
        m.erase(it);
    }

    // The pool segment holding `ptr`: by its recorded base first, else by address.
    // The stack an alloc or alloc_fail names, when the report knows it (0: none).
    uint32_t stack_of(const log_event& e) const {
        return e.has(fd_stack) ? rep_.stacks.defined(e.stack) : 0;
    }

    pool_segment* segment_of(uint64_t seg, uint64_t ptr, uint64_t* base) {
        auto s = segs_.find(seg);
        if (s == segs_.end()) {
            s = segs_.upper_bound(ptr);
            if (s == segs_.begin()) return nullptr;
            --s;
        }
        if (ptr < s->first || ptr - s->first >= s->second.size) return nullptr;
        *base = s->first;
        return &s->second;
    }

    void on_alloc(const log_event& e) {
        if (e.ptr == 0) return;  // a zero-byte allocation: nothing is held
        uint32_t stack = stack_of(e);
        if (e.kind == mem_kind::vmm) {
            handles_[e.ptr] = handle{stack, e.dev};  // physical memory: it shows where it is mapped
            return;
        }
        if (e.dev != dev_) return;
        uint64_t stream = e.has(fd_stream) ? e.stream : 0;
        if (e.pooled) {
            uint64_t base = 0;
            pool_segment* s = segment_of(e.seg, e.ptr, &base);
            if (!s || e.set_aside() > s->size - (e.ptr - base)) {
                ++all_.unplaced;
                return;
            }
            auto old = s->blocks.find(e.ptr);
            if (old != s->blocks.end()) {
                // A block placed over a live one (a log missing its free): the old one ends here.
                if (!old->second.pending) entry(torch_action::free_requested, e.ptr, old->second.shown(), old->second.stream, e.t, old->second.stack);
                entry(torch_action::free_completed, e.ptr, old->second.shown(), old->second.stream, e.t, old->second.stack);
                s->blocks.erase(old);
            }
            const block& placed = s->blocks[e.ptr] = block{e.set_aside(), e.size, stream, stack, false};
            entry(torch_action::alloc, e.ptr, placed.shown(), stream, e.t, stack);
            return;
        }
        if (plain_.count(e.ptr)) close_whole(plain_, e.ptr, e.t);
        whole x{e.set_aside(), e.size, stream, stack, e.ctx, e.has(fd_stream)};
        plain_[e.ptr] = x;
        open_whole(e.ptr, x, e.t);
    }

    void on_free(const log_event& e) {
        if (e.kind == mem_kind::vmm) {
            handles_.erase(e.ptr);
            return;
        }
        if (e.dev != dev_ || e.unknown || e.ptr == 0) return;
        if (plain_.count(e.ptr)) return close_whole(plain_, e.ptr, e.t);
        uint64_t base = 0;
        pool_segment* s = segment_of(e.seg, e.ptr, &base);
        if (!s) {
            ++all_.unplaced;
            return;
        }
        auto b = s->blocks.find(e.ptr);
        if (b == s->blocks.end() || b->second.pending) {
            ++all_.unplaced;
            return;
        }
        block& k = b->second;
        entry(torch_action::free_requested, e.ptr, k.shown(), k.stream, e.t, k.stack);
        if (pool_pend& p = pools_[s->ctx]; pends(p)) {  // the block's segment names its pool
            k.pending = true;
            p.pending.push_back({base, e.ptr});
        } else {
            entry(torch_action::free_completed, e.ptr, k.shown(), k.stream, e.t, k.stack);
            s->blocks.erase(b);
        }
    }

    // The first n pending frees of pool p complete (all of them by default).
    void complete_pending(pool_pend& p, uint64_t t, size_t n = SIZE_MAX) {
        n = std::min(n, p.pending.size());
        for (size_t i = 0; i < n; ++i) {
            const auto& [base, ptr] = p.pending[i];
            auto s = segs_.find(base);
            if (s == segs_.end()) continue;
            auto b = s->second.blocks.find(ptr);
            if (b == s->second.blocks.end() || !b->second.pending) continue;
            entry(torch_action::free_completed, ptr, b->second.shown(), b->second.stream, t, b->second.stack);
            s->second.blocks.erase(b);
        }
        p.pending.erase(p.pending.begin(), p.pending.begin() + std::ptrdiff_t(n));
    }

    // A segment goes: whatever blocks it still holds end first (only a log missing events has
    // any), then the segment, piece by piece when chunks of it were unmapped.
    void drop_segment(uint64_t base, uint64_t t) {
        auto it = segs_.find(base);
        pool_segment& s = it->second;
        for (const auto& [ptr, b] : s.blocks) {
            if (!b.pending) entry(torch_action::free_requested, ptr, b.shown(), b.stream, t, b.stack);
            entry(torch_action::free_completed, ptr, b.shown(), b.stream, t, b.stack);
        }
        uint64_t cur = base;
        const torch_action gone = s.arena ? torch_action::segment_unmap : torch_action::segment_free;
        for (const auto& [hs, hn] : s.holes) {
            if (hs > cur) entry(gone, cur, hs - cur, 0, t, 0);
            cur = std::max(cur, hs + hn);
        }
        if (base + s.size > cur) entry(gone, cur, base + s.size - cur, 0, t, 0);
        segs_.erase(it);
    }

    void segment_head(uint64_t addr, uint64_t size, uint64_t allocated, uint64_t active, uint64_t requested,
                      uint64_t stream, const char* type, bool expandable, uint32_t stack) {
        w_.str_memo("device");
        w_.integer(dev_);
        w_.str_memo("address");
        w_.uinteger(addr);
        w_.str_memo("total_size");
        w_.uinteger(size);
        w_.str_memo("allocated_size");
        w_.uinteger(allocated);
        w_.str_memo("active_size");
        w_.uinteger(active);
        w_.str_memo("requested_size");
        w_.uinteger(requested);
        w_.str_memo("stream");
        w_.uinteger(stream);
        w_.str_memo("segment_type");
        w_.str_memo(type);
        w_.str_memo("segment_pool_id");
        w_.int_pair(0, 0);
        w_.str_memo("is_expandable");
        w_.boolean(expandable);
        w_.str_memo("frames");
        frames(stack);
    }

    void block_dict(uint64_t addr, uint64_t size, uint64_t requested, const char* state, uint32_t stack) {
        w_.begin_dict();
        w_.str_memo("address");
        w_.uinteger(addr);
        w_.str_memo("size");
        w_.uinteger(size);
        w_.str_memo("requested_size");
        w_.uinteger(requested);
        w_.str_memo("state");
        w_.str_memo(state);
        w_.str_memo("frames");
        frames(stack);
        w_.end_dict();
    }

    // One mapped piece [a, end) of a pool segment, its blocks tiled with inactive gaps (memory_viz
    // gives each block the address where the one before it ends).
    void write_piece(uint64_t a, uint64_t end, const pool_segment& s) {
        std::vector<std::pair<uint64_t, const block*>> in;
        uint64_t cur = a, allocated = 0, active = 0, requested = 0;
        for (auto b = s.blocks.lower_bound(a); b != s.blocks.end() && b->first < end; ++b) {
            const block& k = b->second;
            if (b->first < cur || k.asize > end - b->first) continue;  // overlapping (a hostile log)
            in.push_back({b->first, &k});
            cur = b->first + k.asize;
            active += k.asize;
            if (!k.pending) {
                allocated += k.asize;
                requested += std::min(k.size, k.asize);
            }
        }
        w_.begin_dict();
        segment_head(a, end - a, allocated, active, requested, 0, s.pool == pool_id::small ? "small" : "large",
                     s.had_holes, 0);
        w_.str_memo("blocks");
        w_.begin_list();
        cur = a;
        for (const auto& [p, k] : in) {
            if (p > cur) block_dict(cur, p - cur, 0, "inactive", 0);
            block_dict(p, k->asize, std::min(k->size, k->asize), k->pending ? "active_pending_free" : "active_allocated",
                       k->stack);
            cur = p + k->asize;
            ++sum_.blocks;
        }
        if (end > cur) block_dict(cur, end - cur, 0, "inactive", 0);
        w_.end_list();
        w_.end_dict();
        ++sum_.segments;
    }

    void write_whole_segment(uint64_t addr, const whole& x) {
        uint64_t requested = x.shown();
        w_.begin_dict();
        segment_head(addr, x.size, x.size, x.size, requested, x.stream, "large", false, x.stack);
        w_.str_memo("blocks");
        w_.begin_list();
        block_dict(addr, x.size, requested, "active_allocated", x.stack);
        w_.end_list();
        w_.end_dict();
        ++sum_.segments;
        ++sum_.blocks;
    }

    int dev_;
    const process_report& rep_;
    pickle_writer& w_;
    frame_memo& memo_;
    torch_device_summary& sum_;
    torch_snapshot_summary& all_;
    uint64_t time_base_us_ = 0;
    struct oom_fields {
        uint64_t size, device_free, t;
    };
    bool held_oom_ = false;  // held_: a pool's "oom" line waiting for its alloc_fail
    oom_fields held_{};
    std::map<uint64_t, pool_segment> segs_;
    std::map<uint64_t, pool_pend> pools_;  // by "ctx"
    std::unordered_map<uint64_t, whole> plain_, maps_;
    struct handle {
        uint32_t stack;
        int dev;
    };
    std::unordered_map<uint64_t, handle> handles_;  // cuMemCreate handle -> its stack and device
};

// One pass over the log for `dev`.  The log was analyzed already, so a line that does not parse now
// means the file changed in between.
void run_device_pass(const std::string& path, device_export& x) {
    line_source src(path);
    line_parser parser;
    std::string_view line;
    bool complete = true;
    if (!src.next(line, complete)) throw input_error(path, 0, "empty file (did it change since it was analyzed?)");
    log_event e;
    std::string err;
    while (src.next(line, complete)) {
        if (line.empty()) continue;
        parse_status st = parser.parse(line.data(), line.size(), src.capacity_from(line.data()), e, err);
        if (st != parse_status::ok) {
            if (!complete) break;  // the cut last line the analysis warned about
            bool blank = std::all_of(line.begin(), line.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
            if (blank) continue;
            throw input_error(path, src.line_number(), err + " (the log changed since it was analyzed?)");
        }
        if (!e.known_kind || e.ev == ev_kind::stack) continue;
        if (line_parser::required_members(e) & ~e.present) continue;
        x.apply(e);
    }
    x.finish();
}

}  // namespace

torch_snapshot_summary write_torch_snapshot(const std::string& path, const process_report& rep, pickle_writer& w) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
        throw input_error(path, 0, "--torch-snapshot reads the log a second time: give a regular file, not a pipe");
    torch_snapshot_summary sum;
    int max_dev = -1;
    for (const device_report& d : rep.devices) {
        max_dev = std::max(max_dev, d.dev);
        if (d.dev < 0) sum.host_events = d.n_alloc + d.n_free + d.n_map + d.n_unmap;
    }
    for (const header_device& h : rep.header_devices) max_dev = std::max(max_dev, h.index);
    if (max_dev > k_max_device)
        throw input_error(path, 0, "device " + std::to_string(max_dev) + " is past the " + std::to_string(k_max_device) +
                                       " devices a PyTorch snapshot is written for");

    frame_memo memo;
    std::vector<std::unique_ptr<device_export>> exports;
    w.begin();
    w.begin_dict();
    w.str_memo("device_traces");
    w.begin_list();
    for (int d = 0; d <= max_dev; ++d) {
        bool has = std::any_of(rep.devices.begin(), rep.devices.end(), [&](const device_report& r) { return r.dev == d; });
        w.begin_list();
        if (has) {
            torch_device_summary& ds = sum.devices[d];
            exports.push_back(std::make_unique<device_export>(d, rep, w, memo, ds, sum));
            run_device_pass(path, *exports.back());
        }
        w.end_list();
    }
    w.end_list();
    w.str_memo("segments");
    w.begin_list();
    for (auto& x : exports) x->write_segments();
    w.end_list();
    w.end_dict();
    w.end();
    return sum;
}

}  // namespace gpumem::analysis
