#!/usr/bin/env bash
# The first run in one command: builds gpumem (not its tests), runs a training-like workload under
# `gpumem run`, writes the text and HTML reports, and says where everything is.
#
# On a machine with an NVIDIA GPU the workload is a real CUDA program (static cudart, built with nvcc);
# elsewhere it runs on gpumem's emulated CUDA device (tests/emu), and says so.
#
# Environment: CUDAToolkit_ROOT (default /usr/local/cuda); GPUMEM_DEMO_BUILD, the build folder
# (default build-demo; kept, so a second run only relinks); GPUMEM_DEMO_OUT, where the log and the
# reports go (default BUILD/demo); GPUMEM_DEMO_STEPS (default 200); GPUMEM_DEMO_NO_BUILD=1 uses the
# binaries already in GPUMEM_DEMO_BUILD as they are (the test in tests/install reuses the test build).
set -euo pipefail
cd "$(dirname "$0")/.."

export CUDAToolkit_ROOT=${CUDAToolkit_ROOT:-/usr/local/cuda}
build=${GPUMEM_DEMO_BUILD:-build-demo}
mkdir -p "$build"
build=$(cd "$build" && pwd)
out=${GPUMEM_DEMO_OUT:-$build/demo}
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out"/gpumem-*.jsonl "$out/report.html"   # the previous demo's files only: OUT may be a folder of yours
work=$(mktemp -d "${TMPDIR:-/tmp}/gpumem-demo.XXXXXX")   # the program's working folder, removed at exit
trap 'rm -rf "$work"' EXIT

gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then gpu=1; fi

# Only what the demo runs: gpumem, libgpumem.so and, without a GPU, the emulated device.  The tests
# (scripts/test.sh) are a separate, much longer build.
targets=(gpumem gpumem_preload)
[ "$gpu" = 1 ] || targets+=(gpumem_emu_cuda emu_rt_shared_app)
if [ "${GPUMEM_DEMO_NO_BUILD:-0}" = 1 ]; then
  echo "== using the binaries in $build (GPUMEM_DEMO_NO_BUILD=1)"
else
  GPUMEM_WITH_BROWSER=0 GPUMEM_WITH_TESTS=0 scripts/setup.sh
  echo "== building ${targets[*]} in $build (log: $build/demo-build.log)"
  start=$(date +%s)
  if ! { cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUDAToolkit_ROOT="$CUDAToolkit_ROOT" \
           -DGPUMEM_BUILD_TESTS=OFF -DGPUMEM_BUILD_EMU=ON &&
         cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"; } > "$build/demo-build.log" 2>&1; then
    tail -40 "$build/demo-build.log"
    echo "demo: the build failed; the whole log is $build/demo-build.log" >&2
    exit 1
  fi
  echo "   built in $(( $(date +%s) - start )) s"
fi

gpumem=$build/analyzer/gpumem
lib=$build/preload/libgpumem.so
emu=$build/tests/emu
steps=${GPUMEM_DEMO_STEPS:-200}
if [ "$gpu" = 1 ]; then
  echo "== GPU found: $(nvidia-smi -L | head -1)"
  "$CUDAToolkit_ROOT/bin/nvcc" -O2 -o "$build/static_cudart_app" tests/gpu/static_cudart_app.cu
  program=("$build/static_cudart_app")
  own="$gpumem run -- python train.py"
else
  echo "== No GPU here: running on gpumem's emulated CUDA device (tests/emu), 16 GiB per device"
  export LD_LIBRARY_PATH=$emu/driver:$emu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  program=("$emu/emu_rt_shared_app" train "$steps")
  own="LD_LIBRARY_PATH=$emu/driver:$emu $gpumem run -- PROGRAM   (it loads the emulated libcuda.so.1; on a GPU: $gpumem run -- python train.py)"
fi

echo "== gpumem run -o $out/ -- ${program[*]}"
(cd "$work" && "$gpumem" run -o "$out/" -- "${program[@]}")
log=$(ls "$out"/gpumem-*.jsonl | head -1)

echo "== gpumem report $log"
"$gpumem" report --no-progress "$log"
"$gpumem" report --no-progress --html "$out/report.html" "$log" > /dev/null

echo "== done"
echo "binaries: $gpumem and $lib (cmake --install $build --prefix ~/.local puts them on your PATH)"
echo "HTML report: open file://$out/report.html in a browser (or: xdg-open $out/report.html)"
echo "your own program: $own"
