"""Device memory shared between two processes (legacy CUDA IPC), for scripts/gpu-e2e-pool.sh.

Prints one JSON line: {"workload", "ok", "checked", "detail"}.  A child process (spawned, so it
runs under the same LD_PRELOAD) opens the parent's buffers, checks their contents, adds 1 to each
element and reports; the parent then checks it sees the child's writes.  Run without gpumem, and
under gpumem's pool (on virtual memory by default, and with GPUMEM_POOL_VMM=off): the outcome must
be the same (docs/pool.md, "Sharing memory between processes").

  torch: torch.multiprocessing with CUDA tensors of several sizes (PyTorch shares the allocation
         holding each tensor with cudaIpcGetMemHandle and adds the tensor's offset itself);
  cupy:  raw cudaMalloc buffers, small ones first so that under the pool the shared ones lie inside
         shared segments, through cupy.cuda.runtime.ipcGetMemHandle / ipcOpenMemHandle.
"""
import json
import multiprocessing as std_mp
import sys

SIZES = [1000, 5000, 300_000, 3_000_000, 40_000_000]  # int32 elements: 4 KB to 160 MB


def torch_child(q, done):
    import torch
    try:
        ts = q.get(timeout=60)
        sums = [int(t.sum().item()) for t in ts]
        for t in ts:
            t.add_(1)
        torch.cuda.synchronize()
        done.put({"sums": sums})
        q.get(timeout=120)  # hold the tensors until the parent has read them
    except Exception as e:  # reported, so that the parent says why instead of timing out
        done.put({"error": repr(e)})


def run_torch():
    import torch
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    pad = [torch.empty(n, device="cuda", dtype=torch.int8) for n in (123, 4567, 777_777)]
    ts = [torch.arange(n, device="cuda", dtype=torch.int32) % 7 for n in SIZES]
    expect = [int(t.sum().item()) for t in ts]
    for t in ts:  # what pickling does in the queue's feeder thread, where an error would only hang the test
        t.untyped_storage()._share_cuda_()
    q, done = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=torch_child, args=(q, done))
    p.start()
    q.put(ts)
    got = done.get(timeout=120)
    after = [int(t.sum().item()) for t in ts] if "sums" in got else []
    q.put("done")
    p.join(120)
    ok = got.get("sums") == expect and after == [e + n for e, n in zip(expect, SIZES)] and p.exitcode == 0
    del pad
    return ok, len(SIZES), {"child": got, "after": after, "expect": expect, "exitcode": p.exitcode}


def cupy_child(handles, done, hold):
    import cupy
    try:
        rt = cupy.cuda.runtime
        sums, ptrs = [], []
        for h, n in handles:
            ptr = rt.ipcOpenMemHandle(h)
            ptrs.append(ptr)
            mem = cupy.cuda.UnownedMemory(ptr, n * 4, None)
            a = cupy.ndarray((n,), dtype=cupy.int32, memptr=cupy.cuda.MemoryPointer(mem, 0))
            sums.append(int(a.sum()))
            a += 1
        cupy.cuda.Device().synchronize()
        done.put({"sums": sums})
        hold.get(timeout=120)
        for ptr in ptrs:
            rt.ipcCloseMemHandle(ptr)
        done.put({"closed": len(ptrs)})
    except Exception as e:
        done.put({"error": repr(e)})


def run_cupy():
    import cupy
    rt = cupy.cuda.runtime
    ctx = std_mp.get_context("spawn")
    pad = [rt.malloc(n) for n in (100, 3000, 700_000)]  # the shared buffers are not first in their segments
    bufs, arrays, handles = [], [], []
    for n in SIZES:
        ptr = rt.malloc(n * 4)
        mem = cupy.cuda.UnownedMemory(ptr, n * 4, None)
        a = cupy.ndarray((n,), dtype=cupy.int32, memptr=cupy.cuda.MemoryPointer(mem, 0))
        a[...] = cupy.arange(n, dtype=cupy.int32) % 7
        bufs.append(ptr)
        arrays.append(a)
        handles.append((rt.ipcGetMemHandle(ptr), n))
    cupy.cuda.Device().synchronize()
    expect = [int(a.sum()) for a in arrays]
    done, hold = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=cupy_child, args=(handles, done, hold))
    p.start()
    got = done.get(timeout=120)
    after = [int(a.sum()) for a in arrays] if "sums" in got else []
    hold.put("done")
    closed = done.get(timeout=120) if "sums" in got else {}
    p.join(120)
    for ptr in bufs + pad:
        rt.free(ptr)
    ok = (got.get("sums") == expect and after == [e + n for e, n in zip(expect, SIZES)]
          and closed.get("closed") == len(SIZES) and p.exitcode == 0)
    return ok, len(SIZES), {"child": got, "closed": closed, "after": after, "expect": expect, "exitcode": p.exitcode}


def main():
    which = sys.argv[1]
    try:
        ok, checked, detail = {"torch": run_torch, "cupy": run_cupy}[which]()
    except Exception as e:
        ok, checked, detail = False, 0, {"error": repr(e)}
    print(json.dumps({"workload": which, "ok": ok, "checked": checked, "detail": detail}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
