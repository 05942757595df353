#!/usr/bin/env bash
# The main job in one command: build gpumem, run a bundled training-like workload under it, print the report.
#
# On a machine with an NVIDIA GPU the workload is a real CUDA program (static cudart, built with nvcc);
# elsewhere it runs on gpumem's emulated CUDA device, and says so.
set -euo pipefail
cd "$(dirname "$0")/.."

GPUMEM_WITH_BROWSER=0 scripts/setup.sh
cuda_root=${CUDAToolkit_ROOT:-/usr/local/cuda}
echo "== building gpumem (log: build/demo-build.log)"
mkdir -p build
if ! { cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUDAToolkit_ROOT="$cuda_root" &&
       cmake --build build -j"$(nproc)"; } > build/demo-build.log 2>&1; then
  tail -40 build/demo-build.log
  echo "demo: the build failed; the whole log is build/demo-build.log" >&2
  exit 1
fi

out=$(mktemp -d /tmp/gpumem-demo.XXXXXX)
lib=$(pwd)/build/preload/libgpumem.so
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "== GPU found: $(nvidia-smi -L | head -1)"
  mkdir -p build/gpu
  "$cuda_root/bin/nvcc" -O2 -o build/gpu/static_cudart_app tests/gpu/static_cudart_app.cu
  (cd "$out" && LD_PRELOAD="$lib" GPUMEM_OUT="$out/demo-%p.jsonl" "$OLDPWD/build/gpu/static_cudart_app")
else
  echo "== No GPU here: running on gpumem's emulated CUDA device (tests/emu), 16 GiB per device"
  emu=$(pwd)/build/tests/emu
  (cd "$out" && LD_LIBRARY_PATH="$emu/driver:$emu" LD_PRELOAD="$lib" GPUMEM_OUT="$out/demo-%p.jsonl" \
     "$emu/emu_rt_shared_app" train 200)
fi

log=$(ls "$out"/demo-*.jsonl | head -1)
echo "== log: $log ($(wc -l < "$log") lines)"
if [ -x build/analyzer/gpumem ]; then
  build/analyzer/gpumem report "$log"
else
  echo "(the analyzer was not built; the last line of the log:)"
  tail -1 "$log"
fi
