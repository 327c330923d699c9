"""DIRECT (few channels per group) against the float64 reference, every direction, through the
interpreter: 1-D to 3-D, depthwise with channel multipliers, 2 to 8 channels per group, stride,
dilation, wide padding, even kernels, both modes, every layout, alpha/beta, three dtypes; the
determinism and exact workspace of backward-filter; selection and forced-DIRECT errors."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from conftest import make_tensor, out_size, poisoned_like, run_conv_direction

import rtdnn
from rtdnn import reference
from rtdnn.algos import ALGORITHMS, ConvTensors
from rtdnn.algos.direct import MAX_ROWS_CHANNELS, DirectTiles, filter_chunks
from rtdnn.core import ConvDesc, ConvProblem, Direction, TensorDesc

DIRECTIONS = ["forward", "backward_data", "backward_filter"]
#: Relative error against float64: float32 is computed in float32 FMAs; the 16-bit types are
#: dominated by rounding the result (bfloat16 keeps 8 bits).
TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def _tuple(v, n):
    return (v,) * n if isinstance(v, int) else tuple(v)


def y_shape(x_shape, w_shape, conv) -> tuple[int, ...]:
    nd = len(x_shape) - 2
    o = out_size(
        x_shape[2:], w_shape[2:], _tuple(conv.get("stride", 1), nd),
        _tuple(conv.get("padding", 0), nd), _tuple(conv.get("dilation", 1), nd),
    )  # fmt: skip
    return (x_shape[0], w_shape[0], *o)


def run_direction(direction, x, w, dy, *, dtype, algo="DIRECT", **kw):
    """One direction with DIRECT (or `algo`) at this module's tolerance: run_conv_direction."""
    return run_conv_direction(direction, x, w, dy, algo=algo, dtype=dtype, tol=TOL[dtype], **kw)


def check(x_shape, w_shape, *, dtype=torch.float32, layout="contiguous", alpha=1.0, beta=0.0,
          gen=None, **conv):  # fmt: skip
    """Every direction of one problem, inputs and output in `layout`."""
    x = make_tensor(x_shape, dtype, layout, gen)
    w = make_tensor(w_shape, dtype, layout, gen)
    dy = make_tensor(y_shape(x_shape, w_shape, conv), dtype, layout, gen)
    for direction in DIRECTIONS:
        run_direction(
            direction, x, w, dy, dtype=dtype, layout=layout, alpha=alpha, beta=beta, gen=gen,
            **conv,
        )  # fmt: skip


# (id, x shape, w shape, conv parameters)
CASES = [
    ("1d-depthwise", (2, 3, 9), (3, 1, 3), dict(groups=3, padding=1)),
    ("2d-depthwise-x2-stride2", (2, 4, 6, 5), (8, 1, 3, 3), dict(groups=4, stride=2, padding=1)),
    ("2d-depthwise-20ch-5x5", (1, 20, 5, 4), (20, 1, 5, 5), dict(groups=20, padding=2)),
    ("3d-2perg-even", (1, 4, 3, 4, 4), (4, 2, 2, 3, 2), dict(groups=2, padding=1)),
    ("2d-8perg", (1, 16, 5, 4), (4, 8, 3, 3), dict(groups=2, padding=(1, 0))),
    ("2d-3ch-dil2-widepad", (2, 3, 6, 6), (5, 3, 3, 3), dict(dilation=2, padding=3)),
    ("2d-one-pixel", (1, 2, 3, 3), (2, 1, 3, 3), dict(groups=2)),
    (
        "1d-conv-mode-dil2",
        (2, 4, 11),
        (4, 2, 4),
        dict(groups=2, dilation=2, padding=3, mode="convolution"),
    ),  # fmt: skip
    ("1d-wide-filter", (2, 2, 14), (4, 1, 10), dict(groups=2, padding=2)),
    (
        "3d-depthwise-stride2",
        (2, 3, 4, 5, 3),
        (3, 1, 3, 3, 3),
        dict(groups=3, stride=(2, 1, 2), padding=1, mode="convolution"),
    ),  # fmt: skip
]


@pytest.mark.parametrize("x_shape,w_shape,conv", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_shapes_against_reference(x_shape, w_shape, conv, gen):
    check(x_shape, w_shape, gen=gen, **conv)


@pytest.mark.parametrize("layout", ["channels_last", "strided"])
def test_layouts_with_alpha_beta(layout, gen):
    """Channels-last and strided views (inputs and out), alpha and beta on a random out."""
    check((2, 6, 5, 4), (12, 2, 3, 3), layout=layout, alpha=0.5, beta=-0.75, gen=gen, groups=3,
          stride=(1, 2), padding=1)  # fmt: skip


#: Problems for the 16-bit kernels: filters at most 8 wide (the tensor-core kernels' limit),
#: depthwise, multipliers, 2 to 16 channels per group, stride, dilation, 1-D to 3-D.
HALF_CASES = [c for c in CASES if c[2][-1] <= 8] + [
    ("2d-16perg", (1, 32, 5, 4), (8, 16, 3, 3), dict(groups=2, padding=1)),
    ("2d-3perg-x2-pad3", (2, 6, 4, 5), (12, 3, 2, 3), dict(groups=2, padding=3, stride=(2, 1))),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(
    "x_shape,w_shape,conv", [c[1:] for c in HALF_CASES], ids=[c[0] for c in HALF_CASES]
)
def test_tensor_core_kernels(x_shape, w_shape, conv, dtype, gen):
    """16-bit data takes the block-diagonal tensor-core kernels first (float32 accumulation;
    bfloat16 tiles are upcast in the interpreter, whose bfloat16 tl.dot is wrong)."""
    check(x_shape, w_shape, dtype=dtype, layout="channels_last", gen=gen, **conv)


def test_tensor_core_kernels_strided_alpha_beta(gen):
    check((2, 8, 5, 4), (8, 2, 3, 3), dtype=torch.float16, layout="strided", alpha=0.5,
          beta=-0.75, gen=gen, groups=4, stride=(1, 2), padding=1)  # fmt: skip


@pytest.mark.parametrize(
    "x_shape,w_shape,conv",
    [
        ((2, 8, 7, 9), (8, 4, 3, 3), dict(groups=2, stride=2, padding=1)),
        ((1, 8, 9, 8), (16, 2, 3, 2), dict(groups=4, stride=(3, 2), dilation=(2, 1), padding=2)),
        ((1, 4, 5, 6, 5), (4, 2, 3, 3, 3), dict(groups=2, stride=2, padding=(1, 0, 2))),
    ],
    ids=["stride2-odd-sizes", "stride3x2-dil2", "3d-stride2"],
)
def test_tensor_core_backward_data_by_stride_phase(x_shape, w_shape, conv, gen):
    """Strided backward-data on tensor cores walks the input by stride phase and skips the
    filter rows a phase cannot reach: every pixel of every phase is written (the image sizes
    are not multiples of the stride, so each phase's last block is partly outside)."""

    def first_dot(p, candidates):
        assert candidates[0].kernel == "dot", candidates
        return candidates[0]

    check_with_tiles("backward_data", x_shape, w_shape, conv, torch.float16, gen, first_dot)


def written_into(direction, x, w, dy, out, bias=None) -> ConvTensors:
    """The tensors of one direction, `out` in the place of the one it writes."""
    return {
        "forward": ConvTensors(x, w, out, bias),
        "backward_data": ConvTensors(out, w, dy),
        "backward_filter": ConvTensors(x, out, dy),
    }[direction]


def poisoned_output(direction, x, w, dy):
    """A NaN-filled tensor like the one `direction` writes."""
    return poisoned_like({"forward": dy, "backward_data": x, "backward_filter": w}[direction])


def reference_of(direction, x, w, dy, conv):
    """The float64 reference of one direction."""
    if direction == "forward":
        return reference.conv_forward(x, w, **conv)
    if direction == "backward_data":
        return reference.conv_backward_data(dy, w, x.shape, **conv)
    return reference.conv_backward_filter(x, dy, w.shape, **conv)


def check_with_tiles(direction, x_shape, w_shape, conv, dtype, gen, choose) -> None:
    """One direction of DIRECT with the tiles `choose(problem, candidates)` returns, on fresh
    channels-last data, into a NaN-poisoned output with a NaN-poisoned workspace, against the
    float64 reference."""
    x = make_tensor(x_shape, dtype, "channels_last", gen)
    w = make_tensor(w_shape, dtype, "channels_last", gen)
    dy = make_tensor(y_shape(x_shape, w_shape, conv), dtype, "channels_last", gen)
    out = poisoned_output(direction, x, w, dy)
    tensors = written_into(direction, x, w, dy, out)
    p = _problem(direction, *(tensors.x, tensors.w, tensors.y), **conv)
    algo = ALGORITHMS["DIRECT"]
    tiles = choose(p, algo.tile_candidates(p))
    workspace = torch.full((algo.workspace_bytes(p),), 255, dtype=torch.uint8)  # NaN floats
    algo.prepare(p, tiles)(tensors, workspace, 1.0, 0.0)
    assert reference.rel_error(out, reference_of(direction, x, w, dy, conv)) <= TOL[dtype]


#: Grouped problems for the "gemm" tiles (super-groups of twice the group through the implicit
#: GEMM, algos/direct_gemm.py): 2 to 4 channels per group, a channel multiplier, strides,
#: dilation and even filters in convolution mode, 1-D and 3-D, padding wider than the filter
#: around a 1-pixel image, super-groups that are the whole layer.
GEMM_CASES = [
    ("3x3-2perg", (2, 8, 5, 6), (8, 2, 3, 3), dict(groups=4, padding=1)),
    ("stride2-mult2", (2, 8, 7, 9), (16, 4, 3, 3), dict(groups=2, stride=2, padding=1)),
    ("dil2-even-conv-mode", (1, 8, 6, 5), (8, 2, 2, 3), dict(groups=4, dilation=2,
                                                            padding=(1, 2), mode="convolution")),
    ("1d", (2, 4, 11), (4, 2, 4), dict(groups=2, dilation=2, padding=3)),
    ("3d-stride-d", (1, 4, 4, 5, 3), (4, 2, 3, 3, 3), dict(groups=2, padding=1,
                                                            stride=(2, 1, 1))),
    ("one-pixel-widepad", (1, 4, 1, 1), (4, 2, 3, 3), dict(groups=2, padding=4)),
]  # fmt: skip


def _gemm_tiles(p, candidates):
    """The "gemm" tiles, offered after the block-diagonal tiles on the CPU, one width: twice
    the group."""
    tiles = [t for t in candidates if t.kernel == "gemm"]
    assert tiles and candidates[0].kernel != "gemm", candidates
    assert {t.width for t in tiles} == {2 * p.in_channels // p.groups}, tiles
    return tiles[0]


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("x_shape,w_shape,conv", [c[1:] for c in GEMM_CASES],
                         ids=[c[0] for c in GEMM_CASES])  # fmt: skip
def test_super_group_gemm(x_shape, w_shape, conv, direction, gen):
    """The block-diagonal filter packed per call (forward, backward-data) or the wide
    gradient cut to its diagonal blocks (backward-filter), into a NaN-poisoned workspace."""
    check_with_tiles(direction, x_shape, w_shape, conv, torch.bfloat16, gen, _gemm_tiles)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_super_group_gemm_alpha_beta(direction, gen):
    """alpha and beta on a random strided output (the forward with a bias too): applied by the
    implicit GEMM's epilogue, or for backward-filter by the cut to the diagonal blocks."""
    conv = dict(groups=4, padding=1, stride=(1, 2))
    dtype = torch.float16
    x = make_tensor((2, 8, 5, 6), dtype, "channels_last", gen)
    w = make_tensor((8, 2, 3, 3), dtype, "strided", gen)
    dy = make_tensor(y_shape(x.shape, w.shape, conv), dtype, "channels_last", gen)
    bias = make_tensor((8,), dtype, "contiguous", gen)
    before = {"forward": dy, "backward_data": x, "backward_filter": w}[direction]
    before = make_tensor(tuple(before.shape), dtype, "strided", gen)
    out = before.clone()
    tensors = written_into(direction, x, w, dy, out, bias)
    p = _problem(direction, tensors.x, tensors.w, tensors.y, **conv)
    if direction == "forward":
        p = dataclasses.replace(p, has_bias=True)
    algo = ALGORITHMS["DIRECT"]
    tiles = _gemm_tiles(p, algo.tile_candidates(p))
    workspace = torch.full((algo.workspace_bytes(p),), 255, dtype=torch.uint8)
    algo.prepare(p, tiles)(tensors, workspace, 0.5, -0.75)
    conv_ref = reference_of(direction, x, w, dy, conv)
    if direction == "forward":
        conv_ref = conv_ref + 2 * bias.double()[None, :, None, None]
    ref = 0.5 * conv_ref - 0.75 * before.double()
    assert reference.rel_error(out, ref) <= TOL[dtype]


#: Grouped problems for backward-filter's one-accumulator-per-tap tiles ("dot_taps"): 2 to 16
#: channels per group, a channel multiplier, strides, dilation and even filters in convolution
#: mode, 1-D and 3-D, a 1-pixel image under padding wider than the filter, 3 groups (the last
#: super-group partly empty), a 5-wide filter.
TAPS_CASES = GEMM_CASES + [
    ("16perg", (1, 32, 5, 4), (8, 16, 3, 3), dict(groups=2, padding=1)),
    ("3-groups-x2-stride", (2, 12, 7, 9), (12, 4, 3, 3), dict(groups=3, stride=2, padding=1)),
    ("5-wide", (2, 8, 4, 9), (8, 4, 3, 5), dict(groups=2, padding=(1, 2))),
]  # fmt: skip


def _taps_tiles(p, candidates):
    """The "dot_taps" tiles, offered after the block-diagonal tiles on the CPU."""
    tiles = [t for t in candidates if t.kernel == "dot_taps"]
    assert tiles and candidates[0].kernel == "dot", candidates
    return tiles[0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("x_shape,w_shape,conv", [c[1:] for c in TAPS_CASES],
                         ids=[c[0] for c in TAPS_CASES])  # fmt: skip
def test_filter_taps(x_shape, w_shape, conv, dtype, gen):
    """Each tap's accumulator lands in its place of the tap-major partial sums, which the
    finish adds up: against the float64 reference, into NaN-poisoned dw and workspace."""
    check_with_tiles("backward_filter", x_shape, w_shape, conv, dtype, gen, _taps_tiles)


def test_filter_taps_alpha_beta_deterministic_workspace(gen):
    """alpha and beta on a random strided dw; the partial sums stay inside the declared
    workspace (a NaN guard after it stays untouched) and two runs are bit-identical, over
    more than one chunk."""
    from rtdnn.algos.direct import taps_chunks

    conv = dict(groups=2, padding=1, stride=(2, 1))
    dtype = torch.bfloat16
    x = make_tensor((2, 8, 7, 6), dtype, "channels_last", gen)
    dy = make_tensor(y_shape(x.shape, (8, 4, 3, 3), conv), dtype, "channels_last", gen)
    before = make_tensor((8, 4, 3, 3), dtype, "strided", gen)
    p = _problem("backward_filter", x, before, dy, **conv)
    assert not before.is_contiguous()
    algo = ALGORITHMS["DIRECT"]
    tiles = _taps_tiles(p, algo.tile_candidates(p))
    assert taps_chunks(p, tiles)[0] > 1
    need, guard = algo.workspace_bytes(p), 64
    workspace = torch.full(((need + guard) // 4,), math.nan).view(torch.uint8)
    run = algo.prepare(p, tiles)
    outs = []
    for _ in range(2):
        dw = make_tensor(before.shape, dtype, "strided", gen)  # before's strides, not a copy's
        dw.copy_(before)
        run(ConvTensors(x, dw, dy), workspace, 0.5, -0.75)
        assert torch.isnan(workspace[need:].view(torch.float32)).all(), "wrote past the workspace"
        outs.append(dw)
    assert torch.equal(outs[0], outs[1])
    ref = 0.5 * reference.conv_backward_filter(x, dy, before.shape, **conv) - 0.75 * before.double()
    assert reference.rel_error(outs[0], ref) <= TOL[dtype]


#: Problems for the tensor-core ring (forward by bands of rows): strides along H of 1 to 3
#: (one to three input rows per step), dilation along W and D, 1-D to 3-D, even filters,
#: padding wider than the filter, a 1-pixel image, images shorter than the filter, 2 to 16
#: channels per group, bands (2 rows here) not dividing the height.
RING_CASES = [
    ("3x3-4perg", (2, 8, 5, 6), (8, 4, 3, 3), dict(groups=2, padding=1)),
    ("stride2", (2, 8, 7, 9), (8, 4, 3, 3), dict(groups=2, stride=2, padding=1)),
    ("stride3x2-dilw", (1, 8, 9, 8), (16, 2, 3, 2), dict(groups=4, stride=(3, 2),
                                                         dilation=(1, 2), padding=2)),
    ("even-conv-mode", (2, 6, 5, 4), (12, 3, 2, 3), dict(groups=2, padding=(1, 2),
                                                          mode="convolution")),
    ("1d", (2, 4, 11), (4, 2, 4), dict(groups=2, dilation=2, padding=3)),
    ("3d-stride-d", (1, 4, 4, 5, 3), (4, 2, 3, 3, 3), dict(groups=2, padding=1,
                                                            stride=(2, 1, 1))),
    ("one-pixel-widepad", (1, 4, 1, 1), (4, 2, 3, 3), dict(groups=2, padding=4)),
    ("7x7-taller-than-image", (1, 4, 3, 4), (4, 2, 7, 7), dict(groups=2, padding=3)),
    ("16perg", (1, 32, 5, 4), (8, 16, 3, 3), dict(groups=2, padding=1)),
]  # fmt: skip


@pytest.mark.parametrize("direction", ["forward", "backward_data"])
@pytest.mark.parametrize("x_shape,w_shape,conv", [c[1:] for c in RING_CASES],
                         ids=[c[0] for c in RING_CASES])  # fmt: skip
def test_tensor_core_ring(x_shape, w_shape, conv, direction, gen):
    """The ring of block-diagonal tiles (direct_dot_rows_forward_kernel), offered among the
    candidates of 16-bit forward problems and of stride-1 backward-data (a forward of dy with
    the filter flipped), forced here; strided backward-data keeps the stride phases."""
    strided = any(s != 1 for s in _tuple(conv.get("stride", 1), len(x_shape) - 2))
    offered = direction == "forward" or not strided

    def ring(p, candidates):
        kinds = [t.kernel for t in candidates]
        assert ("dot_rows" in kinds) == offered, kinds
        if not offered:
            return next(t for t in candidates if t.kernel == "dot")
        return next(t for t in candidates if t.kernel == "dot_rows")

    check_with_tiles(direction, x_shape, w_shape, conv, torch.bfloat16, gen, ring)


def test_tensor_core_ring_alpha_beta_bias(gen):
    """The ring's epilogue: alpha, beta on a random out, a bias, a strided out."""
    conv = dict(groups=2, padding=1, stride=(2, 1))
    x = make_tensor((2, 8, 5, 4), torch.float16, "channels_last", gen)
    w = make_tensor((8, 4, 3, 3), torch.float16, "channels_last", gen)
    bias = make_tensor((8,), torch.float16, "contiguous", gen)
    y0 = make_tensor(y_shape(x.shape, w.shape, conv), torch.float16, "strided", gen)
    y = y0.clone()
    p = _problem("forward", x, w, y, **conv)
    algo = ALGORITHMS["DIRECT"]
    tiles = next(t for t in algo.tile_candidates(p) if t.kernel == "dot_rows")
    workspace = torch.full((algo.workspace_bytes(p),), 255, dtype=torch.uint8)
    algo.prepare(p, tiles)(ConvTensors(x, w, y, bias), workspace, 0.5, -0.75)
    conv_ref = reference.conv_forward(x, w, **conv)
    ref = 0.5 * conv_ref + bias.double()[None, :, None, None] - 0.75 * y0.double()
    assert reference.rel_error(y, ref) <= TOL[torch.float16]


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_fma_kernels_in_half_precision(direction, gen):
    """The FMA tiles, which the tuner may pick for 16-bit data on a GPU, run here by hand."""

    def first_fma(p, candidates):
        assert candidates[0].kernel in ("dot", "dot_rows"), candidates
        return next(t for t in candidates if t.kernel == "fma")

    conv = dict(groups=3, padding=1, stride=(1, 2))
    check_with_tiles(direction, (2, 6, 5, 5), (6, 2, 3, 3), conv, torch.bfloat16, gen, first_fma)


#: Depthwise problems for the row kernels (kernels/depthwise.py): the forward ring at any
#: stride (dilation along W and D), backward-data at stride 1 and by stride phases (stride 2
#: and 3, a phase without dx pixels in a 1-pixel image), channel multipliers, 1-D and 3-D,
#: padding wider than the filter, 1-pixel images, batch 1.
ROWS_CASES = [
    ("3x3", (2, 5, 7, 6), (5, 1, 3, 3), dict(groups=5, padding=1)),
    ("5x3-pad-2-3", (1, 3, 9, 5), (3, 1, 5, 3), dict(groups=3, padding=(2, 3))),
    ("even-dil-w-conv", (2, 4, 6, 5), (4, 1, 2, 2), dict(groups=4, dilation=(1, 2),
                                                         mode="convolution")),
    ("x2-stride-w", (2, 3, 6, 7), (6, 1, 3, 3), dict(groups=3, padding=1, stride=(1, 2))),
    ("5x5-stride2", (2, 3, 9, 8), (3, 1, 5, 5), dict(groups=3, padding=2, stride=2)),
    ("stride3-pad0", (1, 2, 10, 7), (2, 1, 4, 3), dict(groups=2, stride=(3, 2))),
    ("stride2-pad-even", (2, 3, 8, 7), (3, 1, 4, 2), dict(groups=3, stride=2, padding=(1, 0),
                                                         mode="convolution")),
    ("stride2-one-pixel", (1, 2, 1, 1), (2, 1, 3, 3), dict(groups=2, stride=2, padding=1)),
    ("3d-stride-d", (1, 3, 4, 5, 3), (3, 1, 3, 3, 3), dict(groups=3, padding=1, stride=(2, 1, 1))),
    ("1d", (2, 3, 9), (3, 1, 3), dict(groups=3, padding=1)),
    ("one-pixel-widepad", (1, 2, 1, 1), (2, 1, 3, 3), dict(groups=2, padding=4)),
    ("7x7-taller-than-image", (1, 2, 3, 4), (2, 1, 7, 7), dict(groups=2, padding=3)),
]  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize(
    "x_shape,w_shape,conv", [c[1:] for c in ROWS_CASES], ids=[c[0] for c in ROWS_CASES]
)
def test_row_kernels(x_shape, w_shape, conv, direction, dtype, gen):
    """The row kernels, which the tuner offers first for depthwise layers on a GPU, forced
    here wherever they apply; the others fall to the packed-filter FMA tiles."""
    # Backward-data runs the row kernels with one output channel per group, by stride phases
    # (every case here but x2-stride-w).
    ring = direction != "backward_data" or w_shape[0] == x_shape[1]

    def rows_or_fma(p, candidates):
        assert ("rows" in [t.kernel for t in candidates]) == ring, candidates
        return next(t for t in candidates if t.kernel == ("rows" if ring else "fma"))

    check_with_tiles(direction, x_shape, w_shape, conv, dtype, gen, rows_or_fma)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_row_kernels_alpha_beta_strided(direction, gen):
    """The row kernels' epilogues (alpha, beta, a strided out), through the public API."""
    conv = dict(groups=3, padding=1)
    x = make_tensor((2, 3, 5, 4), torch.float32, "strided", gen)
    w = make_tensor((3, 1, 3, 3), torch.float32, "strided", gen)
    dy = make_tensor((2, 3, 5, 4), torch.float32, "strided", gen)
    run_direction(
        direction, x, w, dy, dtype=torch.float32, layout="strided", alpha=0.5, beta=-0.75,
        gen=gen, **conv,
    )  # fmt: skip


@pytest.mark.parametrize("direction,step_rows", [("forward", 1), ("forward", 3),
                                                ("backward_data", 4)])  # fmt: skip
def test_row_kernels_rows_per_step(direction, step_rows, gen):
    """Forward's ring with 1 to 4 output rows per step, a band not divisible by it."""
    tiles = DirectTiles(4, 16, 5, 1, 1, 1, kernel="rows", step_rows=step_rows)
    conv = dict(groups=3, padding=(2, 1))
    check_with_tiles(
        direction, (2, 3, 7, 5), (3, 1, 5, 3), conv, torch.float32, gen, lambda p, c: tiles
    )


#: Backward-filter's row cases, and one dilated along H with padding wider than the filter.
FILTER_ROWS_CASES = [c for c in ROWS_CASES if c[0] in (
    "x2-stride-w", "even-dil-w-conv", "stride3-pad0", "7x7-taller-than-image", "3d-stride-d",
    "5x3-pad-2-3",
)] + [
    ("dil-h-widepad", (1, 2, 7, 6), (2, 1, 3, 3), dict(groups=2, dilation=(2, 1), padding=(3, 1))),
]  # fmt: skip


@pytest.mark.parametrize(
    "runs,step_columns,step_rows",
    [(1, 1, 1), (2, 2, 1), (1, 5, 1), (4, 4, 1), (4, 3, 2), (4, 7, 4)],
)
@pytest.mark.parametrize("all_rows", [False, True], ids=["row", "all-rows"])
@pytest.mark.parametrize(
    "x_shape,w_shape,conv", [c[1:] for c in FILTER_ROWS_CASES],
    ids=[c[0] for c in FILTER_ROWS_CASES],
)  # fmt: skip
def test_row_kernels_backward_filter_column_runs(
    runs, step_columns, step_rows, all_rows, x_shape, w_shape, conv, gen
):
    """Backward-filter's runs of consecutive output columns per thread: one column (each
    input tile loaded per tap), runs longer than the row, rows not divisible by the run, with
    stride and dilation along W (which decide which input column meets which tap); 1 to 4
    rows a step (chunks of rows not divisible by it, rows of different images in one step);
    one filter row per program or all of them (each dy tile loaded once for every filter
    row), with filter rows over the padding and dilation along H."""
    rows = w_shape[-2] if all_rows else 1
    tiles = DirectTiles(
        runs, 16, rows, 1, 1, 1, kernel="rows", step_rows=step_rows, step_columns=step_columns
    )
    check_with_tiles(
        "backward_filter", x_shape, w_shape, conv, torch.bfloat16, gen, lambda p, c: tiles
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "case", ["5x3-pad-2-3", "even-dil-w-conv", "5x5-stride2", "stride3-pad0", "3d-stride-d",
             "one-pixel-widepad", "7x7-taller-than-image"],
)  # fmt: skip
def test_forward_column_runs(case, dtype, gen):
    """Forward by runs of consecutive output columns per thread (depthwise_runs_kernel): runs
    not dividing the row, longer than the row, stride and dilation along W, bands of rows not
    dividing the height."""
    x_shape, w_shape, conv = next(c[1:] for c in ROWS_CASES if c[0] == case)
    tiles = DirectTiles(2, 16, 3, 1, 1, 1, kernel="rows", step_columns=3)
    check_with_tiles("forward", x_shape, w_shape, conv, dtype, gen, lambda p, c: tiles)


def test_forward_column_runs_bias_beta_multiplier(gen):
    """The runs kernel's epilogue: bias, alpha and beta on a random out, channel multiplier 2,
    through prepare with the tiles forced."""
    x = make_tensor((2, 3, 6, 7), torch.float32, "channels_last", gen)
    w = make_tensor((6, 1, 5, 3), torch.float32, "channels_last", gen)
    b = make_tensor((6,), torch.float32, generator=gen)
    y = make_tensor((2, 6, 6, 7), torch.float32, "channels_last", gen)
    ref = reference.conv_forward(x, w, b, groups=3, padding=(2, 1), alpha=0.5, beta=-0.75, out=y)
    p = _problem("forward", x, w, y, groups=3, padding=(2, 1))
    algo = ALGORITHMS["DIRECT"]
    workspace = torch.full((algo.workspace_bytes(p),), 255, dtype=torch.uint8)
    tiles = DirectTiles(4, 16, 4, 1, 1, 1, kernel="rows", step_columns=2)
    algo.prepare(p, tiles)(ConvTensors(x, w, y, b), workspace, 0.5, -0.75)
    assert reference.rel_error(y, ref) <= TOL[torch.float32]


def test_row_kernels_bias_and_multiplier(gen):
    x = make_tensor((2, 3, 6, 5), torch.float32, "channels_last", gen)
    w = make_tensor((6, 1, 5, 3), torch.float32, "channels_last", gen)
    b = make_tensor((6,), torch.float32, generator=gen)
    y = rtdnn.conv_forward(x, w, b, groups=3, padding=(2, 1), algo="DIRECT", math="fp32")
    ref = reference.conv_forward(x, w, b, groups=3, padding=(2, 1))
    assert reference.rel_error(y, ref) <= TOL[torch.float32]


def test_depthwise_filter_packed_in_workspace():
    """Depthwise forward and backward-data read a float32 copy of the filter packed tap-major
    (rows padded to 16 channels, and a channel block past the last row, which the row kernels
    read unmasked); backward-filter its partial sums; other problems nothing."""
    algo = ALGORITHMS["DIRECT"]
    x, w = torch.empty(2, 20, 6, 6), torch.empty(20, 1, 3, 5)
    for direction in ("forward", "backward_data"):
        p = _problem(direction, x, w, torch.empty(2, 20, 4, 2), groups=20)
        assert algo.workspace_bytes(p) == (15 * 32 + MAX_ROWS_CHANNELS) * 4
    p = _problem("forward", x, torch.empty(10, 2, 3, 5), torch.empty(2, 10, 4, 2), groups=10)
    assert algo.workspace_bytes(p) == 0


def test_block_diagonal_tiles_packed_in_workspace():
    """16-bit grouped forward and backward-data read their block-diagonal tiles from the
    workspace: one [KWP x BLOCK_I, BLOCK_O] tile per super-group and filter row, for the
    widest lanes among the tensor-core candidates (16 on the CPU: 4 groups of 2 channels in
    one super-group, the filter row's 3 taps padded to 4)."""
    algo = ALGORITHMS["DIRECT"]
    x, w = (
        torch.empty(2, 8, 6, 5, dtype=torch.float16),
        torch.empty(8, 2, 3, 3, dtype=torch.float16),
    )
    for direction in ("forward", "backward_data"):
        p = _problem(direction, x, w, torch.empty(2, 8, 4, 3, dtype=torch.float16), groups=4)
        assert algo.workspace_bytes(p) == 1 * 3 * (4 * 16 * 16) * 2
    # A GPU offers no tensor-core tiles for depthwise layers: only the float32 copy counts.
    x, w = (
        torch.empty(2, 20, 6, 6, dtype=torch.float16),
        torch.empty(20, 1, 3, 5, dtype=torch.float16),
    )
    y = torch.empty(2, 20, 4, 2, dtype=torch.float16)
    on_gpu = dataclasses.replace(_problem("forward", x, w, y, groups=20), device="cuda")
    assert all(t.kernel not in ("dot", "dot_rows") for t in algo.tile_candidates(on_gpu))
    assert algo.workspace_bytes(on_gpu) == (15 * 32 + MAX_ROWS_CHANNELS) * 4


def test_tensor_core_backward_filter_deterministic(gen):
    conv = dict(groups=2, padding=1)
    x = make_tensor((2, 8, 6, 5), torch.float16, "channels_last", gen)
    dy = make_tensor((2, 8, 6, 5), torch.float16, "channels_last", gen)
    first = rtdnn.conv_backward_filter(x, dy, (8, 4, 3, 3), algo="DIRECT", **conv)
    again = rtdnn.conv_backward_filter(x, dy, (8, 4, 3, 3), algo="DIRECT", **conv)
    assert torch.equal(first, again)


def _problem(direction, x, w, y, **conv) -> ConvProblem:
    """The ConvProblem of these tensors (their strides are what the kernels address)."""
    desc = ConvDesc.create(
        x.dim() - 2, conv.get("stride", 1), conv.get("padding", 0), conv.get("dilation", 1),
        conv.get("groups", 1), conv.get("mode", "cross_correlation"), "fp32",
    )  # fmt: skip
    return ConvProblem.create(
        Direction(direction), TensorDesc.of(x), TensorDesc.of(w), TensorDesc.of(y), desc, "cpu"
    )


def test_backward_filter_deterministic_and_workspace_exact(gen):
    """Several chunks of pixels: two runs are bit-identical, and the first stage writes every
    byte of the declared workspace and nothing past it."""
    conv = dict(groups=4, padding=1)
    x = make_tensor((2, 8, 6, 5), torch.float32, "channels_last", gen)
    w = make_tensor((8, 2, 3, 3), torch.float32, "channels_last", gen)
    dy = make_tensor(y_shape((2, 8, 6, 5), (8, 2, 3, 3), conv), torch.float32, "channels_last", gen)
    p = _problem("backward_filter", x, w, dy, **conv)
    algo = ALGORITHMS["DIRECT"]
    chunks, _ = filter_chunks(p)
    assert chunks > 1
    need = algo.workspace_bytes(p)
    assert need == chunks * 8 * 2 * 9 * 4
    guard = 64
    workspace = torch.full(((need + guard) // 4,), math.nan).view(torch.uint8)
    dws = []
    for _ in range(2):
        dw = poisoned_like(w)
        algo.run(p, ConvTensors(x, dw, dy), workspace)
        dws.append(dw)
        partials = workspace[:need].view(torch.float32)
        assert not torch.isnan(partials).any(), "a partial sum was not written"
        assert torch.isnan(workspace[need:].view(torch.float32)).all(), "wrote past the workspace"
    assert torch.equal(dws[0], dws[1])
    ref = reference.conv_backward_filter(x, dy, w.shape, **conv)
    assert reference.rel_error(dws[0], ref) <= TOL[torch.float32]


#: (x shape, w shape, conv) for every super-group width: 4 channels per group widened to 4
#: (the layer as it is), 8 and 16 (the implicit GEMM's unpacked path, as the GPU's 32 and 64
#: take), a channel multiplier; 3x3 in convolution mode, whose filter gradient splits its
#: reduction on the interpreter too.
WIDTH_CASES = [
    ((2, 16, 5, 6), (32, 4, 3, 3), dict(groups=4, padding=1, stride=(1, 2))),
    ((2, 8, 8, 8), (8, 4, 3, 3), dict(groups=2, padding=1, mode="convolution")),
]


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("case", range(len(WIDTH_CASES)))
def test_super_group_every_width(case, direction, gen):
    """direct_gemm.prepare at every width that holds whole groups, each with exactly its own
    workspace (NaN-poisoned, a guard after it that must stay untouched): two runs
    bit-identical (backward-filter sums its splits in a fixed order), right against the
    float64 reference."""
    from rtdnn.algos import direct_gemm
    from rtdnn.algos.implicit_gemm import split_count

    x_shape, w_shape, conv = WIDTH_CASES[case]
    dtype = torch.float16
    x = make_tensor(x_shape, dtype, "channels_last", gen)
    w = make_tensor(w_shape, dtype, "channels_last", gen)
    dy = make_tensor(y_shape(x_shape, w_shape, conv), dtype, "channels_last", gen)
    ref = reference_of(direction, x, w, dy, conv)
    cg = x_shape[1] // conv["groups"]
    split = False
    for width in [cg * m for m in (1, 2, 4) if x_shape[1] % (cg * m) == 0]:
        outs = []
        for _ in range(2):
            out = poisoned_output(direction, x, w, dy)
            tensors = written_into(direction, x, w, dy, out)
            p = _problem(direction, tensors.x, tensors.w, tensors.y, **conv)
            tiles = direct_gemm.inner_candidates(p, width)[0]
            need = direct_gemm.workspace_bytes(p, width)
            workspace = torch.full((need // 4 + 16,), math.nan).view(torch.uint8)
            direct_gemm.prepare(p, width, tiles)(tensors, workspace, 1.0, 0.0)
            assert torch.isnan(workspace[need:].view(torch.float32)).all(), width
            outs.append(out)
        assert torch.equal(outs[0], outs[1]), width
        assert reference.rel_error(outs[0], ref) <= TOL[dtype], width
        if direction == "backward_filter" and width > cg:
            split = split or split_count(direct_gemm.widened(p, width)) > 1
    if direction == "backward_filter" and case == 1:
        assert split, "no width split its filter gradient: the workspace slice went untested"


def test_super_group_widths_on_a_gpu():
    """The widths a GPU problem is offered (no GPU needed): 32 and 64 where they hold whole
    groups and divide the channels, the widest for backward-filter and only from 16 channels
    per group there, none for depthwise, ungrouped or float32 layers."""
    from rtdnn.algos import direct_gemm

    def widths(direction, c, groups, dtype=torch.bfloat16):
        desc = ConvDesc.create(2, 1, 1, 1, groups, "cross_correlation", "fp32")
        x = TensorDesc((8, c, 14, 14), (14 * 14 * c, 1, 14 * c, c), dtype)
        w = TensorDesc((c, c // groups, 3, 3), (9 * c // groups, 1, 3 * c // groups, c // groups),
                       dtype)  # fmt: skip
        p = ConvProblem.create(Direction(direction), x, w, x, desc, "cuda")
        return direct_gemm.widths(p)

    assert widths("forward", 128, 32) == [32, 64]
    assert widths("backward_data", 1024, 32) == [32, 64]
    assert widths("forward", 2048, 32) == [64]
    assert widths("forward", 48, 12) == []  # 32 and 64 do not divide 48 channels
    assert widths("backward_filter", 256, 32) == []  # 8 per group: the block-diagonal tiles
    assert widths("backward_filter", 512, 32) == [64]
    assert widths("forward", 64, 64) == []  # depthwise
    assert widths("forward", 64, 1) == []
    assert widths("forward", 128, 32, torch.float32) == []


# -- selection and errors ---------------------------------------------------------------------


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_auto_chooses_direct_for_depthwise(direction):
    x, w = torch.empty(2, 32, 8, 8), torch.empty(32, 1, 3, 3)
    get = lambda **kw: rtdnn.get_conv_algorithm(x, w, direction=direction, groups=32, **kw)
    assert get() == "DIRECT"
    # DIRECT needs workspace for depthwise layers (the packed filter, or backward-filter's
    # partial sums): without any, a path that needs none.
    assert get(preference="no_workspace") == "IMPLICIT_GEMM"
    assert get(workspace_limit=0) == "IMPLICIT_GEMM"
    assert (
        get(workspace_limit=(9 * 32 + MAX_ROWS_CHANNELS) * 4) == "DIRECT"
        or direction == "backward_filter"
    )


def test_auto_chooses_for_grouped_by_dtype():
    """Grouped layers: in float32 16 channels per group is beyond DIRECT (its FMA kernels) and
    4 per group measured far below cuDNN, so the GEMMs run; in 16-bit data the tensor-core
    tiles take up to algos.direct.PREFER_UP_TO_CG per group."""
    x, w = torch.empty(2, 64, 8, 8), torch.empty(64, 16, 3, 3)
    assert rtdnn.get_conv_algorithm(x, w, groups=4) != "DIRECT"
    x, w = torch.empty(2, 64, 8, 8), torch.empty(64, 4, 3, 3)
    assert rtdnn.get_conv_algorithm(x, w, groups=16) != "DIRECT"
    assert rtdnn.get_conv_algorithm(x, w, groups=16, direction="backward_data") != "DIRECT"
    for cg in (4, 16, 32):
        x = torch.empty(2, 64, 8, 8, dtype=torch.bfloat16)
        w = torch.empty(64, cg, 3, 3, dtype=torch.bfloat16)
        for direction in DIRECTIONS:
            algo = rtdnn.get_conv_algorithm(x, w, groups=64 // cg, direction=direction)
            assert algo == "DIRECT", (cg, direction, algo)
    x, w = torch.empty(2, 128, 8, 8, dtype=torch.bfloat16), torch.empty(128, 64, 3, 3)
    assert rtdnn.get_conv_algorithm(x, w.bfloat16(), groups=2) != "DIRECT"


def test_auto_prefers_filter_taps_for_64_channel_weight_gradients(monkeypatch):
    """On a GPU, 16-bit channels-last weight gradients of ungrouped layers of 16 to 64 input
    and output channels with filters over 1x1 go to DIRECT (one super-group of its
    one-accumulator-per-tap tiles); 1x1 filters, wider or narrower layers, other directions,
    NCHW data and the CPU keep the heuristic's other choices."""
    import rtdnn.algos.implicit_gemm as implicit_gemm
    from rtdnn.select import _heuristic_order

    # The split count the heuristic reads asks the device its size: an H100's, here.
    monkeypatch.setattr(implicit_gemm, "parallel_slots", lambda device: 264)

    def first(c=64, k=64, kernel=(3, 3), direction="backward_filter", dtype=torch.bfloat16,
              layout="channels_last", device="cuda"):  # fmt: skip
        x = make_tensor((2, c, 6, 5), dtype, layout, None)
        w = make_tensor((k, c, *kernel), dtype, layout, None)
        y = make_tensor(y_shape(x.shape, w.shape, dict(padding=1)), dtype, layout, None)
        p = dataclasses.replace(_problem(direction, x, w, y, padding=1), device=device)
        return _heuristic_order(p)[0]

    assert first() == "DIRECT"
    assert first(c=16, k=32, kernel=(3, 5)) == "DIRECT"
    assert first(kernel=(1, 1)) != "DIRECT"
    assert first(c=128) != "DIRECT" and first(k=128) != "DIRECT" and first(c=8) != "DIRECT"
    assert first(direction="forward") != "DIRECT"
    assert first(dtype=torch.float16) == "DIRECT"
    assert first(layout="contiguous") != "DIRECT"
    assert first(device="cpu") != "DIRECT"


def test_auto_runs_direct_and_matches(gen):
    x = make_tensor((2, 5, 4, 4), torch.float32, "channels_last", gen)
    w = make_tensor((5, 1, 3, 3), torch.float32, "channels_last", gen)
    b = make_tensor((5,), torch.float32, generator=gen)
    y = rtdnn.conv_forward(x, w, b, groups=5, padding=1, math="fp32")
    err = reference.rel_error(y, reference.conv_forward(x, w, b, groups=5, padding=1))
    assert err <= TOL[torch.float32]


def test_forced_direct_on_too_many_channels_per_group(gen):
    x = make_tensor((1, 18, 4, 4), torch.float32, generator=gen)
    w = make_tensor((2, 9, 3, 3), torch.float32, generator=gen)
    out = torch.ones(1, 2, 2, 2)
    with pytest.raises(rtdnn.NotSupportedError, match="9 input channels per group"):
        rtdnn.conv_forward(x, w, groups=2, algo="DIRECT", out=out)
    assert torch.equal(out, torch.ones(1, 2, 2, 2)), "out written although rejected"
    # 16-bit data: up to 64 per group; beyond, or with a filter wider than 8, refused.
    x = make_tensor((1, 130, 4, 4), torch.bfloat16, generator=gen)
    w = make_tensor((2, 65, 3, 3), torch.bfloat16, generator=gen)
    with pytest.raises(rtdnn.NotSupportedError, match="65 channels per group"):
        rtdnn.conv_forward(x, w, groups=2, algo="DIRECT")
    x = make_tensor((1, 18, 12), torch.bfloat16, generator=gen)
    w = make_tensor((2, 9, 9), torch.bfloat16, generator=gen)
    with pytest.raises(rtdnn.NotSupportedError, match="at most 8 wide"):
        rtdnn.conv_forward(x, w, groups=2, algo="DIRECT")


def test_forced_direct_backward_filter_below_workspace(gen):
    x = make_tensor((2, 4, 6, 6), torch.float32, generator=gen)
    w_shape = (4, 1, 3, 3)
    dy = make_tensor((2, 4, 6, 6), torch.float32, generator=gen)
    p = _problem("backward_filter", x, torch.empty(w_shape), dy, groups=4, padding=1)
    need = ALGORITHMS["DIRECT"].workspace_bytes(p)
    assert need > 0
    out = torch.ones(w_shape)
    with pytest.raises(rtdnn.BadParamError) as info:
        rtdnn.conv_backward_filter(
            x, dy, w_shape, groups=4, padding=1, algo="DIRECT", workspace_limit=need - 1, out=out
        )
    assert "workspace_limit" in str(info.value) and str(need) in str(info.value)
    assert torch.equal(out, torch.ones(w_shape))
    # Exactly the need is enough.
    dw = rtdnn.conv_backward_filter(
        x, dy, w_shape, groups=4, padding=1, algo="DIRECT", workspace_limit=need, math="fp32"
    )
    ref = reference.conv_backward_filter(x, dy, w_shape, groups=4, padding=1)
    assert reference.rel_error(dw, ref) <= TOL[torch.float32]
