"""Checks and helpers shared by the memory-bound primitive families (convolution uses only
`finish_empty`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

from ..core import (
    NotSupportedError,
    bad_param,
    cached_call,
    check_no_overlap,
    check_out,
    check_runnable,
    check_scaling,
    empty_like_layout,
)
from ..core.tensor import MAX_ELEMENTS, memory_span
from ..kernels import elementwise as ew


def span(t: torch.Tensor) -> int:
    """Elements between the lowest and highest address the tensor touches, plus one."""
    return cached_call(memory_span, t.shape, t.stride())


def check_span(name: str, t: torch.Tensor) -> None:
    """Kernels address memory with int32 offsets from the data pointer."""
    if span(t) > MAX_ELEMENTS:
        raise NotSupportedError(
            f"{name} spans {span(t)} elements in memory: views spanning 2**31 or more "
            "elements are not supported"
        )


def check_real(name: str, v: object, *, finite: bool = True) -> float:
    """A real number; finite unless finite=False (a NaN or infinite coefficient or scale
    would silently turn the whole result into NaN or inf)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise bad_param(name, v, "a real number")
    if finite and not math.isfinite(v):
        raise bad_param(name, v, "a finite real number")
    return float(v)


def output(
    out: torch.Tensor | None,
    shape: Sequence[int],
    like: torch.Tensor,
    alpha: float,
    beta: float,
    *,
    reads: Iterable[tuple[str, torch.Tensor | None]],
    in_place_ok: bool = False,
    preserve_strides: bool = False,
) -> torch.Tensor:
    """Validate alpha, beta and `out`, or allocate the result in `like`'s memory format.

    reads: the (name, tensor) inputs the op reads, which `out` must not overlap;
    in_place_ok: the op is elementwise, so `out` may be exactly one of them (see
    core.check_no_overlap). preserve_strides: allocate with torch.empty_like's rule (same
    strides as a dense `like`), which keeps elementwise ops on any dense layout a single flat
    pass.
    """
    check_scaling(alpha, beta, out)
    if out is None:
        check_runnable(like.device)
        if preserve_strides and tuple(shape) == tuple(like.shape):
            return torch.empty_like(like)
        return empty_like_layout(shape, like)
    check_out(out, shape, like)
    check_no_overlap(out, reads, same_index_ok=in_place_ok)
    check_span("out", out)
    check_runnable(like.device)
    return out


def int_tuple(name: str, value, n: int, *, minimum: int) -> tuple[int, ...]:
    """An int or a sequence of n ints, each >= minimum."""
    if isinstance(value, bool):
        raise bad_param(name, value, f"an int or a sequence of {n} ints >= {minimum}")
    if isinstance(value, int):
        t = (value,) * n
    else:
        try:
            t = tuple(value)
        except TypeError:
            raise bad_param(name, value, f"an int or a sequence of {n} ints") from None
        if len(t) == 1 and n > 1:
            t = t * n
        if len(t) != n or not all(isinstance(v, int) and not isinstance(v, bool) for v in t):
            raise bad_param(name, value, f"an int or a sequence of {n} ints")
    if any(v < minimum for v in t):
        raise bad_param(name, value, f"every entry >= {minimum}")
    return t


def spatial5(shape: Sequence[int], strides: Sequence[int]) -> tuple[tuple, tuple]:
    """(N, C, *S) with 1 to 3 spatial dims as (N, C, D, H, W): missing leading spatial dims get
    size 1 and stride 0, which Triton folds away at compile time."""
    pad = 5 - len(shape)
    return (
        (*shape[:2], *(1,) * pad, *shape[2:]),
        (*strides[:2], *(0,) * pad, *strides[2:]),
    )


def elementwise_plan(
    shape, out: torch.Tensor, inputs: list[torch.Tensor], *, index: bool = False
) -> ew.EwPlan:
    """Tile an elementwise op over `shape`; NotSupportedError if the operands' strides leave
    more dims than the kernel addresses after merging contiguous ones."""
    elem = max(t.element_size() for t in (out, *inputs))
    strides = tuple(t.stride() for t in inputs)
    p = ew.plan(tuple(shape), out.stride(), strides, index=index, elem_bytes=elem)
    if p is None:
        raise NotSupportedError(
            f"shape {tuple(shape)} with these strides leaves more than {ew.MAX_DIMS} dims after "
            "merging contiguous ones: make the operands contiguous first"
        )
    return p


def check_batch(name: str, t: torch.Tensor) -> torch.Tensor:
    """For ops on (N, C, *S) that take a batch of N = 0 (as torch does) but no other empty dim."""
    if any(s == 0 for s in t.shape[1:]):
        raise bad_param(f"{name}.shape", tuple(t.shape), "no zero-sized dim but the batch (dim 0)")
    return t


def finish_empty(result: torch.Tensor, beta: float) -> torch.Tensor:
    """The result of an op whose input has no elements, computed without a kernel launch.

    An empty result needs nothing. A non-empty one holds sums over the empty dims (a filter or
    bias gradient, a batch's statistics), which are 0: result = alpha * 0 + beta * result.
    """
    if result.numel():
        if beta == 0:
            result.zero_()  # not beta * result: a NaN in an unused `out` must not survive
        else:
            result.mul_(beta)
    return result
