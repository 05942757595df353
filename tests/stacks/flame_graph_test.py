# The HTML report's flame graph of call sites, through the real gpumem binary: widths proportional
# to bytes, roots at the top, hover titles, the stated threshold, and hostile frame names
# (tests/data/bad/hostile_stacks.jsonl) that must stay text: no element, attribute or control
# character of theirs may reach the page.
import html.parser
import os
import re
import subprocess
import sys
import tempfile
from stack_checks import check, finish

gpumem, data = sys.argv[1:3]


class page(html.parser.HTMLParser):
    """Every element with its attributes, and the text of each <title> inside the flame graph."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.titles, self.boxes = [], [], []
        self._in_title = False
        self._in_flame = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "svg":
            self._in_flame = "flame graph" in a.get("aria-label", "")
        if self._in_flame and tag == "title":
            self._in_title = True
            self.titles.append("")
        if self._in_flame and tag == "rect":
            self.boxes.append((float(a["x"]), float(a["y"]), float(a["width"]), a["fill"]))

    def handle_endtag(self, tag):
        if tag == "title":
            self._in_title = False
        if tag == "svg":
            self._in_flame = False

    def handle_data(self, d):
        if self._in_title:
            self.titles[-1] += d


def report_html(log, d):
    out = os.path.join(d, os.path.basename(log) + ".html")
    r = subprocess.run([gpumem, "report", "--no-progress", log, "--html", out], capture_output=True)
    check(r.returncode == 0, f"{log}: report --html exit {r.returncode}: {r.stderr[-500:]}")
    raw = open(out, "rb").read()
    p = page()
    p.feed(raw.decode("utf-8", "replace"))
    return raw, p


with tempfile.TemporaryDirectory() as d:
    # The golden log: device 0 peaks at 189.16 MiB; <module> (train.py:40) holds 128 MiB of it.
    raw, p = report_html(os.path.join(data, "golden", "stacks.jsonl"), d)
    check(b"Call stacks at the peak of requested memory" in raw, "the section is there")
    check(b"Frames under 0.5% of the peak" in raw, "the threshold is stated")
    first = [t for t in p.titles if t.startswith("<module>\n/src/train.py:40\n")]
    check(len(first) == 2 and "128.00 MiB (67.7% of the peak) in 2 allocations" in first[0],
          f"hover title names function, file:line, bytes and share: {first[:1]}")
    check(any(t.startswith("?\n/opt/app/libtrainer.so+0x1a2b\n8.00 MiB") for t in p.titles), "a native frame's title names its module")
    # Device 0's graph: the first row is the roots, widths in proportion to bytes (980 px = the peak).
    peak = 189.16
    row0 = [b for b in p.boxes if b[1] == 4.0][:4]
    check(abs(row0[0][2] - 980 * 128 / peak) < 1.0, f"root width {row0[0][2]} for 128 MiB of {peak}")
    check(row0[0][0] == 0.0 and abs(row0[1][0] - (row0[0][2] + 0.5)) < 0.2, "roots side by side, largest first")
    # The callee sits below its caller, within it.
    below = [b for b in p.boxes if b[1] == 21.0 and b[0] == 0.0]
    check(below and abs(below[0][2] - row0[0][2]) < 0.01, "load_weights below <module> (train.py:40), as wide")
    # Two narrow call paths under <module> (train.py:41) merged into one box; the 32 KiB one left out.
    check(any(t.startswith("2 call paths, each under 0.5% of the peak\n1.12 MiB") for t in p.titles), "merged box")
    check(not any("evaluate" in t for t in p.titles), "a frame under the threshold with no sibling to merge is left out")
    check(p.titles.count(p.titles[0]) >= 1 and len(re.findall(rb"<svg[^>]*flame graph", raw)) == 2, "one graph per device")

    # From a report JSON that lists only two sites: the rest of the peak is one "(other stacks)" root.
    import json
    j = json.loads(subprocess.run([gpumem, "report", "--no-progress", "--json", os.path.join(data, "golden", "stacks.jsonl")],
                                  capture_output=True, text=True).stdout)
    dev = j["processes"][0]["devices"][0]
    dev["top_sites"] = dev["top_sites"][:2]
    jp = os.path.join(d, "top2.json")
    json.dump(j, open(jp, "w"))
    raw, p = report_html(jp, d)
    other = [t for t in p.titles if t.startswith("stacks not listed")]
    check(len(other) == 1 and "29.16 MiB (15.4% of the peak)" in other[0], f"(other stacks) from a report JSON: {other}")
    check(b"which lists only the top 2 sites" in raw, "the page says the graph is drawn from the listed sites")

    # Logs of given stacks, one allocation each, live at the end (the golden log's header).
    def stacks_log(name, stacks):
        hdr = json.loads(open(os.path.join(data, "golden", "stacks.jsonl")).readline())
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(json.dumps(hdr) + "\n")
            for seq, (s, (frames, size)) in enumerate(stacks.items()):
                f.write(json.dumps({"ev": "stack", "id": s, "frames": [{"function": n, "file": fl, "line": ln} for n, fl, ln in frames]}) + "\n")
                f.write(json.dumps({"ev": "alloc", "seq": seq, "t": 1000 * (seq + 1), "tid": 1, "dev": 0, "api": "cudaMalloc",
                                    "kind": "device", "ptr": hex(0x7f0000000000 + (s << 24)), "size": size, "stack": s}) + "\n")
        return path

    # A log with more stacks live at the peak than the graph takes (5,000): the rest is "(other
    # stacks)", which said the report JSON had left them out.
    raw, p = report_html(stacks_log("many_stacks.jsonl", {
        s: ([(f"f{s}", "/src/a.py", s), ("main", "/src/a.py", 1)], 1000 if s <= 5000 else 999) for s in range(1, 5201)}), d)
    other = [t for t in p.titles if t.startswith("stacks not")]
    check(len(other) == 1 and other[0].startswith("stacks not drawn: only the 5,000 with the most bytes are\n195.12 KiB"),
          f"(other stacks) from a log of 5,200 stacks: {other}")
    check(b"Only the 5,000 stacks with the most bytes are drawn" in raw and b"report JSON" not in raw,
          "the page says the log's graph leaves the smallest stacks out")
    # Exactly 5,000 stacks: every one is drawn, and the page must not say some were left out.
    raw, p = report_html(stacks_log("exact_stacks.jsonl", {
        s: ([(f"f{s}", "/src/a.py", s), ("main", "/src/a.py", 1)], 1000) for s in range(1, 5001)}), d)
    check(b"Only the 5,000 stacks" not in raw and not any(t.startswith("stacks not") for t in p.titles),
          "a log of exactly 5,000 stacks: none said to be left out")

    # A frame called from two callers is a box under each, with its own bytes; siblings of equal
    # bytes are ordered by name; a path of exactly the threshold (0.5% of the peak) is drawn.
    raw, p = report_html(stacks_log("shared_frames.jsonl", {
        2: ([("helper", "/src/x.py", 5), ("g", "/src/a.py", 2)], 407552),
        3: ([("tiny", "/src/b.py", 9)], 4096),  # 819200 at the peak: the threshold is 4096 bytes
        1: ([("helper", "/src/x.py", 5), ("f", "/src/a.py", 1)], 407552)}), d)
    drawn = list(zip(p.titles, p.boxes))
    helpers = [t for t, b in drawn if t.startswith("helper\n/src/x.py:5\n")]
    check(len(helpers) == 2 and all("398.00 KiB" in t for t in helpers), f"helper under f and under g, 398 KiB each: {helpers}")
    roots = [t.split("\n")[0] for t, b in drawn if b[1] == 4.0]
    check(roots[:2] == ["f", "g"], f"equal roots ordered by name: {roots}")
    check(any(t.startswith("tiny\n/src/b.py:9\n4.00 KiB") for t in p.titles), "a path of exactly the threshold is drawn")
    check(not any("smaller" in t for t in p.titles), f"nothing merged: {p.titles}")

    # The sites table's "called from": three callers, then "…" only when there are more.
    raw, p = report_html(stacks_log("callers.jsonl", {
        1: ([(f"c{i}", "/src/a.py", i) for i in range(5)], 1 << 20),
        2: ([(f"d{i}", "/src/a.py", 10 + i) for i in range(4)], 1 << 20)}), d)
    page_text = raw.decode()
    check("<code>c1 (a.py:1) ← c2 (a.py:2) ← c3 (a.py:3) ← …</code>" in page_text, "five frames: three callers and …")
    check("<code>d1 (a.py:11) ← d2 (a.py:12) ← d3 (a.py:13)</code>" in page_text, "four frames: three callers, no …")

    # An OOM's failing call, named in the HTML OOM list, is text too.
    log = stacks_log("oom_hostile.jsonl", {1: ([("<b>boom</b>", "/src/<i>x.py", 3), ("main", "/src/a.py", 1)], 1 << 20)})
    with open(log, "a") as f:
        f.write(json.dumps({"ev": "alloc_fail", "seq": 1, "t": 5000, "tid": 1, "dev": 0, "api": "cudaMalloc", "kind": "device",
                            "ptr": "0x0", "size": 1 << 40, "err": 2, "stack": 1}) + "\n")
    raw, p = report_html(log, d)
    check("<b>boom" not in raw.decode() and "<i>x.py" not in raw.decode(), "the failing call's frame name became markup")
    check("asked for by <code>&lt;b&gt;boom&lt;/b&gt; (&lt;i&gt;x.py:3)</code>" in raw.decode(), "the failing call's name shown as text")

    # No stacks in the log: no section.
    raw, p = report_html(os.path.join(data, "golden", "pool_off_basic.jsonl"), d)
    check(b"Call stacks" not in raw and b"flame graph" not in raw, "no flame graph without stacks")

    # Hostile names.
    log = os.path.join(data, "bad", "hostile_stacks.jsonl")
    raw, p = report_html(log, d)
    bad = [(t, a) for t, a in p.tags if t in ("script", "img") or any(k.startswith("on") for k in a)]
    check(not bad, f"a frame name became markup: {bad[:3]}")
    check(b"\x1b" not in raw and b"\xc2\x9b" not in raw, "control characters shown, not sent")
    check(any(t.startswith("</title><script>alert(1)</script>\nx' onmouseover='alert(1):1\n") for t in p.titles),
          "the hostile name is shown as text in its title")
    check(any("^[[31mevil.so+0x10" in t for t in p.titles), "ESC in a module name is shown as ^[")
    check(b"Frames deeper than 256 levels are not drawn" in raw, "a 300-frame stack is cut at 256 levels, and says so")
    check(max(b[1] for b in p.boxes) == 4.0 + 255 * 17, "256 rows at most")
    # Labels of a 5000-character name are cut to the box, on a character boundary (valid UTF-8).
    raw.decode("utf-8")
    check(all(len(t) < 20000 for t in p.titles), "titles bounded")
    # The text report cuts a 5000-character function name to 120 characters (119 and "…"), the
    # JSON keeps it whole.
    text = subprocess.run([gpumem, "report", "--no-progress", log], capture_output=True).stdout.decode()
    check("  " + "é" * 119 + "… (" + "ü" * 79 + "…:7)\n" in text, "long names cut in the text report")
    js = subprocess.run([gpumem, "report", "--no-progress", "--json", log], capture_output=True).stdout.decode()
    check("é" * 5000 in js, "the JSON report keeps the whole name")
    for args in (["--json"], []):
        r = subprocess.run([gpumem, "report", "--no-progress", log] + args, capture_output=True)
        check(r.returncode == 0 and b"\x1b" not in r.stdout, f"report {args} on hostile stacks: exit {r.returncode}")

finish()
