#!/usr/bin/env bash
# Symbolization benchmark (docs/benchmarks.md, "Symbolizing native stacks"): a log of N allocations
# (default 1,000,000) with native stacks (20,000 stacks of depth 32 over 100,000 unique return
# addresses in real ELF files: a copy of gpumem with its debug info, libc, libstdc++, libdw), and
# the same log with the module paths made nonexistent (nothing to symbolize).  Times `gpumem report`
# on each, alternating, and bench_symbolize (the symbolizer alone).  BUILD=build-dir.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
N=${1:-1000000}
work=$(mktemp -d /tmp/gpumem-bench-sym.XXXXXX)
trap 'rm -rf "$work"' EXIT
cp "$BUILD/analyzer/gpumem" "$work/gpumem-module"  # a fixed copy: the module must not change under the log
mods="$work/gpumem-module"
for m in /lib/x86_64-linux-gnu/libc.so.6 /usr/lib/x86_64-linux-gnu/libstdc++.so.6 /usr/lib/x86_64-linux-gnu/libdw.so.1; do
  [ -f "$m" ] && mods="$mods $m"
done
python3 tests/stacks/gen_native_log.py "$work/native.jsonl" "$N" 20000 32 100000 $mods
python3 tests/stacks/gen_native_log.py "$work/nosym.jsonl" "$N" 20000 32 100000 --modules-as /nonexistent $mods
echo "log: $N allocations, $(grep -c '"ev":"stack"' "$work/native.jsonl") stack records, $(du -m "$work/native.jsonl" | cut -f1) MB; load: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in 1 2 3; do
  for f in nosym native; do
    /usr/bin/time -f "round $round, $f: %e s wall, %U s user, %M KiB peak" \
      "$BUILD/analyzer/gpumem" report "$work/$f.jsonl" --no-progress > /dev/null 2> "$work/time.err" || true
    tail -1 "$work/time.err"
  done
done
"$BUILD/tests/stacks/bench_symbolize" "$work/native.jsonl"
