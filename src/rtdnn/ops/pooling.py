"""Pooling: the public functional API.

x: (N, C, *S) with 1 to 3 spatial dims, any strides (channels-last included), float32 /
float16 / bfloat16. Modes: "max", "avg_include_pad" (divisor: taps inside the padded input,
PyTorch's count_include_pad=True), "avg_exclude_pad" (divisor: taps inside the input).

    y  = alpha * pool(x) + beta * out
    dx = alpha * (gradient of pool at x, given dy) + beta * out

Output size per dim: floor or ceil((S + 2p - d*(k-1) - 1) / s) + 1, and with ceil_mode a
last window that would start past the input and its left padding is dropped (PyTorch's rule).
Padding may be at most half the window (PyTorch's rule), so every window sees the input.

Max pooling picks the first maximum in window scan order (d, then h, then w), and NaN wins, as
in PyTorch; its backward routes each dy to that element, deterministically (no atomics).

`out` must share no memory with x or dy (BadParamError): windows read neighbouring elements.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..core import (
    bad_param,
    channels_last,
    check_out_disjoint,
    check_scaling,
    check_tensor,
    empty_like_layout,
)
from ..core.prepared import PreparedCalls, nonzero, signature
from ..kernels import pooling as K
from ..kernels.launch import slot_launch
from ._common import check_batch, check_span, int_tuple, output, spatial5

MODES = tuple(K.MODES)
IntOrSeq = int | Sequence[int]

#: Checked call signatures -> prepared calls (core.prepared).
_calls = PreparedCalls()


@dataclass(frozen=True)
class PoolDesc:
    mode: str
    window: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    ceil_mode: bool


def pool_desc(x_dim: int, mode, window, stride, padding, dilation, ceil_mode) -> PoolDesc:
    if mode not in K.MODES:
        raise bad_param("mode", mode, f"one of {MODES}")
    nd = x_dim - 2
    window = int_tuple("window", window, nd, minimum=1)
    stride = window if stride is None else int_tuple("stride", stride, nd, minimum=1)
    padding = int_tuple("padding", padding, nd, minimum=0)
    dilation = int_tuple("dilation", dilation, nd, minimum=1)
    if not isinstance(ceil_mode, bool):
        raise bad_param("ceil_mode", ceil_mode, "a bool")
    if any(p > k // 2 for p, k in zip(padding, window, strict=True)):
        raise bad_param("padding", padding, f"at most half the window {window} in every dim")
    return PoolDesc(mode, window, stride, padding, dilation, ceil_mode)


def pool_output_size(in_size: Sequence[int], p: PoolDesc) -> tuple[int, ...]:
    out = []
    for i, k, s, pad, d in zip(in_size, p.window, p.stride, p.padding, p.dilation, strict=True):
        span = i + 2 * pad - d * (k - 1) - 1
        o = (-(-span // s) if p.ceil_mode else span // s) + 1
        if p.ceil_mode and (o - 1) * s >= i + pad:
            o -= 1
        out.append(o)
    if any(o < 1 for o in out):
        raise bad_param(
            "window", p.window,
            f"a window that fits the input {tuple(in_size)} with padding {p.padding} and "
            f"dilation {p.dilation} (output size {tuple(out)})",
        )  # fmt: skip
    return tuple(out)


def _geometry(p: PoolDesc | None, shape5, x_st, y_st, i_st, out5, tiles) -> K.PoolGeometry:
    def pad3(v, fill):
        return (fill,) * (3 - len(v)) + tuple(v)

    return K.PoolGeometry(
        shape5[0], shape5[1], tuple(shape5[2:]), tuple(out5),
        pad3(p.stride if p else (), 1), pad3(p.padding if p else (), 0),
        pad3(p.dilation if p else (), 1), tuple(x_st), tuple(y_st), tuple(i_st),
        tiles.rows, tiles.inner, tiles.inner_tiles,
    )  # fmt: skip


def _window3(p: PoolDesc) -> tuple[int, int, int]:
    return (1,) * (3 - len(p.window)) + p.window


def _is_cl(t: torch.Tensor) -> bool:
    """Tile channels-last when C is the innermost dim in memory."""
    return channels_last(t)


def _tap_dtype(taps: int) -> torch.dtype:
    return torch.int8 if taps <= 127 else torch.int16 if taps <= 32767 else torch.int32


def pooling_forward(
    x: torch.Tensor,
    mode: str,
    window: IntOrSeq,
    *,
    stride: IntOrSeq | None = None,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    ceil_mode: bool = False,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """y = alpha * pool(x) + beta * out. x: (N, C, *S); y: (N, C, *O) in x's memory format.

    window, stride (default: window), padding, dilation: an int or one per spatial dim.
    A batch of N = 0 gives an empty y.
    """
    check_scaling(alpha, beta, out)
    conf = (mode, window, stride, padding, dilation, ceil_mode)
    key = signature("pool", (x, out), *conf, nonzero(beta))
    call = _calls.get(key, lambda: _forward_call(x, out, *conf, beta))
    check_out_disjoint(out, x=x)
    return call(x, out, alpha, beta)


def _forward_call(x, out, mode, window, stride, padding, dilation, ceil_mode, beta):
    x = check_batch("x", check_tensor("x", x, ndim=(3, 4, 5), empty=True))
    check_span("x", x)
    p = pool_desc(x.dim(), mode, window, stride, padding, dilation, ceil_mode)
    shape = (*x.shape[:2], *pool_output_size(x.shape[2:], p))
    y = output(out, shape, x, 0.0, beta, reads=[])

    def result(x, out):
        return out if out is not None else empty_like_layout(shape, x)

    if y.numel() == 0:  # a batch of 0
        return lambda x, out, alpha, beta: result(x, out)
    shape5, x_st = spatial5(x.shape, x.stride())
    out5, y_st = spatial5(y.shape, y.stride())
    cl = _is_cl(x)
    tiles = K.pool_tiles(shape5[0], shape5[1], out5[2:], cl, x.element_size())
    geo = _geometry(p, shape5, x_st, y_st, (0,) * 5, out5[2:], tiles)
    kd, kh, kw = _window3(p)
    launch = slot_launch(
        K.pool_fwd_kernel, tiles.grid, ("X", "Y", "IDX", "alpha", "beta"), tiles.num_warps,
        geo=geo, MODE=K.MODES[mode], KD=kd, KH=kh, KW=kw, CL=cl, STORE_Y=True,
        STORE_IDX=False, BETA_NONZERO=beta != 0, BLOCK_R=tiles.block_r, BLOCK_I=tiles.block_i,
        STEPS=tiles.steps,
    )  # fmt: skip

    def call(x, out, alpha, beta):
        y = result(x, out)
        launch(x, y, y, float(alpha), float(beta))
        return y

    return call


def pooling_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor | None,
    mode: str,
    window: IntOrSeq,
    *,
    stride: IntOrSeq | None = None,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    ceil_mode: bool = False,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """dx = alpha * (gradient of pooling_forward at x, given dy) + beta * out.

    dy: (N, C, *O); x: the forward input (N, C, *S), read only by max pooling; y: the
    forward output, checked for shape when given but not read: max pooling recomputes the
    argmax from x (one byte per output), which moves fewer bytes than reading y. Returns dx
    in x's memory format, or `out`.
    """
    check_scaling(alpha, beta, out)
    conf = (mode, window, stride, padding, dilation, ceil_mode)
    key = signature("pool_bwd", (dy, x, y, out), *conf, nonzero(beta))
    call = _calls.get(key, lambda: _backward_call(dy, x, y, out, *conf, beta))
    check_out_disjoint(out, dy=dy, x=x)
    return call(dy, x, out, alpha, beta)


def _backward_call(dy, x, y, out, mode, window, stride, padding, dilation, ceil_mode, beta):
    x = check_batch("x", check_tensor("x", x, ndim=(3, 4, 5), empty=True))
    dy = check_tensor("dy", dy, ndim=x.dim(), dtype=x.dtype, device=x.device, empty=True)
    check_span("x", x)
    check_span("dy", dy)
    p = pool_desc(x.dim(), mode, window, stride, padding, dilation, ceil_mode)
    y_shape = (*x.shape[:2], *pool_output_size(x.shape[2:], p))
    if tuple(dy.shape) != y_shape:
        raise bad_param("dy.shape", tuple(dy.shape), f"{y_shape}, the pooling output's shape")
    if y is not None:
        check_tensor("y", y, dtype=x.dtype, device=x.device, empty=True)
        if tuple(y.shape) != y_shape:
            raise bad_param("y.shape", tuple(y.shape), f"{y_shape}, the pooling output's shape")
    dx = output(out, x.shape, x, 0.0, beta, reads=[])

    def result(x, out):
        return out if out is not None else empty_like_layout(x.shape, x)

    if dx.numel() == 0:  # a batch of 0
        return lambda dy, x, out, alpha, beta: result(x, out)
    shape5, x_st = spatial5(x.shape, x.stride())
    out5, dy_st = spatial5(dy.shape, dy.stride())
    _, dx_st = spatial5(dx.shape, dx.stride())
    kd, kh, kw = _window3(p)
    mode_id = K.MODES[mode]
    argmax = None
    tap_st = (0,) * 5
    if mode == "max":
        # Pass 1: the argmax tap of every window, laid out like the tiles of pass 2.
        cl = _is_cl(x)
        n, c, od, oh, ow = out5
        tap_dtype = _tap_dtype(kd * kh * kw)
        if cl:
            tap_shape, tap_st = (n, od, oh, ow, c), (od * oh * ow * c, 1, oh * ow * c, ow * c, c)
        else:
            tap_shape = (n, c, od, oh, ow)
            tap_st = (c * od * oh * ow, od * oh * ow, oh * ow, ow, 1)
        tiles = K.pool_tiles(n, c, out5[2:], cl, x.element_size())
        geo = _geometry(p, shape5, x_st, (0,) * 5, tap_st, out5[2:], tiles)
        argmax = slot_launch(
            K.pool_fwd_kernel, tiles.grid, ("X", "Y", "IDX"), tiles.num_warps, geo=geo,
            alpha=1.0, beta=0.0, MODE=mode_id, KD=kd, KH=kh, KW=kw, CL=cl, STORE_Y=False,
            STORE_IDX=True, BETA_NONZERO=False, BLOCK_R=tiles.block_r, BLOCK_I=tiles.block_i,
            STEPS=tiles.steps,
        )  # fmt: skip
    cl = _is_cl(dx)
    tiles = K.pool_tiles(shape5[0], shape5[1], shape5[2:], cl, dx.element_size())
    geo = _geometry(p, shape5, dx_st, dy_st, tap_st, out5[2:], tiles)
    md, mh, mw = (
        K.windows_per_input(k, s, d, o)
        for k, s, d, o in zip((kd, kh, kw), geo.stride, geo.dilation, out5[2:], strict=True)
    )
    scatter = slot_launch(
        K.pool_bwd_kernel, tiles.grid, ("DY", "IDX", "DX", "alpha", "beta"), tiles.num_warps,
        geo=geo, MODE=mode_id, KD=kd, KH=kh, KW=kw, MD=md, MH=mh, MW=mw, CL=cl,
        BETA_NONZERO=beta != 0, BLOCK_R=tiles.block_r, BLOCK_I=tiles.block_i, STEPS=tiles.steps,
    )  # fmt: skip

    def call(dy, x, out, alpha, beta):
        dx = result(x, out)
        taps = dy
        if argmax is not None:
            taps = torch.empty(tap_shape, dtype=tap_dtype, device=x.device)
            argmax(x, taps, taps)
        scatter(dy, taps, dx, float(alpha), float(beta))
        return dx

    return call


def adaptive_size(x: torch.Tensor, output_size) -> tuple[int, ...]:
    """adaptive_avg_pool's output_size checked: one int >= 1 per spatial dim (None keeps it)."""
    nd = x.dim() - 2
    if isinstance(output_size, (list, tuple)):
        output_size = tuple(x.shape[2 + i] if s is None else s for i, s in enumerate(output_size))
    return int_tuple("output_size", output_size, nd, minimum=1)


def adaptive_avg_pool(
    x: torch.Tensor,
    output_size: IntOrSeq,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """y = alpha * adaptive_avg_pool(x) + beta * out, as torch's AdaptiveAvgPoolNd.

    Output index o of a dim of size I -> O averages inputs [o*I // O, ceil((o+1)*I / O)).
    output_size: an int or one per spatial dim (None keeps that dim). Output size 1 in every
    dim is global average pooling, run as a reduction.
    """
    check_scaling(alpha, beta, out)
    key = signature("adaptive_pool", (x, out), output_size, nonzero(beta))
    call = _calls.get(key, lambda: _adaptive_call(x, out, output_size, beta))
    check_out_disjoint(out, x=x)
    return call(x, out, alpha, beta)


def _adaptive_call(x, out, output_size, beta):
    x = check_batch("x", check_tensor("x", x, ndim=(3, 4, 5), empty=True))
    check_span("x", x)
    osize = adaptive_size(x, output_size)
    shape = (*x.shape[:2], *osize)
    y = output(out, shape, x, 0.0, beta, reads=[])

    def result(x, out):
        return out if out is not None else empty_like_layout(shape, x)

    if y.numel() == 0:  # a batch of 0
        return lambda x, out, alpha, beta: result(x, out)
    if all(o == 1 for o in osize):
        from .tensor_ops import reduce_tensor

        dims = tuple(range(2, x.dim()))
        return lambda x, out, alpha, beta: reduce_tensor(
            x, "avg", dims, alpha=alpha, beta=beta, out=result(x, out)
        )
    shape5, x_st = spatial5(x.shape, x.stride())
    out5, y_st = spatial5(y.shape, y.stride())
    cl = _is_cl(x)
    tiles = K.pool_tiles(shape5[0], shape5[1], out5[2:], cl, x.element_size())
    geo = _geometry(None, shape5, x_st, y_st, (0,) * 5, out5[2:], tiles)
    kd, kh, kw = (K.adaptive_max_window(i, o) for i, o in zip(shape5[2:], out5[2:], strict=True))
    launch = slot_launch(
        K.adaptive_fwd_kernel, tiles.grid, ("X", "Y", "alpha", "beta"), tiles.num_warps,
        geo=geo, KD=kd, KH=kh, KW=kw, CL=cl, BETA_NONZERO=beta != 0, BLOCK_R=tiles.block_r,
        BLOCK_I=tiles.block_i, STEPS=tiles.steps,
    )  # fmt: skip

    def call(x, out, alpha, beta):
        y = result(x, out)
        launch(x, y, float(alpha), float(beta))
        return y

    return call


def adaptive_avg_pool_backward(
    dy: torch.Tensor,
    x_shape: Sequence[int],
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """dx = alpha * (gradient of adaptive_avg_pool, given dy) + beta * out.

    dy: (N, C, *O); x_shape: the forward input's shape (N, C, *S). dx is in dy's format.
    """
    check_scaling(alpha, beta, out)
    key = signature("adaptive_pool_bwd", (dy, out), x_shape, nonzero(beta))
    call = _calls.get(key, lambda: _adaptive_backward_call(dy, out, x_shape, beta))
    check_out_disjoint(out, dy=dy)
    return call(dy, out, alpha, beta)


def _adaptive_backward_call(dy, out, x_shape, beta):
    dy = check_batch("dy", check_tensor("dy", dy, ndim=(3, 4, 5), empty=True))
    check_span("dy", dy)
    try:
        x_shape = tuple(int(s) for s in x_shape)
    except (TypeError, ValueError):
        raise bad_param("x_shape", x_shape, f"a sequence of {dy.dim()} ints") from None
    if len(x_shape) != dy.dim() or tuple(x_shape[:2]) != tuple(dy.shape[:2]):
        raise bad_param("x_shape", x_shape, f"(N, C, *S) with N, C = {tuple(dy.shape[:2])}")
    if x_shape[0] < 0 or any(s < 1 for s in x_shape[1:]):
        raise bad_param("x_shape", x_shape, "no dimension below 1 (a batch of 0 is fine)")
    dx = output(out, x_shape, dy, 0.0, beta, reads=[])

    def result(dy, out):
        return out if out is not None else empty_like_layout(x_shape, dy)

    if dx.numel() == 0:  # a batch of 0
        return lambda dy, out, alpha, beta: result(dy, out)
    shape5, dx_st = spatial5(dx.shape, dx.stride())
    out5, dy_st = spatial5(dy.shape, dy.stride())
    cl = _is_cl(dx)
    tiles = K.pool_tiles(shape5[0], shape5[1], shape5[2:], cl, dx.element_size())
    geo = _geometry(None, shape5, dx_st, dy_st, (0,) * 5, out5[2:], tiles)
    md, mh, mw = (K.adaptive_max_window(o, i) for i, o in zip(shape5[2:], out5[2:], strict=True))
    launch = slot_launch(
        K.adaptive_bwd_kernel, tiles.grid, ("DY", "DX", "alpha", "beta"), tiles.num_warps,
        geo=geo, MD=md, MH=mh, MW=mw, CL=cl, BETA_NONZERO=beta != 0, BLOCK_R=tiles.block_r,
        BLOCK_I=tiles.block_i, STEPS=tiles.steps,
    )  # fmt: skip

    def call(dy, out, alpha, beta):
        dx = result(dy, out)
        launch(dy, dx, float(alpha), float(beta))
        return dx

    return call
