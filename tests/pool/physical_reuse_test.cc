// Random programs on the fake device's work clock with ordered releases in batches, stitching, captures, streams made mid-run, memory pressure and exit, checked at the physical level.
//
// A spying backend follows every chunk handle through its first mapping and any stitched second
// mapping; after each step: no block overlaps a live block's physical memory, every kernel on a
// reused block is ordered after all earlier kernels on the same bytes, no chunk is released or
// unmapped under unfinished work or a live block, no backend call after exit, the OOM bound in
// chunks, validate(), and the layout rebuilt from the log alone equals the pool's.  (Written by
// a review of ordered releases in batches, 2026-12-05; 380 programs, none failed.)
#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>
#include <cstdio>
#include <cstdlib>

#include "layout_replayer.h"
#include "pool_test_util.h"

using namespace gpumem;
using namespace gpumem::test;

namespace {

struct piece {
    uint64_t handle, lo, hi;  // handle 0: a cuMemAlloc segment, lo/hi absolute addresses
};

struct work {
    uint64_t va, size, stream, ticket;
    std::vector<piece> ph;
};

bool overlap(const std::vector<piece>& a, const std::vector<piece>& b) {
    for (const piece& x : a)
        for (const piece& y : b)
            if (x.handle == y.handle && x.lo < y.hi && y.lo < x.hi) return true;
    return false;
}

struct model;

// Forwards to a fake_backend, keeps the VA -> handle map of every mapping (first or second), and
// checks each unmap against the model's work: no chunk released / no range unmapped under work
// not done or under a live block; no call at all after exit.
struct spy final : pool_backend {
    fake_backend& d;
    model* m = nullptr;
    bool exited = false;
    std::vector<std::string> violations;
    std::map<uint64_t, std::pair<uint64_t, uint64_t>> va2h;  // mapping start -> handle, bytes
    explicit spy(fake_backend& dev) : d(dev) {}
    std::vector<std::string> trace;
    void after_exit(const char* what) {
        if (exited) violations.push_back(std::string("backend call after exit: ") + what);
        if (trace.size() > 40) trace.erase(trace.begin());
        trace.push_back(std::string(what) + (d.may_synchronize_again() ? "" : "[capt]") + " bad=" + std::to_string(d.bad_calls()));
    }
    std::vector<piece> phys(uint64_t a, uint64_t n) const {
        std::vector<piece> r;
        uint64_t x = a, end = a + n;
        while (x < end) {
            auto it = va2h.upper_bound(x);
            if (it != va2h.begin()) {
                --it;
                const uint64_t s = it->first, sz = it->second.second;
                if (x < s + sz) {
                    const uint64_t e = std::min(end, s + sz);
                    r.push_back({it->second.first, x - s, e - s});
                    x = e;
                    continue;
                }
            }
            // Not a mapping: a cuMemAlloc segment (or a bug); by address up to the next mapping.
            auto nx = va2h.upper_bound(x);
            const uint64_t e = nx == va2h.end() ? end : std::min(end, nx->first);
            r.push_back({0, x, e});
            x = e;
        }
        return r;
    }
    void check_release(const std::vector<piece>& gone, const char* what);  // after model
    void check_unmap_va(uint64_t a, uint64_t n, const char* what);

    int segment_alloc(uint64_t bytes, uint64_t* base) noexcept override { after_exit("segment_alloc"); return d.segment_alloc(bytes, base); }
    int segment_free(uint64_t base) noexcept override { after_exit("segment_free"); return d.segment_free(base); }
    int synchronize() noexcept override { after_exit("synchronize"); return d.synchronize(); }
    bool may_synchronize() noexcept override { after_exit("may_synchronize"); return d.may_synchronize(); }
    bool may_synchronize_again() noexcept override { after_exit("may_synchronize_again"); return d.may_synchronize_again(); }
    void mem_info(uint64_t* f, uint64_t* t) noexcept override { after_exit("mem_info"); d.mem_info(f, t); }
    uint64_t vmm_granularity() noexcept override { return d.vmm_granularity(); }
    int va_reserve(uint64_t bytes, uint64_t* base) noexcept override { after_exit("va_reserve"); return d.va_reserve(bytes, base); }
    int va_free(uint64_t base, uint64_t bytes) noexcept override { after_exit("va_free"); return d.va_free(base, bytes); }
    int map_chunks(uint64_t addr, uint64_t chunk, size_t n, uint64_t* handles) noexcept override {
        after_exit("map_chunks");
        const int rc = d.map_chunks(addr, chunk, n, handles);
        if (rc == k_cuda_success)
            for (size_t i = 0; i < n; ++i) va2h[addr + i * chunk] = {handles[i], chunk};
        return rc;
    }
    int unmap_chunks(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept override;
    int map_alias(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept override {
        after_exit("map_alias");
        const int rc = d.map_alias(addr, chunk, n, handles);
        if (rc == k_cuda_success)
            for (size_t i = 0; i < n; ++i) va2h[addr + i * chunk] = {handles[i], chunk};
        return rc;
    }
    int unmap_alias(uint64_t addr, uint64_t chunk, size_t n) noexcept override;
    int event_create(uint64_t* ev) noexcept override { after_exit("event_create"); return d.event_create(ev); }
    int event_record(uint64_t ev, uint64_t st) noexcept override { after_exit("event_record"); return d.event_record(ev, st); }
    int event_query(uint64_t ev) noexcept override { after_exit("event_query"); return d.event_query(ev); }
    int event_synchronize(uint64_t ev) noexcept override { after_exit("event_synchronize"); return d.event_synchronize(ev); }
    int stream_query(uint64_t st) noexcept override { after_exit("stream_query"); return d.stream_query(st); }
    int stream_wait_event(uint64_t st, uint64_t ev) noexcept override { after_exit("stream_wait_event"); return d.stream_wait_event(st, ev); }
};

struct live_b {
    uint64_t size;
    std::vector<piece> ph;
    std::vector<work> kernels;
};

struct model {
    fake_backend* dev = nullptr;
    std::map<uint64_t, live_b> live;
    std::vector<work> earlier;  // kernels of freed blocks, not yet done
    void prune() {
        const uint64_t done = dev->completed();
        earlier.erase(std::remove_if(earlier.begin(), earlier.end(), [&](const work& w) { return w.ticket <= done; }), earlier.end());
    }
};

void spy::check_release(const std::vector<piece>& gone, const char* what) {
    const uint64_t done = d.completed();
    for (const work& w : m->earlier)
        if (w.ticket > done && overlap(w.ph, gone)) {
            std::ostringstream o;
            o << what << " releases memory under a freed block's kernel not done (ticket " << w.ticket << " done " << done
              << " va " << std::hex << w.va << ")";
            violations.push_back(o.str());
        }
    for (const auto& [p, b] : m->live)
        if (overlap(b.ph, gone)) {
            std::ostringstream o;
            o << what << " releases memory of the live block " << std::hex << p;
            violations.push_back(o.str());
        }
}

void spy::check_unmap_va(uint64_t a, uint64_t n, const char* what) {
    const uint64_t done = d.completed();
    for (const work& w : m->earlier)
        if (w.ticket > done && w.va < a + n && a < w.va + w.size) {
            std::ostringstream o;
            o << what << " unmaps " << std::hex << a << "+" << n << " under a kernel not done (va " << w.va << std::dec
              << " ticket " << w.ticket << " done " << done << ")";
            violations.push_back(o.str());
        }
    for (const auto& [p, b] : m->live)
        if (p < a + n && a < p + b.size) {
            std::ostringstream o;
            o << what << " unmaps the live block " << std::hex << p;
            violations.push_back(o.str());
        }
}

int spy::unmap_chunks(uint64_t addr, uint64_t chunk, size_t n, const uint64_t* handles) noexcept {
    after_exit("unmap_chunks");
    std::vector<piece> gone;
    for (size_t i = 0; i < n; ++i) gone.push_back({handles[i], 0, chunk});
    check_release(gone, "unmap_chunks");
    check_unmap_va(addr, n * chunk, "unmap_chunks");
    const int rc = d.unmap_chunks(addr, chunk, n, handles);
    for (size_t i = 0; i < n; ++i) va2h.erase(addr + i * chunk);
    return rc;
}

int spy::unmap_alias(uint64_t addr, uint64_t chunk, size_t n) noexcept {
    after_exit("unmap_alias");
    check_unmap_va(addr, n * chunk, "unmap_alias");
    const int rc = d.unmap_alias(addr, chunk, n);
    if (rc == k_cuda_success)
        for (size_t i = 0; i < n; ++i) va2h.erase(addr + i * chunk);
    return rc;
}


struct run_opts {
    uint64_t order_batch = 32 * MiB;
    bool stitch = false;
    bool side_stream = true;
    uint64_t headroom = 256 * MiB;
    uint64_t capacity = 192 * MiB;
    bool beside_busy = true;
    int exit_at = -1;
    bool captures = true;
    bool check_log = true;
    bool check_oom = true;
    int ops = 4000;
    bool arenas = true;
    uint64_t pool_chunk = 0;
    uint64_t trim = 0;
    bool wait_any = false;
    int switch_at = -1;  // auto: a stream appears then
    uint32_t stitch_keep = 2;
    bool faults = false;
};

// Returns a description of the first failure, or "".
std::string run_review(uint64_t seed, const run_opts& o) {
    std::mt19937_64 rng(seed);
    fake_backend dev(o.capacity);
    dev.set_vmm(2 * MiB);
    dev.enable_events(true);
    dev.set_auto_complete(false);
    spy sp(dev);
    model md;
    md.dev = &dev;
    sp.m = &md;
    recording_sink sink;
    stream_set streams;
    pool_config cfg = safe_config();
    cfg.vmm = true;
    cfg.order = true;
    cfg.order_beside_busy = o.beside_busy;
    cfg.order_batch = o.order_batch;
    cfg.stitch = o.stitch;
    cfg.headroom = o.headroom;
    cfg.sync_budget = 16 * MiB;
    cfg.fence_batch = 1 + seed % 4;
    cfg.arenas = o.arenas;
    cfg.chunk = o.pool_chunk;
    cfg.trim = o.trim;
    cfg.wait_any = o.wait_any;
    cfg.stitch_keep = o.stitch_keep;
    if (o.switch_at >= 0) cfg.reuse = reuse_mode::automatic;
    block_pool pool(cfg, sp, &sink, 0);
    const uint64_t ctx = 1;
    std::vector<uint64_t> sts = {k_stream_legacy, 0x5100};
    streams.created(ctx, 0x5100, false);
    dev.set_blocking(0x5100);
    if (o.side_stream) {
        streams.created(ctx, 0x5000, true);
        sts.push_back(0x5000);
    }
    pool.set_streams(&streams, ctx);
    layout_replayer rp;
    rp.immediate = o.switch_at >= 0;
    bool capturing = false, exited = false;
    uint64_t target = o.capacity / 2;
    const uint64_t sizes[] = {512, 4096, 100000, 700 * KiB, MiB, 1536 * KiB, 3 * MiB, 5 * MiB, 9 * MiB, 11 * MiB, 21 * MiB, 40 * MiB};
    auto fail = [&](int op, const std::string& what) {
        std::ostringstream s;
        s << "seed " << seed << " op " << op << ": " << what;
        return s.str();
    };
    auto kernel = [&](int op, uint64_t p, live_b& b, uint64_t st) -> std::string {
        for (const work& w : md.earlier)
            if (overlap(w.ph, b.ph) && !dev.ordered_after(st, w.stream, w.ticket)) {
                std::ostringstream s;
                s << "block " << std::hex << p << " used on stream " << st << " before freed kernel at va " << w.va
                  << " on stream " << w.stream << std::dec << " ticket " << w.ticket << " (done " << dev.completed() << ")";
                return fail(op, s.str());
            }
        b.kernels.push_back({p, b.size, st, dev.enqueue_work_on(st), b.ph});
        return "";
    };
    auto pick = [&](int op) { return o.switch_at > op ? k_stream_legacy : sts[rng() % sts.size()]; };
    for (int op = 0; op < o.ops; ++op) {
        if (op == o.switch_at) pool.enter_safe_reuse(api_id::cuStreamCreate);
        if (op == o.exit_at) {
            pool.release_all_at_exit();
            sp.exited = exited = true;
        }
        md.prune();
        if (op % 500 == 0) target = o.capacity / 100 * (20 + rng() % 80);
        uint64_t live_bytes = 0;
        for (const auto& [q, lb] : md.live) live_bytes += lb.size;
        int r = int(rng() % 100);
        if (r < 42 && live_bytes > target && !md.live.empty()) r = 70;  // free instead
        if (r < 42 || md.live.empty()) {
            uint64_t sz = sizes[rng() % (sizeof sizes / sizeof *sizes)];
            if (rng() % 3 == 0) sz += rng() % (512 * KiB);
            const int fault = int(rng() % 40);
            if (!exited && fault == 0) dev.fail_next_allocs(1, 801);
            uint64_t p = 0;
            const int rc = pool.allocate(sz, api_id::cuMemAlloc_v2, &p);
            dev.fail_next_allocs(0);
            if (rc == k_cuda_success) {
                block_pool::block_info bi{};
                if (!pool.lookup(p, &bi) || bi.block != p) return fail(op, "lookup");
                live_b b{sz, sp.phys(p, sz), {}};
                for (const auto& [q, lb] : md.live)
                    if (overlap(lb.ph, b.ph)) {
                        std::ostringstream s;
                        s << "block " << std::hex << p << "+" << sz << " overlaps live block " << q << " physically";
                        return fail(op, s.str());
                    }
                auto& ins = md.live[p] = b;
                if (!capturing && !exited) {
                    // before auto's switch only the legacy stream runs work
                    std::string e = kernel(op, p, ins, pick(op));
                    if (!e.empty()) return e;
                }
            } else if (rc == k_cuda_oom && !capturing && !exited && o.check_oom) {
                std::set<uint64_t> handles;
                uint64_t plain = 0;
                std::set<uint64_t> plain_segs;
                for (const auto& [q, lb] : md.live) {
                    for (const piece& x : lb.ph) {
                        if (x.handle) {
                            handles.insert(x.handle);
                        } else {
                            block_pool::block_info bi{};
                            if (pool.lookup(q, &bi) && plain_segs.insert(bi.segment).second) plain += bi.segment_size;
                        }
                    }
                }
                const uint64_t c = pool.chunk_size();
                const uint64_t held = handles.size() * c + plain;
                const uint64_t asz = (sz + 511) / 512 * 512;
                if (held + (asz + c - 1) / c * c <= o.capacity) {
                    std::ostringstream s;
                    s << "OOM for " << sz << " with " << held / MiB << " MiB held by live requests of " << o.capacity / MiB
                      << " MiB; pending " << pool.pending_bytes() << " reserved " << pool.snapshot().reserved << " in_use "
                      << dev.in_use();
                    return fail(op, s.str());
                }
            }
        } else if (r < 62) {
            // a kernel on a live block
            if (capturing || exited) continue;
            auto it = md.live.begin();
            std::advance(it, rng() % md.live.size());
            std::string e = kernel(op, it->first, it->second, pick(op));
            if (!e.empty()) return e;
        } else if (r < 85) {
            auto it = md.live.begin();
            std::advance(it, rng() % md.live.size());
            const uint64_t p = it->first;
            if (!capturing && !exited && rng() % 2) {
                std::string e = kernel(op, p, it->second, pick(op));
                if (!e.empty()) return e;
            }
            for (work& w : it->second.kernels) md.earlier.push_back(w);
            md.live.erase(it);
            int rc = -1;
            if (!pool.deallocate(p, api_id::cuMemFree_v2, &rc) || rc != k_cuda_success) return fail(op, "free refused");
        } else if (r < 90) {
            if (!exited) {
                const uint64_t last = dev.last_ticket();
                if (last) dev.complete_through(dev.completed() + rng() % (last - dev.completed() + 1));
            }
        } else if (r < 92) {
            if (!exited) dev.complete_all();
        } else if (r < 95) {
            if (!o.captures || exited) continue;
            if (!capturing) {
                pool.release_before_capture();  // the capture hook, before the driver opens it
                capturing = true;
                dev.set_capturing(true);
            } else {
                if (rng() % 3 == 0) pool.release_before_capture();  // a second capture opens meanwhile
                capturing = false;
                dev.set_capturing(false);
            }
        } else if (r < 96) {
            if (capturing || exited || sts.size() > 10 || op < o.switch_at) continue;
            const uint64_t made = 0x7000 + sts.size() * 0x10;
            streams.created(ctx, made, true);
            pool.order_new_stream(made);
            sts.push_back(made);
        } else if (r < 97) {
            if (o.faults && !exited) {
                const int f = int(rng() % 6);
                if (f == 0) dev.fail_next_records(1);
                if (f == 1) dev.fail_next_stream_waits(1);
                if (f == 2 && !capturing && sts.size() > 3) {  // a non-blocking stream made mid-run is destroyed
                    const uint64_t gone = sts.back();
                    sts.pop_back();
                    streams.destroyed(ctx, gone);
                }
                if (f == 3) {  // a capture no hook saw, briefly
                    dev.set_capturing_unseen(true);
                    uint64_t q = 0;
                    const uint64_t qs = 1 + rng() % (4 * MiB);
                    if (pool.allocate(qs, api_id::cuMemAlloc_v2, &q) == k_cuda_success) {
                        md.live[q] = live_b{qs, sp.phys(q, qs), {}};
                    }
                    dev.set_capturing_unseen(false);
                }
                if (f == 4) pool.order_settle();
                (void)f;
            }
            pool.release_cached();
            dev.capture_after_asks(-1);
            if (!capturing) dev.set_capturing(false);
        } else if (r < 98) {
            pool.give_back(api_id::cuMemAlloc_v2);
        } else {
            pool.make_headroom(api_id::cuMemAlloc_v2);
        }
        std::string why;
        if (!pool.validate(&why)) return fail(op, "validate: " + why);
        if (!sp.violations.empty()) return fail(op, sp.violations.front());
        if (dev.bad_calls() != 0) {
            std::string t;
            for (auto& x : sp.trace) t += x + "; ";
            return fail(op, "bad backend call, last calls: " + t + " last op r=" + std::to_string(r));
        }
        if (!exited && pool.snapshot().reserved != dev.in_use()) return fail(op, "reserved != device in_use");
        if (o.check_log) {
            rp.catch_up(sink);
            if (!rp.error.empty()) return fail(op, "log: " + rp.error);
            const pool_state rs = rp.state(), s = pool.snapshot();
            if (rs.reserved != s.reserved || rs.allocated != s.allocated || rs.segments != s.segments ||
                rs.free_blocks != s.free_blocks || rs.largest_free != s.largest_free) {
                std::ostringstream m;
                m << "log rebuild differs: reserved " << rs.reserved << "/" << s.reserved << " allocated " << rs.allocated << "/"
                  << s.allocated << " segments " << rs.segments << "/" << s.segments << " free blocks " << rs.free_blocks << "/"
                  << s.free_blocks << " largest " << rs.largest_free << "/" << s.largest_free;
                return fail(op, m.str());
            }
        }
    }
    if (getenv("REVIEW_STATS")) {
        uint64_t made = 0;
        pool.stitch_counts(&made, nullptr, nullptr);
        fprintf(stderr, "seed %llu: ordered %llu ooms %zu unmaps %zu syncs %zu stitches %llu order_off %d pending %llu reserved %llu events %zu\n",
                (unsigned long long)seed, (unsigned long long)pool.ordered_releases(), sink.count(ev_kind::oom),
                sink.count(ev_kind::segment_unmap), sink.count(ev_kind::pool_sync), (unsigned long long)made,
                int(pool.order_stopped()), (unsigned long long)pool.pending_bytes(),
                (unsigned long long)pool.snapshot().reserved, sink.events.size());
    }
    return "";
}

}  // namespace

// Runs seeds [from, to] with the options opts(seed) gives, and fails with the first eight
// programs' findings (each with its seed and options).
template <class F>
void check_seeds(uint64_t from, uint64_t to, F&& opts) {
    int fails = 0;
    for (uint64_t seed = from; seed <= to; ++seed) {
        run_opts o;
        // The common mix: batches of 32 MiB, 4 MiB and none; a side stream or not; headroom or not.
        o.order_batch = seed % 3 == 0 ? 0 : seed % 3 == 1 ? 32 * MiB : 4 * MiB;
        o.side_stream = seed % 2;
        o.headroom = (seed / 2) % 2 ? 0 : 256 * MiB;
        opts(seed, o);
        const std::string e = run_review(seed, o);
        if (!e.empty() && fails++ < 8) {
            INFO(e << " (seed " << seed << ", batch " << o.order_batch << ", side " << o.side_stream << ", headroom "
                   << o.headroom << ", stitch " << o.stitch << ")");
            CHECK(e.empty());
        }
    }
    CHECK(fails == 0);
}

TEST_CASE("physical reuse: ordered releases in batches keep physical reuse and unmap safety and the log and the OOM bound", "[pool][physical]") {
    check_seeds(1, 60, [](uint64_t, run_opts&) {});
}

TEST_CASE("physical reuse: the same with stitching", "[pool][physical]") {
    check_seeds(101, 160, [](uint64_t, run_opts& o) { o.stitch = true; });
}

TEST_CASE("physical reuse: exit in the middle of pending batches makes no backend call", "[pool][physical]") {
    check_seeds(201, 240, [](uint64_t seed, run_opts& o) {
        o = run_opts{};  // the defaults here, not the common mix
        o.stitch = seed % 2;
        o.exit_at = 300 + int(seed * 37 % 1500);
        o.ops = o.exit_at + 200;
    });
}

TEST_CASE("physical reuse: other settings (waits after ordered release stops, no arenas, larger chunks, trim, auto switch)", "[pool][physical]") {
    check_seeds(301, 420, [](uint64_t seed, run_opts& o) {
        const int v = int(seed % 8);
        o.beside_busy = v != 0;
        o.arenas = v != 1;
        o.pool_chunk = v == 2 ? 6 * MiB : v == 3 ? 4 * MiB : 0;
        o.trim = v == 4 ? 8 * MiB : 0;
        o.wait_any = v == 5;
        o.stitch = v == 3 || v == 6 || v == 7;
        o.stitch_keep = v == 6 ? 0 : 2;
        if (v == 7) o.switch_at = 500;
    });
}

TEST_CASE("physical reuse: with driver refusals, destroyed streams and unseen captures", "[pool][physical]") {
    check_seeds(501, 600, [](uint64_t seed, run_opts& o) {
        o.faults = true;
        o.stitch = seed % 4 < 2;
        o.captures = true;
    });
}
