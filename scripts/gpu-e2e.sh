#!/usr/bin/env bash
# GPU end-to-end check: runs real CUDA programs under the libgpumem.so built on the dev machine and checks their logs.
#
# Builds nothing: it takes build/preload/libgpumem.so and build/gpu/static_cudart_app (made by
# scripts/gpu-bundle.sh on the dev machine) and runs PyTorch (default allocator, no caching,
# expandable segments), JAX (default and platform allocator), CuPy and a static-cudart CUDA C++
# program under it.  Results: a Markdown table in $OUT/gpu-e2e.md (or ./gpu-e2e-out/), logs tarred.
set -uo pipefail
cd "$(dirname "$0")/.."

LIB=$(pwd)/build/preload/libgpumem.so
APP=$(pwd)/build/gpu/static_cudart_app
OUTDIR=${OUT:-$(pwd)/gpu-e2e-out}
LOGS=$(mktemp -d /tmp/gpumem-e2e.XXXXXX)
mkdir -p "$OUTDIR"
RESULTS=$OUTDIR/gpu-e2e.md
: > "$RESULTS"
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
CHECK="python3 tests/gpu/e2e_checks.py"
fails=0
# A value that names no part (a typo: "pools") ran no case at all and passed with "failed cases: 0".
case ${GPUMEM_E2E_ONLY:-} in
  "" | base | pool | stacks | answers) ;;
  *) echo "gpu-e2e: GPUMEM_E2E_ONLY=$GPUMEM_E2E_ONLY: expected base, pool, stacks or answers" >&2; exit 2 ;;
esac

{
  echo "## gpu-e2e $(date -u +%Y-%m-%dT%H:%MZ)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'
  python3 -c 'import torch, jax, cupy; print("torch", torch.__version__, "| jax", jax.__version__, "| cupy", cupy.__version__)' 2>/dev/null
  echo
  echo "| case | events | what the log shows | verdict |"
  echo "|---|---|---|---|"
} >> "$RESULTS"

# run_case NAME POOL ENV... -- CMD...: one program under gpumem, then its check.
run_case() {
  local name=$1 pool=$2; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  rm -f "$LOGS/$name".*
  echo "== $name (GPUMEM_POOL=$pool)"
  env "${envs[@]}" GPUMEM_POOL="$pool" GPUMEM_OUT="$LOGS/$name.%p.jsonl" LD_PRELOAD="$LIB" "$@" \
    > "$LOGS/$name.stdout" 2> "$LOGS/$name.stderr"
  local rc=$?
  local log
  log=$(ls -S "$LOGS/$name".*.jsonl 2>/dev/null | head -1)
  if [ -z "$log" ]; then
    echo "| $name | 0 | no log (exit $rc): $(tail -c 300 "$LOGS/$name.stderr" | tr '\n|' ' /') | FAIL |" >> "$RESULTS"
    fails=$((fails + 1))
    return
  fi
  local stats=()
  [ -f "$LOGS/$name.stats.json" ] && stats=("$LOGS/$name.stats.json")
  $CHECK "$name" "$log" "${stats[@]}" >> "$RESULTS" || fails=$((fails + 1))
}

W=tests/gpu/workloads.py
# GPUMEM_E2E_ONLY=pool runs only the pool checks (scripts/gpu-e2e-pool.sh) and `gpumem run`'s
# (scripts/gpu-e2e-run.sh); =stacks only the call stacks and the PyTorch memory snapshot
# (scripts/gpu-e2e-stacks.sh); =answers only the driver answers the pool must not change
# (scripts/gpu-e2e-answers.sh: captures, other allocators after frees); =base only the programs
# above and the interception cost (the whole script takes more than one 10-minute device call:
# run it as base, pool, stacks, answers).
if [ -z "${GPUMEM_E2E_ONLY:-}" ] || [ "${GPUMEM_E2E_ONLY:-}" = base ]; then
run_case torch-default off -- python3 $W torch "$LOGS/torch-default.stats.json"
run_case torch-nocache off PYTORCH_NO_CUDA_MEMORY_CACHING=1 -- python3 $W torch "$LOGS/torch-nocache.stats.json"
run_case torch-expandable off PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -- python3 $W torch "$LOGS/torch-expandable.stats.json"
run_case jax-default off -- python3 $W jax "$LOGS/jax-default.stats.json"
run_case jax-platform off XLA_PYTHON_CLIENT_ALLOCATOR=platform -- python3 $W jax "$LOGS/jax-platform.stats.json"
# CuPy without gpumem: the driver's own answers, which both cupy cases must match (e2e_checks.py).
python3 $W cupy "$LOGS/cupy-bare.stats.json" > "$LOGS/cupy-bare.stdout" 2>&1
run_case cupy off -- python3 $W cupy "$LOGS/cupy.stats.json"
run_case cuda-static off -- "$APP"
# The same programs with gpumem's pool serving cuMemAlloc/cudaMalloc (the default).
run_case torch-default-pool on -- python3 $W torch "$LOGS/torch-default-pool.stats.json"
run_case torch-nocache-pool on PYTORCH_NO_CUDA_MEMORY_CACHING=1 -- python3 $W torch "$LOGS/torch-nocache-pool.stats.json"
run_case jax-platform-pool on XLA_PYTHON_CLIENT_ALLOCATOR=platform -- python3 $W jax "$LOGS/jax-platform-pool.stats.json"
run_case cupy-pool on -- python3 $W cupy "$LOGS/cupy-pool.stats.json"
run_case cuda-static-pool on -- "$APP"

# Interception cost on the real driver: the same binary with and without gpumem (pool off).
{
  echo
  echo "### cudaMalloc+cudaFree pair, static cudart, pool off (µs per pair, 2000 pairs)"
  echo '```'
  # Alternated twice: the driver's own cost drifts between runs by more than gpumem adds.
  for round in 1 2; do
    echo "without gpumem ($round):"; "$APP" bench | grep bench
    echo "with gpumem ($round):"; GPUMEM_POOL=off GPUMEM_OUT="$LOGS/bench.%p.jsonl" LD_PRELOAD="$LIB" "$APP" bench | grep bench
  done
  echo '```'
} >> "$RESULTS" 2>&1
fi

for extra in scripts/gpu-e2e-pool.sh scripts/gpu-e2e-run.sh scripts/gpu-e2e-stacks.sh scripts/gpu-e2e-answers.sh; do
  case "${GPUMEM_E2E_ONLY:-}:$extra" in
    :* | pool:*pool.sh | pool:*run.sh | stacks:*stacks.sh | answers:*answers.sh) ;;
    *) continue ;;
  esac
  # A part that is missing fails the run: it was skipped without a word.
  if [ -f "$extra" ]; then . "$extra"; else
    echo "| $extra | | missing | FAIL |" >> "$RESULTS"; fails=$((fails + 1))
  fi
done

echo "failed cases: $fails" >> "$RESULTS"
tar -C "$LOGS" -czf "$OUTDIR/gpu-e2e-logs.tar.gz" . 2>/dev/null
cat "$RESULTS"
exit $((fails > 0))
