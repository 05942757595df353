# Driver answers the pool must not change, for scripts/gpu-e2e.sh (sourced by it; GPUMEM_E2E_ONLY=answers runs it alone).
#
# Uses LIB, LOGS, RESULTS and fails.  Each check runs three times: without gpumem, with the pool, with GPUMEM_POOL_VMM=off.
# Answers the driver gives that the pool must not change (docs/pool.md): calls inside stream
# captures (tests/gpu/capture_mode_check.py, every capture mode x thread x thread mode), and
# memory the program freed into the pool, asked for again by calls the pool does not serve
# (tests/gpu/other_allocators_check.py: cuMemCreate, cudaMallocAsync, managed memory, CUDA arrays, the device malloc heap, module loads,
# a first cuSOLVER call), with lazy and with eager module loading, and after a device reset
# (tests/gpu/reset_check.py: the GPU filled again after cudaDeviceReset, and after a primary context's
# last release, three times).  Each outcome, with gpumem and
# with GPUMEM_POOL_VMM=off, must equal the program's without gpumem.
same_run() {  # same_run SCRIPT NAME ENV...: the script's JSON less its run-dependent members, one line
  local script=$1 name=$2; shift 2
  env "$@" timeout 300 python3 "$script" > "$LOGS/same-$name.json" 2> "$LOGS/same-$name.stderr"
  python3 - "$LOGS/same-$name.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:  # no JSON: the script died; its stderr is in the log folder
    print("no result:", repr(e)[:80]); sys.exit()
drop = {"cudart", "problems", "failed", "free_at_start_gib", "asked_gib"}
def strip(v):  # the steps' answers only (sizes and free memory differ from run to run)
    return {k: strip(x) for k, x in v.items() if k not in ("filled_gib", "free_after_frees_gib")} if isinstance(v, dict) else v
print(json.dumps({k: strip(v) for k, v in d.items() if k not in drop}, sort_keys=True))
PY
}
{
  echo
  echo "### Driver answers the pool must not change: the same outcome with and without gpumem"
  echo '| check | without gpumem | gpumem pool (VMM) | gpumem pool, GPUMEM_POOL_VMM=off | verdict |'
  echo '|---|---|---|---|---|'
  for spec in capture:tests/gpu/capture_mode_check.py: other:tests/gpu/other_allocators_check.py: \
              other-eager:tests/gpu/other_allocators_check.py:CUDA_MODULE_LOADING=EAGER \
              reset:tests/gpu/reset_check.py:; do
    IFS=: read -r name script env <<< "$spec"
    base=$(same_run "$script" "$name-native" $env)
    vmm=$(same_run "$script" "$name-gpumem" $env GPUMEM_OUT="$LOGS/same-$name.%p.jsonl" LD_PRELOAD="$LIB")
    novmm=$(same_run "$script" "$name-novmm" $env GPUMEM_POOL_VMM=off GPUMEM_OUT="$LOGS/same-$name-novmm.%p.jsonl" LD_PRELOAD="$LIB")
    verdict=PASS
    # A check that gave no answers without gpumem (it died, or reports an error of its own) compares
    # nothing: three dead runs print the same "no result" line, which read as PASS.
    case $base in "no result:"* | *'"error":'*) verdict=FAIL ;; esac
    if [ "$vmm" != "$base" ] || [ "$novmm" != "$base" ]; then verdict=FAIL; fi
    [ "$verdict" = PASS ] || fails=$((fails + 1))
    short() { if [ "$1" = "$base" ]; then echo same; else echo "$1" | cut -c1-300; fi; }
    echo "| $name | $(echo "$base" | cut -c1-300) | $(short "$vmm") | $(short "$novmm") | $verdict |"
  done
  # Programs whose whole output must be the same alone, under the pool and with GPUMEM_POOL_VMM=off:
  # tests/gpu/address_range.cu (cuMemGetAddressRange and cuPointerGetAttribute's RANGE_START_ADDR /
  # RANGE_SIZE at a block's start, middle, last byte and one past it, sizes from 1 byte to 20 MiB + 7:
  # the pool answers them itself, as the driver would) and tests/gpu/huge_request.cu (a request
  # larger than the device fails at once and leaves the pool's cache, as the driver keeps its memory).
  for spec in "range:address_range:address ranges (36 queries)" "huge:huge_request:request larger than the device"; do
    IFS=: read -r tag prog label <<< "$spec"
    ar=build/gpu/$prog
    if [ ! -x "$ar" ]; then
      fails=$((fails + 1))
      echo "| $label | $ar missing (run scripts/gpu-bundle.sh) | | | FAIL |"
      continue
    fi
    # Each run must succeed on its own: two failing runs would print the same lines.
    base=$("$ar" 2>&1) || base="exit $?: $base"
    vmm=$(GPUMEM_OUT="$LOGS/same-$tag.%p.jsonl" LD_PRELOAD="$LIB" "$ar" 2>&1) || vmm="exit $?: $vmm"
    novmm=$(GPUMEM_POOL_VMM=off GPUMEM_OUT="$LOGS/same-$tag-novmm.%p.jsonl" LD_PRELOAD="$LIB" "$ar" 2>&1) || novmm="exit $?: $novmm"
    printf '%s\n' "$base" > "$LOGS/same-$tag-native.txt"
    printf '%s\n' "$vmm" > "$LOGS/same-$tag-gpumem.txt"
    printf '%s\n' "$novmm" > "$LOGS/same-$tag-novmm.txt"
    verdict=PASS
    if [ "$vmm" != "$base" ] || [ "$novmm" != "$base" ] || [ -z "$base" ] || [ "${base#exit }" != "$base" ]; then
      verdict=FAIL; fails=$((fails + 1))
    fi
    diffs() { if [ "$1" = "$base" ]; then echo same; else diff <(printf '%s\n' "$base") <(printf '%s\n' "$1") | grep '^>' | head -3 | tr '\n' ' '; fi; }
    echo "| $label | $(echo "$base" | wc -l) lines, e.g. $(echo "$base" | sed -n 2p) | $(diffs "$vmm") | $(diffs "$novmm") | $verdict |"
  done
  # The stream-ordered allocations those runs made are in their logs, on the GPU they are on
  # (cuMemAllocAsync on its stream's device, cuMemAllocFromPoolAsync on its pointer's: device 0).
  for api in cuMemAllocAsync cuMemAllocFromPoolAsync; do
    n=$(cat "$LOGS"/same-other.*.jsonl "$LOGS"/same-other-novmm.*.jsonl 2>/dev/null |
        grep '"ev":"alloc"' | grep "\"api\":\"$api\"" | grep -c '"dev":0' || true)
    verdict=PASS
    if [ "$n" -lt 2 ]; then verdict=FAIL; fails=$((fails + 1)); fi
    echo "| $api in the logs of 'other' (pool and VMM off) | - | $n alloc lines on dev 0 (2 expected) | | $verdict |"
  done
} >> "$RESULTS" 2>&1
