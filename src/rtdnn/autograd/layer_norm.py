"""Layer norm and RMS norm as custom ops with autograd, and their differentiable functions."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .. import ops
from ..core import empty_like_layout
from ._custom_op import check_differentiable, custom_op, public, records_grad
from ._norm import _or_nothing, _param_grads_fake, _register_norm_autograd, scaled_grad


def _shape(normalized_shape) -> list[int]:
    """normalized_shape as the ops' list (an int is one dim); ops validates it."""
    return [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)


@custom_op("rtdnn::layer_norm")
def layer_norm_fwd(
    x: Tensor,
    normalized_shape: list[int],
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
    alpha: float = 1.0,
) -> tuple[Tensor, Tensor, Tensor]:
    return ops.layer_norm_forward(x, normalized_shape, weight, bias, eps=eps, alpha=alpha)


@layer_norm_fwd.register_fake
def _(x, normalized_shape, weight, bias, eps, alpha=1.0):
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


@layer_norm_bwd.register_fake
def _(dy, x, normalized_shape, mean, rstd, weight, param_grads):
    dw = _param_grads_fake(x, normalized_shape, weight, param_grads)
    return empty_like_layout(x.shape, x), dw, torch.empty_like(dw)


_register_norm_autograd(layer_norm_fwd, layer_norm_bwd)


def layer_norm(
    x: Tensor,
    normalized_shape: int | list[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """torch.nn.functional.layer_norm computed by rtdnn, differentiable."""
    return layer_norm_fwd(x, _shape(normalized_shape), weight, bias, eps)[0]


@custom_op("rtdnn::rms_norm")
def rms_norm_fwd(
    x: Tensor, normalized_shape: list[int], weight: Tensor | None, eps: float, alpha: float = 1.0
) -> tuple[Tensor, Tensor]:
    return ops.rms_norm_forward(x, normalized_shape, weight, eps=eps, alpha=alpha)


@rms_norm_fwd.register_fake
def _(x, normalized_shape, weight, eps, alpha=1.0):
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
    x, normalized_shape, weight, _, *alpha = inputs  # the eager road may leave alpha out
    ctx.save_for_backward(x, weight, output[1])
    ctx.normalized_shape = normalized_shape
    ctx.alpha = alpha[0] if alpha else 1.0


def _rms_backward(ctx, dy, _):
    x, weight, rstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    dy = scaled_grad(dy, ctx.alpha)
    dx, dw = rms_norm_bwd(dy, x, ctx.normalized_shape, rstd, weight, need[2])
    return dx if need[0] else None, None, dw if need[2] else None, None, None


rms_norm_fwd.register_autograd(_rms_backward, setup_context=_rms_setup)


def rms_norm(
    x: Tensor,
    normalized_shape: int | list[int],
    weight: Tensor | None = None,
    eps: float | None = None,
) -> Tensor:
    """torch.nn.functional.rms_norm computed by rtdnn, differentiable (eps=None: the dtype's
    machine epsilon, as torch)."""
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    return rms_norm_fwd(x, _shape(normalized_shape), weight, eps)[0]


@public(ops.layer_norm_forward, stats=True)
def layer_norm_forward_api(
    x: Tensor,
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    *,
    eps: float = 1e-5,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    if not records_grad(x, weight, bias):
        return ops.layer_norm_forward(
            x, normalized_shape, weight, bias, eps=eps, alpha=alpha, beta=beta, out=out
        )
    check_differentiable("layer_norm_forward", alpha, beta, out)
    y, mean, rstd = layer_norm_fwd(x, _shape(normalized_shape), weight, bias, eps, float(alpha))
    return y, mean.detach(), rstd.detach()


@public(ops.rms_norm_forward, stats=True)
def rms_norm_forward_api(
    x: Tensor,
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,
    *,
    eps: float | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    if not records_grad(x, weight):
        return ops.rms_norm_forward(
            x, normalized_shape, weight, eps=eps, alpha=alpha, beta=beta, out=out
        )
    check_differentiable("rms_norm_forward", alpha, beta, out)
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    y, rstd = rms_norm_fwd(x, _shape(normalized_shape), weight, eps, float(alpha))
    return y, rstd.detach()
