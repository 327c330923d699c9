import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
# The shared helpers sit beside this file (importable whether or not tests/ is a package).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pytest  # noqa: E402
import torch  # noqa: E402
from _prims_util import assert_close, make, out_for  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import rtdnn  # noqa: E402
import rtdnn.nn as rnn  # noqa: E402
from rtdnn import reference as R  # noqa: E402
from rtdnn.kernels import lrn as KL  # noqa: E402

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
LAYOUTS = ("contiguous", "channels_last", "strided", "reversed")


@SETTINGS
@given(
    shape=st.lists(st.integers(1, 5), min_size=2, max_size=5).map(
        lambda s: (s[0], 2 * s[1], *s[2:])
    ),
    size=st.integers(1, 6),
    dtype=st.sampled_from([torch.float32, torch.float16]),
    layout=st.sampled_from(LAYOUTS),
    beta=st.sampled_from([0.0, -1.0]),
    use_out=st.booleans(),
    gather=st.booleans(),
    consts=st.sampled_from([(1e-4, 0.75, 1.0), (0.5, 0.6, 2.0), (0.3, 1.0, 0.5)]),
)
def test_forward_backward_match_reference(
    shape, size, dtype, layout, beta, use_out, gather, consts
):
    a, b, k = consts
    lrn = dict(lrn_alpha=a, lrn_beta=b, lrn_k=k)
    saved = KL.GATHER_MAX
    KL.GATHER_MAX = saved if gather else 0  # 0: the backward recomputes instead of gathers
    try:
        x = make(shape, dtype, layout, scale=2.0)
        beta = beta if use_out else 0.0
        out, prior = out_for(shape, x, beta, layout) if use_out else (None, None)
        y = rtdnn.lrn_forward(x, size, alpha=0.5, beta=beta, out=out, **lrn)
        ref = R.lrn_forward(x, size, alpha=0.5, beta=beta, out=prior, **lrn)
        assert_close(y, ref, dtype, what="forward")
        dy = make(shape, dtype, layout)
        out, prior = out_for(shape, x, beta, layout) if use_out else (None, None)
        dx = rtdnn.lrn_backward(dy, x, None, size, alpha=0.5, beta=beta, out=out, **lrn)
        ref = R.lrn_backward(dy, x, None, size, alpha=0.5, beta=beta, out=prior, **lrn)
        assert_close(dx, ref, dtype, what="backward")
    finally:
        KL.GATHER_MAX = saved


@pytest.mark.parametrize("size", [1, 2, 5, 8, 9, 10])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_channel_chunks_and_halos(size, layout):
    # C = 37 spans three channel chunks of the channel-rows kernels (positions contiguous),
    # so window sums cross chunk edges through the halo rows; size 10 takes the other kernels.
    # Outputs start as NaN: every element must be written.
    shape = (2, 37, 3, 2)
    lrn = dict(lrn_alpha=0.5, lrn_beta=0.75, lrn_k=1.0)
    x = make(shape, layout=layout, scale=2.0)
    dy = make(shape, layout=layout)
    nan = torch.full_like(x, float("nan"))
    y = rtdnn.lrn_forward(x, size, out=nan.clone(), **lrn)
    assert_close(y, R.lrn_forward(x, size, **lrn), torch.float32, what="forward")
    dx = rtdnn.lrn_backward(dy, x, None, size, out=nan.clone(), **lrn)
    assert_close(dx, R.lrn_backward(dy, x, None, size, **lrn), torch.float32, what="backward")


def _err(fn, name):
    with pytest.raises(rtdnn.BadParamError, match=name):
        fn()


def test_validation_errors():
    x = make((2, 4, 3))
    out = torch.full((2, 4, 3), 1.0)
    _err(lambda: rtdnn.lrn_forward(x, 0, out=out), "size")
    _err(lambda: rtdnn.lrn_forward(x, 2.5, out=out), "size")
    _err(lambda: rtdnn.lrn_forward(x, 3, lrn_alpha="a", out=out), "lrn_alpha")
    _err(lambda: rtdnn.lrn_forward(x[0, 0], 3), "x.dim")
    _err(lambda: rtdnn.lrn_forward(x, 3, out=out.half()), "out.dtype")
    _err(lambda: rtdnn.lrn_backward(x[:1], x, None, 3, out=out), "dy.shape")
    _err(lambda: rtdnn.lrn_backward(x, x, x[:, :1], 3, out=out), "y.shape")
    assert torch.equal(out, torch.full((2, 4, 3), 1.0))


def test_module_matches_torch_with_autograd():
    ours = rnn.LocalResponseNorm(3, alpha=0.2, beta=0.7, k=1.5)
    theirs = torch.nn.LocalResponseNorm(3, alpha=0.2, beta=0.7, k=1.5)
    x = make((2, 6, 3, 3), layout="channels_last", scale=2.0).requires_grad_()
    y1, y2 = ours(x), theirs(x)
    g = torch.randn(y2.shape)
    (d1,) = torch.autograd.grad(y1, x, g)
    (d2,) = torch.autograd.grad(y2, x, g)
    assert_close(y1, y2.double(), torch.float32)
    assert_close(d1, d2.double(), torch.float32)
