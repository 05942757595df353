# Checks a PyTorch stacks_workload.py log on the dev machine: `gpumem report --json` must attribute
# each known line's tensor, with its exact bytes, at the peak of requested memory, and name the line
# of its one OOM (1 TiB) as the call that asked for it.
import json
import os
import subprocess
import sys

gpumem, log = sys.argv[1], sys.argv[2]
app = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stacks_workload.py")
MiB = 1 << 20
lines = {}
with open(app) as f:
    for i, text in enumerate(f, 1):
        for m in ("site-weights", "site-buffer", "site-oom"):
            if text.rstrip().endswith("# " + m):
                lines[m] = i
rep = json.loads(subprocess.run([gpumem, "report", "--json", log], capture_output=True, text=True, check=True).stdout)
dev = [d for d in rep["processes"][0]["devices"] if d["dev"] == 0][0]
found = {}
for s in dev.get("top_sites", []):
    for f in s["frames"]:
        if f["file"].endswith("stacks_workload.py"):
            found.setdefault((f["function"], f["line"]), []).append((s["bytes"], s["count"]))
            break
ok = True
for fn, marker, size in (("make_weights", "site-weights", 64 * MiB), ("make_buffer", "site-buffer", 48 * MiB)):
    got = found.get((fn, lines[marker]))
    good = got == [(size, 1)]
    ok &= good
    print(f"{'ok  ' if good else 'FAIL'} {fn} line {lines[marker]}: expected {size} B in 1 allocation, got {got}")
ooms = [o for o in dev.get("ooms", []) if o["size_bytes"] == 1 << 40]
asked = (ooms[0].get("asked_by") or {}).get("frames", []) if len(ooms) == 1 else []
first = next(((f["function"], f["line"]) for f in asked if f["file"].endswith("stacks_workload.py")), None)
good = first == ("ask_too_much", lines["site-oom"])
ok &= good
print(f"{'ok  ' if good else 'FAIL'} OOM of 1 TiB: {len(ooms)} in the report, asked for by {first}, "
      f"expected ('ask_too_much', {lines['site-oom']})")
with_stack = sum(s["bytes"] for s in dev["top_sites"] if s["stack"])
print(f"peak requested {dev['peak_requested_bytes']} B; top sites hold {sum(s['bytes'] for s in dev['top_sites'])} B, "
      f"{with_stack} B with a Python stack")
sys.exit(0 if ok else 1)
