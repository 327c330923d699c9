"""DIRECT on the GPU: depthwise and narrow grouped convolutions in bfloat16 (which only the GPU
run checks against a wide range of shapes), float16 and float32, every direction, channels-last
and contiguous, against the float64 reference; backward-filter bit-identical across runs;
autograd through rtdnn.nn.Conv2d picks DIRECT for a depthwise layer. Run with RTDNN_GPU_TESTS=1
on a machine with a CUDA GPU."""

import pytest
import torch
from conftest import gpu_only

import rtdnn
import rtdnn.nn as rnn
from rtdnn import reference as R

pytestmark = gpu_only()

CASES = {
    "bf16": (torch.bfloat16, 1e-2),
    "fp16": (torch.float16, 2e-3),
    "fp32": (torch.float32, 1e-5),
}
SHAPES = [
    # x shape, w shape, conv parameters
    ((4, 96, 23, 21), (96, 1, 3, 3), dict(padding=1, groups=96)),
    ((3, 144, 20, 19), (144, 1, 5, 5), dict(stride=2, padding=2, groups=144)),
    ((2, 192, 14, 14), (192, 1, 7, 7), dict(padding=3, groups=192)),
    ((2, 40, 12, 13), (80, 1, 3, 3), dict(padding=2, dilation=2, groups=40, mode="convolution")),
    ((3, 128, 15, 15), (128, 4, 3, 3), dict(padding=1, groups=32)),
    ((2, 256, 16, 16), (256, 8, 3, 3), dict(stride=2, padding=1, groups=32)),
    ((2, 24, 6, 9, 7), (24, 1, 3, 3, 3), dict(padding=1, groups=24)),
    ((3, 40, 50), (40, 1, 5), dict(padding=4, dilation=2, groups=40)),
    ((2, 3, 33, 31), (32, 3, 7, 7), dict(stride=2, padding=3)),
    ((2, 512, 9, 10), (512, 16, 3, 3), dict(padding=1, groups=32)),
    ((2, 192, 8, 7), (96, 32, 3, 3), dict(stride=2, padding=1, groups=6)),
]
#: Shapes beyond the FMA kernels' 8 channels per group: 16-bit data only.
WIDE_GROUPS = SHAPES[-2:]
#: Grouped rows wider than 32 columns, where the tensor-core ring (forward and stride-1
#: backward-data) is offered: stride 1 and 2 along H, a width not a power of two, a band of
#: rows not dividing the height.
RING_SHAPES = [
    ((2, 64, 19, 40), (64, 4, 3, 3), dict(padding=1, groups=16)),
    ((2, 32, 13, 70), (64, 2, 3, 3), dict(stride=(2, 1), padding=1, groups=16)),
    ((1, 128, 5, 130), (128, 8, 5, 3), dict(padding=(2, 1), groups=16, mode="convolution")),
]

#: A grouped filter 5 wide: backward-filter's one-accumulator-per-tap tiles take 32 lanes.
#: And an ungrouped 64-channel layer, one super-group of those tiles (`auto` runs its weight
#: gradient on them).
TAPS_SHAPES = [
    ((2, 64, 12, 13), (64, 8, 3, 5), dict(padding=(1, 2), groups=8)),
    ((3, 64, 11, 10), (48, 64, 3, 3), dict(padding=1)),
]


def _channels_last(t):
    return t.movedim(1, -1).contiguous().movedim(-1, 1)


MATRIX = [("bf16", layout, s) for s in SHAPES for layout in ("channels_last", "contiguous")]
MATRIX += [(case, "channels_last", s) for case in ("fp16", "fp32") for s in SHAPES[:3]]
MATRIX += [("fp16", "channels_last", s) for s in WIDE_GROUPS]


def _data(case, layout, shape):
    dtype, _ = CASES[case]
    xs, ws, conv = shape
    x = torch.randn(xs, device="cuda", dtype=dtype)
    w = torch.randn(ws, device="cuda", dtype=dtype) / (ws[1] * ws[-1]) ** 0.5
    if layout == "channels_last":
        x, w = _channels_last(x), _channels_last(w)
    return x, w, conv


@pytest.mark.parametrize("case,layout,shape", MATRIX)
def test_every_direction(case, layout, shape):
    _, tol = CASES[case]
    x, w, conv = _data(case, layout, shape)
    y_ref = R.conv_forward(x, w, **conv)
    dy = torch.randn(y_ref.shape, device="cuda", dtype=x.dtype)
    if layout == "channels_last":
        dy = _channels_last(dy)
    args = dict(algo="DIRECT", math="fp32", **conv)
    y = rtdnn.conv_forward(x, w, **args)
    assert R.rel_error(y, y_ref) < tol
    dx = rtdnn.conv_backward_data(dy, w, x.shape, **args)
    assert R.rel_error(dx, R.conv_backward_data(dy, w, x.shape, **conv)) < tol
    dw = rtdnn.conv_backward_filter(x, dy, w.shape, **args)
    assert R.rel_error(dw, R.conv_backward_filter(x, dy, w.shape, **conv)) < tol


def test_alpha_beta_bias_bf16():
    x, w, conv = _data("bf16", "channels_last", SHAPES[0])
    b = torch.randn(w.shape[0], device="cuda", dtype=x.dtype)
    out = _channels_last(torch.randn(4, 96, 23, 21, device="cuda", dtype=x.dtype))
    prior = out.clone()
    y = rtdnn.conv_forward(x, w, b, alpha=0.5, beta=-0.75, out=out, algo="DIRECT", **conv)
    ref = R.conv_forward(x, w, b, alpha=0.5, beta=-0.75, out=prior, **conv)
    assert y is out and R.rel_error(y, ref) < 1e-2


def test_backward_filter_bit_identical():
    x, w, conv = _data("bf16", "channels_last", SHAPES[2])
    dy = _channels_last(torch.randn(2, 192, 14, 14, device="cuda", dtype=x.dtype))
    first = rtdnn.conv_backward_filter(x, dy, w.shape, algo="DIRECT", **conv)
    for _ in range(3):
        again = rtdnn.conv_backward_filter(x, dy, w.shape, algo="DIRECT", **conv)
        assert torch.equal(first, again)


def test_nn_depthwise_conv2d_autograd_bf16():
    torch.manual_seed(0)
    ref = torch.nn.Conv2d(64, 64, 5, padding=2, groups=64).cuda().to(torch.bfloat16)
    mine = rnn.Conv2d(64, 64, 5, padding=2, groups=64).cuda().to(torch.bfloat16)
    mine.load_state_dict(ref.state_dict())
    x = _channels_last(torch.randn(8, 64, 28, 28, device="cuda", dtype=torch.bfloat16))
    for direction in ("forward", "backward_data", "backward_filter"):
        algo = rtdnn.get_conv_algorithm(x, mine.weight, direction=direction, padding=2, groups=64)
        assert algo == "DIRECT", (direction, algo)
    x1 = x.clone().requires_grad_(True)
    x2 = x.clone().requires_grad_(True)
    y1, y2 = ref(x1), mine(x2)
    g = torch.randn_like(y1)
    y1.backward(g)
    y2.backward(g)
    for a, b in ((y2, y1), (x2.grad, x1.grad), (mine.weight.grad, ref.weight.grad),
                 (mine.bias.grad, ref.bias.grad)):  # fmt: skip
        assert R.rel_error(a, b.double().cpu()) < 2e-2


@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_filter"])
@pytest.mark.parametrize(
    "shape", SHAPES[:3] + SHAPES[4:6] + WIDE_GROUPS + RING_SHAPES + TAPS_SHAPES
)
def test_every_tile_candidate(direction, shape):
    """Each tile the tuner may pick (row, FMA and tensor-core kernels) compiles and is right."""
    from rtdnn.algos import ALGORITHMS, ConvTensors
    from rtdnn.algos.direct import _rows_apply
    from rtdnn.ops.conv import _problem_for_selection

    x, w, conv = _data("bf16", "channels_last", shape)
    y_ref = R.conv_forward(x, w, **conv)
    dy = _channels_last(torch.randn(y_ref.shape, device="cuda", dtype=x.dtype))
    args = dict(stride=1, padding=0, dilation=1, groups=1, mode="cross_correlation", math=None)
    p, _ = _problem_for_selection(direction, x, w, **{**args, **conv})
    algo = ALGORITHMS["DIRECT"]
    need = algo.workspace_bytes(p)
    ws = torch.empty(need, dtype=torch.uint8, device="cuda") if need else None
    if direction == "forward":
        ref = y_ref
        out = _channels_last(torch.full(y_ref.shape, float("nan"), device="cuda", dtype=x.dtype))
        tensors = ConvTensors(x, w, out)
    elif direction == "backward_data":
        ref = R.conv_backward_data(dy, w, x.shape, **conv)
        out = _channels_last(torch.full(x.shape, float("nan"), device="cuda", dtype=x.dtype))
        tensors = ConvTensors(out, w, dy)
    else:
        ref = R.conv_backward_filter(x, dy, w.shape, **conv)
        out = _channels_last(torch.full(w.shape, float("nan"), device="cuda", dtype=x.dtype))
        tensors = ConvTensors(x, out, dy)
    candidates = algo.tile_candidates(p)
    kinds = {t.kernel for t in candidates}
    if p.in_channels == p.groups:  # depthwise: the row kernels wherever they apply
        assert "fma" in kinds and ("rows" in kinds) == _rows_apply(p), kinds
    else:
        assert "dot" in kinds, kinds
    if shape in RING_SHAPES and direction == "forward":
        assert "dot_rows" in kinds, kinds
    if p.in_channels != p.groups and direction == "backward_filter":
        assert "dot_taps" in kinds, kinds
    for tiles in candidates:
        out.fill_(float("nan"))
        algo.prepare(p, tiles)(tensors, ws, 1.0, 0.0)
        assert R.rel_error(out, ref) < 1e-2, tiles


#: Filters wider than MAX_ROW_TAPS, where backward-filter's first stage is the flat kernel
#: (direct_filter_partial_kernel) with hundreds of accumulator rows: AlexNet's RGB stem, 4 and
#: 6 channels of 9-wide filters, one channel of 31x31. Compiling its 16-bit tiles of 512 rows x
#: 16 channels in 4 warps aborted the process inside LLVM's SLP vectorizer (Triton 3.6).
WIDE_FILTERS = [
    ((2, 3, 47, 45), (16, 3, 11, 11), dict(stride=4, padding=2)),
    ((2, 4, 20, 21), (16, 4, 9, 9), dict(padding=4)),
    ((2, 6, 19, 23), (16, 6, 7, 9), dict(padding=3)),
    ((1, 1, 40, 48), (16, 1, 31, 31), dict(padding=2)),
]


@pytest.mark.parametrize("case", ["bf16", "fp16"])
@pytest.mark.parametrize("shape", WIDE_FILTERS)
def test_wide_filter_backward_filter_every_tile(case, shape):
    """Every backward-filter tile of a wide filter compiles and is right in 16-bit data."""
    from rtdnn.algos import ALGORITHMS, ConvTensors
    from rtdnn.ops.conv import _problem_for_selection

    _, tol = CASES[case]
    x, w, conv = _data(case, "channels_last", shape)
    args = dict(stride=1, padding=0, dilation=1, groups=1, mode="cross_correlation", math=None)
    p, scratch = _problem_for_selection("backward_filter", x, w, **{**args, **conv})
    # dy and dw in the layouts p describes: a 1-channel x is contiguous as well as channels-last,
    # and p then takes dy as contiguous.
    dy = torch.empty_like(scratch.y).normal_()
    out = torch.empty_like(scratch.w).fill_(float("nan"))
    ref = R.conv_backward_filter(x, dy, w.shape, **conv)
    algo = ALGORITHMS["DIRECT"]
    ws = torch.empty(max(algo.workspace_bytes(p), 1), dtype=torch.uint8, device="cuda")
    candidates = algo.tile_candidates(p)
    assert candidates
    for tiles in candidates:
        out.fill_(float("nan"))
        algo.prepare(p, tiles)(ConvTensors(x, out, dy), ws, 1.0, 0.0)
        assert R.rel_error(out, ref) < tol, tiles
