"""Activations as custom ops with autograd."""

from __future__ import annotations

from torch import Tensor

from .. import ops
from ._custom_op import _like, check_differentiable, custom_op, public, records_grad


def _coef(mode: str, coef: list[float]):
    """Custom-op schemas take a list: [] is the default, [c] one coefficient, [lo, hi]."""
    if not coef:
        return None
    return tuple(coef) if mode == "hardtanh" else coef[0]


def _coef_list(mode: str, coef) -> list:
    """The plain API's coef as the op's list (the inverse of _coef); ops validates it."""
    if coef is None:
        return []
    if mode == "hardtanh" and isinstance(coef, (tuple, list)):
        return list(coef)
    return [coef]


# alpha scales the output in float32 inside the kernel, as the plain call does, and the
# gradient the same way. The backward of a mode that reads y needs the unscaled y: with alpha
# != 1 it recomputes it from x (one more forward pass) rather than divide by alpha (inexact).


@custom_op("rtdnn::activation_forward")
def activation_forward(x: Tensor, mode: str, coef: list[float], alpha: float = 1.0) -> Tensor:
    return ops.activation_forward(x, mode, coef=_coef(mode, coef), alpha=alpha)


@activation_forward.register_fake
def _(x, mode, coef, alpha=1.0):
    return _like(x)


@custom_op("rtdnn::activation_backward")
def activation_backward(
    dy: Tensor, x: Tensor | None, y: Tensor | None, mode: str, coef: list[float], alpha: float = 1.0
) -> Tensor:
    return ops.activation_backward(dy, x, y, mode, coef=_coef(mode, coef), alpha=alpha)


@activation_backward.register_fake
def _(dy, x, y, mode, coef, alpha=1.0):
    return _like(dy)


def _act_setup(ctx, inputs, output):
    x, mode, coef, *alpha = inputs  # the eager road may leave alpha out
    ctx.alpha = alpha[0] if alpha else 1.0
    needs = ops.activation_needs(mode)
    ctx.recompute = needs == "y" and ctx.alpha != 1
    keep_x = needs == "x" or ctx.recompute
    ctx.save_for_backward(
        x if keep_x else None, output if needs == "y" and not ctx.recompute else None
    )
    ctx.mode, ctx.coef = mode, coef


def _act_backward(ctx, dy):
    x, y = ctx.saved_tensors
    if ctx.recompute:
        x, y = None, activation_forward(x, ctx.mode, ctx.coef)
    return activation_backward(dy, x, y, ctx.mode, ctx.coef, ctx.alpha), None, None, None


activation_forward.register_autograd(_act_backward, setup_context=_act_setup)


@public(ops.activation_forward)
def activation_forward_api(
    x: Tensor,
    mode: str,
    *,
    coef: float | tuple[float, float] | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Tensor | None = None,
) -> Tensor:
    if not records_grad(x):
        return ops.activation_forward(x, mode, coef=coef, alpha=alpha, beta=beta, out=out)
    check_differentiable("activation_forward", alpha, beta, out)
    return activation_forward(x, mode, _coef_list(mode, coef), float(alpha))
