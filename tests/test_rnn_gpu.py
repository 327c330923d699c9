"""GPU correctness of the recurrent layers: compiled kernels, moderate sizes, bf16 / fp16 /
strict fp32, forward and backward, against torch.nn's modules in float64 on the CPU.

Run in its own process, without TRITON_INTERPRET:  RTDNN_GPU_TESTS=1 pytest tests/test_rnn_gpu.py
"""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
from conftest import gpu_only
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

import rtdnn

pytestmark = gpu_only()

# ||out - ref|| / ||ref||: float32 accumulation everywhere; 16-bit storage of h, the layer
# outputs and the gate gradients between steps dominates, compounded over the steps.
TOL = {torch.float32: 2e-5, torch.float16: 5e-3, torch.bfloat16: 4e-2}
DTYPES = list(TOL)

TORCH = {
    "rnn_tanh": (torch.nn.RNN, dict(nonlinearity="tanh")),
    "rnn_relu": (torch.nn.RNN, dict(nonlinearity="relu")),
    "lstm": (torch.nn.LSTM, {}),
    "gru": (torch.nn.GRU, {}),
}


@pytest.fixture(autouse=True)
def strict_fp32(monkeypatch):
    """float32 means strict float32 (no TF32) on both sides."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.detach().double().cpu(), ref.detach().double().cpu()
    assert out64.shape == ref64.shape
    assert torch.isfinite(out64).all(), "non-finite values"
    return float((out64 - ref64).norm() / ref64.norm().clamp_min(1e-300))


def compare(mode, dtype, *, T, B, In, H, lengths=None, **kw):
    cls, extra = TORCH[mode]
    torch.manual_seed(0)
    base = cls(In, H, **extra, **kw)
    ref = copy.deepcopy(base).double()
    ours, _ = rtdnn.convert(base)
    ours = ours.to("cuda", dtype)
    # The reference starts from the very weights and inputs the GPU sees (already rounded).
    for p, q in zip(ref.parameters(), ours.parameters(), strict=True):
        p.data.copy_(q.data.double().cpu())
    x = torch.randn(T, B, In).to(dtype)
    dirs = 2 if kw.get("bidirectional") else 1
    h_shape = (kw.get("num_layers", 1) * dirs, B, kw.get("proj_size", 0) or H)
    h0 = torch.randn(h_shape).to(dtype)
    c0 = torch.randn(*h_shape[:2], H).to(dtype)

    def run(module, device, to):
        leaves = [x.to(device, to).requires_grad_(), h0.to(device, to).requires_grad_()]
        if mode == "lstm":
            leaves.append(c0.to(device, to).requires_grad_())
        hx = tuple(leaves[1:]) if mode == "lstm" else leaves[1]
        inp = leaves[0]
        if lengths is not None:
            inp = pack_padded_sequence(inp, lengths, enforce_sorted=False)
        out, hidden = module(inp, hx)
        out = out.data if isinstance(out, PackedSequence) else out
        outs = [out, *(hidden if mode == "lstm" else (hidden,))]
        return outs, leaves + list(module.parameters())

    got, got_leaves = run(ours, "cuda", dtype)
    want, want_leaves = run(ref, "cpu", torch.float64)
    gen = torch.Generator().manual_seed(2)
    probes = [torch.randn(w.shape, generator=gen, dtype=torch.float64) for w in want]
    sum(
        (g.float() * p.to("cuda", torch.float32)).sum() for g, p in zip(got, probes, strict=True)
    ).backward()
    sum((w * p).sum() for w, p in zip(want, probes, strict=True)).backward()
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == dtype
        err = rel(g, w)
        assert err <= TOL[dtype], f"output {i}: relative error {err:.3g}"
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves, strict=True)):
        err = rel(g.grad, w.grad)
        assert err <= TOL[dtype], f"gradient {i}: relative error {err:.3g}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", list(TORCH))
def test_two_layers_bidirectional(mode, dtype):
    compare(mode, dtype, T=12, B=8, In=40, H=64, num_layers=2, bidirectional=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_packed_variable_lengths(mode, dtype):
    lengths = [5, 9, 1, 9, 3, 7]
    compare(mode, dtype, T=9, B=6, In=24, H=48, lengths=lengths, bidirectional=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_lstm_projection(dtype):
    compare("lstm", dtype, T=8, B=4, In=32, H=96, proj_size=40, num_layers=2)


@pytest.mark.parametrize("dtype", [torch.bfloat16], ids=str)
def test_large_hidden(dtype):
    """Tiles of the GEMMs and the cell kernels over more than one block of hidden units."""
    compare("lstm", dtype, T=6, B=64, In=512, H=1024)


def test_torch_compile_bf16():
    torch.manual_seed(0)
    m = rtdnn.nn.LSTM(64, 128, num_layers=2).to("cuda", torch.bfloat16)
    x = torch.randn(16, 8, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    eager = m(x)[0]
    compiled = torch.compile(lambda x: m(x)[0])(x)
    assert torch.equal(eager, compiled)
    compiled.float().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "per_step"])
@pytest.mark.parametrize("mode", ["gru", "rnn_tanh", "lstm"])
def test_both_recurrence_paths_on_uneven_sizes(mode, persistent, monkeypatch):
    """Hidden and batch sizes that no tile divides, several programs of the persistent kernel
    waiting on each other every step, packed variable lengths; and the per-step launches."""
    monkeypatch.setattr(importlib.import_module("rtdnn.ops.rnn"), "PERSISTENT", persistent)
    lengths = [7, 3, 7, 1, 5] * 8
    compare(mode, torch.bfloat16, T=7, B=40, In=24, H=300, lengths=lengths, bidirectional=True)
