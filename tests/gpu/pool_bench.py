#!/usr/bin/env python3
"""Issue 12's "Performance" benchmark of gpumem's pool on a GPU, every mode in alternating rounds of one run.

Usage: pool_bench.py OUTDIR [ROUNDS]        (the driver: spawns the workers, prints and writes results)
       pool_bench.py worker WHAT ARGS...    (one workload in this process; prints one JSON line)
Environment: LIB = path of libgpumem.so (default build/preload/libgpumem.so), APP = the static-cudart
program of scripts/gpu-bundle.sh (for the pool-hit latency; default build/gpu/static_cudart_app).

(a) fragment: fill the GPU with 6 MiB tensors, free two of every three, then ask for 1 GiB tensors
    until OOM.  Raw PYTORCH_NO_CUDA_MEMORY_CACHING=1 (the driver alone) against gpumem's pool with
    its defaults (on virtual memory) and GPUMEM_POOL_VMM=off.  Gate: the default pool serves every
    request the driver serves.
(b) transformer: a small GPT-2 trained on varying sequence lengths, under bf16 autocast.  PyTorch's
    own caching allocator and expandable_segments against NO_CACHING under the pool (`gpumem`: the
    defaults, virtual memory and GPUMEM_REUSE=auto; the other modes change one setting).  Step time, device-wide syncs (from
    the log), fence releases, peak reserved (torch's for PyTorch, the pool's from the log) and peak
    requested bytes (from the log).  POOL_BENCH_MODES (comma-separated MODES names) picks the modes.
(c) race: a freed tensor that a side stream has yet to read, refilled on the main stream: sums must
    equal raw NO_CACHING's under the defaults, GPUMEM_REUSE=safe, GPUMEM_FENCE_WAIT=order and
    GPUMEM_POOL_STITCH=on (C_MODES);
    GPUMEM_REUSE=immediate is the control that must differ.
(d) pool hit: median cudaMalloc+cudaFree pair latency of the static-cudart program, without
    gpumem, with the pool (auto: no stream, no events), with GPUMEM_REUSE=safe (a fence per batch)
    and, as the control, safe with a fence per free (GPUMEM_FENCE_BATCH=1, the rule before batches).
POOL_BENCH_A_MODES (comma-separated, default raw,gpumem,gpumem-novmm) picks (a)'s modes.
POOL_BENCH_CPUS (e.g. 0-7) pins every spawned process to those CPUs.
POOL_BENCH_TF=LAYERS,EMBD,TOKENS: (b)'s model and tokens a step (default 8,768,16384: a loop whose
host time, Python and PyTorch's dispatch, is most of its step; a wider model with more tokens lets
the GPU set the pace, where host time the pool adds can hide behind the queued work; checked before
any part runs, exit 2 if it is no shape).
POOL_BENCH_LEAVE_MIB=N: (b) runs beside a process (no gpumem, PyTorch's own allocator) that holds
all of the GPU's free memory but N MiB: a program whose peak is near the device's memory, where the
pool's out-of-memory path runs every step (native PyTorch, which caches twice the peak, may not fit).
With GPUMEM_LOG_LEVEL=info, (b) also lists the host ms a step in the pool's chunk calls (its exit line).
Results: OUTDIR/pool-bench.md (Markdown) and OUTDIR/pool-bench.json; the logs in POOL_BENCH_LOGS (a
fresh /tmp directory by default).  Exit 1 if a correctness gate
fails ((a) and (c)); the time and memory targets are printed, not gated (they are what is measured).
"""
import glob
import json
import os
import re
import select
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


# ---- workers (run inside the measured process) ----------------------------------------------

def is_oom(e):
    # Under PYTORCH_NO_CUDA_MEMORY_CACHING=1 a failed cudaMalloc surfaces as torch.AcceleratorError
    # ("CUDA error: out of memory"), not torch.OutOfMemoryError: the caching allocator's OOM path
    # is not involved.
    return "out of memory" in str(e)


def w_fragment():
    import torch
    small, big = [], []
    mb6 = 6 << 20
    try:
        while True:
            small.append(torch.empty(mb6, dtype=torch.uint8, device="cuda"))
    except Exception as e:  # torch.OutOfMemoryError or torch.AcceleratorError (see is_oom)
        if not is_oom(e):
            raise
    n_small = len(small)
    for i in range(len(small)):
        if i % 3:
            small[i] = None  # free two of every three
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    try:
        while True:
            big.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
    except Exception as e:
        if not is_oom(e):
            raise
    return {"small_served": n_small, "big_served": len(big), "big_s": time.perf_counter() - t0,
            "freed_gib": (n_small - (n_small + 2) // 3) * mb6 / 2**30}


def tf_shape():
    """(layers, embd, tokens a step) from POOL_BENCH_TF, default 8,768,16384."""
    given = os.environ.get("POOL_BENCH_TF", "8,768,16384")
    try:
        v = [int(x) for x in given.split(",")]
    except ValueError:
        v = []
    if len(v) != 3 or min(v) <= 0 or v[1] % 64:
        print(f"POOL_BENCH_TF={given}: expected LAYERS,EMBD,TOKENS (EMBD a multiple of 64)", file=sys.stderr)
        sys.exit(2)
    return v


def w_transformer(steps):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    layers, embd, tokens = tf_shape()
    cfg = GPT2Config(n_layer=layers, n_embd=embd, n_head=embd // 64, vocab_size=16384, n_positions=1024)
    model = GPT2LMHeadModel(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device="cpu").manual_seed(1)
    losses, times, launched = [], [], []
    for i in range(steps):
        seq = int(torch.randint(64, 1025, (1,), generator=gen).item())  # varying sequence lengths
        batch = max(1, tokens // seq)
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen).cuda()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=ids, labels=ids)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        # When the host has queued the whole step: far under the step time, the GPU sets the pace
        # and the host's own costs (a remap) hide behind its queue; close to it, they land on it.
        launched.append(time.perf_counter() - t0)
        losses.append(float(out.loss.item()))  # syncs
        times.append(time.perf_counter() - t0)
    warm = times[5:]
    return {"ms_per_step": 1e3 * statistics.mean(warm), "median_ms": 1e3 * statistics.median(warm),
            "step_ms": [round(1e3 * t, 2) for t in times], "steps": steps,
            "launch_median_ms": 1e3 * statistics.median(launched[5:]), "losses": losses[-3:],
            "torch_max_reserved": torch.cuda.max_memory_reserved(),
            "torch_max_allocated": torch.cuda.max_memory_allocated()}


def w_hog(leave_mib):
    # Holds all the free memory but leave_mib, then waits to be killed (POOL_BENCH_LEAVE_MIB).
    import torch
    free, _ = torch.cuda.mem_get_info()
    # Whole 2 MiB pages: the driver cannot hand out every byte mem_get_info counts as free.
    x = torch.empty(max(free - (leave_mib << 20), 0) & ~((2 << 20) - 1), dtype=torch.uint8, device="cuda")
    print(json.dumps({"held_mib": x.numel() >> 20, "left_mib": torch.cuda.mem_get_info()[0] >> 20}), flush=True)
    time.sleep(1e6)


def w_race(iters):
    import torch
    side = torch.cuda.Stream()
    n = 1 << 20
    sums = []
    for i in range(iters):
        x = torch.full((n,), float(i + 1), device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(20_000_000)  # the read of x comes late
            y = x * 2
        del x  # freed while the side stream has yet to read it
        z = torch.zeros(n, device="cuda")  # may land on x's memory
        torch.cuda.current_stream().wait_stream(side)
        sums.append(float(y.sum().item()))
        del y, z
    return {"sums": sums}


# ---- driver -----------------------------------------------------------------------------------

LIB = os.environ.get("LIB", os.path.join(ROOT, "build/preload/libgpumem.so"))
APP = os.environ.get("APP", os.path.join(ROOT, "build/gpu/static_cudart_app"))
LOGS = None

MODES = {
    # name: (environment, under gpumem)
    "native": ({}, False),
    "expandable": ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, False),
    "raw": ({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, False),
    # gpumem's defaults (since 2026-12-01 on virtual memory where the device supports it).
    "gpumem": ({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, True),
    "gpumem-vmm": ({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "GPUMEM_POOL_VMM": "on"}, True),
    "gpumem-vmm-safe": ({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "GPUMEM_POOL_VMM": "on", "GPUMEM_REUSE": "safe"}, True),
    "gpumem-novmm": ({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "GPUMEM_POOL_VMM": "off"}, True),
    # GPUMEM_POOL_TRIM (off by default): reserved near the live peak, at the cost of map/unmap calls.
    "gpumem-vmm-trim": ({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "GPUMEM_POOL_VMM": "on", "GPUMEM_POOL_TRIM": "32MiB"}, True),
    # The pool's cost apart from the call stacks': step time without GPUMEM_STACKS's capture.
    "gpumem-vmm-nostacks": ({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "GPUMEM_POOL_VMM": "on", "GPUMEM_STACKS": "off"}, True),
    "gpumem-vmm-immediate": ({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "GPUMEM_POOL_VMM": "on", "GPUMEM_REUSE": "immediate"}, True),
    # Virtual memory without arenas: a segment per growth (before arenas, the only way).
    "gpumem-vmm-segments": ({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "GPUMEM_POOL_VMM": "on", "GPUMEM_POOL_ARENA": "off"}, True),
    # Waits on fences sooner (at 2 x reserved/64 pending instead of 2 x reserved/16): less held by
    # frees the GPU has not reached, for more waits.
    "gpumem-vmm-div64": ({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "GPUMEM_POOL_VMM": "on", "GPUMEM_SYNC_BUDGET_DIV": "64"}, True),
}


# (c)'s modes: raw NO_CACHING is the truth, immediate reuse the control that must differ, and every
# other mode must give raw's sums (ordered release hands frees out early, so it is judged too).
# The tight variant (a 4 MiB sync budget) brings the pool to the point of a wait, where an ordered
# release would come, at about every free: the side stream, busy with the program's own sleep, must
# stop ordered releases (its "ordered" count says whether any ran) and the sums stay raw's.
C_MODES = ("raw", "gpumem", "gpumem-vmm-safe", "gpumem+GPUMEM_FENCE_WAIT=order", "gpumem+GPUMEM_POOL_STITCH=on",
           "gpumem+GPUMEM_FENCE_WAIT=order+GPUMEM_SYNC_BUDGET=4MiB+GPUMEM_SYNC_BUDGET_DIV=1000000", "gpumem-vmm-immediate")


def mode_env(mode):
    """MODES[mode], or for "BASE+KEY=VALUE+..." BASE's with those variables added: a setting tried
    without a code change (POOL_BENCH_MODES=gpumem,gpumem+GPUMEM_POOL_TRIM=32MiB).  KEY LIB=NAME
    preloads build/gpu/NAME/libgpumem.so instead, for an A/B of two builds in alternating rounds
    (POOL_BENCH_MODES=native,gpumem,gpumem+LIB=before)."""
    base, *extra = mode.split("+")
    env_add, preload = MODES[base]
    env_add = dict(env_add)
    for kv in extra:
        k, _, v = kv.partition("=")
        env_add[k] = v
    return env_add, preload


def cpu_list(text):
    """"0-7,12" -> {0, ..., 7, 12}; empty -> None."""
    cpus = set()
    for part in filter(None, text.replace(" ", "").split(",")):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus or None


PIN = cpu_list(os.environ.get("POOL_BENCH_CPUS", ""))


def pin_cpus():
    # In the child before exec: every mode on the same cores, so that where the scheduler put a
    # process is not one more difference between modes.
    if PIN:
        os.sched_setaffinity(0, PIN)


def bare_env():
    """This process's environment less what picks a mode: each mode sets its own."""
    env = dict(os.environ)
    for k in ("LD_PRELOAD", "GPUMEM_OUT", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING",
              "GPUMEM_POOL_VMM", "GPUMEM_REUSE", "GPUMEM_STACKS", "GPUMEM_POOL_TRIM", "GPUMEM_POOL_ARENA",
              "GPUMEM_SYNC_BUDGET_DIV", "GPUMEM_POOL_STITCH", "GPUMEM_POOL_STITCH_KEEP", "GPUMEM_POOL_CHUNK", "GPUMEM_FENCE_BATCH",
              "GPUMEM_FENCE_WAIT"):
        env.pop(k, None)
    return env


def spawn(outdir, name, mode, argv, timeout=600):
    env_add, preload = mode_env(mode)
    env = bare_env()
    other = env_add.pop("LIB", None)
    lib = os.path.join(os.path.dirname(os.path.dirname(LIB)), "gpu", other, "libgpumem.so") if other else LIB
    env.update(env_add)
    if preload:
        env["LD_PRELOAD"] = lib
        env["GPUMEM_OUT"] = f"{LOGS}/{name}.%p.jsonl"
    t0 = time.perf_counter()
    try:
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, preexec_fn=pin_cpus)
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out, err, rc = e.stdout or "", (e.stderr or "") + "\nTIMEOUT", -9
        out = out.decode() if isinstance(out, bytes) else out
        err = err.decode() if isinstance(err, bytes) else err
    with open(f"{LOGS}/{name}.stderr", "w") as f:
        f.write(err)
    res = {"rc": rc, "wall_s": round(time.perf_counter() - t0, 1)}
    last = [l for l in out.splitlines() if l.startswith("{")]
    if last:
        try:
            res.update(json.loads(last[-1]))
        except ValueError:
            pass
    elif out:
        res["stdout"] = out[-2000:]
    if rc != 0:
        res["stderr_tail"] = err[-600:]
    # The pool's exit line on stitching (GPUMEM_LOG_LEVEL=info): the host ms of its remaps.
    for line in (err or "").splitlines():
        if "stitching made" in line and "ms in those driver calls" in line:
            try:
                res["stitch_ms"] = res.get("stitch_ms", 0) + float(line.rsplit(": ", 1)[1].split(" ms")[0])
                res["stitch_line"] = line.split("stitching made ", 1)[1]
            except (IndexError, ValueError):
                pass
        # ... and on its own chunk calls: "the pool mapped N chunks (M moved from its give-backs, R maps
        # refused for memory, F not tried: too little free) and unmapped U: A ms mapping, B ms
        # unmapping; L looks at the driver's free memory: C ms" (libraries before 2026-12-06 print
        # neither the moved nor the not-tried part).
        m = re.search(r"the pool mapped (\d+) chunks \((?:(\d+) moved from its give-backs, )?(\d+) maps refused for memory"
                      r"(?:, (\d+) not tried: too little free)?\) and unmapped (\d+): ([\d.]+) ms mapping, ([\d.]+) ms "
                      r"unmapping; (\d+) looks at the driver's free memory: ([\d.]+) ms", line)
        if m:
            c = res.setdefault("chunk_calls", {"mapped": 0, "moved": 0, "refused": 0, "foreseen": 0, "unmapped": 0,
                                               "map_ms": 0.0, "unmap_ms": 0.0, "looks": 0, "look_ms": 0.0})
            for k, v in zip(("mapped", "moved", "refused", "foreseen", "unmapped", "map_ms", "unmap_ms", "looks", "look_ms"), m.groups()):
                c[k] += float(v) if k.endswith("_ms") else int(v or 0)
    print(f"== {name} [{mode}] rc={rc} {res.get('wall_s')} s: {json.dumps({k: v for k, v in res.items() if k not in ('stderr_tail', 'sums', 'stdout')})[:300]}", flush=True)
    return res


def log_facts(outdir, name):
    """Device-wide syncs, fence releases, peaks of reserved and requested bytes, from the pool's log."""
    files = sorted(glob.glob(f"{LOGS}/{name}.*.jsonl"), key=os.path.getsize, reverse=True)
    if not files:
        return {}
    syncs = fences = waits = n = oom = unmap = maps = streams = unmap_bytes = wait_ns = fence_ns = 0
    ordered = waits_after_ordered = 0  # ordered releases; waits after the last (they stopped)
    reserved = peak_res = requested = peak_req = 0
    seg_mapped = {}  # segment base -> bytes mapped now (an arena maps as it grows: asize, segment_map)
    live_req = {}
    reuse_safe = None
    with open(files[0]) as f:
        for line in f:
            if not line.strip():
                continue
            e = json.loads(line)
            n += 1
            ev = e.get("ev")
            if ev == "pool_sync":
                wait_ns += e.get("wait_ns", 0)  # how long the pool's waits held the program up
                fence_ns += e.get("fence_ns", 0)  # the host time of its calls that do not wait
                if e.get("fence"):
                    fences += 1
                    waits += bool(e.get("waited"))
                    if e.get("ordered"):
                        ordered += 1
                        waits_after_ordered = 0
                    else:
                        waits_after_ordered += bool(e.get("waited"))
                else:
                    syncs += 1
            elif ev == "segment_alloc":
                m = e.get("asize") or e["size"]
                reserved += m
                seg_mapped[e["ptr"]] = m
            elif ev == "segment_map":
                reserved += e["size"]
                maps += 1
                seg_mapped[e["seg"]] = seg_mapped.get(e["seg"], 0) + e["size"]
            elif ev == "segment_unmap":
                reserved -= e["size"]
                unmap += 1
                unmap_bytes += e["size"]
                seg_mapped[e["seg"]] = seg_mapped.get(e["seg"], 0) - e["size"]
            elif ev == "segment_free":
                reserved -= seg_mapped.pop(e["ptr"], e["size"])
            elif ev == "alloc" and e.get("pooled"):
                live_req[e["ptr"]] = e["size"]
                requested += e["size"]
            elif ev == "free" and e.get("pooled"):
                requested -= live_req.pop(e["ptr"], 0)
            elif ev == "oom":
                oom += 1
                streams = max(streams, e.get("streams", 0))
            elif ev == "stats":
                streams = max(streams, e.get("streams", 0))
            elif ev == "reuse_safe" and reuse_safe is None:
                reuse_safe = e.get("api")
            peak_res = max(peak_res, reserved)
            peak_req = max(peak_req, requested)
    return {"events": n, "device_syncs": syncs, "fence_releases": fences, "fence_waits": waits, "ordered": ordered,
            "waits_after_ordered": waits_after_ordered if ordered else None, "wait_ms": round(wait_ns / 1e6, 1), "fence_ms": round(fence_ns / 1e6, 2), "streams": streams, "peak_reserved": peak_res,
            "peak_requested": peak_req, "ooms": oom, "unmaps": unmap, "maps": maps, "unmapped_bytes": unmap_bytes, "reuse_safe": reuse_safe}


def main():
    global LOGS
    outdir = os.path.abspath(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    # Checked before any part runs: the report names (b)'s shape whether or not (b) ran, and a bad
    # one found there lost every part's results after their GPU time.
    tf = tf_shape()
    os.makedirs(outdir, exist_ok=True)
    # The logs (tens of MB each) stay out of OUTDIR, whose files come back from the GPU machine.
    LOGS = os.environ.get("POOL_BENCH_LOGS") or tempfile.mkdtemp(prefix="gpumem-pool-bench.")
    os.makedirs(LOGS, exist_ok=True)
    me = [sys.executable, os.path.abspath(__file__), "worker"]
    R = {"a": {}, "b": {}, "c": {}, "d": {}}
    fails = []
    # POOL_BENCH_PARTS (default "abcd"): the parts to run; a gate whose part did not run is not judged.
    parts = os.environ.get("POOL_BENCH_PARTS", "abcd")

    # (a) one run each: filling a 141 GB GPU takes seconds, and the result is a count.
    # POOL_BENCH_A_MODES: its modes (e.g. raw,gpumem+GPUMEM_POOL_STITCH=on); the gate judges every
    # one on virtual memory.
    a_modes = os.environ.get("POOL_BENCH_A_MODES", "raw,gpumem,gpumem-novmm").split(",")
    for m in a_modes if "a" in parts else ():
        r = spawn(outdir, f"frag-{m}", m, me + ["fragment"])
        r.update(log_facts(outdir, f"frag-{m}"))
        R["a"][m] = r

    # (b) alternating rounds.
    # gpumem-vmm-immediate drops the reuse promise: it is here to split the fences' cost from the
    # rest of gpumem's (hooks, log, stacks), not as a choice.  The trim (2x step time, run 27) is in
    # POOL_BENCH_MODES's reach but not in the default list.
    b_modes = tuple(os.environ.get("POOL_BENCH_MODES", "native,expandable,gpumem,gpumem-vmm-immediate,"
                                   "gpumem-vmm-nostacks,gpumem-novmm").split(","))
    steps = int(os.environ.get("POOL_BENCH_STEPS", "40"))
    leave = os.environ.get("POOL_BENCH_LEAVE_MIB")
    hog = None
    if leave and "b" in parts:
        # Without gpumem and any mode's settings.  If it cannot hold the memory, (b) is not run:
        # numbers taken with room would read as numbers taken near the device's memory.
        hog = subprocess.Popen(me + ["hog", leave], env=bare_env(), stdout=subprocess.PIPE, text=True)
        ready, _, _ = select.select([hog.stdout], [], [], 300)
        line = hog.stdout.readline() if ready else ""
        if not line.startswith("{") or hog.poll() is not None:
            hog.kill()
            hog.wait()
            print(f"pool_bench: the process meant to leave {leave} MiB free did not start (rc {hog.returncode}); (b) not run", file=sys.stderr)
            return 2
        R["b_hog"] = json.loads(line)
        print(f"== (b) beside a process that leaves {R['b_hog']['left_mib']} MiB of the GPU free", flush=True)
    # Even rounds run the modes in reverse: a machine that warms up (native sped up 27% from its
    # first round to its fourth in run 43, always running first) must not favour the later modes.
    try:
        for rd in range(1, rounds + 1) if "b" in parts else ():
            for m in (b_modes if rd % 2 else b_modes[::-1]):
                r = spawn(outdir, f"tf-{m}-{rd}", m, me + ["transformer", str(steps)])
                r.update(log_facts(outdir, f"tf-{m}-{rd}"))
                R["b"].setdefault(m, []).append(r)
    finally:
        if hog:
            hog.kill()
            hog.wait()

    # (c)
    for m in C_MODES if "c" in parts else ():
        r = spawn(outdir, f"race-{m}", m, me + ["race", "10"])
        r.update(log_facts(outdir, f"race-{m}"))
        R["c"][m] = r

    # (d) alternating rounds of the static-cudart program.
    d_modes = {"no gpumem": {}, "pool, auto (no stream: no events)": {"GPUMEM_REUSE": "auto"},
               "pool, GPUMEM_REUSE=safe (fences)": {"GPUMEM_REUSE": "safe"},
               # The fence rule before batches (a fence per free over an eighth of the budget), as a control.
               "pool, safe, GPUMEM_FENCE_BATCH=1": {"GPUMEM_REUSE": "safe", "GPUMEM_FENCE_BATCH": "1"}}
    run_d = "d" in parts and os.path.exists(APP)
    if "d" in parts and not run_d:
        print(f"no {APP}: (d) skipped", flush=True)
    for rd in range(1, rounds + 2) if run_d else ():
        for label, extra in (list(d_modes.items()) if rd % 2 else list(d_modes.items())[::-1]):
            env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "GPUMEM_REUSE", "GPUMEM_POOL_VMM", "GPUMEM_FENCE_BATCH")}
            env.update(extra)
            if extra or label != "no gpumem":
                env["LD_PRELOAD"] = LIB
                env["GPUMEM_OUT"] = f"{LOGS}/hit-{rd}-%p.jsonl"
            # hold 0: an empty pool (each 20 MiB free over an eighth of the 32 MiB budget floor
            # fences every other pair); 4096: 4 GiB held live, as a training program holds its
            # weights, where the budget is 256 MiB and frees fence in batches of four.
            for hold in ("0", "4096"):
                p = subprocess.run([APP, "bench", hold], env=env, capture_output=True, text=True, timeout=300, preexec_fn=pin_cpus)
                for line in p.stdout.splitlines():
                    if line.startswith("bench "):
                        kv = dict(x.split("=") for x in line.split()[1:])
                        key = f"{label}; {kv['api']}, {int(kv['hold_mib']) // 1024} GiB held"
                        R["d"].setdefault(key, {}).setdefault(kv["size"], []).append(float(kv["median_us"]))
                print(f"== hit {rd} {label} hold {hold} MiB: rc={p.returncode} "
                      f"{p.stdout.strip().splitlines()[-3:] if p.stdout else p.stderr[-300:]}", flush=True)

    # ---- report ----
    md = ["## pool-bench (issue 12) " + time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), ""]
    try:
        md.append("GPU: " + subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                            "--format=csv,noheader"], capture_output=True, text=True).stdout.strip())
    except OSError:
        pass
    md += ["", "### (a) fill with 6 MiB, free two of three, then 1 GiB requests", "",
           "| mode | 6 MiB served | 1 GiB served | segment_unmap | segment_map | syncs | s for the 1 GiB phase |",
           "|---|---|---|---|---|---|---|"]
    for m, r in R["a"].items():
        md.append(f"| {m} | {r.get('small_served')} | {r.get('big_served')} | {r.get('unmaps', '-')} | {r.get('maps', '-')} | "
                  f"{r.get('device_syncs', '-')} | {r.get('big_s', 0):.1f} |")
    ra = R["a"].get("raw", {})
    judged = [m for m in R["a"] if m not in ("raw", "gpumem-novmm")]
    ok_a = ra.get("big_served") is not None and bool(judged) and all(
        R["a"][m].get("big_served") is not None and R["a"][m]["big_served"] >= ra["big_served"] for m in judged)
    md.append(f"\nGate (a) (not run)" if "a" not in parts else f"\nGate (a): the pool on virtual memory ({', '.join(judged)}) serves every 1 GiB request the driver serves: {'PASS' if ok_a else 'FAIL'}")
    if not ok_a and "a" in parts:
        fails.append("a")

    beside = f", beside a process that left {R['b_hog']['left_mib']} MiB of the GPU free" if "b_hog" in R else ""
    md += ["", f"### (b) GPT-2 ({tf[0]}x{tf[1]}, {tf[2]} tokens a step, bf16 autocast, AdamW), sequence length 64-1024 varying, {steps} steps, {rounds} alternating rounds{beside}", "",
           "| mode | ms/step (mean of steps 6+, per round) | ×native | device-wide syncs | fence releases (waits, ms blocked in the whole run; ordered releases, waits after the last) | MiB unmapped | peak reserved MiB | peak requested MiB (log) | reserved/requested |",
           "|---|---|---|---|---|---|---|---|---|"]
    nat = R["b"].get("native", [])
    for m, rs in R["b"].items():
        ms = [r.get("ms_per_step") for r in rs]
        ratio = [a / b for a, b in zip(ms, [r.get("ms_per_step") for r in nat]) if a and b]
        if mode_env(m)[1]:
            res = [r.get("peak_reserved", 0) for r in rs]
            req = [r.get("peak_requested", 0) for r in rs]
            sy = [r.get("device_syncs") for r in rs]
            fe = [f"{r.get('fence_releases')} ({r.get('fence_waits')}, {r.get('wait_ms')}"
                  + (f"; {r['ordered']} ordered, {r['waits_after_ordered']} waits after" if r.get("ordered") else "") + ")" for r in rs]
            um = [f"{r.get('unmapped_bytes', 0) / 2**20:.0f}" for r in rs]
        else:
            res = [r.get("torch_max_reserved", 0) for r in rs]
            req = [r.get("torch_max_allocated", 0) for r in rs]
            sy = fe = um = ["-"] * len(rs)
        md.append(f"| {m} | {' / '.join(f'{x:.1f}' if x else '?' for x in ms)} | {' / '.join(f'{x:.3f}' for x in ratio)} | "
                  f"{'/'.join(map(str, sy))} | {'/'.join(map(str, fe))} | {' / '.join(um)} | {' / '.join(f'{x / 2**20:.0f}' for x in res)} | "
                  f"{' / '.join(f'{x / 2**20:.0f}' for x in req)} | {' / '.join(f'{a / b:.3f}' if b else '?' for a, b in zip(res, req))} |")
    md.append("\n(peak requested: the log's live requested bytes for gpumem; torch.cuda.max_memory_allocated for PyTorch's allocators.)")
    # Step i has the same sequence length in every mode (one seed), so the median over steps 6+ of
    # step i's time against native's step i in the same round is a second estimate, which no one
    # slow step moves.
    for m, rs in R["b"].items():
        per = []
        for r, n in zip(rs, nat):
            a, b = r.get("step_ms") or [], n.get("step_ms") or []
            q = [x / y for x, y in zip(a[5:], b[5:]) if x and y]
            per.append(statistics.median(q) if q else None)
        if m != "native" and any(per):
            md.append(f"- {m}: median of per-step ratios to native, per round: {' / '.join(f'{x:.3f}' if x else '?' for x in per)}")
    def share(ms, step_ms):
        """ms spent over the whole run, as a share of the mean step (none without a step time)."""
        return f" ({100 * ms / steps / step_ms:.1f}% of the step)" if step_ms else ""

    # What safe reuse costs the host without waiting (the pool_sync lines' fence_ns), per step of
    # the whole log (start-up included): an upper bound on its share of the step that the
    # machine's noise from one process to the next does not move.
    for m, rs in R["b"].items():
        fm = [(r.get("fence_ms"), r.get("ms_per_step")) for r in rs if r.get("fence_ms") is not None]
        if fm:
            md.append(f"- {m}: host time in the pool's fence calls (fence_ns), ms per step, per round: "
                      + " / ".join(f"{f / steps:.2f}" + share(f, s) for f, s in fm))
    # What stitching's remaps cost the host (the pool's exit line), per step of the whole run.
    for m, rs in R["b"].items():
        sm = [(r.get("stitch_ms"), r.get("ms_per_step"), r.get("stitch_line", "")) for r in rs if r.get("stitch_ms") is not None]
        if sm:
            md.append(f"- {m}: host time in stitching's map/unmap calls, ms per step, per round: "
                      + " / ".join(f"{t / steps:.2f}" + share(t, s) for t, s, _ in sm)
                      + "; " + " / ".join(x for _, _, x in sm))
    # What the pool's own chunk calls cost the host (its exit line), per step of the whole run:
    # near the device's memory the out-of-memory path cycles chunks every step.
    for m, rs in R["b"].items():
        cc = [(r.get("chunk_calls"), r.get("ms_per_step")) for r in rs if r.get("chunk_calls")]
        if cc:
            md.append(f"- {m}: host ms a step in the pool's chunk calls (map / unmap / cuMemGetInfo), per round: "
                      + " / ".join(f"{c['map_ms'] / steps:.2f} + {c['unmap_ms'] / steps:.2f} + {c['look_ms'] / steps:.2f}"
                                   + share(c['map_ms'] + c['unmap_ms'] + c['look_ms'], s)
                                   + f" [{c['mapped']} mapped ({c.get('moved', 0)} moved), {c['refused']} refused, {c.get('foreseen', 0)} not tried, {c['unmapped']} unmapped, {c['looks']} looks]"
                                   for c, s in cc))
    # How far ahead of the GPU the host ran: the median time to queue a step against the step's.
    for m, rs in R["b"].items():
        lm = [(r.get("launch_median_ms"), r.get("median_ms")) for r in rs if r.get("launch_median_ms")]
        if lm:
            md.append(f"- {m}: host done queuing the step at a median of, per round: "
                      + " / ".join(f"{a:.1f} of {b:.1f} ms" for a, b in lm))
    # One figure per mode over the rounds: the geometric mean of its per-round ratios, with the range.
    for m, rs in R["b"].items():
        ratio = [r.get("ms_per_step") / n.get("ms_per_step") for r, n in zip(rs, nat) if r.get("ms_per_step") and n.get("ms_per_step")]
        if m != "native" and ratio:
            md.append(f"- {m}: step time {statistics.geometric_mean(ratio):.3f}x native, geometric mean of {len(ratio)} rounds "
                      f"({min(ratio):.3f}-{max(ratio):.3f}); modes run in reverse order in even rounds.")

    md += ["", "### (c) free while a side stream has yet to read, refill on the main stream", "",
           "| mode | sums equal raw NO_CACHING's | device-wide syncs | fence releases (waits, ordered) | reuse_safe |", "|---|---|---|---|---|"]
    raw_sums = R["c"].get("raw", {}).get("sums")
    for m, r in R["c"].items():
        eq = r.get("sums") == raw_sums and raw_sums is not None
        md.append(f"| {m} | {'yes' if eq else 'NO'} ({sum(1 for x, y in zip(r.get('sums') or [], raw_sums or []) if x != y)} differ) | "
                  f"{r.get('device_syncs', '-')} | {r.get('fence_releases', '-')} ({r.get('fence_waits', '-')}, {r.get('ordered', '-')}) | {r.get('reuse_safe', '-')} |")
    ok_c = all(R["c"].get(m, {}).get("sums") == raw_sums for m in C_MODES if m not in ("raw", "gpumem-vmm-immediate")) and raw_sums is not None
    ctrl = R["c"].get("gpumem-vmm-immediate", {}).get("sums")
    md.append(f"\nGate (c) (not run)" if "c" not in parts else
              f"\nGate (c): {'PASS' if ok_c else 'FAIL'}; control (immediate must differ): "
              f"{'differs: the check can fail' if ctrl and ctrl != raw_sums else 'WEAK: no difference'}")
    if not ok_c and "c" in parts:
        fails.append("c")

    md += ["", "### (d) pool hit: median µs of one alloc+free pair (static cudart, 2000 pairs; cudaMalloc+cudaFree, "
           "and the driver's cuMemAlloc+cuMemFree that gpumem serves), per round", "",
           "| mode | 512 B | 1 MiB | 20 MiB |", "|---|---|---|---|"]
    for label, by in R["d"].items():
        md.append(f"| {label} | " + " | ".join(" / ".join(f"{x:.2f}" for x in by.get(s, [])) for s in ("512", "1048576", "20971520")) + " |")

    text = "\n".join(md) + "\n"
    print(text)
    with open(f"{outdir}/pool-bench.md", "w") as f:
        f.write(text)
    with open(f"{outdir}/pool-bench.json", "w") as f:
        json.dump(R, f, indent=1)
    return 1 if fails else 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "worker":
        what = sys.argv[2]
        args = [int(x) for x in sys.argv[3:]]
        fn = {"fragment": w_fragment, "transformer": w_transformer, "race": w_race, "hog": w_hog}[what]
        print(json.dumps(fn(*args)), flush=True)
    elif len(sys.argv) > 1 and sys.argv[1] != "worker":
        sys.exit(main())
    else:
        print(__doc__)
        sys.exit(2)
