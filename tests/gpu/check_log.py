"""Reads a gpumem log and checks it against what a GPU workload is known to have done (used by scripts/gpu-e2e.sh).

It is deliberately independent of the C++ analyzer: a second reading of docs/log-format.md.
"""
import json
import sys
from collections import Counter


def load(path):
    lines = [json.loads(l) for l in open(path) if l.strip()]
    assert lines and lines[0]["ev"] == "header", f"{path}: no header"
    return lines


def summarize(lines):
    live = {}          # (namespace, ptr) -> event
    apis = Counter()
    seqs = []
    for e in lines[1:]:
        ev = e["ev"]
        if "seq" in e:
            seqs.append(e["seq"])
        if ev == "alloc":
            ns = "vmm" if e["kind"] == "vmm" else "addr"
            key = (ns, e["ptr"])
            assert key not in live, f"double alloc of {e['ptr']} (seq {e['seq']})"
            live[key] = e
            apis["alloc:" + e["api"]] += 1
        elif ev == "free":
            ns = "vmm" if e["kind"] == "vmm" else "addr"
            live.pop((ns, e["ptr"]), None)
            apis["free:" + e["api"]] += 1
        elif ev in ("alloc_fail", "free_fail", "map", "unmap", "reserve", "unreserve"):
            apis[ev + ":" + e.get("api", "")] += 1
    end = lines[-1] if lines[-1]["ev"] == "end" else None
    gaps = sum(1 for a, b in zip(seqs, seqs[1:]) if b != a + 1)
    return {
        "live": live,
        "apis": apis,
        "end": end,
        "seq_gaps": gaps,
        "events": len(lines) - 1 - (1 if end else 0),
    }


def live_bytes(s, api=None, kind=None):
    return sum(e["size"] for e in s["live"].values()
               if (api is None or e["api"] == api) and (kind is None or e["kind"] == kind))


if __name__ == "__main__":
    s = summarize(load(sys.argv[1]))
    print(json.dumps({"apis": s["apis"], "end": s["end"], "seq_gaps": s["seq_gaps"],
                      "live_bytes": live_bytes(s)}, indent=1))


def peak_reserved(lines):
    """Largest total of pool segments plus pass-through device allocations at any moment, in bytes.
    A segment counts only its mapped chunks: an arena segment_alloc maps `asize` of its `size`, and
    segment_unmap / segment_map take chunks away and put them back (docs/log-format.md)."""
    cur = peak = 0
    sizes = {}
    holes = {}  # segment base -> bytes of it not mapped
    for e in lines[1:]:
        ev = e["ev"]
        if ev == "segment_alloc":
            mapped = min(e.get("asize", e["size"]), e["size"])
            cur += mapped
            holes[e["ptr"]] = e["size"] - mapped
        elif ev == "segment_unmap":
            cur -= e["size"]
            holes[e["seg"]] = holes.get(e["seg"], 0) + e["size"]
        elif ev == "segment_map":
            cur += e["size"]
            holes[e["seg"]] = holes.get(e["seg"], 0) - e["size"]
        elif ev == "segment_free":
            cur -= e["size"] - holes.pop(e["ptr"], 0)
        elif ev == "alloc" and not e.get("pooled") and e["kind"] in ("device", "vmm"):
            sizes[(e["kind"], e["ptr"])] = e["size"]
            cur += e["size"]
        elif ev == "free" and not e.get("pooled"):
            cur -= sizes.pop((e["kind"], e["ptr"]), 0)
        peak = max(peak, cur)
    return peak
