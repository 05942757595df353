#!/usr/bin/env bash
# Pool hit by halves: the static-cudart pair loop under auto and safe reuse, cudart's pairs first or the driver's, ROUNDS rounds.
#
# Usage (GPU machine, after scripts/gpu-bundle.sh): [LIB=path/libgpumem.so] tests/gpu/hit_halves.sh [ROUNDS]   (default 3)
# Each process prints, per api and size, the median pair and the medians of its allocation and its
# free alone (build/gpu/static_cudart_app bench); the summary is the median over the processes of
# each (mode, api, size), with the range of the pair medians.  Pinned to HIT_CPUS (default 2-3):
# unpinned, one build's medians fall in two groups from one process to the next (runs 76 and 81).
# HIT_MODES (default "auto safe safe0"): safeN is safe with GPUMEM_ORDER_BATCH=N MiB; safe0, a release
# at every miss as before 2026-12-04, is the control for ordered releases in batches, and safe80
# batches four 20 MiB requests (the 20 MiB pair's next candidate, docs/benchmarks.md).
set -euo pipefail
rounds=${1:-3}
lib=${LIB:-$PWD/build/preload/libgpumem.so}
app=${APP:-build/gpu/static_cudart_app}
cpus=${HIT_CPUS:-2-3}
out=$(mktemp -d)
for r in $(seq 1 "$rounds"); do
  for mode in ${HIT_MODES:-auto safe safe0}; do for first in 0 1; do for hold in 0 4096; do
    reuse=${mode%%[0-9]*} batch=${mode#"$reuse"}
    GPUMEM_REUSE=$reuse GPUMEM_ORDER_BATCH=${batch:-32}MiB BENCH_DRIVER_FIRST=$first GPUMEM_OUT="$out/log-%p.jsonl" \
      LD_PRELOAD="$lib" taskset -c "$cpus" "$app" bench "$hold" | sed -n "s/^bench /$mode first=$first /p"
  done; done; done
done | tee "$out/all.txt"
echo "== median over processes: pair (range), allocation, free; µs"
python3 - "$out/all.txt" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    kv = dict(x.split("=") for x in f[1:])
    rows[(f[0], kv["api"], int(kv["size"]))].append(
        (float(kv["median_us"]), float(kv["alloc_median_us"]), float(kv["free_median_us"])))
for k in sorted(rows):
    v = rows[k]
    pair = [x[0] for x in v]
    print(f"{k[0]:4} {k[1]:10} {k[2]:>8} B: pair {statistics.median(pair):.2f} ({min(pair):.2f}-{max(pair):.2f}), "
          f"alloc {statistics.median(x[1] for x in v):.2f}, free {statistics.median(x[2] for x in v):.2f}, n={len(v)}")
PY
rm -rf "$out"
