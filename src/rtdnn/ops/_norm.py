"""Checks, views and the call cache shared by the normalization families.

Every public function validates all of its arguments before any kernel runs. What depends only
on the tensors' shapes, strides, dtypes and devices (and on flags such as the mode) is checked
once per call signature (core.prepared): the prepared call, which holds the engine's plan, is
kept in `engine.cache`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..core import (
    bad_param,
    check_out,
    check_runnable,
    check_tensor,
    empty_like_layout,
)
from ..kernels.norm_addressing import ACTIVATIONS
from ._common import check_real


def eps(v: object) -> float:
    """The variance epsilon: finite and > 0 (eps = 0 divides by zero on a constant group)."""
    v = check_real("eps", v)
    if not v > 0:
        raise bad_param("eps", v, "a finite real number > 0")
    return v


def momentum(v: object) -> float:
    """The running statistics' exponential average factor, in [0, 1]."""
    v = check_real("momentum", v)
    if not 0.0 <= v <= 1.0:
        raise bad_param("momentum", v, "a factor in [0, 1]")
    return v


def activation(v: object) -> str:
    if v not in ACTIVATIONS:
        raise bad_param("activation", v, f"one of {ACTIVATIONS}")
    return v


def like(name: str, t: object, x: torch.Tensor) -> torch.Tensor:
    """A tensor with x's shape, dtype and device (any strides)."""
    t = check_tensor(name, t, dtype=x.dtype, device=x.device, empty=True)
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
    t = check_tensor(name, t, device=x.device, empty=True)
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


def contiguous(t: torch.Tensor | None) -> torch.Tensor | None:
    # is_contiguous() is a plain attribute read; contiguous() goes through the dispatcher
    # even when it returns t itself, and these run for every parameter on every call.
    return t if t is None or t.is_contiguous() else t.contiguous()


def float_contiguous(t: torch.Tensor) -> torch.Tensor:
    """t as contiguous float32 (saved statistics usually are already)."""
    if t.dtype is torch.float32 and t.is_contiguous():
        return t
    return t.to(torch.float32).contiguous()


def zeros(shape, dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    """Parameter gradients summed over no elements (an empty batch)."""
    return torch.zeros(shape, dtype=dtype, device=like.device)


def empty(shape, strides, like: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(shape, strides, dtype=like.dtype, device=like.device)
