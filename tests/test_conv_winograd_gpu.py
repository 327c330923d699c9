"""WINOGRAD_NONFUSED (every direction) and WINOGRAD (fused: forward and backward-data) on the
GPU at realistic sizes: each tile size allowed for
the dtype (F(2x2,3x3), F(4x4,3x3)), bfloat16, float16 and float32 (strict and TF32), against
the float64 reference and beside torch's own convolution; alpha/beta/bias; bit-identical
repeated runs. Run with RTDNN_GPU_TESTS=1 on a machine with a CUDA GPU."""

import dataclasses

import pytest
import torch
from conftest import gpu_only

import rtdnn
import rtdnn.ops.conv as conv_ops
from rtdnn import reference as R
from rtdnn.algos import ALGORITHMS, ConvTensors, winograd
from rtdnn.algos import tiles as tile_choice
from rtdnn.core import Direction
from rtdnn.ops.conv import _problem_for_selection

pytestmark = gpu_only()

ALGO = "WINOGRAD_NONFUSED"
FUSED = "WINOGRAD"
#: (dtype, math mode, relative error allowed against float64) per case.
CASES = {
    "bf16": (torch.bfloat16, None, 1e-2),
    "fp16": (torch.float16, None, 2e-3),
    "tf32": (torch.float32, "tf32", 2e-3),
    "fp32": (torch.float32, "fp32", 1e-5),
}
FORMATS = {"bf16": "bfloat16", "fp16": "float16", "tf32": "tf32", "fp32": "fp32"}
SHAPES = [
    # x shape, w shape, conv parameters
    ((8, 64, 28, 28), (64, 64, 3, 3), dict(padding=1)),
    ((4, 96, 17, 15), (128, 96, 3, 3), dict(padding=1, mode="convolution")),
    ((2, 64, 13, 14), (64, 32, 3, 3), dict(padding=2, groups=2)),
    ((3, 32, 9, 11), (48, 32, 3, 3), dict(padding=0)),
    # One tile in all (a tile count of 1 is a compile-time constant to Triton).
    ((1, 16, 2, 2), (16, 16, 3, 3), dict(padding=1)),
]


def _channels_last(t):
    return t.movedim(1, -1).contiguous().movedim(-1, 1)


@pytest.fixture
def only_tile(monkeypatch):
    """Restrict the tile candidates to F(m x m, 3x3) for one test; prepared calls and tile
    choices are forgotten around it."""

    def forget():
        ALGORITHMS[ALGO]._runners.clear()
        ALGORITHMS[FUSED]._runners.clear()
        conv_ops._prepared.clear()
        tile_choice._chosen.clear()

    def use(number_format, m):
        monkeypatch.setitem(winograd.OUT_TILES, number_format, (m,))
        forget()

    yield use
    forget()


def _data(dtype, layout, shape):
    xs, ws, conv = shape
    x = torch.randn(xs, device="cuda", dtype=dtype)
    w = (torch.randn(ws, device="cuda") / (ws[1] * 9) ** 0.5).to(dtype)
    if layout == "channels_last":
        x, w = _channels_last(x), _channels_last(w)
    return x, w, conv


def _all_directions(x, w, conv, math_mode, algo=ALGO):
    """(direction, result, float64 reference, torch's result) of each direction `algo` runs."""
    y_ref = R.conv_forward(x, w, **conv)
    dy = torch.randn(y_ref.shape, device="cuda", dtype=x.dtype)
    args = dict(algo=algo, math=math_mode, **conv)
    tconv = dict(conv)
    tconv.pop("mode", None)
    flip = conv.get("mode") == "convolution"
    wt = w.flip(2, 3) if flip else w
    xr, wr = x.detach().clone().requires_grad_(True), wt.detach().clone().requires_grad_(True)
    yt = torch.nn.functional.conv2d(xr, wr, **tconv)
    yt.backward(dy)
    dwt = wr.grad.flip(2, 3) if flip else wr.grad
    yield "forward", rtdnn.conv_forward(x, w, **args), y_ref, yt
    dx = rtdnn.conv_backward_data(dy, w, x.shape, **args)
    yield "backward_data", dx, R.conv_backward_data(dy, w, x.shape, **conv), xr.grad
    if algo != FUSED:
        dw = rtdnn.conv_backward_filter(x, dy, w.shape, **args)
        yield "backward_filter", dw, R.conv_backward_filter(x, dy, w.shape, **conv), dwt


MATRIX = [
    (algo, case, m, layout, i)
    for algo in (ALGO, FUSED)
    for case in CASES
    for m in (2, 4)
    for layout in ("channels_last", "contiguous")
    for i in range(len(SHAPES))
]


@pytest.mark.parametrize("algo,case,m,layout,shape", MATRIX)
def test_every_direction(algo, case, m, layout, shape, only_tile):
    dtype, math_mode, tol = CASES[case]
    number_format = FORMATS[case]
    if m not in winograd.OUT_TILES[number_format]:
        pytest.skip(f"F({m}x{m},3x3) is not offered for {number_format}")
    only_tile(number_format, m)
    torch.manual_seed(shape)
    x, w, conv = _data(dtype, layout, SHAPES[shape])
    for direction, out, ref, theirs in _all_directions(x, w, conv, math_mode, algo):
        err = R.rel_error(out, ref)
        assert err < tol, f"{direction}: relative error {err:.2e} >= {tol:.0e}"
        if dtype != torch.float32:  # torch's float32 may run TF32
            assert R.rel_error(out, theirs.detach().double().cpu()) < 2 * tol, direction


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(
    "direction,c,k",
    [("forward", 3, 64), ("backward_data", 64, 3), ("backward_data", 3, 64),
     ("backward_filter", 3, 64)],
)  # fmt: skip
def test_fma_tiles_on_a_stem(case, direction, c, k):
    """The FMA products, every tile shape, where 3 channels are reduced or written: WINOGRAD
    (fused) on an RGB stem (3 to 64 channels, 33x31 images: tiles over the edge) forward and
    backward-data and the backward-data of a layer of 3 filters, WINOGRAD_NONFUSED on the
    stem's weight gradient; NaN-poisoned outputs, bias in forward, against float64."""
    dtype, math_mode, tol = CASES[case]
    torch.manual_seed(0)
    x, w, conv = _data(dtype, "channels_last", ((4, c, 33, 31), (k, c, 3, 3), dict(padding=1)))
    dy = _channels_last(torch.randn(4, k, 33, 31, device="cuda", dtype=dtype))
    b = torch.randn(k, device="cuda", dtype=dtype) if direction == "forward" else None
    args = dict(stride=1, dilation=1, groups=1, mode="cross_correlation", **conv)
    p, _ = _problem_for_selection(direction, x, w, math=math_mode, **args)
    if b is not None:
        p = dataclasses.replace(p, has_bias=True)
        ref = R.conv_forward(x, w, b, **conv)
    elif direction == "backward_data":
        ref = R.conv_backward_data(dy, w, x.shape, **conv)
    else:
        ref = R.conv_backward_filter(x, dy, w.shape, **conv)
    algo = ALGORITHMS[ALGO if direction == "backward_filter" else FUSED]
    fma = [t for t in algo.tile_candidates(p) if t.fma or t.block_n < 16]
    assert fma and algo.tile_candidates(p)[0] == fma[0]
    workspace = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8, device="cuda")
    written = {"forward": dy, "backward_data": x, "backward_filter": w}[direction]
    for tiles in fma:
        out = torch.full_like(written, float("nan"))
        t = ConvTensors(x, w, dy, b).with_written(Direction(direction), out)
        algo.prepare(p, tiles)(t, workspace, 1.0, 0.0)
        err = R.rel_error(out, ref)
        assert err < tol, f"{tiles}: relative error {err:.2e} >= {tol:.0e}"


def test_alpha_beta_bias_bf16():
    x, w, conv = _data(torch.bfloat16, "channels_last", SHAPES[0])
    b = torch.randn(w.shape[0], device="cuda", dtype=x.dtype)
    out = _channels_last(torch.randn(8, 64, 28, 28, device="cuda", dtype=x.dtype))
    prior = out.clone()
    ref = R.conv_forward(x, w, b, alpha=0.5, beta=-0.75, out=prior, **conv)
    for algo in (ALGO, FUSED):
        out.copy_(prior)
        y = rtdnn.conv_forward(x, w, b, alpha=0.5, beta=-0.75, out=out, algo=algo, **conv)
        assert y is out and R.rel_error(y, ref) < 1e-2, algo


def test_bit_identical_runs():
    x, w, conv = _data(torch.bfloat16, "channels_last", SHAPES[0])
    dy = _channels_last(torch.randn(8, 64, 28, 28, device="cuda", dtype=x.dtype))
    first = rtdnn.conv_backward_filter(x, dy, w.shape, algo=ALGO, **conv)
    y0 = rtdnn.conv_forward(x, w, algo=ALGO, **conv)
    for _ in range(3):
        assert torch.equal(first, rtdnn.conv_backward_filter(x, dy, w.shape, algo=ALGO, **conv))
        assert torch.equal(y0, rtdnn.conv_forward(x, w, algo=ALGO, **conv))


def test_find_lists_winograd_and_the_heuristic_does_not_pick_it():
    x, w, conv = _data(torch.bfloat16, "channels_last", SHAPES[0])
    assert rtdnn.get_conv_algorithm(x, w, **conv) not in (ALGO, FUSED)
    results = rtdnn.find_conv_algorithms(x, w, **conv)
    for algo in (ALGO, FUSED):
        mine = [r for r in results if r.algo == algo]
        assert len(mine) == 1 and mine[0].status == "ok", results
