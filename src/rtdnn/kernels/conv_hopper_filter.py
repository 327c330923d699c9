"""Backward-filter (the weight gradient) for Hopper (sm_90), warp-specialized, in Gluon.

dW[k, c, r, s] = sum over dy's pixels p of dy[p, k] x[p moved to tap (r, s), c]: a GEMM per
filter tap with a small output (K x C) and a huge reduction (every pixel of the batch). As in
the forward kernel (kernels/conv_hopper.py), a box of pixels [images, rows, columns] of dy
has, for each tap, a box of x of the same shape as its partner: the box shifted by the tap
times the dilation, less the padding, the copy engine's zero fill doing the padding. At stride
2 the tap's pixels are a box of one of x's four stride phases (a descriptor each, as forward).

dy's boxes tile it with the fewest pixels outside it (conv_hopper.least_waste_box): a box may
span images, rows and columns each a power of two (16 images x 2 rows x 2 columns on 14x14),
as the reduction runs over every pixel of the batch in any order.

A work unit is (tap, BLOCK_F filters, BLOCK_C channels, a share of dy's pixel boxes: a split
of the reduction). A step multiplies dy's box, read from shared memory as the MMA's A operand
transposed (filters x pixels), by x's box (pixels x channels) into a BLOCK_F x BLOCK_C float32
accumulator. Units run taps innermost and splits outermost (_unit), so that the programs
running at once share their boxes in L2.

One program a multiprocessor loops over units (persistent) and runs three partitions:

- **load** (one warp): per step of each unit in turn, dy's box of the unit's filters and x's
  box of its channels at the unit's tap, by TMA, into a ring of STAGES stages.
- **two consumers** (one warp group each), in one of two ways:
  - *ping-pong* (128 x 128 units, or 64 wide where a layer has no more): each takes whole
    units, alternately: one finishes a unit
    while the other multiplies the next, so the epilogue costs no tensor-core time. A
    consumer starts a unit's products once the other has taken the last stage of the previous
    unit (the `turn` mbarriers): the ring then never runs two rounds ahead of a consumer's
    waits.
  - *cooperative* (128 x 256 units): both work on every unit, each on 64 of its filters (a
    box of dy of its own) against all 256 channels (x's box, shared): a 64 x 256 MMA, the
    widest the warp group has, which reads the fewest operand bytes from shared memory per
    product; a step moves 48 KiB by TMA for twice the products of a ping-pong step's 32 KiB.
    Its epilogue is not hidden: it comes first on long plans only (cooperative_first).

**Float32 data in TF32 math.** TF32 products read both operands with the reduced dimension
(here the pixels) innermost, which channels-last x and dy do not hold. A consumer step loads
dy's box from shared memory into registers, transposed, as the MMA's A operand (an A operand
in registers has no layout to keep), and copies x's box through registers into a buffer of
its own with the pixels innermost (two a consumer, alternate steps) that the MMA reads as B.
The ring's stage is free once both are taken; a step is 32 pixels (128 bytes of float32, the
transposed buffer's swizzled row). In the cooperative unit both consumers multiply the same
transposed box of x's 256 channels: each copies half of it, and two mbarriers a buffer say
when both halves are written (`xt_full`) and when both products that read it are done
(`xt_free`).

The epilogue: unsplit, alpha x dW (+ beta x its prior value) into the filter. Split, each
unit's partial sums go to the workspace (taps, splits, K, C) in float32, and the split
finish (a launch of its own, kernels/brgemm.py) adds them in split order. Summed in the
kernel by the last unit of a tile to arrive, the finish ran on one warp group a tile, after
every other: ResNet-50's l2.x.conv2 (9 tiles in 14 splits) took 0.054 ms against 0.046
with a launch of its own (H200, bf16).

Scope (algos/implicit_gemm.py, hopper_unsupported): 2-D filters, stride 1 or 2, one group,
x and dy channels-last with 16-byte aligned strides, at least 64 filters and channels (units
64 filters or channels wide where a layer has no more); in 16-bit data filters of more than
one tap (a 1x1 layer's weight gradient is a plain GEMM, which kernels/gemm_tma.py serves).
"""

from typing import NamedTuple

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

#: dy's pixels a step (a box), filters and channels a ping-pong unit, its ring stages (32 KiB
#: each). Chosen on an H200 (bf16, ResNet-50's and VGG-16's 3x3 layers) among 64 or 128
#: pixels a step and 128 x 128 or 64 x 256 units: 64 pixels and 128 x 128 ran fastest on the
#: small images, within 7% of the best on the large ones
#: (benchmarks/probes/conv_hopper_filter_probe.py).
PIXELS = 64
BLOCK_F = 128
BLOCK_C = 128
STAGES = 6
#: Channels of a cooperative unit (its filters: BLOCK_F) and its ring stages (48 KiB each).
COOPERATIVE_BLOCK_C = 256
COOPERATIVE_STAGES = 4
#: A cooperative step's time in ping-pong steps, for split_plan: twice the products in 0.7
#: to 0.8 of the time where ping-pong waits on L2 (H200, bf16, VGG-16's 28x28 and 56x56
#: layers: benchmarks/results/conv_hopper_filter_units_h200.md).
COOPERATIVE_STEP = 1.6
#: Ping-pong plans shorter than this (steps a multiprocessor) keep ping-pong first: there
#: the cooperative unit's unhidden epilogue, and fewer units to spread over the
#: multiprocessors, cost more than its lighter traffic saves. Measured on an H200 (bf16, 27
#: layers, least-waste boxes): every cooperative win had a ping-pong plan of 77 steps or
#: more, every loss 56 or fewer (or a dearer cooperative plan: 320 or 384 channels).
COOPERATIVE_FROM = 64
#: float32 data in TF32 math: dy's pixels a step (128 bytes of them, the row of the
#: transposed x box the MMA reads) and the ring's stages (32 KiB each, beside the consumers'
#: transposed boxes, 64 KiB).
TF32_PIXELS = 32
TF32_STAGES = 5
#: The cooperative unit's stages in float32 (48 KiB each, beside x's two transposed boxes of
#: 256 channels, 64 KiB).
TF32_COOPERATIVE_STAGES = 3
#: Registers a thread at launch, and in a consumer partition (a 128 x 128 float32
#: accumulator is 128 of them).
LAUNCH_REGISTERS = 168
CONSUMER_REGISTERS = 232


@gluon.jit
def _unit(unit, taps, k_tiles, c_tiles, BLOCK_F: gl.constexpr, BLOCK_C: gl.constexpr):
    """(tap, first filter, first channel, split) of a work unit: taps innermost, then channel
    and filter tiles, splits outermost. The units that run at once (a wave of programs) then
    share their boxes: dy's across a filter tile's taps, x's shifted by a pixel from tap to
    tap, all within one split's share of the pixels, which L2 holds where the whole of x and
    dy does not."""
    tap = unit % taps
    rest = unit // taps
    c0 = rest % c_tiles * BLOCK_C
    rest = rest // c_tiles
    k0 = rest % k_tiles * BLOCK_F
    return tap, k0, c0, rest // k_tiles


@gluon.jit
def _box_origin(box, boxes_h, boxes_w, BOX_N: gl.constexpr, BOX_H: gl.constexpr,
                BOX_W: gl.constexpr):  # fmt: skip
    """(first image, row, column) of dy's pixel box `box`."""
    w0 = box % boxes_w * BOX_W
    h0 = (box // boxes_w) % boxes_h * BOX_H
    return box // (boxes_w * boxes_h) * BOX_N, h0, w0


@gluon.jit
def _load_partition(dy_desc, x_desc, x1_desc, x2_desc, x3_desc, dy_smem, x_smem, ready, empty,
                    units, k_tiles, c_tiles, splits, per_split, boxes, boxes_h, boxes_w, pad_h,
                    pad_w, dil_h, dil_w, stride_h, stride_w, lift, S,
                    STRIDED: gl.constexpr):  # fmt: skip
    """Per step of each of this program's units: dy's box of the unit's filters (cooperative:
    two boxes, one for each consumer's half), and x's box of its channels at the unit's tap.
    Strided, the tap's pixels are a box of one stride phase of x (x_desc to x3_desc: phases
    (0, 0), (0, 1), (1, 0), (1, 1))."""
    BOX_N: gl.constexpr = dy_desc.block_type.shape[0]
    BOX_H: gl.constexpr = dy_desc.block_type.shape[1]
    BOX_W: gl.constexpr = dy_desc.block_type.shape[2]
    STAGES: gl.constexpr = ready.type.shape[0]
    DY_BOXES: gl.constexpr = dy_smem.type.shape[0] // STAGES
    F_BOX: gl.constexpr = dy_desc.block_type.shape[3]
    BLOCK_F: gl.constexpr = DY_BOXES * F_BOX
    BLOCK_C: gl.constexpr = x_desc.block_type.shape[3]
    nbytes: gl.constexpr = DY_BOXES * dy_desc.block_type.nbytes + x_desc.block_type.nbytes
    taps = units // (k_tiles * c_tiles * splits)
    it = 0
    for unit in range(gl.program_id(0), units, gl.num_programs(0)):
        tap, k0, c0, split = _unit(unit, taps, k_tiles, c_tiles, BLOCK_F, BLOCK_C)
        r = tap // S
        # dy pixel o reads x pixel stride * o + dh: with the lift (at least the padding) dh
        # is never negative, and its phase is dh mod stride, its row there o + dh // stride.
        dh = (r * dil_h - pad_h) + stride_h * lift
        dw = ((tap - r * S) * dil_w - pad_w) + stride_w * lift
        phase = (dh % stride_h) * 2 + dw % stride_w
        dh = dh // stride_h - lift
        dw = dw // stride_w - lift
        first = split * per_split
        for box in range(first, gl.minimum(first + per_split, boxes)):
            img, h0, w0 = _box_origin(box, boxes_h, boxes_w, BOX_N, BOX_H, BOX_W)
            stage = it % STAGES
            mbarrier.wait(empty.index(stage), ((it // STAGES) & 1) ^ 1)
            bar = ready.index(stage)
            mbarrier.expect(bar, nbytes)
            for i in gl.static_range(DY_BOXES):
                tma.async_copy_global_to_shared(dy_desc, [img, h0, w0, k0 + i * F_BOX], bar,
                                                dy_smem.index(stage * DY_BOXES + i))  # fmt: skip
            a = x_smem.index(stage)
            at = [img, h0 + dh, w0 + dw, c0]
            if STRIDED:
                if phase == 0:
                    tma.async_copy_global_to_shared(x_desc, at, bar, a)
                elif phase == 1:
                    tma.async_copy_global_to_shared(x1_desc, at, bar, a)
                elif phase == 2:
                    tma.async_copy_global_to_shared(x2_desc, at, bar, a)
                else:
                    tma.async_copy_global_to_shared(x3_desc, at, bar, a)
            else:
                tma.async_copy_global_to_shared(x_desc, at, bar, a)
            it += 1


@gluon.jit
def _write_filter(dw_ptr, values, k, c, tap, S, K, C, sk, sc, sr, ss, alpha, beta,
                  BETA_NONZERO: gl.constexpr):  # fmt: skip
    """dW[k, c, tap] = alpha x values (+ beta x its prior value), rows k and columns c inside
    the filter."""
    r = tap // S
    at = dw_ptr + (r * sr + (tap - r * S) * ss) + gl.expand_dims(k * sk, 1)
    at = at + gl.expand_dims(c * sc, 0)
    inside = gl.expand_dims(k < K, 1) & gl.expand_dims(c < C, 0)
    out = values * alpha
    if BETA_NONZERO:
        out = out + beta * gl.load(at, mask=inside, other=0.0).to(gl.float32)
    gl.store(at, out.to(dw_ptr.dtype.element_ty), mask=inside)


@gluon.jit
def _consumer(role: gl.constexpr, dy_smem, x_smem, xt_smem, ready, empty, turn, xt_full,
              xt_free, dw_ptr, ws_ptr, alpha, beta, units, k_tiles, c_tiles, splits, per_split,
              boxes, S, K, C, sk, sc, sr, ss, BETA_NONZERO: gl.constexpr):  # fmt: skip
    """Ping-pong: every other unit of the program's (role 0: the first), all its filters; the
    other role's units only advance the ring position. Cooperative (two boxes of dy a
    stage): every unit, its filters F_BOX x role to F_BOX x (role + 1). Then: the products
    over the unit's share of the pixels, and the epilogue."""
    STAGES: gl.constexpr = ready.type.shape[0]
    DY_BOXES: gl.constexpr = dy_smem.type.shape[0] // STAGES
    COOPERATIVE: gl.constexpr = DY_BOXES == 2
    ROUNDS: gl.constexpr = 1 if COOPERATIVE else 2  # the consumers a unit goes to in turn
    MY_TURN: gl.constexpr = 0 if COOPERATIVE else role
    HALF: gl.constexpr = role if COOPERATIVE else 0  # this consumer's box of dy
    PIXELS: gl.constexpr = dy_smem.type.shape[1] * dy_smem.type.shape[2] * dy_smem.type.shape[3]
    F_BOX: gl.constexpr = dy_smem.type.shape[4]  # the filters this consumer multiplies
    BLOCK_C: gl.constexpr = x_smem.type.shape[4]
    TF32: gl.constexpr = dy_smem.dtype == gl.float32
    # The MMA instruction's reduction: 32 bytes of operands (TF32 products for float32).
    INSTR_K: gl.constexpr = 256 // dy_smem.dtype.primitive_bitwidth
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[gl.num_warps(), 1], instr_shape=[16, BLOCK_C, INSTR_K]
    )
    # TF32: dy's box as the MMA's A operand in registers; x's box read with a lane a pixel
    # and four channels a thread, so that each of a warp's stores into the transposed buffer
    # writes one 128-byte row of it (a channel's 32 pixels).
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=1)
    x_layout: gl.constexpr = gl.BlockedLayout([1, 4], [32, 1], [1, gl.num_warps()], [1, 0])
    # The channels of x's box this consumer copies (cooperative: its half).
    COPY_C: gl.constexpr = BLOCK_C // 2 if COOPERATIVE else BLOCK_C
    rows = gl.arange(0, F_BOX, layout=gl.SliceLayout(1, acc_layout))
    cols = gl.arange(0, BLOCK_C, layout=gl.SliceLayout(0, acc_layout))
    plane = K.to(gl.int64) * C
    taps = units // (k_tiles * c_tiles * splits)
    it = 0
    local = 0  # the unit's place among the program's
    own = 0  # TF32: this consumer's steps so far, whose parity picks its transposed buffer
    for unit in range(gl.program_id(0), units, gl.num_programs(0)):
        tap, k0, c0, split = _unit(unit, taps, k_tiles, c_tiles, DY_BOXES * F_BOX, BLOCK_C)
        first = split * per_split
        steps = gl.minimum(first + per_split, boxes) - first
        if local % ROUNDS == MY_TURN:
            if ROUNDS == 2:
                if local > 0:
                    mbarrier.wait(turn.index(1 - role), ((local - 1) // 2) & 1)
            acc = gl.zeros([F_BOX, BLOCK_C], gl.float32, acc_layout)
            if TF32 and COOPERATIVE:
                for step in range(steps):
                    at = it + step
                    stage = at % STAGES
                    buf = own % 2
                    use = (own // 2) & 1  # how often this buffer was filled before, mod 2
                    mbarrier.wait(ready.index(stage), (at // STAGES) & 1)
                    # Both products that read this buffer two steps back are done.
                    mbarrier.wait(xt_free.index(buf), use ^ 1)
                    half = xt_smem.index(buf).slice(role * COPY_C, COPY_C, dim=0)
                    x = x_smem.index(stage).reshape([PIXELS, BLOCK_C])
                    half.permute((1, 0)).store(x.slice(role * COPY_C, COPY_C, dim=1).load(x_layout))
                    fence_async_shared()  # the MMAs read through the async proxy
                    mbarrier.arrive(xt_full.index(buf), count=1)  # this half written
                    mbarrier.wait(xt_full.index(buf), use)  # and the other consumer's
                    dy_t = dy_smem.index(stage * 2 + HALF).reshape([PIXELS, F_BOX])
                    a = dy_t.permute((1, 0)).load(a_layout)
                    acc = warpgroup_mma(a, xt_smem.index(buf).permute((1, 0)), acc,
                                        is_async=True)  # fmt: skip
                    mbarrier.arrive(empty.index(stage), count=1)  # this consumer's boxes taken
                    acc = warpgroup_mma_wait(0, deps=(acc,))
                    mbarrier.arrive(xt_free.index(buf), count=1)
                    own += 1
            elif TF32:
                for step in range(steps):
                    at = it + step
                    stage = at % STAGES
                    mbarrier.wait(ready.index(stage), (at // STAGES) & 1)
                    gl.static_assert(not COOPERATIVE, "TF32 runs ping-pong units")
                    dy_t = dy_smem.index(stage).reshape([PIXELS, F_BOX]).permute((1, 0))
                    a = dy_t.load(a_layout)
                    # (pixels, channels) view of a buffer that holds the pixels innermost
                    xt = xt_smem.index(2 * role + own % 2).permute((1, 0))
                    xt.store(x_smem.index(stage).reshape([PIXELS, BLOCK_C]).load(x_layout))
                    fence_async_shared()  # the MMA reads through the async proxy
                    gl.thread_barrier()  # every warp's rows of the buffer written
                    acc = warpgroup_mma(a, xt, acc, is_async=True)
                    mbarrier.arrive(empty.index(stage), count=1)  # both boxes taken
                    # Done before the next step writes the other buffer, and before a's
                    # registers are reused.
                    acc = warpgroup_mma_wait(0, deps=(acc,))
                    own += 1
                if ROUNDS == 2:
                    mbarrier.arrive(turn.index(role), count=1)
            else:
                for step in range(steps):
                    at = it + step
                    stage = at % STAGES
                    mbarrier.wait(ready.index(stage), (at // STAGES) & 1)
                    a = dy_smem.index(stage * DY_BOXES + HALF).reshape([PIXELS, F_BOX])
                    b = x_smem.index(stage).reshape([PIXELS, BLOCK_C])
                    acc = warpgroup_mma(a.permute((1, 0)), b, acc, is_async=True)
                    acc = warpgroup_mma_wait(1, deps=(acc,))  # the previous product is done
                    mbarrier.arrive(empty.index((at + STAGES - 1) % STAGES), count=1,
                                    pred=step > 0)  # fmt: skip
                acc = warpgroup_mma_wait(0, deps=(acc,))
                if ROUNDS == 2:
                    mbarrier.arrive(turn.index(role), count=1)
                mbarrier.arrive(empty.index((it + steps + STAGES - 1) % STAGES), count=1,
                                pred=steps > 0)  # fmt: skip
            k = k0 + HALF * F_BOX + rows
            c = c0 + cols
            if splits == 1:
                _write_filter(dw_ptr, acc, k, c, tap, S, K, C, sk, sc, sr, ss, alpha, beta,
                              BETA_NONZERO)  # fmt: skip
            else:  # the partial sums, for the split finish
                part = ws_ptr + (tap * splits + split) * plane
                inside = gl.expand_dims(k < K, 1) & gl.expand_dims(c < C, 0)
                gl.store(part + gl.expand_dims(k * C, 1) + gl.expand_dims(c, 0), acc, mask=inside)
        it += steps
        local += 1


@gluon.jit
def conv_filter_hopper_kernel(
    dy_desc, x_desc, x1_desc, x2_desc, x3_desc, dw_ptr, ws_ptr, alpha, beta,
    units, k_tiles, c_tiles, splits, per_split, boxes, boxes_h, boxes_w, pad_h, pad_w, dil_h,
    dil_w, stride_h, stride_w, lift, S, K, C, sk, sc, sr, ss,
    STAGES: gl.constexpr, COOPERATIVE: gl.constexpr, STRIDED: gl.constexpr,
    BETA_NONZERO: gl.constexpr, CONSUMER_REGS: gl.constexpr,
):  # fmt: skip
    """Persistent, grid (programs,). dy_desc: dy (N, OH, OW, K) in [BOX_N, BOX_H, BOX_W,
    F_BOX] boxes (a unit's BLOCK_F filters: cooperative, two boxes; else one); x_desc: x (N,
    H, W, C) (strided: to x3_desc, its stride phases) in boxes of the same pixels and BLOCK_C
    channels; dw: the filter (K, C, R, S) at element strides (sk, sc, sr, ss); units: taps x
    k_tiles x c_tiles tiles x splits, each split per_split of the boxes (the last fewer); ws:
    float32 (taps, splits, K, C) partials, written when split (the split finish,
    kernels/brgemm.py, sums them); lift: at least the padding."""
    dtype: gl.constexpr = dy_desc.dtype
    DY_BOXES: gl.constexpr = 2 if COOPERATIVE else 1
    dy_smem = gl.allocate_shared_memory(dtype, [STAGES * DY_BOXES] + dy_desc.block_type.shape,
                                        dy_desc.layout)  # fmt: skip
    x_smem = gl.allocate_shared_memory(dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    # TF32: x's box transposed, pixels innermost: two buffers for each consumer, or, in the
    # cooperative unit, two that both share.
    if dtype == gl.float32:
        PIXELS: gl.constexpr = (
            x_desc.block_type.shape[0] * x_desc.block_type.shape[1] * x_desc.block_type.shape[2]
        )
        xt_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32)
        xt_smem = gl.allocate_shared_memory(
            dtype, [2 * (2 // DY_BOXES), x_desc.block_type.shape[3], PIXELS], xt_layout
        )
    else:
        xt_smem = x_smem  # not read
    xt_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    xt_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())  # ping-pong's
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=DY_BOXES)  # released by each consumer of the step
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
        mbarrier.init(xt_full.index(i), count=2)  # cooperative TF32: one arrival a consumer
        mbarrier.init(xt_free.index(i), count=2)
    # Constants written into the argument lists (see conv_hopper_kernel).
    gl.warp_specialize(
        [
            (_consumer, (0, dy_smem, x_smem, xt_smem, ready, empty, turn, xt_full,
                         xt_free, dw_ptr, ws_ptr, alpha, beta, units, k_tiles, c_tiles, splits,
                         per_split, boxes, S, K, C, sk, sc, sr, ss, BETA_NONZERO)),
            (_consumer, (1, dy_smem, x_smem, xt_smem, ready, empty, turn, xt_full,
                         xt_free, dw_ptr, ws_ptr, alpha, beta, units, k_tiles, c_tiles, splits,
                         per_split, boxes, S, K, C, sk, sc, sr, ss, BETA_NONZERO)),
            (_load_partition, (dy_desc, x_desc, x1_desc, x2_desc, x3_desc, dy_smem, x_smem,
                               ready, empty, units, k_tiles, c_tiles, splits, per_split, boxes,
                               boxes_h, boxes_w, pad_h, pad_w, dil_h, dil_w, stride_h,
                               stride_w, lift, S, STRIDED)),
        ],
        [4, 1],
        [CONSUMER_REGS, 24],
    )  # fmt: skip


class SplitPlan(NamedTuple):
    """How a weight gradient's reduction is split, and the model's time for it."""

    splits: int
    per_split: int  #: dy's boxes a split (the last fewer)
    cost: float  #: in ping-pong steps of one multiprocessor


def split_plan(tiles: int, boxes: int, programs: int, most: int,
               cooperative: bool = False) -> SplitPlan:  # fmt: skip
    """The split of `boxes` pixel boxes for `tiles` output tiles (ping-pong's 128 x 128, or
    cooperative 128 x 256) on `programs` multiprocessors, at most `most` splits: the count of
    least time, a multiprocessor running its units one after another (waves of units, each
    `boxes a split` steps, a cooperative step COOPERATIVE_STEP ping-pong steps) plus the
    partials' traffic (float32 written and summed: about 6.7 / PIXELS steps of the whole GPU
    a 128 x 128 unit's partials, a 128 x 128 x 64 step against 128 KiB written and read at
    about 3 TB/s on an H200). Measured on 16-bit 128-wide units; TF32 steps (half the
    pixels at half the rate) and 64-wide units use it as it is."""
    step, width = (COOPERATIVE_STEP, 2) if cooperative else (1.0, 1)

    def cost(splits: int) -> float:
        per = triton.cdiv(boxes, splits)
        units = tiles * triton.cdiv(boxes, per)
        traffic = units * width * 6.7 / PIXELS if splits > 1 else 0.0
        return triton.cdiv(units, programs) * per * step + traffic

    best = min(range(1, max(1, min(boxes, most)) + 1), key=cost)
    per_split = triton.cdiv(boxes, best)
    return SplitPlan(triton.cdiv(boxes, per_split), per_split, cost(best))


def cooperative_first(pingpong: SplitPlan, cooperative: SplitPlan) -> bool:
    """Whether the cooperative unit is the untuned choice, given both units' split plans."""
    return pingpong.cost >= COOPERATIVE_FROM and cooperative.cost < pingpong.cost
