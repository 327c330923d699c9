"""GPU correctness of the memory-bound primitives: compiled kernels, moderate sizes, bf16 /
fp16 / fp32, forward and backward, against the float64 references (computed on the CPU).

Run in its own process, without TRITON_INTERPRET:  pytest tests/test_prims_gpu.py
"""

import pytest
import torch
from conftest import gpu_only

import rtdnn
from rtdnn import reference as R

pytestmark = gpu_only()

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# Max abs error relative to max(|ref|, 1): storage rounding dominates for 16-bit types.
TOL = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3, torch.float32: 2e-5}


def close(out, ref, dtype, tol=None, what=""):
    tol = TOL[dtype] if tol is None else tol
    out64 = out.detach().double().cpu()
    ref64 = ref.detach().double().cpu()
    assert out64.shape == ref64.shape, what
    assert torch.isfinite(out64).all(), f"{what}: non-finite output"
    err = (out64 - ref64).abs().max().item()
    scale = max(ref64.abs().max().item(), 1.0)
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol:.1g} * {scale:.3g}"


def cuda(shape, dtype, layout="contiguous", scale=1.0, fill=None):
    t = fill(shape) if fill else torch.randn(shape) * scale
    t = t.to("cuda", dtype)
    if layout == "channels_last":
        fmt = torch.channels_last if t.dim() == 4 else torch.channels_last_3d
        t = t.contiguous(memory_format=fmt)
    elif layout == "strided":
        wide = torch.zeros((*shape[:-1], 2 * shape[-1]), device="cuda", dtype=dtype)
        wide[..., ::2] = t
        t = wide[..., ::2]
    return t


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# -- pooling ---------------------------------------------------------------------------------

POOL_CASES = [
    # shape, layout, window, stride, padding, dilation, ceil_mode
    ((8, 64, 56, 56), "channels_last", 3, 2, 1, 1, False),
    ((4, 32, 28, 27), "contiguous", 3, 2, 1, 1, True),
    ((4, 48, 15, 15), "channels_last", 2, 2, 0, 1, False),
    ((2, 16, 9, 17, 17), "channels_last", 3, 2, 1, 2, False),
    ((4, 24, 301), "contiguous", 5, 3, 2, 1, True),
    ((2, 40, 20, 20), "strided", 3, 1, 1, 1, False),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", POOL_CASES, ids=str)
@pytest.mark.parametrize("mode", ["max", "avg_include_pad", "avg_exclude_pad"])
def test_pooling(dtype, case, mode):
    shape, layout, k, s, p, d, cm = case
    args = dict(stride=s, padding=p, dilation=d, ceil_mode=cm)
    x = cuda(shape, dtype, layout)
    y = rtdnn.pooling_forward(x, mode, k, **args)
    close(y, R.pooling_forward(x, mode, k, **args), dtype, what="forward")
    dy = cuda(tuple(y.shape), dtype, layout)
    dx = rtdnn.pooling_backward(dy, x, y, mode, k, **args)
    # Overlapping windows add several dy in float32 before one rounding.
    close(dx, R.pooling_backward(dy, x, y, mode, k, **args), dtype, what="backward")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_max_pool_ties_route_like_torch(dtype):
    x = torch.randint(-2, 3, (4, 32, 20, 20), device="cuda").to(dtype)
    x = x.contiguous(memory_format=torch.channels_last)
    xr = x.float().requires_grad_()
    ref_y = torch.nn.functional.max_pool2d(xr, 3, 2, 1)
    dy = torch.randn(ref_y.shape, device="cuda").to(dtype)
    (ref,) = torch.autograd.grad(ref_y, xr, dy.float())
    dx = rtdnn.pooling_backward(dy, x, None, "max", 3, stride=2, padding=1)
    close(dx, ref, dtype)
    assert torch.equal(dx, rtdnn.pooling_backward(dy, x, None, "max", 3, stride=2, padding=1))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape,osize,layout",
    [
        ((8, 64, 14, 14), (7, 7), "channels_last"),
        ((8, 64, 7, 7), (1, 1), "channels_last"),
        ((4, 32, 13, 11), (5, 3), "contiguous"),
        ((2, 16, 6, 10, 10), (3, 4, 4), "channels_last"),
    ],
    ids=str,
)
def test_adaptive_avg_pool(dtype, shape, osize, layout):
    x = cuda(shape, dtype, layout)
    y = rtdnn.adaptive_avg_pool(x, osize)
    close(y, R.adaptive_avg_pool(x, osize), dtype)
    dy = cuda(tuple(y.shape), dtype, layout)
    dx = rtdnn.adaptive_avg_pool_backward(dy, x.shape)
    close(dx, R.adaptive_avg_pool_backward(dy, x.shape), dtype)


# -- activations -----------------------------------------------------------------------------

ACT_MODES = ["identity", "relu", "sigmoid", "tanh", "clipped_relu", "hardtanh", "elu",
             "leaky_relu", "swish", "gelu", "gelu_tanh"]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", ACT_MODES)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "strided"])
def test_activation(dtype, mode, layout):
    x = cuda((16, 64, 30, 30), dtype, layout, scale=3.0)
    y = rtdnn.activation_forward(x, mode)
    close(y, R.activation_forward(x, mode), dtype, what="forward")
    dy = cuda(tuple(x.shape), dtype, layout)
    dx = rtdnn.activation_backward(dy, x, y, mode)
    # relu/sigmoid/tanh differentiate through y, rounded to the storage dtype.
    tol = 2 * TOL[dtype] if dtype != torch.float32 else 5e-5
    close(dx, R.activation_backward(dy, x, y, mode), dtype, tol=tol, what="backward")


def test_activation_transposing_out_and_alpha_beta():
    x = cuda((8, 32, 24, 24), torch.bfloat16)
    out = torch.randn(8, 32, 24, 24, device="cuda", dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last
    )
    prior = out.clone()
    rtdnn.activation_forward(x, "gelu", alpha=2.0, beta=-0.5, out=out)
    close(out, R.activation_forward(x, "gelu", alpha=2.0, beta=-0.5, out=prior), torch.bfloat16)


# -- softmax ---------------------------------------------------------------------------------

SOFTMAX_CASES = [
    ((512, 4096), "channel", "contiguous"),
    ((64, 1000), "channel", "contiguous"),
    ((4, 2**17), "channel", "contiguous"),  # long rows: two-kernel path
    ((4, 21, 64, 64), "channel", "contiguous"),  # over C, positions contiguous
    ((4, 21, 64, 64), "channel", "channels_last"),
    ((8, 16, 32, 32), "instance", "contiguous"),
    ((4, 8, 4, 16, 16), "instance", "channels_last"),
    ((6, 300, 7), "channel", "strided"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", SOFTMAX_CASES, ids=str)
@pytest.mark.parametrize("algo", ["fast", "accurate", "log"])
def test_softmax(dtype, case, algo):
    shape, mode, layout = case
    x = cuda(shape, dtype, layout, scale=2.0)
    y = rtdnn.softmax_forward(x, algo=algo, mode=mode)
    close(y, R.softmax_forward(x, algo=algo, mode=mode), dtype, what="forward")
    dy = cuda(tuple(x.shape), dtype, layout)
    dx = rtdnn.softmax_backward(y, dy, algo=algo, mode=mode)
    close(dx, R.softmax_backward(y, dy, algo=algo, mode=mode), dtype, what="backward")


# -- LRN -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape,layout,size",
    [
        ((8, 96, 27, 27), "channels_last", 5),
        ((8, 96, 27, 27), "contiguous", 5),
        ((4, 2048, 7, 7), "channels_last", 5),  # more channels than one tile: recompute path
        ((4, 64, 33), "contiguous", 4),
    ],
    ids=str,
)
def test_lrn(dtype, shape, layout, size):
    args = dict(lrn_alpha=1e-3, lrn_beta=0.75, lrn_k=2.0)
    x = cuda(shape, dtype, layout, scale=3.0)
    y = rtdnn.lrn_forward(x, size, **args)
    close(y, R.lrn_forward(x, size, **args), dtype, what="forward")
    dy = cuda(tuple(x.shape), dtype, layout)
    dx = rtdnn.lrn_backward(dy, x, y, size, **args)
    close(dx, R.lrn_backward(dy, x, y, size, **args), dtype, what="backward")


# -- dropout ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "strided"])
def test_dropout_same_mask_as_cpu_reference(dtype, layout):
    x = cuda((8, 32, 20, 20), dtype, layout)
    shape = tuple(x.shape)
    y = rtdnn.dropout_forward(x, 0.3, 2024)
    close(y, R.dropout_forward(x, 0.3, 2024), dtype)
    assert torch.equal(
        (y != 0).cpu() | (x == 0).cpu(), R.dropout_mask(shape, 0.3, 2024) | (x == 0).cpu()
    )
    dy = cuda(shape, dtype, layout)
    dx = rtdnn.dropout_backward(dy, 0.3, 2024)
    close(dx, R.dropout_backward(dy, 0.3, 2024), dtype)


# -- tensor ops ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", ["add", "mul", "min", "max", "sqrt", "not"])
def test_op_tensor(dtype, op):
    a = cuda((16, 64, 28, 28), dtype, "channels_last")
    a = a.abs() if op == "sqrt" else a
    b = cuda((1, 64, 1, 1), dtype)
    y = rtdnn.op_tensor(a, b, op, alpha1=1.5, alpha2=0.5)
    close(y, R.op_tensor(a, b, op, alpha1=1.5, alpha2=0.5), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_add_scale_set_transform(dtype):
    c = cuda((16, 64, 28, 28), dtype, "channels_last")
    bias = cuda((1, 64, 1, 1), dtype)
    expected = R.add_tensor(bias, c, alpha=1.0, beta=1.0)
    rtdnn.add_tensor(bias, c)
    close(c, expected, dtype)
    rtdnn.scale_tensor(c, 0.5)
    close(c, 0.5 * expected, dtype)
    x = cuda((16, 64, 28, 28), torch.float32)
    y = rtdnn.transform_tensor(x, dtype=dtype, memory_format=torch.channels_last)
    assert y.is_contiguous(memory_format=torch.channels_last)
    close(y, x.double(), dtype)
    rtdnn.set_tensor(y, 3.0)
    assert (y == 3.0).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape,layout,dims",
    [
        ((32, 64, 28, 28), "channels_last", (0, 2, 3)),  # per-channel sums (bias gradient)
        ((32, 64, 28, 28), "contiguous", (2, 3)),  # global average pooling
        ((256, 4096), "contiguous", (1,)),
        ((256, 4096), "contiguous", (0,)),
        ((8, 64, 30, 30), "strided", None),
    ],
    ids=str,
)
@pytest.mark.parametrize("op", ["add", "max", "min", "amax", "avg", "norm1", "norm2"])
def test_reduce_tensor(dtype, shape, layout, dims, op):
    # The sum of |x| over a whole tensor of N(0, 1) values passes float16's largest value
    # (65504), where the true result is inf: scale the data down to keep the result finite.
    x = cuda(shape, dtype, layout, scale=1 / 64 if op == "norm1" else 1.0)
    indices = op in ("max", "min", "amax")
    got = rtdnn.reduce_tensor(x, op, dims, indices=indices)
    ref = R.reduce_tensor(x, op, dims, indices=indices)
    if indices:
        close(got[0], ref[0], dtype)
        # 16-bit data has many ties: the first one wins, as in the reference
        assert torch.equal(got[1].cpu(), ref[1].cpu())
    else:
        tol = TOL[dtype] * (4 if dtype != torch.float32 else 10)
        close(got, ref, dtype, tol=tol)


# -- modules ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_modules_train_step_matches_torch(dtype):
    import rtdnn.nn as rnn

    def net(nn):
        return torch.nn.Sequential(
            nn.MaxPool2d(3, 2, 1), nn.ReLU(), nn.LocalResponseNorm(5), nn.AvgPool2d(2),
            nn.GELU(), nn.AdaptiveAvgPool2d(2), torch.nn.Flatten(), nn.Softmax(dim=1),
        )  # fmt: skip

    x = cuda((8, 32, 24, 24), dtype, "channels_last").requires_grad_()
    y1 = net(rnn)(x)
    y2 = net(torch.nn)(x)
    g = torch.randn_like(y2)
    (d1,) = torch.autograd.grad(y1, x, g)
    (d2,) = torch.autograd.grad(y2, x, g)
    close(y1, y2.float(), dtype, tol=3 * TOL[dtype])
    close(d1, d2.float(), dtype, tol=3 * TOL[dtype])
