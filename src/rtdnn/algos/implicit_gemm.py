"""IMPLICIT_GEMM: the batch-reduce GEMM reads its operands straight from x, w and dy, with the
im2col addresses computed in the kernel. No workspace, every direction.

IMPLICIT_GEMM_SPLIT_K: forward and backward-filter. When the output has too few tiles to fill
the GPU (backward-filter's K/g x C/g per filter tap with a reduction over every pixel; forward on
small late-stage images) the reduction is split among several programs that write float32
partial sums to a workspace, summed afterwards in a fixed order (deterministic).
"""

from __future__ import annotations

import math

import triton

from ..core import ConvProblem, Direction, TensorDesc
from ..kernels import conv_addressing as ca
from ..kernels import strided
from ..kernels.conv_addressing import DataGeometry
from ..kernels.launch import BrgemmLaunch, Operand, Output, TileConfig
from ..kernels.strided import StridedGeometry
from .base import ConvAlgorithm, ConvTensors, Runner
from .geometry import conv_geometry, data_phases, dot_precision, parallel_slots
from .tiles import gemm_candidates

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


def split_count(p: ConvProblem) -> int:
    """Reduction splits: enough programs to fill the device, each with a long enough share of
    the reduction (16 chunks of 64 on a GPU; small on the CPU so tests split too)."""
    if p.direction == Direction.BACKWARD_DATA:
        return 1
    rows, cols, depth, batches = gemm_shape(p)
    if p.direction == Direction.FORWARD and not packed(p):
        depth *= math.prod(p.kernel)
    tiles = triton.cdiv(rows, 128) * triton.cdiv(cols, 128) * batches
    most = max(1, depth // (16 * 64 if p.device == "cuda" else 32))
    return max(1, min(triton.cdiv(parallel_slots(p.device), tiles), most))


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

    a_load, b_load = strided.strided_a_load, strided.strided_b_load
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


class ImplicitGemm(ConvAlgorithm):
    name = "IMPLICIT_GEMM"

    def supports(self, p: ConvProblem) -> str | None:
        return None

    def splits(self, p: ConvProblem) -> int:
        return 1

    def tile_candidates(self, p: ConvProblem) -> list[TileConfig]:
        rows, cols, depth, _ = gemm_shape(p)
        return gemm_candidates(p, rows, cols, depth)

    def prepare(self, p: ConvProblem, tiles: TileConfig) -> Runner:
        geo = conv_geometry(p)
        rows, cols, depth, batches = gemm_shape(p)
        taps = math.prod(p.kernel)
        if p.direction == Direction.BACKWARD_DATA:
            return self._prepare_backward_data(p, geo, tiles)
        if p.direction == Direction.FORWARD and packed(p):
            a = Operand(ca.fwd_a_setup, ca.fwd_packed_a_load, geo)
            b = Operand(ca.fwd_b_setup, ca.fwd_packed_b_load, geo)
            c = Output(ca.fwd_c_addr, geo)
            steps = triton.cdiv(depth, tiles.block_k)
        elif p.direction == Direction.FORWARD:
            a = Operand(ca.fwd_a_setup, ca.fwd_a_load, geo)
            b = Operand(ca.fwd_b_setup, ca.fwd_b_load, geo)
            c = Output(ca.fwd_c_addr, geo)
            steps = taps * triton.cdiv(depth, tiles.block_k)
        elif packed(p):
            a = Operand(ca.bwd_filter_packed_a_setup, ca.bwd_filter_a_load, geo)
            b = Operand(ca.bwd_filter_packed_b_setup, ca.bwd_filter_packed_b_load, geo)
            c = Output(ca.bwd_filter_packed_c_addr, geo)
            steps = triton.cdiv(depth, tiles.block_k)
        else:
            a = Operand(ca.bwd_filter_a_setup, ca.bwd_filter_a_load, geo)
            b = Operand(ca.bwd_filter_b_setup, ca.bwd_filter_b_load, geo)
            c = Output(ca.bwd_filter_c_addr, geo)
            steps = triton.cdiv(depth, tiles.block_k)
        pointwise = pointwise_operands(p, geo)
        if pointwise is not None:
            a, b = pointwise
        gemm = BrgemmLaunch(
            a, b, c, m=rows, n=cols, steps=steps, batches=batches, tiles=tiles,
            precision=dot_precision(p), splits=self.splits(p),
        )  # fmt: skip
        direction = p.direction

        def run(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
            if direction == Direction.FORWARD:
                gemm(t.x, t.w, t.y, alpha=alpha, beta=beta, bias=t.bias, workspace=workspace)
            else:
                gemm(t.y, t.x, t.w, alpha=alpha, beta=beta, workspace=workspace)

        return run

    def _prepare_backward_data(self, p: ConvProblem, geo, tiles: TileConfig) -> Runner:
        """One GEMM per stride phase (a single one at stride 1)."""
        pointwise = pointwise_operands(p, geo)
        kg, cg = p.out_channels // p.groups, p.in_channels // p.groups
        gemms = []
        for phase in data_phases(p):
            pixels = p.batch * math.prod(phase.count)
            if pixels == 0:
                continue
            g = DataGeometry(geo, phase)
            a = Operand(ca.bwd_data_a_setup, ca.bwd_data_a_load, g)
            b = Operand(ca.bwd_data_b_setup, ca.bwd_data_b_load, g)
            if pointwise is not None:
                a, b = pointwise
            steps = math.prod(phase.taps) * triton.cdiv(kg, tiles.block_k)
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
                )  # fmt: skip
            )

        def run(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
            for gemm in gemms:
                gemm(t.y, t.w, t.x, alpha=alpha, beta=beta)

        return run


class ImplicitGemmSplitK(ImplicitGemm):
    name = "IMPLICIT_GEMM_SPLIT_K"

    def supports(self, p: ConvProblem) -> str | None:
        if p.direction == Direction.BACKWARD_DATA:
            return "backward-data runs one GEMM per stride phase, which are not split"
        return None

    def splits(self, p: ConvProblem) -> int:
        return split_count(p)

    def workspace_bytes(self, p: ConvProblem) -> int:
        rows, cols, _, batches = gemm_shape(p)
        splits = self.splits(p)
        return 0 if splits == 1 else batches * splits * rows * cols * 4
