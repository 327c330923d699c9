"""Layer norm and RMS norm over the last dims, as torch.nn.functional defines them.

x is (*L, *D) with D = normalized_shape, any strides. One statistic per leading index:

    layer norm   y = alpha * ((x - mean) * rstd * weight + bias) + beta * out,
                 rstd = 1 / sqrt(mean((x - mean)^2) + eps)
    RMS norm     y = alpha * (x * rstd * weight) + beta * out,  rstd = 1 / sqrt(mean(x^2) + eps)

weight and bias have shape D (optional). Statistics are float32, of shape L. A row that fits in
registers is read once (forward) or once per operand (backward); longer rows are walked twice.
The parameter gradients are summed per program and then across programs in a fixed order.

`out` must share no memory with any input (BadParamError), even out=x: the statistics and the
normalize pass read x separately. eps must be > 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..algos import norm as engine
from ..core import (
    NotSupportedError,
    bad_param,
    check_out_disjoint,
    check_scaling,
    check_tensor,
)
from ..core.prepared import nonzero, signature
from . import _norm as V


def _normalized(x: torch.Tensor, normalized_shape) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(kept dims, normalized shape) after checking that x ends with normalized_shape."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
    try:
        if isinstance(shape, (str, bytes)) or any(isinstance(s, bool) for s in shape):
            raise TypeError
        shape = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise bad_param("normalized_shape", normalized_shape, "an int or ints") from None
    if not shape or len(shape) > x.dim() or tuple(x.shape[x.dim() - len(shape) :]) != shape:
        raise bad_param(
            "normalized_shape", normalized_shape, f"a non-empty tail of x's shape {tuple(x.shape)}"
        )
    if 0 in shape:
        raise bad_param("normalized_shape", normalized_shape, "no zero-sized dim")
    return tuple(range(x.dim() - len(shape))), shape


def _fit(x: torch.Tensor, kept: tuple[int, ...]) -> bool:
    """True if x's dims merge into at most 4 kept and 4 reduced ones (else x is copied)."""
    try:
        engine.geometry(x.shape, kept, [x.stride()])
    except NotSupportedError:
        return False
    return True


def _forward(x, normalized_shape, weight, bias, eps, alpha, beta, out, rms: bool):
    tensors = (x, weight, bias, out)
    k = signature("rms" if rms else "ln", tensors, normalized_shape, nonzero(beta))
    call = engine.cache.get(k, lambda: _forward_call(*tensors, normalized_shape, beta, rms))
    eps = V.eps(eps)
    check_scaling(alpha, beta, out)
    check_out_disjoint(out, x=x, weight=weight, bias=bias)
    return call(*tensors, eps, float(alpha), float(beta))


def _forward_call(x, weight, bias, out, normalized_shape, beta, rms):
    x = check_tensor("x", x, empty=True)
    kept, nshape = _normalized(x, normalized_shape)
    weight = V.param("weight", weight, nshape, x)
    bias = V.param("bias", bias, nshape, x)
    check_scaling(0.0, beta, out)
    y = V.output(out, x)
    V.ready(x)
    lead = tuple(x.shape[: len(kept)])
    y_strides = y.stride()
    if x.numel() == 0:  # no rows

        def empty_call(x, weight, bias, out, *_):
            y = out if out is not None else V.empty(x.shape, y_strides, x)
            stats = torch.empty(lead, dtype=torch.float32, device=x.device)
            return y, stats, torch.empty_like(stats)

        return empty_call
    copy = not _fit(x, kept)
    xs = x.contiguous() if copy else x
    dims = range(len(kept), x.dim())
    plan = engine.ForwardPlan(
        xs, y, kept, V.broadcast(weight, dims, x.shape), V.broadcast(bias, dims, x.shape), None,
        rms=rms, activation="identity", beta_nonzero=beta != 0, running=False,
    )  # fmt: skip

    def call(x, weight, bias, out, eps, alpha, beta):
        y = out if out is not None else V.empty(x.shape, y_strides, x)
        mean = torch.empty(lead, dtype=torch.float32, device=x.device)
        rstd = torch.empty(lead, dtype=torch.float32, device=x.device)
        xs = x.contiguous() if copy else x
        plan(xs, y, mean, rstd, V.contiguous(weight), V.contiguous(bias), None, None, None, eps,
             0.0, alpha, beta)  # fmt: skip
        return y, mean, rstd

    return call


def _backward(dy, x, normalized_shape, mean, rstd, weight, param_grads, alpha, beta, out, rms):
    tensors = (dy, x, mean, rstd, weight, out)
    k = signature("rms_bwd" if rms else "ln_bwd", tensors, normalized_shape, param_grads,
              nonzero(beta))  # fmt: skip
    call = engine.cache.get(
        k, lambda: _backward_call(*tensors, normalized_shape, param_grads, beta, rms)
    )
    check_scaling(alpha, beta, out)
    check_out_disjoint(out, dy=dy, x=x, mean=mean, rstd=rstd, weight=weight)
    return call(*tensors, float(alpha), float(beta))


def _backward_call(dy, x, mean, rstd, weight, out, normalized_shape, param_grads, beta, rms):
    x = check_tensor("x", x, empty=True)
    dy = V.like("dy", dy, x)
    kept, nshape = _normalized(x, normalized_shape)
    lead = tuple(x.shape[: len(kept)])
    V.stat("rstd", rstd, lead, x)
    if not rms:
        V.stat("mean", mean, lead, x)
    weight = V.param("weight", weight, nshape, x)
    if not isinstance(param_grads, bool):
        raise bad_param("param_grads", param_grads, "True or False")
    check_scaling(0.0, beta, out)
    dx = V.output(out, x)
    V.ready(x)
    gdt = V.grad_dtype(weight)
    dx_strides = dx.stride()
    if x.numel() == 0:  # no rows: the parameter gradients are sums over nothing

        def empty_call(dy, x, mean, rstd, weight, out, *_):
            dx = out if out is not None else V.empty(x.shape, dx_strides, x)
            if not param_grads:
                return dx, None, None
            return dx, V.zeros(nshape, gdt, x), None if rms else V.zeros(nshape, gdt, x)

        return empty_call
    copy_x, copy_dy = not _fit(x, kept), not _fit(dy, kept)
    xs = x.contiguous() if copy_x else x
    dys = dy.contiguous() if copy_dy else dy
    dims = range(len(kept), x.dim())
    plan = engine.RowBackwardPlan(
        dys, xs, dx, kept, V.broadcast(weight, dims, x.shape), grads=param_grads,
        bias_grad=param_grads and not rms, rms=rms, beta_nonzero=beta != 0,
    )  # fmt: skip

    def call(dy, x, mean, rstd, weight, out, alpha, beta):
        dx = out if out is not None else V.empty(x.shape, dx_strides, x)
        dw = db = None
        if param_grads:
            dw = torch.empty(nshape, dtype=gdt, device=x.device)
            db = torch.empty_like(dw) if not rms else None
        rstd = rstd.to(torch.float32).contiguous()
        mean = mean.to(torch.float32).contiguous() if not rms else rstd
        plan(
            dy.contiguous() if copy_dy else dy, x.contiguous() if copy_x else x, dx, mean, rstd,
            V.contiguous(weight), dw, db, alpha, beta,
        )  # fmt: skip
        return dx, dw, db

    return call


def layer_norm_forward(
    x: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    eps: float = 1e-5,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Layer norm forward. x: (*L, *D), D = normalized_shape; weight, bias: D or None.

    Returns (y, mean, rstd): y in x's memory format (or `out`), mean and rstd float32 of
    shape L (one per normalized row), for layer_norm_backward.
    """
    return _forward(x, normalized_shape, weight, bias, eps, alpha, beta, out, rms=False)


def layer_norm_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    normalized_shape: int | Sequence[int],
    mean: torch.Tensor,
    rstd: torch.Tensor,
    weight: torch.Tensor | None = None,
    *,
    param_grads: bool = True,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Layer norm backward. Returns (dx, dweight, dbias).

    dx = alpha * dL/dx + beta * out. With param_grads, dweight = sum over L of dy * xhat and
    dbias = sum over L of dy (shape D, weight's dtype or float32), else both None.
    """
    return _backward(
        dy, x, normalized_shape, mean, rstd, weight, param_grads, alpha, beta, out, rms=False
    )


def rms_norm_forward(
    x: torch.Tensor,
    normalized_shape: int | Sequence[int],
    weight: torch.Tensor | None = None,
    *,
    eps: float | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMS norm forward. Returns (y, rstd), rstd float32 of shape L.

    eps=None uses torch.finfo(x.dtype).eps, as torch.nn.functional.rms_norm does.
    """
    if eps is None and isinstance(x, torch.Tensor) and x.dtype.is_floating_point:
        eps = torch.finfo(x.dtype).eps
    y, _, rstd = _forward(x, normalized_shape, weight, None, eps, alpha, beta, out, rms=True)
    return y, rstd


def rms_norm_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    normalized_shape: int | Sequence[int],
    rstd: torch.Tensor,
    weight: torch.Tensor | None = None,
    *,
    param_grads: bool = True,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RMS norm backward. Returns (dx, dweight); dweight = sum over L of dy * x * rstd."""
    dx, dw, _ = _backward(
        dy, x, normalized_shape, None, rstd, weight, param_grads, alpha, beta, out, rms=True
    )
    return dx, dw
