"""A program that fills the GPU, frees it all, resets the device (cudaDeviceReset) and fills it again; and one that ends its primary context by its last release, three times.

First it tries cuCtxDestroy on the primary context, which the driver refuses: a 64 MiB block made
before must stay usable ("destroy_primary": the call's answer, then cudaMemset's and a sync's).

Without gpumem the second fill gets what the first got.  gpumem's pool keeps freed memory, and its
virtual-memory chunks belong to no context (cuCtxDestroy and a primary context's reset free none
of them), so the pool must give them back when the context ends (docs/pool.md, "Context reset").
The program is the static-cudart one of scripts/gpu-bundle.sh (APP, default
build/gpu/static_cudart_app, mode "reset"); this prints its counts of 1 GiB cudaMalloc per fill
("filled_gib") and whether the second got what the first did, give or take one ("refill":
"full", "short", or "over": memory served twice) as one JSON object.

Then `build/gpu/primary_release fill 3` (PRIMARY_APP): three rounds of cuDevicePrimaryCtxRetain,
fill with 1 GiB cuMemAlloc blocks (each set to its own value and read back), free, and the last
cuDevicePrimaryCtxRelease, which ends the context and frees its memory (H200 run 116; before
gpumem saw it, the pool handed that memory out again under GPUMEM_POOL_VMM=off and the second
round's memset failed).  "after_last_release": each round's count, whether rounds 2-3 got what
round 1 did ("refill"), blocks read back wrong, and the exit status.
Usage: python3 reset_check.py   (exit 1 unless both refills are full)
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

primary_app = os.environ.get("PRIMARY_APP", "build/gpu/primary_release")
q = subprocess.run([primary_app, "fill", "3"], capture_output=True, text=True, timeout=240)
rounds = [(int(n), int(w)) for n, w in re.findall(r"round \d+: (\d+) GiB \(sync -?\d+\), (\d+) blocks read back wrong", q.stdout)]
gib = [n for n, _ in rounds]
if len(gib) < 3:
    release_refill = "failed"
elif all(abs(n - gib[0]) <= 1 for n in gib):
    release_refill = "full"
else:
    release_refill = "over" if max(gib) > gib[0] + 1 else "short"
released = {"filled_gib": gib, "refill": release_refill, "read_back_wrong": sum(w for _, w in rounds),
            "exit": q.returncode}
print(json.dumps({"destroy_primary": destroy, "first": {"filled_gib": first},
                  "after_reset": {"filled_gib": second, "refill": refill}, "after_last_release": released}))
sys.exit(0 if refill == "full" and release_refill == "full" and q.returncode == 0 else 1)
