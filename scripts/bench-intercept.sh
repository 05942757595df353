#!/usr/bin/env bash
# Benchmark: what gpumem adds to one intercepted call plus its event, on the emulated device (pool off).
#
# Runs the same alloc/free loop with and without LD_PRELOAD=libgpumem.so, alternating, and prints
# the median of each and the difference per call (two calls per pair).  Needs a built tree (build/).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
E=$B/tests/emu
export LD_LIBRARY_PATH=$E/driver:$E
runs=${RUNS:-5}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
without=() with=()
for i in $(seq "$runs"); do
  without+=("$("$E/emu_driver_app" bench 31 10000 4096 50 | sed -n 's/median_pair_ns=//p')")
  with+=("$(GPUMEM_POOL=off GPUMEM_OUT="$tmp/b-%p.jsonl" LD_PRELOAD="$B/preload/libgpumem.so" "$E/emu_driver_app" bench 31 10000 4096 50 | sed -n 's/median_pair_ns=//p')")
  rm -f "$tmp"/b-*.jsonl
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mw=$(median "${without[@]}")
mg=$(median "${with[@]}")
echo "alloc+free pair, emulated device, 4 KiB, median of $runs runs (each the median of 31 rounds of 10000 pairs)"
echo "  without gpumem: ${mw} ns   runs: ${without[*]}"
echo "  with gpumem:    ${mg} ns   runs: ${with[*]}"
awk -v a="$mw" -v b="$mg" 'BEGIN {printf "  added per intercepted call plus its event: %.0f ns\n", (b - a) / 2}'
