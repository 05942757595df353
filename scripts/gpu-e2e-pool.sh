# Pool checks for scripts/gpu-e2e.sh (sourced by it): speed, reuse safety and peak memory of gpumem's pool on PyTorch.
#
# Each PyTorch workload runs natively (caching allocator), with PYTORCH_NO_CUDA_MEMORY_CACHING=1 alone
# (every tensor a cudaMalloc), and with no caching under gpumem's pool.  Uses LIB, APP, LOGS, RESULTS.
PW=tests/gpu/pool_workloads.py
pool_run() {  # pool_run NAME MODE(native|raw|gpumem|gpumem-safe|gpumem-immediate) WORKLOAD [N]
  local name=$1 mode=$2; shift 2
  case $mode in
    native) python3 $PW "$@" ;;
    raw) PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 $PW "$@" ;;
    gpumem) PYTORCH_NO_CUDA_MEMORY_CACHING=1 GPUMEM_OUT="$LOGS/$name.%p.jsonl" LD_PRELOAD="$LIB" python3 $PW "$@" ;;
    gpumem-safe) GPUMEM_REUSE=safe PYTORCH_NO_CUDA_MEMORY_CACHING=1 GPUMEM_OUT="$LOGS/$name.%p.jsonl" LD_PRELOAD="$LIB" python3 $PW "$@" ;;
    gpumem-immediate) GPUMEM_REUSE=immediate PYTORCH_NO_CUDA_MEMORY_CACHING=1 GPUMEM_OUT="$LOGS/$name.%p.jsonl" LD_PRELOAD="$LIB" python3 $PW "$@" ;;
  esac 2> "$LOGS/$name.stderr" | tail -1 > "$LOGS/$name.json"
  echo "== $name: $(cut -c1-200 "$LOGS/$name.json")"
}
# The timed workloads alternate their modes, round after round: the machine's speed drifts by more
# than the differences measured (docs/benchmarks.md), and a ratio within one round cancels the drift.
# GPUMEM_E2E_ROUNDS=1 runs one round of each (a quicker check; the gates then have fewer samples).
ROUNDS=${GPUMEM_E2E_ROUNDS:-3}
for r in $(seq 1 "$ROUNDS"); do
  for m in native raw gpumem gpumem-safe gpumem-immediate; do pool_run loop-$m-$r $m loop 2000; done
done
for m in raw gpumem; do pool_run multistream-$m $m multistream 30; done
for m in raw gpumem gpumem-immediate; do pool_run race-$m $m race 10; done
for r in $(seq 1 $((ROUNDS > 2 ? 2 : ROUNDS))); do
  for m in native gpumem gpumem-safe; do pool_run gpt2-$m-$r $m gpt2 30; done
done

python3 tests/gpu/pool_checks.py "$LOGS" "$ROUNDS" >> "$RESULTS"
[ $? -eq 0 ] || fails=$((fails + 1))

{
  echo
  echo "### Pool hit through libgpumem.so: cudaMalloc+cudaFree pair, static cudart (µs per pair)"
  echo '```'
  echo "without gpumem:"; "$APP" bench | grep bench
  echo "with gpumem, pool on (default reuse, auto; the program makes no stream):"; GPUMEM_OUT="$LOGS/bench-pool.%p.jsonl" LD_PRELOAD="$LIB" "$APP" bench | grep bench
  echo "with gpumem, pool on, GPUMEM_REUSE=safe:"; GPUMEM_REUSE=safe GPUMEM_OUT="$LOGS/bench-pool-safe.%p.jsonl" LD_PRELOAD="$LIB" "$APP" bench | grep bench
  echo "with gpumem, pool on, GPUMEM_REUSE=immediate:"; GPUMEM_REUSE=immediate GPUMEM_OUT="$LOGS/bench-pool-imm.%p.jsonl" LD_PRELOAD="$LIB" "$APP" bench | grep bench
  echo '```'
} >> "$RESULTS" 2>&1

# Legacy IPC of pooled blocks (docs/pool.md, "Sharing memory between processes"): a child process
# opens the parent's buffers, checks and changes them.  gpumem must give the outcome the program
# has without it, on virtual memory (the default), with 20 MiB chunks (not a power of two: the
# importer's reservation is aligned to the largest power of two dividing the chunk) and on
# cuMemAlloc segments.
ipc_run() {  # ipc_run WORKLOAD NAME ENV...: prints "ok", "FAIL" or "no run", the JSON line goes to the log dir
  local w=$1 name=$2; shift 2
  env "$@" timeout 300 python3 tests/gpu/ipc_share.py "$w" > "$LOGS/ipc-$w-$name.json" 2> "$LOGS/ipc-$w-$name.stderr"
  # "no run": no JSON line, or the workload's library would not import; IPC was never tried.
  if grep -q '"ok": true' "$LOGS/ipc-$w-$name.json"; then echo ok
  elif ! grep -q '"ok": false' "$LOGS/ipc-$w-$name.json" || grep -qE '"error": "(ModuleNotFound|Import)Error' "$LOGS/ipc-$w-$name.json"; then
    echo "no run"
  else echo FAIL; fi
  # Why, for the record: the JSON line (or the exit) and the last error line, to stderr.
  grep -q '"ok": true' "$LOGS/ipc-$w-$name.json" ||
    echo "ipc $w $name: $(cut -c1-400 "$LOGS/ipc-$w-$name.json") $(grep -E 'Error|error' "$LOGS/ipc-$w-$name.stderr" | tail -1 | cut -c1-300)" >&2
}
{
  echo
  echo "### Device memory shared between processes (legacy IPC): the same outcome with and without gpumem"
  echo '| workload | allocator | without gpumem | gpumem pool (VMM) | gpumem pool, GPUMEM_POOL_CHUNK=20MiB | gpumem pool, GPUMEM_POOL_VMM=off | verdict |'
  echo '|---|---|---|---|---|---|---|'
  # IPC_SPECS="torch:no-caching cupy:cudaMalloc" runs only those.
  for spec in ${IPC_SPECS:-torch:caching torch:no-caching cupy:cudaMalloc}; do
    w=${spec%%:*} alloc=${spec#*:}
    nc=()
    [ "$alloc" = no-caching ] && nc=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
    base=$(ipc_run "$w" "$alloc-native" "${nc[@]}")
    vmm=$(ipc_run "$w" "$alloc-gpumem" "${nc[@]}" GPUMEM_OUT="$LOGS/ipc-$w-$alloc.%p.jsonl" LD_PRELOAD="$LIB")
    chunk=$(ipc_run "$w" "$alloc-gpumem-chunk20" "${nc[@]}" GPUMEM_POOL_CHUNK=20MiB GPUMEM_OUT="$LOGS/ipc-$w-$alloc-chunk20.%p.jsonl" LD_PRELOAD="$LIB")
    novmm=$(ipc_run "$w" "$alloc-gpumem-novmm" "${nc[@]}" GPUMEM_POOL_VMM=off GPUMEM_OUT="$LOGS/ipc-$w-$alloc-novmm.%p.jsonl" LD_PRELOAD="$LIB")
    verdict=PASS
    # A failure without gpumem is an outcome to match (PyTorch's no-cache IPC fails on its own);
    # a workload that never ran is not: four of those compared equal and read PASS.
    if [ "$base" = "no run" ] || [ "$vmm" != "$base" ] || [ "$chunk" != "$base" ] || [ "$novmm" != "$base" ]; then
      verdict=FAIL; fails=$((fails + 1))
    fi
    echo "| $w | $alloc | $base | $vmm | $chunk | $novmm | $verdict |"
  done
} >> "$RESULTS" 2>&1
