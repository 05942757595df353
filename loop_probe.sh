#!/usr/bin/env bash
# Temporary: the randn+mul loop under fence batches 4 and 1, immediate and native, 3 alternating rounds, with log summaries.
LIB=$PWD/build/preload/libgpumem.so; L=$OUT/logs; mkdir -p $L
summ() { python3 - "$1" <<'PY'
import json,sys,glob,collections
for f in glob.glob(sys.argv[1]):
    c=collections.Counter(); fl=collections.Counter()
    for l in open(f):
        try: e=json.loads(l)
        except Exception: continue
        c[e.get("ev")]+=1
        if e.get("ev")=="pool_sync": fl[(e.get("fence"),e.get("waited"))]+=1
        if e.get("ev")=="reuse_safe": print("  reuse_safe api", e.get("api"))
    print("  ", f.split("/")[-1], dict(c), dict(fl))
PY
}
for r in 1 2 3; do
  for m in native b4 b1 imm; do
    case $m in
      native) python3 tests/gpu/pool_workloads.py loop 2000 ;;
      b4) PYTORCH_NO_CUDA_MEMORY_CACHING=1 GPUMEM_OUT=$L/$m-$r.%p.jsonl LD_PRELOAD=$LIB python3 tests/gpu/pool_workloads.py loop 2000 ;;
      b1) GPUMEM_FENCE_BATCH=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 GPUMEM_OUT=$L/$m-$r.%p.jsonl LD_PRELOAD=$LIB python3 tests/gpu/pool_workloads.py loop 2000 ;;
      imm) GPUMEM_REUSE=immediate PYTORCH_NO_CUDA_MEMORY_CACHING=1 GPUMEM_OUT=$L/$m-$r.%p.jsonl LD_PRELOAD=$LIB python3 tests/gpu/pool_workloads.py loop 2000 ;;
    esac 2>$L/$m-$r.err | tail -1 | cut -c1-160 | sed "s/^/$m-$r /"
    [ $r = 1 ] && [ $m != native ] && summ "$L/$m-$r.*.jsonl"
  done
done
