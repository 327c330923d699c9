"""Softmax and log-softmax as custom ops with autograd."""

from __future__ import annotations

from torch import Tensor

from .. import ops
from ._custom_op import _like, check_differentiable, custom_op, public, records_grad, scaled


@custom_op("rtdnn::softmax_forward")
def softmax_forward(x: Tensor, algo: str, mode: str) -> Tensor:
    return ops.softmax_forward(x, algo=algo, mode=mode)


@softmax_forward.register_fake
def _(x, algo, mode):
    return _like(x)


@custom_op("rtdnn::softmax_backward")
def softmax_backward(y: Tensor, dy: Tensor, algo: str, mode: str) -> Tensor:
    return ops.softmax_backward(y, dy, algo=algo, mode=mode)


@softmax_backward.register_fake
def _(y, dy, algo, mode):
    return _like(dy)


def _softmax_setup(ctx, inputs, output):
    ctx.save_for_backward(output)
    ctx.algo, ctx.mode = inputs[1], inputs[2]


def _softmax_backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return softmax_backward(y, dy, ctx.algo, ctx.mode), None, None


softmax_forward.register_autograd(_softmax_backward, setup_context=_softmax_setup)


@public(ops.softmax_forward)
def softmax_forward_api(
    x: Tensor,
    *,
    algo: str = "accurate",
    mode: str = "channel",
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Tensor | None = None,
) -> Tensor:
    if not records_grad(x):
        return ops.softmax_forward(x, algo=algo, mode=mode, alpha=alpha, beta=beta, out=out)
    check_differentiable("softmax_forward", alpha, beta, out)
    return scaled(softmax_forward(x, algo, mode), alpha)
