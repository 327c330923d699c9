"""Scaled-dot-product attention against torch's in float64 (its math backend): outputs and the
gradients of q, k and v, for every kind of mask, causal with L != S, grouped-query attention,
a value head size different from the query's, strided inputs, and bad input; dropout against
float64 attention with the mask rtdnn reports for the seed, its keep rate and seeding.

Tiny shapes (the kernels run in Triton's interpreter, whose blocks are 16 rows): lengths that
are not multiples of the block, so the edge blocks are partial.
"""

import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from conftest import assert_close, tolerance  # noqa: E402

import rtdnn  # noqa: E402
from rtdnn import reference as R  # noqa: E402

# The interpreter warns about NaN in masked-off lanes.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def check(q, k, v, dtype=None, **kw):
    """rtdnn's output and gradients against torch's on the same values in float64."""
    dtype = q.dtype if dtype is None else dtype
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = rtdnn.scaled_dot_product_attention(*leaves, **kw)
    refs = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref_kw = {
        key: (val.double() if isinstance(val, torch.Tensor) and val.is_floating_point() else val)
        for key, val in kw.items()
    }
    ref = F.scaled_dot_product_attention(*refs, **ref_kw)
    assert out.dtype == q.dtype
    assert_close(out.detach(), ref.detach(), dtype)
    dout = torch.randn(ref.shape, dtype=torch.float64)
    out.backward(dout.to(dtype))
    ref.backward(dout)
    for name, got, want in zip("qkv", leaves, refs, strict=True):
        assert got.grad is not None, name
        if want.grad.abs().max() < 1e-12:
            # Exactly zero in exact arithmetic (a single key: the softmax is constant), so a
            # relative error means nothing; rounding noise must stay within the tolerance.
            assert got.grad.abs().max() <= tolerance(dtype), name
        else:
            assert_close(got.grad, want.grad, dtype)


@pytest.mark.parametrize("lq, lk", [(17, 20), (20, 13), (1, 17), (5, 1)])
def test_no_mask(lq, lk):
    torch.manual_seed(0)
    check(rand(2, 2, lq, 16), rand(2, 2, lk, 16), rand(2, 2, lk, 16))


@pytest.mark.parametrize("lq, lk", [(17, 20), (20, 13), (19, 19)])
def test_causal_with_different_lengths(lq, lk):
    """torch's is_causal is top-left aligned: query i sees keys 0..i, also when L != S (so with
    L > S the last queries see every key)."""
    torch.manual_seed(1)
    check(rand(1, 2, lq, 32), rand(1, 2, lk, 32), rand(1, 2, lk, 32), is_causal=True)


@pytest.mark.parametrize("mask_shape", [(17, 19), (2, 1, 17, 19), (1, 2, 1, 19)])
def test_boolean_mask_broadcast(mask_shape):
    torch.manual_seed(2)
    mask = torch.rand(mask_shape) > 0.3
    check(rand(2, 2, 17, 16), rand(2, 2, 19, 16), rand(2, 2, 19, 16), attn_mask=mask)


@pytest.mark.parametrize("mask_shape", [(17, 19), (2, 1, 1, 19)])
def test_additive_mask_broadcast(mask_shape):
    torch.manual_seed(3)
    mask = torch.randn(mask_shape)
    mask[..., 0] = float("-inf")
    check(rand(2, 2, 17, 16), rand(2, 2, 19, 16), rand(2, 2, 19, 16), attn_mask=mask)


def test_rows_with_every_key_masked_give_zeros_as_torch():
    """torch gives zeros (not NaN) and zero gradients for a row whose keys are all masked, for
    boolean and -inf additive masks alike."""
    torch.manual_seed(4)
    mask = torch.rand(17, 19) > 0.3
    mask[3] = False
    mask[16] = False
    q, k, v = rand(1, 2, 17, 16), rand(1, 2, 19, 16), rand(1, 2, 19, 16)
    check(q, k, v, attn_mask=mask)
    additive = torch.zeros(17, 19).masked_fill(~mask, float("-inf"))
    check(q, k, v, attn_mask=additive)
    out = rtdnn.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(out[:, :, 3], torch.zeros_like(out[:, :, 3]))


def test_causal_programs_in_chunks_of_heads(monkeypatch):
    """Causal grids walk chunks of kernels.attention.CAUSAL_CHUNK heads (longest blocks first):
    11 rows of batch x heads make one whole chunk and a partial one, grouped-query heads
    included; every block of every head must still be computed once. Outputs and gradients
    start as NaN, so a block no program wrote fails."""
    empty = torch.empty

    def nan_empty(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", nan_empty)
    torch.manual_seed(11)
    check(rand(1, 11, 35, 16), rand(1, 11, 35, 16), rand(1, 11, 35, 16), is_causal=True)
    check(
        rand(3, 6, 33, 16), rand(3, 3, 33, 16), rand(3, 3, 33, 16), enable_gqa=True, is_causal=True
    )


@pytest.mark.parametrize("e, split", [(32, True), (80, False)])
def test_causal_key_blocks_with_and_without_a_separate_diagonal_loop(e, split):
    """Causal dK/dV runs the diagonal's query blocks in their own loop for heads up to 64 and
    one loop masking every block for wider ones (ops.attention._backward_config); both
    against float64, with lengths that leave partial blocks."""
    from rtdnn.ops import attention as A

    torch.manual_seed(12)
    q = rand(1, 2, 37, e)
    assert A._backward_config(q, e, e, False, True)[0]["SPLIT_DIAGONAL"] is split
    check(q, rand(1, 2, 37, e), rand(1, 2, 37, e), is_causal=True)
    check(rand(1, 4, 21, e), rand(1, 2, 30, e), rand(1, 2, 30, e), is_causal=True, enable_gqa=True)


def test_grouped_query_attention():
    torch.manual_seed(5)
    check(rand(2, 4, 17, 16), rand(2, 2, 19, 16), rand(2, 2, 19, 16), enable_gqa=True)
    check(
        rand(1, 4, 18, 16), rand(1, 1, 13, 16), rand(1, 1, 13, 16), enable_gqa=True, is_causal=True
    )


def test_value_head_size_differs_from_query():
    torch.manual_seed(6)
    check(rand(2, 2, 17, 16), rand(2, 2, 19, 16), rand(2, 2, 19, 32))
    check(rand(1, 2, 17, 32), rand(1, 2, 19, 32), rand(1, 2, 19, 16), is_causal=True)


def test_odd_head_size_and_scale():
    torch.manual_seed(7)
    check(rand(1, 2, 17, 24), rand(1, 2, 19, 24), rand(1, 2, 19, 20), scale=0.3)


def test_three_dim_inputs():
    torch.manual_seed(8)
    check(rand(2, 17, 16), rand(2, 19, 16), rand(2, 19, 16), attn_mask=torch.rand(17, 19) > 0.2)


def test_strided_inputs():
    """Transposed (batch, length, heads, size) storage, sliced head dims, a reversed key axis."""
    torch.manual_seed(9)
    q = rand(2, 17, 2, 16).transpose(1, 2)
    k = rand(2, 2, 19, 32)[..., ::2]
    v = rand(2, 2, 19, 16).flip(2)
    assert not (q.is_contiguous() or k.is_contiguous())
    check(q, k, v, is_causal=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype):
    torch.manual_seed(10)
    mask = torch.rand(2, 1, 17, 19) > 0.3
    check(
        rand(2, 2, 17, 16, dtype=dtype),
        rand(2, 2, 19, 16, dtype=dtype),
        rand(2, 2, 19, 16, dtype=dtype),
        attn_mask=mask,
    )


def test_no_grad_call_matches():
    torch.manual_seed(11)
    q, k, v = rand(1, 2, 17, 16), rand(1, 2, 19, 16), rand(1, 2, 19, 16)
    with torch.no_grad():
        out = rtdnn.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert_close(out, R.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert out.is_contiguous()


def test_fake_kernel_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k, v = torch.empty(2, 4, 7, 16), torch.empty(2, 2, 9, 16), torch.empty(2, 2, 9, 32)
        seed = torch.tensor(0)
        out, lse = torch.ops.rtdnn.attention_forward(q, k, v, None, False, 0.25, True, 0.0, seed)
    assert out.shape == (2, 4, 7, 32) and lse.shape == (2, 4, 7) and lse.dtype == torch.float32


# -- bad input --------------------------------------------------------------------------------

Q, KV = (1, 2, 5, 16), (1, 2, 7, 16)


@pytest.mark.parametrize(
    "change, names",
    [
        (dict(key=rand(1, 2, 7, 32)), ["key.shape"]),
        (dict(key=rand(2, 2, 7, 16), value=rand(2, 2, 7, 16)), ["key.shape"]),
        (dict(value=rand(1, 2, 6, 16)), ["value.shape"]),
        (dict(key=rand(1, 1, 7, 16), value=rand(1, 1, 7, 16)), ["key.shape", "enable_gqa"]),
        (
            dict(query=rand(1, 3, 5, 16), key=rand(1, 2, 7, 16), enable_gqa=True),
            ["enable_gqa"],
        ),
        (dict(attn_mask=torch.ones(4, 7, dtype=torch.bool)), ["attn_mask.shape"]),
        (dict(attn_mask=torch.ones(5, 7, dtype=torch.int32)), ["attn_mask.dtype"]),
        (dict(attn_mask=torch.ones(5, 7, dtype=torch.bool), is_causal=True), ["is_causal"]),
        (dict(dropout_p=1.0), ["dropout_p"]),
        (dict(dropout_p=-0.1), ["dropout_p"]),
        (dict(scale=float("nan")), ["scale"]),
        (dict(value=rand(1, 2, 7, 16).half()), ["value.dtype"]),
        (dict(query=rand(5, 16)), ["query.dim()"]),
    ],
)
def test_bad_input_is_refused(change, names):
    args = dict(query=rand(*Q), key=rand(*KV), value=rand(*KV))
    args.update(change)
    with pytest.raises(rtdnn.BadParamError) as e:
        rtdnn.scaled_dot_product_attention(**args)
    for n in names:
        assert n in str(e.value), (n, str(e.value))


# -- dropout ----------------------------------------------------------------------------------


def _dropped_reference(q, k, v, keep, p, **kw):
    """float64 attention whose probabilities are multiplied by keep / (1 - p) (GQA: each
    query head reads key/value head h // group)."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ kk.transpose(-1, -2) / q.shape[-1] ** 0.5
    if kw.get("is_causal"):
        causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    probs = scores.softmax(-1) * keep.double() / (1.0 - p)
    return (q, k, v), probs @ vv


@pytest.mark.parametrize(
    "q_shape, kv_shape, kw",
    [
        ((2, 2, 17, 16), (2, 2, 20, 16), {}),
        ((1, 4, 9, 16), (1, 2, 21, 16), dict(enable_gqa=True)),
        ((1, 2, 18, 16), (1, 2, 18, 16), dict(is_causal=True)),
    ],
)
def test_dropout_against_the_mask_it_reports(q_shape, kv_shape, kw):
    """Output and gradients equal float64 attention with rtdnn.attention_dropout_mask's mask
    for the same seed applied to the probabilities."""
    torch.manual_seed(0)
    p, seed = 0.3, 1234
    q, k, v = rand(*q_shape), rand(*kv_shape), rand(*kv_shape)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = rtdnn.scaled_dot_product_attention(*leaves, dropout_p=p, seed=seed, **kw)
    keep = rtdnn.attention_dropout_mask((*q_shape[:2], q_shape[2], kv_shape[2]), p, seed, "cpu")
    refs, ref = _dropped_reference(q, k, v, keep, p, **kw)
    assert_close(out.detach(), ref.detach(), torch.float32)
    dout = torch.randn(ref.shape, dtype=torch.float64)
    out.backward(dout.float())
    ref.backward(dout)
    for got, want in zip(leaves, refs, strict=True):
        assert_close(got.grad, want.grad, torch.float32)
    # The same seed gives the same result; another seed another mask.
    again = rtdnn.scaled_dot_product_attention(q, k, v, dropout_p=p, seed=seed, **kw)
    assert torch.equal(again, out.detach())
    other = rtdnn.attention_dropout_mask(tuple(keep.shape), p, seed + 1, "cpu")
    assert not torch.equal(other, keep)


def test_dropout_mask_keep_rate_and_seed_from_torch():
    """The mask is the float64 reference's Philox draw; about 1 - p of the probabilities are
    kept; without a seed each call draws one from torch's default generator, so
    torch.manual_seed repeats a run; dropout_p = 0 draws none."""
    keep = rtdnn.attention_dropout_mask((2, 4, 64, 96), 0.25, 7, "cpu")
    # The float64 reference's Philox: batch-head bh draws tl.rand(seed + bh, i * S + j), the
    # first of tl.rand4x's four outputs at counter i * S + j.
    counters = 4 * torch.arange(64 * 96, dtype=torch.int32)
    want = torch.stack([R.philox_uniform(7 + bh, counters) >= 0.25 for bh in range(8)])
    assert torch.equal(keep, want.reshape(2, 4, 64, 96))
    rate = keep.float().mean().item()
    assert abs(rate - 0.75) < 0.01, rate  # 49152 draws: the standard deviation is 0.002
    q, k, v = rand(1, 2, 9, 16), rand(1, 2, 11, 16), rand(1, 2, 11, 16)
    torch.manual_seed(5)
    first = rtdnn.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    second = rtdnn.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(5)
    assert torch.equal(rtdnn.scaled_dot_product_attention(q, k, v, dropout_p=0.5), first)
    assert not torch.equal(first, second)
    state = torch.get_rng_state()
    rtdnn.scaled_dot_product_attention(q, k, v)
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize(
    "change, name",
    [
        (dict(shape=(2, 4, 8)), "shape"),
        (dict(shape=(2, 0, 8, 8)), "shape"),
        (dict(dropout_p=1.0), "dropout_p"),
        (dict(seed=-3), "seed"),
    ],
)
def test_bad_dropout_mask_arguments(change, name):
    args = dict(shape=(2, 4, 8, 8), dropout_p=0.1, seed=1, device="cpu")
    args.update(change)
    with pytest.raises(rtdnn.BadParamError, match=name):
        rtdnn.attention_dropout_mask(**args)


@pytest.mark.parametrize("seed", [-1, 2**62, 1.5, True])
def test_bad_dropout_seed(seed):
    with pytest.raises(rtdnn.BadParamError, match="seed"):
        rtdnn.scaled_dot_product_attention(rand(*Q), rand(*KV), rand(*KV), dropout_p=0.1, seed=seed)


def test_head_sizes_above_256_are_not_supported():
    q = rand(1, 1, 3, 272)
    with pytest.raises(rtdnn.NotSupportedError, match="query.shape"):
        rtdnn.scaled_dot_product_attention(q, q, q)


def test_a_mask_that_requires_grad_is_refused():
    q = rand(*Q).requires_grad_()
    mask = torch.zeros(5, 7, requires_grad=True)
    with pytest.raises(rtdnn.NotSupportedError, match="attn_mask"):
        rtdnn.scaled_dot_product_attention(q, rand(*KV), rand(*KV), attn_mask=mask)


def test_which_calls_the_hopper_forward_takes():
    """The warp-specialized Hopper forward (kernels/attention_hopper.py, GPU only, tested in
    test_attention_gpu.py) takes 16-bit, TMA-addressable tensors with head sizes 64 or 128 and
    no mask, dropout or negative scale; everything else stays on the Triton kernel."""
    from rtdnn.ops.attention import hopper_forward_fits

    def fits(q_shape=(2, 4, 100, 128), kv_shape=(2, 2, 90, 128), ev=128, dtype=torch.bfloat16,
             **flags):  # fmt: skip
        q, k = torch.empty(q_shape, dtype=dtype), torch.empty(kv_shape, dtype=dtype)
        v = torch.empty((*kv_shape[:-1], ev), dtype=dtype)
        kw = dict(has_mask=False, dropout=False, neg_scale=False) | flags
        return hopper_forward_fits(q, k, v, **kw)

    assert fits()
    assert fits(dtype=torch.float16)
    assert fits(q_shape=(1, 2, 1, 128), kv_shape=(1, 2, 1, 128), ev=64)
    assert fits(ev=64)
    # Head size 64 from HOPPER_MIN_KEYS_AT_64 keys on (shorter: the Triton kernel is faster).
    assert fits(q_shape=(1, 2, 1, 64), kv_shape=(1, 2, 4096, 64), ev=64)
    assert not fits(q_shape=(1, 2, 1, 64), kv_shape=(1, 2, 4095, 64), ev=64)
    assert not fits(dtype=torch.float32)
    assert not fits(q_shape=(2, 4, 100, 96), kv_shape=(2, 2, 90, 96))
    assert not fits(ev=32)
    assert not fits(kv_shape=(2, 2, 0, 128))
    assert not fits(has_mask=True)
    assert not fits(dropout=True)
    assert not fits(neg_scale=True)
    # A key tensor whose rows start 2 bytes apart from 16-byte boundaries: no TMA descriptor.
    wide = torch.empty(2, 2, 90, 130, dtype=torch.bfloat16)[..., 1:129]
    q, v = torch.empty(2, 4, 100, 128, dtype=torch.bfloat16), torch.empty_like(wide)
    assert not hopper_forward_fits(q, wide, v, False, False, False)


def test_the_hopper_forward_prepares_its_launch():
    """Its launch is prepared (every kernel argument given) from CPU tensors; it runs only on a
    Hopper GPU."""
    from rtdnn.ops.attention import _hopper_forward_call

    q = torch.empty(2, 4, 100, 128, dtype=torch.bfloat16)
    k = v = torch.empty(2, 2, 90, 128, dtype=torch.bfloat16)
    for causal in (False, True):
        assert callable(_hopper_forward_call(q, k, v, causal))


def test_calls_reach_the_kernel_that_fits_them(monkeypatch):
    """With a Hopper GPU pretended (the kernel itself runs on the GPU only), attention_forward
    routes each call signature to the Hopper forward or the Triton kernel by
    hopper_forward_fits, and a prepared call keeps its road: a masked, dropout or
    negative-scale call of the same shapes is keyed apart."""
    from rtdnn.core.prepared import PreparedCalls
    from rtdnn.ops import attention as A

    taken = []

    def hopper_call(q, k, v, is_causal):
        def call(*args):
            taken.append("hopper")
            return A._forward_outputs(q, *q.shape[:3], v.shape[-1])

        return call

    monkeypatch.setattr(A, "_calls", PreparedCalls())
    monkeypatch.setattr(A, "_on_hopper", lambda t: True)
    monkeypatch.setattr(A, "_hopper_forward_call", hopper_call)
    q = rand(1, 2, 20, 128).to(torch.bfloat16)
    k, v = rand(1, 2, 17, 128).to(torch.bfloat16), rand(1, 2, 17, 128).to(torch.bfloat16)
    for _ in range(2):  # the first call prepares, the second finds the prepared call
        A.attention_forward(q, k, v, None, True, 0.1, False)
    assert taken == ["hopper", "hopper"]
    mask = torch.rand(20, 17) > 0.5
    for args in [(mask, False, 0.1, False, 0.0), (None, False, -0.1, False, 0.0),
                 (None, False, 0.1, False, 0.2)]:  # fmt: skip
        out, lse = A.attention_forward(q, k, v, *args)
        assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert taken == ["hopper", "hopper"]
