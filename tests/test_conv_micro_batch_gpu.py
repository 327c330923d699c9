"""Micro-batched convolution on the GPU with measured plans: under a workspace limit that only
half the batch fits GEMM's, plan_conv's plan fits the limit, is no slower than the undivided
plan measured beside it (within timing noise), and running it (micro_batch=) gives the
float64 reference's result in every direction with alpha and beta. Run with
RTDNN_GPU_TESTS=1 on a machine with a CUDA GPU."""

import pytest
import torch
from conftest import gpu_only

import rtdnn
from rtdnn import reference as R
from rtdnn.algos import ALGORITHMS
from rtdnn.core import ConvDesc, ConvProblem, Direction, TensorDesc, conv_output_shape

pytestmark = gpu_only()

# Strict float32: the backward-filter slices add up in the output's precision.
X_SHAPE, W_SHAPE, CONV = (8, 32, 28, 28), (64, 32, 3, 3), dict(padding=1, math="fp32")
REF = dict(padding=1)
DIRECTIONS = ["forward", "backward_data", "backward_filter"]


def gemm_workspace(direction: str, batch: int) -> int:
    """What GEMM needs for `direction` at `batch` (float32, contiguous)."""
    x = torch.empty(batch, *X_SHAPE[1:], dtype=torch.float32)
    w = torch.empty(W_SHAPE, dtype=torch.float32)
    desc = ConvDesc.create(2, 1, 1, 1, 1, "cross_correlation", "fp32")
    y_shape = conv_output_shape(x.shape, w.shape, desc)
    y = torch.empty(y_shape, dtype=torch.float32)
    p = ConvProblem.create(
        Direction(direction), TensorDesc.of(x), TensorDesc.of(w), TensorDesc.of(y), desc, "cuda"
    )
    return ALGORITHMS["GEMM"].workspace_bytes(p)


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("policy", ["powerOfTwo", "all"])
def test_measured_plans_fit_and_match_the_reference(direction, policy):
    torch.manual_seed(0)
    n = X_SHAPE[0]
    x = torch.randn(X_SHAPE, device="cuda", dtype=torch.float32)
    w = torch.randn(W_SHAPE, device="cuda", dtype=torch.float32)
    limit = gemm_workspace(direction, n // 2)
    plan = rtdnn.plan_conv(x, w, direction=direction, **CONV, workspace_limit=limit, policy=policy)
    undivided = rtdnn.plan_conv(
        x, w, direction=direction, **CONV, workspace_limit=limit, policy="undivided"
    )
    print(direction, policy, plan, "undivided:", undivided)
    assert sum(b for b, _ in plan.micro_batches) == n
    assert plan.workspace_bytes <= limit
    assert plan.time_ms <= 1.1 * undivided.time_ms

    y = rtdnn.ops.conv_forward(x, w, **CONV)
    dy = torch.randn_like(y)
    alpha, beta = 0.75, 0.5
    args = dict(CONV, alpha=alpha, beta=beta, workspace_limit=limit, micro_batch=policy)
    if direction == "forward":
        prior = torch.randn_like(y)
        got = rtdnn.ops.conv_forward(x, w, out=prior.clone(), **args)
        ref = R.conv_forward(x, w, **REF, alpha=alpha, beta=beta, out=prior)
    elif direction == "backward_data":
        prior = torch.randn_like(x)
        got = rtdnn.conv_backward_data(dy, w, X_SHAPE, out=prior.clone(), **args)
        ref = R.conv_backward_data(dy, w, X_SHAPE, **REF, alpha=alpha, beta=beta, out=prior)
    else:
        prior = torch.randn_like(w)
        got = rtdnn.conv_backward_filter(x, dy, W_SHAPE, out=prior.clone(), **args)
        ref = R.conv_backward_filter(x, dy, W_SHAPE, **REF, alpha=alpha, beta=beta, out=prior)
    err = R.rel_error(got, ref)
    assert err <= 1e-5, f"{plan}: relative error {err:.2e}"
