# Benchmark: what capturing a Python stack costs per call, at a given depth, over the same ctypes
# call without capture.  Prints the per-call medians of alternating rounds and their difference.
import ctypes
import statistics
import sys
import time

probe = ctypes.PyDLL(sys.argv[1])
depth = int(sys.argv[2]) if len(sys.argv) > 2 else 30
calls = 200_000
probe.probe_init(64)


def at_depth(n, fn):
    if n > 1:
        return at_depth(n - 1, fn)
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls


cap, base = [], []
for _ in range(7):  # alternating rounds: drift hits both sides alike
    base.append(at_depth(depth, probe.probe_noop))
    cap.append(at_depth(depth, probe.probe_capture))
mb, mc = statistics.median(base), statistics.median(cap)
print(f"python depth {depth}: {calls} calls x 7 rounds; per call median: no capture {mb:.0f} ns, "
      f"capture {mc:.0f} ns, added {mc - mb:.0f} ns; unique stacks {probe.probe_size()}")
