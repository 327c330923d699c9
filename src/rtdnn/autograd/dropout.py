"""Dropout as custom ops with autograd.

The seed is a 0-d int64 CPU tensor so that torch.compile can trace a fresh one per step without
a graph break (the op reads its value at run time).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import ops
from ._custom_op import _like, check_differentiable, custom_op, public, records_grad, scaled


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
    return scaled(dropout_forward(x, float(p), seed_t), alpha)
