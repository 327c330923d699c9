"""The TMA GEMM (kernels/gemm_tma.py) compiled for the GPU (Hopper or later): every tile
candidate, split and unsplit, in the three operand orientations that linear layers and 1x1
convolutions use, in bfloat16 and float16, with bias, ReLU, alpha and beta, against the float64
reference on NaN-poisoned outputs; then the ops that run it (linear in every direction, 1x1
channels-last convolutions, the GEMM algorithm's product of the column matrix), the pointer
path taking over for a misaligned view, and the split weight gradient repeating bit for bit.
Run with RTDNN_GPU_TESTS=1 on a machine with a CUDA GPU of compute capability 9 or more."""

import pytest
import torch
from conftest import NEEDS_TMA, gpu_only

from rtdnn import ops
from rtdnn import reference as R
from rtdnn.algos import tiles
from rtdnn.kernels.launch import MatrixLayout, TmaGemmLaunch

pytestmark = gpu_only(NEEDS_TMA)

DTYPES = {"bf16": (torch.bfloat16, 1e-2), "fp16": (torch.float16, 2e-3)}
# (m, n, k): tails in every dimension; a long reduction over a small output (split).
SHAPES = [(1000, 136, 520), (136, 64, 8200)]
ORIENTATIONS = {"x@w^T": (False, True), "dy@w": (False, False), "dy^T@x": (True, False)}


def _stored(rows, cols, transposed, dtype):
    """A rows x cols operand and its storage (the transpose when `transposed`)."""
    data = torch.randn(cols, rows) if transposed else torch.randn(rows, cols)
    data = data.to(device="cuda", dtype=dtype)
    return (data.t() if transposed else data), data


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("orientation", ORIENTATIONS)
@pytest.mark.parametrize("shape", SHAPES)
def test_every_candidate(dtype_name, orientation, shape):
    dtype, tol = DTYPES[dtype_name]
    m, n, k = shape
    a_t, b_t = ORIENTATIONS[orientation]
    a, a_data = _stored(m, k, a_t, dtype)
    b, b_data = _stored(k, n, b_t, dtype)
    bias = torch.randn(n, device="cuda").to(dtype)
    prior = torch.randn(m, n, device="cuda").to(dtype)
    product = a.double() @ b.double()
    a_layout = MatrixLayout(m, k, m if a_t else k, a_t)
    b_layout = MatrixLayout(k, n, k if b_t else n, b_t)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    candidates = tiles.tma_gemm_candidates("cuda", dtype, m, n, k)
    if k > 8000:  # two output tiles over 8200: split
        assert any(t.splits > 1 for t in candidates)
    for t in candidates:
        gemm = TmaGemmLaunch(a_layout, b_layout, (n, 1), tiles=t, programs=sms)
        ws = torch.empty(max(1, gemm.partial_bytes), dtype=torch.uint8, device="cuda")
        out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
        gemm(a_data, b_data, out, alpha=0.5, bias=bias, workspace=ws)
        ref = 0.5 * product + bias.double()
        assert R.rel_error(out, ref.cpu()) < tol, t
        out = prior.clone()
        gemm(a_data, b_data, out, alpha=1.0, beta=-2.0, workspace=ws)
        ref = product - 2.0 * prior.double()
        assert R.rel_error(out, ref.cpu()) < tol, t


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_linear_every_direction(tma_launches, dtype_name):
    dtype, tol = DTYPES[dtype_name]
    x = torch.randn(3, 197, 776, device="cuda").to(dtype)
    w = torch.randn(1000, 776, device="cuda").to(dtype) / 28
    bias = torch.randn(1000, device="cuda").to(dtype)
    dy = torch.randn(3, 197, 1000, device="cuda").to(dtype)
    y = ops.linear(x, w, bias, activation="relu")
    y_ref = torch.relu(x.double() @ w.double().t() + bias.double()).cpu()
    assert R.rel_error(y, y_ref) < tol
    dx = ops.linear_backward_data(dy, w)
    assert R.rel_error(dx, (dy.double() @ w.double()).cpu()) < tol
    dw = ops.linear_backward_weight(x, dy)
    ref = dy.double().reshape(-1, 1000).t() @ x.double().reshape(-1, 776)
    assert R.rel_error(dw, ref.cpu()) < tol
    assert torch.equal(dw, ops.linear_backward_weight(x, dy))  # a fixed order of the splits
    assert len(tma_launches) == 4
    # A view 2 bytes past alignment: the same prepared call takes the pointer path.
    shifted = torch.empty(3 * 197 * 776 + 1, device="cuda", dtype=dtype)[1:].view(3, 197, 776)
    shifted.copy_(x)
    y2 = ops.linear(shifted, w, bias, activation="relu")
    assert R.rel_error(y2, y_ref) < tol
    assert len(tma_launches) == 4


def test_tensor_maps_follow_the_data(tma_launches, monkeypatch):
    """Each descriptor's CUtensorMap is encoded once per address (kernels/launch.py): a call
    on new data at an address seen before (a freed tensor's block given out again, or the
    same tensor rewritten) reuses the map and reads the new data; a new address encodes a new
    map."""
    from rtdnn.kernels import launch

    encoded = []
    encode = launch.make_tensordesc_arg

    def counted(desc, meta):
        encoded.append(desc.base.data_ptr())
        return encode(desc, meta)

    monkeypatch.setattr(launch, "make_tensordesc_arg", counted)
    dtype, tol = DTYPES["bf16"]
    w = (torch.randn(384, 256, device="cuda") / 16).to(dtype)
    addresses = set()
    for i in range(4):
        x = torch.randn(512, 256, device="cuda").to(dtype)
        if i == 3:
            x.normal_()  # new data, same tensor
        addresses.add(x.data_ptr())
        y = ops.linear(x, w)
        assert R.rel_error(y, (x.double() @ w.double().t()).cpu()) < tol, i
        del x, y
    assert len(tma_launches) == 4
    # One map for the weight, one per distinct address of x (the first call compiles through
    # Triton's own launcher, which encodes its maps itself).
    assert len(encoded) <= 1 + len(addresses) and len(set(encoded)) == len(encoded)


@pytest.mark.parametrize(
    "algo_name, direction",
    [("IMPLICIT_GEMM", "forward"), ("IMPLICIT_GEMM", "backward_data"),
     ("IMPLICIT_GEMM", "backward_filter"), ("IMPLICIT_GEMM_SPLIT_K", "forward"),
     ("IMPLICIT_GEMM_SPLIT_K", "backward_filter")],
)  # fmt: skip
def test_pointwise_convolution_every_direction(tma_launches, algo_name, direction):
    """A 1x1 channels-last convolution run on the TMA GEMM's first tiles through the
    algorithm's own runner, in every direction the algorithm serves. (Untuned on Hopper the
    algorithm may choose the Hopper convolution kernel instead, so the tiles are taken here.)"""
    from rtdnn.algos import ALGORITHMS, ConvTensors
    from rtdnn.algos.implicit_gemm import gemm_shape
    from rtdnn.core import Direction
    from rtdnn.ops.conv import _problem_for_selection

    dtype, tol = DTYPES["bf16"]
    cl = torch.channels_last
    x = torch.randn(8, 256, 14, 14, device="cuda").to(dtype).to(memory_format=cl)
    w = (torch.randn(520, 256, 1, 1, device="cuda") / 16).to(dtype).to(memory_format=cl)
    bias = torch.randn(520, device="cuda").to(dtype)
    dy = torch.randn(8, 520, 14, 14, device="cuda").to(dtype).to(memory_format=cl)
    conv = dict(stride=1, padding=0, dilation=1, groups=1, mode="cross_correlation", math=None)
    p, _ = _problem_for_selection(direction, x, w, **conv)
    algo = ALGORITHMS[algo_name]
    assert algo.supports(p) is None
    candidates = algo._tma_gemm_candidates(p, *gemm_shape(p)[:3])[:3]
    assert candidates
    ws = torch.empty(max(1, algo.workspace_bytes(p)), dtype=torch.uint8, device="cuda")
    if direction == "forward":
        ref = torch.nn.functional.conv2d(x.double(), w.double(), bias.double())
        tensors = ConvTensors(x, w, torch.empty_like(dy), bias)
    elif direction == "backward_data":
        ref = torch.nn.grad.conv2d_input(x.shape, w.double(), dy.double())
        tensors = ConvTensors(torch.empty_like(x), w, dy)
    else:
        ref = torch.nn.grad.conv2d_weight(x.double(), w.shape, dy.double())
        tensors = ConvTensors(x, torch.empty_like(w), dy)
    out = tensors.written(Direction.parse(direction))
    for t in candidates:
        out.fill_(float("nan"))
        algo.prepare(p, t)(tensors, ws, 1.0, 0.0)
        assert R.rel_error(out, ref.cpu()) < tol, t
    assert len(tma_launches) == len(candidates)  # none fell back to the pointer path


@pytest.mark.parametrize(
    "x_shape, w_shape, conv",
    [
        ((8, 256, 28, 28), (512, 256, 1, 1), dict(stride=2)),  # a ResNet-50 projection
        ((8, 64, 14, 14), (64, 64, 3, 3), dict(padding=1)),
    ],
)
def test_gemm_algorithm_every_direction(tma_launches, x_shape, w_shape, conv):
    dtype, tol = DTYPES["bf16"]
    cl = torch.channels_last
    x = torch.randn(x_shape, device="cuda").to(dtype).to(memory_format=cl)
    fan_in = w_shape[1] * w_shape[2] * w_shape[3]
    w = (torch.randn(w_shape, device="cuda") / fan_in**0.5).to(dtype).to(memory_format=cl)
    bias = torch.randn(w_shape[0], device="cuda").to(dtype)
    y_ref = torch.nn.functional.conv2d(x.double(), w.double(), bias.double(), **conv)
    y = ops.conv_forward(x, w, bias, algo="GEMM", **conv)
    assert R.rel_error(y, y_ref.cpu()) < tol
    dy = torch.randn_like(y_ref).to(dtype).to(memory_format=cl)
    dx = ops.conv_backward_data(dy, w, x.shape, algo="GEMM", **conv)
    ref = torch.nn.grad.conv2d_input(x.shape, w.double(), dy.double(), **conv)
    assert R.rel_error(dx, ref.cpu()) < tol
    dw = ops.conv_backward_filter(x, dy, w.shape, algo="GEMM", **conv)
    ref = torch.nn.grad.conv2d_weight(x.double(), w.shape, dy.double(), **conv)
    assert R.rel_error(dw, ref.cpu()) < tol
    assert len(tma_launches) == 3
