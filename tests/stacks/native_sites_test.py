# End to end, native frames: a C++ program on the emulated device with GPUMEM_STACKS=native; the
# report must name, through libdw, the function, file and line of each allocation call, and of the
# call that ran out of memory (its OOM's "asked_by"), with the pool (a refusal) and without (the
# driver's error passed through).
import json
import os
import subprocess
import sys
import tempfile

gpumem, lib, driver_dir, app = sys.argv[1:5]
src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "emu", "emu_app.cc")
source = open(src).read().splitlines()
failures = []
n_sites = 0
for pool in ("on", "off"):
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, LD_PRELOAD=lib, LD_LIBRARY_PATH=driver_dir, GPUMEM_STACKS="native", GPUMEM_POOL=pool,
                   GPUMEM_OUT=os.path.join(d, "log-%p.jsonl"))
        subprocess.run([app, "basic"], env=env, capture_output=True, check=True)
        log = [os.path.join(d, f) for f in os.listdir(d)][0]
        rep = json.loads(subprocess.run([gpumem, "report", "--json", log], capture_output=True, text=True, check=True).stdout)
        devices = rep["processes"][0]["devices"]
        sites = [s for dv in devices for s in dv["top_sites"]]
        n_sites += len(sites)
        if not sites:
            failures.append(f"pool {pool}: no top_sites")
        for s in sites:
            f = s["frames"][0] if s["frames"] else {}
            where = f"{f.get('function')} {f.get('file')}:{f.get('line')}"
            if "basic_driver" not in f.get("function", "") or not f.get("file", "").endswith("emu_app.cc"):
                failures.append(f"pool {pool}: {s['bytes']} B: innermost frame {where}, expected basic_driver in emu_app.cc")
                continue
            text = source[f["line"] - 1] if 0 < f["line"] <= len(source) else ""
            if "alloc" not in text:
                failures.append(f"pool {pool}: {s['bytes']} B: line {f['line']} is not an allocation call: {text.strip()}")
            if not f.get("module", "").endswith("emu_driver_app") or not f.get("address", "").startswith("0x"):
                failures.append(f"pool {pool}: {s['bytes']} B: module/address missing: {f}")
            if len(s["frames"]) < 2 or s["frames"][1]["function"] != "main":
                failures.append(f"pool {pool}: {s['bytes']} B: caller is not main: {s['frames'][1:2]}")
        # The scenario's one OOM (1 PiB): the line that asked is its own, not an allocation's site.
        ooms = [o for dv in devices for o in dv["ooms"]]
        if len(ooms) != 1:
            failures.append(f"pool {pool}: {len(ooms)} OOMs, expected 1")
            continue
        asked = ooms[0].get("asked_by") or {"frames": []}
        f = asked["frames"][0] if asked["frames"] else {}
        text = source[f["line"] - 1] if 0 < f.get("line", 0) <= len(source) else ""
        if "basic_driver" not in f.get("function", "") or "too_big" not in text:
            failures.append(f"pool {pool}: the OOM was asked for by {f}, line {text.strip()!r}, expected the too_big line")
        out = subprocess.run([gpumem, "report", log], capture_output=True, text=True, check=True).stdout
        if not any(l.startswith("    asked for by ") and "basic_driver" in l and "emu_app.cc:" in l for l in out.splitlines()):
            failures.append(f"pool {pool}: the text report does not name the OOM's call")
for f in failures:
    print("FAIL:", f)
print(f"{len(failures)} failed" if failures else f"ok: {n_sites} sites named")
sys.exit(1 if failures else 0)
