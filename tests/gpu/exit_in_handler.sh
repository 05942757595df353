#!/usr/bin/env bash
# Runs build/gpu/exit_in_handler N times bare and N times under libgpumem.so (alternating) and
# prints how many ended (exit 0) and how many hung (timeout 20 s): gpumem must hang no more often
# than the bare program.  usage: tests/gpu/exit_in_handler.sh [N]   (after scripts/gpu-bundle.sh)
set -uo pipefail
n=${1:-20}
app=build/gpu/exit_in_handler
lib=$PWD/build/preload/libgpumem.so
if [ ! -x "$app" ] || [ ! -f "$lib" ]; then echo "exit_in_handler: run scripts/gpu-bundle.sh first" >&2; exit 2; fi
out=${OUT:-/tmp}/exit-in-handler && mkdir -p "$out"
declare -A ok hung other
for mode in bare gpumem; do ok[$mode]=0; hung[$mode]=0; other[$mode]=0; done
for _ in $(seq 1 "$n"); do
  for mode in bare gpumem; do
    if [ $mode = gpumem ]; then
      GPUMEM_OUT=$out/ LD_PRELOAD=$lib timeout 20 "$app" > /dev/null 2>> "$out/$mode.err"
    else
      timeout 20 "$app" > /dev/null 2>> "$out/$mode.err"
    fi
    rc=$?
    case $rc in 0) ok[$mode]=$((ok[$mode] + 1)) ;; 124) hung[$mode]=$((hung[$mode] + 1)) ;; *) other[$mode]=$((other[$mode] + 1)) ;; esac
  done
done
for mode in bare gpumem; do
  echo "exit_in_handler $mode: $n runs, ended ${ok[$mode]}, hung ${hung[$mode]}, other exit ${other[$mode]}"
done
[ "${hung[gpumem]}" -le "${hung[bare]}" ]
