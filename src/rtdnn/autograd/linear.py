"""Linear (fully connected) layer: forward and its three backward GEMMs as custom ops."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import ops
from ._custom_op import custom_op


@custom_op("rtdnn::linear")
def linear(x: Tensor, w: Tensor, bias: Tensor | None, activation: str | None) -> Tensor:
    return ops.linear(x, w, bias, activation=activation)


@linear.register_fake
def _(x, w, bias, activation):
    return x.new_empty((*x.shape[:-1], w.shape[0]))


@custom_op("rtdnn::linear_backward_data")
def linear_backward_data(dy: Tensor, w: Tensor) -> Tensor:
    return ops.linear_backward_data(dy, w)


@linear_backward_data.register_fake
def _(dy, w):
    return dy.new_empty((*dy.shape[:-1], w.shape[1]))


@custom_op("rtdnn::linear_backward_weight")
def linear_backward_weight(x: Tensor, dy: Tensor) -> Tensor:
    return ops.linear_backward_weight(x, dy)


@linear_backward_weight.register_fake
def _(x, dy):
    return x.new_empty((dy.shape[-1], x.shape[-1]))


@custom_op("rtdnn::linear_backward_bias")
def linear_backward_bias(dy: Tensor) -> Tensor:
    return ops.linear_backward_bias(dy)


@linear_backward_bias.register_fake
def _(dy):
    return dy.new_empty((dy.shape[-1],))


def _linear_setup_context(ctx, inputs, output):
    x, w, bias, activation = inputs
    # ReLU's derivative is read off its output: y > 0 exactly where the pre-activation is.
    ctx.save_for_backward(x, w, output if activation == "relu" else None)
    ctx.has_bias = bias is not None


def _linear_backward(ctx, dy):
    x, w, y = ctx.saved_tensors
    if y is not None:
        dy = torch.where(y > 0, dy, torch.zeros((), dtype=dy.dtype, device=dy.device))
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    dx = linear_backward_data(dy, w) if need_x else None
    dw = linear_backward_weight(x, dy) if need_w else None
    db = linear_backward_bias(dy) if ctx.has_bias and need_b else None
    return dx, dw, db, None


linear.register_autograd(_linear_backward, setup_context=_linear_setup_context)
