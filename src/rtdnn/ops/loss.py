"""Cross-entropy loss with the log-softmax fused in (forward and backward).

Semantics are torch.nn.functional.cross_entropy's with class-index targets: logits (N, C),
(N, C, *spatial) or unbatched (C,), with any strides; target (N,), (N, *spatial) or 0-d
(for (C,) logits) int64; optional class weights
(C,), ignore_index, label_smoothing, reduction "mean" (divided by the summed weights of the
targets that are not ignored), "sum" or "none". With no rows (N = 0 or an empty spatial dim)
the loss is torch's: NaN for "mean" (0 / 0), 0 for "sum", empty for "none".

A target outside [0, C) that is not ignore_index raises BadParamError, as torch raises. The check
runs on the host before any launch: one pass over the targets and, on a GPU, one
device-to-host synchronization per forward call. The backward called by autograd skips it
(check_targets=False: its forward checked the same targets), so a training step synchronizes
once. Under CUDA graph capture, where a synchronization is illegal, the check is skipped: the
kernels never read out of bounds anyway and give an out-of-range row a NaN loss and gradient,
so the result cannot be a plausible number.
"""

from __future__ import annotations

import torch

from ..core import bad_param, check_runnable, check_tensor
from ..kernels.cross_entropy import cross_entropy_bwd_kernel, cross_entropy_fwd_kernel, sum_kernel
from ..kernels.launch import launch_cached
from ._common import check_real

REDUCTIONS = ("mean", "sum", "none")
_BLOCK = 1024


def _rows(logits: torch.Tensor) -> torch.Tensor:
    """(N, C, *S) or (C,) -> (rows, C) with the class dim last; a view when the layout allows."""
    if logits.dim() == 2:
        return logits
    if logits.dim() == 1:  # unbatched: one row
        return logits.unsqueeze(0)
    return logits.movedim(1, -1).reshape(-1, logits.shape[1])


def _check(logits, target, weight, reduction, label_smoothing, ignore_index, check_targets=True):
    logits = check_tensor("logits", logits, ndim=tuple(range(1, 6)), empty=True)
    class_dim = 0 if logits.dim() == 1 else 1
    classes = logits.shape[class_dim]
    if classes == 0:
        raise bad_param(
            "logits.shape", tuple(logits.shape), f"at least one class (dim {class_dim})"
        )
    if not isinstance(target, torch.Tensor) or target.dtype != torch.int64:
        raise bad_param("target.dtype", getattr(target, "dtype", type(target).__name__), "int64")
    if target.device != logits.device:
        raise bad_param("target.device", target.device, f"{logits.device}")
    expected = () if logits.dim() == 1 else (logits.shape[0], *logits.shape[2:])
    if tuple(target.shape) != expected:
        raise bad_param("target.shape", tuple(target.shape), f"{expected}")
    if weight is not None:
        weight = check_tensor("weight", weight, ndim=1, device=logits.device)
        if weight.shape[0] != classes:
            raise bad_param("weight.shape", tuple(weight.shape), f"({classes},)")
        weight = weight.float().contiguous()
    if reduction not in REDUCTIONS:
        raise bad_param("reduction", reduction, f"one of {REDUCTIONS}")
    if not isinstance(ignore_index, int) or isinstance(ignore_index, bool):
        raise bad_param("ignore_index", ignore_index, "an int")
    if not 0.0 <= check_real("label_smoothing", label_smoothing) <= 1.0:
        raise bad_param("label_smoothing", label_smoothing, "a number in [0, 1]")
    check_runnable(logits.device)
    if check_targets:
        _check_classes(target, classes, ignore_index)
    return logits, weight


def _check_classes(target: torch.Tensor, classes: int, ignore_index: int) -> None:
    """Every target is a class index in [0, classes) or ignore_index. On a GPU this waits for
    the targets (one synchronization): an error must reach the caller before the loss does.
    Skipped while a CUDA graph is being captured, where waiting is illegal (the kernels give
    such rows NaN, see the module doc)."""
    if target.is_cuda and torch.cuda.is_current_stream_capturing():
        return
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
    launch_cached(
        cross_entropy_fwd_kernel, (rows,),
        dict(X=x, T=t, W=weight if weight is not None else loss, LOSS=loss, LSE=lse, WT=w_t,
             eps=float(label_smoothing)),
        C=classes, stride_row=x.stride(0), stride_class=x.stride(1), ignore_index=ignore_index,
        HAS_WEIGHT=weight is not None, BLOCK=_block(classes),
    )  # fmt: skip
    if reduction == "none":
        return loss.view(target.shape).to(logits.dtype), lse, w_t
    total = torch.empty(2, dtype=torch.float32, device=x.device)
    _sum(loss, total, rows)
    if reduction == "mean":
        _sum(w_t, total[1:], rows)
        total[0] = total[0] / total[1]
    return total[0].to(logits.dtype), lse, w_t


def _block(classes: int) -> int:
    """The kernels' tile of classes: the classes rounded up to a power of two, 16 to _BLOCK."""
    return min(_BLOCK, max(16, 1 << (classes - 1).bit_length()))


def _sum(values: torch.Tensor, out: torch.Tensor, n: int) -> None:
    """out[0] = the sum of values[:n] (float32), in a fixed order."""
    launch_cached(sum_kernel, (1,), dict(V=values, OUT=out), n=n, BLOCK=_BLOCK)


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
    check_targets: bool = True,
) -> torch.Tensor:
    """d loss / d logits, in logits' shape, dtype and (when it is a view) layout.

    grad: the loss's gradient (its shape: 0-d, or target's shape for "none"); lse and w_t as
    cross_entropy_forward returned them. check_targets=False skips the host check of the
    targets (and its synchronization on a GPU) when the forward checked the same targets.
    """
    logits, weight = _check(
        logits, target, weight, reduction, label_smoothing, ignore_index, check_targets
    )
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
        _sum(w_t, total, rows)
        g = g / total
    launch_cached(
        cross_entropy_bwd_kernel, (rows,),
        dict(X=x, T=t, W=weight if weight is not None else lse, LSE=lse, WT=w_t, G=g, DX=dx,
             eps=float(label_smoothing)),
        C=classes, stride_row=x.stride(0), stride_class=x.stride(1), dstride_row=dx.stride(0),
        dstride_class=dx.stride(1), g_stride=g_stride, ignore_index=ignore_index,
        HAS_WEIGHT=weight is not None, BLOCK=_block(classes),
    )  # fmt: skip
    if logits.dim() == 2:
        return dx
    if logits.dim() == 1:
        return dx[0]
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
