"""An NCCL all-reduce across ranks, one GPU each, for scripts/gpu-e2e-nccl.sh; prints whether the sum was right.

Usage: torchrun --nproc_per_node=N nccl_workload.py
"""
import os

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
dist.init_process_group("nccl")
x = torch.full((64 * 2**20 // 4,), float(rank + 1), device="cuda")  # 64 MiB
for _ in range(5):
    y = x.clone()
    dist.all_reduce(y)
torch.cuda.synchronize()
want = world * (world + 1) / 2
ok = bool(torch.all(y == want).item())
print(f"rank {rank}: all_reduce sum {y[0].item()} want {want} ok={ok}", flush=True)
dist.destroy_process_group()
