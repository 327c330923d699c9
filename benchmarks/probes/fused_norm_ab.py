"""Batch norm's fused passes (one cooperative launch a direction) against the separate
launches, in one process: the device time of ResNet-50's batch-norm layers (the norm
benchmark's rows, bf16, channels-last, batches 64 and 128) with the fused kernels, then with
them off, then fused again, and the ratio of the better fused time to the separate one.
    PYTHONPATH=src python benchmarks/probes/fused_norm_ab.py OUT.md
"""

import dataclasses
import sys

import torch

from rtdnn.algos import norm as engine
from rtdnn.bench.norm import RESNET50_BN, batch_norm_rows
from rtdnn.core.timing import copy_bandwidth


def rows(fused: bool) -> dict:
    """(op, shape) -> rtdnn ms, with the fused kernels on or off (plans prepared afresh)."""
    pol = dataclasses.replace(engine.GPU_POLICY, fused_passes=fused)
    engine.policy = lambda device: pol if device.type == "cuda" else engine.CPU_POLICY
    engine.cache.calls.clear()
    out = {}
    with torch.cuda.stream(torch.cuda.Stream()):
        for n in (64, 128):
            for c, hw in RESNET50_BN:
                for r in batch_norm_rows(n, c, hw, torch.bfloat16, copy):
                    assert r.ok, r
                    out[(r.op, r.shape)] = (r.rtdnn_ms, r.counted_pct)
                torch.cuda.empty_cache()
    torch.cuda.synchronize()
    return out


copy = copy_bandwidth()
fused, separate, again = rows(True), rows(False), rows(True)
lines = [
    f"Batch norm, fused passes against separate launches, bf16, {torch.cuda.get_device_name()}",
    "",
    "| op | shape | fused ms | separate ms | fused again ms | separate / best fused |",
    "|---|---|---:|---:|---:|---:|",
]
for key, (ms, _) in separate.items():
    f1, f2 = fused[key][0], again[key][0]
    ratio = ms / min(f1, f2)
    lines.append(f"| {key[0]} | {key[1]} | {f1:.4f} | {ms:.4f} | {f2:.4f} | {ratio:.3f} |")
print("\n".join(lines))
with open(sys.argv[1], "w") as f:
    f.write("\n".join(lines) + "\n")
