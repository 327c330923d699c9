"""Cross-entropy loss as custom ops with autograd."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import ops
from ..core import not_supported
from ._custom_op import custom_op, public, records_grad


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
    check_targets: bool = True,
) -> Tensor:
    return ops.cross_entropy_backward(
        grad, logits, target, lse, w_t, weight, ignore_index=ignore_index,
        label_smoothing=label_smoothing, reduction=reduction, check_targets=check_targets,
    )  # fmt: skip


@cross_entropy_backward.register_fake
def _(grad, logits, target, lse, w_t, weight, ignore_index, label_smoothing, reduction,
      check_targets=True):  # fmt: skip
    return torch.empty_like(logits)


def _ce_setup_context(ctx, inputs, output):
    logits, target, weight, ignore_index, label_smoothing, reduction = inputs
    _, lse, w_t = output
    ctx.save_for_backward(logits, target, lse, w_t, weight)
    ctx.args = (ignore_index, label_smoothing, reduction)
    ctx.mark_non_differentiable(lse, w_t)


def _ce_backward(ctx, grad, _lse, _w_t):
    logits, target, lse, w_t, weight = ctx.saved_tensors
    # The forward checked these targets: no second host check (and synchronization).
    dx = cross_entropy_backward(grad, logits, target, lse, w_t, weight, *ctx.args, False)
    return dx, None, None, None, None, None


cross_entropy.register_autograd(_ce_backward, setup_context=_ce_setup_context)


@public(ops.cross_entropy)
def cross_entropy_api(
    logits: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
) -> Tensor:
    if not records_grad(logits, weight):
        return ops.cross_entropy(
            logits, target, weight, ignore_index=ignore_index, label_smoothing=label_smoothing,
            reduction=reduction,
        )  # fmt: skip
    if isinstance(weight, Tensor) and weight.requires_grad:
        # As torch: the loss is differentiated with respect to the logits only.
        raise not_supported("weight.requires_grad", True, "the class weights take no gradient")
    loss, _, _ = cross_entropy(logits, target, weight, ignore_index, label_smoothing, reduction)
    return loss
