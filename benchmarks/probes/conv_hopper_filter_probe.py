"""Timing of the weight gradient on Hopper (src/rtdnn/kernels/conv_hopper_filter.py) in tile,
step and stage variants, beside cuDNN and rtdnn's pointer tiles, on ResNet-50's and VGG-16's
3x3 layers; the partials summed by torch (the product uses the split finish).

Its earlier versions, measured on an H200 (results/conv_hopper_filter_probe_*_h200.md, the
history in BENCHMARKS.md, "Backward-filter on Hopper"): two 64-wide MMAs a warp group (0.5 to
0.7x cuDNN), one MMA of the tile's channels a warp group with both warp groups on one unit
(cooperative), then ping-pong, which the product kept.

    PYTHONPATH=src python benchmarks/probes/conv_hopper_filter_probe.py OUT_DIR   (GPU)
"""

from __future__ import annotations

import os
import sys

import torch
import triton

from rtdnn.kernels import conv_hopper as ch
from rtdnn.kernels import conv_hopper_filter as chf

#: Variants measured: (pixels a step, filters a unit, channels a unit, stages).
VARIANTS = [(64, 128, 128, 6), (128, 128, 128, 3), (64, 64, 256, 5), (128, 64, 256, 2)]


def conv_filter_hopper(x, dy, kernel, padding, dilation=1, sms=132, variant=VARIANTS[0],
                       sum_splits=True):  # fmt: skip
    """dW (K, C, R, S) as float32 of a stride-1 convolution of channels-last x and dy, split
    as the product's split_plan chooses (at most 64 ways); with sum_splits=False, the
    kernel's partials (taps, splits, K, C) alone."""
    pixels, block_f, block_c, stages = variant
    n, k, oh, ow = dy.shape
    c = x.shape[1]
    box = ch.least_waste_box(n, oh, ow, pixels)
    boxes_h, boxes_w = triton.cdiv(oh, box[1]), triton.cdiv(ow, box[2])
    boxes = triton.cdiv(n, box[0]) * boxes_h * boxes_w
    k_tiles, c_tiles = triton.cdiv(k, block_f), triton.cdiv(c, block_c)
    taps = kernel[0] * kernel[1]
    splits, per_split, _ = chf.split_plan(taps * k_tiles * c_tiles, boxes, sms, 64)
    splits = max(splits, 2)  # the partials always: one launch shape for every layer
    per_split = triton.cdiv(boxes, splits)
    splits = triton.cdiv(boxes, per_split)
    units = taps * k_tiles * c_tiles * splits
    dy4, x4 = dy.permute(0, 2, 3, 1), x.permute(0, 2, 3, 1)
    dy_desc = ch.descriptor(dy, dy4.shape, dy4.stride(), [*box, block_f])
    x_desc = ch.descriptor(x, x4.shape, x4.stride(), [*box, block_c])
    ws = torch.empty(taps, splits, k, c, dtype=torch.float32, device=x.device)
    dw = torch.empty(k, kernel[0], kernel[1], c, dtype=x.dtype, device=x.device)  # unread
    sk, sr, ss, sc = dw.stride()
    chf.conv_filter_hopper_kernel[(min(units, sms),)](
        dy_desc, x_desc, x_desc, x_desc, x_desc, dw, ws, 1.0, 0.0, units, k_tiles, c_tiles,
        splits, per_split, boxes, boxes_h, boxes_w, padding, padding, dilation, dilation, 1,
        1, padding, kernel[1], k, c, sk, sc, sr, ss, STAGES=stages, COOPERATIVE=False,
        STRIDED=False,
        BETA_NONZERO=False, CONSUMER_REGS=chf.CONSUMER_REGISTERS, num_warps=4,
        maxnreg=chf.LAUNCH_REGISTERS,
    )  # fmt: skip
    if splits == 1:  # a single box: the kernel wrote dw itself
        return ws[:, :0] if not sum_splits else dw.permute(0, 3, 1, 2).float()
    if not sum_splits:
        return ws
    return ws.sum(1).view(kernel[0], kernel[1], k, c).permute(2, 3, 0, 1)


# (name, batch, channels in, channels out, image side): ResNet-50's and VGG-16's 3x3 layers.
LAYERS = [
    ("l1.x.conv2", 64, 64, 64, 56), ("l2.x.conv2", 64, 128, 128, 28),
    ("l3.x.conv2", 64, 256, 256, 14), ("l4.x.conv2", 64, 512, 512, 7),
    ("vgg conv128_112", 16, 128, 128, 112), ("vgg conv256_56", 16, 256, 256, 56),
    ("vgg conv512_28", 16, 512, 512, 28), ("vgg conv512_14", 16, 512, 512, 14),
]  # fmt: skip


def gpu(out_dir: str) -> None:
    """Each layer: cuDNN's and rtdnn's shipped weight gradient, then each variant's error
    against float64 and its device time, kernel alone and with the torch sum of its splits."""
    from torch.nn.grad import conv2d_weight

    import rtdnn
    from rtdnn import reference as R
    from rtdnn.core.timing import device_time_ms

    os.makedirs(out_dir, exist_ok=True)
    out = open(os.path.join(out_dir, "conv_hopper_filter_probe.md"), "w")

    def log(msg):
        print(msg, flush=True)
        out.write(msg + "\n")
        out.flush()

    torch.backends.cudnn.benchmark = True
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    log(f"{torch.cuda.get_device_name()}, bf16, channels-last, 3x3 stride 1 padding 1; variant "
        "(pixels a step, channels a tile, stages): kernel ms / with split sum ms")  # fmt: skip
    head = " | ".join(f"{v}" for v in VARIANTS)
    log(f"| layer | cuDNN ms | rtdnn ms | {head} |")
    log("|---|---:|---:|" + "---|" * len(VARIANTS))
    cl = torch.channels_last
    for name, n, c, k, side in LAYERS:
        x = torch.randn(n, c, side, side, device="cuda", dtype=torch.bfloat16).to(memory_format=cl)
        dy = torch.randn(n, k, side, side, device="cuda", dtype=torch.bfloat16)
        dy = dy.to(memory_format=cl)
        shape = (k, c, 3, 3)
        ref = R.conv_backward_filter(x, dy, shape, padding=1)
        t_cudnn = device_time_ms(lambda: conv2d_weight(x, shape, dy, padding=1))  # noqa: B023
        t_rtdnn = device_time_ms(
            lambda: rtdnn.ops.conv_backward_filter(x, dy, shape, padding=1)  # noqa: B023
        )
        cells = []
        for v in VARIANTS:

            def run(v=v, x=x, dy=dy, sum_splits=True):
                return conv_filter_hopper(x, dy, (3, 3), 1, sms=sms, variant=v,
                                          sum_splits=sum_splits)  # fmt: skip

            try:
                err = R.rel_error(run(), ref)
                t = device_time_ms(lambda run=run: run(sum_splits=False))
                ts = device_time_ms(run)
                splits = conv_filter_hopper(x, dy, (3, 3), 1, sms=sms, variant=v,
                                            sum_splits=False).shape[1]  # fmt: skip
                cells.append(f"{t:.4f} / {ts:.4f} ({t_cudnn / ts:.2f}x, s{splits}, {err:.0e})")
            except Exception as ex:  # noqa: BLE001
                cells.append(f"FAILED {type(ex).__name__}: {str(ex)[:80]}")
        log(f"| {name} | {t_cudnn:.4f} | {t_rtdnn:.4f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    gpu(sys.argv[1])
