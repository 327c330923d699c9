"""Explicit edge cases of the convolution API, each checked against the float64 reference."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import (
    MATH,
    assert_close,
    assert_gaps_untouched,
    is_channels_last,
    make_tensor,
    out_size,
    poisoned,
    poisoned_like,
)

import rtdnn
from rtdnn import reference
from rtdnn.algos import geometry
from rtdnn.algos.geometry import brgemm_precision
from rtdnn.algos.implicit_gemm import (
    TF32_FIRST_ABOVE_COLUMNS,
    ImplicitGemmTiles,
    filter_row_columns,
    filter_row_splits,
    row_pairs,
    split_count,
)
from rtdnn.core import ConvDesc, ConvProblem, Direction, TensorDesc, conv_output_shape
from rtdnn.core.handle import stream_counters

ALGOS = ["IMPLICIT_GEMM", "GEMM"]
FILTER_ALGOS = ["IMPLICIT_GEMM", "GEMM", "IMPLICIT_GEMM_SPLIT_K"]


def _conv_kwargs(stride, padding, dilation, groups=1, mode="cross_correlation"):
    return dict(stride=stride, padding=padding, dilation=dilation, groups=groups, mode=mode)


def check_all_directions(
    x_shape, w_shape, *, algo, filter_algo=None, dtype=torch.float32, gen=None, **conv
):
    """Forward, backward-data and backward-filter of one problem, each written into a
    NaN-poisoned `out`, against the reference. Returns (y, dx, dw) for further checks."""
    conv = _conv_kwargs(**{"stride": 1, "padding": 0, "dilation": 1, **conv})
    spatial = len(x_shape) - 2
    as_t = lambda v: (v,) * spatial if isinstance(v, int) else tuple(v)
    o = out_size(
        x_shape[2:], w_shape[2:], as_t(conv["stride"]), as_t(conv["padding"]),
        as_t(conv["dilation"]),
    )  # fmt: skip
    y_shape = (x_shape[0], w_shape[0], *o)
    x = make_tensor(x_shape, dtype, generator=gen)
    w = make_tensor(w_shape, dtype, generator=gen)
    dy = make_tensor(y_shape, dtype, generator=gen)

    y = rtdnn.conv_forward(x, w, out=poisoned(y_shape, dtype), algo=algo, math=MATH, **conv)
    assert_close(y, reference.conv_forward(x, w, **conv))

    dx = rtdnn.conv_backward_data(
        dy, w, x_shape, out=poisoned(x_shape, dtype), algo=algo, math=MATH, **conv
    )
    assert_close(dx, reference.conv_backward_data(dy, w, x_shape, **conv))

    dw = rtdnn.conv_backward_filter(
        x, dy, w_shape, out=poisoned(w_shape, dtype), algo=filter_algo or algo, math=MATH, **conv
    )
    assert_close(dw, reference.conv_backward_filter(x, dy, w_shape, **conv))
    return y, dx, dw


# -- small sizes ---------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("spatial", [(5,), (4, 3), (2, 3, 2)], ids=["1d", "2d", "3d"])
def test_batch_one_single_channel(algo, spatial, gen):
    nd = len(spatial)
    check_all_directions((1, 1, *spatial), (1, 1, *([2] * nd)), algo=algo, gen=gen, padding=1)


@pytest.mark.parametrize("algo", FILTER_ALGOS)
def test_one_pixel_output(algo, gen):
    """A 3x3 filter over a 3x3 image: one output pixel, every input pixel one filter tap."""
    algo_fwd = "IMPLICIT_GEMM" if algo == "IMPLICIT_GEMM_SPLIT_K" else algo
    y, _, _ = check_all_directions(
        (2, 3, 3, 3), (4, 3, 3, 3), algo=algo_fwd, filter_algo=algo, gen=gen
    )
    assert y.shape == (2, 4, 1, 1)


@pytest.mark.parametrize("algo", ALGOS)
def test_one_pixel_output_from_dilation_and_stride(algo, gen):
    """Dilation 2 spans the whole 5-wide input; stride 3 leaves no second position."""
    y, _, _ = check_all_directions(
        (1, 2, 5, 5), (2, 2, 3, 3), algo=algo, gen=gen, dilation=2, stride=3
    )
    assert y.shape == (1, 2, 1, 1)


# -- padding and stride --------------------------------------------------------------------


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize(
    "kernel, padding, stride", [(1, 3, 1), (2, 3, 2), (3, (3, 0), (1, 2))], ids=str
)
def test_padding_larger_than_kernel(algo, kernel, padding, stride, gen):
    check_all_directions(
        (2, 3, 4, 5), (2, 3, kernel, kernel), algo=algo, gen=gen, padding=padding, stride=stride
    )


@pytest.mark.parametrize("algo", ALGOS)
def test_output_rows_of_padding_only_are_bias(algo, gen):
    """With padding 3 and a 1x1 filter, the outer three rings of y see only zeros: y == bias."""
    x = make_tensor((1, 2, 2, 2), torch.float32, generator=gen)
    w = make_tensor((3, 2, 1, 1), torch.float32, generator=gen)
    b = torch.tensor([1.5, -2.0, 0.25])
    y = rtdnn.conv_forward(x, w, b, padding=3, algo=algo, math=MATH)
    assert y.shape == (1, 3, 8, 8)
    ring = torch.ones(8, 8, dtype=torch.bool)
    ring[3:5, 3:5] = False
    assert torch.equal(y[0][:, ring], b[:, None].expand(3, int(ring.sum())))
    assert_close(y, reference.conv_forward(x, w, b, padding=3))


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("kernel", [1, 2])
def test_stride_larger_than_kernel(algo, kernel, gen):
    """Stride 3 skips input pixels: their gradient must be written as exactly zero."""
    x_shape, w_shape = (2, 2, 7, 8), (3, 2, kernel, kernel)
    _, dx, _ = check_all_directions(x_shape, w_shape, algo=algo, gen=gen, stride=3)
    skipped = torch.ones(7, 8, dtype=torch.bool)
    for i in range(0, 7, 3):
        for j in range(0, 8, 3):
            skipped[i : i + kernel, j : j + kernel] = False
    assert skipped.any()
    assert torch.all(dx[:, :, skipped] == 0)


# -- sizes that do not fill the 32x32x16 CPU tile ------------------------------------------


@pytest.mark.parametrize("algo", ALGOS)
def test_sizes_not_multiple_of_tile(algo, gen):
    """33 output (and input) pixels and 17 input / 33 output channels: every GEMM dim has a
    ragged last tile (32 + 1 rows, 16 + 1 reduction channels, 32 + 1 columns)."""
    y, dx, dw = check_all_directions(
        (1, 17, 3, 11), (33, 17, 3, 3), algo=algo, filter_algo=algo, gen=gen, padding=1
    )
    assert y.shape == (1, 33, 3, 11)


def test_sizes_not_multiple_of_tile_split_k(gen):
    x = make_tensor((1, 17, 3, 11), torch.float32, generator=gen)
    dy = make_tensor((1, 33, 3, 11), torch.float32, generator=gen)
    dw = rtdnn.conv_backward_filter(
        x, dy, (33, 17, 1, 1), algo="IMPLICIT_GEMM_SPLIT_K", out=poisoned((33, 17, 1, 1), x.dtype)
    )
    assert_close(dw, reference.conv_backward_filter(x, dy, (33, 17, 1, 1)))


@pytest.mark.parametrize("algo", ALGOS)
def test_grouped_ragged_channels(algo, gen):
    """Groups of 17 input and 3 output channels."""
    check_all_directions((1, 34, 2, 3), (6, 17, 2, 2), algo=algo, gen=gen, groups=2, padding=1)


# -- 1x1 convolution -----------------------------------------------------------------------


@pytest.mark.parametrize("algo", ALGOS)
def test_one_by_one_is_a_matmul(algo, gen):
    x = make_tensor((2, 5, 3, 4), torch.float32, "channels_last", gen)
    w = make_tensor((6, 5, 1, 1), torch.float32, generator=gen)
    y = rtdnn.conv_forward(x, w, algo=algo, math=MATH)
    expected = torch.einsum("nchw,kc->nkhw", x.double(), w[:, :, 0, 0].double())
    assert_close(y, expected)
    assert is_channels_last(y)


# -- unusual strides and scaling ------------------------------------------------------------


@pytest.mark.parametrize("algo", ALGOS)
def test_broadcast_inputs(algo, gen):
    """Inputs may overlap themselves (stride 0): they are only read."""
    x = make_tensor((1, 3, 1, 5), torch.float32, generator=gen).expand(2, 3, 4, 5)
    w = make_tensor((2, 3, 1, 1), torch.float32, generator=gen).expand(2, 3, 2, 2)
    assert 0 in x.stride() and 0 in w.stride()
    y = rtdnn.conv_forward(x, w, padding=1, algo=algo, math=MATH)
    assert_close(y, reference.conv_forward(x, w, padding=1))
    dy = make_tensor((2, 2, 1, 6), torch.float32, generator=gen).expand(2, 2, 5, 6)
    dx = rtdnn.conv_backward_data(dy, w, x.shape, padding=1, algo=algo, math=MATH)
    assert_close(dx, reference.conv_backward_data(dy, w, x.shape, padding=1))
    dw = rtdnn.conv_backward_filter(x, dy, w.shape, padding=1, algo=algo, math=MATH)
    assert_close(dw, reference.conv_backward_filter(x, dy, w.shape, padding=1))


@pytest.mark.parametrize("algo", FILTER_ALGOS)
def test_alpha_zero_beta_one_keeps_out(algo, gen):
    """out = 0 * op + 1 * out: bit-identical to its prior value, in every direction."""
    x = make_tensor((1, 2, 4, 4), torch.float32, generator=gen)
    w = make_tensor((3, 2, 3, 3), torch.float32, generator=gen)
    dy = make_tensor((1, 3, 2, 2), torch.float32, generator=gen)
    scale = dict(alpha=0.0, beta=1.0, math=MATH)
    fwd_algo = "IMPLICIT_GEMM" if algo == "IMPLICIT_GEMM_SPLIT_K" else algo
    for call, shape in [
        (lambda o: rtdnn.conv_forward(x, w, out=o, algo=fwd_algo, **scale), dy.shape),
        (lambda o: rtdnn.conv_backward_data(dy, w, x.shape, out=o, algo=fwd_algo, **scale),
         x.shape),
        (lambda o: rtdnn.conv_backward_filter(x, dy, w.shape, out=o, algo=algo, **scale),
         w.shape),
    ]:  # fmt: skip
        out = make_tensor(shape, torch.float32, generator=gen)
        prior = out.clone()
        assert call(out) is out
        assert torch.equal(out, prior)


@pytest.mark.parametrize("math_mode", ["tf32", None])
def test_tf32_and_default_math_modes_run(math_mode, gen):
    """math="tf32" and None (torch's allow_tf32 decides) are accepted for float32 data; the
    interpreter multiplies in full float32 anyway, so only a TF32-sized error bound holds."""
    x = make_tensor((1, 16, 3, 3), torch.float32, generator=gen)
    w = make_tensor((2, 16, 3, 3), torch.float32, generator=gen)
    y = rtdnn.conv_forward(x, w, padding=1, math=math_mode)
    assert reference.rel_error(y, reference.conv_forward(x, w, padding=1)) < 2e-3


@pytest.mark.parametrize("algo", [*FILTER_ALGOS, "IMPLICIT_PRECOMP_GEMM"])
@pytest.mark.parametrize("channels", [3, 20], ids=["packed", "per-tap"])
def test_tf32_weight_gradient_as_three_bfloat16_products(algo, channels, gen):
    """Under TF32 the GEMM algorithms' weight gradients of channels-last tensors multiply as
    three bfloat16 products (kernels/brgemm.py, "bf16x3"): within 5e-5 of float64, more exact
    than TF32's 2^-11 and far from the 4e-3 of a head-only split, yet not the 1e-7 of the
    interpreter's float32 products (so the split ran); the other directions, and NCHW x and
    dy (pixels innermost, which TF32 products read well), keep TF32 products."""
    conv = dict(padding=1, stride=(1, 2))
    x = make_tensor((2, channels, 7, 6), torch.float32, "channels_last", gen)
    w = make_tensor((24, channels, 3, 3), torch.float32, "channels_last", gen)
    y_shape = (2, 24, 7, 3)
    dy = make_tensor(y_shape, torch.float32, "channels_last", gen)
    desc = ConvDesc.create(2, (1, 2), 1, 1, 1, "cross_correlation", "tf32")
    descs = [TensorDesc.of(t) for t in (x, w, dy)]
    for direction in Direction:
        p = ConvProblem.create(direction, *descs, desc, "cpu")
        expected = "bf16x3" if direction == Direction.BACKWARD_FILTER else "tf32"
        assert brgemm_precision(p) == expected
    nchw = [TensorDesc.of(t.contiguous()) for t in (x, w, dy)]
    assert brgemm_precision(ConvProblem.create(Direction.BACKWARD_FILTER, *nchw, desc, "cpu")) == (
        "tf32"
    )
    out = poisoned(w.shape, torch.float32)
    dw = rtdnn.conv_backward_filter(x, dy, w.shape, algo=algo, math="tf32", out=out, **conv)
    err = reference.rel_error(dw, reference.conv_backward_filter(x, dy, w.shape, **conv))
    assert 1e-6 < err < 5e-5


def test_tf32_weight_gradient_products_are_a_tile_choice_on_few_channels(gen, monkeypatch):
    """Few-channel (packed) TF32 weight gradients offer the tuner the same tiles with TF32
    products: after the bf16x3 ones over one tile's (tap, channel) columns (3x3 x 3: 27), before
    them over more (7x7 x 3: 147, TF32_FIRST_ABOVE_COLUMNS); more channels, 16-bit data and
    other directions do not.
    Tiles that ask for TF32 products get them (the interpreter's float32 products: 1e-7, not
    bf16x3's 1e-6 and more)."""
    # No GPU here: an H100's capability and 132 multiprocessors.
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(geometry, "multiprocessor_count", lambda index: 132)
    monkeypatch.setattr(geometry, "_shared_memory_bytes", lambda index: 227 * 1024)
    last = torch.channels_last
    algo = rtdnn.algos.ALGORITHMS["IMPLICIT_GEMM_SPLIT_K"]

    def problem(direction, channels, dtype=torch.float32, math="tf32", device="cuda", size=7):
        x = torch.empty(8, channels, 32, 32, dtype=dtype).to(memory_format=last)
        w = torch.empty(64, channels, size, size, dtype=dtype).to(memory_format=last)
        y = torch.empty(8, 64, 16, 16, dtype=dtype).to(memory_format=last)
        desc = ConvDesc.create(2, 2, size // 2, 1, 1, "cross_correlation", math)
        descs = [TensorDesc.of(t) for t in (x, w, y)]
        return ConvProblem.create(Direction(direction), *descs, desc, device)

    assert 3 * 3 * 3 <= TF32_FIRST_ABOVE_COLUMNS < 7 * 7 * 3
    tiles = algo.tile_candidates(problem("backward_filter", 3, size=3))
    chosen = [getattr(t, "precision", "") for t in tiles]
    assert chosen[0] == "" and "tf32" in chosen
    assert chosen.index("tf32") > max(i for i, c in enumerate(chosen) if c == "")
    tiles = algo.tile_candidates(problem("backward_filter", 3))
    chosen = [getattr(t, "precision", "") for t in tiles]
    assert chosen[0] == "tf32" and "" in chosen
    assert chosen.index("") > max(i for i, c in enumerate(chosen) if c == "tf32")
    for q in (
        problem("backward_filter", 20),
        problem("backward_filter", 3, torch.bfloat16, "fp32"),
        problem("forward", 3),
    ):
        assert all(getattr(t, "precision", "") == "" for t in algo.tile_candidates(q))
    # On the CPU: the same problem run with each precision's tiles.
    x = make_tensor((2, 3, 9, 8), torch.float32, "channels_last", gen)
    dy = make_tensor((2, 8, 5, 4), torch.float32, "channels_last", gen)
    w = torch.empty(8, 3, 3, 3).to(memory_format=last)
    desc = ConvDesc.create(2, 2, 1, 1, 1, "cross_correlation", "tf32")
    p = ConvProblem.create(
        Direction.BACKWARD_FILTER, *[TensorDesc.of(t) for t in (x, w, dy)], desc, "cpu"
    )
    ref = reference.conv_backward_filter(x, dy, w.shape, stride=2, padding=1)
    base = algo.tile_candidates(p)[0]
    errors = {}
    for precision in ("", "tf32"):
        tiles = ImplicitGemmTiles(**dataclasses.asdict(base), precision=precision)
        out = poisoned_like(w)
        workspace = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8)
        algo.prepare(p, tiles)(rtdnn.algos.ConvTensors(x, out, dy), workspace, 1.0, 0.0)
        errors[precision] = reference.rel_error(out, ref)
    assert errors["tf32"] < 1e-6 < errors[""] < 5e-5, errors


@pytest.mark.parametrize("case", ["inf", "nan", "near-float32-max"])
def test_tf32_weight_gradient_split_keeps_float32_specials(case, gen):
    """The bfloat16 split of a float32 value: an infinity stays infinite (not inf - inf = NaN in
    its tail), a NaN stays NaN, and a finite value above bfloat16's largest gets a finite head
    (its tail holds the rest), so the result has the float64 reference's infinities and NaNs
    and, for large finite values, its accuracy."""
    x = make_tensor((1, 16, 5, 5), torch.float32, "channels_last", gen)
    dy = make_tensor((1, 16, 5, 5), torch.float32, "channels_last", gen)
    if case == "near-float32-max":
        dy = dy * (3.4e38 / dy.abs().max())
        x = x * 1e-30
    else:
        dy[0, 3, 2, 2] = float(case)
    w_shape = (16, 16, 3, 3)
    dw = rtdnn.conv_backward_filter(x, dy, w_shape, padding=1, math="tf32", algo="IMPLICIT_GEMM")
    ref = reference.conv_backward_filter(x, dy, w_shape, padding=1)
    assert torch.equal(dw.isinf(), ref.isinf()) and torch.equal(dw.isnan(), ref.isnan())
    assert torch.equal(dw.isinf().any(), torch.tensor(case == "inf"))
    if case == "near-float32-max":
        assert reference.rel_error(dw, ref) < 5e-5


# -- bias ----------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_forward_bias_with_alpha_beta(algo, dtype, gen):
    x = make_tensor((2, 3, 4, 4), dtype, generator=gen)
    w = make_tensor((5, 3, 3, 3), dtype, generator=gen)
    b = make_tensor((10,), dtype, generator=gen)[::2]  # a strided bias
    out = make_tensor((2, 5, 2, 2), dtype, generator=gen)
    prior = out.clone()
    y = rtdnn.conv_forward(x, w, b, alpha=0.5, beta=-1.5, out=out, algo=algo, math=MATH)
    assert y is out
    assert_close(y, reference.conv_forward(x, w, b, alpha=0.5, beta=-1.5, out=prior))


@pytest.mark.parametrize("algo", ALGOS)
def test_forward_bias_is_not_scaled_by_alpha(algo, gen):
    """y = alpha * conv + bias: with a zero filter every output is exactly the bias."""
    x = make_tensor((1, 2, 3, 3), torch.float32, generator=gen)
    w = torch.zeros(4, 2, 2, 2)
    b = torch.tensor([1.0, -2.0, 0.5, 3.0])
    y = rtdnn.conv_forward(x, w, b, alpha=3.0, algo=algo, math=MATH)
    assert torch.equal(y, b.view(1, 4, 1, 1).expand(1, 4, 2, 2))


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_backward_bias(layout, dtype, gen):
    dy = make_tensor((2, 5, 3, 4), dtype, layout, gen)
    db = rtdnn.conv_backward_bias(dy)
    assert db.shape == (5,) and db.dtype == dtype
    assert_close(db, reference.conv_backward_bias(dy))


@pytest.mark.parametrize("spatial", [(7,), (3, 5), (2, 2, 3)], ids=["1d", "2d", "3d"])
def test_backward_bias_alpha_beta_in_place(spatial, gen):
    dy = make_tensor((2, 4, *spatial), torch.float32, generator=gen)
    out = make_tensor((4,), torch.float32, generator=gen)
    prior = out.clone()
    db = rtdnn.conv_backward_bias(dy, alpha=-0.5, beta=2.0, out=out)
    assert db is out
    assert_close(db, reference.conv_backward_bias(dy, alpha=-0.5, beta=2.0, out=prior))


def test_backward_bias_beta_zero_ignores_nan_out(gen):
    dy = make_tensor((1, 3, 4, 4), torch.float32, generator=gen)
    out = poisoned_like(torch.empty(3))
    db = rtdnn.conv_backward_bias(dy, alpha=2.0, out=out)
    assert db is out
    assert_close(db, reference.conv_backward_bias(dy, alpha=2.0))


def test_backward_bias_strided_out(gen):
    """out is every other element of a NaN buffer: only those elements may be written."""
    dy = make_tensor((2, 3, 5), torch.float32, generator=gen)
    out = torch.full((6,), float("nan"))[::2]
    db = rtdnn.conv_backward_bias(dy, out=out)
    assert_close(db, reference.conv_backward_bias(dy))
    assert_gaps_untouched(out)


def test_backward_bias_channels_last_dy_into_out(gen):
    dy = make_tensor((2, 4, 3, 3), torch.float32, "channels_last", gen)
    out = torch.empty(4)
    assert_close(rtdnn.conv_backward_bias(dy, out=out), reference.conv_backward_bias(dy))


def test_backward_bias_channels_last_dy(gen):
    dy = make_tensor((2, 4, 3, 3), torch.float32, "channels_last", gen)
    db = rtdnn.conv_backward_bias(dy)
    assert db.shape == (4,)
    assert_close(db, reference.conv_backward_bias(dy))


@pytest.mark.parametrize("pixels", [513, 600])
def test_backward_bias_many_pixels(pixels):
    dy = torch.ones(1, 1, pixels)
    db = rtdnn.conv_backward_bias(dy)
    assert db.item() == pixels


def test_backward_bias_many_pixels_random(gen):
    """More pixels than one slice (>= 512), split evenly into multiples of 64: correct."""
    dy = make_tensor((2, 3, 16, 32), torch.float32, generator=gen)  # 1024 pixels
    assert_close(rtdnn.conv_backward_bias(dy), reference.conv_backward_bias(dy))


# -- true convolution ----------------------------------------------------------------------


@pytest.mark.parametrize("algo", ALGOS)
def test_convolution_mode_by_hand(algo):
    """x = [1, 2, 3], w = [1, 0, -1]: cross-correlation gives 1 - 3 = -2, convolution 3 - 1."""
    x = torch.tensor([[[1.0, 2.0, 3.0]]])
    w = torch.tensor([[[1.0, 0.0, -1.0]]])
    xc = rtdnn.conv_forward(x, w, algo=algo, math=MATH)
    cv = rtdnn.conv_forward(x, w, mode="convolution", algo=algo, math=MATH)
    assert xc.flatten().tolist() == [-2.0]
    assert cv.flatten().tolist() == [2.0]


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("spatial", [(6,), (4, 5), (3, 3, 3)], ids=["1d", "2d", "3d"])
def test_convolution_equals_flipped_cross_correlation(algo, spatial, gen):
    """mode="convolution" with w is cross-correlation with w flipped in every spatial dim,
    in all three directions (the gradient w.r.t. the filter comes back flipped)."""
    nd = len(spatial)
    kernel = (3, 2, 2)[:nd] if nd < 3 else (2, 2, 2)
    x_shape, w_shape = (1, 4, *spatial), (4, 2, *kernel)
    conv = dict(padding=1, stride=(2, 1, 1)[:nd], groups=2, algo=algo, math=MATH)
    flip = list(range(2, 2 + nd))
    x = make_tensor(x_shape, torch.float32, generator=gen)
    w = make_tensor(w_shape, torch.float32, generator=gen)
    wf = w.flip(flip)

    y = rtdnn.conv_forward(x, w, mode="convolution", **conv)
    torch.testing.assert_close(y, rtdnn.conv_forward(x, wf, **conv), rtol=1e-6, atol=1e-6)
    assert not torch.allclose(y, rtdnn.conv_forward(x, w, **conv))

    dy = make_tensor(y.shape, torch.float32, generator=gen)
    dx = rtdnn.conv_backward_data(dy, w, x_shape, mode="convolution", **conv)
    torch.testing.assert_close(dx, rtdnn.conv_backward_data(dy, wf, x_shape, **conv))

    dw = rtdnn.conv_backward_filter(x, dy, w_shape, mode="convolution", **conv)
    dwf = rtdnn.conv_backward_filter(x, dy, w_shape, **conv)
    torch.testing.assert_close(dw, dwf.flip(flip), rtol=1e-6, atol=1e-6)


# -- split-K with more than one split ------------------------------------------------------


def _splits(x, dy, w_shape) -> int:
    conv = ConvDesc.create(1, 1, 0, 1, 1, "cross_correlation", MATH)
    p = ConvProblem.create(
        Direction.BACKWARD_FILTER, TensorDesc.of(x), TensorDesc(tuple(w_shape), (3, 3, 1),
        x.dtype), TensorDesc.of(dy), conv, "cpu",
    )  # fmt: skip
    return split_count(p)


def test_auto_splits_skinny_layers_on_a_gpu(monkeypatch):
    """On a GPU, forward and backward-data go to IMPLICIT_GEMM_SPLIT_K first where the
    output's 128 x 128 tiles fill less than half the multiprocessors and the reduction splits
    (deepbench's late layers at batch 8); a wide output (ResNet-50's 7x7 layer at batch 64),
    a short reduction and the CPU keep the unsplit kernel first."""
    import rtdnn.algos.implicit_gemm as implicit_gemm
    from rtdnn.select import _heuristic_order

    # The split count and the fill ask the device its size: an H100's, here.
    monkeypatch.setattr(implicit_gemm, "parallel_slots", lambda device: 264)

    def first(n, c, k, side, kernel=3, direction=Direction.FORWARD, device="cuda"):
        conv = ConvDesc.create(2, 1, kernel // 2, 1, 1, "cross_correlation", "tf32")
        x = torch.empty(n, c, side, side, dtype=torch.bfloat16)
        w = torch.empty(k, c, kernel, kernel, dtype=torch.bfloat16)
        y = torch.empty(n, k, side, side, dtype=torch.bfloat16)
        p = ConvProblem.create(
            direction, TensorDesc.of(x), TensorDesc.of(w), TensorDesc.of(y), conv, device
        )
        return _heuristic_order(p)[0]

    assert first(8, 512, 512, 7) == "IMPLICIT_GEMM_SPLIT_K"  # 4 tiles, 4,608 deep
    assert first(16, 832, 128, 7, kernel=5) == "IMPLICIT_GEMM_SPLIT_K"  # 7 tiles, 20,800
    assert first(64, 512, 512, 7) == "IMPLICIT_GEMM"  # 100 tiles
    assert first(8, 64, 512, 7) == "IMPLICIT_GEMM"  # 576 deep: no split
    data = Direction.BACKWARD_DATA
    assert first(8, 512, 512, 7, direction=data) == "IMPLICIT_GEMM_SPLIT_K"  # 4 tiles
    assert first(64, 512, 512, 7, direction=data) == "IMPLICIT_GEMM"  # 100 tiles
    assert first(8, 512, 512, 7, device="cpu") == "IMPLICIT_GEMM"


def test_split_count_fills_whole_waves_on_a_gpu(monkeypatch):
    """On a GPU (132 multiprocessors here) a weight gradient that could overfill the device
    splits into whole waves of one program per multiprocessor: 9 tiles (a 128 x 64 gradient
    per tap of a 3x3 filter) into 14 splits (126 programs, one wave; 30 splits ran a third
    wave of 6 programs), 36 tiles into 7 (252, two waves); one that cannot takes every split
    its reduction allows."""
    import rtdnn.algos.implicit_gemm as implicit_gemm

    monkeypatch.setattr(implicit_gemm, "parallel_slots", lambda device: 264)

    def splits(n, c, k, side, kernel=3, stride=1):
        conv = ConvDesc.create(2, stride, kernel // 2, 1, 1, "cross_correlation", "tf32")
        x = torch.empty(n, c, side, side, dtype=torch.bfloat16)
        w = torch.empty(k, c, kernel, kernel, dtype=torch.bfloat16)
        y = torch.empty(n, k, side // stride, side // stride, dtype=torch.bfloat16)
        p = ConvProblem.create(
            Direction.BACKWARD_FILTER, TensorDesc.of(x), TensorDesc.of(w), TensorDesc.of(y),
            conv, "cuda",
        )  # fmt: skip
        return implicit_gemm.split_count(p)

    assert splits(16, 64, 128, 112) == 14  # deepbench's db24
    assert splits(64, 256, 256, 14) == 7  # ResNet-50's l3.x.conv2
    assert splits(64, 512, 512, 14) == 7  # VGG-16's conv512_512_14: 144 tiles, 1008 programs
    assert splits(64, 64, 64, 8) == 4  # 9 tiles, but 4,096 pixels: 4 chunks of 1,024
    assert splits(256, 64, 64, 224) == 14  # the same 9 tiles over 12.8M pixels
    # ResNet-50's l2.0.down: 8 tiles x 32 splits fit 264 slots, so all 32 stay.
    assert splits(64, 256, 512, 56, kernel=1, stride=2) == implicit_gemm.MAX_SPLITS


@pytest.mark.parametrize("direction", [Direction.FORWARD, Direction.BACKWARD_FILTER])
def test_filter_row_tiles_fit_shared_memory(direction, monkeypatch):
    """The few-channel filter-row tiles offered on a GPU fit its shared memory: in float32 a
    256 x 128 x 64 forward tile in 3 stages (288 KiB) and a 64 x 128 x 128 backward-filter
    one (the 3 x 5 filter over 15 channels) failed to compile on an H200 (227 KiB); bfloat16
    keeps them."""
    import rtdnn.algos.implicit_gemm as implicit_gemm
    from rtdnn.algos.tiles import tile_candidates

    monkeypatch.setattr(implicit_gemm, "parallel_slots", lambda device: 264)
    monkeypatch.setattr(implicit_gemm, "shared_memory_bytes", lambda device: 232448)
    if direction == Direction.FORWARD:
        x_shape, w_shape, stride, padding = (2, 3, 47, 45), (96, 3, 11, 11), 4, 2
    else:
        x_shape, w_shape, stride, padding = (2, 15, 9, 13), (40, 15, 3, 5), 1, 1
    conv = ConvDesc.create(2, stride, padding, 1, 1, "cross_correlation", "tf32")
    y_shape = conv_output_shape(x_shape, w_shape, conv)
    offered = {}
    for dtype in (torch.float32, torch.bfloat16):
        x, w, y = (torch.empty(s, dtype=dtype) for s in (x_shape, w_shape, y_shape))
        p = ConvProblem.create(
            direction, TensorDesc.of(x), TensorDesc.of(w), TensorDesc.of(y), conv, "cuda"
        )
        rows, cols, depth, _ = implicit_gemm.gemm_shape(p)
        generic = tile_candidates("cuda", dtype, rows, cols, depth)
        tiles = implicit_gemm.filter_rows_candidates(p, generic, splits=1)
        assert tiles, dtype
        assert all(implicit_gemm.shared_memory_count(p, t) <= 232448 for t in tiles)
        offered[dtype] = {(t.block_m, t.block_n, t.block_k, t.num_stages) for t in tiles}
    assert offered[torch.float32] < offered[torch.bfloat16]
    too_large = (256, 128, 64, 3) if direction == Direction.FORWARD else (64, 128, 128, 3)
    assert too_large in offered[torch.bfloat16] and too_large not in offered[torch.float32]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["IMPLICIT_GEMM_SPLIT_K", "GEMM"])
def test_backward_filter_split_into_several_parts(algo, gen):
    """2050 output pixels make backward-filter split its reduction; the partial sums must add
    up to the reference, identically on every run (deterministic)."""
    x = make_tensor((2, 1, 1027), torch.float32, generator=gen)
    dy = make_tensor((2, 1, 1025), torch.float32, generator=gen)
    assert _splits(x, dy, (1, 1, 3)) >= 2
    p_args = dict(algo=algo, math=MATH, alpha=0.5)
    dw = rtdnn.conv_backward_filter(x, dy, (1, 1, 3), **p_args)
    assert_close(dw, reference.conv_backward_filter(x, dy, (1, 1, 3), alpha=0.5))
    out = make_tensor((1, 1, 3), torch.float32, generator=gen)
    prior = out.clone()
    dw2 = rtdnn.conv_backward_filter(x, dy, (1, 1, 3), beta=1.0, out=out, **p_args)
    assert torch.equal(dw2, dw + prior), "not deterministic, or beta applied twice"
    assert not stream_counters(x.device, 64).any(), "a tile's arrival counter was left set"


@pytest.mark.slow
def test_split_k_grouped_channels_last_into_strided_out(gen):
    """Split-K over 2 groups (taps and channels packed into the columns, several splits each):
    the reduction's epilogue must address every (group, tap) slice of a strided `out`, with
    beta."""
    x = make_tensor((1, 4, 2050), torch.float32, "channels_last", gen)
    dy = make_tensor((1, 6, 2049), torch.float32, generator=gen)
    w_shape = (6, 2, 2)
    conv = ConvDesc.create(1, 1, 0, 1, 2, "cross_correlation", MATH)
    p = ConvProblem.create(
        Direction.BACKWARD_FILTER, TensorDesc.of(x), TensorDesc.of(torch.empty(w_shape)),
        TensorDesc.of(dy), conv, "cpu",
    )  # fmt: skip
    assert split_count(p) >= 2
    out = make_tensor(w_shape, torch.float32, "strided", gen)
    prior = out.clone()
    dw = rtdnn.conv_backward_filter(
        x, dy, w_shape, groups=2, alpha=1.5, beta=-0.5, out=out, algo="IMPLICIT_GEMM_SPLIT_K",
        math=MATH,
    )  # fmt: skip
    assert dw is out
    assert_close(dw, reference.conv_backward_filter(x, dy, w_shape, groups=2, alpha=1.5,
                                                    beta=-0.5, out=prior))  # fmt: skip
    assert_gaps_untouched(out)


@pytest.mark.parametrize("stride", [1, 2])
def test_backward_data_split_into_several_parts(stride, gen):
    """Split-K backward-data: each stride phase's reduction (output channels x taps) split,
    its partial sums in its own part of the workspace, with alpha and beta into a
    NaN-poisoned or prior `out` (channels-last, 2 groups); two runs bit-identical."""
    x_shape, w_shape = (2, 4, 7, 6), (16, 2, 3, 3)
    conv = dict(stride=stride, padding=1, groups=2)
    desc = ConvDesc.create(2, stride, 1, 1, 2, "cross_correlation", MATH)
    y_shape = conv_output_shape(x_shape, w_shape, desc)
    dy = make_tensor(y_shape, torch.float32, "channels_last", gen)
    w = make_tensor(w_shape, torch.float32, generator=gen)
    p = ConvProblem.create(
        Direction.BACKWARD_DATA, TensorDesc.of(torch.empty(x_shape)), TensorDesc.of(w),
        TensorDesc.of(dy), desc, "cpu",
    )  # fmt: skip
    assert split_count(p) >= 2
    args = dict(algo="IMPLICIT_GEMM_SPLIT_K", math=MATH, **conv)
    out = poisoned(x_shape, torch.float32)
    dx = rtdnn.conv_backward_data(dy, w, x_shape, alpha=0.5, out=out, **args)
    assert dx is out
    assert_close(dx, reference.conv_backward_data(dy, w, x_shape, alpha=0.5, **conv))
    again = rtdnn.conv_backward_data(dy, w, x_shape, alpha=0.5, **args)
    assert torch.equal(again, dx), "not deterministic"
    prior = make_tensor(x_shape, torch.float32, "channels_last", gen)
    expected = reference.conv_backward_data(dy, w, x_shape, alpha=1.5, beta=-0.5,
                                            out=prior.clone(), **conv)  # fmt: skip
    dx = rtdnn.conv_backward_data(dy, w, x_shape, alpha=1.5, beta=-0.5, out=prior, **args)
    assert_close(dx, expected)
    assert not stream_counters(dy.device, 64).any(), "a tile's arrival counter was left set"


@pytest.mark.slow
@pytest.mark.parametrize("channels", [16, 17])
@pytest.mark.parametrize("algo", ["IMPLICIT_GEMM", "IMPLICIT_GEMM_SPLIT_K", "GEMM"])
def test_many_channels_per_group(channels, algo, gen):
    """C/g >= 16: forward and backward-filter reduce tap by tap over channel chunks (not the
    packed path the small property-test shapes take); 17 leaves a partial chunk."""
    x = make_tensor((2, channels, 5, 4), torch.float32, "channels_last", gen)
    w = make_tensor((5, channels, 3, 2), torch.float32, generator=gen)
    conv = dict(stride=(2, 1), padding=(1, 0), dilation=(1, 2))
    y = rtdnn.conv_forward(x, w, algo=algo, math=MATH, **conv)
    assert_close(y, reference.conv_forward(x, w, **conv))
    dy = make_tensor(tuple(y.shape), torch.float32, generator=gen)
    dw = rtdnn.conv_backward_filter(x, dy, w.shape, algo=algo, math=MATH, **conv)
    assert_close(dw, reference.conv_backward_filter(x, dy, w.shape, **conv))
    dx = rtdnn.conv_backward_data(dy, w, x.shape, algo=algo, math=MATH, **conv)
    assert_close(dx, reference.conv_backward_data(dy, w, x.shape, **conv))


@pytest.mark.parametrize("algo", ["IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM"])
def test_several_channel_chunks_per_tap(algo, gen):
    """C/g and K/g of 144 take two reduction chunks per filter tap even with the
    interpreter's 128-long chunks, so each step's (tap, chunk) split must agree between the
    two operands of every GEMM (implicit, through the offset table, and through im2col's
    column matrix); the last chunk is partial."""
    check_all_directions((1, 144, 3, 4), (144, 144, 3, 3), algo=algo, gen=gen, padding=1)


@pytest.mark.parametrize(
    "x_shape, w_shape, conv",
    [
        ((2, 3, 23, 23), (5, 3, 11, 11), dict(stride=4)),  # an AlexNet-like RGB stem
        ((1, 2, 13, 11), (3, 2, 3, 3), dict(stride=3, dilation=2, padding=2)),
        ((1, 2, 12, 9), (3, 2, 3, 2), dict(stride=2, dilation=2, padding=(3, 1))),
        ((1, 4, 9, 10), (6, 2, 3, 3), dict(stride=(2, 3), dilation=(3, 1), padding=4, groups=2)),
        ((1, 2, 7, 6, 8), (3, 2, 2, 3, 3), dict(stride=(2, 1, 3), dilation=(1, 2, 2), padding=1)),
        ((2, 3, 17), (4, 3, 5), dict(stride=4, padding=3)),
        ((1, 4, 1, 1), (4, 1, 3, 3), dict(padding=2, groups=4)),
    ],
)
def test_gemm_col2im_visits_linked_taps(x_shape, w_shape, conv, gen):
    """GEMM's col2im visits, per input pixel, only the taps that reach it (r * dilation =
    i mod stride): strides and dilations with and without a common factor (2 and 2: every
    other pixel gets no tap at all), a stride larger than the dilation and the reverse, 1-D
    and 3-D, a 1-pixel image; im2col's channel chunks as wide as the group's channels."""
    check_all_directions(x_shape, w_shape, algo="GEMM", gen=gen, **conv)


# -- forward of few-channel layers by filter rows ---------------------------------------------

#: (x shape, w shape, conv parameters): RGB stems and other packed (few-channel) layers,
#: including rows longer than one chunk, dilation, flipped filters, 1-D and 3-D.
FILTER_ROWS_CASES = [
    ("7x7-stride2", (2, 3, 13, 11), (8, 3, 7, 7), dict(stride=2, padding=3)),
    ("3x3", (1, 3, 6, 7), (5, 3, 3, 3), dict(padding=1)),
    ("11x11-stride4", (1, 3, 19, 17), (4, 3, 11, 11), dict(stride=4, padding=2)),
    ("5x3-dilated", (2, 5, 9, 10), (6, 5, 5, 3), dict(padding=(2, 4), dilation=(1, 3))),
    ("wide-pad-1px", (1, 2, 1, 1), (3, 2, 3, 3), dict(padding=4)),
    ("long-rows", (1, 15, 5, 9), (4, 15, 3, 5), dict(padding=1)),
    ("groups-convolution", (2, 6, 7, 6), (8, 3, 3, 2), dict(groups=2, mode="convolution")),
    ("1d", (2, 3, 17), (4, 3, 7), dict(stride=3, padding=2)),
    ("3d", (1, 3, 4, 5, 6), (4, 3, 2, 3, 3), dict(padding=1, stride=(1, 2, 1))),
]


@pytest.mark.parametrize(
    "x_shape,w_shape,conv",
    [c[1:] for c in FILTER_ROWS_CASES],
    ids=[c[0] for c in FILTER_ROWS_CASES],
)
@pytest.mark.parametrize("block_k", [16, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_by_filter_rows(x_shape, w_shape, conv, block_k, dtype, gen):
    """The filter-row tiles of a few-channel forward (a chunk of 16: rows of more pairs span
    several chunks; 64: one chunk, mostly padding) against the float64 reference, with a bias,
    alpha and beta, into a poisoned output (beta = 0) and onto a prior one."""
    conv = _conv_kwargs(**{"stride": 1, "padding": 0, "dilation": 1, **conv})
    x = make_tensor(x_shape, dtype, "channels_last", gen)
    w = make_tensor(w_shape, dtype, "channels_last", gen)
    bias = make_tensor((w_shape[0],), dtype, generator=gen)
    desc = ConvDesc.create(len(x_shape) - 2, **conv, math=MATH)
    y_shape = tuple(reference.conv_forward(x, w, **conv).shape)
    layout = "channels_last" if len(x_shape) == 4 else "contiguous"
    prior = make_tensor(y_shape, dtype, layout, gen)
    algo = rtdnn.algos.ALGORITHMS["IMPLICIT_GEMM"]
    for alpha, beta in ((1.0, 0.0), (0.5, 2.0)):
        out = poisoned(y_shape, dtype, layout) if beta == 0 else prior.clone()
        descs = [TensorDesc.of(t) for t in (x, w, out)]
        p = ConvProblem.create(Direction.FORWARD, *descs, desc, "cpu", has_bias=True)
        tiles = ImplicitGemmTiles(32, 32, block_k, 1, 1, 1, filter_rows=True)
        workspace = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8)
        algo.prepare(p, tiles)(rtdnn.algos.ConvTensors(x, w, out, bias), workspace, alpha, beta)
        expected = reference.conv_forward(
            x, w, bias, alpha=alpha, beta=beta, out=prior, **conv
        )  # fmt: skip
        assert_close(out, expected)


@pytest.mark.parametrize(
    "x_shape,w_shape,conv",
    [c[1:] for c in FILTER_ROWS_CASES],
    ids=[c[0] for c in FILTER_ROWS_CASES],
)
@pytest.mark.parametrize("algo_name", ["IMPLICIT_GEMM", "IMPLICIT_GEMM_SPLIT_K"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_filter_by_filter_rows(x_shape, w_shape, conv, algo_name, dtype, gen):
    """The filter-row tiles of a few-channel weight gradient (a column tile per filter row,
    its (rw, c) pairs padded) against the float64 reference, unsplit and split, into a
    poisoned output and with alpha and beta onto a prior one."""
    conv = _conv_kwargs(**{"stride": 1, "padding": 0, "dilation": 1, **conv})
    x = make_tensor(x_shape, dtype, "channels_last", gen)
    y_shape = tuple(reference.conv_forward(x, torch.empty(w_shape), **conv).shape)
    layout = "channels_last" if len(x_shape) == 4 else "contiguous"
    dy = make_tensor(y_shape, dtype, layout, gen)
    prior = make_tensor(w_shape, dtype, layout, gen)
    desc = ConvDesc.create(len(x_shape) - 2, **conv, math=MATH)
    algo = rtdnn.algos.ALGORITHMS[algo_name]
    descs = [TensorDesc.of(t) for t in (x, prior, dy)]
    p = ConvProblem.create(Direction.BACKWARD_FILTER, *descs, desc, "cpu")
    # Where the algorithm splits: its splits, the filter-row tiles' own, and enough splits for
    # a second launch to sum the partial tiles (BrgemmLaunch.FINISH_APART_FROM).
    split_counts = (0,) if algo.splits(p) == 1 else (0, filter_row_splits(p), 17)
    partials = max(split_counts) * w_shape[0] * filter_row_columns(p) * 4
    workspace = torch.empty(max(algo.workspace_bytes(p), partials), dtype=torch.uint8)
    for alpha, beta in ((1.0, 0.0), (0.5, 2.0)):
        for splits in split_counts:
            tiles = ImplicitGemmTiles(
                32, row_pairs(p), 32, 1, 1, 1, filter_rows=True, splits=splits
            )
            out = poisoned(w_shape, dtype, layout) if beta == 0 else prior.clone()
            algo.prepare(p, tiles)(rtdnn.algos.ConvTensors(x, out, dy), workspace, alpha, beta)
            expected = reference.conv_backward_filter(
                x, dy, w_shape, alpha=alpha, beta=beta, out=prior, **conv
            )  # fmt: skip
            assert_close(out, expected)


@pytest.mark.parametrize("direction", ["forward", "backward_filter"])
def test_filter_rows_in_tf32_math(direction, gen):
    """Float32 data in TF32 math through the filter-row tiles: forward with TF32 products
    (the interpreter's are float32), the weight gradient as three bfloat16 products (bf16x3,
    as the packed tiles: within about 2^-15 of float32's)."""
    conv = _conv_kwargs(stride=2, padding=3, dilation=1)
    x = make_tensor((2, 3, 13, 11), torch.float32, "channels_last", gen)
    w = make_tensor((8, 3, 7, 7), torch.float32, "channels_last", gen)
    y = reference.conv_forward(x, w, **conv)
    dy = make_tensor(tuple(y.shape), torch.float32, "channels_last", gen)
    desc = ConvDesc.create(2, **conv, math="tf32")
    algo = rtdnn.algos.ALGORITHMS["IMPLICIT_GEMM_SPLIT_K"]
    if direction == "forward":
        out = poisoned(tuple(y.shape), torch.float32, "channels_last")
        descs, ref = [TensorDesc.of(t) for t in (x, w, out)], y
        tensors = rtdnn.algos.ConvTensors(x, w, out)
    else:
        out = poisoned(w.shape, torch.float32, "channels_last")
        descs = [TensorDesc.of(t) for t in (x, out, dy)]
        ref = reference.conv_backward_filter(x, dy, w.shape, **conv)
        tensors = rtdnn.algos.ConvTensors(x, out, dy)
    p = ConvProblem.create(Direction(direction), *descs, desc, "cpu")
    block_n = 32 if direction == "forward" else row_pairs(p)
    tiles = ImplicitGemmTiles(32, block_n, 32, 1, 1, 1, filter_rows=True)
    workspace = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8)
    algo.prepare(p, tiles)(tensors, workspace, 1.0, 0.0)
    assert reference.rel_error(out, ref) < 5e-5


def test_filter_rows_tiles_are_offered_for_few_channel_forward_on_a_gpu(monkeypatch):
    """The tuner gets filter-row tiles for the forward of packed (fewer than 16 channels per
    group) layers on a GPU, with chunks as long as a filter row's (rw, c) pairs, first where
    the packed reduction is long; not for more channels or other directions."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(geometry, "multiprocessor_count", lambda index: 132)
    monkeypatch.setattr(geometry, "_shared_memory_bytes", lambda index: 227 * 1024)
    last = torch.channels_last
    algo = rtdnn.algos.ALGORITHMS["IMPLICIT_GEMM"]

    def problem(direction, channels, kernel):
        x = torch.empty(8, channels, 32, 32, dtype=torch.bfloat16).to(memory_format=last)
        w = torch.empty(64, channels, kernel, kernel, dtype=torch.bfloat16).to(memory_format=last)
        y = torch.empty(8, 64, 16, 16, dtype=torch.bfloat16).to(memory_format=last)
        desc = ConvDesc.create(2, 2, (kernel - 1) // 2, 1, 1, "cross_correlation", "fp32")
        descs = [TensorDesc.of(t) for t in (x, w, y)]
        return ConvProblem.create(Direction(direction), *descs, desc, "cuda")

    def chunks(q):
        return [t.block_k for t in algo.tile_candidates(q) if getattr(t, "filter_rows", False)]

    assert chunks(problem("forward", 3, 7)) and set(chunks(problem("forward", 3, 7))) == {32}
    assert set(chunks(problem("forward", 3, 11))) == {64}  # 33 pairs a row
    # The untuned choice: filter rows where the packed reduction takes several chunks (7x7
    # over 3 channels: 147), as narrow as the 64 filters; the packed tiles for 3x3 (27).
    first = algo.tile_candidates(problem("forward", 3, 7))[0]
    assert first.filter_rows and (first.block_m, first.block_n) == (128, 64)
    assert not getattr(algo.tile_candidates(problem("forward", 3, 3))[0], "filter_rows", False)
    assert not chunks(problem("forward", 16, 3))
    # Backward-filter: a column tile per filter row, its 21 pairs padded to 32.
    bwd = algo.tile_candidates(problem("backward_filter", 3, 7))
    bwd = [t for t in bwd if getattr(t, "filter_rows", False)]
    assert bwd and {t.block_n for t in bwd} == {32}
    # The split algorithm puts them first, at their own split count.
    q = problem("backward_filter", 3, 7)
    first = rtdnn.algos.ALGORITHMS["IMPLICIT_GEMM_SPLIT_K"].tile_candidates(q)[0]
    assert first.filter_rows and first.splits == filter_row_splits(q)
