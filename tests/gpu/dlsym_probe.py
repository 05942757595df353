"""What a Python program finds when it probes for the CUDA driver with ctypes.CDLL(None) before and after PyTorch starts CUDA: run bare and under gpumem, the two must print the same."""
import ctypes
import sys

NAMES = ["cuMemAlloc_v2", "cuGetProcAddress_v2", "cuMemAllocAsync", "cuGreenCtxCreate"]


def probe(when):
    me = ctypes.CDLL(None)  # dlsym on the program's own handle: the global scope, preloads included
    for n in NAMES:
        print(f"{when}_{n}={int(hasattr(me, n))}")


probe("before")
import torch  # noqa: E402

torch.zeros(1, device="cuda")
probe("after")
sys.stdout.flush()
