"""Prepared calls (core.prepared): a function checks and plans once per call signature, and
later calls with that signature still get fresh results and the checks that the signature does
not fix (scalars, overlaps)."""

import importlib
import math

import pytest
import torch

import rtdnn
from rtdnn import ops
from rtdnn.core import byte_spans, spans_apart
from rtdnn.core.prepared import PreparedCalls, signature

linear_module = importlib.import_module("rtdnn.ops.linear")


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def test_signature_separates_shapes_strides_and_flag_types():
    a = torch.randn(4, 6)
    assert signature("f", (a,), True) == signature("f", (torch.randn(4, 6),), True)
    assert signature("f", (a,), True) != signature("f", (a.t().contiguous().t(),), True)
    assert signature("f", (a,), True) != signature("f", (a,), 1)
    assert hash(signature("f", (a, None), [1, 2]))  # a list flag is kept as a tuple
    assert signature("f", (a, 3)) is None  # not a tensor: checked every time
    assert signature("f", (a,), "relu") != signature("f", (a,), "identity")


def test_spans_apart_judges_overlaps_from_addresses():
    """What a prepared call checks on each call from the byte spans it keeps: a written
    tensor against every other one, interleaved views counted as overlapping (as
    check_no_overlap counts them), adjacent ones and empty ones not."""
    buf = torch.randn(64)
    written, read = buf[:8], buf[8:16]
    spans = byte_spans(written, read, None)
    assert spans == (32, 32, 0)
    assert spans_apart((written, read, None), spans, written=1)
    assert not spans_apart((written, buf[4:12], None), spans, written=1)
    even, odd = buf[0:16:2], buf[1:16:2]  # share no element, but their ranges interleave
    assert not spans_apart((even, odd), byte_spans(even, odd), written=1)
    # Only the first `written` are checked against the rest: two read ones may overlap.
    assert spans_apart((written, read, buf[9:12]), byte_spans(written, read, buf[9:12]), 1)
    assert spans_apart((buf[:0], buf), byte_spans(buf[:0], buf), written=1)


def test_failed_preparation_is_not_kept():
    calls = PreparedCalls()
    made = []

    def bad():
        made.append(1)
        raise rtdnn.BadParamError("x: no")

    for _ in range(2):
        with pytest.raises(rtdnn.BadParamError):
            calls.get(("k",), bad)
    assert len(made) == 2 and not calls.calls
    assert calls.get(["unhashable"], lambda: 5) == 5  # checked without the cache


def test_linear_repeated_calls_are_fresh_and_checked():
    w = torch.randn(5, 7, dtype=torch.float64).float()
    for _ in range(3):  # the same signature: one preparation, fresh data each time
        x = torch.randn(3, 2, 7)
        y = ops.linear(x, w)
        assert rel(y, x.double() @ w.double().t()) < 1e-5
    with pytest.raises(rtdnn.BadParamError, match="alpha"):
        ops.linear(x, w, alpha=math.nan)
    out = torch.full((3, 2, 5), math.nan)
    with pytest.raises(rtdnn.BadParamError):  # out overlapping x, on a prepared signature
        ops.linear(x, w, out=x[..., :5])
    ops.linear(x, w, out=out)
    y = ops.linear(x, w, alpha=2.0, beta=0.5, out=out)
    assert y is out
    assert rel(out, 2.5 * (x.double() @ w.double().t())) < 1e-5


def test_linear_follows_the_tf32_switch_per_call():
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    before = len(linear_module._calls.calls)
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        for flag in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = flag
            ops.linear(x, w)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    assert len(linear_module._calls.calls) == before + 2


def test_linear_bias_gradient_repeated():
    for _ in range(2):
        dy = torch.randn(2, 3, 6)
        db = ops.linear_backward_bias(dy)
        assert rel(db, dy.double().sum((0, 1))) < 1e-5
    with pytest.raises(rtdnn.BadParamError, match="dy"):
        ops.linear_backward_bias(dy, out=dy[0, 0])


@pytest.mark.parametrize("keepdim", [True, False])
def test_reduce_repeated_with_out_and_indices(keepdim):
    shape = (2, 1, 5) if keepdim else (2, 5)
    for _ in range(2):
        x = torch.randn(2, 3, 5)
        out = torch.full(shape, math.nan)
        ops.reduce_tensor(x, "add", 1, keepdim=keepdim, out=out)
        assert rel(out, x.double().sum(1, keepdim=keepdim)) < 1e-5
        values, idx = ops.reduce_tensor(x, "max", 1, keepdim=keepdim, indices=True)
        ref_v, ref_i = x.max(1, keepdim=keepdim)
        assert torch.equal(values, ref_v) and torch.equal(idx, ref_i)
    with pytest.raises(rtdnn.BadParamError, match="beta"):
        ops.reduce_tensor(x, "add", 1, keepdim=keepdim, beta=1.0)


def test_attention_repeated_calls_and_scalar_checks():
    def ref(q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(
            q.double(), k.double(), v.double(), attn_mask=mask
        )

    mask = torch.rand(1, 1, 5, 7) > 0.3
    mask[..., 0] = True
    for m in (None, mask, mask, None):
        q, k, v = torch.randn(2, 3, 5, 16), torch.randn(2, 3, 7, 16), torch.randn(2, 3, 7, 16)
        out = rtdnn.ops.scaled_dot_product_attention(q, k, v, attn_mask=m)
        assert rel(out, ref(q, k, v, m)) < 1e-5
    with pytest.raises(rtdnn.BadParamError, match="dropout_p"):
        rtdnn.ops.scaled_dot_product_attention(q, k, v, dropout_p=1.5)
    with pytest.raises(rtdnn.BadParamError, match="scale"):
        rtdnn.ops.scaled_dot_product_attention(q, k, v, scale=math.inf)


def test_pooling_repeated_calls_and_checks():
    for _ in range(2):  # max pooling's backward recomputes the argmax of the new x
        x = torch.randn(2, 3, 7, 6)
        y = ops.pooling_forward(x, "max", 3, stride=2, padding=1)
        ref = torch.nn.functional.max_pool2d(x.double(), 3, 2, 1)
        assert rel(y, ref) < 1e-6
        dy = torch.randn_like(y)
        dx = ops.pooling_backward(dy, x, y, "max", 3, stride=2, padding=1)
        xr = x.double().requires_grad_()
        torch.nn.functional.max_pool2d(xr, 3, 2, 1).backward(dy.double())
        assert rel(dx, xr.grad) < 1e-6
        g = ops.adaptive_avg_pool(x, (1, 1))
        assert rel(g, x.double().mean((2, 3), keepdim=True)) < 1e-6
    with pytest.raises(rtdnn.BadParamError, match="alpha"):
        ops.pooling_forward(x, "max", 3, stride=2, padding=1, alpha=math.nan)
    with pytest.raises(rtdnn.BadParamError):  # out overlapping x
        ops.pooling_forward(x, "max", 3, stride=2, padding=1, out=x[:, :, :4, :3])


def test_flags_are_keyed_element_by_element():
    """A sequence flag's elements keep their types: a call that passes [True] where ints are
    due is refused whatever was called before with [1]."""
    assert signature("f", (), [1]) != signature("f", (), [True])
    assert signature("f", (), [1, 2]) == signature("f", (), [1, 2])
    assert signature("f", (), [1, 2]) != signature("f", (), (1, 2))
    assert signature("f", (), [[1]]) != signature("f", (), [[True]])  # nested: element-wise
    assert signature("f", (), [(1,)]) != signature("f", (), [(True,)])
    x = torch.randn(2, 3, 4)
    ops.reduce_tensor(x, "add", [1])
    with pytest.raises(rtdnn.BadParamError, match="dims"):
        ops.reduce_tensor(x, "add", [True])
    ops.activation_forward(x, "hardtanh", coef=(-1.0, 1.0))
    with pytest.raises(rtdnn.BadParamError, match="coef"):
        ops.activation_forward(x, "hardtanh", coef=(-1.0, True))


def test_attention_under_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.randn(2, 3, 5, 16, requires_grad=True)
        k = v = torch.randn(2, 3, 7, 16)
        out = rtdnn.scaled_dot_product_attention(q, k, v)
    assert out.shape == (2, 3, 5, 16)
