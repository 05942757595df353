# Checks `gpumem report --torch-snapshot` on a real PyTorch log (the GPU machine's torch 2.11): the
# snapshot is read by torch's own memory_viz (torch.cuda._memory_viz: segsum, trace, memory,
# segments, trace_plot, segment_plot, and `python -m torch.cuda._memory_viz trace_plot`), which must
# succeed, and its numbers must match the log (tests/torch_snapshot/snapshot_checks.py: the count of
# each trace action, each allocation's frames, the replay of the trace ending at "segments").
# Usage: torch_snapshot_check.py GPUMEM LOG [OUTDIR]; prints one Markdown table row per check.
import io
import os
import pickle
import re
import shutil
import subprocess
import sys
from collections import Counter
from contextlib import redirect_stdout

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "torch_snapshot"))
import snapshot_checks  # noqa: E402

gpumem, log = sys.argv[1], sys.argv[2]
outdir = sys.argv[3] if len(sys.argv) > 3 else os.path.dirname(os.path.abspath(log))
snap_path = os.path.join(outdir, os.path.basename(log).rsplit(".", 1)[0] + ".pickle")
rows = []
# Files of an earlier run (the same log checked again, or OUT reused) must not pass for this run's.
if os.path.exists(snap_path):
    os.remove(snap_path)


def row(name, ok, detail):
    rows.append(f"| torch-snapshot: {name} | {detail} | {'PASS' if ok else 'FAIL'} |")
    return ok


r = subprocess.run([gpumem, "report", log, "--torch-snapshot", snap_path], capture_output=True, text=True)
if not row("export", r.returncode == 0 and os.path.isfile(snap_path),
           f"`gpumem report --torch-snapshot`: exit {r.returncode}, {os.path.getsize(snap_path) if os.path.isfile(snap_path) else 0} bytes "
           + r.stderr.strip().replace("\n", " ").replace("|", "/")[:200]):
    print("\n".join(rows))
    sys.exit(1)

# The log against the snapshot, as in the CI test, on a real PyTorch log.
with redirect_stdout(io.StringIO()) as said:
    snap = snapshot_checks.check_snapshot(log, snap_path, os.path.basename(log))
traces = snap["device_traces"]
counts = Counter(e["action"] for t in traces for e in t)
row("matches the log", not snapshot_checks.failures,
    f"{sum(len(t) for t in traces)} trace entries ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}), "
    f"{len(snap['segments'])} segments, {sum(len(s['blocks']) for s in snap['segments'])} blocks"
    + ("; " + "; ".join(snapshot_checks.failures[:3]).replace("|", "/") if snapshot_checks.failures else ""))

import torch  # noqa: E402
from torch.cuda import _memory_viz as mv  # noqa: E402

with open(snap_path, "rb") as f:
    data = pickle.load(f)

# segsum asserts that each segment's blocks add up to it; its totals must be the snapshot's.
try:
    text = mv.segsum(data)
    m = re.search(r"segments: (\d+)", text)
    row("memory_viz segsum", m and int(m.group(1)) == len(data["segments"]),
        f"torch {torch.__version__}: {m.group(0) if m else 'no segment count'}")
except Exception as e:  # noqa: BLE001
    row("memory_viz segsum", False, f"{type(e).__name__}: {e}"[:200])

# trace walks every entry of every device and prints "N entries" per device.
try:
    text = mv.trace(data)
    said_n = [int(x) for x in re.findall(r"^(\d+) entries$", text, re.M)]
    want_n = [len(t) for t in traces if t]
    row("memory_viz trace", said_n == want_n, f"entries per device {said_n}, the snapshot has {want_n}")
except Exception as e:  # noqa: BLE001
    row("memory_viz trace", False, f"{type(e).__name__}: {e}"[:200])

# memory and segments: the flame graph lines (flamegraph.pl is not run: no network there).
try:
    lines = mv.memory(data, format_flamegraph=lambda s: s).splitlines()
    total = sum(int(l.rsplit(" ", 1)[1]) for l in lines)
    want = sum(b["size"] for s in data["segments"] for b in s["blocks"])
    row("memory_viz memory", total == want, f"{len(lines)} flame graph lines, {total} B (segments hold {want} B)")
    lines = mv.segments(data, format_flamegraph=lambda s: s).splitlines()
    row("memory_viz segments", len(lines) > 0, f"{len(lines)} flame graph lines")
except Exception as e:  # noqa: BLE001
    row("memory_viz memory/segments", False, f"{type(e).__name__}: {e}"[:200])

# The HTML viewers, in-process and through the module's command line, as a user runs it.
for fn in ("trace_plot", "segment_plot"):
    try:
        html = getattr(mv, fn)(data)
        row(f"memory_viz {fn}()", "snapshot.pickle" in html and len(html) > 1000, f"{len(html)} bytes of HTML")
    except Exception as e:  # noqa: BLE001
        row(f"memory_viz {fn}()", False, f"{type(e).__name__}: {e}"[:200])
html_path = os.path.join(outdir, "torch-snapshot-trace.html")
if os.path.exists(html_path):
    os.remove(html_path)
r = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", snap_path, "-o", html_path],
                   capture_output=True, text=True)
row("python -m torch.cuda._memory_viz trace_plot", r.returncode == 0 and os.path.isfile(html_path),
    f"exit {r.returncode} {r.stderr.strip()[-150:]}".replace("|", "/").replace("\n", " "))

# The viewer's own JavaScript, when the wheel ships it, goes back with the results so that it can
# be run against the snapshot where node is installed.
js = os.path.join(os.path.dirname(torch.__file__), "utils", "viz", "MemoryViz.js")
if os.path.isfile(js):
    shutil.copy(js, os.path.join(outdir, "MemoryViz.js"))
print("\n".join(rows))
sys.exit(0 if all(r.endswith("PASS |") for r in rows) else 1)
