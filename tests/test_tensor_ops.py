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
from rtdnn import autograd as ag  # noqa: E402
from rtdnn import reference as R  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # interpreter loop bounds
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
LAYOUTS = ("contiguous", "channels_last", "strided", "reversed")
shapes = st.lists(st.integers(1, 5), min_size=1, max_size=5).map(tuple)


@st.composite
def broadcast_of(draw, shape):
    """A shape broadcastable to `shape`: some dims set to 1, some leading dims dropped."""
    b = [1 if draw(st.booleans()) else s for s in shape]
    return tuple(b[draw(st.integers(0, len(b) - 1)) :])


@SETTINGS
@given(
    data=st.data(),
    shape=shapes,
    op=st.sampled_from(["add", "mul", "min", "max", "sqrt", "not"]),
    dtype=st.sampled_from([torch.float32, torch.float16]),
    layout=st.sampled_from(LAYOUTS),
    beta=st.sampled_from([0.0, 0.5]),
)
def test_op_tensor_matches_reference(data, shape, op, dtype, layout, beta):
    a = make(shape, dtype, layout)
    if op == "sqrt":
        a = a.abs()
    b = make(data.draw(broadcast_of(shape)), dtype, data.draw(st.sampled_from(LAYOUTS)))
    out, prior = out_for(shape, a, beta, layout)
    y = rtdnn.op_tensor(a, b, op, alpha1=1.5, alpha2=-0.5, beta=beta, out=out)
    ref = R.op_tensor(a, b, op, alpha1=1.5, alpha2=-0.5, beta=beta, out=prior)
    assert_close(y, ref, dtype)


@SETTINGS
@given(data=st.data(), shape=shapes, layout=st.sampled_from(LAYOUTS))
def test_add_scale_set(data, shape, layout):
    c = make(shape, layout=layout)
    a = make(data.draw(broadcast_of(shape)))
    expected = R.add_tensor(a, c, alpha=2.0, beta=0.5)
    assert rtdnn.add_tensor(a, c, alpha=2.0, beta=0.5) is c
    assert_close(c, expected, torch.float32)
    rtdnn.scale_tensor(c, -3.0)
    assert_close(c, -3.0 * expected, torch.float32)
    rtdnn.set_tensor(c, 0.25)
    assert torch.equal(c, torch.full(shape, 0.25))


@SETTINGS
@given(
    shape=st.lists(st.integers(1, 5), min_size=3, max_size=5).map(tuple),
    src=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    dst=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
    layout=st.sampled_from(LAYOUTS),
    out_layout=st.sampled_from(LAYOUTS),
    beta=st.sampled_from([0.0, 2.0]),
)
def test_transform_tensor(shape, src, dst, layout, out_layout, beta):
    x = make(shape, src, layout)
    out, prior = out_for(shape, x.to(dst), beta, out_layout)
    y = rtdnn.transform_tensor(x, out=out, alpha=0.5, beta=beta)
    assert_close(y, R.transform_tensor(x, out=prior, alpha=0.5, beta=beta), dst)
    if len(shape) in (4, 5):
        fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
        y = rtdnn.transform_tensor(x, dtype=dst, memory_format=fmt)
        assert y.dtype == dst and y.is_contiguous(memory_format=fmt)
        assert_close(y, x.double(), dst)


@SETTINGS
@given(
    data=st.data(),
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple),
    op=st.sampled_from(["add", "mul", "min", "max", "amax", "avg", "norm1", "norm2"]),
    dtype=st.sampled_from([torch.float32, torch.float16]),
    layout=st.sampled_from(LAYOUTS),
    keepdim=st.booleans(),
    beta=st.sampled_from([0.0, 1.0]),
)
def test_reduce_tensor_matches_reference(data, shape, op, dtype, layout, keepdim, beta):
    nd = len(shape)
    dims = data.draw(st.lists(st.integers(0, nd - 1), min_size=1, max_size=nd, unique=True))
    ties = op in ("min", "max", "amax") and data.draw(st.booleans())
    fill = (lambda s: torch.randint(-2, 3, s).float()) if ties else None
    x = make(shape, dtype, layout, fill=fill, scale=0.5 if op == "mul" else 1.0)
    indices = op in ("min", "max", "amax")
    ref = R.reduce_tensor(x, op, dims, keepdim=keepdim, indices=indices, alpha=2.0)
    ref_v = ref[0] if indices else ref
    out, prior = out_for(ref_v.shape, x, beta)
    got = rtdnn.reduce_tensor(
        x, op, dims, keepdim=keepdim, indices=indices, alpha=2.0, beta=beta, out=out
    )
    got_v = got[0] if indices else got
    expected = ref_v + beta * prior.double() if beta else ref_v
    assert_close(got_v, expected, dtype)
    if indices:
        assert torch.equal(got[1], ref[1])


def test_reduce_splits_long_reductions():
    x = make((3, 3000))
    for op in ("add", "max", "norm2"):
        got = rtdnn.reduce_tensor(x, op, indices=op == "max")
        ref = R.reduce_tensor(x, op, indices=op == "max")
        assert_close(got[0] if op == "max" else got, ref[0] if op == "max" else ref, x.dtype)
        if op == "max":
            assert torch.equal(got[1], ref[1])


@pytest.mark.parametrize("dims", [(0, 2, 3), (2, 3)])
def test_reduce_channels_last_keeps_channels(dims):
    # Kept channels contiguous, reduced pixels strided: the [BLOCK_R, BLOCK_K] tile, a
    # channel tail, ties, NaN and (over N, H, W) partial sums split over programs.
    fill = lambda s: torch.randint(-2, 3, s).float()  # noqa: E731
    x = make((3, 70, 9, 10), layout="channels_last", fill=fill)
    x[1, 5, 2, 3] = float("nan")
    for op in ("add", "max", "min", "amax", "avg", "norm2", "mul"):
        indexed = op in ("max", "min", "amax")
        xs = x * 0.25 + 1.0 if op == "mul" else x
        out, _ = out_for((1 if 0 in dims else 3, 70, 1, 1), xs, 0.0)
        got = rtdnn.reduce_tensor(xs, op, dims, indices=indexed, out=out)
        ref = R.reduce_tensor(xs, op, dims, indices=indexed)
        if indexed:
            assert torch.equal(got[1], ref[1]), op
            got, ref = got[0], ref[0]
        assert_close(got.nan_to_num(7.0), ref.nan_to_num(7.0), x.dtype, what=op)
        assert torch.equal(got.isnan(), ref.isnan()), op


def test_reduce_loops_over_many_tiles_per_split():
    # Each split walks several tiles (double-buffered loop, an odd tail), with ties and a NaN
    # late in the walk.
    fill = lambda s: torch.randint(-3, 4, s).float()  # noqa: E731
    x = make((4, 40, 33, 33), layout="channels_last", fill=fill)
    x[3, 7, 30, 31] = float("nan")
    for op in ("add", "max", "min", "norm1"):
        indexed = op in ("max", "min")
        got = rtdnn.reduce_tensor(x, op, (0, 2, 3), indices=indexed)
        ref = R.reduce_tensor(x, op, (0, 2, 3), indices=indexed)
        if indexed:
            assert torch.equal(got[1], ref[1]), op
            got, ref = got[0], ref[0]
        assert_close(got.nan_to_num(7.0), ref.nan_to_num(7.0), x.dtype, what=op)
        assert torch.equal(got.isnan(), ref.isnan()), op
    # Value-only max keeps NaN without tracking indices.
    assert torch.equal(
        rtdnn.reduce_tensor(x, "max", (0, 2, 3)).isnan().flatten(), torch.arange(40) == 7
    )


def test_reduce_nan_wins_like_torch():
    x = torch.tensor([[1.0, float("nan"), 3.0, float("nan")], [4.0, 2.0, 4.0, 0.0]])
    v, i = rtdnn.reduce_tensor(x, "max", 1, keepdim=False, indices=True)
    rv, ri = torch.max(x, 1)
    assert torch.isnan(v[0]) and i.tolist() == ri.tolist() and v[1] == rv[1]


def _err(fn, name):
    with pytest.raises(rtdnn.BadParamError, match=name):
        fn()


def test_validation_errors():
    a = make((2, 3))
    out = torch.full((2, 3), 4.0)
    _err(lambda: rtdnn.op_tensor(a, a, "div", out=out), "op")
    _err(lambda: rtdnn.op_tensor(a, None, "add", out=out), "b")
    _err(lambda: rtdnn.op_tensor(a, make((3, 3)), "add", out=out), "b.shape")
    _err(lambda: rtdnn.op_tensor(a, a, "add", alpha1="x", out=out), "alpha1")
    _err(lambda: rtdnn.op_tensor(a, a.half(), "add", out=out), "b.dtype")
    _err(lambda: rtdnn.add_tensor(make((3, 3)), out), "a.shape")
    _err(lambda: rtdnn.add_tensor(a, torch.empty(1, 3).expand(2, 3)), "c")
    _err(lambda: rtdnn.scale_tensor(out, "2"), "alpha")
    _err(lambda: rtdnn.set_tensor(torch.empty(1, 3).expand(2, 3), 1.0), "y")
    _err(lambda: rtdnn.transform_tensor(a, dtype=torch.int32), "dtype")
    _err(lambda: rtdnn.transform_tensor(a, memory_format=torch.channels_last), "memory_format")
    _err(lambda: rtdnn.transform_tensor(a, out=out, dtype=torch.half), "dtype")
    _err(lambda: rtdnn.transform_tensor(a, out=torch.empty(3, 2)), "out.shape")
    _err(lambda: rtdnn.reduce_tensor(a, "median"), "op")
    _err(lambda: rtdnn.reduce_tensor(a, "add", 2), "dims")
    _err(lambda: rtdnn.reduce_tensor(a, "add", (0, 0)), "dims")
    _err(lambda: rtdnn.reduce_tensor(a, "add", indices=True), "indices")
    _err(lambda: rtdnn.reduce_tensor(a, "add", 1, out=out), "out.shape")
    assert torch.equal(out, torch.full((2, 3), 4.0))


def test_custom_ops_autograd():
    a = make((2, 3, 4)).requires_grad_()
    b = make((3, 1)).requires_grad_()
    for op in ("add", "mul", "max"):
        y = ag.op_tensor(a, b, op, 1.5, 0.5)
        u, v = 1.5 * a, 0.5 * b
        ref = {"add": u + v, "mul": u * v, "max": torch.maximum(u, v)}[op]
        g = torch.randn(y.shape)
        got = torch.autograd.grad(y, (a, b), g)
        want = torch.autograd.grad(ref, (a, b), g)
        for x1, x2 in zip(got, want, strict=True):
            assert_close(x1, x2.double(), torch.float32)
    for op in ("add", "avg", "max", "norm2"):
        y = ag.reduce_tensor(a, op, [0, 2])
        x64 = a.detach().double().requires_grad_()
        ref = R.reduce_tensor(x64, op, (0, 2)) if op != "max" else x64.amax((0, 2), keepdim=True)
        if op in ("add", "avg", "norm2"):
            ref = {"add": x64.sum((0, 2), keepdim=True), "avg": x64.mean((0, 2), keepdim=True),
                   "norm2": x64.pow(2).sum((0, 2), keepdim=True).sqrt()}[op]  # fmt: skip
        g = torch.randn(y.shape)
        (d1,) = torch.autograd.grad(y, a, g)
        (d2,) = torch.autograd.grad(ref, x64, g.double())
        assert_close(d1, d2, torch.float32)
    x = make((2, 3, 4, 5)).requires_grad_()
    y = ag.transform_tensor(x, torch.float16, True)
    assert y.dtype == torch.float16 and y.is_contiguous(memory_format=torch.channels_last)
    (d,) = torch.autograd.grad(y, x, torch.ones_like(y))
    assert d.dtype == torch.float32 and torch.equal(d, torch.ones_like(x))
