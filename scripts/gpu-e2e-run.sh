# `gpumem run`, `check` and `diff` on real PyTorch, torchrun and JAX, for scripts/gpu-e2e.sh (sourced by it) or alone.
#
# The commands of docs/guide.md's GPU sections, as written there, with tests/gpu/workloads.py as the
# program.  Must hold: a run passes `check` against its own baseline and against a baseline from
# an earlier identical run, and fails (exit 1) a limit tightened below its peak.  Uses LIB, LOGS,
# RESULTS and fails when sourced; alone: `bash scripts/gpu-e2e-run.sh` (GPUMEM_BUILD=build-dir).
# The gpumem binary needs libsimdjson.so, which the GPU machine lacks: scripts/gpu-bundle.sh puts a
# copy in $GPUMEM_BUILD/gpu/lib.
GPUMEM_BUILD=${GPUMEM_BUILD:-build}
: "${LIB:=$(pwd)/$GPUMEM_BUILD/preload/libgpumem.so}"
: "${LOGS:=$(mktemp -d /tmp/gpumem-e2e-run.XXXXXX)}"
: "${RESULTS:=${OUT:-$LOGS}/gpu-e2e-run.md}"
: "${fails:=0}"
GPUMEM_BIN=$(pwd)/$GPUMEM_BUILD/analyzer/gpumem
export GPUMEM_LIB=$LIB
# `gpumem` on PATH, so that the commands below read as in the docs (`env VAR=1 gpumem run ...`).
# The simdjson directory also reaches the programs gpumem runs; it holds nothing else.
mkdir -p "$LOGS/bin"
printf '#!/bin/sh\nLD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s" "$@"\n' \
  "$(pwd)/$GPUMEM_BUILD/gpu/lib" "$GPUMEM_BIN" > "$LOGS/bin/gpumem"
chmod +x "$LOGS/bin/gpumem"
PATH=$LOGS/bin:$PATH
W=tests/gpu/workloads.py
run_fails=0
# expect NAME WANT_RC CMD...: runs CMD (output to $LOGS/run-NAME.out), one table row.
expect() {
  local name=$1 want=$2; shift 2
  "$@" > "$LOGS/run-$name.out" 2>&1
  local rc=$?
  local verdict=PASS
  [ "$rc" = "$want" ] || { verdict="FAIL (exit $rc, expected $want)"; run_fails=$((run_fails + 1)); }
  echo "| $name | \`$*\` | $rc | $(grep -m1 -E "$EXPECT_LINE" "$LOGS/run-$name.out" | cut -c1-160 | tr '|' '/') | $verdict |" >> "$RESULTS"
  echo "== run/$name: exit $rc ($verdict)"
}
{
  echo
  echo "### gpumem run / check / diff (scripts/gpu-e2e-run.sh)"
  echo
  echo "| step | command | exit | output | verdict |"
  echo "|---|---|---|---|---|"
} >> "$RESULTS"
cd_logs=$LOGS/run && mkdir -p "$cd_logs"

# PyTorch, default caching allocator, recorded twice: main branch and merge request.
EXPECT_LINE='gpumem run: [0-9]+ log'
expect torch-main 0 gpumem run --pool off -o "$cd_logs/main/" -- python3 $W torch "$LOGS/run-main.stats.json"
expect torch-mr 0 gpumem run --pool off -o "$cd_logs/mr/" -- python3 $W torch "$LOGS/run-mr.stats.json"
gpumem report --json "$cd_logs"/main/*.jsonl > "$cd_logs/baseline.json"
EXPECT_LINE='limits? on'
expect check-own-baseline 0 gpumem check "$cd_logs"/main/*.jsonl --baseline "$cd_logs/baseline.json"
expect check-mr-vs-main 0 gpumem check "$cd_logs"/mr/*.jsonl --baseline "$cd_logs/baseline.json" --tolerance 5% --junit "$cd_logs/check.xml"
peak=$(python3 tests/gpu/halve_baseline.py --peak "$cd_logs/baseline.json")
# No peak read (an unusable baseline) made the limit 0, which any run breaks: the row below then
# passed without testing a limit at half the peak.
case $peak in
  '' | *[!0-9]* | 0) echo "| check-tightened | | | no peak in the baseline ('$peak') | FAIL |" >> "$RESULTS"; run_fails=$((run_fails + 1)) ;;
esac
tight=$((peak / 2))
EXPECT_LINE='FAIL'
expect check-tightened 1 gpumem check "$cd_logs"/mr/*.jsonl --max-peak "$tight"
# A tightened baseline: the same report with every peak halved.
python3 tests/gpu/halve_baseline.py "$cd_logs/baseline.json" "$cd_logs/tight-baseline.json"
expect check-tight-baseline 1 gpumem check "$cd_logs"/mr/*.jsonl --baseline "$cd_logs/tight-baseline.json"
EXPECT_LINE='peak allocated'
expect diff-main-mr 0 gpumem diff "$cd_logs/baseline.json" "$cd_logs"/mr/*.jsonl

# The three PyTorch modes of the guide: what gpumem sees in each.
EXPECT_LINE='^  [0-9]+ '
expect torch-nocache 0 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 gpumem run -o "$cd_logs/nocache/" -- python3 $W torch "$LOGS/run-nocache.stats.json"
expect torch-expandable 0 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True gpumem run --pool off -o "$cd_logs/expandable/" -- python3 $W torch "$LOGS/run-expandable.stats.json"

# torchrun: one log per rank (%r) and process (%p).
NPROC=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$NPROC" -ge 2 ] || NPROC=2
EXPECT_LINE='gpumem run: [0-9]+ log'
expect torchrun 0 gpumem run --pool off -o "$cd_logs/ranks/gpumem-%r-%p.jsonl" -- torchrun --standalone --nproc_per_node="$NPROC" tests/gpu/rank_workload.py
n_rank_logs=$(ls "$cd_logs"/ranks/*.jsonl 2>/dev/null | wc -l)
if [ "$n_rank_logs" != "$NPROC" ]; then
  echo "| torchrun logs | | | $n_rank_logs logs for $NPROC ranks | FAIL |" >> "$RESULTS"; run_fails=$((run_fails + 1))
fi
EXPECT_LINE='limits? on'
expect torchrun-check 0 gpumem check "$cd_logs"/ranks/*.jsonl --max-peak 100GiB

# JAX with the platform allocator: one driver allocation per buffer.
EXPECT_LINE='gpumem run: [0-9]+ log'
expect jax-platform 0 env XLA_PYTHON_CLIENT_ALLOCATOR=platform gpumem run --pool off -o "$cd_logs/jax/" -- python3 $W jax "$LOGS/run-jax.stats.json"

{
  echo
  echo "gpumem run/check failures: $run_fails"
  for f in torch-main check-mr-vs-main check-tightened check-tight-baseline diff-main-mr torch-nocache torch-expandable torchrun jax-platform; do
    echo
    echo "#### $f"
    echo '```'
    grep -v '^\s*$' "$LOGS/run-$f.out" | grep -vE '^(steps|rank [0-9]+:)' | head -40
    echo '```'
  done
} >> "$RESULTS"
[ "$run_fails" -eq 0 ] || fails=$((fails + 1))
