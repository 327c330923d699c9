"""Squeeze-and-excitation on the GPU: EfficientNet's and MobileNetV3's block shapes against the
float64 reference (outputs and every gradient), and torchvision's blocks converted.
Run with RTDNN_GPU_TESTS=1 on a machine with a CUDA GPU (torchvision for the last test)."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close, gpu_only

import rtdnn
from rtdnn import reference as R

pytestmark = gpu_only()


@pytest.mark.parametrize(
    "n, c, r, hw, activation, gate",
    [
        (64, 96, 4, 112, "silu", "sigmoid"),  # EfficientNet-B0's second block
        (64, 672, 28, 14, "silu", "sigmoid"),
        (64, 1152, 48, 7, "silu", "sigmoid"),
        (64, 72, 24, 28, "relu", "hardsigmoid"),  # MobileNetV3-Large
        (64, 960, 240, 7, "relu", "hardsigmoid"),
        (5, 33, 17, 9, "silu", "sigmoid"),  # sizes off every tile
    ],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_block_shapes_match_reference(n, c, r, hw, activation, gate, dtype):
    torch.manual_seed(c + r)
    x = torch.randn(n, c, hw, hw, device="cuda").to(dtype, memory_format=torch.channels_last)
    x.requires_grad_()
    w1 = (torch.randn(r, c, 1, 1, device="cuda") / c**0.5).requires_grad_()
    w2 = (torch.randn(c, r, 1, 1, device="cuda") / r**0.5).requires_grad_()
    b1 = torch.randn(r, device="cuda").requires_grad_()
    b2 = torch.randn(c, device="cuda").requires_grad_()
    y = rtdnn.squeeze_excitation(x, w1, b1, w2, b2, activation, gate)
    assert y.is_contiguous(memory_format=torch.channels_last)
    ref = R.squeeze_excitation(x, w1, b1, w2, b2, activation, gate)
    assert_close(y, ref.detach().cpu(), dtype)
    dy = torch.randn_like(y)
    inputs = [x, w1, b1, w2, b2]
    grads = torch.autograd.grad(y, inputs, dy)
    refs = torch.autograd.grad(ref, inputs, dy.double())
    for g, gr in zip(grads, refs, strict=True):
        assert_close(g, gr.cpu(), dtype)


def test_converted_torchvision_block_under_autocast():
    """torchvision's block, converted, under bf16 autocast (float32 parameters read as they
    are) against the same block in torch: outputs and parameter gradients."""
    torchvision_ops = pytest.importorskip("torchvision.ops")
    torch.manual_seed(5)
    block = torchvision_ops.SqueezeExcitation(96, 24, torch.nn.SiLU).cuda()
    converted, report = rtdnn.convert(torch.nn.Sequential(block))
    assert type(converted[0]) is rtdnn.nn.SqueezeExcitation
    x = torch.randn(16, 96, 28, 28, device="cuda").to(memory_format=torch.channels_last)
    with torch.autocast("cuda", torch.bfloat16):
        y, ref = converted(x.bfloat16()), block(x.bfloat16())
    assert_close(y, ref.double().cpu(), torch.bfloat16)
    grads = torch.autograd.grad(y.float().square().sum(), list(converted.parameters()))
    refs = torch.autograd.grad(ref.float().square().sum(), list(block.parameters()))
    for g, gr in zip(grads, refs, strict=True):
        assert_close(
            g, gr.double().cpu(), torch.bfloat16
        )  # torch rounds its steps to bf16, rtdnn does not
