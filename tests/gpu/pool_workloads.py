"""PyTorch workloads for the pool checks of scripts/gpu-e2e.sh; each prints one JSON line of results.

Usage: python3 pool_workloads.py loop|multistream|race|gpt2 [ITERATIONS]
Run them with and without gpumem, and with and without PYTORCH_NO_CUDA_MEMORY_CACHING=1: with no
caching every tensor is a cudaMalloc/cudaFree, which gpumem's pool then serves.
"""
import json
import sys
import time

import torch


def timed(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def loop(iters):
    """The randn+mul loop of the issue: two 4 MiB tensors made and dropped per iteration.

    Timed in 5 rounds of `iters` iterations, reported sorted.  The loop is bound by the CPU that
    launches it, and on the H200 machine that CPU's speed drifts: plain PyTorch, without gpumem,
    took from 17.2 to 25.8 µs per iteration in the rounds of one process."""
    def step():
        x = torch.randn(1024, 1024, device="cuda")
        y = x * 2
        return y

    rounds = sorted(timed(step, iters, 200) * 1e6 for _ in range(5))
    return {"us_per_iter": rounds[2], "min_us": rounds[0], "rounds_us": rounds, "iters": iters}


def multistream(iters):
    """A training step whose work is split over two side streams; losses must not depend on gpumem."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator(device="cuda").manual_seed(1)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    losses = []
    for _ in range(iters):
        x = torch.randn(256, 1024, device="cuda", generator=gen)
        target = torch.randn(256, 1024, device="cuda", generator=gen)
        main = torch.cuda.current_stream()
        s1.wait_stream(main)
        s2.wait_stream(main)
        with torch.cuda.stream(s1):
            a = model(x[:128])
            la = torch.nn.functional.mse_loss(a, target[:128])
        with torch.cuda.stream(s2):
            b = model(x[128:])
            lb = torch.nn.functional.mse_loss(b, target[128:])
        main.wait_stream(s1)
        main.wait_stream(s2)
        loss = (la + lb) / 2
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        # Temporaries die here while side-stream work may still be queued: the case reuse safety is for.
        del a, b, la, lb, x, target
        losses.append(loss.item())
    return {"losses": losses}


def race(iters):
    """Frees a tensor that a side stream's queued kernel has yet to read, then refills memory of that
    size on the main stream.  The side stream reads the right values only if the free waited for it:
    cudaFree's implicit sync without gpumem, safe reuse with it.  Reusing the block at once (the
    wrong mode for this program) lets the zeros land first."""
    side = torch.cuda.Stream()
    n = 1 << 20  # 4 MiB of float32
    sums = []
    for i in range(iters):
        x = torch.full((n,), float(i + 1), device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(20_000_000)  # about 10 ms: the read of x below comes late
            y = x * 2
        del x  # freed while the side stream has yet to read it
        z = torch.zeros(n, device="cuda")  # the main stream, at once: may land on x's memory
        torch.cuda.current_stream().wait_stream(side)
        sums.append(float(y.sum().item()))
        del y, z
    return {"sums": sums}


def gpt2(iters):
    """A small GPT-2 built from a config (no download), trained with AdamW."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=6, n_embd=512, n_head=8, vocab_size=8192, n_positions=512)
    model = GPT2LMHeadModel(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device="cuda").manual_seed(1)
    losses = []

    def step():
        batch = 8 + int(torch.randint(0, 8, (1,), generator=gen, device="cuda").item())  # varying shapes
        ids = torch.randint(0, cfg.vocab_size, (batch, 256), device="cuda", generator=gen)
        out = model(input_ids=ids, labels=ids)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())

    per_iter = timed(step, iters, 5)
    return {"ms_per_iter": per_iter * 1e3, "iters": iters, "losses": losses[-5:],
            "max_reserved": torch.cuda.max_memory_reserved(), "max_allocated": torch.cuda.max_memory_allocated()}


if __name__ == "__main__":
    what = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else {"loop": 2000, "multistream": 30, "race": 10, "gpt2": 30}[what]
    print(json.dumps({"loop": loop, "multistream": multistream, "race": race, "gpt2": gpt2}[what](n)), flush=True)
