"""WINOGRAD_NONFUSED F(4x4) in strict float32 on ResNet-50's 3x3 stride-1 layers at batch 64
(the resnet50 suite's), channels-last: each GEMM tile shape with each kind of product
(3xTF32 on tensor cores, IEEE float32 on FMA units), the whole call's device time and its
relative error against the float64 reference, beside cuDNN (benchmark mode, TF32 off).
Forward stands for backward-data too (the same GEMM shapes: square layers).

    PYTHONPATH=src python3 benchmarks/probes/winograd_sweep.py OUT_DIR
"""

from __future__ import annotations

import os
import sys
from functools import partial

import torch
from torch.nn.grad import conv2d_input, conv2d_weight

from rtdnn.algos import ALGORITHMS, ConvTensors, winograd
from rtdnn.core.timing import device_time_ms
from rtdnn.ops.conv import _problem_for_selection

LAYERS = [(64, 64, 56), (64, 128, 28), (64, 256, 14), (64, 512, 7)]  # (batch, channels, side)
# (block_m, block_n, block_k, warps, stages)
DATA_SHAPES = [
    (128, 128, 32, 8, 3), (128, 64, 32, 4, 3), (64, 64, 32, 4, 3), (128, 64, 64, 4, 2),
    (256, 64, 32, 8, 3), (64, 128, 32, 4, 3), (128, 128, 64, 8, 2), (64, 64, 64, 4, 2),
]  # fmt: skip
FILTER_SHAPES = [
    (128, 128, 32, 8, 3), (64, 64, 64, 4, 3), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4),
    (128, 128, 64, 8, 3), (64, 64, 32, 4, 4),
]  # fmt: skip


def _case(direction: str, x, w, dy):
    """(float64 reference, cuDNN's call, rtdnn's output, rtdnn's tensors) of one direction."""
    if direction == "forward":
        ref = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
        out = torch.empty_like(x)
        return (
            ref,
            partial(torch.nn.functional.conv2d, x, w, padding=1),
            out,
            ConvTensors(x, w, out),
        )
    ref = conv2d_weight(x.double(), w.shape, dy.double(), padding=1)
    out = torch.empty_like(w)
    return ref, partial(conv2d_weight, x, w.shape, dy, padding=1), out, ConvTensors(x, out, dy)


def _row(p, direction, products, shape, ref, out, tensors, wsp) -> tuple[float, float]:
    """(us, relative error) of one tile shape and kind of product."""
    bm, bn, bk, warps, stages = shape
    winograd.PRECISION["fp32"] = products
    tiles = winograd.WinogradTiles(bm, bn, bk, 8, warps, stages, out_tile=4)
    run = partial(ALGORITHMS["WINOGRAD_NONFUSED"].prepare(p, tiles), tensors, wsp, 1.0, 0.0)
    out.fill_(float("nan"))
    run()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    return device_time_ms(run, rep_ms=30) * 1e3, err


def main(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    log_file = open(os.path.join(out_dir, "winograd_sweep.md"), "w")

    def log(msg: str) -> None:
        print(msg, flush=True)
        log_file.write(msg + "\n")
        log_file.flush()

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    algo = ALGORITHMS["WINOGRAD_NONFUSED"]
    log(f"{torch.cuda.get_device_name()}: WINOGRAD_NONFUSED F(4x4), strict float32, us")
    log("| layer | direction | products | tiles | us | cuDNN us | ratio | rel. err |")
    log("|---|---|---|---|---:|---:|---:|---:|")
    torch.manual_seed(0)
    cl = torch.channels_last
    for n, c, side in LAYERS:
        x = torch.randn(n, c, side, side, device="cuda").to(memory_format=cl)
        w = (torch.randn(c, c, 3, 3, device="cuda") / (9 * c) ** 0.5).to(memory_format=cl)
        dy = torch.randn(n, c, side, side, device="cuda").to(memory_format=cl)
        bwd_data = partial(conv2d_input, x.shape, w, dy, padding=1)
        log(f"| {c}x{side} | backward_data | cuDNN alone | | | "
            f"{device_time_ms(bwd_data, rep_ms=30) * 1e3:.1f} | | |")  # fmt: skip
        for direction, shapes in (("forward", DATA_SHAPES), ("backward_filter", FILTER_SHAPES)):
            ref, cudnn_call, out, tensors = _case(direction, x, w, dy)
            cudnn = device_time_ms(cudnn_call, rep_ms=30) * 1e3
            p, _ = _problem_for_selection(
                direction, x, w, math="fp32", stride=1, padding=1, dilation=1, groups=1,
                mode="cross_correlation",
            )  # fmt: skip
            wsp = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8, device="cuda")
            for products in ("tf32x3", "ieee"):
                for shape in shapes:
                    label = "x".join(map(str, shape[:3])) + f" w{shape[3]} s{shape[4]}"
                    head = f"| {c}x{side} | {direction} | {products} | {label} |"
                    try:
                        us, err = _row(p, direction, products, shape, ref, out, tensors, wsp)
                    except Exception as ex:  # noqa: BLE001
                        log(f"{head} failed: {type(ex).__name__} {str(ex)[:80]} |")
                        continue
                    log(f"{head} {us:.1f} | {cudnn:.1f} | {cudnn / us:.2f} | {err:.1e} |")
    winograd.PRECISION["fp32"] = "tf32x3"


if __name__ == "__main__":
    main(sys.argv[1])
