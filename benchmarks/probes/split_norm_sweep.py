"""Batch norm on ResNet-50 shapes (channels-last bf16): time per tile policy of the split
kernels of the training forward, plain and with add + ReLU (statistics and elementwise
passes), and of the backward, to choose the policy from measurements: elements per tile and
per warp, bytes of channels per tile row, programs per parallel slot (of the statistics pass
and of the others), pipeline stages of the statistics loop.
Each op is timed whole (core.timing, L2 flushed) and split into its kernels (torch.profiler).
    PYTHONPATH=src python benchmarks/probes/split_norm_sweep.py OUT_DIR [CONFIG_INDEX ...]
"""

import dataclasses
import json
import os
import sys

import torch
from host_timing import kernel_times, print_best

from rtdnn import ops
from rtdnn.algos import norm as engine
from rtdnn.core.timing import device_time_ms

out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
default_policy = engine.GPU_POLICY
results = []

# (split_elements, warp_elements, lane_bytes, programs_per_slot, stats_stages,
# stats_programs_per_slot = sums_programs_per_slot); the first was the default until the
# statistics pass went to 2 per slot and the partial sums to 4. Give a subset on the command line:
# indices into this list. SWEEP_SHAPES="64x2048x7,..." picks the shapes (default: SHAPES).
CONFIGS = [
    (4096, 1024, 128, 8, 2, 4),
    (4096, 512, 128, 8, 4, 4),
    (2048, 512, 128, 8, 4, 4),
    (2048, 256, 128, 8, 4, 4),
    (8192, 1024, 128, 8, 4, 4),
    (8192, 2048, 128, 8, 4, 4),
    (4096, 1024, 256, 8, 4, 4),
    (4096, 512, 64, 8, 4, 4),
    (4096, 1024, 128, 4, 4, 4),
    (4096, 1024, 128, 16, 4, 4),
    (4096, 1024, 128, 8, 1, 4),
    (4096, 1024, 128, 8, 3, 4),
    (8192, 1024, 128, 8, 3, 4),
    (8192, 2048, 128, 8, 4, 4),
    (2048, 512, 128, 8, 3, 4),
    (4096, 1024, 128, 8, 4, 4),
    (4096, 1024, 128, 8, 2, 1),
    (4096, 1024, 128, 8, 2, 2),
    (4096, 1024, 128, 8, 2, 8),
    (2048, 512, 128, 8, 2, 4),
    (2048, 512, 128, 8, 2, 8),
    (2048, 512, 128, 16, 2, 8),
    (8192, 1024, 128, 8, 2, 2),
    (4096, 1024, 128, 16, 2, 4),
    (4096, 1024, 256, 8, 2, 4),
]
if len(sys.argv) > 2:
    CONFIGS = [CONFIGS[int(i)] for i in sys.argv[2:]]
SHAPES = [(64, 64, 112), (64, 256, 56), (64, 512, 28), (64, 1024, 14), (128, 512, 28),
          (128, 1024, 14), (64, 2048, 7)]  # fmt: skip
if os.environ.get("SWEEP_SHAPES"):
    SHAPES = [tuple(map(int, s.split("x"))) for s in os.environ["SWEEP_SHAPES"].split(",")]


def calls(n: int, c: int, hw: int) -> dict:
    def cl(t):
        return t.to(memory_format=torch.channels_last)

    x = cl(torch.randn(n, c, hw, hw, device="cuda", dtype=torch.bfloat16))
    z = torch.randn_like(x)
    w, b = torch.rand(c, device="cuda") + 0.5, torch.randn(c, device="cuda")
    rm, rv = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
    dy = torch.randn_like(x)
    _, mean, invstd = ops.batch_norm_forward_training(x, w, b)
    nb = x.numel() * 2
    return {
        "bn train fwd": (lambda: ops.batch_norm_forward_training(
            x, w, b, running_mean=rm, running_var=rv), 2 * nb),
        "bn+add+relu train fwd": (lambda: ops.batch_norm_forward_training(
            x, w, b, z=z, activation="relu"), 3 * nb),
        "bn bwd": (lambda: ops.batch_norm_backward(dy, x, mean, invstd, w, b), 3 * nb),
    }  # fmt: skip


for n, c, hw in SHAPES:
    work = calls(n, c, hw)
    for split, warp, lane, pps, stages, stats_pps in CONFIGS:
        engine.GPU_POLICY = dataclasses.replace(
            default_policy, split_elements=split, warp_elements=warp, lane_bytes=lane,
            programs_per_slot=pps, stats_stages=stages, stats_programs_per_slot=stats_pps,
            sums_programs_per_slot=stats_pps,
        )  # fmt: skip
        engine.clear_plans()
        for op, (fn, moved) in work.items():
            ms = device_time_ms(fn)
            row = dict(op=op, shape=f"{n}x{c}x{hw}x{hw}", split=split, warp=warp, lane=lane,
                       pps=pps, stages=stages, stats_pps=stats_pps, ms=round(ms, 4),
                       gbs=round(moved / ms / 1e6),
                       kernels=kernel_times(fn, steps=10, width=40))  # fmt: skip
            results.append(row)
            print(json.dumps(row), flush=True)
engine.GPU_POLICY = default_policy
with open(os.path.join(out_dir, "split_norm_sweep.json"), "w") as f:
    json.dump(results, f, indent=1)
print_best(results, ("op", "shape"))
