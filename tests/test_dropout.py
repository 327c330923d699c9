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

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
LAYOUTS = ("contiguous", "channels_last", "strided", "reversed")


@SETTINGS
@given(
    shape=st.lists(st.integers(1, 6), min_size=1, max_size=5).map(tuple),
    p=st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]),
    seed=st.sampled_from([0, 1, 12345, 2**31 - 1, 2**40 + 3]),
    dtype=st.sampled_from([torch.float32, torch.float16]),
    layout=st.sampled_from(LAYOUTS),
    beta=st.sampled_from([0.0, 1.0]),
)
def test_forward_backward_match_reference(shape, p, seed, dtype, layout, beta):
    x = make(shape, dtype, layout)
    out, prior = out_for(shape, x, beta, layout)
    y = rtdnn.dropout_forward(x, p, seed, alpha=2.0, beta=beta, out=out)
    assert_close(y, R.dropout_forward(x, p, seed, alpha=2.0, beta=beta, out=prior), dtype)
    dy = make(shape, dtype, layout)
    dx = rtdnn.dropout_backward(dy, p, seed)
    assert_close(dx, R.dropout_backward(dy, p, seed), dtype)


def test_mask_depends_on_seed_and_index_only():
    ones = torch.ones(3, 4, 5, 6)
    ref = rtdnn.dropout_forward(ones, 0.5, 99)
    for layout in LAYOUTS:
        t = make(ones.shape, layout=layout, fill=torch.ones)
        assert torch.equal(rtdnn.dropout_forward(t, 0.5, 99), ref), layout
    assert torch.equal(ref != 0, R.dropout_mask(ones.shape, 0.5, 99))
    assert not torch.equal(rtdnn.dropout_forward(ones, 0.5, 100), ref)
    # backward recomputes the same mask
    assert torch.equal(rtdnn.dropout_backward(ones, 0.5, 99), ref)


def test_keep_rate_and_scale():
    x = torch.ones(4096)
    y = rtdnn.dropout_forward(x, 0.3, 5)
    kept = (y != 0).float().mean().item()
    assert abs(kept - 0.7) < 0.03
    assert torch.allclose(y[y != 0], torch.tensor(1 / 0.7))


def _err(fn, name):
    with pytest.raises(rtdnn.BadParamError, match=name):
        fn()


def test_validation_errors():
    x = make((3, 4))
    out = torch.full((3, 4), 2.0)
    _err(lambda: rtdnn.dropout_forward(x, 1.5, 0, out=out), "p")
    _err(lambda: rtdnn.dropout_forward(x, -0.1, 0, out=out), "p")
    _err(lambda: rtdnn.dropout_forward(x, 0.5, -1, out=out), "seed")
    _err(lambda: rtdnn.dropout_forward(x, 0.5, 1.5, out=out), "seed")
    _err(lambda: rtdnn.dropout_forward(x, 0.5, 1, out=out[:2]), "out.shape")
    _err(lambda: rtdnn.dropout_backward(x.double(), 0.5, 1, out=out), "dy.dtype")
    assert torch.equal(out, torch.full((3, 4), 2.0))


def test_module_autograd_and_eval():
    torch.manual_seed(0)
    m = rnn.Dropout(0.4)
    x = torch.randn(5, 40, requires_grad=True)
    y = m(x)
    y.backward(torch.ones_like(y))
    keep = y.detach() != 0
    assert torch.equal(keep, x.grad != 0)
    assert_close(x.grad[keep], torch.full_like(x.grad[keep], 1 / 0.6).double(), torch.float32)
    m.eval()
    assert m(x) is x


def test_torch_compile_fullgraph():
    m = torch.compile(rnn.Dropout(0.5), backend="eager", fullgraph=True)
    y = m(torch.ones(4, 8))
    assert set(y.unique().tolist()) <= {0.0, 2.0}
