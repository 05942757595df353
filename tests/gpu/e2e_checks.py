"""Checks one gpu-e2e case's log against what its program is known to do; prints one Markdown table row.

Usage: python3 e2e_checks.py CASE LOG [STATS_JSON]
Exit status 0 when every check of the case holds.
"""
import json
import os
import sys

from check_log import live_bytes, load, summarize

MiB = 1 << 20


def common(s, expect_reason):
    """Checks every log must pass: an end line, nothing lost, every pointer wrapped, seq gap-free."""
    problems = []
    end = s["end"]
    if end is None:
        problems.append("no end line")
    else:
        if end["reason"] != expect_reason:
            problems.append(f"end reason {end['reason']} != {expect_reason}")
        if end["lost"]:
            problems.append(f"lost={end['lost']}")
        if end["unmatched"]:
            problems.append(f"unmatched={end['unmatched']}")
    if s["seq_gaps"]:
        problems.append(f"{s['seq_gaps']} seq gaps")
    return problems


def sizes_of(s, api):
    return sorted(e["size"] for e in s["live"].values() if e["api"] == api)


def main():
    case, log = sys.argv[1], sys.argv[2]
    stats = json.load(open(sys.argv[3])) if len(sys.argv) > 3 else {}
    lines = load(log)
    s = summarize(lines)
    apis = s["apis"]
    allocs = {k[6:]: v for k, v in apis.items() if k.startswith("alloc:")}
    problems = []
    facts = []
    if case.startswith("torch"):
        problems += common(s, "_exit")
        if "expandable" in case:
            live = live_bytes(s, kind="vmm")
            facts.append(f"cuMemCreate={allocs.get('cuMemCreate', 0)} maps={apis.get('map:cuMemMap', 0)}")
            facts.append(f"live cuMemCreate bytes={live}, torch reserved={stats['reserved']}")
            if live != stats["reserved"]:
                problems.append("live VMM bytes != memory_reserved()")
            if allocs.get("cudaMalloc", 0):
                problems.append("cudaMalloc seen with expandable segments")
        else:
            live = live_bytes(s, api="cudaMalloc")
            facts.append(f"cudaMalloc={allocs.get('cudaMalloc', 0)} cudaFree={apis.get('free:cudaFree', 0)}")
            facts.append(f"live cudaMalloc bytes={live}, torch reserved={stats['reserved']}")
            # Without caching PyTorch keeps no statistics (reserved reads 0); the tensor check below
            # is the exact one for that mode.
            if "nocache" not in case and live != stats["reserved"]:
                problems.append("live cudaMalloc bytes != memory_reserved()")
            if "nocache" in case and allocs.get("cudaMalloc", 0) < 100:
                problems.append("expected one cudaMalloc per tensor")
            if "nocache" not in case and apis.get("free:cudaFree", 0):
                problems.append("caching allocator should not cudaFree here")
        # Every tensor the program still holds lies inside memory the log says is live; without
        # caching, each tensor is its own allocation of (at least) its size.
        ranges = sorted((int(e["ptr"], 16), e["size"], e["kind"]) for e in s["live"].values() if e["kind"] != "vmm")
        maps = [(int(e["ptr"], 16), e["size"]) for e in lines if e["ev"] == "map"]
        unmapped = {int(e["ptr"], 16) for e in lines if e["ev"] == "unmap"}
        # Expandable segments map a range piece by piece: merge touching maps into one range.
        merged = []
        for p, n in sorted((p, n) for p, n in maps if p not in unmapped):
            if merged and merged[-1][0] + merged[-1][1] == p:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((p, n))
        ranges += [(p, n, "map") for p, n in merged]
        # workloads.py's torch mode always lists its live tensors: none listed would pass both checks below.
        tensors = stats.get("tensors") or []
        if not tensors:
            problems.append("the stats list no live tensors: nothing to check against the log")
        outside, exact = 0, 0
        for ptr, nbytes in tensors:
            hit = [r for r in ranges if r[0] <= ptr and ptr + max(nbytes, 1) <= r[0] + r[1]]
            outside += not hit
            exact += any(r[0] == ptr and r[1] - nbytes < 512 for r in hit)
        facts.append(f"live tensors={len(tensors)} outside live memory={outside}")
        if outside:
            problems.append(f"{outside} live tensors outside memory the log shows live")
        if "nocache" in case:
            facts.append(f"tensors that are exactly one allocation={exact}")
            if exact != len(tensors):
                problems.append("without caching every tensor should be its own allocation")
        other = {k: v for k, v in allocs.items() if k not in ("cudaMalloc", "cuMemCreate")}
        facts.append(f"other allocs={dict(other)}")
    elif case.startswith("jax"):
        problems += common(s, "_exit")
        biggest = max((e["size"] for e in lines if e["ev"] == "alloc"), default=0)
        total = lines[0]["devices"][0]["total"] if lines[0]["devices"] else 0
        facts.append(f"allocs={dict(allocs)} largest={biggest // MiB} MiB of {total // MiB} MiB")
        if "platform" in case:
            n64 = sum(1 for e in lines if e["ev"] == "alloc" and e["size"] == 64 * MiB)
            facts.append(f"64 MiB buffers={n64}")
            if n64 < 2:
                problems.append("expected the 64 MiB input and output buffers as their own allocations")
        elif not total:  # no device memory in the header: "most of the GPU" would be 0 bytes, and any log passed
            problems.append("the header names no device memory: the up-front allocation cannot be judged")
        elif biggest < total // 2:
            problems.append("expected one up-front allocation of most of the GPU")
    elif case.startswith("cupy"):
        problems += common(s, "_exit")
        want = {10 * MiB, 3 * MiB + 5, 4096}
        made = {e["size"] for e in lines if e["ev"] == "alloc" and e["api"] == "cuMemAlloc_v2"}
        freed = {e["size"] for e in lines if e["ev"] == "free"}
        facts.append(f"allocs={dict(allocs)} frees={sum(v for k, v in apis.items() if k.startswith('free:'))}")
        if not want <= made:
            problems.append(f"missing allocations {sorted(want - made)}")
        if (3 * MiB + 5) not in freed:
            problems.append("the freed array's free is missing")
        for size in want:
            n = sum(1 for e in lines if e["ev"] == "alloc" and e["size"] == size)
            if n != 1:
                problems.append(f"size {size} recorded {n} times")
        # cudaFreeAsync of a cudaMalloc block succeeds and is logged, with or without the pool; with
        # it, the mapping of a 6 MiB block is the block (the driver would name one 2 MiB chunk).
        if "free_async_rc" in stats:
            facts.append(f"freeAsync rc={stats['free_async_rc']} mapping rc={stats['mapping_rc']} "
                         f"base={'block' if stats['mapping_base'] == stats['block'] else hex(stats['mapping_base'])} "
                         f"size={stats['mapping_size']}")
            if stats["free_async_rc"] != 0:
                problems.append(f"cudaFreeAsync of a cudaMalloc block returned {stats['free_async_rc']}")
            if not any(e["ev"] == "free" and e["size"] == 6 * MiB for e in lines):
                problems.append("the cudaFreeAsync'd block's free is missing")
            if case.endswith("-pool") and (stats["mapping_rc"] != [0, 0] or stats["mapping_base"] != stats["block"] or
                                           stats["mapping_size"] < 6 * MiB):
                problems.append("the mapping of a pooled 6 MiB block is not the block")
        # cudaFreeAsync of a cudaMalloc block during a capture: the driver's answer without gpumem
        # (cupy-bare, run by gpu-e2e.sh), the same under gpumem with or without the pool; a refused
        # free is logged as free_fail, and the pool keeps the block.
        if "capture_free_rc" in stats:
            bare_path = os.path.join(os.path.dirname(sys.argv[3]), "cupy-bare.stats.json")
            bare = json.load(open(bare_path)) if os.path.exists(bare_path) else {}
            rc, end_rc = stats["capture_free_rc"], stats["capture_end_rc"]
            facts.append(f"capture freeAsync rc={rc} (without gpumem {bare.get('capture_free_rc', '?')}) "
                         f"end rc={end_rc} (without {bare.get('capture_end_rc', '?')}) "
                         f"same block again={stats['capture_realloc_same']}")
            if not bare:
                problems.append("no cupy-bare.stats.json: nothing to compare the capture free with")
            elif (rc, end_rc) != (bare["capture_free_rc"], bare["capture_end_rc"]):
                problems.append("the capture free or its end answered otherwise than without gpumem")
            blk = hex(stats["capture_block"])
            # Only the lines after the block's own 5 MiB allocation: its address may be the earlier
            # 6 MiB block's, freed for real above.
            made_at = [i for i, e in enumerate(lines) if e["ev"] == "alloc" and e["ptr"] == blk and e["size"] == 5 * MiB]
            after = lines[made_at[0] + 1:] if made_at else []
            if not made_at:
                problems.append("the capture block's 5 MiB allocation is missing")
            if rc != 0:
                if stats["capture_realloc_same"]:
                    problems.append("the refused block was handed out again")
                if any(e["ev"] == "free" and e["ptr"] == blk for e in after):
                    problems.append("the refused capture free is logged as a free")
                if not any(e["ev"] == "free_fail" and e["ptr"] == blk for e in after):
                    problems.append("the refused capture free is not logged as free_fail")
    elif case.startswith("cuda-static"):
        problems += common(s, "exit")
        want = [1000, MiB, 3 * MiB + 5, 256 * MiB]
        got = sorted(e["size"] for e in lines if e["ev"] == "alloc" and e["size"] in want)
        freed = sorted(e["size"] for e in lines if e["ev"] == "free" and e["size"] in want)
        facts.append(f"allocs={dict(allocs)} known sizes alloc'd={len(got)} freed={len(freed)}")
        if "bench" not in case and (got != want or freed != want):
            problems.append(f"expected exactly {want} allocated and freed, got {got} / {freed}")
        if any(k != "cuMemAlloc_v2" for k in allocs if k.startswith("cuda")):
            problems.append("static cudart cannot show cuda* names")
    else:
        problems.append("unknown case")
    verdict = "PASS" if not problems else "FAIL: " + "; ".join(problems)
    print(f"| {case} | {s['events']} | {'; '.join(facts)} | {verdict} |")
    sys.exit(0 if not problems else 1)


if __name__ == "__main__":
    main()
