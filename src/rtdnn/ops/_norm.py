"""Checks and views shared by the normalization families (batch, layer, RMS, group, instance).

Every public function validates all of its arguments with these before any kernel runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..core import bad_param, check_out, check_runnable, check_tensor, empty_like_layout
from ..kernels.norm_addressing import ACTIVATIONS


def real(name: str, v: object, *, minimum: float | None = None) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        raise bad_param(name, v, "a finite real number")
    if minimum is not None and v < minimum:
        raise bad_param(name, v, f"a real number >= {minimum}")
    return float(v)


def activation(v: object) -> str:
    if v not in ACTIVATIONS:
        raise bad_param("activation", v, f"one of {ACTIVATIONS}")
    return v


def like(name: str, t: object, x: torch.Tensor) -> torch.Tensor:
    """A tensor with x's shape, dtype and device (any strides)."""
    t = check_tensor(name, t, dtype=x.dtype, device=x.device)
    if t.shape != x.shape:
        raise bad_param(f"{name}.shape", tuple(t.shape), f"{tuple(x.shape)}, the shape of x")
    return t


def param(name: str, t: object, shape: Sequence[int], x: torch.Tensor) -> torch.Tensor | None:
    """An optional per-channel (or per-element) parameter: any supported dtype, x's device,
    exactly `shape`. Returned contiguous (they are small), so weight and bias share strides."""
    if t is None:
        return None
    t = check_tensor(name, t, device=x.device)
    if tuple(t.shape) != tuple(shape):
        raise bad_param(f"{name}.shape", tuple(t.shape), f"{tuple(shape)}")
    return t.contiguous()


def stat(name: str, t: object, shape: Sequence[int], x: torch.Tensor) -> torch.Tensor:
    """Saved statistics for a backward pass: float32, contiguous, exactly `shape`."""
    t = check_tensor(name, t, device=x.device)
    if tuple(t.shape) != tuple(shape):
        raise bad_param(f"{name}.shape", tuple(t.shape), f"{tuple(shape)}")
    return t.to(torch.float32).contiguous()


def running(name: str, t: object, shape: Sequence[int], x: torch.Tensor) -> torch.Tensor:
    """Running statistics are updated in place, so they cannot be copied: contiguous only."""
    t = check_tensor(name, t, device=x.device)
    if tuple(t.shape) != tuple(shape):
        raise bad_param(f"{name}.shape", tuple(t.shape), f"{tuple(shape)}")
    if not t.is_contiguous():
        raise bad_param(f"{name}.stride()", t.stride(), "a contiguous tensor (updated in place)")
    return t


def output(out: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """`out` (checked) or a new tensor of x's shape in x's memory format."""
    if out is None:
        return empty_like_layout(x.shape, x)
    check_out(out, x.shape, x)
    return out


def ready(x: torch.Tensor) -> None:
    check_runnable(x.device)


def broadcast(t: torch.Tensor | None, dims: Sequence[int], shape: Sequence[int]):
    """View t (whose shape is [shape[d] for d in dims]) broadcast to `shape`: zero strides on
    every other dim. This is how kernels see weights, biases and statistics."""
    if t is None:
        return None
    view = [1] * len(shape)
    for d in dims:
        view[d] = shape[d]
    return t.view(view).expand(tuple(shape))


def grad_dtype(weight: torch.Tensor | None) -> torch.dtype:
    """Parameter gradients come in the weight's dtype, float32 without a weight."""
    return weight.dtype if weight is not None else torch.float32
