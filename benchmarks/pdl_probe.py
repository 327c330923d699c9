"""What programmatic dependent launch (kernels/dependent_launch.py) and the timing method each
change in the normalization ops: every op of `rtdnn bench --op norm` (bfloat16) timed with the
tile policy's `pdl` on and off, each both ways: CUDA-graph replay (core.timing.device_time_ms,
the benchmark's method) and plain launches (triton.testing.do_bench), L2 flushed in both.
    PYTHONPATH=src python benchmarks/pdl_probe.py OUT_DIR
"""

import dataclasses
import json
import os
import sys

import torch
import triton

from rtdnn import ops
from rtdnn.algos import norm as engine
from rtdnn.bench.norm import RESNET50_BN, TRANSFORMER_ROWS, copy_bandwidth
from rtdnn.core.timing import device_time_ms

out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
dtype = torch.bfloat16
default_policy = engine.GPU_POLICY
results = []


def channels_last(shape):
    return torch.randn(shape, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)


def batch_norm_calls(n, c, hw):
    x, z, dy = (channels_last((n, c, hw, hw)) for _ in range(3))
    w, b = torch.rand(c, device="cuda") + 0.5, torch.randn(c, device="cuda")
    rm, rv = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
    _, mean, invstd = ops.batch_norm_forward_training(x, w, b)
    nbytes = x.numel() * x.element_size()
    return f"{n}x{c}x{hw}x{hw}", {
        "bn train fwd": (
            lambda: ops.batch_norm_forward_training(x, w, b, running_mean=rm, running_var=rv),
            3 * nbytes,
        ),
        "bn bwd": (lambda: ops.batch_norm_backward(dy, x, mean, invstd, w, b), 5 * nbytes),
        "bn+add+relu train fwd": (
            lambda: ops.batch_norm_forward_training(x, w, b, z=z, activation="relu"),
            4 * nbytes,
        ),
        "bn+add+relu bwd": (
            lambda: ops.batch_norm_backward(dy, x, mean, invstd, w, b, z=z, activation="relu"),
            7 * nbytes,
        ),
    }


def row_norm_calls(rows, d):
    x = torch.randn(rows, d, device="cuda", dtype=dtype)
    dy = torch.randn_like(x)
    w = torch.rand(d, device="cuda", dtype=dtype) + 0.5
    b = torch.randn(d, device="cuda", dtype=dtype)
    _, mean, rstd = ops.layer_norm_forward(x, d, w, b)
    _, rms_rstd = ops.rms_norm_forward(x, d, w)
    nbytes = x.numel() * x.element_size()
    return f"{rows}x{d}", {
        "layer norm fwd": (lambda: ops.layer_norm_forward(x, d, w, b), 2 * nbytes),
        "layer norm bwd": (lambda: ops.layer_norm_backward(dy, x, d, mean, rstd, w), 3 * nbytes),
        "rms norm bwd": (lambda: ops.rms_norm_backward(dy, x, d, rms_rstd, w), 3 * nbytes),
    }


def measure(shape, calls, copy):
    for op, (fn, moved) in calls.items():
        for pdl in (True, False):
            engine.GPU_POLICY = dataclasses.replace(default_policy, pdl=pdl)
            engine.clear_plans()
            graph_ms = device_time_ms(fn, rep_ms=100)
            plain_ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
            row = dict(op=op, shape=shape, pdl=pdl, graph_ms=round(graph_ms, 4),
                       plain_ms=round(plain_ms, 4),
                       graph_pct=round(100 * moved / graph_ms / 1e6 / copy, 1),
                       plain_pct=round(100 * moved / plain_ms / 1e6 / copy, 1))  # fmt: skip
            results.append(row)
            print(json.dumps(row), flush=True)


with torch.cuda.stream(torch.cuda.Stream()):
    copy = copy_bandwidth()
    print(json.dumps({"copy GB/s": round(copy)}), flush=True)
    for n in (64, 128):
        for c, hw in RESNET50_BN:
            measure(*batch_norm_calls(n, c, hw), copy)
            torch.cuda.empty_cache()
    for rows, d in TRANSFORMER_ROWS[:2]:
        measure(*row_norm_calls(rows, d), copy)
engine.GPU_POLICY = default_policy
with open(os.path.join(out_dir, "pdl_probe.json"), "w") as f:
    json.dump(results, f, indent=1)
print("op | shape | graph ms pdl/no | plain ms pdl/no | % copy (counted bytes) graph pdl/no")
for on, off in zip(results[0::2], results[1::2], strict=True):
    graph = f"{on['graph_ms']:.4f}/{off['graph_ms']:.4f}"
    plain = f"{on['plain_ms']:.4f}/{off['plain_ms']:.4f}"
    print(f"{on['op']} | {on['shape']} | {graph} | {plain} | {on['graph_pct']}/{off['graph_pct']}")
