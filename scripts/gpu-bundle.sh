#!/usr/bin/env bash
# Builds, on the dev machine, what scripts/gpu-e2e.sh runs on the GPU machine: libgpumem.so and a static-cudart CUDA program.
set -euo pipefail
cd "$(dirname "$0")/.."
cuda_root=${CUDAToolkit_ROOT:-/usr/local/cuda}
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUDAToolkit_ROOT="$cuda_root" >/dev/null
cmake --build build -j"$(nproc)" --target gpumem_preload
mkdir -p build/gpu
# nvcc's default is -cudart static: the case gpumem must see through the cuGetProcAddress route.
"$cuda_root/bin/nvcc" -O2 -arch=sm_90 -o build/gpu/static_cudart_app tests/gpu/static_cudart_app.cu
echo "bundle ready: build/preload/libgpumem.so build/gpu/static_cudart_app"
