"""How the L2 flush between timed runs moves the normalization benchmark: memory-bound ops of
50 to 150 MB, rtdnn and PyTorch eager, each timed three ways: triton.testing.do_bench (which
flushes L2 by zeroing 256 MB, leaving it full of dirty lines), core.timing.median_time_ms
(which flushes by reading 256 MB), and the latter on a CUDA-graph replay (the benchmarks'
method, core.timing.device_time_ms). Also the copy bandwidth both ways.
    PYTHONPATH=src python benchmarks/probes/flush_probe.py OUT_DIR
"""

import json
import os
import sys

import torch
import torch.nn.functional as F
import triton

from rtdnn import ops
from rtdnn.core.timing import capture, median_time_ms

out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
dtype = torch.bfloat16
results = []


def record(**row):
    results.append(row)
    print(json.dumps(row), flush=True)


def three_ways(fn) -> tuple[float, float, float]:
    zeroed = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    return zeroed, median_time_ms(fn), median_time_ms(capture(fn))


def batch_norm_calls(n, c, hw):
    x, z, dy = (
        torch.randn(n, c, hw, hw, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
        for _ in range(3)
    )
    w, b = torch.rand(c, device="cuda") + 0.5, torch.randn(c, device="cuda")
    rm, rv = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
    _, mean, invstd = ops.batch_norm_forward_training(x, w, b)
    xe, we, be = (t.detach().requires_grad_() for t in (x, w, b))
    ye = F.batch_norm(xe, None, None, we, be, training=True)
    nb = x.numel() * x.element_size()
    return f"{n}x{c}x{hw}x{hw}", {
        "bn train fwd": (
            lambda: ops.batch_norm_forward_training(x, w, b, running_mean=rm, running_var=rv),
            lambda: F.batch_norm(x, rm, rv, w, b, training=True),
            3 * nb,
        ),
        "bn bwd": (
            lambda: ops.batch_norm_backward(dy, x, mean, invstd, w, b),
            lambda: torch.autograd.grad(ye, (xe, we, be), dy, retain_graph=True),
            5 * nb,
        ),
    }


def row_norm_calls(rows, d):
    x = torch.randn(rows, d, device="cuda", dtype=dtype)
    dy = torch.randn_like(x)
    w = torch.rand(d, device="cuda", dtype=dtype) + 0.5
    b = torch.randn(d, device="cuda", dtype=dtype)
    _, mean, rstd = ops.layer_norm_forward(x, d, w, b)
    xe, we, be = (t.detach().requires_grad_() for t in (x, w, b))
    ye = F.layer_norm(xe, (d,), we, be)
    nb = x.numel() * x.element_size()
    return f"{rows}x{d}", {
        "layer norm fwd": (
            lambda: ops.layer_norm_forward(x, d, w, b),
            lambda: F.layer_norm(x, (d,), w, b),
            2 * nb,
        ),
        "layer norm bwd": (
            lambda: ops.layer_norm_backward(dy, x, d, mean, rstd, w),
            lambda: torch.autograd.grad(ye, (xe, we, be), dy, retain_graph=True),
            3 * nb,
        ),
    }


WAYS = ("zeroed", "read", "graph")


def copy_rates() -> float:
    """GB/s of a 1 GiB copy, three ways; returns the read-flush one (the benchmarks')."""
    a = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    gbs = [2 * 2**30 / t / 1e6 for t in three_ways(lambda: b.copy_(a))]
    record(op="copy 1 GiB", **{f"{k}_gbs": round(g) for k, g in zip(WAYS, gbs, strict=True)})
    return gbs[1]


with torch.cuda.stream(torch.cuda.Stream()):
    copy = copy_rates()
    cases = [
        batch_norm_calls(n, ch, hw)
        for n, ch, hw in (
            (64, 64, 112),
            (64, 512, 28),
            (128, 1024, 14),
            (64, 1024, 14),
            (64, 2048, 7),
        )
    ]
    cases += [row_norm_calls(32768, 768), row_norm_calls(32768, 4096)]  # fmt: skip
    for shape, calls in cases:
        for op, (ours, theirs, moved) in calls.items():
            for side, fn in (("rtdnn", ours), ("eager", theirs)):
                times = dict(zip(WAYS, three_ways(fn), strict=True))
                record(
                    op=op, shape=shape, side=side,
                    **{f"{k}_ms": round(t, 4) for k, t in times.items()},
                    **{f"{k}_pct": round(moved / t / 1e4 / copy, 1) for k, t in times.items()},
                )  # fmt: skip
torch.cuda.synchronize()
with open(os.path.join(out_dir, "flush_probe.json"), "w") as f:
    json.dump(results, f, indent=1)
print("op | shape | side | ms: zero-flush / read-flush / read+graph | % copy (counted), same")
for r in results[1:]:
    ms = f"{r['zeroed_ms']:.4f} / {r['read_ms']:.4f} / {r['graph_ms']:.4f}"
    pct = f"{r['zeroed_pct']} / {r['read_pct']} / {r['graph_pct']}"
    print(f"{r['op']} | {r['shape']} | {r['side']} | {ms} | {pct}")
