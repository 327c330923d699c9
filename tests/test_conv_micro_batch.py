"""Micro-batched convolution: the conv functions' micro_batch= and plan_conv.

On the CPU the interpreter's timings are noise, so most tests replace select.find with a table
of made-up times (the real workspaces) that forces a plan of several micro-batches with
different algorithms; the kernels that run are the real ones. The result must equal the
undivided call's: forward and backward-data slice the batch, backward-filter adds the slices'
gradients with alpha and beta applied as once.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import MATH, assert_close, make_tensor, poisoned_like

import rtdnn
from rtdnn import reference, select
from rtdnn.algos import ALGORITHMS
from rtdnn.ops import conv_plan
from rtdnn.select import AlgoPerf

N = 5
GEOMETRY = dict(stride=2, padding=1)
X_SHAPE, W_SHAPE = (N, 3, 6, 6), (4, 3, 3, 3)
Y_SHAPE = (N, 4, 3, 3)


def forced_find(fast: dict[int, str]):
    """A stand-in for select.find: every supported algorithm with its real workspace, at
    1 ms for the algorithm `fast` names for the problem's batch size and 100 ms otherwise."""

    def find(p, tensors):
        return [
            AlgoPerf(a.name, 1.0 if fast.get(p.batch) == a.name else 100.0,
                     a.workspace_bytes(p), a.deterministic(p))
            for a in ALGORITHMS.values()
            if a.supports(p) is None
        ]  # fmt: skip

    return find


# The two fast (size, algorithm) pairs per direction: A at the first size, B at the second.
ALGOS = {
    "forward": ("GEMM", "IMPLICIT_GEMM"),
    "backward_data": ("IMPLICIT_GEMM", "GEMM"),
    "backward_filter": ("IMPLICIT_GEMM_SPLIT_K", "GEMM"),
}
# With only those at 1 ms, the best plans of 5 have three micro-batches: 3 + 1 + 1 ("all"),
# 2 + 2 + 1 ("powerOfTwo", which has no 3).
SIZES = {"all": (3, 1), "powerOfTwo": (2, 1)}
EXPECTED = {"all": (0, 1, 1), "powerOfTwo": (0, 0, 1)}


@pytest.fixture
def forced(monkeypatch):
    """Plans made here are forgotten afterwards; returns a function forcing the plan of a
    direction and policy, which returns the plan's micro-batches."""
    monkeypatch.setattr(conv_plan, "_plans", {})

    def force(direction: str, policy: str = "all"):
        algos, sizes = ALGOS[direction], SIZES[policy]
        monkeypatch.setattr(select, "find", forced_find(dict(zip(sizes, algos, strict=True))))
        return tuple((sizes[i], algos[i]) for i in EXPECTED[policy])

    return force


def call(direction: str, a, b, out, alpha, beta, **kw):
    args = dict(GEOMETRY, alpha=alpha, beta=beta, out=out, math=MATH, **kw)
    if direction == "forward":
        return rtdnn.conv_forward(a, b, **args)
    if direction == "backward_data":
        return rtdnn.conv_backward_data(a, b, X_SHAPE, **args)
    return rtdnn.conv_backward_filter(a, b, W_SHAPE, **args)


def operands(direction: str, layout: str):
    x = make_tensor(X_SHAPE, torch.float32, layout)
    w = make_tensor(W_SHAPE, torch.float32)
    dy = make_tensor(Y_SHAPE, torch.float32, layout)
    ref = dict(GEOMETRY)
    if direction == "forward":
        return (x, w), Y_SHAPE, lambda **s: reference.conv_forward(x, w, **ref, **s)
    if direction == "backward_data":
        return (
            (dy, w),
            X_SHAPE,
            lambda **s: reference.conv_backward_data(dy, w, X_SHAPE, **ref, **s),
        )
    return (x, dy), W_SHAPE, lambda **s: reference.conv_backward_filter(x, dy, W_SHAPE, **ref, **s)


@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_filter"])
@pytest.mark.parametrize("policy", ["all", "powerOfTwo"])
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (0.7, 0.0), (-1.5, 0.5)])
def test_micro_batched_equals_undivided(forced, direction, policy, alpha, beta):
    torch.manual_seed(1)
    micro_batches = forced(direction, policy)
    (a, b), out_shape, ref = operands(direction, "contiguous")
    prior = make_tensor(out_shape, torch.float32)
    out = prior.clone() if beta else poisoned_like(prior)
    got = call(direction, a, b, out, alpha, beta, micro_batch=policy)
    assert got is out
    (plan,) = conv_plan._plans.values()
    assert plan.micro_batches == micro_batches
    assert_close(got, ref(alpha=alpha, beta=beta, out=prior))
    undivided = call(direction, a, b, prior.clone() if beta else None, alpha, beta)
    assert_close(got, undivided.double())


@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_filter"])
def test_channels_last_and_a_plan_reused(forced, direction):
    """Slices of channels-last tensors; the second call runs the remembered plan."""
    torch.manual_seed(2)
    micro_batches = forced(direction)
    (a, b), _, ref = operands(direction, "channels_last")
    first = call(direction, a, b, None, 1.0, 0.0, micro_batch="all")
    again = call(direction, a, b, None, 1.0, 0.0, micro_batch="all")
    (plan,) = conv_plan._plans.values()
    assert plan.micro_batches == micro_batches
    assert torch.equal(first, again)
    assert_close(again, ref())


def test_forward_with_bias_and_unbatched(forced):
    torch.manual_seed(3)
    forced("forward")
    x, w, bias = make_tensor(X_SHAPE, torch.float32), make_tensor(W_SHAPE, torch.float32), None
    bias = torch.randn(4)
    y = rtdnn.conv_forward(x, w, bias, **GEOMETRY, math=MATH, micro_batch="all")
    assert_close(y, reference.conv_forward(x, w, bias, **GEOMETRY))
    y1 = rtdnn.conv_forward(x[0], w, bias, **GEOMETRY, math=MATH, micro_batch="all")
    assert_close(y1, reference.conv_forward(x[:1], w, bias, **GEOMETRY)[0])


def test_autograd_passes_micro_batch_to_every_direction(forced, monkeypatch):
    torch.manual_seed(4)
    fast = {3: "GEMM", 1: "IMPLICIT_GEMM"}
    monkeypatch.setattr(select, "find", forced_find(fast))
    x = make_tensor(X_SHAPE, torch.float32).requires_grad_()
    w = make_tensor(W_SHAPE, torch.float32).requires_grad_()
    y = rtdnn.conv_forward(x, w, **GEOMETRY, math=MATH, micro_batch="all")
    dy = torch.randn_like(y)
    y.backward(dy)
    planned = {p.direction.value: plan.micro_batches for (p, *_), plan in conv_plan._plans.items()}
    expected = ((3, "GEMM"), (1, "IMPLICIT_GEMM"), (1, "IMPLICIT_GEMM"))
    assert planned == {d: expected for d in ("forward", "backward_data", "backward_filter")}
    assert_close(x.grad, reference.conv_backward_data(dy, w.detach(), X_SHAPE, **GEOMETRY))
    assert_close(w.grad, reference.conv_backward_filter(x.detach(), dy, W_SHAPE, **GEOMETRY))


def test_a_workspace_limit_is_respected(forced, monkeypatch):
    """GEMM (which needs workspace) is fastest at every size; under a limit of 0 the plan
    keeps to algorithms that need none."""
    monkeypatch.setattr(select, "find", forced_find({b: "GEMM" for b in range(1, N + 1)}))
    x, w = make_tensor(X_SHAPE, torch.float32), make_tensor(W_SHAPE, torch.float32)
    plan = rtdnn.plan_conv(x, w, **GEOMETRY, math=MATH, workspace_limit=0)
    assert plan.workspace_bytes == 0 and plan.time_ms == 100.0
    assert sum(b for b, _ in plan.micro_batches) == N
    plan = rtdnn.plan_conv(x, w, **GEOMETRY, math=MATH)
    assert plan.micro_batches == ((N, "GEMM"),) and plan.time_ms == 1.0
    y = rtdnn.conv_forward(x, w, **GEOMETRY, math=MATH, micro_batch="all", workspace_limit=0)
    assert_close(y, reference.conv_forward(x, w, **GEOMETRY))


def test_undivided_never_plans(monkeypatch):
    """The default runs as before: nothing is measured or planned."""

    def fail(*a, **k):
        raise AssertionError("planned")

    monkeypatch.setattr(conv_plan, "plan_for", fail)
    monkeypatch.setattr(conv_plan, "run_micro_batched", fail)
    x, w = make_tensor(X_SHAPE, torch.float32), make_tensor(W_SHAPE, torch.float32)
    y = rtdnn.conv_forward(x, w, **GEOMETRY, math=MATH)
    y2 = rtdnn.conv_forward(x, w, **GEOMETRY, math=MATH, micro_batch="undivided")
    assert torch.equal(y, y2)


@pytest.mark.slow
def test_plan_conv_measures_every_size():
    """Real timings (noise on the CPU): a plan of the allowed sizes, adding up to N, whose
    workspace is what its algorithms need at those sizes."""
    torch.manual_seed(5)
    x, w = make_tensor((3, 2, 4, 4), torch.float32), make_tensor((2, 2, 3, 3), torch.float32)
    plan = rtdnn.plan_conv(x, w, direction="backward_filter", padding=1, policy="powerOfTwo")
    assert sum(b for b, _ in plan.micro_batches) == 3
    assert {b for b, _ in plan.micro_batches} <= {1, 2, 3}
    assert all(a in ALGORITHMS for _, a in plan.micro_batches)
    assert math.isfinite(plan.time_ms) and plan.time_ms > 0
    assert plan.workspace_bytes >= 0


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_filter"])
@pytest.mark.parametrize("bad", ["ALL", "power_of_two", None, 2])
def test_unknown_micro_batch_is_refused(direction, bad):
    (a, b), out_shape, _ = operands(direction, "contiguous")
    out = torch.full(out_shape, math.nan)
    with pytest.raises(rtdnn.BadParamError, match="micro_batch"):
        call(direction, a, b, out, 1.0, 0.0, micro_batch=bad)
    assert torch.isnan(out).all(), "written"


def test_micro_batch_needs_algo_auto():
    x, w = make_tensor(X_SHAPE, torch.float32), make_tensor(W_SHAPE, torch.float32)
    with pytest.raises(rtdnn.BadParamError, match="algo='GEMM'"):
        rtdnn.conv_forward(x, w, **GEOMETRY, algo="GEMM", micro_batch="all")


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(policy="ALL"), "policy"),
        (dict(policy=None), "policy"),
        (dict(workspace_limit=-1), "workspace_limit"),
        (dict(workspace_limit=1.5), "workspace_limit"),
        (dict(workspace_limit=True), "workspace_limit"),
        (dict(direction="sideways"), "direction"),
        (dict(stride=0), "stride"),
    ],
)
def test_plan_conv_refuses_bad_input(monkeypatch, kwargs, name):
    monkeypatch.setattr(select, "find", forced_find({}))
    x, w = make_tensor(X_SHAPE, torch.float32), make_tensor(W_SHAPE, torch.float32)
    with pytest.raises(rtdnn.BadParamError, match=name):
        rtdnn.plan_conv(x, w, **kwargs)


def test_the_custom_op_with_micro_batch_passes_opcheck(forced):
    """The dispatcher's road (torch.compile, fake tensors) with the trailing micro_batch."""
    from rtdnn import autograd

    forced("forward")
    x = make_tensor(X_SHAPE, torch.float32).requires_grad_()
    w = make_tensor(W_SHAPE, torch.float32).requires_grad_()
    conv = ([2, 2], [1, 1], [1, 1], 1, "cross_correlation", "auto", None, MATH, 1.0, "all")
    torch.library.opcheck(autograd.conv_forward.op, (x, w, None, *conv))
