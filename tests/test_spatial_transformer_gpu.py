"""Spatial transformer on the GPU: compiled kernels against torch's float64 implementation at
sizes where many points share pixels (the atomic scatter really races).

Run in its own process, without TRITON_INTERPRET:  pytest tests/test_spatial_transformer_gpu.py
"""

import itertools

import pytest
import torch
from conftest import gpu_only

import rtdnn
from rtdnn import reference

pytestmark = gpu_only()

TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


@pytest.mark.parametrize(
    "dims,padding,align,dtype",
    list(itertools.product((2, 3), ("zeros", "border", "reflection"), (False, True),
                           (torch.float32, torch.bfloat16))),
)  # fmt: skip
def test_grid_sample_forward_backward(dims, padding, align, dtype):
    x_shape = (4, 16, 32, 40) if dims == 2 else (2, 8, 10, 12, 14)
    theta = torch.eye(dims, dims + 1).repeat(x_shape[0], 1, 1)
    theta += 0.3 * torch.randn_like(theta)
    grid = rtdnn.affine_grid(theta.cuda().to(dtype), x_shape, align_corners=align)
    x = torch.randn(x_shape, device="cuda").to(dtype).requires_grad_()
    grid.requires_grad_()
    y = rtdnn.grid_sample(x, grid, padding_mode=padding, align_corners=align)
    dy = torch.randn_like(y)
    y.backward(dy)
    x64 = x.detach().double().requires_grad_()
    g64 = grid.detach().double().requires_grad_()
    y64 = reference.grid_sample(x64, g64, "bilinear", padding, align)
    y64.backward(dy.double())
    assert rel(y, y64) <= TOL[dtype]
    assert rel(x.grad, x64.grad) <= TOL[dtype]
    assert rel(grid.grad.float(), g64.grad) <= TOL[torch.bfloat16]


def test_deterministic_input_gradient_repeats():
    x = torch.randn(2, 8, 16, 16, device="cuda")
    grid = torch.rand(2, 64, 64, 2, device="cuda") * 0.2 - 0.1  # 4096 points on a few pixels
    dy = torch.randn(2, 8, 64, 64, device="cuda")
    a, _ = rtdnn.ops.grid_sample_backward(dy, x, grid, deterministic=True)
    b, _ = rtdnn.ops.grid_sample_backward(dy, x, grid, deterministic=True)
    assert torch.equal(a, b)
    c, _ = rtdnn.ops.grid_sample_backward(dy, x, grid, deterministic=False)
    assert rel(c, a.double()) <= 1e-5


@pytest.mark.parametrize("mode", ("bilinear", "nearest"))
@pytest.mark.parametrize("dims,channels", [(2, 64), (2, 100), (2, 3), (3, 24)])
def test_channels_last_forward(mode, dims, channels):
    """Channels-last input: the forward gathers a block of a point's channels at once (up to
    64, masked past the last)."""
    shape = (3, channels, 33, 45) if dims == 2 else (2, channels, 9, 11, 13)
    fmt = torch.channels_last if dims == 2 else torch.channels_last_3d
    x = torch.randn(shape, device="cuda").to(memory_format=fmt)
    theta = torch.eye(dims, dims + 1).repeat(shape[0], 1, 1) + 0.2 * torch.randn(
        shape[0], dims, dims + 1
    )
    grid = rtdnn.affine_grid(theta.cuda(), shape, align_corners=False)
    y = rtdnn.grid_sample(x, grid, mode=mode)
    assert y.is_contiguous(memory_format=fmt)
    ref = reference.grid_sample(x.double(), grid.double(), mode, "zeros", False)
    # nearest: a point within rounding of a pixel boundary may pick the other pixel
    assert rel(y, ref) <= (1e-5 if mode == "bilinear" else 1e-3)
