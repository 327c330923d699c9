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


@pytest.mark.parametrize(
    "kernel,pad,dil,stride",
    [
        (3, 1, 1, 2),
        (1, 0, 1, 2),
        (3, 1, 1, 1),
        (7, 3, 1, 2),
        (3, 2, 2, 2),
        (5, 2, 1, 2),
        (4, 1, 3, 2),
    ],
)
def test_data_phases_rebuild_backward_data(kernel, pad, dil, stride):
    """Backward-data assembled stride phase by stride phase from data_phase_taps, with the
    kernel's index arithmetic (tap t of a phase: filter tap first + step_filter t, dy pixel
    o + shift + t step), equals the float64 reference; phases no tap reaches stay zero."""
    from rtdnn import reference as R

    for side in (7, 8):
        out = (side + 2 * pad - dil * (kernel - 1) - 1) // stride + 1
        if out < 1:
            continue
        dy = torch.randn(2, 3, out, out, dtype=torch.float64)
        w = torch.randn(3, 2, kernel, kernel, dtype=torch.float64)
        dx = torch.zeros(2, 2, side, side, dtype=torch.float64)
        for a in range(stride):
            for b in range(stride):
                th = conv_hopper.data_phase_taps(kernel, pad, dil, stride, a)
                tw = conv_hopper.data_phase_taps(kernel, pad, dil, stride, b)
                for t in range(th.count):
                    for q in range(tw.count):
                        r = th.first + th.step_filter * t
                        s = tw.first + tw.step_filter * q
                        for u in range(len(range(a, side, stride))):
                            for v in range(len(range(b, side, stride))):
                                i, j = u + th.shift + t * th.step, v + tw.shift + q * tw.step
                                if 0 <= i < out and 0 <= j < out:
                                    dx[:, :, a + stride * u, b + stride * v] += (
                                        dy[:, :, i, j] @ w[:, :, r, s]
                                    )
        ref = R.conv_backward_data(dy, w, dx.shape, stride=stride, padding=pad, dilation=dil)
        assert torch.allclose(dx, ref, atol=1e-10), (side, (dx - ref).abs().max())


@pytest.mark.parametrize("stride", [1, 2])
def test_strided_forward_reads_the_right_phase(stride):
    """The loader's arithmetic for a strided forward (lift the shifted row, take its phase and
    its row within the phase) lands on input row stride x o - pad + r x dil."""
    for pad, dil, kernel in ((0, 1, 1), (1, 1, 3), (3, 1, 7), (2, 2, 3)):
        run = conv_hopper.forward_taps(kernel, pad, dil)
        lift = pad
        for o in range(5):
            for t in range(run.count):
                d = run.shift + t * run.step + stride * lift
                phase, row = d % stride, o + d // stride - lift
                assert stride * row + phase == stride * o - pad + t * dil
