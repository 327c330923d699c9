"""The Hopper weight gradient's two unit shapes (kernels/conv_hopper_filter.py: ping-pong
128 x 128, cooperative 128 x 256) timed through the product's IMPLICIT_GEMM_SPLIT_K launch,
beside cuDNN and the split plan's predicted costs, on every layer of the resnet50, vgg16 and
deepbench_train suites the kernel serves with 256 channels or more, and on shapes outside
them; each with dy's boxes as the product picks them (least_waste_box) and as before (rows a
power of two: rows_box). What COOPERATIVE_STEP and COOPERATIVE_FROM are set from.

    PYTHONPATH=src python benchmarks/probes/conv_hopper_filter_units.py OUT_DIR   (GPU)
"""

from __future__ import annotations

import os
import sys

import torch
import triton

from rtdnn import reference as R
from rtdnn.algos import ALGORITHMS, ConvTensors
from rtdnn.algos import implicit_gemm as ig
from rtdnn.bench.conv import layer_calls, load_suite
from rtdnn.bench.conv_algos import _problem
from rtdnn.core.timing import device_time_ms
from rtdnn.kernels import conv_hopper as ch

#: Off-suite layers: (name, batch, channels, filters, height, width, kernel, stride, padding).
OFF_SUITE = [
    ("inception 384 17x17", 32, 384, 384, 17, 17, 3, 1, 1),
    ("wide 256 100x60", 8, 256, 256, 100, 60, 3, 1, 1),
    ("5x5 320 20x20", 32, 320, 320, 20, 20, 5, 1, 2),
    ("s2 256->512 28", 64, 256, 512, 28, 28, 3, 2, 1),
    ("1x7 768 17x17", 32, 768, 192, 17, 17, (1, 7), 1, (0, 3)),
    ("batch 1 512 28", 1, 512, 512, 28, 28, 3, 1, 1),
]


def rows_box(out_h: int, out_w: int, pixels: int) -> tuple[int, int, int]:
    """The boxes before least_waste_box: columns the power of two covering a row (at most
    64), then rows, then images."""
    box_w = min(64, pixels, triton.next_power_of_2(out_w))
    box_h = min(pixels // box_w, triton.next_power_of_2(out_h))
    return pixels // (box_w * box_h), box_h, box_w


def layers() -> list[tuple[str, dict]]:
    out = []
    for suite in ("resnet50", "vgg16", "deepbench_train"):
        out += [(f"{suite} {layer['name']}", layer) for layer in load_suite(suite)]
    for name, n, c, k, h, w, kernel, stride, pad in OFF_SUITE:
        two = lambda v: list(v) if isinstance(v, tuple) else [v, v]  # noqa: E731
        out.append((name, dict(name=name, n=n, c=c, k=k, spatial=[h, w], kernel=two(kernel),
                               stride=two(stride), padding=two(pad), dilation=[1, 1],
                               groups=1)))  # fmt: skip
    return out


def main(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    out = open(os.path.join(out_dir, "conv_hopper_filter_units.md"), "w")

    def log(msg: str) -> None:
        print(msg, flush=True)
        out.write(msg + "\n")
        out.flush()

    algo = ALGORITHMS["IMPLICIT_GEMM_SPLIT_K"]
    log(f"{torch.cuda.get_device_name()}, bf16, channels-last, backward-filter, "
        "IMPLICIT_GEMM_SPLIT_K's Hopper launch per unit shape: ms (cuDNN / ours, splits, "
        "plan cost, rel. error vs cuDNN)")  # fmt: skip
    log("| layer | cuDNN ms | ping-pong 128x128 | cooperative 128x256 | ping-pong, rows of "
        "2^k | cooperative, rows of 2^k | plan's first | best |")  # fmt: skip
    log("|---|---:|---|---|---|---|---|---|")
    for name, layer in layers():
        c = layer_calls(layer, "backward_filter", torch.bfloat16, None)
        p = _problem(c, "backward_filter")
        if ig.hopper_unsupported(p) is not None or p.in_channels < 256:
            continue
        expected = c.expected.double().cpu()
        cudnn = device_time_ms(c.theirs)
        workspace = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8, device="cuda")
        candidates = algo.tile_candidates(p)
        cells, times = {}, {}
        least_waste = ch.least_waste_box
        for rule in ("least waste", "rows of 2^k"):
            if rule != "least waste":  # the earlier boxes: rows a power of two, then images
                ch.least_waste_box = lambda n, h, w, px: rows_box(h, w, px)
            for tiles in candidates:
                plan = ig._hopper_filter_plan(p, tiles, algo.splits(p)).split
                run = algo.prepare(p, tiles)
                dw = torch.empty_like(c.w)

                def call(run=run, dw=dw):
                    run(ConvTensors(c.x, dw, c.dy), workspace, 1.0, 0.0)  # noqa: B023

                call()
                err = R.rel_error(dw, expected)
                ms = device_time_ms(call)
                times[rule, tiles.block_n] = ms
                cells[rule, tiles.block_n] = (f"{ms:.4f} ({cudnn / ms:.2f}x, s{plan.splits}, "
                                              f"c{plan.cost:.0f}, {err:.0e})")  # fmt: skip
            ch.least_waste_box = least_waste
        best = min(times, key=times.get)
        row = " | ".join(cells.get((rule, n), "-") for rule in ("least waste", "rows of 2^k")
                         for n in (128, 256))  # fmt: skip
        log(f"| {name} | {cudnn:.4f} | {row} | {candidates[0].block_n} | {best} |")


if __name__ == "__main__":
    main(sys.argv[1])
