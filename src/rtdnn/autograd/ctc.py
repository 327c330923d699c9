"""CTC loss as custom ops with autograd."""

from __future__ import annotations

import torch
from torch import Tensor

from ..ops import ctc
from ._custom_op import custom_op


@custom_op("rtdnn::ctc_loss_forward")
def ctc_loss_forward(
    log_probs: Tensor,
    targets: Tensor,
    offsets: Tensor,
    input_lengths: Tensor,
    target_lengths: Tensor,
    blank: int,
    max_target: int,
    reduction: str,
    zero_infinity: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    return ctc.ctc_forward(
        log_probs, targets, offsets, input_lengths, target_lengths, blank, max_target,
        reduction, zero_infinity,
    )  # fmt: skip


@ctc_loss_forward.register_fake
def _(log_probs, targets, offsets, input_lengths, target_lengths, blank, max_target, reduction,
      zero_infinity):  # fmt: skip
    T, N, _ = log_probs.shape
    lanes = 1 << (2 * max_target).bit_length()  # next power of two >= 2 * max_target + 1
    nll = log_probs.new_empty((N,), dtype=torch.float32)
    loss = nll.new_empty((N,) if reduction == "none" else ())
    return loss, torch.empty_like(nll), log_probs.new_empty((N, T, lanes), dtype=torch.float32)


@custom_op("rtdnn::ctc_loss_backward")
def ctc_loss_backward(
    grad_loss: Tensor,
    log_probs: Tensor,
    targets: Tensor,
    offsets: Tensor,
    input_lengths: Tensor,
    target_lengths: Tensor,
    nll: Tensor,
    alpha: Tensor,
    blank: int,
    reduction: str,
    zero_infinity: bool,
) -> Tensor:
    return ctc.ctc_backward(
        grad_loss, log_probs, targets, offsets, input_lengths, target_lengths, nll, alpha,
        blank, reduction, zero_infinity,
    )  # fmt: skip


@ctc_loss_backward.register_fake
def _(grad_loss, log_probs, targets, offsets, input_lengths, target_lengths, nll, alpha, blank,
      reduction, zero_infinity):  # fmt: skip
    return log_probs.new_empty(log_probs.shape)


def _setup(ctx, inputs, output):
    lp, targets, offsets, in_len, tgt_len, blank, _max_target, reduction, zero_infinity = inputs
    _, nll, alpha = output
    ctx.save_for_backward(lp, targets, offsets, in_len, tgt_len, nll, alpha)
    ctx.args = (blank, reduction, zero_infinity)
    ctx.mark_non_differentiable(nll, alpha)


def _backward(ctx, grad_loss, _nll, _alpha):
    lp, targets, offsets, in_len, tgt_len, nll, alpha = ctx.saved_tensors
    grad = ctc_loss_backward(
        grad_loss, lp, targets, offsets, in_len, tgt_len, nll, alpha, *ctx.args
    )
    return grad, None, None, None, None, None, None, None, None


ctc_loss_forward.register_autograd(_backward, setup_context=_setup)


def ctc_loss(
    log_probs: Tensor,
    targets: Tensor,
    input_lengths: Tensor | tuple[int, ...] | list[int],
    target_lengths: Tensor | tuple[int, ...] | list[int],
    blank: int = 0,
    reduction: str = "mean",
    zero_infinity: bool = False,
) -> Tensor:
    """The CTC loss, as torch.nn.functional.ctc_loss: log_probs (T, N, C) (log_softmax output;
    or unbatched (T, C)), targets padded (N, S) or concatenated 1-D, lengths as tensors or
    sequences of ints; reduction "mean" (each loss over its target length, then the batch
    mean), "sum" or "none" ((N,)). An impossible alignment gives inf (0 with zero_infinity,
    its gradient then 0). Differentiable with respect to log_probs, with torch's gradient (that
    of the logits of the log_softmax that made log_probs). Targets and lengths are checked
    before any launch (see rtdnn.ops.ctc)."""
    ctc.check_reduction(reduction, zero_infinity)
    lp, flat, offsets, in_len, tgt_len, max_target, unbatched = ctc.prepare(
        log_probs, targets, input_lengths, target_lengths, blank
    )
    loss, _, _ = ctc_loss_forward(
        lp, flat, offsets, in_len, tgt_len, blank, max_target, reduction, zero_infinity
    )
    out = loss.to(log_probs.dtype)
    return out.squeeze(0) if unbatched and reduction == "none" else out
