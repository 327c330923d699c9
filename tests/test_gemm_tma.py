"""The TMA GEMM on plain matrices (kernels/gemm_tma.py) through Triton's interpreter, which runs
tensor-descriptor loads with the copy engine's zero fill outside the matrix: linear layers in
every direction (bias, ReLU, alpha and beta; rows, columns and reductions not a multiple of the
tile; the weight gradient split over programs and summed in a fixed order) and 1x1
channels-last convolutions in every direction, in float16 and bfloat16, against the float64
reference with NaN-poisoned outputs; the pointer path taking over for a misaligned operand;
the GEMM algorithm's product of the column matrix (1x1 strided and 3x3 layers, every
direction); and which operands the path refuses. On a GPU it runs on Hopper and later only;
here TMA_GEMM_IN_INTERPRETER turns it on."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close, make_tensor, poisoned_like

from rtdnn import ops, reference
from rtdnn.algos import implicit_gemm as ig
from rtdnn.algos import tiles
from rtdnn.kernels import launch
from rtdnn.kernels.launch import MatrixLayout

DTYPES = (torch.float16, torch.bfloat16)


def _randn(*shape, dtype):
    return torch.randn(*shape).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_forward(tma_launches, dtype):
    x = _randn(2, 37, 40, dtype=dtype)  # 74 rows: two and a bit 32-row tiles
    w = _randn(24, 40, dtype=dtype)
    bias = _randn(24, dtype=dtype)
    out = poisoned_like(torch.empty(2, 37, 24, dtype=dtype))
    y = ops.linear(x, w, bias, activation="relu", alpha=0.5, out=out)
    ref = torch.relu(0.5 * x.double() @ w.double().t() + bias.double())
    assert_close(y, ref)
    assert tma_launches == [1]


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_backward_data_with_beta(tma_launches, dtype):
    dy = _randn(45, 24, dtype=dtype)
    w = _randn(24, 56, dtype=dtype)
    prior = _randn(45, 56, dtype=dtype)
    dx = ops.linear_backward_data(dy, w, alpha=2.0, beta=-1.5, out=prior.clone())
    assert_close(dx, 2.0 * dy.double() @ w.double() - 1.5 * prior.double())
    assert tma_launches == [1]


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_backward_weight_split_is_deterministic(tma_launches, dtype):
    # The reduction (100 rows) is split over programs; the last of each tile sums in order.
    x = _randn(100, 40, dtype=dtype)
    dy = _randn(100, 24, dtype=dtype)
    first = ops.linear_backward_weight(x, dy, out=poisoned_like(torch.empty(24, 40, dtype=dtype)))
    assert_close(first, dy.double().t() @ x.double())
    again = ops.linear_backward_weight(x, dy)
    assert torch.equal(first, again)
    assert tma_launches == [2, 2]


def test_misaligned_operand_takes_the_pointer_path(tma_launches):
    w = _randn(24, 40, dtype=torch.float16)
    x = _randn(50, 40, dtype=torch.float16)
    y = ops.linear(x, w)  # aligned: the call is prepared with TMA tiles
    shifted = torch.empty(50 * 40 + 1, dtype=torch.float16)[1:].view(50, 40)
    shifted.copy_(_randn(50, 40, dtype=torch.float16))
    y = ops.linear(shifted, w)  # the same signature, a base 2 bytes past 16-byte alignment
    assert_close(y, shifted.double() @ w.double().t())
    assert tma_launches == [1]


@pytest.mark.parametrize(
    "algo, direction",
    [
        ("IMPLICIT_GEMM", "forward"),
        ("IMPLICIT_GEMM", "backward_data"),
        ("IMPLICIT_GEMM", "backward_filter"),
        ("IMPLICIT_GEMM_SPLIT_K", "forward"),  # (it has no backward-data)
        ("IMPLICIT_GEMM_SPLIT_K", "backward_filter"),
    ],
)
def test_pointwise_convolution(tma_launches, algo, direction):
    dtype = torch.bfloat16
    x = make_tensor((2, 24, 5, 7), dtype, "channels_last")
    w = make_tensor((40, 24, 1, 1), dtype, "channels_last")
    bias = _randn(40, dtype=dtype)
    y_ref = torch.nn.functional.conv2d(x.double(), w.double(), bias.double())
    dy = make_tensor(tuple(y_ref.shape), dtype, "channels_last")
    if direction == "forward":
        out = ops.conv_forward(x, w, bias, algo=algo, out=poisoned_like(dy))
        ref = y_ref
    elif direction == "backward_data":
        out = ops.conv_backward_data(dy, w, x.shape, algo=algo, out=poisoned_like(x))
        ref = torch.nn.grad.conv2d_input(x.shape, w.double(), dy.double())
    else:
        out = ops.conv_backward_filter(x, dy, w.shape, algo=algo, out=poisoned_like(w))
        ref = torch.nn.grad.conv2d_weight(x.double(), w.shape, dy.double())
    assert_close(out, ref)
    split = algo == "IMPLICIT_GEMM_SPLIT_K" and direction == "backward_filter"
    assert tma_launches == [2 if split else 1]


def test_refused_operands(monkeypatch):
    monkeypatch.setattr(tiles, "TMA_GEMM_IN_INTERPRETER", True)
    plain = MatrixLayout(64, 64, 64, False)
    assert tiles.tma_gemm_usable("cpu", torch.bfloat16, plain, plain)
    # float32: TF32 products of a transposed operand need tiles the copy engine does not give.
    assert not tiles.tma_gemm_usable("cpu", torch.float32, plain, plain)
    # Rows 2 elements apart in bytes that are not a multiple of 16 (70 bf16 = 140 bytes).
    assert not tiles.tma_gemm_usable("cpu", torch.bfloat16, MatrixLayout(64, 70, 70, False), plain)
    # No unit stride at all, or one row: the pointer path.
    assert MatrixLayout.of(64, 64, 128, 2) is None
    assert MatrixLayout.of(1, 64, 64, 1) is None
    assert MatrixLayout.of(64, 32, 1, 64) == MatrixLayout(64, 32, 64, True)
    monkeypatch.setenv("RTDNN_TMA_GEMM", "0")  # the user's switch
    assert not tiles.tma_gemm_usable("cpu", torch.bfloat16, plain, plain)
    monkeypatch.delenv("RTDNN_TMA_GEMM")
    monkeypatch.setattr(tiles, "TMA_GEMM_IN_INTERPRETER", False)
    assert not tiles.tma_gemm_usable("cpu", torch.bfloat16, plain, plain)


def test_pointwise_layouts_refuse_grouped_and_strided_convolutions(monkeypatch):
    from rtdnn.ops.conv import _problem_for_selection

    monkeypatch.setattr(tiles, "TMA_GEMM_IN_INTERPRETER", True)
    x = make_tensor((2, 16, 4, 4), torch.float16, "channels_last")
    w = make_tensor((16, 16, 1, 1), torch.float16, "channels_last")
    p, _ = _problem_for_selection("forward", x, w, math=None, stride=1, padding=0, dilation=1,
                                  groups=1, mode="cross_correlation")  # fmt: skip
    assert ig.pointwise_layouts(p) is not None
    w_grouped = make_tensor((16, 8, 1, 1), torch.float16, "channels_last")
    p, _ = _problem_for_selection("forward", x, w_grouped, math=None, stride=1, padding=0,
                                  dilation=1, groups=2, mode="cross_correlation")  # fmt: skip
    assert ig.pointwise_layouts(p) is None
    p, _ = _problem_for_selection("forward", x, w, math=None, stride=2, padding=0, dilation=1,
                                  groups=1, mode="cross_correlation")  # fmt: skip
    assert ig.pointwise_layouts(p) is None
    nchw = make_tensor((2, 16, 4, 4), torch.float16, "contiguous")
    p, _ = _problem_for_selection("forward", nchw, w, math=None, stride=1, padding=0,
                                  dilation=1, groups=1, mode="cross_correlation")  # fmt: skip
    assert ig.pointwise_layouts(p) is None


@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_filter"])
@pytest.mark.parametrize(
    "kernel, stride, padding, mode",
    [
        (1, 2, 0, "cross_correlation"),  # a ResNet projection: col is every other pixel
        (3, 1, 1, "cross_correlation"),  # backward-filter: one GEMM over all 9 taps
        (1, 1, 0, "convolution"),  # a 1x1 filter flips to itself
    ],
)
def test_gemm_algorithm(tma_launches, direction, kernel, stride, padding, mode):
    gen = torch.Generator().manual_seed(2)
    dtype = torch.bfloat16
    conv = dict(stride=stride, padding=padding, mode=mode)
    x = make_tensor((2, 16, 7, 6), dtype, "channels_last", gen)
    w = make_tensor((24, 16, kernel, kernel), dtype, "channels_last", gen)
    bias = torch.randn(24, generator=gen).to(dtype)
    y_ref = reference.conv_forward(x, w, bias, **conv)
    dy = make_tensor(tuple(y_ref.shape), dtype, "channels_last", gen)
    if direction == "forward":
        out = ops.conv_forward(x, w, bias, algo="GEMM", out=poisoned_like(dy), **conv)
        ref = y_ref
    elif direction == "backward_data":
        out = ops.conv_backward_data(dy, w, x.shape, algo="GEMM", out=poisoned_like(x), **conv)
        ref = reference.conv_backward_data(dy, w, x.shape, **conv)
    else:
        out = ops.conv_backward_filter(x, dy, w.shape, algo="GEMM", out=poisoned_like(w), **conv)
        ref = reference.conv_backward_filter(x, dy, w.shape, **conv)
    assert_close(out, ref)
    assert len(tma_launches) == 1  # (split or not, as the workspace allows)


def test_gemm_algorithm_refuses_flipped_taps_and_nchw_filters(tma_launches):
    gen = torch.Generator().manual_seed(3)
    dtype = torch.bfloat16
    x = make_tensor((2, 16, 5, 5), dtype, "channels_last", gen)
    for w, mode in (
        (make_tensor((24, 16, 3, 3), dtype, "channels_last", gen), "convolution"),
        (make_tensor((24, 16, 3, 3), dtype, "contiguous", gen), "cross_correlation"),
    ):
        y = ops.conv_forward(x, w, padding=1, mode=mode, algo="GEMM")
        assert_close(y, reference.conv_forward(x, w, padding=1, mode=mode))
    assert tma_launches == []


def test_gemm_algorithm_with_a_misaligned_workspace_takes_the_pointer_path(tma_launches):
    from rtdnn.algos import ALGORITHMS, ConvTensors
    from rtdnn.ops.conv import _problem_for_selection

    gen = torch.Generator().manual_seed(4)
    x = make_tensor((2, 16, 6, 6), torch.float16, "channels_last", gen)
    w = make_tensor((24, 16, 1, 1), torch.float16, "channels_last", gen)
    conv = dict(stride=2, padding=0, dilation=1, groups=1, mode="cross_correlation")
    p, _ = _problem_for_selection("forward", x, w, math=None, **conv)
    algo = ALGORITHMS["GEMM"]
    tiles = algo.tile_candidates(p)[0]
    assert isinstance(tiles, launch.TmaGemmTiles)
    y = poisoned_like(make_tensor((2, 24, 3, 3), torch.float16, "channels_last", gen))
    workspace = torch.empty(algo.workspace_bytes(p) + 16, dtype=torch.uint8)[2:]
    algo.prepare(p, tiles)(ConvTensors(x, w, y, None), workspace, 1.0, 0.0)
    assert_close(y, reference.conv_forward(x, w, stride=2))
    assert tma_launches == []
