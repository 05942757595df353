"""Ground truth for `gpumem replay`: a deterministic PyTorch training loop that prints what PyTorch's allocator reserved.

Usage: python3 replay_truth.py WORKLOAD OUT_JSON   (WORKLOAD: transformer | mlp)
       torchrun --nproc_per_node=2 replay_truth.py ddp OUT_JSON   (writes OUT_JSON.RANK)
Run it once per allocator setting (default, PYTORCH_CUDA_ALLOC_CONF=..., and under libgpumem.so
with PYTORCH_NO_CUDA_MEMORY_CACHING=1 for the log).  Every run makes the same tensor requests in
the same order (fixed seeds, fixed size schedule, one stream), so the replay of the no-caching
log through a model of the allocator must reproduce the numbers the cached runs print.
"""
import json
import os
import sys

import torch
import torch.nn as nn

# Batch and sequence sizes vary step to step, as with bucketed or packed data: blocks of many
# sizes are freed and reused, which is where allocators differ.
TRANSFORMER_SCHEDULE = [(8, 128), (16, 64), (4, 384), (12, 200), (8, 512), (24, 96), (6, 300),
                        (16, 160), (2, 640), (10, 256), (20, 120), (8, 448)]
MLP_BATCHES = [256, 1024, 96, 2048, 640, 1536, 32, 3000, 512, 1200, 4096, 700]


def transformer(steps):
    torch.manual_seed(0)
    d = 256
    layer = nn.TransformerEncoderLayer(d, nhead=8, dim_feedforward=1024, batch_first=True,
                                       dropout=0.0)
    model = nn.Sequential(nn.Embedding(1000, d), nn.TransformerEncoder(layer, 3), nn.Linear(d, 1000))
    model = model.cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    for i in range(steps):
        b, s = TRANSFORMER_SCHEDULE[i % len(TRANSFORMER_SCHEDULE)]
        x = torch.randint(0, 1000, (b, s), generator=g).cuda()
        y = torch.randint(0, 1000, (b, s), generator=g).cuda()
        out = model(x)
        loss = nn.functional.cross_entropy(out.reshape(-1, 1000), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        del x, y, out, loss


def mlp(steps):
    torch.manual_seed(0)
    widths = [1024, 3072, 2048, 4096, 1536, 10]
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.GELU()]
    model = nn.Sequential(*layers[:-1]).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    for i in range(steps):
        b = MLP_BATCHES[i % len(MLP_BATCHES)]
        x = torch.randn(b, widths[0], generator=g).cuda()
        y = torch.randint(0, 10, (b,), generator=g).cuda()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        del x, y, loss


def ddp(steps):
    # The MLP under DistributedDataParallel, one GPU per rank: gradient buckets and NCCL's
    # all-reduce add their own allocations and a second stream.
    import torch.distributed as dist
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    widths = [1024, 3072, 2048, 4096, 1536, 10]
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.GELU()]
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers[:-1]).cuda(), device_ids=[rank])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1 + rank)
    for i in range(steps):
        b = MLP_BATCHES[i % len(MLP_BATCHES)]
        x = torch.randn(b, widths[0], generator=g).cuda()
        y = torch.randint(0, 10, (b,), generator=g).cuda()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        del x, y, loss


def main():
    workload, out_path = sys.argv[1], sys.argv[2]
    steps = int(os.environ.get("REPLAY_TRUTH_STEPS", "24"))
    {"transformer": transformer, "mlp": mlp, "ddp": ddp}[workload](steps)
    if workload == "ddp":
        out_path += "." + os.environ["RANK"]
    torch.cuda.synchronize()
    s = torch.cuda.memory_stats()
    result = {
        "workload": workload,
        "rank": int(os.environ.get("RANK", "0")),
        "steps": steps,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "no_caching": os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", ""),
        "torch": torch.__version__,
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "num_device_alloc": s.get("num_device_alloc"),
        "num_device_free": s.get("num_device_free"),
        "num_alloc_retries": s.get("num_alloc_retries"),
        "requested_bytes_peak": s.get("requested_bytes.all.peak"),
    }
    print(json.dumps(result))
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
