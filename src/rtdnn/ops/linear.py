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

from ..algos.geometry import parallel_slots
from ..algos.tiles import (
    tile_candidates,
    tma_gemm_candidates,
    tma_gemm_programs,
    tma_gemm_usable,
    tune,
)
from ..core import (
    bad_param,
    cdiv,
    check_out,
    check_out_disjoint,
    check_runnable,
    check_scaling,
    check_tensor,
    default_matmul_math_mode,
    not_supported,
    resolve_math_mode,
    tma_aligned,
)
from ..core.handle import stream_workspace
from ..core.prepared import PreparedCalls, nonzero, signature
from ..kernels import brgemm, strided
from ..kernels.launch import (
    BrgemmLaunch,
    MatrixLayout,
    Operand,
    Output,
    TileConfig,
    TmaGemmLaunch,
    TmaGemmTiles,
)
from ..kernels.strided import StridedGeometry
from ._common import finish_empty
from .tensor_ops import prepared_reduce, reduce_tensor

ACTIVATIONS = {None: brgemm.identity, "identity": brgemm.identity, "relu": brgemm.relu}

#: Checked call signatures -> prepared calls (core.prepared).
_calls = PreparedCalls()


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
    tiles = cdiv(m, 128) * cdiv(n, 128)
    return max(1, min(cdiv(parallel_slots(device), tiles), k // 1024))


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
        m=c_geo.rows, n=c_geo.cols, steps=cdiv(depth, tiles.block_k), batches=1,
        tiles=tiles, precision=precision, activation=activation, splits=splits,
    )  # fmt: skip


def _layout(g: StridedGeometry) -> MatrixLayout | None:
    return MatrixLayout.of(g.rows, g.cols, g.s_row, g.s_col)


def _prepare_gemm(a, a_geo, b, b_geo, c, bias, activation, precision):
    """The call c = act(alpha * A @ B + bias + beta * c) for strided 2-D A, B and c of these
    shapes and strides: tiles (timed on the first call's tensors on the GPU), split and launch
    chosen once. On Hopper, 16-bit operands with a unit-stride dimension are offered to the
    TMA GEMM too (its tiles first: the untuned choice), which falls back to the pointer
    path's first tiles on a call whose operands are not 16-byte aligned. Returns run(a, b, c,
    alpha, beta, bias)."""
    m, n, depth = a_geo.rows, b_geo.cols, a_geo.cols
    c_geo = _matrix(c)
    device = c.device.type
    act = ACTIVATIONS[activation]
    splits = _splits(m, n, depth, device)
    candidates = list(_candidates(device, c.dtype, m, n, depth))
    a_layout, b_layout = _layout(a_geo), _layout(b_geo)
    if a_layout and b_layout and tma_gemm_usable(device, a.dtype, a_layout, b_layout):
        candidates = tma_gemm_candidates(device, c.dtype, m, n, depth) + candidates
    key = ("linear", a_geo, b_geo, c_geo, c.dtype, precision, splits)
    programs = tma_gemm_programs(device)

    def build(tiles):
        if isinstance(tiles, TmaGemmTiles):
            return TmaGemmLaunch(
                a_layout, b_layout, (c_geo.s_row, c_geo.s_col), tiles=tiles,
                programs=programs, precision=precision, activation=act,
            )  # fmt: skip
        return _launch(a_geo, b_geo, c_geo, depth, tiles, precision, act, splits)

    def make_run(tiles):
        launch = build(tiles)
        scratch = torch.empty_strided(c.shape, c.stride(), dtype=c.dtype, device=c.device)
        ws = stream_workspace(launch.partial_bytes, c.device)
        return lambda: launch(a, b, scratch, bias=bias, workspace=ws)

    tiles = tune(key, candidates, make_run) if device == "cuda" else candidates[0]
    launch = build(tiles)
    pointer = None  # the TMA GEMM's stand-in for a call whose operands are not 16-byte aligned
    if isinstance(tiles, TmaGemmTiles):
        pointer_tiles = next(t for t in candidates if not isinstance(t, TmaGemmTiles))
        pointer = _launch(a_geo, b_geo, c_geo, depth, pointer_tiles, precision, act, splits)
    target = c.device

    def run(a, b, c, alpha, beta, bias=None):
        chosen = launch if pointer is None or tma_aligned(a, b) else pointer
        nbytes = chosen.partial_bytes
        ws = stream_workspace(nbytes, target) if nbytes else None
        chosen(a, b, c, alpha=alpha, beta=beta, bias=bias, workspace=ws)

    return run


def _gemm(a, a_geo, b, b_geo, c, alpha, beta, bias=None, activation=None, math=None) -> None:
    """c = act(alpha * A @ B + bias + beta * c) for strided 2-D A, B and c, on arguments the
    caller has checked (the recurrent layers' GEMMs, c in float32 or in a's dtype), prepared
    once per signature."""
    precision = _precision(math, c.dtype)
    key = ("gemm", a_geo, b_geo, c.shape, c.stride(), a.dtype, c.dtype, c.device, precision,
           activation, bias is None)  # fmt: skip
    run = _calls.get(key, lambda: _prepare_gemm(a, a_geo, b, b_geo, c, bias, activation, precision))
    run(a, b, c, alpha, beta, bias)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """(*, features) -> (rows, features) without copying when the leading dims allow it."""
    return t.reshape(-1, t.shape[-1]) if t.dim() != 2 else t


def _result(out: torch.Tensor | None, shape, like: torch.Tensor) -> torch.Tensor:
    """`out` (checked: shape, dtype, device) or a new tensor."""
    if out is None:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    check_out(out, shape, like)
    return out


def _out_rows(out: torch.Tensor) -> torch.Tensor:
    try:
        return out.view(-1, out.shape[-1])
    except RuntimeError:
        raise not_supported(
            "out.stride()", out.stride(), "out's leading dims must flatten into one (a view)"
        ) from None


def _math_key(math: object) -> tuple:
    """What decides the math mode: `math`, and torch's TF32 switch when it is None."""
    return (math, default_matmul_math_mode() if math is None else None)


def _precision(math: str | None, dtype: torch.dtype) -> str:
    tf32 = resolve_math_mode(math, matmul=True) == "tf32"
    return "tf32" if dtype == torch.float32 and tf32 else "ieee"


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
    check_scaling(alpha, beta, out)
    key = signature("linear", (x, w, bias, out), activation, _math_key(math), nonzero(beta))
    call = _calls.get(key, lambda: _linear_call(x, w, bias, out, activation, math, beta))
    # Every output element reads a whole row and column: nothing runs in place.
    check_out_disjoint(out, x=x, w=w, bias=bias)
    return call(x, w, bias, out, alpha, beta)


def _linear_call(x, w, bias, out, activation, math, beta):
    x = check_tensor("x", x, empty=True)
    w = check_tensor("w", w, ndim=2, dtype=x.dtype, device=x.device)
    if x.shape[-1] != w.shape[1]:
        raise bad_param("x.shape[-1]", x.shape[-1], f"w.shape[1] = {w.shape[1]} (in_features)")
    if bias is not None:
        bias = check_tensor("bias", bias, ndim=1, dtype=x.dtype, device=x.device)
        if bias.shape[0] != w.shape[0]:
            raise bad_param("bias.shape", tuple(bias.shape), f"({w.shape[0]},)")
    if activation not in ACTIVATIONS:
        raise bad_param("activation", activation, f"one of {sorted(map(str, ACTIVATIONS))}")
    check_scaling(0.0, beta, out)
    precision = _precision(math, x.dtype)
    check_runnable(x.device)
    shape = (*x.shape[:-1], w.shape[0])
    y = _result(out, shape, x)
    copy_bias = bias is not None and not bias.is_contiguous()
    if y.numel() == 0:  # no rows
        return lambda x, w, bias, out, alpha, beta: _result(out, shape, x)
    x2, y2 = _rows(x), _out_rows(y)
    b = bias.contiguous() if copy_bias else bias
    run = _prepare_gemm(
        x2, _matrix(x2), w, _matrix(w, transpose=True), y2, b, activation, precision
    )

    def call(x, w, bias, out, alpha, beta):
        y = out if out is not None else torch.empty(shape, dtype=x.dtype, device=x.device)
        run(_rows(x), w, _out_rows(y), alpha, beta, bias.contiguous() if copy_bias else bias)
        return y

    return call


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
    check_scaling(alpha, beta, out)
    key = signature("linear_bwd_data", (dy, w, out), _math_key(math), nonzero(beta))
    call = _calls.get(key, lambda: _backward_data_call(dy, w, out, math, beta))
    check_out_disjoint(out, dy=dy, w=w)
    return call(dy, w, out, alpha, beta)


def _backward_data_call(dy, w, out, math, beta):
    dy = check_tensor("dy", dy, empty=True)
    w = check_tensor("w", w, ndim=2, dtype=dy.dtype, device=dy.device)
    if dy.shape[-1] != w.shape[0]:
        raise bad_param("dy.shape[-1]", dy.shape[-1], f"w.shape[0] = {w.shape[0]}")
    check_scaling(0.0, beta, out)
    precision = _precision(math, dy.dtype)
    check_runnable(dy.device)
    shape = (*dy.shape[:-1], w.shape[1])
    dx = _result(out, shape, dy)
    if dx.numel() == 0:  # no rows
        return lambda dy, w, out, alpha, beta: _result(out, shape, dy)
    dy2 = _rows(dy)
    run = _prepare_gemm(dy2, _matrix(dy2), w, _matrix(w), _out_rows(dx), None, None, precision)

    def call(dy, w, out, alpha, beta):
        dx = out if out is not None else torch.empty(shape, dtype=dy.dtype, device=dy.device)
        run(_rows(dy), w, _out_rows(dx), alpha, beta)
        return dx

    return call


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
    check_scaling(alpha, beta, out)
    key = signature("linear_bwd_weight", (x, dy, out), _math_key(math), nonzero(beta))
    call = _calls.get(key, lambda: _backward_weight_call(x, dy, out, math, beta))
    check_out_disjoint(out, x=x, dy=dy)
    return call(x, dy, out, alpha, beta)


def _backward_weight_call(x, dy, out, math, beta):
    x = check_tensor("x", x, empty=True)
    dy = check_tensor("dy", dy, dtype=x.dtype, device=x.device, empty=True)
    if dy.shape[:-1] != x.shape[:-1]:
        raise bad_param("dy.shape", tuple(dy.shape), f"(*{tuple(x.shape[:-1])}, out_features)")
    check_scaling(0.0, beta, out)
    precision = _precision(math, x.dtype)
    check_runnable(x.device)
    shape = (dy.shape[-1], x.shape[-1])
    dw = _result(out, shape, x)
    if x.numel() == 0:  # a sum over no rows
        return lambda x, dy, out, alpha, beta: finish_empty(_result(out, shape, x), beta)
    x2, dy2 = _rows(x), _rows(dy)
    run = _prepare_gemm(dy2, _matrix(dy2, transpose=True), x2, _matrix(x2), dw, None, None,
                        precision)  # fmt: skip

    def call(x, dy, out, alpha, beta):
        dw = out if out is not None else torch.empty(shape, dtype=x.dtype, device=x.device)
        run(_rows(dy), _rows(x), dw, alpha, beta)
        return dw

    return call


def linear_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor,
    *,
    alpha: float = 1.0,
    math: str | None = None,
    need_x: bool = True,
    need_w: bool = True,
    need_bias: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(dx, dw, db): linear_backward_data(dy, w) and linear_backward_weight(x, dy) with
    alpha, and linear_backward_bias(dy), those asked for (None for the others), no out. One
    signature for all three: a layer's backward checks and looks up once per call instead of
    once per product."""
    check_scaling(alpha, 0.0, None)
    key = signature("linear_bwd", (dy, x, w), _math_key(math), need_x, need_w, need_bias)
    call = _calls.get(key, lambda: _backward_call(dy, x, w, math, need_x, need_w, need_bias))
    return call(dy, x, w, alpha)


def _backward_call(dy, x, w, math, need_x: bool, need_w: bool, need_bias: bool):
    data = _backward_data_call(dy, w, None, math, 0.0) if need_x else None
    weight = _backward_weight_call(x, dy, None, math, 0.0) if need_w else None
    bias = prepared_reduce(_rows(dy), "add", 0, keepdim=False) if need_bias else None

    def call(dy, x, w, alpha):
        dx = data(dy, w, None, alpha, 0.0) if data is not None else None
        dw = weight(x, dy, None, alpha, 0.0) if weight is not None else None
        db = bias(_rows(dy), None, 1.0, 0.0) if bias is not None else None
        return dx, dw, db

    return call


def linear_backward_bias(
    dy: torch.Tensor, *, alpha: float = 1.0, beta: float = 0.0, out: torch.Tensor | None = None
) -> torch.Tensor:
    """db = alpha * (dy summed over every leading index) + beta * out; (out_features,)."""
    dy = check_tensor("dy", dy, empty=True)
    check_out_disjoint(out, dy=dy)  # named as the caller knows it (reduce_tensor says "x")
    # A sum over rows: float32 partial sums over slices of the rows, then a fixed-order
    # finish (deterministic).
    return reduce_tensor(_rows(dy), "add", 0, keepdim=False, alpha=alpha, beta=beta, out=out)
