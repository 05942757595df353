#!/usr/bin/env python3
"""One rank's row of scripts/gpu-e2e-nccl.sh: checks its gpumem log and prints a Markdown table row.

Usage: nccl_checks.py LOG POOL RANK SUM_OK TORCHRUN_RC.  Exit 1 if the rank's checks fail.
"""
import json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_log import load, summarize
log, pool, rank, sum_ok, rc = sys.argv[1:]
lines = load(log)
s = summarize(lines)
a = s["apis"]
e = s["end"] or {}
pooled = sum(1 for x in lines if x["ev"] == "alloc" and x.get("pooled"))
problems = []
if sum_ok != "1" or rc != "0": problems.append(f"all-reduce wrong or torchrun exit {rc}")
if not e: problems.append("no end line")
elif e.get("lost") or e.get("unmatched"): problems.append(f"lost={e.get('lost')} unmatched={e.get('unmatched')}")
if s["seq_gaps"]: problems.append("seq gaps")
if a.get("alloc:cuMemCreate", 0) == 0: problems.append("NCCL's cuMemCreate not seen")
if pool == "on" and pooled == 0: problems.append("nothing pooled")
verdict = "PASS" if not problems else "FAIL: " + "; ".join(problems)
print(f"| nccl pool {pool} | {rank} | {'right' if sum_ok == '1' else 'WRONG'} | {a.get('alloc:cuMemCreate', 0)} | {a.get('map:cuMemMap', 0)} | "
      f"{a.get('alloc:cudaMalloc', 0)} | {pooled} | {e.get('reason')} | {verdict} |")
sys.exit(1 if problems else 0)
