# End to end: a Python program allocates through the emulated libcuda from known functions under
# LD_PRELOAD=libgpumem.so; `gpumem report --json` must name each call site's function, file and
# line with its exact bytes at the peak, and group the leaks by site.  Pool on and off.
import json
import os
import subprocess
import sys
import tempfile
from stack_checks import check, finish

gpumem, lib, driver_dir = sys.argv[1:4]
app = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python_alloc_app.py")
MiB = 1 << 20


def line_of(marker):
    with open(app) as f:
        for i, text in enumerate(f, 1):
            if text.rstrip().endswith("# " + marker):
                return i
    raise AssertionError(marker)


def user(site):
    return site["frames"][0] if site["frames"] else None


for pool in ("on", "off"):
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, LD_PRELOAD=lib, LD_LIBRARY_PATH=driver_dir, GPUMEM_POOL=pool,
                   GPUMEM_OUT=os.path.join(d, "log-%p.jsonl"))
        r = subprocess.run([sys.executable, app], env=env, capture_output=True, text=True)
        check(r.returncode == 0, f"pool {pool}: app ran: {r.stderr}")
        logs = [os.path.join(d, f) for f in os.listdir(d)]
        check(len(logs) == 1, f"pool {pool}: one log")
        rep = subprocess.run([gpumem, "report", "--json", logs[0]], capture_output=True, text=True)
        check(rep.returncode == 0, f"pool {pool}: report ran: {rep.stderr}")
        check("events; the log has" not in rep.stderr, f"pool {pool}: stack records are not counted as events: {rep.stderr}")
        dev = json.loads(rep.stdout)["processes"][0]["devices"][0]
        sites = dev["top_sites"]
        # Peak: 2 x 3 MiB (load_weights) + 5 MiB (make_activations via alloc) + 1 MiB (the thread).
        check([s["bytes"] for s in sites] == [6 * MiB, 5 * MiB, 1 * MiB], f"pool {pool}: bytes {[s['bytes'] for s in sites]}")
        check([s["count"] for s in sites] == [2, 1, 1], f"pool {pool}: counts")
        check(user(sites[0]) == {"function": "load_weights", "file": app, "line": line_of("site-weights")},
              f"pool {pool}: weights site {user(sites[0])}")
        f1 = sites[1]["frames"]
        check(f1[0]["function"] == "alloc" and f1[1] == {"function": "make_activations", "file": app,
                                                        "line": line_of("site-activations")},
              f"pool {pool}: activations site {f1[:2]}")
        f2 = sites[2]["frames"]
        check(len(f2) > 1 and f2[0]["function"] == "alloc" and f2[1]["function"] == "<lambda>",
              f"pool {pool}: the thread that released the GIL has its own stack {f2[:2]}")
        check(all(user(s) is None or user(s)["function"] != "scratch" for s in sites), f"pool {pool}: freed scratch not at the peak")
        leaks = dev["leak_sites"]
        check([(s["bytes"], s["stack"] != 0) for s in leaks] == [(6 * MiB, True), (1 * MiB, True)],
              f"pool {pool}: leaks by site {[(s['bytes'], s['stack']) for s in leaks]}")
        text = subprocess.run([gpumem, "report", logs[0]], capture_output=True, text=True).stdout
        check("Top call sites at the peak of requested memory" in text and
              f"load_weights (python_alloc_app.py:{line_of('site-weights')})" in text, f"pool {pool}: text table")
        # Off: no stacks, no site members.
        env["GPUMEM_STACKS"] = "off"
        env["GPUMEM_OUT"] = os.path.join(d, "off-%p.jsonl")
        subprocess.run([sys.executable, app], env=env, capture_output=True)
        off = [os.path.join(d, f) for f in os.listdir(d) if f.startswith("off-")][0]
        check('"ev":"stack"' not in open(off).read(), f"pool {pool}: GPUMEM_STACKS=off writes no stack record")
        j = json.loads(subprocess.run([gpumem, "report", "--json", off], capture_output=True, text=True).stdout)
        check("top_sites" not in j["processes"][0]["devices"][0], f"pool {pool}: no top_sites without stacks")

finish()
