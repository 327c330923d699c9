"""Group norm and instance norm as custom ops with autograd, and their differentiable functions
(instance norm is group norm with one group per channel)."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import ops
from ..core import bad_param, check_tensor, empty_like_layout
from ..ops._norm import momentum as check_momentum
from ._custom_op import check_differentiable, custom_op, public, records_grad
from ._norm import _or_nothing, _param_grads_fake, _register_norm_autograd
from .batch_norm import batch_norm_infer


@custom_op("rtdnn::group_norm")
def group_norm_fwd(
    x: Tensor,
    num_groups: int,
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
    alpha: float = 1.0,
) -> tuple[Tensor, Tensor, Tensor]:
    return ops.group_norm_forward(x, num_groups, weight, bias, eps=eps, alpha=alpha)


@group_norm_fwd.register_fake
def _(x, num_groups, weight, bias, eps, alpha=1.0):
    stats = [x.new_empty((x.shape[0], num_groups), dtype=torch.float32) for _ in range(2)]
    return empty_like_layout(x.shape, x), *stats


@custom_op("rtdnn::group_norm_bwd")
def group_norm_bwd(
    dy: Tensor,
    x: Tensor,
    num_groups: int,
    mean: Tensor,
    rstd: Tensor,
    weight: Tensor | None,
    param_grads: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    dx, dw, db = ops.group_norm_backward(
        dy, x, num_groups, mean, rstd, weight, param_grads=param_grads
    )
    return dx, _or_nothing(dw, x), _or_nothing(db, x)


@group_norm_bwd.register_fake
def _(dy, x, num_groups, mean, rstd, weight, param_grads):
    dw = _param_grads_fake(x, (x.shape[1],), weight, param_grads)
    return empty_like_layout(x.shape, x), dw, torch.empty_like(dw)


_register_norm_autograd(group_norm_fwd, group_norm_bwd)


def group_norm(
    x: Tensor,
    num_groups: int,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """torch.nn.functional.group_norm computed by rtdnn, differentiable."""
    return group_norm_fwd(x, num_groups, weight, bias, eps)[0]


def instance_norm(
    x: Tensor,
    running_mean: Tensor | None = None,
    running_var: Tensor | None = None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    use_input_stats: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """torch.nn.functional.instance_norm computed by rtdnn, differentiable.

    With the input's statistics, the running statistics (if given) are updated in place as
    torch does: by the batch average of each instance's mean and unbiased variance (the
    variance recovered from the float32 1/std). Without, the running statistics normalize
    every instance (an inference batch norm).
    """
    momentum = check_momentum(momentum)
    if not use_input_stats:
        if running_mean is None or running_var is None:
            raise bad_param("running_mean", None, "running statistics when use_input_stats=False")
        return batch_norm_infer(x, weight, bias, None, running_mean, running_var, eps,
                                "identity", False)  # fmt: skip
    y, mean, rstd = group_norm_fwd(x, x.shape[1], weight, bias, eps)
    if running_mean is not None and running_var is not None:
        n = x[0, 0].numel()
        with torch.no_grad():
            var = (rstd.detach().double() ** -2 - eps).clamp_min(0) * (n / max(n - 1, 1))
            running_mean.mul_(1 - momentum).add_(momentum * mean.detach().mean(0))
            running_var.mul_(1 - momentum).add_((momentum * var.mean(0)).to(running_var.dtype))
    return y


@public(ops.group_norm_forward, stats=True)
def group_norm_forward_api(
    x: Tensor,
    num_groups: int,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    *,
    eps: float = 1e-5,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    if not records_grad(x, weight, bias):
        return ops.group_norm_forward(
            x, num_groups, weight, bias, eps=eps, alpha=alpha, beta=beta, out=out
        )
    check_differentiable("group_norm_forward", alpha, beta, out)
    y, mean, rstd = group_norm_fwd(x, num_groups, weight, bias, eps, float(alpha))
    return y, mean.detach(), rstd.detach()


@public(ops.instance_norm_forward, stats=True)
def instance_norm_forward_api(
    x: Tensor,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    *,
    eps: float = 1e-5,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    if not records_grad(x, weight, bias):
        return ops.instance_norm_forward(x, weight, bias, eps=eps, alpha=alpha, beta=beta, out=out)
    check_differentiable("instance_norm_forward", alpha, beta, out)
    # Group norm with one group per channel, which also takes 0 spatial dims: instance norm
    # does not.
    x = check_tensor("x", x, ndim=(3, 4, 5))
    y, mean, rstd = group_norm_fwd(x, x.shape[1], weight, bias, eps, float(alpha))
    return y, mean.detach(), rstd.detach()
