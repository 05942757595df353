#!/usr/bin/env bash
# Ground truth for `gpumem replay` on the GPU machine: tests/gpu/replay_truth.py under each PyTorch allocator setting, and its no-caching log.
#
# Usage: scripts/gpu-replay-truth.sh DIR  (DIR holds libgpumem.so and replay_truth.py; results in $OUT)
# WORKLOADS="transformer mlp" by default; WORKLOADS=ddp runs the two-rank DDP case (needs 2 GPUs).
# Writes $OUT/truth.jsonl (one line per run: what torch.cuda reported) and, per workload, the
# gzipped gpumem log of the PYTORCH_NO_CUDA_MEMORY_CACHING=1 run (what `gpumem replay` reads) and
# of the default run (PyTorch's own segments, to compare with the model's one by one).
set -u
DIR=$(cd "$1" && pwd)
OUTDIR=${OUT:-$(pwd)/replay-truth-out}
mkdir -p "$OUTDIR"
LOGS=$(mktemp -d /tmp/replay-truth.XXXXXX)
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
P="python3 $DIR/replay_truth.py"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for w in ${WORKLOADS:-transformer mlp}; do
  if [ "$w" = ddp ]; then
    # Two ranks, one GPU each: torchrun, and one gpumem log per rank (%r).
    R="torchrun --standalone --nproc_per_node=2 $DIR/replay_truth.py ddp"
    $R "$LOGS/ddp-default.json"
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $R "$LOGS/ddp-expandable.json"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 GPUMEM_POOL=off GPUMEM_OUT="$LOGS/ddp-nocache-%r.jsonl" \
      LD_PRELOAD="$DIR/libgpumem.so" $R "$LOGS/ddp-nocache.json"
    ls -la "$LOGS"/ddp-*
    for r in 0 1; do gzip -9 -c "$LOGS/ddp-nocache-$r.jsonl" > "$OUTDIR/ddp-nocache-$r.jsonl.gz"; done
    for f in "$LOGS"/ddp-*.json.*; do mv "$f" "${f%.json.*}-rank${f##*.}.json"; done
    continue
  fi
  $P "$w" "$LOGS/$w-default.json"
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $P "$w" "$LOGS/$w-expandable.json"
  PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:40 $P "$w" "$LOGS/$w-mss40.json"
  PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:4 $P "$w" "$LOGS/$w-rp4.json"
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 GPUMEM_POOL=off GPUMEM_OUT="$LOGS/$w-nocache.jsonl" \
    LD_PRELOAD="$DIR/libgpumem.so" $P "$w" "$LOGS/$w-nocache.json"
  GPUMEM_POOL=off GPUMEM_OUT="$LOGS/$w-default-log.jsonl" LD_PRELOAD="$DIR/libgpumem.so" \
    $P "$w" "$LOGS/$w-default-gpumem.json"
  ls -la "$LOGS"/$w-*.jsonl
  gzip -9 -c "$LOGS/$w-nocache.jsonl" > "$OUTDIR/$w-nocache.jsonl.gz"
  gzip -9 -c "$LOGS/$w-default-log.jsonl" > "$OUTDIR/$w-default.jsonl.gz"
done
cat "$LOGS"/*.json | python3 -c 'import sys,json; [print(json.dumps(json.loads(l))) for l in sys.stdin.read().replace("}{","}\n{").splitlines()]' > "$OUTDIR/truth.jsonl"
cat "$OUTDIR/truth.jsonl"
