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

# ===========================================================================================
# Memory-bound primitives: pooling, activations, softmax, LRN, dropout, tensor ops.
# Each forward op saves what its backward op reads; fake kernels give shapes and layouts.
# ===========================================================================================

from .core import channels_last as _channels_last  # noqa: E402


def _like(x: Tensor) -> Tensor:
    """What the ops allocate for an elementwise result: torch.empty_like's layout."""
    return torch.empty_like(x)


# -- pooling --------------------------------------------------------------------------------


def _pool_out_shape(x, mode, window, stride, padding, dilation, ceil_mode):
    p = ops.pooling.pool_desc(x.dim(), mode, window, stride, padding, dilation, ceil_mode)
    return (*x.shape[:2], *ops.pooling.pool_output_size(x.shape[2:], p))


@torch.library.custom_op("rtdnn::pooling_forward", mutates_args=())
def pooling_forward(
    x: Tensor,
    mode: str,
    window: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    ceil_mode: bool,
) -> Tensor:
    return ops.pooling_forward(
        x, mode, window, stride=stride, padding=padding, dilation=dilation, ceil_mode=ceil_mode
    )


@pooling_forward.register_fake
def _(x, mode, window, stride, padding, dilation, ceil_mode):
    return empty_like_layout(
        _pool_out_shape(x, mode, window, stride, padding, dilation, ceil_mode), x
    )


@torch.library.custom_op("rtdnn::pooling_backward", mutates_args=())
def pooling_backward(
    dy: Tensor,
    x: Tensor,
    mode: str,
    window: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    ceil_mode: bool,
) -> Tensor:
    return ops.pooling_backward(
        dy, x, None, mode, window, stride=stride, padding=padding, dilation=dilation,
        ceil_mode=ceil_mode,
    )  # fmt: skip


@pooling_backward.register_fake
def _(dy, x, mode, window, stride, padding, dilation, ceil_mode):
    return empty_like_layout(x.shape, x)


def _pool_setup(ctx, inputs, output):
    x, *args = inputs
    ctx.save_for_backward(x)
    ctx.args = args


def _pool_backward(ctx, dy):
    (x,) = ctx.saved_tensors
    dx = pooling_backward(dy, x, *ctx.args) if ctx.needs_input_grad[0] else None
    return dx, None, None, None, None, None, None


pooling_forward.register_autograd(_pool_backward, setup_context=_pool_setup)


@torch.library.custom_op("rtdnn::adaptive_avg_pool", mutates_args=())
def adaptive_avg_pool(x: Tensor, output_size: list[int]) -> Tensor:
    return ops.adaptive_avg_pool(x, output_size)


@adaptive_avg_pool.register_fake
def _(x, output_size):
    return empty_like_layout((*x.shape[:2], *output_size), x)


@torch.library.custom_op("rtdnn::adaptive_avg_pool_backward", mutates_args=())
def adaptive_avg_pool_backward(dy: Tensor, x_shape: list[int]) -> Tensor:
    return ops.adaptive_avg_pool_backward(dy, x_shape)


@adaptive_avg_pool_backward.register_fake
def _(dy, x_shape):
    return empty_like_layout(x_shape, dy)


def _adaptive_setup(ctx, inputs, output):
    ctx.x_shape = list(inputs[0].shape)


def _adaptive_backward(ctx, dy):
    return adaptive_avg_pool_backward(dy, ctx.x_shape), None


adaptive_avg_pool.register_autograd(_adaptive_backward, setup_context=_adaptive_setup)


# -- activations ----------------------------------------------------------------------------


def _coef(mode: str, coef: list[float]):
    """Custom-op schemas take a list: [] is the default, [c] one coefficient, [lo, hi]."""
    if not coef:
        return None
    return tuple(coef) if mode == "hardtanh" else coef[0]


@torch.library.custom_op("rtdnn::activation_forward", mutates_args=())
def activation_forward(x: Tensor, mode: str, coef: list[float]) -> Tensor:
    return ops.activation_forward(x, mode, coef=_coef(mode, coef))


@activation_forward.register_fake
def _(x, mode, coef):
    return _like(x)


@torch.library.custom_op("rtdnn::activation_backward", mutates_args=())
def activation_backward(
    dy: Tensor, x: Tensor | None, y: Tensor | None, mode: str, coef: list[float]
) -> Tensor:
    return ops.activation_backward(dy, x, y, mode, coef=_coef(mode, coef))


@activation_backward.register_fake
def _(dy, x, y, mode, coef):
    return _like(dy)


def _act_setup(ctx, inputs, output):
    x, mode, coef = inputs
    needs = ops.activation_needs(mode)
    ctx.save_for_backward(x if needs == "x" else None, output if needs == "y" else None)
    ctx.mode, ctx.coef = mode, coef


def _act_backward(ctx, dy):
    x, y = ctx.saved_tensors
    return activation_backward(dy, x, y, ctx.mode, ctx.coef), None, None


activation_forward.register_autograd(_act_backward, setup_context=_act_setup)


# -- softmax --------------------------------------------------------------------------------


@torch.library.custom_op("rtdnn::softmax_forward", mutates_args=())
def softmax_forward(x: Tensor, algo: str, mode: str) -> Tensor:
    return ops.softmax_forward(x, algo=algo, mode=mode)


@softmax_forward.register_fake
def _(x, algo, mode):
    return _like(x)


@torch.library.custom_op("rtdnn::softmax_backward", mutates_args=())
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


# -- LRN ------------------------------------------------------------------------------------


@torch.library.custom_op("rtdnn::lrn_forward", mutates_args=())
def lrn_forward(x: Tensor, size: int, alpha: float, beta: float, k: float) -> Tensor:
    return ops.lrn_forward(x, size, lrn_alpha=alpha, lrn_beta=beta, lrn_k=k)


@lrn_forward.register_fake
def _(x, size, alpha, beta, k):
    return _like(x)


@torch.library.custom_op("rtdnn::lrn_backward", mutates_args=())
def lrn_backward(dy: Tensor, x: Tensor, size: int, alpha: float, beta: float, k: float) -> Tensor:
    return ops.lrn_backward(dy, x, None, size, lrn_alpha=alpha, lrn_beta=beta, lrn_k=k)


@lrn_backward.register_fake
def _(dy, x, size, alpha, beta, k):
    return _like(dy)


def _lrn_setup(ctx, inputs, output):
    x, *args = inputs
    ctx.save_for_backward(x)
    ctx.args = args


def _lrn_backward(ctx, dy):
    (x,) = ctx.saved_tensors
    return lrn_backward(dy, x, *ctx.args), None, None, None, None


lrn_forward.register_autograd(_lrn_backward, setup_context=_lrn_setup)


# -- dropout: the seed is a 0-d int64 CPU tensor so that torch.compile can trace a fresh one
# per step without a graph break (the op reads its value at run time).


@torch.library.custom_op("rtdnn::dropout_forward", mutates_args=())
def dropout_forward(x: Tensor, p: float, seed: Tensor) -> Tensor:
    return ops.dropout_forward(x, p, int(seed.item()))


@dropout_forward.register_fake
def _(x, p, seed):
    return _like(x)


@torch.library.custom_op("rtdnn::dropout_backward", mutates_args=())
def dropout_backward(dy: Tensor, p: float, seed: Tensor) -> Tensor:
    return ops.dropout_backward(dy, p, int(seed.item()))


@dropout_backward.register_fake
def _(dy, p, seed):
    return _like(dy)


def _dropout_setup(ctx, inputs, output):
    _, p, seed = inputs
    ctx.save_for_backward(seed)
    ctx.p = p


def _dropout_backward(ctx, dy):
    (seed,) = ctx.saved_tensors
    return dropout_backward(dy, ctx.p, seed), None, None


dropout_forward.register_autograd(_dropout_backward, setup_context=_dropout_setup)


# -- tensor ops -----------------------------------------------------------------------------


@torch.library.custom_op("rtdnn::op_tensor", mutates_args=())
def op_tensor(a: Tensor, b: Tensor | None, op: str, alpha1: float, alpha2: float) -> Tensor:
    return ops.op_tensor(a, b, op, alpha1=alpha1, alpha2=alpha2)


@op_tensor.register_fake
def _(a, b, op, alpha1, alpha2):
    return _like(a)


def _sum_to(g: Tensor, shape) -> Tensor:
    """Undo broadcasting: sum g over the dims that were broadcast to reach g's shape."""
    shape = tuple(shape)
    lead = g.dim() - len(shape)
    dims = [d for d in range(g.dim()) if d < lead or (shape[d - lead] == 1 and g.shape[d] != 1)]
    if dims:
        g = reduce_tensor(g, "add", dims)
        g = g.reshape(g.shape[lead:]) if lead else g
    return g


def _op_setup(ctx, inputs, output):
    a, b, op, alpha1, alpha2 = inputs
    ctx.save_for_backward(a, b, output)
    ctx.op, ctx.alpha1, ctx.alpha2 = op, alpha1, alpha2


def _op_backward(ctx, g):
    # Composed from rtdnn ops; min/max split ties evenly, as torch.minimum/maximum do.
    a, b, y = ctx.saved_tensors
    op, a1, a2 = ctx.op, ctx.alpha1, ctx.alpha2
    da = db = None
    if op == "add":
        da = op_tensor(g, g, "add", a1, 0.0)  # a1 * g
        db = _sum_to(op_tensor(g, g, "add", a2, 0.0), b.shape)
    elif op == "mul":
        da = op_tensor(g, b.expand(a.shape), "mul", a1 * a2, 1.0)
        db = _sum_to(op_tensor(g, a, "mul", a1 * a2, 1.0), b.shape)
    elif op in ("min", "max"):
        ua = a * a1
        vb = b.expand(a.shape) * a2
        tie = (ua == vb).to(g.dtype)
        win_a = ((ua > vb) if op == "max" else (ua < vb)).to(g.dtype) + 0.5 * tie
        da = g * win_a * a1
        db = _sum_to(g * (1 - win_a) * a2, b.shape)
    elif op == "sqrt":
        da = g * (0.5 * a1) / y
    elif op == "not":
        da = op_tensor(g, g, "add", -a1, 0.0)
    return da, db, None, None, None


op_tensor.register_autograd(_op_backward, setup_context=_op_setup)


@torch.library.custom_op("rtdnn::reduce_tensor", mutates_args=())
def reduce_tensor(x: Tensor, op: str, dims: list[int]) -> Tensor:
    """Values only, keepdim (reduced dims of size 1)."""
    return ops.reduce_tensor(x, op, dims)


@reduce_tensor.register_fake
def _(x, op, dims):
    nd = x.dim()
    red = {d % nd for d in dims} if dims else set(range(nd))
    return empty_like_layout(tuple(1 if d in red else s for d, s in enumerate(x.shape)), x)


def _reduce_setup(ctx, inputs, output):
    x, op, dims = inputs
    ctx.save_for_backward(x, output)
    ctx.op = op
    nd = x.dim()
    ctx.red = sorted({d % nd for d in dims} if dims else range(nd))


def _reduce_backward(ctx, g):
    # The gradient of a reduction is a broadcast of g times a local factor, in torch ops.
    x, y = ctx.saved_tensors
    op = ctx.op
    count = 1
    for d in ctx.red:
        count *= x.shape[d]
    if op == "add":
        dx = g.expand(x.shape)
    elif op == "avg":
        dx = g.expand(x.shape) / count
    elif op == "mul":
        dx = g * y / x
    elif op in ("min", "max"):
        hit = (x == y).to(g.dtype)
        dx = g * hit / reduce_tensor(hit, "add", ctx.red)
    elif op == "amax":
        hit = (x.abs() == y).to(g.dtype)
        dx = g * hit * torch.sign(x) / reduce_tensor(hit, "add", ctx.red)
    elif op == "norm1":
        dx = g * torch.sign(x)
    else:  # norm2
        dx = g * x / y
    return dx.contiguous(memory_format=_fmt(x)), None, None


def _fmt(x: Tensor):
    if _channels_last(x):
        return torch.channels_last if x.dim() == 4 else torch.channels_last_3d
    return torch.contiguous_format


reduce_tensor.register_autograd(_reduce_backward, setup_context=_reduce_setup)


@torch.library.custom_op("rtdnn::transform_tensor", mutates_args=())
def transform_tensor(x: Tensor, dtype: torch.dtype, channels_last: bool) -> Tensor:
    """x copied into dtype, in channels-last (4-d / 5-d) or contiguous layout."""
    return ops.transform_tensor(x, dtype=dtype, memory_format=_target_format(x, channels_last))


def _target_format(x: Tensor, channels_last: bool):
    if not channels_last:
        return torch.contiguous_format
    return torch.channels_last if x.dim() == 4 else torch.channels_last_3d


@transform_tensor.register_fake
def _(x, dtype, channels_last):
    return torch.empty_like(x, dtype=dtype, memory_format=_target_format(x, channels_last))


def _transform_setup(ctx, inputs, output):
    x = inputs[0]
    ctx.dtype = x.dtype
    ctx.cl = _channels_last(x)


def _transform_backward(ctx, g):
    return transform_tensor(g, ctx.dtype, ctx.cl), None, None


transform_tensor.register_autograd(_transform_backward, setup_context=_transform_setup)
