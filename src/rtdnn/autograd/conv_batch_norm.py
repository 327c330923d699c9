"""A convolution and the training batch norm after it (with the batch norm's fused residual add
and activation) as one custom op with one autograd node: y = act(bn(conv(x)) + z).

It computes what the two ops compute one after the other, with the same kernels; what it
saves is the host's work of a second op call and a second autograd node per layer, forward
and backward, which an eager training step of a convolutional network spends on every pair
(rtdnn.fuse pairs them; the convolution module runs it, see nn.conv). Like batch_norm_train,
the op returns the new running statistics, and its eager road updates them in place instead.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import ops
from ..core import ConvDesc, conv_output_shape, empty_like_layout
from ._custom_op import _nothing, custom_op
from .batch_norm import batch_norm_bwd, check_running_pair, copy_new_running
from .conv import conv_backward_bias, conv_backward_data, conv_backward_filter

_MODE = "cross_correlation"  # what the torch.nn convolution modules compute


def _conv_args(stride, padding, dilation, groups) -> dict:
    return dict(stride=stride, padding=padding, dilation=dilation, groups=groups, mode=_MODE)


def _in_place(
    x, w, conv_bias, stride, padding, dilation, groups, weight, bias, z, running_mean,
    running_var, momentum, eps, activation,
):  # fmt: skip
    """The eager road: (y, conv output, saved_mean, saved_invstd), the running statistics
    updated in place by the kernel that finishes the batch statistics."""
    c = ops.conv_forward(x, w, conv_bias, **_conv_args(stride, padding, dilation, groups))
    y, mean, invstd = ops.batch_norm_forward_training(
        c, weight, bias, running_mean=running_mean, running_var=running_var,
        momentum=momentum, eps=eps, z=z, activation=activation,
    )  # fmt: skip
    return y, c, mean, invstd


@custom_op("rtdnn::conv_batch_norm_train")
def conv_batch_norm_train(
    x: Tensor,
    w: Tensor,
    conv_bias: Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    weight: Tensor | None,
    bias: Tensor | None,
    z: Tensor | None,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    momentum: float,
    eps: float,
    activation: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(y, conv output, saved_mean, saved_invstd, new_running_mean, new_running_var), the
    batch norm spatial (one statistic per output channel): the eager road's computation on
    copies of the running statistics, as a functional op returns what it updates."""
    new_rm = new_rv = None
    if running_mean is not None and running_var is not None:
        new_rm, new_rv = running_mean.clone(), running_var.clone()
    outputs = _in_place(
        x, w, conv_bias, stride, padding, dilation, groups, weight, bias, z, new_rm, new_rv,
        momentum, eps, activation,
    )  # fmt: skip
    if new_rm is None:
        new_rm, new_rv = _nothing(x), _nothing(x)
    return *outputs, new_rm, new_rv


conv_batch_norm_train.register_eager(_in_place)


@conv_batch_norm_train.register_fake
def _(x, w, conv_bias, stride, padding, dilation, groups, weight, bias, z, running_mean,
      running_var, momentum, eps, activation):  # fmt: skip
    desc = ConvDesc.create(x.dim() - 2, stride, padding, dilation, groups, _MODE, "fp32")
    c = empty_like_layout(conv_output_shape(x.shape, w.shape, desc), x)
    stats = [x.new_empty([w.shape[0]], dtype=torch.float32) for _ in range(2)]
    if running_mean is not None and running_var is not None:
        running = [torch.empty_like(running_mean), torch.empty_like(running_var)]
    else:
        running = [_nothing(x), _nothing(x)]
    return empty_like_layout(c.shape, c), c, *stats, *running


def _setup(ctx, inputs, output):
    x, w, conv_bias, stride, padding, dilation, groups, weight, bias, z, *_, activation = inputs
    c, mean, invstd = output[1], output[2], output[3]
    ctx.save_for_backward(x, w, c, weight, bias, z, mean, invstd)
    ctx.conv_args = (stride, padding, dilation, groups, _MODE)
    ctx.activation = activation
    ctx.has_conv_bias = conv_bias is not None


def _backward(ctx, dy, *_):
    x, w, c, weight, bias, z, mean, invstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    # The batch norm's gradients first; the convolution's take dc, its output's gradient.
    dc, dweight, dbias, dz = batch_norm_bwd(
        dy, c, mean, invstd, weight, bias, z, ctx.activation, False, True
    )
    args = ctx.conv_args
    dx = conv_backward_data(dc, w, list(x.shape), *args) if need[0] else None
    dw = conv_backward_filter(x, dc, list(w.shape), *args) if need[1] else None
    dcb = conv_backward_bias(dc) if ctx.has_conv_bias and need[2] else None
    return (
        dx, dw, dcb, None, None, None, None, dweight if need[7] else None,
        dbias if need[8] else None, dz if need[9] else None, None, None, None, None, None,
    )  # fmt: skip


conv_batch_norm_train.register_autograd(_backward, setup_context=_setup)


def conv_batch_norm(
    x: Tensor,
    w: Tensor,
    conv_bias: Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
    weight: Tensor | None,
    bias: Tensor | None,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    momentum: float,
    eps: float,
    *,
    z: Tensor | None = None,
    activation: str = "identity",
) -> Tensor:
    """act(batch_norm(conv(x)) + z) in training (batch statistics; the running statistics, if
    given, updated in place with `momentum` as the exponential average factor), differentiable:
    torch.nn.functional.conv{1,2,3}d (cross-correlation, zero padding as numbers) followed by
    rtdnn.autograd.batch_norm(training=True), as one op and one autograd node. x: (N, C, *S);
    w: (K, C / groups, *R); weight, bias, running_mean, running_var: (K,) or None; z: the
    convolution's output shape, or None."""
    check_running_pair(running_mean, running_var)
    outputs = conv_batch_norm_train(
        x, w, conv_bias, stride, padding, dilation, groups, weight, bias, z, running_mean,
        running_var, momentum, eps, activation,
    )  # fmt: skip
    copy_new_running(outputs, 6, running_mean, running_var)
    return outputs[0]
