"""What the driver answers when a stream capture's end fails, for the pool's capture count (preload/hooks_driver.cc, capture_ended).

The hooks count captures so that the pool never records, waits or unmaps inside one.  A failed
cuStreamEndCapture leaves the count as it was for CUDA_ERROR_ILLEGAL_STATE (no capture on that
stream) and asks the stream for any other error.  This checks, on the real driver through CuPy's
runtime (which reaches cuStreamEndCapture), that those answers say what happened; run it with and
without gpumem and compare the JSON lines (identical since 22a8860; before it the pool served the
cudaMalloc that the driver refuses inside a global capture: "malloc_in_capture").
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
    """0 none, 1 active, 2 invalidated (CuPy raises for that one)."""
    try:
        return int(rt.streamIsCapturing(stream_ptr))
    except Exception:  # "the stream was capturing, but an error has invalidated the capture sequence"
        return 2


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
# The hook asks the stream after such a refusal: its answer must match whether the capture was
# still open, which the own thread's end then shows (0: it was; ILLEGAL_STATE: it had ended).
# (On the H200, 2026-12-03: 908, then NONE and ILLEGAL_STATE: the wrong-thread end ends it.)
if other["rc"] not in (0, ILLEGAL_STATE):
    still_open = out["end_on_own_thread"] == 0
    if still_open != (out["status_after_wrong_thread"] == ACTIVE):
        problems.append("after a wrong-thread end the stream's status does not tell whether the capture goes on")
if out["status_after_own_end"] != NONE:
    problems.append("a capture is still open after both ends")

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
