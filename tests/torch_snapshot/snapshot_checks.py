# The checks of a PyTorch memory snapshot written by `gpumem report --torch-snapshot` against its log,
# shared by tests/torch_snapshot/torch_snapshot_test.py (here, no torch) and
# tests/gpu/torch_snapshot_check.py (on the GPU machine, with torch's memory_viz): the count of each
# trace action, the frames of each allocation, and a forward replay of the trace that must stay
# consistent (every block inside a live segment, every free of a live block) and end exactly at
# "segments", as memory_viz's viewer, which replays it backwards, needs.
import json
import os
import pickle
from collections import Counter

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def read_log(path):
    lines = [json.loads(l) for l in open(path, encoding="utf-8") if l.strip()]
    stacks = {l["id"]: l["frames"] for l in lines if l.get("ev") == "stack"}
    events = [l for l in lines if l.get("ev") not in ("header", "stack")]
    return lines[0], stacks, events


def torch_frames(frames):
    """A stack record's frames as the export writes them.  A native frame that the analyzer may
    symbolize (its module exists here) is None: any frame matches it."""
    out = []
    for f in frames or []:
        native = "module" in f
        if native and not f.get("function") and os.path.exists(f["module"]):
            out.append(None)
            continue
        name = f.get("function") or (("0x%x" % int(f["address"], 16)) if native else "??")
        out.append({"filename": f.get("file") or f.get("module", ""), "line": f.get("line", 0), "name": name})
    return out


def same_frames(got, want):
    return len(got) == len(want) and all(w is None or g == w for g, w in zip(got, want))


def pieces(base, size, holes):
    """How many mapped pieces a pool segment [base, base+size) with these holes is listed as."""
    cur, n = base, 0
    for hs, hn in sorted(holes):
        n += hs > cur
        cur = max(cur, hs + hn)
    return n + (base + size > cur)


def fill(holes, p, n):
    """The holes after a segment_map of [p, p+n): that range is taken out of them."""
    out = []
    for hs, hn in holes:
        he = hs + hn
        if he <= p or hs >= p + n:
            out.append((hs, hn))
            continue
        if hs < p:
            out.append((hs, p - hs))
        if he > p + n:
            out.append((p + n, he - p - n))
    return out


def expected(header, stacks, events, dev):
    """The trace actions of `dev` by the mapping rules (views/torch_snapshot.cc), counted from the log,
    and the frames of each allocation in order.  free_completed is left to the replay."""
    c = Counter()
    frames = []
    handles, maps, holes, seg_size, arena, seg_ctx = {}, {}, {}, {}, {}, {}
    live_pooled, live_plain = {}, {}  # live_pooled: block -> its segment; live_plain: ptr -> its line
    by_ctx = header.get("alloc_ctx", False)  # a reset ends only its own context's plain allocations
    oom_pending = None
    for e in events:
        ev, d = e["ev"], e.get("dev", -1)
        kind, ptr = e.get("kind"), int(e.get("ptr", "0x0"), 16)
        st = torch_frames(stacks.get(e.get("stack"))) if e.get("stack") in stacks else []
        if ev == "alloc" and kind == "vmm":
            handles[ptr] = (st, d)
        elif ev == "alloc" and d == dev and ptr:
            if e.get("pooled"):
                live_pooled[ptr] = int(e["seg"], 16)
            else:
                live_plain[ptr] = e
            if not e.get("pooled"):
                c["segment_alloc"] += 1
            c["alloc"] += 1
            frames.append((ptr, st))
        elif ev == "free" and d == dev and kind != "vmm" and not e.get("unknown"):
            c["free_requested"] += 1
            live_pooled.pop(ptr, None)
            live_plain.pop(ptr, None)
            if not e.get("pooled"):
                c["free_completed"] += 1
                c["segment_free"] += 1
        elif ev == "map" and (d if d >= 0 else handles.get(int(e["handle"], 16), ([], -1))[1]) == dev:
            maps[ptr] = True
            c["segment_alloc"] += 1
            c["alloc"] += 1
            frames.append((ptr, handles.get(int(e["handle"], 16), ([], -1))[0]))
        elif ev == "unmap" and maps.pop(ptr, None):
            c["free_requested"] += 1
            c["free_completed"] += 1
            c["segment_free"] += 1
        elif ev == "segment_alloc" and d == dev:
            # An arena segment is drawn from what it mapped at first (asize); the rest is a hole.
            mapped = min(e.get("asize", e["size"]), e["size"])
            # An arena is PyTorch's expandable segment: segment_map and segment_unmap only.
            arena[ptr] = mapped < e["size"]
            c["segment_map" if arena[ptr] else "segment_alloc"] += mapped > 0
            holes[ptr] = [(ptr + mapped, e["size"] - mapped)] if mapped < e["size"] else []
            seg_size[ptr] = e["size"]
            seg_ctx[ptr] = e.get("ctx", 0)  # the device's pool it belongs to
        elif ev == "segment_unmap" and d == dev:
            c["segment_unmap"] += 1
            holes[int(e["seg"], 16)].append((ptr, e["size"]))
        elif ev == "segment_map" and d == dev:
            c["segment_map"] += 1
            holes[int(e["seg"], 16)] = fill(holes[int(e["seg"], 16)], ptr, e["size"])
        elif ev == "context_reset" and d == dev:
            # The blocks and segments of its pool ("ctx") end, and its context's allocations outside
            # the pools (with the header's alloc_ctx: those of its "ctx" that name no stream; before
            # it, all of the device's): live blocks are freed first, and each pool segment piece by piece.
            gone = {b for b in holes if seg_ctx[b] == e.get("ctx", 0)}
            dying = [p for p, s in live_pooled.items() if s in gone]
            plain = [p for p, a in live_plain.items()
                     if not by_ctx or ("stream" not in a and a.get("ctx", 0) == e.get("ctx", 0))]
            c["free_requested"] += len(dying) + len(plain)
            c["free_completed"] += len(plain)
            c["segment_free"] += len(plain) + sum(pieces(b, seg_size[b], holes[b]) for b in gone if not arena.get(b))
            c["segment_unmap"] += sum(pieces(b, seg_size[b], holes[b]) for b in gone if arena.get(b))
            for p in dying:
                del live_pooled[p]
            for b in gone:
                holes.pop(b)
                arena.pop(b, None)
            for p in plain:
                del live_plain[p]
        elif ev == "segment_free" and d == dev:
            # One segment_free per mapped piece left between the holes.
            c["segment_unmap" if arena.pop(ptr, False) else "segment_free"] += pieces(ptr, e["size"], holes.pop(ptr, []))
        elif ev == "oom" and d == dev:
            c["oom"] += 1
            oom_pending = e["size"]
        elif ev == "alloc_fail" and d == dev and e.get("err") == 2:
            if oom_pending == e["size"]:
                oom_pending = None
            else:
                c["oom"] += 1
    return c, frames


def replay(trace, where):
    """Applies a device's trace forwards from nothing; returns the segments {addr: size} and blocks
    {addr: (size, free requested)} at the end, failing on any step memory_viz could not draw."""
    segs, blocks = {}, {}

    def seg_of(a, n):
        for s, sz in segs.items():
            if s <= a and a + n <= s + sz:
                return s
        return None

    for i, e in enumerate(trace):
        a, addr, size = e["action"], e.get("addr"), e["size"]
        w = f"{where}: entry {i} {a} 0x{addr or 0:x}+{size}"
        if a == "segment_alloc":
            check(all(addr + size <= s or s + n <= addr for s, n in segs.items()), w + " overlaps a segment")
            segs[addr] = size
        elif a == "segment_free":
            check(segs.get(addr) == size, w + " frees no such segment")
            check(not any(addr <= b < addr + size for b in blocks), w + " frees a segment that holds blocks")
            segs.pop(addr, None)
        elif a == "segment_unmap":
            s = seg_of(addr, size)
            check(s is not None, w + " unmaps outside any segment")
            check(not any(addr <= b < addr + size for b in blocks), w + " unmaps live blocks")
            if s is not None:
                end = s + segs.pop(s)
                if addr > s:
                    segs[s] = addr - s
                if end > addr + size:
                    segs[addr + size] = end - addr - size
        elif a == "segment_map":
            # As memory_viz: a new piece, joined with the pieces it touches (one stream here).
            check(all(addr + size <= s or s + n <= addr for s, n in segs.items()), w + " maps over a segment")
            start, end = addr, addr + size
            before = next((s for s, n in segs.items() if s + n == start), None)
            if before is not None:
                start = before
                segs.pop(before)
            if end in segs:
                end += segs.pop(end)
            segs[start] = end - start
        elif a == "alloc":
            check(seg_of(addr, size) is not None, w + " is in no segment")
            check(not any(b < addr + size and addr < b + n for b, (n, _) in blocks.items()), w + " overlaps a block")
            blocks[addr] = (size, False)
        elif a == "free_requested":
            check(addr in blocks and not blocks[addr][1], w + " of no live block")
            if addr in blocks:
                blocks[addr] = (blocks[addr][0], True)
        elif a == "free_completed":
            check(addr in blocks and blocks[addr] == (size, True), w + " without its free_requested")
            blocks.pop(addr, None)
        elif a == "oom":
            check("device_free" in e and "addr" not in e, w + " oom without device_free")
        else:
            check(False, w + " unknown action")
    return segs, blocks


def check_snapshot(log, snap_path, where, expect_pending=None):
    header, stacks, events = read_log(log)
    with open(snap_path, "rb") as f:
        snap = pickle.load(f)
    check(set(snap) == {"device_traces", "segments"}, f"{where}: top-level keys {set(snap)}")
    devs = sorted({e["dev"] for e in events if e.get("dev", -1) >= 0})
    check(len(snap["device_traces"]) == (max(devs) + 1 if devs else 0), f"{where}: one trace per device")
    for dev in devs:
        trace = snap["device_traces"][dev]
        w = f"{where} dev {dev}"
        want, want_frames = expected(header, stacks, events, dev)
        got = Counter(e["action"] for e in trace)
        for k in set(want) | set(got):
            if k != "free_completed" or not any(e.get("pooled") for e in events):
                check(got[k] == want[k], f"{w}: {k}: {got[k]} entries, the log says {want[k]}")
        check(all(set(e) >= {"action", "size", "stream", "time_us", "frames"} for e in trace), f"{w}: entry keys")
        times = [e["time_us"] for e in trace]
        check(times == sorted(times), f"{w}: time_us in order")
        got_frames = [(e["addr"], e["frames"]) for e in trace if e["action"] == "alloc"]
        check(len(got_frames) == len(want_frames) and
              all(ga == wa and same_frames(gf, wf) for (ga, gf), (wa, wf) in zip(got_frames, want_frames)),
              f"{w}: alloc frames differ from the stack records")
        segs, blocks = replay(trace, w)
        mine = [s for s in snap["segments"] if s["device"] == dev]
        check({s["address"]: s["total_size"] for s in mine} == segs, f"{w}: segments {[(hex(s['address']), s['total_size']) for s in mine]} != replay {segs}")
        got_blocks = {}
        for s in mine:
            cur = s["address"]
            for b in s["blocks"]:
                check(b["address"] == cur, f"{w}: blocks of segment 0x{s['address']:x} do not tile it")
                cur += b["size"]
                check(0 <= b["requested_size"] <= b["size"], f"{w}: requested_size past size")
                if b["state"] != "inactive":
                    # The trace's alloc and free entries carry the requested size, as PyTorch's do.
                    got_blocks[b["address"]] = (b["requested_size"], b["state"] == "active_pending_free")
            check(cur == s["address"] + s["total_size"], f"{w}: blocks sum to total_size")
            act = [b for b in s["blocks"] if b["state"] == "active_allocated"]
            check(s["allocated_size"] == sum(b["size"] for b in act), f"{w}: allocated_size")
            check(s["requested_size"] == sum(b["requested_size"] for b in act), f"{w}: requested_size")
            check(s["segment_pool_id"] == (0, 0) and isinstance(s["is_expandable"], bool), f"{w}: segment keys")
        check(got_blocks == blocks, f"{w}: blocks at the end {got_blocks} != replay {blocks}")
        pend = sum(1 for _, p in blocks.values() if p)
        check(got["free_requested"] - got["free_completed"] == pend, f"{w}: pending blocks = frees not completed")
        if expect_pending is not None:
            check(pend == expect_pending.get(dev, 0), f"{w}: {pend} pending blocks, expected {expect_pending.get(dev, 0)}")
        # Live at the end by the log alone: each allocation not freed (pooled or not) is one active
        # block.  A reset ends its pool's blocks and, as above, its context's plain allocations.
        live, handle_dev, seg_pool = {}, {}, {}
        for e in events:
            if e["ev"] == "segment_alloc":
                seg_pool[int(e["ptr"], 16)] = (e.get("dev", -1), e.get("ctx", 0))
            if e["ev"] == "alloc" and e.get("kind") == "vmm":
                handle_dev[e["ptr"]] = e.get("dev", -1)
            d = e.get("dev", -1)
            if e["ev"] == "map" and d < 0:
                d = handle_dev.get(e["handle"], -1)  # a map is on its handle's device
            if d != dev or e.get("kind") == "vmm":
                continue
            p = int(e.get("ptr", "0x0"), 16)
            if e["ev"] == "alloc" and p:
                live[p] = (e["size"], e)
            elif e["ev"] == "free":
                live.pop(p, None)
            elif e["ev"] == "map":
                live[p] = (e["size"], {"ev": "map"})  # mapped memory outlives contexts (cuMemCreate's)
            elif e["ev"] == "unmap":
                live.pop(p, None)
            elif e["ev"] == "context_reset":
                rc = e.get("ctx", 0)
                by_ctx = header.get("alloc_ctx", False)
                live = {a: (n, x) for a, (n, x) in live.items()
                        if x["ev"] == "map"
                        or (x.get("pooled") and seg_pool.get(int(x["seg"], 16), (dev, 0)) != (dev, rc))
                        or (not x.get("pooled") and by_ctx and ("stream" in x or x.get("ctx", 0) != rc))}
        live = {a: n for a, (n, _) in live.items()}
        check({a: n for a, (n, p) in blocks.items() if not p} == live, f"{w}: active blocks != the log's live allocations")
    return snap
