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
  # One log per rank: a rank that wrote none was not checked at all, and the other's row passed.
  n_logs=$(ls "$LOGS"/nccl-$pool-*.jsonl 2>/dev/null | wc -l)
  if [ "$n_logs" != 2 ]; then
    echo "| nccl pool $pool | | | | | | | | FAIL: $n_logs logs for 2 ranks |"; fails=$((fails + 1))
  fi
  for log in "$LOGS"/nccl-$pool-*.jsonl; do
    [ -e "$log" ] || continue  # no log at all: the row above failed it, and the glob is no file
    r=$(basename "$log" | sed 's/.*-\([0-9]*\)\.[0-9]*\.jsonl/\1/')
    sum_ok=$(grep -c "rank $r: .* ok=True" "$LOGS/nccl-$pool.out")
    python3 tests/gpu/nccl_checks.py "$log" "$pool" "$r" "$sum_ok" "$rc" || fails=$((fails + 1))
  done
done
echo "nccl failures: $fails"
tar -C "$LOGS" -czf "$OUTDIR/gpu-e2e-nccl-logs.tar.gz" .
exit $((fails > 0))
