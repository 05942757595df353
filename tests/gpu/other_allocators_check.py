"""Memory a program frees into gpumem's pool, needed again by a call the pool does not serve.

Under PYTORCH_NO_CUDA_MEMORY_CACHING=1 every freed tensor goes back to the driver without gpumem,
and into gpumem's pool with it.  Before each step the program fills the GPU with tensors until
the driver refuses one, then frees them all; the step then asks for memory another way: through
cuMemCreate (as NCCL's buffers do), cuMemAllocAsync (cudaMallocAsync's pool), cuMemAllocFromPoolAsync
(a pool of the program's own, cuMemPoolCreate, as cudaMallocFromPoolAsync), cuMemAllocManaged,
a CUDA array (cuArrayCreate_v2, as cudaMallocArray), a device malloc heap (cuCtxSetLimit), by loading and launching a module never loaded before (CuPy RawKernel: cuModuleLoadData and
cuLaunchKernel), and by a PyTorch operator not used before (lazy loading of its kernels).
Without gpumem each is served; it must be under gpumem too (docs/pool.md, "OOM behaviour").
Prints one JSON object (each step's result, and cuMemGetInfo's free after the frees).
Usage: python3 other_allocators_check.py   (exit 1 when a step fails; OTHER_ALLOCATORS_ONLY=a,b runs those steps)
"""
import ctypes
import json
import os
import sys

os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
import cupy as cp  # noqa: E402
import torch  # noqa: E402

cu = ctypes.CDLL("libcuda.so.1")
MiB, GiB = 1 << 20, 1 << 30
torch.zeros(1, device="cuda")
free0, total = torch.cuda.mem_get_info()
want = int(free0 * 0.8) // (2 * MiB) * (2 * MiB)  # whole 2 MiB granules (cuMemCreate's)


def fill_and_free():
    """Tensors until the driver refuses one (1 GiB, then 32 MiB, then 2 MiB), all freed again.
    Returns (GiB filled, cuMemGetInfo's free after the frees in GiB)."""
    ts, filled = [], 0
    for size in (GiB, 32 * MiB, 2 * MiB):
        while True:
            try:
                ts.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
                filled += size
            except Exception:  # OutOfMemoryError, or AcceleratorError from a cudaMalloc under NO_CACHING
                if ts or size != GiB:
                    break
                raise
    del ts
    torch.cuda.synchronize()
    return round(filled / GiB, 2), round(torch.cuda.mem_get_info()[0] / GiB, 2)


class Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("loc_type", ctypes.c_int),
                ("loc_id", ctypes.c_int), ("win32HandleMetaData", ctypes.c_void_p),
                ("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


def create():
    h = ctypes.c_uint64(0)
    prop = Prop(type=1, loc_type=1, loc_id=0)  # pinned, on device 0
    rc = cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(want), ctypes.byref(prop), ctypes.c_ulonglong(0))
    if rc == 0:
        cu.cuMemRelease(h)
    return rc


def alloc_async():
    p = ctypes.c_uint64(0)
    rc = cu.cuMemAllocAsync(ctypes.byref(p), ctypes.c_size_t(want), ctypes.c_void_p(0))
    if rc == 0:
        cu.cuMemFreeAsync(p, ctypes.c_void_p(0))
        cu.cuCtxSynchronize()
        pool = ctypes.c_void_p(0)
        cu.cuDeviceGetDefaultMemPool(ctypes.byref(pool), 0)
        cu.cuMemPoolTrimTo(pool, ctypes.c_size_t(0))  # the driver's pool gives it back too
    return rc


class PoolProps(ctypes.Structure):  # CUmemPoolProps
    _fields_ = [("allocType", ctypes.c_int), ("handleTypes", ctypes.c_int), ("loc_type", ctypes.c_int),
                ("loc_id", ctypes.c_int), ("win32SecurityAttributes", ctypes.c_void_p), ("maxSize", ctypes.c_size_t),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 54)]


def alloc_from_pool():
    """From a pool the program made: the block is written and read back before it is freed."""
    pool = ctypes.c_void_p(0)
    rc = cu.cuMemPoolCreate(ctypes.byref(pool), ctypes.byref(PoolProps(allocType=1, loc_type=1, loc_id=0)))
    if rc != 0:
        return f"cuMemPoolCreate {rc}"
    p = ctypes.c_uint64(0)
    rc = cu.cuMemAllocFromPoolAsync(ctypes.byref(p), ctypes.c_size_t(want), pool, ctypes.c_void_p(0))
    if rc == 0:
        byte = ctypes.c_ubyte(0)
        ok = cu.cuMemsetD8_v2(p, ctypes.c_ubyte(7), ctypes.c_size_t(want)) == 0 and \
            cu.cuMemcpyDtoH_v2(ctypes.byref(byte), ctypes.c_uint64(p.value + want - 1), ctypes.c_size_t(1)) == 0
        cu.cuMemFreeAsync(p, ctypes.c_void_p(0))
        cu.cuCtxSynchronize()
        rc = 0 if ok and byte.value == 7 else f"written and read back: {byte.value}"
    cu.cuMemPoolDestroy(pool)
    return rc


def managed():
    p = ctypes.c_uint64(0)
    rc = cu.cuMemAllocManaged(ctypes.byref(p), ctypes.c_size_t(want), 1)
    if rc == 0:
        cu.cuMemFree_v2(p)
    return rc


class ArrayDesc(ctypes.Structure):  # CUDA_ARRAY_DESCRIPTOR
    _fields_ = [("Width", ctypes.c_size_t), ("Height", ctypes.c_size_t), ("Format", ctypes.c_int),
                ("NumChannels", ctypes.c_uint)]


def array():
    """A 2D CUDA array (textures, cudaMallocArray) of float4, 65536 wide, as tall as `want` allows."""
    width = 65536
    desc = ArrayDesc(Width=width, Height=min(65536, want // (width * 16)), Format=0x20, NumChannels=4)
    a = ctypes.c_void_p(0)
    rc = cu.cuArrayCreate_v2(ctypes.byref(a), ctypes.byref(desc))
    if rc == 0:
        cu.cuArrayDestroy(a)
    return rc


def malloc_heap():
    """The device malloc heap set to `want`, then back to the default 8 MiB."""
    rc = cu.cuCtxSetLimit(ctypes.c_int(2), ctypes.c_size_t(want))  # CU_LIMIT_MALLOC_HEAP_SIZE
    cu.cuCtxSetLimit(ctypes.c_int(2), ctypes.c_size_t(8 * MiB))
    return rc


def new_module():
    """A module never loaded before, with a large global array (device memory at load)."""
    try:
        src = r'__device__ char big[256 << 20]; extern "C" __global__ void k(int* o) { big[threadIdx.x] = 1; o[0] = big[0]; }'
        k = cp.RawKernel(src, "k")
        o = cp.zeros(1, dtype=cp.int32)
        k((1,), (32,), (o,))
        cp.cuda.runtime.deviceSynchronize()
        return 0 if int(o[0]) == 1 else -1
    except Exception as e:  # the driver's refusal, as the program would see it
        return repr(e)[:200]


def new_torch_op():
    try:
        x = torch.randn(1024, 1024, device="cuda", dtype=torch.float64)
        y = torch.linalg.eigvalsh(x @ x.T)  # kernels (and a solver workspace) not used before
        torch.cuda.synchronize()
        return 0 if y.shape[0] == 1024 else -1
    except Exception as e:
        return repr(e)[:200]


out = {"free_at_start_gib": round(free0 / GiB, 2), "asked_gib": round(want / GiB, 2)}
only = os.environ.get("OTHER_ALLOCATORS_ONLY", "").split(",")  # steps' names: those alone
for name, step in (("cuMemCreate", create), ("cuMemAllocAsync", alloc_async), ("cuMemAllocFromPoolAsync", alloc_from_pool),
                   ("cuMemAllocManaged", managed), ("cuArrayCreate", array), ("cuCtxSetLimit_heap", malloc_heap),
                   ("new_module", new_module), ("new_torch_op", new_torch_op)):
    if only != [""] and name not in only:
        continue
    filled, free_after = fill_and_free()
    out[name] = {"filled_gib": filled, "free_after_frees_gib": free_after, "rc": step()}
out["failed"] = [k for k, v in out.items() if isinstance(v, dict) and v["rc"] != 0]
print(json.dumps(out))
sys.exit(1 if out["failed"] else 0)
