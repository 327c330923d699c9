import os

os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _norm_helpers import LAYOUTS, check, make, scaling, term_size  # noqa: E402
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import rtdnn  # noqa: E402
import rtdnn.nn as rnn  # noqa: E402
from rtdnn import reference as R  # noqa: E402
from rtdnn.core.handle import stream_counters  # noqa: E402

SETTINGS = dict(
    deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow],
    max_examples=20,
)  # fmt: skip


@st.composite
def bn_problems(draw):
    ndim = draw(st.integers(2, 5))
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 5)))
    shape += tuple(draw(st.integers(1, 4)) for _ in range(ndim - 2))
    return dict(
        shape=shape,
        mode=draw(st.sampled_from(["spatial", "spatial", "per_activation"])),
        dtype=draw(st.sampled_from([torch.float32, torch.float32, torch.float16])),
        layout=draw(st.sampled_from(LAYOUTS)),
        affine=draw(st.sampled_from(["both", "weight", "none"])),
        residual=draw(st.booleans()),
        activation=draw(st.sampled_from(["identity", "relu", "silu", "hardswish"])),
        scale=draw(st.sampled_from(["plain", "nan_out", "alpha_beta"])),
    )


def _params(p, x):
    pshape = (x.shape[1],) if p["mode"] == "spatial" else tuple(x.shape[1:])
    w = make(pshape, torch.float32, seed=1) if p["affine"] != "none" else None
    b = make(pshape, torch.float32, seed=2) if p["affine"] == "both" else None
    z = make(x.shape, x.dtype, p["layout"], seed=3) if p["residual"] else None
    return pshape, w, b, z


def _count(p):
    shape = p["shape"]
    return (
        shape[0]
        if p["mode"] == "per_activation"
        else shape[0] * int(torch.tensor(shape[2:]).prod())
    )


@settings(**SETTINGS)
@given(bn_problems())
def test_training_forward_matches_reference(p):
    assume(_count(p) >= 2)
    x = make(p["shape"], p["dtype"], p["layout"], shift=0.5)
    pshape, w, b, z = _params(p, x)
    rm, rv = make(pshape, seed=4), make(pshape, seed=5).abs() + 0.5
    rm0, rv0 = rm.clone(), rv.clone()
    alpha, beta, out, prior = scaling(p["scale"], x)
    y, mean, invstd = rtdnn.batch_norm_forward_training(
        x, w, b, running_mean=rm, running_var=rv, momentum=0.3, eps=1e-3, mode=p["mode"], z=z,
        activation=p["activation"], alpha=alpha, beta=beta, out=out,
    )  # fmt: skip
    ref = R.batch_norm_forward_training(
        x, w, b, running_mean=rm0, running_var=rv0, momentum=0.3, eps=1e-3, mode=p["mode"], z=z,
        activation=p["activation"], alpha=alpha, beta=beta, out=prior,
    )  # fmt: skip
    if out is not None:
        assert y is out
    if out is None and p["layout"] in ("contiguous", "channels_last"):
        # Same memory format: equal strides on every dim that has more than one element.
        pairs = zip(y.stride(), x.stride(), x.shape, strict=True)
        assert all(a == b for a, b, n in pairs if n > 1)
    check(y, ref[0], p["dtype"], what="y")
    check(mean, ref[1], what="mean", factor=10)
    check(invstd, ref[2], what="invstd", factor=10)
    check(rm, ref[3], what="running_mean", factor=10)
    check(rv, ref[4], what="running_var", factor=10)
    assert mean.dtype == invstd.dtype == torch.float32 and tuple(mean.shape) == pshape


@settings(**SETTINGS)
@given(bn_problems())
def test_inference_forward_matches_reference(p):
    x = make(p["shape"], p["dtype"], p["layout"])
    pshape, w, b, z = _params(p, x)
    rm, rv = make(pshape, seed=4), make(pshape, seed=5).abs() + 0.5
    alpha, beta, out, prior = scaling(p["scale"], x)
    y = rtdnn.batch_norm_forward_inference(
        x, w, b, rm, rv, eps=1e-3, mode=p["mode"], z=z, activation=p["activation"],
        alpha=alpha, beta=beta, out=out,
    )  # fmt: skip
    ref = R.batch_norm_forward_inference(
        x, w, b, rm, rv, eps=1e-3, mode=p["mode"], z=z, activation=p["activation"], alpha=alpha,
        beta=beta, out=prior,
    )  # fmt: skip
    check(y, ref, p["dtype"], what="y")


@settings(**SETTINGS)
@given(bn_problems(), st.booleans())
def test_backward_matches_reference(p, training):
    assume(_count(p) >= 2)
    x = make(p["shape"], p["dtype"], p["layout"])
    pshape, w, b, z = _params(p, x)
    dy = make(p["shape"], p["dtype"], p["layout"], seed=7)
    _, mean, invstd, _, _ = R.batch_norm_forward_training(x, mode=p["mode"], eps=1e-3)
    mean, invstd = mean.float(), invstd.float()
    alpha, beta, out, prior = scaling(p["scale"], x)
    dx, dw, db, dz = rtdnn.batch_norm_backward(
        dy, x, mean, invstd, w, b, z=z, activation=p["activation"], mode=p["mode"],
        training=training, alpha=alpha, beta=beta, out=out,
    )  # fmt: skip
    ref = R.batch_norm_backward(
        dy, x, mean, invstd, w, b, z=z, activation=p["activation"], mode=p["mode"],
        training=training, alpha=alpha, beta=beta, out=prior,
    )  # fmt: skip
    # dx of training-mode batch norm is a difference of nearly equal terms: a few more ulps.
    check(dx, ref[0], p["dtype"], factor=4, what="dx", floor=term_size(dy, invstd.max(), w))
    check(dw, ref[1], factor=10, what="dweight")
    check(db, ref[2], factor=10, what="dbias")
    assert dw.dtype == torch.float32 and tuple(dw.shape) == pshape
    if z is None:
        assert dz is None
    else:
        check(dz, ref[3], p["dtype"], what="dz")


def test_large_mean_small_variance_float32():
    """mean 1e3, std 1: E[x^2] - E[x]^2 would lose ~6 of float32's 7 digits here. The kernels
    accumulate x - shift (the first value of each channel) and normalize with
    (x - shift) - mean, so even y keeps full float32 precision."""
    x = make((4, 3, 16, 16), layout="channels_last", shift=1e3, seed=11)
    # eps must be > 0; 1e-30 vanishes next to the variance in float32.
    y, mean, invstd = rtdnn.batch_norm_forward_training(x, eps=1e-30)
    ref = R.batch_norm_forward_training(x, eps=1e-30)
    assert R.rel_error(invstd.double() ** -2, ref[2] ** -2) < 1e-6
    assert R.rel_error(mean, ref[1]) < 1e-7
    assert R.rel_error(y, ref[0]) < 1e-6
    dy = make(x.shape, layout="channels_last", seed=12)
    dx, dw, db, _ = rtdnn.batch_norm_backward(dy, x, mean, invstd)
    rdx, rdw, rdb, _ = R.batch_norm_backward(dy, x, ref[1], ref[2])
    # The backward reads the saved float32 mean: its rounding (ulp(1e3) = 6e-5, against a
    # spread of 1) bounds dx and dweight to about 3e-5.
    assert R.rel_error(dx, rdx) < 1e-4 and R.rel_error(dw, rdw) < 1e-4
    assert R.rel_error(db, rdb) < 1e-6


@pytest.mark.parametrize(
    "changes",
    [
        dict(max_slices=64),  # one tile per slice
        dict(max_slices=2),  # many tiles per slice, the last one partial
        dict(max_slices=64, stats_programs_per_slot=4),  # more statistics slices than apply's
        dict(max_slices=64, sums_programs_per_slot=4),  # more partial-sum slices than apply's
        dict(max_slices=2, stats_stages=4),  # a deeper pipeline of the statistics loop
        dict(max_slices=3, programs_per_slot=4),  # several kept blocks and slices
        dict(lane_bytes=64, split_elements=64, warp_elements=16),  # wider kept blocks
    ],
)
def test_split_plans_channels_last(norm_tile_policy, changes):
    """Batch norm's split path on channels-last data (the kept dim is the contiguous one)
    for several slicings: the partial passes walk their tiles with the next one in flight,
    the apply passes walk slices and tiles in reverse."""
    norm_tile_policy(**changes)
    x = make((3, 24, 5, 7), layout="channels_last", shift=0.5, seed=31)
    dy = make(x.shape, layout="channels_last", seed=32)
    z = make(x.shape, layout="channels_last", seed=33)
    w, b = make((24,), seed=34), make((24,), seed=35)
    rm, rv = make((24,), seed=36), make((24,), seed=37).abs() + 0.5
    rm0, rv0 = rm.clone(), rv.clone()
    args = dict(z=z, activation="relu", momentum=0.3)
    y, mean, invstd = rtdnn.batch_norm_forward_training(
        x, w, b, running_mean=rm, running_var=rv, **args
    )
    ref = R.batch_norm_forward_training(x, w, b, running_mean=rm0, running_var=rv0, **args)
    check(y, ref[0], what="y")
    check(mean, ref[1], what="mean", factor=10)
    check(rm, ref[3], what="running mean", factor=10)
    check(rv, ref[4], what="running var", factor=10)
    got = rtdnn.batch_norm_backward(dy, x, mean, invstd, w, b, z=z, activation="relu")
    want = R.batch_norm_backward(dy, x, mean, invstd, w, b, z=z, activation="relu")
    for name, a, r in zip(("dx", "dw", "db", "dz"), got, want, strict=True):
        check(a, r, what=name, factor=10)
    # The last program of each kept block finished the statistics and left its arrival
    # counter at zero for the next call.
    assert not stream_counters(x.device, 64).any()


@pytest.mark.parametrize("channels", [3, 24, 256, 2048])
@pytest.mark.parametrize("per_slot", [1, 2, 8])
def test_resident_slicing_never_exceeds_its_programs(channels, per_slot):
    """A cooperative launch's grid (batch norm's fused passes) holds no more programs than
    `per_slot` a parallel slot (where every kept block gets a slice), so that all fit at once;
    the usual slicing rounds up instead."""
    from rtdnn.algos import norm as engine

    x = torch.empty(16, channels, 28, 28).to(memory_format=torch.channels_last)
    pol = engine.GPU_POLICY
    g = engine.geometry(x.shape, (1,), [x.stride()])
    t = engine.split_tiles(g, 2, pol)
    kept_blocks = -(-g.kept // t.block_k)
    slots = engine.parallel_slots("cpu")
    slices, per_slice = engine._slices(g, t, x.device, pol, per_slot, resident=True)
    assert kept_blocks * slices <= max(kept_blocks, per_slot * slots)
    assert slices * per_slice >= g.for_tiles(t.block_r).tiles  # every tile in a slice


def test_results_are_deterministic():
    x = make((3, 4, 5, 6), layout="channels_last", seed=21)
    dy = make((3, 4, 5, 6), layout="channels_last", seed=22)
    first = rtdnn.batch_norm_forward_training(x)
    second = rtdnn.batch_norm_forward_training(x)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    g1 = rtdnn.batch_norm_backward(dy, x, first[1], first[2])
    g2 = rtdnn.batch_norm_backward(dy, x, first[1], first[2])
    for a, b in zip(g1[:3], g2[:3], strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("activation", ["relu", "silu", "hardswish"])
def test_fused_add_activation_against_torch_autograd(activation):
    x = make((2, 3, 4, 4), layout="channels_last").requires_grad_()
    z = make((2, 3, 4, 4), seed=1).requires_grad_()
    w = make((3,), seed=2).requires_grad_()
    b = make((3,), seed=3).requires_grad_()
    y = rtdnn.batch_norm(x, None, None, w, b, True, z=z, activation=activation)
    dy = make(y.shape, seed=4)
    y.backward(dy)
    leaves = [t.detach().double().requires_grad_() for t in (x, z, w, b)]
    act = {"relu": F.relu, "silu": F.silu, "hardswish": F.hardswish}[activation]
    ref = act(F.batch_norm(leaves[0], None, None, leaves[2], leaves[3], True) + leaves[1])
    ref.backward(dy.double())
    check(y, ref.detach())
    for ours, theirs in zip((x, z, w, b), leaves, strict=True):
        check(ours.grad, theirs.grad, factor=4)


# -- modules ----------------------------------------------------------------------------------

MODULES = [
    (rnn.BatchNorm1d, torch.nn.BatchNorm1d, (4, 3)),
    (rnn.BatchNorm1d, torch.nn.BatchNorm1d, (2, 3, 5)),
    (rnn.BatchNorm2d, torch.nn.BatchNorm2d, (2, 3, 3, 4)),
    (rnn.BatchNorm3d, torch.nn.BatchNorm3d, (2, 3, 2, 2, 3)),
]


@pytest.mark.parametrize("ours_cls, torch_cls, shape", MODULES)
@pytest.mark.parametrize("momentum", [0.1, None])
def test_module_matches_torch_over_steps(ours_cls, torch_cls, shape, momentum):
    theirs = torch_cls(3, momentum=momentum).double()
    with torch.no_grad():
        theirs.weight.copy_(make((3,), seed=1))
        theirs.bias.copy_(make((3,), seed=2))
    ours = ours_cls(3, momentum=momentum)
    ours.load_state_dict(
        {k: v.float() if v.is_floating_point() else v for k, v in theirs.state_dict().items()}
    )
    for step in range(3):
        x = make(shape, layout="channels_last", seed=step, scale=2.0, shift=step)
        xo, xt = x.clone().requires_grad_(), x.double().requires_grad_()
        yo, yt = ours(xo), theirs(xt)
        dy = make(shape, seed=10 + step)
        yo.backward(dy)
        yt.backward(dy.double())
        check(yo, yt.detach(), what=f"y step {step}")
        check(xo.grad, xt.grad, factor=4, what=f"dx step {step}")
    check(ours.weight.grad, theirs.weight.grad, factor=10)
    check(ours.bias.grad, theirs.bias.grad, factor=10)
    check(ours.running_mean, theirs.running_mean, factor=10)
    check(ours.running_var, theirs.running_var, factor=10)
    assert int(ours.num_batches_tracked) == int(theirs.num_batches_tracked) == 3
    ours.eval()
    theirs.eval()
    x = make(shape, seed=30)
    xo, xt = x.clone().requires_grad_(), x.double().requires_grad_()
    yo, yt = ours(xo), theirs(xt)
    yo.sum().backward()
    yt.sum().backward()
    check(yo, yt.detach(), what="eval y")
    check(xo.grad, xt.grad, what="eval dx")


@pytest.mark.parametrize("affine", [True, False])
def test_module_without_running_stats(affine):
    theirs = torch.nn.BatchNorm2d(3, affine=affine, track_running_stats=False)
    ours = rnn.BatchNorm2d(3, affine=affine, track_running_stats=False)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    x = make((2, 3, 2, 3), seed=5)
    for mode in ("train", "eval"):
        getattr(ours, mode)()
        getattr(theirs, mode)()
        with torch.no_grad():
            check(ours(x), theirs(x).double(), what=mode)


def test_state_dict_round_trips_both_ways():
    theirs = torch.nn.BatchNorm2d(4)
    theirs(make((2, 4, 3, 3)))
    ours = rnn.BatchNorm2d(4)
    ours.load_state_dict(theirs.state_dict())
    ours(make((2, 4, 3, 3), seed=1))
    back = torch.nn.BatchNorm2d(4)
    back.load_state_dict(ours.state_dict())
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for k, v in ours.state_dict().items():
        assert torch.equal(back.state_dict()[k], v)
    assert int(back.num_batches_tracked) == 2
