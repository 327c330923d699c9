"""Whole-model micro-batch planning on the GPU with measured times: a converted model under a
workspace limit gives the float64 reference's outputs and gradients, every plan fits its limit,
the divided budget holds and is never slower than undivided, and `rtdnn tune --model` plans a
shipped suite. Run with RTDNN_GPU_TESTS=1 on a machine with a CUDA GPU."""

import copy

import pytest
import torch
from conftest import assert_close, gpu_only

import rtdnn
from rtdnn import cli

pytestmark = gpu_only()

LIMIT = 256 << 10  # below what GEMM needs for the whole batch of these layers


@pytest.fixture(autouse=True)
def strict_float32(monkeypatch):
    # The modules follow torch's TF32 setting: off, so the float64 comparison is strict.
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)


def model_and_data():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(32, 64, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(64, 64, 3, stride=2, padding=1, bias=False),
    ).cuda()
    x = torch.randn(16, 32, 28, 28, device="cuda")
    dy = torch.randn(16, 64, 14, 14, device="cuda")
    return model, x, dy


def step(model, x, dy):
    x = x.detach().clone().requires_grad_()
    y = model(x)
    y.backward(dy)
    grads = [p.grad.clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    return [y.detach(), x.grad, *grads]


@pytest.mark.parametrize("workspace_policy", ["reuse", "divide"])
def test_planned_model_matches_float64(workspace_policy):
    model, x, dy = model_and_data()
    reference = step(copy.deepcopy(model).double(), x.double(), dy.double())
    converted, report = rtdnn.convert(
        model, workspace_limit=LIMIT, micro_batch="all", workspace_policy=workspace_policy
    )
    plan = rtdnn.plan_network(converted, x.clone().requires_grad_())
    assert len(plan.rows) == 6
    if workspace_policy == "divide":
        assert sum(r.plan.workspace_bytes for r in plan.rows) <= LIMIT
    else:
        assert all(r.plan.workspace_bytes <= LIMIT for r in plan.rows)
    # Undivided is among the candidates: never slower on the same measurements.
    assert plan.time_ms <= plan.undivided_ms * (1 + 1e-9)
    print(plan)
    for got, ref in zip(step(converted, x, dy), reference, strict=True):
        assert_close(got, ref)
    for r in report.plans():
        assert r.plan.workspace_bytes <= LIMIT
    print(report)


def test_tune_plans_a_shipped_suite(capsys):
    argv = ["tune", "--model", "alexnet", "--batch", "16", "--workspace-limit", "8MiB"]
    assert cli.main([*argv, "--policy", "powerOfTwo"]) == 0
    out = capsys.readouterr().out
    print(out)
    rows = [line for line in out.splitlines() if line.startswith("conv")]
    assert len(rows) == 15  # five layers, three directions
    assert "vs undivided" in out
