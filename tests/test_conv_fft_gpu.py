"""FFT and FFT_TILING on the GPU: large filters (9x9, 7x5 grouped in true convolution, 5x5x5)
and a long 1-D filter, bfloat16 and strict float32, every direction, channels-last and
contiguous, against the float64 reference; an image large enough for several waves of
FFT_TILING tiles; bit-identical repeated runs; alpha/beta/bias into a strided out. Run with
RTDNN_GPU_TESTS=1 on a machine with a CUDA GPU."""

import pytest
import torch
from conftest import gpu_only

import rtdnn
from rtdnn import reference as R
from rtdnn.algos import ALGORITHMS
from rtdnn.core import ConvDesc, ConvProblem, Direction, TensorDesc

pytestmark = gpu_only()

ALGOS = ["FFT", "FFT_TILING"]
#: dtype and relative error allowed against float64 (float32: strict, transforms in float32).
CASES = {"bf16": (torch.bfloat16, 1e-2), "fp32": (torch.float32, 1e-5)}
SHAPES = [
    # x shape, w shape, conv parameters
    ((8, 64, 56, 56), (64, 64, 9, 9), dict(padding=4)),
    ((4, 32, 40, 33), (48, 16, 7, 5), dict(padding=(3, 1), groups=2, mode="convolution")),
    ((16, 32, 4096), (32, 32, 63), dict(padding=31)),
    ((2, 8, 16, 16, 16), (8, 8, 5, 5, 5), dict(padding=2)),
    ((3, 16, 30, 29), (24, 16, 11, 11), dict()),
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


def _every_direction(algo, x, w, dy, conv, tol, **kw):
    args = dict(algo=algo, math="fp32", **conv, **kw)
    y = rtdnn.conv_forward(x, w, **args)
    err = R.rel_error(y, R.conv_forward(x, w, **conv))
    assert err < tol, f"forward: {err:.2e}"
    dx = rtdnn.conv_backward_data(dy, w, x.shape, **args)
    err = R.rel_error(dx, R.conv_backward_data(dy, w, x.shape, **conv))
    assert err < tol, f"backward-data: {err:.2e}"
    dw = rtdnn.conv_backward_filter(x, dy, w.shape, **args)
    err = R.rel_error(dw, R.conv_backward_filter(x, dy, w.shape, **conv))
    assert err < tol, f"backward-filter: {err:.2e}"
    return y, dx, dw


MATRIX = [
    (c, layout, s) for c in CASES for s in SHAPES for layout in ("channels_last", "contiguous")
]


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("case,layout,shape", MATRIX)
def test_every_direction(algo, case, layout, shape):
    dtype, tol = CASES[case]
    x, w, dy, conv = _data(dtype, layout, shape)
    _every_direction(algo, x, w, dy, conv, tol)


@pytest.mark.parametrize("case", list(CASES))
def test_tiles_in_several_waves(case):
    """A 512 x 512 image: FFT_TILING runs its 22 x 22 tiles in more than one wave."""
    dtype, tol = CASES[case]
    x, w, dy, conv = _data(dtype, "channels_last", ((2, 32, 512, 512), (32, 32, 9, 9), {}))
    conv = dict(padding=4)
    dy = _channels_last(torch.randn(x.shape, device="cuda", dtype=dtype))
    desc = ConvDesc.create(2, 1, 4, 1, 1, "cross_correlation", "fp32")
    descs = [TensorDesc.of(t) for t in (x, w, dy)]
    p = ConvProblem.create(Direction.FORWARD, *descs, desc, "cuda")
    plan = ALGORITHMS["FFT_TILING"].plan(p)
    assert plan.waves > 1, plan
    assert ALGORITHMS["FFT_TILING"].workspace_bytes(p) < ALGORITHMS["FFT"].workspace_bytes(p)
    _every_direction("FFT_TILING", x, w, dy, conv, tol)


@pytest.mark.parametrize("algo", ALGOS)
def test_repeated_runs_bit_identical(algo):
    x, w, dy, conv = _data(torch.float32, "channels_last", SHAPES[1])
    first = _every_direction(algo, x, w, dy, conv, 1e-5)
    second = _every_direction(algo, x, w, dy, conv, 1e-5)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("algo", ALGOS)
def test_alpha_beta_bias_into_strided_out_bf16(algo):
    x, w, dy, conv = _data(torch.bfloat16, "channels_last", SHAPES[0])
    b = torch.randn(w.shape[0], device="cuda", dtype=x.dtype)
    base = torch.randn(8, 65, 56, 112, device="cuda", dtype=x.dtype)
    before = base.clone()
    out = base[:, 1:, :, ::2]
    prior = out.clone()
    y = rtdnn.conv_forward(x, w, b, algo=algo, alpha=0.5, beta=-2.0, out=out, **conv)
    assert y is out
    ref = R.conv_forward(x, w, b, alpha=0.5, beta=-2.0, out=prior, **conv)
    assert R.rel_error(y, ref) < 1e-2
    assert torch.equal(base[:, :1], before[:, :1]), "wrote outside the view"
    assert torch.equal(base[:, 1:, :, 1::2], before[:, 1:, :, 1::2]), "wrote outside the view"
