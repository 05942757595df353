# Call stacks on real PyTorch, for scripts/gpu-e2e.sh (sourced by it) or alone
# (`bash scripts/gpu-e2e-stacks.sh`, GPUMEM_BUILD=build-dir): tests/gpu/stacks_workload.py under
# `gpumem run --tensors` (every tensor its own allocation, Python stacks on), then
# tests/gpu/stacks_checks.py (each known line's tensor at the peak with its exact bytes) and
# tests/gpu/torch_snapshot_check.py (the --torch-snapshot export read by torch's memory_viz, its
# counts against the log).  Uses LIB, LOGS, RESULTS and fails when sourced.
GPUMEM_BUILD=${GPUMEM_BUILD:-build}
: "${LIB:=$(pwd)/$GPUMEM_BUILD/preload/libgpumem.so}"
: "${LOGS:=$(mktemp -d /tmp/gpumem-e2e-stacks.XXXXXX)}"
: "${RESULTS:=${OUT:-$LOGS}/gpu-e2e-stacks.md}"
: "${fails:=0}"
stacks_dir=$LOGS/stacks && mkdir -p "$stacks_dir"
# gpumem needs the shared libraries scripts/gpu-bundle.sh copied (the GPU machine lacks them): a
# wrapper puts them on its library path only, so that the Python checks that call it do not load them.
stacks_bin=$stacks_dir/gpumem
printf '#!/bin/sh\nLD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s" "$@"\n' \
  "$(pwd)/$GPUMEM_BUILD/gpu/lib" "$(pwd)/$GPUMEM_BUILD/analyzer/gpumem" > "$stacks_bin"
chmod +x "$stacks_bin"
stacks_fails=0
{
  echo
  echo "### Call stacks and the PyTorch memory snapshot (scripts/gpu-e2e-stacks.sh)"
  echo
  echo "| check | result | verdict |"
  echo "|---|---|---|"
} >> "$RESULTS"
echo "== stacks: stacks_workload.py under gpumem run --tensors"
GPUMEM_LIB=$LIB "$stacks_bin" run --tensors -o "$stacks_dir/" -- python3 tests/gpu/stacks_workload.py 50 \
  > "$stacks_dir/run.out" 2>&1
rc=$?
stacks_log=$(ls -S "$stacks_dir"/*.jsonl 2>/dev/null | head -1)
if [ "$rc" != 0 ] || [ -z "$stacks_log" ]; then
  echo "| gpumem run --tensors | exit $rc, log: ${stacks_log:-none}; $(tail -c 200 "$stacks_dir/run.out" | tr '\n|' ' /') | FAIL |" >> "$RESULTS"
  stacks_fails=$((stacks_fails + 1))
else
  echo "| gpumem run --tensors | exit 0, $(grep -c '"ev":"alloc"' "$stacks_log") allocations, $(grep -c '"ev":"stack"' "$stacks_log") stack records | PASS |" >> "$RESULTS"
  if python3 tests/gpu/stacks_checks.py "$stacks_bin" "$stacks_log" > "$stacks_dir/sites.out" 2>&1; then v=PASS; else
    v=FAIL; stacks_fails=$((stacks_fails + 1)); fi
  echo "| call sites at the peak (stacks_checks.py) | $(tr '\n|' ' /' < "$stacks_dir/sites.out" | cut -c1-400) | $v |" >> "$RESULTS"
  python3 tests/gpu/torch_snapshot_check.py "$stacks_bin" "$stacks_log" "${OUT:-$stacks_dir}" \
    > "$stacks_dir/snapshot.out" 2> "$stacks_dir/snapshot.err" || stacks_fails=$((stacks_fails + 1))
  grep '^| ' "$stacks_dir/snapshot.out" >> "$RESULTS"
  grep -q '^| ' "$stacks_dir/snapshot.out" || echo "| torch-snapshot | $(tail -c 300 "$stacks_dir/snapshot.err" | tr '\n|' ' /') | FAIL |" >> "$RESULTS"
fi
echo "stacks check failures: $stacks_fails" >> "$RESULTS"
[ "$stacks_fails" -eq 0 ] || fails=$((fails + 1))
