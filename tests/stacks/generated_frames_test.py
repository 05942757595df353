# Sites whose innermost frames are code torch.compile generated (TorchInductor's output module,
# torch.fx's <eval_with_key> code) are named by the user's frame that called the compiled model, in
# the text report, the HTML report, an OOM's "asked for by" and `gpumem diff`; "<string>" (python -c,
# exec of source) stays the user's own.  A synthetic log, through the real gpumem binary.
import json
import os
import sys
import tempfile
from stack_checks import check, finish, run_gpumem

gpumem = sys.argv[1]
MiB = 1 << 20


def run(*args):
    return run_gpumem(gpumem, *args)


torch = "/usr/lib/python3/dist-packages/torch"
user = [{"function": "train_step", "file": "/src/train.py", "line": 25},
        {"function": "<module>", "file": "/src/train.py", "line": 41}]
stacks = {
    # Inductor's compiled graph, called from the model's forward through Dynamo's wrappers.
    1: [{"function": "call", "file": "/tmp/torchinductor_root/ab/cabcdefgh.py", "line": 120},
        {"function": "CompiledFxGraph.__call__", "file": f"{torch}/_inductor/output_code.py", "line": 460},
        {"function": "_fn", "file": f"{torch}/_dynamo/eval_frame.py", "line": 632},
        {"function": "Net.forward", "file": "/src/model.py", "line": 30}] + user,
    # torch.fx's GraphModule code, "<eval_with_key>.N" with the source it was traced from.
    2: [{"function": "forward", "file": "<eval_with_key>.7 from /src/model.py:12 in forward", "line": 5},
        {"function": "GraphModule._call_impl", "file": f"{torch}/fx/graph_module.py", "line": 784},
        {"function": "Net.head", "file": "/src/model.py", "line": 44}] + user,
    # The same under a relative cache path, and a plain fx key.
    3: [{"function": "call", "file": "torchinductor_ci/xy/cxyz.py", "line": 9},
        {"function": "forward", "file": "<eval_with_key>.2", "line": 4},
        {"function": "Net.tail", "file": "/src/model.py", "line": 50}] + user,
    # python -c: the program's own code is "<string>", kept.
    4: [{"function": "<module>", "file": "<string>", "line": 3}],
    # A user's own tree that merely has "torchinductor_" in a folder's name: the user's.
    5: [{"function": "bench", "file": "/home/u/torchinductor_bench/run.py", "line": 7}] + user,
}
sizes = {1: 64 * MiB, 2: 32 * MiB, 3: 16 * MiB, 4: 8 * MiB, 5: 4 * MiB}


def write_log(path, grow=0):
    lines = [{"ev": "header", "format": "gpumem-events", "version": 3, "pid": 1,
              "devices": [{"index": 0, "name": "synthetic", "total": 1 << 40}], "config": {"pool": "off", "stacks": "python"}}]
    seq = 0
    for sid, frames in stacks.items():
        lines.append({"ev": "stack", "id": sid, "frames": frames})
        size = sizes[sid] + (grow if sid == 1 else 0)
        lines.append({"ev": "alloc", "seq": seq, "t": 1000 * (seq + 1), "tid": 1, "dev": 0, "api": "cudaMalloc",
                      "kind": "device", "ptr": hex(0x7f0000000000 + sid * (1 << 32)), "size": size, "stack": sid})
        seq += 1
    lines.append({"ev": "alloc_fail", "seq": seq, "t": 1000 * (seq + 1), "tid": 1, "dev": 0, "api": "cudaMalloc",
                  "kind": "device", "ptr": "0x0", "size": 1 << 39, "err": 2, "stack": 1})
    seq += 1
    live = sum(sizes.values()) + grow
    lines.append({"ev": "end", "seq": seq, "t": 1000 * (seq + 1), "tid": 1, "reason": "exit", "events": seq,
                  "n_alloc": len(stacks), "n_free": 0, "n_fail": 1, "live_allocs": len(stacks), "live_bytes": live, "lost": 0, "unmatched": 0})
    with open(path, "w") as f:
        f.writelines(json.dumps(e, separators=(",", ":")) + "\n" for e in lines)


inductor = "Net.forward (model.py:30)"
fx = "Net.head (model.py:44)"
both = "Net.tail (model.py:50)"
with tempfile.TemporaryDirectory() as d:
    a, b = os.path.join(d, "a.jsonl"), os.path.join(d, "b.jsonl")
    write_log(a)
    write_log(b, grow=8 * MiB)

    text = run("report", "--no-progress", a)
    check(f"64.00 MiB in 1 allocation  {inductor}\n" in text, f"inductor site named by the user's frame:\n{text[-2500:]}")
    check("(inside call (cabcdefgh.py:120))" in text, "the inductor frame is still shown as the innermost")
    check(f"32.00 MiB in 1 allocation  {fx}\n" in text, f"fx site named by the user's frame:\n{text[-2500:]}")
    check(f"16.00 MiB in 1 allocation  {both}\n" in text, f"relative inductor cache and plain fx key skipped:\n{text[-2500:]}")
    check("8.00 MiB in 1 allocation  <module> (<string>:3)\n" in text, f"<string> stays the user's frame:\n{text[-2500:]}")
    check("4.00 MiB in 1 allocation  bench (run.py:7)\n" in text, f"a user's torchinductor_* folder stays the user's:\n{text[-2500:]}")
    check(f"asked for by {inductor}\n" in text, f"the OOM's failing call named by the user's frame:\n{text[-2500:]}")

    run("report", "--no-progress", a, "--html", os.path.join(d, "a.html"))
    page = open(os.path.join(d, "a.html")).read()
    check(f"<td><code>{inductor} inside call (cabcdefgh.py:120)</code></td>" in page and
          f"<td><code>{fx} inside forward (" in page, "HTML sites table names the user's frames")

    diff = run("diff", a, b)
    check(f"+ {inductor} <- train_step (train.py:25) (inside call (cabcdefgh.py:120))  +8.00 MiB" in diff,
          f"diff names the grown site by its user frame:\n{diff}")

finish()
