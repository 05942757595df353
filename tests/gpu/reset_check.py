"""A program that fills the GPU, frees it all, resets the device (cudaDeviceReset) and fills it again.

First it tries cuCtxDestroy on the primary context, which the driver refuses: a 64 MiB block made
before must stay usable ("destroy_primary": the call's answer, then cudaMemset's and a sync's).

Without gpumem the second fill gets what the first got.  gpumem's pool keeps freed memory, and its
virtual-memory chunks belong to no context (cuCtxDestroy and a primary context's reset free none
of them), so the pool must give them back when the context ends (docs/pool.md, "Context reset").
The program is the static-cudart one of scripts/gpu-bundle.sh (APP, default
build/gpu/static_cudart_app, mode "reset"); this prints its counts of 1 GiB cudaMalloc per fill
("filled_gib") and whether the second got what the first did, give or take one ("refill":
"full", "short", or "over": memory served twice) as one JSON object.
Usage: python3 reset_check.py   (exit 1 unless the refill is full)
"""
import json
import os
import re
import subprocess
import sys

app = os.environ.get("APP", "build/gpu/static_cudart_app")
p = subprocess.run([app, "reset"], capture_output=True, text=True, timeout=240)
m = re.search(r"reset first=(\d+) second=(\d+)", p.stdout)
d = re.search(r"destroy_primary=(-?\d+) memset=(-?\d+) sync=(-?\d+)", p.stdout)
if p.returncode != 0 or not m or not d:
    print(json.dumps({"error": f"{app} reset: exit {p.returncode}: {p.stderr.strip()[-200:]}"}))
    sys.exit(1)
first, second = int(m.group(1)), int(m.group(2))
# More than the first got is as wrong as less: memory handed out twice (run 111: 139 then 278 GiB).
refill = "full" if abs(second - first) <= 1 else ("over" if second > first else "short")
destroy = {"rc": int(d.group(1)), "memset_after": int(d.group(2)), "sync_after": int(d.group(3))}
print(json.dumps({"destroy_primary": destroy, "first": {"filled_gib": first},
                  "after_reset": {"filled_gib": second, "refill": refill}}))
sys.exit(0 if refill == "full" else 1)
