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

from ..core import ConvProblem, Direction, cdiv, tma_aligned
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
from ..kernels.launch import (
    BrgemmLaunch,
    KernelLaunch,
    MatrixLayout,
    Operand,
    Output,
    TileConfig,
    TmaGemmLaunch,
    TmaGemmTiles,
)
from ..kernels.strided import StridedGeometry
from .base import ConvAlgorithm, ConvTensors, Runner, epilogue_activation
from .geometry import (
    brgemm_precision,
    conv_geometry,
    device_memory_bytes,
    dot_precision,
    static_taps,
)
from .implicit_gemm import (
    gemm_shape,
    hopper_offered,
    pixel_stride,
    pointwise_layouts,
    split_count,
)
from .tiles import gemm_candidates, tma_gemm_candidates, tma_gemm_programs, tma_gemm_usable


def _col_sizes(p: ConvProblem) -> tuple[int, int, int, int]:
    """(groups, output pixels, taps, channels per group) of the column matrix."""
    g = p.groups
    return g, p.batch * math.prod(p.out_spatial), math.prod(p.kernel), p.in_channels // g


def _col_bytes(p: ConvProblem) -> int:
    itemsize = 4 if p.direction == Direction.BACKWARD_DATA else p.dtype.itemsize
    return math.prod(_col_sizes(p)) * itemsize


def _align(nbytes: int, to: int = 256) -> int:
    return (nbytes + to - 1) // to * to


def _filter_row_stride(p: ConvProblem) -> int | None:
    """The stride between a filter's output channels when each output channel's (tap, channel)
    values lie in one run ordered as the column matrix's (taps row-major, channels innermost:
    a channels-last filter), else None (a true convolution flips the taps)."""
    w = p.w
    if p.conv.mode == "convolution" and math.prod(p.kernel) > 1:
        return None
    expected = 1
    for d in [1, *range(w.ndim - 1, 1, -1)]:  # channels, then the kernel dims innermost first
        if w.shape[d] != 1 and w.strides[d] != expected:
            return None
        expected *= w.shape[d]
    return w.strides[0]


def tma_layouts(p: ConvProblem) -> tuple[MatrixLayout, MatrixLayout, tuple[int, int]] | None:
    """A's and B's layouts and C's (row, column) strides of GEMM's product as the TMA GEMM
    (kernels/gemm_tma.py) reads it, or None where it cannot (tiles.tma_gemm_usable): an
    ungrouped layer whose dy (or y) has evenly spaced channels-last pixels and whose filter is
    channels-last. Backward-filter is then one GEMM over every tap, dw[k, (tap, c)] = dy^T @
    col, not one per tap."""
    if p.groups != 1 or p.x.offset or p.w.offset or p.y.offset:
        return None
    ws_k, sy = _filter_row_stride(p), pixel_stride(p.y)
    if ws_k is None or sy is None:
        return None
    _, m, taps, cg = _col_sizes(p)
    j, k, ys_k = taps * cg, p.out_channels, p.y.strides[1]
    col = MatrixLayout.of(m, j, j, 1)
    if p.direction == Direction.FORWARD:  # col[m, j] @ w^T[j, k] -> y[m, k]
        a, b, out = col, MatrixLayout.of(j, k, 1, ws_k), (sy, ys_k)
    elif p.direction == Direction.BACKWARD_FILTER:  # dy^T[k, m] @ col[m, j] -> dw[k, j]
        a, b, out = MatrixLayout.of(k, m, ys_k, sy), col, (ws_k, 1)
    else:  # dy[m, k] @ w[k, j] -> dcol[m, j], float32
        a, b, out = MatrixLayout.of(m, k, sy, ys_k), MatrixLayout.of(k, j, ws_k, 1), (j, 1)
    if a is None or b is None or not tma_gemm_usable(p.device, p.dtype, a, b):
        return None
    return a, b, out


class Gemm(ConvAlgorithm):
    name = "GEMM"
    fuses_activation = True  # the GEMM's epilogue

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

    def _pointer_candidates(self, p: ConvProblem) -> list[TileConfig]:
        g, m, taps, cg = _col_sizes(p)
        if p.direction == Direction.BACKWARD_DATA:
            return gemm_candidates(p, m, taps * cg, p.out_channels // g)
        rows, cols, depth, _ = gemm_shape(p)
        return gemm_candidates(p, rows, cols, depth)

    def tile_candidates(self, p: ConvProblem) -> list[TileConfig]:
        """The TMA GEMM's tiles first where it can read the product (tma_layouts), then the
        pointer tiles."""
        pointer = self._pointer_candidates(p)
        layouts = tma_layouts(p)
        if layouts is None:
            return pointer
        a, b, _ = layouts
        # Split no more than the workspace holds.
        splits = self._splits(p)
        return tma_gemm_candidates(p.device, p.dtype, a.rows, b.cols, a.cols, splits) + pointer

    def prepare(self, p: ConvProblem, tiles: TileConfig) -> Runner:
        if isinstance(tiles, TmaGemmTiles):
            return self._prepare_tma(p, tiles)
        # The GEMM's operands split each step by the filter size as a constant; im2col and
        # col2im take the plain geometry (the interpreter cannot take a constant filter size
        # in col2im's loop over taps).
        plain = conv_geometry(p)
        geo = static_taps(plain)
        g, m, taps, cg = _col_sizes(p)
        kg = p.out_channels // g
        col_dtype = torch.float32 if p.direction == Direction.BACKWARD_DATA else p.dtype
        col_bytes = _col_bytes(p)
        col_geo = _col_geometry(p)
        precision = brgemm_precision(p)

        if p.direction == Direction.BACKWARD_DATA:
            dcol_geo = StridedGeometry(m, taps * cg, 1, m * taps * cg, 0, 0, taps * cg, 1, 0)
            gemm = BrgemmLaunch(
                Operand(ca.dy_rows_a_setup, ca.dy_rows_a_load, geo),
                Operand(ca.filter_cols_b_setup, ca.filter_cols_b_load, geo),
                Output(strided.strided_c_addr, dcol_geo),
                m=m, n=taps * cg, steps=cdiv(kg, tiles.block_k), batches=g,
                tiles=tiles, precision=precision,
            )  # fmt: skip
            col2im = _col2im(p, plain, col_geo)

            def run_backward_data(t: ConvTensors, workspace, alpha, beta) -> None:
                dcol = workspace[:col_bytes].view(col_dtype)
                gemm(t.y, t.w, dcol)
                col2im(COL=dcol, DX=t.x, alpha=float(alpha), beta=float(beta),
                       BETA_NONZERO=beta != 0)  # fmt: skip

            return run_backward_data

        im2col = _im2col(p, plain, col_geo, tiles)
        if p.direction == Direction.FORWARD:
            gemm = BrgemmLaunch(
                Operand(col_a_setup, col_a_load, ColGeometry(geo, col_geo)),
                Operand(ca.fwd_b_setup, ca.fwd_b_load, geo),
                Output(ca.fwd_c_addr, geo),
                m=m, n=kg, steps=taps * cdiv(cg, tiles.block_k), batches=g,
                tiles=tiles, precision=precision, activation=epilogue_activation(p),
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

    def _prepare_tma(self, p: ConvProblem, tiles: TmaGemmTiles) -> Runner:
        """The column matrix's product on the TMA GEMM (kernels/gemm_tma.py), im2col and
        col2im as on the pointer path; the pointer path's first tiles run instead where a
        call's tensors are not 16-byte aligned."""
        layouts = tma_layouts(p)
        if layouts is None:
            raise ValueError("TMA GEMM tiles for a problem it cannot read")
        a, b, c_strides = layouts
        gemm = TmaGemmLaunch(
            a, b, c_strides, tiles=tiles, programs=tma_gemm_programs(p.device),
            precision=dot_precision(p), activation=epilogue_activation(p),
        )  # fmt: skip
        pointer = self.prepare(p, self._pointer_candidates(p)[0])
        plain, col_geo, col_bytes = conv_geometry(p), _col_geometry(p), _col_bytes(p)
        direction = p.direction

        if direction == Direction.BACKWARD_DATA:
            col2im = _col2im(p, plain, col_geo)

            def run_backward_data(t: ConvTensors, workspace, alpha, beta) -> None:
                if not tma_aligned(t.y, t.w):
                    pointer(t, workspace, alpha, beta)
                    return
                dcol = workspace[:col_bytes].view(torch.float32)
                gemm(t.y, t.w, dcol)
                col2im(COL=dcol, DX=t.x, alpha=float(alpha), beta=float(beta),
                       BETA_NONZERO=beta != 0)  # fmt: skip

            return run_backward_data

        im2col = _im2col(p, plain, col_geo, tiles)

        def run(t: ConvTensors, workspace, alpha, beta) -> None:
            # The column matrix, the other operand, starts the workspace (rtdnn's own are
            # 256-byte aligned; a caller's may not be).
            other = t.w if direction == Direction.FORWARD else t.y
            if not tma_aligned(other, workspace):
                pointer(t, workspace, alpha, beta)
                return
            col = workspace[:col_bytes].view(p.dtype)
            im2col(X=t.x, COL=col)
            if direction == Direction.FORWARD:
                gemm(col, t.w, t.y, alpha=alpha, beta=beta, bias=t.bias)
            else:
                partials = workspace[_align(col_bytes) :] if gemm.splits > 1 else None
                gemm(t.y, col, t.w, alpha=alpha, beta=beta, workspace=partials)

        return run


def _col_geometry(p: ConvProblem) -> StridedGeometry:
    """col[g, m, tap, c], contiguous; as A of the forward GEMM, step i is the tap."""
    g, m, taps, cg = _col_sizes(p)
    return StridedGeometry(m, cg, 1, m * taps * cg, 0, cg, taps * cg, 1, 0)


def _im2col(p: ConvProblem, plain, col_geo: StridedGeometry, tiles: TileConfig) -> KernelLaunch:
    """The launch that copies x into the column matrix. It copies a channel chunk per tap:
    chunks as wide as the group's channels, not the GEMM's (col's layout does not depend on
    them), about 4096 elements per program."""
    g, m, taps, cg = _col_sizes(p)
    block_k = min(tiles.block_k, triton.next_power_of_2(cg))
    block_m = max(tiles.block_m, 4096 // block_k)
    return KernelLaunch(
        im2col_kernel,
        (cdiv(m, block_m), taps * cdiv(cg, block_k), g),
        dict(num_warps=tiles.num_warps), geo=plain, col_geo=col_geo, BLOCK_M=block_m,
        BLOCK_K=block_k,
    )  # fmt: skip


def _col2im(p: ConvProblem, plain, col_geo: StridedGeometry) -> KernelLaunch:
    """The launch that sums the float32 column matrix into dx (alpha, beta). col2im is a
    gather bound by memory: its tiles fit the group's channels (3 in an RGB stem) rather than
    the GEMM's tile, about 4096 elements per program."""
    g, _, _, cg = _col_sizes(p)
    in_pixels = p.batch * math.prod(p.in_spatial)
    block_n = min(64, triton.next_power_of_2(cg))
    block_m = 4096 // block_n
    phases = tuple(map(tap_phase, plain.stride, plain.dilation))
    return KernelLaunch(
        col2im_kernel,
        (cdiv(in_pixels, block_m), cdiv(cg, block_n), g),
        dict(num_warps=8), geo=plain, col_geo=col_geo, phases=phases, BLOCK_M=block_m,
        BLOCK_N=block_n,
    )  # fmt: skip


#: Input channels up to which the heuristic runs backward-data of an ungrouped layer as GEMM.
#: There the implicit GEMMs multiply an output of that many columns on a 16-wide tile, while
#: GEMM's product is as wide as the filter's taps x channels and col2im visits only the taps
#: that reach each pixel. Measured on an H100 (BENCHMARKS.md, "Backward-data of few-channel
#: layers"), GEMM against IMPLICIT_GEMM, bf16: RGB stems 11x11/4 2.8x, 7x7/2 1.6x, 3x3/2 1.8x,
#: VGG's 3x3/1 1.3x; a 1-channel 5x20/2 spectrogram layer 3.7x (TF32: 7.5x).
PREFER_BACKWARD_DATA_UP_TO_C = 4
#: Backward-filter of an ungrouped layer whose product the TMA GEMM takes (tma_layouts): the
#: heuristic runs it as GEMM from this many output channels. Each column-matrix element
#: costs 4 bytes of traffic (written, then read) and feeds K multiply-adds, so im2col adds
#: about 2 / K bytes per FLOP: at K >= 512 that is less than the time the TMA GEMM saves over
#: the implicit GEMM's pointer tiles, which reach 30 to 45% of the matmul ceiling on 3x3
#: weight gradients. A 1x1 strided projection has no taps to gather and its implicit GEMM
#: runs near cuDNN on many pixels: GEMM only up to PREFER_BACKWARD_FILTER_UP_TO_PIXELS
#: output pixels (batch x spatial) there. Measured on an H200, bf16, batch 64, tiles tuned
#: (BENCHMARKS.md, "GEMM for late weight gradients"), GEMM against IMPLICIT_GEMM_SPLIT_K:
#: ResNet-50's 3x3 layers at K = 512, 7x7 output 1.27x and 1.24x; VGG-16's at 14x14 1.16x,
#: 28x28 1.16x, and 1.02x with 256 input channels; the projections to 1024 and 2048 channels
#: (12544 and 3136 pixels) 1.36x and 1.83x, to 512 channels at 50176 pixels 0.81x. At
#: K = 256 GEMM lost (ResNet-50's 3x3 at 14x14, 0.85x).
PREFER_BACKWARD_FILTER_FROM_K = 512
PREFER_BACKWARD_FILTER_UP_TO_PIXELS = 16384
#: The most workspace the heuristic takes for it without being asked (Find, a plan or a
#: micro-batch policy may take more), as a share of the device's memory, since the buffer
#: stays with the stream for later calls: 2.5 GiB on an 80 GB H100. ResNet-50's stem at batch
#: 64 needs 450 MiB; AlexNet's at batch 256 1.05 GiB, where GEMM measured 2.8x IMPLICIT_GEMM
#: (a fixed 1 GiB bound left it out). If the allocation fails, `auto` falls back to an
#: algorithm without workspace.
PREFER_UP_TO_MEMORY_SHARE = 1 / 32


def _late_filter_gradient(p: ConvProblem) -> bool:
    """Backward-filter in GEMM's region (PREFER_BACKWARD_FILTER_FROM_K): many output
    channels, a product the TMA GEMM reads, taps to gather or few pixels, and not a layer the
    implicit GEMM already runs on the TMA GEMM itself (1x1 stride 1: no im2col to pay for)
    or on the Hopper weight-gradient kernel (kernels/conv_hopper_filter.py, which the GEMM
    preference was not measured against)."""
    pixels = p.batch * math.prod(p.out_spatial)
    taps = math.prod(p.kernel)
    return (
        p.out_channels >= PREFER_BACKWARD_FILTER_FROM_K
        and (taps > 1 or pixels <= PREFER_BACKWARD_FILTER_UP_TO_PIXELS)
        and tma_layouts(p) is not None
        and pointwise_layouts(p) is None
        and not hopper_offered(p)
    )


def gemm_preferred(p: ConvProblem) -> bool:
    """Whether the heuristic should try GEMM first for `p`, on a GPU, within
    PREFER_UP_TO_MEMORY_SHARE of the current device's memory: backward-data of an ungrouped
    layer of at most PREFER_BACKWARD_DATA_UP_TO_C input channels (grouped layers were not
    measured), and backward-filter of a late layer on Hopper (_late_filter_gradient)."""
    if p.device != "cuda":
        return False
    if p.direction == Direction.BACKWARD_DATA:
        if p.groups != 1 or p.in_channels > PREFER_BACKWARD_DATA_UP_TO_C:
            return False
    elif p.direction != Direction.BACKWARD_FILTER or not _late_filter_gradient(p):
        return False
    memory = device_memory_bytes(torch.cuda.current_device())
    return Gemm().workspace_bytes(p) <= memory * PREFER_UP_TO_MEMORY_SHARE
