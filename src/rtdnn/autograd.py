"""PyTorch integration: rtdnn primitives as torch.library custom ops with autograd and fake
(meta) kernels, so they work under autograd and torch.compile traces them without graph breaks.

The ops are functional (no alpha, beta or out): those belong to the plain API in rtdnn.ops.

Eager calls take a shorter road. Going through the dispatcher costs a custom op tens of
microseconds per call, more than many of these kernels take on the GPU, so on plain tensors
outside any tracing each op runs its implementation directly, or, when an input needs a
gradient, through a torch.autograd.Function built from the same forward, setup_context and
backward. Under torch.compile, fake tensors, tensor subclasses or dispatch modes the call goes
through the registered custom op, so traced graphs hold rtdnn::* ops.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from . import ops
from .core import ConvDesc, bad_param, conv_output_shape, empty_like_layout

_unwrap_if_dead = torch._C._functorch.unwrap_if_dead


class CustomOp:
    """A torch.library custom op (functional, no mutated arguments) with an eager fast path.

    Use as a decorator like torch.library.custom_op; `register_fake` and `register_autograd`
    take the same arguments as CustomOpDef's.
    """

    def __init__(self, name: str, fn):
        self.fn = fn
        self.eager = fn
        self.op = torch.library.custom_op(name, mutates_args=())(fn)
        self.function: type[torch.autograd.Function] | None = None
        functools.update_wrapper(self, fn)

    def register_eager(self, eager) -> None:
        """Run `eager` instead of the op's function on the eager road: the same results, but it
        may also update some inputs in place (what a functional op cannot), and leave off
        trailing outputs that stand in for nothing there (e.g. empty tensors where the op has
        no tensor to return; the op's callers must accept the shorter tuple)."""
        if self.function is not None:
            raise RuntimeError(f"{self.fn.__name__}: register_eager before register_autograd")
        self.eager = eager

    def register_fake(self, fake):
        return self.op.register_fake(fake)

    def register_autograd(self, backward, *, setup_context) -> None:
        self.op.register_autograd(backward, setup_context=setup_context)
        eager = self.eager

        # forward(ctx, ...) rather than a separate setup_context: Function.apply binds the
        # arguments with inspect.signature on every call when setup_context is overridden.
        def forward(ctx, *args):
            # Gradients of unused outputs stay None instead of tensors of zeros: the backward
            # formulas read only the first output's gradient (the others are statistics).
            ctx.set_materialize_grads(False)
            ctx.num_inputs = len(args)
            output = eager(*args)
            setup_context(ctx, args, output)
            return output

        def backward_or_none(ctx, *grads):
            if grads[0] is None:  # no gradient reached the main output: nothing to propagate
                return (None,) * ctx.num_inputs
            return backward(ctx, *grads)

        self.function = type(
            f"{self.fn.__name__}_function",
            (torch.autograd.Function,),
            {"forward": staticmethod(forward), "backward": staticmethod(backward_or_none)},
        )
        # Function.apply's own entry point, in C. The Python classmethod around it adds what
        # these Functions do not need on the eager road (setup_context binding, functorch
        # transforms, which __call__ checks) at about a microsecond per call.
        self.apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, self.function)

    def __call__(self, *args):
        # One pass over the arguments: a tensor subclass (FakeTensor, FunctionalTensor, a
        # user's) sends the call through the dispatcher, as tracing and dispatch modes do. A
        # tensor left over from a finished torch.func transform (a "dead wrapper") sends it
        # through Function.apply, which unwraps it.
        needs_grad = dead = False
        for a in args:
            kind = type(a)
            if kind is Tensor or kind is torch.nn.Parameter:
                needs_grad = needs_grad or a.requires_grad
                dead = dead or _unwrap_if_dead(a) is not a
            elif isinstance(a, Tensor):
                return self.op(*args)
        if (
            torch.compiler.is_compiling()
            or torch._C._is_torch_function_mode_enabled()
            or is_in_torch_dispatch_mode()
        ):
            return self.op(*args)
        if needs_grad and self.function is not None and torch.is_grad_enabled():
            if dead or torch._C._are_functorch_transforms_active():
                return self.function.apply(*args)
            return self.apply(*args)
        return self.eager(*args)


def custom_op(name: str):
    """Decorator: `fn` as the custom op `name` with an eager fast path (see CustomOp)."""
    return functools.partial(CustomOp, name)


def _desc(x: Tensor, stride, padding, dilation, groups, mode) -> ConvDesc:
    return ConvDesc.create(x.dim() - 2, stride, padding, dilation, groups, mode, "fp32")


# -- convolution ----------------------------------------------------------------------------


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


# -- linear -----------------------------------------------------------------------------------


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


# -- cross-entropy ----------------------------------------------------------------------------


@custom_op("rtdnn::cross_entropy")
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


@custom_op("rtdnn::cross_entropy_backward")
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


@custom_op("rtdnn::pooling_forward")
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


@custom_op("rtdnn::pooling_backward")
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


@custom_op("rtdnn::adaptive_avg_pool")
def adaptive_avg_pool(x: Tensor, output_size: list[int]) -> Tensor:
    return ops.adaptive_avg_pool(x, output_size)


@adaptive_avg_pool.register_fake
def _(x, output_size):
    return empty_like_layout((*x.shape[:2], *output_size), x)


@custom_op("rtdnn::adaptive_avg_pool_backward")
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


@custom_op("rtdnn::activation_forward")
def activation_forward(x: Tensor, mode: str, coef: list[float]) -> Tensor:
    return ops.activation_forward(x, mode, coef=_coef(mode, coef))


@activation_forward.register_fake
def _(x, mode, coef):
    return _like(x)


@custom_op("rtdnn::activation_backward")
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


# -- LRN ------------------------------------------------------------------------------------


@custom_op("rtdnn::lrn_forward")
def lrn_forward(x: Tensor, size: int, alpha: float, beta: float, k: float) -> Tensor:
    return ops.lrn_forward(x, size, lrn_alpha=alpha, lrn_beta=beta, lrn_k=k)


@lrn_forward.register_fake
def _(x, size, alpha, beta, k):
    return _like(x)


@custom_op("rtdnn::lrn_backward")
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


@custom_op("rtdnn::dropout_forward")
def dropout_forward(x: Tensor, p: float, seed: Tensor) -> Tensor:
    return ops.dropout_forward(x, p, int(seed.item()))


@dropout_forward.register_fake
def _(x, p, seed):
    return _like(x)


@custom_op("rtdnn::dropout_backward")
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


@custom_op("rtdnn::op_tensor")
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


@custom_op("rtdnn::reduce_tensor")
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


@custom_op("rtdnn::transform_tensor")
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

# -- normalization --------------------------------------------------------------------------
# Custom ops must be functional to take an autograd formula, so batch norm's training op returns
# the updated running statistics as new tensors (written by the same kernel that finishes the
# batch statistics) and the differentiable wrappers below copy them into the buffers. Eager
# calls skip the copies: the kernel updates the buffers in place (see register_eager).
# Optional outputs that do not exist come back as empty tensors: custom ops return tensors.


def _bn_param_shape(x: Tensor, per_activation: bool) -> list[int]:
    return list(x.shape[1:]) if per_activation else [x.shape[1]]


def _bn_mode(per_activation: bool) -> str:
    return "per_activation" if per_activation else "spatial"


def _nothing(x: Tensor) -> Tensor:
    return x.new_empty(0)


@custom_op("rtdnn::batch_norm_train")
def batch_norm_train(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    z: Tensor | None,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    momentum: float,
    eps: float,
    activation: str,
    per_activation: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(y, saved_mean, saved_invstd, new_running_mean, new_running_var)."""
    new_rm = new_rv = None
    if running_mean is not None and running_var is not None:
        new_rm, new_rv = running_mean.clone(), running_var.clone()
    y, mean, invstd = ops.batch_norm_forward_training(
        x, weight, bias, running_mean=new_rm, running_var=new_rv, momentum=momentum, eps=eps,
        mode=_bn_mode(per_activation), z=z, activation=activation,
    )  # fmt: skip
    if new_rm is None:
        new_rm, new_rv = _nothing(x), _nothing(x)
    return y, mean, invstd, new_rm, new_rv


def _batch_norm_train_in_place(
    x, weight, bias, z, running_mean, running_var, momentum, eps, activation, per_activation
):
    """batch_norm_train on the eager road: (y, saved_mean, saved_invstd). The kernel that
    finishes the batch statistics updates the running ones in place, saving two copies each
    way, so there are no new running statistics to return."""
    return ops.batch_norm_forward_training(
        x, weight, bias, running_mean=running_mean, running_var=running_var, momentum=momentum,
        eps=eps, mode=_bn_mode(per_activation), z=z, activation=activation,
    )  # fmt: skip


batch_norm_train.register_eager(_batch_norm_train_in_place)


@batch_norm_train.register_fake
def _(x, weight, bias, z, running_mean, running_var, momentum, eps, activation, per_activation):
    shape = _bn_param_shape(x, per_activation)
    stats = [x.new_empty(shape, dtype=torch.float32) for _ in range(2)]
    if running_mean is not None and running_var is not None:
        running = [torch.empty_like(running_mean), torch.empty_like(running_var)]
    else:
        running = [_nothing(x), _nothing(x)]
    return empty_like_layout(x.shape, x), *stats, *running


@custom_op("rtdnn::batch_norm_infer")
def batch_norm_infer(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    z: Tensor | None,
    running_mean: Tensor,
    running_var: Tensor,
    eps: float,
    activation: str,
    per_activation: bool,
) -> Tensor:
    return ops.batch_norm_forward_inference(
        x, weight, bias, running_mean, running_var, eps=eps, mode=_bn_mode(per_activation),
        z=z, activation=activation,
    )  # fmt: skip


@batch_norm_infer.register_fake
def _(x, weight, bias, z, running_mean, running_var, eps, activation, per_activation):
    return empty_like_layout(x.shape, x)


@custom_op("rtdnn::batch_norm_bwd")
def batch_norm_bwd(
    dy: Tensor,
    x: Tensor,
    mean: Tensor,
    invstd: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    z: Tensor | None,
    activation: str,
    per_activation: bool,
    training: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx, dweight, dbias, dz); dz is empty without z."""
    dx, dw, db, dz = ops.batch_norm_backward(
        dy, x, mean, invstd, weight, bias, z=z, activation=activation,
        mode=_bn_mode(per_activation), training=training,
    )  # fmt: skip
    return dx, dw, db, dz if dz is not None else _nothing(x)


def _batch_norm_bwd_eager(dy, x, mean, invstd, weight, bias, z, activation, per_activation,
                          training):  # fmt: skip
    """batch_norm_bwd on the eager road: dz is None without z (no empty tensor to make)."""
    return ops.batch_norm_backward(
        dy, x, mean, invstd, weight, bias, z=z, activation=activation,
        mode=_bn_mode(per_activation), training=training,
    )  # fmt: skip


batch_norm_bwd.register_eager(_batch_norm_bwd_eager)


@batch_norm_bwd.register_fake
def _(dy, x, mean, invstd, weight, bias, z, activation, per_activation, training):
    shape = _bn_param_shape(x, per_activation)
    dt = weight.dtype if weight is not None else torch.float32
    dz = empty_like_layout(z.shape, z) if z is not None else _nothing(x)
    return (
        empty_like_layout(x.shape, x),
        x.new_empty(shape, dtype=dt),
        x.new_empty(shape, dtype=dt),
        dz,
    )


def _bn_train_setup(ctx, inputs, output):
    x, weight, bias, z, _, _, _, _, activation, per_activation = inputs
    mean, invstd = output[1], output[2]
    ctx.save_for_backward(x, weight, bias, z, mean, invstd)
    ctx.args = (activation, per_activation)


def _bn_train_backward(ctx, dy, *_):
    x, weight, bias, z, mean, invstd = ctx.saved_tensors
    activation, per_activation = ctx.args
    dx, dw, db, dz = batch_norm_bwd(
        dy, x, mean, invstd, weight, bias, z, activation, per_activation, True
    )
    need = ctx.needs_input_grad
    return (
        dx if need[0] else None, dw if need[1] else None, db if need[2] else None,
        dz if need[3] else None, None, None, None, None, None, None,
    )  # fmt: skip


batch_norm_train.register_autograd(_bn_train_backward, setup_context=_bn_train_setup)


def _bn_infer_setup(ctx, inputs, output):
    x, weight, bias, z, running_mean, running_var, eps, activation, per_activation = inputs
    ctx.save_for_backward(x, weight, bias, z, running_mean, running_var)
    ctx.args = (eps, activation, per_activation)


def _bn_infer_backward(ctx, dy):
    x, weight, bias, z, running_mean, running_var = ctx.saved_tensors
    eps, activation, per_activation = ctx.args
    # The statistics are constants here: dx = dy * act' * weight / sqrt(running_var + eps).
    invstd = torch.rsqrt(running_var.float() + eps)
    dx, dw, db, dz = batch_norm_bwd(
        dy, x, running_mean.float(), invstd, weight, bias, z, activation, per_activation, False
    )
    need = ctx.needs_input_grad
    return (
        dx if need[0] else None, dw if need[1] else None, db if need[2] else None,
        dz if need[3] else None, None, None, None, None, None,
    )  # fmt: skip


batch_norm_infer.register_autograd(_bn_infer_backward, setup_context=_bn_infer_setup)


def batch_norm(
    x: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
    *,
    z: Tensor | None = None,
    activation: str = "identity",
    mode: str = "spatial",
) -> Tensor:
    """torch.nn.functional.batch_norm computed by rtdnn, differentiable, with cuDNN's fused
    residual add and activation: y = act(bn(x) + z). In training the running statistics
    (if given) are updated in place with `momentum` as the exponential average factor."""
    per_activation = mode == "per_activation"
    if training:
        outputs = batch_norm_train(
            x, weight, bias, z, running_mean, running_var, momentum, eps, activation,
            per_activation,
        )  # fmt: skip
        # Three outputs on the eager road, which updated the running statistics in place.
        if len(outputs) == 5 and running_mean is not None and outputs[3].numel():
            with torch.no_grad():
                running_mean.copy_(outputs[3])
                running_var.copy_(outputs[4])
        return outputs[0]
    if running_mean is None or running_var is None:
        raise bad_param("running_mean", None, "running statistics in inference (training=False)")
    return batch_norm_infer(
        x, weight, bias, z, running_mean, running_var, eps, activation, per_activation
    )


@custom_op("rtdnn::layer_norm")
def layer_norm_fwd(
    x: Tensor, normalized_shape: list[int], weight: Tensor | None, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    return ops.layer_norm_forward(x, normalized_shape, weight, bias, eps=eps)


@layer_norm_fwd.register_fake
def _(x, normalized_shape, weight, bias, eps):
    lead = x.shape[: x.dim() - len(normalized_shape)]
    stats = [x.new_empty(lead, dtype=torch.float32) for _ in range(2)]
    return empty_like_layout(x.shape, x), *stats


@custom_op("rtdnn::layer_norm_bwd")
def layer_norm_bwd(
    dy: Tensor,
    x: Tensor,
    normalized_shape: list[int],
    mean: Tensor,
    rstd: Tensor,
    weight: Tensor | None,
    param_grads: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    dx, dw, db = ops.layer_norm_backward(
        dy, x, normalized_shape, mean, rstd, weight, param_grads=param_grads
    )
    return dx, _or_nothing(dw, x), _or_nothing(db, x)


def _or_nothing(t: Tensor | None, x: Tensor) -> Tensor:
    return t if t is not None else _nothing(x)


def _param_grads_fake(x: Tensor, shape, weight: Tensor | None, param_grads: bool) -> Tensor:
    if not param_grads:
        return _nothing(x)
    return x.new_empty(shape, dtype=weight.dtype if weight is not None else torch.float32)


@layer_norm_bwd.register_fake
def _(dy, x, normalized_shape, mean, rstd, weight, param_grads):
    dw = _param_grads_fake(x, normalized_shape, weight, param_grads)
    return empty_like_layout(x.shape, x), dw, torch.empty_like(dw)


def _register_norm_autograd(forward: CustomOp, backward_op: CustomOp) -> None:
    """Autograd for the normalizations shaped (x, shape or groups, weight, bias, eps) ->
    (y, mean, rstd), whose backward op is (dy, x, shape or groups, mean, rstd, weight,
    param_grads) -> (dx, dweight, dbias)."""

    def setup_context(ctx, inputs, output):
        x, arg, weight, _, _ = inputs
        _, mean, rstd = output
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.arg = arg

    def backward(ctx, dy, *_):
        x, weight, mean, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        dx, dw, db = backward_op(dy, x, ctx.arg, mean, rstd, weight, need[2] or need[3])
        return (
            dx if need[0] else None, None, dw if need[2] else None, db if need[3] else None, None,
        )  # fmt: skip

    forward.register_autograd(backward, setup_context=setup_context)


_register_norm_autograd(layer_norm_fwd, layer_norm_bwd)


def layer_norm(
    x: Tensor,
    normalized_shape: int | list[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """torch.nn.functional.layer_norm computed by rtdnn, differentiable."""
    shape = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    return layer_norm_fwd(x, shape, weight, bias, eps)[0]


@custom_op("rtdnn::rms_norm")
def rms_norm_fwd(
    x: Tensor, normalized_shape: list[int], weight: Tensor | None, eps: float
) -> tuple[Tensor, Tensor]:
    return ops.rms_norm_forward(x, normalized_shape, weight, eps=eps)


@rms_norm_fwd.register_fake
def _(x, normalized_shape, weight, eps):
    lead = x.shape[: x.dim() - len(normalized_shape)]
    return empty_like_layout(x.shape, x), x.new_empty(lead, dtype=torch.float32)


@custom_op("rtdnn::rms_norm_bwd")
def rms_norm_bwd(
    dy: Tensor,
    x: Tensor,
    normalized_shape: list[int],
    rstd: Tensor,
    weight: Tensor | None,
    param_grads: bool,
) -> tuple[Tensor, Tensor]:
    dx, dw = ops.rms_norm_backward(dy, x, normalized_shape, rstd, weight, param_grads=param_grads)
    return dx, _or_nothing(dw, x)


@rms_norm_bwd.register_fake
def _(dy, x, normalized_shape, rstd, weight, param_grads):
    dw = _param_grads_fake(x, normalized_shape, weight, param_grads)
    return empty_like_layout(x.shape, x), dw


def _rms_setup(ctx, inputs, output):
    x, normalized_shape, weight, _ = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.normalized_shape = normalized_shape


def _rms_backward(ctx, dy, _):
    x, weight, rstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    dx, dw = rms_norm_bwd(dy, x, ctx.normalized_shape, rstd, weight, need[2])
    return dx if need[0] else None, None, dw if need[2] else None, None


rms_norm_fwd.register_autograd(_rms_backward, setup_context=_rms_setup)


def rms_norm(
    x: Tensor,
    normalized_shape: int | list[int],
    weight: Tensor | None = None,
    eps: float | None = None,
) -> Tensor:
    """torch.nn.functional.rms_norm computed by rtdnn, differentiable (eps=None: the dtype's
    machine epsilon, as torch)."""
    shape = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    return rms_norm_fwd(x, shape, weight, eps)[0]


@custom_op("rtdnn::group_norm")
def group_norm_fwd(
    x: Tensor, num_groups: int, weight: Tensor | None, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    return ops.group_norm_forward(x, num_groups, weight, bias, eps=eps)


@group_norm_fwd.register_fake
def _(x, num_groups, weight, bias, eps):
    stats = [x.new_empty((x.shape[0], num_groups), dtype=torch.float32) for _ in range(2)]
    return empty_like_layout(x.shape, x), *stats


@custom_op("rtdnn::group_norm_bwd")
def group_norm_bwd(
    dy: Tensor,
    x: Tensor,
    num_groups: int,
    mean: Tensor,
    rstd: Tensor,
    weight: Tensor | None,
    param_grads: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    dx, dw, db = ops.group_norm_backward(
        dy, x, num_groups, mean, rstd, weight, param_grads=param_grads
    )
    return dx, _or_nothing(dw, x), _or_nothing(db, x)


@group_norm_bwd.register_fake
def _(dy, x, num_groups, mean, rstd, weight, param_grads):
    dw = _param_grads_fake(x, (x.shape[1],), weight, param_grads)
    return empty_like_layout(x.shape, x), dw, torch.empty_like(dw)


_register_norm_autograd(group_norm_fwd, group_norm_bwd)


def group_norm(
    x: Tensor,
    num_groups: int,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """torch.nn.functional.group_norm computed by rtdnn, differentiable."""
    return group_norm_fwd(x, num_groups, weight, bias, eps)[0]


def instance_norm(
    x: Tensor,
    running_mean: Tensor | None = None,
    running_var: Tensor | None = None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    use_input_stats: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """torch.nn.functional.instance_norm computed by rtdnn, differentiable.

    With the input's statistics, the running statistics (if given) are updated in place as
    torch does: by the batch average of each instance's mean and unbiased variance (the
    variance recovered from the float32 1/std). Without, the running statistics normalize
    every instance (an inference batch norm).
    """
    if (
        not isinstance(momentum, (int, float))
        or isinstance(momentum, bool)
        or not 0.0 <= momentum <= 1.0
    ):
        raise bad_param("momentum", momentum, "a factor in [0, 1]")
    if not use_input_stats:
        if running_mean is None or running_var is None:
            raise bad_param("running_mean", None, "running statistics when use_input_stats=False")
        return batch_norm_infer(x, weight, bias, None, running_mean, running_var, eps,
                                "identity", False)  # fmt: skip
    y, mean, rstd = group_norm_fwd(x, x.shape[1], weight, bias, eps)
    if running_mean is not None and running_var is not None:
        n = x[0, 0].numel()
        with torch.no_grad():
            var = (rstd.detach().double() ** -2 - eps).clamp_min(0) * (n / max(n - 1, 1))
            running_mean.mul_(1 - momentum).add_(momentum * mean.detach().mean(0))
            running_var.mul_(1 - momentum).add_((momentum * var.mean(0)).to(running_var.dtype))
    return y
