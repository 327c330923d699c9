"""Tensor ops (op_tensor, reduce_tensor, transform_tensor) as custom ops with autograd."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .. import ops
from ..core import bad_param, empty_like_layout
from ..core import channels_last as _channels_last
from ._custom_op import (
    _like,
    check_differentiable,
    custom_op,
    in_place_error,
    public,
    records_grad,
    scaled,
)


@custom_op("rtdnn::op_tensor")
def op_tensor(a: Tensor, b: Tensor | None, op: str, alpha1: float, alpha2: float) -> Tensor:
    return ops.op_tensor(a, b, op, alpha1=alpha1, alpha2=alpha2)


@op_tensor.register_fake
def _(a, b, op, alpha1, alpha2):
    return _like(a)


def _sum_to(g: Tensor, shape) -> Tensor:
    """Undo broadcasting: sum g over the dims that were broadcast to reach g's shape."""
    shape = tuple(shape)
    lead = g.dim() - len(shape)
    dims = [d for d in range(g.dim()) if d < lead or (shape[d - lead] == 1 and g.shape[d] != 1)]
    if dims:
        g = reduce_tensor(g, "add", dims)
        g = g.reshape(g.shape[lead:]) if lead else g
    return g


def _op_setup(ctx, inputs, output):
    a, b, op, alpha1, alpha2 = inputs
    ctx.save_for_backward(a, b, output)
    ctx.op, ctx.alpha1, ctx.alpha2 = op, alpha1, alpha2


def _op_backward(ctx, g):
    # Composed from rtdnn ops; min/max split ties evenly, as torch.minimum/maximum do.
    a, b, y = ctx.saved_tensors
    op, a1, a2 = ctx.op, ctx.alpha1, ctx.alpha2
    da = db = None
    if op == "add":
        da = op_tensor(g, g, "add", a1, 0.0)  # a1 * g
        db = _sum_to(op_tensor(g, g, "add", a2, 0.0), b.shape)
    elif op == "mul":
        da = op_tensor(g, b.expand(a.shape), "mul", a1 * a2, 1.0)
        db = _sum_to(op_tensor(g, a, "mul", a1 * a2, 1.0), b.shape)
    elif op in ("min", "max"):
        ua = a * a1
        vb = b.expand(a.shape) * a2
        tie = (ua == vb).to(g.dtype)
        win_a = ((ua > vb) if op == "max" else (ua < vb)).to(g.dtype) + 0.5 * tie
        da = g * win_a * a1
        db = _sum_to(g * (1 - win_a) * a2, b.shape)
    elif op == "sqrt":
        da = g * (0.5 * a1) / y
    elif op == "not":
        da = op_tensor(g, g, "add", -a1, 0.0)
    return da, db, None, None, None


op_tensor.register_autograd(_op_backward, setup_context=_op_setup)


@custom_op("rtdnn::reduce_tensor")
def reduce_tensor(x: Tensor, op: str, dims: list[int], alpha: float = 1.0) -> Tensor:
    """Values only, keepdim (reduced dims of size 1); alpha scales them in float32 inside the
    kernel, as the plain call does."""
    return ops.reduce_tensor(x, op, dims, alpha=alpha)


@reduce_tensor.register_fake
def _(x, op, dims, alpha=1.0):
    nd = x.dim()
    red = {d % nd for d in dims} if dims else set(range(nd))
    return empty_like_layout(tuple(1 if d in red else s for d, s in enumerate(x.shape)), x)


def _reduce_setup(ctx, inputs, output):
    x, op, dims, *alpha = inputs  # the eager road may leave alpha out
    ctx.alpha = alpha[0] if alpha else 1.0
    # The formulas read the unscaled y: with alpha != 1 the backward recomputes it from x (one
    # more pass) rather than divide by alpha (inexact).
    ctx.save_for_backward(x, output if ctx.alpha == 1 else None)
    ctx.op = op
    nd = x.dim()
    ctx.red = sorted({d % nd for d in dims} if dims else range(nd))


def _reduce_backward(ctx, g):
    # The gradient of a reduction is a broadcast of g times a local factor, in torch ops.
    x, y = ctx.saved_tensors
    op = ctx.op
    if ctx.alpha != 1:
        y = reduce_tensor(x, op, ctx.red) if op in ("mul", "min", "max", "amax", "norm2") else None
        g = g * ctx.alpha
    count = 1
    for d in ctx.red:
        count *= x.shape[d]
    if op == "add":
        dx = g.expand(x.shape)
    elif op == "avg":
        dx = g.expand(x.shape) / count
    elif op == "mul":
        dx = _prod_backward(g, x, y, ctx.red)
    elif op in ("min", "max"):
        hit = (x == y).to(g.dtype)
        dx = g * hit / reduce_tensor(hit, "add", ctx.red)
    elif op == "amax":
        hit = (x.abs() == y).to(g.dtype)
        dx = g * hit * torch.sign(x) / reduce_tensor(hit, "add", ctx.red)
    elif op == "norm1":
        dx = g * torch.sign(x)
    else:  # norm2; an all-zero slice has gradient 0 there (as torch's norm), not 0 / 0
        dx = torch.where(y == 0, torch.zeros((), dtype=g.dtype, device=g.device), g * x / y)
    return dx.contiguous(memory_format=_fmt(x)), None, None, None


def _prod_backward(g: Tensor, x: Tensor, y: Tensor, red: list[int]) -> Tensor:
    """d prod / dx as torch's prod: g * y / x in a slice with no zero; in a slice with one zero
    that element takes g * (product of the others) and the others 0; with more zeros, all 0."""
    zero = x == 0
    one = torch.ones((), dtype=x.dtype, device=x.device)
    nonzero = torch.where(zero, one, x)  # x with its zeros as ones, so nothing divides by 0
    zeros = reduce_tensor(zero.to(g.dtype), "add", red)
    others = reduce_tensor(nonzero, "mul", red)  # the product of the nonzero elements
    none = torch.zeros((), dtype=g.dtype, device=g.device)
    return torch.where(
        zeros == 0, g * y / nonzero, torch.where(zero & (zeros == 1), g * others, none)
    )


def _fmt(x: Tensor):
    if _channels_last(x):
        return torch.channels_last if x.dim() == 4 else torch.channels_last_3d
    return torch.contiguous_format


reduce_tensor.register_autograd(_reduce_backward, setup_context=_reduce_setup)


@custom_op("rtdnn::transform_tensor")
def transform_tensor(
    x: Tensor, dtype: torch.dtype, channels_last: bool, alpha: float = 1.0
) -> Tensor:
    """alpha * x copied into dtype (scaled in float32, then rounded once, as the plain call), in
    channels-last (4-d / 5-d) or contiguous layout."""
    return ops.transform_tensor(
        x, dtype=dtype, memory_format=_target_format(x, channels_last), alpha=alpha
    )


def _target_format(x: Tensor, channels_last: bool):
    if not channels_last:
        return torch.contiguous_format
    return torch.channels_last if x.dim() == 4 else torch.channels_last_3d


@transform_tensor.register_fake
def _(x, dtype, channels_last, alpha=1.0):
    return torch.empty_like(x, dtype=dtype, memory_format=_target_format(x, channels_last))


def _transform_setup(ctx, inputs, output):
    x, _dtype, _cl, *alpha = inputs  # the eager road may leave alpha out
    ctx.dtype = x.dtype
    ctx.cl = _channels_last(x)
    ctx.alpha = alpha[0] if alpha else 1.0


def _transform_backward(ctx, g):
    return transform_tensor(g, ctx.dtype, ctx.cl, ctx.alpha), None, None, None


transform_tensor.register_autograd(_transform_backward, setup_context=_transform_setup)


@public(ops.op_tensor)
def op_tensor_api(
    a: Tensor,
    b: Tensor | None,
    op: str,
    *,
    alpha1: float = 1.0,
    alpha2: float = 1.0,
    beta: float = 0.0,
    out: Tensor | None = None,
) -> Tensor:
    if not records_grad(a, b):
        return ops.op_tensor(a, b, op, alpha1=alpha1, alpha2=alpha2, beta=beta, out=out)
    check_differentiable("op_tensor", 1.0, beta, out)
    return op_tensor(a, b, op, alpha1, alpha2)


@public(ops.reduce_tensor)
def reduce_tensor_api(
    x: Tensor,
    op: str,
    dims: int | Sequence[int] | None = None,
    *,
    keepdim: bool = True,
    indices: bool = False,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Tensor | None = None,
):
    if not records_grad(x):
        return ops.reduce_tensor(
            x, op, dims, keepdim=keepdim, indices=indices, alpha=alpha, beta=beta, out=out
        )
    check_differentiable("reduce_tensor", alpha, beta, out)
    reduced = ops.tensor_ops.reduce_dims(dims, x.dim())  # the plain checks; sorted dims
    idx = None
    if indices is False:
        y = reduce_tensor(x, op, list(reduced), float(alpha))
    else:
        # As torch.max(x, dim): the gradient goes to the chosen element only (ties too), so the
        # values are the elements the plain op's indices pick.
        _, idx = ops.reduce_tensor(x.detach(), op, reduced, indices=indices)
        # The picked values are x's elements, exact: scaling them rounds once, as the kernel.
        y = scaled(_picked(x, idx, reduced, op), alpha)
    if not keepdim:
        y = y.squeeze(reduced)
        idx = idx.squeeze(reduced) if idx is not None else None
    return y if idx is None else (y, idx)


def _picked(x: Tensor, idx: Tensor, reduced: tuple[int, ...], op: str) -> Tensor:
    """x's elements at idx (the flat positions within the reduced dims, keepdim shape), |x| for
    amax, differentiable, in the plain op's layout."""
    kept = [d for d in range(x.dim()) if d not in reduced]
    perm = [*kept, *reduced]
    lead = [x.shape[d] for d in kept]
    v = x.permute(perm).reshape(*lead, -1).gather(-1, idx.permute(perm).reshape(*lead, 1))
    v = v.reshape([idx.shape[d] for d in perm]).permute(
        sorted(range(x.dim()), key=perm.__getitem__)
    )
    v = v.abs() if op == "amax" else v
    return empty_like_layout(v.shape, x).copy_(v)


@public(ops.transform_tensor)
def transform_tensor_api(
    x: Tensor,
    *,
    out: Tensor | None = None,
    dtype: torch.dtype | None = None,
    memory_format: torch.memory_format = torch.preserve_format,
    alpha: float = 1.0,
    beta: float = 0.0,
) -> Tensor:
    if not records_grad(x):
        return ops.transform_tensor(
            x, out=out, dtype=dtype, memory_format=memory_format, alpha=alpha, beta=beta
        )
    check_differentiable("transform_tensor", alpha, beta, out)
    cl_format = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
    if memory_format == torch.preserve_format:
        # x's layout when it is contiguous or channels-last; other layouts come back contiguous.
        channels_last = _channels_last(x)
    elif memory_format in (torch.contiguous_format, cl_format):
        channels_last = memory_format == cl_format
    else:
        raise bad_param(
            "memory_format", memory_format,
            f"preserve_format, contiguous_format or {cl_format} for a {x.dim()}-d x",
        )  # fmt: skip
    return transform_tensor(x, x.dtype if dtype is None else dtype, channels_last, float(alpha))


@public(ops.add_tensor, in_place=True)
def add_tensor_api(a: Tensor, c: Tensor, *, alpha: float = 1.0, beta: float = 1.0) -> Tensor:
    if records_grad(a, c):
        raise in_place_error("add_tensor", "c")
    return ops.add_tensor(a, c, alpha=alpha, beta=beta)


@public(ops.scale_tensor, in_place=True)
def scale_tensor_api(y: Tensor, alpha: float) -> Tensor:
    if records_grad(y):
        raise in_place_error("scale_tensor", "y")
    return ops.scale_tensor(y, alpha)


@public(ops.set_tensor, in_place=True)
def set_tensor_api(y: Tensor, value: float) -> Tensor:
    if records_grad(y):
        raise in_place_error("set_tensor", "y")
    return ops.set_tensor(y, value)
