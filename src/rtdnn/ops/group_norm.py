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
"""

from __future__ import annotations

import torch

from ..algos import norm as engine
from ..core import bad_param, check_scaling, check_tensor
from . import _norm as V


def _groups(x: torch.Tensor, num_groups: object) -> int:
    if not isinstance(num_groups, int) or isinstance(num_groups, bool) or num_groups < 1:
        raise bad_param("num_groups", num_groups, "a positive int")
    if x.shape[1] % num_groups:
        raise bad_param("num_groups", num_groups, f"a divisor of the channel count {x.shape[1]}")
    return num_groups


def _forward(x, num_groups, weight, bias, eps, alpha, beta, out):
    n, c = x.shape[:2]
    weight = V.param("weight", weight, (c,), x)
    bias = V.param("bias", bias, (c,), x)
    eps = V.real("eps", eps, minimum=0.0)
    check_scaling(alpha, beta, out)
    y = V.output(out, x)
    V.ready(x)
    g = num_groups
    # View C as (G, C/G): kept dims (N, G), reduced dims (C/G, *S).
    xv, yv = x.unflatten(1, (g, c // g)), y.unflatten(1, (g, c // g))
    mean = torch.empty((n, g), dtype=torch.float32, device=x.device)
    rstd = torch.empty((n, g), dtype=torch.float32, device=x.device)
    engine.forward_train(
        xv, yv, (0, 1), mean, rstd, w=_param_view(weight, xv), b=_param_view(bias, xv), eps=eps,
        alpha=alpha, beta=beta,
    )  # fmt: skip
    return y, mean, rstd


def _param_view(t: torch.Tensor | None, xv: torch.Tensor):
    """A (C,) parameter seen through the (N, G, C/G, *S) view."""
    if t is None:
        return None
    return V.broadcast(t.view(xv.shape[1], xv.shape[2]), (1, 2), xv.shape)


def _backward(dy, x, num_groups, mean, rstd, weight, param_grads, alpha, beta, out):
    dy = V.like("dy", dy, x)
    n, c = x.shape[:2]
    g = num_groups
    mean = V.stat("mean", mean, (n, g), x)
    rstd = V.stat("rstd", rstd, (n, g), x)
    weight = V.param("weight", weight, (c,), x)
    if not isinstance(param_grads, bool):
        raise bad_param("param_grads", param_grads, "True or False")
    check_scaling(alpha, beta, out)
    dx = V.output(out, x)
    V.ready(x)
    dw = db = None
    if param_grads:
        dw = torch.empty((c,), dtype=V.grad_dtype(weight), device=x.device)
        db = torch.empty_like(dw)
    # Kept dims (N, G, C/G): sums per (n, c) over *S, then combined per group and per channel.
    shape = (n, g, c // g, *x.shape[2:])
    engine.backward_split(
        dy.unflatten(1, shape[1:3]), x.unflatten(1, shape[1:3]), dx.unflatten(1, shape[1:3]),
        (0, 1, 2), V.broadcast(mean, (0, 1), shape), V.broadcast(rstd, (0, 1), shape),
        (n, g, c // g), weight=weight, w=V.broadcast(_as_groups(weight, g), (1, 2), shape),
        dw=dw, db=db, alpha=alpha, beta=beta,
    )  # fmt: skip
    return dx, dw, db


def _as_groups(t: torch.Tensor | None, g: int):
    return None if t is None else t.view(g, -1)


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
    x = check_tensor("x", x, ndim=(2, 3, 4, 5))
    g = _groups(x, num_groups)
    return _forward(x, g, weight, bias, eps, alpha, beta, out)


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
    x = check_tensor("x", x, ndim=(2, 3, 4, 5))
    g = _groups(x, num_groups)
    return _backward(dy, x, g, mean, rstd, weight, param_grads, alpha, beta, out)


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
    x = check_tensor("x", x, ndim=(3, 4, 5))
    return _forward(x, x.shape[1], weight, bias, eps, alpha, beta, out)


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
    x = check_tensor("x", x, ndim=(3, 4, 5))
    return _backward(dy, x, x.shape[1], mean, rstd, weight, param_grads, alpha, beta, out)
