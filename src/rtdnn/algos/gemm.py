"""GEMM: explicit im2col into a workspace, then the batch-reduce GEMM on plain strided matrices.

    forward          col = im2col(x);  y = col @ w           (per group, reduced over taps)
    backward-filter  col = im2col(x);  dw[tap] = dy^T @ col[tap]
    backward-data    dcol = dy @ w  (float32);  dx = col2im(dcol)

The workspace is exactly the column matrix (plus split-K partial sums for backward-filter).
"""

from __future__ import annotations

import math

import torch
import triton

from ..core import ConvProblem, Direction, cdiv
from ..core.tensor import MAX_ELEMENTS
from ..kernels import conv_addressing as ca
from ..kernels import strided
from ..kernels.im2col import (
    ColGeometry,
    col2im_kernel,
    col_a_load,
    col_a_setup,
    im2col_kernel,
    tap_phase,
)
from ..kernels.launch import BrgemmLaunch, KernelLaunch, Operand, Output, TileConfig
from ..kernels.strided import StridedGeometry
from .base import ConvAlgorithm, ConvTensors, Runner
from .geometry import conv_geometry, device_memory_bytes, dot_precision, static_taps
from .implicit_gemm import gemm_shape, split_count
from .tiles import gemm_candidates


def _col_sizes(p: ConvProblem) -> tuple[int, int, int, int]:
    """(groups, output pixels, taps, channels per group) of the column matrix."""
    g = p.groups
    return g, p.batch * math.prod(p.out_spatial), math.prod(p.kernel), p.in_channels // g


def _col_bytes(p: ConvProblem) -> int:
    itemsize = 4 if p.direction == Direction.BACKWARD_DATA else p.dtype.itemsize
    return math.prod(_col_sizes(p)) * itemsize


def _align(nbytes: int, to: int = 256) -> int:
    return (nbytes + to - 1) // to * to


class Gemm(ConvAlgorithm):
    name = "GEMM"

    def supports(self, p: ConvProblem) -> str | None:
        # The kernels address the column matrix with 32-bit offsets.
        elements = math.prod(_col_sizes(p))
        if elements > MAX_ELEMENTS:
            return (
                f"the column matrix would hold {elements} elements: offsets above 2**31 - 1 "
                "are not supported (a smaller batch, or micro-batches, fit)"
            )
        return None

    def _splits(self, p: ConvProblem) -> int:
        return split_count(p) if p.direction == Direction.BACKWARD_FILTER else 1

    def workspace_bytes(self, p: ConvProblem) -> int:
        col = _col_bytes(p)
        splits = self._splits(p)
        if splits == 1:
            return col
        rows, cols, _, batches = gemm_shape(p)
        return _align(col) + batches * splits * rows * cols * 4

    def tile_candidates(self, p: ConvProblem) -> list[TileConfig]:
        g, m, taps, cg = _col_sizes(p)
        if p.direction == Direction.BACKWARD_DATA:
            return gemm_candidates(p, m, taps * cg, p.out_channels // g)
        rows, cols, depth, _ = gemm_shape(p)
        return gemm_candidates(p, rows, cols, depth)

    def prepare(self, p: ConvProblem, tiles: TileConfig) -> Runner:
        # The GEMM's operands split each step by the filter size as a constant; im2col and
        # col2im take the plain geometry (the interpreter cannot take a constant filter size
        # in col2im's loop over taps).
        plain = conv_geometry(p)
        geo = static_taps(plain)
        g, m, taps, cg = _col_sizes(p)
        kg = p.out_channels // g
        col_dtype = torch.float32 if p.direction == Direction.BACKWARD_DATA else p.dtype
        col_bytes = _col_bytes(p)
        # col[g, m, tap, c], contiguous; as A of the forward GEMM, step i is the tap.
        col_geo = StridedGeometry(m, cg, 1, m * taps * cg, 0, cg, taps * cg, 1, 0)
        precision = dot_precision(p)
        warps = dict(num_warps=tiles.num_warps)

        if p.direction == Direction.BACKWARD_DATA:
            dcol_geo = StridedGeometry(m, taps * cg, 1, m * taps * cg, 0, 0, taps * cg, 1, 0)
            gemm = BrgemmLaunch(
                Operand(ca.dy_rows_a_setup, ca.dy_rows_a_load, geo),
                Operand(ca.filter_cols_b_setup, ca.filter_cols_b_load, geo),
                Output(strided.strided_c_addr, dcol_geo),
                m=m, n=taps * cg, steps=cdiv(kg, tiles.block_k), batches=g,
                tiles=tiles, precision=precision,
            )  # fmt: skip
            in_pixels = p.batch * math.prod(p.in_spatial)
            # col2im is a gather bound by memory: its tiles fit the group's channels (3 in
            # an RGB stem) rather than the GEMM's tile, about 4096 elements per program.
            block_n = min(64, triton.next_power_of_2(cg))
            block_m = 4096 // block_n
            phases = tuple(map(tap_phase, plain.stride, plain.dilation))
            col2im = KernelLaunch(
                col2im_kernel,
                (cdiv(in_pixels, block_m), cdiv(cg, block_n), g),
                dict(num_warps=8), geo=plain, col_geo=col_geo, phases=phases, BLOCK_M=block_m,
                BLOCK_N=block_n,
            )  # fmt: skip

            def run_backward_data(t: ConvTensors, workspace, alpha, beta) -> None:
                dcol = workspace[:col_bytes].view(col_dtype)
                gemm(t.y, t.w, dcol)
                col2im(COL=dcol, DX=t.x, alpha=float(alpha), beta=float(beta),
                       BETA_NONZERO=beta != 0)  # fmt: skip

            return run_backward_data

        # im2col copies a channel chunk per tap: chunks as wide as the group's channels, not
        # the GEMM's (col's layout does not depend on them), about 4096 elements per program.
        block_k = min(tiles.block_k, triton.next_power_of_2(cg))
        block_m = max(tiles.block_m, 4096 // block_k)
        im2col = KernelLaunch(
            im2col_kernel,
            (cdiv(m, block_m), taps * cdiv(cg, block_k), g),
            warps, geo=plain, col_geo=col_geo, BLOCK_M=block_m, BLOCK_K=block_k,
        )  # fmt: skip
        if p.direction == Direction.FORWARD:
            gemm = BrgemmLaunch(
                Operand(col_a_setup, col_a_load, ColGeometry(geo, col_geo)),
                Operand(ca.fwd_b_setup, ca.fwd_b_load, geo),
                Output(ca.fwd_c_addr, geo),
                m=m, n=kg, steps=taps * cdiv(cg, tiles.block_k), batches=g,
                tiles=tiles, precision=precision,
            )  # fmt: skip

            def run_forward(t: ConvTensors, workspace, alpha, beta) -> None:
                col = workspace[:col_bytes].view(col_dtype)
                im2col(X=t.x, COL=col)
                gemm(col, t.w, t.y, alpha=alpha, beta=beta, bias=t.bias)

            return run_forward

        # Backward-filter: batch entry (group, tap) reads col[group, :, tap, :] as B.
        col_b = StridedGeometry(m, cg, taps, m * taps * cg, cg, 0, taps * cg, 1, 0)
        gemm = BrgemmLaunch(
            Operand(ca.bwd_filter_a_setup, ca.bwd_filter_a_load, geo),
            Operand(strided.strided_b_setup, strided.strided_b_load, col_b),
            Output(ca.bwd_filter_c_addr, geo),
            m=kg, n=cg, steps=cdiv(m, tiles.block_k), batches=g * taps, tiles=tiles,
            precision=precision, splits=self._splits(p),
        )  # fmt: skip

        def run_backward_filter(t: ConvTensors, workspace, alpha, beta) -> None:
            col = workspace[:col_bytes].view(col_dtype)
            im2col(X=t.x, COL=col)
            partials = workspace[_align(col_bytes) :] if gemm.splits > 1 else None
            gemm(t.y, col, t.w, alpha=alpha, beta=beta, workspace=partials)

        return run_backward_filter


#: Input channels up to which the heuristic runs backward-data of an ungrouped layer as GEMM.
#: There the implicit GEMMs multiply an output of that many columns on a 16-wide tile, while
#: GEMM's product is as wide as the filter's taps x channels and col2im visits only the taps
#: that reach each pixel. Measured on an H100 (BENCHMARKS.md, "Backward-data of few-channel
#: layers"), GEMM against IMPLICIT_GEMM, bf16: RGB stems 11x11/4 2.8x, 7x7/2 1.6x, 3x3/2 1.8x,
#: VGG's 3x3/1 1.3x; a 1-channel 5x20/2 spectrogram layer 3.7x (TF32: 7.5x).
PREFER_BACKWARD_DATA_UP_TO_C = 4
#: The most workspace the heuristic takes for it without being asked (Find, a plan or a
#: micro-batch policy may take more), as a share of the device's memory, since the buffer
#: stays with the stream for later calls: 2.5 GiB on an 80 GB H100. ResNet-50's stem at batch
#: 64 needs 450 MiB; AlexNet's at batch 256 1.05 GiB, where GEMM measured 2.8x IMPLICIT_GEMM
#: (a fixed 1 GiB bound left it out). If the allocation fails, `auto` falls back to an
#: algorithm without workspace.
PREFER_UP_TO_MEMORY_SHARE = 1 / 32


def gemm_preferred(p: ConvProblem) -> bool:
    """Whether the heuristic should try GEMM first for `p`: backward-data of an ungrouped
    layer of at most PREFER_BACKWARD_DATA_UP_TO_C input channels, on a GPU, within
    PREFER_UP_TO_MEMORY_SHARE of the current device's memory (grouped layers were not
    measured)."""
    few = p.groups == 1 and p.in_channels <= PREFER_BACKWARD_DATA_UP_TO_C
    if p.device != "cuda" or p.direction != Direction.BACKWARD_DATA or not few:
        return False
    memory = device_memory_bytes(torch.cuda.current_device())
    return Gemm().workspace_bytes(p) <= memory * PREFER_UP_TO_MEMORY_SHARE
