"""GPU correctness of scaled-dot-product attention: compiled kernels, moderate sizes, bf16 / fp16
/ strict fp32, outputs and gradients, against torch's in float64 on the CPU.

Run in its own process, without TRITON_INTERPRET:
    RTDNN_GPU_TESTS=1 pytest tests/test_attention_gpu.py
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import gpu_only

import rtdnn

pytestmark = gpu_only()

# ||out - ref|| / ||ref||: float32 accumulation; 16-bit storage of the probabilities fed to the
# second product (as flash attention does) and of the results dominates.
TOL = {torch.float32: 2e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}
DTYPES = list(TOL)


@pytest.fixture(autouse=True)
def strict_fp32(monkeypatch):
    """float32 means strict float32 (no TF32) on both sides."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.detach().double().cpu(), ref.detach().double().cpu()
    assert out64.shape == ref64.shape
    assert torch.isfinite(out64).all(), "non-finite values"
    return float((out64 - ref64).norm() / ref64.norm().clamp_min(1e-300))


def compare(dtype, q_shape, k_shape, ev, seed=0, **kw):
    """rtdnn's output and gradients against torch's in float64; returns rtdnn's (q, k, v,
    out)."""
    torch.manual_seed(seed)
    q = torch.randn(q_shape, device="cuda").to(dtype).requires_grad_()
    k = torch.randn(k_shape, device="cuda").to(dtype).requires_grad_()
    v = torch.randn((*k_shape[:-1], ev), device="cuda").to(dtype).requires_grad_()
    refs = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    ref_kw = {
        a: (
            b.cpu().double()
            if isinstance(b, torch.Tensor) and b.is_floating_point()
            else b.cpu()
            if isinstance(b, torch.Tensor)
            else b
        )
        for a, b in kw.items()
    }
    out = rtdnn.scaled_dot_product_attention(q, k, v, **kw)
    ref = F.scaled_dot_product_attention(*refs, **ref_kw)
    assert rel(out, ref) <= TOL[dtype], "out"
    dout = torch.randn(ref.shape, dtype=torch.float64)
    out.backward(dout.to("cuda", dtype))
    ref.backward(dout)
    for name, got, want in zip("qkv", (q, k, v), refs, strict=True):
        if want.grad.abs().max() < 1e-12:
            # Exactly zero (a single key, or a causal row that sees one: the softmax is
            # constant), so only rounding noise is allowed.
            assert got.grad.abs().max().item() <= TOL[dtype], name
        else:
            assert rel(got.grad, want.grad) <= TOL[dtype], name
    return q, k, v, out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("e", [16, 64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_head_sizes(dtype, e, causal):
    compare(dtype, (2, 4, 300, e), (2, 4, 257, e), e, is_causal=causal)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_repeated_calls_on_fresh_tensors(dtype, causal):
    """A problem's first call compiles through Triton's launch; later ones go through rtdnn's
    cached launch, which passes the tensors and host-side tensor descriptors of each call. Each
    call here has its own data, and earlier calls' tensors stay alive so that no address
    repeats: a launch that kept an earlier call's tensor would give that call's result."""
    kept = [compare(dtype, (2, 4, 640, 128), (2, 4, 640, 128), 128, seed, is_causal=causal)
            for seed in range(3)]  # fmt: skip
    assert len({t[0].data_ptr() for t in kept}) == 3


@pytest.mark.parametrize("dtype", DTYPES)
def test_masks_gqa_and_value_size(dtype):
    mask = torch.rand(1, 4, 129, 200, device="cuda") > 0.3
    compare(dtype, (2, 4, 129, 64), (2, 2, 200, 64), 128, attn_mask=mask, enable_gqa=True)
    additive = torch.randn(129, 200, device="cuda")
    compare(dtype, (2, 4, 129, 96), (2, 4, 200, 96), 32, attn_mask=additive)


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_strided(dtype):
    torch.manual_seed(1)
    q = torch.randn(2, 1000, 8, 64, device="cuda", dtype=dtype).transpose(1, 2)
    k = torch.randn(2, 8, 700, 128, device="cuda", dtype=dtype)[..., ::2]
    v = torch.randn(2, 700, 8, 64, device="cuda", dtype=dtype).transpose(1, 2)
    out = rtdnn.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref = F.scaled_dot_product_attention(
        q.double().cpu(), k.double().cpu(), v.double().cpu(), is_causal=True
    )
    assert rel(out, ref) <= TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_dropout_against_the_mask_it_reports(dtype, causal):
    """Output and gradients against float64 attention with rtdnn.attention_dropout_mask's mask
    (drawn on the GPU) applied to the probabilities; GQA."""
    torch.manual_seed(0)
    p, seed = 0.2, 77
    q = torch.randn(2, 4, 300, 64, device="cuda", dtype=dtype)
    k = torch.randn(2, 2, 300, 64, device="cuda", dtype=dtype)
    v = torch.randn(2, 2, 300, 64, device="cuda", dtype=dtype)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = rtdnn.scaled_dot_product_attention(
        *leaves, dropout_p=p, seed=seed, is_causal=causal, enable_gqa=True
    )
    keep = rtdnn.attention_dropout_mask((2, 4, 300, 300), p, seed, "cuda").cpu()
    assert abs(keep.float().mean().item() - (1 - p)) < 0.01
    refs = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    kk, vv = (t.repeat_interleave(2, 1) for t in refs[1:])
    scores = refs[0] @ kk.transpose(-1, -2) / 8.0
    if causal:
        scores = scores.masked_fill(~torch.ones(300, 300, dtype=torch.bool).tril(), -torch.inf)
    ref = (scores.softmax(-1) * keep / (1 - p)) @ vv
    assert rel(out, ref) < TOL[dtype]
    dout = torch.randn(ref.shape, dtype=torch.float64)
    out.backward(dout.to("cuda", dtype))
    ref.backward(dout)
    for name, got, want in zip("qkv", leaves, refs, strict=True):
        assert rel(got.grad, want.grad) < 2 * TOL[dtype], name


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.skipif(not _hopper(), reason="the warp-specialized forward runs on Hopper (sm_90)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "q_shape, k_shape, ev",
    [
        ((2, 4, 300, 128), (2, 4, 257, 128), 128),  # lengths not multiples of the blocks
        ((1, 8, 1008, 128), (1, 2, 1104, 128), 128),  # grouped-query, L < S
        ((2, 2, 777, 64), (2, 2, 4133, 64), 64),  # head size 64 from 4096 keys
        ((1, 2, 1, 128), (1, 2, 129, 128), 64),  # one query row; value size differs
        ((2, 2, 300, 128), (2, 2, 1, 128), 64),  # one key
        ((2, 2, 777, 128), (2, 2, 333, 128), 128),  # L > S
        ((3, 129, 128), (3, 130, 128), 128),  # (N, L, E) inputs
    ],
)
@pytest.mark.parametrize("causal", [False, True])
def test_hopper_forward(monkeypatch, dtype, q_shape, k_shape, ev, causal):
    """The warp-specialized Gluon forward (kernels/attention_hopper.py): output and gradients
    (the backward reads its log-sum-exp) against float64, and the call went through it."""
    from rtdnn.ops import attention as A

    taken = []
    prepare = A._hopper_forward_call
    monkeypatch.setattr(A, "_calls", type(A._calls)())  # prepare afresh, through the spy
    monkeypatch.setattr(A, "_hopper_forward_call", lambda *a: taken.append(1) or prepare(*a))
    gqa = q_shape[-3] != k_shape[-3] if len(q_shape) == 4 else False
    compare(dtype, q_shape, k_shape, ev, is_causal=causal, enable_gqa=gqa)
    assert taken, "the Hopper forward was not used"
