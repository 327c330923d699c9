"""Softmax and log-softmax as custom ops with autograd."""

from __future__ import annotations

from torch import Tensor

from .. import ops
from ._custom_op import _like, check_differentiable, custom_op, public, records_grad

# alpha scales the output in float32 inside the kernel, as the plain call does, and the
# gradient the same way. The backward reads the unscaled y: with alpha != 1 it recomputes it
# from x (one more forward pass) rather than divide by alpha (inexact).


@custom_op("rtdnn::softmax_forward")
def softmax_forward(x: Tensor, algo: str, mode: str, alpha: float = 1.0) -> Tensor:
    return ops.softmax_forward(x, algo=algo, mode=mode, alpha=alpha)


@softmax_forward.register_fake
def _(x, algo, mode, alpha=1.0):
    return _like(x)


@custom_op("rtdnn::softmax_backward")
def softmax_backward(y: Tensor, dy: Tensor, algo: str, mode: str, alpha: float = 1.0) -> Tensor:
    return ops.softmax_backward(y, dy, algo=algo, mode=mode, alpha=alpha)


@softmax_backward.register_fake
def _(y, dy, algo, mode, alpha=1.0):
    return _like(dy)


def _softmax_setup(ctx, inputs, output):
    x, ctx.algo, ctx.mode, *alpha = inputs  # the eager road may leave alpha out
    ctx.alpha = alpha[0] if alpha else 1.0
    ctx.save_for_backward(output if ctx.alpha == 1 else x)


def _softmax_backward(ctx, dy):
    (saved,) = ctx.saved_tensors
    y = saved if ctx.alpha == 1 else softmax_forward(saved, ctx.algo, ctx.mode)
    return softmax_backward(y, dy, ctx.algo, ctx.mode, ctx.alpha), None, None, None


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
    return softmax_forward(x, algo, mode, float(alpha))
