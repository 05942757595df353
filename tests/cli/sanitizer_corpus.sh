#!/usr/bin/env bash
# Runs every bad input (tests/data/bad) and every log under tests/data through an ASan+UBSan gpumem:
# report (text, --json, --html, --perfetto), check, replay.  Fails on any sanitizer report and on
# any exit code a command does not document (report/replay 0 or 2, check 0, 1 or 2).
#
# usage: sanitizer_corpus.sh GPUMEM SRC WORK   (scripts/test.sh runs it on build-san's gpumem, or on
# build-asan's where clang is missing)
set -uo pipefail
GPUMEM=$1 SRC=$2 WORK=$3
rm -rf "$WORK" && mkdir -p "$WORK" || exit 1
# A finding exits 99 (not 1, which check uses for a broken limit) after printing its report.
export ASAN_OPTIONS="exitcode=99:detect_leaks=1:abort_on_error=0:symbolize=1"
export UBSAN_OPTIONS="exitcode=99:print_stacktrace=1:halt_on_error=1"
# One run per core at a time: each is a short single-threaded process, mostly the sanitizers'
# start-up, so on CI's 2 cores the corpus takes about half as long.
jobs=$(nproc)

# run NAME ALLOWED_RCS CMD...: in the background, stderr to $WORK/NAME.err; the exit code must be
# one of ALLOWED_RCS.  Its verdict goes to $WORK/NAME.ok or $WORK/NAME.fail, counted at the end.
run() {
  local name=$1 allowed=$2; shift 2
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  (
    "$@" > /dev/null 2> "$WORK/$name.err"
    rc=$?
    if grep -qE "Sanitizer|runtime error:" "$WORK/$name.err"; then
      { echo "FAIL: sanitizer report: $*"; sed 's/^/    /' "$WORK/$name.err" | head -40; } > "$WORK/$name.fail"
    elif [[ " $allowed " != *" $rc "* ]]; then
      { echo "FAIL: exit $rc (allowed: $allowed): $*"; sed 's/^/    /' "$WORK/$name.err" | head -10; } > "$WORK/$name.fail"
    else
      : > "$WORK/$name.ok"
    fi
  ) &
}

inputs=("$SRC"/tests/data/bad/* "$SRC"/tests/data/golden/*.jsonl "$SRC"/tests/data/cli/*.jsonl \
        "$SRC"/tests/data/h200/*.jsonl "$SRC"/tests/data/replay/*.jsonl.gz)
for f in "${inputs[@]}"; do
  n=$(basename "$f")
  case $f in
  *.gz)
    # Compressed logs go through a pipe: also the spool of a non-regular input.
    run "$n.report" "0" bash -c 'zcat "$1" | "$0" report --no-progress /dev/stdin --html "$2.html" --perfetto "$2.trace"' "$GPUMEM" "$f" "$WORK/$n"
    run "$n.json" "0" bash -c 'zcat "$1" | "$0" report --no-progress --json /dev/stdin' "$GPUMEM" "$f"
    run "$n.check" "0 1" bash -c 'zcat "$1" | "$0" check /dev/stdin --max-peak 1GiB --max-fragmentation 10%' "$GPUMEM" "$f"
    run "$n.replay" "0" bash -c 'zcat "$1" | "$0" replay /dev/stdin' "$GPUMEM" "$f"
    continue ;;
  */bad/*) ok_report="0 2" ok_check="0 1 2" ok_replay="0 2" ;;
  *) ok_report="0" ok_check="0 1" ok_replay="0" ;;
  esac
  run "$n.report" "$ok_report" "$GPUMEM" report --no-progress "$f" --html "$WORK/$n.html" --perfetto "$WORK/$n.trace"
  run "$n.at" "$ok_report" "$GPUMEM" report --no-progress --at 3 "$f"
  run "$n.json" "$ok_report" "$GPUMEM" report --no-progress --json "$f"
  run "$n.check" "$ok_check" "$GPUMEM" check "$f" --max-peak 1GiB --max-fragmentation 10% --junit "$WORK/$n.xml"
  # replay reads logs, not report JSON.
  case $f in *.json) ;; *) run "$n.replay" "$ok_replay" "$GPUMEM" replay "$f" ;; esac
done
# diff over a bad input and a golden log.
for f in "$SRC"/tests/data/bad/*; do
  run "$(basename "$f").diff" "0 2" "$GPUMEM" diff "$f" "$SRC/tests/data/cli/after.jsonl"
done
wait
shopt -s nullglob
fails=("$WORK"/*.fail) oks=("$WORK"/*.ok)
for f in "${fails[@]}"; do cat "$f"; done
runs=$((${#fails[@]} + ${#oks[@]})) failures=${#fails[@]}
echo "sanitizer corpus: $runs runs over ${#inputs[@]} inputs, $failures failure(s)"
[ "$failures" = 0 ] && [ "$runs" -gt 0 ]
