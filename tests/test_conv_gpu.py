"""Convolution on the GPU: every algorithm and direction in bfloat16, float16 and float32 (TF32
and strict) on moderately sized inputs, against the float64 reference; autograd through
rtdnn.nn.Conv2d in bfloat16. Run with RTDNN_GPU_TESTS=1 on a machine with a CUDA GPU.
"""

import dataclasses
import math

import pytest
import torch
from conftest import gpu_only

import rtdnn
import rtdnn.algos
import rtdnn.nn as rnn
from rtdnn import reference as R

pytestmark = gpu_only()

#: (dtype, math mode) -> relative error allowed against float64.
CASES = {
    "bf16": (torch.bfloat16, None, 1e-2),
    "fp16": (torch.float16, None, 2e-3),
    "tf32": (torch.float32, "tf32", 2e-3),
    "fp32": (torch.float32, "fp32", 1e-5),
}
SHAPES = [
    # x shape, w shape, conv parameters
    ((4, 64, 17, 15), (96, 64, 3, 3), dict(padding=1)),
    ((3, 32, 20, 20), (64, 32, 3, 3), dict(stride=2, padding=1)),
    ((2, 3, 33, 31), (32, 3, 7, 7), dict(stride=2, padding=3)),
    ((4, 128, 9, 9), (256, 128, 1, 1), dict()),
    ((2, 64, 11, 12), (64, 64, 1, 1), dict(stride=2)),
    ((2, 48, 6, 7, 5), (24, 12, 3, 3, 3), dict(padding=1, groups=4)),
    ((3, 40, 50), (40, 1, 5), dict(padding=4, dilation=2, groups=40)),
    ((2, 32, 13, 13), (32, 32, 3, 3), dict(padding=2, dilation=2, mode="convolution")),
]


def _channels_last(t):
    return t.movedim(1, -1).contiguous().movedim(-1, 1)


# bf16 (the interpreter cannot check it) on every shape; the other modes on a few.
MATRIX = [("bf16", layout, shape) for shape in SHAPES for layout in ("channels_last", "contiguous")]
MATRIX += [
    (case, "channels_last", shape) for case in ("fp16", "tf32", "fp32") for shape in SHAPES[:3]
]


@pytest.mark.parametrize("case,layout,shape", MATRIX)
def test_all_directions_and_algorithms(case, layout, shape):
    dtype, math_mode, tol = CASES[case]
    xs, ws, conv = shape
    x = torch.randn(xs, device="cuda", dtype=dtype)
    w = torch.randn(ws, device="cuda", dtype=dtype) / ws[1] ** 0.5
    if layout == "channels_last":
        x, w = _channels_last(x), _channels_last(w)
    y_ref = R.conv_forward(x, w, **conv)
    dy = torch.randn(y_ref.shape, device="cuda", dtype=dtype)
    for algo in rtdnn.algos.ALGORITHMS:
        for direction in ("forward", "backward_data", "backward_filter"):
            try:
                if direction == "forward":
                    out = rtdnn.conv_forward(x, w, algo=algo, math=math_mode, **conv)
                    ref = y_ref
                elif direction == "backward_data":
                    out = rtdnn.conv_backward_data(
                        dy, w, x.shape, algo=algo, math=math_mode, **conv
                    )
                    ref = R.conv_backward_data(dy, w, x.shape, **conv)
                else:
                    out = rtdnn.conv_backward_filter(
                        x, dy, w.shape, algo=algo, math=math_mode, **conv
                    )
                    ref = R.conv_backward_filter(x, dy, w.shape, **conv)
            except rtdnn.NotSupportedError:
                strided = conv.get("stride", 1) != 1 or conv.get("dilation", 1) != 1
                fft_strided = algo in ("FFT", "FFT_TILING") and strided
                not_winograd = ws[2:] != (3, 3) or strided
                winograd = algo == "WINOGRAD_NONFUSED" and not_winograd
                winograd |= algo == "WINOGRAD" and (not_winograd or direction == "backward_filter")
                assert fft_strided or winograd or (algo == "DIRECT" and ws[1] > 8)
                continue
            err = R.rel_error(out, ref)
            assert err < tol, f"{algo} {direction}: rel. error {err:.2e}"


def test_beta_after_beta_zero_every_algorithm():
    """beta = 0 and beta != 0 compile different kernels: calls alternating between them on one
    problem each get their own (a launch reused across them would drop beta * out)."""
    xs, ws, conv = SHAPES[0]
    x = torch.randn(xs, device="cuda")
    w = torch.randn(ws, device="cuda") / ws[1] ** 0.5
    dy = torch.randn(R.conv_forward(x, w, **conv).shape, device="cuda")
    for algo in rtdnn.algos.ALGORITHMS:
        for direction in ("forward", "backward_data", "backward_filter"):
            shape = {"forward": dy.shape, "backward_data": xs, "backward_filter": ws}[direction]
            for alpha, beta in [(1.0, 0.0), (0.75, 0.5), (1.0, 0.0), (0.75, 0.5)]:
                prior = torch.randn(shape, device="cuda")
                args = dict(conv, algo=algo, math="fp32", alpha=alpha, beta=beta)
                ref_args = dict(conv, alpha=alpha, beta=beta, out=prior)
                try:
                    if direction == "forward":
                        out = rtdnn.conv_forward(x, w, out=prior.clone(), **args)
                        ref = R.conv_forward(x, w, **ref_args)
                    elif direction == "backward_data":
                        out = rtdnn.conv_backward_data(dy, w, xs, out=prior.clone(), **args)
                        ref = R.conv_backward_data(dy, w, xs, **ref_args)
                    else:
                        out = rtdnn.conv_backward_filter(x, dy, ws, out=prior.clone(), **args)
                        ref = R.conv_backward_filter(x, dy, ws, **ref_args)
                except rtdnn.NotSupportedError:
                    break
                err = R.rel_error(out, ref)
                assert err < 1e-5, f"{algo} {direction} beta={beta}: rel. error {err:.2e}"


def test_nn_conv2d_autograd_bf16():
    torch.manual_seed(0)
    ref = torch.nn.Conv2d(64, 128, 3, padding=1, bias=True).cuda().to(torch.bfloat16)
    mine = rnn.Conv2d(64, 128, 3, padding=1, bias=True).cuda().to(torch.bfloat16)
    mine.load_state_dict(ref.state_dict())
    x = _channels_last(torch.randn(8, 64, 28, 28, device="cuda", dtype=torch.bfloat16))
    x1 = x.clone().requires_grad_(True)
    x2 = x.clone().requires_grad_(True)
    y1, y2 = ref(x1), mine(x2)
    g = torch.randn_like(y1)
    y1.backward(g)
    y2.backward(g)
    assert y2.is_contiguous(memory_format=torch.channels_last)
    for a, b in ((y2, y1), (x2.grad, x1.grad), (mine.weight.grad, ref.weight.grad),
                 (mine.bias.grad, ref.bias.grad)):  # fmt: skip
        assert R.rel_error(a, b.double().cpu()) < 2e-2


@pytest.mark.parametrize("where", ["side_stream", "cuda_graph"])
def test_strided_backward_data_phases_overlap_safely(where):
    """Backward-data at stride 2 runs its four stride phases on side streams at once
    (core.run_concurrently): on a caller's own stream and inside a captured CUDA graph,
    replayed on new dy, every pixel is written (the output is poisoned first) and right."""
    xs, ws, conv = (8, 128, 14, 14), (128, 128, 3, 3), dict(stride=2, padding=1)
    w = _channels_last(torch.randn(ws, device="cuda", dtype=torch.bfloat16) / 34)
    dy = _channels_last(torch.randn(8, 128, 7, 7, device="cuda", dtype=torch.bfloat16))
    out = _channels_last(torch.full(xs, float("nan"), device="cuda", dtype=torch.bfloat16))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())

    def call():
        rtdnn.conv_backward_data(dy, w, xs, out=out, algo="IMPLICIT_GEMM", **conv)

    with torch.cuda.stream(stream):
        call()
        if where == "cuda_graph":
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                call()
            dy.copy_(torch.randn_like(dy))
            out.fill_(float("nan"))
            graph.replay()
    torch.cuda.current_stream().wait_stream(stream)
    ref = R.conv_backward_data(dy, w, xs, **conv)
    assert R.rel_error(out, ref) < 1e-2


#: Few-channel (packed) forward shapes: RGB stems (7x7/2, 3x3, 11x11/4), rows longer than one
#: chunk (15 channels of 5-wide filters), dilation, flipped filters, 1-D.
FEW_CHANNELS = [
    ((2, 3, 33, 31), (32, 3, 7, 7), dict(stride=2, padding=3)),
    ((2, 3, 20, 18), (64, 3, 3, 3), dict(padding=1)),
    ((2, 3, 47, 45), (96, 3, 11, 11), dict(stride=4, padding=2)),
    ((2, 15, 9, 13), (40, 15, 3, 5), dict(padding=1)),
    ((2, 5, 12, 14), (24, 5, 5, 3), dict(padding=(2, 4), dilation=(1, 3), mode="convolution")),
    ((3, 4, 50), (16, 4, 9), dict(stride=2, padding=4)),
]


def _check_every_tile(algo, p, candidates, tensors, prior, ref, ref_beta, tol, workspace=None):
    """Each tile's launch of `algo` on `p`: alpha 0.5 into a NaN-poisoned output matches
    `ref`, a second run is bit-identical, and alpha 0.5, beta -1.5 into a copy of `prior`
    matches `ref_beta`. tensors(out): the launch's ConvTensors, writing `out`."""
    for tiles in candidates:
        launch = algo.prepare(p, tiles)
        out = torch.full_like(prior, float("nan"))
        launch(tensors(out), workspace, 0.5, 0.0)
        assert R.rel_error(out, ref) < tol, f"{tiles}: rel. error {R.rel_error(out, ref):.2e}"
        again = torch.full_like(out, float("nan"))
        launch(tensors(again), workspace, 0.5, 0.0)
        assert torch.equal(again, out), f"{tiles}: not deterministic"
        out = prior.clone()
        launch(tensors(out), workspace, 0.5, -1.5)
        err = R.rel_error(out, ref_beta)
        assert err < tol, f"{tiles} with beta: rel. error {err:.2e}"


@pytest.mark.parametrize("case", ["bf16", "fp16", "tf32", "fp32"])
@pytest.mark.parametrize("shape", FEW_CHANNELS)
@pytest.mark.parametrize("direction", ["forward", "backward_filter"])
def test_few_channel_every_tile(direction, case, shape):
    """Every tile of IMPLICIT_GEMM (forward, with a bias) and IMPLICIT_GEMM_SPLIT_K
    (backward-filter) on a few-channel layer, the filter-row tiles among them, compiles and
    matches float64."""
    from rtdnn.algos import ALGORITHMS, ConvTensors
    from rtdnn.ops.conv import _problem_for_selection

    dtype, math_mode, tol = CASES[case]
    xs, ws, conv = shape
    x = _channels_last(torch.randn(xs, device="cuda", dtype=dtype))
    w = _channels_last(torch.randn(ws, device="cuda", dtype=dtype) / (ws[1] * ws[-1]) ** 0.5)
    bias = torch.randn(ws[0], device="cuda", dtype=dtype)
    args = dict(stride=1, padding=0, dilation=1, groups=1, mode="cross_correlation")
    p, _ = _problem_for_selection(direction, x, w, math=math_mode, **{**args, **conv})
    if direction == "forward":
        p = dataclasses.replace(p, has_bias=True)
        ref = R.conv_forward(x, w, bias, **conv)
        out = _channels_last(torch.full(ref.shape, float("nan"), device="cuda", dtype=dtype))
        tensors = ConvTensors(x, w, out, bias)
        algo = ALGORITHMS["IMPLICIT_GEMM"]
    else:
        dy = _channels_last(torch.randn(R.conv_forward(x, w, **conv).shape, device="cuda"))
        dy = dy.to(dtype)
        ref = R.conv_backward_filter(x, dy, w.shape, **conv)
        out = _channels_last(torch.full(w.shape, float("nan"), device="cuda", dtype=dtype))
        tensors = ConvTensors(x, out, dy)
        algo = ALGORITHMS["IMPLICIT_GEMM_SPLIT_K"]
    ws_bytes = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8, device="cuda")
    candidates = algo.tile_candidates(p)
    assert any(getattr(t, "filter_rows", False) for t in candidates), candidates
    for tiles in candidates:
        out.fill_(float("nan"))
        algo.prepare(p, tiles)(tensors, ws_bytes, 1.0, 0.0)
        err = R.rel_error(out, ref)
        assert err < tol, f"{tiles}: rel. error {err:.2e}"


#: Skinny backward-data problems (few output tiles, reductions of 2,048 and more, which the
#: GPU splits) that split-K serves: stride 1 and stride 2 (four phases, each split into its
#: own part of the workspace).
SKINNY_BACKWARD_DATA = [
    ((4, 96, 7, 7), (256, 96, 3, 3), dict(padding=1)),
    ((2, 64, 14, 13), (256, 64, 3, 3), dict(stride=2, padding=1)),
    ((3, 72, 9, 9), (2048, 72, 1, 1), dict()),
    # 26 tiles x up to 18 splits overfill the device: split in whole waves (5 on an H200).
    ((8, 256, 14, 14), (2048, 256, 3, 3), dict(padding=1)),
]


@pytest.mark.parametrize("case", ["bf16", "tf32", "fp32"])
@pytest.mark.parametrize("shape", SKINNY_BACKWARD_DATA)
def test_split_k_backward_data_every_tile(case, shape):
    """Every tile of IMPLICIT_GEMM_SPLIT_K in backward-data, with alpha and beta into a
    NaN-poisoned and then a prior output, matches float64; two runs are bit-identical."""
    from rtdnn.algos import ALGORITHMS, ConvTensors
    from rtdnn.ops.conv import _problem_for_selection

    dtype, math_mode, tol = CASES[case]
    xs, ws, conv = shape
    x = _channels_last(torch.randn(xs, device="cuda", dtype=dtype))
    w = _channels_last(torch.randn(ws, device="cuda", dtype=dtype) / (ws[1] * 9) ** 0.5)
    dy = _channels_last(torch.randn(R.conv_forward(x, w, **conv).shape, device="cuda"))
    dy = dy.to(dtype)
    args = dict(stride=1, padding=0, dilation=1, groups=1, mode="cross_correlation")
    p, _ = _problem_for_selection("backward_data", x, w, math=math_mode, **{**args, **conv})
    algo = ALGORITHMS["IMPLICIT_GEMM_SPLIT_K"]
    assert algo.splits(p) > 1
    workspace = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8, device="cuda")
    prior = _channels_last(torch.randn(xs, device="cuda", dtype=dtype))
    ref = R.conv_backward_data(dy, w, xs, alpha=0.5, **conv)
    ref_beta = R.conv_backward_data(dy, w, xs, alpha=0.5, beta=-1.5, out=prior.clone(), **conv)
    _check_every_tile(algo, p, algo.tile_candidates(p), lambda out: ConvTensors(out, w, dy),
                      prior, ref, ref_beta, tol, workspace)  # fmt: skip


#: Shapes for the warp-specialized Hopper kernel (x shape, w shape, conv parameters): images
#: not a multiple of the box (17x15, 9x9, 30x70: two boxes a row), a 1-pixel image, padding
#: above the filter's reach, dilation, 5x5, batch 1, written channels not a multiple of the
#: tile (96, 200, 192). Backward-data reduces over K, which must be a multiple of 64:
#: HOPPER_FORWARD_ONLY runs forward only.
HOPPER_FORWARD_ONLY = [
    ((4, 64, 17, 15), (96, 64, 3, 3), dict(padding=1)),
    ((2, 64, 10, 11), (200, 64, 3, 3), dict(padding=3)),
]
HOPPER_SHAPES = [
    # Stride 2: odd and even sizes, 1x1 downsampling (backward-data: phases no tap reaches),
    # 7x7, one dimension only, dilation.
    ((2, 64, 15, 16), (128, 64, 3, 3), dict(stride=2, padding=1)),
    ((3, 128, 14, 13), (256, 128, 1, 1), dict(stride=2)),
    ((2, 64, 19, 20), (64, 64, 7, 7), dict(stride=2, padding=3)),
    ((2, 64, 9, 9), (64, 64, 3, 3), dict(stride=(2, 1), padding=1)),
    ((1, 64, 2, 3), (64, 64, 3, 3), dict(stride=2, padding=2, dilation=2)),
    ((1, 128, 9, 9), (128, 128, 3, 3), dict(padding=1)),
    ((3, 64, 1, 1), (64, 64, 3, 3), dict(padding=1)),
    ((2, 128, 30, 70), (64, 128, 3, 3), dict(padding=2, dilation=2)),
    ((5, 64, 7, 7), (128, 64, 5, 5), dict(padding=2)),
    ((2, 64, 12, 12), (64, 64, 3, 3), dict()),
    ((2, 192, 8, 8), (128, 192, 3, 3), dict(padding=1)),
    # Reduced channels not a multiple of 128 bytes in 16-bit data (96, 160: steps of 64-byte
    # rows).
    ((2, 96, 11, 13), (160, 96, 3, 3), dict(padding=1)),
    ((2, 160, 15, 16), (96, 160, 3, 3), dict(stride=2, padding=1)),
    # More tiles than programs: several a program (ping-pong's turns; at stride 2, the
    # phases' shares of the multiprocessors).
    ((16, 64, 40, 40), (128, 64, 3, 3), dict(padding=1)),
    ((16, 64, 48, 48), (128, 64, 3, 3), dict(stride=2, padding=1)),
]
#: 3-D at stride 1 (forward and backward-data): depth taps, odd sizes, padding above the
#: filter's reach, dilation in depth, 96 reduced channels (64-byte steps), a 1-deep image.
HOPPER_3D_SHAPES = [
    ((2, 64, 5, 9, 10), (128, 64, 3, 3, 3), dict(padding=1)),
    ((1, 96, 6, 7, 11), (64, 96, 3, 3, 3), dict(padding=(2, 1, 0), dilation=(2, 1, 1))),
    ((3, 64, 1, 6, 6), (64, 64, 3, 3, 3), dict(padding=1)),
    ((2, 128, 4, 8, 8), (192, 128, 1, 3, 3), dict(padding=(0, 1, 1))),
]
HOPPER_MATRIX = [("forward", s) for s in HOPPER_FORWARD_ONLY + HOPPER_SHAPES + HOPPER_3D_SHAPES]
HOPPER_MATRIX += [("backward_data", s) for s in HOPPER_SHAPES + HOPPER_3D_SHAPES]


# Forward copies an NCHW filter only where it has more than one tap: a 1x1 filter stored NCHW
# already holds its channels innermost, and IMPLICIT_GEMM runs it as given.
TF32_COPY_MATRIX = [("backward_data", s) for s in HOPPER_SHAPES + HOPPER_3D_SHAPES]
TF32_COPY_MATRIX += [
    ("forward", s) for s in HOPPER_SHAPES + HOPPER_3D_SHAPES if math.prod(s[1][2:]) > 1
]


@pytest.mark.parametrize("direction,shape", TF32_COPY_MATRIX)
def test_hopper_tf32_filter_copy(direction, shape):
    """TF32 on Hopper through IMPLICIT_PRECOMP_GEMM's filter copy: backward-data on the copy
    with k innermost (of a channels-last filter), forward on a channels-last copy of an NCHW
    filter; its Hopper tiles (first), alpha and beta into a NaN-poisoned and then a prior
    output, match float64; two runs are bit-identical."""
    from rtdnn.algos import ALGORITHMS, ConvTensors
    from rtdnn.algos.implicit_gemm import HopperConvTiles
    from rtdnn.ops.conv import _problem_for_selection

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Hopper kernel runs on sm_90 only")
    dtype, math_mode, tol = CASES["tf32"]
    xs, ws, conv = shape
    x = _channels_last(torch.randn(xs, device="cuda", dtype=dtype))
    forward = direction == "forward"
    w = torch.randn(ws, device="cuda", dtype=dtype) / (ws[1] * 9) ** 0.5
    w = w if forward else _channels_last(w)  # forward: an NCHW filter, copied channels-last
    y_shape = R.conv_forward(x, w, **conv).shape
    dy = _channels_last(torch.randn(y_shape, device="cuda", dtype=dtype))
    args = dict(stride=1, padding=0, dilation=1, groups=1, mode="cross_correlation")
    p, _ = _problem_for_selection(direction, x, w, math=math_mode, **{**args, **conv})
    algo = ALGORITHMS["IMPLICIT_PRECOMP_GEMM"]
    candidates = [t for t in algo.tile_candidates(p) if isinstance(t, HopperConvTiles)]
    assert candidates and isinstance(algo.tile_candidates(p)[0], HopperConvTiles)
    workspace = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8, device="cuda")
    prior = _channels_last(torch.randn(y_shape if forward else xs, device="cuda", dtype=dtype))
    if forward:
        ref = R.conv_forward(x, w, alpha=0.5, **conv)
        ref_beta = R.conv_forward(x, w, alpha=0.5, beta=-1.5, out=prior.clone(), **conv)
    else:
        ref = R.conv_backward_data(dy, w, xs, alpha=0.5, **conv)
        ref_beta = R.conv_backward_data(dy, w, xs, alpha=0.5, beta=-1.5, out=prior.clone(),
                                        **conv)  # fmt: skip

    def tensors(out: torch.Tensor) -> ConvTensors:
        return ConvTensors(x, w, out) if forward else ConvTensors(out, w, dy)

    _check_every_tile(algo, p, candidates, tensors, prior, ref, ref_beta, tol, workspace)


#: Shapes for the Hopper weight gradient (at least 64 filters and channels): odd images,
#: filters and channels not a multiple of the 128 x 128 or 128 x 256 unit (136, 192, 200,
#: 320; the cooperative unit runs where there are 256 channels or more), padding above the
#: filter's reach, stride 2 (3x3, 7x7, one dimension, with dilation), a 1-pixel image,
#: batch 1, enough pixels that IMPLICIT_GEMM_SPLIT_K splits (ten and eleven), 64-wide units.
HOPPER_FILTER_SHAPES = [
    ((4, 128, 17, 15), (128, 128, 3, 3), dict(padding=1)),
    ((2, 192, 10, 11), (136, 192, 3, 3), dict(padding=3)),
    ((2, 128, 15, 16), (256, 128, 3, 3), dict(stride=2, padding=1)),
    ((3, 256, 14, 13), (128, 256, 3, 3), dict(stride=2, padding=1)),
    ((2, 128, 19, 20), (128, 128, 7, 7), dict(stride=2, padding=3)),
    ((2, 128, 9, 9), (128, 128, 3, 3), dict(stride=(2, 1), padding=1)),
    ((1, 128, 2, 3), (128, 128, 3, 3), dict(stride=2, padding=2, dilation=2)),
    ((3, 128, 1, 1), (128, 128, 3, 3), dict(padding=1)),
    ((2, 128, 30, 70), (128, 128, 3, 3), dict(padding=2, dilation=2)),
    ((8, 128, 32, 32), (128, 128, 3, 3), dict(padding=1)),
    ((16, 256, 14, 14), (256, 256, 3, 3), dict(padding=1)),
    # Cooperative units (256 channels or more): a second channel tile and a filter half
    # partly out of range (200 filters); a filter half wholly out of range (136).
    ((2, 320, 9, 10), (200, 320, 3, 3), dict(padding=1)),
    ((2, 256, 6, 5), (136, 256, 3, 3), dict(padding=1)),
    # Units 64 filters or channels wide: 64 x 64, and 128 filters x 64 channels.
    ((2, 64, 12, 11), (64, 64, 3, 3), dict(padding=1)),
    ((2, 64, 20, 18), (128, 64, 3, 3), dict(padding=1)),
]


#: Float32 (TF32) also runs 1x1 weight gradients.
HOPPER_FILTER_TF32_SHAPES = [
    ((3, 96, 9, 8), (200, 96, 1, 1), dict()),
    ((2, 128, 15, 13), (72, 128, 1, 1), dict(stride=2)),
    ((2, 64, 30, 31), (256, 64, 1, 1), dict()),
]
#: 16-bit 1x1 weight gradients whose outputs are 14 to 28 pixels a side (hopper_unsupported):
#: filters not a multiple of the unit, stride 2, 256 channels (cooperative units).
HOPPER_FILTER_1X1_SHAPES = [
    ((3, 96, 14, 15), (200, 96, 1, 1), dict()),
    ((2, 128, 29, 28), (64, 128, 1, 1), dict(stride=2)),
    ((2, 256, 16, 20), (128, 256, 1, 1), dict()),
]
HOPPER_FILTER_CASES = [(s, case) for s in HOPPER_FILTER_SHAPES for case in ("bf16", "fp16", "tf32")]
HOPPER_FILTER_CASES += [(s, "tf32") for s in HOPPER_FILTER_TF32_SHAPES]
HOPPER_FILTER_CASES += [(s, case) for s in HOPPER_FILTER_1X1_SHAPES for case in ("bf16", "fp16")]


@pytest.mark.parametrize("algo_name", ["IMPLICIT_GEMM", "IMPLICIT_GEMM_SPLIT_K"])
@pytest.mark.parametrize("shape,case", HOPPER_FILTER_CASES)
def test_hopper_filter_kernel(shape, algo_name, case):
    """The warp-specialized Hopper weight gradient (both implicit GEMMs' only tiles on sm_90
    where it applies; split within IMPLICIT_GEMM_SPLIT_K's workspace; float32 in TF32 math,
    x's boxes transposed by the kernel), alpha and beta into a NaN-poisoned and then a prior
    filter, matches float64; two runs are bit-identical."""
    from rtdnn.algos import ALGORITHMS, ConvTensors
    from rtdnn.algos.implicit_gemm import HopperConvTiles, hopper_unsupported
    from rtdnn.ops.conv import _problem_for_selection

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Hopper kernel runs on sm_90 only")
    dtype, math_mode, tol = CASES[case]
    xs, ws, conv = shape
    x = _channels_last(torch.randn(xs, device="cuda", dtype=dtype))
    dy_shape = R.conv_forward(x, torch.empty(ws, device="cuda", dtype=dtype), **conv).shape
    dy = _channels_last(torch.randn(dy_shape, device="cuda", dtype=dtype))
    args = dict(stride=1, padding=0, dilation=1, groups=1, mode="cross_correlation")
    w_like = _channels_last(torch.empty(ws, device="cuda", dtype=dtype))
    p, _ = _problem_for_selection("backward_filter", x, w_like, math=math_mode, **{**args, **conv})
    assert hopper_unsupported(p) is None, hopper_unsupported(p)
    algo = ALGORITHMS[algo_name]
    candidates = algo.tile_candidates(p)
    assert candidates and all(isinstance(t, HopperConvTiles) for t in candidates)
    workspace = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8, device="cuda")
    prior = _channels_last(torch.randn(ws, device="cuda", dtype=dtype))
    ref = R.conv_backward_filter(x, dy, ws, alpha=0.5, **conv)
    ref_beta = R.conv_backward_filter(x, dy, ws, alpha=0.5, beta=-1.5, out=prior.clone(), **conv)
    _check_every_tile(algo, p, candidates, lambda out: ConvTensors(x, out, dy), prior, ref,
                      ref_beta, tol, workspace)  # fmt: skip


#: float32 runs the kernel in forward here; in backward-data it reads IMPLICIT_PRECOMP_GEMM's
#: filter copy with k innermost (test_hopper_tf32_filter_copy).
HOPPER_CASES = [(d, s, case) for d, s in HOPPER_MATRIX for case in ("bf16", "fp16")]
HOPPER_CASES += [(d, s, "tf32") for d, s in HOPPER_MATRIX if d == "forward"]
#: 48 float32 channels: steps of 64-byte rows (16 channels) in TF32.
HOPPER_CASES += [("forward", ((2, 48, 10, 9), (64, 48, 3, 3), dict(padding=1)), "tf32")]


@pytest.mark.parametrize("direction,shape,case", HOPPER_CASES)
def test_hopper_kernel(direction, shape, case):
    """Every tile of the warp-specialized Hopper kernel (IMPLICIT_GEMM's tiles on sm_90; in
    float32, TF32 forward), alpha and beta into a NaN-poisoned and then a prior output,
    forward with bias and relu, matches float64; two runs are bit-identical."""
    from rtdnn.algos import ALGORITHMS, ConvTensors
    from rtdnn.algos.implicit_gemm import HopperConvTiles, hopper_unsupported
    from rtdnn.ops.conv import _problem_for_selection

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Hopper kernel runs on sm_90 only")
    dtype, math_mode, tol = CASES[case]
    xs, ws, conv = shape
    x = _channels_last(torch.randn(xs, device="cuda", dtype=dtype))
    w = _channels_last(torch.randn(ws, device="cuda", dtype=dtype) / (ws[1] * 9) ** 0.5)
    y_shape = R.conv_forward(x, w, **conv).shape
    dy = _channels_last(torch.randn(y_shape, device="cuda", dtype=dtype))
    bias = torch.randn(ws[0], device="cuda", dtype=dtype)
    args = dict(stride=1, padding=0, dilation=1, groups=1, mode="cross_correlation")
    p, _ = _problem_for_selection(direction, x, w, math=math_mode, **{**args, **conv})
    forward = direction == "forward"
    if forward:
        p = dataclasses.replace(p, has_bias=True, activation="relu")
    assert hopper_unsupported(p) is None, hopper_unsupported(p)
    algo = ALGORITHMS["IMPLICIT_GEMM"]
    # The Hopper tiles (on 64-byte steps, the pointer tiles come too: tested elsewhere).
    candidates = [t for t in algo.tile_candidates(p) if isinstance(t, HopperConvTiles)]
    assert candidates
    out_shape = y_shape if forward else xs
    prior = _channels_last(torch.randn(out_shape, device="cuda", dtype=dtype))
    if forward:
        ref = R.conv_forward(x, w, bias, alpha=0.5, activation="relu", **conv)
        ref_beta = R.conv_forward(x, w, bias, alpha=0.5, beta=-1.5, out=prior.clone(),
                                  activation="relu", **conv)  # fmt: skip
    else:
        ref = R.conv_backward_data(dy, w, xs, alpha=0.5, **conv)
        ref_beta = R.conv_backward_data(dy, w, xs, alpha=0.5, beta=-1.5, out=prior.clone(),
                                        **conv)  # fmt: skip

    def tensors(out):
        return ConvTensors(x, w, out, bias) if forward else ConvTensors(out, w, dy)

    _check_every_tile(algo, p, candidates, tensors, prior, ref, ref_beta, tol)
