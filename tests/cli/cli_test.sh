#!/usr/bin/env bash
# Tests of `gpumem run`, `gpumem check` and `gpumem diff`: every exit code, through the real binary,
# on small logs (tests/data/cli) and on the emulated CUDA device; plus the commands of docs/guide.md.
#
# usage: cli_test.sh CASE   with GPUMEM, BUILD (build tree), SRC (source tree) and WORK set.
set -uo pipefail
case_name=$1
: "${GPUMEM:?}" "${BUILD:?}" "${SRC:?}" "${WORK:?}"
DATA=$SRC/tests/data/cli
EMU=$BUILD/tests/emu
# The emulated libcuda.so.1 and CUDA runtime; gpumem run passes the environment through.
export LD_LIBRARY_PATH=$EMU/driver:$EMU${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
W=$WORK/$case_name
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
. "$SRC/tests/lib/expect.sh"
json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }
# edit_report SRC DST EDIT: DST is the report JSON SRC after the Python statement EDIT (p is its
# first process, dev that process's first device).
edit_report() {
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); p=d["processes"][0]; dev=p["devices"][0]; exec(sys.argv[3]); json.dump(d, open(sys.argv[2], "w"), indent=1)' "$@"
}
# line_of FILE ERE: the number of the first line of FILE that matches ERE (where a message should
# point, found apart from gpumem's own reading).
line_of() { grep -nE -m1 -- "$2" "$1" | cut -d: -f1; }

# summary_columns_apart: in the `gpumem run` summary of $W/err, two spaces or more part every column
# of every row (a row splits into as many fields as the heading), and each right-aligned value
# (requested to OOMs) ends under its heading.
summary_columns_apart() {
  python3 - "$W/err" <<'PY' || fail "summary columns run together: $(cat "$W/err")"
import re, sys
lines = open(sys.argv[1]).read().split("\n")
top = next(i for i, l in enumerate(lines) if l.startswith("gpumem summary"))
head, rows = lines[top + 1], []
for l in lines[top + 2:]:
    if not re.match(r"  \d", l): break
    rows.append(l)
assert rows, "no rows"
cols = [(m.start(), m.end()) for m in re.finditer(r"\S+(?: \S+)*", head)]
assert len(cols) == 10, head
for r in rows:
    fields = [(m.start(), m.end()) for m in re.finditer(r"\S+(?: \S+)*", r)]
    assert len(fields) == len(cols), (head, r)
    for c in range(3, 9):
        assert fields[c][1] == cols[c][1], (c, head, r)
PY
}

case $case_name in
run_exit_codes)
  # 0, with the log found and summarized: train 20 keeps a 3 MiB checkpoint every 10 steps.
  expect_rc 0 "$GPUMEM" run -o "$W/logs/" -- "$EMU/emu_rt_shared_app" train 20
  expect_in "$W/out" "steps=20"
  expect_in "$W/err" "gpumem run: 1 log (pattern $W/logs/gpumem-%p.jsonl)"
  expect_in "$W/err" "2 / 6.00 MiB"
  expect_in "$W/err" "full report: gpumem report $W/logs/gpumem-"
  [ "$(ls "$W"/logs/gpumem-*.jsonl | wc -l)" = 1 ] || fail "expected one log in $W/logs"
  expect_not_in "$W/err" "earlier log"
  # A second run into the same folder (a baseline recorded again): its list is its own log, but
  # the folder's glob reads the first run's too, and a baseline made so held "rank 0#2", which
  # every later run failed as missing, with no word from gpumem run.  Named after the list, and
  # the "full report" hint names this run's log only.
  first=$(ls "$W"/logs/gpumem-*.jsonl)
  expect_rc 0 "$GPUMEM" run -o "$W/logs/" -- "$EMU/emu_rt_shared_app" train 20
  expect_in "$W/err" "gpumem run: 1 log (pattern $W/logs/gpumem-%p.jsonl)"
  expect_in "$W/err" "gpumem run: 1 earlier log matches the pattern too, from before this run ($first)"
  expect_not_in "$W/err" "full report: gpumem report $first"
  expect_in "$W/err" "): a glob of the folder reads it with this run's, as more processes (a second rank 0 is \"rank 0#2\"); move it away before a run, or give -o a folder of its own"
  rm -rf "$W/logs"
  # A hint too long to list every log names the pattern's glob, which would read the earlier logs
  # too: with some there it lists this run's.
  long="$W/$(printf 'd%.0s' {1..210})"
  expect_rc 0 "$GPUMEM" run -o "$long/" -- "$EMU/emu_rt_shared_app" train 20
  expect_in "$W/err" "full report: gpumem report $long/gpumem-*.jsonl"
  expect_rc 0 "$GPUMEM" run -o "$long/" -- "$EMU/emu_rt_shared_app" train 20
  expect_not_in "$W/err" "full report: gpumem report $long/gpumem-*.jsonl"
  rm -rf "$long"
  # The program's own code.
  expect_rc 3 "$GPUMEM" run -- sh -c 'exit 3'
  expect_in "$W/err" "no log matching $W/gpumem-%p.jsonl was written"
  # Past the three OOMs it names, the summary counts the rest from n_oom, as its table's column: a
  # device keeps only its first 1000 OOMs, and 1100 read "1100" in the table, then "... 997 more".
  python3 - "$W/oom1100.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    f.write(json.dumps({"ev": "header", "format": "gpumem-events", "version": 4, "pid": 100, "devices": [{"index": 0, "name": "G", "total": 1 << 30}], "config": {"pool": "off"}}) + "\n")
    for i in range(1100):
        f.write(json.dumps({"ev": "alloc_fail", "seq": i, "t": 1000 + i, "tid": 1, "dev": 0, "api": "cudaMalloc", "kind": "device", "size": 2 << 30, "err": 2}) + "\n")
PY
  expect_rc 0 "$GPUMEM" run -o "$W/ooms/" -- sh -c 'cp "$1" "$2"' sh "$W/oom1100.jsonl" "$W/ooms/gpumem-1.jsonl"
  expect_in "$W/err" "  ... 1,097 more OOMs"
  expect_rc 0 "$GPUMEM" report "$W/ooms/gpumem-1.jsonl"
  expect_in "$W/out" "  ... 1,080 more OOMs"
  # A log that cannot be read is named with its control characters shown, as every message does (an
  # ESC in the name reached the terminal as is): here a file the command wrote where its log would be.
  esc=$(printf '\033')
  expect_rc 0 "$GPUMEM" run -o "$W/junk/x${esc}-%p.jsonl" -- sh -c 'printf "junk\n" > "$1"' sh "$W/junk/x${esc}-1.jsonl"
  expect_in "$W/err" "gpumem: warning: cannot summarize $W/junk/x^[-1.jsonl: $W/junk/x^[-1.jsonl:1: line 1 is not JSON"
  expect_in "$W/err" "  $W/junk/x^[-1.jsonl"
  expect_not_in "$W/err" "$esc"
  # So does the rest of what run says of its logs: the pattern, the list, the earlier logs; and the
  # "full report" command, meant to be pasted, names them in bash's $'...' (\e for the ESC), not
  # with the ESC as is (the terminal took it) nor as ^[ (another file): pasted, it reads the log.
  gpumem() { "$GPUMEM" "$@"; }
  expect_rc 0 "$GPUMEM" run -o "$W/lo${esc}gs/" -- "$EMU/emu_rt_shared_app" train 20
  expect_in "$W/err" "gpumem run: 1 log (pattern $W/lo^[gs/gpumem-%p.jsonl):"
  expect_in "$W/err" "  $W/lo^[gs/gpumem-"
  expect_in "$W/err" "full report: gpumem report \$'$W/lo\\egs/gpumem-"
  expect_not_in "$W/err" "$esc"
  first=$(ls "$W/lo${esc}gs/")
  pasted=$(sed -n 's/^full report: //p' "$W/err")
  expect_rc 0 eval "$pasted"
  expect_in "$W/out" "gpumem report: $W/lo^[gs/$first"
  expect_rc 0 "$GPUMEM" run -o "$W/lo${esc}gs/" -- "$EMU/emu_rt_shared_app" train 20
  expect_in "$W/err" "gpumem run: 1 earlier log matches the pattern too, from before this run ($W/lo^[gs/$first)"
  expect_not_in "$W/err" "$esc"
  pasted=$(sed -n 's/^full report: //p' "$W/err")
  expect_rc 0 eval "$pasted"
  expect_not_in "$W/out" "$first"
  expect_in "$W/out" "gpumem report: $W/lo^[gs/gpumem-"
  # The pattern's glob, for a list too long: the quoted parts around a bare *.
  long="$W/lo${esc}$(printf 'd%.0s' {1..210})"
  expect_rc 0 "$GPUMEM" run -o "$long/" -- "$EMU/emu_rt_shared_app" train 20
  expect_in "$W/err" "full report: gpumem report \$'$W/lo\\e$(printf 'd%.0s' {1..210})/gpumem-'*.jsonl"
  pasted=$(sed -n 's/^full report: //p' "$W/err")
  expect_rc 0 eval "$pasted"
  expect_in "$W/out" "gpumem report: $W/lo^[$(printf 'd%.0s' {1..210})/gpumem-"
  rm -rf "$W/lo${esc}gs" "$long"
  # Killed by a signal: 128 + SIGABRT; the log it left is summarized.
  expect_rc 134 "$GPUMEM" run -o "$W/crash/" -- "$EMU/emu_driver_app" crash abort 10
  expect_in "$W/err" "killed by signal 6 (exit code 134)"
  expect_in "$W/err" "signal 6"
  # SIGKILL leaves no end line: what it held is live where the log stops, not leaked.  The summary
  # says of it what the report says (it said "(killed?)" only after a last line cut short, the
  # report always), and the same with a cut line.
  expect_rc 137 "$GPUMEM" run -o "$W/killed/" -- "$EMU/emu_driver_app" crash kill 100
  expect_in "$W/err" "KiB *     0  no end line (killed or still running)"
  expect_in "$W/err" "* live when the log stops: the process did not exit, so not a leak"
  killed_log=$(ls "$W"/killed/*.jsonl)
  expect_rc 0 "$GPUMEM" report --no-progress "$killed_log"
  expect_in "$W/out" " events, no end line (killed or still running)"
  printf '{"ev":"free","seq":' >> "$killed_log"
  expect_rc 0 "$GPUMEM" report --no-progress "$killed_log"
  expect_in "$W/err" "the last line is cut short"
  expect_in "$W/out" " events, no end line (killed or still running)"
  # An exec: two logs of one pid, said as such, and no imbalance between the two images.
  expect_rc 0 "$GPUMEM" run -o "$W/exec/" -- "$EMU/emu_driver_app" exec execv 10
  expect_in "$W/err" "holds this process's log from before its exec"
  expect_not_in "$W/err" "already exists"
  expect_not_in "$W/err" "imbalance"
  # 127 not found, 126 not executable.
  expect_rc 127 "$GPUMEM" run -- "$W/no-such-program"
  expect_in "$W/err" "gpumem: error: cannot run $W/no-such-program"
  # The command never ran: no hint that it "made no CUDA call".
  expect_not_in "$W/err" "no log matching"
  expect_not_in "$W/err" "CUDA call"
  echo "not a program" > "$W/plain.txt"
  expect_rc 126 "$GPUMEM" run -- "$W/plain.txt"
  expect_not_in "$W/err" "CUDA call"
  # 2: gpumem's own arguments.
  expect_rc 2 "$GPUMEM" run
  expect_in "$W/err" "no command given"
  expect_rc 2 "$GPUMEM" run --pool maybe -- true
  expect_in "$W/err" "--pool maybe: expected on or off"
  expect_rc 2 "$GPUMEM" run --frobnicate -- true
  # An unknown token in -o (the library keeps it as written): refused before the command runs.
  for p in 'x-%q.jsonl' 'typo/%P/' 'x-100%'; do
    expect_rc 2 "$GPUMEM" run -o "$p" -- sh -c 'echo ran'
    expect_not_in "$W/out" "ran"
    expect_in "$W/err" "gpumem: error: -o $p: "
    expect_in "$W/err" "is no token; the tokens are %p (pid), %r (rank), %h (host) and %% (a percent sign)"
  done
  expect_in "$W/err" "a % at the end is no token"
  [ ! -e "$W/typo" ] || fail "-o typo/%P/: a directory was made for a refused pattern"
  expect_rc 2 env GPUMEM_LIB="$W/missing.so" "$GPUMEM" run -- true
  expect_in "$W/err" "GPUMEM_LIB=$W/missing.so is not a file"
  ;;
run_environment)
  lib=$(readlink -f "$BUILD/preload/libgpumem.so")
  # The library goes first and an LD_PRELOAD already set stays; GPUMEM_OUT is absolute.
  expect_rc 0 env LD_PRELOAD=/lib/x86_64-linux-gnu/libm.so.6 "$GPUMEM" run -o rel/x-%p.jsonl --pool off -- \
    sh -c 'echo "preload=$LD_PRELOAD"; echo "out=$GPUMEM_OUT"; echo "pool=$GPUMEM_POOL"; echo "ld=$LD_LIBRARY_PATH"'
  expect_in "$W/out" "preload=$lib:/lib/x86_64-linux-gnu/libm.so.6"
  expect_in "$W/out" "out=$W/rel/x-%p.jsonl"
  expect_in "$W/out" "pool=off"
  expect_in "$W/out" "ld=$EMU/driver:$EMU"
  # GPUMEM_OUT with an unknown token, without gpumem run: the program runs as ever, the log has the
  # name as written, and the library says so once.
  expect_rc 0 env LD_PRELOAD="$lib" GPUMEM_OUT="$W/odd-%q-%p.jsonl" "$EMU/emu_rt_shared_app" train 5
  expect_in "$W/out" "steps=5"
  ls "$W"/odd-%q-[0-9]*.jsonl > /dev/null 2>&1 || fail "no odd-%q-PID.jsonl"
  [ "$(grep -c "GPUMEM_OUT='$W/odd-%q-%p.jsonl': %q is no token (the tokens are %p (pid), %r (rank), %h (host) and %% (a percent sign)); kept as written" "$W/err")" = 1 ] ||
    fail "GPUMEM_OUT with %q: not warned of once: $(cat "$W/err")"
  # A pattern without %p is warned of (a second process would add .PID); "%%p" is a percent sign
  # and a p, not the pid.
  expect_rc 0 "$GPUMEM" run -o "$W/pp/x%%p.jsonl" --no-summary -- true
  expect_in "$W/err" "x%%p.jsonl has no %p"
  expect_rc 0 "$GPUMEM" run -o "$W/pp/y-%p.jsonl" --no-summary -- true
  expect_not_in "$W/err" "has no %p"
  # GPUMEM_OUT set in the environment is the pattern when -o is not given, as GPUMEM_POOL is the pool
  # setting when --pool is not: it was replaced by gpumem-%p.jsonl in the current directory without
  # a word.  Made absolute, its directory made, listed; -o still wins; its typos are refused by name.
  mkdir -p "$W/envcwd" && cd "$W/envcwd" || fail "cd envcwd"
  expect_rc 0 env GPUMEM_OUT=envlogs/ "$GPUMEM" run -- "$EMU/emu_rt_shared_app" train 3
  cd "$W" || fail "cd $W"
  ls "$W"/envcwd/envlogs/gpumem-[0-9]*.jsonl > /dev/null 2>&1 || fail "GPUMEM_OUT=envlogs/ ignored: $(ls -R "$W/envcwd")"
  expect_in "$W/err" "gpumem run: 1 log (pattern $W/envcwd/envlogs/gpumem-%p.jsonl)"
  expect_rc 0 env GPUMEM_OUT="$W/envlogs-not/" "$GPUMEM" run -o "$W/envlogs-o/" -- sh -c 'echo "out=$GPUMEM_OUT"'
  expect_in "$W/out" "out=$W/envlogs-o/gpumem-%p.jsonl"
  expect_rc 2 env GPUMEM_OUT="$W/typo-%q.jsonl" "$GPUMEM" run -- sh -c 'echo ran'
  expect_in "$W/err" "gpumem: error: GPUMEM_OUT=$W/typo-%q.jsonl: %q is no token"
  expect_not_in "$W/out" "ran"
  expect_rc 0 env GPUMEM_OUT= "$GPUMEM" run -- sh -c 'echo "out=$GPUMEM_OUT"'
  expect_in "$W/out" "out=$W/gpumem-%p.jsonl"
  # A relative pattern run from a directory whose name holds a % (here "%p"): that % is the
  # directory's, not a token, so the log lands in it and the library warns of nothing.
  mkdir -p "$W/at 100%p" && cd "$W/at 100%p" || fail "cd 'at 100%p'"
  expect_rc 0 "$GPUMEM" run -o x-%p.jsonl --no-summary -- "$EMU/emu_rt_shared_app" train 3
  cd "$W" || fail "cd $W"
  ls "$W/at 100%p"/x-[0-9]*.jsonl > /dev/null 2>&1 || fail "no log in 'at 100%p': $(ls -R "$W" | head -20)"
  expect_not_in "$W/err" "is no token"
  # A symlink to a directory counts as one only with a trailing '/', as GPUMEM_OUT does without
  # run (lstat, log-format.md "File safety"): without it the name is taken, and the log gets .PID.
  mkdir -p "$W/real" && ln -s "$W/real" "$W/link"
  expect_rc 0 "$GPUMEM" run -o "$W/link" --no-summary -- "$EMU/emu_rt_shared_app" train 3
  ls "$W"/link.[0-9]* > /dev/null 2>&1 || fail "-o LINK: no LINK.PID log: $(ls "$W")"
  [ -z "$(ls -A "$W/real")" ] || fail "-o LINK: the link was followed: $(ls "$W/real")"
  expect_rc 0 "$GPUMEM" run -o "$W/link/" --no-summary -- "$EMU/emu_rt_shared_app" train 3
  ls "$W"/real/gpumem-[0-9]*.jsonl > /dev/null 2>&1 || fail "-o LINK/: no log in the directory: $(ls "$W/real")"
  # --tensors: PyTorch's caching off for the child, and only with the flag.
  expect_rc 0 "$GPUMEM" run --tensors -o "$W/t/" -- sh -c 'echo "nocache=${PYTORCH_NO_CUDA_MEMORY_CACHING:-unset}"'
  expect_in "$W/out" "nocache=1"
  expect_rc 0 env -u PYTORCH_NO_CUDA_MEMORY_CACHING "$GPUMEM" run -o "$W/t/" -- sh -c 'echo "nocache=${PYTORCH_NO_CUDA_MEMORY_CACHING:-unset}"'
  expect_in "$W/out" "nocache=unset"
  # --tensors with the pool off: every tensor a driver call, which the guide advises against; said
  # once before the command starts (its output follows), and the command runs with its own code.
  warn="--tensors with --pool off: every tensor is a driver call (220-260 us per iteration of a small loop instead of 18-21 us with gpumem's pool; docs/guide.md)"
  expect_rc 3 "$GPUMEM" run --tensors --pool off -o "$W/t/" -- sh -c 'echo ran >&2; exit 3'
  [ "$(grep -cF -- "$warn" "$W/err")" = 1 ] || fail "--tensors --pool off: not warned of once: $(cat "$W/err")"
  [ "$(sed -n 1p "$W/err")" = "gpumem: warning: $warn" ] || fail "--tensors --pool off: warning not first: $(cat "$W/err")"
  expect_rc 0 env GPUMEM_POOL=no "$GPUMEM" run --tensors -o "$W/t/" -- true
  expect_in "$W/err" "--tensors with GPUMEM_POOL=no: every tensor is a driver call"
  # Not with the pool on (--pool on wins over GPUMEM_POOL), nor --pool off without --tensors.
  for a in "--tensors" "--tensors --pool on" "--pool off"; do
    expect_rc 0 env -u GPUMEM_POOL "$GPUMEM" run $a -o "$W/t/" -- true
    expect_not_in "$W/err" "driver call"
  done
  expect_rc 0 env GPUMEM_POOL=off "$GPUMEM" run --tensors --pool on -o "$W/t/" -- true
  expect_not_in "$W/err" "driver call"
  [ -d "$W/rel" ] || fail "-o rel/x-%p.jsonl did not create $W/rel"
  # --pool off reaches the recorder.
  expect_rc 0 "$GPUMEM" run --pool off -o "$W/p/" -- "$EMU/emu_rt_shared_app" train 5
  # Fragmentation is measured on the pool's segments: with none, the summary shows no 0.0%, and a
  # --max-fragmentation limit, which cannot fail there, says so.
  expect_in "$W/err" "gpumem summary"
  expect_not_in "$W/err" "0.0%"
  expect_rc 0 "$GPUMEM" check "$W"/p/*.jsonl --max-fragmentation 10%
  expect_in "$W/err" "--max-fragmentation: no gpumem pool segments on this device"
  "$GPUMEM" report --json "$W"/p/*.jsonl > "$W/p.json"
  [ "$(json "$W/p.json" 'd["processes"][0]["pool"]')" = off ] || fail "--pool off not in the log header"
  # An OOM in the summary names the call that asked, when stacks are on (native: a C program).
  expect_rc 0 env GPUMEM_STACKS=native "$GPUMEM" run -o "$W/oom/" -- "$EMU/emu_driver_app" basic
  expect_in "$W/err" "OOMs  ended"
  grep -q "^  OOM in pid .* of 1.00 PiB, verdict capacity, asked for by .*basic_driver.* (emu_app.cc:[0-9]*)" "$W/err" ||
    fail "the summary's OOM does not name its call: $(cat "$W/err")"
  # A forked child gets its own log; the run lists both.
  expect_rc 0 "$GPUMEM" run -o "$W/fork/" -- "$EMU/emu_driver_app" fork 10
  expect_in "$W/err" "gpumem run: 2 logs"
  [ "$(ls "$W"/fork/*.jsonl | wc -l)" = 2 ] || fail "fork: expected 2 logs"
  # The summary reads the logs in parallel, and still shows them in the order it lists them.
  listed=$(sed -n 's|^  .*/gpumem-\([0-9]*\)\.jsonl$|\1|p' "$W/err" | tr '\n' ' ')
  rows=$(sed -n '/^gpumem summary/,/^full report/s/^  \([0-9][0-9]*\) .*/\1/p' "$W/err" | tr '\n' ' ')
  [ -n "$listed" ] && [ "$listed" = "$rows" ] || fail "summary rows ($rows) not in the listed logs' order ($listed)"
  # -j bounds the summary's threads (and the logs held half-read); one thread gives the same rows.
  expect_rc 0 "$GPUMEM" run -j 1 -o "$W/fork1/" -- "$EMU/emu_driver_app" fork 10
  [ "$(sed -n '/^gpumem summary/,/^full report/p' "$W/err" | grep -c '^  [0-9]')" = 2 ] ||
    fail "run -j 1: expected 2 summary rows: $(cat "$W/err")"
  expect_rc 2 "$GPUMEM" run -j 0 -- true
  expect_in "$W/err" "gpumem: error: --jobs 0: expected a whole number from 1 to 1024"
  expect_rc 0 "$GPUMEM" check "$W"/fork/*.jsonl --max-fragmentation 100%
  expect_not_in "$W/err" "not measured"
  # %r is the rank; logs that were there before the run are not listed as this run's.
  touch "$W/rank7-old.jsonl"
  expect_rc 0 env RANK=7 "$GPUMEM" run -o "rank%r-%p.jsonl" -- "$EMU/emu_rt_shared_app" train 5
  ls "$W"/rank7-[0-9]*.jsonl > /dev/null 2>&1 || fail "no rank7-PID.jsonl"
  expect_in "$W/err" "gpumem run: 1 log"
  ! grep -q '^  .*rank7-old.jsonl$' "$W/err" || fail "rank7-old.jsonl listed as this run's: $(cat "$W/err")"
  expect_in "$W/err" "gpumem run: 1 earlier log matches the pattern too, from before this run ($W/rank7-old.jsonl)"
  # The "full report" hint quotes paths as a shell would, so it can be pasted.
  expect_rc 0 "$GPUMEM" run -o "$W/it's here/" -- "$EMU/emu_rt_shared_app" train 5
  expect_in "$W/err" "full report: gpumem report '$W/it'\\''s here/gpumem-"
  hint=$(grep "^full report: " "$W/err" | sed 's/^full report: gpumem report //')
  eval "set -- $hint"
  [ $# = 1 ] && [ -f "$1" ] || fail "the quoted hint does not name the log: $hint"
  # One row past the summary's screen: "1 more row".  The command writes 17 logs of its own.
  expect_rc 0 "$GPUMEM" run -o "$W/many/" -- sh -c 'for i in $(seq 1 17); do cp "$0" "${1}gpumem-$i.jsonl"; done' \
    "$SRC/tests/data/golden/pool_off_basic.jsonl" "$W/many/"
  expect_in "$W/err" "gpumem run: 17 logs"
  expect_in "$W/err" "  ... 1 more row: see gpumem report"
  # Wide values (12,345 blocks live where a log stops, a long rank) widen their columns: two spaces
  # still part every column, and each value ends under its heading.
  python3 - "$W/wide.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    f.write(json.dumps({"ev": "header", "format": "gpumem-events", "version": 1, "pid": 4242, "host": "gpu01",
                        "rank": "worker-0123456", "start_unix_ns": 1796010000000000000,
                        "devices": [{"index": 0, "name": "NVIDIA H200", "total": 150754820096}],
                        "config": {"pool": "off"}}) + "\n")
    for i in range(12345):
        f.write(json.dumps({"ev": "alloc", "seq": i, "t": 1000 * (i + 1), "tid": 4242, "dev": 0, "api": "cudaMalloc",
                            "kind": "device", "ptr": hex(0x7f0000000000 + i * (1 << 20)), "size": 1000000}) + "\n")
PY
  expect_rc 0 "$GPUMEM" run -o "$W/wide/" -- sh -c 'cp "$0" "${1}gpumem-1.jsonl"' "$W/wide.jsonl" "$W/wide/"
  expect_in "$W/err" "12,345 / 11.50 GiB *"
  summary_columns_apart
  expect_rc 137 "$GPUMEM" run -o "$W/killed2/" -- "$EMU/emu_driver_app" crash kill 100
  summary_columns_apart
  # A rank from the log is shown, its escape sequence never sent to the terminal.
  sed 's/"rank":"0"/"rank":"r\\u001b[2Jx"/' "$SRC/tests/data/golden/pool_off_basic.jsonl" > "$W/esc.jsonl"
  expect_rc 0 "$GPUMEM" run -o "$W/esc/" -- sh -c 'cp "$0" "${1}gpumem-1.jsonl"' "$W/esc.jsonl" "$W/esc/"
  expect_in "$W/err" "  r^[[2Jx  "
  summary_columns_apart
  # --no-summary lists the logs only.
  expect_rc 0 "$GPUMEM" run --no-summary -o "$W/q/" -- "$EMU/emu_rt_shared_app" train 5
  expect_in "$W/err" "gpumem run: 1 log"
  expect_not_in "$W/err" "gpumem summary"
  ;;
run_signals)
  # SIGINT, SIGQUIT, SIGTERM and SIGHUP sent to gpumem alone reach the command, as with timeout(1).
  # The command traps them and says so; gpumem then returns its exit code.
  for sig in INT QUIT TERM HUP; do
    rm -f "$W/ready"
    # `&` starts gpumem with SIGINT and SIGQUIT ignored, which it keeps (below): restore them first.
    (trap - INT QUIT; exec "$GPUMEM" run -o "$W/sig/" -- sh -c 'for s in INT QUIT TERM HUP; do trap "echo got $s; exit 7" $s; done; touch "$0"; i=0; while [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; echo not-signalled' "$W/ready" > "$W/out" 2> "$W/err") &
    pid=$!
    for _ in $(seq 100); do [ -e "$W/ready" ] && break; sleep 0.1; done
    kill -$sig $pid
    wait $pid
    rc=$?
    [ "$rc" = 7 ] || fail "SIG$sig to gpumem run: exit $rc, expected the command's 7"
    expect_in "$W/out" "got $sig"
  done
  # Ctrl-C in a script that runs gpumem run in a loop stops the script, as it does without gpumem:
  # the shell, which got the SIGINT too, goes on only when its child exited normally (it takes it
  # that the child handled the signal), and gpumem exited 130 where the command had died of SIGINT,
  # so the loop went on to its next run and the script ended 0.  (A SIGINT to the script's process
  # group, as Ctrl-C sends one to the terminal's foreground group.)
  rm -f "$W/ready"
  printf '%s\n' 'for i in 1 2; do' '  echo "iteration $i"' \
    '  "$1" run --no-summary -o "$2/loop/" -- sh -c '"'"'touch "$0"; sleep 3'"'"' "$2/ready"' \
    'done' 'echo "loop finished"' > "$W/loop.sh"
  (trap - INT QUIT; exec setsid bash "$W/loop.sh" "$GPUMEM" "$W" > "$W/out" 2> "$W/err") &
  pid=$!
  for _ in $(seq 100); do [ -e "$W/ready" ] && break; sleep 0.1; done
  kill -INT -- -$pid
  wait $pid
  rc=$?
  [ "$rc" = 130 ] || fail "Ctrl-C in a loop of gpumem run: the script exited $rc, expected 130 (killed by SIGINT)"
  expect_not_in "$W/out" "iteration 2"
  expect_not_in "$W/out" "loop finished"
  expect_in "$W/err" "was killed by signal 2 (exit code 130)"
  # For the shell that runs it, gpumem still ends with 128+N, after its summary.
  expect_rc 130 "$GPUMEM" run -o "$W/int/" -- sh -c 'kill -INT $$'
  expect_in "$W/err" "was killed by signal 2 (exit code 130)"
  # A signal gpumem was started with ignored (nohup: SIGHUP; a shell's `&`: SIGINT, SIGQUIT) reaches
  # the command ignored, as without gpumem; sent to gpumem, it ends neither.  Both were once killed.
  expect_rc 0 sh -c 'trap "" HUP INT QUIT; exec "$0" run -o "$1/ign/" -- sh -c "kill -HUP \$PPID; kill -HUP \$\$; kill -INT \$\$; kill -QUIT \$\$; echo survived"' "$GPUMEM" "$W"
  expect_in "$W/out" "survived"
  ;;
run_installed)
  # cmake --install puts gpumem in bin and libgpumem.so in lib; the installed gpumem finds its own.
  cmake --install "$BUILD" --prefix "$W/prefix" > "$W/install.log" || fail "cmake --install failed"
  [ -x "$W/prefix/bin/gpumem" ] || fail "no bin/gpumem"
  installed_lib=$(ls "$W"/prefix/lib*/libgpumem.so "$W"/prefix/lib/*/libgpumem.so 2>/dev/null | head -1)
  [ -n "$installed_lib" ] || fail "no libgpumem.so under $W/prefix/lib"
  expect_rc 0 "$W/prefix/bin/gpumem" run -- sh -c 'echo "preload=$LD_PRELOAD"'
  expect_in "$W/out" "preload=$(readlink -f "$installed_lib")"
  expect_rc 0 "$W/prefix/bin/gpumem" run -o "$W/logs/" -- "$EMU/emu_rt_shared_app" train 20
  expect_in "$W/err" "2 / 6.00 MiB"
  # GPUMEM_LIB overrides the search.
  mkdir -p "$W/custom" && cp "$installed_lib" "$W/custom/libgpumem.so"
  expect_rc 0 env GPUMEM_LIB="$W/custom/libgpumem.so" "$W/prefix/bin/gpumem" run -- sh -c 'echo "preload=$LD_PRELOAD"'
  expect_in "$W/out" "preload=$W/custom/libgpumem.so"
  # A gpumem with no libgpumem.so beside it says so and exits 2.
  mkdir -p "$W/lonely/bin" && cp "$W/prefix/bin/gpumem" "$W/lonely/bin/"
  expect_rc 2 "$W/lonely/bin/gpumem" run -- true
  expect_in "$W/err" "libgpumem.so not found; tried $W/lonely/bin/../lib/libgpumem.so"
  [ "$(grep -o "lonely/bin/../lib/libgpumem.so" "$W/err" | wc -l)" = 1 ] || fail "a path tried twice: $(cat "$W/err")"
  # Both copied into one folder, as --help says: found there.
  mkdir -p "$W/flat" && cp "$W/prefix/bin/gpumem" "$installed_lib" "$W/flat/"
  expect_rc 0 "$W/flat/gpumem" run -- sh -c 'echo "preload=$LD_PRELOAD"'
  expect_in "$W/out" "preload=$W/flat/libgpumem.so"
  # A folder with a space in its name: LD_PRELOAD splits there, so ld.so printed its own error and
  # the run recorded nothing ("no log ... was written").  Refused before the command runs, with the
  # way out: a link from a path without, in GPUMEM_LIB, which is kept as given (it was resolved
  # back to the spaced path).
  mkdir -p "$W/my tools" && cp "$W/prefix/bin/gpumem" "$installed_lib" "$W/my tools/"
  expect_rc 2 "$W/my tools/gpumem" run -o "$W/spaced/" -- sh -c 'echo ran'
  expect_in "$W/err" "gpumem: error: libgpumem.so's path '$W/my tools/libgpumem.so' holds a space or a colon"
  expect_in "$W/err" "set GPUMEM_LIB="
  expect_not_in "$W/out" "ran"
  expect_not_in "$W/err" "cannot be preloaded"
  expect_rc 2 env GPUMEM_LIB="$W/my tools/libgpumem.so" "$W/prefix/bin/gpumem" run -- true
  expect_in "$W/err" "holds a space or a colon"
  ln -s "$W/my tools/libgpumem.so" "$W/linked.so"
  expect_rc 0 env GPUMEM_LIB="$W/linked.so" "$W/my tools/gpumem" run -o "$W/spaced/" -- "$EMU/emu_rt_shared_app" train 20
  expect_not_in "$W/err" "cannot be preloaded"
  expect_in "$W/err" "2 / 6.00 MiB"
  ;;
check_limits)
  expect_rc 0 "$GPUMEM" check "$DATA/before.jsonl" --max-peak 3MiB --max-reserved 3MiB --max-leak 1MiB
  expect_in "$W/out" "3 limits on 1 GPU of 1 process: 0 broken"
  expect_rc 1 "$GPUMEM" check "$DATA/after.jsonl" --max-peak 3MiB --max-leak 1MiB --max-reserved 8MiB
  expect_in "$W/out" "3 limits on 1 GPU of 1 process: 2 broken"
  expect_in "$W/out" "FAIL rank 0 dev 0 (pid 2002, $DATA/after.jsonl): peak requested 7.00 MiB > limit 3.00 MiB (--max-peak 3MiB); at 2.50 us (seq 2)"
  expect_in "$W/out" "leaked 1.50 MiB > limit 1.00 MiB (--max-leak 1MiB); largest: 1.00 MiB from cudaMalloc at 1.00 us (seq 0)"
  expect_in "$W/out" "ok   rank 0 dev 0 (pid 2002, $DATA/after.jsonl): peak reserved 7.00 MiB <= limit 8.00 MiB"
  # A log with no end line (a killed process): what is allocated when it stops is not called leaked
  # (check once did, where report says "live when the log stops"); the limit counts the same bytes
  # (docs/metrics.md, Leaks), from the log or its report JSON, and the JUnit names stay.  Every
  # result on it says the log stopped short, as results on lossy logs say so: a killed run could
  # pass its limits with only a stderr warning, which a passing CI job hides.
  killed=$SRC/tests/data/golden/killed_truncated.jsonl
  "$GPUMEM" report --json "$killed" > "$W/killed.json" 2>/dev/null
  # (Each against the other as its baseline: a log is no baseline of itself.)
  for pair in "$killed|$W/killed.json" "$W/killed.json|$killed"; do
    expect_rc 1 "$GPUMEM" check "${pair%|*}" --max-leak 1MiB --baseline "${pair#*|}" --tolerance 0 --junit "$W/killed.xml"
    expect_in "$W/out" "FAIL rank 0 dev 0 (pid 7001, $killed): live when the log stops 2.00 MiB > limit 1.00 MiB (--max-leak 1MiB); largest: 2.00 MiB from cudaMalloc at 2.00 us (seq 1)"
    expect_in "$W/out" "ok   rank 0 dev 0 (pid 7001, $killed): live when the log stops 2.00 MiB <= baseline 2.00 MiB + 0% = 2.00 MiB"
    expect_not_in "$W/out" "leaked"
    expect_in "$W/killed.xml" '<failure message="live when the log stops 2.00 MiB &gt; limit'
    expect_in "$W/killed.xml" 'name="baseline leaked">'
    expect_in "$W/killed.xml" '= 2.00 MiB; the log has no end line (killed or still running): values up to where it stops; in the baseline, the log has no end line (killed or still running): values up to where it stops</system-out>'
    expect_in "$W/out" "7 limits on 1 GPU of 1 process: 1 broken, 7 on logs with no end line (incomplete)"
    expect_in "$W/out" "(--max-leak 1MiB); largest: 2.00 MiB from cudaMalloc at 2.00 us (seq 1); the log has no end line (killed or still running): values up to where it stops"
  done
  expect_rc 0 "$GPUMEM" check "$DATA/before.jsonl" --max-peak 1GiB --baseline "$killed"
  expect_in "$W/out" "; in the baseline, the log has no end line (killed or still running): values up to where it stops"
  expect_not_in "$W/out" "; the log has no end line"
  expect_in "$W/out" "on logs with no end line (incomplete)"
  # A log whose recorder lost events: every result on it says its values are approximate, in the
  # line and the JUnit message (a passing job's stderr warning goes unread), the baseline's too.
  lossy=$SRC/tests/data/bad/lost_record_end_count.jsonl
  "$GPUMEM" report --json "$lossy" > "$W/lossy.json" 2>/dev/null
  expect_rc 0 "$GPUMEM" check "$lossy" --max-peak 1GiB --baseline "$W/lossy.json" --junit "$W/lossy.xml"
  expect_in "$W/out" "7 limits on 1 GPU of 1 process: 0 broken, 7 on logs that lost events (approximate)"
  expect_in "$W/out" "ok   rank 0 dev 0 (pid 1, $lossy): peak requested 256 B <= limit 1.00 GiB (--max-peak 1GiB); 4 events were lost by the recorder: approximate"
  expect_in "$W/out" "= 268 B; 4 events were lost by the recorder: approximate; in the baseline, 4 events were lost by the recorder: approximate"
  expect_in "$W/lossy.xml" '<system-out>rank 0 dev 0 (pid 1, '"$lossy"'): peak requested 256 B &lt;= limit 1.00 GiB (--max-peak 1GiB); 4 events were lost by the recorder: approximate</system-out>'
  expect_rc 0 "$GPUMEM" check "$DATA/before.jsonl" --max-peak 1GiB --junit "$W/whole.xml"
  expect_not_in "$W/out" "lost"
  expect_not_in "$W/whole.xml" "system-out"
  # Decimal units, = syntax, and fragmentation as a ratio or percentage (this log peaks at 33.3%).
  expect_rc 1 "$GPUMEM" check "$DATA/before.jsonl" --max-peak=3000KB
  frag=$SRC/tests/data/golden/pool_fragmentation.jsonl
  expect_rc 1 "$GPUMEM" check "$frag" --max-fragmentation 30%
  expect_in "$W/out" "max external fragmentation 33.3% > limit 30.0% (--max-fragmentation 30%); of 1.50 MiB free at 6.00 us (seq 5)"
  expect_rc 0 "$GPUMEM" check "$frag" --max-fragmentation 0.34
  # A value and its limit that print alike named no difference ("7.00 MiB > limit 7.00 MiB", "33.3%
  # > limit 33.3%"): such a line gives both exactly, as they were compared.
  expect_rc 1 "$GPUMEM" check "$DATA/after.jsonl" --max-peak 7340031
  expect_in "$W/out" "FAIL rank 0 dev 0 (pid 2002, $DATA/after.jsonl): peak requested 7,340,032 B > limit 7,340,031 B (--max-peak 7340031); at 2.50 us (seq 2)"
  expect_rc 0 "$GPUMEM" check "$DATA/after.jsonl" --max-peak 7340032
  expect_in "$W/out" "peak requested 7.00 MiB <= limit 7.00 MiB (--max-peak 7340032)"
  expect_rc 1 "$GPUMEM" check "$frag" --max-fragmentation 0.3333
  expect_in "$W/out" "max external fragmentation 33.3333% > limit 33.3300% (--max-fragmentation 0.3333); of 1.50 MiB free"
  expect_rc 0 "$GPUMEM" check "$frag" --max-fragmentation 0.3333335
  expect_in "$W/out" "max external fragmentation 33.3333% <= limit 33.33335% (--max-fragmentation 0.3333335)"
  # --max-ooms: a program that caught its OOM exits 0; the log still had one (this log's 1.14 MiB).
  expect_rc 1 "$GPUMEM" check "$frag" --max-ooms 0
  expect_in "$W/out" "FAIL rank 0 dev 0 (pid 5001, $frag): OOMs 1 > limit 0 (--max-ooms 0); first: 1.14 MiB from cudaMalloc at 7.00 us (seq 6), fragmentation"
  expect_rc 0 "$GPUMEM" check "$frag" --max-ooms 1
  # An OOM whose driver free memory was not recorded: its verdict carries the report's caveat.
  { head -1 "$DATA/before.jsonl"
    echo '{"ev":"alloc_fail","seq":0,"t":1,"tid":1,"dev":0,"api":"cudaMalloc","kind":"device","ptr":"0x0","size":1073741824,"err":2}'
  } > "$W/unrecorded.jsonl"
  expect_rc 1 "$GPUMEM" check "$W/unrecorded.jsonl" --max-ooms 0
  expect_in "$W/out" "first: 1.00 GiB from cudaMalloc at 1 ns (seq 0), capacity, as far as the log says"
  expect_rc 1 "$GPUMEM" check "$frag" --max-ooms 0
  expect_not_in "$W/out" "as far as the log says"
  expect_rc 0 "$GPUMEM" check "$DATA/before.jsonl" --max-ooms 0
  for bad in -1 1.5 nan 1e30 abc; do
    expect_rc 2 "$GPUMEM" check "$frag" --max-ooms "$bad"
    expect_in "$W/err" "--max-ooms $bad: expected a whole number such as 0"
  done
  # Several logs: every rank is held to the limits.
  expect_rc 1 "$GPUMEM" check "$SRC/tests/data/golden/rank0.jsonl" "$SRC/tests/data/golden/rank1.jsonl" --max-peak 1GiB
  expect_in "$W/out" "2 limits on 2 GPUs of 2 processes: 1 broken"
  expect_in "$W/out" "FAIL rank 1 dev 1 (pid 8001, $SRC/tests/data/golden/rank1.jsonl): peak requested 3.00 GiB > limit 1.00 GiB"
  # --max-peak limits requested bytes (torch.cuda.max_memory_allocated()) unless --metric says
  # otherwise; pool_fragmentation.jsonl rounds 1.93 MiB requested up to 2.00 MiB allocated, and
  # pool_auto.jsonl reserves 2.00 MiB segments for 1.50 MiB of blocks.
  frag=$SRC/tests/data/golden/pool_fragmentation.jsonl
  expect_rc 0 "$GPUMEM" check "$frag" --max-peak 2.05MB
  expect_in "$W/out" "peak requested 1.93 MiB <= limit 1.96 MiB (--max-peak 2.05MB)"
  expect_rc 1 "$GPUMEM" check "$frag" --max-peak 2.05MB --metric allocated
  expect_in "$W/out" "FAIL rank 0 dev 0 (pid 5001, $frag): peak allocated 2.00 MiB > limit 1.96 MiB (--max-peak 2.05MB)"
  auto=$SRC/tests/data/golden/pool_auto.jsonl
  expect_rc 0 "$GPUMEM" check "$auto" --max-peak=1.75MiB --metric=allocated
  expect_rc 1 "$GPUMEM" check "$auto" --max-peak=1.75MiB --metric=reserved
  expect_in "$W/out" "peak reserved 2.00 MiB > limit 1.75 MiB (--max-peak 1.75MiB)"
  expect_rc 2 "$GPUMEM" check "$frag" --max-peak 2MiB --metric used
  expect_in "$W/err" "--metric used: expected requested, allocated or reserved"
  expect_rc 2 "$GPUMEM" check "$frag" --max-leak 1GiB --metric reserved
  expect_in "$W/err" "--metric says what --max-peak limits"
  # Sizes as the size rule writes them: fractions, spaces, decimal and binary units.
  expect_rc 0 "$GPUMEM" check "$DATA/after.jsonl" --max-peak 1.5GiB --max-leak "1.5 MiB"
  expect_rc 1 "$GPUMEM" check "$DATA/after.jsonl" --max-leak 1.4MiB
  # Every number follows the size rule's (digits, optionally '.' and digits): no exponent, for a
  # ratio, a count or a percentage as for a size (--tolerance 1e2 was taken, --max-peak 1e3 not),
  # and a unit, '%' too, may stand after spaces.  A bad one is named with its option.
  for bad in "--max-peak 1e3:a size" "--max-leak 1.5e6:a size" "--max-fragmentation 3e-1:a ratio" \
             "--max-ooms 1e0:a whole number" "--tolerance 1e2:a percentage" "--tolerance .5:a percentage" \
             "--max-fragmentation 1.:a ratio" "--tolerance 5%%:a percentage"; do
    opt=${bad%% *} rest=${bad#* } val=${rest%%:*} what=${rest#*:}
    expect_rc 2 "$GPUMEM" check "$DATA/before.jsonl" --max-reserved 1GiB "$opt" "$val"
    expect_in "$W/err" "gpumem: error: $opt $val: expected $what"
  done
  expect_rc 0 "$GPUMEM" check "$DATA/before.jsonl" --baseline "$DATA/after.jsonl" --tolerance "5 %"
  expect_in "$W/out" "+ 5%"
  expect_rc 0 "$GPUMEM" check "$frag" --max-fragmentation "34 %"
  expect_rc 1 "$GPUMEM" check "$frag" --max-fragmentation "30 %"
  # --quiet: only broken limits and the total.
  expect_rc 1 "$GPUMEM" check "$DATA/after.jsonl" --max-peak 3MiB --max-leak 1MiB --max-reserved 8MiB --quiet
  [ "$(wc -l < "$W/out")" = 3 ] || fail "--quiet printed more than the total and 2 FAIL lines: $(cat "$W/out")"
  expect_in "$W/out" "3 limits on 1 GPU of 1 process: 2 broken"
  expect_not_in "$W/out" "ok   "
  expect_rc 0 "$GPUMEM" check "$DATA/before.jsonl" --max-peak 3MiB -q
  [ "$(wc -l < "$W/out")" = 1 ] || fail "--quiet on a pass printed more than the total: $(cat "$W/out")"
  ;;
check_baseline)
  "$GPUMEM" report --json "$DATA/before.jsonl" > "$W/baseline.json" || fail "report --json"
  expect_rc 0 "$GPUMEM" check "$DATA/before.jsonl" --baseline "$W/baseline.json"
  expect_in "$W/out" "6 limits on 1 GPU of 1 process: 0 broken"
  # The report JSON of the run's own log, a different file, passed silently: a CI job that makes
  # the baseline from the run it then checks has a gate that cannot fail.  Said (same host, pid,
  # start and rank), exit 0 kept; not said of another run's baseline.
  own="every process of this run is in the --baseline $W/baseline.json (the same host, pid, start time and rank"
  expect_in "$W/err" "gpumem: warning: $own"
  expect_in "$W/err" "the run is being compared with itself, so the check against the baseline cannot fail; give the baseline of another run"
  expect_rc 1 "$GPUMEM" check "$DATA/after.jsonl" --baseline "$W/baseline.json" --tolerance 10%
  expect_not_in "$W/err" "compared with itself"
  expect_not_in "$W/err" "on another GPU"
  # A baseline recorded on another GPU (a CI runner that changed model or memory size) went
  # unnoticed: said, per device pair, naming both; the exit code stays the limits' own.
  # The check of after.jsonl against the baseline as edit_report's PY changes it (saved as NAME.json):
  # exit 1 from its limits whatever the GPU.
  check_edited() {
    edit_report "$W/baseline.json" "$W/$1.json" "$2"
    expect_rc 1 "$GPUMEM" check "$DATA/after.jsonl" --baseline "$W/$1.json" --tolerance 10%
  }
  check_edited h100 'dev["name"]="NVIDIA H100 80GB HBM3"; dev["total_bytes"]=85029158912'
  expect_in "$W/err" "gpumem: warning: rank 0 dev 0 (pid 2002, $DATA/after.jsonl) ran on another GPU than the baseline's: NVIDIA H200 (140.40 GiB) here, NVIDIA H100 80GB HBM3 (79.19 GiB) in the baseline (rank 0 dev 0 (pid 1001, $DATA/before.jsonl)): its memory use may differ for that alone (record the baseline on the GPU the check runs on)"
  check_edited small 'dev["total_bytes"]=85029158912'
  expect_in "$W/err" "NVIDIA H200 (140.40 GiB) here, NVIDIA H200 (79.19 GiB) in the baseline"
  # The same GPU whose reported size moved a little (a driver update, ECC turned on: 1/16 of a GDDR
  # card) warned on every check: the size alone is said only past 10% of the larger, a name always.
  check_edited ecc 'dev["total_bytes"]=dev["total_bytes"]*15//16'
  expect_not_in "$W/err" "on another GPU"
  check_edited near 'dev["total_bytes"]=dev["total_bytes"]*90//100 + 1'
  expect_not_in "$W/err" "on another GPU"
  check_edited far 'dev["total_bytes"]=dev["total_bytes"]*89//100'
  expect_in "$W/err" "NVIDIA H200 (140.40 GiB) here, NVIDIA H200 (124.96 GiB) in the baseline"
  check_edited renamed 'dev["name"]="NVIDIA H100 NVL"'
  expect_in "$W/err" "NVIDIA H200 (140.40 GiB) here, NVIDIA H100 NVL (140.40 GiB) in the baseline"
  # A baseline that does not record the GPU says nothing.
  check_edited nogpu 'dev["name"]=""; dev.pop("total_bytes")'
  expect_not_in "$W/err" "on another GPU"
  expect_in "$W/out" "FAIL rank 0 dev 0 (pid 2002, $DATA/after.jsonl): peak requested 7.00 MiB > baseline 3.00 MiB + 10% = 3.30 MiB; at 2.50 us (seq 2)"
  expect_in "$W/out" "leaked 1.50 MiB > baseline 1.00 MiB + 10% = 1.10 MiB"
  # Both runs had the pool off: fragmentation is not measured, and said so, not "0.0% <= 0.0%".
  expect_in "$W/out" "ok   rank 0 dev 0 (pid 2002, $DATA/after.jsonl): max external fragmentation not measured (no gpumem pool segments on this GPU): not compared with the baseline's (not measured either)"
  # Growth of 133% (peak) and 50% (leak) passes a 150% tolerance.
  expect_rc 0 "$GPUMEM" check "$DATA/after.jsonl" --baseline "$W/baseline.json" --tolerance 150
  expect_not_in "$W/err" "--tolerance"
  # A bare number below 1 is still a percentage (0.05 = 0.05%, as CI scripts rely on), but
  # --max-fragmentation reads 0.3 as 30%, so it may be meant as a ratio: said on stderr. Not for
  # 0, 1 and up, or with a % sign.
  expect_rc 1 "$GPUMEM" check "$DATA/after.jsonl" --baseline "$W/baseline.json" --tolerance 0.05
  expect_in "$W/err" "gpumem: warning: --tolerance 0.05 means 0.05%; for 5% write 5 or 5%"
  expect_in "$W/out" "peak requested 7.00 MiB > baseline 3.00 MiB + 0.05% = 3.00 MiB"
  expect_rc 0 "$GPUMEM" check "$DATA/before.jsonl" --baseline "$W/baseline.json" --tolerance=0.3 -q
  expect_in "$W/err" "gpumem: warning: --tolerance 0.3 means 0.3%; for 30% write 30 or 30%"
  for t in 0.05% 0 1 5; do
    expect_rc 0 "$GPUMEM" check "$DATA/before.jsonl" --baseline "$W/baseline.json" --tolerance "$t"
    expect_not_in "$W/err" "warning: --tolerance"
  done
  # Fragmentation grows by the tolerance in points, printed as given (one decimal said 0.1 for 0.05).
  "$GPUMEM" report --json "$SRC/tests/data/golden/pool_fragmentation.jsonl" > "$W/pooled.json" || fail "report --json"
  expect_rc 0 "$GPUMEM" check "$SRC/tests/data/golden/pool_fragmentation.jsonl" --baseline "$W/pooled.json" --tolerance 0.05%
  expect_in "$W/out" "max external fragmentation 33.3% <= baseline 33.3% + 0.05 points ="
  expect_not_in "$W/out" "+ 0.1 points"
  # A run just over its baseline under --tolerance 0 read "7.00 MiB > baseline 7.00 MiB + 0% = 7.00
  # MiB", and "33.3% > baseline 33.3% + 0 points = 33.3%": the values, exactly, as compared.
  edit_report "$W/baseline.json" "$W/near.json" 'dev["peak_requested_bytes"]=7340031'
  expect_rc 1 "$GPUMEM" check "$DATA/after.jsonl" --baseline "$W/near.json" --tolerance 0
  expect_in "$W/out" "FAIL rank 0 dev 0 (pid 2002, $DATA/after.jsonl): peak requested 7,340,032 B > baseline 7,340,031 B + 0% = 7,340,031 B; at 2.50 us (seq 2)"
  expect_in "$W/out" "leaked 1.50 MiB > baseline 1.00 MiB + 0% = 1.00 MiB"
  edit_report "$W/pooled.json" "$W/pooled-near.json" 'dev["max_external_fragmentation"]=0.3333'
  expect_rc 1 "$GPUMEM" check "$SRC/tests/data/golden/pool_fragmentation.jsonl" --baseline "$W/pooled-near.json" --tolerance 0
  expect_in "$W/out" "max external fragmentation 33.3333% > baseline 33.3300% + 0 points = 33.3300%; of 1.50 MiB free"
  # A process with no GPU (pinned host memory alone, or a log cut before its first allocation) that
  # shares the run's rank and started first was numbered too: the run's GPU became "rank 0#2",
  # failed as not in the baseline, and the baseline's "rank 0" as missing (diff: "(not in B)").
  # Only processes with a GPU are numbered.  (The baseline on another host: not the run's job.)
  { head -1 "$DATA/after.jsonl" | sed -e 's/"pid":2002,"ppid":100/"pid":2003,"ppid":2002/' \
      -e 's/"start_unix_ns":1796010000000000000,"start_time":"2026-11-30T03:40:00.000000000Z"/"start_unix_ns":1796009999000000000,"start_time":"2026-11-30T03:39:59.000000000Z"/'
    echo '{"ev":"alloc","seq":0,"t":1000,"tid":1,"dev":-1,"api":"cuMemHostAlloc","kind":"host","ptr":"0x7e0000000000","size":65536}'
    echo '{"ev":"end","seq":1,"t":2000,"tid":1,"reason":"exit","events":1,"n_alloc":1,"n_free":0,"n_fail":0,"live_allocs":1,"live_bytes":65536,"lost":0,"unmatched":0}'
  } > "$W/pinned.jsonl"
  grep -q '"pid":2003' "$W/pinned.jsonl" && grep -q '"start_unix_ns":1796009999000000000' "$W/pinned.jsonl" || fail "pinned.jsonl: header not edited"
  edit_report "$W/baseline.json" "$W/other-host.json" 'p["host"]="ci02"'
  expect_rc 0 "$GPUMEM" check "$DATA/after.jsonl" "$W/pinned.jsonl" --baseline "$W/other-host.json" --tolerance 200%
  expect_in "$W/out" "6 limits on 1 GPU of 2 processes: 0 broken"
  expect_in "$W/out" "ok   rank 0 dev 0 (pid 2002, $DATA/after.jsonl): peak requested 7.00 MiB <= baseline 3.00 MiB + 200% = 9.00 MiB"
  expect_not_in "$W/out" "0#2"
  expect_rc 0 "$GPUMEM" diff "$W/other-host.json" "$DATA/after.jsonl" "$W/pinned.jsonl"
  expect_in "$W/out" "B: rank 0 dev 0 (pid 2002, $DATA/after.jsonl)"
  expect_not_in "$W/out" "0#2"
  # Fragmentation is measured on gpumem's pool segments: a run without any (--pool off) against a
  # baseline that had them read 0.0% and passed without a word; said, as --max-fragmentation says it,
  # and on the result line (JUnit: its system-out), where it read "0.0% <= baseline 33.3%".
  expect_rc 1 "$GPUMEM" check "$DATA/before.jsonl" --baseline "$W/pooled.json" --junit "$W/unmeasured.xml"
  expect_in "$W/err" "rank 0 dev 0 (pid 1001, $DATA/before.jsonl): baseline max external fragmentation: no gpumem pool segments on this device"
  expect_in "$W/out" "ok   rank 0 dev 0 (pid 1001, $DATA/before.jsonl): max external fragmentation not measured (no gpumem pool segments on this GPU): not compared with the baseline's 33.3%"
  expect_in "$W/unmeasured.xml" "<system-out>rank 0 dev 0 (pid 1001, $DATA/before.jsonl): max external fragmentation not measured"
  # The other way round the run's fragmentation is held to the tolerance alone, and the baseline's
  # is named as not measured, not as 0.0%.
  expect_rc 1 "$GPUMEM" check "$SRC/tests/data/golden/pool_fragmentation.jsonl" --baseline "$W/baseline.json"
  expect_in "$W/out" "max external fragmentation 33.3% > baseline not measured (no gpumem pool segments there) + 5 points = 5.0%"
  # --max-fragmentation on such a GPU cannot fail: the line says so.
  expect_rc 0 "$GPUMEM" check "$DATA/before.jsonl" --max-fragmentation 10%
  expect_in "$W/out" "ok   rank 0 dev 0 (pid 1001, $DATA/before.jsonl): max external fragmentation not measured (no gpumem pool segments on this GPU): --max-fragmentation 10% cannot fail here"
  # Not said of a run that has them.
  expect_rc 0 "$GPUMEM" check "$SRC/tests/data/golden/pool_fragmentation.jsonl" --baseline "$W/pooled.json"
  expect_not_in "$W/err" "no gpumem pool segments"
  # The --max-* limits are absolute: a tolerance without --baseline is said to do nothing.
  expect_rc 0 "$GPUMEM" check "$DATA/before.jsonl" --max-peak 1GiB --tolerance 5
  expect_in "$W/err" "gpumem: warning: --tolerance 5 applies to --baseline only"
  expect_rc 0 "$GPUMEM" check "$DATA/before.jsonl" --max-peak 1GiB
  expect_not_in "$W/err" "warning"
  # A baseline rank missing from the run is a failure; a baseline given as a log works too.
  "$GPUMEM" report --json "$SRC/tests/data/golden/rank0.jsonl" "$SRC/tests/data/golden/rank1.jsonl" > "$W/ranks.json"
  "$GPUMEM" report --json "$SRC/tests/data/golden/rank0.jsonl" > "$W/rank0.json"
  expect_rc 1 "$GPUMEM" check "$SRC/tests/data/golden/rank0.jsonl" --baseline "$W/ranks.json"
  expect_in "$W/out" "FAIL rank 1 dev 1: in the baseline"
  # Rank 0 is compared with itself; only the missing rank can fail, as said.
  expect_in "$W/err" "compared with itself, so the check against the baseline cannot fail (but for the baseline's 1 process missing from the run)"
  expect_rc 0 "$GPUMEM" check "$SRC/tests/data/golden/rank0.jsonl" "$SRC/tests/data/golden/rank1.jsonl" --baseline "$W/ranks.json"
  expect_in "$W/err" "every process of this run is in the --baseline $W/ranks.json"
  expect_not_in "$W/err" "but for the baseline's"
  # OOMs may not grow over the baseline's: a run that caught one (PyTorch's retry after emptying its
  # cache) exits 0, and the baseline passed it with no limit on OOMs.
  "$GPUMEM" report --json "$SRC/tests/data/golden/pool_off_kinds.jsonl" > "$W/kinds.json"
  python3 - "$SRC/tests/data/golden/pool_off_kinds.jsonl" "$W/kinds_no_oom.jsonl" <<'PY'
import sys
open(sys.argv[2], "w").writelines(l for l in open(sys.argv[1]) if '"alloc_fail"' not in l)
PY
  expect_rc 0 "$GPUMEM" check "$W/kinds_no_oom.jsonl" --baseline "$W/kinds.json"
  expect_in "$W/out" "OOMs 0 <= baseline 1 + 5% = 1"
  "$GPUMEM" report --json "$W/kinds_no_oom.jsonl" > "$W/kinds_no_oom.json"
  expect_rc 1 "$GPUMEM" check "$SRC/tests/data/golden/pool_off_kinds.jsonl" --baseline "$W/kinds_no_oom.json" -q
  expect_in "$W/out" "FAIL rank 1 dev 0 (pid 6001, $SRC/tests/data/golden/pool_off_kinds.jsonl): OOMs 1 > baseline 0 + 5% = 0; first: 186.26 GiB from cudaMalloc at 13.00 us (seq 13), capacity, as far as the log says"
  expect_in "$W/out" "1 broken"
  # A GPU of the run that the baseline lacks is held to the --max-* limits; with none given nothing
  # checked it, and the run passed ("5 limits on 2 GPUs ... 0 broken", a warning on stderr only).
  expect_rc 1 "$GPUMEM" check "$SRC/tests/data/golden/rank0.jsonl" "$SRC/tests/data/golden/rank1.jsonl" --baseline "$W/rank0.json"
  expect_in "$W/out" "FAIL rank 1 dev 1 (pid "
  expect_in "$W/out" "not in the baseline, and no --max-* limit is given: nothing checks this GPU"
  expect_rc 0 "$GPUMEM" check "$SRC/tests/data/golden/rank0.jsonl" "$SRC/tests/data/golden/rank1.jsonl" --baseline "$W/rank0.json" --max-peak 1TiB
  expect_in "$W/err" "rank 1 dev 1 (pid "
  expect_in "$W/err" "is not in the baseline; only absolute limits apply to it"
  expect_not_in "$W/out" "nothing checks"
  # A limit that cannot fail on that GPU checks nothing there: --max-fragmentation on a GPU without
  # pool segments (these logs have none) passed it as "not measured", 0 broken.
  expect_rc 1 "$GPUMEM" check "$SRC/tests/data/golden/rank0.jsonl" "$SRC/tests/data/golden/rank1.jsonl" --baseline "$W/rank0.json" --max-fragmentation 10%
  expect_in "$W/out" "FAIL rank 1 dev 1 (pid "
  expect_in "$W/out" "not in the baseline, and no --max-* limit given can fail on it"
  expect_in "$W/out" "1 broken"
  # A glob given to --baseline (--baseline main/*.jsonl) left it the first log and gave the main
  # branch's other ranks to the run: rank 1 of main stood in for the run's missing rank 1 and passed
  # the --max-* limits, exit 0 with a warning only.  Logs of the baseline's run (one host and
  # parent, at the same time: golden/rank0 and rank1 are torchrun's two workers) beside another
  # run's are refused, naming both, exit 2; logs of that run only are read as ever (above).
  mkdir -p "$W/mr"
  sed 's/"pid":8000,"ppid":7999/"pid":9000,"ppid":8999/; s/"start_unix_ns":1796010000000000000/"start_unix_ns":1796020000000000000/' \
    "$SRC/tests/data/golden/rank0.jsonl" > "$W/mr/rank0.jsonl"
  expect_rc 2 "$GPUMEM" check --baseline "$SRC/tests/data/golden/rank0.jsonl" "$SRC/tests/data/golden/rank1.jsonl" "$W/mr/rank0.jsonl" --max-peak 1TiB
  expect_in "$W/err" "gpumem: error: $SRC/tests/data/golden/rank1.jsonl holds a process of the --baseline's run (rank 1, pid 8001 on gpu01, a child of parent 7999 as the baseline's, at the same time), and $W/mr/rank0.jsonl one of another run: --baseline takes one file"
  expect_in "$W/err" "give the baseline as one report JSON of all its logs (gpumem report --json main/*.jsonl > baseline.json)"
  expect_not_in "$W/out" "limit"
  # A process of that parent that ran after the baseline's ended (the next step of one job
  # script) is of another run, and is checked as ever.
  sed 's/"pid":8000,/"pid":8002,/; s/"start_unix_ns":1796010000000000000/"start_unix_ns":1796010000000004000/' \
    "$SRC/tests/data/golden/rank0.jsonl" > "$W/mr/later.jsonl"
  expect_rc 0 "$GPUMEM" check --baseline "$SRC/tests/data/golden/rank0.jsonl" "$W/mr/later.jsonl" "$W/mr/rank0.jsonl" --max-peak 1TiB
  expect_not_in "$W/err" "error"
  # The baseline's own process among the run's, in logs without a ppid (a report JSON another
  # tool wrote): matched as that process, and named so, not as "a child of parent 0".
  for r in 0 1; do sed 's/"ppid":7999,//' "$SRC/tests/data/golden/rank$r.jsonl" > "$W/mr/noppid$r.jsonl"; done
  expect_rc 0 "$GPUMEM" report --json "$W/mr/noppid0.jsonl" "$W/mr/noppid1.jsonl"
  cp "$W/out" "$W/mr/noppid.json"
  expect_rc 2 "$GPUMEM" check --baseline "$W/mr/noppid0.jsonl" "$W/mr/noppid.json" "$W/mr/rank0.jsonl" --max-peak 1TiB
  expect_in "$W/err" "gpumem: error: $W/mr/noppid.json holds a process of the --baseline's run (rank 0, pid 8000 on gpu01, the baseline's own process), and "
  expect_not_in "$W/err" "parent 0"
  # A child that rank 0 forked (its log gpumem-10005.jsonl sorts before rank 0's gpumem-9998.jsonl,
  # so a glob gives it to --baseline) is of the baseline's run too: its parent among the run's logs
  # was checked as the run's, exit 0.  Here pid 8005, forked by golden rank 0 (8000).
  sed 's/"pid":8000,"ppid":7999/"pid":8005,"ppid":8000/; s/"start_unix_ns":1796010000000000000/"start_unix_ns":1796010000000000500/' \
    "$SRC/tests/data/golden/rank0.jsonl" > "$W/mr/child.jsonl"
  expect_rc 2 "$GPUMEM" check --baseline "$W/mr/child.jsonl" "$SRC/tests/data/golden/rank0.jsonl" "$W/mr/rank0.jsonl" --max-peak 1TiB
  expect_in "$W/err" "gpumem: error: $SRC/tests/data/golden/rank0.jsonl holds a process of the --baseline's run (rank 0, pid 8000 on gpu01, the parent of the baseline's pid 8005, at the same time), and $W/mr/rank0.jsonl one of another run"
  expect_rc 2 "$GPUMEM" check --baseline "$SRC/tests/data/golden/rank0.jsonl" "$W/mr/child.jsonl" "$W/mr/rank0.jsonl" --max-peak 1TiB
  expect_in "$W/err" "gpumem: error: $W/mr/child.jsonl holds a process of the --baseline's run (rank 0, pid 8005 on gpu01, a child of the baseline's pid 8000, at the same time), and $W/mr/rank0.jsonl one of another run"
  expect_rc 0 "$GPUMEM" check "$DATA/before.jsonl" --baseline "$W/baseline.json" --tolerance 0%
  # The baseline among other logs (a glob that matches it too) was read as a run: the older one
  # took "rank 0", was checked against itself and passed, and the real run was only warned of.
  # Left out of the runs, and said; so is a copy of it (the same bytes under another name).
  mkdir -p "$W/g" && cp "$DATA/after.jsonl" "$W/g/gpumem-2002.jsonl" && cp "$W/baseline.json" "$W/g/baseline.json"
  expect_rc 1 "$GPUMEM" check "$W/g/baseline.json" "$W/g/gpumem-2002.jsonl" --baseline "$W/g/baseline.json"
  expect_in "$W/err" "$W/g/baseline.json is the --baseline: left out of the runs checked"
  expect_in "$W/out" "FAIL rank 0 dev 0 (pid 2002, $W/g/gpumem-2002.jsonl): peak requested 7.00 MiB > baseline 3.00 MiB"
  cp "$W/baseline.json" "$W/g/copy.json"
  expect_rc 1 "$GPUMEM" check "$W/g/copy.json" "$W/g/gpumem-2002.jsonl" --baseline "$W/g/baseline.json"
  expect_in "$W/err" "$W/g/copy.json is a copy of the --baseline $W/g/baseline.json (the same bytes): left out of the runs checked"
  expect_in "$W/out" "FAIL rank 0 dev 0 (pid 2002, $W/g/gpumem-2002.jsonl): peak requested 7.00 MiB > baseline 3.00 MiB"
  expect_in "$W/out" "of 1 process:"
  # The baseline as the run's only log, under any name (the file, a link to it, a copy of its bytes,
  # a cut copy of the log or the log of a cut baseline): the run was compared with itself and passed
  # whatever it held, exit 0, a CI gate that could not fail.  Refused before any analysis, naming
  # both, exit 2 (unusable input), with a --max-* limit given too.
  mkdir -p "$W/own" && cd "$W/own" || exit 1
  cp "$DATA/after.jsonl" run.jsonl && ln -s run.jsonl symlink.jsonl && ln run.jsonl hardlink.jsonl && cp run.jsonl copy.jsonl
  head -3 run.jsonl > cut.jsonl && cp "$W/baseline.json" base.json && cp base.json base-copy.json
  for args in "run.jsonl --baseline run.jsonl|run.jsonl is the --baseline" \
              "symlink.jsonl --baseline run.jsonl|symlink.jsonl is the same file as the --baseline run.jsonl" \
              "run.jsonl --baseline hardlink.jsonl|run.jsonl is the same file as the --baseline hardlink.jsonl" \
              "copy.jsonl --baseline run.jsonl --max-peak 1GiB|copy.jsonl is a copy of the --baseline run.jsonl (the same bytes)" \
              "run.jsonl --baseline cut.jsonl|run.jsonl and the --baseline cut.jsonl are copies of the log of process 2002 on ci01, started 2026-11-30T03:40:00.000000000Z" \
              "cut.jsonl --baseline run.jsonl|cut.jsonl and the --baseline run.jsonl are copies of the log of process 2002 on ci01" \
              "base-copy.json --baseline base.json|base-copy.json is a copy of the --baseline base.json (the same bytes)" \
              "copy.jsonl run.jsonl --baseline run.jsonl|copy.jsonl is a copy of the --baseline run.jsonl (the same bytes)"; do
    # shellcheck disable=SC2086
    expect_rc 2 "$GPUMEM" check ${args%%|*}
    expect_in "$W/err" "gpumem: error: ${args#*|}"
    expect_in "$W/err" ": the run would be compared with itself"
    expect_in "$W/err" "; give the baseline of another run (gpumem report --json of the main branch's logs)"
    expect_not_in "$W/out" "limit"
  done
  # Said as what it is: against its own cut copy the run can fail, so "pass whatever it holds" is
  # only said of the same bytes.
  expect_rc 2 "$GPUMEM" check run.jsonl --baseline cut.jsonl
  expect_not_in "$W/err" "pass whatever it holds"
  expect_rc 2 "$GPUMEM" check copy.jsonl --baseline run.jsonl
  expect_in "$W/err" "compared with itself and pass whatever it holds"
  cd "$W" || exit 1
  # A ratio compares at the report JSON's 6 decimals: a real log against its own report JSON under
  # --tolerance 0 read "max external fragmentation 9.4% > baseline 9.4% + 0 points = 9.4%".
  "$GPUMEM" report --json "$SRC/tests/data/h200/torch-default-pool-on.jsonl" > "$W/h200.json" || fail "report --json h200"
  expect_rc 0 "$GPUMEM" check "$SRC/tests/data/h200/torch-default-pool-on.jsonl" --baseline "$W/h200.json" --tolerance 0
  # A report JSON is accepted in place of a log.
  expect_rc 1 "$GPUMEM" check "$W/ranks.json" --max-peak 1GiB
  # ... also re-serialized with sorted keys (its first key is then "processes") or after a UTF-8
  # byte order mark: it was read as a log and refused ("line 1 is not a header").
  python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1])), sort_keys=True, separators=(',', ':')))" "$W/baseline.json" > "$W/sorted.json"
  expect_rc 0 "$GPUMEM" check "$DATA/before.jsonl" --baseline "$W/sorted.json"
  expect_in "$W/out" "6 limits on 1 GPU of 1 process: 0 broken"
  { printf '\xef\xbb\xbf'; cat "$W/baseline.json"; } > "$W/bom.json"
  expect_rc 0 "$GPUMEM" check "$DATA/before.jsonl" --baseline "$W/bom.json"
  expect_in "$W/out" "6 limits on 1 GPU of 1 process: 0 broken"
  # A baseline with no GPU in it compares nothing: unusable (it passed with "0 limits").
  printf '{"schema": "gpumem-report", "schema_version": 1, "processes": []}' > "$W/nogpu.json"
  expect_rc 2 "$GPUMEM" check "$DATA/before.jsonl" --baseline "$W/nogpu.json"
  expect_in "$W/err" "baseline: $W/nogpu.json: report's \"processes\" list is empty"
  ;;
check_junit)
  "$GPUMEM" report --json "$DATA/before.jsonl" > "$W/baseline.json"
  expect_rc 1 "$GPUMEM" check "$DATA/after.jsonl" --max-peak 8MiB --max-leak 1MiB --baseline "$W/baseline.json" --junit "$W/out.xml"
  python3 - "$W/out.xml" <<'PY' || fail "JUnit XML content"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
cases = root.findall("./testsuite/testcase")
# 2 limits + 6 baseline comparisons on one GPU.
assert len(cases) == 8, len(cases)
failed = {c.get("name") for c in cases if c.find("failure") is not None}
assert failed == {"max-leak", "baseline peak requested", "baseline peak allocated", "baseline peak reserved", "baseline leaked"}, failed
assert root.get("failures") == "5" and root.find("testsuite").get("tests") == "8"
assert "baseline OOMs" in {c.get("name") for c in cases}
assert all(c.get("classname") == "gpumem.rank_0.dev_0" for c in cases)
# The JUnit name says which bytes --max-peak held (requested unless --metric says otherwise).
assert "max-peak (requested)" in {c.get("name") for c in cases}, [c.get("name") for c in cases]
msg = [c.find("failure").get("message") for c in cases if c.get("name") == "max-leak"][0]
assert msg.startswith("leaked 1.50 MiB > limit 1.00 MiB"), msg
PY
  # Control characters in a rank or file name: well-formed XML, and no raw escapes on the terminal.
  expect_rc 1 "$GPUMEM" check "$SRC/tests/data/bad/report_control_chars.json" --max-peak 1KiB --junit "$W/ctl.xml"
  python3 -c "import sys,xml.etree.ElementTree as ET; ET.parse(sys.argv[1])" "$W/ctl.xml" || fail "JUnit XML with control characters is not well-formed"
  expect_in "$W/ctl.xml" 'classname="gpumem.rank_0^B^@.dev_0"'
  expect_in "$W/out" 'FAIL rank "0^B^@" dev 0 (pid 2002, after^A^[[31m.jsonl)'
  ! grep -q $'\x1b' "$W/out" || fail "an escape character reached the terminal"
  # diff names the GPU by the same key.
  expect_rc 0 "$GPUMEM" diff "$SRC/tests/data/bad/report_control_chars.json" "$SRC/tests/data/bad/report_control_chars.json"
  grep -Fxq 'rank "0^B^@" dev 0' "$W/out" || fail "diff: the GPU's heading does not show the rank's control characters as ^B^@"
  ! grep -q $'\x1b' "$W/out" || fail "diff: an escape character reached the terminal"
  # An empty rank (shown ?) and a rank of "?" are two GPUs, not one key the second overwrote.
  for r in "" "?"; do
    sed "s/\"rank\":\"0\"/\"rank\":\"$r\"/" "$DATA/before.jsonl" > "$W/rank_${#r}.jsonl"
  done
  expect_rc 0 "$GPUMEM" diff "$W/rank_0.jsonl" "$W/rank_1.jsonl" -- "$W/rank_0.jsonl" "$W/rank_1.jsonl"
  grep -Fxq 'rank ? dev 0' "$W/out" || fail "diff: no block for the empty rank"
  grep -Fxq 'rank "?" dev 0' "$W/out" || fail "diff: no block for the rank \"?\""
  # Two processes of rank 0 ("rank 0#2" for the second) and one of rank "0_2": three JUnit classes,
  # not two (junit_class spells "0#2" and "0_2" alike, and a CI viewer merged their cases).
  sed 's/"pid":1001/"pid":1002/' "$DATA/before.jsonl" > "$W/rank0_again.jsonl"
  sed 's/"rank":"0"/"rank":"0_2"/; s/"pid":1001/"pid":1003/' "$DATA/before.jsonl" > "$W/rank0_2.jsonl"
  expect_rc 0 "$GPUMEM" check "$DATA/before.jsonl" "$W/rank0_again.jsonl" "$W/rank0_2.jsonl" --max-peak 1GiB --junit "$W/ranks.xml"
  python3 - "$W/ranks.xml" <<'PY' || fail "JUnit classes of ranks 0, 0#2 and 0_2: $(cat "$W/ranks.xml")"
import sys, xml.etree.ElementTree as ET
names = sorted(c.get("classname") for c in ET.parse(sys.argv[1]).getroot().findall("./testsuite/testcase"))
assert names == ["gpumem.rank_0.dev_0", "gpumem.rank_0_2.dev_0", "gpumem.rank_0_2.dev_0_2"], names
PY
  # A file name that is not UTF-8 (byte 0xff): the XML stays well-formed, the byte shows as \xFF.
  badname=$W/$(printf 'after\xff.jsonl')
  cp "$DATA/after.jsonl" "$badname"
  expect_rc 1 "$GPUMEM" check "$badname" --max-peak 1KiB --junit "$W/badname.xml"
  python3 -c "import sys,xml.etree.ElementTree as ET; ET.parse(sys.argv[1])" "$W/badname.xml" || fail "JUnit XML with a non-UTF-8 file name is not well-formed"
  expect_in "$W/out" 'after\xFF.jsonl)'
  # U+FFFE and U+FFFF are valid UTF-8 but no XML characters: a parser refused the whole report.
  sed 's/"rank":"0"/"rank":"a\\uFFFEb\\uFFFF"/' "$DATA/after.jsonl" > "$W/nonchar.jsonl"
  expect_rc 1 "$GPUMEM" check "$W/nonchar.jsonl" --max-peak 1KiB --junit "$W/nonchar.xml"
  python3 -c "import sys,xml.etree.ElementTree as ET; ET.parse(sys.argv[1])" "$W/nonchar.xml" || fail "JUnit XML with U+FFFE is not well-formed"
  expect_in "$W/nonchar.xml" "rank_a$(printf '\xef\xbf\xbd')b"
  expect_rc 0 "$GPUMEM" check "$DATA/before.jsonl" --max-peak 8MiB --junit "$W/pass.xml"
  python3 -c "import sys,xml.etree.ElementTree as ET; r=ET.parse(sys.argv[1]).getroot(); assert r.get('failures')=='0' and len(r.findall('.//testcase'))==1" "$W/pass.xml" || fail "passing JUnit"
  ;;
check_bad_input)
  expect_rc 2 "$GPUMEM" check "$DATA/before.jsonl"
  expect_in "$W/err" "nothing to check"
  expect_rc 2 "$GPUMEM" check --max-peak 1GiB
  expect_in "$W/err" "no log file given"
  expect_rc 2 "$GPUMEM" check "$DATA/before.jsonl" --max-peak 12XB
  expect_in "$W/err" "--max-peak 12XB: expected a size"
  expect_rc 2 "$GPUMEM" check "$DATA/before.jsonl" --max-fragmentation 1.5
  expect_rc 2 "$GPUMEM" check "$DATA/before.jsonl" --max-peak 1GiB --tolerance lots
  # Hex, which strtod reads, is no ratio or percentage (0x0.1 passed as 6.25%, 0x5 as 5%).
  expect_rc 2 "$GPUMEM" check "$DATA/before.jsonl" --max-fragmentation 0x0.1
  expect_in "$W/err" "gpumem: error: --max-fragmentation 0x0.1: expected a ratio such as 0.3 or 30%"
  expect_rc 2 "$GPUMEM" check "$DATA/before.jsonl" --max-peak 1GiB --tolerance 0x5
  expect_in "$W/err" "gpumem: error: --tolerance 0x5: expected a percentage such as 5% or 0.5%"
  expect_rc 2 "$GPUMEM" check "$DATA/before.jsonl" --max-peak
  expect_rc 2 "$GPUMEM" check "$W/missing.jsonl" --max-peak 1GiB
  expect_rc 2 "$GPUMEM" check "$SRC/tests/data/bad/not_json.jsonl" --max-peak 1GiB
  expect_rc 2 "$GPUMEM" check "$SRC/tests/data/bad/empty.jsonl" --max-peak 1GiB
  # A gate shows what report shows about a log that lost events (the peak may be understated).
  expect_rc 0 "$GPUMEM" check "$SRC/tests/data/bad/lost_record_end_count.jsonl" --max-peak 1GiB
  expect_in "$W/err" "lost_record_end_count.jsonl:3: 4 event(s) were lost by the recorder"
  expect_rc 0 "$GPUMEM" diff "$SRC/tests/data/bad/lost_record_end_count.jsonl" "$DATA/before.jsonl"
  expect_in "$W/err" "lost_record_end_count.jsonl:3: 4 event(s) were lost by the recorder"
  # Issue 14 #2: a log whose file name is not UTF-8 (byte 0xff) still gives valid report JSON.
  badname=$W/$(printf 'log\xff.jsonl')
  cp "$SRC/tests/data/golden/rank1.jsonl" "$badname"
  expect_rc 0 "$GPUMEM" report --no-progress --json "$badname"
  python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$W/out" || fail "report --json on a non-UTF-8 file name: invalid JSON"
  expect_rc 0 "$GPUMEM" report --no-progress "$badname" --perfetto "$W/badname.trace"
  python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$W/badname.trace" || fail "--perfetto on a non-UTF-8 file name: invalid JSON"
  # An endless first line: refused in bounded memory and time (it was read whole to see whether
  # the file is a log).  Its start is no log's: refused at line 1 after 64 KiB of it.
  expect_rc 2 bash -c "ulimit -v 1000000; exec timeout 20 \"\$0\" check /dev/zero --max-peak 1GiB" "$GPUMEM"
  expect_in "$W/err" "gpumem: error: /dev/zero:1: line 1 is not JSON"
  expect_rc 2 bash -c "ulimit -v 1000000; exec timeout 20 \"\$0\" diff /dev/zero /dev/zero" "$GPUMEM"
  expect_in "$W/err" "gpumem: error: /dev/zero:1: line 1 is not JSON"
  # One that starts as a header does: at the log reader's line limit.
  expect_rc 2 bash -c "ulimit -v 1000000; (printf '{\"ev\":\"header\",\"x\":\"'; cat /dev/zero) | timeout 60 \"\$0\" check - --max-peak 1GiB" "$GPUMEM"
  expect_in "$W/err" "gpumem: error: /dev/stdin:1: line longer than"
  echo '{"schema": "something-else"}' > "$W/other.json"
  expect_rc 2 "$GPUMEM" check "$DATA/before.jsonl" --baseline "$W/other.json"
  expect_in "$W/err" "not a \`gpumem report --json\` file"
  # A device that cannot be matched with a GPU is named (it was left out without a word).
  printf '{"schema": "gpumem-report", "schema_version": 1, "processes": [{"rank": 0, "devices": [{"dev": "zero"}, 5]}]}' > "$W/odd.json"
  expect_rc 2 "$GPUMEM" check "$W/odd.json" --max-peak 1GiB
  expect_in "$W/err" "odd.json:1: process 0: device 0 of \"devices\" is not an object with an integer \"dev\""
  # The line is the bad device's own (line 4, the 5), not that of a "dev" in a later device.
  printf '{"schema": "gpumem-report", "schema_version": 1,\n"processes": [{"rank": 0, "devices": [\n{"dev": 0},\n5,\n{"dev": 1}]}]}' > "$W/odd.json"
  expect_rc 2 "$GPUMEM" check "$W/odd.json" --max-peak 1GiB
  expect_in "$W/err" "odd.json:4: process 0: device 1 of \"devices\" is not an object with an integer \"dev\""
  printf '{"schema": "gpumem-report", "schema_version": 1, "processes": [{"rank": 0, "devices": []}]}' > "$W/idle.json"
  expect_rc 2 "$GPUMEM" check "$W/idle.json" --max-peak 1GiB
  expect_in "$W/err" "no GPU memory activity"
  # ... and as a baseline: nothing to compare against is an error, not a pass.
  expect_rc 2 "$GPUMEM" check "$DATA/before.jsonl" --baseline "$W/idle.json"
  expect_in "$W/err" "no GPU memory activity to compare against"
  # Both name the file with its control characters made visible, as other messages do.
  cp "$W/idle.json" "$W/id$(printf '\033')le.json"
  expect_rc 2 "$GPUMEM" check "$W/id$(printf '\033')le.json" --max-peak 1GiB
  expect_in "$W/err" "gpumem: error: no GPU memory activity in $W/id^[le.json"
  expect_rc 2 "$GPUMEM" check "$DATA/before.jsonl" --baseline "$W/id$(printf '\033')le.json"
  expect_in "$W/err" "gpumem: error: baseline $W/id^[le.json: no GPU memory activity to compare against"
  # A compressed log (as tests/data/replay keeps them) is named as such, with the way to read it:
  # the pipe spelled out with the file and the command that met it, ready to copy (it once said
  # "zcat FILE | gpumem COMMAND /dev/stdin"), and standard input as the guide spells it, "-".
  gz=$SRC/tests/data/replay/mlp-nocache.jsonl.gz
  expect_rc 2 "$GPUMEM" check "$gz" --max-peak 1GiB
  expect_in "$W/err" "gpumem: error: $gz:1: the file is gzip-compressed: decompress it first, or read it from a pipe (zcat $gz | gpumem check -)"
  expect_rc 2 "$GPUMEM" report "$gz"
  expect_in "$W/err" "$gz:1: the file is gzip-compressed: decompress it first, or read it from a pipe (zcat $gz | gpumem report -)"
  # diff reads two runs, and only one input can be "-": its advice puts the decompressed file, or
  # process substitution, in the compressed one's place (it once said "zcat B | gpumem diff -",
  # which dropped the other side), and both work as written, on either side.
  expect_rc 2 "$GPUMEM" diff "$DATA/before.jsonl" "$gz"
  expect_in "$W/err" "$gz:1: the file is gzip-compressed: decompress it first (zcat $gz > ${gz%.gz}) and give diff that file, or, in bash, give <(zcat $gz) in its place"
  expect_not_in "$W/err" "gpumem diff -"
  cp "$gz" "$W/side.jsonl.gz"
  expect_rc 2 "$GPUMEM" diff "$W/side.jsonl.gz" "$DATA/before.jsonl"
  expect_in "$W/err" "(zcat $W/side.jsonl.gz > $W/side.jsonl)"
  zcat "$W/side.jsonl.gz" > "$W/side.jsonl"
  expect_rc 0 "$GPUMEM" diff "$W/side.jsonl" "$DATA/before.jsonl"
  expect_rc 0 bash -c '"$0" diff <(zcat "$1") "$2"' "$GPUMEM" "$gz" "$DATA/before.jsonl"
  expect_in "$W/out" "rank 0 dev 0"
  expect_rc 0 bash -c '"$0" diff "$2" <(zcat "$1")' "$GPUMEM" "$gz" "$DATA/before.jsonl"
  expect_in "$W/out" "rank 0 dev 0"
  # check's baseline is read for --baseline, where "-" would be a log: the same advice as diff's
  # (it once said "zcat B | gpumem check -"), and it works as written.
  expect_rc 2 "$GPUMEM" check "$DATA/before.jsonl" --baseline "$W/side.jsonl.gz"
  expect_in "$W/err" "baseline: $W/side.jsonl.gz:1: the file is gzip-compressed: decompress it first (zcat $W/side.jsonl.gz > $W/side.jsonl) and give check --baseline that file, or, in bash, give <(zcat $W/side.jsonl.gz) in its place"
  expect_not_in "$W/err" "gpumem check -"
  # The same baseline through a pipe: the logs stay named; a process substitution's own name
  # (/dev/fd/N) is no file to decompress: the decompressor goes inside it.
  expect_rc 2 bash -c 'cat "$1" | "$0" check "$2" --baseline -' "$GPUMEM" "$W/side.jsonl.gz" "$DATA/before.jsonl"
  expect_in "$W/err" "the input is gzip-compressed: decompress it in the pipe, the logs named as before (... | zcat | gpumem check LOG... --baseline -)"
  expect_rc 0 bash -c 'zcat "$1" | "$0" check "$2" --baseline - --tolerance 1000%' "$GPUMEM" "$W/side.jsonl.gz" "$DATA/before.jsonl"
  expect_rc 2 bash -c '"$0" diff "$2" <(cat "$1")' "$GPUMEM" "$W/side.jsonl.gz" "$DATA/before.jsonl"
  expect_in "$W/err" "the input is gzip-compressed: decompress it inside the substitution (<(zcat FILE))"
  expect_rc 0 bash -c '"$0" check "$2" --baseline <(zcat "$1") --tolerance 1000%' "$GPUMEM" "$W/side.jsonl.gz" "$DATA/before.jsonl"
  # A name without the compression's extension gets .jsonl; one a shell would split is quoted.
  cp "$gz" "$W/packed log"
  expect_rc 2 "$GPUMEM" diff "$DATA/before.jsonl" "$W/packed log"
  expect_in "$W/err" "(zcat '$W/packed log' > '$W/packed log.jsonl') and give diff that file, or, in bash, give <(zcat '$W/packed log') in its place"
  # A name a shell would split is quoted; compressed bytes already in a pipe get the decompressor there.
  cp "$gz" "$W/my log's.jsonl.gz"
  expect_rc 2 "$GPUMEM" report "$W/my log's.jsonl.gz"
  expect_in "$W/err" "(zcat '$W/my log'\''s.jsonl.gz' | gpumem report -)"
  expect_rc 2 bash -c 'cat "$1" | "$0" report /dev/stdin' "$GPUMEM" "$gz"
  expect_in "$W/err" "/dev/stdin:1: the input is gzip-compressed: decompress it in the pipe (... | zcat | gpumem report -)"
  # The advice's pipe works as written, for each command.
  for cmd in "report" "check --max-peak 1GiB" "diff $DATA/before.jsonl" "replay"; do
    expect_rc 0 bash -c 'zcat "$1" | "$0" $2 -' "$GPUMEM" "$gz" "$cmd"
  done
  # xz and bzip2 too: they were "line 1 is not JSON".
  python3 -c "import bz2,lzma,sys; d=open(sys.argv[1],'rb').read(); open(sys.argv[2],'wb').write(lzma.compress(d)); open(sys.argv[3],'wb').write(bz2.compress(d))" \
    "$DATA/before.jsonl" "$W/before.jsonl.xz" "$W/before.jsonl.bz2"
  for cmd in "report" "check --max-peak 1GiB" "diff $DATA/before.jsonl" "replay"; do
    expect_rc 2 "$GPUMEM" $cmd "$W/before.jsonl.xz"
    expect_rc 2 "$GPUMEM" $cmd "$W/before.jsonl.bz2"
    if [ "${cmd%% *}" = diff ]; then
      expect_in "$W/err" "gpumem: error: $W/before.jsonl.bz2:1: the file is bzip2-compressed: decompress it first (bzcat $W/before.jsonl.bz2 > $W/before.jsonl) and give diff that file, or, in bash, give <(bzcat $W/before.jsonl.bz2) in its place"
      expect_rc 2 "$GPUMEM" $cmd "$W/before.jsonl.xz"
      expect_in "$W/err" "gpumem: error: $W/before.jsonl.xz:1: the file is xz-compressed: decompress it first (xzcat $W/before.jsonl.xz > $W/before.jsonl) and give diff that file, or, in bash, give <(xzcat $W/before.jsonl.xz) in its place"
    else
      expect_in "$W/err" "gpumem: error: $W/before.jsonl.bz2:1: the file is bzip2-compressed: decompress it first, or read it from a pipe (bzcat $W/before.jsonl.bz2 | gpumem ${cmd%% *} -)"
      expect_rc 2 "$GPUMEM" $cmd "$W/before.jsonl.xz"
      expect_in "$W/err" "gpumem: error: $W/before.jsonl.xz:1: the file is xz-compressed: decompress it first, or read it from a pipe (xzcat $W/before.jsonl.xz | gpumem ${cmd%% *} -)"
    fi
    expect_rc 2 bash -c 'cat "$1" | "$0" $2 -' "$GPUMEM" "$W/before.jsonl.xz" "$cmd"
    if [ "${cmd%% *}" = diff ]; then  # the other run is kept in the advice
      expect_in "$W/err" "/dev/stdin:1: the input is xz-compressed: decompress it in the pipe, each run on its side as before (... | xzcat | gpumem diff - B.jsonl, or diff A.jsonl -)"
    else
      expect_in "$W/err" "/dev/stdin:1: the input is xz-compressed: decompress it in the pipe (... | xzcat | gpumem ${cmd%% *} -)"
    fi
  done
  # A baseline cut short (a full disk, a killed job) is named with the line where the JSON stops.
  "$GPUMEM" report --json "$DATA/before.jsonl" | head -n 20 > "$W/cut.json"
  expect_rc 2 "$GPUMEM" check "$DATA/before.jsonl" --baseline "$W/cut.json"
  expect_in "$W/err" "gpumem: error: baseline: $W/cut.json:21: not valid JSON (syntax error"
  expect_rc 2 "$GPUMEM" report "$W/cut.json"
  expect_in "$W/err" "gpumem: error: $W/cut.json:21: not valid JSON"
  printf '{"schema": "gpumem-report", "schema_version": 99, "processes": []}' > "$W/future.json"
  expect_rc 2 "$GPUMEM" check "$DATA/before.jsonl" --baseline "$W/future.json"
  # A report of a newer schema version is read by the gpumem that wrote it (regenerating it here
  # is the other way); one of an older version is regenerated; a version that is no number is
  # named as such (a string "1" read as another version sent one looking for a version 1).
  expect_in "$W/err" "report schema version 99 is newer than the 1 this gpumem reads: read it with the newer gpumem that wrote it, or regenerate it with this gpumem's \`gpumem report --json\` on the run's logs"
  for v in 0 '"1"' null; do
    printf '{"schema": "gpumem-report", "schema_version": %s, "processes": []}' "$v" > "$W/version.json"
    expect_rc 2 "$GPUMEM" check "$DATA/before.jsonl" --baseline "$W/version.json"
    if [ "$v" = 0 ]; then
      expect_in "$W/err" "report schema version 0 is older than the 1 this gpumem reads: regenerate it with this gpumem's \`gpumem report --json\` on the run's logs"
    else
      expect_in "$W/err" "report's \"schema_version\" is $v, not a number (this gpumem reads version 1): regenerate it with this gpumem's \`gpumem report --json\` on the run's logs"
    fi
    expect_not_in "$W/err" "read it with the newer gpumem"
  done
  expect_rc 2 "$GPUMEM" check "$DATA/before.jsonl" --max-peak 1GiB --junit /nonexistent-dir/out.xml
  # A report JSON that lacks a member a limit needs is unusable (it once read as 0 and passed).
  bad=$SRC/tests/data/bad/report_no_peak.json
  # Named at the line of the device that lacks it, as the report JSON's other errors are (the file alone).
  at=$(( $(line_of "$bad" '"devices": \[') + 1 ))
  expect_rc 2 "$GPUMEM" check "$bad" --max-peak 1KiB
  expect_in "$W/err" "gpumem: error: $bad:$at: rank 0 dev 0 (pid 2002, after.jsonl) has no \"peak_requested_bytes\""
  expect_rc 2 "$GPUMEM" check "$bad" --max-peak 1KiB --metric reserved
  expect_in "$W/err" "has no \"peak_reserved_bytes\""
  expect_rc 2 "$GPUMEM" check "$DATA/before.jsonl" --baseline "$bad"
  expect_in "$W/err" "gpumem: error: baseline $bad:$at: rank 0 dev 0"
  # A member that a limit and the baseline both need is said once, not once for each.
  expect_rc 2 "$GPUMEM" check "$bad" --max-peak 1KiB --baseline "$DATA/before.jsonl"
  [ "$(grep -c 'has no "peak_requested_bytes"' "$W/err")" = 1 ] || fail "a missing member said more than once: $(cat "$W/err")"
  expect_in "$W/err" "has no \"peak_reserved_bytes\" (a number), which peak reserved needs"
  # Limits that need no missing member still work on it.
  expect_rc 1 "$GPUMEM" check "$bad" --max-leak 1KiB
  # diff shows a missing member as unknown, not as 0.
  expect_rc 0 "$GPUMEM" diff "$bad" "$DATA/after.jsonl"
  grep -qE "peak requested +\? +7.00 MiB" "$W/out" || fail "diff of a report without peak_*: $(grep 'peak requested' "$W/out")"
  ;;
diff)
  expect_rc 0 "$GPUMEM" diff "$DATA/before.jsonl" "$DATA/after.jsonl"
  expect_in "$W/out" "rank 0 dev 0"
  grep -qE "peak allocated +3.00 MiB +7.00 MiB +\+4.00 MiB \(\+133.3%\)" "$W/out" || fail "diff peak row"
  grep -qE "leaked bytes +1.00 MiB +1.50 MiB +\+512.00 KiB \(\+50.0%\)" "$W/out" || fail "diff leak row"
  grep -qE "allocations +2 +4 +\+2 \(\+100.0%\)" "$W/out" || fail "diff count row"
  expect_in "$W/out" "+ size class 4.00 MiB-8.00 MiB: 0 -> 1 allocations  [+4.00 MiB"
  expect_in "$W/out" "+ api cudaMalloc: peak live 3.00 MiB -> 7.00 MiB  [+4.00 MiB"
  expect_in "$W/out" "+ leaks from cudaMallocManaged: 0 B -> 512.00 KiB"
  expect_not_in "$W/out" "no end line"
  expect_not_in "$W/out" "approximate"
  # A side whose recorder lost events is said to be approximate above its table, as check says it
  # on each result: the changes read as exact before.
  sed 's/"lost":0/"lost":3/' "$DATA/after.jsonl" > "$W/after_lost.jsonl"
  expect_rc 0 "$GPUMEM" diff "$DATA/before.jsonl" "$W/after_lost.jsonl"
  expect_in "$W/out" "(B's log: 3 events were lost by the recorder, so its numbers are approximate)"
  expect_not_in "$W/out" "A's log"
  # A GPU compared with one of another model or memory size (a CI runner that changed GPU) is said
  # above its table, as check --baseline says it: the changes may be that alone.  By check's rule:
  # another name always, the size alone past 10% of the larger, nothing where a side does not record it.
  expect_not_in "$W/out" "another GPU"
  "$GPUMEM" report --json --no-progress "$DATA/before.jsonl" > "$W/before.json" 2> /dev/null
  edit_report "$W/before.json" "$W/h100.json" 'dev["name"]="NVIDIA H100 80GB HBM3"; dev["total_bytes"]=85029158912'
  expect_rc 0 "$GPUMEM" diff "$W/h100.json" "$DATA/after.jsonl"
  expect_in "$W/out" "  (B ran on another GPU than A's: NVIDIA H200 (140.40 GiB) in B, NVIDIA H100 80GB HBM3 (79.19 GiB) in A: its memory use may differ for that alone)"
  edit_report "$W/before.json" "$W/near.json" 'dev["total_bytes"]=dev["total_bytes"]*90//100 + 1'
  expect_rc 0 "$GPUMEM" diff "$W/near.json" "$DATA/after.jsonl"
  expect_not_in "$W/out" "another GPU"
  edit_report "$W/before.json" "$W/far.json" 'dev["total_bytes"]=dev["total_bytes"]*89//100'
  expect_rc 0 "$GPUMEM" diff "$DATA/after.jsonl" "$W/far.json"
  expect_in "$W/out" "  (B ran on another GPU than A's: NVIDIA H200 (124.96 GiB) in B, NVIDIA H200 (140.40 GiB) in A:"
  edit_report "$W/before.json" "$W/esc.json" 'dev["name"]="NVIDIA\u001bH100"'
  expect_rc 0 "$GPUMEM" diff "$W/esc.json" "$DATA/after.jsonl"
  expect_in "$W/out" "NVIDIA H200 (140.40 GiB) in B, NVIDIA^[H100 (140.40 GiB) in A"
  edit_report "$W/before.json" "$W/nogpu.json" 'dev["name"]=""; dev.pop("total_bytes")'
  expect_rc 0 "$GPUMEM" diff "$W/nogpu.json" "$DATA/after.jsonl"
  expect_not_in "$W/out" "another GPU"
  # --top N keeps the N largest changes, a drop ranked by its size as a growth is: against the
  # larger run as A, the 4 MiB drop comes before the 512 KiB ones, and the rest are counted.
  expect_rc 0 "$GPUMEM" diff --top 1 "$DATA/after.jsonl" "$DATA/before.jsonl"
  [ "$(sed -n '/top changes (by bytes)/,$p' "$W/out")" = "  top changes (by bytes)
    - api cudaMalloc: peak live 7.00 MiB -> 3.00 MiB  [-4.00 MiB; allocations 3 -> 2]
    ... 6 more (--top N)" ] || fail "diff --top 1: $(cat "$W/out")"
  # The smallest size class holds requests of 0 and 1 byte: it is named from 0 B.
  sed 's/"size":2097152/"size":1/g' "$DATA/before.jsonl" > "$W/one_byte.jsonl"
  expect_rc 0 "$GPUMEM" diff "$DATA/before.jsonl" "$W/one_byte.jsonl"
  expect_in "$W/out" "+ size class 0 B-2 B: 0 -> 1 allocations  [+1 B; bytes allocated over the run 0 B -> 1 B]"
  # Fragmentation is measured on gpumem's pool segments only (docs/metrics.md): a side that had none
  # (--pool off) is "not measured", not a 0.0% that reads as unfragmented, and has no change (a
  # pool-on run against a pool-off one was "-33.3 points", an improvement that was never measured).
  grep -qE "max external fragmentation +not measured +not measured +$" "$W/out" || fail "diff of pool-off runs: $(grep fragmentation "$W/out")"
  expect_rc 0 "$GPUMEM" diff "$SRC/tests/data/golden/pool_fragmentation.jsonl" "$DATA/before.jsonl"
  grep -qE "max external fragmentation +33.3% +not measured +$" "$W/out" || fail "diff pool on/off: $(grep fragmentation "$W/out")"
  grep -qE "end external fragmentation +27.3% +not measured +$" "$W/out" || fail "diff pool on/off: $(grep fragmentation "$W/out")"
  expect_not_in "$W/out" "points"
  # A side whose log has no end line (a killed process) did not exit: its live bytes are not
  # called leaks, in the rows, the changes by API or the note that says why (docs/metrics.md).
  expect_rc 0 "$GPUMEM" diff "$DATA/after.jsonl" "$SRC/tests/data/golden/killed_truncated.jsonl"
  expect_in "$W/out" "(B's log has no end line: killed or still running, so what was live at the end is not called a leak)"
  grep -qE "live bytes at log end +1.50 MiB +2.00 MiB" "$W/out" || fail "diff live-at-end row: $(grep 'log end' "$W/out")"
  expect_in "$W/out" "+ live at log end from cudaMalloc: 1.00 MiB -> 2.00 MiB  [+1.00 MiB; live allocations 1 -> 1]"
  expect_not_in "$W/out" "leaked"
  expect_not_in "$W/out" "leaks"
  # Leaks by API count every leaked allocation, not only the 50 largest that the report lists:
  # 60 leaked 1 MiB blocks are 60 MiB, where the listed ones add up to 50 MiB.
  for n in 60 50; do python3 - "$DATA/before.jsonl" "$W/leak$n.jsonl" $n <<'EOF'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
out, n = [lines[0]], int(sys.argv[3])
for i in range(n):
    out.append(json.dumps({"ev": "alloc", "seq": i, "t": 1000 * (i + 1), "tid": 1, "dev": 0, "api": "cudaMalloc",
                           "kind": "device", "ptr": hex(0x7f0000000000 + i * 0x100000), "size": 1048576}))
out.append(json.dumps({"ev": "end", "seq": n, "t": 100000, "tid": 1, "reason": "exit", "events": n, "n_alloc": n,
                       "n_free": 0, "n_fail": 0, "live_allocs": n, "live_bytes": n * 1048576, "lost": 0,
                       "unmatched": 0}))
open(sys.argv[2], "w").write("\n".join(out) + "\n")
EOF
  done
  # The text report says when it lists fewer leaks than there are (the 50 largest), and only then.
  expect_rc 0 "$GPUMEM" report --no-progress "$W/leak60.jsonl"
  expect_in "$W/out" "Leaks: allocations never freed: 60 allocations, 60.00 MiB requested (largest 50 listed)"
  expect_rc 0 "$GPUMEM" report --no-progress "$W/leak50.jsonl"
  expect_in "$W/out" "Leaks: allocations never freed: 50 allocations, 50.00 MiB requested"
  expect_not_in "$W/out" "listed)"
  expect_rc 0 "$GPUMEM" diff "$DATA/before.jsonl" "$W/leak60.jsonl"
  expect_in "$W/out" "+ leaks from cudaMalloc: 1.00 MiB -> 60.00 MiB  [+59.00 MiB; leaked allocations 1 -> 60]"
  "$GPUMEM" report --json "$W/leak60.jsonl" > "$W/leak60.json"
  expect_rc 0 "$GPUMEM" diff "$DATA/before.jsonl" "$W/leak60.json"
  expect_in "$W/out" "+ leaks from cudaMalloc: 1.00 MiB -> 60.00 MiB  [+59.00 MiB; leaked allocations 1 -> 60]"
  # A report JSON on either side; identical runs show no change.
  "$GPUMEM" report --json "$DATA/before.jsonl" > "$W/before.json"
  expect_rc 0 "$GPUMEM" diff "$W/before.json" "$DATA/before.jsonl"
  expect_in "$W/out" "no change by API, kind, size class or leak"
  # A ratio the report JSON rounded to 6 decimals (33.3%) is still "=" against its own log.
  "$GPUMEM" report --json "$SRC/tests/data/golden/pool_fragmentation.jsonl" > "$W/frag.json"
  expect_rc 0 "$GPUMEM" diff "$W/frag.json" "$SRC/tests/data/golden/pool_fragmentation.jsonl"
  grep -qE "max external fragmentation +33.3% +33.3% +=$" "$W/out" || fail "diff of a report against its log: $(grep fragmentation "$W/out")"
  expect_not_in "$W/out" "0.0 points"
  # A change under 0.05 points read "+0.0 points": given to the 6 decimals compared.
  edit_report "$W/frag.json" "$W/frag-near.json" 'dev["max_external_fragmentation"]-=0.000067'
  expect_rc 0 "$GPUMEM" diff "$W/frag-near.json" "$SRC/tests/data/golden/pool_fragmentation.jsonl"
  grep -qE "max external fragmentation +33.3% +33.3% +\+0\.0067 points$" "$W/out" || fail "diff of a change under 0.05 points: $(grep fragmentation "$W/out")"
  # A GPU only on one side.
  expect_rc 0 "$GPUMEM" diff "$SRC/tests/data/golden/rank1.jsonl" "$DATA/before.jsonl"
  expect_in "$W/out" "A: rank 1 dev 1 (pid 8001"
  expect_in "$W/out" "B: (not in B)"
  expect_in "$W/out" "A: (not in A)"
  # 2: arguments and input.
  expect_rc 2 "$GPUMEM" diff "$DATA/before.jsonl"
  expect_in "$W/err" "needs two runs"
  # With --, the side left empty is named: two runs on one side of it were "needs two runs" alone.
  expect_rc 2 "$GPUMEM" diff "$DATA/before.jsonl" --
  expect_in "$W/err" "gpumem: error: needs two runs: nothing after -- (A1 A2... -- B1 B2...: A's inputs, then --, then B's)"
  expect_rc 2 "$GPUMEM" diff "$DATA/before.jsonl" "$DATA/after.jsonl" --
  expect_in "$W/err" "gpumem: error: needs two runs: nothing after --"
  expect_rc 2 "$GPUMEM" diff -- "$DATA/before.jsonl" "$DATA/after.jsonl"
  expect_in "$W/err" "gpumem: error: needs two runs: nothing before --"
  expect_rc 2 "$GPUMEM" diff --
  expect_in "$W/err" "gpumem: error: needs two runs: A B, A B1 B2..., or A1 A2... -- B1 B2..."
  expect_rc 2 "$GPUMEM" diff "$DATA/before.jsonl" "$W/missing.jsonl"
  expect_rc 2 "$GPUMEM" diff "$DATA/before.jsonl" "$SRC/tests/data/bad/no_header.jsonl"
  expect_rc 2 "$GPUMEM" diff --top 0 "$DATA/before.jsonl" "$DATA/after.jsonl"
  # Several inputs per side, matched by rank and device: BASE... -- NEW..., logs or reports on
  # either side, and one baseline report against several logs (the guide's CI step).
  g=$SRC/tests/data/golden
  "$GPUMEM" report --json "$g/rank0.jsonl" "$g/rank1.jsonl" > "$W/ranks.json"
  expect_rc 0 "$GPUMEM" diff "$W/ranks.json" "$g/rank0.jsonl" "$g/rank1.jsonl"
  expect_in "$W/out" "B = $g/rank0.jsonl and 1 more (2 processes)"
  [ "$(grep -c "no change by API, kind, size class or leak" "$W/out")" = 2 ] || fail "diff report vs its logs: $(cat "$W/out")"
  expect_not_in "$W/out" "(not in"
  expect_rc 0 "$GPUMEM" diff "$g/rank0.jsonl" "$g/rank1.jsonl" -- "$W/ranks.json"
  [ "$(grep -c "no change by API, kind, size class or leak" "$W/out")" = 2 ] || fail "diff logs -- report"
  # One rank gone from the new run.
  expect_rc 0 "$GPUMEM" diff "$g/rank0.jsonl" "$g/rank1.jsonl" -- "$g/rank0.jsonl"
  expect_in "$W/out" "B: (not in B)"
  expect_in "$W/out" "A = $g/rank0.jsonl and 1 more (2 processes)"
  # A glob for A without -- (diff main/*.jsonl mr/*.jsonl) made A the first log alone and gave B
  # main's other ranks beside the merge request's, exit 0.  Refused, naming both, exit 2; with --
  # the sides are as given.
  mkdir -p "$W/mr"
  sed 's/"pid":8000,"ppid":7999/"pid":9000,"ppid":8999/; s/"start_unix_ns":1796010000000000000/"start_unix_ns":1796020000000000000/' \
    "$SRC/tests/data/golden/rank0.jsonl" > "$W/mr/rank0.jsonl"
  expect_rc 2 "$GPUMEM" diff "$SRC/tests/data/golden/rank0.jsonl" "$SRC/tests/data/golden/rank1.jsonl" "$W/mr/rank0.jsonl"
  expect_in "$W/err" "gpumem: error: $SRC/tests/data/golden/rank1.jsonl holds a process of A's run (rank 1, pid 8001 on gpu01, a child of parent 7999 as A's, at the same time), and $W/mr/rank0.jsonl one of another run: without --, A is the first input alone"
  expect_in "$W/err" "give several inputs per side as A1 A2 ... -- B1 B2 ..."
  expect_rc 0 "$GPUMEM" diff "$SRC/tests/data/golden/rank0.jsonl" "$SRC/tests/data/golden/rank1.jsonl" -- "$W/mr/rank0.jsonl"
  expect_in "$W/out" "A = $SRC/tests/data/golden/rank0.jsonl and 1 more (2 processes)"
  for r in 0 1; do sed 's/"ppid":7999,//' "$SRC/tests/data/golden/rank$r.jsonl" > "$W/mr/noppid$r.jsonl"; done
  expect_rc 0 "$GPUMEM" report --json "$W/mr/noppid0.jsonl" "$W/mr/noppid1.jsonl"
  cp "$W/out" "$W/mr/noppid.json"
  expect_rc 2 "$GPUMEM" diff "$W/mr/noppid0.jsonl" "$W/mr/noppid.json" "$W/mr/rank0.jsonl"
  expect_in "$W/err" "gpumem: error: $W/mr/noppid.json holds a process of A's run (rank 0, pid 8000 on gpu01, A's own process), and "
  expect_not_in "$W/err" "parent 0"
  # The HTML histogram names each size class as diff does (it said "512.00 KiB – 1024.00 KiB"), the
  # smallest from 0 B too.
  expect_rc 0 "$GPUMEM" diff "$DATA/before.jsonl" "$DATA/after.jsonl"
  classes=$(sed -n 's/^ *[+-] size class \(.*\): [0-9]* -> [0-9]* allocations.*/\1/p' "$W/out")
  [ "$(echo "$classes" | wc -l)" = 2 ] || fail "diff: expected 2 size classes: $(cat "$W/out")"
  expect_rc 0 "$GPUMEM" report --html "$W/after.html" "$DATA/after.jsonl" "$W/one_byte.jsonl"
  while IFS= read -r c; do expect_in "$W/after.html" "<title>$c: 1</title>"; done <<< "$classes"
  expect_in "$W/after.html" "<title>0 B-2 B: 1</title>"
  expect_not_in "$W/after.html" "1024.00 KiB"
  ;;
conventions)
  # One convention for every subcommand (CLI11): --help, both flag forms, one error prefix, exit 2
  # with a one-line hint instead of the usage text.
  expect_rc 0 "$GPUMEM" --help
  for sub in report run check diff replay; do
    grep -qE "^  $sub  +[a-z]" "$W/out" || fail "gpumem --help does not list $sub with one line"
  done
  expect_in "$W/out" "--version"
  expect_rc 0 "$GPUMEM" --version
  grep -qE "^gpumem [0-9]+\.[0-9]+" "$W/out" || fail "--version: $(cat "$W/out")"
  for sub in report run check diff replay; do
    expect_rc 0 "$GPUMEM" $sub --help
    expect_in "$W/out" "Usage: gpumem $sub"
    expect_rc 2 "$GPUMEM" $sub --no-such-flag x
    expect_in "$W/err" "gpumem: error: "
    expect_in "$W/err" "(gpumem $sub --help lists the options)"
    [ "$(wc -l < "$W/err")" = 2 ] || fail "$sub: usage error is not two lines: $(cat "$W/err")"
  done
  # An option of one value given twice was said in CLI11's words, "--max-peak: At Most 1 required
  # but received 2".
  for args in "check --max-peak 1GiB --max-peak=2GiB|--max-peak" "diff --top 3 --top 4|--top" \
              "report --html a.html --html b.html|--html" "run -o a/ -o b/ -- true|--out"; do
    expect_rc 2 "$GPUMEM" ${args%|*} "$DATA/before.jsonl"
    expect_in "$W/err" "gpumem: error: ${args#*|} is given 2 times: give it once"
  done
  # "-" reads standard input; as an output file it made a file named "-" (and stdout has the text).
  for opt in "report --html" "report --perfetto" "report --torch-snapshot" "check --max-peak 1GiB --junit"; do
    expect_rc 2 "$GPUMEM" $opt - "$DATA/before.jsonl"
    expect_in "$W/err" "-: give a file name (standard output carries the command's own output)"
    [ -e "$W/-" ] && fail "$opt -: wrote a file named -"
  done
  # The HTML report and the trace carry the command line: created 0600, as the log is.
  (umask 022 && "$GPUMEM" report --no-progress "$DATA/before.jsonl" --html "$W/mode.html" --perfetto "$W/mode.trace" > /dev/null)
  for f in mode.html mode.trace; do
    [ "$(stat -c %a "$W/$f")" = 600 ] || fail "$f: mode $(stat -c %a "$W/$f"), expected 600"
  done
  expect_rc 2 "$GPUMEM"
  expect_in "$W/err" "gpumem: error: no command given"
  expect_rc 2 "$GPUMEM" frobnicate
  expect_in "$W/err" "gpumem: error: unknown command 'frobnicate'"
  expect_in "$W/err" "(gpumem --help lists the commands)"
  # A stray -- before the command (CLI11 said "A subcommand is required" and pointed at `gpumem
  # report --help`).
  for pre in "--" "-v --"; do
    expect_rc 2 "$GPUMEM" $pre report "$DATA/before.jsonl"
    expect_in "$W/err" "gpumem: error: '--' before the command: give the command first, then -- (gpumem report -- LOG..., gpumem run -- PROGRAM...)"
    expect_in "$W/err" "(gpumem --help lists the commands)"
  done
  # --flag value and --flag=value in every subcommand.
  "$GPUMEM" report --json "$DATA/before.jsonl" > "$W/before.json"
  expect_rc 0 "$GPUMEM" report --html "$W/a.html" "$DATA/before.jsonl"
  expect_rc 0 "$GPUMEM" report --html="$W/b.html" --perfetto="$W/b.trace.json" "$DATA/before.jsonl"
  [ -s "$W/b.html" ] && [ -s "$W/b.trace.json" ] || fail "report --html=FILE --perfetto=FILE wrote nothing"
  expect_rc 0 "$GPUMEM" report --at=#2 "$DATA/before.jsonl"
  # --at's time takes spaces before its unit, as a size does, and the size rule's numbers only.
  expect_rc 0 "$GPUMEM" report --at '2 us' "$DATA/before.jsonl"
  cp "$W/out" "$W/at_space"
  expect_rc 0 "$GPUMEM" report --at 2us "$DATA/before.jsonl"
  cmp -s "$W/out" "$W/at_space" || fail "--at '2 us' and --at 2us differ: $(diff "$W/out" "$W/at_space")"
  for bad in 1e3us .5ms "2 " 2us5; do
    expect_rc 2 "$GPUMEM" report --at "$bad" "$DATA/before.jsonl"
    expect_in "$W/err" "gpumem: error: --at $bad: expected an event seq"
  done
  expect_rc 1 "$GPUMEM" check --max-peak=3000KB "$DATA/before.jsonl"
  expect_rc 1 "$GPUMEM" check --max-peak 3000KB "$DATA/before.jsonl"
  expect_rc 0 "$GPUMEM" check --baseline="$W/before.json" --tolerance=0% "$DATA/before.jsonl"
  expect_rc 0 "$GPUMEM" diff --top=2 "$DATA/before.jsonl" "$DATA/after.jsonl"
  expect_rc 0 "$GPUMEM" diff --top 2 "$DATA/before.jsonl" "$DATA/after.jsonl"
  # The list's cut is said at its edge: 7 changes, --top 6 hides one and says so; --top 7 none.
  expect_rc 0 "$GPUMEM" diff --top 6 "$DATA/before.jsonl" "$DATA/after.jsonl"
  expect_in "$W/out" "... 1 more (--top N)"
  expect_rc 0 "$GPUMEM" diff --top 7 "$DATA/before.jsonl" "$DATA/after.jsonl"
  expect_not_in "$W/out" "more (--top N)"
  expect_rc 2 "$GPUMEM" diff "$DATA/before.jsonl" -- "$DATA/after.jsonl" -- "$DATA/after.jsonl"
  expect_in "$W/err" "gpumem: error: a second --: diff compares two runs"
  expect_rc 2 "$GPUMEM" diff --top=0 "$DATA/before.jsonl" "$DATA/after.jsonl"
  expect_in "$W/err" "gpumem: error: --top"
  # An empty value (an unset variable: --junit "$JUNIT") is refused, not taken for "not given":
  # the output, gate or map it asked for would be skipped without a word.
  expect_rc 2 "$GPUMEM" check --max-peak 10GiB --junit "" "$DATA/before.jsonl"
  expect_in "$W/err" "gpumem: error: --junit: empty value"
  expect_rc 2 "$GPUMEM" check --max-peak 10GiB --baseline "" "$DATA/before.jsonl"
  expect_in "$W/err" "gpumem: error: --baseline: empty value"
  for opt in --html --perfetto --torch-snapshot --at; do
    expect_rc 2 "$GPUMEM" report $opt "" "$DATA/before.jsonl"
    expect_in "$W/err" "gpumem: error: $opt: empty value"
  done
  expect_rc 2 "$GPUMEM" replay --capacity "" "$DATA/before.jsonl"
  expect_in "$W/err" "gpumem: error: --capacity: empty value"
  # An option whose value was forgotten took the next argument, -- or another option, as its value:
  # `report --html --json LOG` wrote text and an HTML file named --json, `report --html -- LOG` a
  # file named --, `run -o -- PROGRAM` logged to a file named --.  Refused, naming both.
  for args in "report --html --json" "report --html --" "report --perfetto -v" "check --max-peak 1GiB --junit -q" \
              "check --max-peak 1GiB --junit --"; do
    set -- $args
    expect_rc 2 "$GPUMEM" "$@" "$DATA/before.jsonl"
    opt=${*: -2:1} next=${*: -1}
    expect_in "$W/err" "gpumem: error: $opt $next: $opt takes a value, and $next "
    [ "$(wc -l < "$W/err")" = 2 ] || fail "$args: usage error is not two lines: $(cat "$W/err")"
  done
  expect_in "$W/err" "for a file named --, write ./--"
  # A short option with its value attached (-j2) is the option as much as -j is: it wrote an HTML
  # file named -j2 and read the logs on all cores.
  expect_rc 2 "$GPUMEM" report --html -j2 "$DATA/before.jsonl"
  expect_in "$W/err" "gpumem: error: --html -j2: --html takes a value, and -j is one of gpumem report's options"
  [ ! -e "$W/-j2" ] || fail "--html took -j2 as its file"
  [ -z "$(ls "$W" | grep -e '^--')" ] || fail "an option took the next argument as its file: $(ls "$W")"
  expect_rc 2 "$GPUMEM" run -o -- sh -c 'echo ran'
  expect_in "$W/err" "gpumem: error: -o --: -o takes a value, and -- ends gpumem's options"
  expect_not_in "$W/out" "ran"
  expect_rc 2 "$GPUMEM" run -o --pool off -- sh -c 'echo ran'
  expect_in "$W/err" "gpumem: error: -o --pool: -o takes a value, and --pool is one of gpumem run's options"
  # A value given with = is the value as written; - is standard input where an input takes it.
  expect_rc 0 "$GPUMEM" check --max-peak 10GiB --baseline - "$DATA/before.jsonl" < "$W/before.json"
  # An output option that took a log as its FILE (a glob after --html) must not overwrite it: exit 2,
  # the log intact.  The same for an input named twice, and for a report JSON in the way.
  cp "$DATA/before.jsonl" "$DATA/after.jsonl" "$W/"
  sum=$(md5sum < "$W/before.jsonl")
  for opt in --html --perfetto --torch-snapshot; do
    expect_rc 2 "$GPUMEM" report $opt "$W/before.jsonl" "$W/after.jsonl"
    expect_in "$W/err" "gpumem: error: $opt $W/before.jsonl: holds a gpumem log, which $opt would overwrite"
  done
  expect_rc 2 "$GPUMEM" check --junit "$W/before.jsonl" "$W/after.jsonl" --max-peak 10GiB
  expect_in "$W/err" "--junit $W/before.jsonl: holds a gpumem log, which --junit would overwrite"
  # The same mistake with the one log of a run (`report --html LOG`): it was refused as "no log
  # file given", which names neither the log taken for the FILE nor the fix.
  for opt in --html --perfetto --torch-snapshot; do
    expect_rc 2 "$GPUMEM" report $opt "$W/before.jsonl"
    expect_in "$W/err" "gpumem: error: $opt $W/before.jsonl: holds a gpumem log, which $opt would overwrite"
  done
  expect_rc 2 "$GPUMEM" check --junit "$W/before.jsonl" --max-peak 10GiB
  expect_in "$W/err" "--junit $W/before.jsonl: holds a gpumem log, which --junit would overwrite"
  expect_rc 2 "$GPUMEM" report --html "$W/new.html"
  expect_in "$W/err" "gpumem: error: no log file given"
  expect_rc 2 "$GPUMEM" report --html "$W/before.json" "$DATA/before.jsonl"
  expect_in "$W/err" "before.json: holds a gpumem report"
  ln -sf "$W/after.jsonl" "$W/again.jsonl"
  expect_rc 2 "$GPUMEM" report --perfetto "$W/again.jsonl" "$W/after.jsonl"
  expect_in "$W/err" "--perfetto $W/again.jsonl: is also an input"
  [ "$(md5sum < "$W/before.jsonl")" = "$sum" ] || fail "an output option overwrote an input log"
  expect_rc 0 "$GPUMEM" report --html "$W/a.html" "$DATA/before.jsonl"  # an earlier report: replaced
  # An output written whole or not at all: a write that fails halfway (a file size limit: EFBIG)
  # leaves the earlier report as it was and no half file beside it.
  cp "$W/a.html" "$W/a.html.before"
  (trap '' XFSZ; ulimit -f 4; "$GPUMEM" report --no-progress --html "$W/a.html" "$DATA/before.jsonl") > "$W/out" 2> "$W/err" \
    && fail "report --html past the file size limit exited 0"
  expect_in "$W/err" "gpumem: error: --html $W/a.html: writing failed"
  cmp -s "$W/a.html" "$W/a.html.before" || fail "a failed --html write changed the earlier report"
  [ -z "$(ls -A "$W" | grep '^\.gpumem-out-')" ] || fail "a failed write left a file: $(ls -A "$W")"
  (trap '' XFSZ; ulimit -f 0; "$GPUMEM" check --max-peak 10GiB --junit "$W/a.html" "$DATA/before.jsonl" "$DATA/after.jsonl") \
    > "$W/out" 2> "$W/err" && fail "check --junit past the file size limit exited 0"
  cmp -s "$W/a.html" "$W/a.html.before" || fail "a failed --junit write changed the file it names"
  # Every output takes its name as the shell's > does (docs/guide.md), one rule for all four:
  # through a link the file it names is replaced (0600) and the link stays, a link to nothing
  # creates the file it names, a device is written through, a directory is refused.  Before,
  # --torch-snapshot refused a link and a device, and the others replaced a link to nothing with a
  # plain file.  What each writes starts with: <!DOCTYPE, {"traceEvents", pickle 4's \x80\x04, <?xml.
  write_out() {  # write_out I FILE: output I of the four to FILE
    case $1 in
      0) "$GPUMEM" report --no-progress "$DATA/before.jsonl" --html "$2" ;;
      1) "$GPUMEM" report --no-progress "$DATA/before.jsonl" --perfetto "$2" ;;
      2) "$GPUMEM" report --no-progress "$DATA/before.jsonl" --torch-snapshot "$2" ;;
      3) "$GPUMEM" check --max-peak 10GiB "$DATA/before.jsonl" --junit "$2" ;;
    esac
  }
  outs_opt=(--html --perfetto --torch-snapshot --junit)
  outs_head=("<!DOCTYPE" '{"traceEvents"' $'\x80\x04' "<?xml")
  for i in 0 1 2 3; do
    set -- write_out "$i"
    opt=${outs_opt[$i]} head=${outs_head[$i]}
    starts() { [ "$(head -c "$(printf '%s' "$head" | wc -c)" "$1" | od -An -c)" = "$(printf '%s' "$head" | od -An -c)" ]; }
    mkdir -p "$W/rule" "$W/rule/dir" && rm -f "$W/rule/"*.out "$W/rule/"*.link "$W/rule/sub/"* && mkdir -p "$W/rule/sub"
    echo old > "$W/rule/target.out" && chmod 644 "$W/rule/target.out"
    ln -s target.out "$W/rule/to-file.link"             # relative: from the link's directory
    ln -s "$W/rule/sub/new.out" "$W/rule/to-nothing.link"
    ln -s sub/rel-new.out "$W/rule/to-nothing-rel.link"
    expect_rc 0 "$@" "$W/rule/to-file.link"
    [ -L "$W/rule/to-file.link" ] || fail "$opt through a link replaced the link"
    starts "$W/rule/target.out" || fail "$opt through a link did not write the file it names: $(head -c 40 "$W/rule/target.out")"
    [ "$(stat -c %a "$W/rule/target.out")" = 600 ] || fail "$opt through a link: mode $(stat -c %a "$W/rule/target.out"), expected 600"
    for l in to-nothing:new to-nothing-rel:rel-new; do
      expect_rc 0 "$@" "$W/rule/${l%%:*}.link"
      [ -L "$W/rule/${l%%:*}.link" ] || fail "$opt through a link to nothing replaced the link with a file"
      starts "$W/rule/sub/${l#*:}.out" || fail "$opt through a link to nothing (${l%%:*}) did not create the file it names"
    done
    # Mixed with the command's own text there (check and report print theirs).
    "$@" /dev/stdout > "$W/rule/stdout.out" 2> "$W/err" || fail "$opt /dev/stdout failed: $(cat "$W/err")"
    LC_ALL=C grep -qaF -- "$head" "$W/rule/stdout.out" || fail "$opt /dev/stdout wrote nothing of its own"
    # Refused before the analysis (nothing of the report on stdout), not after it: on a large log
    # that was minutes of work thrown away.
    expect_rc 2 "$@" "$W/rule/dir"
    expect_in "$W/err" "gpumem: error: $opt $W/rule/dir: is a directory; not written"
    [ ! -s "$W/out" ] || fail "$opt DIR: the analysis ran before the directory was refused: $(head -c 80 "$W/out")"
    ln -s loop.link "$W/rule/loop.link"
    expect_rc 2 "$@" "$W/rule/loop.link"
    expect_in "$W/err" "gpumem: error: $opt $W/rule/loop.link: cannot write: Too many levels of symbolic links"
    [ ! -s "$W/out" ] || fail "$opt LOOP: the analysis ran before the loop was refused: $(head -c 80 "$W/out")"
    [ -L "$W/rule/loop.link" ] || fail "$opt replaced a loop of links with a file"
    # A folder that is not there (a typo, a CI step that forgot mkdir), named or behind a link to
    # nothing: `>` fails there too.  Before, the whole log was read and only the write said so.
    expect_rc 2 "$@" "$W/rule/no-such-dir/x.out"
    expect_in "$W/err" "gpumem: error: $opt $W/rule/no-such-dir/x.out: cannot create a file in $W/rule/no-such-dir/: No such file or directory"
    [ ! -s "$W/out" ] || fail "$opt NO-SUCH-DIR/FILE: the analysis ran before the missing folder was refused: $(head -c 80 "$W/out")"
    rm -f "$W/rule/to-no-dir.link" && ln -s no-such-dir/y.out "$W/rule/to-no-dir.link"
    expect_rc 2 "$@" "$W/rule/to-no-dir.link"
    expect_in "$W/err" "gpumem: error: $opt $W/rule/to-no-dir.link: cannot create a file in $W/rule/no-such-dir/: No such file or directory"
    [ ! -s "$W/out" ] || fail "$opt LINK-TO-NO-DIR: the analysis ran before the missing folder was refused: $(head -c 80 "$W/out")"
    [ -z "$(ls -A "$W/rule" "$W/rule/sub" | grep '^\.gpumem-out-')" ] || fail "$opt left a temporary file"
  done
  # The errors that name an output show its control characters as every message does (an ESC in the
  # name reached the terminal as is): a write that fails (a link to /dev/full), a directory, and one
  # file named twice.
  esc=$(printf '\033')
  ln -sf /dev/full "$W/rule/snap${esc}.pickle" && mkdir -p "$W/rule/dir${esc}"
  expect_rc 2 "$GPUMEM" report --no-progress "$DATA/before.jsonl" --torch-snapshot "$W/rule/snap${esc}.pickle"
  expect_in "$W/err" "gpumem: error: --torch-snapshot $W/rule/snap^[.pickle: writing failed: No space left on device"
  expect_rc 2 "$GPUMEM" report --no-progress "$DATA/before.jsonl" --torch-snapshot "$W/rule/dir${esc}"
  expect_in "$W/err" "gpumem: error: --torch-snapshot $W/rule/dir^[: is a directory; not written"
  expect_rc 2 "$GPUMEM" report --html "$W/rule/same${esc}.out" --torch-snapshot "$W/rule/same${esc}.out" "$DATA/before.jsonl"
  expect_in "$W/err" "gpumem: error: --html and --torch-snapshot both name $W/rule/same^[.out: give each output its own file"
  # So do report's messages about one log (built as the log's name and what befell it): a report
  # JSON given to --torch-snapshot or --at, a log that is no JSON, one not there, and a warning read
  # back from a report JSON; -v's debug lines too.  Each reached the terminal with its ESC as is.
  "$GPUMEM" report --json --no-progress "$DATA/before.jsonl" > "$W/rule/r${esc}.json"
  expect_rc 2 "$GPUMEM" report --no-progress "$W/rule/r${esc}.json" --torch-snapshot "$W/rule/t.pickle"
  expect_in "$W/err" "gpumem: error: $W/rule/r^[.json: --torch-snapshot needs the event log"
  expect_not_in "$W/err" "$esc"
  expect_rc 2 "$GPUMEM" report --no-progress -v --at 5 "$W/rule/r${esc}.json"
  expect_in "$W/err" "$W/rule/r^[.json: reading as a \`gpumem report --json\` file"
  expect_in "$W/err" "gpumem: error: $W/rule/r^[.json: --at needs the event log"
  expect_not_in "$W/err" "$esc"
  printf 'junk\n' > "$W/rule/j${esc}.jsonl"
  expect_rc 2 "$GPUMEM" report --no-progress "$W/rule/j${esc}.jsonl" "$W/rule/gone${esc}.jsonl"
  expect_in "$W/err" "gpumem: error: $W/rule/j^[.jsonl:1: line 1 is not JSON"
  expect_in "$W/err" "gpumem: error: $W/rule/gone^[.jsonl: cannot open: No such file or directory"
  expect_not_in "$W/err" "$esc"
  edit_report "$W/rule/r${esc}.json" "$W/rule/w.json" 'p["warnings"] = ["x.jsonl:3: a\x1b[31m warning"]; p["n_warnings"] = 2'
  cp "$DATA/after.jsonl" "$W/rule/a${esc}.jsonl"
  expect_rc 0 "$GPUMEM" report --no-progress -v "$W/rule/w.json" "$W/rule/a${esc}.jsonl"
  expect_in "$W/err" "gpumem: warning: x.jsonl:3: a^[[31m warning"
  expect_in "$W/err" "gpumem: debug: $W/rule/a^[.jsonl: 8 lines, 7 events"
  expect_not_in "$W/err" "$esc"
  # So do the errors that name an input, of every command: a log that is not there, and one that
  # is not JSON (an ESC and a byte that is not UTF-8 in its name reached the terminal as is).
  bad="$W/rule/in${esc}$(printf '\377')"
  printf 'junk\n' > "$bad.jsonl"
  for cmd in "report" "check --max-peak 1GiB" "diff $DATA/before.jsonl" "replay"; do
    for f in "$bad.jsonl" "$bad-none.jsonl"; do
      # shellcheck disable=SC2086
      expect_rc 2 "$GPUMEM" $cmd --no-progress "$f"
      expect_in "$W/err" "gpumem: error: $W/rule/in^[\xFF"
      ! grep -q "$esc" "$W/err" || fail "$cmd: an escape character of an input's name reached the terminal"
    done
  done
  # And an argument's value in its error, and a command that cannot be run.
  expect_rc 2 "$GPUMEM" check "$DATA/before.jsonl" --max-peak "1${esc}"
  expect_in "$W/err" "1^["
  ! grep -q "$esc" "$W/err" || fail "check: an escape character of an argument reached the terminal"
  expect_rc 127 "$GPUMEM" run -- "$W/rule/no${esc}"
  expect_in "$W/err" "gpumem: error: cannot run $W/rule/no^[: No such file or directory"
  ! grep -q "$esc" "$W/err" || fail "run: an escape character of the command reached the terminal"
  # The headers of diff and replay name a log; run's list, its messages and its summary name logs,
  # ranks and the pattern; its `full report:` line is still one to paste ($'...' in bash).
  cp "$DATA/before.jsonl" "$W/rule/ok${esc}.jsonl"
  expect_rc 0 "$GPUMEM" diff "$DATA/after.jsonl" "$W/rule/ok${esc}.jsonl"
  expect_in "$W/out" "  B = $W/rule/ok^[.jsonl (1 process)"
  expect_rc 0 "$GPUMEM" replay "$W/rule/ok${esc}.jsonl"
  expect_in "$W/out" "== $W/rule/ok^[.jsonl: device 0"
  ! grep -q "$esc" "$W/out" || fail "diff or replay: an escape character of a log's name reached the terminal"
  for i in 1 2; do
    expect_rc 0 env RANK="r${esc}" "$GPUMEM" run -o "$W/rule/e${esc}sc/" -- "$EMU/emu_rt_shared_app" train 20
  done
  ! grep -q "$esc" "$W/err" || fail "run: an escape character reached the terminal: $(cat -v "$W/err")"
  expect_in "$W/err" "gpumem run: 1 log (pattern $W/rule/e^[sc/gpumem-%p.jsonl):"
  expect_in "$W/err" "from before this run ($W/rule/e^[sc/gpumem-"
  expect_in "$W/err" "r^["
  line=$(sed -n 's/^full report: gpumem //p' "$W/err")
  case "$line" in *"\$'"*"\\e"*) ;; *) fail "full report line not quoted as \$'...': $line" ;; esac
  eval "\"\$GPUMEM\" $line" > /dev/null 2>&1 || fail "the full report line does not run: $line"
  # What goes to stdout is an output too: `report --json > r.json` on a full disk is an error (exit
  # 2), not a cut file and exit 0.
  for cmd in "report" "report --json" "check --max-peak 10GiB" "diff $DATA/before.jsonl" "replay" "replay --json"; do
    "$GPUMEM" $cmd --no-progress "$DATA/after.jsonl" > /dev/full 2> "$W/err"
    rc=$?
    [ "$rc" = 2 ] || fail "$cmd > /dev/full exited $rc, expected 2"
    expect_in "$W/err" "gpumem: error: writing to stdout failed ("
  done
  # So is the help and the version (the man page is written from --help): they exited 0 with nothing
  # written.
  for args in "--help" "--version" "report --help" "check -h" "run --help"; do
    "$GPUMEM" $args > /dev/full 2> "$W/err"
    rc=$?
    [ "$rc" = 2 ] || fail "gpumem $args > /dev/full exited $rc, expected 2"
    expect_in "$W/err" "gpumem: error: writing to stdout failed ("
  done
  # Two outputs on one file: the second would replace the first.
  expect_rc 2 "$GPUMEM" report --html "$W/same.out" --perfetto "./same.out" "$DATA/before.jsonl"
  expect_in "$W/err" "gpumem: error: --html and --perfetto both name ./same.out"
  expect_rc 2 "$GPUMEM" report --perfetto "$W/same.out" --torch-snapshot "$W/same.out" "$DATA/before.jsonl"
  expect_in "$W/err" "gpumem: error: --perfetto and --torch-snapshot both name"
  # The same, both relative and the file not there yet ("x" and "./x"): the HTML was lost, exit 0.
  rm -f "$W/new.out"
  expect_rc 2 "$GPUMEM" report --html new.out --perfetto ./new.out "$DATA/before.jsonl"
  expect_in "$W/err" "gpumem: error: --html and --perfetto both name ./new.out"
  # A link to a file not there yet and that file: both outputs would go to the file.
  rm -f "$W/later.out" "$W/later.link" && ln -s later.out "$W/later.link"
  expect_rc 2 "$GPUMEM" report --html "$W/later.link" --torch-snapshot "$W/later.out" "$DATA/before.jsonl"
  expect_in "$W/err" "gpumem: error: --html and --torch-snapshot both name $W/later.out"
  # Inputs after --, and options after the inputs.
  expect_rc 1 "$GPUMEM" check "$DATA/before.jsonl" --max-peak 1KiB
  expect_rc 0 "$GPUMEM" report --no-progress -- "$DATA/before.jsonl"
  # -v: the analyzer's debug messages through spdlog, before or after the subcommand.
  expect_rc 0 "$GPUMEM" report -v "$DATA/before.jsonl"
  expect_in "$W/err" "gpumem: debug: $DATA/before.jsonl: "
  expect_rc 0 "$GPUMEM" --verbose diff "$W/before.json" "$DATA/after.jsonl"
  expect_in "$W/err" "gpumem: debug: $W/before.json: reading as a \`gpumem report --json\` file"
  expect_rc 0 "$GPUMEM" report "$DATA/before.jsonl"
  [ ! -s "$W/err" ] || fail "report without -v wrote on stderr: $(cat "$W/err")"
  # Progress: every command that reads logs takes --progress / --no-progress (the hidden
  # --progress-every shortens the 2 s interval); off by default when stderr is not a terminal.
  gzip -dc "$SRC/tests/data/replay/gpt2-varlen-vmm.jsonl.gz" > "$W/long.jsonl"
  for cmd in "report" "check --max-peak 100GiB" "diff $W/long.jsonl" "replay"; do
    expect_rc 0 "$GPUMEM" $cmd --progress --progress-every 0 "$W/long.jsonl"
    expect_in "$W/err" "gpumem: $W/long.jsonl: 10% ("
    expect_rc 0 "$GPUMEM" $cmd --progress-every 0 "$W/long.jsonl"
    expect_not_in "$W/err" "% ("
    expect_rc 2 "$GPUMEM" $cmd --progress --no-progress "$W/long.jsonl"
  done
  # The progress lines name a file as every message does (control characters shown, here an ESC as
  # ^[; they were printed raw) and count its events with thousands separators, as the report does.
  cp "$W/long.jsonl" "$W/lo$(printf '\033')ng.jsonl"
  expect_rc 0 "$GPUMEM" report --progress --progress-every 0 "$W/lo$(printf '\033')ng.jsonl"
  expect_in "$W/err" "gpumem: $W/lo^[ng.jsonl: 10% ("
  grep -q "$(printf '\033')" "$W/err" && fail "progress line: a raw ESC on stderr: $(cat -v "$W/err" | head -3)"
  grep -Eq '^gpumem: .*: [0-9]+% \([0-9]+ MB\), [0-9]{1,3}(,[0-9]{3})+ events, ' "$W/err" \
    || fail "progress line: no event count with thousands separators: $(cat -v "$W/err" | head -3)"
  mkfifo "$W/fi$(printf '\033')fo"
  cat "$W/long.jsonl" > "$W/fi$(printf '\033')fo" &
  expect_rc 0 "$GPUMEM" report --progress --progress-every 0 "$W/fi$(printf '\033')fo"
  wait
  expect_in "$W/err" "gpumem: $W/fi^[fo: copying the pipe to a temporary file, "
  grep -q "$(printf '\033')" "$W/err" && fail "pipe progress line: a raw ESC on stderr: $(cat -v "$W/err" | head -3)"
  rm -f "$W/lo$(printf '\033')ng.jsonl" "$W/fi$(printf '\033')fo"
  # A metric that never rose above 0 (the pool took a segment and gave it back, nothing allocated)
  # has no moment of its peak: "-", not "0 ns (seq 0)", which reads as the log's first event.
  {
    head -1 "$SRC/tests/data/golden/oom_stack.jsonl"
    echo '{"ev":"segment_alloc","seq":0,"t":1000,"tid":7300,"dev":0,"api":"cudaMalloc","ptr":"0x1000000","size":2097152,"pool":"large"}'
    echo '{"ev":"segment_free","seq":1,"t":2000,"tid":7300,"dev":0,"api":"cudaFree","ptr":"0x1000000","size":2097152,"pool":"large"}'
    echo '{"ev":"end","seq":2,"t":3000,"tid":7300,"reason":"exit","events":2,"n_alloc":0,"n_free":0,"n_fail":0,"live_allocs":0,"live_bytes":0,"lost":0,"unmatched":0}'
  } > "$W/noalloc.jsonl"
  expect_rc 0 "$GPUMEM" report --no-progress "$W/noalloc.jsonl" --html "$W/noalloc.html"
  grep -Eq '^\| Requested memory +0 B +0 B +- +\|$' "$W/out" || fail "no allocation: requested peak's moment not '-': $(grep Requested "$W/out")"
  grep -Eq '^\| Reserved memory +0 B +2.00 MiB +1.00 us \(seq 0\) +\|$' "$W/out" || fail "no allocation: reserved peak's moment lost: $(grep Reserved "$W/out")"
  grep -q '<tr><td>requested</td><td>0 B</td><td>0 B</td><td>-</td></tr>' "$W/noalloc.html" \
    || fail "no allocation: the HTML's requested peak moment not '-': $(grep -o '<tr><td>requested[^\n]*</tr>' "$W/noalloc.html" | head -1)"
  # A pipe is copied to a temporary file before it is read, as long as its writer takes (zcat of a
  # large log): that copy was silent under --progress.  The pipe comes from a process substitution:
  # expect_rc at the end of `cat | expect_rc` ran in a subshell, and the failure it counted was lost.
  for cmd in "report" "check --max-peak 100GiB" "diff $W/long.jsonl"; do
    expect_rc 0 "$GPUMEM" $cmd --progress --progress-every 0 - < <(cat "$W/long.jsonl")
    expect_in "$W/err" "gpumem: /dev/stdin: copying the pipe to a temporary file, "
    expect_in "$W/err" "gpumem: /dev/stdin: 10% ("
    expect_rc 0 "$GPUMEM" $cmd --progress-every 0 - < <(cat "$W/long.jsonl")
    expect_not_in "$W/err" "copying the pipe"
  done
  # --progress-every: seconds from 0 to 3600.  Anything else is named with the option, exit 2 (nan
  # was taken, and the others were said as ": Value abc not in range ...", without the option).
  for v in nan inf -inf -1 abc 1e9 3601 0x10 " 5" ""; do
    expect_rc 2 "$GPUMEM" report --progress-every "$v" "$DATA/before.jsonl"
    expect_in "$W/err" "gpumem: error: --progress-every $v: expected seconds from 0 to 3600"
  done
  for cmd in "report" "check --max-peak 100GiB" "diff $DATA/before.jsonl" "replay"; do
    expect_rc 2 "$GPUMEM" $cmd --progress-every=nan "$DATA/before.jsonl"
    expect_in "$W/err" "gpumem: error: --progress-every nan: expected seconds from 0 to 3600"
    expect_rc 0 "$GPUMEM" $cmd --progress-every 0.5 "$DATA/before.jsonl"
  done
  # -j: threads, 1 to 1024.  0 and past 1024 were taken (up to 65536 threads for as many logs or
  # replays: a failed thread creation aborts); the option is named for any bad value.
  for cmd in report replay; do
    # As every number on the command line (the size rule's digits): "+4", "0x4", " 4" and "1e2"
    # were taken by CLI11's own conversion while --max-ooms refused them.
    for v in 0 -1 abc nan 1.5 1025 4294967296 +4 0x4 " 4" 1e2; do
      expect_rc 2 "$GPUMEM" $cmd -j "$v" "$DATA/before.jsonl"
      expect_in "$W/err" "gpumem: error: --jobs $v: expected a whole number from 1 to 1024"
    done
    expect_rc 0 "$GPUMEM" $cmd --jobs 1024 "$DATA/before.jsonl"
  done
  for v in 0 0x4 1e2 100001; do
    expect_rc 2 "$GPUMEM" diff --top "$v" "$DATA/before.jsonl" "$DATA/after.jsonl"
    expect_in "$W/err" "gpumem: error: --top $v: expected a whole number from 1 to 100000"
  done
  expect_rc 0 "$GPUMEM" diff --top 3 "$DATA/before.jsonl" "$DATA/after.jsonl"
  # replay also says how far its replays are, within one replay too (-j 1: the first of the 4
  # replays is said before it ends, as a replay of a large log takes seconds).
  expect_rc 0 "$GPUMEM" replay -j 1 --progress --progress-every 0 "$W/long.jsonl"
  expect_in "$W/err" "gpumem: replay: 0 of 4 replays done, 10% of their requests (1 device,"
  expect_in "$W/err" "gpumem: replay: 1 of 4 replays done, 25% of their requests (1 device,"
  expect_rc 0 "$GPUMEM" replay --no-progress --progress-every 0 "$W/long.jsonl"
  expect_not_in "$W/err" "replays done"  # One file named twice in a run (a CI glob and a name, ./x and x, a link and its target) is read
  # once, with a warning: it counted as a second process, "rank 0#2", doubling every total.
  ln -sf "$DATA/before.jsonl" "$W/link.jsonl"
  for names in "$DATA/before.jsonl $DATA/before.jsonl" "$W/link.jsonl $DATA/before.jsonl"; do
    expect_rc 0 "$GPUMEM" check $names --max-peak 1GiB
    expect_in "$W/out" "1 limit on 1 GPU of 1 process: 0 broken"
    expect_not_in "$W/out" "0#2"
  done
  expect_in "$W/err" "gpumem: warning: $DATA/before.jsonl is the same file as $W/link.jsonl: read once"
  (cd "$DATA" && "$GPUMEM" report --json before.jsonl ./before.jsonl after.jsonl > "$W/out" 2> "$W/err")
  [ "$(json "$W/out" 'len(d["processes"])')" = 2 ] || fail "report of before, ./before and after: not 2 processes"
  expect_in "$W/err" "gpumem: warning: ./before.jsonl is the same file as before.jsonl: read once"
  # The repeat is named with its own first name, not the first input's.
  (cd "$DATA" && "$GPUMEM" report --json before.jsonl after.jsonl ./after.jsonl > "$W/out" 2> "$W/err")
  [ "$(json "$W/out" 'len(d["processes"])')" = 2 ] || fail "report of before, after and ./after: not 2 processes"
  expect_in "$W/err" "gpumem: warning: ./after.jsonl is the same file as after.jsonl: read once"
  expect_rc 0 "$GPUMEM" diff "$DATA/before.jsonl" "$W/link.jsonl" -- "$DATA/after.jsonl" "$DATA/after.jsonl"
  expect_in "$W/out" "A = $DATA/before.jsonl (1 process)"
  expect_in "$W/out" "B = $DATA/after.jsonl (1 process)"
  expect_in "$W/err" "gpumem: warning: $W/link.jsonl is the same file as $DATA/before.jsonl: read once"
  expect_in "$W/err" "gpumem: warning: $DATA/after.jsonl is given more than once: read once"
  expect_not_in "$W/out" "0#2"
  # A file on both sides of a diff is a run compared with itself, and a baseline may be a log.
  expect_rc 0 "$GPUMEM" diff "$DATA/before.jsonl" "$DATA/before.jsonl"
  expect_in "$W/out" "B = $DATA/before.jsonl (1 process)"
  expect_not_in "$W/err" "read once"
  expect_rc 0 "$GPUMEM" check "$DATA/before.jsonl" --baseline "$DATA/after.jsonl"
  expect_not_in "$W/err" "read once"
  expect_rc 0 "$GPUMEM" replay --json "$DATA/before.jsonl" "$W/link.jsonl"
  [ "$(json "$W/out" 'len(d["logs"])')" = 1 ] || fail "replay of a log and its link: not 1 log"
  expect_in "$W/err" "gpumem: warning: $W/link.jsonl is the same file as $DATA/before.jsonl: read once"
  # A glob that matched nothing reaches gpumem as written: the error says so, for *, ? and [,
  # in words that hold too for a quoted name the shell never expanded (a file named with a '*').
  for pat in 'nosuch*.jsonl' 'rank?.jsonl' 'rank[0-9].json'; do
    for cmd in "report $pat" "check $pat --max-peak 1GiB" "diff $DATA/before.jsonl $pat" "replay $pat" \
               "check $DATA/before.jsonl --baseline $pat"; do
      expect_rc 2 "$GPUMEM" $cmd
      expect_in "$W/err" "$pat: cannot open: No such file or directory (if this is a pattern, no file matched it)"
      expect_not_in "$W/err" "the shell"
    done
  done
  # A plain missing name is no pattern: no such hint.
  expect_rc 2 "$GPUMEM" report "$W/missing.jsonl"
  expect_in "$W/err" "missing.jsonl: cannot open: No such file or directory"
  expect_not_in "$W/err" "pattern"
  # A log redirected or piped in without `-` among the inputs: the error says how to read it.
  for cmd in "report" "check --max-peak 1GiB" "replay" "diff" "diff $DATA/before.jsonl"; do
    expect_rc 2 "$GPUMEM" $cmd < "$DATA/after.jsonl"
    expect_in "$W/err" "; to read standard input, pass -"
    expect_rc 2 sh -c 'cat "$1" | "$0" $2' "$GPUMEM" "$DATA/after.jsonl" "$cmd"
    expect_in "$W/err" "; to read standard input, pass -"
    # Nothing given on standard input (a CI step's /dev/null): no hint.
    expect_rc 2 "$GPUMEM" $cmd < /dev/null
    expect_not_in "$W/err" "standard input"
  done
  expect_rc 2 "$GPUMEM" report < "$DATA/after.jsonl"
  expect_in "$W/err" "gpumem: error: no log file given; to read standard input, pass -"
  expect_rc 2 "$GPUMEM" diff "$DATA/before.jsonl" < "$DATA/after.jsonl"
  expect_in "$W/err" "gpumem: error: needs two runs: A B, A B1 B2..., or A1 A2... -- B1 B2...; to read standard input, pass -"
  expect_rc 0 "$GPUMEM" diff "$DATA/before.jsonl" - < "$DATA/after.jsonl"
  ;;
run_arguments)
  # run: --flag=value works, and everything from the command on goes to it untouched, gpumem's own
  # option names and --help included.
  expect_rc 0 "$GPUMEM" run --pool=off --out="$W/l/" --no-summary sh -c 'echo "args:$*"; echo "pool=$GPUMEM_POOL"' sh --help -o x --pool on -- -v
  expect_in "$W/out" "args:--help -o x --pool on -- -v"
  expect_in "$W/out" "pool=off"
  expect_rc 0 "$GPUMEM" run -o "$W/l/" -- sh -c 'echo "args:$*"' sh --version
  expect_in "$W/out" "args:--version"
  # The summary reads every log after the command ends, which takes as long as `gpumem report` on
  # them: progress as in the commands that read logs (--progress, by default on a terminal).
  expect_rc 0 "$GPUMEM" run --progress --progress-every 0 -o "$W/prog/" -- "$EMU/emu_rt_shared_app" train 200
  expect_in "$W/err" "gpumem: $W/prog/gpumem-"
  expect_in "$W/err" "% ("
  expect_rc 0 "$GPUMEM" run --progress-every 0 -o "$W/prog/" -- "$EMU/emu_rt_shared_app" train 200
  expect_not_in "$W/err" "% ("
  expect_rc 2 "$GPUMEM" run --progress --no-progress -- true
  # A program named like a subcommand after --.
  mkdir -p "$W/bin" && printf '#!/bin/sh\necho "fake report $*"\n' > "$W/bin/report" && chmod +x "$W/bin/report"
  expect_rc 0 env PATH="$W/bin:$PATH" "$GPUMEM" run -- report --json
  expect_in "$W/out" "fake report --json"
  # -o into a folder that is a file: refused before the command runs (the library would write to
  # /tmp, and run would then say that no log was written).
  touch "$W/afile"
  expect_rc 2 "$GPUMEM" run -o "$W/afile/" -- sh -c 'echo ran'
  expect_in "$W/err" "gpumem: error: cannot create $W/afile: Not a directory"
  expect_not_in "$W/out" "ran"
  expect_rc 2 "$GPUMEM" run -o "$W/afile/sub/x-%p.jsonl" -- true
  expect_in "$W/err" "gpumem: error: cannot create $W/afile/sub: Not a directory"
  # -o -: every other output option refuses - (standard output carries the command's own output);
  # run wrote the log to a file named - in the current directory.
  mkdir -p "$W/dash" && cd "$W/dash" || fail "cd dash"
  expect_rc 2 "$GPUMEM" run -o - -- sh -c 'echo ran'
  cd "$W" || fail "cd $W"
  expect_in "$W/err" "gpumem: error: -o -: give a path pattern; standard output is the program's (a file named - is ./-)"
  expect_not_in "$W/out" "ran"
  [ ! -e "$W/dash/-" ] || fail "-o - wrote a file named -"
  # A folder per host: %h is this host's name for every process, so the folder is made and the log
  # found.  Run made no folder whose name held a token, so the log went to /tmp unlisted.
  expect_rc 0 "$GPUMEM" run -o "$W/byhost/%h/" -- "$EMU/emu_rt_shared_app" train 5
  expect_in "$W/err" "gpumem run: 1 log (pattern $W/byhost/%h/gpumem-%p.jsonl)"
  ls "$W/byhost/$(hostname)"/gpumem-*.jsonl > /dev/null || fail "no log in $W/byhost/$(hostname)"
  # A folder per rank cannot be made ahead: said before the command runs, and again at the end.
  expect_rc 0 "$GPUMEM" run -o "$W/byrank/%r/" -- "$EMU/emu_rt_shared_app" train 5
  expect_in "$W/err" "the directory part holds %p or %r, which gpumem run cannot create ahead"
  expect_in "$W/err" "or its log went to /tmp"
  moved=$(sed -n 's/.*writing the log to \(\/tmp\/gpumem-[0-9.]*jsonl\)$/\1/p' "$W/err")
  [ -n "$moved" ] && rm -f "$moved"
  # -o /dev/null: the log goes there and cannot be read back.  Run said the command "made no CUDA
  # call" (and warned of .PID names, which a device never gets).
  expect_rc 0 "$GPUMEM" run -o /dev/null -- "$EMU/emu_rt_shared_app" train 5
  expect_in "$W/out" "steps=5"
  expect_in "$W/err" "gpumem run: /dev/null is a character device, not a regular file: a log written there cannot be read back"
  expect_not_in "$W/err" "CUDA call"
  expect_not_in "$W/err" "no log matching"
  expect_not_in "$W/err" "has no %p"
  # -o /dev/full: the library's first write fails and the log moves to /tmp/full, which run said
  # did not exist ("there is no log"); it now points at the message that names the moved log.
  expect_rc 0 "$GPUMEM" run -o /dev/full -- "$EMU/emu_rt_shared_app" train 5
  expect_in "$W/err" "the log continues in /tmp/full"
  expect_in "$W/err" "(where a write there failed, as on /dev/full, the log moved to /tmp: a message above names it"
  moved=$(sed -n 's/.*the log continues in \(\/tmp\/full[0-9.-]*\)$/\1/p' "$W/err")
  [ -n "$moved" ] && rm -f "$moved"
  # A FIFO of ours with a reader gets the log as it is too.  Opening fd 3 for writing waits until
  # cat has the FIFO open, so the library finds its reader; cat ends once both writers are gone.
  mkfifo "$W/fifo"
  cat "$W/fifo" > "$W/from-fifo.txt" &
  reader=$!
  exec 3> "$W/fifo"
  expect_rc 0 "$GPUMEM" run -o "$W/fifo" -- "$EMU/emu_rt_shared_app" train 5
  exec 3>&-
  wait $reader
  expect_in "$W/err" "gpumem run: $W/fifo is a FIFO, not a regular file"
  expect_not_in "$W/err" "CUDA call"
  expect_in "$W/from-fifo.txt" '"ev":"end"'
  # The same FIFO with no reader yet: the library does not wait for one, and its log goes to
  # fifo.PID, which run lists.  stderr said "already exists (another process's log, an older log,
  # or a link)", which sent the user looking for a file that is not there.
  rm -f "$W"/fifo.*
  expect_rc 0 "$GPUMEM" run -o "$W/fifo" -- "$EMU/emu_rt_shared_app" train 5
  expect_in "$W/err" "gpumem: $W/fifo is a FIFO with no reader (the log does not wait for one: start the reader first); this process (pid "
  expect_not_in "$W/err" "already exists"
  expect_in "$W/err" "gpumem run: 1 log (pattern $W/fifo):"
  ls "$W"/fifo.*[0-9] > /dev/null 2>&1 || fail "no fifo.PID log beside the FIFO without a reader"
  ;;
report_from_json)
  # gpumem report on a report JSON prints the same text, HTML, Perfetto trace and warnings as on the
  # logs it was made from (and a report JSON again: it round-trips).
  g=$SRC/tests/data/golden
  while read -r name args; do
    # shellcheck disable=SC2086
    (cd "$g" && "$GPUMEM" report --no-progress --json $args) > "$W/$name.json" 2> /dev/null || fail "$name: report --json"
    (cd "$g" && "$GPUMEM" report --no-progress $args --html "$W/$name.a.html" --perfetto "$W/$name.a.trace") > "$W/$name.a.txt" 2> "$W/$name.a.err"
    # Without --at: the report remembers the moment it was made with.
    expect_rc 0 "$GPUMEM" report --no-progress "$W/$name.json" --html "$W/$name.b.html" --perfetto "$W/$name.b.trace"
    cmp -s "$W/out" "$W/$name.a.txt" || { fail "$name: text from the report JSON differs"; diff "$W/$name.a.txt" "$W/out" | head -10; }
    cmp -s "$W/err" "$W/$name.a.err" || fail "$name: warnings from the report JSON differ"
    cmp -s "$W/$name.a.html" "$W/$name.b.html" || fail "$name: HTML from the report JSON differs"
    cmp -s "$W/$name.a.trace" "$W/$name.b.trace" || fail "$name: Perfetto trace from the report JSON differs"
    expect_rc 0 "$GPUMEM" report --no-progress --json "$W/$name.json"
    cmp -s "$W/out" "$W/$name.json" || fail "$name: the report JSON does not round-trip"
  done <<EOF2
basic pool_off_basic.jsonl
frag pool_fragmentation.jsonl
frag_at pool_fragmentation.jsonl --at 5
auto pool_auto.jsonl
kinds pool_off_kinds.jsonl
killed killed_truncated.jsonl
ranks rank0.jsonl rank1.jsonl
stacks stacks.jsonl
oom_stack oom_stack.jsonl
EOF2
  # A log and a report together; --at on a report JSON is refused (the log is needed).
  expect_rc 0 "$GPUMEM" report --no-progress "$W/basic.json" "$g/rank1.jsonl"
  expect_in "$W/out" "imbalance"
  expect_rc 2 "$GPUMEM" report --no-progress --at 5 "$W/basic.json"
  expect_in "$W/err" "--at needs the event log"
  # A report of no process is no run: report printed nothing and exited 0, diff compared against nothing.
  for cmd in "report --no-progress" "diff $DATA/before.jsonl"; do
    expect_rc 2 "$GPUMEM" $cmd "$SRC/tests/data/bad/report_no_processes.json"
    expect_in "$W/err" "gpumem: error: $SRC/tests/data/bad/report_no_processes.json: report's \"processes\" list is empty"
  done
  # A report JSON with values no analysis produces is refused with the member named (a segment of
  # 0 bytes made the text writer abort).
  expect_rc 2 "$GPUMEM" report --no-progress "$SRC/tests/data/bad/report_segment_size_zero.json"
  # Named by file:line too (the member's line, found by a second reading: the JSON parser keeps no
  # positions), as a log's bad line is.
  expect_in "$W/err" "gpumem: error: $SRC/tests/data/bad/report_segment_size_zero.json:$(line_of "$SRC/tests/data/bad/report_segment_size_zero.json" '"size_bytes": 0,'): process 0: device 0 of \"devices\" (dev 0): a segment of \"segment_list\" has no \"size_bytes\""
  # A report JSON without a member CI gates on: shown as 0, with a warning naming it (report_no_peak
  # lacks the peak of requested bytes).
  expect_rc 0 "$GPUMEM" report --no-progress "$SRC/tests/data/bad/report_no_peak.json"
  expect_in "$W/err" "gpumem: warning: $SRC/tests/data/bad/report_no_peak.json:$(( $(line_of "$SRC/tests/data/bad/report_no_peak.json" '"devices": \[') + 1 )): process 2002 dev 0 has no \"peak_requested_bytes\", \"peak_allocated_bytes\", \"peak_reserved_bytes\" (a number): shown as 0, which is no measurement"
  expect_rc 0 "$GPUMEM" report --no-progress "$W/basic.json"
  expect_not_in "$W/err" "which is no measurement"
  # A member of another type (a string "12") is as missing, and said to be what it is: it read as
  # 'has no "peak_requested_bytes" (a number)', which sent one looking for a member that is there.
  edit_report "$W/basic.json" "$W/strpeak.json" 'dev["peak_requested_bytes"]="12"; dev["n_free"]=None'
  expect_rc 0 "$GPUMEM" report --no-progress "$W/strpeak.json"
  at=$(line_of "$W/strpeak.json" '"peak_requested_bytes": "12",')
  expect_in "$W/err" "gpumem: warning: $W/strpeak.json:$at: process 4242 dev 0 has \"peak_requested_bytes\": \"12\", not a number: shown as 0, which is no measurement"
  expect_in "$W/err" "$W/strpeak.json:$(line_of "$W/strpeak.json" '"n_free": null,'): process 4242 dev 0 has \"n_free\": null, not a number: shown as 0, which is no measurement"
  expect_not_in "$W/err" "has no"
  expect_rc 2 "$GPUMEM" check --max-peak 1GiB "$W/strpeak.json"
  expect_in "$W/err" "gpumem: error: $W/strpeak.json:$at: rank 0 dev 0 (pid 4242, pool_off_basic.jsonl) has \"peak_requested_bytes\": \"12\", not a number, which peak requested needs"
  expect_rc 2 "$GPUMEM" check --baseline "$W/strpeak.json" "$g/pool_off_basic.jsonl"
  expect_in "$W/err" "gpumem: error: baseline $W/strpeak.json:$at: rank 0 dev 0 (pid 4242, pool_off_basic.jsonl) has \"peak_requested_bytes\": \"12\", not a number"
  # A long value is cut at 37 bytes, on a character boundary: "a" then 2-byte characters put the
  # 37th byte mid-character, which was cut in two (a stray \xC3 byte, shown as such by report).
  edit_report "$W/basic.json" "$W/longpeak.json" 'dev["peak_requested_bytes"]="a" + "é" * 30'
  expect_rc 0 "$GPUMEM" report --no-progress "$W/longpeak.json"
  expect_in "$W/err" "has \"peak_requested_bytes\": \"a$(printf 'é%.0s' $(seq 17))..., not a number: shown as 0"
  expect_not_in "$W/err" '\xC3'
  # check's error names the file as every message does, its control characters made visible (an
  # ESC reached the terminal as is).
  cp "$W/longpeak.json" "$W/long$(printf '\033')peak.json"
  expect_rc 2 "$GPUMEM" check --max-peak 1GiB "$W/long$(printf '\033')peak.json"
  expect_in "$W/err" "gpumem: error: $W/long^[peak.json:$(line_of "$W/longpeak.json" '"peak_requested_bytes": "a'): rank 0 dev 0 (pid 4242, pool_off_basic.jsonl) has \"peak_requested_bytes\": \"a$(printf 'é%.0s' $(seq 17))..., not a number, which peak requested needs"
  # The leak members, which --max-leak and --baseline gate on, too (they read as 0 B of leaks, unsaid).
  edit_report "$W/basic.json" "$W/noleak.json" 'dev.pop("leaked_bytes"); dev.pop("n_leaks")'
  expect_rc 0 "$GPUMEM" report --no-progress "$W/noleak.json"
  expect_in "$W/err" "gpumem: warning: $W/noleak.json:$(line_of "$W/noleak.json" '^    \{$'): process 4242 dev 0 has no \"n_leaks\", \"leaked_bytes\" (a number): shown as 0, which is no measurement"
  # A device whose "dev" is not an integer, or a "devices" that is not a list, was left out without
  # a word: the report showed "no device memory events", diff "(not in B)", and a baseline lost the
  # GPU (held to absolute limits only).  Unusable, with the process and the device named.
  # A "dev" under -1 (no device's) or past 65535 (past the log's range) read as host memory or as a
  # GPU no log can name: refused too.
  # The line named is the member's ("dev"), or where it is missing, the object's that lacks it.
  while IFS='|' read -r edit at; do
    edit_report "$W/basic.json" "$W/nodev.json" "$edit"
    line=$(line_of "$W/nodev.json" "$at")
    [ -n "$line" ] || fail "$edit: no line matches $at"
    for cmd in "report --no-progress" "check --max-peak 1GiB" "diff $W/basic.json"; do
      expect_rc 2 "$GPUMEM" $cmd "$W/nodev.json"
      expect_in "$W/err" "gpumem: error: $W/nodev.json:$line: process 0: "
    done
  done <<'EOF2'
dev["dev"]=-7|"dev": -7,
dev["dev"]=70000|"dev": 70000,
dev["dev"]=2**40|"dev": 1099511627776,
dev["dev"]="0"|"dev": "0",
del dev["dev"]|^    \{$
p["devices"]={"0": dev}|"devices": \{
p.pop("devices")|^  \{$
EOF2
  expect_in "$W/err" "has no \"devices\" list"
  while IFS='|' read -r edit says; do
    edit_report "$W/basic.json" "$W/nodev.json" "$edit"
    expect_rc 2 "$GPUMEM" report --no-progress "$W/nodev.json"
    expect_in "$W/err" "$says"
  done <<'EOF2'
dev["dev"]=-7|device 0 of "devices" has "dev" -7, not -1 (host) or a device ordinal up to 65535
dev["dev"]=2**40|has "dev" 1099511627776, not -1 (host)
EOF2
  # One GPU listed twice (an edited report): report showed it twice, and check and diff said
  # "rank 0 dev 0 (pid 4242, pool_off_basic.jsonl): rank 0 dev 0 appears twice", naming the log
  # the report was made from, not the file to fix.  Refused at the second one's "dev".
  edit_report "$W/basic.json" "$W/twice.json" 'p["devices"].append(dict(dev))'
  line=$(grep -nE '^ *"dev": 0,$' "$W/twice.json" | sed -n 2p | cut -d: -f1)
  [ -n "$line" ] || fail "twice.json: no second \"dev\": 0"
  for cmd in "report --no-progress" "check --max-peak 1GiB" "diff $W/basic.json"; do
    expect_rc 2 "$GPUMEM" $cmd "$W/twice.json"
    expect_in "$W/err" "gpumem: error: $W/twice.json:$line: process 0: device 1 of \"devices\" has \"dev\" 0, as device 0 has: one GPU listed twice"
  done
  # A ratio outside [0, 1] was taken as it was (max_external_fragmentation 7.5 shown as 750.0%, and
  # passed by --baseline), a negative count read as missing (shown as 0) and a fraction of one
  # as the whole number under it (1.5 B as 1 B): no analysis writes any, so each is refused, with
  # the process, the device and the member named.
  # The line named is the value's (AT, matched in the file as written).
  while IFS='|' read -r edit at says; do
    edit_report "$W/frag.json" "$W/range.json" "$edit"
    line=$(line_of "$W/range.json" "$at")
    [ -n "$line" ] || fail "$edit: no line matches $at"
    for cmd in "report --no-progress" "check --max-fragmentation 50%" "diff $W/frag.json"; do
      expect_rc 2 "$GPUMEM" $cmd "$W/range.json"
      expect_in "$W/err" "gpumem: error: $W/range.json:$line: process 0: device 0 of \"devices\" (dev 0): $says"
      expect_not_in "$W/out" "750.0%"
    done
    expect_rc 2 "$GPUMEM" check --baseline "$W/range.json" "$g/pool_fragmentation.jsonl"
    expect_in "$W/err" "range.json:$line: process 0: device 0 of \"devices\" (dev 0): $says"
  done <<'EOF2'
dev["max_external_fragmentation"]=7.5|"max_external_fragmentation": 7.5,|"max_external_fragmentation" is 7.5, not a ratio from 0 to 1
dev["end_external_fragmentation"]=-0.25|"end_external_fragmentation": -0.25,|"end_external_fragmentation" is -0.25, not a ratio from 0 to 1
dev["peak_requested_bytes"]=-1|"peak_requested_bytes": -1,|"peak_requested_bytes" is -1, not a whole number from 0 to 2^64 - 1
dev["n_oom"]=-2.5|"n_oom": -2.5,|"n_oom" is -2.5, not a whole number from 0 to 2^64 - 1
dev["peak_requested_bytes"]=1.5|"peak_requested_bytes": 1.5,|"peak_requested_bytes" is 1.5, not a whole number from 0 to 2^64 - 1
dev["at_peak"]["external_fragmentation"]=1.5|"external_fragmentation": 1.5,|"external_fragmentation" is 1.5, not a ratio from 0 to 1 (in "at_peak")
dev["ooms"][0]["map"]["external_fragmentation"]=2|"external_fragmentation": 2,|"external_fragmentation" is 2, not a ratio from 0 to 1 (in "ooms" 0, "map")
dev["timeline"][3][5]=7.5|^ *7\.5,$|"timeline" row 3: "external_fragmentation_max" is 7.5, not a ratio from 0 to 1
dev["timeline"][3][11]=-1|^ *-1$|"timeline" row 3: "external_fragmentation_last" is -1, not a ratio from 0 to 1
EOF2
  # The edges are ratios; a count written as a float within range is read as before.
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); dev=d["processes"][0]["devices"][0]; dev["max_external_fragmentation"]=1; dev["end_external_fragmentation"]=0; dev["n_oom"]=1.0; json.dump(d, open(sys.argv[2], "w"))' \
    "$W/frag.json" "$W/edges.json"
  expect_rc 0 "$GPUMEM" report --no-progress "$W/edges.json"
  expect_in "$W/out" "100.0%"
  expect_rc 2 "$GPUMEM" check --max-peak 1GiB --baseline "$W/nodev.json" "$g/pool_off_basic.jsonl"
  expect_in "$W/err" "nodev.json:$(line_of "$W/nodev.json" '"dev": 1099511627776'): process 0: "
  # A report JSON that counts warnings but lists none (the list cut by a tool): the HTML report
  # quoted the first of an empty list and crashed.
  expect_rc 0 "$GPUMEM" report --no-progress "$SRC/tests/data/bad/report_warnings_unlisted.json" --html "$W/unlisted.html"
  expect_in "$W/unlisted.html" "<p class=warn>2 warnings</p>"
  ;;
hostile_values)
  # Issue 14 #12, #13, #16, #17: logs with values no program produces, through the binary.
  B=$SRC/tests/data/bad
  # #12: two 2^63-byte allocations plus 100 B wrapped to "At end 100 B"; the totals now stop at
  # 2^64 - 1 and the log gets a warning (kept past the cap on listed warnings).
  expect_rc 0 "$GPUMEM" report --no-progress "$B/sum_overflow.jsonl"
  expect_in "$W/err" "sum_overflow.jsonl:3: the byte totals pass 2^64 - 1 here"
  grep -qE "^\| Requested memory +100 B" "$W/out" && fail "the overflowing sum wrapped to 100 B"
  expect_in "$W/out" "| Requested memory                 16.00 EiB"
  expect_rc 0 "$GPUMEM" report --no-progress --json "$B/sum_overflow.jsonl"
  [ "$(json "$W/out" 'd["processes"][0]["devices"][0]["end_requested_bytes"]')" = 18446744073709551615 ] || fail "#12: JSON end_requested_bytes is not 2^64 - 1"
  # 16,384 device ordinals, then 200,000 events on one: each event walked every device (over two
  # minutes); now seconds.  The timeout only ends a regression instead of hanging the suite.
  python3 - > "$W/many_devices.jsonl" <<'PY'
print('{"ev":"header","format":"gpumem-events","version":4,"pid":1,"ppid":0,"host":"h","rank":"0","cmdline":["x"],'
      '"start_unix_ns":0,"start_time":"x","devices":[],"config":{"pool":"off"},"gpumem_version":"0.1.0"}')
L = '{"ev":"%s","seq":%d,"t":%d,"tid":1,"dev":%d,"api":"cudaMalloc","kind":"device","ptr":"0x%x","size":100}'
s = 0
for i in range(16384):
    print(L % ("alloc", s, s, i, 0x1000 + i * 4096)); s += 1
for i in range(100000):
    print(L % ("alloc", s, s, 0, 0x20000000)); s += 1
    print(L % ("free", s, s, 0, 0x20000000)); s += 1
PY
  expect_rc 0 timeout 120 "$GPUMEM" report --no-progress --json "$W/many_devices.jsonl"
  [ "$(json "$W/out" 'len(d["processes"][0]["devices"])')" = 16384 ] || fail "many devices: not 16384 devices"
  # Past 1,024 distinct API names the rest fold into one named entry (they were counted as "none").
  python3 - > "$W/many_apis.jsonl" <<'PY'
print('{"ev":"header","format":"gpumem-events","version":4,"pid":1,"ppid":0,"host":"h","rank":"0","cmdline":["x"],'
      '"start_unix_ns":0,"start_time":"x","devices":[],"config":{"pool":"off"},"gpumem_version":"0.1.0"}')
for i in range(1100):
    print('{"ev":"alloc","seq":%d,"t":%d,"tid":1,"dev":0,"api":"myAlloc%d","kind":"device","ptr":"0x%x","size":100}'
          % (i, i, i, 0x1000 + i * 4096))
PY
  expect_rc 0 "$GPUMEM" report --no-progress "$W/many_apis.jsonl"
  expect_in "$W/out" "(other APIs: more than 1024 names)"
  # #13: two live allocations whose ranges overlap (not the same pointer) are named.
  expect_rc 0 "$GPUMEM" report --no-progress "$B/overlapping_ranges.jsonl"
  expect_in "$W/err" "overlapping_ranges.jsonl:3: allocation [0x1080, +256) overlaps the live allocation [0x1000, +256) from line 2"
  # ... and allocations side by side are not.
  expect_rc 0 "$GPUMEM" report --no-progress "$DATA/before.jsonl"
  expect_not_in "$W/err" "overlaps"
  # #16: a lost record is not an event of the end line's count: no "the end line counts 2 events;
  # the log has 3", only the loss.
  expect_rc 0 "$GPUMEM" report --no-progress "$B/lost_record_end_count.jsonl"
  expect_in "$W/err" "lost_record_end_count.jsonl:3: 4 event(s) were lost by the recorder"
  expect_not_in "$W/err" "the end line counts"
  expect_rc 0 "$GPUMEM" report --no-progress --json "$B/lost_record_end_count.jsonl"
  [ "$(json "$W/out" 'd["processes"][0]["n_warnings"]')" = 1 ] || fail "#16: more warnings than the loss"
  # #17: 60 blank lines (60 warnings, past the 50 listed) and no end line: "no end line" is shown,
  # not hidden behind "N more warnings not shown".
  expect_rc 0 "$GPUMEM" report --no-progress "$B/many_warnings_no_end.jsonl"
  expect_in "$W/err" "many_warnings_no_end.jsonl: no end line: the process was killed"
  expect_in "$W/err" "more warnings not shown"
  expect_rc 0 "$GPUMEM" report --no-progress --json "$B/many_warnings_no_end.jsonl"
  python3 -c "import json,sys; w=json.load(open(sys.argv[1]))['processes'][0]['warnings']; assert any('no end line' in x for x in w), w[-3:]" "$W/out" || fail "#17: no end line missing from the JSON warnings"
  # #21: undefined behaviour on absurd values gave garbled labels (scripts/test.sh also runs these
  # under UBSan).  The size histogram's last bucket shifted by 64 ("8.00 EiB – 0 B"; named as diff
  # names it now); a chart label of 2^64 bytes was converted to an integer out of range.
  expect_rc 0 "$GPUMEM" report --no-progress "$B/sum_overflow.jsonl" --html "$W/overflow.html"
  expect_in "$W/overflow.html" "<title>8.00 EiB-16.00 EiB: 2</title>"
  expect_in "$W/overflow.html" "text-anchor='end'>16.00 EiB</text>"
  # Times from 0 to 2^64 - 1: the text timeline's row index was NaN (t1 - t0 + 1 wrapped to 0), the
  # rows came out of order; and the "events bunched" test wrapped.
  expect_rc 0 "$GPUMEM" report --no-progress "$B/time_span_2_64.jsonl"
  sed -n '/Memory over time/,/^$/p' "$W/out" | awk 'NR > 2 && NF { print $1, $2 }' > "$W/rows.txt"
  [ "$(head -1 "$W/rows.txt")" = "0 ns" ] && [ "$(wc -l < "$W/rows.txt")" = 5 ] || fail "#21: timeline rows: $(cat "$W/rows.txt")"
  expect_not_in "$W/out" "rows of equal event count"
  # A report JSON read back may carry any verdict: escaped in the HTML, and no markup in its class.
  "$GPUMEM" report --no-progress --json "$SRC/tests/data/golden/pool_fragmentation.jsonl" > "$W/frag.json" || fail "report --json"
  python3 - "$W/frag.json" <<'PY' || fail "no OOM to rewrite in pool_fragmentation's report"
import json, sys
d = json.load(open(sys.argv[1]))
d["processes"][0]["devices"][0]["ooms"][0]["verdict"] = "x'></span><script>alert(1)</script>"
json.dump(d, open(sys.argv[1], "w"))
PY
  expect_rc 0 "$GPUMEM" report --no-progress "$W/frag.json" --html "$W/verdict.html"
  expect_not_in "$W/verdict.html" "<script>alert"
  expect_in "$W/verdict.html" "class='verdict-xspanscriptalert1script'>x&#39;&gt;&lt;/span&gt;&lt;script&gt;"
  ;;
pipes)
  # Issue 14 #11: a log or report read from a pipe, /dev/stdin, a FIFO or <(process substitution).
  # Each input is sniffed (log or report JSON?) and a log may be read twice (the peak pass), so a
  # pipe is copied once to an unlinked file in $TMPDIR; before, report said "empty file".
  export TMPDIR=$W/tmp && mkdir -p "$TMPDIR"
  g=$SRC/tests/data/golden
  # A log whose peak moves too often to copy the state at each new peak: 3000 live blocks, then
  # 2000 times a new peak freed at once.  The analyzer rebuilds the peak map in a second pass.
  python3 - > "$W/peaks.jsonl" <<'PY'
print('{"ev":"header","format":"gpumem-events","version":2,"pid":7,"ppid":1,"host":"h","rank":"0","cmdline":["peaks"],'
      '"start_unix_ns":0,"start_time":"1970-01-01T00:00:00Z","devices":[],"config":{"pool":"off"},"gpumem_version":"0.1.0"}')
seq = 0
def ev(kind, ptr, size):
    global seq
    api = "cudaMalloc" if kind == "alloc" else "cudaFree"
    print('{"ev":"%s","seq":%d,"t":%d,"tid":7,"dev":0,"api":"%s","kind":"device","ptr":"0x%x","size":%d}'
          % (kind, seq, seq * 10, api, ptr, size))
    seq += 1
for i in range(3000): ev("alloc", 0x100000000 + i * 0x1000, 4096)
for k in range(2000):
    ev("alloc", 0x900000000, 4096 + k)
    ev("free", 0x900000000, 4096 + k)
print('{"ev":"end","seq":%d,"t":%d,"tid":7,"reason":"exit","events":%d}' % (seq, seq * 10, seq))
PY
  # An endless stream that is no gpumem input fails at line 1 at once; it was copied to $TMPDIR to
  # its end, which never came (4 GB in 15 s).
  for cmd in "report -" "check - --max-peak 1GiB" "diff $g/pool_off_basic.jsonl -"; do
    # shellcheck disable=SC2086
    yes garbage | timeout 60 "$GPUMEM" $cmd > "$W/out" 2> "$W/err"
    rc=${PIPESTATUS[1]}
    [ "$rc" = 2 ] || fail "yes garbage | gpumem $cmd: exit $rc, expected 2"
    expect_in "$W/err" "/dev/stdin:1: line 1 is not JSON"
  done
  # Endless JSON objects that are no log: stopped at the second line.
  yes '{}' | timeout 60 "$GPUMEM" report - > "$W/out" 2> "$W/err"
  rc=${PIPESTATUS[1]}
  [ "$rc" = 2 ] || fail "yes '{}' | gpumem report -: exit $rc, expected 2"
  expect_in "$W/err" "/dev/stdin:2: "
  # Blank lines first change nothing (they stopped the early judgement), nor does endless blankness.
  for src in "(echo; yes)" "yes ''"; do
    bash -c "$src" 2> /dev/null | timeout 60 "$GPUMEM" report - > "$W/out" 2> "$W/err"
    rc=${PIPESTATUS[1]}
    [ "$rc" = 2 ] || fail "$src | gpumem report -: exit $rc, expected 2"
  done
  # A pretty report JSON behind a UTF-8 byte order mark still reads from a pipe (it was cut short).
  "$GPUMEM" report --no-progress --json "$g/stacks.jsonl" > "$W/pretty.json"
  expect_rc 0 sh -c '{ printf "\357\273\277"; cat "$1"; } | "$2" report --no-progress -' sh "$W/pretty.json" "$GPUMEM"
  expect_in "$W/out" "gpumem report:"
  # A report JSON on one line with its keys sorted ("schema" last, past 64 KiB of a big report)
  # still reads from a pipe.
  "$GPUMEM" report --no-progress --json "$g/stacks.jsonl" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin), sort_keys=True))' > "$W/sorted.json"
  expect_rc 0 sh -c 'cat "$1" | "$2" report --no-progress -' sh "$W/sorted.json" "$GPUMEM"
  expect_in "$W/out" "gpumem report:"
  for log in "$W/peaks.jsonl" "$g/pool_fragmentation.jsonl"; do
    name=$(basename "$log" .jsonl)
    expect_rc 0 "$GPUMEM" report --no-progress "$log"
    sed "s|$log|/dev/stdin|" "$W/out" > "$W/$name.file.txt"
    cp "$W/err" "$W/$name.file.err"
    "$GPUMEM" report --no-progress --json "$log" | sed "s|$log|/dev/stdin|" > "$W/$name.file.json"
    # report: text and JSON through a real pipe are what the file gives.
    expect_rc 0 bash -c 'cat "$1" | "$0" report --no-progress /dev/stdin' "$GPUMEM" "$log"
    cmp -s "$W/out" "$W/$name.file.txt" || { fail "$name: report from a pipe differs"; diff "$W/$name.file.txt" "$W/out" | head; }
    expect_not_in "$W/err" "empty file"
    expect_rc 0 bash -c 'cat "$1" | "$0" report --no-progress --json /dev/stdin' "$GPUMEM" "$log"
    cmp -s "$W/out" "$W/$name.file.json" || fail "$name: report --json from a pipe differs"
    # A FIFO and process substitution.
    rm -f "$W/fifo" && mkfifo "$W/fifo"
    # (timeouts: the old code opened the FIFO twice and waited for a second writer for ever)
    timeout 60 cat "$log" > "$W/fifo" &
    expect_rc 0 timeout 60 "$GPUMEM" report --no-progress --json "$W/fifo"
    wait
    sed "s|$W/fifo|/dev/stdin|" "$W/out" | cmp -s - "$W/$name.file.json" || fail "$name: report from a FIFO differs"
    expect_rc 0 bash -c '"$0" report --no-progress --json <(cat "$1")' "$GPUMEM" "$log"
    expect_in "$W/out" '"requested_bytes"'
    # --torch-snapshot reads its log once more: from the spool, the same pickle as from the file.
    expect_rc 0 "$GPUMEM" report --no-progress "$log" --torch-snapshot "$W/$name.file.pickle"
    expect_rc 0 bash -c 'cat "$1" | "$0" report --no-progress /dev/stdin --torch-snapshot "$2"' "$GPUMEM" "$log" "$W/$name.pipe.pickle"
    cmp -s "$W/$name.file.pickle" "$W/$name.pipe.pickle" || fail "$name: --torch-snapshot from a pipe differs"
    # check, diff and replay.
    expect_rc 0 bash -c 'cat "$1" | "$0" check /dev/stdin --max-peak 1GiB' "$GPUMEM" "$log"
    expect_in "$W/out" "1 limit on 1 GPU of 1 process: 0 broken"
    expect_rc 1 bash -c 'cat "$1" | "$0" check /dev/stdin --max-peak 1KiB' "$GPUMEM" "$log"
    expect_rc 0 bash -c 'cat "$1" | "$0" diff /dev/stdin "$1"' "$GPUMEM" "$log"
    expect_in "$W/out" "no change by API, kind, size class or leak"
    expect_rc 0 bash -c 'cat "$1" | "$0" replay /dev/stdin' "$GPUMEM" "$log"
    expect_in "$W/out" "== /dev/stdin: device 0"
  done
  # The peak pass did happen on the big log, and read the spool: the spool is opened for the sniff
  # and twice by the log reader (strace, when installed; scripts/setup.sh installs it).
  if command -v strace > /dev/null; then
    expect_rc 0 bash -c 'cat "$1" | strace -f -e trace=openat -o "$2" "$0" report --no-progress /dev/stdin' "$GPUMEM" "$W/peaks.jsonl" "$W/strace.txt"
    n=$(grep -c '"/proc/self/fd/[0-9]*", O_RDONLY|O_CLOEXEC' "$W/strace.txt")
    [ "$n" = 2 ] || fail "expected the log reader to open the spool twice (first and peak pass), got $n"
  else
    echo "strace not installed: the peak pass over the spool is not traced"
  fi
  # A report JSON piped into check and diff.
  "$GPUMEM" report --json "$DATA/after.jsonl" > "$W/after.json"
  expect_rc 1 bash -c 'cat "$1" | "$0" check /dev/stdin --max-peak 3MiB' "$GPUMEM" "$W/after.json"
  expect_in "$W/out" "peak requested 7.00 MiB > limit 3.00 MiB"
  expect_rc 0 bash -c 'cat "$1" | "$0" report --no-progress /dev/stdin' "$GPUMEM" "$W/after.json"
  expect_in "$W/out" "gpumem report"
  # "-" is standard input for every command that reads logs (it said "-: cannot open"), the same
  # as /dev/stdin, through a real pipe; --baseline too.  A second "-" would read nothing: refused.
  expect_rc 0 bash -c 'cat "$1" | "$0" report --no-progress -' "$GPUMEM" "$DATA/before.jsonl"
  sed "s|$DATA/before.jsonl|/dev/stdin|" <("$GPUMEM" report --no-progress "$DATA/before.jsonl") | cmp -s - "$W/out" \
    || fail "report - differs from the file's report"
  expect_rc 0 bash -c 'cat "$1" | "$0" report --no-progress --json -- -' "$GPUMEM" "$DATA/before.jsonl"
  expect_in "$W/out" '"file": "/dev/stdin"'
  expect_rc 1 bash -c 'cat "$1" | "$0" check - --max-peak 3MiB' "$GPUMEM" "$DATA/after.jsonl"
  expect_in "$W/out" "peak requested 7.00 MiB > limit 3.00 MiB"
  expect_rc 0 bash -c 'cat "$1" | "$0" check "$2" --baseline -' "$GPUMEM" "$W/after.json" "$DATA/after.jsonl"
  expect_in "$W/out" "6 limits on 1 GPU of 1 process: 0 broken"
  expect_rc 0 bash -c 'cat "$1" | "$0" diff - "$2"' "$GPUMEM" "$DATA/before.jsonl" "$DATA/after.jsonl"
  expect_in "$W/out" "A = /dev/stdin (1 process)"
  expect_rc 0 bash -c 'cat "$1" | "$0" replay -' "$GPUMEM" "$DATA/before.jsonl"
  expect_in "$W/out" "== /dev/stdin: device 0"
  expect_rc 2 bash -c 'cat "$1" | "$0" diff - -' "$GPUMEM" "$DATA/before.jsonl"
  expect_in "$W/err" "gpumem: error: - (standard input) is given more than once"
  expect_rc 2 bash -c 'cat "$1" | "$0" check - --baseline - --max-peak 1GiB' "$GPUMEM" "$DATA/before.jsonl"
  expect_in "$W/err" "gpumem: error: - (standard input) is given more than once"
  for sub in report check diff replay; do
    "$GPUMEM" "$sub" --help > "$W/help.txt" 2>&1
    expect_in "$W/help.txt" "- reads standard input"
  done
  # Unusable input from a pipe still names the pipe, and nothing stays in $TMPDIR.
  expect_rc 2 bash -c 'printf "not a log\n" | "$0" report --no-progress /dev/stdin' "$GPUMEM"
  expect_in "$W/err" "gpumem: error: /dev/stdin:1: "
  expect_rc 2 bash -c ': | "$0" check /dev/stdin --max-peak 1GiB' "$GPUMEM"
  expect_in "$W/err" "gpumem: error: /dev/stdin: empty file"
  [ -z "$(ls -A "$TMPDIR")" ] || fail "spool files left in \$TMPDIR: $(ls -A "$TMPDIR")"
  # A spool that cannot be created is named as the reason.
  expect_rc 2 bash -c 'cat "$1" | TMPDIR=/nonexistent "$0" report --no-progress /dev/stdin' "$GPUMEM" "$W/peaks.jsonl"
  expect_in "$W/err" "gpumem: error: /dev/stdin: cannot spool the input to /nonexistent/gpumem-spool-"
  # With where that folder comes from, which the user can change: TMPDIR, not named before.
  expect_in "$W/err" "the copy goes to \$TMPDIR (/nonexistent): set TMPDIR to a folder that exists, with room for the input"
  # A copy cut short (a full disk; here the file size limit) says so too, and where it went.
  expect_rc 2 bash -c 'cat "$1" | (trap "" XFSZ; ulimit -f 1; "$0" report --no-progress /dev/stdin)' "$GPUMEM" "$W/peaks.jsonl"
  expect_in "$W/err" "gpumem: error: /dev/stdin: cannot spool the input to a temporary file in $TMPDIR: File too large"
  expect_in "$W/err" "the copy goes to \$TMPDIR ($TMPDIR): set TMPDIR to a folder that exists, with room for the input"
  ;;
docs_guide)
  # The commands of docs/guide.md outside its GPU sections, as written there, with the emulated
  # device's program in place of `python train.py` (scripts/gpu-e2e-run.sh runs them on PyTorch).
  TRAIN=("$EMU/emu_rt_shared_app" train 200)
  # Quick start.
  expect_rc 0 "$GPUMEM" run -- "${TRAIN[@]}"
  log=$(ls "$W"/gpumem-*.jsonl | head -1)
  expect_rc 0 "$GPUMEM" report "$log"
  # CI: record on the main branch, keep the report as the baseline.
  expect_rc 0 "$GPUMEM" run -o gpumem-logs/ -- "${TRAIN[@]}"
  mkdir -p ci && "$GPUMEM" report --json gpumem-logs/*.jsonl > ci/gpumem-baseline.json || fail "report --json for the baseline"
  # CI: the merge request's run, gated on the baseline and on an absolute limit.
  rm -rf gpumem-logs
  expect_rc 0 "$GPUMEM" run -o gpumem-logs/ -- "${TRAIN[@]}"
  expect_rc 0 "$GPUMEM" check gpumem-logs/*.jsonl --baseline ci/gpumem-baseline.json --tolerance 5% --max-peak 60GiB --junit gpumem-check.xml
  [ -s gpumem-check.xml ] || fail "no gpumem-check.xml"
  expect_rc 0 "$GPUMEM" diff ci/gpumem-baseline.json gpumem-logs/*.jsonl
  # A change that keeps more memory fails the gate: 400 steps leak twice the checkpoints.
  rm -rf gpumem-logs
  expect_rc 0 "$GPUMEM" run -o gpumem-logs/ -- "$EMU/emu_rt_shared_app" train 400
  expect_rc 1 "$GPUMEM" check gpumem-logs/*.jsonl --baseline ci/gpumem-baseline.json --tolerance 5% --max-peak 60GiB --junit gpumem-check.xml
  expect_in "$W/out" "leaked 120.00 MiB > baseline 60.00 MiB + 5% = 63.00 MiB"
  # Tightened limit: the same run fails an absolute limit below its peak.
  expect_rc 1 "$GPUMEM" check gpumem-logs/*.jsonl --max-peak 10MiB
  # torchrun-style ranks: one log per rank and pid, checked together.
  rm -rf ranks && mkdir ranks
  for r in 0 1; do
    expect_rc 0 env RANK=$r "$GPUMEM" run -o "ranks/gpumem-%r-%p.jsonl" -- "${TRAIN[@]}"
  done
  expect_rc 0 "$GPUMEM" report ranks/*.jsonl
  expect_in "$W/out" "imbalance"
  expect_rc 0 "$GPUMEM" check ranks/*.jsonl --max-peak 60GiB
  expect_in "$W/out" "2 limits on 2 GPUs of 2 processes: 0 broken"
  ;;
docs_report_example)
  # docs/report-example.md shows the text report of a real H200 log and links the HTML report of
  # the same log: both as the binary writes them today, so a change to the report's output redoes
  # the page in the same commit (its own commands, run from the repository root).
  log=tests/data/h200/torch-2stream-train-pool-on.jsonl
  (cd "$SRC" && "$GPUMEM" report "$log") > text.txt 2> text.err || fail "report of $log: $(cat text.err)"
  awk '/^## Text report/{t=1} t&&/^```$/{if(f){exit} f=1; next} f' "$SRC/docs/report-example.md" > doc.txt
  [ -s doc.txt ] || fail "no text block under '## Text report' in docs/report-example.md"
  diff doc.txt text.txt > text.diff || fail "docs/report-example.md's text report is not what gpumem report prints now (redo it: its command is on the page): $(head -20 text.diff)"
  (cd "$SRC" && "$GPUMEM" report --no-progress --html "$W/example.html" "$log" > /dev/null) || fail "report --html of $log"
  cmp -s example.html "$SRC/docs/report-example.html" || fail "docs/report-example.html is not what gpumem report --html writes now (redo it: docs/report-example.md has the command)"
  ;;
copies)
  # Two copies of one log (the original cut at a full disk and the copy gpumem moved to /tmp; a
  # run folder and its backup) are one process: read once, from the longer, with a warning naming
  # both.  Read as two, they doubled every total.  Same process: host, pid and start in the header.
  mkdir -p run tmp backup
  cp "$DATA/before.jsonl" tmp/x.jsonl
  # The original stopped mid-line where the disk filled; the copy holds all of it and more.
  head -c "$(( $(head -3 "$DATA/before.jsonl" | wc -c) + 40 ))" "$DATA/before.jsonl" > run/x.jsonl
  cp "$DATA/before.jsonl" backup/x.jsonl
  for pair in "run/x.jsonl tmp/x.jsonl" "tmp/x.jsonl run/x.jsonl"; do
    # shellcheck disable=SC2086
    expect_rc 0 "$GPUMEM" report --json $pair
    [ "$(json "$W/out" 'len(d["processes"])')" = 1 ] || fail "report $pair: not 1 process"
    [ "$(json "$W/out" 'd["processes"][0]["file"]')" = tmp/x.jsonl ] || fail "report $pair: not read from the longer copy"
    expect_in "$W/err" "gpumem: warning: run/x.jsonl is a shorter copy of tmp/x.jsonl (the log of process 1001 on ci01, started 2026-11-30T03:40:00.000000000Z): read once, from tmp/x.jsonl"
    expect_not_in "$W/err" "cut short"
  done
  # The same bytes: the first given is read.
  expect_rc 0 "$GPUMEM" report --json run/x.jsonl tmp/x.jsonl backup/x.jsonl
  [ "$(json "$W/out" 'len(d["processes"])')" = 1 ] || fail "report of three copies: not 1 process"
  expect_in "$W/err" "gpumem: warning: run/x.jsonl is a shorter copy of tmp/x.jsonl"
  expect_in "$W/err" "gpumem: warning: backup/x.jsonl is a copy of tmp/x.jsonl (the log of process 1001 on ci01, started 2026-11-30T03:40:00.000000000Z): read once, from tmp/x.jsonl"
  # check, diff (within a side) and replay alike.
  expect_rc 0 "$GPUMEM" check run/x.jsonl tmp/x.jsonl --max-peak 1GiB
  expect_in "$W/out" "1 limit on 1 GPU of 1 process: 0 broken"
  expect_in "$W/err" "gpumem: warning: run/x.jsonl is a shorter copy of tmp/x.jsonl"
  expect_rc 0 "$GPUMEM" diff tmp/x.jsonl backup/x.jsonl -- "$DATA/after.jsonl"
  expect_in "$W/out" "A = tmp/x.jsonl (1 process)"
  expect_not_in "$W/out" "0#2"
  expect_in "$W/err" "gpumem: warning: backup/x.jsonl is a copy of tmp/x.jsonl"
  # A log on both sides of a diff is a run compared with itself, as a file named on both is.
  expect_rc 0 "$GPUMEM" diff tmp/x.jsonl backup/x.jsonl
  expect_not_in "$W/err" "copy of"
  expect_rc 0 "$GPUMEM" replay --json run/x.jsonl tmp/x.jsonl
  [ "$(json "$W/out" 'len(d["logs"])')" = 1 ] || fail "replay of two copies: not 1 log"
  # Copies that disagree (an edited or damaged one): which to read cannot be told; exit 2, both named.
  { head -1 "$DATA/before.jsonl"; tail -n +2 "$DATA/after.jsonl"; } > tmp/edited.jsonl
  for cmd in report "check --max-peak 1GiB" replay; do
    # shellcheck disable=SC2086
    expect_rc 2 "$GPUMEM" $cmd tmp/x.jsonl tmp/edited.jsonl
    expect_in "$W/err" "gpumem: error: tmp/x.jsonl and tmp/edited.jsonl both hold the log of process 1001 on ci01, started 2026-11-30T03:40:00.000000000Z, but differ from line 4 on"
    expect_not_in "$W/out" "peak"
  done
  expect_rc 2 "$GPUMEM" diff "$DATA/after.jsonl" -- tmp/edited.jsonl run/x.jsonl
  expect_in "$W/err" "gpumem: error: run/x.jsonl and tmp/edited.jsonl both hold the log of process 1001"
  # A copy through a pipe (standard input, <(...): the way a compressed backup is given, zcat) was
  # not compared, and was read as a second process, "rank 0#2".  Pipes are now spooled first when
  # there is something to compare them with, and compared as files are.
  expect_rc 0 bash -c 'cat "$1" | "$0" report --json run/x.jsonl -' "$GPUMEM" tmp/x.jsonl
  [ "$(json "$W/out" 'len(d["processes"])')" = 1 ] || fail "report of a cut file and its copy on stdin: not 1 process"
  [ "$(json "$W/out" 'd["processes"][0]["file"]')" = /dev/stdin ] || fail "report of a cut file and stdin: not read from the longer"
  expect_in "$W/err" "gpumem: warning: run/x.jsonl is a shorter copy of /dev/stdin (the log of process 1001 on ci01, started 2026-11-30T03:40:00.000000000Z): read once, from /dev/stdin"
  expect_rc 0 bash -c '"$0" report --json <(cat "$1") "$1"' "$GPUMEM" tmp/x.jsonl
  [ "$(json "$W/out" 'len(d["processes"])')" = 1 ] || fail "report of <(cat x) x: not 1 process"
  expect_in "$W/err" "gpumem: warning: tmp/x.jsonl is a copy of /dev/fd/"
  expect_rc 0 bash -c 'cat "$1" | "$0" check - "$1" --max-peak 1GiB' "$GPUMEM" tmp/x.jsonl
  expect_in "$W/out" "1 limit on 1 GPU of 1 process: 0 broken"
  expect_in "$W/err" "gpumem: warning: tmp/x.jsonl is a copy of /dev/stdin"
  expect_rc 0 bash -c 'cat "$1" | "$0" diff - "$1" -- "$2"' "$GPUMEM" tmp/x.jsonl "$DATA/after.jsonl"
  expect_in "$W/out" "A = /dev/stdin (1 process)"
  expect_not_in "$W/out" "0#2"
  expect_rc 0 bash -c 'cat "$1" | "$0" replay --json run/x.jsonl -' "$GPUMEM" tmp/x.jsonl
  [ "$(json "$W/out" 'len(d["logs"])')" = 1 ] || fail "replay of a cut file and its copy on stdin: not 1 log"
  expect_rc 2 bash -c 'cat "$1" | "$0" report tmp/x.jsonl -' "$GPUMEM" tmp/edited.jsonl
  expect_in "$W/err" "gpumem: error: tmp/x.jsonl and /dev/stdin both hold the log of process 1001 on ci01, started 2026-11-30T03:40:00.000000000Z, but differ from line 4 on"
  # A pipe that is not a copy is read as before; one pipe alone has nothing to be compared with and
  # is not spooled for it (replay streams it: no temporary file).
  expect_rc 0 bash -c 'cat "$1" | "$0" report --json - "$2"' "$GPUMEM" tmp/x.jsonl "$DATA/after.jsonl"
  [ "$(json "$W/out" 'len(d["processes"])')" = 2 ] || fail "report of stdin and another log: not 2 processes"
  expect_not_in "$W/err" "copy of"
  expect_rc 0 bash -c 'cat "$1" | TMPDIR=/nonexistent "$0" replay --json -' "$GPUMEM" tmp/x.jsonl
  # A --baseline through a pipe that is a copy of the one log checked: the run against itself.
  expect_rc 2 bash -c 'cat "$1" | "$0" check "$1" --baseline -' "$GPUMEM" tmp/x.jsonl
  expect_in "$W/err" "gpumem: error: tmp/x.jsonl is a copy of the --baseline /dev/stdin (the same bytes): the run would be compared with itself"
  expect_rc 2 bash -c '"$0" check "$1" --baseline <(cat "$2")' "$GPUMEM" tmp/x.jsonl run/x.jsonl
  expect_in "$W/err" "gpumem: error: tmp/x.jsonl and the --baseline /dev/fd/"
  expect_rc 2 bash -c 'cat "$1" | "$0" check - --baseline "$1"' "$GPUMEM" tmp/x.jsonl
  expect_in "$W/err" "gpumem: error: /dev/stdin is a copy of the --baseline tmp/x.jsonl (the same bytes)"
  # A report JSON is one more way to give a process twice: two copies of one report, or a log beside
  # the report JSON made from it (a run folder globbed after `gpumem report --json run/*.jsonl >
  # run/report.json`), were read as two processes, "rank 0#2" (check --baseline then failed the run:
  # "rank 0#2 ... not in the baseline").  The same bytes are read once; a report JSON holding a
  # process that another input holds too is refused, naming both (which to read cannot be told).
  mkdir -p rep
  "$GPUMEM" report --json tmp/x.jsonl > rep/x.json 2>/dev/null
  cp rep/x.json rep/x-copy.json
  expect_rc 0 "$GPUMEM" report --json rep/x.json rep/x-copy.json
  [ "$(json "$W/out" 'len(d["processes"])')" = 1 ] || fail "report of a report JSON and its copy: not 1 process"
  expect_in "$W/err" "gpumem: warning: rep/x-copy.json is a copy of rep/x.json (the same bytes): read once, from rep/x.json"
  expect_rc 0 "$GPUMEM" check rep/x.json rep/x-copy.json --max-peak 1GiB
  expect_in "$W/out" "1 limit on 1 GPU of 1 process: 0 broken"
  expect_rc 0 bash -c 'cat "$1" | "$0" report --json - "$1"' "$GPUMEM" rep/x.json
  [ "$(json "$W/out" 'len(d["processes"])')" = 1 ] || fail "report of a report JSON and its copy on stdin: not 1 process"
  "$GPUMEM" report --json tmp/x.jsonl "$DATA/after.jsonl" > rep/both.json 2>/dev/null
  for cmd in report "check --max-peak 1GiB" "check --baseline $DATA/after.jsonl"; do
    # shellcheck disable=SC2086
    expect_rc 2 "$GPUMEM" $cmd tmp/x.jsonl rep/x.json
    expect_in "$W/err" "gpumem: error: tmp/x.jsonl and rep/x.json both hold process 1001 on ci01, started 2026-11-30T03:40:00.000000000Z; a report JSON is not compared with a log or another report, so which to read cannot be told: give one of them"
    expect_not_in "$W/out" "peak"
  done
  expect_rc 2 "$GPUMEM" report rep/both.json run/x.jsonl
  expect_in "$W/err" "gpumem: error: rep/both.json and run/x.jsonl both hold process 1001 on ci01"
  expect_rc 2 "$GPUMEM" diff "$DATA/after.jsonl" -- rep/x.json rep/both.json
  expect_in "$W/err" "gpumem: error: rep/x.json and rep/both.json both hold process 1001 on ci01"
  # A report JSON of other processes beside a log: read as ever.
  expect_rc 0 "$GPUMEM" report --json rep/x.json "$DATA/after.jsonl"
  [ "$(json "$W/out" 'len(d["processes"])')" = 2 ] || fail "report JSON and another process's log: not 2 processes"
  expect_not_in "$W/err" "both hold"
  # Not copies: an exec's two images (one pid, the second started later) and a fork child (its own
  # pid, even with the parent's start) are processes of their own, read without a word.
  sed 's/"reason":"exit"/"reason":"exec"/' "$DATA/before.jsonl" > run/image1.jsonl
  sed 's/"start_unix_ns":1796010000000000000/"start_unix_ns":1796010000500000000/' "$DATA/before.jsonl" > run/image2.jsonl
  sed 's/"pid":1001,"ppid":100,/"pid":1002,"ppid":1001,/; s/"header",/"header","forked_from":1001,/' "$DATA/before.jsonl" > run/child.jsonl
  expect_rc 0 "$GPUMEM" report --json run/image1.jsonl run/image2.jsonl run/child.jsonl
  [ "$(json "$W/out" 'len(d["processes"])')" = 3 ] || fail "exec pair and fork child: not 3 processes"
  expect_not_in "$W/err" "copy of"
  expect_rc 0 "$GPUMEM" check run/image1.jsonl run/image2.jsonl run/child.jsonl --max-peak 1GiB
  expect_in "$W/out" "of 3 processes"
  # Headers that name one process but differ (line 1 is written once, so no copy has another):
  # two processes (pid namespaces under one host name, with a coarse clock), read as two, and said.
  sed 's/"rank":"0"/"rank":"1"/' "$DATA/before.jsonl" > run/rank1.jsonl
  expect_rc 0 "$GPUMEM" report --json tmp/x.jsonl run/rank1.jsonl run/x.jsonl
  [ "$(json "$W/out" 'len(d["processes"])')" = 2 ] || fail "two headers of one process: not 2 processes"
  expect_in "$W/err" "gpumem: warning: run/x.jsonl is a shorter copy of tmp/x.jsonl"
  expect_in "$W/err" "gpumem: warning: run/rank1.jsonl and tmp/x.jsonl both name process 1001 on ci01, started 2026-11-30T03:40:00.000000000Z, in headers that differ: read as two processes"
  ;;
*)
  echo "unknown case $case_name"; exit 2 ;;
esac

if [ "$failures" -gt 0 ]; then
  echo "$case_name: $failures failure(s)"
  exit 1
fi
echo "$case_name: ok"
