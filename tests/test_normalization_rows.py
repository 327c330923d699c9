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
def row_problems(draw):
    lead = tuple(draw(st.integers(1, 4)) for _ in range(draw(st.integers(0, 2))))
    norm = tuple(draw(st.integers(1, 24)) for _ in range(draw(st.integers(1, 2))))
    return dict(
        shape=lead + norm,
        normalized=norm,
        dtype=draw(st.sampled_from([torch.float32, torch.float32, torch.float16])),
        layout=draw(st.sampled_from(LAYOUTS)),
        affine=draw(st.sampled_from(["both", "weight", "none"])),
        scale=draw(st.sampled_from(["plain", "nan_out", "alpha_beta"])),
        shift=draw(st.sampled_from([0.0, 3.0])),
    )


def _params(p):
    w = make(p["normalized"], seed=1) if p["affine"] != "none" else None
    b = make(p["normalized"], seed=2) if p["affine"] == "both" else None
    return w, b


@settings(**SETTINGS)
@given(row_problems())
def test_layer_norm_matches_reference(p):
    x = make(p["shape"], p["dtype"], p["layout"], shift=p["shift"])
    w, b = _params(p)
    alpha, beta, out, prior = scaling(p["scale"], x)
    y, mean, rstd = rtdnn.layer_norm_forward(
        x, p["normalized"], w, b, eps=1e-4, alpha=alpha, beta=beta, out=out
    )
    ref = R.layer_norm_forward(x, p["normalized"], w, b, eps=1e-4, alpha=alpha, beta=beta,
                               out=prior)  # fmt: skip
    check(y, ref[0], p["dtype"], what="y")
    check(mean, ref[1], factor=10, what="mean")
    check(rstd, ref[2], factor=10, what="rstd")
    dy = make(p["shape"], p["dtype"], p["layout"], seed=5)
    alpha, beta, out, prior = scaling(p["scale"], x)
    dx, dw, db = rtdnn.layer_norm_backward(
        dy, x, p["normalized"], mean, rstd, w, alpha=alpha, beta=beta, out=out
    )
    ref = R.layer_norm_backward(dy, x, p["normalized"], mean, rstd, w, alpha=alpha, beta=beta,
                                out=prior)  # fmt: skip
    floor = term_size(dy, rstd.max(), w)
    check(dx, ref[0], p["dtype"], factor=4, what="dx", floor=floor)
    check(dw, ref[1], factor=10, what="dweight")
    check(db, ref[2], factor=10, what="dbias")
    assert dw.dtype == torch.float32 and dw.shape == tuple(p["normalized"])


@settings(**SETTINGS)
@given(row_problems())
def test_rms_norm_matches_reference(p):
    x = make(p["shape"], p["dtype"], p["layout"], shift=p["shift"])
    w, _ = _params(p)
    alpha, beta, out, prior = scaling(p["scale"], x)
    y, rstd = rtdnn.rms_norm_forward(x, p["normalized"], w, alpha=alpha, beta=beta, out=out)
    ref = R.rms_norm_forward(x, p["normalized"], w, alpha=alpha, beta=beta, out=prior)
    check(y, ref[0], p["dtype"], what="y")
    check(rstd, ref[1], factor=10, what="rstd")
    dy = make(p["shape"], p["dtype"], p["layout"], seed=5)
    dx, dw = rtdnn.rms_norm_backward(dy, x, p["normalized"], rstd, w)
    ref = R.rms_norm_backward(dy, x, p["normalized"], rstd, w)
    check(dx, ref[0], p["dtype"], factor=4, what="dx", floor=term_size(dy, rstd.max(), w))
    check(dw, ref[1], factor=10, what="dweight")


@pytest.mark.parametrize(
    "changes, shape",
    [
        (dict(), (5, 12)),  # one tile per row, rows packed
        (dict(), (3, 2, 40)),  # rows longer than a tile: two walks
        # two reduced dims: walked tiles
        (dict(row_elements=16, row_pack=16, row_pack_16bit=16), (7, 3, 5)),
        (dict(force_path="split"), (3, 40)),  # few long rows: split statistics
        (dict(max_block_r=8), (40, 6)),  # several kept blocks per backward program
        # one row per tile: 8 backward programs walking 8 blocks each, 8 partial dweight rows
        (dict(row_pack=4, max_block_r=4), (64, 3)),
    ],
)
def test_layer_norm_paths(norm_tile_policy, changes, shape):
    norm_tile_policy(**changes)
    norm = shape[-2:] if len(shape) == 3 and changes.get("row_elements") else shape[-1:]
    x = make(shape, shift=2.0)
    w, b = make(norm, seed=1), make(norm, seed=2)
    y, mean, rstd = rtdnn.layer_norm_forward(x, norm, w, b)
    ref = R.layer_norm_forward(x, norm, w, b)
    check(y, ref[0], what="y")
    dy = make(shape, seed=3)
    for rms in (False, True):
        if rms:
            y, rstd = rtdnn.rms_norm_forward(x, norm, w, eps=1e-5)
            check(y, R.rms_norm_forward(x, norm, w, eps=1e-5)[0], what="rms y")
            got = rtdnn.rms_norm_backward(dy, x, norm, rstd, w)
            want = R.rms_norm_backward(dy, x, norm, rstd, w)
        else:
            got = rtdnn.layer_norm_backward(dy, x, norm, mean, rstd, w)
            want = R.layer_norm_backward(dy, x, norm, mean, rstd, w)
        for a, b_, what in zip(got, want, ("dx", "dw", "db"), strict=False):
            check(a, b_, factor=10, what=f"{what} rms={rms}")


def test_large_mean_small_variance_float32():
    x = make((6, 300), shift=1e3, seed=3)
    # eps must be > 0; 1e-30 vanishes next to the variance in float32.
    y, mean, rstd = rtdnn.layer_norm_forward(x, 300, eps=1e-30)
    ref = R.layer_norm_forward(x, 300, eps=1e-30)
    assert R.rel_error(rstd.double() ** -2, ref[2] ** -2) < 1e-6
    assert R.rel_error(y, ref[0]) < 1e-6
    x = make((6, 12), shift=1e3, seed=4)  # one tile per row
    y, mean, rstd = rtdnn.layer_norm_forward(x, 12, eps=1e-30)
    ref = R.layer_norm_forward(x, 12, eps=1e-30)
    assert R.rel_error(rstd.double() ** -2, ref[2] ** -2) < 1e-6
    assert R.rel_error(y, ref[0]) < 1e-6


def test_param_grads_can_be_skipped():
    x, dy = make((3, 8)), make((3, 8), seed=1)
    _, mean, rstd = rtdnn.layer_norm_forward(x, 8)
    dx, dw, db = rtdnn.layer_norm_backward(dy, x, 8, mean, rstd, param_grads=False)
    assert dw is None and db is None
    check(dx, R.layer_norm_backward(dy, x, 8, mean, rstd)[0])


@pytest.mark.parametrize(
    "ours, theirs, shape",
    [
        (rnn.LayerNorm(6), torch.nn.LayerNorm(6), (2, 3, 6)),
        (rnn.LayerNorm([3, 4], bias=False), torch.nn.LayerNorm([3, 4], bias=False), (2, 3, 4)),
        (
            rnn.LayerNorm(5, elementwise_affine=False),
            torch.nn.LayerNorm(5, elementwise_affine=False),
            (4, 5),
        ),
        (rnn.RMSNorm(6), torch.nn.RMSNorm(6), (2, 3, 6)),
        (rnn.RMSNorm([2, 3], eps=1e-3), torch.nn.RMSNorm([2, 3], eps=1e-3), (4, 2, 3)),
    ],
)
def test_modules_match_torch(ours, theirs, shape):
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(make(p.shape, seed=p.numel()))
    ours.load_state_dict(theirs.state_dict())
    assert list(ours.state_dict()) == list(theirs.state_dict())
    x = make(shape, layout="strided", shift=1.0)
    xo, xt = x.clone().requires_grad_(), x.double().requires_grad_()
    theirs = theirs.double()
    yo, yt = ours(xo), theirs(xt)
    dy = make(shape, seed=7)
    yo.backward(dy)
    yt.backward(dy.double())
    check(yo, yt.detach())
    check(xo.grad, xt.grad, factor=4)
    for po, pt in zip(ours.parameters(), theirs.parameters(), strict=True):
        check(po.grad, pt.grad, factor=10)


def test_functional_matches_torch():
    x = make((3, 7), shift=1.0).requires_grad_()
    w = make((7,), seed=1).requires_grad_()
    y = rtdnn.layer_norm(x, 7, w, None, 1e-5)
    check(y, F.layer_norm(x.double(), (7,), w.double(), None, 1e-5).detach())
    y = rtdnn.rms_norm(x, [7], w)
    check(y, F.rms_norm(x.double(), (7,), w.double(), torch.finfo(torch.float32).eps).detach())
