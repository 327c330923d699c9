"""IMPLICIT_GEMM: the batch-reduce GEMM reads its operands straight from x, w and dy, with the
im2col addresses computed in the kernel. No workspace, every direction.

IMPLICIT_GEMM_SPLIT_K: backward-filter only. Its GEMM is small (K/g x C/g per filter tap) and
its reduction long (every output pixel), so the pixels are split among several programs that
write float32 partial sums to a workspace, summed afterwards in a fixed order (deterministic).
"""

from __future__ import annotations

import math

import triton

from ..core import ConvProblem, Direction
from ..kernels import conv_addressing as ca
from ..kernels.launch import BrgemmLaunch, Operand, Output, TileConfig
from .base import ConvAlgorithm, ConvTensors, Runner
from .geometry import conv_geometry, dot_precision, parallel_slots
from .tiles import gemm_candidates


def gemm_shape(p: ConvProblem) -> tuple[int, int, int, int]:
    """(rows, cols, reduction chunk length, batch entries) of each direction's GEMM."""
    g = p.groups
    cg, kg = p.in_channels // g, p.out_channels // g
    taps = math.prod(p.kernel)
    if p.direction == Direction.FORWARD:
        return p.batch * math.prod(p.out_spatial), kg, cg, g
    if p.direction == Direction.BACKWARD_DATA:
        return p.batch * math.prod(p.in_spatial), cg, kg, g
    return kg, cg, p.batch * math.prod(p.out_spatial), g * taps


def split_count(p: ConvProblem) -> int:
    """Backward-filter splits: enough programs to fill the device, each with a long enough
    share of the pixels (16 steps of 64 on a GPU; small on the CPU so tests split too)."""
    rows, cols, pixels, batches = gemm_shape(p)
    tiles = triton.cdiv(rows, 128) * triton.cdiv(cols, 128) * batches
    most = max(1, pixels // (16 * 64 if p.device == "cuda" else 32))
    return max(1, min(triton.cdiv(parallel_slots(p.device), tiles), most))


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
        if p.direction == Direction.FORWARD:
            a = Operand(ca.fwd_a_setup, ca.fwd_a_load, geo)
            b = Operand(ca.fwd_b_setup, ca.fwd_b_load, geo)
            c = Output(ca.fwd_c_addr, geo)
            steps = taps * triton.cdiv(depth, tiles.block_k)
        elif p.direction == Direction.BACKWARD_DATA:
            a = Operand(ca.bwd_data_a_setup, ca.bwd_data_a_load, geo)
            b = Operand(ca.bwd_data_b_setup, ca.bwd_data_b_load, geo)
            c = Output(ca.bwd_data_c_addr, geo)
            steps = taps * triton.cdiv(depth, tiles.block_k)
        else:
            a = Operand(ca.bwd_filter_a_setup, ca.bwd_filter_a_load, geo)
            b = Operand(ca.bwd_filter_b_setup, ca.bwd_filter_b_load, geo)
            c = Output(ca.bwd_filter_c_addr, geo)
            steps = triton.cdiv(depth, tiles.block_k)
        gemm = BrgemmLaunch(
            a, b, c, m=rows, n=cols, steps=steps, batches=batches, tiles=tiles,
            precision=dot_precision(p), splits=self.splits(p),
        )  # fmt: skip
        direction = p.direction

        def run(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
            if direction == Direction.FORWARD:
                gemm(t.x, t.w, t.y, alpha=alpha, beta=beta, bias=t.bias)
            elif direction == Direction.BACKWARD_DATA:
                gemm(t.y, t.w, t.x, alpha=alpha, beta=beta)
            else:
                gemm(t.y, t.x, t.w, alpha=alpha, beta=beta, workspace=workspace)

        return run


class ImplicitGemmSplitK(ImplicitGemm):
    name = "IMPLICIT_GEMM_SPLIT_K"

    def supports(self, p: ConvProblem) -> str | None:
        if p.direction != Direction.BACKWARD_FILTER:
            return "split-K is for backward-filter, whose reduction runs over every pixel"
        return None

    def splits(self, p: ConvProblem) -> int:
        return split_count(p)

    def workspace_bytes(self, p: ConvProblem) -> int:
        rows, cols, _, batches = gemm_shape(p)
        splits = self.splits(p)
        return 0 if splits == 1 else batches * splits * rows * cols * 4
