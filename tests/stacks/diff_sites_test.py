# `gpumem diff` by call site, through the real binary: run B is the golden stacks log with one site
# grown (load_weights: +32 MiB), one shrunk (the optimizer's: -8 MiB) and its stack ids 1 and 2
# swapped, so sites can only match by their frames.  From logs, from report JSON, and from a report
# JSON that lists fewer sites than were live (a site missing there is unknown, not 0).
import json
import os
import sys
import tempfile
from stack_checks import check, finish, run_gpumem

gpumem, data = sys.argv[1:3]
MiB = 1 << 20


def run(*args):
    return run_gpumem(gpumem, *args)


def device0(out):
    return out.split("rank 0 dev 1")[0]


a = os.path.join(data, "golden", "stacks.jsonl")
with tempfile.TemporaryDirectory() as d:
    lines = [json.loads(l) for l in open(a)]
    swap = {1: 2, 2: 1}
    for e in lines:
        if e["ev"] == "stack":
            e["id"] = swap.get(e["id"], e["id"])
        if e["ev"] == "alloc" and "stack" in e:
            e["stack"] = swap.get(e["stack"], e["stack"])
        if e.get("ptr") == "0x7f1100000000":  # the second load_weights allocation, never freed
            e["size"] = 96 * MiB
        if e.get("ptr") == "0x7f4000000000":  # Adam._init_group's, alloc and free
            e["size"] = 8 * MiB
        if e["ev"] == "end":
            e["live_bytes"] += 32 * MiB
    b = os.path.join(d, "b.jsonl")
    with open(b, "w") as f:
        f.writelines(json.dumps(e, separators=(",", ":")) + "\n" for e in lines)

    grew = ("    + load_weights (train.py:12) <- <module> (train.py:40)  +32.00 MiB (+25.0%)\n"
            "        A 128.00 MiB in 2 allocations -> B 160.00 MiB in 2 allocations\n")
    shrank = ("    - train_step (train.py:27) <- <module> (train.py:41) (inside Adam._init_group (adam.py:178))  -8.00 MiB (-50.0%)\n"
              "        A 16.00 MiB in 1 allocation -> B 8.00 MiB in 1 allocation\n")
    out = device0(run("diff", a, b))
    check("  call sites at the peak of requested memory: 1 grew, 1 shrank, 6 unchanged\n" + grew + shrank in out,
          f"sites at the peak from logs:\n{out}")
    check("  leaks by call site: 1 grew, 0 shrank, 0 unchanged\n" + grew in out, "leaks by site from logs")
    check("Model.forward" not in out and "make_buffer" not in out, "unchanged sites are not listed")
    # The same run against itself: nothing grew.
    same = device0(run("diff", a, a))
    check("call sites at the peak of requested memory: 0 grew, 0 shrank, 8 unchanged\n" in same, "A against A")

    # Through report JSON: top_sites carry their frames, so the same sites match.
    ja, jb = os.path.join(d, "a.json"), os.path.join(d, "b.json")
    open(ja, "w").write(run("report", "--no-progress", "--json", a))
    open(jb, "w").write(run("report", "--no-progress", "--json", b))
    out_json = device0(run("diff", ja, jb))
    check("1 grew, 1 shrank, 6 unchanged\n" + grew + shrank in out_json, f"sites from report JSON:\n{out_json}")
    out_mixed = device0(run("diff", ja, b))
    check("1 grew, 1 shrank, 6 unchanged\n" + grew + shrank in out_mixed, "report JSON against a log")

    # A report JSON listing only its two largest sites: the optimizer's site is not in it, so its
    # bytes in A are unknown (below the smallest listed), never taken as 0.
    rep = json.load(open(ja))
    dev = rep["processes"][0]["devices"][0]
    dev["top_sites"] = dev["top_sites"][:2]
    jt = os.path.join(d, "a_top2.json")
    json.dump(rep, open(jt, "w"), indent=2)
    out_top = device0(run("diff", jt, jb))
    check("call sites at the peak of requested memory: 1 grew, 0 shrank, 1 unchanged, 6 listed on one side only\n" + grew in out_top,
          f"truncated top_sites:\n{out_top}")
    check("    ? train_step (train.py:27) <- <module> (train.py:41) (inside Adam._init_group (adam.py:178))  ?\n"
          "        A < 32.00 MiB (not listed) -> B 8.00 MiB in 1 allocation\n" in out_top, "an unlisted site is unknown")
    # --top 1: one site, and the count of the rest not shown, the unknown ones among them.
    out_top1 = device0(run("diff", "--top", "1", jt, jb))
    check("6 listed on one side only\n" + grew + "    ... 6 more (--top N)\n  leaks by call site" in out_top1,
          f"truncated top_sites, --top 1:\n{out_top1}")

    # Logs without stacks: no site section.
    plain = os.path.join(data, "golden", "pool_off_basic.jsonl")
    check("call sites" not in run("diff", plain, plain), "no site section without stacks")
    # The same run recorded with GPUMEM_STACKS=off: the sites are only in A.
    nostack = os.path.join(d, "nostack.jsonl")
    with open(nostack, "w") as f:
        for e in (json.loads(l) for l in open(a)):
            if e["ev"] != "stack":
                e.pop("stack", None)
                f.write(json.dumps(e, separators=(",", ":")) + "\n")
    out_off = device0(run("diff", a, nostack))
    check("  call sites at the peak of requested memory: only in A (the other run's log has no stacks, or nothing was live)\n"
          in out_off, f"one side without stacks:\n{out_off}")

# Twelve leak sites, the smallest grown in B: from logs every site live at the end counts (a
# report JSON lists the top 10), so the twelfth is matched and shown as grown, not as unknown.
def leak_log(path, grow_last):
    hdr = json.loads(open(a).readline())
    ev = [hdr]
    seq = 0
    live = 0
    for i in range(12):
        size = (12 - i) * MiB + (MiB if grow_last and i == 11 else 0)
        ev.append({"ev": "stack", "id": i + 1, "frames": [{"function": f"site{i}", "file": "/src/leak.py", "line": 10 + i}]})
        ev.append({"ev": "alloc", "seq": seq, "t": 1000 * (seq + 1), "tid": 7100, "dev": 0, "api": "cudaMalloc",
                   "kind": "device", "ptr": hex(0x7f0000000000 + i * (64 * MiB)), "size": size, "stack": i + 1})
        seq += 1
        live += size
    ev.append({"ev": "end", "seq": seq, "t": 1000 * (seq + 1), "tid": 7100, "reason": "exit", "events": seq,
               "n_alloc": 12, "n_free": 0, "n_fail": 0, "live_allocs": 12, "live_bytes": live, "lost": 0, "unmatched": 0})
    with open(path, "w") as f:
        f.writelines(json.dumps(e, separators=(",", ":")) + "\n" for e in ev)


with tempfile.TemporaryDirectory() as d:
    la, lb = os.path.join(d, "la.jsonl"), os.path.join(d, "lb.jsonl")
    leak_log(la, False)
    leak_log(lb, True)
    out = run("diff", la, lb)
    check("  leaks by call site: 1 grew, 0 shrank, 11 unchanged\n"
          "    + site11 (leak.py:21)  +1.00 MiB (+100.0%)\n"
          "        A 1.00 MiB in 1 allocation -> B 2.00 MiB in 1 allocation\n" in out, f"the twelfth leak site from logs:\n{out}")


# A log whose only stacked allocation is freed before the peak: its sites are all "no stack", yet
# the report has site tables, and a report JSON of it round-trips with them.
with tempfile.TemporaryDirectory() as d:
    lines = [json.loads(l) for l in open(a)]
    log = os.path.join(d, "early.jsonl")
    with open(log, "w") as f:
        for e in lines:
            if e["ev"] == "stack" and e["id"] != 5:
                continue
            if e["ev"] == "alloc" and e.get("stack") != 5:
                e.pop("stack", None)
            f.write(json.dumps(e, separators=(",", ":")) + "\n")
    j1 = run("report", "--no-progress", "--json", log)
    dev = json.loads(j1)["processes"][0]["devices"][0]
    check([s["stack"] for s in dev["top_sites"]] == [0], f"only the no-stack site at the peak: {dev.get('top_sites')}")
    p1 = os.path.join(d, "early.json")
    open(p1, "w").write(j1)
    check(run("report", "--no-progress", "--json", p1) == j1, "a report JSON whose sites are all stack 0 round-trips")

finish()
