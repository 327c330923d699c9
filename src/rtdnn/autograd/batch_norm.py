"""Batch normalization (training and inference forward, backward) as custom ops with autograd,
and the differentiable batch_norm.

Custom ops must be functional to take an autograd formula, so batch norm's training op returns
the updated running statistics as new tensors (written by the same kernel that finishes the
batch statistics) and the differentiable wrappers below copy them into the buffers. Eager
calls skip the copies: the kernel updates the buffers in place (see register_eager).
Optional outputs that do not exist come back as empty tensors: custom ops return tensors.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import ops
from ..core import bad_param, empty_like_layout
from ._custom_op import _nothing, check_differentiable, custom_op, public, records_grad
from ._norm import scaled_grad


def _bn_param_shape(x: Tensor, per_activation: bool) -> list[int]:
    return list(x.shape[1:]) if per_activation else [x.shape[1]]


def _bn_mode(per_activation: bool) -> str:
    return "per_activation" if per_activation else "spatial"


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
    alpha: float = 1.0,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(y, saved_mean, saved_invstd, new_running_mean, new_running_var); alpha scales y in
    float32 inside the kernel, as the plain call does."""
    new_rm = new_rv = None
    if running_mean is not None and running_var is not None:
        new_rm, new_rv = running_mean.clone(), running_var.clone()
    # The eager road's computation on copies: a functional op returns what it updates.
    y, mean, invstd = _batch_norm_train_in_place(
        x, weight, bias, z, new_rm, new_rv, momentum, eps, activation, per_activation, alpha
    )
    if new_rm is None:
        new_rm, new_rv = _nothing(x), _nothing(x)
    return y, mean, invstd, new_rm, new_rv


def _batch_norm_train_in_place(
    x, weight, bias, z, running_mean, running_var, momentum, eps, activation, per_activation,
    alpha=1.0,
):  # fmt: skip
    """batch_norm_train on the eager road: (y, saved_mean, saved_invstd). The kernel that
    finishes the batch statistics updates the running ones in place, saving two copies each
    way, so there are no new running statistics to return."""
    return ops.batch_norm_forward_training(
        x, weight, bias, running_mean=running_mean, running_var=running_var, momentum=momentum,
        eps=eps, mode=_bn_mode(per_activation), z=z, activation=activation, alpha=alpha,
    )  # fmt: skip


batch_norm_train.register_eager(_batch_norm_train_in_place)


@batch_norm_train.register_fake
def _(x, weight, bias, z, running_mean, running_var, momentum, eps, activation, per_activation,
      alpha=1.0):  # fmt: skip
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
    alpha: float = 1.0,
) -> Tensor:
    return ops.batch_norm_forward_inference(
        x, weight, bias, running_mean, running_var, eps=eps, mode=_bn_mode(per_activation),
        z=z, activation=activation, alpha=alpha,
    )  # fmt: skip


@batch_norm_infer.register_fake
def _(x, weight, bias, z, running_mean, running_var, eps, activation, per_activation,
      alpha=1.0):  # fmt: skip
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
    x, weight, bias, z, _, _, _, _, activation, per_activation, *alpha = inputs
    mean, invstd = output[1], output[2]
    ctx.save_for_backward(x, weight, bias, z, mean, invstd)
    ctx.args = (activation, per_activation)
    ctx.alpha = alpha[0] if alpha else 1.0  # the eager road may leave alpha out


def _bn_train_backward(ctx, dy, *_):
    x, weight, bias, z, mean, invstd = ctx.saved_tensors
    activation, per_activation = ctx.args
    dy = scaled_grad(dy, ctx.alpha)
    dx, dw, db, dz = batch_norm_bwd(
        dy, x, mean, invstd, weight, bias, z, activation, per_activation, True
    )
    need = ctx.needs_input_grad
    return (
        dx if need[0] else None, dw if need[1] else None, db if need[2] else None,
        dz if need[3] else None, None, None, None, None, None, None, None,
    )  # fmt: skip


batch_norm_train.register_autograd(_bn_train_backward, setup_context=_bn_train_setup)


def _bn_infer_setup(ctx, inputs, output):
    x, weight, bias, z, running_mean, running_var, eps, activation, per_activation, *alpha = inputs
    ctx.save_for_backward(x, weight, bias, z, running_mean, running_var)
    ctx.args = (eps, activation, per_activation)
    ctx.alpha = alpha[0] if alpha else 1.0  # the eager road may leave alpha out


def _bn_infer_backward(ctx, dy):
    x, weight, bias, z, running_mean, running_var = ctx.saved_tensors
    eps, activation, per_activation = ctx.args
    # The statistics are constants here: dx = dy * act' * weight / sqrt(running_var + eps).
    invstd = torch.rsqrt(running_var.float() + eps)
    dy = scaled_grad(dy, ctx.alpha)
    dx, dw, db, dz = batch_norm_bwd(
        dy, x, running_mean.float(), invstd, weight, bias, z, activation, per_activation, False
    )
    need = ctx.needs_input_grad
    return (
        dx if need[0] else None, dw if need[1] else None, db if need[2] else None,
        dz if need[3] else None, None, None, None, None, None, None,
    )  # fmt: skip


batch_norm_infer.register_autograd(_bn_infer_backward, setup_context=_bn_infer_setup)


def _per_activation(mode: str) -> bool:
    """The ops' flag for the plain API's mode, checked here: the ops see only the flag."""
    if mode not in ops.batch_norm.MODES:
        raise bad_param("mode", mode, f"one of {ops.batch_norm.MODES}")
    return mode == "per_activation"


def _train(
    x, weight, bias, z, running_mean, running_var, momentum, eps, activation, per_activation,
    alpha=1.0,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """batch_norm_train's (y, saved_mean, saved_invstd), the running statistics (if given)
    updated in place."""
    check_running_pair(running_mean, running_var)
    outputs = batch_norm_train(
        x, weight, bias, z, running_mean, running_var, momentum, eps, activation, per_activation,
        alpha,
    )  # fmt: skip
    copy_new_running(outputs, 5, running_mean, running_var)
    return outputs[0], outputs[1], outputs[2]


def check_running_pair(running_mean: Tensor | None, running_var: Tensor | None) -> None:
    """Running statistics come both or neither."""
    if (running_mean is None) != (running_var is None):
        raise bad_param("running_var", running_var, "given with running_mean (both or neither)")


def copy_new_running(
    outputs: tuple, functional: int, running_mean: Tensor | None, running_var: Tensor | None
) -> None:
    """Copy a training op's new running statistics (its last two outputs) into the buffers
    when the op ran as a functional op, with all `functional` outputs (through the
    dispatcher, as a traced or compiled graph calls it). The eager road returns fewer: its
    kernel updated the buffers in place."""
    if len(outputs) == functional and running_mean is not None and outputs[-2].numel():
        with torch.no_grad():
            running_mean.copy_(outputs[-2])
            running_var.copy_(outputs[-1])


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
    per_activation = _per_activation(mode)
    if training:
        return _train(
            x, weight, bias, z, running_mean, running_var, momentum, eps, activation,
            per_activation,
        )[0]  # fmt: skip
    if running_mean is None or running_var is None:
        raise bad_param("running_mean", None, "running statistics in inference (training=False)")
    return batch_norm_infer(
        x, weight, bias, z, running_mean, running_var, eps, activation, per_activation
    )


@public(ops.batch_norm_forward_training, stats=True)
def batch_norm_forward_training_api(
    x: Tensor,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    *,
    running_mean: Tensor | None = None,
    running_var: Tensor | None = None,
    momentum: float = 0.1,
    eps: float = 1e-5,
    mode: str = "spatial",
    z: Tensor | None = None,
    activation: str = "identity",
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    if not records_grad(x, weight, bias, z):
        return ops.batch_norm_forward_training(
            x, weight, bias, running_mean=running_mean, running_var=running_var,
            momentum=momentum, eps=eps, mode=mode, z=z, activation=activation, alpha=alpha,
            beta=beta, out=out,
        )  # fmt: skip
    check_differentiable("batch_norm_forward_training", alpha, beta, out)
    y, mean, invstd = _train(
        x, weight, bias, z, running_mean, running_var, momentum, eps, activation,
        _per_activation(mode), float(alpha),
    )  # fmt: skip
    return y, mean.detach(), invstd.detach()


@public(ops.batch_norm_forward_inference)
def batch_norm_forward_inference_api(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    running_mean: Tensor,
    running_var: Tensor,
    *,
    eps: float = 1e-5,
    mode: str = "spatial",
    z: Tensor | None = None,
    activation: str = "identity",
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Tensor | None = None,
) -> Tensor:
    if not records_grad(x, weight, bias, z):
        return ops.batch_norm_forward_inference(
            x, weight, bias, running_mean, running_var, eps=eps, mode=mode, z=z,
            activation=activation, alpha=alpha, beta=beta, out=out,
        )  # fmt: skip
    check_differentiable("batch_norm_forward_inference", alpha, beta, out)
    return batch_norm_infer(
        x, weight, bias, z, running_mean, running_var, eps, activation, _per_activation(mode),
        float(alpha),
    )  # fmt: skip
