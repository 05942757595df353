#!/usr/bin/env python3
"""What tests/gpu/pool_bench.py checks of its settings before any GPU work, run without a GPU (ctest)."""
import os
import subprocess
import sys
import tempfile

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pool_bench.py")
fails = []


def bench(tf, parts):
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, POOL_BENCH_TF=tf, POOL_BENCH_PARTS=parts, POOL_BENCH_MODES="native",
                   POOL_BENCH_LOGS=os.path.join(d, "logs"))
        return subprocess.run([sys.executable, BENCH, os.path.join(d, "out"), "1"], env=env,
                              capture_output=True, text=True, timeout=60)


# A POOL_BENCH_TF that is no shape is refused before any part runs: it ran every mode of (b), each
# failing, and then, with the other parts' results (minutes of GPU time), died in a traceback while
# writing the report, whose (b) heading names the shape even when (b) did not run.
for tf, parts in (("8,768,x", "b"), ("8,768,", "b"), ("8,768", "b"), ("8,770,16384", "b"), ("8,768,x", "c")):
    r = bench(tf, parts)
    out = r.stdout + r.stderr
    if r.returncode != 2 or f"POOL_BENCH_TF={tf}: expected LAYERS,EMBD,TOKENS" not in out or "Traceback" in out or "== " in r.stdout:
        fails.append(f"POOL_BENCH_TF={tf} POOL_BENCH_PARTS={parts}: rc {r.returncode}, {out[-600:]!r}")

# The default is the gate's transformer, the shape pool_bench.py had before the knob.
sys.path.insert(0, os.path.dirname(BENCH))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
os.environ.pop("POOL_BENCH_TF", None)
import pool_bench  # noqa: E402
if pool_bench.tf_shape() != [8, 768, 16384]:
    fails.append(f"default shape {pool_bench.tf_shape()}, not 8,768,16384")

for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
