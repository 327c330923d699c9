import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
# The shared helpers sit beside this file (importable whether or not tests/ is a package).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pytest  # noqa: E402
import torch  # noqa: E402
from _prims_util import LAYOUTS, assert_close, make, out_for  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import rtdnn  # noqa: E402
import rtdnn.nn as rnn  # noqa: E402
from rtdnn import reference as R  # noqa: E402
from rtdnn.ops.activation import MODES  # noqa: E402

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
COEF = {"clipped_relu": 2.5, "hardtanh": (-0.5, 1.5), "elu": 0.7, "leaky_relu": 0.2, "swish": 1.3}

shapes = st.lists(st.integers(1, 5), min_size=1, max_size=5).map(tuple)


@SETTINGS
@given(
    mode=st.sampled_from(MODES),
    shape=shapes,
    dtype=st.sampled_from([torch.float32, torch.float16]),
    layout=st.sampled_from(LAYOUTS),
    out_layout=st.sampled_from(["none", *LAYOUTS]),
    alpha=st.sampled_from([1.0, -0.5]),
    beta=st.sampled_from([0.0, 0.75]),
    use_coef=st.booleans(),
)
def test_forward_backward_match_reference(
    mode, shape, dtype, layout, out_layout, alpha, beta, use_coef
):
    coef = COEF.get(mode) if use_coef else None
    x = make(shape, dtype, layout, scale=3.0)
    dy = make(shape, dtype, layout)
    if out_layout == "none":
        beta = 0.0
        out, prior = None, None
    else:
        out, prior = out_for(shape, x, beta, out_layout)
    y = rtdnn.activation_forward(x, mode, coef=coef, alpha=alpha, beta=beta, out=out)
    ref = R.activation_forward(x, mode, coef=coef, alpha=alpha, beta=beta, out=prior)
    assert_close(y, ref, dtype, what="forward")
    if out is not None:
        assert y is out
    else:
        assert y.stride() == torch.empty_like(x).stride()  # keeps x's dense layout
    y1 = rtdnn.activation_forward(x, mode, coef=coef)
    out2, prior2 = (None, None) if out_layout == "none" else out_for(shape, x, beta, out_layout)
    dx = rtdnn.activation_backward(dy, x, y1, mode, coef=coef, alpha=alpha, beta=beta, out=out2)
    ref = R.activation_backward(dy, x, y1, mode, coef=coef, alpha=alpha, beta=beta, out=prior2)
    # sigmoid/tanh/relu differentiate through y, which is rounded to the storage dtype
    tol = 4e-3 if dtype == torch.float16 else 2e-5
    assert_close(dx, ref, dtype, tol=tol, what="backward")


def test_backward_reads_only_what_it_needs():
    x = make((3, 4), scale=2.0)
    dy = make((3, 4))
    for mode in MODES:
        y = rtdnn.activation_forward(x, mode)
        needs = rtdnn.activation_needs(mode)
        full = rtdnn.activation_backward(dy, x, y, mode)
        part = rtdnn.activation_backward(
            dy, x if needs == "x" else None, y if needs == "y" else None, mode
        )
        assert torch.equal(full, part), mode


def test_special_values():
    x = torch.tensor([float("nan"), float("-inf"), float("inf"), -0.0, 0.0, -40.0, 40.0])
    assert torch.isnan(rtdnn.activation_forward(x, "relu")[0])
    # Saturation is exact and tails keep their relative accuracy.
    y = rtdnn.activation_forward(x[1:], "sigmoid")
    torch.testing.assert_close(y, torch.sigmoid(x[1:]), rtol=1e-6, atol=0)
    y = rtdnn.activation_forward(x[1:], "tanh")
    torch.testing.assert_close(y, torch.tanh(x[1:]), rtol=1e-6, atol=0)
    y = rtdnn.activation_forward(x[3:], "gelu")
    assert_close(y, torch.nn.functional.gelu(x[3:].double()), torch.float32)
    y = rtdnn.activation_forward(torch.tensor([-3.0, 0.5, 9.0]), "clipped_relu", coef=6.0)
    assert torch.equal(y, torch.tensor([0.0, 0.5, 6.0]))


def test_in_place_forward():
    x = make((4, 5))
    ref = torch.relu(x)
    y = rtdnn.activation_forward(x, "relu", out=x)
    assert y is x and torch.equal(x, ref)


def _err(fn, name):
    with pytest.raises(rtdnn.BadParamError, match=name):
        fn()


def test_validation_errors_name_the_parameter_and_leave_out_alone():
    x = make((2, 3))
    out = torch.full((2, 3), 7.0)
    _err(lambda: rtdnn.activation_forward(x, "swishy"), "mode")
    _err(lambda: rtdnn.activation_forward([1.0], "relu"), "x")
    _err(lambda: rtdnn.activation_forward(x.double(), "relu"), "x.dtype")
    _err(lambda: rtdnn.activation_forward(x, "relu", out=torch.empty(3, 2)), "out.shape")
    _err(lambda: rtdnn.activation_forward(x, "relu", out=out.half()), "out.dtype")
    _err(lambda: rtdnn.activation_forward(x, "relu", beta=1.0), "beta")
    _err(lambda: rtdnn.activation_forward(x, "relu", alpha="2", out=out), "alpha")
    _err(lambda: rtdnn.activation_forward(x, "elu", coef="a", out=out), "coef")
    _err(lambda: rtdnn.activation_forward(x, "hardtanh", coef=1.0, out=out), "coef")
    _err(lambda: rtdnn.activation_forward(x, "hardtanh", coef=(2.0, 1.0), out=out), "coef")
    _err(lambda: rtdnn.activation_forward(x, "clipped_relu", coef=-1.0, out=out), "coef")
    _err(lambda: rtdnn.activation_forward(x, "relu", out=torch.empty(1, 3).expand(2, 3)), "out")
    _err(lambda: rtdnn.activation_backward(x, None, x, "gelu", out=out), "x")
    _err(lambda: rtdnn.activation_backward(x, x, None, "tanh", out=out), "y")
    _err(lambda: rtdnn.activation_backward(x, torch.empty(3, 2), x, "gelu", out=out), "x.shape")
    _err(lambda: rtdnn.activation_backward(x, x.half(), x, "gelu", out=out), "x.dtype")
    assert torch.equal(out, torch.full((2, 3), 7.0))


MODULES = [
    (rnn.ReLU(), torch.nn.ReLU()),
    (rnn.Sigmoid(), torch.nn.Sigmoid()),
    (rnn.Tanh(), torch.nn.Tanh()),
    (rnn.ELU(alpha=0.5), torch.nn.ELU(alpha=0.5)),
    (rnn.LeakyReLU(0.2), torch.nn.LeakyReLU(0.2)),
    (rnn.SiLU(), torch.nn.SiLU()),
    (rnn.GELU(), torch.nn.GELU()),
    (rnn.GELU(approximate="tanh"), torch.nn.GELU(approximate="tanh")),
    (rnn.Hardtanh(-2.0, 1.5), torch.nn.Hardtanh(-2.0, 1.5)),
    (rnn.Hardtanh(0.0, 6.0), torch.nn.ReLU6()),
]


@pytest.mark.parametrize("ours,theirs", MODULES, ids=lambda m: type(m).__name__)
def test_modules_match_torch_with_autograd(ours, theirs):
    x = make((2, 3, 4), layout="channels_last", scale=3.0).requires_grad_()
    y1, y2 = ours(x), theirs(x)
    g = torch.randn(y2.shape)
    (d1,) = torch.autograd.grad(y1, x, g)
    (d2,) = torch.autograd.grad(y2, x, g)
    assert_close(y1, y2.double(), torch.float32)
    assert_close(d1, d2.double(), torch.float32, tol=2e-5)


def test_torch_compile_fullgraph():
    m = torch.nn.Sequential(rnn.GELU(), rnn.LeakyReLU(0.1))
    compiled = torch.compile(m, backend="eager", fullgraph=True)
    x = torch.randn(3, 5, requires_grad=True)
    y = compiled(x)
    y.sum().backward()
    ref = torch.nn.functional.leaky_relu(torch.nn.functional.gelu(x.detach()), 0.1)
    assert_close(y, ref.double(), torch.float32)
    assert x.grad is not None and torch.isfinite(x.grad).all()
