# Writes a synthetic gpumem log with many call sites, for timing the reports' call-site views
# (docs/benchmarks.md, "Call-site views"): N allocations from S distinct Python stacks of D frames
# that share their outer frames as a program's do (a tree that branches every 3 levels), half of
# them freed at random, the peak at the end.  Deterministic (seeded).
#
# usage: make_sites_log.py OUT [allocations=200000] [stacks=5000] [depth=30]
import json
import random
import sys

out_path = sys.argv[1]
n, n_stacks, depth = (int(a) for a in (sys.argv[2:] + ["200000", "5000", "30"][len(sys.argv) - 2:])[:3])
random.seed(1)
lines = [json.dumps({"ev": "header", "format": "gpumem-events", "version": 3, "pid": 1,
                     "devices": [{"index": 0, "name": "synthetic", "total": 1 << 50}], "config": {"pool": "off"}})]
defined, live, seq, n_free = set(), [], 0, 0
for i in range(n):
    s = random.randrange(1, n_stacks + 1)
    if s not in defined:
        defined.add(s)
        # Outermost frame last; frame k depends on the stack's id above bit k//3, so stacks share
        # their outer frames and branch (7 ways) every three levels.
        frames = [{"function": f"f{(s >> (k // 3)) % 7}_{k}", "file": f"/src/m{k}.py", "line": (s >> (k // 3)) % 7}
                  for k in range(depth)]
        lines.append(json.dumps({"ev": "stack", "id": s, "frames": frames}, separators=(",", ":")))
    ptr, size = 0x100000000 + i * 0x100000, 4096 * (1 + s % 64)
    lines.append(f'{{"ev":"alloc","seq":{seq},"t":{seq * 10 + 1},"tid":1,"dev":0,"api":"cudaMalloc","kind":"device",'
                 f'"ptr":"{hex(ptr)}","size":{size},"stack":{s}}}')
    seq += 1
    live.append((ptr, size))
    if i % 2:
        q, qs = live.pop(random.randrange(len(live)))
        lines.append(f'{{"ev":"free","seq":{seq},"t":{seq * 10 + 1},"tid":1,"dev":0,"api":"cudaFree","kind":"device",'
                     f'"ptr":"{hex(q)}","size":{qs}}}')
        seq += 1
        n_free += 1
lines.append(json.dumps({"ev": "end", "seq": seq, "t": seq * 10 + 1, "tid": 1, "reason": "exit", "events": seq,
                         "n_alloc": n, "n_free": n_free, "n_fail": 0, "live_allocs": len(live),
                         "live_bytes": sum(s for _, s in live), "lost": 0, "unmatched": 0}))
with open(out_path, "w") as f:
    f.write("\n".join(lines) + "\n")
