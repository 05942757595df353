#!/usr/bin/env bash
# Times `gpumem report` and `gpumem replay` over 8 logs of 1M events each, one thread against all
# cores, in alternating rounds, and each replay policy alone (docs/benchmarks.md, "Many logs").
# Usage: scripts/bench-many-logs.sh [BUILD_DIR] [ROUNDS]   (BUILD_DIR default: build)
set -euo pipefail
build=${1:-build}
rounds=${2:-3}
gpumem=$(realpath "$build/analyzer/gpumem")
bench_ingest=$(realpath "$build/tests/analyzer/bench_ingest")
dir=$(mktemp -d "${TMPDIR:-/tmp}/gpumem-many-XXXXXX")
trap 'rm -rf "$dir"' EXIT
cd "$dir"
# bench_ingest's synthetic pool-on log (512 segments of 2 MiB, random allocs and frees), 1,000,001
# events, 177 MB.  The other seven are hard links: the same bytes, no more disk.
"$bench_ingest" 1000000 log0.jsonl >/dev/null
for k in 1 2 3 4 5 6 7; do ln log0.jsonl "log$k.jsonl"; done
cores=$(nproc)
echo "8 logs x 1,000,001 events; $cores cores; $(uptime | sed 's/.*load/load/')"
t() {  # label, command...: wall, user, sys seconds
    local label=$1
    shift
    /usr/bin/time -f "$label: wall %e s, user %U s, sys %S s, max RSS %M KB" "$@" >/dev/null
}
for r in $(seq "$rounds"); do
    echo "round $r ($(uptime | sed 's/.*load/load/'))"
    t "  report -j 1      " "$gpumem" report --no-progress -j 1 log?.jsonl
    t "  report -j $cores      " "$gpumem" report --no-progress -j "$cores" log?.jsonl
    t "  replay -j 1      " "$gpumem" replay -j 1 log?.jsonl
    t "  replay -j $cores      " "$gpumem" replay -j "$cores" log?.jsonl
done
"$gpumem" report --no-progress -j 1 log?.jsonl >one.txt
"$gpumem" report --no-progress -j "$cores" log?.jsonl >all.txt
cmp -s one.txt all.txt && echo "report output identical for -j 1 and -j $cores" || { echo "report outputs DIFFER"; exit 1; }
echo "each policy alone, 8M events, one thread (user+sys CPU includes reading the logs; ideal ~ reading only)"
for p in ideal pytorch pytorch-expandable gpumem; do
    t "  replay --policy $p" "$gpumem" replay --policy "$p" -j 1 log?.jsonl
done
