#!/usr/bin/env bash
# NCCL under gpumem on a multi-GPU machine: a 2-rank all-reduce with the pool off and on; checks the sums and each rank's log.
#
# Run on the GPU machine with build/preload/libgpumem.so carried (see scripts/gpu-e2e.sh).  Needs 2 GPUs.
set -uo pipefail
cd "$(dirname "$0")/.."
LIB=$(pwd)/build/preload/libgpumem.so
OUTDIR=${OUT:-$(pwd)/gpu-e2e-out}
LOGS=$(mktemp -d /tmp/gpumem-nccl.XXXXXX)
mkdir -p "$OUTDIR"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
fails=0
echo "| case | rank | all-reduce | cuMemCreate | cuMemMap | cudaMalloc | pooled allocs | end | verdict |"
echo "|---|---|---|---|---|---|---|---|---|"
for pool in off on; do
  GPUMEM_POOL=$pool GPUMEM_OUT="$LOGS/nccl-$pool-%r.%p.jsonl" LD_PRELOAD="$LIB" \
    torchrun --standalone --nproc_per_node=2 tests/gpu/nccl_workload.py > "$LOGS/nccl-$pool.out" 2>&1
  rc=$?
  for log in "$LOGS"/nccl-$pool-*.jsonl; do
    r=$(basename "$log" | sed 's/.*-\([0-9]*\)\.[0-9]*\.jsonl/\1/')
    sum_ok=$(grep -c "rank $r: .* ok=True" "$LOGS/nccl-$pool.out")
    python3 - "$log" "$pool" "$r" "$sum_ok" "$rc" <<'PY' || fails=$((fails + 1))
import json, sys
sys.path.insert(0, "tests/gpu")
from check_log import load, summarize
log, pool, rank, sum_ok, rc = sys.argv[1:]
lines = load(log)
s = summarize(lines)
a = s["apis"]
e = s["end"] or {}
pooled = sum(1 for x in lines if x["ev"] == "alloc" and x.get("pooled"))
problems = []
if sum_ok != "1" or rc != "0": problems.append(f"all-reduce wrong or torchrun exit {rc}")
if not e: problems.append("no end line")
elif e.get("lost") or e.get("unmatched"): problems.append(f"lost={e.get('lost')} unmatched={e.get('unmatched')}")
if s["seq_gaps"]: problems.append("seq gaps")
if a.get("alloc:cuMemCreate", 0) == 0: problems.append("NCCL's cuMemCreate not seen")
if pool == "on" and pooled == 0: problems.append("nothing pooled")
verdict = "PASS" if not problems else "FAIL: " + "; ".join(problems)
print(f"| nccl pool {pool} | {rank} | {'right' if sum_ok == '1' else 'WRONG'} | {a.get('alloc:cuMemCreate', 0)} | {a.get('map:cuMemMap', 0)} | "
      f"{a.get('alloc:cudaMalloc', 0)} | {pooled} | {e.get('reason')} | {verdict} |")
sys.exit(1 if problems else 0)
PY
  done
done
echo "nccl failures: $fails"
tar -C "$LOGS" -czf "$OUTDIR/gpu-e2e-nccl-logs.tar.gz" .
exit $((fails > 0))
