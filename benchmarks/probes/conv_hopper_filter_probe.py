"""An experiment for the weight gradient on Hopper, in the manner of the forward and
backward-data kernel (src/rtdnn/kernels/conv_hopper.py): boxes of pixels by TMA, warp-group
MMAs straight from shared memory, one load warp and two MMA warp groups, persistent programs.

dW[k, r, s, c] = sum over pixels p of dy[p, k] x[p shifted by tap (r, s), c]. A work unit is
(filter tap, 128 filters k, 128 channels c, a share of dy's pixels). A step takes one box of
128 of dy's pixels ([images, rows, columns], as the forward's output boxes): two boxes of dy
(64 filters each, one per MMA warp group, read as the MMA's A operand transposed: k x pixels)
and two boxes of x at the same pixels shifted by the tap (64 channels each: B, pixels x c),
so each warp group multiplies a 64 x 128-pixel slice of dy^T by two 128-pixel x 64 blocks of
x. A unit's share of the pixel boxes is a split of the reduction: float32 partial sums go to
a workspace (splits, taps, K, C), summed here by torch in a fixed order (the product would use
rtdnn's split finish). Stride 1, one group, 16-bit, channels-last, K and C multiples of 64.

Not in the product. First run (H200, one 128 x 128 tile as two 64-channel MMAs a warp
group, 128 pixels a step): correct, 0.5-0.7x cuDNN.

    PYTHONPATH=src python benchmarks/probes/conv_hopper_filter_probe.py compile   (no GPU)
    PYTHONPATH=src python benchmarks/probes/conv_hopper_filter_probe.py OUT_DIR   (GPU)
"""

from __future__ import annotations

import os
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

#: Variants measured: (pixels a step, filters a unit, channels a unit, stages). Each consumer
#: warp group takes whole units, alternating (ping-pong: one's epilogue under the other's
#: products). A stage holds dy's box of the unit's filters and x's box of its channels.
VARIANTS = [(64, 128, 128, 6), (128, 128, 128, 3), (64, 64, 256, 5), (128, 64, 256, 2)]


@gluon.jit
def _unit(unit, k_tiles, c_tiles, splits, BLOCK_F: gl.constexpr, BLOCK_C: gl.constexpr):
    """(tap, first filter, first channel, split) of a work unit: splits innermost, so that
    the programs sharing a tile's reduction run side by side."""
    split = unit % splits
    rest = unit // splits
    c0 = rest % c_tiles * BLOCK_C
    rest = rest // c_tiles
    k0 = rest % k_tiles * BLOCK_F
    return rest // k_tiles, k0, c0, split


@gluon.jit
def _box_origin(box, boxes_h, boxes_w, BOX_N: gl.constexpr, BOX_H: gl.constexpr,
                BOX_W: gl.constexpr):  # fmt: skip
    """(first image, row, column) of pixel box `box` of dy."""
    w0 = box % boxes_w * BOX_W
    h0 = (box // boxes_w) % boxes_h * BOX_H
    return box // (boxes_w * boxes_h) * BOX_N, h0, w0


@gluon.jit
def _loader(dy_desc, x_desc, dy_smem, x_smem, ready, empty, units, k_tiles, c_tiles, splits,
            per_split, boxes, boxes_h, boxes_w, pad_h, pad_w, dil_h, dil_w, S):  # fmt: skip
    """Per step of each unit in turn: dy's box of the unit's filters and x's box, shifted by
    the unit's tap, of its channels."""
    BOX_N: gl.constexpr = dy_desc.block_type.shape[0]
    BOX_H: gl.constexpr = dy_desc.block_type.shape[1]
    BOX_W: gl.constexpr = dy_desc.block_type.shape[2]
    BLOCK_F: gl.constexpr = dy_desc.block_type.shape[3]
    BLOCK_C: gl.constexpr = x_desc.block_type.shape[3]
    STAGES: gl.constexpr = ready.type.shape[0]
    nbytes: gl.constexpr = dy_desc.block_type.nbytes + x_desc.block_type.nbytes
    it = 0
    for unit in range(gl.program_id(0), units, gl.num_programs(0)):
        tap, k0, c0, split = _unit(unit, k_tiles, c_tiles, splits, BLOCK_F, BLOCK_C)
        r = tap // S
        s = tap - r * S
        first = split * per_split
        last = gl.minimum(first + per_split, boxes)
        for box in range(first, last):
            img, h0, w0 = _box_origin(box, boxes_h, boxes_w, BOX_N, BOX_H, BOX_W)
            stage = it % STAGES
            mbarrier.wait(empty.index(stage), ((it // STAGES) & 1) ^ 1)
            bar = ready.index(stage)
            mbarrier.expect(bar, nbytes)
            tma.async_copy_global_to_shared(dy_desc, [img, h0, w0, k0], bar, dy_smem.index(stage))
            xh = h0 - pad_h + r * dil_h
            xw = w0 - pad_w + s * dil_w
            tma.async_copy_global_to_shared(x_desc, [img, xh, xw, c0], bar, x_smem.index(stage))
            it += 1


@gluon.jit
def _consumer(role: gl.constexpr, dy_smem, x_smem, ready, empty, turn, ws_ptr, units, k_tiles,
              c_tiles, splits, per_split, boxes, K, C):  # fmt: skip
    """Every other unit of the program's (role 0: the first): BLOCK_F filters against
    BLOCK_C channels over the unit's share of the pixels, then its partial sums into the
    workspace. The other role's units only advance the ring position. A unit's products
    start once the other role's previous unit has taken its last stage (its `turn`
    mbarrier): the ring's phases then never run two rounds ahead of this role's waits."""
    PIXELS: gl.constexpr = dy_smem.type.shape[1] * dy_smem.type.shape[2] * dy_smem.type.shape[3]
    BLOCK_F: gl.constexpr = dy_smem.type.shape[4]
    BLOCK_C: gl.constexpr = x_smem.type.shape[4]
    STAGES: gl.constexpr = ready.type.shape[0]
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, BLOCK_C, 16]
    )
    rows = gl.arange(0, BLOCK_F, layout=gl.SliceLayout(1, acc_layout))
    cols = gl.arange(0, BLOCK_C, layout=gl.SliceLayout(0, acc_layout))
    it = 0
    local = 0  # the unit's place among the program's
    for unit in range(gl.program_id(0), units, gl.num_programs(0)):
        tap, k0, c0, split = _unit(unit, k_tiles, c_tiles, splits, BLOCK_F, BLOCK_C)
        first = split * per_split
        steps = gl.minimum(first + per_split, boxes) - first
        if local % 2 == role:
            if local > 0:
                mbarrier.wait(turn.index(1 - role), ((local - 1) // 2) & 1)
            acc = gl.zeros([BLOCK_F, BLOCK_C], gl.float32, acc_layout)
            for step in range(steps):
                at = it + step
                stage = at % STAGES
                mbarrier.wait(ready.index(stage), (at // STAGES) & 1)
                a = dy_smem.index(stage).reshape([PIXELS, BLOCK_F]).permute((1, 0))
                b = x_smem.index(stage).reshape([PIXELS, BLOCK_C])
                acc = warpgroup_mma(a, b, acc, is_async=True)
                acc = warpgroup_mma_wait(1, deps=(acc,))  # the previous step's
                mbarrier.arrive(empty.index((at + STAGES - 1) % STAGES), count=1, pred=step > 0)
            acc = warpgroup_mma_wait(0, deps=(acc,))
            mbarrier.arrive(turn.index(role), count=1)
            mbarrier.arrive(empty.index((it + steps + STAGES - 1) % STAGES), count=1,
                            pred=steps > 0)  # fmt: skip
            # Workspace (taps, splits, K, C): the split finish's (batches, splits, M, N).
            k = k0 + rows
            c = c0 + cols
            base = ws_ptr + ((tap * splits + split) * K).to(gl.int64) * C
            out = base + gl.expand_dims(k, 1) * C + gl.expand_dims(c, 0)
            gl.store(out, acc, mask=gl.expand_dims(k < K, 1) & gl.expand_dims(c < C, 0))
        it += steps
        local += 1


@gluon.jit
def conv_filter_hopper_kernel(dy_desc, x_desc, ws_ptr, units, k_tiles, c_tiles, splits,
                              per_split, boxes, boxes_h, boxes_w, pad_h, pad_w, dil_h, dil_w,
                              S, K, C, STAGES: gl.constexpr):  # fmt: skip
    """Persistent, grid (programs,). dy_desc: dy (N, OH, OW, K) in [BOX_N, BOX_H, BOX_W,
    BLOCK_F] boxes; x_desc: x (N, H, W, C) in boxes of the same pixels and BLOCK_C channels; ws:
    float32 (taps, splits, K, C) partial sums, every element written."""
    dtype: gl.constexpr = dy_desc.dtype
    dy_smem = gl.allocate_shared_memory(dtype, [STAGES] + dy_desc.block_type.shape,
                                        dy_desc.layout)  # fmt: skip
    x_smem = gl.allocate_shared_memory(dtype, [STAGES] + x_desc.block_type.shape,
                                       x_desc.layout)  # fmt: skip
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    gl.warp_specialize(
        [
            (_consumer, (0, dy_smem, x_smem, ready, empty, turn, ws_ptr, units, k_tiles, c_tiles,
                         splits, per_split, boxes, K, C)),
            (_consumer, (1, dy_smem, x_smem, ready, empty, turn, ws_ptr, units, k_tiles, c_tiles,
                         splits, per_split, boxes, K, C)),
            (_loader, (dy_desc, x_desc, dy_smem, x_smem, ready, empty, units, k_tiles, c_tiles,
                       splits, per_split, boxes, boxes_h, boxes_w, pad_h, pad_w, dil_h, dil_w,
                       S)),
        ],
        [4, 1],
        [232, 24],
    )  # fmt: skip


def pixel_box(oh: int, ow: int, pixels: int) -> tuple[int, int, int]:
    """(images, rows, columns) of `pixels` of dy: columns the power of two covering a row (at
    most 64), then rows, then images."""
    box_w = min(64, pixels, triton.next_power_of_2(ow))
    box_h = min(pixels // box_w, triton.next_power_of_2(oh))
    return pixels // (box_w * box_h), box_h, box_w


def plan(x, dy, kernel: tuple[int, int], sms: int, pixels: int, block_f: int, block_c: int):
    """The launch's boxes, units and splits: the split count that takes the least time, in
    steps: waves of units (a multiprocessor runs its units one after another, the two
    consumers' epilogues under each other's products) plus the workspace's traffic (float32
    partials written and summed: about 6.7 / pixels steps of the whole GPU a unit)."""
    n, k, oh, ow = dy.shape
    c = x.shape[1]
    box = pixel_box(oh, ow, pixels)
    boxes_h, boxes_w = triton.cdiv(oh, box[1]), triton.cdiv(ow, box[2])
    boxes = triton.cdiv(n, box[0]) * boxes_h * boxes_w
    tiles = kernel[0] * kernel[1] * triton.cdiv(k, block_f) * triton.cdiv(c, block_c)

    def cost(splits):
        per = triton.cdiv(boxes, splits)
        units = tiles * triton.cdiv(boxes, per)
        return triton.cdiv(units, sms) * per + units * 6.7 / pixels

    best = min(range(1, min(boxes, 64) + 1), key=cost)
    per_split = triton.cdiv(boxes, best)
    splits = triton.cdiv(boxes, per_split)
    return box, boxes, boxes_h, boxes_w, tiles * splits, splits, per_split


def conv_filter_hopper(x, dy, kernel, padding, dilation=1, sms=132, variant=VARIANTS[0],
                       sum_splits=True):  # fmt: skip
    """dW (K, C, R, S) as float32, of a stride-1 convolution of channels-last x and dy."""
    from rtdnn.kernels import conv_hopper as ch

    pixels, block_f, block_c, stages = variant
    n, k, oh, ow = dy.shape
    c = x.shape[1]
    box, boxes, boxes_h, boxes_w, units, splits, per_split = plan(x, dy, kernel, sms, pixels,
                                                                  block_f, block_c)  # fmt: skip
    dy4, x4 = dy.permute(0, 2, 3, 1), x.permute(0, 2, 3, 1)
    dy_desc = ch.descriptor(dy, dy4.shape, dy4.stride(), [*box, block_f])
    x_desc = ch.descriptor(x, x4.shape, x4.stride(), [*box, block_c])
    taps = kernel[0] * kernel[1]
    ws = torch.empty(taps, splits, k, c, dtype=torch.float32, device=x.device)
    conv_filter_hopper_kernel[(min(units, sms),)](
        dy_desc, x_desc, ws, units, triton.cdiv(k, block_f), triton.cdiv(c, block_c), splits,
        per_split, boxes, boxes_h, boxes_w, padding, padding, dilation, dilation, kernel[1],
        k, c, STAGES=stages, num_warps=4, maxnreg=168,
    )  # fmt: skip
    if not sum_splits:
        return ws
    return ws.sum(1).view(kernel[0], kernel[1], k, c).permute(2, 3, 0, 1)


def compile_offline() -> None:
    """Compile each variant for sm_90 without a GPU and report registers and spills."""
    import re

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from sm90_stub import activate, ptxas_log

    activate()
    from rtdnn.kernels import conv_hopper as ch

    for pixels, block_f, block_c, stages in VARIANTS:
        x = torch.empty(8, 14, 14, 256, dtype=torch.bfloat16)
        dy = torch.empty(8, 14, 14, 256, dtype=torch.bfloat16)
        ws = torch.empty(9, 4, 256, 256, dtype=torch.float32)
        box = pixel_box(14, 14, pixels)
        dy_desc = ch.descriptor(dy, dy.shape, dy.stride(), [*box, block_f])
        x_desc = ch.descriptor(x, x.shape, x.stride(), [*box, block_c])
        kernel = conv_filter_hopper_kernel.warmup(
            dy_desc, x_desc, ws, 144, 2, 2, 4, 2, 8, 4, 1, 1, 1, 1, 1, 3, 256, 256,
            STAGES=stages, num_warps=4, maxnreg=168, grid=(1,),
        )  # fmt: skip
        log = ptxas_log(kernel)
        regs = re.findall(r"Used (\d+) registers", log)
        print((pixels, block_f, block_c, stages), "registers", regs,
              "spills", re.findall(r"(\d+) bytes spill stores", log), "smem",
              kernel.metadata.shared, "serialized" if "C7515" in log else "")  # fmt: skip


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
                splits = plan(x, dy, (3, 3), sms, *v[:3])[5]
                cells.append(f"{t:.4f} / {ts:.4f} ({t_cudnn / ts:.2f}x, s{splits}, {err:.0e})")
            except Exception as ex:  # noqa: BLE001
                cells.append(f"FAILED {type(ex).__name__}: {str(ex)[:80]}")
        log(f"| {name} | {t_cudnn:.4f} | {t_rtdnn:.4f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if sys.argv[1:] == ["compile"]:
        compile_offline()
    else:
        gpu(sys.argv[1])
