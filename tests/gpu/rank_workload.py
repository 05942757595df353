"""A torchrun worker for scripts/gpu-e2e-run.sh: each rank takes its own GPU (LOCAL_RANK modulo the GPUs
there are) and allocates a rank-dependent amount, so per-rank logs and the imbalance are visible.

Usage: torchrun --nproc_per_node=N rank_workload.py
"""
import os

import torch

local_rank = int(os.environ.get("LOCAL_RANK", "0"))
torch.cuda.set_device(local_rank % torch.cuda.device_count())
keep = [torch.empty((local_rank + 1) * 64 * 2**20, dtype=torch.uint8, device="cuda") for _ in range(4)]
x = torch.randn(2048, 2048, device="cuda")
y = (x @ x).sum().item()
torch.cuda.synchronize()
print(f"rank {local_rank}: device {torch.cuda.current_device()} reserved {torch.cuda.memory_reserved()}")
