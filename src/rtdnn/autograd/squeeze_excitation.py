"""Squeeze-and-excitation as custom ops with autograd, and its differentiable function.

The forward op returns the output and the block's float32 intermediates (the pooled means,
and the two products before their activations), from which the backward computes every
gradient without recomputing the pooling.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import ops
from ..core import empty_like_layout
from ..ops.squeeze_excitation import (
    squeeze_excitation,
    squeeze_excitation_training,
)
from ..ops.squeeze_excitation import (
    squeeze_excitation_backward as backward,
)
from ._custom_op import _nothing, custom_op, public, records_grad


@custom_op("rtdnn::squeeze_excitation_forward")
def squeeze_excitation_forward(
    x: Tensor,
    w1: Tensor,
    b1: Tensor | None,
    w2: Tensor,
    b2: Tensor | None,
    activation: str,
    gate: str,
) -> tuple[Tensor, Tensor]:
    return squeeze_excitation_training(x, w1, b1, w2, b2, activation, gate)


@squeeze_excitation_forward.register_fake
def _(x, w1, b1, w2, b2, activation, gate):
    saved = x.new_empty(x.shape[0] * (2 * x.shape[1] + w1.shape[0]), dtype=torch.float32)
    return empty_like_layout(x.shape, x), saved


@custom_op("rtdnn::squeeze_excitation_backward")
def squeeze_excitation_backward(
    dy: Tensor,
    x: Tensor,
    saved: Tensor,
    w1: Tensor,
    b1: Tensor | None,
    w2: Tensor,
    b2: Tensor | None,
    activation: str,
    gate: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dx, dw1, db1, dw2, db2), an empty tensor for each missing bias."""
    dx, dw1, db1, dw2, db2 = backward(dy, x, saved, w1, b1, w2, b2, activation, gate)
    return (
        dx, dw1, db1 if db1 is not None else _nothing(x), dw2,
        db2 if db2 is not None else _nothing(x),
    )  # fmt: skip


@squeeze_excitation_backward.register_fake
def _(dy, x, saved, w1, b1, w2, b2, activation, gate):
    db1 = w1.new_empty(w1.shape[0]) if b1 is not None else _nothing(x)
    db2 = w1.new_empty(w2.shape[0]) if b2 is not None else _nothing(x)
    return empty_like_layout(x.shape, x), torch.empty_like(w1), db1, torch.empty_like(w2), db2


def _setup(ctx, inputs, output):
    x, w1, b1, w2, b2, activation, gate = inputs
    ctx.save_for_backward(x, output[1], w1, b1, w2, b2)
    ctx.modes = (activation, gate)


def _backward(ctx, dy, _saved_grad):
    x, saved, w1, b1, w2, b2 = ctx.saved_tensors
    dx, dw1, db1, dw2, db2 = squeeze_excitation_backward(dy, x, saved, w1, b1, w2, b2, *ctx.modes)
    need = ctx.needs_input_grad
    return (
        dx if need[0] else None, dw1 if need[1] else None,
        db1 if b1 is not None and need[2] else None, dw2 if need[3] else None,
        db2 if b2 is not None and need[4] else None, None, None,
    )  # fmt: skip


squeeze_excitation_forward.register_autograd(_backward, setup_context=_setup)


@public(ops.squeeze_excitation)
def squeeze_excitation_api(
    x: Tensor,
    w1: Tensor,
    b1: Tensor | None,
    w2: Tensor,
    b2: Tensor | None,
    activation: str = "relu",
    gate: str = "sigmoid",
) -> Tensor:
    if not records_grad(x, w1, b1, w2, b2):
        return squeeze_excitation(x, w1, b1, w2, b2, activation, gate)
    return squeeze_excitation_forward(x, w1, b1, w2, b2, activation, gate)[0]
