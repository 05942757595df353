"""What the pool did during static_cudart_app's pair loops: per api and size, the pairs, the fence releases, the waits, the growths and the host time in the pool's fence calls (fence_ns), from the gpumem log.

Usage: python3 tests/gpu/hit_anatomy.py LOG...
The bench runs one size at a time, so each pool_sync and segment event belongs to the size of the
allocation before it.  A wait (pool_sync with "waited") is the GPU's latency to reach a fence,
microseconds on an idle H200: the events part of a pool hit's cost that the log can show.
"""
import json
import sys
from collections import defaultdict


def main(paths):
    for path in paths:
        rows = defaultdict(lambda: defaultdict(int))
        key = None
        with open(path) as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                ev = e.get("ev")
                if ev == "alloc" and e.get("pooled"):
                    key = (e.get("api"), e.get("size"))
                    rows[key]["pairs"] += 1
                elif key and ev == "pool_sync":
                    rows[key]["fence releases" if e.get("fence") else "context syncs"] += 1
                    rows[key]["fence_ns"] += e.get("fence_ns", 0)
                    if e.get("waited"):
                        rows[key]["waits"] += 1
                elif key and ev in ("segment_alloc", "segment_map"):
                    rows[key]["growths"] += 1
        print(path)
        for (api, size), r in sorted(rows.items(), key=lambda kv: (str(kv[0][0]), kv[0][1] or 0)):
            n = max(r["pairs"], 1)
            print(f"  {api} {size} B: {r['pairs']} pairs; per pair {r['fence releases'] / n:.3f} fence releases, "
                  f"{r['waits'] / n:.3f} waits, {r['context syncs'] / n:.3f} context syncs, {r['growths']} growths, "
                  f"{r['fence_ns'] / n / 1000:.3f} us in the pool's fence calls")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
