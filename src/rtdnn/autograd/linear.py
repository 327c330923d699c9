"""Linear (fully connected) layer: forward and its three backward GEMMs as custom ops."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import ops
from ..ops.linear import linear_backward as linear_backward_eager
from ._custom_op import check_differentiable, custom_op, public, records_grad, runs_eager

# The GEMMs take the plain API's math mode ("fp32", "tf32" or None: torch's TF32 switch). alpha
# scales the product (before the bias and the activation) in float32 inside the kernel, as the
# plain call does, and scales the data and weight gradients the same way.


@custom_op("rtdnn::linear")
def linear(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None,
    activation: str | None,
    math: str | None = None,
    alpha: float = 1.0,
) -> Tensor:
    return ops.linear(x, w, bias, activation=activation, alpha=alpha, math=math)


@linear.register_fake
def _(x, w, bias, activation, math=None, alpha=1.0):
    return x.new_empty((*x.shape[:-1], w.shape[0]))


@custom_op("rtdnn::linear_backward_data")
def linear_backward_data(
    dy: Tensor, w: Tensor, math: str | None = None, alpha: float = 1.0
) -> Tensor:
    return ops.linear_backward_data(dy, w, alpha=alpha, math=math)


@linear_backward_data.register_fake
def _(dy, w, math=None, alpha=1.0):
    return dy.new_empty((*dy.shape[:-1], w.shape[1]))


@custom_op("rtdnn::linear_backward_weight")
def linear_backward_weight(
    x: Tensor, dy: Tensor, math: str | None = None, alpha: float = 1.0
) -> Tensor:
    return ops.linear_backward_weight(x, dy, alpha=alpha, math=math)


@linear_backward_weight.register_fake
def _(x, dy, math=None, alpha=1.0):
    return x.new_empty((dy.shape[-1], x.shape[-1]))


@custom_op("rtdnn::linear_backward_bias")
def linear_backward_bias(dy: Tensor) -> Tensor:
    return ops.linear_backward_bias(dy)


@linear_backward_bias.register_fake
def _(dy):
    return dy.new_empty((dy.shape[-1],))


def _linear_setup_context(ctx, inputs, output):
    x, w, bias, activation, *tuning = inputs  # the eager road may leave math and alpha out
    ctx.math, ctx.alpha = (*tuning, *(None, 1.0)[len(tuning) :])
    # ReLU's derivative is read off its output: y > 0 exactly where the pre-activation is.
    ctx.save_for_backward(x, w, output if activation == "relu" else None)
    ctx.has_bias = bias is not None


def _linear_backward(ctx, dy):
    x, w, y = ctx.saved_tensors
    if y is not None:
        dy = torch.where(y > 0, dy, torch.zeros((), dtype=dy.dtype, device=dy.device))
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    # y = act(alpha * x @ w^T + bias): dx and dw take alpha, db does not.
    need_b = ctx.has_bias and need_b
    if runs_eager(dy, x, w):  # no graph to build: the three under one signature
        dx, dw, db = linear_backward_eager(
            dy, x, w, alpha=ctx.alpha, math=ctx.math, need_x=need_x, need_w=need_w,
            need_bias=need_b,
        )  # fmt: skip
    else:
        dx = linear_backward_data(dy, w, ctx.math, ctx.alpha) if need_x else None
        dw = linear_backward_weight(x, dy, ctx.math, ctx.alpha) if need_w else None
        db = linear_backward_bias(dy) if need_b else None
    return dx, dw, db, None, None, None


linear.register_autograd(_linear_backward, setup_context=_linear_setup_context)


@public(ops.linear)
def linear_api(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    *,
    activation: str | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Tensor | None = None,
    math: str | None = None,
) -> Tensor:
    if not records_grad(x, w, bias):
        return ops.linear(
            x, w, bias, activation=activation, alpha=alpha, beta=beta, out=out, math=math
        )
    check_differentiable("linear", alpha, beta, out)
    return linear(x, w, bias, activation, math, float(alpha))
