# Writes a synthetic gpumem log with native stacks for the symbolization benchmark
# (scripts/bench-symbolize.sh): N allocations and frees, each allocation naming one of S stacks of
# depth D, whose frames are return addresses inside the functions of real ELF files (so that libdw
# reads real symbol tables and DWARF line tables), drawn from U unique addresses.
# Usage: gen_native_log.py OUT N S D U [--modules-as PREFIX] MODULE...
# --modules-as: write the module paths with PREFIX put before them (a path that does not exist), so
# the same log is analyzed with nothing to symbolize.
import argparse
import json
import random
import subprocess

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("n", type=int)
ap.add_argument("stacks", type=int)
ap.add_argument("depth", type=int)
ap.add_argument("unique", type=int)
ap.add_argument("modules", nargs="+")
ap.add_argument("--modules-as", default="")
a = ap.parse_args()
rng = random.Random(1)

# Functions with a size, from each module's symbol table (nm --defined-only -S; -D where stripped).
funcs = []
for m in a.modules:
    out = subprocess.run(["nm", "--defined-only", "-S", m], capture_output=True, text=True).stdout
    if "no symbols" in out or not out.strip():
        out = subprocess.run(["nm", "-D", "--defined-only", "-S", m], capture_output=True, text=True).stdout
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 4 and f[2] in "tTwW" and int(f[1], 16) > 4:
            funcs.append((a.modules_as + m, int(f[0], 16), int(f[1], 16)))
addrs = set()
while len(addrs) < a.unique:
    m, start, size = rng.choice(funcs)
    addrs.add((m, start + rng.randrange(1, size)))
addrs = sorted(addrs)
MiB = 1 << 20
with open(a.out, "w") as f:
    hdr = {"ev": "header", "format": "gpumem-events", "version": 3, "pid": 1, "ppid": 0, "host": "bench", "rank": "0",
           "cmdline": ["gen_native_log.py"], "start_unix_ns": 0, "start_time": "1970-01-01T00:00:00Z",
           "devices": [{"index": 0, "name": "bench", "total": 80 << 30}],
           "config": {"pool": "off", "stacks": "native", "stack_depth": a.depth}, "gpumem_version": "bench"}
    f.write(json.dumps(hdr, separators=(",", ":")) + "\n")
    defined = 0
    live = []
    seq = 0
    base = 0x7f0000000000
    for i in range(a.n):
        s = rng.randrange(1, a.stacks + 1) if i >= a.stacks else i + 1  # every stack used at least once
        if s > defined:
            for sid in range(defined + 1, s + 1):
                frames = [{"module": m, "address": hex(x)} for m, x in rng.sample(addrs, a.depth)]
                f.write(json.dumps({"ev": "stack", "id": sid, "frames": frames}, separators=(",", ":")) + "\n")
            defined = s
        ptr = base + i * MiB
        f.write('{"ev":"alloc","seq":%d,"t":%d,"tid":1,"dev":0,"api":"cudaMalloc","kind":"device","ptr":"%s","size":%d,"stack":%d}\n'
                % (seq, seq * 100, hex(ptr), 4096, s))
        seq += 1
        live.append(ptr)
        if len(live) > 1000:
            p = live.pop(rng.randrange(len(live)))
            f.write('{"ev":"free","seq":%d,"t":%d,"tid":1,"dev":0,"api":"cudaFree","kind":"device","ptr":"%s","size":4096}\n'
                    % (seq, seq * 100, hex(p)))
            seq += 1
    f.write('{"ev":"end","seq":%d,"t":%d,"tid":1,"reason":"exit","events":%d}\n' % (seq, seq * 100, seq))
