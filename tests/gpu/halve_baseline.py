#!/usr/bin/env python3
"""For scripts/gpu-e2e-run.sh: a report JSON with every device peak halved (a baseline the run must fail), or its largest peak.

Usage: halve_baseline.py BASELINE.json TIGHT.json   writes TIGHT.json, the baseline with halved peaks
       halve_baseline.py --peak BASELINE.json         prints the largest peak_allocated_bytes of a device
"""
import json, sys
if sys.argv[1] == "--peak":
    r = json.load(open(sys.argv[2]))
    print(max(d["peak_allocated_bytes"] for p in r["processes"] for d in p["devices"] if d["dev"] >= 0))
    sys.exit(0)
r = json.load(open(sys.argv[1]))
for p in r["processes"]:
    for d in p["devices"]:
        for k in ("peak_requested_bytes", "peak_allocated_bytes", "peak_reserved_bytes"):
            d[k] //= 2
json.dump(r, open(sys.argv[2], "w"))
