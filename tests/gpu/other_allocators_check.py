"""Memory a program frees into gpumem's pool, asked for again by an allocator the pool does not serve.

Under PYTORCH_NO_CUDA_MEMORY_CACHING=1 every freed tensor goes back to the driver without gpumem,
and into gpumem's pool with it.  The program then asks for most of the GPU through cuMemCreate
(as NCCL's buffers do), cuMemAllocAsync (cudaMallocAsync's pool) and cuMemAllocManaged: without
gpumem each is served, and it must be under gpumem too (docs/pool.md, "OOM behaviour").  Prints
one JSON object (each call's result, and what cuMemGetInfo says is free after the frees).
Usage: python3 other_allocators_check.py   (exit 1 when a call fails)
"""
import ctypes
import json
import os
import sys

os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
import torch  # noqa: E402

cu = ctypes.CDLL("libcuda.so.1")
GiB = 1 << 30
torch.zeros(1, device="cuda")
free0, total = torch.cuda.mem_get_info()
want = int(free0 * 0.8) // (2 << 20) * (2 << 20)  # whole 2 MiB granules (cuMemCreate's)


def fill_and_free():
    """Tensors of 1 GiB up to 80% of the free memory, freed again; cuMemGetInfo's free after."""
    ts = [torch.empty(GiB, dtype=torch.uint8, device="cuda") for _ in range(want // GiB)]
    del ts
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


class Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("loc_type", ctypes.c_int),
                ("loc_id", ctypes.c_int), ("win32HandleMetaData", ctypes.c_void_p),
                ("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


out = {"free_at_start_gib": free0 / GiB, "asked_gib": want / GiB}
out["free_after_frees_gib"] = fill_and_free() / GiB
prop = Prop(type=1, loc_type=1, loc_id=0)  # pinned, on device 0
h = ctypes.c_uint64(0)
out["create_rc"] = cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(want), ctypes.byref(prop), ctypes.c_ulonglong(0))
if out["create_rc"] == 0:
    cu.cuMemRelease(h)

fill_and_free()
p = ctypes.c_uint64(0)
out["async_rc"] = cu.cuMemAllocAsync(ctypes.byref(p), ctypes.c_size_t(want), ctypes.c_void_p(0))
if out["async_rc"] == 0:
    cu.cuMemFreeAsync(p, ctypes.c_void_p(0))
    cu.cuCtxSynchronize()
    pool = ctypes.c_void_p(0)
    cu.cuDeviceGetDefaultMemPool(ctypes.byref(pool), 0)
    cu.cuMemPoolTrimTo(pool, ctypes.c_size_t(0))  # the driver's pool gives it back too

fill_and_free()
out["managed_rc"] = cu.cuMemAllocManaged(ctypes.byref(p), ctypes.c_size_t(want), 1)
if out["managed_rc"] == 0:
    cu.cuMemFree_v2(p)

out["failed"] = [k for k in ("create_rc", "async_rc", "managed_rc") if out[k] != 0]
print(json.dumps(out))
sys.exit(1 if out["failed"] else 0)
