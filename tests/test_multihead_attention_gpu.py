"""GPU correctness of rtdnn.nn.MultiheadAttention: compiled kernels, moderate sizes, bf16 /
fp16 / strict fp32, outputs, weights and gradients against torch's module in float64 on the
CPU with the very same (rounded) weights.

Run in its own process, without TRITON_INTERPRET:
    RTDNN_GPU_TESTS=1 pytest tests/test_multihead_attention_gpu.py
"""

from __future__ import annotations

import pytest
import torch
from conftest import gpu_only

import rtdnn

pytestmark = gpu_only()

# ||out - ref|| / ||ref||: as the attention's own GPU tests, a little wider for the two
# projections around it.
TOL = {torch.float32: 5e-5, torch.float16: 1e-2, torch.bfloat16: 5e-2}


@pytest.fixture(autouse=True)
def strict_fp32(monkeypatch):
    """float32 means strict float32 (no TF32) on both sides."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.detach().double().cpu(), ref.detach().double().cpu()
    assert out64.shape == ref64.shape
    assert torch.isfinite(out64).all(), "non-finite values"
    return float((out64 - ref64).norm() / ref64.norm().clamp_min(1e-300))


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("need_weights", [False, True])
def test_matches_torch(dtype, need_weights):
    torch.manual_seed(0)
    e, h, n, lq, lk = 256, 4, 3, 200, 333
    mod = rtdnn.nn.MultiheadAttention(e, h, batch_first=True, kdim=192, vdim=160).cuda()
    with torch.no_grad():
        mod.in_proj_bias.normal_()
    mod.to(dtype)
    ref = torch.nn.MultiheadAttention(e, h, batch_first=True, kdim=192, vdim=160).double()
    ref.load_state_dict({k: v.double().cpu() for k, v in mod.state_dict().items()})
    q = torch.randn(n, lq, e, device="cuda").to(dtype).requires_grad_()
    k = torch.randn(n, lk, 192, device="cuda").to(dtype).requires_grad_()
    v = torch.randn(n, lk, 160, device="cuda").to(dtype).requires_grad_()
    kpm = torch.rand(n, lk, device="cuda") < 0.3
    kpm[:, 0] = False
    refs = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    out, w = mod(q, k, v, key_padding_mask=kpm, need_weights=need_weights)
    out_ref, w_ref = ref(*refs, key_padding_mask=kpm.cpu(), need_weights=need_weights)
    assert rel(out, out_ref) <= TOL[dtype], "out"
    if need_weights:
        assert rel(w, w_ref) <= TOL[dtype], "weights"
    g = torch.randn(out_ref.shape, dtype=torch.float64)
    out.backward(g.to(device="cuda", dtype=dtype))
    out_ref.backward(g)
    for name, got, want in zip("qkv", (q, k, v), refs, strict=True):
        assert rel(got.grad, want.grad) <= TOL[dtype], name
    params = dict(ref.named_parameters())
    for name, p in mod.named_parameters():
        assert rel(p.grad, params[name].grad) <= TOL[dtype], name
