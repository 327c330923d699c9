"""The spatial transformer (affine grid, grid sampler) as custom ops with autograd."""

from __future__ import annotations

import torch
from torch import Tensor

from ..core import check_tensor, empty_like_layout
from ..ops import spatial_transformer as st
from ._custom_op import custom_op


@custom_op("rtdnn::affine_grid")
def affine_grid_op(theta: Tensor, size: list[int], align_corners: bool) -> Tensor:
    return st.affine_grid(theta, size, align_corners)


@affine_grid_op.register_fake
def _(theta, size, align_corners):
    return theta.new_empty((size[0], *size[2:], len(size) - 2))


@custom_op("rtdnn::affine_grid_backward")
def affine_grid_backward(dgrid: Tensor, size: list[int], align_corners: bool) -> Tensor:
    return st.affine_grid_backward(dgrid, size, align_corners)


@affine_grid_backward.register_fake
def _(dgrid, size, align_corners):
    dims = len(size) - 2
    return dgrid.new_empty((size[0], dims, dims + 1))


def _affine_setup(ctx, inputs, output):
    ctx.args = inputs[1:]


def _affine_backward(ctx, dgrid):
    return affine_grid_backward(dgrid, *ctx.args), None, None


affine_grid_op.register_autograd(_affine_backward, setup_context=_affine_setup)


@custom_op("rtdnn::grid_sample")
def grid_sample_op(
    x: Tensor, grid: Tensor, mode: str, padding_mode: str, align_corners: bool
) -> Tensor:
    return st.grid_sample(x, grid, mode, padding_mode, align_corners)


@grid_sample_op.register_fake
def _(x, grid, mode, padding_mode, align_corners):
    return empty_like_layout((*x.shape[:2], *grid.shape[1:-1]), x)


@custom_op("rtdnn::grid_sample_backward")
def grid_sample_backward(
    dy: Tensor,
    x: Tensor,
    grid: Tensor,
    mode: str,
    padding_mode: str,
    align_corners: bool,
    input_grad: bool,
    deterministic: bool,
) -> tuple[Tensor, Tensor]:
    dx, dgrid = st.grid_sample_backward(
        dy, x, grid, mode, padding_mode, align_corners,
        input_grad=input_grad, deterministic=deterministic,
    )  # fmt: skip
    return (dx if dx is not None else x.new_empty(0)), dgrid


@grid_sample_backward.register_fake
def _(dy, x, grid, mode, padding_mode, align_corners, input_grad, deterministic):
    dx = empty_like_layout(x.shape, x) if input_grad else x.new_empty(0)
    return dx, torch.empty_like(grid, memory_format=torch.contiguous_format)


def _sample_setup(ctx, inputs, output):
    x, grid, *args = inputs
    ctx.save_for_backward(x, grid)
    ctx.args = args


def _sample_backward(ctx, dy):
    x, grid = ctx.saved_tensors
    input_grad = ctx.needs_input_grad[0]
    deterministic = torch.are_deterministic_algorithms_enabled()
    dx, dgrid = grid_sample_backward(dy, x, grid, *ctx.args, input_grad, deterministic)
    dgrid = dgrid if ctx.needs_input_grad[1] else None
    return (dx if input_grad else None), dgrid, None, None, None


grid_sample_op.register_autograd(_sample_backward, setup_context=_sample_setup)


def affine_grid(theta: Tensor, size: list[int] | tuple[int, ...], align_corners: bool = False):
    """The sampling grid of the affine maps theta, as torch.nn.functional.affine_grid:
    theta (N, 2, 3) and size (N, C, H, W) give (N, H, W, 2); theta (N, 3, 4) and size
    (N, C, D, H, W) give (N, D, H, W, 3). Differentiable with respect to theta."""
    # Checked here too: the custom op's schema needs a list of ints.
    st._check_size(size, check_tensor("theta", theta, ndim=3))
    return affine_grid_op(theta, list(size), align_corners)


def grid_sample(
    input: Tensor,
    grid: Tensor,
    mode: str = "bilinear",
    padding_mode: str = "zeros",
    align_corners: bool = False,
) -> Tensor:
    """Sample input (N, C, H, W) at grid (N, OH, OW, 2) -> (N, C, OH, OW), or the 5-D
    (trilinear) forms, as torch.nn.functional.grid_sample; mode "bilinear" or "nearest",
    padding_mode "zeros", "border" or "reflection". Differentiable with respect to input and
    grid. The input gradient is scattered with atomic adds (its last bits may vary between
    runs) unless torch.use_deterministic_algorithms(True) is on, which takes a serial,
    bit-for-bit repeatable scatter; the grid gradient is always deterministic."""
    return grid_sample_op(input, grid, mode, padding_mode, align_corners)
