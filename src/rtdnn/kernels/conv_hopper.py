"""Forward and backward-data convolution for Hopper (sm_90), warp-specialized, in Gluon.

The implicit GEMM of a stride-1 convolution, with every operand moved by the copy engine:
for filter tap (r, s) the input pixels a tile of output pixels reads are the tile itself
shifted by (r, s) times the dilation, less the padding. So a tile of output pixels chosen as
a box [images, rows, columns] of the output has, for each tap, a box of the input of the same
shape as its operand: one TMA copy, with the hardware's zero fill doing the padding. Read
from shared memory as a [pixels, channels] matrix it feeds the warp-group MMA directly (the
box's 128-byte swizzle is the matrix's). The filter operand is a 2-D box of the filter seen
as a (K, taps x C) matrix (TF32 backward-data: a copy seen as (C, taps x K), below).

At stride 2 (forward) a tap's input pixels are every other row and column from the tap's
offset: one of the input's four stride phases, each seen through a descriptor of its own
(rows and columns two apart), in which the pixels are again a box.

Backward-data at stride 1 is the same product: dx's box of pixels reads dy's box shifted the
other way, reduces over the output channels k, and multiplies by the filter's (k, c) block
of the tap, whose c is contiguous: the MMA takes that operand with N innermost. TF32
products cannot read an operand so (both need the reduced dimension innermost): in float32
backward-data reads IMPLICIT_PRECOMP_GEMM's copy of the filter laid out k innermost, then
the taps, then c, as a (C, taps x K) matrix whose rows are the written channels
(W_REDUCED_ROWS off). At stride 2,
dx's pixels split into four stride phases (every other row and column), each reached by a
subset of the taps (data_phase_taps) that reads dy at stride 1: four launches, side by side,
each writing its phase through a strided view of dx.

One program a multiprocessor loops over tiles (persistent) and runs three partitions, as
kernels/attention_hopper.py does:

- **load** (one warp): for each of the program's tiles and each step (a filter tap and a
  chunk of 128 bytes of the reduced channels, or 64 where they are not a multiple of 128),
  the input box and the filter block, by TMA, into a ring of STAGES shared-memory stages. A
  stage is refilled once the consumers that read it released it (an `empty` mbarrier counting
  two arrivals, or one in ping-pong); the copies' completion arrives on its `ready`
  mbarrier. The loader runs ahead into the program's next tile as stages free up.
- **two consumers** (one warp group each): half of the tile's pixels each (half the box's
  images, or half its rows), one step's MMA in flight while the next is issued; then the
  epilogue, alpha * acc (+ beta * the prior output, read by TMA) (+ bias) (relu), written by
  TMA. Pixels and channels outside the output are dropped by the store. Or, ping-pong
  (PINGPONG, 128-pixel tiles in 16-bit data), whole tiles in turn: one consumer's epilogue
  runs while the other multiplies the next tile, which matters where a tile has few steps
  (64 reduced channels, one chunk a tap; the stride phases of backward-data, 1 to 4 taps).

Box shapes (least_waste_box): 128 output pixels (or, in 16-bit data, 256: 128 a consumer),
images, rows and columns each a power of two, chosen to tile the output with the fewest
pixels outside it (at batch 64, ResNet-50's 14x14 outputs in boxes of 32 x 2 x 2 waste none
and its 7x7 ones in 16 x 1 x 8 waste 12.5%, where boxes of whole rows a power of two wide,
the earlier rule, wasted 23% on both).

3-D convolutions at stride 1 are the same product one dimension up: a tile is a box of one
image's depth x rows x columns, the taps run over depth too, and the images are seen through
5-D descriptors (N, D, H, W, channels) whose zero fill pads the depth as well.

Scope (algos/implicit_gemm.py, hopper_unsupported, checks it): 2-D, stride 1 or 2 in each
dimension, or 3-D at stride 1; one group, cross-correlation, 16-bit data or float32 in TF32
math (backward-data on the filter copy above), channels-last tensors a TMA descriptor can
address, the reduced channels (C forward, K backward-data) a multiple of 64 bytes (32 16-bit
channels, 16 of float32), at least 64 written channels, a channels-last filter with dense
taps (or, in TF32 backward-data, the copy).
"""

import math
from typing import NamedTuple

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ..core import cdiv
from .launch import DescriptorView

#: Output pixels a tile (a box of the output): 128, each consumer multiplying 64 of them,
#: or in 16-bit data also 256 (128 a consumer: twice the products per barrier round trip and
#: per filter block loaded, for the tile tuner to weigh against half as many tiles).
BLOCK_M = 128
BLOCK_M_WIDE = 256
#: Shared memory for the operand ring's stages (the epilogue's buffers come on top): 4 stages
#: of 128 pixels x 128 bytes of channels with a 128-wide filter block, 6 with a 64-wide one.
STAGE_BYTES = 144 * 1024
#: Registers a thread at launch (12 warps: two consumer groups and the load warp's group) and
#: in a consumer partition.
LAUNCH_REGISTERS = 168
CONSUMER_REGISTERS = 240


@gluon.jit
def _tile_origin(tile, tiles_n, tiles_d, tiles_h, tiles_w, BOX_N: gl.constexpr,
                 BOX_D: gl.constexpr, BOX_H: gl.constexpr, BOX_W: gl.constexpr,
                 BLOCK_N: gl.constexpr, THREE_D: gl.constexpr):  # fmt: skip
    """(first image, depth, row, column, output channel) of a tile: output-channel tiles
    innermost, then column bands, row bands, depth bands (3-D; one band in 2-D), image groups
    (neighbouring programs share input boxes)."""
    tm = tile // tiles_n
    n0 = (tile - tm * tiles_n) * BLOCK_N
    w0 = tm % tiles_w * BOX_W
    h0 = (tm // tiles_w) % tiles_h * BOX_H
    if THREE_D:
        d0 = (tm // (tiles_w * tiles_h)) % tiles_d * BOX_D
        img = tm // (tiles_w * tiles_h * tiles_d) * BOX_N
    else:
        d0 = 0
        img = tm // (tiles_w * tiles_h) * BOX_N
    return img, d0, h0, w0, n0


@gluon.jit
def _load_partition(x_desc, x1_desc, x2_desc, x3_desc, w_desc, a_smem, b_smem, ready, empty,
                    taps, chunks, tap_cols, taps_hw, taps_w, d0f, dstep, r0, s0, rstep, sstep,
                    shift_d, shift_h, shift_w, step_d, step_h, step_w, stride_h, stride_w,
                    lift, R, S, tiles, tiles_n, tiles_d, tiles_h, tiles_w,
                    W_REDUCED_ROWS: gl.constexpr, STRIDED: gl.constexpr,
                    THREE_D: gl.constexpr):  # fmt: skip
    """For each step of each of this program's tiles: the input box of the step's tap and
    channel chunk, and the filter block of that tap, chunk and the tile's output channels.
    Strided (forward), the tap's input pixels are one stride phase of the input, every
    stride-th row and column from (a, b): a box of that phase's view, x_desc to x3_desc for
    phases (0, 0), (0, 1), (1, 0), (1, 1). THREE_D: boxes of one image's depth x rows x
    columns, the taps in depth too."""
    if THREE_D:  # [1, BOX_D, BOX_H, BOX_W, CHUNK]
        BOX_N: gl.constexpr = 1
        BOX_D: gl.constexpr = x_desc.block_type.shape[1]
        BOX_H: gl.constexpr = x_desc.block_type.shape[2]
        BOX_W: gl.constexpr = x_desc.block_type.shape[3]
        CHUNK: gl.constexpr = x_desc.block_type.shape[4]
    else:  # [BOX_N, BOX_H, BOX_W, CHUNK]
        BOX_N: gl.constexpr = x_desc.block_type.shape[0]
        BOX_D: gl.constexpr = 1
        BOX_H: gl.constexpr = x_desc.block_type.shape[1]
        BOX_W: gl.constexpr = x_desc.block_type.shape[2]
        CHUNK: gl.constexpr = x_desc.block_type.shape[3]
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[W_REDUCED_ROWS * 1]  # [k, n] or [n, k]
    STAGES: gl.constexpr = ready.type.shape[0]
    nbytes: gl.constexpr = x_desc.block_type.nbytes + w_desc.block_type.nbytes
    it = 0
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        img, od, oh, ow, n0 = _tile_origin(tile, tiles_n, tiles_d, tiles_h, tiles_w, BOX_N,
                                           BOX_D, BOX_H, BOX_W, BLOCK_N, THREE_D)  # fmt: skip
        # Taps outside, channel chunks inside: a tap's coordinates are worked out once for
        # its chunks, and before the wait for a free stage rather than after it (the single
        # load warp's arithmetic sits on the path from a stage freed to its refill: ResNet-50's
        # strided 3x3 layers ran up to 13% slower with it per step).
        for tap in range(taps):
            # Tap (u, t, q) of the taps this launch visits (u: 3-D only; taps_hw taps a
            # depth): filter tap (d0f + dstep u, r0 + rstep t, s0 + sstep q), read at
            # (u, t, q) x step from the shift.
            if THREE_D:
                u = tap // taps_hw
                in_plane = tap - u * taps_hw
                d0 = od + shift_d + u * step_d
                r = (d0f + dstep * u) * R + r0
            else:
                in_plane = tap
                r = r0
            t = in_plane // taps_w
            q = in_plane - t * taps_w
            filter_col = ((r + rstep * t) * S + s0 + sstep * q) * tap_cols
            dh = shift_h + t * step_h
            dw = shift_w + q * step_w
            if STRIDED:
                # Output row o reads input row stride * o + dh: phase dh mod stride, row
                # o + floor(dh / stride) of that phase (lifted to stay non-negative).
                dh += stride_h * lift
                dw += stride_w * lift
                phase = (dh % stride_h) * 2 + dw % stride_w
                h0 = oh + dh // stride_h - lift
                w0 = ow + dw // stride_w - lift
            else:
                phase = 0
                h0 = oh + dh
                w0 = ow + dw
            for chunk in range(chunks):
                c0 = chunk * CHUNK
                stage = it % STAGES
                mbarrier.wait(empty.index(stage), ((it // STAGES) & 1) ^ 1)
                bar = ready.index(stage)
                mbarrier.expect(bar, nbytes)
                a = a_smem.index(stage)
                if THREE_D:  # stride 1
                    tma.async_copy_global_to_shared(x_desc, [img, d0, h0, w0, c0], bar, a)
                elif phase == 0:
                    tma.async_copy_global_to_shared(x_desc, [img, h0, w0, c0], bar, a)
                elif phase == 1:
                    tma.async_copy_global_to_shared(x1_desc, [img, h0, w0, c0], bar, a)
                elif phase == 2:
                    tma.async_copy_global_to_shared(x2_desc, [img, h0, w0, c0], bar, a)
                else:
                    tma.async_copy_global_to_shared(x3_desc, [img, h0, w0, c0], bar, a)
                if W_REDUCED_ROWS:  # rows: the reduced channels; columns: this tap's written
                    coords = [c0, filter_col + n0]
                else:  # rows: the written channels; columns: this tap's reduced ones
                    coords = [n0, filter_col + c0]
                tma.async_copy_global_to_shared(w_desc, coords, bar, b_smem.index(stage))
                it += 1


@gluon.jit
def _consumer(half: gl.constexpr, a_smem, b_smem, c_smem, prior_bar, turn, ready, empty,
              y_desc, bias_ptr, alpha, beta, cols, steps, tiles, tiles_n, tiles_d, tiles_h,
              tiles_w, W_REDUCED_ROWS: gl.constexpr, HAS_BIAS: gl.constexpr,
              BETA_NONZERO: gl.constexpr, RELU: gl.constexpr, THREE_D: gl.constexpr,
              PINGPONG: gl.constexpr):  # fmt: skip
    """Half of each tile's pixels (consumer `half` of two), or with PINGPONG every other tile
    whole (consumer 0 the program's first): the products over every step, then the
    epilogue. A ping-pong consumer starts a tile's products once the other has finished the
    previous tile's (the `turn` mbarriers), so the two take the tensor cores in turn and one's
    epilogue runs under the other's products."""
    if THREE_D:  # stages of [1, BOX_D, BOX_H, BOX_W, CHUNK]
        BOX_N: gl.constexpr = 1
        BOX_D: gl.constexpr = a_smem.type.shape[2]
        BOX_H: gl.constexpr = a_smem.type.shape[3]
        BOX_W: gl.constexpr = a_smem.type.shape[4]
        CHUNK: gl.constexpr = a_smem.type.shape[5]
    else:  # stages of [BOX_N, BOX_H, BOX_W, CHUNK]
        BOX_N: gl.constexpr = a_smem.type.shape[1]
        BOX_D: gl.constexpr = 1
        BOX_H: gl.constexpr = a_smem.type.shape[2]
        BOX_W: gl.constexpr = a_smem.type.shape[3]
        CHUNK: gl.constexpr = a_smem.type.shape[4]
    BLOCK_N: gl.constexpr = b_smem.type.shape[1 + W_REDUCED_ROWS * 1]
    STAGES: gl.constexpr = ready.type.shape[0]
    PIXELS: gl.constexpr = BOX_N * BOX_D * BOX_H * BOX_W
    # The pixels this consumer multiplies a tile: half the box, or ping-pong all of it.
    MINE: gl.constexpr = PIXELS if PINGPONG else PIXELS // 2
    # The MMA instruction's reduction: 32 bytes of operands (TF32 products for float32).
    INSTR_K: gl.constexpr = 256 // a_smem.dtype.primitive_bitwidth
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, BLOCK_N, INSTR_K]
    )
    out = c_smem.index(half)
    out2 = out.reshape([MINE, BLOCK_N])
    bar = prior_bar.index(half)
    it = 0  # the ring position of the tile's first step
    local = 0  # the tile's place among the program's
    done = 0
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        if PINGPONG:
            owner = local % 2
        else:
            owner = half
        if owner == half:
            img, od, oh, ow, n0 = _tile_origin(tile, tiles_n, tiles_d, tiles_h, tiles_w, BOX_N,
                                               BOX_D, BOX_H, BOX_W, BLOCK_N, THREE_D)  # fmt: skip
            if PINGPONG:
                if local > 0:  # the other consumer's products of the previous tile are done
                    mbarrier.wait(turn.index(1 - half), ((local - 1) // 2) & 1)
            acc = gl.zeros([MINE, BLOCK_N], gl.float32, acc_layout)
            for step in range(steps):
                at = it + step
                stage = at % STAGES
                mbarrier.wait(ready.index(stage), (at // STAGES) & 1)
                a = a_smem.index(stage).reshape([PIXELS, CHUNK])
                if not PINGPONG:
                    a = a.slice(half * MINE, MINE)
                if W_REDUCED_ROWS:
                    b = b_smem.index(stage)
                else:
                    b = b_smem.index(stage).permute((1, 0))
                acc = warpgroup_mma(a, b, acc, is_async=True)
                acc = warpgroup_mma_wait(1, deps=(acc,))  # the previous step's product is done
                mbarrier.arrive(empty.index((at + STAGES - 1) % STAGES), count=1, pred=step > 0)
            acc = warpgroup_mma_wait(0, deps=(acc,))
            # The last step's stage (none when no tap reaches these pixels: alpha x 0).
            mbarrier.arrive(empty.index((it + steps + STAGES - 1) % STAGES), count=1,
                            pred=steps > 0)  # fmt: skip
            if PINGPONG:
                mbarrier.arrive(turn.index(half), count=1)
                if THREE_D:
                    coords = [img, od, oh, ow, n0]
                else:
                    coords = [img, oh, ow, n0]
            elif THREE_D:  # each half: half the depth, else half the rows
                if BOX_D > 1:
                    coords = [img, od + half * (BOX_D // 2), oh, ow, n0]
                else:
                    coords = [img, od, oh + half * (BOX_H // 2), ow, n0]
            elif BOX_N > 1:  # each half: half the images
                coords = [img + half * (BOX_N // 2), oh, ow, n0]
            else:  # each half: half the rows
                coords = [img, oh + half * (BOX_H // 2), ow, n0]
            acc = acc * alpha
            tma.store_wait(0)  # the last tile's store has read `out`
            if BETA_NONZERO:
                mbarrier.expect(bar, y_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(y_desc, coords, bar, out)
                mbarrier.wait(bar, done & 1)
                # Each thread reads the elements it writes below: no barrier between the two.
                acc = acc + beta * out2.load(acc_layout).to(gl.float32)
            if HAS_BIAS:
                cn = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc_layout))
                bias = gl.load(bias_ptr + cn, mask=cn < cols, other=0.0).to(gl.float32)
                acc = acc + gl.expand_dims(bias, 0)
            if RELU:
                acc = gl.maximum(acc, 0.0)
            out2.store(acc.to(y_desc.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(y_desc, coords, out)
            done += 1
        it += steps
        local += 1
    tma.store_wait(0)


@gluon.jit
def conv_hopper_kernel(
    x_desc, x1_desc, x2_desc, x3_desc, w_desc, y_desc, bias_ptr, alpha, beta, cols, chunks,
    taps, tap_cols, taps_hw, taps_w, d0f, dstep, r0, s0, rstep, sstep, shift_d, shift_h,
    shift_w, step_d, step_h, step_w, stride_h, stride_w, lift, R, S, tiles_n, tiles_d, tiles_h,
    tiles_w, tiles,
    STAGES: gl.constexpr, W_REDUCED_ROWS: gl.constexpr, STRIDED: gl.constexpr,
    HAS_BIAS: gl.constexpr, BETA_NONZERO: gl.constexpr, RELU: gl.constexpr,
    CONSUMER_REGS: gl.constexpr, THREE_D: gl.constexpr, PINGPONG: gl.constexpr = False,
):  # fmt: skip
    """Persistent, grid (programs,). x_desc: the read image (x forward, dy backward-data),
    (N, H, W, channels) in [BOX_N, BOX_H, BOX_W, CHUNK] boxes; w_desc: the filter as a matrix
    of taps x tap_cols columns, in [BLOCK_N, CHUNK] blocks (rows the written channels: forward's
    (K, taps x C); backward-data's (C, taps x K) from a copy with k innermost) or, with
    W_REDUCED_ROWS, [CHUNK, BLOCK_N] blocks (backward-data's (K, taps x C), the filter as
    stored); y_desc: the written image (N, OH, OW, cols) in half boxes. A step: a tap (u, t,
    q) of the taps visited (u = step // chunks // taps_hw, then (t, q) = divmod of the rest
    by taps_w; taps_hw = taps in 2-D), filter tap (d0f + dstep u, r0 + rstep t, s0 + sstep q)
    of a filter (depth x) R x S, read at box origin + shift + (u, t, q) x step, and a chunk
    of CHUNK reduced channels; taps: how many are visited (0: the output is alpha x 0, plus
    beta x its prior value). STRIDED (forward at stride 2 in a dimension): x_desc to x3_desc
    are the input's stride phases (see _load_partition); lift: at least the padding, so that
    a shifted row is never negative before the phase is taken. THREE_D (stride 1): the read
    and written images are (N, D, H, W, channels), in [1, BOX_D, BOX_H, BOX_W, CHUNK] boxes
    and half boxes, tiles_d depth bands of them."""
    dtype: gl.constexpr = w_desc.dtype
    a_smem = gl.allocate_shared_memory(dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    b_smem = gl.allocate_shared_memory(dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    c_smem = gl.allocate_shared_memory(dtype, [2] + y_desc.block_type.shape, y_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    prior_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())  # ping-pong's
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        # One arrival per consumer that reads the stage: both, or ping-pong the tile's own.
        mbarrier.init(empty.index(i), count=1 if PINGPONG else 2)
    for i in gl.static_range(2):
        mbarrier.init(prior_bar.index(i), count=1)
        mbarrier.init(turn.index(i), count=1)
    steps = taps * chunks
    # Constants are written into the partitions' argument lists here: kept in a variable,
    # a tuple's constants would reach the partitions as run-time values.
    gl.warp_specialize(
        [
            (_consumer, (0, a_smem, b_smem, c_smem, prior_bar, turn, ready, empty, y_desc,
                         bias_ptr, alpha, beta, cols, steps, tiles, tiles_n, tiles_d, tiles_h,
                         tiles_w, W_REDUCED_ROWS, HAS_BIAS, BETA_NONZERO, RELU, THREE_D,
                         PINGPONG)),
            (_consumer, (1, a_smem, b_smem, c_smem, prior_bar, turn, ready, empty, y_desc,
                         bias_ptr, alpha, beta, cols, steps, tiles, tiles_n, tiles_d, tiles_h,
                         tiles_w, W_REDUCED_ROWS, HAS_BIAS, BETA_NONZERO, RELU, THREE_D,
                         PINGPONG)),
            (_load_partition, (x_desc, x1_desc, x2_desc, x3_desc, w_desc, a_smem, b_smem,
                               ready, empty, taps, chunks, tap_cols, taps_hw, taps_w, d0f,
                               dstep, r0, s0, rstep, sstep, shift_d, shift_h, shift_w, step_d,
                               step_h, step_w, stride_h, stride_w, lift, R, S, tiles, tiles_n,
                               tiles_d, tiles_h, tiles_w, W_REDUCED_ROWS, STRIDED, THREE_D)),
        ],
        [4, 1],
        [CONSUMER_REGS, 24],
    )  # fmt: skip


def least_waste_box(
    batch: int, out_h: int, out_w: int, pixels: int, halves: bool = False
) -> tuple[int, int, int]:
    """(images, rows, columns) of a box of `pixels` (a power of two) that wastes the fewest
    products on pixels outside a batch x out_h x out_w output, the boxes tiling it with the
    last ones cut; of boxes wasting alike, the one with the longest rows (fewest separate
    runs of memory for the copy engine). At batch 64, 64 pixels: ResNet-50's 7x7 outputs in
    boxes of 64 images of one pixel, 14x14 in 16 x 2 x 2, 28x28 in 4 x 4 x 4, none wasted,
    where boxes of whole rows a power of two wide (the earlier rule) kept 77%, 77% and 88%.
    halves: two or more images or rows, so that each of the forward kernel's consumers
    takes half (half_box)."""
    if pixels < 2 or pixels & (pixels - 1):
        raise ValueError(f"pixels = {pixels}: a power of two, at least 2")

    def covered(box: tuple[int, int, int]) -> int:
        sizes = (batch, out_h, out_w)
        return math.prod(cdiv(size, b) * b for size, b in zip(sizes, box, strict=True))

    shapes = [
        (pixels // (h * w), h, w)
        for w in (1 << i for i in range(pixels.bit_length()))
        for h in (1 << i for i in range((pixels // w).bit_length()))
        if not halves or w < pixels  # two or more images or rows
    ]
    return min(shapes, key=lambda box: (covered(box), -box[2], -box[1]))


def half_box(box: tuple[int, int, int]) -> tuple[int, int, int]:
    """The box of one consumer's pixels: half the images, or half the rows of one."""
    n, h, w = box
    return (n // 2, h, w) if n > 1 else (1, h // 2, w)


class TapRun(NamedTuple):
    """The filter taps along one dimension that one launch visits: `count` taps first,
    first + step_filter, ..., the t-th read at written pixel o + shift + t * step."""

    first: int
    step_filter: int
    count: int
    shift: int
    step: int


def forward_taps(kernel: int, pad: int, dil: int) -> TapRun:
    """Forward (any stride: the stride is taken by the input's phase views): every tap, the
    t-th reading o - pad + t * dil."""
    return TapRun(0, 1, kernel, -pad, dil)


def data_phase_taps(kernel: int, pad: int, dil: int, stride: int, phase: int) -> TapRun:
    """Backward-data, along one dimension, for the input pixels i = stride * o + phase: dx[i]
    gathers dy[(i + pad - r * dil) / stride] over the taps r where that division is exact,
    every stride / gcd(dil, stride)-th tap from the first, and the dy pixel moves by
    (that many taps) x dil / stride from one to the next. No tap: count 0."""
    reach = [r for r in range(kernel) if (phase + pad - r * dil) % stride == 0]
    if not reach:
        return TapRun(0, 1, 0, 0, 0)
    step_filter = reach[1] - reach[0] if len(reach) > 1 else 1
    shift = (phase + pad - reach[0] * dil) // stride
    return TapRun(reach[0], step_filter, len(reach), shift, -(step_filter * dil // stride))


_GLUON_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}
#: (block, dtype) -> the shared-memory layout of a TMA block (microseconds to make).
_layouts: dict[tuple, gl.NVMMASharedLayout] = {}


def descriptor_view(dtype: torch.dtype, shape, strides, block) -> DescriptorView:
    """A TMA descriptor, less its tensor, of data of `dtype` seen with these shape and strides
    (elements, innermost stride 1), in blocks of `block`, with the swizzled layout the MMAs
    read: prepared with a launch, bound to each call's tensor (DescriptorView.bind)."""
    key = (tuple(block), dtype)
    layout = _layouts.get(key)
    if layout is None:
        layout = _layouts[key] = gl.NVMMASharedLayout.get_default_for(
            list(block), _GLUON_DTYPES[dtype]
        )
    return DescriptorView(shape, strides, block, layout)


def descriptor(t: torch.Tensor, shape, strides, block) -> TensorDescriptor:
    """Triton's TMA descriptor of t's data (descriptor_view's, bound to t and checked)."""
    return descriptor_view(t.dtype, shape, strides, block).bind(t).materialize()


#: Bytes of reduced channels a step can take, widest first: a swizzled row of 128 bytes (the
#: TMA's widest), else of 64 where the layer's channels are not a multiple of 128 bytes (96,
#: 160, 288 16-bit channels), so that no step reads past a tap's channels. Narrower rows
#: (32 bytes: 16-bit products of one k-step) were not measured and are not offered.
CHUNK_BYTES = (128, 64)


def chunk(dtype: torch.dtype, reduced: int | None = None) -> int | None:
    """Reduced channels a step: the widest of CHUNK_BYTES whose channels divide `reduced`
    (the reduced channels, C forward and K backward-data; None: the widest), None if none
    does (64 or 32 16-bit channels, 32 or 16 of float32)."""
    for nbytes in CHUNK_BYTES:
        channels = nbytes // dtype.itemsize
        if reduced is None or reduced % channels == 0:
            return channels
    return None


def stages_for(block_m: int, block_n: int, block_k: int, itemsize: int) -> int:
    """Stages of the operand ring in STAGE_BYTES, a stage being a box of block_m pixels and a
    filter block of block_n channels, block_k reduced channels each: 4 of 32 KiB with 128
    pixels and 128 output channels in 16-bit data (160 KiB with the epilogue's buffers; 192
    in float32), 6 of 24 KiB with 64 channels, 9 of 16 KiB on 64-byte rows, 3 of 48 KiB with
    256 pixels (208 KiB)."""
    return STAGE_BYTES // ((block_m + block_n) * block_k * itemsize)
