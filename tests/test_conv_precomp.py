"""IMPLICIT_PRECOMP_GEMM against the float64 reference, every direction, through the
interpreter: 1-D (a filter of more than 32 taps: two validity words), 2-D and 3-D, stride,
dilation, padding larger than the filter, groups, both modes, the packed (few channels) and
per-tap reductions, every layout, alpha/beta and bias on NaN-poisoned outputs, float32 (strict
and TF32, whose filter is read from a copy with the reduced channels contiguous), float16 and
bfloat16; determinism and the exact workspace; selection and the workspace refusal."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import conv_reference, make_tensor, out_size, poisoned_like, run_conv_direction

import rtdnn
from rtdnn import reference, select
from rtdnn.algos import ALGORITHMS, ConvTensors
from rtdnn.algos import implicit_gemm as ig
from rtdnn.algos import implicit_precomp_gemm as precomp
from rtdnn.algos.geometry import conv_geometry
from rtdnn.algos.implicit_precomp_gemm import ImplicitPrecompGemm, _tables
from rtdnn.core import INTERPRETED, ConvDesc, ConvProblem, Direction, TensorDesc

ALGO = "IMPLICIT_PRECOMP_GEMM"
DIRECTIONS = ["forward", "backward_data", "backward_filter"]
#: Relative error against float64: float32 strict sums (IMPLICIT_GEMM's), TF32 products (10-bit
#: mantissas), and the 16-bit types' rounding of the result (float32 accumulation).
TOL = {"fp32": 1e-5, "tf32": 3e-3, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def _tuple(v, n):
    return (v,) * n if isinstance(v, int) else tuple(v)


def y_shape(x_shape, w_shape, conv) -> tuple[int, ...]:
    nd = len(x_shape) - 2
    o = out_size(
        x_shape[2:], w_shape[2:], _tuple(conv.get("stride", 1), nd),
        _tuple(conv.get("padding", 0), nd), _tuple(conv.get("dilation", 1), nd),
    )  # fmt: skip
    return (x_shape[0], w_shape[0], *o)


def _problem(direction, x, w, y, math_mode="fp32", device="cpu", **conv) -> ConvProblem:
    desc = ConvDesc.create(
        x.dim() - 2, conv.get("stride", 1), conv.get("padding", 0), conv.get("dilation", 1),
        conv.get("groups", 1), conv.get("mode", "cross_correlation"), math_mode,
    )  # fmt: skip
    return ConvProblem.create(
        Direction(direction), TensorDesc.of(x), TensorDesc.of(w), TensorDesc.of(y), desc, device
    )


def run_direction(direction, x, w, dy, *, dtype, math_mode="fp32", **kw):
    """One direction with IMPLICIT_PRECOMP_GEMM (float32 at the math mode's tolerance):
    run_conv_direction."""
    tol = TOL[math_mode] if dtype == torch.float32 else TOL[dtype]
    return run_conv_direction(
        direction, x, w, dy, algo=ALGO, dtype=dtype, math=math_mode, tol=tol, **kw
    )


def check(x_shape, w_shape, *, dtype=torch.float32, layout="contiguous", gen=None,
          directions=DIRECTIONS, **kw):  # fmt: skip
    """Every direction of one problem, inputs and output in `layout`."""
    conv = {k: v for k, v in kw.items() if k in ("stride", "padding", "dilation", "groups", "mode")}
    x = make_tensor(x_shape, dtype, layout, gen)
    w = make_tensor(w_shape, dtype, layout, gen)
    dy = make_tensor(y_shape(x_shape, w_shape, conv), dtype, layout, gen)
    for direction in directions:
        run_direction(direction, x, w, dy, dtype=dtype, layout=layout, gen=gen, **kw)


# (id, x shape, w shape, conv parameters)
CASES = [
    (
        "1d-stride2-dil2-groups",
        (2, 4, 11),
        (6, 2, 3),
        dict(stride=2, dilation=2, padding=3, groups=2),
    ),  # fmt: skip
    ("1d-33taps", (1, 2, 40), (3, 2, 33), dict(padding=2)),
    ("2d-pad-beyond-filter", (1, 3, 5, 6), (4, 3, 2, 3), dict(stride=(2, 1), padding=(3, 4))),
    ("2d-3x3-stride2", (2, 3, 7, 6), (4, 3, 3, 3), dict(stride=2, padding=1)),
    (
        "2d-dil-conv",
        (1, 4, 7, 8),
        (8, 2, 3, 2),
        dict(dilation=(2, 3), padding=(2, 1), groups=2, mode="convolution"),
    ),  # fmt: skip
    ("2d-1x1-stride2", (2, 3, 5, 4), (4, 3, 1, 1), dict(stride=2)),
    (
        "3d",
        (1, 2, 4, 5, 4),
        (2, 2, 3, 3, 2),
        dict(stride=(1, 2, 1), padding=1, mode="convolution"),
    ),  # fmt: skip
]


@pytest.mark.parametrize("x_shape,w_shape,conv", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_shapes_against_reference(x_shape, w_shape, conv, gen):
    check(x_shape, w_shape, gen=gen, **conv)


def test_tables_cover_every_direction_and_word():
    """The cases above do read tables (not the 1x1 shortcut), with two words per pixel for 33
    taps, one table per stride phase in backward-data and dy's offsets in backward-filter."""
    x, w = torch.empty(1, 2, 40), torch.empty(3, 2, 33)
    y = torch.empty(y_shape(x.shape, w.shape, dict(padding=2)))
    for direction in DIRECTIONS:
        p = _problem(direction, x, w, y, padding=2)
        t = _tables(p, conv_geometry(p))
        assert t.specs[0][0].words == 2 and t.dtype == torch.int32
        pixels = 12 if direction != "backward_data" else 40
        extra = 2 * pixels if direction == "backward_filter" else 0
        assert t.nbytes == 4 * (2 * pixels + extra) == ALGORITHMS[ALGO].workspace_bytes(p)
    x, w = torch.empty(2, 4, 11), torch.empty(6, 2, 3)
    y = torch.empty(y_shape(x.shape, w.shape, dict(stride=2, dilation=2, padding=3)))
    p = _problem("backward_data", x, w, y, stride=2, dilation=2, padding=3, groups=2)
    phases = _tables(p, conv_geometry(p)).specs
    assert [s.taps for s, _ in phases] == [(1, 1, 3), (1, 1, 0)]  # odd pixels: no tap reaches


def test_backward_data_with_no_tap_reaching_any_pixel(gen):
    """Every input pixel lies where only padding is read: no table at all, dx = beta * dx."""
    conv = dict(stride=(1, 2), padding=(0, 1))
    w = make_tensor((2, 3, 1, 1), torch.float32, generator=gen)
    dy = make_tensor((1, 2, 3, 2), torch.float32, generator=gen)
    x = torch.empty(1, 3, 3, 1)
    assert ALGORITHMS[ALGO].workspace_bytes(_problem("backward_data", x, w, dy, **conv)) == 0
    for beta in (0.0, 0.5):
        run_direction("backward_data", x, w, dy, dtype=torch.float32, beta=beta, gen=gen, **conv)


def test_pointwise_needs_no_table(gen):
    """1x1, stride 1, no padding, evenly spaced pixels (channels-last): nothing to precompute;
    it runs as IMPLICIT_GEMM does. NCHW with two images is not evenly spaced: a table."""
    last = torch.channels_last
    x, w = torch.empty(2, 3, 5, 4).to(memory_format=last), torch.empty(4, 3, 1, 1)
    y = torch.empty(2, 4, 5, 4).to(memory_format=last)
    for direction in DIRECTIONS:
        assert ALGORITHMS[ALGO].workspace_bytes(_problem(direction, x, w, y)) == 0
        p = _problem(direction, x.contiguous(), w, y.contiguous())
        assert ALGORITHMS[ALGO].workspace_bytes(p) > 0
    check((2, 3, 5, 4), (4, 3, 1, 1), layout="channels_last", gen=gen)


def test_offsets_past_int32_take_a_wide_table():
    """Backward-filter's stored offsets: int64 when they can pass 2^31 elements (plan only)."""
    xd = TensorDesc((600, 64, 240, 240), (64 * 240 * 240, 1, 240 * 64, 64), torch.float16)
    wd = TensorDesc((64, 64, 3, 3), (576, 9, 3, 1), torch.float16)
    yd = TensorDesc((600, 64, 240, 240), (64 * 240 * 240, 1, 240 * 64, 64), torch.float16)
    desc = ConvDesc.create(2, 1, 1, 1, 1, "cross_correlation", "fp32")
    for direction, wide in (("backward_filter", True), ("forward", False)):
        p = ConvProblem.create(Direction(direction), xd, wd, yd, desc, "cuda")
        t = _tables(p, conv_geometry(p))
        assert t.dtype == (torch.int64 if wide else torch.int32)
        assert t.nbytes % t.dtype.itemsize == 0


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_wide_table_runs(direction, gen, monkeypatch):
    """The int64 table (its offsets and words) on a small problem, forced."""

    def wide(p, geo):
        t = _tables(p, geo)
        return dataclasses.replace(t, dtype=torch.int64, nbytes=2 * t.nbytes)

    conv = dict(stride=2, padding=2, dilation=(1, 2))
    x = make_tensor((2, 3, 7, 6), torch.float32, "channels_last", gen)
    w = make_tensor((4, 3, 3, 2), torch.float32, "channels_last", gen)
    dy = make_tensor(y_shape(x.shape, w.shape, conv), torch.float32, "channels_last", gen)
    p = _problem(direction, x, w, dy, **conv)
    narrow = ALGORITHMS[ALGO].workspace_bytes(p)
    monkeypatch.setattr(precomp, "_tables", wide)
    algo = ImplicitPrecompGemm()
    need = algo.workspace_bytes(p)
    assert need == 2 * narrow
    out = poisoned_like({"forward": dy, "backward_data": x, "backward_filter": w}[direction])
    workspace = torch.empty(need, dtype=torch.uint8)
    algo.run(p, ConvTensors(x, w, dy).with_written(p.direction, out), workspace)
    err = reference.rel_error(out, conv_reference(direction, x, w, dy, **conv))
    assert err <= TOL["fp32"], f"{direction}: {err:.2e}"


def test_per_tap_reduction_with_few_channels(gen, monkeypatch):
    """The per-tap loads (forward and backward-filter with 16 or more channels per group)
    on tiny channels: pack nothing, on a fresh instance so no prepared runner is shared."""
    monkeypatch.setattr(ig, "PACK_BELOW", 1)
    algo = ImplicitPrecompGemm()
    conv = dict(stride=(2, 1), padding=(2, 1), dilation=(1, 2), groups=2)
    x = make_tensor((2, 4, 6, 7), torch.float32, "channels_last", gen)
    w = make_tensor((6, 2, 3, 2), torch.float32, "channels_last", gen)
    dy = make_tensor(y_shape(x.shape, w.shape, conv), torch.float32, "channels_last", gen)
    for direction in ("forward", "backward_filter"):
        p = _problem(direction, x, w, dy, **conv)
        assert not ig.packed(p)
        out = poisoned_like({"forward": dy, "backward_filter": w}[direction])
        algo.run(p, ConvTensors(x, w, dy).with_written(p.direction, out),
                 torch.empty(algo.workspace_bytes(p), dtype=torch.uint8))  # fmt: skip
        err = reference.rel_error(out, conv_reference(direction, x, w, dy, **conv))
        assert err <= TOL["fp32"], f"{direction}: {err:.2e}"


@pytest.mark.parametrize("layout", ["channels_last", "strided"])
def test_layouts_with_alpha_beta(layout, gen):
    """Channels-last and strided views (inputs and out), alpha and beta on a random out."""
    check((2, 4, 7, 6), (4, 2, 3, 3), layout=layout, alpha=0.5, beta=-0.75, gen=gen,
          groups=2, padding=1, stride=(1, 2))  # fmt: skip


def test_alpha_and_bias_on_poisoned_out(gen):
    """beta = 0 never reads out (NaN); alpha scales the convolution, not the bias."""
    x = make_tensor((2, 3, 6, 7), torch.float32, generator=gen)
    w = make_tensor((5, 3, 3, 3), torch.float32, generator=gen)
    b = make_tensor((5,), torch.float32, generator=gen)
    dy = make_tensor((2, 5, 6, 7), torch.float32, generator=gen)
    kw = dict(dtype=torch.float32, padding=1, gen=gen)
    run_direction("forward", x, w, dy, alpha=-1.5, bias=b, **kw)
    run_direction("forward", x, w, dy, alpha=2.0, beta=0.5, bias=b, **kw)
    for direction in DIRECTIONS[1:]:
        run_direction(direction, x, w, dy, alpha=2.0, **kw)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precision(dtype, gen):
    """16-bit storage, float32 accumulation. In the interpreter the GEMM upcasts bfloat16
    tiles (its tl.dot is wrong there): without that this would fail."""
    assert INTERPRETED
    check((2, 4, 7, 6), (4, 4, 3, 2), dtype=dtype, layout="channels_last", gen=gen,
          padding=(2, 0), stride=(2, 1), mode="convolution")  # fmt: skip


def test_tf32(gen):
    x = make_tensor((2, 3, 6, 5), torch.float32, generator=gen)
    w = make_tensor((4, 3, 3, 3), torch.float32, generator=gen)
    dy = make_tensor((2, 4, 6, 5), torch.float32, generator=gen)
    for direction in DIRECTIONS:
        run_direction(direction, x, w, dy, dtype=torch.float32, math_mode="tf32", padding=1)


@pytest.mark.parametrize("math_mode", ["fp32", "tf32"])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_deterministic_and_workspace_exact(direction, math_mode, gen):
    """A workspace of exactly the declared bytes, NaN beforehand, followed by a guard: two runs
    are bit-identical and right, the table (in TF32 backward-data: the filter copy) reaches
    the last byte, the guard is untouched."""
    conv = dict(padding=2, stride=2, groups=2, mode="convolution")
    x = make_tensor((2, 4, 7, 6), torch.float32, "channels_last", gen)
    w = make_tensor((4, 2, 3, 3), torch.float32, "channels_last", gen)
    dy = make_tensor(y_shape(x.shape, w.shape, conv), torch.float32, "channels_last", gen)
    p = _problem(direction, x, w, dy, math_mode, **conv)
    copied = precomp.tf32_filter_copy(p) is not None
    assert copied == (math_mode == "tf32" and direction == "backward_data")
    a = ALGORITHMS[ALGO]
    need = a.workspace_bytes(p)
    assert need > 0 and need % 4 == 0
    guard = 64
    results = []
    for _ in range(2):
        workspace = torch.full(((need + guard) // 4,), math.nan).view(torch.uint8)
        written = {"forward": dy, "backward_data": x, "backward_filter": w}[direction]
        out = poisoned_like(written)
        a.run(p, ConvTensors(x, w, dy).with_written(p.direction, out), workspace[:need])
        results.append(out)
        assert not torch.isnan(workspace[need - 4 : need].view(torch.float32)).any()
        assert torch.isnan(workspace[need:].view(torch.float32)).all(), "wrote past the workspace"
    assert torch.equal(results[0], results[1])
    ref = conv_reference(direction, x, w, dy, **conv)
    assert reference.rel_error(results[0], ref) <= TOL[math_mode]


def test_tf32_filter_copy_layout():
    """TF32 reads a copy of the filter with the reduced channels innermost: channels-last in
    forward (c, then the taps, then k), k then c then the taps in backward-data; and builds no
    tables. No copy where the filter already has them, with one reduced channel per group
    (depthwise backward-data), in strict float32, or in backward-filter."""
    last = torch.channels_last
    x, w, y = torch.empty(2, 6, 7, 5), torch.empty(8, 3, 3, 2), torch.empty(2, 8, 7, 6)
    conv = dict(padding=1, groups=2)

    def copy(direction, w, math_mode="tf32"):
        return precomp.tf32_filter_copy(_problem(direction, x, w, y, math_mode, **conv))

    assert copy("backward_data", w.to(memory_format=last)).strides == (1, 8, 48, 24)
    assert copy("backward_data", w).strides == (1, 8, 48, 24)
    assert copy("forward", w).strides == (18, 1, 6, 3)
    assert copy("forward", w.to(memory_format=last)) is None  # c is innermost already
    assert copy("backward_data", w.permute(3, 2, 1, 0).contiguous().permute(3, 2, 1, 0)) is None
    assert copy("backward_filter", w) is None
    xd, wd, yd = torch.empty(2, 6, 7, 5), torch.empty(6, 1, 3, 2), torch.empty(2, 6, 7, 6)
    depthwise = _problem("backward_data", xd, wd, yd, "tf32", padding=1, groups=6)
    assert precomp.tf32_filter_copy(depthwise) is None
    assert copy("backward_data", w, "fp32") is None
    p = _problem("backward_data", x, w, y, "tf32", **conv)
    assert ALGORITHMS[ALGO].workspace_bytes(p) == w.numel() * 4


def test_tf32_gemm_reads_the_filter_copy(gen, monkeypatch):
    """The GEMMs read the copy, not the filter given: with a fill that writes twice the filter,
    the result is twice the reference."""

    def doubling(op, plan, num_in, beta_nonzero):
        def fill(out, inputs, *args):
            out.copy_(2 * inputs[0])

        return fill

    monkeypatch.setattr(precomp.ew, "prepared_launch", doubling)
    conv = dict(padding=1, stride=(2, 1), groups=2, mode="convolution")
    x = make_tensor((2, 4, 7, 6), torch.float32, "channels_last", gen)
    w = make_tensor((6, 2, 3, 2), torch.float32, "channels_last", gen)
    dy = make_tensor(y_shape(x.shape, w.shape, conv), torch.float32, "channels_last", gen)
    p = _problem("backward_data", x, w, dy, "tf32", **conv)
    algo = ImplicitPrecompGemm()
    out = poisoned_like(x)
    workspace = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8)
    algo.run(p, ConvTensors(out, w, dy), workspace)
    ref = conv_reference("backward_data", x, w, dy, **conv)
    assert reference.rel_error(out, 2 * ref) <= TOL["fp32"]


def test_tf32_copy_offers_no_tma_tiles(monkeypatch):
    """The opt-in TMA kernels read the filter as given (channels-last): with a filter copy
    they are not offered, where IMPLICIT_GEMM on the same problem offers them."""
    monkeypatch.setenv(ig.TMA_ENV, "1")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    last = torch.channels_last
    x = torch.empty(2, 64, 8, 8).to(memory_format=last)
    w = torch.empty(64, 64, 3, 3).to(memory_format=last)
    p = _problem("backward_data", x, w, x, "tf32", "cuda", padding=1)
    assert precomp.tf32_filter_copy(p) is not None
    assert any(getattr(t, "tma", False) for t in ALGORITHMS["IMPLICIT_GEMM"].tile_candidates(p))
    assert not any(getattr(t, "tma", False) for t in ALGORITHMS[ALGO].tile_candidates(p))


# -- selection and refusals ---------------------------------------------------------------------


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_heuristic_chooses_it_for_tf32_filter_copies(direction):
    """`auto` takes it first where it copies the filter (TF32 backward-data of a channels-last
    filter), and keeps to the other algorithms elsewhere."""
    last = torch.channels_last
    x, w = torch.empty(2, 16, 8, 8).to(memory_format=last), torch.empty(16, 16, 3, 3)
    w = w.to(memory_format=last)
    tf32 = rtdnn.get_conv_algorithm(x, w, direction=direction, padding=1, math="tf32")
    assert (tf32 == ALGO) == (direction == "backward_data")
    assert rtdnn.get_conv_algorithm(x, w, direction=direction, padding=1, math="fp32") != ALGO


def test_find_lists_it(gen, monkeypatch):
    monkeypatch.setattr(select, "_measured", {})  # keep other tests' measurements apart
    x = make_tensor((1, 2, 5, 4), torch.float32, generator=gen)
    w = make_tensor((2, 2, 3, 3), torch.float32, generator=gen)
    results = rtdnn.find_conv_algorithms(x, w, direction="backward_filter", padding=1,
                                         math="fp32")  # fmt: skip
    r = {r.algo: r for r in results}[ALGO]
    p = _problem("backward_filter", x, w, torch.empty(1, 2, 5, 4), padding=1)
    assert r.status == "ok" and math.isfinite(r.time_ms), r
    assert r.workspace_bytes == ALGORITHMS[ALGO].workspace_bytes(p) > 0
    assert r.deterministic is True


def test_forced_below_workspace(gen):
    x = make_tensor((2, 3, 6, 6), torch.float32, generator=gen)
    w = make_tensor((4, 3, 3, 3), torch.float32, generator=gen)
    dy = make_tensor((2, 4, 6, 6), torch.float32, generator=gen)
    p = _problem("forward", x, w, dy, padding=1)
    need = ALGORITHMS[ALGO].workspace_bytes(p)
    out = torch.ones(dy.shape)
    with pytest.raises(rtdnn.BadParamError, match=rf"workspace_limit.*{need} bytes"):
        rtdnn.conv_forward(
            x, w, padding=1, algo=ALGO, workspace_limit=need - 1, out=out, math="fp32"
        )
    assert torch.equal(out, torch.ones(dy.shape)), "out written although rejected"
    y = rtdnn.conv_forward(x, w, padding=1, algo=ALGO, workspace_limit=need, math="fp32")
    assert reference.rel_error(y, reference.conv_forward(x, w, padding=1)) <= TOL["fp32"]
