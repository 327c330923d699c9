import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _norm_helpers import LAYOUTS, check, make, scaling, term_size  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import rtdnn  # noqa: E402
import rtdnn.nn as rnn  # noqa: E402
from rtdnn import reference as R  # noqa: E402

SETTINGS = dict(
    deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow],
    max_examples=20,
)  # fmt: skip


@st.composite
def group_problems(draw, min_spatial=0):
    ndim = draw(st.integers(2 + min_spatial, 5))
    groups = draw(st.integers(1, 3))
    channels = groups * draw(st.integers(1, 3))
    shape = (draw(st.integers(1, 3)), channels)
    shape += tuple(draw(st.integers(1, 5)) for _ in range(ndim - 2))
    return dict(
        shape=shape,
        groups=groups,
        dtype=draw(st.sampled_from([torch.float32, torch.float32, torch.float16])),
        layout=draw(st.sampled_from(LAYOUTS)),
        affine=draw(st.sampled_from(["both", "weight", "none"])),
        scale=draw(st.sampled_from(["plain", "nan_out", "alpha_beta"])),
    )


def _params(p):
    c = p["shape"][1]
    w = make((c,), seed=1) if p["affine"] != "none" else None
    b = make((c,), seed=2) if p["affine"] == "both" else None
    return w, b


def _run(p, instance: bool):
    x = make(p["shape"], p["dtype"], p["layout"], shift=1.5)
    w, b = _params(p)
    g = p["shape"][1] if instance else p["groups"]
    alpha, beta, out, prior = scaling(p["scale"], x)
    if instance:
        y, mean, rstd = rtdnn.instance_norm_forward(
            x, w, b, eps=1e-4, alpha=alpha, beta=beta, out=out
        )
    else:
        y, mean, rstd = rtdnn.group_norm_forward(
            x, g, w, b, eps=1e-4, alpha=alpha, beta=beta, out=out
        )
    ref = R.group_norm_forward(x, g, w, b, eps=1e-4, alpha=alpha, beta=beta, out=prior)
    check(y, ref[0], p["dtype"], what="y")
    check(mean, ref[1], factor=10, what="mean")
    check(rstd, ref[2], factor=10, what="rstd")
    assert mean.shape == (x.shape[0], g) and mean.dtype == torch.float32
    dy = make(p["shape"], p["dtype"], p["layout"], seed=5)
    alpha, beta, out, prior = scaling(p["scale"], x)
    if instance:
        dx, dw, db = rtdnn.instance_norm_backward(
            dy, x, mean, rstd, w, alpha=alpha, beta=beta, out=out
        )
    else:
        dx, dw, db = rtdnn.group_norm_backward(
            dy, x, g, mean, rstd, w, alpha=alpha, beta=beta, out=out
        )
    ref = R.group_norm_backward(dy, x, g, mean, rstd, w, alpha=alpha, beta=beta, out=prior)
    check(dx, ref[0], p["dtype"], factor=4, what="dx", floor=term_size(dy, rstd.max(), w))
    check(dw, ref[1], factor=10, what="dweight")
    check(db, ref[2], factor=10, what="dbias")


@settings(**SETTINGS)
@given(group_problems())
def test_group_norm_matches_reference(p):
    _run(p, instance=False)


@settings(**SETTINGS)
@given(group_problems(min_spatial=1))
def test_instance_norm_matches_reference(p):
    _run(p, instance=True)


def test_group_norm_large_mean_small_variance_float32():
    x = make((2, 4, 6, 6), layout="channels_last", shift=1e3, seed=8)
    # eps must be > 0; 1e-30 vanishes next to the variance in float32.
    y, mean, rstd = rtdnn.group_norm_forward(x, 2, eps=1e-30)
    ref = R.group_norm_forward(x, 2, eps=1e-30)
    assert R.rel_error(rstd.double() ** -2, ref[2] ** -2) < 1e-6
    assert R.rel_error(y, ref[0]) < 1e-6


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_group_norm_module_matches_torch(affine, layout):
    theirs = torch.nn.GroupNorm(2, 4, affine=affine).double()
    if affine:
        with torch.no_grad():
            theirs.weight.copy_(make((4,), seed=1))
            theirs.bias.copy_(make((4,), seed=2))
    ours = rnn.GroupNorm(2, 4, affine=affine)
    ours.load_state_dict(theirs.state_dict())
    x = make((2, 4, 3, 3), layout=layout, shift=0.5)
    xo, xt = x.clone().requires_grad_(), x.double().requires_grad_()
    yo, yt = ours(xo), theirs(xt)
    dy = make(x.shape, seed=3)
    yo.backward(dy)
    yt.backward(dy.double())
    check(yo, yt.detach())
    check(xo.grad, xt.grad, factor=4)
    for po, pt in zip(ours.parameters(), theirs.parameters(), strict=True):
        check(po.grad, pt.grad, factor=10)


@pytest.mark.parametrize(
    "ours_cls, theirs_cls, shape",
    [
        (rnn.InstanceNorm1d, torch.nn.InstanceNorm1d, (2, 3, 5)),
        (rnn.InstanceNorm1d, torch.nn.InstanceNorm1d, (3, 5)),  # unbatched
        (rnn.InstanceNorm2d, torch.nn.InstanceNorm2d, (2, 3, 3, 4)),
        (rnn.InstanceNorm3d, torch.nn.InstanceNorm3d, (2, 3, 2, 2, 3)),
    ],
)
@pytest.mark.parametrize("track", [False, True])
def test_instance_norm_modules_match_torch(ours_cls, theirs_cls, shape, track):
    theirs = theirs_cls(3, affine=True, track_running_stats=track).double()
    with torch.no_grad():
        theirs.weight.copy_(make((3,), seed=1))
        theirs.bias.copy_(make((3,), seed=2))
    ours = ours_cls(3, affine=True, track_running_stats=track)
    ours.load_state_dict(
        {k: v.float() if v.is_floating_point() else v for k, v in theirs.state_dict().items()}
    )
    for step in range(2):
        x = make(shape, shift=step, scale=2.0, seed=step)
        xo, xt = x.clone().requires_grad_(), x.double().requires_grad_()
        yo, yt = ours(xo), theirs(xt)
        yo.backward(make(shape, seed=9))
        yt.backward(make(shape, seed=9).double())
        check(yo, yt.detach(), what=f"y step {step}")
        check(xo.grad, xt.grad, factor=4, what=f"dx step {step}")
    if track:
        # Running variances come from the float32 1/std, hence the looser bound.
        check(ours.running_mean, theirs.running_mean, factor=10)
        check(ours.running_var, theirs.running_var, factor=100)
    ours.eval()
    theirs.eval()
    x = make(shape, seed=20)
    with torch.no_grad():
        check(ours(x), theirs(x.double()), factor=100 if track else 1, what="eval")


def test_functional_group_and_instance_norm_match_torch():
    x = make((2, 6, 4), shift=1.0)
    w, b = make((6,), seed=1), make((6,), seed=2)
    check(rtdnn.group_norm(x, 3, w, b), F.group_norm(x.double(), 3, w.double(), b.double()))
    check(
        rtdnn.instance_norm(x, weight=w, bias=b),
        F.instance_norm(x.double(), None, None, w.double(), b.double()),
    )


def test_group_norm_dx_with_many_channels_per_group():
    # C/G > 1 and several spatial positions: the per-(n, c) sums are combined per group.
    x = make((3, 8, 5), layout="permuted", shift=2.0)
    dy = make((3, 8, 5), seed=4)
    w = make((8,), seed=5)
    _, mean, rstd = rtdnn.group_norm_forward(x, 2, w)
    got = rtdnn.group_norm_backward(dy, x, 2, mean, rstd, w)
    want = R.group_norm_backward(dy, x, 2, mean, rstd, w)
    for a, b, f in zip(got, want, (4, 10, 10), strict=True):
        check(a, b, factor=f)


def test_rejects_channels_not_divisible_by_groups():
    with pytest.raises(rtdnn.BadParamError, match="num_groups"):
        rtdnn.group_norm_forward(make((2, 6, 3)), 4)
