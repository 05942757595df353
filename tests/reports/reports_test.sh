#!/usr/bin/env bash
# Tests of what the text, HTML and Perfetto reports say to a reader, through the real gpumem binary
# on the golden logs (tests/data/golden): names, plurals, rates, pool-only metrics, chart lines.
#
# usage: reports_test.sh CASE   with GPUMEM, SRC (source tree) and WORK set.
set -uo pipefail
case_name=$1
: "${GPUMEM:?}" "${SRC:?}" "${WORK:?}"
G=$SRC/tests/data/golden
W=$WORK/$case_name
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
. "$SRC/tests/lib/expect.sh"
report() {  # report NAME LOG... [OPTIONS]: text to NAME.txt
  local name=$1; shift
  "$GPUMEM" report --no-progress "$@" > "$W/$name.txt" 2> "$W/$name.err" || fail "gpumem report $* failed"
}

case $case_name in
names)
  # Each of the three byte counts is explained once, with PyTorch's name beside it.
  report off "$G/pool_off_basic.jsonl" --html "$W/off.html"
  expect_in off.txt "requested = asked for by the program and not yet freed     (PyTorch: torch.cuda.memory_allocated())"
  expect_in off.txt "allocated = pool blocks holding them, incl. pool rounding  (PyTorch: no counterpart)"
  expect_in off.txt "reserved  = held from the driver: segments + unpooled      (PyTorch: torch.cuda.memory_reserved())"
  expect_in off.html "<b>requested</b> = asked for by the program and not yet freed (PyTorch: <code>torch.cuda.memory_allocated()</code>)"
  expect_in off.html "<b>reserved</b> = held from the driver: segments + unpooled (PyTorch: <code>torch.cuda.memory_reserved()</code>)"
  # Once per report, not once per log.
  report ranks "$G/rank0.jsonl" "$G/rank1.jsonl"
  [ "$(grep -c 'torch.cuda.memory_allocated()' ranks.txt)" = 1 ] || fail "the meanings are not printed exactly once for two logs"
  # docs/metrics.md says plainly that allocated includes the pool's rounding.
  expect_in "$SRC/docs/metrics.md" "**including the pool's rounding**"
  ;;
cosmetics)
  # Pool off: no segment or fragmentation numbers, singular nouns for one, rates with separators.
  report off "$G/pool_off_basic.jsonl"
  for s in "| Segments " "| External fragmentation" "| Free blocks" "| Largest free block" "| Free in segments" "free in segments" "    frag"; do
    expect_not_in off.txt "$s"
  done
  expect_in off.txt "1 live allocation"
  expect_not_in off.txt "1 live allocations"
  expect_in off.txt "72,579/s"
  grep -nE '[0-9]{4,}(\.[0-9]+)?/s' off.txt && fail "a rate without thousands separators"
  grep -nE '(^|[^0-9,])1 (blocks|allocations|warnings|events)' off.txt && fail "a plural after 1"
  # Pool on: the pool's metrics are there, and "1 block" in the segment map.
  report frag "$G/pool_fragmentation.jsonl"
  expect_in frag.txt "| Segments "
  expect_in frag.txt "| External fragmentation"
  expect_in frag.txt "frag"
  expect_in frag.txt "| 1 block, 1.50 MiB free, largest 1.00 MiB"
  expect_in frag.txt "500,000/s"
  grep -nE '(^|[^0-9,])1 (blocks|allocations|warnings|events)' frag.txt && fail "a plural after 1"
  # A truncated log with warnings: "2 warnings", "1 allocation".
  report killed "$G/killed_truncated.jsonl"
  expect_in killed.txt "2 warnings, printed on stderr"
  expect_in killed.txt "Live when the log stops: 1 allocation, 2.00 MiB requested"
  # Nor are they leaks by call site: a killed process never got to free them.
  grep -v '"ev":"end"' "$G/stacks.jsonl" > killed_stacks.jsonl
  report killed_stacks killed_stacks.jsonl --html "$W/killed_stacks.html"
  expect_in killed_stacks.txt "Live when the log stops, by call site"
  expect_not_in killed_stacks.txt "Leaks by call site"
  expect_in killed_stacks.html "Live when the log stops, by call site:"
  expect_not_in killed_stacks.html "Leaks by call site"
  # A call site's callers beyond the three shown: "1 more frame", "2 more frames".
  head -1 "$G/stacks.jsonl" > deep.jsonl
  for n in 5 6; do
    frames=$(for i in $(seq 1 $n); do printf '{"function":"f%d","file":"/src/train.py","line":%d},' "$i" "$i"; done)
    echo "{\"ev\":\"stack\",\"id\":$n,\"frames\":[${frames%,}]}" >> deep.jsonl
    echo "{\"ev\":\"alloc\",\"seq\":$((n - 5)),\"t\":$n,\"tid\":1,\"dev\":0,\"api\":\"cudaMalloc\",\"kind\":\"device\",\"ptr\":\"0x$n\",\"size\":$n,\"stack\":$n}" >> deep.jsonl
  done
  report deep deep.jsonl
  expect_in deep.txt "... 1 more frame in --json"
  expect_in deep.txt "... 2 more frames in --json"
  ;;
html_lines)
  # Pool off: requested = allocated = reserved all along, so the memory chart has one line and its
  # legend one entry that names all three; no fragmentation chart.
  "$GPUMEM" report --no-progress --html "$W/off.html" "$G/pool_off_basic.jsonl" > /dev/null || fail "report --html"
  [ "$(grep -c '<polyline' off.html)" = 1 ] || fail "pool off: expected 1 line in the charts, got $(grep -c '<polyline' off.html)"
  expect_in off.html ">reserved = allocated = requested</text>"
  expect_not_in off.html "External fragmentation over time"
  expect_not_in off.html "max external fragmentation"
  # Pool on: three different lines, three legend entries, drawn widest first so none hides another.
  "$GPUMEM" report --no-progress --html "$W/on.html" "$G/pool_fragmentation.jsonl" > /dev/null || fail "report --html"
  sed -n '/memory over time/,/<\/svg>/p' on.html > mem.svg
  [ "$(grep -c '<polyline' mem.svg)" = 3 ] || fail "pool on: expected 3 memory lines"
  for n in reserved allocated requested; do expect_in mem.svg ">$n</text>"; done
  widths=$(grep -o "<polyline fill='none' stroke='#[0-9a-f]*' stroke-width='[0-9.]*'" mem.svg | sed "s/.*stroke-width='//; s/'//" | tr '\n' ' ')
  [ "$widths" = "4.6 3.1 1.6 " ] || fail "memory lines' widths '$widths', expected widest first"
  expect_in on.html "External fragmentation over time"
  ;;
perfetto_processes)
  # Two ranks whose recorders started 5 s apart (start_unix_ns) land on one clock in one trace:
  # rank 1's first event (t = 1 us in its own log) is at 5 s + 1 us; each process is one track group
  # (its own pid), ordered by rank although rank 1's log is given first.
  # Rank 1 is also made a forked child of rank 0's process, which its track group's name says.
  sed '1s/"start_unix_ns":1796010000000000000/"start_unix_ns":1796010005000000000,"forked_from":8000/' "$G/rank1.jsonl" > late1.jsonl
  grep -q '"start_unix_ns":1796010005000000000' late1.jsonl || fail "could not shift rank 1's start"
  "$GPUMEM" report --no-progress --perfetto "$W/trace.json" late1.jsonl "$G/rank0.jsonl" > /dev/null || fail "report --perfetto"
  python3 - "$W/trace.json" <<'PY' || fail "trace content"
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
names = {e["pid"]: e["args"]["name"] for e in ev if e["name"] == "process_name"}
assert sorted(names) == [8000, 8001], names
assert "rank 0" in names[8000] and "rank 1" in names[8001], names
assert "forked from 8000" in names[8001] and "forked" not in names[8000], names
sort = {e["pid"]: e["args"]["sort_index"] for e in ev if e["name"] == "process_sort_index"}
assert sort == {8000: 0, 8001: 1}, sort
first = {pid: min(e["ts"] for e in ev if e["pid"] == pid and e["ph"] == "C") for pid in names}
assert first[8000] == 1.0, first          # the earliest log keeps its own times
assert first[8001] == 5000001.0, first    # 5 s later, in us
PY
  # One log alone keeps its own times: nothing to align.
  "$GPUMEM" report --no-progress --perfetto "$W/one.json" late1.jsonl > /dev/null || fail "report --perfetto"
  python3 -c "import json,sys; ev=json.load(open(sys.argv[1]))['traceEvents']; t=min(e['ts'] for e in ev if e['ph']=='C'); assert t == 1.0, t" "$W/one.json" \
    || fail "a single log's times were shifted"
  ;;
*)
  echo "unknown case $case_name"; exit 2 ;;
esac

if [ "$failures" -gt 0 ]; then
  echo "$case_name: $failures failure(s)"
  exit 1
fi
echo "$case_name: ok"
