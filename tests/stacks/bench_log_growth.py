# Log growth from call stacks (docs/benchmarks.md, "Log size with stacks"): the same Python program
# (N cuMemAlloc/cuMemFree pairs through the emulated libcuda from 8 call sites, at Python depth
# about 30) under libgpumem.so with GPUMEM_STACKS=off, python, native and all; prints the log's
# bytes, its stack records, and the bytes each allocation adds over `off`, stack records included.
# Usage: bench_log_growth.py LIBGPUMEM DRIVER_DIR [N]
import os
import subprocess
import sys
import tempfile

lib, driver_dir = sys.argv[1], sys.argv[2]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 20000
app = r'''
import ctypes, sys
cuda = ctypes.PyDLL("libcuda.so.1")
cuda.cuInit(0)
ctx = ctypes.c_void_p()
cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
cuda.cuCtxSetCurrent(ctx)
def pair(size):
    p = ctypes.c_uint64()
    assert cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(size)) == 0
    assert cuda.cuMemFree_v2(p) == 0
def site0(s): pair(s)
def site1(s): pair(s)
def site2(s): pair(s)
def site3(s): pair(s)
def site4(s): pair(s)
def site5(s): pair(s)
def site6(s): pair(s)
def site7(s): pair(s)
sites = [site0, site1, site2, site3, site4, site5, site6, site7]
def deep(k, i):
    if k: return deep(k - 1, i)
    sites[i % 8](4096 * (1 + i % 16))
for i in range(int(sys.argv[1])):
    deep(25, i)
'''
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "app.py")
    with open(path, "w") as f:
        f.write(app)
    sizes = {}
    for mode in ("off", "python", "native", "all"):
        out = os.path.join(d, mode + "-%p.jsonl")
        env = dict(os.environ, LD_PRELOAD=lib, LD_LIBRARY_PATH=driver_dir, GPUMEM_OUT=out, GPUMEM_STACKS=mode)
        subprocess.run([sys.executable, path, str(n)], env=env, check=True)
        log = [os.path.join(d, x) for x in os.listdir(d) if x.startswith(mode + "-")][0]
        data = open(log, "rb").read()
        allocs = data.count(b'"ev":"alloc"')
        records = data.count(b'"ev":"stack"')
        rec_bytes = sum(len(l) + 1 for l in data.split(b"\n") if b'"ev":"stack"' in l)
        sizes[mode] = len(data)
        extra = (len(data) - sizes["off"]) / allocs
        print(f"GPUMEM_STACKS={mode}: {len(data)} bytes, {allocs} allocations, {records} stack records "
              f"({rec_bytes} bytes), {extra:+.2f} bytes per allocation over off")
