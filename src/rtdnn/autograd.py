"""PyTorch integration: rtdnn primitives as torch.library custom ops with autograd and fake
(meta) kernels, so they work under autograd and torch.compile traces them without graph breaks.

The ops are functional (no alpha, beta or out): those belong to the plain API in rtdnn.ops.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import ops
from .core import ConvDesc, conv_output_shape, empty_like_layout


def _desc(x: Tensor, stride, padding, dilation, groups, mode) -> ConvDesc:
    return ConvDesc.create(x.dim() - 2, stride, padding, dilation, groups, mode, "fp32")


# -- convolution ----------------------------------------------------------------------------


@torch.library.custom_op("rtdnn::conv_forward", mutates_args=())
def conv_forward(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    mode: str,
) -> Tensor:
    return ops.conv_forward(
        x, w, bias, stride=stride, padding=padding, dilation=dilation, groups=groups, mode=mode
    )


@conv_forward.register_fake
def _(x, w, bias, stride, padding, dilation, groups, mode):
    shape = conv_output_shape(x.shape, w.shape, _desc(x, stride, padding, dilation, groups, mode))
    return empty_like_layout(shape, x)


@torch.library.custom_op("rtdnn::conv_backward_data", mutates_args=())
def conv_backward_data(
    dy: Tensor,
    w: Tensor,
    x_shape: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    mode: str,
) -> Tensor:
    return ops.conv_backward_data(
        dy, w, x_shape, stride=stride, padding=padding, dilation=dilation, groups=groups,
        mode=mode,
    )  # fmt: skip


@conv_backward_data.register_fake
def _(dy, w, x_shape, stride, padding, dilation, groups, mode):
    return empty_like_layout(x_shape, dy)


@torch.library.custom_op("rtdnn::conv_backward_filter", mutates_args=())
def conv_backward_filter(
    x: Tensor,
    dy: Tensor,
    w_shape: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    mode: str,
) -> Tensor:
    return ops.conv_backward_filter(
        x, dy, w_shape, stride=stride, padding=padding, dilation=dilation, groups=groups,
        mode=mode,
    )  # fmt: skip


@conv_backward_filter.register_fake
def _(x, dy, w_shape, stride, padding, dilation, groups, mode):
    return empty_like_layout(w_shape, x)


@torch.library.custom_op("rtdnn::conv_backward_bias", mutates_args=())
def conv_backward_bias(dy: Tensor) -> Tensor:
    return ops.conv_backward_bias(dy)


@conv_backward_bias.register_fake
def _(dy):
    return dy.new_empty((dy.shape[1],))


def _conv_setup_context(ctx, inputs, output):
    x, w, bias, stride, padding, dilation, groups, mode = inputs
    ctx.save_for_backward(x, w)
    ctx.conv_args = (stride, padding, dilation, groups, mode)
    ctx.has_bias = bias is not None


def _conv_backward(ctx, dy):
    x, w = ctx.saved_tensors
    args = ctx.conv_args
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    dx = conv_backward_data(dy, w, list(x.shape), *args) if need_x else None
    dw = conv_backward_filter(x, dy, list(w.shape), *args) if need_w else None
    db = conv_backward_bias(dy) if ctx.has_bias and need_b else None
    return dx, dw, db, None, None, None, None, None


conv_forward.register_autograd(_conv_backward, setup_context=_conv_setup_context)


# -- linear -----------------------------------------------------------------------------------


@torch.library.custom_op("rtdnn::linear", mutates_args=())
def linear(x: Tensor, w: Tensor, bias: Tensor | None, activation: str | None) -> Tensor:
    return ops.linear(x, w, bias, activation=activation)


@linear.register_fake
def _(x, w, bias, activation):
    return x.new_empty((*x.shape[:-1], w.shape[0]))


@torch.library.custom_op("rtdnn::linear_backward_data", mutates_args=())
def linear_backward_data(dy: Tensor, w: Tensor) -> Tensor:
    return ops.linear_backward_data(dy, w)


@linear_backward_data.register_fake
def _(dy, w):
    return dy.new_empty((*dy.shape[:-1], w.shape[1]))


@torch.library.custom_op("rtdnn::linear_backward_weight", mutates_args=())
def linear_backward_weight(x: Tensor, dy: Tensor) -> Tensor:
    return ops.linear_backward_weight(x, dy)


@linear_backward_weight.register_fake
def _(x, dy):
    return x.new_empty((dy.shape[-1], x.shape[-1]))


@torch.library.custom_op("rtdnn::linear_backward_bias", mutates_args=())
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


# -- cross-entropy ----------------------------------------------------------------------------


@torch.library.custom_op("rtdnn::cross_entropy", mutates_args=())
def cross_entropy(
    logits: Tensor,
    target: Tensor,
    weight: Tensor | None,
    ignore_index: int,
    label_smoothing: float,
    reduction: str,
) -> tuple[Tensor, Tensor, Tensor]:
    return ops.cross_entropy_forward(
        logits, target, weight, ignore_index=ignore_index, label_smoothing=label_smoothing,
        reduction=reduction,
    )  # fmt: skip


@cross_entropy.register_fake
def _(logits, target, weight, ignore_index, label_smoothing, reduction):
    rows = target.numel()
    shape = target.shape if reduction == "none" else ()
    stats = logits.new_empty((rows,), dtype=torch.float32)
    return logits.new_empty(shape), stats, torch.empty_like(stats)


@torch.library.custom_op("rtdnn::cross_entropy_backward", mutates_args=())
def cross_entropy_backward(
    grad: Tensor,
    logits: Tensor,
    target: Tensor,
    lse: Tensor,
    w_t: Tensor,
    weight: Tensor | None,
    ignore_index: int,
    label_smoothing: float,
    reduction: str,
) -> Tensor:
    return ops.cross_entropy_backward(
        grad, logits, target, lse, w_t, weight, ignore_index=ignore_index,
        label_smoothing=label_smoothing, reduction=reduction,
    )  # fmt: skip


@cross_entropy_backward.register_fake
def _(grad, logits, target, lse, w_t, weight, ignore_index, label_smoothing, reduction):
    return torch.empty_like(logits)


def _ce_setup_context(ctx, inputs, output):
    logits, target, weight, ignore_index, label_smoothing, reduction = inputs
    _, lse, w_t = output
    ctx.save_for_backward(logits, target, lse, w_t, weight)
    ctx.args = (ignore_index, label_smoothing, reduction)
    ctx.mark_non_differentiable(lse, w_t)


def _ce_backward(ctx, grad, _lse, _w_t):
    logits, target, lse, w_t, weight = ctx.saved_tensors
    dx = cross_entropy_backward(grad, logits, target, lse, w_t, weight, *ctx.args)
    return dx, None, None, None, None, None


cross_entropy.register_autograd(_ce_backward, setup_context=_ce_setup_context)
