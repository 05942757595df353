#!/usr/bin/env bash
# Issue 12's pool benchmark on the GPU machine: tests/gpu/pool_bench.py over the bundle of scripts/gpu-bundle.sh; results in $OUT.
#
# Usage (on the GPU machine, in the repository root): bash scripts/gpu-bench-pool.sh [ROUNDS]
# Needs build/preload/libgpumem.so and build/gpu/static_cudart_app (scripts/gpu-bundle.sh), PyTorch
# and transformers.  Writes $OUT/pool-bench.md and $OUT/pool-bench.json (./gpu-bench-out/ without $OUT).
set -uo pipefail
cd "$(dirname "$0")/.."
export LIB=$(pwd)/build/preload/libgpumem.so APP=$(pwd)/build/gpu/static_cudart_app PYTHONUNBUFFERED=1
OUTDIR=${OUT:-$(pwd)/gpu-bench-out}
mkdir -p "$OUTDIR"
[ -f "$LIB" ] || { echo "no $LIB: run scripts/gpu-bundle.sh on the dev machine and carry build/preload" >&2; exit 2; }
python3 tests/gpu/pool_bench.py "$OUTDIR" "${1:-2}"
