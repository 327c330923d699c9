"""Local response normalization (across channels) as custom ops with autograd."""

from __future__ import annotations

from torch import Tensor

from .. import ops
from ._custom_op import _like, check_differentiable, custom_op, public, records_grad


@custom_op("rtdnn::lrn_forward")
def lrn_forward(
    x: Tensor, size: int, alpha: float, beta: float, k: float, scale: float = 1.0
) -> Tensor:
    return ops.lrn_forward(x, size, lrn_alpha=alpha, lrn_beta=beta, lrn_k=k, alpha=scale)


@lrn_forward.register_fake
def _(x, size, alpha, beta, k, scale=1.0):
    return _like(x)


@custom_op("rtdnn::lrn_backward")
def lrn_backward(
    dy: Tensor, x: Tensor, size: int, alpha: float, beta: float, k: float, scale: float = 1.0
) -> Tensor:
    return ops.lrn_backward(dy, x, None, size, lrn_alpha=alpha, lrn_beta=beta, lrn_k=k, alpha=scale)


@lrn_backward.register_fake
def _(dy, x, size, alpha, beta, k, scale=1.0):
    return _like(dy)


def _lrn_setup(ctx, inputs, output):
    x, *args = inputs  # the backward op takes the same arguments (scale included, if given)
    ctx.save_for_backward(x)
    ctx.args = args


def _lrn_backward(ctx, dy):
    (x,) = ctx.saved_tensors
    return lrn_backward(dy, x, *ctx.args), None, None, None, None, None


lrn_forward.register_autograd(_lrn_backward, setup_context=_lrn_setup)


@public(ops.lrn_forward)
def lrn_forward_api(
    x: Tensor,
    size: int,
    *,
    lrn_alpha: float = 1e-4,
    lrn_beta: float = 0.75,
    lrn_k: float = 1.0,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Tensor | None = None,
) -> Tensor:
    if not records_grad(x):
        return ops.lrn_forward(
            x, size, lrn_alpha=lrn_alpha, lrn_beta=lrn_beta, lrn_k=lrn_k, alpha=alpha,
            beta=beta, out=out,
        )  # fmt: skip
    check_differentiable("lrn_forward", alpha, beta, out)
    return lrn_forward(x, size, lrn_alpha, lrn_beta, lrn_k, float(alpha))
