"""What the driver answers to cuMemAlloc/cuMemFree inside a stream capture, by capture mode and thread, for the pool's capture rule.

Inside a capture the driver refuses "potentially unsafe" calls, cuMemAlloc and cuMemFree among
them, from some threads and not others, depending on the capture's mode (cuStreamBeginCapture's
argument) and the calling thread's mode (cuThreadExchangeStreamCaptureMode); a refusal
(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, 900) also invalidates the capture.  The pool must answer
the same way (docs/pool.md, "Contexts, captures, fork and exit").  cuMemFreeAsync on another stream,
one not being captured, is such a call too (run 97): the matrix asks it as a third operation.  This runs the whole matrix on
the real driver through ctypes (so under gpumem it reaches the hooks by dlsym) and prints one JSON
object: run it with and without gpumem and compare.  It also checks that the runtime's
cudaThreadExchangeStreamCaptureMode sets the driver's mode (the hooks watch the driver's).
Usage: python3 capture_mode_check.py   (exit 1 when a case differs from the rule the pool models)
"""
import ctypes
import json
import sys
import threading

import cupy as cp

rt = cp.cuda.runtime
cu = ctypes.CDLL("libcuda.so.1")
GLOBAL, THREAD_LOCAL, RELAXED = 0, 1, 2
MODES = {"global": GLOBAL, "thread_local": THREAD_LOCAL, "relaxed": RELAXED}
MiB = 1 << 20


def exchange(mode):
    m = ctypes.c_int(mode)
    r = cu.cuThreadExchangeStreamCaptureMode(ctypes.byref(m))
    return r, m.value


def alloc(size=MiB):
    p = ctypes.c_uint64(0)
    r = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(size))
    return r, p.value


def free(p):
    return cu.cuMemFree_v2(ctypes.c_uint64(p))


def status(stream_ptr):
    st = ctypes.c_int(0)
    r = cu.cuStreamIsCapturing(ctypes.c_void_p(stream_ptr), ctypes.byref(st))
    return st.value if r == 0 else -r


def end(stream_ptr):
    g = ctypes.c_void_p(0)
    r = cu.cuStreamEndCapture(ctypes.c_void_p(stream_ptr), ctypes.byref(g))
    if r == 0 and g.value:
        cu.cuGraphDestroy(g)
    return r


def run_on(same_thread, fn):
    """fn() on this thread, or on a new thread with this thread's context current (a new thread has none)."""
    if same_thread:
        fn()
        return

    def body():
        cu.cuCtxSetCurrent(ctx)
        fn()

    t = threading.Thread(target=body)
    t.start()
    t.join()


def forbidden(capture_mode, same_thread, thread_mode):
    """The rule of the CUDA documentation (cudaStreamCaptureMode), which the pool models."""
    if thread_mode == RELAXED:
        return False
    if same_thread:
        return capture_mode != RELAXED
    return thread_mode == GLOBAL and capture_mode == GLOBAL


def case(capture_mode, same_thread, thread_mode, op):
    s = cp.cuda.Stream(non_blocking=True)
    other = cp.cuda.Stream(non_blocking=True)  # free_async's stream: never captured
    pre = None
    if op != "alloc":
        r, pre = alloc()
        assert r == 0, r
    cu.cuStreamBeginCapture_v2(ctypes.c_void_p(s.ptr), capture_mode)
    res = {}

    def act():
        old = None
        if thread_mode is not None:
            _, old = exchange(thread_mode)
        if op == "alloc":
            res["rc"], res["ptr"] = alloc()
        elif op == "free":
            res["rc"] = free(pre)
        else:
            res["rc"] = cu.cuMemFreeAsync(ctypes.c_uint64(pre), ctypes.c_void_p(other.ptr))
        if old is not None:
            exchange(old)

    run_on(same_thread, act)
    res["status_in"] = status(s.ptr)
    res["end"] = end(s.ptr)
    # Clean up after the capture: what the call left allocated.
    if op == "alloc" and res["rc"] == 0:
        free(res.pop("ptr"))
    res.pop("ptr", None)
    if op != "alloc" and res["rc"] != 0:
        res["free_after"] = free(pre)
    other.synchronize()
    s.synchronize()
    return res


out, problems = {}, []
cp.cuda.Device(0).use()
cp.zeros(1)  # a context
ctx = ctypes.c_void_p(0)
cu.cuCtxGetCurrent(ctypes.byref(ctx))

for cname, cmode in MODES.items():
    for same in (True, False):
        for tname, tmode in (("default", None), ("thread_local", THREAD_LOCAL), ("relaxed", RELAXED)):
            for op in ("alloc", "free", "free_async"):
                key = f"{op}:{cname}:{'same' if same else 'other'}:{tname}"
                r = case(cmode, same, tmode, op)
                out[key] = r
                want = forbidden(cmode, same, GLOBAL if tmode is None else tmode)
                got = r["rc"] == 900
                if want != got or (got and r["end"] == 0) or (not got and r["rc"] != 0):
                    problems.append(f"{key}: {r} (rule says {'refused' if want else 'served'})")

# The runtime's exchange: does it set the driver's mode (the one the hooks watch)?
libs = [l.split()[-1] for l in open("/proc/self/maps") if "libcudart" in l]
if not libs:  # CuPy may link the runtime statically: the first shared one in this Python's packages
    import torch  # noqa: F401  (loads its libcudart)
    libs = [l.split()[-1] for l in open("/proc/self/maps") if "libcudart" in l]
out["cudart"] = libs[0] if libs else None
if libs:
    crt = ctypes.CDLL(libs[0])
    m = ctypes.c_int(RELAXED)
    r1 = crt.cudaThreadExchangeStreamCaptureMode(ctypes.byref(m))
    r2, seen = exchange(GLOBAL)  # puts the default back, returns what the driver had
    out["runtime_exchange"] = {"rc": r1, "old": m.value, "driver_saw": seen, "rc2": r2}
    if seen != RELAXED:
        problems.append(f"the runtime's exchange did not reach the driver's mode: {out['runtime_exchange']}")

    # The same mode, set by the runtime, as PyTorch sets it around its cudaMalloc inside a capture:
    # the driver allows the allocation.  Under gpumem the hooks must see the mode too, or the pool
    # leaves the call to the driver: its log then has this size (3 MiB + 4 KiB) without "pooled".
    s = cp.cuda.Stream(non_blocking=True)
    cu.cuStreamBeginCapture_v2(ctypes.c_void_p(s.ptr), GLOBAL)
    m = ctypes.c_int(RELAXED)
    crt.cudaThreadExchangeStreamCaptureMode(ctypes.byref(m))
    rc, p = alloc(3 * MiB + 4096)
    crt.cudaThreadExchangeStreamCaptureMode(ctypes.byref(m))
    out["runtime_relaxed_alloc"] = {"rc": rc, "end": end(s.ptr)}
    if rc == 0:
        free(p)
    if rc != 0 or out["runtime_relaxed_alloc"]["end"] != 0:
        problems.append(f"an allocation in relaxed mode set by the runtime was refused: {out['runtime_relaxed_alloc']}")


def ended_elsewhere(mode):
    """A capture of `mode` ended from another thread: that end's answer, the stream's status after it,
    and the beginning thread's end then."""
    s = cp.cuda.Stream(non_blocking=True)
    cu.cuStreamBeginCapture_v2(ctypes.c_void_p(s.ptr), mode)
    res = {}
    run_on(False, lambda: res.update(other_end=end(s.ptr)))
    res["status_after"] = status(s.ptr)
    res["own_end"] = end(s.ptr)
    return res


for cname, cmode in MODES.items():
    out[f"end_from_other_thread:{cname}"] = ended_elsewhere(cmode)


def bogus_free(capture_mode, address):
    """cuMemFree of an address that was never allocated, inside a capture of this thread: does the
    driver check the capture rule first (900, capture invalidated) or the pointer (1)?"""
    s = cp.cuda.Stream(non_blocking=True)
    cu.cuStreamBeginCapture_v2(ctypes.c_void_p(s.ptr), capture_mode)
    rc = free(address)
    res = {"rc": rc, "status_in": status(s.ptr), "end": end(s.ptr)}
    return res


for cname in ("global", "relaxed"):
    for address in (0, 0x1000):
        out[f"bogus_free:{cname}:{address:#x}"] = bogus_free(MODES[cname], address)
out["bogus_free:no_capture:0x1000"] = {"rc": free(0x1000)}


def v1_capture(same_thread):
    """The first cuStreamBeginCapture ABI (CUDA 10.0, no mode), which runtimes still resolve: which
    mode does it capture in?  An allocation from the same thread and from another (global mode)."""
    s = cp.cuda.Stream(non_blocking=True)
    res = {"begin": cu.cuStreamBeginCapture(ctypes.c_void_p(s.ptr))}

    def act():
        res["rc"], p = alloc()
        if res["rc"] == 0:
            res["p"] = p

    run_on(same_thread, act)
    res["status_in"] = status(s.ptr)
    res["end"] = end(s.ptr)
    if "p" in res:
        free(res.pop("p"))
    return res


out["v1_capture:same"] = v1_capture(True)
out["v1_capture:other"] = v1_capture(False)

out["problems"] = problems
print(json.dumps(out, indent=1))
sys.exit(1 if problems else 0)
