"""Tensor operations with cuDNN's semantics: the public functional API.

    add_tensor(a, c)              c = alpha * a + beta * c, a broadcast to c (a bias add)
    op_tensor(a, b, op)           out = op(alpha1 * a, alpha2 * b) + beta * out
    reduce_tensor(x, op, dims)    out = alpha * reduce(x over dims) + beta * out
    transform_tensor(x)           out = alpha * x + beta * out, into another layout or dtype
    scale_tensor(y, alpha)        y *= alpha, in place
    set_tensor(y, value)          y[...] = value, in place

Any shape and strides, float32 / float16 / bfloat16, float32 arithmetic. Broadcasting follows
torch's rule (trailing dims equal or 1), which includes cuDNN's (same rank, dims equal or 1).
Empty tensors give empty results without a kernel launch; a reduction over no elements is
torch's: 0 for add, norm1 and norm2, 1 for mul, NaN for avg, an error for min, max and amax.

`out` and the inputs: op_tensor's out may be exactly a or b, add_tensor's a may be exactly c,
transform_tensor's out may be exactly x (same dtype): elementwise, so in place is exact. Any
other overlap is refused (BadParamError), as is any overlap of reduce_tensor's out with x.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..algos.geometry import parallel_slots
from ..core import (
    SUPPORTED_DTYPES,
    BadParamError,
    NotSupportedError,
    bad_param,
    check_no_overlap,
    check_out,
    check_runnable,
    check_scaling,
    check_tensor,
    empty_like_layout,
)
from ..core.prepared import PreparedCalls, nonzero, signature
from ..core.tensor import _overlaps_itself as overlaps_itself
from ..kernels import elementwise as ew
from ..kernels import reduction as red
from ..kernels.tensor_ops import OP_TENSOR, UNARY
from ._common import check_real, check_span, elementwise_plan, output

OP_TENSOR_OPS = tuple(OP_TENSOR)
REDUCE_OPS = tuple(red.OPS)


def _broadcast(name: str, t: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """t expanded to `shape` (a view with stride 0 along broadcast dims)."""
    shape = tuple(shape)
    ok = t.dim() <= len(shape) and all(
        s in (1, n) for s, n in zip(reversed(t.shape), reversed(shape), strict=False)
    )
    if not ok:
        raise bad_param(f"{name}.shape", tuple(t.shape), f"broadcastable to {shape}")
    return t.expand(shape)


def _check_inplace(name: str, y: torch.Tensor) -> torch.Tensor:
    """A tensor written in place: like `out`, it must not overlap itself."""
    y = check_tensor(name, y, empty=True)
    if overlaps_itself(y):
        raise BadParamError(
            f"{name} has overlapping elements (a broadcast view): it cannot be written"
        )
    check_span(name, y)
    check_runnable(y.device)
    return y


def add_tensor(a: torch.Tensor, c: torch.Tensor, *, alpha: float = 1.0, beta: float = 1.0):
    """c = alpha * a + beta * c, in place; returns c.

    a: broadcastable to c's shape (e.g. a bias of shape (1, C, 1, 1) for c of (N, C, H, W)).
    """
    c = _check_inplace("c", c)
    a = check_tensor("a", a, dtype=c.dtype, device=c.device, empty=True)
    check_scaling(alpha, beta, c)
    a = _broadcast("a", a, c.shape)
    check_span("a", a)
    # c is read and written in place; a may be c itself (elementwise) but no other view of it.
    check_no_overlap(c, [("a", a)], same_index_ok=True, out_name="c")
    if c.numel() == 0:
        return c
    plan = elementwise_plan(c.shape, c, [a])
    ew.launch(ew.op_first, c, [a], plan, alpha=alpha, beta=beta)
    return c


def op_tensor(
    a: torch.Tensor,
    b: torch.Tensor | None,
    op: str,
    *,
    alpha1: float = 1.0,
    alpha2: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """out = op(alpha1 * a, alpha2 * b) + beta * out, of a's shape.

    op: "add", "mul", "min", "max" (b broadcast to a's shape), or the unary "sqrt"
    (sqrt(alpha1 * a)) and "not" (1 - alpha1 * a), which ignore b (it may be None).
    Returns a new tensor in a's layout, or `out`.
    """
    if op not in OP_TENSOR:
        raise bad_param("op", op, f"one of {OP_TENSOR_OPS}")
    a = check_tensor("a", a, empty=True)
    check_span("a", a)
    a1 = check_real("alpha1", alpha1)
    a2 = check_real("alpha2", alpha2)
    inputs = [a]
    if op not in UNARY:
        if b is None:
            raise bad_param("b", None, f"a tensor for op={op!r}")
        b = check_tensor("b", b, dtype=a.dtype, device=a.device, empty=True)
        b = _broadcast("b", b, a.shape)
        check_span("b", b)
        inputs.append(b)
    reads = [("a", a), ("b", b if op not in UNARY else None)]
    y = output(out, a.shape, a, 1.0, beta, reads=reads, in_place_ok=True, preserve_strides=True)
    if y.numel() == 0:
        return y
    plan = elementwise_plan(a.shape, y, inputs)
    ew.launch(OP_TENSOR[op], y, inputs, plan, alpha=1.0, beta=beta, p=(a1, a2, 0.0))
    return y


def scale_tensor(y: torch.Tensor, alpha: float) -> torch.Tensor:
    """y = alpha * y, in place; returns y."""
    y = _check_inplace("y", y)
    alpha = check_real("alpha", alpha)
    if y.numel() == 0:
        return y
    plan = elementwise_plan(y.shape, y, [y])
    ew.launch(ew.op_first, y, [y], plan, alpha=alpha)
    return y


def set_tensor(y: torch.Tensor, value: float) -> torch.Tensor:
    """Every element of y = value (rounded to y's dtype), in place; returns y."""
    y = _check_inplace("y", y)
    value = check_real("value", value, finite=False)  # a value to store, not a scale
    if y.numel() == 0:
        return y
    plan = elementwise_plan(y.shape, y, [])
    ew.launch(ew.op_fill, y, [], plan, p=(value, 0.0, 0.0))
    return y


_FORMATS = (torch.preserve_format, torch.contiguous_format, torch.channels_last,
            torch.channels_last_3d)  # fmt: skip


def transform_tensor(
    x: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
    memory_format: torch.memory_format = torch.preserve_format,
    alpha: float = 1.0,
    beta: float = 0.0,
) -> torch.Tensor:
    """out = alpha * x + beta * out: x copied into another layout and/or dtype.

    Without `out`, a new tensor of x's shape is made with `dtype` (default x's) and
    `memory_format` (torch.contiguous_format, channels_last, channels_last_3d, or
    preserve_format: x's strides if x is dense). With `out`, its shape must be x's; its dtype
    and strides are whatever it has (dtype and memory_format must then be left unset).
    """
    x = check_tensor("x", x, empty=True)
    check_span("x", x)
    check_scaling(alpha, beta, out)
    if memory_format not in _FORMATS:
        raise bad_param("memory_format", memory_format, f"one of {_FORMATS}")
    if out is None:
        dtype = x.dtype if dtype is None else dtype
        if dtype not in SUPPORTED_DTYPES:
            raise bad_param("dtype", dtype, "one of float32, float16, bfloat16")
        if memory_format == torch.channels_last and x.dim() != 4:
            raise bad_param("memory_format", memory_format, "channels_last needs a 4-d x")
        if memory_format == torch.channels_last_3d and x.dim() != 5:
            raise bad_param("memory_format", memory_format, "channels_last_3d needs a 5-d x")
        check_runnable(x.device)
        y = torch.empty_like(x, dtype=dtype, memory_format=memory_format)
    else:
        if dtype is not None:
            raise bad_param("dtype", dtype, "None when `out` is given (out sets the dtype)")
        if memory_format != torch.preserve_format:
            raise bad_param(
                "memory_format", memory_format, "unset when `out` is given (out sets the layout)"
            )
        out = check_tensor("out", out, device=x.device, empty=True)
        check_out(out, x.shape, out)
        check_no_overlap(out, [("x", x)], same_index_ok=True)
        check_span("out", out)
        check_runnable(x.device)
        y = out
    if y.numel() == 0:
        return y
    plan = elementwise_plan(x.shape, y, [x])
    ew.launch(ew.op_first, y, [x], plan, alpha=alpha, beta=beta)
    return y


#: Checked reduce_tensor signatures -> prepared calls (core.prepared).
_reduce_calls = PreparedCalls()


def reduce_dims(dims, nd: int) -> tuple[int, ...]:
    """reduce_tensor's dims argument checked against nd dims: sorted, wrapped, no repeats."""
    if dims is None:
        return tuple(range(nd))
    if isinstance(dims, int) and not isinstance(dims, bool):
        dims = (dims,)
    try:
        t = tuple(dims)
    except TypeError:
        raise bad_param("dims", dims, "None, an int or a sequence of ints") from None
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in t):
        raise bad_param("dims", dims, "None, an int or a sequence of ints")
    if not all(-nd <= d < nd for d in t):
        raise bad_param("dims", dims, f"dims in [-{nd}, {nd})")
    wrapped = tuple(sorted(d % nd for d in t))
    if len(set(wrapped)) != len(wrapped):
        raise bad_param("dims", dims, "no repeated dim")
    if not wrapped:
        raise bad_param("dims", dims, "at least one dim")
    return wrapped


def reduce_tensor(
    x: torch.Tensor,
    op: str,
    dims: int | Sequence[int] | None = None,
    *,
    keepdim: bool = True,
    indices: bool = False,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: torch.Tensor | None = None,
):
    """out = alpha * reduce_op(x over `dims`) + beta * out.

    op: "add", "mul", "min", "max", "amax" (max |x|), "avg", "norm1" (sum |x|), "norm2"
    (sqrt of sum x^2). dims: None (all), an int or a sequence of ints. The result has x's shape
    with the reduced dims of size 1 (cuDNN's convention); keepdim=False drops them. Accumulates
    in float32, result in x's dtype (a sum beyond a 16-bit dtype's range is inf, as in torch).
    With indices=True (min, max, amax only) returns (out, idx): idx (int64) is the flat
    position of the chosen element within the reduced dims, row-major in x's dim order; ties
    go to the first, NaN wins as in torch.max.
    """
    check_scaling(alpha, beta, out)
    key = signature("reduce", (x, out), op, dims, keepdim, indices, nonzero(beta))
    call = _reduce_calls.get(key, lambda: _reduce_call(x, op, dims, keepdim, indices, beta, out))
    if out is not None:
        check_no_overlap(out, [("x", x)])
    return call(x, out, alpha, beta)


def prepared_reduce(x: torch.Tensor, op: str, dims, keepdim: bool = True):
    """reduce_tensor's prepared call for x's signature with no `out` and no indices, made on
    first use: call(x, out=None, alpha, beta=0.0), for ops that reduce as one step of a
    prepared call of their own (a linear layer's bias gradient)."""
    key = signature("reduce", (x, None), op, dims, keepdim, False, nonzero(0.0))
    return _reduce_calls.get(key, lambda: _reduce_call(x, op, dims, keepdim, False, 0.0, None))


def _reduce_call(x, op, dims, keepdim, indices, beta, out):
    """reduce_tensor's arguments checked, its plan made: the call for this signature."""
    if op not in red.OPS:
        raise bad_param("op", op, f"one of {REDUCE_OPS}")
    x = check_tensor("x", x, empty=True)
    check_span("x", x)
    reduced = reduce_dims(dims, x.dim())
    if not isinstance(indices, bool):
        raise bad_param("indices", indices, "a bool")
    if indices and op not in red.INDEXED:
        raise bad_param("indices", indices, f"False for op={op!r} (indices: {red.INDEXED})")
    full = tuple(1 if d in reduced else s for d, s in enumerate(x.shape))
    shape = full if keepdim else tuple(s for d, s in enumerate(x.shape) if d not in reduced)
    if x.numel() == 0 and op in red.INDEXED and any(x.shape[d] == 0 for d in reduced):
        raise bad_param("x.shape", tuple(x.shape), f"no empty reduced dim for op={op!r}")
    y = output(out, shape, x, 0.0, beta, reads=[])

    def result(x, out):
        return out if out is not None else empty_like_layout(shape, x)

    if x.numel() == 0:
        return lambda x, out, alpha, beta: _reduce_empty(result(x, out), op, alpha, beta, indices)
    slots = 2 * parallel_slots(x.device.type)
    y_full = y.view(full)
    plan = red.plan_reduce(
        x.shape, x.stride(), y_full.stride(), reduced, slots=slots, elem_bytes=x.element_size()
    )
    if plan is None:
        raise NotSupportedError(
            "x's strides leave more than 4 kept or 4 reduced dims after merging contiguous "
            "ones: make x contiguous first"
        )
    # The kernel writes indices at out's offsets: they take out's strides.
    idx_strides = y_full.stride()
    run = red.reduce_launch(plan, op, indices, beta != 0)

    def call(x, out, alpha, beta):
        y = result(x, out)
        y_full = y.view(full) if not keepdim else y
        idx = None
        if indices:
            idx = torch.empty_strided(full, idx_strides, dtype=torch.int64, device=x.device)
        run(x, y_full, idx, alpha, beta)
        if not indices:
            return y
        return y, idx if keepdim else idx.view(shape)

    return call


def _reduce_empty(y: torch.Tensor, op: str, alpha: float, beta: float, indices: bool):
    """reduce_tensor over no elements (torch's values), without a kernel launch."""
    if y.numel():
        value = alpha * {"mul": 1.0, "avg": float("nan")}.get(op, 0.0)
        if beta == 0:
            y.fill_(value)
        else:
            y.mul_(beta).add_(value)
    if indices:  # only reached when y is empty (an empty kept dim)
        return y, torch.empty(y.shape, dtype=torch.int64, device=y.device)
    return y


__all__ = [
    "add_tensor",
    "op_tensor",
    "reduce_tensor",
    "scale_tensor",
    "set_tensor",
    "transform_tensor",
]
