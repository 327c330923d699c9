"""PyTorch integration: rtdnn primitives as torch.library custom ops with autograd and fake
(meta) kernels, so they work under autograd and torch.compile traces them without graph breaks.

The ops are functional (no alpha, beta or out): those belong to the plain API in rtdnn.ops.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import ops
from .core import ConvDesc, bad_param, conv_output_shape, empty_like_layout


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


# -- normalization --------------------------------------------------------------------------
# Custom ops must be functional to take an autograd formula, so batch norm's training op returns
# the updated running statistics as new tensors (written by the same kernel that finishes the
# batch statistics) and the differentiable wrappers below copy them into the buffers.
# Optional outputs that do not exist come back as empty tensors: custom ops return tensors.


def _bn_param_shape(x: Tensor, per_activation: bool) -> list[int]:
    return list(x.shape[1:]) if per_activation else [x.shape[1]]


def _bn_mode(per_activation: bool) -> str:
    return "per_activation" if per_activation else "spatial"


def _nothing(x: Tensor) -> Tensor:
    return x.new_empty(0)


@torch.library.custom_op("rtdnn::batch_norm_train", mutates_args=())
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


@batch_norm_train.register_fake
def _(x, weight, bias, z, running_mean, running_var, momentum, eps, activation, per_activation):
    shape = _bn_param_shape(x, per_activation)
    stats = [x.new_empty(shape, dtype=torch.float32) for _ in range(2)]
    if running_mean is not None and running_var is not None:
        running = [torch.empty_like(running_mean), torch.empty_like(running_var)]
    else:
        running = [_nothing(x), _nothing(x)]
    return empty_like_layout(x.shape, x), *stats, *running


@torch.library.custom_op("rtdnn::batch_norm_infer", mutates_args=())
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


@torch.library.custom_op("rtdnn::batch_norm_bwd", mutates_args=())
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
    _, mean, invstd, _, _ = output
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
        y, _, _, new_rm, new_rv = batch_norm_train(
            x, weight, bias, z, running_mean, running_var, momentum, eps, activation,
            per_activation,
        )  # fmt: skip
        if running_mean is not None and running_var is not None:
            with torch.no_grad():
                running_mean.copy_(new_rm)
                running_var.copy_(new_rv)
        return y
    if running_mean is None or running_var is None:
        raise bad_param("running_mean", None, "running statistics in inference (training=False)")
    return batch_norm_infer(
        x, weight, bias, z, running_mean, running_var, eps, activation, per_activation
    )


@torch.library.custom_op("rtdnn::layer_norm", mutates_args=())
def layer_norm_fwd(
    x: Tensor, normalized_shape: list[int], weight: Tensor | None, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    return ops.layer_norm_forward(x, normalized_shape, weight, bias, eps=eps)


@layer_norm_fwd.register_fake
def _(x, normalized_shape, weight, bias, eps):
    lead = x.shape[: x.dim() - len(normalized_shape)]
    stats = [x.new_empty(lead, dtype=torch.float32) for _ in range(2)]
    return empty_like_layout(x.shape, x), *stats


@torch.library.custom_op("rtdnn::layer_norm_bwd", mutates_args=())
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


def _ln_setup(ctx, inputs, output):
    x, normalized_shape, weight, bias, _ = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, weight, mean, rstd)
    ctx.normalized_shape = normalized_shape


def _ln_backward(ctx, dy, *_):
    x, weight, mean, rstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    grads = need[2] or need[3]
    dx, dw, db = layer_norm_bwd(dy, x, ctx.normalized_shape, mean, rstd, weight, grads)
    return (dx if need[0] else None, None, dw if need[2] else None, db if need[3] else None, None)


layer_norm_fwd.register_autograd(_ln_backward, setup_context=_ln_setup)


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


@torch.library.custom_op("rtdnn::rms_norm", mutates_args=())
def rms_norm_fwd(
    x: Tensor, normalized_shape: list[int], weight: Tensor | None, eps: float
) -> tuple[Tensor, Tensor]:
    return ops.rms_norm_forward(x, normalized_shape, weight, eps=eps)


@rms_norm_fwd.register_fake
def _(x, normalized_shape, weight, eps):
    lead = x.shape[: x.dim() - len(normalized_shape)]
    return empty_like_layout(x.shape, x), x.new_empty(lead, dtype=torch.float32)


@torch.library.custom_op("rtdnn::rms_norm_bwd", mutates_args=())
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


@torch.library.custom_op("rtdnn::group_norm", mutates_args=())
def group_norm_fwd(
    x: Tensor, num_groups: int, weight: Tensor | None, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    return ops.group_norm_forward(x, num_groups, weight, bias, eps=eps)


@group_norm_fwd.register_fake
def _(x, num_groups, weight, bias, eps):
    stats = [x.new_empty((x.shape[0], num_groups), dtype=torch.float32) for _ in range(2)]
    return empty_like_layout(x.shape, x), *stats


@torch.library.custom_op("rtdnn::group_norm_bwd", mutates_args=())
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


def _gn_setup(ctx, inputs, output):
    x, num_groups, weight, _, _ = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, weight, mean, rstd)
    ctx.num_groups = num_groups


def _gn_backward(ctx, dy, *_):
    x, weight, mean, rstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    grads = need[2] or need[3]
    dx, dw, db = group_norm_bwd(dy, x, ctx.num_groups, mean, rstd, weight, grads)
    return (dx if need[0] else None, None, dw if need[2] else None, db if need[3] else None, None)


group_norm_fwd.register_autograd(_gn_backward, setup_context=_gn_setup)


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
