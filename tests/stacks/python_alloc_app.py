# A Python program that allocates device memory through the emulated libcuda with ctypes, from
# known functions: the call-site tests check that the report names each function, file and line
# with its exact bytes.  The main thread calls through PyDLL, which keeps the GIL; the worker thread
# through CDLL, which releases it, as PyTorch does around every operator.
import ctypes
import sys
import threading

cuda = ctypes.PyDLL("libcuda.so.1")
cuda_nogil = ctypes.CDLL("libcuda.so.1")
MiB = 1 << 20
live = []


def check(rc, what):
    if rc != 0:
        sys.exit(f"{what} failed: {rc}")


def alloc(lib, size):
    p = ctypes.c_uint64()
    check(lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(size)), "cuMemAlloc_v2")
    return p.value


def load_weights():
    for _ in range(2):
        p = ctypes.c_uint64()
        check(cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(3 * MiB)), "weights")  # site-weights
        live.append(p.value)


def make_activations():
    return alloc(cuda, 5 * MiB)  # site-activations


def scratch():
    p = alloc(cuda, 7 * MiB)  # site-scratch
    check(cuda.cuMemFree_v2(ctypes.c_uint64(p)), "cuMemFree_v2")


check(cuda.cuInit(0), "cuInit")
ctx = ctypes.c_void_p()
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

scratch()                  # freed before the peak: must not appear at the peak
load_weights()
act = make_activations()
t = threading.Thread(target=lambda: live.append(alloc(cuda_nogil, 1 * MiB)))
t.start()
t.join()
# Peak here: 2 x 3 MiB + 5 MiB + 1 MiB live.
check(cuda.cuMemFree_v2(ctypes.c_uint64(act)), "cuMemFree_v2")
print("done")
