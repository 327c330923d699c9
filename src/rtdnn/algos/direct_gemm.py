"""DIRECT's "gemm" tiles: a grouped convolution as one of wider groups through the implicit GEMM.

A layer with CG input channels per group is the same convolution as one with WIDTH = PER x CG
channels per group ("super-groups" of PER groups side by side) whose filter is block-diagonal:
each output channel keeps its own group's weights and has zeros against the other groups of
its super-group. The zeros cost PER times the useful products, which these memory-bound layers
have to spare, and the wide groups feed the implicit GEMM (algos/implicit_gemm.py) tiles of 32
or 64 channels, whose pipelined operand loads beat the block-diagonal tensor-core tiles
(kernels/direct_dot.py) on ResNeXt-50's grouped layers (H100, bf16, tiles tuned; widths 32 and
64 through IMPLICIT_GEMM, benchmarks/probes/grouped_as_dense.py): forward 0.72 -> 0.96x of
cuDNN, backward-data 0.92 -> 1.25x, and backward-filter on 16 and 32 channels per group.

Forward and backward-data pack the wide filter into the workspace on every call (one launch,
kernels/direct_dot.widen_filter_kernel) and run the wide problem. Backward-filter runs the wide
problem's filter gradient (IMPLICIT_GEMM_SPLIT_K) into a float32 wide gradient in the workspace
and keeps its diagonal blocks (narrow_filter_kernel), where alpha and beta apply. A width equal
to CG is the layer itself: no packing. In backward-filter DIRECT's one-accumulator-per-tap
tiles come first; the tuner still times these beside them (on an H100 they won one
grouped layer of seven, g1024.14.s2, by 2%).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import triton

from ..core import ConvProblem, Direction, TensorDesc, cdiv, dense_strides
from ..kernels.direct_dot import narrow_filter_kernel, widen_filter_kernel
from ..kernels.launch import KernelLaunch, TileConfig
from .base import ConvTensors, Runner
from .geometry import _strides_3d, _to_3d
from .implicit_gemm import ImplicitGemm, ImplicitGemmSplitK, gemm_shape
from .tiles import gemm_candidates

#: Super-group widths on a GPU. Measured on ResNeXt-50's grouped layers (bf16, every tile
#: timed, benchmarks/probes/gpu_direct.sh's tile log): backward-filter ran fastest on 64-channel
#: super-groups (32: 1.4 to 1.7x slower on an H200), whose filter-gradient GEMM per tap is then
#: 64 x 64; forward and backward-data on 32-channel ones in most layers, 64 on the H100's
#: stride-2 forward (g256.56.s2: 66 against 76 us), so those two directions try both.
WIDTHS = (32, 64)
#: Elements per program of the pack and narrow kernels.
_BLOCK = 1024


#: Backward-filter offers the "gemm" tiles from this many channels per group: below it (4 and
#: 8 per group) the block-diagonal tiles ran 1.15 to 1.3x faster on an H200, and the wide
#: gradient would only enlarge the workspace.
FILTER_GRADIENT_FROM_CG = 16


def widths(p: ConvProblem) -> list[int]:
    """The super-group widths for `p`: grouped 16-bit layers of at least 2 channels per group
    (depthwise layers have the row kernels; backward-filter from FILTER_GRADIENT_FROM_CG on a
    GPU), widths of WIDTHS that hold whole groups and divide the channels (for backward-filter
    the widest). On the CPU twice the group, so that the tests' shapes widen."""
    g, c = p.groups, p.in_channels
    cg = c // g
    if g == 1 or cg < 2 or p.dtype not in (torch.float16, torch.bfloat16):
        return []
    gradient = p.direction == Direction.BACKWARD_FILTER
    if gradient and p.device == "cuda" and cg < FILTER_GRADIENT_FROM_CG:
        return []
    offered = WIDTHS if p.device == "cuda" else (2 * cg,)
    fits = [w for w in offered if w >= cg and w % cg == 0 and c % w == 0]
    return fits[-1:] if gradient else fits


def widened(p: ConvProblem, width: int) -> ConvProblem:
    """`p` with super-groups of `width` channels and a dense channels-last block-diagonal
    filter (float32 for backward-filter, whose wide gradient is summed before it is cut)."""
    shape = (p.out_channels, width, *p.kernel)
    w = TensorDesc(shape, dense_strides(shape, True), _wide_dtype(p))
    return replace(p, w=w, conv=replace(p.conv, groups=p.in_channels // width))


def _wide_dtype(p: ConvProblem) -> torch.dtype:
    return torch.float32 if p.direction == Direction.BACKWARD_FILTER else p.dtype


def _inner(p: ConvProblem) -> ImplicitGemm:
    return ImplicitGemmSplitK() if p.direction == Direction.BACKWARD_FILTER else ImplicitGemm()


def _runs_as_is(p: ConvProblem, width: int) -> bool:
    return width == p.in_channels // p.groups


def inner_candidates(p: ConvProblem, width: int) -> list[TileConfig]:
    """The implicit GEMM's tiles for `p` widened to `width` that are as wide as its GEMM's
    columns and at most as tall as its rows (rounded up to powers of two): narrower ones ran
    1.6x slower on the grouped layers, wider or taller ones compute padding."""
    pw = widened(p, width)
    rows, cols, depth, _ = gemm_shape(pw)
    tall = max(64, triton.next_power_of_2(rows))
    wide = max(16, triton.next_power_of_2(cols))
    every = gemm_candidates(pw, rows, cols, depth)
    fit = [t for t in every if t.block_m <= tall and t.block_n == wide]
    return list(dict.fromkeys(fit or every[:1]))


def _wide_elements(p: ConvProblem, width: int) -> int:
    return p.out_channels * math.prod(p.kernel) * width


def _wide_bytes(p: ConvProblem, width: int) -> int:
    """The packed wide filter (or wide float32 gradient), rounded up to 256 bytes so that the
    split-K workspace after it stays aligned."""
    return cdiv(_wide_elements(p, width) * _wide_dtype(p).itemsize, 256) * 256


def workspace_bytes(p: ConvProblem, width: int) -> int:
    """Bytes the "gemm" tiles of `width` need: the wide filter or gradient, and backward-filter's
    split-K partial sums."""
    if _runs_as_is(p, width):
        return _inner(p).workspace_bytes(p)
    pw = widened(p, width)
    return _wide_bytes(p, width) + _inner(p).workspace_bytes(pw)


def prepare(p: ConvProblem, width: int, tiles: TileConfig) -> Runner:
    """The runner of `p` as super-groups of `width` channels with the implicit GEMM's `tiles`."""
    inner_algo = _inner(p)
    if _runs_as_is(p, width):
        return inner_algo.prepare(p, tiles)
    pw = widened(p, width)
    inner = inner_algo.prepare(pw, tiles)
    total = _wide_elements(p, width)
    wide_bytes = _wide_bytes(p, width)
    kd, kh, kw = _to_3d(p.kernel, 1)
    shape = dict(
        w_strides=_strides_3d(p.w), w_offset=p.w.offset, total=total, CG=p.in_channels // p.groups,
        KG=p.out_channels // p.groups, WIDTH=width, TAPS=kd * kh * kw, KH=kh, KW=kw, BLOCK=_BLOCK,
    )  # fmt: skip
    grid = (cdiv(total, _BLOCK),)

    def wide_view(workspace: torch.Tensor) -> torch.Tensor:
        dtype = pw.w.dtype
        flat = workspace[: total * dtype.itemsize].view(dtype)
        return flat.as_strided(pw.w.shape, pw.w.strides)

    if p.direction != Direction.BACKWARD_FILTER:
        pack = KernelLaunch(widen_filter_kernel, grid, dict(num_warps=4), **shape)

        def run(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
            wide = wide_view(workspace)
            pack(W=t.w, WIDE=wide)
            inner(ConvTensors(t.x, wide, t.y, t.bias), None, alpha, beta)

        return run

    narrows: dict[bool, KernelLaunch] = {}

    def run_backward_filter(t: ConvTensors, workspace, alpha: float, beta: float) -> None:
        wide = wide_view(workspace)
        inner(ConvTensors(t.x, wide, t.y), workspace[wide_bytes:], 1.0, 0.0)
        key = beta != 0
        narrow = narrows.get(key)
        if narrow is None:
            narrow = narrows[key] = KernelLaunch(
                narrow_filter_kernel, grid, dict(num_warps=4), BETA_NONZERO=key, **shape
            )
        narrow(WIDE=wide, DW=t.w, alpha=float(alpha), beta=float(beta))

    return run_backward_filter
