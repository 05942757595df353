#!/usr/bin/env bash
# Builds, on the dev machine, what scripts/gpu-e2e.sh runs on the GPU machine: libgpumem.so, gpumem and a static-cudart CUDA program.
set -euo pipefail
cd "$(dirname "$0")/.."
cuda_root=${CUDAToolkit_ROOT:-/usr/local/cuda}
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUDAToolkit_ROOT="$cuda_root" >/dev/null
cmake --build build -j"$(nproc)" --target gpumem_preload gpumem
mkdir -p build/gpu/lib
# gpumem links shared Debian libraries the GPU machine lacks (simdjson, spdlog, fmt, libdw and its
# compression libraries): scripts/gpu-e2e-run.sh puts these copies on gpumem's library path.  The C
# and C++ runtimes stay the GPU machine's own (newer there).
ldd build/analyzer/gpumem | awk '$3 ~ /^\// {print $3}' \
  | grep -Ev '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' \
  | while read -r so; do cp -L "$so" build/gpu/lib/; done
# nvcc's default is -cudart static: the case gpumem must see through the cuGetProcAddress route.
"$cuda_root/bin/nvcc" -O2 -arch=sm_90 -o build/gpu/static_cudart_app tests/gpu/static_cudart_app.cu
"$cuda_root/bin/nvcc" -O2 -arch=sm_90 -o build/gpu/primary_release tests/gpu/primary_release.cu -L"$cuda_root/lib64/stubs" -lcuda
"$cuda_root/bin/nvcc" -O2 -arch=sm_90 -o build/gpu/vmm_cost tests/gpu/vmm_cost.cu -L"$cuda_root/lib64/stubs" -lcuda
"$cuda_root/bin/nvcc" -O2 -arch=sm_90 -o build/gpu/exit_in_handler tests/gpu/exit_in_handler.cu
"$cuda_root/bin/nvcc" -O2 -arch=sm_90 -o build/gpu/address_range tests/gpu/address_range.cu -L"$cuda_root/lib64/stubs" -lcuda
"$cuda_root/bin/nvcc" -O2 -arch=sm_90 -o build/gpu/huge_request tests/gpu/huge_request.cu
"$cuda_root/bin/nvcc" -O2 -arch=sm_90 -o build/gpu/green_free tests/gpu/green_free.cu -L"$cuda_root/lib64/stubs" -lcuda
"$cuda_root/bin/nvcc" -O2 -arch=sm_90 -o build/gpu/ipc_first_abi tests/gpu/ipc_first_abi.cu -L"$cuda_root/lib64/stubs" -lcuda -ldl
"$cuda_root/bin/nvcc" -O2 -arch=sm_90 -o build/gpu/ctx_end_memory tests/gpu/ctx_end_memory.cu -L"$cuda_root/lib64/stubs" -lcuda
cc -O1 -g -shared -fPIC -o build/gpu/abort_trace.so tests/gpu/abort_trace.c
echo "bundle ready: build/preload/libgpumem.so build/analyzer/gpumem build/gpu/lib build/gpu/static_cudart_app"
