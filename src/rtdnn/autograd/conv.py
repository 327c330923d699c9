"""Convolution: forward, backward data, filter and bias as custom ops with autograd."""

from __future__ import annotations

from torch import Tensor

from .. import ops
from ..core import ConvDesc, conv_output_shape, empty_like_layout
from ._custom_op import custom_op


def _desc(x: Tensor, stride, padding, dilation, groups, mode) -> ConvDesc:
    return ConvDesc.create(x.dim() - 2, stride, padding, dilation, groups, mode, "fp32")


@custom_op("rtdnn::conv_forward")
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


@custom_op("rtdnn::conv_backward_data")
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


@custom_op("rtdnn::conv_backward_filter")
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


@custom_op("rtdnn::conv_backward_bias")
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
