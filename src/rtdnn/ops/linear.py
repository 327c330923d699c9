"""Linear (fully connected) layers on the batch-reduce GEMM building block.

    y  = act(alpha * x @ w^T + bias + beta * out)      linear
    dx = alpha * dy @ w + beta * out                   linear_backward_data
    dw = alpha * dy^T @ x + beta * out                 linear_backward_weight
    db = alpha * sum over rows of dy + beta * out      linear_backward_bias

x: (*, in_features), w: (out_features, in_features), bias: (out_features,); any strides (the
leading dims of x and dy are flattened, copying only if they cannot be viewed as one). All
three are the same kernel as the convolutions with plain strided addressing. `activation` is
None (identity) or "relu", fused into the epilogue. `math` is "fp32" (strict) or "tf32" for
float32 data; None follows `torch.backends.cuda.matmul.allow_tf32`, as torch.nn.Linear does
(strict by default; convolutions follow cuDNN's switch instead).

`out` must share no memory with x, w, dy or bias (BadParamError): every output element reads
a whole row and column, so nothing runs in place.
"""

from __future__ import annotations

import functools

import torch
import triton

from ..algos.geometry import parallel_slots
from ..algos.tiles import tile_candidates, tune
from ..core import (
    bad_param,
    check_out,
    check_out_disjoint,
    check_runnable,
    check_scaling,
    check_tensor,
    not_supported,
    resolve_math_mode,
)
from ..core.handle import stream_workspace
from ..kernels import brgemm, strided
from ..kernels.launch import BrgemmLaunch, Operand, Output, TileConfig
from ..kernels.strided import StridedGeometry
from ._common import finish_empty

ACTIVATIONS = {None: brgemm.identity, "identity": brgemm.identity, "relu": brgemm.relu}


def _matrix(t: torch.Tensor, transpose: bool = False) -> StridedGeometry:
    """A 2-D tensor (or its transpose) as a strided matrix for the GEMM."""
    rows, cols = t.shape
    s_row, s_col = t.stride()
    if transpose:
        rows, cols, s_row, s_col = cols, rows, s_col, s_row
    return StridedGeometry(rows, cols, 1, 0, 0, 0, s_row, s_col, 0)


def _splits(m: int, n: int, k: int, device: str) -> int:
    """Split the reduction when the output has too few tiles to fill the device."""
    if device != "cuda":
        return 1 if k < 64 else 2
    tiles = triton.cdiv(m, 128) * triton.cdiv(n, 128)
    return max(1, min(triton.cdiv(parallel_slots(device), tiles), k // 1024))


@functools.lru_cache(maxsize=4096)
def _candidates(device: str, dtype: torch.dtype, m: int, n: int, depth: int) -> tuple:
    """tile_candidates, once per GEMM shape: a layer's call repeats it every step."""
    return tuple(tile_candidates(device, dtype, m, n, depth))


@functools.lru_cache(maxsize=1024)
def _launch(
    a_geo: StridedGeometry,
    b_geo: StridedGeometry,
    c_geo: StridedGeometry,
    depth: int,
    tiles: TileConfig,
    precision: str,
    activation,
    splits: int,
) -> BrgemmLaunch:
    return BrgemmLaunch(
        Operand(strided.strided_a_setup, strided.matrix_a_load, a_geo),
        Operand(strided.strided_b_setup, strided.matrix_b_load, b_geo),
        Output(strided.strided_c_addr, c_geo),
        m=c_geo.rows, n=c_geo.cols, steps=triton.cdiv(depth, tiles.block_k), batches=1,
        tiles=tiles, precision=precision, activation=activation, splits=splits,
    )  # fmt: skip


def _gemm(a, a_geo, b, b_geo, c, alpha, beta, bias=None, activation=None, math=None) -> None:
    """c = act(alpha * A @ B + bias + beta * c) for strided 2-D A, B and c."""
    m, n, depth = a_geo.rows, b_geo.cols, a_geo.cols
    c_geo = _matrix(c)
    device = c.device.type
    tf32 = resolve_math_mode(math, matmul=True) == "tf32"
    precision = "tf32" if c.dtype == torch.float32 and tf32 else "ieee"
    act = ACTIVATIONS[activation]
    splits = _splits(m, n, depth, device)
    candidates = list(_candidates(device, c.dtype, m, n, depth))
    key = ("linear", a_geo, b_geo, c_geo, c.dtype, precision, splits)

    def workspace_for(launch: BrgemmLaunch):
        return stream_workspace(launch.partial_bytes, c.device)

    def make_run(tiles):
        launch = _launch(a_geo, b_geo, c_geo, depth, tiles, precision, act, splits)
        scratch = torch.empty_strided(c.shape, c.stride(), dtype=c.dtype, device=c.device)
        ws = workspace_for(launch)
        return lambda: launch(a, b, scratch, bias=bias, workspace=ws)

    tiles = tune(key, candidates, make_run) if device == "cuda" else candidates[0]
    launch = _launch(a_geo, b_geo, c_geo, depth, tiles, precision, act, splits)
    launch(a, b, c, alpha=alpha, beta=beta, bias=bias, workspace=workspace_for(launch))


def _rows(t: torch.Tensor) -> torch.Tensor:
    """(*, features) -> (rows, features) without copying when the leading dims allow it."""
    return t.reshape(-1, t.shape[-1]) if t.dim() != 2 else t


def _out(out, shape, like, **reads: torch.Tensor | None) -> torch.Tensor:
    """`out` (checked: shape, dtype, device, no overlap with what the GEMM reads: every
    output element reads a whole row and column) or a new tensor."""
    if out is None:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    check_out(out, shape, like)
    check_out_disjoint(out, **reads)
    return out


def _out_rows(out: torch.Tensor) -> torch.Tensor:
    try:
        return out.view(-1, out.shape[-1])
    except RuntimeError:
        raise not_supported(
            "out.stride()", out.stride(), "out's leading dims must flatten into one (a view)"
        ) from None


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    activation: str | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
    math: str | None = None,
) -> torch.Tensor:
    """y = act(alpha * x @ w^T + bias + beta * out).

    x: (*, in_features); w: (out_features, in_features); bias: (out_features,) or None.
    Returns y (*, out_features), or `out` written in place. No rows (x.shape[:-1] holding a
    0) give an empty y, and zero weight and bias gradients.
    """
    x = check_tensor("x", x, empty=True)
    w = check_tensor("w", w, ndim=2, dtype=x.dtype, device=x.device)
    if x.shape[-1] != w.shape[1]:
        raise bad_param("x.shape[-1]", x.shape[-1], f"w.shape[1] = {w.shape[1]} (in_features)")
    if bias is not None:
        bias = check_tensor("bias", bias, ndim=1, dtype=x.dtype, device=x.device)
        if bias.shape[0] != w.shape[0]:
            raise bad_param("bias.shape", tuple(bias.shape), f"({w.shape[0]},)")
        bias = bias.contiguous()
    if activation not in ACTIVATIONS:
        raise bad_param("activation", activation, f"one of {sorted(map(str, ACTIVATIONS))}")
    check_scaling(alpha, beta, out)
    resolve_math_mode(math, matmul=True)
    check_runnable(x.device)
    y = _out(out, (*x.shape[:-1], w.shape[0]), x, x=x, w=w, bias=bias)
    if y.numel() == 0:  # no rows
        return y
    x2, y2 = _rows(x), _out_rows(y)
    _gemm(x2, _matrix(x2), w, _matrix(w, transpose=True), y2, alpha, beta, bias, activation, math)
    return y


def linear_backward_data(
    dy: torch.Tensor,
    w: torch.Tensor,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
    math: str | None = None,
) -> torch.Tensor:
    """dx = alpha * dy @ w + beta * out. dy: (*, out_features); returns (*, in_features)."""
    dy = check_tensor("dy", dy, empty=True)
    w = check_tensor("w", w, ndim=2, dtype=dy.dtype, device=dy.device)
    if dy.shape[-1] != w.shape[0]:
        raise bad_param("dy.shape[-1]", dy.shape[-1], f"w.shape[0] = {w.shape[0]}")
    check_scaling(alpha, beta, out)
    resolve_math_mode(math, matmul=True)
    check_runnable(dy.device)
    dx = _out(out, (*dy.shape[:-1], w.shape[1]), dy, dy=dy, w=w)
    if dx.numel() == 0:  # no rows
        return dx
    dy2, dx2 = _rows(dy), _out_rows(dx)
    _gemm(dy2, _matrix(dy2), w, _matrix(w), dx2, alpha, beta, math=math)
    return dx


def linear_backward_weight(
    x: torch.Tensor,
    dy: torch.Tensor,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
    math: str | None = None,
) -> torch.Tensor:
    """dw = alpha * dy^T @ x + beta * out, summed over every leading index of x and dy.

    x: (*, in_features); dy: (*, out_features). Returns (out_features, in_features).
    """
    x = check_tensor("x", x, empty=True)
    dy = check_tensor("dy", dy, dtype=x.dtype, device=x.device, empty=True)
    if dy.shape[:-1] != x.shape[:-1]:
        raise bad_param("dy.shape", tuple(dy.shape), f"(*{tuple(x.shape[:-1])}, out_features)")
    check_scaling(alpha, beta, out)
    resolve_math_mode(math, matmul=True)
    check_runnable(x.device)
    dw = _out(out, (dy.shape[-1], x.shape[-1]), x, x=x, dy=dy)
    if x.numel() == 0:  # a sum over no rows
        return finish_empty(dw, beta)
    x2, dy2 = _rows(x), _rows(dy)
    _gemm(dy2, _matrix(dy2, transpose=True), x2, _matrix(x2), dw, alpha, beta, math=math)
    return dw


def linear_backward_bias(
    dy: torch.Tensor, *, alpha: float = 1.0, beta: float = 0.0, out: torch.Tensor | None = None
) -> torch.Tensor:
    """db = alpha * (dy summed over every leading index) + beta * out; (out_features,)."""
    from .conv import conv_backward_bias

    dy = check_tensor("dy", dy, empty=True)
    dy2 = _rows(dy)
    # The per-channel sum of the convolution, with rows as the batch and one pixel each.
    return conv_backward_bias(dy2.unsqueeze(-1), alpha=alpha, beta=beta, out=out)
