"""Cross-entropy loss with the log-softmax fused in (forward and backward).

Semantics are torch.nn.functional.cross_entropy's with class-index targets: logits (N, C) or
(N, C, *spatial) with any strides, target (N,) or (N, *spatial) int64, optional class weights
(C,), ignore_index, label_smoothing, reduction "mean" (divided by the summed weights of the
targets that are not ignored), "sum" or "none". With no rows (N = 0 or an empty spatial dim)
the loss is torch's: NaN for "mean" (0 / 0), 0 for "sum", empty for "none".

A target outside [0, C) that is not ignore_index raises BadParamError, as torch raises. The check
runs on the host before any launch: one pass over the targets and, on a GPU, one
device-to-host synchronization per call (forward and backward each), which a training step
of a few kernels does not notice. The kernels themselves never read out of bounds.
"""

from __future__ import annotations

import torch

from ..core import bad_param, check_runnable, check_tensor
from ..kernels.cross_entropy import cross_entropy_bwd_kernel, cross_entropy_fwd_kernel, sum_kernel

REDUCTIONS = ("mean", "sum", "none")
_BLOCK = 1024


def _rows(logits: torch.Tensor) -> torch.Tensor:
    """(N, C, *S) -> (rows, C) with the class dim last; a view when the layout allows."""
    if logits.dim() == 2:
        return logits
    return logits.movedim(1, -1).reshape(-1, logits.shape[1])


def _check(logits, target, weight, reduction, label_smoothing, ignore_index):
    logits = check_tensor("logits", logits, ndim=tuple(range(2, 6)), empty=True)
    if logits.shape[1] == 0:
        raise bad_param("logits.shape", tuple(logits.shape), "at least one class (dim 1)")
    if not isinstance(target, torch.Tensor) or target.dtype != torch.int64:
        raise bad_param("target.dtype", getattr(target, "dtype", type(target).__name__), "int64")
    if target.device != logits.device:
        raise bad_param("target.device", target.device, f"{logits.device}")
    expected = (logits.shape[0], *logits.shape[2:])
    if tuple(target.shape) != expected:
        raise bad_param("target.shape", tuple(target.shape), f"{expected}")
    if weight is not None:
        weight = check_tensor("weight", weight, ndim=1, device=logits.device)
        if weight.shape[0] != logits.shape[1]:
            raise bad_param("weight.shape", tuple(weight.shape), f"({logits.shape[1]},)")
        weight = weight.float().contiguous()
    if reduction not in REDUCTIONS:
        raise bad_param("reduction", reduction, f"one of {REDUCTIONS}")
    if not isinstance(ignore_index, int) or isinstance(ignore_index, bool):
        raise bad_param("ignore_index", ignore_index, "an int")
    if (
        not isinstance(label_smoothing, (int, float))
        or isinstance(label_smoothing, bool)
        or not 0.0 <= label_smoothing <= 1.0
    ):
        raise bad_param("label_smoothing", label_smoothing, "a number in [0, 1]")
    check_runnable(logits.device)
    _check_classes(target, logits.shape[1], ignore_index)
    return logits, weight


def _check_classes(target: torch.Tensor, classes: int, ignore_index: int) -> None:
    """Every target is a class index in [0, classes) or ignore_index. On a GPU this waits for
    the targets (one synchronization): an error must reach the caller before the loss does."""
    bad = ((target < 0) | (target >= classes)) & (target != ignore_index)
    if bad.any():
        value = int(target[bad][0])
        raise bad_param(
            "target", value, f"class indices in [0, {classes}) or ignore_index={ignore_index}"
        )


def cross_entropy_forward(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, lse, w_t): the loss (a 0-d tensor, or per element for "none", in logits' dtype)
    and what the backward needs per row: log-sum-exp and the target's weight (float32)."""
    logits, weight = _check(logits, target, weight, reduction, label_smoothing, ignore_index)
    x = _rows(logits)
    t = target.reshape(-1).contiguous()
    rows, classes = x.shape
    loss = torch.empty(rows, dtype=torch.float32, device=x.device)
    lse = torch.empty_like(loss)
    w_t = torch.empty_like(loss)
    if rows == 0:
        if reduction == "none":
            return loss.view(target.shape).to(logits.dtype), lse, w_t
        empty_value = float("nan") if reduction == "mean" else 0.0
        return torch.full((), empty_value, dtype=logits.dtype, device=x.device), lse, w_t
    cross_entropy_fwd_kernel[(rows,)](
        x, t, weight if weight is not None else loss, loss, lse, w_t, classes, x.stride(0),
        x.stride(1), ignore_index, float(label_smoothing), HAS_WEIGHT=weight is not None,
        BLOCK=min(_BLOCK, max(16, 1 << (classes - 1).bit_length())),
    )  # fmt: skip
    if reduction == "none":
        return loss.view(target.shape).to(logits.dtype), lse, w_t
    total = torch.empty(2, dtype=torch.float32, device=x.device)
    sum_kernel[(1,)](loss, total, rows, BLOCK=_BLOCK)
    if reduction == "mean":
        sum_kernel[(1,)](w_t, total[1:], rows, BLOCK=_BLOCK)
        total[0] = total[0] / total[1]
    return total[0].to(logits.dtype), lse, w_t


def cross_entropy_backward(
    grad: torch.Tensor,
    logits: torch.Tensor,
    target: torch.Tensor,
    lse: torch.Tensor,
    w_t: torch.Tensor,
    weight: torch.Tensor | None = None,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
) -> torch.Tensor:
    """d loss / d logits, in logits' shape, dtype and (when it is a view) layout."""
    logits, weight = _check(logits, target, weight, reduction, label_smoothing, ignore_index)
    x = _rows(logits)
    t = target.reshape(-1).contiguous()
    rows, classes = x.shape
    dx = torch.empty_like(x)
    if rows == 0:
        return torch.empty_like(logits)
    g = grad.reshape(-1).float().contiguous()
    g_stride = 1 if reduction == "none" else 0
    if reduction == "mean":
        total = torch.empty(1, dtype=torch.float32, device=x.device)
        sum_kernel[(1,)](w_t, total, rows, BLOCK=_BLOCK)
        g = g / total
    cross_entropy_bwd_kernel[(rows,)](
        x, t, weight if weight is not None else lse, lse, w_t, g, dx, classes, x.stride(0),
        x.stride(1), dx.stride(0), dx.stride(1), g_stride, ignore_index,
        float(label_smoothing), HAS_WEIGHT=weight is not None,
        BLOCK=min(_BLOCK, max(16, 1 << (classes - 1).bit_length())),
    )  # fmt: skip
    if logits.dim() == 2:
        return dx
    n, c, *spatial = logits.shape
    return dx.view(n, *spatial, c).movedim(-1, 1)


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
) -> torch.Tensor:
    """The cross-entropy loss of `logits` against class indices `target` (see module doc)."""
    loss, _, _ = cross_entropy_forward(
        logits, target, weight, ignore_index=ignore_index, label_smoothing=label_smoothing,
        reduction=reduction,
    )  # fmt: skip
    return loss
