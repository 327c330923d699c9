"""Pooling (max, average) and adaptive average pooling as custom ops with autograd."""

from __future__ import annotations

from torch import Tensor

from .. import ops
from ..core import empty_like_layout
from ..ops.pooling import IntOrSeq
from ._custom_op import check_differentiable, custom_op, public, records_grad


def _pool_out_shape(x, mode, window, stride, padding, dilation, ceil_mode):
    p = ops.pooling.pool_desc(x.dim(), mode, window, stride, padding, dilation, ceil_mode)
    return (*x.shape[:2], *ops.pooling.pool_output_size(x.shape[2:], p))


@custom_op("rtdnn::pooling_forward")
def pooling_forward(
    x: Tensor,
    mode: str,
    window: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    ceil_mode: bool,
    alpha: float = 1.0,
) -> Tensor:
    return ops.pooling_forward(
        x, mode, window, stride=stride, padding=padding, dilation=dilation, ceil_mode=ceil_mode,
        alpha=alpha,
    )  # fmt: skip


@pooling_forward.register_fake
def _(x, mode, window, stride, padding, dilation, ceil_mode, alpha=1.0):
    return empty_like_layout(
        _pool_out_shape(x, mode, window, stride, padding, dilation, ceil_mode), x
    )


@custom_op("rtdnn::pooling_backward")
def pooling_backward(
    dy: Tensor,
    x: Tensor,
    mode: str,
    window: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    ceil_mode: bool,
    alpha: float = 1.0,
) -> Tensor:
    return ops.pooling_backward(
        dy, x, None, mode, window, stride=stride, padding=padding, dilation=dilation,
        ceil_mode=ceil_mode, alpha=alpha,
    )  # fmt: skip


@pooling_backward.register_fake
def _(dy, x, mode, window, stride, padding, dilation, ceil_mode, alpha=1.0):
    return empty_like_layout(x.shape, x)


def _pool_setup(ctx, inputs, output):
    x, *args = inputs  # the backward op takes the same arguments (alpha included, if given)
    ctx.save_for_backward(x)
    ctx.args = args


def _pool_backward(ctx, dy):
    (x,) = ctx.saved_tensors
    dx = pooling_backward(dy, x, *ctx.args) if ctx.needs_input_grad[0] else None
    return dx, None, None, None, None, None, None, None


pooling_forward.register_autograd(_pool_backward, setup_context=_pool_setup)


@custom_op("rtdnn::adaptive_avg_pool")
def adaptive_avg_pool(x: Tensor, output_size: list[int], alpha: float = 1.0) -> Tensor:
    return ops.adaptive_avg_pool(x, output_size, alpha=alpha)


@adaptive_avg_pool.register_fake
def _(x, output_size, alpha=1.0):
    return empty_like_layout((*x.shape[:2], *output_size), x)


@custom_op("rtdnn::adaptive_avg_pool_backward")
def adaptive_avg_pool_backward(dy: Tensor, x_shape: list[int], alpha: float = 1.0) -> Tensor:
    return ops.adaptive_avg_pool_backward(dy, x_shape, alpha=alpha)


@adaptive_avg_pool_backward.register_fake
def _(dy, x_shape, alpha=1.0):
    return empty_like_layout(x_shape, dy)


def _adaptive_setup(ctx, inputs, output):
    x, _size, *alpha = inputs  # the eager road may leave alpha out
    ctx.x_shape = list(x.shape)
    ctx.alpha = alpha[0] if alpha else 1.0


def _adaptive_backward(ctx, dy):
    return adaptive_avg_pool_backward(dy, ctx.x_shape, ctx.alpha), None, None


adaptive_avg_pool.register_autograd(_adaptive_backward, setup_context=_adaptive_setup)


@public(ops.pooling_forward)
def pooling_forward_api(
    x: Tensor,
    mode: str,
    window: IntOrSeq,
    *,
    stride: IntOrSeq | None = None,
    padding: IntOrSeq = 0,
    dilation: IntOrSeq = 1,
    ceil_mode: bool = False,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Tensor | None = None,
) -> Tensor:
    if not records_grad(x):
        return ops.pooling_forward(
            x, mode, window, stride=stride, padding=padding, dilation=dilation,
            ceil_mode=ceil_mode, alpha=alpha, beta=beta, out=out,
        )  # fmt: skip
    check_differentiable("pooling_forward", alpha, beta, out)
    p = ops.pooling.pool_desc(x.dim(), mode, window, stride, padding, dilation, ceil_mode)
    return pooling_forward(
        x, mode, list(p.window), list(p.stride), list(p.padding), list(p.dilation), ceil_mode,
        float(alpha),
    )  # fmt: skip


@public(ops.adaptive_avg_pool)
def adaptive_avg_pool_api(
    x: Tensor,
    output_size: IntOrSeq,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    out: Tensor | None = None,
) -> Tensor:
    if not records_grad(x):
        return ops.adaptive_avg_pool(x, output_size, alpha=alpha, beta=beta, out=out)
    check_differentiable("adaptive_avg_pool", alpha, beta, out)
    size = ops.pooling.adaptive_size(x, output_size)  # None entries keep that dim
    return adaptive_avg_pool(x, list(size), float(alpha))
