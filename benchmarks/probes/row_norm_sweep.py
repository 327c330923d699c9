"""Layer and RMS norm on short rows (768, 1024): time per tile policy of the row kernels, to
choose the policy from measurements (rows per tile, elements per warp, programs per slot).
    PYTHONPATH=src python benchmarks/probes/row_norm_sweep.py OUT_DIR
"""

import dataclasses
import itertools
import json
import os
import sys

import torch
from host_timing import print_best

from rtdnn import ops
from rtdnn.algos import norm as engine
from rtdnn.core.timing import device_time_ms

out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
dtype = torch.bfloat16
default_policy = engine.GPU_POLICY
default_row_tiles = engine.row_tiles
per_warp = [512]


def row_tiles(g, itemsize, pol):
    t = default_row_tiles(g, itemsize, pol)
    return engine.Tiles(t.block_r, t.block_k, engine._warps(t.block_r * t.block_k, per_warp[0]))


engine.row_tiles = row_tiles
results = []


def sweep(rows: int, d: int) -> None:
    x = torch.randn(rows, d, device="cuda", dtype=dtype)
    dy = torch.randn_like(x)
    w = torch.randn(d, device="cuda", dtype=dtype)
    b = torch.randn(d, device="cuda", dtype=dtype)
    _, mean, rstd = ops.layer_norm_forward(x, d, w, b)
    _, rms_rstd = ops.rms_norm_forward(x, d, w)
    nbytes = x.numel() * x.element_size()
    calls = {
        "layer norm fwd": (lambda: ops.layer_norm_forward(x, d, w, b), 2 * nbytes),
        "layer norm bwd": (lambda: ops.layer_norm_backward(dy, x, d, mean, rstd, w), 3 * nbytes),
        "rms norm bwd": (lambda: ops.rms_norm_backward(dy, x, d, rms_rstd, w), 3 * nbytes),
    }
    for pack, warp, slot in itertools.product([1024, 2048, 4096, 8192], [256, 512, 1024], [1, 2]):
        engine.GPU_POLICY = dataclasses.replace(
            default_policy, row_pack=pack, row_pack_16bit=pack, row_programs_per_slot=slot
        )
        per_warp[0] = warp
        engine.clear_plans()
        for op, (fn, moved) in calls.items():
            try:
                ms = device_time_ms(fn, graph=False)
            except Exception as e:  # a config the compiler rejects
                print(op, rows, d, pack, warp, slot, "failed", type(e).__name__, flush=True)
                continue
            row = dict(op=op, d=d, row_pack=pack, per_warp=warp, programs_per_slot=slot,
                       ms=round(ms, 4), gbs=round(moved / ms / 1e6))  # fmt: skip
            results.append(row)
            print(json.dumps(row), flush=True)


for rows, d in [(32768, 768), (32768, 1024)]:
    sweep(rows, d)
engine.GPU_POLICY = default_policy
with open(os.path.join(out_dir, "row_norm_sweep.json"), "w") as f:
    json.dump(results, f, indent=1)
print_best(results, ("op", "d"))
