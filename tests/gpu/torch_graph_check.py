"""A PyTorch CUDA graph captured and replayed, for comparing runs with and without gpumem (capture rules, docs/pool.md).

PyTorch's caching allocator makes its cudaMalloc calls inside a capture in relaxed mode
(cudaThreadExchangeStreamCaptureMode), where the driver allows them; under
PYTORCH_NO_CUDA_MEMORY_CACHING=1 every tensor of the captured code is a cudaMalloc.  This captures a
small MLP's forward and backward, replays it on new input and compares with eager results.  It
prints one JSON line: whether capture and replay worked (or the error) and the largest difference.
Usage: python3 torch_graph_check.py   (exit 0 whatever the outcome: compare the lines of two runs)
"""
import json
import os

import torch

torch.manual_seed(0)
dev = "cuda"
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).to(dev)
x_static = torch.randn(64, 256, device=dev, requires_grad=False)
out = {"caching": os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "0") in ("", "0")}
try:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on a side stream, as the PyTorch docs ask
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            model(x_static).sum().backward()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    model.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        y_static = model(x_static)
        y_static.sum().backward()
    grad_static = model[0].weight.grad  # the graph's backward writes here at every replay
    worst = 0.0
    for _ in range(5):
        x = torch.randn(64, 256, device=dev)
        x_static.copy_(x)
        g.replay()
        torch.cuda.synchronize()
        y_graph, grad_graph = y_static.clone(), grad_static.clone()
        model.zero_grad(set_to_none=True)  # eager grads in fresh tensors
        y_eager = model(x)
        y_eager.sum().backward()
        worst = max(worst, (y_graph - y_eager).abs().max().item(), (grad_graph - model[0].weight.grad).abs().max().item())
        model.zero_grad(set_to_none=True)
    out.update(ok=True, max_diff=worst)
except Exception as e:  # the outcome is what is compared; the message says which call failed
    out.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
print(json.dumps(out))
