"""What the driver answers when a stream capture's end fails, for the pool's capture count (preload/hooks_driver.cc, capture_ended).

The hooks count captures so that the pool never records, waits or unmaps inside one.  A failed
cuStreamEndCapture leaves the count as it was for CUDA_ERROR_ILLEGAL_STATE (no capture on that
stream) and CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD (the capture goes on), and asks the stream for
any other error.  This checks those assumptions on the real driver, through CuPy's runtime (which
reaches cuStreamEndCapture), with and without gpumem: run it both ways and compare the JSON lines.
Usage: python3 capture_end_check.py   (prints one JSON object; exit 1 when an assumption fails)
"""
import json
import sys
import threading

import cupy as cp

rt = cp.cuda.runtime
ILLEGAL_STATE, WRONG_THREAD, INVALIDATED = 401, 908, 901
NONE, ACTIVE = 0, 1


def end(stream_ptr):
    try:
        graph = rt.streamEndCapture(stream_ptr)
        if graph:
            rt.graphDestroy(graph)
        return 0
    except rt.CUDARuntimeError as e:
        return e.status


def status(stream_ptr):
    return int(rt.streamIsCapturing(stream_ptr))


out, problems = {}, []
cp.cuda.Device(0).use()
s = cp.cuda.Stream(non_blocking=True)

# 1. End with no capture open.
out["end_without_capture"] = end(s.ptr)
if out["end_without_capture"] != ILLEGAL_STATE:
    problems.append(f"end without a capture returned {out['end_without_capture']}, not {ILLEGAL_STATE}")

# 2. A global capture begun on this thread, ended from another.
rt.streamBeginCapture(s.ptr, 0)  # cudaStreamCaptureModeGlobal
other = {}
t = threading.Thread(target=lambda: other.update(rc=end(s.ptr)))
t.start()
t.join()
out["end_from_other_thread"] = other["rc"]
out["status_after_wrong_thread"] = status(s.ptr)
out["end_on_own_thread"] = end(s.ptr)
out["status_after_own_end"] = status(s.ptr)
if other["rc"] == WRONG_THREAD and out["status_after_wrong_thread"] != ACTIVE:
    problems.append("the capture did not go on after a wrong-thread end")
if other["rc"] == WRONG_THREAD and (out["end_on_own_thread"] != 0 or out["status_after_own_end"] != NONE):
    problems.append("the capture's own thread could not end it")
if other["rc"] not in (0, WRONG_THREAD):
    problems.append(f"end from another thread returned {other['rc']}")

# 3. A capture invalidated by a call it forbids (cudaMalloc under global mode), then ended.
rt.streamBeginCapture(s.ptr, 0)
try:
    p = rt.malloc(1 << 20)
    rt.free(p)
    out["malloc_in_capture"] = 0
except rt.CUDARuntimeError as e:
    out["malloc_in_capture"] = e.status
out["status_after_forbidden_call"] = status(s.ptr)
out["end_invalidated"] = end(s.ptr)
out["status_after_invalidated_end"] = status(s.ptr)
if out["end_invalidated"] in (ILLEGAL_STATE, WRONG_THREAD):
    problems.append("an invalidated capture's end returned a code the hook takes for 'capture goes on'")
if out["end_invalidated"] != 0 and out["status_after_invalidated_end"] == ACTIVE:
    problems.append("an invalidated capture is still active after its failed end (the hook, asking the stream, counts it open)")

out["problems"] = problems
print(json.dumps(out))
sys.exit(1 if problems else 0)
