"""IMPLICIT_PRECOMP_GEMM on the GPU: every direction in bfloat16, float16, strict float32 and
TF32, channels-last and contiguous, against the float64 reference, on layers of ResNet-like
shapes (an RGB stem with few channels, strided and dilated 3x3, grouped, 1-D and 3-D, a filter
of more than 32 taps); the same answer as IMPLICIT_GEMM; bit-identical repeated runs; the exact
workspace. Run with RTDNN_GPU_TESTS=1 on a machine with a CUDA GPU."""

import pytest
import torch
from conftest import gpu_only

import rtdnn
from rtdnn import reference as R
from rtdnn.algos import ALGORITHMS
from rtdnn.core import ConvDesc, ConvProblem, Direction, TensorDesc

pytestmark = gpu_only()

ALGO = "IMPLICIT_PRECOMP_GEMM"
#: dtype, math mode and relative error allowed against float64.
CASES = {
    "bf16": (torch.bfloat16, "fp32", 1e-2),
    "fp16": (torch.float16, "fp32", 2e-3),
    "fp32": (torch.float32, "fp32", 1e-5),
    "tf32": (torch.float32, "tf32", 2e-3),
}
SHAPES = [
    # x shape, w shape, conv parameters
    ((8, 3, 64, 64), (32, 3, 7, 7), dict(stride=2, padding=3)),  # stem: packed taps, 49 taps
    ((8, 64, 28, 28), (64, 64, 3, 3), dict(padding=1)),
    ((4, 64, 29, 30), (128, 64, 3, 3), dict(stride=2, padding=2, dilation=2)),
    ((4, 64, 14, 14), (64, 16, 3, 3), dict(padding=1, groups=4, mode="convolution")),
    ((8, 32, 500), (32, 32, 41), dict(padding=20)),  # two validity words per pixel
    ((2, 16, 12, 14, 10), (16, 16, 3, 3, 3), dict(padding=1, stride=(1, 2, 1))),
]


def _channels_last(t):
    return t.movedim(1, -1).contiguous().movedim(-1, 1)


def _data(dtype, layout, shape):
    xs, ws, conv = shape
    x = torch.randn(xs, device="cuda", dtype=dtype)
    w = (torch.randn(ws, device="cuda") / (ws[1] * ws[-1]) ** 0.5).to(dtype)
    dy = torch.randn(R.conv_forward(x, w, **conv).shape, device="cuda", dtype=dtype)
    if layout == "channels_last":
        x, w, dy = _channels_last(x), _channels_last(w), _channels_last(dy)
    return x, w, dy, conv


def _every_direction(algo, x, w, dy, conv, math_mode, **kw):
    args = dict(algo=algo, math=math_mode, **conv, **kw)
    y = rtdnn.conv_forward(x, w, **args)
    dx = rtdnn.conv_backward_data(dy, w, x.shape, **args)
    dw = rtdnn.conv_backward_filter(x, dy, w.shape, **args)
    return y, dx, dw


MATRIX = [
    (c, layout, s) for c in CASES for s in SHAPES for layout in ("channels_last", "contiguous")
]


@pytest.mark.parametrize("case,layout,shape", MATRIX)
def test_every_direction(case, layout, shape):
    dtype, math_mode, tol = CASES[case]
    x, w, dy, conv = _data(dtype, layout, shape)
    y, dx, dw = _every_direction(ALGO, x, w, dy, conv, math_mode)
    refs = (
        R.conv_forward(x, w, **conv),
        R.conv_backward_data(dy, w, x.shape, **conv),
        R.conv_backward_filter(x, dy, w.shape, **conv),
    )
    names = ("forward", "backward-data", "backward-filter")
    for name, out, ref in zip(names, (y, dx, dw), refs, strict=True):
        err = R.rel_error(out, ref)
        assert err < tol, f"{name}: rel. error {err:.2e}"


@pytest.mark.parametrize("shape", SHAPES)
def test_same_as_implicit_gemm_and_deterministic(shape):
    """Strict float32: the same sums as IMPLICIT_GEMM up to rounding, and bit-identical runs."""
    x, w, dy, conv = _data(torch.float32, "channels_last", shape)
    first = _every_direction(ALGO, x, w, dy, conv, "fp32")
    again = _every_direction(ALGO, x, w, dy, conv, "fp32")
    plain = _every_direction("IMPLICIT_GEMM", x, w, dy, conv, "fp32")
    for a, b, c in zip(first, again, plain, strict=True):
        assert torch.equal(a, b)
        assert R.rel_error(a, c.double().cpu()) < 1e-6


def test_exact_workspace_and_alpha_beta_bias():
    """The table fills exactly the declared bytes (a guard after them stays untouched);
    alpha, beta and bias on a random out."""
    x, w, dy, conv = _data(torch.bfloat16, "channels_last", SHAPES[0])
    bias = torch.randn(w.shape[0], device="cuda", dtype=torch.bfloat16)
    for direction in Direction:
        written = {"forward": dy, "backward_data": x, "backward_filter": w}[direction.value]
        desc = ConvDesc.create(2, 2, 3, 1, 1, "cross_correlation", "fp32")
        p = ConvProblem.create(direction, TensorDesc.of(x), TensorDesc.of(w), TensorDesc.of(dy),
                               desc, "cuda", direction == Direction.FORWARD)  # fmt: skip
        algo = ALGORITHMS[ALGO]
        need = algo.workspace_bytes(p)
        assert need > 0
        ws = torch.full((need + 4096,), 0xA5, dtype=torch.uint8, device="cuda")
        out = torch.randn_like(written)
        prior = out.clone()
        t = rtdnn.algos.ConvTensors(x, w, dy, bias if direction == Direction.FORWARD else None)
        algo.run(p, t.with_written(direction, out), ws[:need], alpha=0.5, beta=-1.0)
        assert bool((ws[need:] == 0xA5).all())
        if direction == Direction.FORWARD:
            ref = R.conv_forward(x, w, bias, alpha=0.5, beta=-1.0, out=prior, **conv)
        elif direction == Direction.BACKWARD_DATA:
            ref = R.conv_backward_data(dy, w, x.shape, alpha=0.5, beta=-1.0, out=prior, **conv)
        else:
            ref = R.conv_backward_filter(x, dy, w.shape, alpha=0.5, beta=-1.0, out=prior, **conv)
        assert R.rel_error(out, ref) < 1e-2
