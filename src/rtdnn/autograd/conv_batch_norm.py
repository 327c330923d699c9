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
from ..algos import ConvTensors
from ..algos import norm as engine
from ..core import ConvDesc, Direction, conv_output_shape, default_math_mode, empty_like_layout
from ..core.prepared import signature
from ..ops import batch_norm as bn_ops
from ..ops import conv as conv_ops
from ._custom_op import _nothing, custom_op, runs_eager
from .batch_norm import batch_norm_bwd, check_running_pair, copy_new_running
from .conv import conv_backward_bias, conv_backward_data, conv_backward_filter

_MODE = "cross_correlation"  # what the torch.nn convolution modules compute

# A layer makes the same pair of calls on every step. The eager road keeps, under one
# signature of all the pair's tensors and flags, the prepared calls of its convolution and
# batch norm (and, for the backward, of the three ops it runs): they were checked and stored
# by the ops on the signature's first call, and every tensor those ops see (the convolution's
# output, its gradient) has a shape and strides fixed by the signature. A later call then
# skips the ops' own signatures and wrappers; what they check per call (scalars, overlaps) is
# still checked. The plans sit in the normalization engine's cache, which
# algos.norm.clear_plans empties. torch's deterministic and TF32 switches, which the
# convolution's own signature reads, are part of the key.


class _ForwardPlan:
    """The prepared convolution and training batch norm of one pair signature."""

    def __init__(self, conv, bn):
        self.conv, self.bn = conv, bn

    def __call__(self, x, w, conv_bias, weight, bias, z, running_mean, running_var, momentum,
                 eps, deterministic):  # fmt: skip
        conv = self.conv
        c = conv.output(None, x)
        conv_bias = conv_bias.contiguous() if conv_bias is not None else None
        conv_ops.run_prepared(conv, ConvTensors(x, w, c, conv_bias), deterministic)
        y, mean, invstd = bn_ops.run_training(
            self.bn, c, weight, bias, running_mean, running_var, z, None, momentum, eps, 1.0, 0.0
        )
        return y, c, mean, invstd


def _in_place(
    x, w, conv_bias, stride, padding, dilation, groups, weight, bias, z, running_mean,
    running_var, momentum, eps, activation,
):  # fmt: skip
    """The eager road: (y, conv output, saved_mean, saved_invstd), the running statistics
    updated in place by the kernel that finishes the batch statistics."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    key = signature(
        "conv_bn_train", (x, w, conv_bias, weight, bias, z, running_mean, running_var), stride,
        padding, dilation, groups, activation, deterministic, default_math_mode(),
    )  # fmt: skip
    plan = engine.cache.find(key)
    if plan is not None:
        return plan(
            x, w, conv_bias, weight, bias, z, running_mean, running_var, momentum, eps,
            deterministic,
        )  # fmt: skip
    c = ops.conv_forward(
        x, w, conv_bias, stride=stride, padding=padding, dilation=dilation, groups=groups,
        mode=_MODE, deterministic=deterministic,
    )  # fmt: skip
    y, mean, invstd = ops.batch_norm_forward_training(
        c, weight, bias, running_mean=running_mean, running_var=running_var,
        momentum=momentum, eps=eps, z=z, activation=activation,
    )  # fmt: skip
    # Both calls passed their checks: their prepared calls are stored (none for a batch of 0).
    conv = conv_ops.prepared_forward(
        x, w, conv_bias, stride, padding, dilation, groups, _MODE, deterministic
    )
    if conv is not None:
        bn = bn_ops.prepared_training(
            c, weight, bias, running_mean, running_var, z, None, "spatial", activation, 0.0
        )
        engine.cache.get(key, lambda: _ForwardPlan(conv, bn))
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


class _BackwardPlan:
    """The prepared batch-norm backward and convolution backward-data and backward-filter
    (None where that gradient is not needed) of one pair signature."""

    def __init__(self, bn, data, filter):
        self.bn, self.data, self.filter = bn, data, filter

    def __call__(self, dy, x, w, c, weight, bias, z, mean, invstd, deterministic):
        # batch_norm_backward checks alpha, beta and out on every call: 1, 0 and None here.
        dc, dweight, dbias, dz = self.bn(dy, c, mean, invstd, weight, bias, z, None, 1.0, 0.0)
        dx = dw = None
        if self.data is not None:
            dx = self.data.output(None, dc)
            conv_ops.run_prepared(self.data, ConvTensors(dx, w, dc), deterministic)
        if self.filter is not None:
            dw = self.filter.output(None, x)
            conv_ops.run_prepared(self.filter, ConvTensors(x, dw, dc), deterministic)
        return dc, dx, dw, dweight, dbias, dz


def _backward(ctx, dy, *_):
    x, w, c, weight, bias, z, mean, invstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    args = ctx.conv_args
    # Without a gradient graph to build (create_graph) or a trace, the ops would run their
    # eager roads: the plan of this signature runs them at once (see _ForwardPlan).
    key = plan = None
    if runs_eager(dy, x, w, c, weight, bias, z, mean, invstd):
        deterministic = torch.are_deterministic_algorithms_enabled()
        key = signature(
            "conv_bn_bwd", (dy, x, w, c, weight, bias, z, mean, invstd), *args, ctx.activation,
            need[0], need[1], deterministic, default_math_mode(),
        )  # fmt: skip
        plan = engine.cache.find(key)
    if plan is not None:
        dc, dx, dw, dweight, dbias, dz = plan(
            dy, x, w, c, weight, bias, z, mean, invstd, deterministic
        )
    else:
        # The batch norm's gradients first; the convolution's take dc, its output's gradient.
        dc, dweight, dbias, dz = batch_norm_bwd(
            dy, c, mean, invstd, weight, bias, z, ctx.activation, False, True
        )
        dx = conv_backward_data(dc, w, list(x.shape), *args) if need[0] else None
        dw = conv_backward_filter(x, dc, list(w.shape), *args) if need[1] else None
        if key is not None:
            _remember_backward(
                key, deterministic, dy, x, w, c, weight, bias, z, mean, invstd, dc, ctx, need
            )
    dcb = conv_backward_bias(dc) if ctx.has_conv_bias and need[2] else None
    return (
        dx, dw, dcb, None, None, None, None, dweight if need[7] else None,
        dbias if need[8] else None, dz if need[9] else None, None, None, None, None, None,
    )  # fmt: skip


def _remember_backward(key, deterministic, dy, x, w, c, weight, bias, z, mean, invstd, dc, ctx,
                       need):  # fmt: skip
    """Keep the backward plan of `key` once the ops of its first call stored their prepared
    calls (none where a batch of 0 returned early)."""
    stride, padding, dilation, groups, _ = ctx.conv_args
    found = [
        conv_ops.prepared_backward(
            direction, first, second, list(shape), stride, padding, dilation, groups, _MODE,
            deterministic,
        ) if wanted else None
        for wanted, direction, first, second, shape in (
            (need[0], Direction.BACKWARD_DATA, dc, w, x.shape),
            (need[1], Direction.BACKWARD_FILTER, x, dc, w.shape),
        )
    ]  # fmt: skip
    if any(call is None for wanted, call in zip(need[:2], found, strict=True) if wanted):
        return
    bn = bn_ops.prepared_backward(
        dy, c, mean, invstd, weight, bias, z, None, ctx.activation, "spatial", True, 0.0
    )
    engine.cache.get(key, lambda: _BackwardPlan(bn, *found))


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
