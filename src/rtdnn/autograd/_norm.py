"""What the normalization families share: optional outputs and the autograd of the ops shaped
(x, shape or groups, weight, bias, eps) -> (y, mean, rstd)."""

from __future__ import annotations

import torch
from torch import Tensor

from ._custom_op import CustomOp, _nothing


def _or_nothing(t: Tensor | None, x: Tensor) -> Tensor:
    return t if t is not None else _nothing(x)


def _param_grads_fake(x: Tensor, shape, weight: Tensor | None, param_grads: bool) -> Tensor:
    if not param_grads:
        return _nothing(x)
    return x.new_empty(shape, dtype=weight.dtype if weight is not None else torch.float32)


def scaled_grad(dy: Tensor, alpha: float) -> Tensor:
    """The gradient reaching y / alpha for y = alpha * (normalized x * weight + bias): alpha
    scales the data and the parameter gradients alike (the backward ops' alpha scales dx only)."""
    return dy if alpha == 1 else dy * alpha


def _register_norm_autograd(forward: CustomOp, backward_op: CustomOp) -> None:
    """Autograd for the normalizations shaped (x, shape or groups, weight, bias, eps[, alpha])
    -> (y, mean, rstd), whose backward op is (dy, x, shape or groups, mean, rstd, weight,
    param_grads) -> (dx, dweight, dbias)."""

    def setup_context(ctx, inputs, output):
        x, arg, weight, _, _, *alpha = inputs  # the eager road may leave alpha out
        _, mean, rstd = output
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.arg = arg
        ctx.alpha = alpha[0] if alpha else 1.0

    def backward(ctx, dy, *_):
        x, weight, mean, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        dy = scaled_grad(dy, ctx.alpha)
        dx, dw, db = backward_op(dy, x, ctx.arg, mean, rstd, weight, need[2] or need[3])
        return (
            dx if need[0] else None, None, dw if need[2] else None, db if need[3] else None, None,
            None,
        )  # fmt: skip

    forward.register_autograd(backward, setup_context=setup_context)
