"""On the CPU, rtdnn's kernels round float32 to bfloat16 to nearest (ties to even), as the GPU
does; Triton 3.6's interpreter alone truncates, which doubles the rounding error of every
bfloat16 result (core/interpreter.py)."""

import numpy as np
import torch
import triton
import triton.language as tl

import rtdnn
from rtdnn.core.interpreter import float32_to_bfloat16_bits


def _torch_bits(x: torch.Tensor) -> np.ndarray:
    return x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def test_float32_to_bfloat16_bits_matches_torch():
    gen = torch.Generator().manual_seed(0)
    x = torch.cat([
        torch.randn(20000, generator=gen),
        torch.randn(2000, generator=gen) * 1e-39,  # subnormal float32
        # ties (a half-way low half: 0x8000) with even and odd kept bits, the largest
        # bfloat16 and past it, infinities, zeros
        torch.tensor([0x3F808000, 0x3F818000, 0x7F7F7FFF, 0x7F7FFFFF], dtype=torch.int32)
        .view(torch.float32),
        torch.tensor([float("inf"), -float("inf"), 0.0, -0.0, 3.4e38, -3.4e38]),
    ])  # fmt: skip
    assert np.array_equal(float32_to_bfloat16_bits(x.numpy()), _torch_bits(x))
    nan = torch.tensor([float("nan"), -float("nan")])
    back = torch.from_numpy(float32_to_bfloat16_bits(nan.numpy()).view(np.int16))
    assert back.view(torch.bfloat16).isnan().all()


def test_rtdnn_kernels_round_bfloat16_results_to_nearest(gen):
    """alpha * conv(x, w) with a 1x1 filter of ones is alpha * x in float32, then rounded to
    x's bfloat16: bit for bit torch's rounding of the same float32 product."""
    x = torch.randn(2, 1, 9, 7, generator=gen).bfloat16()
    w = torch.ones(1, 1, 1, 1, dtype=torch.bfloat16)
    alpha = 1 / 3
    y = rtdnn.conv_forward(x, w, alpha=alpha, algo="IMPLICIT_GEMM")
    expected = (x.float() * torch.tensor(alpha, dtype=torch.float32)).bfloat16()
    assert torch.equal(y, expected)


@triton.jit
def _to_bfloat16(X, Y, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(Y + offs, tl.load(X + offs).to(tl.bfloat16))


def test_other_kernels_keep_tritons_conversion():
    """Only rtdnn's own launches are changed: a kernel of another module converts as
    Triton's interpreter does (truncation, in Triton 3.6)."""
    x = torch.randn(256)
    y = torch.empty(256, dtype=torch.bfloat16)
    _to_bfloat16[(1,)](x, y, N=256)
    truncated = (x.view(torch.int32) >> 16).to(torch.int16)
    assert torch.equal(y.view(torch.int16), truncated)
