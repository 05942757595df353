"""A program that fills the GPU, frees it all, resets the device (cudaDeviceReset) and fills it again.

Without gpumem the second fill gets what the first got.  gpumem's pool keeps freed memory, and its
virtual-memory chunks belong to no context (cuCtxDestroy and a primary context's reset free none
of them), so the pool must give them back when the context ends (docs/pool.md, "Context reset").
The program is the static-cudart one of scripts/gpu-bundle.sh (APP, default
build/gpu/static_cudart_app, mode "reset"); this prints its counts of 1 GiB cudaMalloc per fill
("filled_gib") and whether the second got at least the first's less one ("refill": "full" or
"short") as one JSON object.
Usage: python3 reset_check.py   (exit 1 when the refill is short or the program failed)
"""
import json
import os
import re
import subprocess
import sys

app = os.environ.get("APP", "build/gpu/static_cudart_app")
p = subprocess.run([app, "reset"], capture_output=True, text=True, timeout=240)
m = re.search(r"reset first=(\d+) second=(\d+)", p.stdout)
if p.returncode != 0 or not m:
    print(json.dumps({"error": f"{app} reset: exit {p.returncode}: {p.stderr.strip()[-200:]}"}))
    sys.exit(1)
first, second = int(m.group(1)), int(m.group(2))
refill = "full" if second >= first - 1 else "short"
print(json.dumps({"first": {"filled_gib": first}, "after_reset": {"filled_gib": second, "refill": refill}}))
sys.exit(0 if refill == "full" else 1)
