"""The warp-specialized Hopper convolution's host-side rules, on the CPU (the kernel itself runs
on sm_90 only: tests/test_conv_gpu.py, test_hopper_kernel)."""

import pytest
import torch

from rtdnn.algos import ALGORITHMS
from rtdnn.algos.implicit_gemm import HopperConvTiles, hopper_unsupported
from rtdnn.kernels import conv_hopper
from rtdnn.ops.conv import _problem_for_selection


@pytest.mark.parametrize("side", [(1, 1), (7, 7), (14, 14), (56, 56), (224, 224), (3, 70), (9, 2)])
def test_box_covers_tile_and_splits_in_halves(side):
    """A tile's box holds BLOCK_M pixels, columns a power of two up to 64 covering the row
    where they can, and two or more images or rows so that each consumer takes half."""
    n, h, w = conv_hopper.conv_box(*side)
    assert n * h * w == conv_hopper.BLOCK_M
    assert w <= 64 and w & (w - 1) == 0 and (w >= side[1] or w == 64)
    assert n > 1 or h > 1
    half = conv_hopper.half_box((n, h, w))
    assert 2 * half[0] * half[1] * half[2] == conv_hopper.BLOCK_M


def _problem(direction, dtype=torch.bfloat16, **conv):
    x = torch.randn(2, 64, 9, 9, dtype=dtype).to(memory_format=torch.channels_last)
    w = torch.randn(64, 64, 3, 3, dtype=dtype).to(memory_format=torch.channels_last)
    args = dict(stride=1, padding=1, dilation=1, groups=1, mode="cross_correlation", math=None)
    p, _ = _problem_for_selection(direction, x, w, **{**args, **conv})
    return p


@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_filter"])
def test_not_offered_off_hopper(direction):
    """Off a Hopper GPU (here the CPU) the kernel says why it does not run, and IMPLICIT_GEMM
    offers its other tiles."""
    p = _problem(direction)
    assert "Hopper" in hopper_unsupported(p)
    candidates = ALGORITHMS["IMPLICIT_GEMM"].tile_candidates(p)
    assert candidates and not any(isinstance(t, HopperConvTiles) for t in candidates)
