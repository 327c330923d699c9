"""Dropout as custom ops with autograd.

The seed is a 0-d int64 CPU tensor so that torch.compile can trace a fresh one per step without
a graph break (the op reads its value at run time).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import ops
from ._custom_op import _like, check_differentiable, custom_op, public, records_grad


@custom_op("rtdnn::dropout_forward")
def dropout_forward(x: Tensor, p: float, seed: Tensor, alpha: float = 1.0) -> Tensor:
    return ops.dropout_forward(x, p, int(seed.item()), alpha=alpha)


@dropout_forward.register_fake
def _(x, p, seed, alpha=1.0):
    return _like(x)


@custom_op("rtdnn::dropout_backward")
def dropout_backward(dy: Tensor, p: float, seed: Tensor, alpha: float = 1.0) -> Tensor:
    return ops.dropout_backward(dy, p, int(seed.item()), alpha=alpha)


@dropout_backward.register_fake
def _(dy, p, seed, alpha=1.0):
    return _like(dy)


def _dropout_setup(ctx, inputs, output):
    _, p, seed, *alpha = inputs  # the eager road may leave alpha out
    ctx.save_for_backward(seed)
    ctx.p = p
    ctx.alpha = alpha[0] if alpha else 1.0


def _dropout_backward(ctx, dy):
    (seed,) = ctx.saved_tensors
    return dropout_backward(dy, ctx.p, seed, ctx.alpha), None, None, None


dropout_forward.register_autograd(_dropout_backward, setup_context=_dropout_setup)


@public(ops.dropout_forward)
def dropout_forward_api(
    x: Tensor,
    p: float,
    seed: int,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Tensor | None = None,
) -> Tensor:
    if not records_grad(x):
        return ops.dropout_forward(x, p, seed, alpha=alpha, beta=beta, out=out)
    check_differentiable("dropout_forward", alpha, beta, out)
    ops.dropout.check_dropout_args(p, seed)  # the plain checks, before the seed becomes a tensor
    seed_t = torch.tensor(seed, dtype=torch.int64)
    return dropout_forward(x, float(p), seed_t, float(alpha))
