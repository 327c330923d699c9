"""DIRECT: convolution of few input channels per group (depthwise and narrow grouped
convolutions) tap by tap on tiles of pixels x channels, every direction.

Such layers are memory-bound (at most 8 x taps multiply-adds per output element). Three kernel
families compute them, chosen per problem by the tile tuner (DirectTiles.kernel):

- "rows", depthwise only (kernels/depthwise.py): programs own bands of rows; forward rolls a
  ring of output rows down the band so that each input row is converted once for all the
  filter rows it meets; backward-data is that kernel on the flipped filter, once per stride
  phase at strides above 1; backward-filter walks rows, one filter row per program;
- "fma": float32 FMAs on flat tiles of pixels x channels (kernels/direct.py), every dtype and
  every case the others leave; float32 data is computed in strict float32 also under "tf32",
  which is at least as accurate as asked for;
- block-diagonal tensor-core tiles (kernels/direct_dot.py), float16 and bfloat16: several
  groups share one tile, the zeros off the diagonal cost tensor-core work the layer has to
  spare, and each tap costs a vector load and part of an MMA instead of a convert, an address
  and an FMA per element. Products are exact and sums float32, as in the FMA kernels. On flat
  tiles of pixels ("dot"), or on rows wider than 32 columns rolled down bands in a ring of
  output rows ("dot_rows": forward, and stride-1 backward-data as the forward of dy on the
  flipped filter), so that each input row is loaded once for every filter row it meets;
  backward-filter also with one accumulator per filter tap ("dot_taps"), which reads dy once
  per filter row and streams pipelined 2-D tiles.

Forward and backward-data read the filter from a copy packed in the workspace at each call:
the row and FMA kernels of depthwise layers a float32 copy tap-major (taps x K, rows padded
to 16 channels), so that a thread's channels of a tap are one vector load; the tensor-core
tiles their block-diagonal tiles, zeros included, each filter row's one contiguous block.
The FMA kernels of grouped layers read w itself.
Backward-filter reduces over every output pixel in two deterministic stages; its workspace
holds the float32 partial sums of each chunk of pixels (or rows), [chunks, K, C/groups, taps],
exactly `workspace_bytes`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, replace

import torch
import triton

from ..core import INTERPRETED, ConvProblem, Direction, cdiv
from ..kernels.brgemm import identity
from ..kernels.depthwise import (
    depthwise_filter_rows_kernel,
    depthwise_rows_kernel,
    depthwise_runs_kernel,
    pack_filter_kernel,
)
from ..kernels.direct import (
    MAX_ROW_TAPS,
    direct_backward_data_kernel,
    direct_filter_finish_kernel,
    direct_filter_partial_kernel,
    direct_filter_rows_kernel,
    direct_forward_kernel,
)
from ..kernels.direct_dot import (
    direct_dot_backward_data_kernel,
    direct_dot_filter_rows_kernel,
    direct_dot_filter_taps_kernel,
    direct_dot_forward_kernel,
    direct_dot_rows_forward_kernel,
    pack_block_diagonal_kernel,
)
from ..kernels.launch import KernelLaunch, TileConfig
from . import direct_gemm
from .base import ConvAlgorithm, ConvTensors, Runner
from .geometry import conv_geometry, multiprocessor_count, parallel_slots, strict_float32

#: Input channels per group that the FMA kernels unroll (each is one more load and FMA per tap).
MAX_CHANNELS_PER_GROUP = 8
#: Input channels per group of the tensor-core kernels (16-bit data): a super-group tile
#: holds at least one group.
MAX_TENSOR_CORE_CHANNELS = 64
#: (channels per group) x (filter taps): the rows of backward-filter's accumulator.
MAX_FILTER_ROWS = 4096
#: The heuristic prefers DIRECT for one input channel per group (depthwise) and up to this
#: many output channels per group: measured on an H100 (bf16, depthwise suite) at 0.5-1.0x of
#: cuDNN forward, where the GEMM paths ran at 0.01-0.02x. With 4 and 8 channels per group
#: (ResNeXt-50 32x4d, grouped suite) DIRECT measured 0.02-0.07x of cuDNN, its loads of the
#: group's input channels not vectorized, so those stay with the GEMM paths; re-measure both
#: when either changes.
PREFER_UP_TO_KG = 16
#: In float16 and bfloat16 the heuristic also prefers DIRECT for grouped layers of up to this
#: many input channels per group (block-diagonal tensor-core tiles).
PREFER_UP_TO_CG = 32
#: In strict float32 (no tensor cores on either side) the heuristic prefers DIRECT for the
#: weight gradient of ungrouped layers of up to this many input channels (RGB stems): the
#: implicit GEMM's output is K x (C x taps), 64 x 147 for ResNet-50's stem, a few narrow
#: tiles each summing every pixel, where DIRECT spreads the pixels over the whole GPU.
#: Measured on an H200 (resnet50 suite, `rtdnn bench --algo all --math fp32`): ResNet-50's
#: 7x7 stem 3.70 ms against IMPLICIT_GEMM_SPLIT_K's 5.70.
PREFER_FILTER_GRADIENT_UP_TO_C = 4
#: In 16-bit data on a GPU the heuristic also prefers DIRECT for the weight gradient of
#: ungrouped layers of 16 to this many input and output channels with filters wider than 1x1:
#: such a layer is one super-group of the "dot_taps" tiles, with no zeros, which read dy once
#: per filter row where the split-K implicit GEMM reads it once per tap. Measured on an H100
#: (bf16, benchmarks/probes/dense_filter_taps_probe.py): ResNet-50's 64-channel 3x3 layer
#: (56x56) 79.7 -> 47.2 us (cuDNN 46.8), VGG-16's conv64_64_224 1135 -> 629 us (cuDNN 513);
#: its 1x1 layer only 32.2 -> 30.2, where the TMA GEMM competes. Channels-last x and dy only
#: (the tiles' lanes are channels; the NCHW layout was not measured).
PREFER_FILTER_TAPS_UP_TO_C = 64
#: Filter rows the forward ring of kernels/depthwise.py holds (an accumulator tile each).
MAX_RING_ROWS = 8
#: Channels of a "rows" tile at most.
MAX_ROWS_CHANNELS = 128
#: Taps of the filters whose "rows" backward-filter may hold every filter row in one program.
MAX_FILTER_ROWS_PER_PROGRAM = 9
#: Channels a backward-filter program covers, as assumed when the pixels are divided into
#: chunks (the chunk count, hence the workspace, must not depend on the tile chosen later).
_NOMINAL_BLOCK_C = 64
#: Shared memory that one wave of "dot_taps" programs may take on a multiprocessor (of the
#: H100's and H200's 228 KB), with which taps_chunks sizes that wave.
TAPS_SHARED_MEMORY = 192 * 1024


def _filter_rows(p: ConvProblem) -> int:
    return p.in_channels // p.groups * math.prod(p.kernel)


def _by_rows(p: ConvProblem) -> bool:
    """Backward-filter's first stage runs one program per filter row (direct_filter_rows_kernel)
    for filters up to MAX_ROW_TAPS wide, else one per (chunk, channel block) over every tap."""
    return p.kernel[-1] <= MAX_ROW_TAPS


def _filter_row_programs(p: ConvProblem) -> int:
    """Programs per (chunk, channel block) in backward-filter's first stage."""
    return _filter_rows(p) // p.kernel[-1] if _by_rows(p) else 1


def _chunks_within_data(p: ConvProblem, passes: int) -> int:
    """The most chunks whose float32 partial sums, moved `passes` times (written; read again),
    take at most a quarter of the bytes of x and dy, so that backward-filter's two stages stay
    bound by reading x and dy."""
    pixels = p.batch * math.prod(p.out_spatial)
    data = p.batch * math.prod(p.in_spatial) * p.in_channels + pixels * p.out_channels
    return data * p.dtype.itemsize // (4 * passes * p.out_channels * _filter_rows(p) * 4)


def filter_chunks(p: ConvProblem) -> tuple[int, int]:
    """(chunks, pixels per chunk) of backward-filter's first stage.

    Enough programs to keep every multiprocessor busy (about 8 per scheduling slot), each with
    at least 32 output pixels, and on a GPU the partial sums (written and read once more) at
    most a quarter of the bytes of x and dy, so that the reduction stays bandwidth-bound, unless
    that leaves fewer programs than scheduling slots."""
    pixels = p.batch * math.prod(p.out_spatial)
    k = p.out_channels
    c_blocks = cdiv(k, _NOMINAL_BLOCK_C) * _filter_row_programs(p)
    # On the CPU a few chunks, so that the tests' tiny shapes still split.
    chunks = cdiv(8 * parallel_slots(p.device), c_blocks) if p.device == "cuda" else 4
    chunks = min(chunks, cdiv(pixels, 32 if p.device == "cuda" else 4))
    if p.device == "cuda":  # tiny test shapes on the CPU still split
        # Small layers are latency-bound: keep at least one program per scheduling slot.
        floor = cdiv(parallel_slots(p.device), c_blocks)
        chunks = min(chunks, max(floor, _chunks_within_data(p, passes=2)))
    chunks = max(1, chunks)
    per_chunk = cdiv(pixels, chunks)
    return cdiv(pixels, per_chunk), per_chunk


def taps_lanes(p: ConvProblem) -> int:
    """Channel lanes of the "dot_taps" tiles: 64 for filters up to 3 wide (three 64 x 64
    float32 accumulators, 96 registers a thread in 4 warps), 32 for wider ones (up to
    MAX_ROW_TAPS accumulators)."""
    return 64 if p.kernel[-1] <= 3 else 32


def taps_chunks(p: ConvProblem, tiles: TileConfig) -> tuple[int, int]:
    """(chunks, pixels per chunk) of the "dot_taps" backward-filter with `tiles`: one wave of
    programs, as many as the multiprocessors hold at once (TAPS_SHARED_MEMORY over a
    program's pipelined tiles: per stage one dy tile and the filter row's input tiles), and
    the partial sums, counted once (filter_chunks counts their write and their read), at
    most a quarter of the bytes of x and dy.

    Measured on an H100 (grouped suite, `benchmarks/probes/grouped_filter_probe.py`): twice
    the chunks of one wave ran 1.1 to 1.3x slower (the partial sums written and summed again
    grow with the chunks), half of them up to 1.5x slower (multiprocessors idle), except on
    the 32-channels-per-group layers, whose filters are large beside their data (7x7: one
    wave 29 us, half a wave 26)."""
    pixels = p.batch * math.prod(p.out_spatial)
    if p.device != "cuda":  # the tests' tiny shapes still split
        chunks = min(2, pixels)
    else:
        sg, block_i, block_o = super_group(p, tiles.block_n)
        stage = (block_o + p.kernel[-1] * block_i) * tiles.block_m * p.dtype.itemsize
        resident = max(1, TAPS_SHARED_MEMORY // (tiles.num_stages * stage))
        filter_rows = math.prod(p.kernel[:-1])
        programs = cdiv(p.groups, sg) * filter_rows
        wave = multiprocessor_count(torch.cuda.current_device()) * resident
        chunks = min(cdiv(wave, programs), cdiv(pixels, tiles.block_m))
        chunks = max(1, min(chunks, _chunks_within_data(p, passes=1)))
    per_chunk = cdiv(pixels, chunks)
    return cdiv(pixels, per_chunk), per_chunk


def direct_preferred(p: ConvProblem) -> bool:
    """Whether the heuristic should try DIRECT first for `p`: depthwise layers, in 16-bit
    data grouped layers of up to PREFER_UP_TO_CG channels per group (tensor-core tiles), and
    on a GPU the weight gradient of few-channel layers in strict float32
    (PREFER_FILTER_GRADIENT_UP_TO_C) and of 16- to 64-channel layers in 16-bit data
    (PREFER_FILTER_TAPS_UP_TO_C)."""
    cg = p.in_channels // p.groups
    depthwise = cg == 1 and p.out_channels // p.groups <= PREFER_UP_TO_KG
    grouped = p.groups > 1 and cg <= PREFER_UP_TO_CG and _tensor_cores_apply(p)
    ungrouped_gradient = (
        p.direction == Direction.BACKWARD_FILTER and p.device == "cuda" and p.groups == 1
    )
    stem_gradient = (
        ungrouped_gradient and strict_float32(p) and p.in_channels <= PREFER_FILTER_GRADIENT_UP_TO_C
    )
    taps_gradient = (
        ungrouped_gradient
        and _tensor_cores_apply(p)
        and _channels_last(p)
        and p.y.strides[1] == 1  # dy channels-last too: the tiles' lanes are channels
        and 16 <= p.in_channels <= PREFER_FILTER_TAPS_UP_TO_C
        and p.out_channels <= PREFER_FILTER_TAPS_UP_TO_C
        and math.prod(p.kernel) > 1
    )
    return (depthwise or grouped or stem_gradient or taps_gradient) and Direct().supports(p) is None


def _channels_last(p: ConvProblem) -> bool:
    """x (read or written in every direction) has its channels innermost."""
    return p.x.strides[1] == 1 or p.in_channels == 1


@dataclass(frozen=True)
class DirectTiles(TileConfig):
    """DIRECT's tiles. kernel: the family, "fma" (kernels/direct.py), "dot" (block-diagonal
    tensor-core tiles, kernels/direct_dot.py), "dot_rows" (the same tiles rolled down bands of
    rows, forward), "dot_taps" (backward-filter, one tensor-core accumulator per filter tap)
    or "rows" (kernels/depthwise.py).
    block_m: pixels per tile (columns per tile for "rows" and "dot_rows", or runs of
    step_columns columns where that is above 1; per loop step in the FMA backward-filter);
    block_n: channels per tile ("fma", "rows") or channel lanes of a super-group ("dot",
    "dot_rows", "dot_taps"); block_k: pixels per loop step of the FMA backward-filter
    kernel over every tap, rows per band of the "rows" and "dot_rows" forward, or filter rows
    per program of the "rows" backward-filter (1 or the filter's height); step_rows: output
    rows per step of the "rows" forward and backward-filter; step_columns: consecutive output
    columns a thread holds in the "rows" forward (depthwise_runs_kernel, where above 1) and
    backward-filter. The "gemm" tiles (algos/direct_gemm.py) are the implicit GEMM's tiles
    (block_m, block_n, block_k, group_m, num_warps, num_stages) on super-groups of `width`
    channels."""

    kernel: str = "fma"
    step_rows: int = 1
    step_columns: int = 1
    width: int = 0


def _tensor_cores_apply(p: ConvProblem) -> bool:
    """The block-diagonal kernels take 16-bit data and filters at most MAX_ROW_TAPS wide (a
    filter row's input tiles sit side by side in one operand)."""
    return p.dtype in (torch.float16, torch.bfloat16) and _by_rows(p)


def _dot_tiles_offered(p: ConvProblem) -> bool:
    """Whether the tensor-core tiles are among p's candidates: where they apply, except for
    depthwise layers on a GPU. Measured on an H100 (bf16, depthwise suite): the row and FMA
    tiles beat them on every depthwise layer and direction (the FMA tiles by 1.1 to 2.5x; the
    last wins of the tensor-core tiles, stride-2 backward-data, went to the row kernels'
    stride phases). The interpreter takes every family on the tests' shapes."""
    return _tensor_cores_apply(p) and not (_depthwise(p) and p.device == "cuda")


def super_group(p: ConvProblem, lanes: int) -> tuple[int, int, int]:
    """(groups per program SG, input lanes BLOCK_I, output lanes BLOCK_O) for tiles of about
    `lanes` channels: SG groups side by side, each tile side a power of two of at least 16
    (a tensor-core operand's least size)."""
    g = p.groups
    cg, kg = p.in_channels // g, p.out_channels // g
    sg = max(1, min(g, lanes // max(cg, kg)))
    return sg, max(16, triton.next_power_of_2(sg * cg)), max(16, triton.next_power_of_2(sg * kg))


def _block_diagonal_elements(p: ConvProblem, lanes: tuple[int, int, int]) -> int:
    """Elements of the packed block-diagonal tiles (kernels/direct_dot.py) for super-groups
    `lanes` = (SG, BLOCK_I, BLOCK_O): one [KWP x BLOCK_I, BLOCK_O] tile per super-group and
    filter row."""
    sg, block_i, block_o = lanes
    tile = triton.next_power_of_2(p.kernel[-1]) * block_i * block_o
    return cdiv(p.groups, sg) * math.prod(p.kernel[:-1]) * tile


def _depthwise(p: ConvProblem) -> bool:
    return p.in_channels == p.groups


def _packs_filter(p: ConvProblem) -> bool:
    """Depthwise forward and backward-data read a packed float32 copy of the filter."""
    return _depthwise(p) and p.direction != Direction.BACKWARD_FILTER


def _packed_rows(p: ConvProblem) -> int:
    """Row length (channels, padded to 16 so that every row starts 64-byte aligned)."""
    return cdiv(p.out_channels, 16) * 16


def _packed_elements(p: ConvProblem) -> int:
    """Float32 elements of the packed filter: its rows, and MAX_ROWS_CHANNELS more, as the row
    kernels read a whole channel block of the last row unmasked (the values past the last
    channel go to outputs that are never stored)."""
    return math.prod(p.kernel) * _packed_rows(p) + MAX_ROWS_CHANNELS


def _rows_apply(p: ConvProblem) -> bool:
    """Whether the "rows" kernels of kernels/depthwise.py run p: depthwise; forward with
    dilation 1 along H and at most MAX_RING_ROWS output rows waiting on an input row (filter
    height / stride); backward-data likewise, with one output channel per input channel, at
    stride 1 or (dilation 1, every stride at most the filter's size) by stride phases;
    backward-filter with a filter at most MAX_ROW_TAPS wide."""
    if not _depthwise(p):
        return False
    geo = conv_geometry(p)
    if p.direction == Direction.BACKWARD_FILTER:
        return geo.kernel[2] <= MAX_ROW_TAPS
    ring = geo.dilation[1] == 1 and cdiv(geo.kernel[1], geo.stride[1]) <= MAX_RING_ROWS
    if p.direction == Direction.FORWARD:
        return ring
    # Backward-data by stride phases (see _data_passes): each phase must hold a tap.
    every_phase_has_taps = all(s <= r for s, r in zip(geo.stride, geo.kernel, strict=True))
    phases = geo.stride == (1, 1, 1) or (geo.dilation == (1, 1, 1) and every_phase_has_taps)
    return ring and phases and p.out_channels == p.groups


def _row_chunks(p: ConvProblem) -> tuple[int, int]:
    """(chunks, output rows per chunk) of the "rows" backward-filter: the rows (n, od, oh)
    divided among at most filter_chunks(p) chunks, so the same workspace holds them."""
    od, oh, _ = conv_geometry(p).out_size
    rows = p.batch * od * oh
    per_chunk = cdiv(rows, filter_chunks(p)[0])
    return cdiv(rows, per_chunk), per_chunk


def _rows_candidates(p: ConvProblem) -> list[TileConfig]:
    """Tiles of the "rows" kernels, as (E, R, BLOCK_C): E elements of a tile per thread (8
    channels of 16-bit data per pixel, so E / 8 pixels share each filter load), R output rows
    per forward step (each filter load serves R rows too). The forward ring holds
    (ceil(KH / stride) + R - 1) * E float32 accumulators and R * stride converted input tiles,
    all kept within registers. Backward-filter's: _filter_rows_candidates."""
    geo = conv_geometry(p)
    _, kh, kw = geo.kernel
    # The rows the kernel walks: y's, or dx's for backward-data (a forward convolution of dy).
    _, height, width = geo.in_size if p.direction == Direction.BACKWARD_DATA else geo.out_size
    channels = triton.next_power_of_2(p.out_channels)
    if p.direction == Direction.BACKWARD_FILTER:
        return _filter_rows_candidates(p, width, channels)
    if p.device != "cuda":
        return [DirectTiles(4, 16, 4, 1, 1, 1, kernel="rows", step_rows=2)]
    # Candidates that stay within 255 registers without spilling in the sm_90 compile (the
    # ring holds ceil(KH / stride) + R - 1 rows), the most often fastest on the H100's
    # depthwise suite first: it is what runs untuned.
    if cdiv(kh, geo.stride[1]) <= 3:
        shapes = [(8, 4, 32), (8, 2, 32), (16, 2, 32), (8, 2, 64)]
    elif kh <= 5:
        shapes = [(8, 4, 32), (8, 2, 32), (8, 2, 64), (8, 1, 32)]
    else:
        shapes = [(8, 2, 32), (8, 3, 32), (8, 2, 64), (8, 1, 32)]
    out = []
    for e, r, bc in shapes:
        bc = min(bc, channels)
        bw = max(1, min(e * 128 // bc, triton.next_power_of_2(width)))
        warps = max(1, min(4, bw * bc // (32 * e)))
        # Bands as tall as the image up to 32 rows: the ring's first KH - 1 steps and last
        # rows feed slots outside the band, (KH - 1) / band of the work.
        band = min(32, height)
        cfg = DirectTiles(bw, bc, band, 1, warps, 1, kernel="rows", step_rows=r)
        if cfg not in out:
            out.append(cfg)
    if p.direction == Direction.FORWARD:
        # Runs of columns (depthwise_runs_kernel), bands of 4 rows: no ring to fill. First
        # for rows of at most 8 columns, where the ring's tiles are mostly empty: on an H200
        # (bf16, EfficientNet-B0's and ConvNeXt-T's 7-column layers) 0.019 to 0.031 ms against
        # the ring's best 0.023 to 0.046.
        runs = [t for v in _column_runs(width, kw) for t in _run_tiles(width, v, channels, 4)]
        out = runs + out if width <= 8 else out + runs
    return out


def _column_runs(width: int, kw: int) -> list[int]:
    """Run lengths V for "rows" tiles whose threads hold V consecutive output columns (8
    elements per column: a 16-byte vector of 16-bit data), best first. A thread holds V
    accumulators (forward) or converted dy tiles (backward-filter) beside KW filter values or
    accumulators, so V stays within 16 - KW (at most 8): the run that pads the row least (7
    divides every width of the suites' layers: 112 to 7), then the best of at most 4 columns
    (fewer registers)."""

    def padding(v: int) -> int:
        return triton.next_power_of_2(cdiv(width, v)) * v - width

    runs = sorted(range(2, max(2, min(8, 16 - kw)) + 1), key=lambda v: (padding(v), -v))
    return list(dict.fromkeys([runs[0], next(v for v in runs if v <= 4)]))


def _run_tiles(
    width: int, v: int, channels: int, band: int, rows_per_step: int = 1
) -> list[TileConfig]:
    """Tiles of runs of v columns covering the row (at most 32 runs) of rows_per_step rows
    (backward-filter's step_rows), 64 or 32 channels, or more where that leaves less than a
    warp's worth of 8-element pieces; block_k = band (rows per band of the forward, filter
    rows per program of backward-filter)."""
    groups = min(32, triton.next_power_of_2(cdiv(width, v))) * rows_per_step
    out = []
    for bc in (64, 32):
        bc = min(bc, channels)
        while groups * bc < 256 and bc < min(channels, MAX_ROWS_CHANNELS):
            bc *= 2
        warps = max(1, min(4, groups * bc // 256))
        tile = DirectTiles(groups, bc, band, 1, warps, 1, kernel="rows")
        out.append(replace(tile, step_rows=rows_per_step, step_columns=v))
    return list(dict.fromkeys(out))


def _filter_rows_candidates(p: ConvProblem, width: int, channels: int) -> list[TileConfig]:
    """Tiles of the "rows" backward-filter: runs of columns (_column_runs), then the
    one-column tiles (each input tile loaded once per tap), for the tuner."""
    geo = conv_geometry(p)
    _, kh, kw = geo.kernel
    if p.device != "cuda":
        return [DirectTiles(2, 16, 1, 1, 1, 1, kernel="rows", step_columns=3)]
    runs = _column_runs(width, kw)
    # First what ran fastest on an H100 (bf16, the depthwise suite, tiles tuned): the longest
    # run for 7-wide filters and for rows of at most 8 columns, else the run of at most 4
    # (dw240.28.k5 0.119 against 0.162 ms); for 3x3 filters on rows wider than 16 columns,
    # every filter row in one program (dw32.112.k3 0.129 against 0.148 ms).
    if kw < 7 and width > 8:
        runs = runs[::-1]
    out = [t for v in runs for t in _run_tiles(width, v, channels, 1)]
    per_row = triton.next_power_of_2(cdiv(width, max(runs)))
    if per_row <= 2:
        # Rows of one or two runs: 8 runs a step from 8 // per_row rows, so that a program
        # has more than one row's loads in flight. First for 5- and 7-wide filters at
        # stride 1: on an H100 they won on every such layer (convnext.dw768.7.k7 0.047 ->
        # 0.027 ms, effb0.dw672.14.k5 0.117 -> 0.070) and lost at stride 2 (dw672.14.k5.s2
        # 0.049 against 0.043).
        several = _run_tiles(width, max(runs), channels, 1, rows_per_step=8 // per_row)
        first = kw >= 5 and geo.stride[2] == 1
        out = several + out if first else out + several
    if kh > 1 and kh * kw <= MAX_FILTER_ROWS_PER_PROGRAM:
        # Every filter row in one program (block_k = KH): KH * KW accumulators, runs of at
        # most 4 columns.
        all_rows = _run_tiles(width, min(runs), channels, kh)
        out = all_rows + out if width > 16 else out + all_rows
    wide = 16 if kw <= 6 else 8  # elements per thread
    for e, bc in ((wide, 32), (wide // 2, 64)):
        bc = min(bc, channels)
        bw = max(1, min(e * 128 // bc, triton.next_power_of_2(width)))
        warps = max(1, min(4, bw * bc // (32 * e)))
        out.append(DirectTiles(bw, bc, 1, 1, warps, 1, kernel="rows"))
    return list(dict.fromkeys(out))


def _dot_candidates(p: ConvProblem) -> list[TileConfig]:
    if p.device != "cuda":
        return [DirectTiles(16, 16, 1, 1, 1, 1, kernel="dot")]
    # A tile holds a filter row's taps side by side: wide lanes only for narrow filters.
    wide = 32 if triton.next_power_of_2(p.kernel[-1]) <= 4 else 16
    if p.direction == Direction.BACKWARD_FILTER:
        shapes = [(64, 16, 4), (128, 16, 4), (64, wide, 4)]
    else:
        shapes = [(128, 16, 4), (64, 16, 4), (256, 16, 8), (128, wide, 4)]
    shapes = list(dict.fromkeys(shapes))
    # One stage: three (the next row's loads as asynchronous copies) measured slower on an
    # H100, 0.39 -> 0.43 ms on convnext.dw96.56.k7 forward, 0.85 -> 1.04 ms backward-filter,
    # and no faster on the grouped layers.
    return [DirectTiles(bp, lanes, 1, 1, warps, 1, kernel="dot") for bp, lanes, warps in shapes]


def _dot_taps_candidates(p: ConvProblem) -> list[TileConfig]:
    """Backward-filter tiles with one accumulator per filter tap ("dot_taps"): (pixels a
    step, lanes, stages). On an H100 (grouped suite, bf16, 4 to 32 channels per group) 32
    pixels in 4 stages ran fastest on four layers of seven, 64 pixels in 3 or 4 stages on the
    others (by up to 1.1x); 8 warps never won."""
    if p.device != "cuda":
        return [DirectTiles(16, 16, 1, 1, 1, 1, kernel="dot_taps")]
    lanes = taps_lanes(p)
    shapes = [(32, 4), (64, 4), (64, 3), (32, 3)]
    return [DirectTiles(bp, lanes, 1, 1, 4, stages, kernel="dot_taps") for bp, stages in shapes]


def _gemm_candidates(p: ConvProblem) -> list[TileConfig]:
    """The "gemm" tiles: the implicit GEMM's tiles on each super-group width of
    algos/direct_gemm.py."""
    return [
        DirectTiles(**asdict(t), kernel="gemm", width=width)
        for width in direct_gemm.widths(p)
        for t in direct_gemm.inner_candidates(p, width)
    ]


def _dot_rows_apply(p: ConvProblem) -> bool:
    """Whether the tensor-core ring (direct_dot_rows_forward_kernel) runs p: forward and
    stride-1 backward-data, where the tensor-core tiles are offered, with dilation 1 along H
    and at most MAX_RING_ROWS output rows waiting on an input row."""
    if p.direction == Direction.BACKWARD_FILTER or not _dot_tiles_offered(p):
        return False
    geo = conv_geometry(p)
    ring = geo.dilation[1] == 1 and cdiv(geo.kernel[1], geo.stride[1]) <= MAX_RING_ROWS
    # Backward-data: the forward ring on dy at stride 1 (strided layers keep the stride
    # phases of direct_dot_backward_data_kernel).
    return ring and (p.direction == Direction.FORWARD or geo.stride == (1, 1, 1))


def _dot_rows_candidates(p: ConvProblem) -> list[TileConfig]:
    """(columns, rows per band) of the tensor-core ring, 16-lane super-groups in 4 warps: a
    tile as wide as the output row (64 or 128 columns), bands of 16 or 8 rows (the ring's
    first D steps feed slots before the band: D / band of the loads). Offered for rows wider
    than 32 columns. Measured on ResNeXt-50's grouped layers (H200, bf16): at 56 columns
    0.105 ms against the flat tiles' best 0.144, forward and backward-data alike; at 28 and
    14 columns (32- and 16-column tiles) 1.3 to 2.4x slower than the flat tiles; loading each
    step's rows one step ahead was slower (0.116 ms at 56 columns)."""
    if p.device != "cuda":
        return [DirectTiles(16, 16, 2, 1, 1, 1, kernel="dot_rows")]
    geo = conv_geometry(p)
    # The rows the kernel walks: y's, or dx's for backward-data (a forward convolution of dy).
    width = (geo.in_size if p.direction == Direction.BACKWARD_DATA else geo.out_size)[2]
    if width <= 32:
        return []
    bw = min(128, triton.next_power_of_2(width))
    return [DirectTiles(bw, 16, band, 1, 4, 1, kernel="dot_rows") for band in (16, 8)]


def _fma_candidates(p: ConvProblem) -> list[TileConfig]:
    channels = p.in_channels if p.direction == Direction.BACKWARD_DATA else p.out_channels
    if p.direction == Direction.BACKWARD_FILTER and _by_rows(p):
        if p.device != "cuda":
            return [DirectTiles(8, 16, 1, 1, 1, 1)]
        if _channels_last(p):
            shapes = [(32, 64, 4), (16, 64, 4), (64, 64, 8)]
        else:
            shapes = [(256, 4, 4), (128, 8, 4)]
    elif p.direction == Direction.BACKWARD_FILTER:
        rows = triton.next_power_of_2(_filter_rows(p))
        if p.device != "cuda":
            return [DirectTiles(1, 16, 1, 1, 1, 1)]
        shapes = [(64, 2, 4), (32, 4, 4), (128, 1, 4)]
        # The accumulator (rows x channels) is held in registers: at most 64 float32 values a
        # thread in 4 warps, 32 for 16-bit data, where Triton 3.6's LLVM aborted the process
        # (an SLP vectorizer assertion) compiling 512 rows x 16 channels (AlexNet's stem).
        elements = 8192 if p.dtype == torch.float32 else 4096
        out = []
        for bc, unroll, warps in shapes:
            bc = max(1, min(bc, elements // rows, triton.next_power_of_2(channels)))
            cfg = DirectTiles(1, bc, unroll, 1, warps, 1)
            if cfg not in out:
                out.append(cfg)
        return out
    elif p.device != "cuda":
        return [DirectTiles(16, 16, 1, 1, 1, 1)]
    elif _channels_last(p):
        shapes = [(32, 64, 4), (64, 64, 4), (16, 128, 4), (128, 64, 8)]
    else:
        shapes = [(256, 4, 4), (128, 8, 4), (64, 32, 4)]
    out = []
    for bp, bc, warps in shapes:
        bc = min(bc, triton.next_power_of_2(channels))
        cfg = DirectTiles(bp, bc, 1, 1, warps, 1)
        if cfg not in out:
            out.append(cfg)
    return out


class Direct(ConvAlgorithm):
    name = "DIRECT"

    def supports(self, p: ConvProblem) -> str | None:
        cg = p.in_channels // p.groups
        kg = p.out_channels // p.groups
        where = f"(C={p.in_channels}, K={p.out_channels}, groups={p.groups})"
        if cg > MAX_CHANNELS_PER_GROUP and not _tensor_cores_apply(p):
            return (
                f"{cg} input channels per group {where}: DIRECT handles at most "
                f"{MAX_CHANNELS_PER_GROUP} in {p.dtype} (up to {MAX_TENSOR_CORE_CHANNELS} in "
                "float16 and bfloat16, backward-filter with filters at most "
                f"{MAX_ROW_TAPS} wide), the GEMM algorithms the rest"
            )
        if max(cg, kg) > MAX_TENSOR_CORE_CHANNELS:
            return (
                f"{max(cg, kg)} channels per group {where}: DIRECT handles at most "
                f"{MAX_TENSOR_CORE_CHANNELS}, the GEMM algorithms the rest"
            )
        if _filter_rows(p) > MAX_FILTER_ROWS:
            return (
                f"{cg} channels per group x {math.prod(p.kernel)} filter taps = "
                f"{_filter_rows(p)} filter elements per output channel: DIRECT handles at most "
                f"{MAX_FILTER_ROWS}"
            )
        return None

    def workspace_bytes(self, p: ConvProblem) -> int:
        """The most that any of p's tiles needs (the tile is chosen after the workspace is
        sized). Forward and backward-data: the packed filter; backward-filter: the partial
        sums; the "gemm" tiles: their wide filter (algos/direct_gemm.py)."""
        gemm = [direct_gemm.workspace_bytes(p, w) for w in direct_gemm.widths(p)]
        if p.direction != Direction.BACKWARD_FILTER:
            packed = _packed_elements(p) * 4 if _packs_filter(p) else 0
            if _dot_tiles_offered(p):
                lanes = {t.block_n for t in _dot_candidates(p) + _dot_rows_candidates(p)}
                tiles = max(_block_diagonal_elements(p, super_group(p, n)) for n in lanes)
                packed = max(packed, tiles * p.dtype.itemsize)
            return max([packed, *gemm])
        chunks, _ = filter_chunks(p)
        if _dot_tiles_offered(p):
            chunks = max([chunks, *(taps_chunks(p, t)[0] for t in _dot_taps_candidates(p))])
        return max([chunks * p.out_channels * _filter_rows(p) * 4, *gemm])

    def deterministic(self, p: ConvProblem) -> bool:
        return True

    def tile_candidates(self, p: ConvProblem) -> list[TileConfig]:
        """The first candidate is what runs without tuning (RTDNN_AUTOTUNE=0); see DirectTiles
        for the fields."""
        rows = _rows_candidates(p) if _rows_apply(p) else []
        # The ring first where it is offered (rows wider than 32 columns on a GPU): it
        # measured faster than the flat tiles there.
        dot = _dot_rows_candidates(p) if _dot_rows_apply(p) else []
        dot += _dot_candidates(p) if _dot_tiles_offered(p) else []
        gradient = p.direction == Direction.BACKWARD_FILTER
        taps = _dot_taps_candidates(p) if _dot_tiles_offered(p) and gradient else []
        cg = p.in_channels // p.groups
        # Several channels per group: the tensor-core tiles win where they apply. With 4 or
        # more on a GPU the FMA tiles are not offered at all: on ResNeXt-50's grouped layers
        # (H100, bf16, 4 and 8 channels per group) they took 1.8 to 14 ms against the
        # tensor-core tiles' 0.08 to 0.16, every layer and direction: the tuner compiled and
        # timed 3 or 4 of each layer's 7 or 8 candidates for nothing. The interpreter takes
        # every family on the tests' shapes.
        fma_lose = dot and cg >= 4 and p.device == "cuda"
        fma = _fma_candidates(p) if cg <= MAX_CHANNELS_PER_GROUP and not fma_lose else []
        gemm = _gemm_candidates(p)
        # On a GPU from 4 channels per group, first what measured fastest on every ResNeXt-50
        # grouped layer (H100, bf16, 4 to 32 channels per group): in forward and backward-data
        # the super-groups through the implicit GEMM (algos/direct_gemm.py), in
        # backward-filter the one-accumulator-per-tap tiles (1.1 to 1.5x faster than the
        # block-diagonal tiles and the GEMM's, benchmarks/probes/grouped_filter_probe.py).
        # The interpreter keeps the block-diagonal tiles first, which the tests' shapes
        # exercise.
        if p.device == "cuda" and cg >= 4:
            return taps + gemm + dot + rows + fma
        return dot + taps + rows + fma + gemm

    def prepare(self, p: ConvProblem, tiles: TileConfig) -> Runner:
        kernel = getattr(tiles, "kernel", "fma")
        if kernel == "gemm":
            return direct_gemm.prepare(p, tiles.width, tiles.base())
        if kernel == "rows":
            return _prepare_rows(p, tiles)
        return _prepare_flat(p, tiles, kernel in ("dot", "dot_rows", "dot_taps"))


def _packing(p: ConvProblem, geo, flip: bool):
    """The launch that packs p's filter for the forward and backward-data kernels (see
    Direct.workspace_bytes), and the geometry that reads the packed copy in place of w."""
    k, kp = p.out_channels, _packed_rows(p)
    taps = math.prod(geo.kernel)
    pack = KernelLaunch(
        pack_filter_kernel, (cdiv(taps * k, 256),), dict(num_warps=4), geo=geo, K=k,
        KP=kp, FLIP=flip, BLOCK=256,
    )  # fmt: skip
    _, kh, kw = geo.kernel
    packed = geo._replace(
        w_strides=(1, 0, kh * kw * kp, kw * kp, kp), offsets=(geo.offsets[0], 0, geo.offsets[2])
    )
    return pack, packed, _packed_elements(p)


def _prepare_rows(p: ConvProblem, tiles: TileConfig) -> Runner:
    """The "rows" kernels (kernels/depthwise.py)."""
    geo = conv_geometry(p)
    kd, kh, kw = geo.kernel
    warps = dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    bw, bc = tiles.block_m, tiles.block_n
    k = p.out_channels
    kg = k // p.groups
    launches: dict[tuple, KernelLaunch] = {}

    if p.direction == Direction.BACKWARD_FILTER:
        chunks, per_chunk = _row_chunks(p)
        fh = tiles.block_k  # filter rows per program: 1 or KH
        partial = KernelLaunch(
            depthwise_filter_rows_kernel, (chunks * cdiv(k, bc) * kd * (kh // fh),), warps,
            geo=geo, K=k, rows_per_chunk=per_chunk, KG=kg, KD=kd, KH=kh, KW=kw,
            SW=geo.stride[2], DW=geo.dilation[2], FH=fh, V=tiles.step_columns,
            RR=tiles.step_rows, BLOCK_W=bw, BLOCK_C=bc,
        )  # fmt: skip
        return _filter_runner(p, geo, partial, chunks, launches)

    forward = p.direction == Direction.FORWARD
    pack, _, packed_elements = _packing(p, geo, flip=not forward)
    full = (kh * kw, kw, 1)  # the packed filter's strides, in taps
    passes = [(geo, full, 0)] if forward else _data_passes(geo)
    kp = _packed_rows(p)

    def launch_for(run_geo, strides, first_tap, key) -> KernelLaunch:
        od, oh, ow = run_geo.out_size
        rows = min(tiles.block_k, oh)
        v = tiles.step_columns
        grid = (p.batch * od * cdiv(oh, rows) * cdiv(ow, bw * v) * cdiv(k, bc),)
        pd, ph, pw = strides
        rd, rh, rw = run_geo.kernel
        shared = dict(
            geo=run_geo, K=k, KP=kp, PD=pd, PH=ph, PW=pw, KG=kg if forward else 1, KD=rd,
            KH=rh, KW=rw, ACTIVATION=identity, HAS_BIAS=key[0], BETA_NONZERO=key[1], ROWS=rows,
            BLOCK_W=bw, BLOCK_C=bc,
        )  # fmt: skip
        if v > 1:
            return KernelLaunch(
                depthwise_runs_kernel, grid, warps, SW=run_geo.stride[2],
                DW=run_geo.dilation[2], V=v, **shared,
            )  # fmt: skip
        return KernelLaunch(
            depthwise_rows_kernel, grid, warps, S=run_geo.stride[1], R=tiles.step_rows, **shared
        )

    def run(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
        packed = workspace[: packed_elements * 4].view(torch.float32)
        pack(W=t.w, P=packed)
        key = (t.bias is not None, beta != 0)
        if key not in launches:
            launches[key] = [(launch_for(*ps, key), ps[2]) for ps in passes]
        src, dst = (t.x, t.y) if forward else (t.y, t.x)
        bias = t.bias if t.bias is not None else dst
        for launch, first_tap in launches[key]:
            taps = packed[first_tap * kp :] if first_tap else packed
            launch(X=src, P=taps, Y=dst, BIAS=bias, alpha=float(alpha), beta=float(beta))

    return run


def _flipped_filter(p: ConvProblem):
    """p's geometry with the filter read flipped along every spatial axis: the geometry of the
    same problem in the other mode (convolution reads the filter flipped)."""
    other = "cross_correlation" if p.conv.mode == "convolution" else "convolution"
    return conv_geometry(replace(p, conv=replace(p.conv, mode=other)))


def _data_passes(geo) -> list[tuple]:
    """Backward-data as forward convolutions of dy with the filter packed flipped, each as
    (its geometry, the packed filter's strides in taps, its first tap).

    At stride 1, one: padding mirrored, (R - 1) * dil - pad. At stride s (dilation 1), one per
    stride phase q = (q_d, q_h, q_w): the dx elements i with (i + pad) % s == q, s apart from
    the first, take dy's rows m - t with the taps r = q + s * t, a stride-1 correlation with
    those taps reversed, which in the flipped filter lie s apart from R - 1 - q - s * (T - 1)
    (T taps). So no program meets a tap that cannot reach its pixel."""
    kd, kh, kw = geo.kernel
    if geo.stride == (1, 1, 1):
        mirrored = zip(geo.kernel, geo.dilation, geo.padding, strict=True)
        run_geo = geo._replace(
            in_size=geo.out_size, out_size=geo.in_size,
            padding=tuple((r - 1) * d - q for r, d, q in mirrored),
            x_strides=geo.y_strides, y_strides=geo.x_strides,
            offsets=(geo.offsets[2], 0, geo.offsets[0]),
        )  # fmt: skip
        return [(run_geo, (kh * kw, kw, 1), 0)]
    per_dim = []
    for size, r, s, pad in zip(geo.in_size, geo.kernel, geo.stride, geo.padding, strict=True):
        options = []
        for q in range(s):
            taps = len(range(q, r, s))
            first = (q - pad) % s  # the first dx index of the phase
            count = max(0, cdiv(size - first, s))
            m0 = (first + pad - q) // s  # its dy row for tap q
            options.append((taps, first, count, taps - 1 - m0, r - 1 - q - s * (taps - 1)))
        per_dim.append(options)
    xs_n, xs_c, *xs_spatial = geo.x_strides
    passes = []
    for combo in itertools.product(*per_dim):
        taps, first, count, padding, base = zip(*combo, strict=True)
        if 0 in count:
            continue
        run_geo = geo._replace(
            in_size=geo.out_size, out_size=count, kernel=taps, stride=(1, 1, 1),
            padding=padding, x_strides=geo.y_strides,
            y_strides=(xs_n, xs_c, *(st * s for st, s in zip(xs_spatial, geo.stride, strict=True))),
            offsets=(geo.offsets[2], 0,
                     geo.offsets[0] + sum(f * st for f, st in zip(first, xs_spatial, strict=True))),
        )  # fmt: skip
        strides = (geo.stride[0] * kh * kw, geo.stride[1] * kw, geo.stride[2])
        passes.append((run_geo, strides, base[0] * kh * kw + base[1] * kw + base[2]))
    return passes


def _filter_runner(
    p: ConvProblem, geo, partial: KernelLaunch, chunks: int, launches, tap_major: bool = False
) -> Runner:
    """Backward-filter's two stages: `partial` writes the chunks' float32 partial sums into the
    workspace ([chunk, k, j, tap], or [chunk, tap, k, j] when `tap_major`),
    direct_filter_finish_kernel adds them in order into dw."""
    elements = p.out_channels * _filter_rows(p)
    kd, kh, kw = geo.kernel
    # Enough programs over the filter's elements, each adding up to 64 chunks per step.
    block_chunks = min(64, triton.next_power_of_2(chunks))
    block_e = 32 if p.device == "cuda" else 16
    grid = (cdiv(elements, block_e),)
    nbytes = chunks * elements * 4

    def run_backward_filter(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
        ws = workspace[:nbytes].view(torch.float32)
        partial(X=t.x, DY=t.y, WS=ws)
        key = beta != 0
        finish = launches.get(key)
        if finish is None:
            finish = launches[key] = KernelLaunch(
                direct_filter_finish_kernel, grid, dict(num_warps=4), geo=geo, K=p.out_channels,
                chunks=chunks, BETA_NONZERO=key, BLOCK_CHUNKS=block_chunks, BLOCK_E=block_e,
                CG=p.in_channels // p.groups, KD=kd, KH=kh, KW=kw, TAP_MAJOR=tap_major,
            )  # fmt: skip
        finish(WS=ws, DW=t.w, alpha=float(alpha), beta=float(beta))

    return run_backward_filter


def _prepare_flat(p: ConvProblem, tiles: TileConfig, tensor_cores: bool) -> Runner:
    """The flat-tile kernels: FMA (kernels/direct.py) or block-diagonal tensor-core tiles
    (kernels/direct_dot.py)."""
    geo = conv_geometry(p)
    g = p.groups
    kd, kh, kw = geo.kernel
    shape = dict(CG=p.in_channels // g, KG=p.out_channels // g, KD=kd, KH=kh, KW=kw)
    warps = dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    bp, bc = tiles.block_m, tiles.block_n
    if tensor_cores:
        sg, block_i, block_o = super_group(p, bc)
        # Programs per pixel block: one per super-group of SG groups.
        channel_blocks = cdiv(g, sg)
        sizes = dict(C=p.in_channels, K=p.out_channels, groups=g)
        tiling = dict(
            SG=sg, UPCAST=INTERPRETED, BLOCK_I=block_i, BLOCK_O=block_o,
            KWP=triton.next_power_of_2(kw), **shape,
        )  # fmt: skip
    launches: dict[tuple, KernelLaunch] = {}
    ring = getattr(tiles, "kernel", "fma") == "dot_rows"

    def ring_grid(run_geo) -> tuple[tuple[int], int]:
        """The tensor-core ring's grid over run_geo's output rows, and its rows per band."""
        od, oh, ow = run_geo.out_size
        rows = min(tiles.block_k, oh)
        return (p.batch * od * cdiv(oh, rows) * cdiv(ow, bp) * channel_blocks,), rows

    if p.direction != Direction.BACKWARD_FILTER:
        # The tensor-core tiles and the depthwise FMA tiles read a packed filter (see the
        # module docstring); the FMA tiles of grouped layers read w itself.
        pack = None
        if tensor_cores:
            packed_dtype = p.dtype
            packed_elements = _block_diagonal_elements(p, (sg, block_i, block_o))
            # Backward-data by the ring is a forward convolution of dy with the filter
            # flipped (and its tiles transposed): pack it from a flipped view of w.
            data_ring = ring and p.direction == Direction.BACKWARD_DATA
            pack_geo = _flipped_filter(p) if data_ring else geo
            pack = KernelLaunch(
                pack_block_diagonal_kernel, (cdiv(packed_elements, 1024),),
                dict(num_warps=4), geo=pack_geo, total=packed_elements, ROWS=kd * kh,
                TRANSPOSED=p.direction == Direction.BACKWARD_DATA, BLOCK=1024,
                **{k: v for k, v in tiling.items() if k != "UPCAST"}, **sizes,
            )  # fmt: skip
        elif _packs_filter(p):
            packed_dtype = torch.float32
            pack, geo, packed_elements = _packing(p, geo, flip=False)

        def filter_for(t: ConvTensors, workspace) -> torch.Tensor:
            if pack is None:
                return t.w
            nbytes = packed_elements * packed_dtype.itemsize
            packed = workspace[:nbytes].view(packed_dtype)
            pack(W=t.w, P=packed)
            return packed

    if p.direction == Direction.FORWARD:
        pixels = p.batch * math.prod(p.out_spatial)
        if ring:
            grid, rows = ring_grid(geo)
            kernel = direct_dot_rows_forward_kernel
            fixed = dict(**sizes, **tiling, S=geo.stride[1], ROWS=rows, BLOCK_W=bp)
        elif tensor_cores:
            grid = (cdiv(pixels, bp) * channel_blocks,)
            kernel, fixed = direct_dot_forward_kernel, dict(**sizes, **tiling, BLOCK_P=bp)
        else:
            grid = (cdiv(pixels, bp) * cdiv(p.out_channels, bc),)
            kernel = direct_forward_kernel
            fixed = dict(K=p.out_channels, BLOCK_C=bc, BLOCK_P=bp, **shape)

        def run_forward(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
            w = filter_for(t, workspace)
            key = (t.bias is not None, beta != 0)
            launch = launches.get(key)
            if launch is None:
                launch = launches[key] = KernelLaunch(
                    kernel, grid, warps, geo=geo, ACTIVATION=identity, HAS_BIAS=key[0],
                    BETA_NONZERO=key[1], **fixed,
                )  # fmt: skip
            bias = t.bias if t.bias is not None else t.y
            launch(X=t.x, Wt=w, Y=t.y, BIAS=bias, alpha=float(alpha), beta=float(beta))

        return run_forward

    if p.direction == Direction.BACKWARD_DATA and ring:
        # Stride 1: the forward ring over dx's rows, dy as its input, padding mirrored; the
        # roles of the channels swap (dy's K lanes in, dx's C lanes out).
        run_geo = _data_passes(geo)[0][0]
        grid, rows = ring_grid(run_geo)
        fixed = dict(
            C=p.out_channels, K=p.in_channels, groups=g, CG=shape["KG"], KG=shape["CG"],
            KD=kd, KH=kh, KW=kw, KWP=tiling["KWP"], SG=sg, UPCAST=INTERPRETED, BLOCK_I=block_o,
            BLOCK_O=block_i, S=1, ROWS=rows, BLOCK_W=bp, ACTIVATION=identity, HAS_BIAS=False,
        )  # fmt: skip

        def run_backward_data_ring(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
            w = filter_for(t, workspace)
            key = beta != 0
            launch = launches.get(key)
            if launch is None:
                launch = launches[key] = KernelLaunch(
                    direct_dot_rows_forward_kernel, grid, warps, geo=run_geo, BETA_NONZERO=key,
                    **fixed,
                )  # fmt: skip
            launch(X=t.y, Wt=w, Y=t.x, BIAS=t.x, alpha=float(alpha), beta=float(beta))

        return run_backward_data_ring

    if p.direction == Direction.BACKWARD_DATA:
        pixels = p.batch * math.prod(p.in_spatial)
        if tensor_cores:
            # Strided: one block of pixels per stride phase (see the kernel), each phase
            # cdiv(size, stride) pixels along each axis.
            phased = geo.stride != (1, 1, 1)
            if phased:
                per_phase = p.batch * math.prod(
                    cdiv(n, s) for n, s in zip(geo.in_size, geo.stride, strict=True)
                )
                blocks = math.prod(geo.stride) * cdiv(per_phase, bp)
            else:
                blocks = cdiv(pixels, bp)
            grid = (blocks * channel_blocks,)
            kernel = direct_dot_backward_data_kernel
            fixed = dict(**sizes, **tiling, PHASED=phased)
        else:
            grid = (cdiv(pixels, bp) * cdiv(p.in_channels, bc),)
            kernel = direct_backward_data_kernel
            fixed = dict(C=p.in_channels, BLOCK_C=bc, **shape)

        def run_backward_data(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
            w = filter_for(t, workspace)
            key = beta != 0
            launch = launches.get(key)
            if launch is None:
                launch = launches[key] = KernelLaunch(
                    kernel, grid, warps, geo=geo, BETA_NONZERO=key, BLOCK_P=bp, **fixed
                )
            launch(DY=t.y, Wt=w, DX=t.x, alpha=float(alpha), beta=float(beta))

        return run_backward_data

    chunks, per_chunk = filter_chunks(p)
    k = p.out_channels
    tap_major = getattr(tiles, "kernel", "fma") == "dot_taps"
    if tap_major:
        chunks, per_chunk = taps_chunks(p, tiles)
        taps_tiling = {name: v for name, v in tiling.items() if name != "KWP"}
        partial = KernelLaunch(
            direct_dot_filter_taps_kernel, (chunks * channel_blocks * kd * kh,), warps,
            geo=geo, pixels_per_chunk=per_chunk, BLOCK_P=bp, **sizes, **taps_tiling,
        )  # fmt: skip
    elif tensor_cores:
        programs = chunks * channel_blocks * kd * kh
        partial = KernelLaunch(
            direct_dot_filter_rows_kernel, (programs,), warps, geo=geo,
            pixels_per_chunk=per_chunk, BLOCK_P=bp, **sizes, **tiling,
        )  # fmt: skip
    elif _by_rows(p):
        programs = chunks * cdiv(k, bc) * _filter_row_programs(p)
        partial = KernelLaunch(
            direct_filter_rows_kernel, (programs,), warps, geo=geo, K=k,
            pixels_per_chunk=per_chunk, BLOCK_P=bp, BLOCK_C=bc, **shape,
        )  # fmt: skip
    else:
        programs = chunks * cdiv(k, bc)
        partial = KernelLaunch(
            direct_filter_partial_kernel, (programs,), warps, geo=geo, K=k,
            pixels_per_chunk=per_chunk, BLOCK_R=triton.next_power_of_2(_filter_rows(p)),
            BLOCK_C=bc, UNROLL=tiles.block_k, **shape,
        )  # fmt: skip
    return _filter_runner(p, geo, partial, chunks, launches, tap_major)
