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
from rtdnn.kernels import softmax as KS  # noqa: E402

# The interpreter warns about NaN in masked-off lanes and about tensor loop bounds.
pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
LAYOUTS = ("contiguous", "channels_last", "strided", "reversed")


@SETTINGS
@given(
    shape=st.lists(st.integers(1, 6), min_size=2, max_size=5).map(tuple),
    algo=st.sampled_from(["fast", "accurate", "log"]),
    mode=st.sampled_from(["channel", "instance"]),
    dtype=st.sampled_from([torch.float32, torch.float16]),
    layout=st.sampled_from(LAYOUTS),
    beta=st.sampled_from([0.0, 0.5]),
    use_out=st.booleans(),
    split=st.booleans(),
)
def test_forward_backward_match_reference(shape, algo, mode, dtype, layout, beta, use_out, split):
    # split: force the two-kernel path of long rows on these tiny rows.
    saved = KS.FUSED_MAX, KS.SPLIT_BLOCK
    if split:
        KS.FUSED_MAX, KS.SPLIT_BLOCK = 4, 4
    try:
        _check(shape, algo, mode, dtype, layout, beta, use_out)
    finally:
        KS.FUSED_MAX, KS.SPLIT_BLOCK = saved


def _check(shape, algo, mode, dtype, layout, beta, use_out):
    x = make(shape, dtype, layout, scale=3.0)
    beta = beta if use_out else 0.0
    out, prior = out_for(shape, x, beta, layout) if use_out else (None, None)
    y = rtdnn.softmax_forward(x, algo=algo, mode=mode, alpha=1.5, beta=beta, out=out)
    ref = R.softmax_forward(x, algo=algo, mode=mode, alpha=1.5, beta=beta, out=prior)
    assert_close(y, ref, dtype, what="forward")
    y = rtdnn.softmax_forward(x, algo=algo, mode=mode)
    dy = make(shape, dtype, layout)
    out, prior = out_for(shape, x, beta, layout) if use_out else (None, None)
    dx = rtdnn.softmax_backward(y, dy, algo=algo, mode=mode, alpha=1.5, beta=beta, out=out)
    ref = R.softmax_backward(y, dy, algo=algo, mode=mode, alpha=1.5, beta=beta, out=prior)
    assert_close(dx, ref, dtype, what="backward")


@pytest.mark.parametrize("length", [1, 3, 16385])
def test_row_lengths(length):
    x = make((2, length), scale=4.0)
    for algo in ("accurate", "log"):
        y = rtdnn.softmax_forward(x, algo=algo)
        assert_close(y, R.softmax_forward(x, algo=algo), torch.float32)
        dy = make((2, length))
        dx = rtdnn.softmax_backward(y, dy, algo=algo)
        assert_close(dx, R.softmax_backward(y, dy, algo=algo), torch.float32)


def test_accurate_survives_large_inputs():
    x = torch.tensor([[1000.0, 1001.0, -1000.0], [-float("inf"), 0.0, 1.0]])
    y = rtdnn.softmax_forward(x)
    assert_close(y, torch.softmax(x.double(), -1), torch.float32)
    y = rtdnn.softmax_forward(x, algo="log")
    assert torch.isfinite(y[0]).all() and y[1, 0] == -float("inf")


@pytest.mark.parametrize("max_splits", [1, 2, 1024])
def test_split_rows_match_reference(max_splits):
    # Rows of 37 in chunks of 2 (float32): 19 segments, or a capped number of segments that
    # each loop over several chunks. -inf entries and a large one go through the stats
    # kernel's online max and sum. Outputs start as NaN: every element must be written.
    saved = KS.FUSED_MAX, KS.SPLIT_BLOCK, KS.MAX_SPLITS
    KS.FUSED_MAX, KS.SPLIT_BLOCK, KS.MAX_SPLITS = 4, 4, max_splits
    try:
        for algo in ("fast", "accurate", "log"):
            x = make((3, 37), scale=3.0 if algo == "fast" else 30.0)
            if algo != "fast":  # fast subtracts no max: finite, moderate inputs only
                x[1, ::3] = -float("inf")
                x[2, 5] = 80.0
            y = rtdnn.softmax_forward(x, algo=algo, out=torch.full_like(x, float("nan")))
            assert_close(y, R.softmax_forward(x, algo=algo), torch.float32, what=algo)
            dy = make((3, 37))
            dx = rtdnn.softmax_backward(y, dy, algo=algo, out=torch.full_like(x, float("nan")))
            ref = R.softmax_backward(y, dy, algo=algo)
            assert_close(dx, ref, torch.float32, what=f"{algo} backward")
    finally:
        KS.FUSED_MAX, KS.SPLIT_BLOCK, KS.MAX_SPLITS = saved


def _err(fn, name):
    with pytest.raises(rtdnn.BadParamError, match=name):
        fn()


def test_validation_errors():
    x = make((2, 3, 4))
    out = torch.full((2, 3, 4), 5.0)
    _err(lambda: rtdnn.softmax_forward(x, algo="exact", out=out), "algo")
    _err(lambda: rtdnn.softmax_forward(x, mode="spatial", out=out), "mode")
    _err(lambda: rtdnn.softmax_forward(x[0, 0, 0]), "x.dim")  # 0-d (1-D is one row)
    _err(lambda: rtdnn.softmax_forward(x, out=out[:, :2]), "out.shape")
    _err(lambda: rtdnn.softmax_forward(x, beta=2.0), "beta")
    _err(lambda: rtdnn.softmax_backward(x, x[:1], out=out), "dy.shape")
    _err(lambda: rtdnn.softmax_backward(x, x.half(), out=out), "dy.dtype")
    assert torch.equal(out, torch.full((2, 3, 4), 5.0))


@pytest.mark.parametrize(
    "ours,theirs,shape",
    [
        (rnn.Softmax(dim=1), torch.nn.Softmax(dim=1), (2, 4, 3, 2)),
        (rnn.Softmax(dim=-1), torch.nn.Softmax(dim=-1), (2, 3, 5)),
        (rnn.Softmax(), torch.nn.Softmax(), (7,)),
        (rnn.LogSoftmax(dim=0), torch.nn.LogSoftmax(dim=0), (4, 3)),
        (rnn.LogSoftmax(dim=2), torch.nn.LogSoftmax(dim=2), (2, 3, 4, 2)),
    ],
    ids=str,
)
def test_modules_match_torch_with_autograd(ours, theirs, shape):
    x = make(shape, scale=2.0).requires_grad_()
    y1, y2 = ours(x), theirs(x)
    g = torch.randn(y2.shape)
    (d1,) = torch.autograd.grad(y1, x, g)
    (d2,) = torch.autograd.grad(y2, x, g)
    assert_close(y1, y2.double(), torch.float32)
    assert_close(d1, d2.double(), torch.float32)


def test_torch_compile_fullgraph():
    m = rnn.LogSoftmax(dim=-1)
    compiled = torch.compile(m, backend="eager", fullgraph=True)
    x = torch.randn(3, 6)
    assert_close(compiled(x), torch.log_softmax(x.double(), -1), torch.float32)
