"""WINOGRAD_NONFUSED (every direction) and WINOGRAD (fused: forward and backward-data), 3x3 at
stride 1, against the float64 reference through the interpreter: both modes, padding 0 to 2,
odd and one-pixel images, groups, both tile sizes F(2x2,3x3) and F(4x4,3x3), channels-last and
strided views, alpha/beta (NaN-poisoned outputs for beta = 0), bias, float32, float16 and
bfloat16; backward-filter's split reduction deterministic within its exact workspace;
selection (listed by find; picked by the heuristic for strict float32 on a GPU only) and
the refusals of forced runs."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import make_tensor, out_size, poisoned_like, run_conv_direction

import rtdnn
from rtdnn import reference, select
from rtdnn.algos import ALGORITHMS, ConvTensors, geometry
from rtdnn.algos.winograd import WinogradTiles, plan
from rtdnn.core import ConvDesc, ConvProblem, Direction, TensorDesc, conv_output_shape
from rtdnn.core.handle import allocate_workspace

ALGO = "WINOGRAD_NONFUSED"
FUSED = "WINOGRAD"
ALGOS = [ALGO, FUSED]
DIRECTIONS = ["forward", "backward_data", "backward_filter"]
#: Relative error against float64 (inputs rounded to the dtype first). Float32: the
#: transforms add a few roundings (F(4x4)'s up to 10x the data), still far below 1e-5; the
#: 16-bit types are dominated by rounding the result.
TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def y_shape(x_shape, w_shape, padding) -> tuple[int, ...]:
    o = out_size(x_shape[2:], w_shape[2:], (1, 1), (padding, padding), (1, 1))
    return (x_shape[0], w_shape[0], *o)


def run_direction(direction, x, w, dy, *, dtype, algo=ALGO, **kw):
    """One direction with `algo` at this module's tolerance: run_conv_direction."""
    return run_conv_direction(direction, x, w, dy, algo=algo, dtype=dtype, tol=TOL[dtype], **kw)


def check(x_shape, w_shape, *, dtype=torch.float32, layout="contiguous", gen=None, algo=ALGO,
          **conv):  # fmt: skip
    """Every direction `algo` supports."""
    x = make_tensor(x_shape, dtype, layout, gen)
    w = make_tensor(w_shape, dtype, layout, gen)
    dy = make_tensor(y_shape(x_shape, w_shape, conv.get("padding", 0)), dtype, layout, gen)
    for direction in DIRECTIONS if algo == ALGO else DIRECTIONS[:2]:
        run_direction(direction, x, w, dy, dtype=dtype, layout=layout, gen=gen, algo=algo, **conv)


# (id, x shape, w shape, conv parameters)
CASES = [
    ("odd-7x5-pad1", (2, 3, 7, 5), (4, 3, 3, 3), dict(padding=1)),
    ("6x6-pad0-groups2-conv", (1, 4, 6, 6), (4, 2, 3, 3), dict(padding=0, groups=2,
                                                               mode="convolution")),
    ("1x3-pad2", (2, 2, 1, 3), (3, 2, 3, 3), dict(padding=2)),
    ("3x4-pad1-conv", (1, 1, 3, 4), (2, 1, 3, 3), dict(padding=1, mode="convolution")),
]  # fmt: skip


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("x_shape,w_shape,conv", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_shapes_against_reference(x_shape, w_shape, conv, algo, gen):
    check(x_shape, w_shape, gen=gen, algo=algo, **conv)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("x_shape,w_shape,conv", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_tensor_core_tiles_on_few_channel_layers(x_shape, w_shape, conv, algo, gen):
    """CASES (a few channels a group: the FMA products come first there) through the
    tensor-core tiles too, in strided views, every direction the algorithm runs."""
    x = make_tensor(x_shape, torch.float32, "strided", gen)
    w = make_tensor(w_shape, torch.float32, generator=gen)
    dy = make_tensor(y_shape(x_shape, w_shape, conv.get("padding", 0)), torch.float32,
                     "strided", gen)  # fmt: skip
    refs = {
        "forward": lambda: reference.conv_forward(x, w, **conv),
        "backward_data": lambda: reference.conv_backward_data(dy, w, x.shape, **conv),
        "backward_filter": lambda: reference.conv_backward_filter(x, dy, w.shape, **conv),
    }
    for direction in DIRECTIONS if algo == ALGO else DIRECTIONS[:2]:
        p = _problem(direction, x, w, dy, **conv)
        written = {"forward": dy, "backward_data": x, "backward_filter": w}[direction]
        out = poisoned_like(written)
        t = ConvTensors(x, w, dy).with_written(Direction(direction), out)
        workspace = allocate_workspace(ALGORITHMS[algo].workspace_bytes(p), torch.device("cpu"))
        ALGORITHMS[algo].prepare(p, _tensor_core_tiles(p, algo))(t, workspace, 1.0, 0.0)
        assert reference.rel_error(out, refs[direction]()) <= TOL[torch.float32], direction


@pytest.mark.parametrize("algo", ALGOS)
def test_several_programs_per_kernel(algo, gen):
    """40 input and 36 output channels on 25 tiles: every transform kernel runs several
    blocks of tiles and of channels (the other tests fit in one)."""
    check((1, 40, 10, 9), (36, 40, 3, 3), layout="channels_last", gen=gen, algo=algo, padding=1)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("layout", ["channels_last", "strided"])
def test_layouts_with_alpha_beta(layout, algo, gen):
    """Channels-last and strided views (inputs and out), alpha and beta on a random out."""
    dtype = torch.float32
    x = make_tensor((2, 4, 5, 6), dtype, layout, gen)
    w = make_tensor((4, 2, 3, 3), dtype, layout, gen)
    dy = make_tensor(y_shape(x.shape, w.shape, 1), dtype, layout, gen)
    for direction in DIRECTIONS if algo == ALGO else DIRECTIONS[:2]:
        run_direction(direction, x, w, dy, dtype=dtype, layout=layout, alpha=0.5, beta=-0.75,
                      gen=gen, algo=algo, padding=1, groups=2)  # fmt: skip


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precision(dtype, algo, gen):
    """16-bit storage, float32 transforms and products (whose operands are float32, so the
    interpreter's wrong bfloat16 tl.dot is never reached)."""
    check((2, 3, 5, 6), (4, 3, 3, 3), dtype=dtype, layout="channels_last", gen=gen, algo=algo,
          padding=1)  # fmt: skip


@pytest.mark.parametrize("algo", ALGOS)
def test_bias_with_beta(algo, gen):
    x = make_tensor((1, 3, 4, 5), torch.float32, generator=gen)
    w = make_tensor((2, 3, 3, 3), torch.float32, generator=gen)
    b = make_tensor((2,), torch.float32, generator=gen)
    out = make_tensor((1, 2, 4, 5), torch.float32, generator=gen)
    prior = out.clone()
    y = rtdnn.conv_forward(x, w, b, padding=1, alpha=2.0, beta=0.5, out=out, algo=algo,
                           math="fp32")  # fmt: skip
    ref = reference.conv_forward(x, w, b, padding=1, alpha=2.0, beta=0.5, out=prior)
    assert reference.rel_error(y, ref) <= TOL[torch.float32]


# -- both tile sizes, through the algorithm itself -------------------------------------------


def _problem(direction, x, w, y, **conv) -> ConvProblem:
    desc = ConvDesc.create(
        2, 1, conv.get("padding", 0), 1, conv.get("groups", 1),
        conv.get("mode", "cross_correlation"), "fp32",
    )  # fmt: skip
    return ConvProblem.create(
        Direction(direction), TensorDesc.of(x), TensorDesc.of(w), TensorDesc.of(y), desc, "cpu",
        has_bias=direction == "forward",
    )  # fmt: skip


def _tensor_core_tiles(p: ConvProblem, algo: str = ALGO) -> WinogradTiles:
    """The algorithm's first candidate with tensor-core products (not the FMA products of a
    few reduced or written channels)."""
    return next(t for t in ALGORITHMS[algo].tile_candidates(p) if not t.fma and t.block_n >= 16)


def _tiles(p: ConvProblem, m: int, algo: str = ALGO) -> WinogradTiles:
    """The algorithm's first tensor-core candidate with the output tile set to m."""
    first = _tensor_core_tiles(p, algo)
    return WinogradTiles(first.block_m, first.block_n, first.block_k, 1, 1, 1, out_tile=m)


@pytest.mark.parametrize(
    "algo,direction", [(ALGO, d) for d in DIRECTIONS] + [(FUSED, d) for d in DIRECTIONS[:2]]
)
def test_f4x4_every_direction(algo, direction, gen):
    """F(4x4,3x3) (the first candidate on the GPU for float32) with padding 2 and true
    convolution: 7x5 outputs (5x3 for backward-data), so the last tiles hang over the edge."""
    conv = dict(padding=2, mode="convolution")
    x = make_tensor((1, 3, 5, 3), torch.float32, "channels_last", gen)
    w = make_tensor((2, 3, 3, 3), torch.float32, generator=gen)
    dy = make_tensor(y_shape(x.shape, w.shape, 2), torch.float32, generator=gen)
    b = make_tensor((2,), torch.float32, generator=gen)
    written = {"forward": dy, "backward_data": x, "backward_filter": w}[direction]
    out = poisoned_like(written)
    t = ConvTensors(x, w, dy, b if direction == "forward" else None).with_written(
        Direction(direction), out
    )
    p = _problem(direction, t.x, t.w, t.y, **conv)
    workspace = allocate_workspace(ALGORITHMS[algo].workspace_bytes(p), torch.device("cpu"))
    ALGORITHMS[algo].prepare(p, _tiles(p, 4, algo))(t, workspace, 1.0, 0.0)
    if direction == "forward":
        ref = reference.conv_forward(x, w, b, **conv)
    elif direction == "backward_data":
        ref = reference.conv_backward_data(dy, w, x.shape, **conv)
    else:
        ref = reference.conv_backward_filter(x, dy, w.shape, **conv)
    assert reference.rel_error(out, ref) <= TOL[torch.float32]


@pytest.mark.parametrize("fma", [False, True], ids=["gemm", "fma"])
def test_backward_filter_split_deterministic_and_workspace_exact(fma, gen):
    """Backward-filter reduces over 2 x 4 x 4 = 32 tiles: the GEMM in two splits, the FMA
    products (2 input channels) in 4 chunks of 8 tiles. Two runs are bit-identical, and
    nothing past the declared workspace is written."""
    x = make_tensor((2, 2, 7, 8), torch.float32, generator=gen)
    w = make_tensor((3, 2, 3, 3), torch.float32, generator=gen)
    dy = make_tensor(y_shape(x.shape, w.shape, 1), torch.float32, generator=gen)
    p = _problem("backward_filter", x, w, dy, padding=1)
    algo = ALGORITHMS[ALGO]
    assert plan(p, 2).splits == 2
    tiles = next(t for t in algo.tile_candidates(p) if t.fma == fma and t.out_tile == 2)
    need = algo.workspace_bytes(p)
    guard = 64
    workspace = torch.full(((need + guard) // 4,), math.nan).view(torch.uint8)
    dws = []
    for _ in range(2):
        dw = poisoned_like(w)
        algo.prepare(p, tiles)(ConvTensors(x, dw, dy), workspace, 1.0, 0.0)
        dws.append(dw)
        assert torch.isnan(workspace[need:].view(torch.float32)).all(), "wrote past the workspace"
    assert torch.equal(dws[0], dws[1])
    ref = reference.conv_backward_filter(x, dy, w.shape, padding=1)
    assert reference.rel_error(dws[0], ref) <= TOL[torch.float32]


@pytest.mark.parametrize("mode", ["cross_correlation", "convolution"])
def test_backward_filter_fma_products(mode, gen):
    """WINOGRAD_NONFUSED's weight gradient for a few input channels a group (filter_fma_kernel,
    first): 3 channels and 2 groups of 2, several chunks of tiles and of output channels,
    tiles over the edge, alpha and beta into a NaN-poisoned then a prior gradient, against
    float64; only F(2x2) tiles; none offered from 5 channels a group."""
    algo = ALGORITHMS[ALGO]
    for x_shape, w_shape, groups in (((2, 3, 9, 11), (20, 3, 3, 3), 1),
                                     ((1, 4, 7, 6), (6, 2, 3, 3), 2)):  # fmt: skip
        conv = dict(padding=1, groups=groups, mode=mode)
        x = make_tensor(x_shape, torch.float32, "channels_last", gen)
        w = make_tensor(w_shape, torch.float32, generator=gen)
        dy = make_tensor(y_shape(x.shape, w.shape, 1), torch.float32, "channels_last", gen)
        p = _problem("backward_filter", x, w, dy, **conv)
        candidates = algo.tile_candidates(p)
        assert candidates[0].fma and all(t.out_tile == 2 for t in candidates if t.fma)
        workspace = allocate_workspace(algo.workspace_bytes(p), torch.device("cpu"))
        for alpha, beta in ((1.0, 0.0), (0.5, -0.75)):
            prior = make_tensor(w_shape, torch.float32, generator=gen)
            dw = poisoned_like(w) if beta == 0 else prior.clone()
            algo.prepare(p, candidates[0])(ConvTensors(x, dw, dy), workspace, alpha, beta)
            ref = reference.conv_backward_filter(x, dy, w.shape, alpha=alpha, beta=beta,
                                                 out=prior, **conv)  # fmt: skip
            assert reference.rel_error(dw, ref) <= TOL[torch.float32], (x_shape, alpha, beta)
    x, w = torch.empty(1, 5, 6, 6), torch.empty(4, 5, 3, 3)
    p = _problem("backward_filter", x, w, torch.empty(1, 4, 6, 6), padding=1)
    assert not any(t.fma for t in algo.tile_candidates(p))


# -- selection and refusals ------------------------------------------------------------------


@pytest.mark.parametrize("direction", DIRECTIONS[:2])
@pytest.mark.parametrize("groups,written", [(2, 3), (1, 20)])
def test_fused_fma_products_on_few_reduced_channels(direction, groups, written, gen):
    """WINOGRAD (fused) multiplies layers of at most FMA_CHANNELS reduced channels a group
    with float32 FMAs, first; those and the tensor-core products both match float64 on
    stem-like layers (3 reduced channels a group: 2 groups of 3 written channels, or one of
    20, two blocks of output channels; 6x7 outputs, so tiles hang over the edge) with bias,
    alpha and beta, NaN-poisoned out for beta = 0."""
    conv = dict(padding=1, groups=groups)
    c, k = (3 * groups, written * groups) if direction == "forward" else (written * groups,
                                                                       3 * groups)  # fmt: skip
    x = make_tensor((2, c, 6, 7), torch.float32, "channels_last", gen)
    w = make_tensor((k, c // groups, 3, 3), torch.float32, generator=gen)
    dy = make_tensor(y_shape(x.shape, w.shape, 1), torch.float32, "channels_last", gen)
    b = make_tensor((k,), torch.float32, generator=gen)
    forward = direction == "forward"
    written = dy if forward else x
    t = ConvTensors(x, w, dy, b if forward else None)
    p = _problem(direction, x, w, dy, **conv)
    algo = ALGORITHMS[FUSED]
    candidates = algo.tile_candidates(p)
    assert candidates[0].fma and candidates[0].out_tile == 2
    workspace = allocate_workspace(algo.workspace_bytes(p), torch.device("cpu"))
    for tiles in (candidates[0], _tensor_core_tiles(p, FUSED)):
        for alpha, beta in ((1.0, 0.0), (0.5, -0.75)):
            prior = make_tensor(written.shape, torch.float32, "channels_last", gen)
            out = poisoned_like(written) if beta == 0 else prior.clone()
            algo.prepare(p, tiles)(t.with_written(Direction(direction), out), workspace, alpha,
                                   beta)  # fmt: skip
            if forward:
                ref = reference.conv_forward(x, w, b, alpha=alpha, beta=beta, out=prior, **conv)
            else:
                ref = reference.conv_backward_data(dy, w, x.shape, alpha=alpha, beta=beta,
                                                   out=prior, **conv)  # fmt: skip
            assert reference.rel_error(out, ref) <= TOL[torch.float32], (tiles, alpha, beta)


@pytest.mark.parametrize("direction", DIRECTIONS[:2])
def test_fused_narrow_products_on_few_written_channels(direction, gen):
    """WINOGRAD (fused) on 3 written channels (an RGB stem's backward-data; a forward of 3
    filters) over 20 reduced ones: tiles 4 written channels wide come first, each point's
    product summed from FMAs (tensor-core products are 16 or more wide), 16 reduced channels
    a step (two steps); bias, alpha and beta, NaN-poisoned out for beta = 0, against float64."""
    c, k = (3, 20) if direction == "backward_data" else (20, 3)
    x = make_tensor((2, c, 6, 7), torch.float32, "channels_last", gen)
    w = make_tensor((k, c, 3, 3), torch.float32, generator=gen)
    dy = make_tensor(y_shape(x.shape, w.shape, 1), torch.float32, "channels_last", gen)
    b = make_tensor((k,), torch.float32, generator=gen)
    forward = direction == "forward"
    written = dy if forward else x
    t = ConvTensors(x, w, dy, b if forward else None)
    p = _problem(direction, x, w, dy, padding=1)
    algo = ALGORITHMS[FUSED]
    tiles = algo.tile_candidates(p)[0]
    assert (tiles.block_n, tiles.block_k, tiles.fma) == (4, 16, False)
    workspace = allocate_workspace(algo.workspace_bytes(p), torch.device("cpu"))
    for alpha, beta in ((1.0, 0.0), (0.5, -0.75)):
        prior = make_tensor(written.shape, torch.float32, "channels_last", gen)
        out = poisoned_like(written) if beta == 0 else prior.clone()
        algo.prepare(p, tiles)(t.with_written(Direction(direction), out), workspace, alpha, beta)
        if forward:
            ref = reference.conv_forward(x, w, b, alpha=alpha, beta=beta, out=prior, padding=1)
        else:
            ref = reference.conv_backward_data(dy, w, x.shape, alpha=alpha, beta=beta,
                                               out=prior, padding=1)  # fmt: skip
        assert reference.rel_error(out, ref) <= TOL[torch.float32], (alpha, beta)


@pytest.mark.parametrize("direction", DIRECTIONS[:2])
@pytest.mark.parametrize("reduced,fma", [(1, True), (4, True), (5, False), (64, False)])
def test_fused_fma_products_where_few_channels(direction, reduced, fma):
    """The FMA products are offered (first) up to FMA_CHANNELS reduced channels a group, in
    F(2x2) only, on a GPU as on the CPU; not above."""
    for device in ("cpu", "cuda"):
        c, k = (reduced, 64) if direction == "forward" else (64, reduced)
        p = _gpu_problem(direction, (8, c, 28, 28), (k, c, 3, 3))
        if device == "cpu":
            p = _problem(direction, torch.empty(8, c, 28, 28), torch.empty(k, c, 3, 3),
                         torch.empty(8, k, 26, 26))  # fmt: skip
        tiles = ALGORITHMS[FUSED].tile_candidates(p)
        assert tiles[0].fma == fma
        assert all(t.out_tile == 2 for t in tiles if t.fma)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_heuristic_never_picks_winograd_on_the_cpu(direction):
    x, w = torch.empty(8, 64, 28, 28), torch.empty(64, 64, 3, 3)
    for kw in ({}, {"math": "fp32"}, {"workspace_limit": 2**40}):
        chosen = rtdnn.get_conv_algorithm(x, w, direction=direction, padding=1, **kw)
        assert chosen not in ALGOS


def _gpu_problem(direction, x_shape, w_shape, math="fp32", dtype=torch.float32, **conv):
    """A problem as a GPU call would describe it (nothing runs: the heuristic only reads it)."""
    x, w = torch.empty(x_shape, dtype=dtype), torch.empty(w_shape, dtype=dtype)
    desc = ConvDesc.create(
        2, conv.get("stride", 1), 1, 1, conv.get("groups", 1), "cross_correlation", math
    )
    y = torch.empty(conv_output_shape(x.shape, w.shape, desc), dtype=dtype)
    return ConvProblem.create(
        Direction(direction), TensorDesc.of(x), TensorDesc.of(w), TensorDesc.of(y), desc, "cuda"
    )


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_heuristic_picks_nonfused_for_strict_float32_on_a_gpu(direction, monkeypatch):
    """Strict float32 3x3 layers on a GPU run as WINOGRAD_NONFUSED, within the workspace
    limit; TF32 and 16-bit data, strided and narrow layers keep the implicit GEMM."""
    # No GPU here: nothing stored to ask the database for; an H100's 132 multiprocessors.
    monkeypatch.setattr(select, "_known", lambda p: [])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(geometry, "multiprocessor_count", lambda index: 132)
    p = _gpu_problem(direction, (8, 64, 28, 28), (64, 64, 3, 3))
    assert select.choose(p).name == ALGO
    need = ALGORITHMS[ALGO].workspace_bytes(p)
    assert select.choose(p, workspace_limit=need - 1).name != ALGO
    assert select.choose(p, "no_workspace").name != ALGO
    others = [
        _gpu_problem(direction, (8, 64, 28, 28), (64, 64, 3, 3), math="tf32"),
        _gpu_problem(direction, (8, 64, 28, 28), (64, 64, 3, 3), None, torch.bfloat16),
        _gpu_problem(direction, (8, 64, 28, 28), (64, 64, 3, 3), stride=2),
        _gpu_problem(direction, (8, 8, 28, 28), (64, 8, 3, 3)),
        _gpu_problem(direction, (8, 64, 28, 28), (64, 8, 3, 3), groups=8),
    ]
    for q in others:
        assert select.choose(q).name not in ALGOS, q


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_gpu_tiles_are_narrow_and_fit_the_rows(direction, monkeypatch):
    """On a GPU the GEMMs take Winograd's own tiles, 64 columns wide first (the sweep's
    winners), and a filter gradient of 64 output channels takes a 64-row tile first."""
    monkeypatch.setattr(geometry, "multiprocessor_count", lambda index: 132)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for channels in (64, 256):
        p = _gpu_problem(direction, (8, channels, 28, 28), (channels, channels, 3, 3))
        tiles = ALGORITHMS[ALGO].tile_candidates(p)
        first = tiles[0]
        assert (first.out_tile, first.block_n) == (4, 64)
        filter_rows = 64 if direction == "backward_filter" and channels == 64 else 128
        assert first.block_m == filter_rows
        # Every shape is offered for both tile sizes, F(4x4) first (strict float32).
        assert [t.out_tile for t in tiles] == sorted((t.out_tile for t in tiles), reverse=True)
        assert {t.base() for t in tiles if t.out_tile == 2} == {
            t.base() for t in tiles if t.out_tile == 4
        }


def test_find_lists_winograd_where_supported(gen, monkeypatch):
    monkeypatch.setattr(select, "_measured", {})
    x = make_tensor((1, 2, 3, 3), torch.float32, generator=gen)
    w = make_tensor((2, 2, 3, 3), torch.float32, generator=gen)
    p = _problem("forward", x, w, torch.empty(1, 2, 3, 3), padding=1)
    results = rtdnn.find_conv_algorithms(x, w, padding=1, math="fp32")
    for algo in ALGOS:
        mine = [r for r in results if r.algo == algo]
        assert len(mine) == 1 and mine[0].status == "ok" and mine[0].deterministic, results
        assert mine[0].workspace_bytes == ALGORITHMS[algo].workspace_bytes(p) > 0
    filters = rtdnn.find_conv_algorithms(x, w, direction="backward_filter", padding=1, math="fp32")
    assert ALGO in {r.algo for r in filters} and FUSED not in {r.algo for r in filters}
    strided = rtdnn.find_conv_algorithms(x, w, padding=1, stride=2, math="fp32")
    assert not set(ALGOS) & {r.algo for r in strided}


@pytest.mark.parametrize(
    "w_shape,conv,reason",
    [
        ((2, 2, 3, 3), dict(stride=2, padding=1), "stride"),
        ((2, 2, 3, 3), dict(dilation=2, padding=2), "dilation"),
        ((2, 2, 5, 5), dict(padding=2), "kernel"),
        ((2, 2, 3), dict(padding=1), "2-D"),
    ],
    ids=["stride2", "dilation2", "5x5", "1d"],
)
@pytest.mark.parametrize("algo", ALGOS)
def test_forced_on_unsupported_problem(w_shape, conv, reason, algo, gen):
    x = make_tensor((1, 2, *([6] * (len(w_shape) - 2))), torch.float32, generator=gen)
    w = make_tensor(w_shape, torch.float32, generator=gen)
    y = rtdnn.conv_forward(x, w, **conv)
    dy = torch.ones_like(y)
    calls = {
        "forward": lambda out: rtdnn.conv_forward(x, w, algo=algo, out=out, **conv),
        "backward_data": lambda out: rtdnn.conv_backward_data(
            dy, w, x.shape, algo=algo, out=out, **conv
        ),
        "backward_filter": lambda out: rtdnn.conv_backward_filter(
            x, dy, w.shape, algo=algo, out=out, **conv
        ),
    }
    for direction, call in calls.items():
        out = torch.ones_like({"forward": y, "backward_data": x, "backward_filter": w}[direction])
        with pytest.raises(rtdnn.NotSupportedError, match=reason):
            call(out)
        assert torch.equal(out, torch.ones_like(out)), f"{direction}: out written although rejected"
    # algo="auto" never fails on it.
    assert reference.rel_error(y, reference.conv_forward(x, w, **conv)) <= TOL[torch.float32]


@pytest.mark.parametrize(
    "algo,direction", [(ALGO, d) for d in DIRECTIONS] + [(FUSED, d) for d in DIRECTIONS[:2]]
)
def test_forced_below_workspace(algo, direction, gen):
    x = make_tensor((1, 2, 4, 4), torch.float32, generator=gen)
    w = make_tensor((2, 2, 3, 3), torch.float32, generator=gen)
    dy = make_tensor((1, 2, 4, 4), torch.float32, generator=gen)
    p = _problem(direction, x, w, dy, padding=1)
    need = ALGORITHMS[algo].workspace_bytes(p)
    assert need > 0
    written = {"forward": dy, "backward_data": x, "backward_filter": w}[direction]
    out = torch.ones_like(written)
    args = dict(padding=1, algo=algo, workspace_limit=need - 1, out=out, math="fp32")
    with pytest.raises(rtdnn.BadParamError) as info:
        if direction == "forward":
            rtdnn.conv_forward(x, w, **args)
        elif direction == "backward_data":
            rtdnn.conv_backward_data(dy, w, x.shape, **args)
        else:
            rtdnn.conv_backward_filter(x, dy, w.shape, **args)
    assert "workspace_limit" in str(info.value) and str(need) in str(info.value)
    assert torch.equal(out, torch.ones_like(written))
    # algo="auto" under the same limit runs (on an algorithm that fits).
    if direction == "forward":
        y = rtdnn.conv_forward(x, w, padding=1, workspace_limit=need - 1, math="fp32")
        assert reference.rel_error(y, reference.conv_forward(x, w, padding=1)) <= 1e-5


def test_fused_refuses_backward_filter(gen):
    x = make_tensor((1, 2, 4, 4), torch.float32, generator=gen)
    dy = make_tensor((1, 2, 4, 4), torch.float32, generator=gen)
    with pytest.raises(rtdnn.NotSupportedError, match="backward-filter"):
        rtdnn.conv_backward_filter(x, dy, (2, 2, 3, 3), padding=1, algo=FUSED)
