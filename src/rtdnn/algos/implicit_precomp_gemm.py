"""IMPLICIT_PRECOMP_GEMM: the implicit GEMM with one thing its main loop would otherwise work out
or gather at every step precomputed into the workspace, once per call: under TF32, a filter
whose reduced channels are contiguous where the given one's are not; otherwise the im2col
indices. Every problem, every direction.

IMPLICIT_GEMM works out in the kernel, at every reduction step, which pixel each filter tap
reads and whether it lies in the padding; a profile showed that index arithmetic (divisions
by the output sizes, per-tap bounds checks) dominating its instructions on layers with few
channels. Here one small kernel first writes a table of validity
bits per (pixel, filter tap), and for backward-filter each pixel's offset, into the workspace
(see kernels/conv_precomp.py); the GEMM's addressing reads it. The tiles, GEMM shapes, phases
and the 1x1 fast path are IMPLICIT_GEMM's (a 1x1, stride-1, unpadded convolution whose
pixels are evenly spaced has no im2col to precompute: it runs as IMPLICIT_GEMM, with no
workspace).

Why the table is built on every call, into the workspace, and not once in prepare(): rtdnn's
ops pass each call the current stream's shared workspace buffer (core.handle.stream_workspace),
which every other operation on that stream also writes, so what an earlier call left there is
gone; and a table kept with the prepared launch would be device memory that workspace_bytes
does not declare and a `workspace_limit` does not bound (and prepared launches are keyed by
problem, not by device, so it would also be on the wrong GPU for a second device). The build
is one small launch per table that writes 4 bytes per pixel per 32 filter taps (8 more per
output pixel in backward-filter): a thirty-second of the input's bytes on a 3x3 layer with 64
channels in 16 bits, next to a GEMM that reads every input pixel several times.

TF32: Hopper's tensor cores read TF32 operands only with the reduced dimension contiguous
(K-major) in shared memory. A channels-last filter has it in forward (reduced over c) but not in
backward-data (reduced over k), where Triton then fills shared memory with 4-byte copies
instead of 16-byte ones. So under TF32 on Hopper, a filter without it is first copied into the
workspace with the reduced channels innermost (one elementwise launch over the filter's
bytes), and the GEMM reads the copy with IMPLICIT_GEMM's own addressing, no tables. On an H200
(`benchmarks/probes/tf32_operand_layout.py`), ResNet-50's backward-data layers ran 1.03x to
2.7x faster with the filter so stored; with the tables built as well the 3x3 layers lost a
fifth to half of that again (TF32 backward-data suite 0.74 with them). Backward-filter reduces
over pixels, which neither channels-last operand has innermost; a copy of x and dy would move
more bytes than the product saves on most layers, so it is not made. The warp-specialized
Hopper kernel (kernels/conv_hopper.py) reads the copy too where it runs the problem, first:
in backward-data a copy with k innermost, then the taps, then c (hopper_data_filter_strides),
which it reads as a (C, taps x K) matrix.

Workspace, exactly: the TF32 filter copy; or one int32 table (int64 when backward-filter's
pixel offsets pass 2^31) of, per gather, ceil(taps / 32) validity words per pixel, plus one
offset per output pixel for x and one for dy in backward-filter. Deterministic: no atomics, one
order of summation.

The heuristic (select/) picks it where it copies the filter (`precomp_preferred`); elsewhere
it runs when named (algo="IMPLICIT_PRECOMP_GEMM") or when find_conv_algorithms measured it
fastest (its tables lost to IMPLICIT_GEMM's arithmetic on ResNet-50's 3x3 layers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from ..core import ConvProblem, Direction, TensorDesc, cdiv
from ..core.tensor import contiguous_strides
from ..kernels import conv_addressing as ca
from ..kernels import conv_precomp as cp
from ..kernels import elementwise as ew
from ..kernels.conv_addressing import ConvGeometry, DataGeometry
from ..kernels.conv_precomp import DataGatherGeometry, Gather, GatherGeometry, TableSpec
from ..kernels.launch import BrgemmLaunch, KernelLaunch, Operand, Output, TileConfig
from .base import ConvTensors, Runner, epilogue_activation
from .geometry import before_hopper, conv_geometry, data_phases, dot_precision
from .implicit_gemm import (
    HopperConvTiles,
    ImplicitGemm,
    gemm_shape,
    hopper_candidates,
    hopper_data_filter_strides,
    packed,
    pointwise_operands,
    tile_precision,
)

#: Rows per program of the table builder.
BUILD_BLOCK = 128


@dataclass
class Tables:
    """The tables of one problem, where they lie in the workspace, and how loads read them."""

    specs: list[tuple[TableSpec, bool]]  # (spec, whether it stores origins)
    gathers: list[Gather]  # forward: [x]; backward-data: one per phase; backward-filter: [x, dy]
    dtype: torch.dtype
    nbytes: int


def _dot(a: tuple, b: tuple) -> int:
    return sum(u * v for u, v in zip(a, b, strict=True))


def _tables(p: ConvProblem, geo: ConvGeometry) -> Tables:
    specs: list[tuple[TableSpec, bool]] = []
    gathers: list[Gather] = []
    size = 0

    def add(count, first, scale, taps, step, limit, n_stride, strides, depth, chan_stride,
            origins=False, bits=True) -> None:  # fmt: skip
        nonlocal size
        rows = geo.n * math.prod(count)
        words = cdiv(math.prod(taps), cp.BITS) if bits else 0
        origin_at = size
        words_at = size + (rows if origins else 0)
        size = words_at + words * rows
        spec = TableSpec(rows, count, first, scale, taps, step, limit, n_stride, strides,
                         origin_at, words_at, words)  # fmt: skip
        specs.append((spec, origins))
        delta = tuple(q * s for q, s in zip(step, strides, strict=True))
        gathers.append(Gather(rows, origin_at, words_at, taps, delta, depth, chan_stride))

    xs_n, xs_c, *xs = geo.x_strides
    ys_n, ys_k, *ys = geo.y_strides
    xs, ys = tuple(xs), tuple(ys)
    padding = tuple(-q for q in geo.padding)
    wide = False
    if p.direction == Direction.BACKWARD_DATA:
        for phase in data_phases(p):
            if geo.n * math.prod(phase.count) == 0:
                continue  # no GEMM runs for this phase
            first = tuple(
                (f + q - r * d) // s
                for f, q, r, d, s in zip(phase.first, geo.padding, phase.tap0, geo.dilation,
                                         geo.stride, strict=True)
            )  # fmt: skip
            # Successive taps of a phase reach outputs dilation / gcd(stride, dilation) apart.
            step = tuple(
                -(d // math.gcd(s, d)) for d, s in zip(geo.dilation, geo.stride, strict=True)
            )
            add(phase.count, first, (1, 1, 1), phase.taps, step, geo.out_size, ys_n, ys,
                geo.kg, ys_k)  # fmt: skip
    else:
        add(geo.out_size, padding, geo.stride, geo.kernel, geo.dilation, geo.in_size, xs_n, xs,
            geo.cg, xs_c, origins=p.direction == Direction.BACKWARD_FILTER)  # fmt: skip
    if p.direction == Direction.BACKWARD_FILTER:
        # dy's pixel offsets, no validity bits: every output pixel exists.
        ones = (1, 1, 1)
        add(geo.out_size, (0, 0, 0), ones, ones, (0, 0, 0), geo.out_size, ys_n, ys, geo.kg,
            ys_k, origins=True, bits=False)  # fmt: skip
        # The largest origin: the last image's farthest window in x, or dy's last pixel.
        last = tuple(o - 1 for o in geo.out_size)
        reach = tuple(
            max(q, o * s - q) for o, s, q in zip(last, geo.stride, geo.padding, strict=True)
        )
        far_x = (geo.n - 1) * xs_n + _dot(reach, xs)
        far_y = (geo.n - 1) * ys_n + _dot(last, ys)
        wide = max(far_x, far_y) >= 2**31
    dtype = torch.int64 if wide else torch.int32
    return Tables(specs, gathers, dtype, size * dtype.itemsize)


def tf32_filter_copy(p: ConvProblem) -> TensorDesc | None:
    """The layout of the filter copy that TF32 products read (see the module's docstring):
    (K, C/groups, *R) stored channels-last (c innermost, then the taps, then k) in forward, and
    with k innermost, then c, then the taps in backward-data; None where no copy is made: not
    TF32, backward-filter, a GPU before Hopper (whose TF32 products were not measured with it),
    one reduced channel per group, or a filter that has its reduced channels contiguous."""
    if dot_precision(p) != "tf32" or p.direction == Direction.BACKWARD_FILTER:
        return None
    if before_hopper(p.device):
        return None
    reduced = 1 if p.direction == Direction.FORWARD else 0
    shape = p.w.shape
    per_group = shape[1] if reduced == 1 else shape[0] // p.groups
    if per_group == 1 or p.w.strides[reduced] == 1:
        return None
    taps = list(range(2, len(shape)))
    order = [0, *taps, 1] if reduced == 1 else [*taps, 1, 0]  # outermost first
    return TensorDesc(shape, contiguous_strides(shape, order), p.w.dtype)


def _copy_for(p: ConvProblem, copy: TensorDesc, hopper: bool) -> TensorDesc:
    """The filter copy's layout for the Hopper kernel (hopper) or the pointer tiles: the same
    bytes, in backward-data ordered for the kernel's (C, taps x K) reading."""
    if not hopper or p.direction != Direction.BACKWARD_DATA:
        return copy
    return replace(copy, strides=hopper_data_filter_strides(copy.shape))


def precomp_preferred(p: ConvProblem) -> bool:
    """Whether `auto` should try IMPLICIT_PRECOMP_GEMM before IMPLICIT_GEMM: where it runs a
    TF32 product on a filter copy with the reduced channels contiguous (1.03x to 2.7x faster
    on ResNet-50's backward-data layers, H200)."""
    return tf32_filter_copy(p) is not None


#: The launches that read the filter copy: IMPLICIT_GEMM's own (a separate instance, so that
#: nothing it prepares comes back to this algorithm's table path).
_ON_COPY = ImplicitGemm()


class ImplicitPrecompGemm(ImplicitGemm):
    name = "IMPLICIT_PRECOMP_GEMM"
    hopper_directions = frozenset()

    def tile_candidates(self, p: ConvProblem) -> list[TileConfig]:
        # With a filter copy, the tiles that can read the copy (the TMA kernels want the
        # filter as given, channels-last): the Hopper kernel's first, on a copy of its own.
        copy = tf32_filter_copy(p)
        if copy is None:
            return super().tile_candidates(p)
        hopper = hopper_candidates(replace(p, w=_copy_for(p, copy, hopper=True)), 1)
        return hopper + super().tile_candidates(replace(p, w=copy))

    def workspace_bytes(self, p: ConvProblem) -> int:
        copy = tf32_filter_copy(p)
        if copy is not None:
            return copy.numel * copy.dtype.itemsize
        geo = conv_geometry(p)
        if pointwise_operands(p, geo) is not None:
            return 0
        return _tables(p, geo).nbytes

    def prepare(self, p: ConvProblem, tiles: TileConfig) -> Runner:
        copy = tf32_filter_copy(p)
        if copy is None:
            return self._prepare_tables(p, tiles)
        # IMPLICIT_GEMM's launches on the problem with the copy's strides (a true convolution
        # flips the copy in place, as it would the filter).
        copy = _copy_for(p, copy, hopper=isinstance(tiles, HopperConvTiles))
        gemms = _ON_COPY.prepare(replace(p, w=copy), tiles)
        nbytes = copy.numel * copy.dtype.itemsize
        plan = ew.plan(copy.shape, copy.strides, (p.w.strides,), elem_bytes=copy.dtype.itemsize)
        if plan is None:  # not for a filter of at most 5 dims; kept as a check
            raise ValueError(f"no elementwise plan copies a filter of shape {copy.shape}")
        fill = ew.prepared_launch(ew.op_first, plan, 1, False)

        def run(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
            w = workspace[:nbytes].view(t.w.dtype).as_strided(copy.shape, copy.strides)
            fill(w, [t.w])
            gemms(ConvTensors(t.x, w, t.y, t.bias), workspace, alpha, beta)

        return run

    def _prepare_tables(self, p: ConvProblem, tiles: TileConfig) -> Runner:
        """The tables' builds and the GEMMs that read them (IMPLICIT_GEMM's launches for a
        pointwise layer, which needs no tables)."""
        geo = conv_geometry(p)
        if pointwise_operands(p, geo) is not None:
            return super().prepare(p, tiles)
        tables = _tables(p, geo)
        builds = [
            KernelLaunch(
                cp.build_table_kernel,
                (cdiv(spec.rows, BUILD_BLOCK),),
                dict(num_warps=4),
                spec=spec,
                WITH_ORIGIN=origin,
                BLOCK=BUILD_BLOCK,
            )  # fmt: skip
            for spec, origin in tables.specs
            if origin or spec.words
        ]
        if p.direction == Direction.BACKWARD_DATA:
            gemms = self._data_gemms(p, geo, tables, tiles)
        else:
            gemms = [self._gemm(p, geo, tables, tiles)]
        direction, nbytes, dtype = p.direction, tables.nbytes, tables.dtype

        def run(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
            if nbytes:
                table = workspace[:nbytes].view(dtype)
            else:  # backward-data where no filter tap reaches any pixel: nothing is read
                table = torch.empty(0, dtype=dtype, device=t.x.device)
            for build in builds:
                build(TAB=table)
            for gemm in gemms:
                if direction == Direction.FORWARD:
                    gemm((t.x, table), t.w, t.y, alpha=alpha, beta=beta, bias=t.bias)
                elif direction == Direction.BACKWARD_DATA:
                    gemm((t.y, table), t.w, t.x, alpha=alpha, beta=beta)
                else:
                    gemm((t.y, table), (t.x, table), t.w, alpha=alpha, beta=beta)

        return run

    def _gemm(self, p: ConvProblem, geo: ConvGeometry, tables: Tables, tiles: TileConfig):
        """Forward or backward-filter: IMPLICIT_GEMM's GEMM with the table's loads."""
        rows, cols, depth, batches = gemm_shape(p)
        x_geo = GatherGeometry(geo, tables.gathers[0])
        if p.direction == Direction.FORWARD:
            if packed(p):
                a = Operand(cp.fwd_a_setup, cp.gather_packed_a_load, x_geo)
                b = Operand(ca.fwd_b_setup, ca.fwd_packed_b_load, geo)
                steps = cdiv(depth, tiles.block_k)
            else:
                a = Operand(cp.fwd_a_setup, cp.gather_a_load, x_geo)
                b = Operand(ca.fwd_b_setup, ca.fwd_b_load, geo)
                steps = math.prod(p.kernel) * cdiv(depth, tiles.block_k)
            c = Output(ca.fwd_c_addr, geo)
        else:
            dy_geo = GatherGeometry(geo, tables.gathers[1])
            if packed(p):
                a = Operand(cp.bwd_filter_packed_a_setup, cp.bwd_filter_a_load, dy_geo)
                b = Operand(cp.bwd_filter_packed_b_setup, cp.bwd_filter_b_load, x_geo)
                c = Output(ca.bwd_filter_packed_c_addr, geo)
            else:
                a = Operand(cp.bwd_filter_a_setup, cp.bwd_filter_a_load, dy_geo)
                b = Operand(cp.bwd_filter_b_setup, cp.bwd_filter_b_load, x_geo)
                c = Output(ca.bwd_filter_c_addr, geo)
            steps = cdiv(depth, tiles.block_k)
        return BrgemmLaunch(
            a, b, c, m=rows, n=cols, steps=steps, batches=batches, tiles=tiles,
            precision=tile_precision(p, tiles), activation=epilogue_activation(p),
        )  # fmt: skip

    def _data_gemms(self, p: ConvProblem, geo: ConvGeometry, tables: Tables, tiles: TileConfig):
        """Backward-data: one GEMM per stride phase, each with its own table."""
        gemms = []
        phases = [ph for ph in data_phases(p) if p.batch * math.prod(ph.count)]
        for phase, gather in zip(phases, tables.gathers, strict=True):
            g = DataGeometry(geo, phase)
            gemms.append(
                BrgemmLaunch(
                    Operand(cp.bwd_data_a_setup, cp.gather_a_load, DataGatherGeometry(g, gather)),
                    Operand(ca.bwd_data_b_setup, ca.bwd_data_b_load, g),
                    Output(ca.bwd_data_c_addr, g),
                    m=gather.rows,
                    n=geo.cg,
                    steps=math.prod(phase.taps) * cdiv(geo.kg, tiles.block_k),
                    batches=p.groups,
                    tiles=tiles,
                    precision=dot_precision(p),
                )  # fmt: skip
            )
        return gemms
