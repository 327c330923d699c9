"""bfloat16 on the CPU: Triton's interpreter gets bf16 tl.dot wrong, so the GEMM kernel converts
its tiles to float32 there (kernels/brgemm.py, UPCAST). Every GEMM user in bfloat16 (convolution
in each direction and algorithm, linear layers, the modules under CPU autocast) must match the
float64 reference of the same bf16 inputs; so must the memory-bound primitives, which compute
in float32 already.
"""

import pytest
import torch
from conftest import TOLERANCE

import rtdnn
import rtdnn.nn as rnn
from rtdnn import reference as R

BF16 = torch.bfloat16
TOL = TOLERANCE[BF16]
CONV = dict(padding=1)

# The algorithms that take each direction of this problem (find_conv_algorithms lists them).
DIRECTIONS = [
    ("forward", "IMPLICIT_GEMM"),
    ("forward", "IMPLICIT_GEMM_SPLIT_K"),
    ("forward", "GEMM"),
    ("forward", "IMPLICIT_PRECOMP_GEMM"),
    ("backward_data", "IMPLICIT_GEMM"),
    ("backward_data", "IMPLICIT_PRECOMP_GEMM"),
    ("backward_data", "GEMM"),
    ("backward_filter", "IMPLICIT_GEMM"),
    ("backward_filter", "IMPLICIT_GEMM_SPLIT_K"),
    ("backward_filter", "GEMM"),
    ("backward_filter", "IMPLICIT_PRECOMP_GEMM"),
]


def rand(*shape, dtype=BF16):
    return torch.randn(shape, generator=GEN, dtype=torch.float32).to(dtype)


GEN = torch.Generator().manual_seed(7)


def check(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert out.dtype == BF16
    err = R.rel_error(out, ref)
    assert err <= TOL, f"relative error {err:.3e} > {TOL}"


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("direction,algo", DIRECTIONS)
def test_conv_bf16(direction, algo, layout):
    x, w, dy = rand(2, 16, 5, 5), rand(16, 16, 3, 3), rand(2, 16, 5, 5)
    if layout == "channels_last":
        x, dy = (t.contiguous(memory_format=torch.channels_last) for t in (x, dy))
    if direction == "forward":
        out = rtdnn.conv_forward(x, w, algo=algo, **CONV)
        ref = R.conv_forward(x, w, **CONV)
    elif direction == "backward_data":
        out = rtdnn.conv_backward_data(dy, w, x.shape, algo=algo, **CONV)
        ref = R.conv_backward_data(dy, w, x.shape, **CONV)
    else:
        out = rtdnn.conv_backward_filter(x, dy, w.shape, algo=algo, **CONV)
        ref = R.conv_backward_filter(x, dy, w.shape, **CONV)
    check(out, ref)


def test_linear_bf16_every_direction():
    x, w, b, dy = rand(5, 32), rand(16, 32), rand(16), rand(5, 16)
    xd, wd, dyd = x.double(), w.double(), dy.double()
    check(rtdnn.linear(x, w, b), xd @ wd.T + b.double())
    check(rtdnn.linear_backward_data(dy, w), dyd @ wd)
    check(rtdnn.linear_backward_weight(x, dy), dyd.T @ xd)


def test_conv2d_module_under_cpu_autocast():
    torch.manual_seed(3)
    m = rnn.Conv2d(16, 16, 3, padding=1)
    x = torch.randn(2, 16, 5, 5, requires_grad=True)
    with torch.autocast("cpu", dtype=BF16):
        y = m(x)
    assert y.dtype == BF16
    xb, wb, bb = (t.detach().to(BF16) for t in (x, m.weight, m.bias))
    check(y.detach(), R.conv_forward(xb, wb, bb, padding=1))
    dy = rand(*y.shape)
    y.backward(dy)
    # Autocast casts x and the weight to bf16 first; their gradients are computed in bf16.
    ref_dx = R.conv_backward_data(dy, wb, x.shape, padding=1)
    ref_dw = R.conv_backward_filter(xb, dy, wb.shape, padding=1)
    assert R.rel_error(x.grad, ref_dx) <= TOL
    assert R.rel_error(m.weight.grad, ref_dw) <= TOL


def test_linear_module_under_cpu_autocast():
    torch.manual_seed(4)
    m = rnn.Linear(32, 16)
    x = torch.randn(4, 32)
    with torch.autocast("cpu", dtype=BF16):
        y = m(x)
    xb, wb, bb = (t.detach().to(BF16).double() for t in (x, m.weight, m.bias))
    check(y.detach(), xb @ wb.T + bb)


def test_memory_bound_primitives_bf16():
    """No tl.dot here: float32 arithmetic on bf16 loads, checked all the same."""
    f = torch.nn.functional
    x = rand(2, 8, 6, 6)
    xd = x.double()
    check(rtdnn.activation_forward(x, "gelu"), f.gelu(xd))
    check(rtdnn.softmax_forward(x), f.softmax(xd, 1))
    check(rtdnn.pooling_forward(x, "avg_include_pad", 2), f.avg_pool2d(xd, 2))
    check(rtdnn.lrn_forward(x, 3), f.local_response_norm(xd, 3))
    check(rtdnn.layer_norm_forward(x, [6])[0], f.layer_norm(xd, [6]))
    check(rtdnn.batch_norm_forward_training(x)[0], f.batch_norm(xd, None, None, training=True))
    check(rtdnn.reduce_tensor(x, "add", 1), xd.sum(1, keepdim=True))
    target = torch.randint(0, 8, (2, 6, 6), generator=GEN)
    check(rtdnn.cross_entropy(x, target), f.cross_entropy(xd, target))
