# Replays a gpumem log's pooled cuMemAlloc/cuMemFree through libcuda.so.1 (the emulated one), for a library under test.
#
# Usage (a log recorded on a GPU, replayed through the preload on the emulated device, no GPU):
#   LD_LIBRARY_PATH=build/tests/emu/driver:build/tests/emu GPUMEM_EMU_CAPACITY=64G \
#     build/analyzer/gpumem run -o OUT/ -- python3 tests/emu/replay_log.py LOG
# Where build/tests/pool/pool_replay runs the core's block_pool alone, this goes through the hooks,
# the registry and the driver seam, as a program does: how docs/gpu-results.md "Runs 177-178" found
# that an experimental library's second pool had fallen back to cuMemAlloc segments.  The program
# makes a non-blocking stream where the recorded one switched to safe reuse ("reuse_safe"), so that
# `auto` switches at the same point.  Work on the device is not replayed: the GPU keeps up.
import ctypes
import json
import sys

if len(sys.argv) != 2:
    sys.exit("usage: replay_log.py LOG")
cu = ctypes.CDLL("libcuda.so.1")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
for call, args in (("cuInit", (0,)), ("cuDeviceGet", (ctypes.byref(dev), 0)),
                   ("cuDevicePrimaryCtxRetain", (ctypes.byref(ctx), dev)), ("cuCtxSetCurrent", (ctx,))):
    rc = getattr(cu, call)(*args)
    if rc:
        sys.exit(f"{call}: CUresult {rc}")
mine = {}  # logged pointer -> replayed pointer
n = 0
with open(sys.argv[1]) as f:
    for lineno, line in enumerate(f, 1):
        if '"ev":"reuse_safe"' in line:
            s = ctypes.c_void_p()
            cu.cuStreamCreate(ctypes.byref(s), 1)  # CU_STREAM_NON_BLOCKING
        if '"pooled":true' not in line:
            continue
        e = json.loads(line)
        if e["ev"] == "alloc":
            p = ctypes.c_uint64()
            rc = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(e["size"]))
            if rc:
                sys.exit(f"{sys.argv[1]}:{lineno}: cuMemAlloc_v2 of {e['size']} bytes: CUresult {rc}")
            mine[e["ptr"]] = p.value
            n += 1
        elif e["ev"] == "free" and e["ptr"] in mine:
            cu.cuMemFree_v2(ctypes.c_uint64(mine.pop(e["ptr"])))
print(f"replayed {n} allocations, {len(mine)} live at the end")
