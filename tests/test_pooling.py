import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
# The shared helpers sit beside this file (importable whether or not tests/ is a package).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _prims_util import assert_close, make, out_for  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import rtdnn  # noqa: E402
import rtdnn.nn as rnn  # noqa: E402
from rtdnn import reference as R  # noqa: E402

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
LAYOUTS = ("contiguous", "channels_last", "strided")


@st.composite
def problems(draw):
    nd = draw(st.integers(1, 3))
    limit = {1: 9, 2: 7, 3: 5}[nd]
    window, stride, padding, dilation, size = [], [], [], [], []
    for _ in range(nd):
        k = draw(st.integers(1, 3))
        d = draw(st.integers(1, 2))
        p = draw(st.integers(0, k // 2))
        s = draw(st.integers(1, 3))
        lo = max(1, d * (k - 1) + 1 - 2 * p)
        window.append(k)
        dilation.append(d)
        padding.append(p)
        stride.append(s)
        size.append(draw(st.integers(lo, max(lo, limit))))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), *size)
    return dict(
        shape=shape,
        window=tuple(window),
        stride=tuple(stride),
        padding=tuple(padding),
        dilation=tuple(dilation),
        ceil_mode=draw(st.booleans()),
    )


@SETTINGS
@given(
    prob=problems(),
    mode=st.sampled_from(["max", "avg_include_pad", "avg_exclude_pad"]),
    dtype=st.sampled_from([torch.float32, torch.float16]),
    layout=st.sampled_from(LAYOUTS),
    alpha=st.sampled_from([1.0, 0.5]),
    beta=st.sampled_from([0.0, -1.5]),
    use_out=st.booleans(),
    ties=st.booleans(),
)
def test_forward_backward_match_reference(prob, mode, dtype, layout, alpha, beta, use_out, ties):
    shape = prob.pop("shape")
    # Small integers make ties: max pooling must route them like PyTorch.
    fill = (lambda s: torch.randint(-2, 3, s).float()) if ties else None
    x = make(shape, dtype, layout, fill=fill)
    y0 = rtdnn.pooling_forward(x, mode, **prob)
    beta = beta if use_out else 0.0
    out, prior = out_for(y0.shape, x, beta, layout) if use_out else (None, None)
    y = rtdnn.pooling_forward(x, mode, alpha=alpha, beta=beta, out=out, **prob)
    ref = R.pooling_forward(x, mode, alpha=alpha, beta=beta, out=prior, **prob)
    assert_close(y, ref, dtype, what="forward")
    if out is None and layout == "channels_last" and x.dim() > 3 and x.shape[1] > 1:
        assert rtdnn.core.channels_last(y) or y.shape[1] == 1
    dy = make(y0.shape, dtype, layout)
    out, prior = out_for(shape, x, beta, layout) if use_out else (None, None)
    dx = rtdnn.pooling_backward(dy, x, y0, mode, alpha=alpha, beta=beta, out=out, **prob)
    ref = R.pooling_backward(dy, x, y0, mode, alpha=alpha, beta=beta, out=prior, **prob)
    assert_close(dx, ref, dtype, what="backward")


def test_reference_matches_torch():
    x = make((2, 3, 7, 6))
    for cm in (False, True):
        for mode, inc in (("avg_include_pad", True), ("avg_exclude_pad", False)):
            ours = R.pooling_forward(x, mode, 3, stride=2, padding=1, ceil_mode=cm)
            theirs = F.avg_pool2d(x.double(), 3, 2, 1, ceil_mode=cm, count_include_pad=inc)
            assert_close(ours, theirs, torch.float64, tol=1e-12)
        ours = R.pooling_forward(x, "max", 3, stride=2, padding=1, dilation=2, ceil_mode=cm)
        theirs = F.max_pool2d(x.double(), 3, 2, 1, 2, ceil_mode=cm)
        assert_close(ours, theirs, torch.float64, tol=1e-12)


def test_max_backward_routes_ties_like_torch_exactly():
    x = torch.zeros(1, 2, 6, 6)
    x[0, 1, 2:4, 2:4] = 1.0  # a block of equal maxima shared by overlapping windows
    xr = x.clone().requires_grad_()
    y = F.max_pool2d(xr, 3, 2, 1)
    dy = torch.arange(y.numel(), dtype=torch.float32).reshape(y.shape) + 1
    (ref,) = torch.autograd.grad(y, xr, dy)
    dx = rtdnn.pooling_backward(dy, x, None, "max", 3, stride=2, padding=1)
    assert torch.equal(dx, ref)
    dx2 = rtdnn.pooling_backward(dy, x, None, "max", 3, stride=2, padding=1)
    assert torch.equal(dx, dx2)  # deterministic


def test_max_window_of_padding_only_passes_no_gradient(gen):
    """Dilation can put every tap of a window in the padding: its output is -inf and it passes
    no gradient (torch's own max_pool routes one to an element outside the window)."""
    x = torch.randn(2, 3, 3, 1, generator=gen)
    conv = dict(stride=1, padding=(0, 1), dilation=(1, 2))
    y = rtdnn.pooling_forward(x, "max", (1, 2), **conv)
    assert torch.equal(y, torch.full_like(y, float("-inf")))
    dy = torch.randn(y.shape, generator=gen)
    dx = rtdnn.pooling_backward(dy, x, y, "max", (1, 2), **conv)
    assert torch.equal(dx, torch.zeros_like(dx))
    assert torch.equal(R.pooling_backward(dy, x, y, "max", (1, 2), **conv), dx.double())


def _without_nan(t: torch.Tensor) -> torch.Tensor:
    return torch.where(t.isnan(), 0.0, t)


@pytest.mark.parametrize("channels", [72, 300])
@pytest.mark.parametrize("mode", ["max", "avg_include_pad", "avg_exclude_pad"])
def test_channels_last_wide_channels(channels, mode):
    # Several channel blocks per program and a channel tail. For max pooling: ties, a NaN and
    # windows whose inside is all -inf (their argmax is the first tap inside).
    fill = lambda s: torch.randint(-2, 3, s).float()  # noqa: E731
    x = make((1, channels, 5, 6), layout="channels_last", fill=fill)
    if mode == "max":
        x[0, :7, :2, :2] = float("-inf")
        x[0, 9, 3, 3] = float("nan")
    kw = dict(stride=2, padding=1)
    out, _ = out_for((1, channels, 3, 3), x, 0.0, "channels_last")
    y = rtdnn.pooling_forward(x, mode, 3, out=out, **kw)
    ref = R.pooling_forward(x, mode, 3, **kw)
    assert torch.equal(y.isnan(), ref.isnan())
    assert_close(_without_nan(y), _without_nan(ref), torch.float32, what="forward")
    dy = make(y.shape, layout="channels_last")
    out, _ = out_for(x.shape, x, 0.0, "channels_last")
    dx = rtdnn.pooling_backward(dy, x, None, mode, 3, out=out, **kw)
    assert_close(dx, R.pooling_backward(dy, x, None, mode, 3, **kw), torch.float32)


@SETTINGS
@given(
    nd=st.integers(1, 3),
    data=st.data(),
    dtype=st.sampled_from([torch.float32, torch.float16]),
    layout=st.sampled_from(LAYOUTS),
    beta=st.sampled_from([0.0, 2.0]),
)
def test_adaptive_avg_pool_matches_reference(nd, data, dtype, layout, beta):
    size = data.draw(st.lists(st.integers(1, 7 if nd < 3 else 4), min_size=nd, max_size=nd))
    osize = tuple(data.draw(st.integers(1, s + 1)) for s in size)
    shape = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3)), *size)
    x = make(shape, dtype, layout)
    out, prior = out_for((*shape[:2], *osize), x, beta, layout)
    y = rtdnn.adaptive_avg_pool(x, osize, alpha=0.5, beta=beta, out=out)
    assert_close(y, R.adaptive_avg_pool(x, osize, alpha=0.5, beta=beta, out=prior), dtype)
    dy = make(y.shape, dtype, layout)
    out, prior = out_for(shape, x, beta, layout)
    dx = rtdnn.adaptive_avg_pool_backward(dy, shape, alpha=0.5, beta=beta, out=out)
    ref = R.adaptive_avg_pool_backward(dy, shape, alpha=0.5, beta=beta, out=prior)
    assert_close(dx, ref, dtype)


def test_global_average_pooling_is_a_reduction():
    x = make((2, 5, 4, 3), layout="channels_last")
    y = rtdnn.adaptive_avg_pool(x, 1)
    assert y.shape == (2, 5, 1, 1)
    assert_close(y, x.double().mean((2, 3), keepdim=True), torch.float32)


def _err(fn, name):
    with pytest.raises(rtdnn.BadParamError, match=name):
        fn()


def test_validation_errors():
    x = make((1, 2, 5, 5))
    out = torch.full((1, 2, 2, 2), 3.0)
    _err(lambda: rtdnn.pooling_forward(x, "min", 2), "mode")
    _err(lambda: rtdnn.pooling_forward(x[0, 0], "max", 2), "x.dim")
    _err(lambda: rtdnn.pooling_forward(x, "max", (2, 2, 2)), "window")
    _err(lambda: rtdnn.pooling_forward(x, "max", 0), "window")
    _err(lambda: rtdnn.pooling_forward(x, "max", 2, stride=0, out=out), "stride")
    _err(lambda: rtdnn.pooling_forward(x, "max", 2, padding=2, out=out), "padding")
    _err(lambda: rtdnn.pooling_forward(x, "max", 2, dilation=0, out=out), "dilation")
    _err(lambda: rtdnn.pooling_forward(x, "max", 2, ceil_mode=1, out=out), "ceil_mode")
    _err(lambda: rtdnn.pooling_forward(x, "max", 6, out=out), "window")
    _err(lambda: rtdnn.pooling_forward(x, "max", 3, out=out), "out.shape")
    _err(lambda: rtdnn.pooling_forward(x, "max", 2, beta=1.0), "beta")
    dy = make((1, 2, 2, 2))
    _err(lambda: rtdnn.pooling_backward(dy, x, None, "max", 3, out=out), "dy.shape")
    _err(lambda: rtdnn.pooling_backward(dy.half(), x, None, "max", 2), "dy.dtype")
    _err(lambda: rtdnn.pooling_backward(dy, x, dy[:, :1], "max", 2), "y.shape")
    _err(lambda: rtdnn.adaptive_avg_pool(x, (2, 0), out=out), "output_size")
    _err(lambda: rtdnn.adaptive_avg_pool_backward(dy, (1, 3, 5, 5)), "x_shape")
    assert torch.equal(out, torch.full((1, 2, 2, 2), 3.0))


MODULES = [
    (rnn.MaxPool1d(3, 2, 1), torch.nn.MaxPool1d(3, 2, 1), (2, 3, 9)),
    (rnn.MaxPool2d(3, 2, 1, dilation=1), torch.nn.MaxPool2d(3, 2, 1), (2, 3, 7, 6)),
    (rnn.MaxPool3d(2, ceil_mode=True), torch.nn.MaxPool3d(2, ceil_mode=True), (1, 2, 5, 4, 5)),
    (rnn.AvgPool1d(3, 2, 1), torch.nn.AvgPool1d(3, 2, 1), (2, 3, 9)),
    (
        rnn.AvgPool2d(3, 2, 1, count_include_pad=False),
        torch.nn.AvgPool2d(3, 2, 1, count_include_pad=False),
        (2, 3, 7, 6),
    ),
    (rnn.AvgPool3d(2, ceil_mode=True), torch.nn.AvgPool3d(2, ceil_mode=True), (1, 2, 5, 4, 5)),
    (rnn.AdaptiveAvgPool1d(4), torch.nn.AdaptiveAvgPool1d(4), (2, 3, 9)),
    (rnn.AdaptiveAvgPool2d((3, None)), torch.nn.AdaptiveAvgPool2d((3, None)), (2, 3, 7, 5)),
    (rnn.AdaptiveAvgPool3d(1), torch.nn.AdaptiveAvgPool3d(1), (1, 2, 3, 4, 5)),
]


@pytest.mark.parametrize("ours,theirs,shape", MODULES, ids=lambda m: type(m).__name__)
def test_modules_match_torch_with_autograd(ours, theirs, shape):
    x = make(shape, layout="channels_last").requires_grad_()
    y1, y2 = ours(x), theirs(x)
    g = torch.randn(y2.shape)
    (d1,) = torch.autograd.grad(y1, x, g)
    (d2,) = torch.autograd.grad(y2, x, g)
    assert_close(y1, y2.double(), torch.float32)
    assert_close(d1, d2.double(), torch.float32)


def test_unsupported_module_options():
    with pytest.raises(rtdnn.NotSupportedError):
        rnn.MaxPool2d(2, return_indices=True)(torch.randn(1, 1, 4, 4))
    with pytest.raises(rtdnn.NotSupportedError):
        rnn.AvgPool2d(2, divisor_override=3)(torch.randn(1, 1, 4, 4))


def test_torch_compile_fullgraph():
    m = torch.nn.Sequential(rnn.MaxPool2d(2), rnn.AdaptiveAvgPool2d(1))
    compiled = torch.compile(m, backend="eager", fullgraph=True)
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    y = compiled(x)
    y.sum().backward()
    assert_close(y, m(x.detach()).double(), torch.float32)
    assert x.grad is not None
