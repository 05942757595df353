# PyTorch under gpumem with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (gpumem run --tensors): tensors made on
# known lines, then a training loop timed per step, then a request no GPU can serve on a known line.  tests/gpu/stacks_checks.py reads the log.
import json
import sys
import time

import torch

MiB = 1 << 20


def make_weights():
    return torch.empty(64 * MiB // 4, dtype=torch.float32, device="cuda")  # site-weights


def make_buffer():
    return torch.empty(48 * MiB, dtype=torch.uint8, device="cuda")  # site-buffer


def train(steps):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times = []
    for i in range(steps):
        x = torch.randn(64 + 32 * (i % 4), 1024, device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times


def ask_too_much():
    # 1 TiB: more than any GPU has, so an OOM with or without gpumem; its report must name this line.
    # Under PYTORCH_NO_CUDA_MEMORY_CACHING=1 torch raises AcceleratorError, not OutOfMemoryError
    # (H200 run 134): both are RuntimeErrors.
    try:
        torch.empty(1 << 40, dtype=torch.uint8, device="cuda")  # site-oom
    except RuntimeError:
        return True
    return False


w = make_weights()
b = make_buffer()
times = train(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
times.sort()
oom_raised = ask_too_much()
print(json.dumps({"median_step_s": times[len(times) // 2], "min_step_s": times[0], "steps": len(times),
                  "oom_raised": oom_raised}))
