"""CTC loss on the GPU: compiled kernels against torch's float64 implementation at speech-like
sizes (many steps, long targets, large alphabets, where the barriers between steps matter).

Run in its own process, without TRITON_INTERPRET:  pytest tests/test_ctc_gpu.py
"""

import pytest
import torch
from conftest import gpu_only

import rtdnn
from rtdnn import reference

pytestmark = gpu_only()


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


@pytest.mark.parametrize("T,N,C,S", [(50, 4, 29, 10), (400, 16, 29, 120), (200, 8, 5000, 60)])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_ctc_matches_torch(T, N, C, S, reduction):
    lp = torch.randn(T, N, C, device="cuda").log_softmax(-1)
    tgt_len = torch.randint(S // 2, S + 1, (N,))
    targets = torch.randint(1, C, (N, S), device="cuda")
    targets[0, 1] = targets[0, 0]  # a repeat
    in_len = torch.randint(T // 2, T + 1, (N,))
    in_len[0] = T
    x = lp.clone().requires_grad_()
    loss = rtdnn.ctc_loss(x, targets, in_len, tgt_len, reduction=reduction, zero_infinity=True)
    w = torch.randn(loss.shape, device="cuda")
    (loss * w).sum().backward()
    x64 = lp.double().requires_grad_()
    ref = reference.ctc_loss(x64, targets, in_len, tgt_len, reduction=reduction,
                             zero_infinity=True)  # fmt: skip
    (ref * w.double()).sum().backward()
    # torch's own float32 CTC beside it: over hundreds of steps the log-space sums lose
    # digits in any float32 implementation, so the bar is torch's error where that is larger.
    x32 = lp.clone().requires_grad_()
    theirs = torch.nn.functional.ctc_loss(
        x32, targets, in_len, tgt_len, reduction=reduction, zero_infinity=True
    )
    (theirs * w).sum().backward()
    loss_err, their_loss_err = rel(loss.detach(), ref.detach()), rel(theirs.detach(), ref.detach())
    grad_err, their_grad_err = rel(x.grad, x64.grad), rel(x32.grad, x64.grad)
    note = f"loss {loss_err:.1e} (torch {their_loss_err:.1e}), "
    note += f"grad {grad_err:.1e} (torch {their_grad_err:.1e})"
    assert loss_err <= max(1e-5, 2 * their_loss_err), note
    assert grad_err <= max(1e-4, 2 * their_grad_err), note


@pytest.mark.parametrize("layout", ["padded", "concatenated"])
def test_targets_on_the_host_and_bad_labels(layout):
    """Targets may stay on the host (torch's cuDNN path wants them there): the same loss as
    with targets on the GPU; a blank inside a length is refused either way, nothing run."""
    T, N, C, S = 60, 4, 29, 12
    lp = torch.randn(T, N, C, device="cuda").log_softmax(-1)
    tgt_len = [12, 7, 9, 3]
    padded = torch.randint(1, C, (N, S), dtype=torch.int32)
    targets = (
        padded if layout == "padded" else torch.cat([padded[i, :n] for i, n in enumerate(tgt_len)])
    )
    in_len = [T] * N
    on_host = rtdnn.ctc_loss(lp, targets, in_len, tgt_len, reduction="none")
    on_gpu = rtdnn.ctc_loss(lp, targets.cuda(), in_len, tgt_len, reduction="none")
    ref = reference.ctc_loss(lp.double(), targets.cuda(), in_len, tgt_len, reduction="none")
    assert rel(on_host, ref) <= 1e-5
    assert torch.equal(on_host, on_gpu)
    bad = targets.clone()
    bad[1] = 0  # the blank, inside element 0's (or 1's) target
    for where in ("cpu", "cuda"):
        with pytest.raises(rtdnn.BadParamError, match="targets"):
            rtdnn.ctc_loss(lp, bad.to(where), in_len, tgt_len)
