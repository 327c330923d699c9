"""Bad input on the GPU: the refusals of test_bad_input.py hold with compiled kernels too, and
the cross-entropy kernels are right on valid targets and never read at invalid ones.

Run in its own process, without TRITON_INTERPRET:  pytest tests/test_bad_input_gpu.py
"""

import math

import pytest
import torch
from conftest import gpu_only

import rtdnn

pytestmark = gpu_only()


@pytest.mark.parametrize("bad", [1000, -3, 2**32])
def test_cross_entropy_targets_outside_the_classes(bad):
    logits = torch.randn(4, 1000, device="cuda")
    target = torch.tensor([0, 5, bad, 7], device="cuda")
    with pytest.raises(rtdnn.BadParamError, match=f"target={bad}"):
        rtdnn.cross_entropy(logits, target)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_cross_entropy_matches_torch_with_ignored_rows(dtype):
    logits = torch.randn(64, 1000, device="cuda").to(dtype)
    target = torch.randint(0, 1000, (64,), device="cuda")
    target[::5] = -100
    for smoothing in (0.0, 0.1):
        loss = rtdnn.cross_entropy(logits, target, label_smoothing=smoothing)
        ref = torch.nn.functional.cross_entropy(logits.double(), target, label_smoothing=smoothing)
        assert abs(float(loss) - float(ref)) <= 2e-2 * max(1.0, abs(float(ref)))


def test_cross_entropy_kernel_called_directly_gives_nan_not_a_read():
    from rtdnn.kernels.cross_entropy import cross_entropy_fwd_kernel

    x = torch.randn(3, 100, device="cuda")
    target = torch.tensor([1, 2**40, -2], device="cuda")
    loss, lse, w_t = (torch.empty(3, device="cuda") for _ in range(3))
    cross_entropy_fwd_kernel[(3,)](
        x, target, loss, loss, lse, w_t, 100, x.stride(0), x.stride(1), -100, 0.0,
        HAS_WEIGHT=False, BLOCK=128,
    )  # fmt: skip
    torch.cuda.synchronize()
    ref = torch.nn.functional.cross_entropy(x[:1].double(), target[:1], reduction="none")
    assert abs(float(loss[0]) - float(ref[0])) < 1e-4
    assert torch.isnan(loss[1:]).all()


def test_cross_entropy_under_cuda_graph_capture():
    """While a graph is captured the host check (a synchronization, illegal there) is skipped:
    replayed with a bad target, that row's loss and gradient are NaN, the others right."""
    logits = torch.randn(4, 100, device="cuda")
    target = torch.tensor([0, 5, 7, 9], device="cuda")
    grad = torch.ones(4, device="cuda")

    def step():
        loss, lse, w_t = rtdnn.ops.cross_entropy_forward(logits, target, reduction="none")
        dx = rtdnn.ops.cross_entropy_backward(grad, logits, target, lse, w_t, reduction="none")
        return loss, dx

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up: kernels compiled outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss, dx = step()
    target.copy_(torch.tensor([0, 2**40, 7, -100]))
    graph.replay()
    torch.cuda.synchronize()
    x = logits.double().requires_grad_(True)
    ref = torch.nn.functional.cross_entropy(x, target.clamp(0, 99), reduction="none")
    ref.sum().backward()
    assert torch.isnan(loss[1]) and torch.isnan(dx[1]).all()
    assert float(loss[3]) == 0.0 and torch.equal(dx[3], torch.zeros_like(dx[3]))
    for row in (0, 2):
        assert abs(float(loss[row]) - float(ref[row])) < 1e-4
        assert torch.allclose(dx[row].double(), x.grad[row], atol=1e-5)


def test_out_overlapping_an_input_on_the_gpu():
    x = torch.randn(2, 16, 8, 8, device="cuda")
    w = torch.randn(16, 16, 3, 3, device="cuda")
    before = x.clone()
    with pytest.raises(rtdnn.BadParamError, match="out overlaps x"):
        rtdnn.conv_forward(x, w, padding=1, out=x)
    assert torch.equal(x, before)
    y = rtdnn.activation_forward(x, "relu", out=x)
    assert y is x and torch.equal(x, torch.relu(before))


def test_non_finite_scaling_on_the_gpu():
    x = torch.randn(4, 3, 8, 8, device="cuda")
    out = torch.full_like(x, math.nan)
    with pytest.raises(rtdnn.BadParamError, match="alpha"):
        rtdnn.batch_norm_forward_training(x, alpha=math.inf, out=out)
    with pytest.raises(rtdnn.BadParamError, match="eps"):
        rtdnn.batch_norm_forward_training(x, eps=0.0, out=out)
    assert torch.isnan(out).all()
