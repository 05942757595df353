"""GPU workloads for scripts/gpu-e2e.sh: each does known allocations and writes what its framework reports.

Usage: python3 workloads.py MODE STATS_JSON
Every mode ends with os._exit(0) after writing STATS_JSON, so nothing is freed after the framework's
numbers were read: the log's live bytes at its end line are comparable with them.
"""
import json
import os
import sys


def torch_mode(stats_path):
    import torch

    keep = []
    for i in range(20):
        keep.append(torch.empty(int((i + 1) * 1.5 * 2**20), dtype=torch.uint8, device="cuda"))
    del keep[::2]  # frees half: the caching allocator keeps the memory, the no-cache mode returns it
    a = torch.randn(1024, 1024, device="cuda")
    b = (a @ a).relu_()
    keep.append(b)
    small = [torch.ones(i + 1, device="cuda") for i in range(100)]
    torch.cuda.synchronize()
    live = keep + small + [a]
    s = torch.cuda.memory_stats()
    stats = {
        "reserved": torch.cuda.memory_reserved(),
        "allocated": torch.cuda.memory_allocated(),
        "num_alloc_retries": s.get("num_alloc_retries", 0),
        "segment_count": s.get("segment.all.current", 0),
        "alloc_calls": s.get("num_device_alloc", None),
        "free_calls": s.get("num_device_free", None),
        "env": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "no_caching": os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", ""),
        # every tensor still alive: the log must show memory holding each of them
        "tensors": [[t.data_ptr(), t.untyped_storage().nbytes()] for t in live],
    }
    with open(stats_path, "w") as f:
        json.dump(stats, f)
    del small
    os._exit(0)


def jax_mode(stats_path):
    import jax
    import jax.numpy as jnp

    x = jnp.ones((4096, 4096), dtype=jnp.float32)  # 64 MiB
    y = (x @ x).block_until_ready()
    stats = {"platform": os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default"), "sum": float(y[0, 0])}
    dev = jax.devices()[0]
    try:
        ms = dev.memory_stats()
        stats["bytes_in_use"] = ms.get("bytes_in_use")
        stats["bytes_reserved"] = ms.get("bytes_reserved", ms.get("pool_bytes"))
    except Exception as e:  # memory_stats is optional on some backends
        stats["memory_stats_error"] = str(e)
    with open(stats_path, "w") as f:
        json.dump(stats, f)
    os._exit(0)


def cupy_mode(stats_path):
    import cupy as cp

    cp.cuda.set_allocator(None)  # every array is its own cudaMalloc (static cudart inside CuPy)
    sizes = [10 * 2**20, 3 * 2**20 + 5, 4096]
    arrays = [cp.empty(s, dtype=cp.uint8) for s in sizes]
    freed = arrays.pop(1)
    del freed
    cp.cuda.Device().synchronize()
    # Raw cudaMalloc blocks: the mapping the driver reports for a 6 MiB block (gpumem answers the
    # block, not the 2 MiB chunk under the pointer), and cudaFreeAsync of cudaMalloc memory, which
    # CUDA allows (under gpumem the pool must take it: the driver never saw the block).
    import ctypes
    rt = cp.cuda.runtime
    cuda = ctypes.CDLL("libcuda.so.1")
    a, b = rt.malloc(6 * 2**20), rt.malloc(2**20)
    mapping_size, mapping_base = ctypes.c_size_t(0), ctypes.c_void_p(0)
    rc_size = cuda.cuPointerGetAttribute(ctypes.byref(mapping_size), 18, ctypes.c_uint64(a + 4 * 2**20))  # MAPPING_SIZE
    rc_base = cuda.cuPointerGetAttribute(ctypes.byref(mapping_base), 19, ctypes.c_uint64(a + 4 * 2**20))  # MAPPING_BASE_ADDR
    try:
        rt.freeAsync(a, 0)
        free_async_rc = 0
    except rt.CUDARuntimeError as e:
        free_async_rc = e.status
    rt.deviceSynchronize()
    rt.free(b)
    # cudaFreeAsync of a cudaMalloc block on a stream being captured: a free node, which only a graph
    # allocation may have (cuMemFreeAsync's documentation), so the driver should refuse it; the code
    # is recorded, to be the same without gpumem, with it and with its pool (which must pass the call
    # to the driver and keep the block: a second 5 MiB cudaMalloc must not get it back).
    c = rt.malloc(5 * 2**20)
    stream = cp.cuda.Stream()  # blocking, the only stream: auto reuse stays immediate
    rt.streamBeginCapture(stream.ptr, 0)  # cudaStreamCaptureModeGlobal
    try:
        rt.freeAsync(c, stream.ptr)
        capture_free_rc = 0
    except rt.CUDARuntimeError as e:
        capture_free_rc = e.status
    try:
        graph = rt.streamEndCapture(stream.ptr)
        capture_end_rc = 0
        if graph:
            rt.graphDestroy(graph)  # never launched
    except rt.CUDARuntimeError as e:
        capture_end_rc = e.status
    d = rt.malloc(5 * 2**20)
    print(f"capture cudaFreeAsync rc={capture_free_rc} end capture rc={capture_end_rc} same block again={d == c}")
    with open(stats_path, "w") as f:
        json.dump({"sizes": sizes, "live_sizes": [sizes[0], sizes[2]], "block": a, "mapping_rc": [rc_size, rc_base],
                   "mapping_size": mapping_size.value, "mapping_base": mapping_base.value or 0,
                   "free_async_rc": free_async_rc, "capture_block": c, "capture_free_rc": capture_free_rc,
                   "capture_end_rc": capture_end_rc, "capture_realloc_same": d == c}, f)
    os._exit(0)


if __name__ == "__main__":
    {"torch": torch_mode, "jax": jax_mode, "cupy": cupy_mode}[sys.argv[1]](sys.argv[2])
