#!/usr/bin/env bash
# Pool hit of two libgpumem.so builds, alternating: ROUNDS rounds of the static-cudart pair loop
# (build/gpu/static_cudart_app bench HOLD) per build, mode and held memory; even rounds in reverse
# order.  Prints one line per run: "round build mode hold api size median_us", then the medians.
# Usage: tests/gpu/hit_compare.sh ROUNDS LIB_A LIB_B [MODES]   (MODES default "auto safe")
# HIT_CPUS (e.g. 2-3) pins every run to those CPUs (taskset): unpinned, the same build's medians
# fall in two groups from one process to the next (runs 76 and 81, docs/benchmarks.md).
set -euo pipefail
rounds=${1:?rounds}; lib_a=${2:?lib a}; lib_b=${3:?lib b}; modes=${4:-auto safe}
app=${APP:-build/gpu/static_cudart_app}
pin=()
[ -n "${HIT_CPUS:-}" ] && pin=(taskset -c "$HIT_CPUS")
out=$(mktemp -d)
for r in $(seq 1 "$rounds"); do
  builds="a b"; [ $((r % 2)) -eq 0 ] && builds="b a"
  for b in $builds; do
    lib=$lib_a; [ "$b" = b ] && lib=$lib_b
    for m in $modes; do for hold in 0 4096; do
      GPUMEM_REUSE=$m GPUMEM_OUT="$out/hit-%p.jsonl" LD_PRELOAD="$lib" "${pin[@]}" "$app" bench "$hold" |
        awk -v r="$r" -v b="$b" -v m="$m" '/^bench /{for(i=2;i<=NF;i++){split($i,kv,"=");v[kv[1]]=kv[2]}
             print r, b, m, v["hold_mib"], v["api"], v["size"], v["median_us"]}'
    done; done
  done
done | tee "$out/all.txt"
echo "== median of the round medians (min-max) per build, mode, held MiB, api, size"
python3 - "$out/all.txt" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    r, b, m, hold, api, size, med = line.split()
    runs.setdefault((m, int(hold), api, int(size), b), []).append(float(med))
for k in sorted(runs):
    x = runs[k]
    print(f"{k[4]} {k[0]:5} hold {k[1]:4} {k[2]:9} {k[3]:>8} B: {statistics.median(x):.2f} ({min(x):.2f}-{max(x):.2f}, n={len(x)})")
PY
rm -rf "$out"
