"""FFT and FFT_TILING against the float64 reference, every direction, through the interpreter:
1-D (a long filter), 2-D and 3-D, padding 0 to 2, groups, both modes, several tiles and
waves of tiles, every layout, alpha/beta and bias, three dtypes; determinism and the exact
workspace; the tiled workspace bounded as the image grows; selection and the refusals."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import make_tensor, out_size, poisoned_like, run_conv_direction
from hypothesis import given, settings
from hypothesis import strategies as st

import rtdnn
from rtdnn import reference, select
from rtdnn.algos import ALGORITHMS, ConvTensors
from rtdnn.algos.fft import CPU_TILES_PER_WAVE, WAVE_BYTES, fast_length, make_plan
from rtdnn.core import ConvDesc, ConvProblem, Direction, TensorDesc

ALGOS = ["FFT", "FFT_TILING"]
DIRECTIONS = ["forward", "backward_data", "backward_filter"]
#: Relative error against float64. float32: transforms and sums in float32 (measured up to
#: 6e-7 on these shapes); the 16-bit types: the rounding of the result.
TOL = {torch.float32: 5e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def _tuple(v, n):
    return (v,) * n if isinstance(v, int) else tuple(v)


def y_shape(x_shape, w_shape, conv) -> tuple[int, ...]:
    nd = len(x_shape) - 2
    o = out_size(x_shape[2:], w_shape[2:], (1,) * nd, _tuple(conv.get("padding", 0), nd), (1,) * nd)
    return (x_shape[0], w_shape[0], *o)


def run_direction(direction, x, w, dy, *, algo, dtype, **kw):
    """One direction with `algo` at this module's tolerance: run_conv_direction."""
    return run_conv_direction(direction, x, w, dy, algo=algo, dtype=dtype, tol=TOL[dtype], **kw)


def check(algo, x_shape, w_shape, *, dtype=torch.float32, layout="contiguous", gen=None,
          directions=DIRECTIONS, **kw):  # fmt: skip
    """Every direction of one problem, inputs and output in `layout`."""
    conv = {k: v for k, v in kw.items() if k in ("padding", "groups", "mode")}
    x = make_tensor(x_shape, dtype, layout, gen)
    w = make_tensor(w_shape, dtype, layout, gen)
    dy = make_tensor(y_shape(x_shape, w_shape, conv), dtype, layout, gen)
    for direction in directions:
        run_direction(direction, x, w, dy, algo=algo, dtype=dtype, layout=layout, gen=gen, **kw)


def _problem(direction, x, w, y, device="cpu", **conv) -> ConvProblem:
    """The ConvProblem of these tensors (their strides are what the kernels address)."""
    desc = ConvDesc.create(
        x.dim() - 2, conv.get("stride", 1), conv.get("padding", 0), conv.get("dilation", 1),
        conv.get("groups", 1), conv.get("mode", "cross_correlation"), "fp32",
    )  # fmt: skip
    return ConvProblem.create(
        Direction(direction), TensorDesc.of(x), TensorDesc.of(w), TensorDesc.of(y), desc, device
    )


def _plan(direction, x_shape, w_shape, tiled, device="cpu", **conv):
    x, w = torch.empty(x_shape), torch.empty(w_shape)
    y = torch.empty(y_shape(x_shape, w_shape, conv))
    return make_plan(_problem(direction, x, w, y, device, **conv), tiled)


# (id, x shape, w shape, conv parameters); the FFT_TILING tiles in the interpreter are
# 4 (3 taps), 8 (5 taps) and 16 (9 taps) long.
CASES = [
    ("1d-9taps-pad2", (2, 3, 20), (4, 3, 9), dict(padding=2)),
    ("2d-3x3-groups-pad1", (2, 4, 9, 7), (4, 2, 3, 3), dict(padding=1, groups=2)),
    ("2d-5x5-conv-pad2", (1, 3, 8, 9), (2, 3, 5, 5), dict(padding=2, mode="convolution")),
    ("2d-2x5-conv-pad01", (2, 2, 6, 9), (3, 2, 2, 5), dict(padding=(0, 1), mode="convolution")),
    ("2d-1x1", (2, 3, 5, 4), (4, 3, 1, 1), dict()),
    ("2d-filter-fills-image", (1, 2, 5, 5), (2, 2, 5, 5), dict()),
    ("3d-pad1", (1, 2, 4, 5, 4), (2, 2, 3, 3, 2), dict(padding=1)),
]


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("x_shape,w_shape,conv", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_shapes_against_reference(algo, x_shape, w_shape, conv, gen):
    check(algo, x_shape, w_shape, gen=gen, **conv)


def test_tiling_cases_span_tiles_and_waves():
    """The tiled cases above do exercise several tiles, several waves and a last wave padded
    with empty tiles (else the tests would only repeat FFT's)."""
    plans = {c[0]: _plan(d, c[1], c[2], True, **c[3]) for c in CASES for d in DIRECTIONS[:1]}
    assert plans["1d-9taps-pad2"].tiles == (2,)
    groups = plans["2d-3x3-groups-pad1"]
    assert groups.tiles == (5, 4) and groups.waves == 5 and groups.per_wave == CPU_TILES_PER_WAVE
    filt = _plan("backward_filter", (1, 3, 8, 9), (2, 3, 5, 5), True, padding=2)
    assert filt.tiles == (2, 3) and (filt.waves, filt.per_wave) == (2, 3)
    last_padded = _plan("forward", (2, 1, 12), (3, 1, 3), True)
    assert last_padded.tiles == (5,) and (last_padded.waves, last_padded.per_wave) == (2, 3)
    # FFT: one tile per dim, transform lengths of small prime factors.
    whole = _plan("forward", (2, 4, 9, 7), (4, 2, 3, 3), False, padding=1, groups=2)
    assert whole.tiles == (1, 1) and whole.length == (12, 9) and whole.waves == 1


@st.composite
def random_problems(draw):
    """A small 1-D or 2-D problem: filters of 1 to 6 taps (up to the padded image), padding
    0 to 2 per dim, groups, both modes, one direction, one algorithm, one layout."""
    nd = draw(st.integers(1, 2))
    groups = draw(st.sampled_from([1, 2]))
    c, k = groups * draw(st.integers(1, 2)), groups * draw(st.integers(1, 2))
    kernel = [draw(st.integers(1, 6)) for _ in range(nd)]
    padding = [draw(st.integers(0, 2)) for _ in range(nd)]
    most = 12 if nd == 1 else 7
    size = [
        draw(st.integers(max(1, r - 2 * q), most)) for r, q in zip(kernel, padding, strict=True)
    ]
    conv = dict(padding=tuple(padding), groups=groups,
                mode=draw(st.sampled_from(["cross_correlation", "convolution"])))  # fmt: skip
    run = dict(
        algo=draw(st.sampled_from(ALGOS)), direction=draw(st.sampled_from(DIRECTIONS)),
        layout=draw(st.sampled_from(["contiguous", "channels_last", "strided"])),
        beta=draw(st.sampled_from([0.0, 0.5])),
    )  # fmt: skip
    return (draw(st.integers(1, 2)), c, *size), (k, c // groups, *kernel), conv, run


@settings(max_examples=12, deadline=None)
@given(problem=random_problems())
def test_random_problems(problem):
    x_shape, w_shape, conv, run = problem
    gen = torch.Generator().manual_seed(7)
    layout = run["layout"]
    x = make_tensor(x_shape, torch.float32, layout, gen)
    w = make_tensor(w_shape, torch.float32, layout, gen)
    dy = make_tensor(y_shape(x_shape, w_shape, conv), torch.float32, layout, gen)
    run_direction(run["direction"], x, w, dy, algo=run["algo"], dtype=torch.float32,
                  layout=layout, beta=run["beta"], gen=gen, **conv)  # fmt: skip


def test_last_wave_padded_with_empty_tiles(gen):
    """5 tiles in 2 waves of 3: the last wave's empty tile adds nothing and writes nothing."""
    for algo in ALGOS:
        check(algo, (2, 1, 12), (3, 1, 3), gen=gen)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("layout", ["channels_last", "strided"])
def test_layouts_with_alpha_beta(algo, layout, gen):
    """Channels-last and strided views (inputs and out), alpha and beta on a random out."""
    check(algo, (2, 4, 7, 6), (4, 2, 3, 3), layout=layout, alpha=0.5, beta=-0.75, gen=gen,
          groups=2, padding=1)  # fmt: skip


@pytest.mark.parametrize("algo", ALGOS)
def test_alpha_and_bias_on_poisoned_out(algo, gen):
    """beta = 0 never reads out (NaN); alpha scales the convolution, not the bias."""
    x = make_tensor((2, 3, 6, 7), torch.float32, generator=gen)
    w = make_tensor((5, 3, 3, 3), torch.float32, generator=gen)
    b = make_tensor((5,), torch.float32, generator=gen)
    dy = make_tensor((2, 5, 6, 7), torch.float32, generator=gen)
    run_direction("forward", x, w, dy, algo=algo, dtype=torch.float32, alpha=-1.5, bias=b,
                  padding=1, gen=gen)  # fmt: skip
    run_direction("forward", x, w, dy, algo=algo, dtype=torch.float32, alpha=2.0, beta=0.5,
                  bias=b, padding=1, gen=gen)  # fmt: skip
    for direction in DIRECTIONS[1:]:
        run_direction(direction, x, w, dy, algo=algo, dtype=torch.float32, alpha=2.0,
                      padding=1, gen=gen)  # fmt: skip


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precision(algo, dtype, gen):
    """16-bit storage, float32 transforms and sums (no tl.dot, so bf16 runs in the
    interpreter as on the GPU)."""
    check(algo, (2, 4, 7, 6), (4, 4, 5, 3), dtype=dtype, layout="channels_last", gen=gen,
          padding=(2, 0), mode="convolution")  # fmt: skip


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_deterministic_and_workspace_exact(algo, direction, gen):
    """A workspace of exactly the declared bytes, NaN beforehand (so reading a byte the run did
    not write first would show), followed by a guard: two runs are bit-identical and right,
    the last byte of the workspace is written, the guard is not."""
    conv = dict(padding=1, groups=2, mode="convolution")
    x = make_tensor((2, 4, 7, 6), torch.float32, "channels_last", gen)
    w = make_tensor((4, 2, 3, 3), torch.float32, "channels_last", gen)
    dy = make_tensor(y_shape(x.shape, w.shape, conv), torch.float32, "channels_last", gen)
    p = _problem(direction, x, w, dy, **conv)
    a = ALGORITHMS[algo]
    need = a.workspace_bytes(p)
    assert need > 0 and need % 8 == 0
    guard = 64
    results = []
    for _ in range(2):
        workspace = torch.full(((need + guard) // 4,), math.nan).view(torch.uint8)
        written = {"forward": dy, "backward_data": x, "backward_filter": w}[direction]
        out = poisoned_like(written)
        a.run(p, ConvTensors(x, w, dy).with_written(p.direction, out), workspace)
        results.append(out)
        assert not torch.isnan(workspace[need - 8 : need].view(torch.float32)).any()
        assert torch.isnan(workspace[need:].view(torch.float32)).all(), "wrote past the workspace"
    assert torch.equal(results[0], results[1])
    ref = {
        "forward": lambda: reference.conv_forward(x, w, **conv),
        "backward_data": lambda: reference.conv_backward_data(dy, w, x.shape, **conv),
        "backward_filter": lambda: reference.conv_backward_filter(x, dy, w.shape, **conv),
    }[direction]()
    assert reference.rel_error(results[0], ref) <= TOL[torch.float32]


def test_tiled_workspace_bounded_as_the_image_grows():
    """On a GPU (the plan only, nothing runs): FFT's workspace grows with the image,
    FFT_TILING's stays within one wave's bound plus the filter spectrum."""
    w_shape = (64, 64, 9, 9)
    sizes = {}
    for side in (128, 256, 512):
        x_shape = (8, 64, side, side)
        for tiled in (False, True):
            for d in DIRECTIONS:
                plan = _plan(d, x_shape, w_shape, tiled, "cuda", padding=4)
                sizes[side, tiled, d] = plan.workspace_bytes
                if tiled:
                    assert plan.length == (32, 32) and plan.step == (24, 24)
    for d in DIRECTIONS:
        assert sizes[512, False, d] > 10 * sizes[128, False, d]
        filter_spectrum = 64 * 64 * 32 * 17 * 8
        assert sizes[512, True, d] <= WAVE_BYTES + filter_spectrum + 1024
        assert sizes[512, True, d] < sizes[512, False, d] / 4


def test_fast_length():
    assert [fast_length(n) for n in (1, 2, 11, 13, 17, 97, 121, 1000)] == [
        1, 2, 12, 14, 18, 98, 125, 1000,
    ]  # fmt: skip
    for n in range(1, 300):
        m = fast_length(n)
        assert m >= n
        for q in (2, 3, 5, 7):
            while m % q == 0:
                m //= q
        assert m == 1


# -- selection and refusals ---------------------------------------------------------------------


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_heuristic_does_not_choose_fft(direction):
    """Not measured on a GPU yet: the heuristic keeps the GEMM paths even for large filters."""
    x, w = torch.empty(2, 8, 32, 32), torch.empty(8, 8, 9, 9)
    name = rtdnn.get_conv_algorithm(x, w, direction=direction, padding=4)
    assert name not in ALGOS


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_find_lists_fft_where_supported(direction, gen, monkeypatch):
    monkeypatch.setattr(select, "_measured", {})  # keep other tests' measurements apart
    x = make_tensor((1, 2, 5, 4), torch.float32, generator=gen)
    w = make_tensor((2, 2, 3, 3), torch.float32, generator=gen)
    results = rtdnn.find_conv_algorithms(x, w, direction=direction, padding=1, math="fp32")
    listed = {r.algo: r for r in results}
    p = _problem(direction, x, w, torch.empty(1, 2, 5, 4), padding=1)
    for algo in ALGOS:
        r = listed[algo]
        assert r.status == "ok" and math.isfinite(r.time_ms), r
        assert r.workspace_bytes == ALGORITHMS[algo].workspace_bytes(p) > 0
        assert r.deterministic is True
    # Stride 2: not supported, so not listed; auto still runs (without workspace too).
    strided = rtdnn.find_conv_algorithms(x, w, direction=direction, stride=2, math="fp32")
    assert not {r.algo for r in strided} & set(ALGOS)
    y = rtdnn.conv_forward(x, w, padding=1, workspace_limit=0, math="fp32")
    assert reference.rel_error(y, reference.conv_forward(x, w, padding=1)) <= TOL[torch.float32]


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("param", ["stride", "dilation"])
def test_forced_fft_refuses_stride_and_dilation(algo, param, gen):
    x = make_tensor((1, 2, 7, 7), torch.float32, generator=gen)
    w = make_tensor((2, 2, 3, 3), torch.float32, generator=gen)
    shape = (1, 2, 3, 3)
    out = torch.ones(shape)
    with pytest.raises(rtdnn.NotSupportedError, match=rf"{param} \(2, 2\)"):
        rtdnn.conv_forward(x, w, algo=algo, out=out, **{param: 2})
    assert torch.equal(out, torch.ones(shape)), "out written although rejected"
    dx = torch.ones(x.shape)
    with pytest.raises(rtdnn.NotSupportedError, match=param):
        rtdnn.conv_backward_data(torch.ones(shape), w, x.shape, algo=algo, out=dx, **{param: 2})
    assert torch.equal(dx, torch.ones(x.shape))
    with pytest.raises(rtdnn.NotSupportedError, match=param):
        rtdnn.conv_backward_filter(x, torch.ones(shape), w.shape, algo=algo, **{param: 2})


@pytest.mark.parametrize("algo", ALGOS)
def test_forced_fft_below_workspace(algo, gen):
    x = make_tensor((2, 3, 6, 6), torch.float32, generator=gen)
    w = make_tensor((4, 3, 3, 3), torch.float32, generator=gen)
    dy = make_tensor((2, 4, 6, 6), torch.float32, generator=gen)
    p = _problem("backward_filter", x, w, dy, padding=1)
    need = ALGORITHMS[algo].workspace_bytes(p)
    out = torch.ones(w.shape)
    with pytest.raises(rtdnn.BadParamError) as info:
        rtdnn.conv_backward_filter(
            x, dy, w.shape, padding=1, algo=algo, workspace_limit=need - 1, out=out
        )
    assert "workspace_limit" in str(info.value) and str(need) in str(info.value)
    assert torch.equal(out, torch.ones(w.shape))
    # Exactly the need is enough.
    dw = rtdnn.conv_backward_filter(
        x, dy, w.shape, padding=1, algo=algo, workspace_limit=need, math="fp32"
    )
    ref = reference.conv_backward_filter(x, dy, w.shape, padding=1)
    assert reference.rel_error(dw, ref) <= TOL[torch.float32]
