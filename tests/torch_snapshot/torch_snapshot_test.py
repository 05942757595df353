# `gpumem report --torch-snapshot`: logs (from the emulated device when its paths are given, and
# written here to reach every mapping rule) are exported, read back with python3's pickle.load (no
# torch here; tests/gpu/torch_snapshot_check.py runs torch's own memory_viz), and checked against
# the log (snapshot_checks.py: the count of each trace action, each allocation's frames, and a
# forward replay that must end exactly at "segments").
# Also: hostile output names, links and directories refused, an unusable log gives exit 2 with
# file:line.
import json
import os
import pickle
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from snapshot_checks import check, check_snapshot, failures  # noqa: E402

gpumem = sys.argv[1]
lib, driver_dir = (sys.argv[2], sys.argv[3]) if len(sys.argv) > 3 else (None, None)
here = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


def export(log, out, *extra):
    return subprocess.run([gpumem, "report", log, "--torch-snapshot", out, *extra], capture_output=True)


# --- a log written here: every mapping rule --------------------------------------------------------
def write_log(path, body, reuse="safe", devices=2, version=3, alloc_ctx=False):
    hdr = {"ev": "header", "format": "gpumem-events", "version": version, "pid": 7, "ppid": 1, "host": "h", "rank": "0",
           "cmdline": ["x"], "start_unix_ns": 1_000_000_000, "start_time": "1970-01-01T00:00:01Z",
           "devices": [{"index": i, "name": "emu", "total": 80 << 30} for i in range(devices)],
           "config": {"pool": "on", "reuse": reuse}, "gpumem_version": "0"}
    if alloc_ctx:
        hdr["alloc_ctx"] = True
    seq = 0
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(hdr) + "\n")
        for e in body:
            if e["ev"] != "stack":
                e = {"ev": e["ev"], "seq": seq, "t": 1000 * (seq + 1), "tid": 1, **{k: v for k, v in e.items() if k != "ev"}}
                seq += 1
            f.write(json.dumps(e, ensure_ascii=False) + "\n")
        f.write(json.dumps({"ev": "end", "seq": seq, "t": 1000 * (seq + 1), "tid": 1, "reason": "exit"}) + "\n")


def pooled(ev, dev, ptr, size, seg, asize=None, stack=None, stream=None):
    e = {"ev": ev, "dev": dev, "api": "cudaMalloc" if ev == "alloc" else "cudaFree", "kind": "device", "ptr": hex(ptr),
         "size": size, "seg": hex(seg), "pooled": True}
    if asize:
        e["asize"] = asize
    if stream:
        e["stream"] = hex(stream)
    if stack:
        e["stack"] = stack
    return e


def seg(ev, dev, ptr, size, pool="large"):
    return {"ev": ev, "dev": dev, "api": "cudaMalloc", "ptr": hex(ptr), "size": size, "pool": pool}


odd = "f\u00e9\u4e2d \"q\" \\ \n\t\u0001 " + "long" * 80
S0, S1, S2, S3 = 0x10000000, 0x20000000, 0x30000000, 0x60000000
rules = [
    {"ev": "stack", "id": 1, "frames": [{"function": "load", "file": "/src/a \"quoted\".py", "line": 10},
                                        {"function": "<module>", "file": "/src/main.py", "line": 3}]},
    {"ev": "stack", "id": 2, "frames": [{"module": "/nonexistent/libfoo.so", "address": "0x1a2b"},
                                        {"function": odd, "file": "/src/weird\tname \u2603.py", "line": 7}]},
    # A native frame the log names already (file and line from the program's debug info), and an
    # unnamed one of stack 2's module and line: frames are told apart by their names too.
    {"ev": "stack", "id": 3, "frames": [{"module": "/nonexistent/libfoo.so", "address": "0x2c00"},
                                        {"module": "/nonexistent/libbar.so", "address": "0x10", "function": "gemm",
                                         "file": "/src/gemm.cu", "line": 7}]},
    seg("segment_alloc", 0, S0, 20 * MiB),
    pooled("alloc", 0, S0, 1000, S0, asize=1024, stack=1, stream=5),
    pooled("alloc", 0, S0 + 1024, 4096, S0, stack=2),
    pooled("free", 0, S0, 1000, S0, asize=1024),                 # pending (reuse safe) ...
    {"ev": "pool_sync", "dev": 0, "count": 1},                     # ... free_completed here
    pooled("alloc", 0, S0 + 8192, 2 * MiB, S0, stack=1),         # live at the end
    seg("segment_alloc", 0, S1, 8 * MiB),
    {"ev": "segment_unmap", "dev": 0, "api": "cudaMalloc", "ptr": hex(S1 + 2 * MiB), "size": 2 * MiB,
     "seg": hex(S1), "pool": "large"},
    pooled("alloc", 0, S1 + 4 * MiB, MiB, S1),
    pooled("free", 0, S1 + 4 * MiB, MiB, S1),
    {"ev": "pool_sync", "dev": 0, "count": 1},
    seg("segment_free", 0, S1, 8 * MiB),                          # two pieces: two segment_free
    pooled("free", 0, S0 + 1024, 4096, S0),                      # pending at the end
    {"ev": "oom", "dev": 0, "api": "cudaMalloc", "size": 1 << 30, "reserved": 22 * MiB, "allocated": 2 * MiB,
     "requested": 2 * MiB, "largest_free": 18 * MiB, "free_blocks": 1, "segments": 1, "gpu_free": 5 * MiB,
     "gpu_total": 80 << 30},
    {"ev": "alloc_fail", "dev": 0, "api": "cudaMalloc", "kind": "device", "ptr": "0x0", "size": 1 << 30,
     "seg": "0x0", "pooled": True, "err": 2, "stack": 2},          # the same OOM as the line before
    {"ev": "alloc_fail", "dev": 0, "api": "cuMemAllocManaged", "kind": "managed", "ptr": "0x0", "size": 2 << 30,
     "err": 2, "stack": 1, "gpu_free": 7 * MiB, "gpu_total": 80 << 30},  # an OOM of its own
    {"ev": "alloc", "dev": 0, "api": "cuMemAllocManaged", "kind": "managed", "ptr": hex(S2), "size": 3000, "stack": 1},
    {"ev": "alloc", "dev": 0, "api": "cuMemCreate", "kind": "vmm", "ptr": "0x77", "size": 2 * MiB, "stack": 2},
    {"ev": "map", "dev": 0, "api": "cuMemMap", "ptr": "0x40000000", "size": 2 * MiB, "handle": "0x77", "offset": 0},
    {"ev": "unmap", "dev": 0, "api": "cuMemUnmap", "ptr": "0x40000000", "size": 2 * MiB},
    # As recorders before 2026-12-06 wrote a map: dev -1; it is on its handle's device.
    {"ev": "map", "dev": -1, "api": "cuMemMap", "ptr": "0x40000000", "size": 2 * MiB, "handle": "0x77", "offset": 0},
    {"ev": "alloc", "dev": -1, "api": "cuMemHostAlloc", "kind": "host", "ptr": "0x50000000", "size": 4096},
    seg("segment_alloc", 1, S3, 2 * MiB, "small"),
    pooled("alloc", 1, S3, 512, S3, stack=1),                     # its frames: the memo of device 0's
    pooled("free", 1, S3, 512, S3),                               # pending at the end
    {"ev": "alloc", "dev": 0, "api": "cudaMalloc", "kind": "device", "ptr": hex(0x70000000), "size": 4096, "stack": 3},
]
reset = [
    {"ev": "stack", "id": 1, "frames": [{"function": "f", "file": "/a.py", "line": 1}]},
    seg("segment_alloc", 0, S0, 2 * MiB, "small"),
    pooled("alloc", 0, S0, 512, S0, stack=1),
    pooled("alloc", 0, S0 + 512, 512, S0),
    pooled("free", 0, S0 + 512, 512, S0),
    {"ev": "alloc", "dev": 0, "api": "cuMemAllocManaged", "kind": "managed", "ptr": hex(S2), "size": 3000},
    {"ev": "context_reset", "dev": 0, "count": 0},
    seg("segment_alloc", 0, S1, 2 * MiB, "small"),
    pooled("alloc", 0, S1, 1024, S1, stack=1),
]

with tempfile.TemporaryDirectory() as d:
    log = os.path.join(d, "rules.jsonl")
    write_log(log, rules)
    out = os.path.join(d, "rules.pickle")
    r = export(log, out)
    check(r.returncode == 0, f"rules: exit {r.returncode}: {r.stderr.decode(errors='replace')}")
    check(b"1 events of host memory" in r.stderr, f"rules: the host allocation is said to be left out: {r.stderr!r}")
    if r.returncode == 0:
        snap = check_snapshot(log, out, "rules", expect_pending={0: 1, 1: 1})
        t0 = snap["device_traces"][0]
        check([e["action"] for e in t0].count("segment_free") == 3, "rules: an unmapped segment is freed piece by piece")
        check(any(f["name"] == odd for e in t0 for f in e["frames"]), "rules: odd function names pass unchanged")
        check(any(f == {"filename": "/nonexistent/libfoo.so", "line": 0, "name": "0x1a2b"} for e in t0 for f in e["frames"]),
              "rules: an unsymbolized native frame is its module and address")
        check(t0[0]["time_us"] == 1_000_000 + 1, f"rules: time_us is wall-clock µs ({t0[0]['time_us']})")
        check([e["stream"] for e in t0 if e["action"] == "alloc"][0] == 5, "rules: the stream is kept")
        # As PyTorch's trace: an entry of a block carries the requested bytes (1000), not the block's (1024).
        check([e["size"] for e in t0 if e.get("addr") == S0 and e["action"] in ("alloc", "free_requested", "free_completed")][:3] ==
              [1000, 1000, 1000], "rules: trace entries carry the requested size")
        ooms = [e for e in t0 if e["action"] == "oom"]
        check([(e["size"], e["device_free"]) for e in ooms] == [(1 << 30, 5 * MiB), (2 << 30, 7 * MiB)], f"rules: ooms {ooms}")
        # Each OOM carries the failing call's frames: the pool's "oom" line takes them from the
        # alloc_fail after it, a passed-through failure from its own.
        check([[f["name"] for f in e["frames"]] for e in ooms] == [["0x1a2b", odd], ["load", "<module>"]],
              f"rules: the OOMs' frames {[e['frames'] for e in ooms]}")
        # A free carries its allocation's frames, as PyTorch's free entries do: memory_viz shows
        # where a freed block came from.
        alloc_frames, frees_seen = {}, 0
        for e in t0:
            if e["action"] == "alloc":
                alloc_frames[e["addr"]] = e["frames"]
            elif e["action"] in ("free_requested", "free_completed") and e["addr"] in alloc_frames:
                check(e["frames"] == alloc_frames[e["addr"]], f"rules: {e['action']} at {e['addr']:#x} has its allocation's frames")
                frees_seen += bool(e["frames"])
        check(frees_seen >= 4, f"rules: frees with frames checked ({frees_seen})")
        # The segments at the end: each live block, and a segment of one allocation, name its frames.
        names = lambda fr: [f["name"] for f in fr]  # noqa: E731
        blocks = {b["address"]: b for s in snap["segments"] for b in s["blocks"]}
        check(names(blocks[S0 + 8192]["frames"]) == ["load", "<module>"], f"rules: a live pooled block's frames {blocks[S0 + 8192]}")
        whole = [s for s in snap["segments"] if s["address"] == S2]
        check(len(whole) == 1 and names(whole[0]["frames"]) == ["load", "<module>"] and
              names(whole[0]["blocks"][0]["frames"]) == ["load", "<module>"], f"rules: a whole segment's frames {whole}")
        # A native frame the log already names keeps its source file and line, and two unnamed
        # frames of one module are each their own address.
        check(names(blocks[0x70000000]["frames"]) == ["0x2c00", "gemm"] and
              blocks[0x70000000]["frames"][1] == {"filename": "/src/gemm.cu", "line": 7, "name": "gemm"},
              f"rules: native frames {blocks[0x70000000]['frames']}")
        with open(out, "rb") as f:
            raw = f.read()
        check(raw[:2] == b"\x80\x04" and raw.count(odd.encode()) == 1,
              "rules: protocol 4, and a repeated stack's frames are written once (memo)")
        check(oct(os.stat(out).st_mode & 0o777) == "0o600", "rules: the snapshot is created 0600, as the log")

    log = os.path.join(d, "reset.jsonl")
    write_log(log, reset, devices=1)
    r = export(log, os.path.join(d, "reset.pickle"))
    check(r.returncode == 0, f"reset: exit {r.returncode}: {r.stderr.decode(errors='replace')}")
    if r.returncode == 0:
        snap = check_snapshot(log, os.path.join(d, "reset.pickle"), "reset")
        check([(s["address"], len(s["blocks"])) for s in snap["segments"]] == [(S1, 2)], "reset: only the new segment remains")

    # A release by fences completes only the first `count` pending frees, in free order; the rest stay
    # active_pending_free (a synchronize would complete them all).
    fences = [
        seg("segment_alloc", 0, S0, 20 * MiB),
        pooled("alloc", 0, S0, 1024, S0),
        pooled("alloc", 0, S0 + 1024, 1024, S0),
        pooled("alloc", 0, S0 + 2048, 1024, S0),
        pooled("free", 0, S0, 1024, S0),
        pooled("free", 0, S0 + 2048, 1024, S0),
        pooled("free", 0, S0 + 1024, 1024, S0),
        {"ev": "pool_sync", "dev": 0, "count": 2, "fence": True},
    ]
    log = os.path.join(d, "fences.jsonl")
    write_log(log, fences, devices=1)
    r = export(log, os.path.join(d, "fences.pickle"))
    check(r.returncode == 0, f"fences: exit {r.returncode}: {r.stderr.decode(errors='replace')}")
    if r.returncode == 0:
        snap = check_snapshot(log, os.path.join(d, "fences.pickle"), "fences", expect_pending={0: 1})
        done = [e["addr"] for e in snap["device_traces"][0] if e["action"] == "free_completed"]
        check(done == [S0, S0 + 2048], f"fences: the first two frees complete, in free order: {done}")
        pend = [b["address"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_pending_free"]
        check(pend == [S0 + 1024], f"fences: the last free is still pending: {pend}")

    # Two contexts' pools on one device, told apart by "ctx": the second pool's fence completes its
    # own free, not the first pool's older one, and its context's end takes only its own segment
    # and live block.  Read per device, the fence completed S0's free and the reset took both.
    two = [
        seg("segment_alloc", 0, S0, 20 * MiB),
        {**seg("segment_alloc", 0, S1, 20 * MiB), "ctx": 1},
        pooled("alloc", 0, S0, 1024, S0),
        pooled("alloc", 0, S1, 1024, S1),
        pooled("free", 0, S0, 1024, S0),
        pooled("free", 0, S1, 1024, S1),
        {"ev": "pool_sync", "dev": 0, "ctx": 1, "count": 1, "fence": True},
        pooled("alloc", 0, S1, 1024, S1),
        {"ev": "context_reset", "dev": 0, "ctx": 1, "count": 0},
    ]
    log = os.path.join(d, "two.jsonl")
    write_log(log, two, devices=1)
    r = export(log, os.path.join(d, "two.pickle"))
    check(r.returncode == 0, f"two pools: exit {r.returncode}: {r.stderr.decode(errors='replace')}")
    if r.returncode == 0:
        snap = check_snapshot(log, os.path.join(d, "two.pickle"), "two pools", expect_pending={0: 1})
        done = [e["addr"] for e in snap["device_traces"][0] if e["action"] == "free_completed"]
        check(done == [S1, S1], f"two pools: the fence completes pool 1's free, the reset its live block: {done}")
        pend = [b["address"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_pending_free"]
        check(pend == [S0], f"two pools: pool 0's free is still pending: {pend}")
        check([s["address"] for s in snap["segments"]] == [S0], "two pools: pool 0's segment outlives pool 1's reset")

    # Allocations outside the pools with the header's alloc_ctx: a reset of context 1 ends its own
    # (ctx 1) and pool 1's segment, not context 0's nor the stream-ordered one (no context owns it).
    # Before, it ended every allocation of the device outside the pools.
    P0, P1, PS = 0x7000000000, 0x7100000000, 0x7200000000
    plain = [
        seg("segment_alloc", 0, S0, 20 * MiB),
        {**seg("segment_alloc", 0, S1, 20 * MiB), "ctx": 1},
        {"ev": "alloc", "dev": 0, "api": "cuMemAllocManaged", "kind": "managed", "ptr": hex(P0), "size": 4096},
        {"ev": "alloc", "dev": 0, "ctx": 1, "api": "cuMemAllocManaged", "kind": "managed", "ptr": hex(P1), "size": 8192},
        {"ev": "alloc", "dev": 0, "api": "cuMemAllocAsync", "kind": "device", "ptr": hex(PS), "size": 12288, "stream": "0x0"},
        {"ev": "context_reset", "dev": 0, "ctx": 1, "count": 0},
    ]
    for by_ctx in (True, False):
        w = f"plain, alloc_ctx {by_ctx}"
        log = os.path.join(d, f"plain{int(by_ctx)}.jsonl")
        write_log(log, [dict(e) for e in plain], devices=1, alloc_ctx=by_ctx)
        r = export(log, os.path.join(d, f"plain{int(by_ctx)}.pickle"))
        check(r.returncode == 0, f"{w}: exit {r.returncode}: {r.stderr.decode(errors='replace')}")
        if r.returncode == 0:
            snap = check_snapshot(log, os.path.join(d, f"plain{int(by_ctx)}.pickle"), w)
            left = sorted(s["address"] for s in snap["segments"])
            check(left == ([S0, P0, PS] if by_ctx else [S0]), f"{w}: segments left {[hex(a) for a in left]}")

    # Arena segments (log format 4): a segment_alloc that maps only its first asize bytes, grown by
    # segment_map into its hole, a hole unmapped and mapped again, and a segment that mapped nothing
    # at first.  Each map is PyTorch's segment_map, joined to the pieces it touches; at the end the
    # segment is its mapped pieces.
    def chunks(ev, ptr, size, base):
        return {"ev": ev, "dev": 0, "api": "cudaMalloc", "ptr": hex(ptr), "size": size, "seg": hex(base), "pool": "large"}
    arena = [
        dict(seg("segment_alloc", 0, S0, 16 * MiB), asize=4 * MiB),  # [0, 4) mapped of 16 MiB
        pooled("alloc", 0, S0, 3 * MiB, S0),
        chunks("segment_map", S0 + 4 * MiB, 4 * MiB, S0),              # joins [0, 4): one piece [0, 8)
        pooled("alloc", 0, S0 + 3 * MiB, 4 * MiB, S0),
        pooled("free", 0, S0, 3 * MiB, S0),
        chunks("segment_unmap", S0, 2 * MiB, S0),                       # pieces [2, 8)
        chunks("segment_map", S0, 2 * MiB, S0),                         # [0, 8) again
        chunks("segment_map", S0 + 8 * MiB, 2 * MiB, S0),               # [0, 10); [10, 16) stays a hole
        pooled("alloc", 0, S0 + 8 * MiB, MiB, S0),                      # live at the end
        dict(seg("segment_alloc", 0, S1, 8 * MiB), asize=0),           # nothing mapped yet: no segment_alloc
        chunks("segment_map", S1 + 2 * MiB, 2 * MiB, S1),
        seg("segment_free", 0, S1, 8 * MiB),                            # its one piece
    ]
    log = os.path.join(d, "arena.jsonl")
    write_log(log, arena, reuse="immediate", devices=1, version=4)
    out = os.path.join(d, "arena.pickle")
    r = export(log, out)
    check(r.returncode == 0, f"arena: exit {r.returncode}: {r.stderr.decode(errors='replace')}")
    if r.returncode == 0:
        snap = check_snapshot(log, out, "arena")
        t0 = snap["device_traces"][0]
        acts = [(e["action"], e["addr"], e["size"]) for e in t0 if e["action"].startswith("segment")]
        # An arena is PyTorch's expandable segment all through: its first chunks are a segment_map
        # (memory_viz's segment timeline pairs segment_alloc with segment_free only), and its
        # segment_free is a segment_unmap per mapped piece.
        check(acts == [("segment_map", S0, 4 * MiB), ("segment_map", S0 + 4 * MiB, 4 * MiB),
                       ("segment_unmap", S0, 2 * MiB), ("segment_map", S0, 2 * MiB),
                       ("segment_map", S0 + 8 * MiB, 2 * MiB), ("segment_map", S1 + 2 * MiB, 2 * MiB),
                       ("segment_unmap", S1 + 2 * MiB, 2 * MiB)], f"arena: segment actions {acts}")
        check([(s["address"], s["total_size"], s["is_expandable"]) for s in snap["segments"]] == [(S0, 10 * MiB, True)],
              f"arena: the segment is its mapped piece: {[(hex(s['address']), s['total_size']) for s in snap['segments']]}")

    # Hostile output names: written exactly there, nothing else touched.
    log = os.path.join(d, "rules.jsonl")
    for name in ["sp ace.pickle", "new\nline.pickle", "quo'te\".pickle", "-dash.pickle", "bad\udcff.pickle",
                 "x" * 240 + ".pickle"]:
        target = os.path.join(d, "odd", name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        r = export(log, os.fsencode(target))
        check(r.returncode == 0 and os.path.isfile(target), f"odd name {name!r}: exit {r.returncode}")
        if r.returncode == 0:
            with open(target, "rb") as f:
                check("segments" in pickle.load(f), f"odd name {name!r}: reads back")
    left = [n for n in os.listdir(os.path.join(d, "odd")) if n.startswith(".gpumem-out-")]
    check(not left, f"no temporary file is left behind: {left}")
    # An existing file is replaced; FILE is taken as every output takes it (docs/guide.md, the
    # shell's >; tests/cli cli_conventions checks the rule for all four): through a link the file it
    # names is replaced and the link kept, a device is written through, a directory is refused.
    target = os.path.join(d, "target")
    with open(target, "w") as f:
        f.write("old")
    link = os.path.join(d, "link.pickle")
    os.symlink(target, link)
    r = export(log, link)
    check(r.returncode == 0 and open(target, "rb").read(2) == b"\x80\x04" and os.path.islink(link),
          f"through a symbolic link: the file it names is written: {r.returncode} {r.stderr!r}")
    r = export(log, d)
    check(r.returncode == 2 and b"is a directory" in r.stderr, f"a directory is refused: {r.stderr!r}")
    r = export(log, "/dev/null")
    check(r.returncode == 0, f"a device is written through: {r.stderr!r}")
    r = export(log, os.path.join(d, "no", "such", "dir", "x.pickle"))
    check(r.returncode == 2 and b"cannot create" in r.stderr, f"a missing directory: exit 2: {r.stderr!r}")
    existing = os.path.join(d, "existing.pickle")
    with open(existing, "w") as f:
        f.write("old")
    r = export(log, existing)
    check(r.returncode == 0 and open(existing, "rb").read(2) == b"\x80\x04", "an existing regular file is replaced")

    # Unusable inputs: exit 2 naming file:line, and no snapshot written.
    bad = os.path.join(d, "bad.jsonl")
    with open(bad, "w") as f:
        f.write(open(log).readline() + '{"ev":"alloc","seq":0,"t":1,"tid":1,"dev":0,\n')
    out = os.path.join(d, "bad.pickle")
    r = export(bad, out)
    check(r.returncode == 2 and f"{bad}:2:".encode() in r.stderr and not os.path.exists(out),
          f"an unusable log: exit 2 with file:line, no file: {r.returncode} {r.stderr!r}")
    # A pipe: read from the analyzer's spool of it (issue 14 #11), the same snapshot as from the file.
    ref = os.path.join(d, "ref.pickle")
    export(log, ref)
    r = subprocess.run(f"cat '{log}' | '{gpumem}' report /dev/stdin --torch-snapshot '{out}'", shell=True, capture_output=True)
    check(r.returncode == 0 and open(out, "rb").read() == open(ref, "rb").read(), f"a pipe: the file's snapshot: {r.stderr!r}")
    os.remove(out)
    # Two files: one named twice is read once (docs/guide.md), so that would be one log; so would
    # two copies of one log, and bad.jsonl, with the header of rules.jsonl, is a damaged copy of it:
    # the second is another process's log.
    other = os.path.join(d, "other.jsonl")
    with open(other, "w") as f:
        f.write(open(log).readline().replace('"pid": 7,', '"pid": 8,'))
    r = export(log, out, other)
    check(r.returncode == 2 and b"exactly one log" in r.stderr, f"two logs: exit 2: {r.stderr!r}")
    rj = subprocess.run([gpumem, "report", "--json", log], capture_output=True)
    js = os.path.join(d, "rep.json")
    with open(js, "wb") as f:
        f.write(rj.stdout)
    r = export(js, out)
    check(r.returncode == 2 and b"needs the event log" in r.stderr, f"a report JSON: exit 2: {r.stderr!r}")

    # Real logs from the emulated device: pool off, pool with immediate reuse, pool with safe reuse.
    if lib:
        app = os.path.join(here, "..", "stacks", "python_alloc_app.py")
        for name, env in (("pool-off", {"GPUMEM_POOL": "off"}), ("pool-auto", {"GPUMEM_POOL": "on"}),
                          ("pool-safe", {"GPUMEM_POOL": "on", "GPUMEM_REUSE": "safe"})):
            env = dict(os.environ, LD_PRELOAD=lib, LD_LIBRARY_PATH=driver_dir, GPUMEM_OUT=os.path.join(d, name + "-%p.jsonl"), **env)
            r = subprocess.run([sys.executable, app], env=env, capture_output=True, text=True)
            check(r.returncode == 0, f"{name}: app ran: {r.stderr}")
            logs = [os.path.join(d, f) for f in os.listdir(d) if f.startswith(name + "-")]
            check(len(logs) == 1, f"{name}: one log")
            if len(logs) != 1:
                continue
            out = os.path.join(d, name + ".pickle")
            r = export(logs[0], out)
            check(r.returncode == 0, f"{name}: exit {r.returncode}: {r.stderr}")
            if r.returncode == 0:
                snap = check_snapshot(logs[0], out, name)
                allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
                check(len(allocs) == 5 and any(f["name"] == "load_weights" for e in allocs for f in e["frames"]),
                      f"{name}: five allocations, load_weights among their frames")

if failures:
    print(f"{len(failures)} failed")
    sys.exit(1)
print("ok")
