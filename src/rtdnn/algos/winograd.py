"""WINOGRAD_NONFUSED and WINOGRAD: 2-D 3x3 convolutions at stride 1 by Winograd's minimal
filtering F(m x m, 3 x 3), m = 2 or 4 (kernels/winograd.py). WINOGRAD_NONFUSED runs three stages
through a float32 workspace, in every direction:

    forward          V = BT x_tile B      U = G w G^T         M[p] = V[p] @ U[p]    y = AT M A
    backward-data    the same on dy, with the filter transposed (k <-> c) and rotated by 180
                     degrees and the padding 2 - pad (negative padding: tiles start inside dy)
    backward-filter  V = BT x_tile B      Y = A dy_tile AT    D[p] = Y[p]^T @ V[p]  dw = G^T D G

where p runs over the (m + 2)^2 transform points, tiles are m x m pixels of the output (of dy
for backward-filter), and each M[p] (or D[p]) is one batch entry, per group, of the batch-reduce
GEMM (plain strided matrices). Backward-filter of a few input channels a group (an RGB stem)
first tries float32 FMAs that transform both tiles in registers and sum D[p] over chunks of
tiles (filter_fma_kernel): the GEMM's transformed planes would hold 4x dy's bytes, for a
product 3 columns wide. The output transform applies alpha, the bias and beta and writes
through the output's strides. Backward-filter's GEMM reduces over every tile; it is split into
float32 partial sums (summed in a fixed order) when its output alone cannot fill the GPU.

WINOGRAD (fused), forward and backward-data: the input transform, the products of every point
and the output transform in one kernel per block of tiles and output channels; only the
transformed filter goes through the workspace. Where at most FMA_CHANNELS channels a group are
reduced (an RGB stem's forward) or written (its backward-data), its first tiles multiply with
float32 FMAs instead of tensor cores, whose products would reduce over 8 or more channels or
write 16 or more, mostly padding (F(2x2) only).

Products: strict float32 (math="fp32") multiplies as 3xTF32 (each float32 operand split into
a TF32 high and low part, three tensor-core products summed in float32): on tensor cores, and
measured more accurate than IEEE float32 products here, whose long backward-filter reduction
loses most (table below; 1.9e-6 against 7.8e-6 on ResNet-50's 64-channel 56x56 layer at batch
64). With the GEMM tiles below, the best tile with IEEE products ran within 11% of the best
with 3xTF32, faster or slower by layer (winograd_sweep.py). math="tf32" multiplies as TF32.
Float16 and bfloat16 data are transformed in float32 and multiplied as TF32: the transformed
operands keep 10 bits of mantissa, at least as many as the data had.

Tile size: F(4x4) does 36 products per 16 output pixels (4x fewer multiplications than direct
convolution), F(2x2) 16 per 4 (2.25x), but F(4x4)'s transforms amplify rounding errors more.
Both are tile candidates (timed on the GPU, the first one taken elsewhere), where the error
allows (OUT_TILES). Relative error ||out - ref|| / ||ref|| against the float64 reference, H100,
N=8, C=K=64, 28x28, padding 1, channels-last, standard-normal data (benchmarks/probes/
winograd_probe.py), forward / backward-data / backward-filter:

    format (products)     F(2x2)                 F(4x4)                 IMPLICIT_GEMM
    float32 fp32 (3xTF32) 2.0e-7/2.0e-7/2.4e-7   1.2e-6/1.2e-6/1.4e-6   4.2e-7/4.3e-7/1.4e-6
    float32 fp32 (IEEE)   2.7e-7/2.6e-7/7.0e-7   1.7e-6/1.7e-6/4.0e-6
    float32 tf32          8.8e-4/8.8e-4/8.8e-4   3.5e-3/3.5e-3/3.5e-3   7.7e-4/7.7e-4/7.8e-4
    float16 (TF32)        8.3e-4/8.3e-4/8.0e-4   3.6e-3/3.6e-3/3.6e-3   2.1e-4/2.1e-4/2.1e-4
    bfloat16 (TF32)       1.7e-3/1.7e-3/1.7e-3   3.7e-3/3.8e-3/3.8e-3   1.7e-3/1.7e-3/1.6e-3

WINOGRAD (fused) measured the same to two digits in forward and backward-data. So F(4x4) is
offered for strict float32 and bfloat16 (within 1e-5 and 1e-2), F(2x2) only for TF32 and
float16, where F(4x4) is 4-17x IMPLICIT_GEMM's error and above their tolerances (2e-3, 1e-3).

Time, strict float32, H200, ResNet-50's 3x3 stride-1 layers at batch 64 (the resnet50
suite's), channels-last, F(4x4), the first GEMM tile candidate (RTDNN_AUTOTUNE=0), us
(WINOGRAD_NONFUSED / IMPLICIT_GEMM / cuDNN in benchmark mode, TF32 off; benchmarks/probes/
winograd_probe.py stages):

    layer            forward              backward-data        backward-filter
    64ch 56x56       216 / 1428 / 423     216 / 732 / 425      252 / 18262 / 580
    128ch 28x28      153 / 711 / 212      152 / 362 / 298      151 / 4571 / 247
    256ch 14x14      162 / 937 / 237      160 / 469 / 570      168 / 1155 / 196
    512ch 7x7        184 / 935 / 512      175 / 470 / 591      141 / 578 / 186

1.17x to 3.55x cuDNN, 2.4x to 72x IMPLICIT_GEMM; VGG-16's 3x3 layers of 64 channels and more
1.11x to 2.84x cuDNN. With the generic GEMM's 128 x 128 tiles (before DATA_TILES) the same
calls took 371 / 372 / 618 us at 56x56 (0.83x cuDNN in backward-filter) and 1.2x to 2.8x
longer elsewhere: the GEMM of the 64-channel layer, one 64-deep step a tile, ran a
128 x 128 x 64 tile (half of it padding) with 192 KiB of shared memory, one program a
multiprocessor.

Determinism: every sum is in a fixed order; runs are bit-identical.

Workspace: the transformed input, filter and product planes in float32 (plus split-K partial
sums for backward-filter); `workspace_bytes` is the need of the largest tile candidate (F(2x2)
has 4/2.25 times more tiles' worth of points than F(4x4) on large images), of which the
chosen one uses a prefix.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch
import triton

from ..core import ConvProblem, Direction, cdiv
from ..core.tensor import MAX_ELEMENTS
from ..kernels import strided
from ..kernels.launch import BrgemmLaunch, KernelLaunch, Operand, Output, TileConfig
from ..kernels.strided import StridedGeometry
from ..kernels.winograd import (
    FilterGeometry,
    TileGeometry,
    Transforms,
    filter_fma_kernel,
    filter_output_kernel,
    filter_transform_kernel,
    fused_kernel,
    output_transform_kernel,
    tile_transform_kernel,
    transforms,
)
from .base import ConvAlgorithm, ConvTensors, Runner
from .geometry import conv_geometry, parallel_slots, strict_float32
from .tiles import tile_candidates as gemm_tiles

#: Output tile sizes m of F(m x m, 3 x 3) per number format (see `number_format`), the default
#: first: F(4x4) only where its error stays within the format's tolerance (the table above).
OUT_TILES = {"fp32": (4, 2), "tf32": (2,), "float16": (2,), "bfloat16": (2, 4)}
#: tl.dot precision of the products per number format: the operands are float32 transforms.
PRECISION = {"fp32": "tf32x3", "tf32": "tf32", "float16": "tf32", "bfloat16": "tf32"}
#: WINOGRAD (fused) multiplies layers of at most this many reduced channels a group with
#: float32 FMAs (fused_kernel, FMA), first: a tensor-core product reduces over 8 or more.
FMA_CHANNELS = 4
#: Its (tiles, output channels, warps) a program on a GPU: 2 to 4 elements of each of the 16
#: point accumulators a thread; ptxas (offline, sm_90) spills none at 16 x 16 over 4 warps
#: (first), 52 to 60 bytes at the others, 988 at 32 x 32 over 4 warps (8 elements).
FMA_SHAPES = [(16, 16, 4), (16, 32, 4), (32, 32, 8), (16, 64, 8)]
#: WINOGRAD (fused) where at most FMA_CHANNELS channels a group are written: (tiles, reduced
#: channels a step, warps), each point's product [tiles, step] x [step, written] from FMAs;
#: shapes ptxas (offline, sm_90) compiles without spills (64 x 32 over 8 warps: 68 bytes).
NARROW_SHAPES = [(32, 16, 4), (32, 32, 8), (16, 32, 4), (16, 16, 4)]
#: WINOGRAD_NONFUSED's backward-filter for as few input channels a group: (tiles a step,
#: output channels, warps) a program of filter_fma_kernel, the shapes ptxas (offline, sm_90)
#: compiles without spills (16 x 64 over 8 warps spilled 648 bytes, 8 x 64 over 4: 8 to 204).
FILTER_FMA_SHAPES = [(8, 32, 4), (8, 64, 8)]


def number_format(p: ConvProblem) -> str:
    """ "fp32" (strict) or "tf32" for float32 data, else the 16-bit dtype's name."""
    if p.dtype == torch.float32:
        return p.conv.math
    return str(p.dtype).removeprefix("torch.")


@dataclass(frozen=True)
class WinogradTiles(TileConfig):
    """The GEMM's tiles and the Winograd output tile m of F(m x m, 3 x 3); for WINOGRAD
    (fused), `fma`: the products as float32 FMAs (fused_kernel's FMA; block_k unused)."""

    out_tile: int = 2
    fma: bool = False


class Plan(NamedTuple):
    """Sizes of one problem at one output tile size. `regions` are the workspace's float32
    planes in order, in elements."""

    tr: Transforms
    tiles: int  # N * tiles_h * tiles_w
    tiles_h: int
    tiles_w: int
    regions: tuple
    splits: int  # backward-filter's GEMM splits (1 elsewhere)


def _align(nbytes: int, to: int = 256) -> int:
    return (nbytes + to - 1) // to * to


def _tiled_size(p: ConvProblem) -> tuple[int, int]:
    """The image that is cut into output tiles: dx's for backward-data, y's (dy's) else."""
    size = p.in_spatial if p.direction == Direction.BACKWARD_DATA else p.out_spatial
    return size[0], size[1]


def _filter_splits(p: ConvProblem, points: int, tiles: int) -> int:
    """Backward-filter's GEMM (kg x cg per point and group, a reduction over every tile) is
    split when its output tiles alone cannot fill the device; each split keeps at least 512
    tiles of the reduction (16 on the CPU, so that the tests' tiny shapes split too)."""
    g = p.groups
    kg, cg = p.out_channels // g, p.in_channels // g
    if p.device != "cuda":
        return 2 if tiles >= 32 else 1
    outputs = cdiv(kg, 128) * cdiv(cg, 128) * points * g
    return max(1, min(cdiv(parallel_slots(p.device), outputs), tiles // 512))


def plan(p: ConvProblem, m: int) -> Plan:
    tr = transforms(m)
    h, w = _tiled_size(p)
    th, tw = cdiv(h, m), cdiv(w, m)
    tiles = p.batch * th * tw
    g, c, k = p.groups, p.in_channels, p.out_channels
    points = tr.points
    if p.direction == Direction.BACKWARD_FILTER:
        splits = _filter_splits(p, points, tiles)
        dw = points * k * (c // g)
        regions = (points * tiles * c, points * tiles * k, dw, dw * splits if splits > 1 else 0)
        return Plan(tr, tiles, th, tw, regions, splits)
    c_in, c_out = (c, k) if p.direction == Direction.FORWARD else (k, c)
    filters = points * c_in * (c_out // g)
    return Plan(tr, tiles, th, tw, (points * tiles * c_in, filters, points * tiles * c_out), 1)


def _offsets(regions: tuple) -> list[int]:
    """Byte offset of each region (each aligned to 256 bytes)."""
    out, at = [], 0
    for n in regions:
        out.append(at)
        at += _align(n * 4)
    return out


def _plan_bytes(pl: Plan) -> int:
    return max(at + n * 4 for at, n in zip(_offsets(pl.regions), pl.regions, strict=True) if n)


def _out_tiles(p: ConvProblem) -> tuple[int, ...]:
    """The output tile sizes to try for `p`, the default first. In the interpreter F(2x2) comes
    first: its cost there is per program, and F(2x2) runs 16 points' GEMMs to F(4x4)'s 36."""
    sizes = OUT_TILES[number_format(p)]
    return tuple(sorted(sizes)) if p.device != "cuda" else sizes


#: Channels per group, in and out, from which the heuristic runs strict-float32 3x3 layers
#: as WINOGRAD_NONFUSED: its GEMMs use tensor cores (3xTF32) where the implicit GEMM's strict
#: float32 products cannot. Measured on the H100 (BENCHMARKS.md, ResNet-50 forward at 64 to
#: 512 channels): 1.08-2.06x cuDNN against the implicit GEMM's 0.23-0.31x.
PREFER_FROM_CHANNELS = 16


def winograd_preferred(p: ConvProblem) -> bool:
    """Whether the heuristic should try WINOGRAD_NONFUSED first for `p`: a supported 3x3
    layer on a GPU in strict float32, with PREFER_FROM_CHANNELS channels per group or more."""
    g = p.groups
    wide = min(p.in_channels // g, p.out_channels // g) >= PREFER_FROM_CHANNELS
    on_gpu = p.device == "cuda" and strict_float32(p) and wide
    return on_gpu and WinogradNonfused().supports(p) is None


#: The GEMMs' tiles on a GPU, (block_m, block_n, block_k, warps, stages), the untuned choice
#: first. Forward and backward-data multiply (tiles x channels) planes by (channels x channels)
#: filters: a reduction of 64 to 512 channels; backward-filter reduces over every tile, split.
#: Tiles 64 columns wide ran fastest at every channel count from 64 to 512, 1.2x to 2.8x the
#: generic GEMM's 128 x 128 (H200, strict float32, ResNet-50's 3x3 layers at batch 64,
#: benchmarks/probes/winograd_sweep.py; BENCHMARKS.md, "Winograd's own GEMM tiles").
DATA_TILES = ((128, 64, 32, 4, 3), (256, 64, 32, 8, 3), (128, 64, 64, 4, 2), (64, 64, 64, 4, 2))
FILTER_TILES = ((128, 64, 32, 4, 4), (64, 64, 32, 4, 4), (64, 64, 64, 4, 3))


def _gpu_tiles(direction: Direction, rows: int) -> list[TileConfig]:
    """DATA_TILES or FILTER_TILES as TileConfigs; tiles taller than the GEMM's rows (a filter
    gradient of 64 output channels) go last, as they compute mostly padding."""
    shapes = FILTER_TILES if direction == Direction.BACKWARD_FILTER else DATA_TILES
    tiles = [TileConfig(bm, bn, bk, 8, warps, stages) for bm, bn, bk, warps, stages in shapes]
    return sorted(tiles, key=lambda t: t.block_m > max(64, rows))


def _transform_blocks(a: int, channels: int) -> tuple[int, int]:
    """(tiles, channels) per program of the tile transforms: a^2 values of each are live at
    once, so fewer for F(4x4); channels innermost for channels-last coalescing."""
    bc = min(32, triton.next_power_of_2(channels))
    return (512 if a == 4 else 256) // bc, bc


def data_geometries(p: ConvProblem, pl: Plan) -> tuple[TileGeometry, TileGeometry, FilterGeometry]:
    """(source tiles, output tiles, filter) of forward, and of backward-data as a forward
    convolution of dy with padding 2 - pad and the filter transposed and rotated."""
    g, pad = p.groups, p.conv.padding
    forward = p.direction == Direction.FORWARD
    c_in, c_out = (p.in_channels, p.out_channels) if forward else (p.out_channels, p.in_channels)
    ig, og = c_in // g, c_out // g
    src, dst = (p.x, p.y) if forward else (p.y, p.x)
    start = (-pad[0], -pad[1]) if forward else (pad[0] - 2, pad[1] - 2)
    in_geo = TileGeometry(
        pl.tiles, c_in, *src.shape[2:], pl.tiles_h, pl.tiles_w, src.strides, src.offset, *start
    )
    out_geo = TileGeometry(
        pl.tiles, c_out, *dst.shape[2:], pl.tiles_h, pl.tiles_w, dst.strides, dst.offset, 0, 0
    )
    # Backward-data reads w[g*kg + i, o] rotated by 180 degrees: flipped in cross-correlation
    # mode, as stored in convolution mode (conv_geometry flips it there).
    w = p.w.flipped((2, 3)) if (p.conv.mode == "convolution") == forward else p.w
    ws_k, ws_c, ws_h, ws_w = w.strides
    s_o, s_i = (ws_k, ws_c) if forward else (ws_c, ws_k)
    group_stride = (og if forward else ig) * ws_k
    filt_geo = FilterGeometry(g * ig * og, og, ig, (group_stride, s_o, s_i, ws_h, ws_w), w.offset)
    return in_geo, out_geo, filt_geo


class WinogradNonfused(ConvAlgorithm):
    name = "WINOGRAD_NONFUSED"

    def supports(self, p: ConvProblem) -> str | None:
        if p.spatial_dims != 2:
            return f"{p.spatial_dims}-D convolution: Winograd here is 2-D only"
        if p.kernel != (3, 3):
            return f"kernel {p.kernel}: Winograd here computes 3x3 filters only"
        if p.conv.stride != (1, 1):
            return f"stride {p.conv.stride}: Winograd needs stride 1"
        if p.conv.dilation != (1, 1):
            return f"dilation {p.conv.dilation}: Winograd needs dilation 1"
        for m in _out_tiles(p):
            # The GEMM addresses its planes with 32-bit offsets.
            if max(plan(p, m).regions) > MAX_ELEMENTS:
                return f"a transformed plane of F({m}x{m},3x3) exceeds 2**31 - 1 elements"
        return None

    def workspace_bytes(self, p: ConvProblem) -> int:
        return max(_plan_bytes(plan(p, m)) for m in _out_tiles(p))

    def deterministic(self, p: ConvProblem) -> bool:
        return True

    def _gemm_shape(self, p: ConvProblem, pl: Plan) -> tuple[int, int, int]:
        """(rows, cols, reduction) of each point's GEMM."""
        g = p.groups
        cg, kg = p.in_channels // g, p.out_channels // g
        if p.direction == Direction.FORWARD:
            return pl.tiles, kg, cg
        if p.direction == Direction.BACKWARD_DATA:
            return pl.tiles, cg, kg
        return kg, cg, pl.tiles

    def tile_candidates(self, p: ConvProblem) -> list[TileConfig]:
        out = []
        few = p.in_channels // p.groups <= FMA_CHANNELS and 2 in _out_tiles(p)
        if p.direction == Direction.BACKWARD_FILTER and few:
            # A few input channels a group (an RGB stem): float32 FMAs with the transforms in
            # registers first (filter_fma_kernel), as WINOGRAD's forward does.
            shapes = FILTER_FMA_SHAPES if p.device == "cuda" else [(8, 16, 1)]
            out += [WinogradTiles(bt, bk, 1, 1, w, 1, out_tile=2, fma=True) for bt, bk, w in shapes]
        for m in _out_tiles(p):
            rows, cols, depth = self._gemm_shape(p, plan(p, m))
            if p.device == "cuda":
                tiles = _gpu_tiles(p.direction, rows)
            else:
                # The operands are float32 (multiplied as TF32 or IEEE float32).
                tiles = gemm_tiles(p.device, torch.float32, rows, cols, depth)[:3]
                if p.direction == Direction.BACKWARD_FILTER:
                    # Short chunks of tiles, so that the tests' tiny shapes take several steps.
                    tiles = [TileConfig(t.block_m, t.block_n, 16, 1, 1, 1) for t in tiles]
            out += [WinogradTiles(**asdict(t), out_tile=m) for t in tiles]
        return out

    def prepare(self, p: ConvProblem, tiles: TileConfig) -> Runner:
        m = tiles.out_tile if isinstance(tiles, WinogradTiles) else _out_tiles(p)[0]
        pl = plan(p, m)
        precision = PRECISION[number_format(p)]
        if p.direction == Direction.BACKWARD_FILTER:
            return self._prepare_backward_filter(p, pl, tiles, precision)
        return self._prepare_data(p, pl, tiles, precision)

    def _prepare_data(self, p: ConvProblem, pl: Plan, tiles: TileConfig, precision) -> Runner:
        """Forward, and backward-data as a forward convolution of dy."""
        tr, a, m = pl.tr, pl.tr.tile, pl.tr.m
        g = p.groups
        forward = p.direction == Direction.FORWARD
        in_geo, out_geo, filt_geo = data_geometries(p, pl)
        c_in, c_out = in_geo.channels, out_geo.channels
        ig, og = c_in // g, c_out // g
        points = tr.points
        v_off, u_off, m_off = _offsets(pl.regions)
        v_n, u_n, m_n = pl.regions
        bt_, bc_ = _transform_blocks(a, c_in)
        warps = dict(num_warps=4)
        transform_in = KernelLaunch(
            tile_transform_kernel, (cdiv(pl.tiles, bt_), cdiv(c_in, bc_)), warps,
            geo=in_geo, MAT=tr.bt, L=a, STEP=m, BLOCK_T=bt_, BLOCK_C=bc_,
        )  # fmt: skip
        block = 128 if p.device == "cuda" else 64
        transform_w = KernelLaunch(
            filter_transform_kernel, (cdiv(filt_geo.elements, block),), warps,
            geo=filt_geo, MAT=tr.g, BLOCK=block,
        )  # fmt: skip
        v_geo = StridedGeometry(pl.tiles, ig, g, pl.tiles * c_in, ig, 0, c_in, 1, 0)
        u_geo = StridedGeometry(ig, og, g, g * ig * og, ig * og, 0, og, 1, 0)
        m_geo = StridedGeometry(pl.tiles, og, g, pl.tiles * c_out, og, 0, c_out, 1, 0)
        gemm = BrgemmLaunch(
            Operand(strided.strided_a_setup, strided.strided_a_load, v_geo),
            Operand(strided.strided_b_setup, strided.strided_b_load, u_geo),
            Output(strided.strided_c_addr, m_geo),
            m=pl.tiles, n=og, steps=cdiv(ig, tiles.block_k), batches=points * g,
            tiles=tiles, precision=precision,
        )  # fmt: skip
        bt_o, bc_o = _transform_blocks(a, c_out)
        out_grid = (cdiv(pl.tiles, bt_o), cdiv(c_out, bc_o))
        outputs: dict[tuple, KernelLaunch] = {}

        def run(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
            v = workspace[v_off : v_off + 4 * v_n].view(torch.float32)
            u = workspace[u_off : u_off + 4 * u_n].view(torch.float32)
            prod = workspace[m_off : m_off + 4 * m_n].view(torch.float32)
            source, dest = (t.x, t.y) if forward else (t.y, t.x)
            transform_in(SRC=source, WS=v)
            transform_w(Wt=t.w, WS=u)
            gemm(v, u, prod)
            key = (t.bias is not None, beta != 0)
            out = outputs.get(key)
            if out is None:
                out = outputs[key] = KernelLaunch(
                    output_transform_kernel, out_grid, warps, geo=out_geo, MAT=tr.at,
                    HAS_BIAS=key[0], BETA_NONZERO=key[1], BLOCK_T=bt_o, BLOCK_C=bc_o,
                )  # fmt: skip
            bias = t.bias if t.bias is not None else dest
            out(WS=prod, Y=dest, BIAS=bias, alpha=float(alpha), beta=float(beta))

        return run

    def _prepare_backward_filter(
        self, p: ConvProblem, pl: Plan, tiles: TileConfig, precision: str
    ) -> Runner:
        tr, a, m = pl.tr, pl.tr.tile, pl.tr.m
        g, pad = p.groups, p.conv.padding
        c, k = p.in_channels, p.out_channels
        cg, kg = c // g, k // g
        x_geo = TileGeometry(
            pl.tiles, c, *p.in_spatial, pl.tiles_h, pl.tiles_w, p.x.strides, p.x.offset,
            -pad[0], -pad[1],
        )  # fmt: skip
        dy_geo = TileGeometry(
            pl.tiles, k, *p.out_spatial, pl.tiles_h, pl.tiles_w, p.y.strides, p.y.offset, 0, 0
        )
        geo = conv_geometry(p)  # dw written flipped in convolution mode
        ws_k, ws_c, _, ws_h, ws_w = geo.w_strides
        dw_geo = FilterGeometry(k * cg, kg, cg, (kg * ws_k, ws_k, ws_c, ws_h, ws_w), geo.offsets[1])

        if isinstance(tiles, WinogradTiles) and tiles.fma:
            return self._prepare_filter_fma(p, pl, tiles, x_geo, dy_geo, dw_geo)
        points = tr.points
        v_off, y_off, d_off, part_off = _offsets(pl.regions)
        v_n, y_n, d_n, part_n = pl.regions
        warps = dict(num_warps=4)
        bt_x, bc_x = _transform_blocks(a, c)
        transform_x = KernelLaunch(
            tile_transform_kernel, (cdiv(pl.tiles, bt_x), cdiv(c, bc_x)), warps,
            geo=x_geo, MAT=tr.bt, L=a, STEP=m, BLOCK_T=bt_x, BLOCK_C=bc_x,
        )  # fmt: skip
        bt_y, bc_y = _transform_blocks(a, k)
        transform_dy = KernelLaunch(
            tile_transform_kernel, (cdiv(pl.tiles, bt_y), cdiv(k, bc_y)), warps,
            geo=dy_geo, MAT=tr.a, L=m, STEP=m, BLOCK_T=bt_y, BLOCK_C=bc_y,
        )  # fmt: skip
        # D[p, g] = Y[p, :, group's k]^T @ V[p, :, group's c], reduced over the tiles.
        y_geo = StridedGeometry(kg, pl.tiles, g, pl.tiles * k, kg, 0, 1, k, 0)
        v_geo = StridedGeometry(pl.tiles, cg, g, pl.tiles * c, cg, 0, c, 1, 0)
        d_geo = StridedGeometry(kg, cg, g, k * cg, kg * cg, 0, cg, 1, 0)
        gemm = BrgemmLaunch(
            Operand(strided.strided_a_setup, strided.strided_a_load, y_geo),
            Operand(strided.strided_b_setup, strided.strided_b_load, v_geo),
            Output(strided.strided_c_addr, d_geo),
            m=kg, n=cg, steps=cdiv(pl.tiles, tiles.block_k), batches=points * g,
            tiles=tiles, precision=precision, splits=pl.splits,
        )  # fmt: skip
        block = 128 if p.device == "cuda" else 64
        finish_grid = (cdiv(dw_geo.elements, block),)
        finishes: dict[bool, KernelLaunch] = {}

        def run(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
            v = workspace[v_off : v_off + 4 * v_n].view(torch.float32)
            ydy = workspace[y_off : y_off + 4 * y_n].view(torch.float32)
            d = workspace[d_off : d_off + 4 * d_n].view(torch.float32)
            partials = workspace[part_off : part_off + 4 * part_n] if gemm.splits > 1 else None
            transform_x(SRC=t.x, WS=v)
            transform_dy(SRC=t.y, WS=ydy)
            gemm(ydy, v, d, workspace=partials)
            key = beta != 0
            finish = finishes.get(key)
            if finish is None:
                finish = finishes[key] = KernelLaunch(
                    filter_output_kernel, finish_grid, warps, geo=dw_geo, MAT=tr.gt,
                    BETA_NONZERO=key, BLOCK=block,
                )  # fmt: skip
            finish(WS=d, DW=t.w, chunks=1, alpha=float(alpha), beta=float(beta))

        return run

    def _prepare_filter_fma(
        self, p: ConvProblem, pl: Plan, tiles: WinogradTiles, x_geo: TileGeometry,
        dy_geo: TileGeometry, dw_geo: FilterGeometry,
    ) -> Runner:  # fmt: skip
        """Backward-filter for a few input channels a group: filter_fma_kernel's partial sums
        per chunk of tiles (the chunks filling the device once), then filter_output_kernel
        sums them in order into G^T . D . G."""
        tr, g = pl.tr, p.groups
        kg, cg = p.out_channels // g, p.in_channels // g
        k_blocks = cdiv(kg, tiles.block_n)
        chunks = max(
            1, min(cdiv(pl.tiles, tiles.block_m), parallel_slots(p.device) // (k_blocks * g))
        )
        per_chunk = cdiv(cdiv(pl.tiles, chunks), tiles.block_m) * tiles.block_m
        chunks = cdiv(pl.tiles, per_chunk)
        part_n = chunks * tr.points * dw_geo.elements
        if 4 * part_n > self.workspace_bytes(p):  # the GEMM's planes hold more: a check
            raise ValueError(f"{chunks} chunks of partial sums exceed the workspace")
        products = KernelLaunch(
            filter_fma_kernel, (chunks, k_blocks, g), dict(num_warps=tiles.num_warps),
            x_geo=x_geo, dy_geo=dy_geo, outs=kg, ins=cg, tiles_per_chunk=per_chunk,
            BT_MAT=tr.bt, A_MAT=tr.a, STEP=tr.m, CHANNELS=triton.next_power_of_2(cg),
            BLOCK_T=tiles.block_m, BLOCK_K=tiles.block_n,
        )  # fmt: skip
        block = 128 if p.device == "cuda" else 64
        finishes: dict[bool, KernelLaunch] = {}

        def run(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
            part = workspace[: 4 * part_n].view(torch.float32)
            products(X=t.x, DY=t.y, WS=part)
            key = beta != 0
            finish = finishes.get(key)
            if finish is None:
                finish = finishes[key] = KernelLaunch(
                    filter_output_kernel, (cdiv(dw_geo.elements, block),), dict(num_warps=4),
                    geo=dw_geo, MAT=tr.gt, BETA_NONZERO=key, BLOCK=block,
                )  # fmt: skip
            finish(WS=part, DW=t.w, chunks=chunks, alpha=float(alpha), beta=float(beta))

        return run


class WinogradFused(WinogradNonfused):
    """WINOGRAD: forward and backward-data with the input transform, the products of every
    point and the output transform in one kernel (fused_kernel); only the transformed filter
    goes through the workspace. Each program keeps (m + 2)^2 accumulators of BLOCK_T tiles x
    BLOCK_K channels, so its tiles are smaller than the GEMM's."""

    name = "WINOGRAD"

    def supports(self, p: ConvProblem) -> str | None:
        reason = super().supports(p)
        if reason is None and p.direction == Direction.BACKWARD_FILTER:
            return "backward-filter: WINOGRAD (fused) runs forward and backward-data only"
        return reason

    def workspace_bytes(self, p: ConvProblem) -> int:
        return max(plan(p, m).regions[1] * 4 for m in _out_tiles(p))

    def tile_candidates(self, p: ConvProblem) -> list[TileConfig]:
        """block_m: tiles, block_n: output channels, block_k: input channels per step. Layers
        of at most FMA_CHANNELS reduced channels a group take float32 FMAs for products
        first (F(2x2) only: F(4x4)'s 36 accumulators would not fit in registers beside its
        transformed inputs). On VGG-16's RGB stem (strict float32, batch 64, H200) the tuner chose
        them: 2.05 ms, IMPLICIT_GEMM 0.91, cuDNN 0.89."""
        out = []
        if self._reduced_per_group(p) <= FMA_CHANNELS and 2 in _out_tiles(p):
            shapes = FMA_SHAPES if p.device == "cuda" else [(16, 16, 1)]
            for bt, bk, warps in shapes:
                out.append(WinogradTiles(bt, bk, 1, 1, warps, 1, out_tile=2, fma=True))
        written = (p.in_channels + p.out_channels) // p.groups - self._reduced_per_group(p)
        if written <= FMA_CHANNELS and 2 in _out_tiles(p):
            # A few written channels a group (a stem's backward-data): block_n of them, each
            # point's product summed from FMAs (fused_kernel; tensor cores take 16 or more).
            width = triton.next_power_of_2(written)
            shapes = NARROW_SHAPES if p.device == "cuda" else [(16, 16, 1)]
            for bt, bc, warps in shapes:
                out.append(WinogradTiles(bt, width, bc, 1, warps, 1, out_tile=2))
        for m in _out_tiles(p):
            # Chosen by ptxas's report for sm_90 (compiled offline): the fewest spilled
            # accumulators. Every F(4x4) shape spills some (36 accumulators and 36 transformed
            # inputs live at once); F(2x2) at 16 x 32 hardly does.
            if p.device != "cuda":
                shapes = [(16, 16, 16, 1)]
            elif m == 2:
                shapes = [(16, 32, 16, 4), (16, 64, 16, 4), (64, 32, 16, 8)]
            else:
                shapes = [(16, 32, 16, 8), (64, 16, 16, 8)]
            for bt, bk, bc, warps in shapes:
                out.append(WinogradTiles(bt, bk, bc, 1, warps, 1, out_tile=m))
        return out

    @staticmethod
    def _reduced_per_group(p: ConvProblem) -> int:
        """The channels each output sums over: C / groups forward, K / groups backward-data."""
        reduced = p.in_channels if p.direction == Direction.FORWARD else p.out_channels
        return reduced // p.groups

    def prepare(self, p: ConvProblem, tiles: TileConfig) -> Runner:
        m = tiles.out_tile if isinstance(tiles, WinogradTiles) else _out_tiles(p)[0]
        fma = isinstance(tiles, WinogradTiles) and tiles.fma
        pl = plan(p, m)
        tr = pl.tr
        precision = PRECISION[number_format(p)]
        in_geo, out_geo, filt_geo = data_geometries(p, pl)
        g = p.groups
        ins, outs = in_geo.channels // g, out_geo.channels // g
        u_bytes = pl.regions[1] * 4
        block = 128 if p.device == "cuda" else 64
        transform_w = KernelLaunch(
            filter_transform_kernel, (cdiv(filt_geo.elements, block),),
            dict(num_warps=4), geo=filt_geo, MAT=tr.g, BLOCK=block,
        )  # fmt: skip
        grid = (cdiv(pl.tiles, tiles.block_m) * cdiv(outs, tiles.block_n), g)
        forward = p.direction == Direction.FORWARD
        launches: dict[tuple, KernelLaunch] = {}

        def run(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
            u = workspace[:u_bytes].view(torch.float32)
            transform_w(Wt=t.w, WS=u)
            source, dest = (t.x, t.y) if forward else (t.y, t.x)
            key = (t.bias is not None, beta != 0)
            launch = launches.get(key)
            if launch is None:
                launch = launches[key] = KernelLaunch(
                    fused_kernel, grid, dict(num_warps=tiles.num_warps, num_stages=1),
                    in_geo=in_geo, out_geo=out_geo, ins=ins, outs=outs, BT_MAT=tr.bt,
                    AT_MAT=tr.at, STEP=tr.m, HAS_BIAS=key[0], BETA_NONZERO=key[1],
                    PRECISION=precision, BLOCK_T=tiles.block_m, BLOCK_K=tiles.block_n,
                    BLOCK_C=tiles.block_k, FMA=fma,
                )  # fmt: skip
            bias = t.bias if t.bias is not None else dest
            launch(SRC=source, U=u, Y=dest, BIAS=bias, alpha=float(alpha), beta=float(beta))

        return run


__all__ = [
    "FMA_CHANNELS",
    "OUT_TILES",
    "PRECISION",
    "WinogradFused",
    "WinogradNonfused",
    "WinogradTiles",
    "number_format",
]
