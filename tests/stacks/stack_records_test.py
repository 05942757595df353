# Mutated stack records (tests/data/bad/stack_*.jsonl) through the gpumem binary: each gets its exit
# code and its warning at file:line, the allocations (and failed ones, whose OOMs name their call)
# that name a bad record are shown without a stack, and the --torch-snapshot export of each usable
# one still reads back with pickle.load.
import json
import os
import pickle
import subprocess
import sys
import tempfile
from stack_checks import check, finish

gpumem = sys.argv[1]
bad = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "bad")


# file: (exit code, [(line, text in the message)], [(stack, bytes) of top_sites] or None)
cases = {
    "stack_bad_ids.jsonl": (0, [(2, 'stack record without a valid "id"'), (3, 'without a valid "id"'),
                                (4, 'without a valid "id"'), (5, 'without a valid "id"'), (6, 'without a valid "id"'),
                                (8, "allocation names stack 7, which no earlier stack record defines")],
                            []),  # no allocation kept a stack: no site table
    "stack_id_far_beyond.jsonl": (0, [(2, "stack 4000000000 is far beyond the 0 stacks defined so far"),
                                      (3, "allocation names stack 4000000000"),
                                      (4, "allocation names stack 18446744073709551615")], []),
    "stack_huge_depth.jsonl": (0, [(2, "stack 1 has 3000 frames; the innermost 1024 are kept")], [(1, 4096)]),
    "stack_missing_frames.jsonl": (0, [(2, 'stack record without a "frames" array'),
                                       (3, 'stack record without a "frames" array'),
                                       (4, "a frame of the stack record is not an object"),
                                       (5, "a frame names neither a function, a file nor a module"),
                                       (6, "a native frame's \"address\" is not a hex string"),
                                       (8, "allocation names stack 1, which no earlier")], [(0, 4096), (6, 4096)]),
    "stack_before_definition_and_duplicate.jsonl": (0, [(2, "allocation names stack 1, which no earlier"),
                                                        (5, "stack 1 is defined twice; the first record is kept")],
                                                    [(1, 8192 + 16384), (0, 4096)]),
    "stack_lone_surrogate.jsonl": (0, [(2, "stack record is not valid JSON"), (3, "allocation names stack 1")], []),
    "stack_not_utf8.jsonl": (2, [(2, "not JSON (The input is not valid UTF-8)")], None),
    "stack_cut_record.jsonl": (2, [(2, "not JSON")], None),
    # alloc_fail's stack, by alloc's rules: the OOMs' "asked_by" (below) keeps only the defined one.
    "stack_failed_alloc_undefined.jsonl": (0, [(2, "failed allocation names stack 1, which no earlier stack record defines"),
                                               (5, "failed allocation names stack 18446744073709551615")], []),
}
# file: the stack id each OOM's "asked_by" names, None for null
asked_by = {"stack_failed_alloc_undefined.jsonl": [None, 1, None]}
for name in sorted(os.listdir(bad)):
    if name.startswith("stack_"):
        check(name in cases, f"{name}: a case without an expectation here")
with tempfile.TemporaryDirectory() as d:
    for name, (rc, said, sites) in sorted(cases.items()):
        path = os.path.join(bad, name)
        out = os.path.join(d, name + ".pickle")
        r = subprocess.run([gpumem, "report", "--json", "--no-progress", path, "--torch-snapshot", out], capture_output=True)
        err = r.stderr.decode("utf-8", "replace")
        check(r.returncode == rc, f"{name}: exit {r.returncode}, expected {rc}: {err[:300]}")
        for line, text in said:
            check(any(l.startswith(f"gpumem: {'error' if rc else 'warning'}: {path}:{line}: ") and text in l for l in err.splitlines()),
                  f"{name}: no message at line {line} saying {text!r}: {err[:600]}")
        if rc:
            check(not r.stdout and not os.path.exists(out), f"{name}: nothing written on exit {rc}")
            continue
        dev = json.loads(r.stdout)["processes"][0]["devices"][0]
        got = [(s["stack"], s["bytes"]) for s in dev.get("top_sites", [])]
        check(got == sites, f"{name}: top_sites {got}, expected {sites}")
        check(all(len(s["frames"]) <= 1024 for s in dev.get("top_sites", [])), f"{name}: at most 1024 frames a site")
        if name in asked_by:
            got = [o.get("asked_by") and o["asked_by"]["stack"] for o in dev["ooms"]]
            check(got == asked_by[name], f"{name}: OOMs asked_by {got}, expected {asked_by[name]}")
        with open(out, "rb") as f:
            snap = pickle.load(f)
        n = sum(1 for e in snap["device_traces"][0] if e["action"] == "alloc")
        check(n == sum(1 for l in open(path, "rb") if b'"ev":"alloc"' in l), f"{name}: the snapshot has every allocation")
# A native frame's module is a path on the machine that reads the log: one that is a FIFO (or a
# terminal) blocked the report forever in libdw's open.  Only regular files are read; such a frame
# keeps its module and address, unnamed.
with tempfile.TemporaryDirectory() as d:
    fifo = os.path.join(d, "module.fifo")
    os.mkfifo(fifo)
    log = os.path.join(d, "fifo_module.jsonl")
    with open(log, "w") as f:
        f.write('{"ev":"header","format":"gpumem-events","version":3,"pid":1}\n')
        f.write(json.dumps({"ev": "stack", "id": 1, "frames": [{"module": fifo, "address": "0x1234"},
                                                                {"module": d, "address": "0x10"}]}) + "\n")
        f.write('{"ev":"alloc","seq":0,"t":1,"dev":0,"api":"cudaMalloc","kind":"device","ptr":"0x1000","size":100,"stack":1}\n')
    try:
        r = subprocess.run([gpumem, "report", "--json", "--no-progress", log], capture_output=True, timeout=60)
        check(r.returncode == 0, f"a FIFO as a frame's module: exit {r.returncode}: {r.stderr[:300]}")
        frames = json.loads(r.stdout)["processes"][0]["devices"][0]["top_sites"][0]["frames"]
        check([(f.get("module"), f.get("address"), f.get("function", "")) for f in frames] ==
              [(fifo, "0x1234", ""), (d, "0x10", "")], f"a FIFO as a frame's module: frames {frames}")
    except subprocess.TimeoutExpired:
        check(False, "a FIFO as a frame's module: gpumem report hung opening it")
finish()
