"""IMPLICIT_GEMM: the batch-reduce GEMM reads its operands straight from x, w and dy, with the
im2col addresses computed in the kernel. No workspace, every direction. On Hopper GPUs, 2-D
channels-last convolutions in 16-bit data or float32 under TF32 math run the warp-specialized
kernels instead where they apply (kernels/conv_hopper.py forward and backward-data,
kernels/conv_hopper_filter.py the weight gradient; hopper_unsupported says where not).

IMPLICIT_GEMM_SPLIT_K: forward and backward-filter. When the output has too few tiles to fill
the GPU (backward-filter's K/g x C/g per filter tap with a reduction over every pixel; forward on
small late-stage images) the reduction is split among several programs that write float32
partial sums to a workspace, summed afterwards in a fixed order (deterministic).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import os
from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..core import INTERPRETED, ConvProblem, Direction, TensorDesc, cdiv, tma_aligned
from ..core.handle import run_concurrently, stream_counters
from ..core.tensor import contiguous_strides
from ..kernels import conv_addressing as ca
from ..kernels import conv_tma, strided
from ..kernels.brgemm import identity
from ..kernels.conv_addressing import DataGeometry
from ..kernels.launch import (
    BrgemmLaunch,
    KernelLaunch,
    MatrixLayout,
    Operand,
    Output,
    TileConfig,
    TmaGemmLaunch,
    TmaGemmTiles,
    slot_launch,
    split_finish,
)
from ..kernels.strided import StridedGeometry
from .base import ConvAlgorithm, ConvTensors, Runner, epilogue_activation
from .geometry import (
    before_hopper,
    brgemm_precision,
    conv_geometry,
    data_phases,
    dot_precision,
    multiprocessor_count,
    parallel_slots,
    share_programs,
    shared_memory_bytes,
    static_phase_taps,
    static_taps,
)
from .tiles import gemm_candidates, tma_gemm_candidates, tma_gemm_programs, tma_gemm_usable

#: A packed TF32 weight gradient with more (tap, channel) columns than this tries TF32
#: products first (ImplicitGemm.tile_candidates).
TF32_FIRST_ABOVE_COLUMNS = 64
#: Below this many channels per group, forward and backward-filter pack (tap, channel) into
#: one reduction (or column) index rather than giving each tap its own mostly empty chunk.
PACK_BELOW = 16


def packed(p: ConvProblem) -> bool:
    return p.direction != Direction.BACKWARD_DATA and p.in_channels // p.groups < PACK_BELOW


def gemm_shape(p: ConvProblem) -> tuple[int, int, int, int]:
    """(rows, cols, reduction chunk length, batch entries) of each direction's GEMM."""
    g = p.groups
    cg, kg = p.in_channels // g, p.out_channels // g
    taps = math.prod(p.kernel)
    pixels = p.batch * math.prod(p.out_spatial)
    if p.direction == Direction.FORWARD:
        return pixels, kg, taps * cg if packed(p) else cg, g
    if p.direction == Direction.BACKWARD_DATA:
        return p.batch * math.prod(p.in_spatial), cg, kg, g
    if packed(p):
        return kg, taps * cg, pixels, g
    return kg, cg, pixels, g * taps


#: At most this many splits: the last program of a tile to finish sums every split's partial
#: tile alone, so the finish grows with the splits while the work per split shrinks. On an
#: H100 a 64 x 256 filter gradient over 200k pixels took 0.12-0.18 ms in 132 splits and
#: 0.066 ms in 32 (benchmarks/probes/filter_split_probe.py).
MAX_SPLITS = 32


def _output_tiles(p: ConvProblem) -> int:
    """The GEMM's output as 128 x 128 tiles, over every batch entry."""
    rows, cols, _, batches = gemm_shape(p)
    return cdiv(rows, 128) * cdiv(cols, 128) * batches


def split_count(p: ConvProblem) -> int:
    """Reduction splits, each with a long enough share of the reduction (16 chunks of 64 on
    a GPU; small on the CPU so tests split too; counted over every tap, so a strided
    backward-data's phases, each with some of the taps, get less), at most MAX_SPLITS: on a
    GPU as many as that allows while the programs do not exceed parallel_slots, else
    programs that fill whole waves of the device.

    A wave is one program per multiprocessor (half of parallel_slots: the 128 x 128 tiles
    take 169 registers a thread, one program a multiprocessor). Splits s of T tiles run
    cdiv(T x s, wave) waves of 1/s of the work each: the count of least time, or the fewest
    splits within 5% of it (fewer partial sums to add). The former count, cdiv(slots, T),
    ran a nearly empty last wave on most layers (9 tiles x 30 splits = 270 programs on 132
    multiprocessors). Measured on an H200, bf16 backward-filter: at the best tile
    (benchmarks/probes/gpu_split_waves.sh) deepbench's db24 0.128 -> 0.107 ms (30 -> 14
    splits), db56 0.186 -> 0.162 (11 -> 5), ResNet-50's l3.x.conv2 0.063 -> 0.057 (8 -> 7),
    VGG-16's conv512_512_14 0.189 -> 0.181 (2 -> 7); in the suites (shipped tiles,
    split_ab.py) VGG-16's split 3x3 layers 1.2x to 1.4x faster, ResNet-50's late 1x1 layers
    up to 1.4x. Its early 1x1 layers (1 to 8 tiles) ran slower in whole waves (l2.0.down
    0.045 -> 0.066 ms in 16 splits instead of 32): their smaller tiles hold several
    programs a multiprocessor, so there every split the reduction allows stays."""
    depth = gemm_shape(p)[2]
    if p.direction != Direction.BACKWARD_FILTER and not packed(p):
        depth *= math.prod(p.kernel)  # forward and backward-data reduce over the taps too
    most = max(1, min(depth // (16 * 64 if p.device == "cuda" else 32), MAX_SPLITS))
    tiles, slots = _output_tiles(p), parallel_slots(p.device)
    if p.device != "cuda":  # the interpreter: splits for the tests, time aside
        return max(1, min(cdiv(slots, tiles), most))
    if tiles * most <= slots:
        return most  # even the most splits leave the device room: take them all
    wave = max(1, slots // 2)
    time = {s: cdiv(tiles * s, wave) / s for s in range(1, most + 1)}
    least = min(time.values())
    return min(s for s, t in time.items() if t <= 1.05 * least)


def split_k_preferred(p: ConvProblem) -> bool:
    """Whether `auto` should try IMPLICIT_GEMM_SPLIT_K before the unsplit kernel: for a
    weight gradient whenever its reduction splits (a small output, a reduction over every
    pixel); in forward and backward-data on a GPU only where the output's 128 x 128 tiles
    fill less than half the multiprocessors and the reduction splits. Measured on an H200
    (bf16, first tiles; BENCHMARKS.md, "Skinny layers split"): deepbench_train's late layers
    at batch 8 and 16 (7 to 52 tiles, reductions of 2,048 to 20,800) ran 1.2x to 6.5x faster
    split in forward, on all ten, and 1.1x to 2.1x in backward-data, on all seven;
    resnet50's layers at batch 64 (100 tiles and more) lost split."""
    splits = split_count(p)
    if p.direction == Direction.BACKWARD_FILTER:
        return splits > 1
    if p.device != "cuda" or splits == 1:
        return False
    return 4 * _output_tiles(p) < parallel_slots(p.device)  # two slots a multiprocessor


#: At most this many splits of a weight gradient by filter rows. Its output is a few narrow
#: tiles (seven of 64 x 32 for ResNet-50's 7x7 stem), too few programs for the device at
#: MAX_SPLITS; from BrgemmLaunch.FINISH_APART_FROM splits on, a launch of its own sums the
#: partial tiles, so the finish does not grow with them.
MAX_ROW_SPLITS = 128


def filter_row_splits(p: ConvProblem) -> int:
    """Splits that give a weight gradient by filter rows (one 64-row tile of filters per
    filter row and group) about four programs per multiprocessor, with at least 16 chunks of
    64 pixels each (small on the CPU), at most MAX_ROW_SPLITS."""
    tiles = math.prod(p.kernel[:-1]) * cdiv(p.out_channels // p.groups, 64) * p.groups
    depth = gemm_shape(p)[2]
    most = max(1, depth // (16 * 64 if p.device == "cuda" else 32))
    return max(1, min(cdiv(2 * parallel_slots(p.device), tiles), most, MAX_ROW_SPLITS))


@dataclass(frozen=True)
class ImplicitGemmTiles(TileConfig):
    """Tiles of the implicit GEMM; tma: operands read through tensor descriptors
    (kernels/conv_tma.py; forward and backward-data at stride 1), whose row tiles are
    rectangles of written pixels; precision: the GEMM's PRECISION where the tuner chooses it
    ("": geometry.brgemm_precision's, see tf32_product_candidates); filter_rows: a few-channel
    layer read by filter rows (see filter_rows_candidates); splits: the reduction's splits
    where the tiles choose them (0: the algorithm's)."""

    tma: bool = False
    precision: str = ""
    filter_rows: bool = False
    splits: int = 0


def tile_precision(p: ConvProblem, tiles: TileConfig) -> str:
    """The batch-reduce GEMM's PRECISION for `p` with these tiles."""
    return getattr(tiles, "precision", "") or brgemm_precision(p)


def tf32_product_candidates(p: ConvProblem, candidates: list[TileConfig]) -> list[TileConfig]:
    """TF32 weight gradients of few-channel layers (the packed reduction) run as three
    bfloat16 products (geometry.brgemm_precision), which lose there as often as they win: RGB
    stems on an H200 (BENCHMARKS.md), ResNet-50's 7x7 one 1.25x slower than TF32 products,
    VGG-16's 3x3 one 1.49x faster. The tuner times both: the same tiles with TF32 products
    follow, or come first where the packed columns pass TF32_FIRST_ABOVE_COLUMNS. On more
    channels bf16x3 ran 1.4x to 4x faster on every layer measured, so only its tiles are
    offered there."""
    if p.device != "cuda" or brgemm_precision(p) != "bf16x3" or not packed(p):
        return []
    return [ImplicitGemmTiles(**asdict(t), precision="tf32") for t in candidates]


def row_run(p: ConvProblem) -> int:
    """A filter row's (rw, c) pairs: its width times the channels per group."""
    return p.kernel[-1] * (p.in_channels // p.groups)


def row_pairs(p: ConvProblem) -> int:
    """A filter row's (rw, c) pairs, padded to a power of two of at least 16 (a tensor-core
    operand's side): the chunk (forward) or column tile (backward-filter) of the tiles that
    work by filter rows."""
    return max(16, triton.next_power_of_2(row_run(p)))


def filter_rows_candidates(
    p: ConvProblem, candidates: list[TileConfig], splits: int = 1
) -> list[TileConfig]:
    """Tiles of few-channel layers (the packed reduction) that work by filter rows. Along a
    filter row the (rw, c) pairs of a channels-last input lie at fixed offsets from the row's
    first pixel (21 for a 7x7 filter over 3 channels), so a tile that takes one row's pairs
    adds a per-pixel and a per-pair offset, with one bound checked per element.

    Forward (conv_addressing.fwd_rows_a_load): each step reads one row's pairs in chunks of
    row_pairs (at most 64); the packed tiles' shapes otherwise, the narrowest that spans the
    output channels first. Backward-filter (bwd_filter_rows_b_load): a column tile is one
    row's pairs, block_n = row_pairs; where the algorithm splits the reduction (`splits`),
    each shape also at filter_row_splits."""
    if p.device != "cuda" or not packed(p) or p.direction == Direction.BACKWARD_DATA:
        return []
    return [t for t in _filter_rows_shapes(p, candidates, splits) if _fits_shared_memory(p, t)]


def shared_memory_count(p: ConvProblem, t: TileConfig) -> int:
    """Bytes of shared memory that tile t takes, counted as the larger of its pipelined
    operand tiles (stages x (block_m + block_n) x block_k elements) and the float32
    accumulator that the epilogue passes through it: at or above what Triton 3.6 allocates
    for each filter-row tile of the few-channel GPU tests on sm_90
    (benchmarks/aot_compile_few_channels.py)."""
    operands = t.num_stages * (t.block_m + t.block_n) * t.block_k * p.dtype.itemsize
    return max(operands, t.block_m * t.block_n * 4)


def _fits_shared_memory(p: ConvProblem, t: TileConfig) -> bool:
    """In float32 the filter-row tiles' 64- and 128-deep steps can exceed the device's shared
    memory (256 x 128 x 64 in 3 stages: 288 KiB of the H200's 227), a compile failure that
    the tuner skips but an untuned choice would meet."""
    return shared_memory_count(p, t) <= shared_memory_bytes(p.device)


def _filter_rows_shapes(
    p: ConvProblem, candidates: list[TileConfig], splits: int
) -> list[TileConfig]:
    pairs = row_pairs(p)
    kg = p.out_channels // p.groups
    if p.direction == Direction.BACKWARD_FILTER:
        # First (H100, bf16 and fp16): 64 filters by one row's pairs, 128 pixels a step, split
        # to fill the device. ResNet-50's 7x7 stem 0.169 ms against 0.217 at 32 splits and
        # 0.578 for the packed tiles' best; VGG-16's 3x3 one 0.221 against 0.67 and 1.25.
        shapes = [(64, 128, 4, 3), (64, 64, 4, 4), (128, 64, 8, 3), (128, 128, 8, 3)]
        counts = [0] if splits == 1 else sorted({splits, filter_row_splits(p)}, reverse=True)
        return [
            ImplicitGemmTiles(bm, pairs, bk, 8, warps, stages, filter_rows=True, splits=n)
            for n in counts
            for bm, bk, warps, stages in shapes
            if bm <= 2 * max(32, kg)
        ]
    bk = min(64, pairs)
    out: list[TileConfig] = []
    for t in candidates:
        rows = ImplicitGemmTiles(**{**asdict(t), "block_k": bk}, filter_rows=True)
        if rows not in out:
            out.append(rows)
    # On ResNet-50's stem (64 filters) 128 x 64 ran 0.155 ms, 128 x 128 0.351 (H100).
    snug = min((t.block_n for t in out if t.block_n >= kg), default=0)
    return sorted(out, key=lambda t: t.block_n != snug)


def filter_row_steps(p: ConvProblem, block_k: int) -> int:
    """Reduction steps of the forward by filter rows: each filter row's (rw, c) pairs in
    chunks of block_k."""
    return math.prod(p.kernel[:-1]) * cdiv(row_run(p), block_k)


def filter_row_columns(p: ConvProblem) -> int:
    """Columns of the weight gradient by filter rows: row_pairs for each filter row."""
    return math.prod(p.kernel[:-1]) * row_pairs(p)


#: Set to 1 to let the tile tuner try the TMA kernel on Hopper GPUs. Off by default: the
#: path is checked against float64 through the interpreter and compiles for sm_90, but its
#: speed has not been measured on a GPU yet.
TMA_ENV = "RTDNN_TMA"


def _channels_last_strides(desc: TensorDesc) -> tuple[int, ...]:
    """`desc`'s strides, with those of size-1 dims (never stepped along, so arbitrary in
    PyTorch) replaced by what a channels-last tensor with the same other strides would have."""
    shape, strides = desc.shape, list(desc.strides)
    if shape[1] == 1:
        strides[1] = 1
    step = strides[1] * shape[1]
    for d in [*range(desc.ndim - 1, 1, -1), 0]:  # the spatial dims innermost first, then N
        if shape[d] == 1:
            strides[d] = step
        step = strides[d] * shape[d]
    return tuple(strides)


def _box_strides(desc: TensorDesc) -> tuple[int, int, int, int]:
    """The (n, d, h, w) strides of a channels-last data tensor as a TMA descriptor takes them
    (conv_tma._image_box): 1-D and 2-D tensors get leading dims of size 1, for which any
    16-byte multiple serves (N's)."""
    s = _channels_last_strides(desc)
    return (s[0], *(s[0],) * (5 - desc.ndim), *s[2:])


def _channels_last_aligned(desc: TensorDesc, item: int) -> bool:
    """Channels innermost, every other stride a multiple of 16 bytes (a TMA descriptor's)."""
    strides = _channels_last_strides(desc)
    return strides[1] == 1 and all(s * item % 16 == 0 for i, s in enumerate(strides) if i != 1)


def tma_unsupported(p: ConvProblem, block_k: int) -> str | None:
    """None if the TMA kernels can run `p` with reduction chunks of `block_k` (channels in
    forward and backward-data, pixels in backward-filter), else why not (device capability
    aside, which the tile candidates check)."""
    if any(s != 1 for s in p.conv.stride):
        return "stride 1 only: a strided tap's pixels are not a box"
    if p.conv.mode != "cross_correlation" or p.x.offset or p.w.offset or p.y.offset:
        return "the filter and data are read as stored (no flipped views)"
    cg, kg = p.in_channels // p.groups, p.out_channels // p.groups
    item = p.dtype.itemsize
    if (cg * item) % 16 or (kg * item) % 16:
        return f"C/groups, K/groups = {cg}, {kg}: a group's channels must span 16-byte multiples"
    if p.direction == Direction.BACKWARD_FILTER:
        if packed(p):
            return f"C/groups = {cg} < {PACK_BELOW}: the pointer path packs taps and channels"
        if not (_channels_last_aligned(p.x, item) and _channels_last_aligned(p.y, item)):
            return "x and dy must be channels-last with 16-byte aligned strides"
        return None
    forward = p.direction == Direction.FORWARD
    reduced = cg if forward else kg
    if reduced % block_k:
        what = "C/groups" if forward else "K/groups"
        return f"{what} = {reduced} is not a multiple of the chunk ({block_k})"
    if not _channels_last_aligned(p.x if forward else p.y, item):
        return f"{'x' if forward else 'dy'} must be channels-last with 16-byte aligned strides"
    taps = math.prod(p.kernel)
    ws = _channels_last_strides(p.w)
    dense = [math.prod(p.kernel[i + 1 :]) * cg for i in range(len(p.kernel))]
    if ws[1] != 1 or list(ws[2:]) != dense or ws[0] < taps * cg or (ws[0] * item) % 16:
        return "w must be a channels-last filter with dense taps and 16-byte aligned rows"
    return None


def tma_filter_geometry(p: ConvProblem, tiles: TileConfig) -> conv_tma.TmaFilterGeometry:
    """Backward-filter's TMA geometry: the reduction steps over rectangles of block_k of dy's
    pixels (conv_tma.rectangle)."""
    geo = conv_geometry(p)
    _, oh, ow = geo.out_size
    box = conv_tma.rectangle(oh, ow, tiles.block_k)
    return conv_tma.TmaFilterGeometry(
        *(tl.constexpr(b) for b in box), p.batch, geo.cg, geo.kg, geo.in_size, geo.out_size,
        geo.kernel, geo.padding, geo.dilation, _box_strides(p.x), p.in_channels,
        _box_strides(p.y), p.out_channels, geo.w_strides, geo.offsets[1],
    )  # fmt: skip


def tma_geometry(p: ConvProblem, tiles: TileConfig) -> conv_tma.TmaGeometry:
    """The TMA kernel's geometry for `p` with these tiles: the row tile is the rectangle of
    BLOCK_M written pixels, as wide as the written image's rows allow (powers of two), then as
    tall, then spanning images."""
    geo = conv_geometry(p)
    forward = p.direction == Direction.FORWARD
    src, dst = (p.x, p.y) if forward else (p.y, p.x)
    src_size, dst_size = (geo.in_size, geo.out_size) if forward else (geo.out_size, geo.in_size)
    _, oh, ow = dst_size
    box_n, box_h, box_w = conv_tma.rectangle(oh, ow, tiles.block_m)
    # Forward reads src at o - pad + tap * dil, backward-data at i + pad - tap * dil.
    sign = 1 if forward else -1
    shift = tuple(-sign * q for q in geo.padding)
    step = tuple(sign * d for d in geo.dilation)
    src_strides = _box_strides(src)
    dst_strides = geo.y_strides if forward else geo.x_strides
    cg, kg = geo.cg, geo.kg
    return conv_tma.TmaGeometry(
        tl.constexpr(box_n), tl.constexpr(box_h), tl.constexpr(box_w), tl.constexpr(tiles.block_n),
        p.batch, cg if forward else kg, kg if forward else cg, src_size, dst_size, geo.kernel,
        shift, step, src_strides, src.shape[1], _channels_last_strides(p.w)[0], p.out_channels,
        dst_strides, dst.offset,
    )  # fmt: skip


#: Set to 0 to keep the warp-specialized Hopper kernel (kernels/conv_hopper.py) out of
#: IMPLICIT_GEMM's candidates, so the pointer tiles run (A/B measurements).
HOPPER_CONV_ENV = "RTDNN_HOPPER_CONV"
#: The Triton release whose Gluon (an experimental API that changes between releases) the
#: Hopper kernel is written for; with another the pointer tiles run.
GLUON_TRITON = "3.6."


@dataclass(frozen=True)
class HopperConvTiles(TileConfig):
    """Tiles of the warp-specialized Hopper kernel (kernels/conv_hopper.py): block_m output
    pixels as a box of the output, block_n output channels, block_k reduced channels a step,
    num_stages the operand ring's depth."""

    # Where they come first beside the pointer tiles (64-byte steps), that order was measured
    # for the layer's kind: a similar layer's pointer tiles, chosen in sweeps before the
    # kernel took such layers, do not displace them (H200, bf16: a 96-channel stride-2
    # backward-data 0.046 ms on the Hopper tiles, 0.061 on a similar layer's pointer tiles).
    first_over_similar = True
    #: Forward and backward-data: each consumer takes whole tiles in turn, its epilogue under
    #: the other's products (kernels/conv_hopper.py, PINGPONG), in place of half of every tile.
    pingpong: bool = False


def hopper_data_filter_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of a (K, C, *taps) filter stored with k innermost, then the taps, then c: the
    copy that the Hopper kernel's TF32 backward-data reads as a (C, taps x K) matrix, whose
    rows are the written channels and whose columns hold the reduced k innermost."""
    return contiguous_strides(shape, (1, *range(2, len(shape)), 0))


def channels_last_desc(desc: TensorDesc) -> TensorDesc:
    """`desc` with its channels (dimension 1) innermost, the batch (dimension 0) outermost,
    densely."""
    shape = desc.shape
    return dataclasses.replace(
        desc, strides=contiguous_strides(shape, (0, *range(2, len(shape)), 1))
    )


def hopper_unsupported(p: ConvProblem) -> str | None:
    """None if the warp-specialized Hopper kernel (kernels/conv_hopper.py) runs `p` on this
    machine, else why not."""
    if p.device != "cuda" or INTERPRETED or not triton.__version__.startswith(GLUON_TRITON):
        return f"a Hopper GPU with Triton {GLUON_TRITON}x"
    if torch.cuda.get_device_capability()[0] != 9:
        return "a Hopper GPU (sm_90: warp-group MMAs)"
    if p.dtype not in (torch.float16, torch.bfloat16):
        # TF32 products read both operands with the reduced dimension innermost: backward-
        # data's filter as stored (k) does not hold it so, and IMPLICIT_PRECOMP_GEMM copies it
        # with k innermost; the weight gradient's kernel transposes x's boxes itself.
        if p.dtype != torch.float32 or p.conv.math != "tf32":
            return "16-bit data, or float32 in TF32 math"
        if p.direction == Direction.BACKWARD_DATA:
            if p.w.strides != hopper_data_filter_strides(p.w.shape):
                return "float32 (TF32) backward-data: a filter copy with k innermost"
            # The rest as for a channels-last filter: the copy is dense.
            p = dataclasses.replace(p, w=channels_last_desc(p.w))
    if p.spatial_dims not in (2, 3) or p.groups != 1:
        return "2-D and 3-D convolutions of one group only"
    if p.spatial_dims == 3 and (
        p.direction == Direction.BACKWARD_FILTER or any(q != 1 for q in p.conv.stride)
    ):
        return "3-D: forward and backward-data at stride 1"
    if p.activation not in ("identity", "relu"):
        return f"no {p.activation} epilogue"
    from ..kernels import conv_hopper  # Gluon: imported where it runs

    stride = p.conv.stride
    if any(q != 1 for q in stride):
        if any(q not in (1, 2) for q in stride):
            return "stride 1 or 2 in each dimension"
        if any(size < q for size, q in zip(p.in_spatial, stride, strict=True)):
            return "each stride phase of the input must have a row and a column"
        # The rest as at stride 1: the phases are views of the same tensor.
        p = dataclasses.replace(p, conv=dataclasses.replace(p.conv, stride=(1,) * len(stride)))
    if p.direction != Direction.BACKWARD_FILTER:
        reduced = p.in_channels if p.direction == Direction.FORWARD else p.out_channels
        block_k = conv_hopper.chunk(p.dtype, reduced)
        if block_k is None:
            step = conv_hopper.CHUNK_BYTES[-1] // p.dtype.itemsize  # the narrowest offered
            return f"{reduced} reduced channels: a multiple of {step}"
    else:
        block_k = conv_hopper.chunk(p.dtype)
    reason = tma_unsupported(p, block_k)
    if reason is not None:
        return reason
    if p.direction == Direction.BACKWARD_FILTER:
        if min(p.out_channels, p.in_channels) < 64:  # units of 64 x 64 at the least
            return f"{p.out_channels} filters, {p.in_channels} channels: at least 64 of each"
        # 1x1 in 16-bit data: the TMA GEMM's where the output is larger than 28 or smaller than
        # 14 pixels a side, the kernel's in between. ResNet-50 at batch 64, H200, bf16
        # (benchmarks/probes/hopper_filter_1x1_probe.py): at 14x14 to 28x28 the kernel ran
        # 0.85 to 1.42x cuDNN where what ran before ran 0.43 to 1.08 (l3.x.conv1 0.046 ms ->
        # 0.022, l3.0.down 0.073 -> 0.033); at 56x56 and 7x7 the TMA GEMM was 2 to 22% faster.
        # In float32 the kernel takes every 1x1 layer (the TMA GEMM reads 16-bit data only).
        if math.prod(p.kernel) == 1 and p.dtype != torch.float32:
            if not 14 <= min(p.out_spatial) <= max(p.out_spatial) <= 28:
                return "1x1 16-bit weight gradients outside 14 to 28 output pixels: a plain GEMM"
        return None
    dst = p.y if p.direction == Direction.FORWARD else p.x
    if dst.shape[1] < 64:  # tiles wider than the output's channels: not run on a GPU yet
        return f"{dst.shape[1]} written channels: at least 64"
    if not _channels_last_aligned(dst, p.dtype.itemsize):
        return "the written tensor must be channels-last with 16-byte aligned strides"
    return None


def hopper_offered(p: ConvProblem) -> bool:
    """Whether the Hopper kernels' tiles are offered for `p`: they run it on this machine
    (hopper_unsupported) and RTDNN_HOPPER_CONV is not 0."""
    return os.environ.get(HOPPER_CONV_ENV) != "0" and hopper_unsupported(p) is None


def _narrow_steps(p: ConvProblem, tiles: TileConfig) -> bool:
    """Whether the Hopper forward/backward-data tiles step through the reduced channels in
    rows narrower than the widest (kernels/conv_hopper.py, CHUNK_BYTES)."""
    from ..kernels import conv_hopper

    forward_or_data = p.direction != Direction.BACKWARD_FILTER
    return forward_or_data and tiles.block_k * p.dtype.itemsize < conv_hopper.CHUNK_BYTES[0]


def hopper_candidates(p: ConvProblem, most_splits: int) -> list[TileConfig]:
    """The Hopper kernels' tiles where they run `p` (and RTDNN_HOPPER_CONV is not 0): 128
    output channels a tile, or 64 where the output has no more (kernels/conv_hopper.py);
    backward-filter, its unit shapes (_hopper_filter_candidates, split at most
    `most_splits` ways)."""
    if not hopper_offered(p):
        return []
    if p.direction == Direction.BACKWARD_FILTER:
        return _hopper_filter_candidates(p, most_splits)
    from ..kernels import conv_hopper

    forward = p.direction == Direction.FORWARD
    cols, reduced = (p.out_channels, p.in_channels) if forward else (p.in_channels, p.out_channels)
    block_k = conv_hopper.chunk(p.dtype, reduced)
    widths = (128, 64) if cols > 64 else (64,)
    # 256-pixel tiles after the 128-pixel ones (the untuned choice unchanged), in 16-bit data
    # only: float32's 256 x 128 epilogue buffers (128 KiB) leave too little for the ring.
    pixels = [conv_hopper.BLOCK_M]
    if p.dtype.itemsize == 2:
        pixels.append(conv_hopper.BLOCK_M_WIDE)
    tiles = [
        HopperConvTiles(bm, bn, block_k, group_m=1, num_warps=4,
                        num_stages=conv_hopper.stages_for(bm, bn, block_k, p.dtype.itemsize))
        for bm in pixels
        for bn in widths
    ]  # fmt: skip
    if p.dtype.itemsize == 2:
        # Ping-pong 128-pixel tiles last, for the tuner (their epilogue buffers, a whole box
        # each, take what the 256-pixel tiles' halves do; float32's would not fit beside the
        # ring). Measured on ResNet-50's 3x3 layers (H200, bf16): 64 channels wide 1-4% faster
        # than the same tiles without (l3.x.conv2 0.0294 -> 0.0281 ms), 128 wide alike.
        tiles += [dataclasses.replace(t, pingpong=True) for t in tiles[: len(widths)]]
    return tiles


def _hopper_filter_candidates(p: ConvProblem, most_splits: int) -> list[TileConfig]:
    """The weight-gradient kernel's units (kernels/conv_hopper_filter.py): 128 filters x 128
    channels (ping-pong), and 128 x 256 (cooperative) where there are 256 channels or more,
    first where cooperative_first says so; ping-pong's 64 filters or channels wide where the
    layer has no more. Float32 (TF32): 32 pixels a step."""
    from ..kernels import conv_hopper_filter as chf

    pingpong = HopperConvTiles(
        chf.BLOCK_F if p.out_channels > 64 else 64, chf.BLOCK_C if p.in_channels > 64 else 64,
        chf.PIXELS, group_m=1, num_warps=4, num_stages=chf.STAGES,
    )  # fmt: skip
    tf32 = p.dtype == torch.float32
    if tf32:
        pingpong = dataclasses.replace(pingpong, block_k=chf.TF32_PIXELS,
                                       num_stages=chf.TF32_STAGES)  # fmt: skip
    # The cooperative unit gives each warp group 64 of its filters: it needs 128.
    if p.in_channels < chf.COOPERATIVE_BLOCK_C or pingpong.block_m < chf.BLOCK_F:
        return [pingpong]
    cooperative = dataclasses.replace(
        pingpong, block_n=chf.COOPERATIVE_BLOCK_C,
        num_stages=chf.TF32_COOPERATIVE_STAGES if tf32 else chf.COOPERATIVE_STAGES,
    )  # fmt: skip
    plans = [_hopper_filter_plan(p, t, most_splits).split for t in (pingpong, cooperative)]
    if chf.cooperative_first(*plans):
        return [cooperative, pingpong]
    return [pingpong, cooperative]


class HopperFilterPlan(NamedTuple):
    """The weight-gradient kernel's launch (kernels/conv_hopper_filter.py): dy's box of
    pixels (images, rows, columns), the boxes down and across an image and in all, the
    filter and channel tiles, and the split of the reduction."""

    box: tuple[int, int, int]
    boxes_h: int
    boxes_w: int
    boxes: int
    k_tiles: int
    c_tiles: int
    split: object  #: conv_hopper_filter.SplitPlan


def _hopper_filter_plan(p: ConvProblem, tiles: TileConfig, most_splits: int) -> HopperFilterPlan:
    """The weight-gradient kernel's launch plan for `tiles` on this GPU."""
    from ..kernels import conv_hopper as ch
    from ..kernels import conv_hopper_filter as chf

    out_h, out_w = p.out_spatial
    box = ch.least_waste_box(p.batch, out_h, out_w, tiles.block_k)
    boxes_h, boxes_w = cdiv(out_h, box[1]), cdiv(out_w, box[2])
    boxes = cdiv(p.batch, box[0]) * boxes_h * boxes_w
    k_tiles, c_tiles = cdiv(p.out_channels, tiles.block_m), cdiv(p.in_channels, tiles.block_n)
    programs = multiprocessor_count(torch.cuda.current_device())
    plan = chf.split_plan(
        math.prod(p.kernel) * k_tiles * c_tiles, boxes, programs, most_splits,
        cooperative=tiles.block_n > chf.BLOCK_C,
    )  # fmt: skip
    return HopperFilterPlan(box, boxes_h, boxes_w, boxes, k_tiles, c_tiles, plan)


def _tma_candidates(p: ConvProblem, candidates: list[TileConfig]) -> list[TileConfig]:
    """TMA variants of the pointer candidates, where RTDNN_TMA=1 asks for them and a Hopper
    (or later) GPU can run them."""
    if os.environ.get(TMA_ENV) != "1" or p.device != "cuda":
        return []
    if before_hopper(p.device):
        return []
    out = []
    for t in candidates:
        if tma_unsupported(p, t.block_k) is None and t.block_m >= 64 and not _known_bad(p, t):
            out.append(ImplicitGemmTiles(**asdict(t), tma=True))
    return out


def _known_bad(p: ConvProblem, t: TileConfig) -> bool:
    """A TMA tile measured giving wrong results (benchmarks/probes/tma_notes.md): 128x128x64
    with 8 warps and 3 stages on 1x1 layers in forward and backward-data, 0.4 to 2.9% off
    cuDNN at ResNet-50's sizes. Never offered until the cause is found."""
    shape = (t.block_m, t.block_n, t.block_k, t.num_warps, t.num_stages)
    one_by_one = all(k == 1 for k in p.kernel)
    return one_by_one and p.direction != Direction.BACKWARD_FILTER and shape == (128, 128, 64, 8, 3)


def pixel_stride(desc: TensorDesc) -> int | None:
    """The one stride that steps through every pixel (n and spatial dims) of `desc` in order,
    or None if the pixels are not evenly spaced (e.g. NCHW with N > 1, or a padded view)."""
    step = expected = None
    for d in reversed([0, *range(2, desc.ndim)]):
        if desc.shape[d] == 1:
            continue
        if expected is None:
            step = desc.strides[d]
            expected = step * desc.shape[d]
        elif desc.strides[d] != expected:
            return None
        else:
            expected *= desc.shape[d]
    return 1 if step is None else step


def pointwise_operands(p: ConvProblem, geo) -> tuple[Operand, Operand] | None:
    """A and B of a 1x1, stride-1, unpadded convolution whose pixels are evenly spaced: a plain
    GEMM over pixels, addressed as strided matrices (no per-step index arithmetic)."""
    if any(k != 1 for k in p.kernel) or any(s != 1 for s in p.conv.stride):
        return None
    if any(q != 0 for q in p.conv.padding):
        return None
    sx, sy = pixel_stride(p.x), pixel_stride(p.y)
    if sx is None or sy is None:
        return None
    pixels = p.batch * math.prod(p.out_spatial)
    cg, kg = p.in_channels // p.groups, p.out_channels // p.groups
    xs_c, ys_k = p.x.strides[1], p.y.strides[1]
    ws_k, ws_c = geo.w_strides[0], geo.w_strides[1]
    x_off, w_off, y_off = geo.offsets

    def matrix(rows, cols, group_stride, s_row, s_col, offset):
        return StridedGeometry(rows, cols, 1, group_stride, 0, 0, s_row, s_col, offset)

    # One matrix per operand, no reduce index: steps are plain chunks of the reduced dim.
    a_load, b_load = strided.matrix_a_load, strided.matrix_b_load
    a_setup, b_setup = strided.strided_a_setup, strided.strided_b_setup
    if p.direction == Direction.FORWARD:  # x[P, c] @ w[c, k]
        a = matrix(pixels, cg, cg * xs_c, sx, xs_c, x_off)
        b = matrix(cg, kg, kg * ws_k, ws_c, ws_k, w_off)
    elif p.direction == Direction.BACKWARD_DATA:  # dy[P, k] @ w[k, c]
        a = matrix(pixels, kg, kg * ys_k, sy, ys_k, y_off)
        b = matrix(kg, cg, kg * ws_k, ws_k, ws_c, w_off)
    else:  # dy^T[k, P] @ x[P, c]
        a = matrix(kg, pixels, kg * ys_k, ys_k, sy, y_off)
        b = matrix(pixels, cg, cg * xs_c, sx, xs_c, x_off)
    return Operand(a_setup, a_load, a), Operand(b_setup, b_load, b)


def pointwise_layouts(p: ConvProblem) -> tuple[MatrixLayout, MatrixLayout, tuple[int, int]] | None:
    """A's and B's layouts and C's (row, column) strides of an ungrouped 1x1, stride-1,
    unpadded convolution as the plain GEMM that the TMA GEMM (kernels/gemm_tma.py) reads, or
    None where it cannot (see tiles.tma_gemm_usable): channels-last pixels and a filter with
    contiguous input channels give unit-stride matrices."""
    geo = conv_geometry(p)
    if p.groups != 1 or any(geo.offsets) or pointwise_operands(p, geo) is None:
        return None
    sx, sy = pixel_stride(p.x), pixel_stride(p.y)
    pixels = p.batch * math.prod(p.out_spatial)
    c, k = p.in_channels, p.out_channels
    xs_c, ys_k = p.x.strides[1], p.y.strides[1]
    ws_k, ws_c = geo.w_strides[0], geo.w_strides[1]
    if p.direction == Direction.FORWARD:  # x[P, c] @ w^T[c, k] -> y[P, k]
        a, b = MatrixLayout.of(pixels, c, sx, xs_c), MatrixLayout.of(c, k, ws_c, ws_k)
        out = (sy, ys_k)
    elif p.direction == Direction.BACKWARD_DATA:  # dy[P, k] @ w[k, c] -> dx[P, c]
        a, b = MatrixLayout.of(pixels, k, sy, ys_k), MatrixLayout.of(k, c, ws_k, ws_c)
        out = (sx, xs_c)
    else:  # dy^T[k, P] @ x[P, c] -> dw[k, c]
        a, b = MatrixLayout.of(k, pixels, ys_k, sy), MatrixLayout.of(pixels, c, sx, xs_c)
        out = (ws_k, ws_c)
    if a is None or b is None or not tma_gemm_usable(p.device, p.dtype, a, b):
        return None
    return a, b, out


def _image(desc: TensorDesc, step=None, phase=None) -> tuple[tuple, tuple]:
    """(shape, strides) of a channels-last tensor as (N, [D,] H, W, channels), or of its
    stride phase (pixels `step` apart in each spatial dimension, from `phase`): what the
    Hopper kernels' descriptors see."""
    dims = len(desc.shape) - 2
    step, phase = step or (1,) * dims, phase or (0,) * dims
    st = _channels_last_strides(desc)
    sizes = [cdiv(size - a, q) for size, a, q in zip(desc.shape[2:], phase, step, strict=True)]
    strides = [t * q for t, q in zip(st[2:], step, strict=True)]
    return (desc.shape[0], *sizes, desc.shape[1]), (st[0], *strides, 1)


def _read_phases(stride: tuple[int, int]) -> list[tuple[int, int]]:
    """The stride phases (a, b) = divmod(i, 2) the Hopper kernels read through their four
    read descriptors; where the stride is 1 in a dimension, the phases it lacks repeat phase
    0."""
    return [(a % stride[0], b % stride[1]) for a in range(2) for b in range(2)]


def _read_views(dtype: torch.dtype, views: list, block: list) -> list:
    """The descriptor views (kernels/conv_hopper.py, descriptor_view) of the Hopper kernels'
    four reads, in blocks of `block`, from their views (_image: shape and strides)."""
    from ..kernels import conv_hopper as ch

    return [ch.descriptor_view(dtype, *view, block) for view in views]


def _read_descriptors(image: torch.Tensor, phases: list, views: list, strided: bool) -> list:
    """The Hopper kernels' four read descriptors of `image`, its descriptor views (_read_views)
    bound: strided, one per stride phase (_read_phases), each starting at the phase's first
    pixel; else the whole image four times."""
    if not strided:
        return [views[0].bind(image)] * 4
    return [view.bind(image[:, :, a:, b:]) for (a, b), view in zip(phases, views, strict=True)]


def _filter_split_finishes(p: ConvProblem, splits: int) -> dict:
    """The launches, by beta != 0, that sum a weight gradient's float32 partials (workspace
    [groups x taps, splits, K / groups, C / groups]) in split order into the filter."""
    dw = Output(ca.bwd_filter_c_addr, static_taps(conv_geometry(p)))
    kg, cg = p.out_channels // p.groups, p.in_channels // p.groups
    entries = p.groups * math.prod(p.kernel)
    return {
        b: split_finish(
            dw, kg, cg, entries, splits, ACTIVATION=identity, HAS_BIAS=False, BETA_NONZERO=b
        )  # fmt: skip
        for b in (False, True)
    }


class ImplicitGemm(ConvAlgorithm):
    name = "IMPLICIT_GEMM"
    fuses_activation = True  # the GEMM's epilogue
    #: The directions the warp-specialized Hopper kernels serve in this algorithm: all three
    #: in the plain implicit GEMM (the weight gradient unsplit); in IMPLICIT_GEMM_SPLIT_K the
    #: weight gradient, split into the workspace that algorithm declares.
    hopper_directions = frozenset(Direction)

    def supports(self, p: ConvProblem) -> str | None:
        return None

    def splits(self, p: ConvProblem) -> int:
        return 1

    def tile_candidates(self, p: ConvProblem) -> list[TileConfig]:
        rows, cols, depth, _ = gemm_shape(p)
        hopper = (
            hopper_candidates(p, self.splits(p)) if p.direction in self.hopper_directions else []
        )
        if hopper and not _narrow_steps(p, hopper[0]):
            # On Hopper the warp-specialized kernel alone (not beside tiles the shipped table
            # or the tuning database could prefer): H200, bf16, VGG-16's 256-channel 56x56
            # layer 0.091 ms against the pointer tiles' 0.128 and cuDNN's 0.084.
            return hopper
        candidates = gemm_candidates(p, rows, cols, depth)
        plain = self._tma_gemm_candidates(p, rows, cols, depth)
        if self.splits(p) > 1 and p.direction != Direction.BACKWARD_FILTER:
            return plain + candidates  # the TMA forward does not split its reduction
        by_rows = filter_rows_candidates(p, candidates, self.splits(p))
        forward = p.direction == Direction.FORWARD
        # The filter-row tiles first, the untuned choice, where they won on RGB stems (H100,
        # bf16; BENCHMARKS.md): forward where the packed reduction takes several chunks (7x7
        # or 11x11: ResNet-50's stem 0.155 ms against the packed tiles' best 0.543; AlexNet's
        # 0.73 against 1.20), and split weight gradients (3.4x to 5.6x faster). A forward
        # reduction of one chunk (3x3 over 3 channels: 27 of 32) keeps the packed tiles first
        # (VGG-16's stem 0.161 against 0.224 ms).
        rows_first = forward and depth > candidates[0].block_k or self.splits(p) > 1
        first, last = (by_rows, []) if rows_first else ([], by_rows)
        tf32 = tf32_product_candidates(p, candidates)
        if cols > TF32_FIRST_ABOVE_COLUMNS and p.groups == 1:
            # A packed TF32 weight gradient wider than one tile is bound by its products, and
            # TF32's one beats bf16x3's three (H200: AlexNet's 11x11 stem, 363 columns, 1.70
            # ms against 3.22 at best; ResNet-50's 7x7, 147, 1.25x); over 27 columns (a 3x3
            # RGB stem) bf16x3 on filter rows won (1.49x). Grouped layers: not measured.
            first, tf32 = tf32 + first, []
        pointer = plain + first + candidates + _tma_candidates(p, candidates) + tf32 + last
        if not hopper:
            return pointer
        # Hopper steps of 64-byte rows (channels not a multiple of 128 bytes) beside the
        # pointer tiles, for the tuner to weigh. Untuned, the pointer tiles first in a strided
        # forward (H200, bf16: Inception's 288-channel 3x3 stride-2 layer 0.058 ms against the
        # Hopper kernel's 0.082, a 96-channel one 0.040 against 0.046), the Hopper kernel first
        # elsewhere (the same 96-channel layer's backward-data 0.046 against 0.061).
        if p.direction == Direction.FORWARD and max(p.conv.stride) > 1:
            return pointer + hopper
        return hopper + pointer

    def _tma_gemm_candidates(
        self, p: ConvProblem, rows: int, cols: int, depth: int
    ) -> list[TmaGemmTiles]:
        """The TMA GEMM's tiles for a 1x1 layer it can read (first: the untuned choice), split
        no more than this algorithm's workspace holds."""
        if pointwise_layouts(p) is None:
            return []
        return tma_gemm_candidates(p.device, p.dtype, rows, cols, depth, self.splits(p))

    def prepare(self, p: ConvProblem, tiles: TileConfig) -> Runner:
        if isinstance(tiles, TmaGemmTiles):
            return self._prepare_tma_gemm(p, tiles)
        if isinstance(tiles, HopperConvTiles):
            return self._prepare_hopper(p, tiles)
        geo = static_taps(conv_geometry(p))
        if packed(p):
            # Few channels, few distinct counts: the (tap, channel) split of every packed
            # reduction or column index divides by a constant.
            geo = geo._replace(cg=tl.constexpr(geo.cg))
        rows, cols, depth, batches = gemm_shape(p)
        taps = math.prod(p.kernel)
        if getattr(tiles, "tma", False):
            return self._prepare_tma(p, tiles)
        if p.direction == Direction.BACKWARD_DATA:
            return self._prepare_backward_data(p, geo, tiles)
        if p.direction == Direction.FORWARD and getattr(tiles, "filter_rows", False):
            a = Operand(ca.fwd_a_setup, ca.fwd_rows_a_load, geo)
            b = Operand(ca.fwd_b_setup, ca.fwd_rows_b_load, geo)
            c = Output(ca.fwd_c_addr, geo)
            steps = filter_row_steps(p, tiles.block_k)
        elif getattr(tiles, "filter_rows", False):
            if tiles.block_n != row_pairs(p):
                raise ValueError(f"filter-row tiles {tiles} need block_n = {row_pairs(p)}")
            rows_geo = ca.FilterRowsGeometry(geo, tl.constexpr(row_pairs(p)))
            a = Operand(ca.bwd_filter_packed_a_setup, ca.bwd_filter_a_load, geo)
            b = Operand(ca.bwd_filter_rows_b_setup, ca.bwd_filter_rows_b_load, rows_geo)
            c = Output(ca.bwd_filter_rows_c_addr, rows_geo)
            cols = filter_row_columns(p)
            steps = cdiv(depth, tiles.block_k)
        elif p.direction == Direction.FORWARD and packed(p):
            a = Operand(ca.fwd_a_setup, ca.fwd_packed_a_load, geo)
            b = Operand(ca.fwd_b_setup, ca.fwd_packed_b_load, geo)
            c = Output(ca.fwd_c_addr, geo)
            steps = cdiv(depth, tiles.block_k)
        elif p.direction == Direction.FORWARD:
            a = Operand(ca.fwd_a_setup, ca.fwd_a_load, geo)
            b = Operand(ca.fwd_b_setup, ca.fwd_b_load, geo)
            c = Output(ca.fwd_c_addr, geo)
            steps = taps * cdiv(depth, tiles.block_k)
        elif packed(p):
            a = Operand(ca.bwd_filter_packed_a_setup, ca.bwd_filter_a_load, geo)
            b = Operand(ca.bwd_filter_packed_b_setup, ca.bwd_filter_packed_b_load, geo)
            c = Output(ca.bwd_filter_packed_c_addr, geo)
            steps = cdiv(depth, tiles.block_k)
        else:
            a = Operand(ca.bwd_filter_a_setup, ca.bwd_filter_a_load, geo)
            b = Operand(ca.bwd_filter_b_setup, ca.bwd_filter_b_load, geo)
            c = Output(ca.bwd_filter_c_addr, geo)
            steps = cdiv(depth, tiles.block_k)
        pointwise = pointwise_operands(p, geo)
        if pointwise is not None:
            a, b = pointwise
        gemm = BrgemmLaunch(
            a, b, c, m=rows, n=cols, steps=steps, batches=batches, tiles=tiles,
            precision=tile_precision(p, tiles), splits=self._tile_splits(p, tiles),
            activation=epilogue_activation(p),
        )  # fmt: skip
        direction = p.direction

        def run(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
            if direction == Direction.FORWARD:
                gemm(t.x, t.w, t.y, alpha=alpha, beta=beta, bias=t.bias, workspace=workspace)
            else:
                gemm(t.y, t.x, t.w, alpha=alpha, beta=beta, workspace=workspace)

        return run

    def _tile_splits(self, p: ConvProblem, tiles: TileConfig) -> int:
        """The tiles' own splits where they choose them, if this algorithm splits at all."""
        splits = self.splits(p)
        return (getattr(tiles, "splits", 0) or splits) if splits > 1 else 1

    def _prepare_tma_gemm(self, p: ConvProblem, tiles: TmaGemmTiles) -> Runner:
        """A 1x1 layer as a plain GEMM read through TMA descriptors (kernels/gemm_tma.py); the
        pointer path's first tiles run instead where a call's operands are not 16-byte
        aligned."""
        layouts = pointwise_layouts(p)
        if layouts is None:
            raise ValueError("TMA GEMM tiles for a problem it cannot read")
        a, b, c_strides = layouts
        gemm = TmaGemmLaunch(
            a, b, c_strides, tiles=tiles, programs=tma_gemm_programs(p.device),
            precision=dot_precision(p), activation=epilogue_activation(p),
        )  # fmt: skip
        rows, cols, depth, _ = gemm_shape(p)
        plain = self.prepare(p, gemm_candidates(p, rows, cols, depth)[0])
        direction = p.direction

        def run(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
            if direction == Direction.FORWARD:
                operands, out, bias = (t.x, t.w), t.y, t.bias
            elif direction == Direction.BACKWARD_DATA:
                operands, out, bias = (t.y, t.w), t.x, None
            else:
                operands, out, bias = (t.y, t.x), t.w, None
            if not tma_aligned(*operands):
                plain(t, workspace, alpha, beta)
                return
            gemm(*operands, out, alpha=alpha, beta=beta, bias=bias, workspace=workspace)

        return run

    def _prepare_hopper(self, p: ConvProblem, tiles: HopperConvTiles) -> Runner:
        """Forward or backward-data by the warp-specialized Hopper kernel (kernels/
        conv_hopper.py): one launch, or at stride 2 in backward-data one per stride phase of
        dx, side by side. The pointer path's first tiles run instead where a call's tensors
        are not 16-byte aligned."""
        reason = hopper_unsupported(p)
        if reason is not None:
            raise ValueError(f"Hopper tiles for a problem they cannot run: {reason}")
        if p.direction == Direction.BACKWARD_FILTER:
            return self._prepare_hopper_filter(p, tiles)
        from ..kernels import conv_hopper as ch

        forward = p.direction == Direction.FORWARD
        src, dst = (p.x, p.y) if forward else (p.y, p.x)
        if src.shape[1] % tiles.block_k:  # a step past a tap's channels would read the next's
            raise ValueError(f"{tiles}: {src.shape[1]} reduced channels, steps of {tiles.block_k}")
        three_d = p.spatial_dims == 3  # stride 1 (hopper_unsupported)
        stride = tuple(p.conv.stride)[-2:]
        strided = stride != (1, 1)
        pads, dils = p.conv.padding, p.conv.dilation
        (r, s), in_channels = p.kernel[-2:], p.in_channels
        # 3-D: the depth taps (in 2-D one, the first of a filter one deep).
        depth = ch.TapRun(0, 0, 1, 0, 0)
        if three_d:
            depth = (ch.forward_taps(p.kernel[0], pads[0], dils[0]) if forward
                     else ch.data_phase_taps(p.kernel[0], pads[0], dils[0], 1, 0))  # fmt: skip
        (pad_h, pad_w), (dil_h, dil_w) = pads[-2:], dils[-2:]

        # What is read: forward at stride 2, the four phase views of x (x_desc to x3_desc:
        # (a, b) = divmod(i, 2); where the stride is 1 in a dimension the phases it lacks
        # repeat phase 0); else the whole of x or dy.
        read_phases = _read_phases(stride)
        if forward and strided:
            read_views = [_image(src, stride, ph) for ph in read_phases]
        else:
            read_views = [_image(src)] * 4
        if forward:  # one launch: every tap, the stride taken by the read phases
            taps = ch.forward_taps(r, pad_h, dil_h), ch.forward_taps(s, pad_w, dil_w)
            writes = [((0, 0), _image(dst), taps)]
        else:  # a launch per stride phase of dx, with the taps that reach it
            writes = []
            for a in range(stride[0]):
                for b in range(stride[1]):
                    view = _image(dst, (*(1,) * three_d, *stride), (*(0,) * three_d, a, b))
                    taps = (ch.data_phase_taps(r, pad_h, dil_h, stride[0], a),
                            ch.data_phase_taps(s, pad_w, dil_w, stride[1], b))  # fmt: skip
                    if all(view[0][1:-1]):  # a phase with pixels
                        writes.append(((a, b), view, taps))
        # The filter as a matrix of taps x tap_cols columns: backward-data reads it as stored,
        # (K, taps x C), its rows the reduced k; forward as (K, taps x C) and backward-data on
        # IMPLICIT_PRECOMP_GEMM's TF32 copy with k innermost as (C, taps x K), their rows the
        # written channels (the reduced ones innermost, as TF32 products need).
        reduced_rows = not forward and p.w.strides != hopper_data_filter_strides(p.w.shape)
        filter_taps = math.prod(p.kernel)
        if forward or reduced_rows:
            w_view = ((p.out_channels, filter_taps * in_channels),
                      (_channels_last_strides(p.w)[0], 1))  # fmt: skip
            tap_cols = in_channels
        else:
            w_view = ((in_channels, filter_taps * p.out_channels), (p.w.strides[1], 1))
            tap_cols = p.out_channels
        w_block = [tiles.block_k, tiles.block_n] if reduced_rows else [tiles.block_n, tiles.block_k]
        w_descriptor = ch.descriptor_view(p.dtype, *w_view, w_block)
        # Each written phase's boxes of pixels and tile counts. The two consumers take half a
        # box each (two or more images or rows), or ping-pong whole boxes in turn.
        pingpong = tiles.pingpong
        halves = not pingpong
        boxes, counts, tile_costs = [], [], []
        for _, view, (th, tw) in writes:
            n, *dst_dhw = view[0][:-1]
            if three_d:  # boxes of one image's depth x rows x columns
                dst_d, dst_h, dst_w = dst_dhw
                box = ch.least_waste_box(dst_d, dst_h, dst_w, tiles.block_m, halves=halves)
                tiles_d, groups = cdiv(dst_d, box[0]), n
            else:  # boxes of images x rows x columns
                (dst_h, dst_w), tiles_d = dst_dhw, 1
                box = ch.least_waste_box(n, dst_h, dst_w, tiles.block_m, halves=halves)
                groups = cdiv(n, box[0])
            tiles_hw = cdiv(dst_h, box[1]), cdiv(dst_w, box[2])
            tiles_n = cdiv(dst.shape[1], tiles.block_n)
            boxes.append((box, tiles_d, *tiles_hw, tiles_n))
            counts.append(groups * tiles_d * math.prod(tiles_hw) * tiles_n)
            # A tile's steps, and about one more for its epilogue.
            tile_costs.append(depth.count * th.count * tw.count * src.shape[1] // tiles.block_k + 1)
        # The phases that taps reach run side by side on shares of the multiprocessors (one
        # program fills one). A phase no tap reaches (1x1 filters at stride 2) only stores:
        # bound by memory, it takes every multiprocessor, as the stores need (on a share of
        # a few, ResNet-50's 1x1 stride-2 backward-data ran 20% slower).
        sms = multiprocessor_count(torch.cuda.current_device())
        reached = [i for i, cost in enumerate(tile_costs) if cost > 1]
        shares = [min(count, sms) for count in counts]
        for i, share in zip(
            reached,
            share_programs([counts[i] for i in reached], [tile_costs[i] for i in reached], sms),
            strict=True,
        ):
            shares[i] = share
        # (written phase, its read descriptor views, its written one, launches by beta != 0)
        phases = []
        slots = ("x_desc", "x1_desc", "x2_desc", "x3_desc", "w_desc", "y_desc", "bias_ptr")
        for (phase, view, (th, tw)), tiling, count, programs in zip(
            writes, boxes, counts, shares, strict=True
        ):
            box, tiles_d, tiles_h, tiles_w, tiles_n = tiling
            launches = {
                beta_nonzero: slot_launch(
                    ch.conv_hopper_kernel,
                    (programs,),
                    (*slots, "alpha", "beta"),
                    num_warps=4,
                    maxnreg=ch.LAUNCH_REGISTERS,
                    cols=dst.shape[1],
                    chunks=src.shape[1] // tiles.block_k,
                    taps=depth.count * th.count * tw.count,
                    tap_cols=tap_cols,
                    taps_hw=th.count * tw.count,
                    taps_w=tw.count,
                    d0f=depth.first,
                    dstep=depth.step_filter,
                    r0=th.first,
                    s0=tw.first,
                    rstep=th.step_filter,
                    sstep=tw.step_filter,
                    shift_d=depth.shift,
                    shift_h=th.shift,
                    shift_w=tw.shift,
                    step_d=depth.step,
                    step_h=th.step,
                    step_w=tw.step,
                    stride_h=stride[0],
                    stride_w=stride[1],
                    lift=max(pad_h, pad_w),
                    R=r,
                    S=s,
                    tiles_n=tiles_n,
                    tiles_d=tiles_d,
                    tiles_h=tiles_h,
                    tiles_w=tiles_w,
                    tiles=count,
                    STAGES=tiles.num_stages,
                    W_REDUCED_ROWS=reduced_rows,
                    STRIDED=forward and strided,
                    HAS_BIAS=forward and p.has_bias,
                    BETA_NONZERO=beta_nonzero,
                    RELU=p.activation == "relu",
                    CONSUMER_REGS=ch.CONSUMER_REGISTERS,
                    THREE_D=three_d,
                    PINGPONG=pingpong,
                )  # fmt: skip
                for beta_nonzero in (False, True)
            }
            # 3-D: boxes of one image ([1, depth, rows, columns]).
            box = (1,) * three_d + box
            stored = box if pingpong else (*box[:-3], *ch.half_box(box[-3:]))
            reads = _read_views(p.dtype, read_views, [*box, tiles.block_k])
            written_view = ch.descriptor_view(p.dtype, *view, [*stored, tiles.block_n])
            phases.append((phase, reads, written_view, launches))
        plain = self.prepare(p, gemm_candidates(p, *gemm_shape(p)[:3])[0])

        def run(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
            read, written = (t.x, t.y) if forward else (t.y, t.x)
            if not tma_aligned(read, t.w, written):
                plain(t, workspace, alpha, beta)
                return
            bias = t.bias if forward and t.bias is not None else written
            w_desc = w_descriptor.bind(t.w)
            calls = []
            for (a, b), reads, written_view, launches in phases:
                reads = _read_descriptors(read, read_phases, reads, forward and strided)
                out = written[:, :, a:, b:] if (a, b) != (0, 0) else written
                args = (*reads, w_desc, written_view.bind(out), bias, float(alpha), float(beta))
                calls.append(functools.partial(launches[beta != 0], *args))
            run_concurrently(written.device, calls)

        return run

    def _prepare_hopper_filter(self, p: ConvProblem, tiles: TileConfig) -> Runner:
        """Backward-filter by the warp-specialized Hopper kernel (kernels/
        conv_hopper_filter.py): one launch over units of (tap, block_m filters, block_n
        channels, a split of dy's boxes of block_k pixels), cooperative where block_n is
        256, split at most this algorithm's splits (partials in its workspace, then the split
        finish). The pointer path's first tiles run instead where a call's tensors are not
        16-byte aligned."""
        from ..kernels import conv_hopper as ch
        from ..kernels import conv_hopper_filter as chf

        stride = tuple(p.conv.stride)
        strided = stride != (1, 1)
        (pad_h, pad_w), (dil_h, dil_w) = p.conv.padding, p.conv.dilation
        box, boxes_h, boxes_w, boxes, k_tiles, c_tiles, plan = _hopper_filter_plan(
            p, tiles, self.splits(p)
        )
        splits, per_split = plan.splits, plan.per_split
        cooperative = tiles.block_n > chf.BLOCK_C
        units = math.prod(p.kernel) * k_tiles * c_tiles * splits
        programs = multiprocessor_count(torch.cuda.current_device())
        sk, sc, sr, ss = p.w.strides
        finishes = _filter_split_finishes(p, splits) if splits > 1 else {}
        slots = ("dy_desc", "x_desc", "x1_desc", "x2_desc", "x3_desc", "dw_ptr", "ws_ptr")
        fixed = dict(
            units=units, k_tiles=k_tiles, c_tiles=c_tiles, splits=splits, per_split=per_split,
            boxes=boxes, boxes_h=boxes_h, boxes_w=boxes_w, pad_h=pad_h, pad_w=pad_w,
            dil_h=dil_h, dil_w=dil_w, stride_h=stride[0], stride_w=stride[1],
            lift=max(pad_h, pad_w), S=p.kernel[1], K=p.out_channels, C=p.in_channels, sk=sk,
            sc=sc, sr=sr, ss=ss, STAGES=tiles.num_stages, COOPERATIVE=cooperative,
            STRIDED=strided, CONSUMER_REGS=chf.CONSUMER_REGISTERS,
        )  # fmt: skip
        launches = {
            beta_nonzero: slot_launch(
                chf.conv_filter_hopper_kernel,
                (min(units, programs),),
                (*slots, "alpha", "beta"),
                num_warps=4,
                maxnreg=chf.LAUNCH_REGISTERS,
                BETA_NONZERO=beta_nonzero,
                **fixed,
            )  # fmt: skip
            for beta_nonzero in (False, True)
        }
        read_phases = _read_phases(stride)
        # Cooperative: dy in two boxes a step, one for each consumer's half of the filters.
        dy_block = [*box, tiles.block_m // (2 if cooperative else 1)]
        dy_view = ch.descriptor_view(p.dtype, *_image(p.y), dy_block)
        x_views = [_image(p.x, stride, ph) for ph in read_phases]
        x_views = _read_views(p.dtype, x_views, [*box, tiles.block_n])
        plain = self.prepare(p, gemm_candidates(p, *gemm_shape(p)[:3])[0])

        def run(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
            if not tma_aligned(t.x, t.y):
                plain(t, workspace, alpha, beta)
                return
            reads = _read_descriptors(t.x, read_phases, x_views, strided)
            ws = workspace.view(torch.float32) if splits > 1 else t.w  # unsplit: not read
            launches[beta != 0](
                dy_view.bind(t.y), *reads, t.w, ws, float(alpha), float(beta)
            )  # fmt: skip
            if splits > 1:
                finishes[beta != 0](ws, t.w, t.w, float(alpha), float(beta))

        return run

    def _prepare_tma(self, p: ConvProblem, tiles: TileConfig) -> Runner:
        """Forward or backward-data with TMA operands (kernels/conv_tma.py); the pointer
        path's tiles run instead where a call's tensors are not 16-byte aligned."""
        reason = tma_unsupported(p, tiles.block_k)
        if reason is not None:
            raise ValueError(f"TMA tiles for a problem they cannot run: {reason}")
        plain = self.prepare(p, tiles.base())
        if p.direction == Direction.BACKWARD_FILTER:
            return self._prepare_tma_filter(p, tiles, plain)
        geo = tma_geometry(p, tiles)
        row_tiles = conv_tma.rectangles(geo)
        forward = p.direction == Direction.FORWARD
        kernel = KernelLaunch(
            conv_tma.tma_conv_kernel,
            (row_tiles * cdiv(geo.cols, tiles.block_n), p.groups),
            dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages),
            geo=geo, M=row_tiles * tiles.block_m,
            STEPS=math.prod(p.kernel) * cdiv(geo.red, tiles.block_k),
            BACKWARD_DATA=not forward, ACTIVATION=epilogue_activation(p),
            PRECISION=dot_precision(p),
            UPCAST=INTERPRETED, BLOCK_K=tiles.block_k, GROUP_M=tiles.group_m,
        )  # fmt: skip

        def run(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
            src, dst = (t.x, t.y) if forward else (t.y, t.x)
            if not tma_aligned(src, t.w):
                plain(t, workspace, alpha, beta)
                return
            bias = t.bias if forward and t.bias is not None else None
            kernel(
                SRC=src, Wt=t.w, DST=dst, BIAS=bias if bias is not None else dst,
                alpha=float(alpha), beta=float(beta), HAS_BIAS=bias is not None,
                BETA_NONZERO=beta != 0,
            )  # fmt: skip

        return run

    def _prepare_tma_filter(self, p: ConvProblem, tiles: TileConfig, plain: Runner) -> Runner:
        """Backward-filter with TMA operands: block_m output channels x block_n input channels
        per tile, block_k of dy's pixels per step; split over this algorithm's splits (partial
        sums in the workspace, the same bytes the pointer path declares)."""
        geo = tma_filter_geometry(p, tiles)
        rects = conv_tma.rectangles(geo)
        per_split = cdiv(rects, self.splits(p))
        splits = cdiv(rects, per_split)
        tiles_kc = cdiv(geo.kg, tiles.block_m) * cdiv(geo.cg, tiles.block_n)
        entries = p.groups * math.prod(p.kernel)
        # Many splits: the partials are summed by a launch of their own, as BrgemmLaunch does.
        apart = splits >= BrgemmLaunch.FINISH_APART_FROM
        kernel = KernelLaunch(
            conv_tma.tma_conv_filter_kernel, (tiles_kc, entries * splits),
            dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages),
            geo=geo, rects_per_split=per_split, PRECISION=dot_precision(p), UPCAST=INTERPRETED,
            SPLITS=splits, FINISH=not apart, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
        )  # fmt: skip
        finishes = _filter_split_finishes(p, splits) if apart else {}  # by beta != 0

        def run(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
            if not tma_aligned(t.x, t.y):
                plain(t, workspace, alpha, beta)
                return
            ws = arrivals = t.w  # not read without splits
            if splits > 1:
                ws = workspace.view(torch.float32)
                if not apart:
                    arrivals = stream_counters(t.w.device, tiles_kc * entries)
            kernel(
                X=t.x, DY=t.y, DW=t.w, WS=ws, ARRIVALS=arrivals, alpha=float(alpha),
                beta=float(beta), BETA_NONZERO=beta != 0,
            )  # fmt: skip
            if apart:
                finishes[beta != 0](ws, t.w, t.w, float(alpha), float(beta))

        return run

    def _prepare_backward_data(self, p: ConvProblem, geo, tiles: TileConfig) -> Runner:
        """One GEMM per stride phase (a single one at stride 1), each split as this algorithm
        splits; a split phase's partial sums take the next part of the workspace."""
        pointwise = pointwise_operands(p, geo)
        splits = self._tile_splits(p, tiles)
        kg, cg = p.out_channels // p.groups, p.in_channels // p.groups
        gemms = []
        for phase in data_phases(p):
            pixels = p.batch * math.prod(phase.count)
            if pixels == 0:
                continue
            g = DataGeometry(geo, static_phase_taps(phase))
            a = Operand(ca.bwd_data_a_setup, ca.bwd_data_a_load, g)
            b = Operand(ca.bwd_data_b_setup, ca.bwd_data_b_load, g)
            if pointwise is not None:
                a, b = pointwise
            steps = math.prod(phase.taps) * cdiv(kg, tiles.block_k)
            gemms.append(
                BrgemmLaunch(
                    a,
                    b,
                    Output(ca.bwd_data_c_addr, g),
                    m=pixels,
                    n=cg,
                    steps=steps,
                    batches=p.groups,
                    tiles=tiles,
                    precision=dot_precision(p),
                    splits=splits,
                )  # fmt: skip
            )

        # The phases write disjoint pixels of dx: they run side by side (at stride 2 each
        # is a quarter of the pixels, too few tiles to fill the GPU late in a network), the
        # longest first.
        gemms.sort(key=lambda gemm: -gemm.steps_per_split)
        # Byte offsets of each phase's partial sums (none unsplit): the phases' pixels add up
        # to dx's, so they fit in workspace_bytes.
        offsets = list(itertools.accumulate((gemm.partial_bytes for gemm in gemms), initial=0))[:-1]

        def run(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
            calls = [
                functools.partial(
                    gemm,
                    t.y,
                    t.w,
                    t.x,
                    alpha=alpha,
                    beta=beta,
                    workspace=workspace[at : at + gemm.partial_bytes]
                    if gemm.partial_bytes
                    else None,
                )  # fmt: skip
                for gemm, at in zip(gemms, offsets, strict=True)
            ]
            run_concurrently(t.x.device, calls)

        return run


class ImplicitGemmSplitK(ImplicitGemm):
    name = "IMPLICIT_GEMM_SPLIT_K"
    hopper_directions = frozenset({Direction.BACKWARD_FILTER})

    def splits(self, p: ConvProblem) -> int:
        return split_count(p)

    def workspace_bytes(self, p: ConvProblem) -> int:
        rows, cols, _, batches = gemm_shape(p)
        splits = self.splits(p)
        if splits == 1:
            return 0
        if packed(p) and p.direction == Direction.BACKWARD_FILTER:
            # The filter-row tiles: padded columns, and their own splits.
            wide = filter_row_columns(p) * max(splits, filter_row_splits(p))
            return batches * rows * max(cols * splits, wide) * 4
        return batches * splits * rows * cols * 4
