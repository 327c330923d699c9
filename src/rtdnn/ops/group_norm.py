"""Group norm and instance norm, as torch.nn.functional defines them.

x is (N, C, *S), any strides. Group norm splits C into G groups of C/G channels and takes one
statistic per (n, group) over the group's channels and every spatial position; instance norm is
group norm with G = C (one statistic per (n, c) over the spatial positions):

    y = alpha * ((x - mean) * rstd * weight[c] + bias[c]) + beta * out

weight, bias: (C,) or None. Statistics are float32, (N, G) or (N, C). Running statistics of
instance norm modules are kept by rtdnn.nn, from the statistics these functions return.

The forward reads x once when a group fits in one tile, else it runs the deterministic split
path. The backward takes per-(n, c) sums of dy and dy * xhat, combines them per group and per
channel in a fixed order, then writes dx (two reads of x and dy).

`out` must share no memory with any input (BadParamError), even out=x: the statistics and the
normalize pass read x separately. eps must be > 0.
"""

from __future__ import annotations

import torch

from ..algos import norm as engine
from ..core import bad_param, check_out_disjoint, check_scaling, check_tensor
from ..core.prepared import nonzero, signature
from . import _norm as V
from ._common import check_batch


def _groups(x: torch.Tensor, num_groups: object) -> int:
    if not isinstance(num_groups, int) or isinstance(num_groups, bool) or num_groups < 1:
        raise bad_param("num_groups", num_groups, "a positive int")
    if x.shape[1] % num_groups:
        raise bad_param("num_groups", num_groups, f"a divisor of the channel count {x.shape[1]}")
    return num_groups


def _forward(x, num_groups, weight, bias, eps, alpha, beta, out, instance):
    tensors = (x, weight, bias, out)
    k = signature("in" if instance else "gn", tensors, num_groups, nonzero(beta))
    call = engine.cache.get(k, lambda: _forward_call(*tensors, num_groups, beta, instance))
    eps = V.eps(eps)
    check_scaling(alpha, beta, out)
    check_out_disjoint(out, x=x, weight=weight, bias=bias)
    return call(*tensors, eps, float(alpha), float(beta))


def _forward_call(x, weight, bias, out, num_groups, beta, instance):
    x = check_tensor("x", x, ndim=(3, 4, 5) if instance else (2, 3, 4, 5), empty=True)
    check_batch("x", x)
    g = x.shape[1] if instance else _groups(x, num_groups)
    n, c = x.shape[:2]
    weight = V.param("weight", weight, (c,), x)
    bias = V.param("bias", bias, (c,), x)
    check_scaling(0.0, beta, out)
    y = V.output(out, x)
    V.ready(x)
    y_strides = y.stride()
    if n == 0:  # an empty batch

        def empty_call(x, weight, bias, out, *_):
            y = out if out is not None else V.empty(x.shape, y_strides, x)
            stats = torch.empty((0, g), dtype=torch.float32, device=x.device)
            return y, stats, torch.empty_like(stats)

        return empty_call
    # View C as (G, C/G): kept dims (N, G), reduced dims (C/G, *S).
    xv, yv = x.unflatten(1, (g, c // g)), y.unflatten(1, (g, c // g))
    plan = engine.ForwardPlan(
        xv, yv, (0, 1), _param_view(weight, xv), _param_view(bias, xv), None, rms=False,
        activation="identity", beta_nonzero=beta != 0, running=False,
    )  # fmt: skip

    def call(x, weight, bias, out, eps, alpha, beta):
        y = out if out is not None else V.empty(x.shape, y_strides, x)
        mean = torch.empty((n, g), dtype=torch.float32, device=x.device)
        rstd = torch.empty((n, g), dtype=torch.float32, device=x.device)
        plan(x, y, mean, rstd, V.contiguous(weight), V.contiguous(bias), None, None, None, eps,
             0.0, alpha, beta)  # fmt: skip
        return y, mean, rstd

    return call


def _param_view(t: torch.Tensor | None, xv: torch.Tensor):
    """A (C,) parameter seen through the (N, G, C/G, *S) view."""
    if t is None:
        return None
    return V.broadcast(t.view(xv.shape[1], xv.shape[2]), (1, 2), xv.shape)


def _backward(dy, x, num_groups, mean, rstd, weight, param_grads, alpha, beta, out, instance):
    tensors = (dy, x, mean, rstd, weight, out)
    k = signature("in_bwd" if instance else "gn_bwd", tensors, num_groups, param_grads,
              nonzero(beta))  # fmt: skip
    call = engine.cache.get(
        k, lambda: _backward_call(*tensors, num_groups, param_grads, beta, instance)
    )
    check_scaling(alpha, beta, out)
    check_out_disjoint(out, dy=dy, x=x, mean=mean, rstd=rstd, weight=weight)
    return call(*tensors, float(alpha), float(beta))


def _backward_call(dy, x, mean, rstd, weight, out, num_groups, param_grads, beta, instance):
    x = check_tensor("x", x, ndim=(3, 4, 5) if instance else (2, 3, 4, 5), empty=True)
    check_batch("x", x)
    g = x.shape[1] if instance else _groups(x, num_groups)
    dy = V.like("dy", dy, x)
    n, c = x.shape[:2]
    V.stat("mean", mean, (n, g), x)
    V.stat("rstd", rstd, (n, g), x)
    weight = V.param("weight", weight, (c,), x)
    if not isinstance(param_grads, bool):
        raise bad_param("param_grads", param_grads, "True or False")
    check_scaling(0.0, beta, out)
    dx = V.output(out, x)
    V.ready(x)
    gdt = V.grad_dtype(weight)
    dx_strides = dx.stride()
    if n == 0:  # an empty batch: the parameter gradients are sums over nothing

        def empty_call(dy, x, mean, rstd, weight, out, *_):
            dx = out if out is not None else V.empty(x.shape, dx_strides, x)
            if not param_grads:
                return dx, None, None
            return dx, V.zeros((c,), gdt, x), V.zeros((c,), gdt, x)

        return empty_call
    # Kept dims (N, G, C/G): sums per (n, c) over *S, then combined per group and per channel.
    shape = (n, g, c // g, *x.shape[2:])
    stats = V.broadcast(torch.empty((n, g), device="meta"), (0, 1), shape)
    xv = x.unflatten(1, shape[1:3])
    plan = engine.SplitBackwardPlan(
        dy.unflatten(1, shape[1:3]), xv, dx.unflatten(1, shape[1:3]), (0, 1, 2), stats,
        (n, g, c // g), _param_view(weight, xv), None, None, None, grads=param_grads,
        training=True, rms=False, activation="identity", beta_nonzero=beta != 0,
    )  # fmt: skip

    def call(dy, x, mean, rstd, weight, out, alpha, beta):
        dx = out if out is not None else V.empty(x.shape, dx_strides, x)
        dw = db = None
        if param_grads:
            dw = torch.empty((c,), dtype=gdt, device=x.device)
            db = torch.empty_like(dw)
        mean = mean.to(torch.float32).contiguous()
        rstd = rstd.to(torch.float32).contiguous()
        plan(dy, x, dx, mean, rstd, V.contiguous(weight), None, None, None, dw, db, alpha, beta)
        return dx, dw, db

    return call


def group_norm_forward(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    eps: float = 1e-5,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group norm forward. x: (N, C, *S) with 0 to 3 spatial dims; C divisible by num_groups.

    Returns (y, mean, rstd): y in x's memory format (or `out`); mean, rstd float32 (N, G).
    """
    return _forward(x, num_groups, weight, bias, eps, alpha, beta, out, instance=False)


def group_norm_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    num_groups: int,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    weight: torch.Tensor | None = None,
    *,
    param_grads: bool = True,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Group norm backward. Returns (dx, dweight, dbias); dweight, dbias (C,) (weight's dtype,
    float32 without a weight) when param_grads, else None."""
    return _backward(
        dy, x, num_groups, mean, rstd, weight, param_grads, alpha, beta, out, instance=False
    )


def instance_norm_forward(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    eps: float = 1e-5,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Instance norm forward with the input's statistics. x: (N, C, *S), 1 to 3 spatial dims.

    Returns (y, mean, rstd); mean, rstd float32 (N, C).
    """
    return _forward(x, None, weight, bias, eps, alpha, beta, out, instance=True)


def instance_norm_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    weight: torch.Tensor | None = None,
    *,
    param_grads: bool = True,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Instance norm backward. Returns (dx, dweight, dbias) as group_norm_backward."""
    return _backward(dy, x, None, mean, rstd, weight, param_grads, alpha, beta, out, instance=True)
