"""Linear layers and the fused cross-entropy against float64 references, on the CPU."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from conftest import MATH, assert_close, poisoned
from hypothesis import given, settings
from hypothesis import strategies as st

import rtdnn
import rtdnn.nn as rnn
from rtdnn.core.handle import stream_counters


def _f64(t):
    return t.detach().double()


@settings(max_examples=12, deadline=None)
@given(
    lead=st.lists(st.integers(1, 4), min_size=1, max_size=2),
    k=st.integers(1, 40),
    n=st.integers(1, 20),
    dtype=st.sampled_from([torch.float32, torch.float16]),
    transposed=st.booleans(),
    relu=st.booleans(),
    beta=st.sampled_from([0.0, 0.5]),
)
def test_linear_all_directions(lead, k, n, dtype, transposed, relu, beta):
    x = torch.randn(*lead, k).to(dtype)
    w = torch.randn(k, n).to(dtype).T if transposed else torch.randn(n, k).to(dtype)
    bias = torch.randn(n).to(dtype)
    out = poisoned((*lead, n), dtype) if beta == 0 else torch.randn(*lead, n).to(dtype)
    ref = 0.5 * (_f64(x) @ _f64(w).T) + _f64(bias)
    if beta:
        ref = ref + beta * _f64(out)
    if relu:
        ref = ref.clamp_min(0)
    act = "relu" if relu else None
    y = rtdnn.linear(x, w, bias, activation=act, alpha=0.5, beta=beta, out=out, math=MATH)
    assert y is out
    assert_close(y, ref, dtype)
    dy = torch.randn(*lead, n).to(dtype)
    assert_close(rtdnn.linear_backward_data(dy, w, math=MATH), _f64(dy) @ _f64(w), dtype)
    dw_ref = _f64(dy).reshape(-1, n).T @ _f64(x).reshape(-1, k)
    assert_close(rtdnn.linear_backward_weight(x, dy, math=MATH), dw_ref, dtype)
    assert_close(rtdnn.linear_backward_bias(dy), _f64(dy).reshape(-1, n).sum(0), dtype)


def test_linear_long_reduction_splits():
    """700 rows: the weight gradient splits its reduction; the sum must still be exact."""
    x, dy = torch.randn(700, 9), torch.randn(700, 5)
    first = rtdnn.linear_backward_weight(x, dy, math=MATH)
    assert_close(first, _f64(dy).T @ _f64(x))
    # The last split of each tile summed the partials in a fixed order and reset its counter.
    assert torch.equal(rtdnn.linear_backward_weight(x, dy, math=MATH), first)
    assert not stream_counters(x.device, 64).any()


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: rtdnn.linear(torch.randn(2, 3), torch.randn(4, 5)), "x.shape[-1]"),
        (lambda: rtdnn.linear(torch.randn(2, 3), torch.randn(4, 3).double()), "dtype"),
        (lambda: rtdnn.linear(torch.randn(2, 3), torch.randn(4, 3), torch.randn(5)), "bias"),
        (lambda: rtdnn.linear(torch.randn(2, 3), torch.randn(4, 3), activation="x"), "activation"),
        (lambda: rtdnn.linear(torch.randn(2, 3), torch.randn(4, 3), beta=1.0), "beta"),
    ],
)
def test_linear_errors(call, name):
    with pytest.raises(rtdnn.BadParamError, match=re.escape(name)):
        call()


def test_nn_linear_autograd_and_compile():
    torch.manual_seed(0)
    ref = torch.nn.Linear(6, 4)
    mine = rnn.Linear(6, 4)
    mine.load_state_dict(ref.state_dict())
    x1 = torch.randn(3, 6, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_(True)
    ref(x1).square().sum().backward()
    with torch.backends.cudnn.flags(allow_tf32=False):
        mine(x2).square().sum().backward()
        compiled = torch.compile(mine, fullgraph=True, backend="eager")
        assert_close(compiled(x2.detach()), _f64(ref(x1.detach())))
    assert_close(x2.grad, _f64(x1.grad))
    assert_close(mine.weight.grad, _f64(ref.weight.grad))
    assert_close(mine.bias.grad, _f64(ref.bias.grad))


@pytest.mark.parametrize("grads", ["x,w,b", "x", "w,b"])
@pytest.mark.parametrize("relu", [False, True])
def test_linear_backward_roads_agree(grads, relu):
    """The backward's two roads: without a graph to build both GEMMs go through one prepared
    call (ops.linear.linear_backward), with create_graph=True through the three custom ops.
    Gradients against float64, for each set of inputs that asks for one, twice (the second
    call finds the prepared call)."""
    torch.manual_seed(0)
    act = "relu" if relu else None
    for create_graph in (False, True, False):
        x = torch.randn(2, 3, 9, requires_grad="x" in grads)
        w = torch.randn(5, 9, requires_grad="w" in grads)
        b = torch.randn(5, requires_grad="b" in grads)
        dy = torch.randn(2, 3, 5)
        y = rtdnn.linear(x, w, b, activation=act)
        got = torch.autograd.grad(y, [t for t in (x, w, b) if t.requires_grad], dy,
                                  create_graph=create_graph)  # fmt: skip
        xs = [_f64(t).requires_grad_(t.requires_grad) for t in (x, w, b)]
        ref = F.linear(*xs)
        ref = F.relu(ref) if relu else ref
        want = torch.autograd.grad(ref, [t for t in xs if t.requires_grad], dy.double())
        for g, r in zip(got, want, strict=True):
            assert_close(g.detach(), r, torch.float32)


@settings(max_examples=12, deadline=None)
@given(
    shape=st.sampled_from([(5, 7), (4, 3, 2), (2, 6, 2, 3), (3, 1100)]),
    reduction=st.sampled_from(["mean", "sum", "none"]),
    smoothing=st.sampled_from([0.0, 0.1]),
    weighted=st.booleans(),
    channels_last=st.booleans(),
)
def test_cross_entropy_against_torch(shape, reduction, smoothing, weighted, channels_last):
    x = torch.randn(shape)
    if channels_last and x.dim() > 2:
        x = x.movedim(1, -1).contiguous().movedim(-1, 1)
    t = torch.randint(0, shape[1], (shape[0], *shape[2:]))
    t.view(-1)[0] = -100  # ignored
    w = torch.rand(shape[1]) + 0.5 if weighted else None
    x_ref = _f64(x).requires_grad_(True)
    ref = F.cross_entropy(
        x_ref, t, None if w is None else _f64(w), label_smoothing=smoothing, reduction=reduction
    )
    x_mine = x.clone().requires_grad_(True)
    loss_fn = rnn.CrossEntropyLoss(weight=w, label_smoothing=smoothing, reduction=reduction)
    loss = loss_fn(x_mine, t)
    assert_close(loss, ref.detach())
    g = torch.randn(ref.shape)
    ref.backward(_f64(g))
    loss.backward(g)
    assert_close(x_mine.grad, x_ref.grad)


def test_cross_entropy_errors():
    x = torch.randn(4, 3)
    with pytest.raises(rtdnn.BadParamError, match="target.dtype"):
        rtdnn.cross_entropy(x, torch.zeros(4, dtype=torch.int32))
    with pytest.raises(rtdnn.BadParamError, match="target.shape"):
        rtdnn.cross_entropy(x, torch.zeros(5, dtype=torch.int64))
    with pytest.raises(rtdnn.BadParamError, match="reduction"):
        rtdnn.cross_entropy(x, torch.zeros(4, dtype=torch.int64), reduction="avg")
