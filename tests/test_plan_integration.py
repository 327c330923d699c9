"""Micro-batch planning of whole models: rtdnn.convert(workspace_limit=, micro_batch=,
workspace_policy=), rtdnn.plan_network and `rtdnn tune --model`.

The interpreter's timings are noise, so select.find is replaced by made-up times (with the
algorithms' real workspaces) under which splitting the batch wins; the kernels that run are
the real ones, so outputs and gradients are checked against a float64 torch model.
"""

from __future__ import annotations

import copy
import itertools
import json

import pytest
import torch
from conftest import assert_close

import rtdnn
from rtdnn import cli, select
from rtdnn.algos import ALGORITHMS
from rtdnn.network_plan import parse_bytes
from rtdnn.ops import conv_plan
from rtdnn.select import AlgoPerf
from rtdnn.select.plan import desirable_plans

N = 2
# One image takes 1 ms with GEMM (which needs workspace), 1.5 ms with IMPLICIT_GEMM (none);
# anything else 100 ms per image. So a batch of 2 runs fastest as 1 + 1 with GEMM (2 ms), or
# without workspace as 1 + 1 with IMPLICIT_GEMM (3 ms); undivided it takes 200 ms.
FAST = {"GEMM": 1.0, "IMPLICIT_GEMM": 1.5}
SPLIT, NO_WORKSPACE = ((1, "GEMM"), (1, "GEMM")), ((1, "IMPLICIT_GEMM"), (1, "IMPLICIT_GEMM"))


def fake_find(p, tensors):
    def ms(name):
        return FAST[name] if p.batch == 1 and name in FAST else 100.0 * p.batch

    return [
        AlgoPerf(a.name, ms(a.name), a.workspace_bytes(p), a.deterministic(p))
        for a in ALGORITHMS.values()
        if a.supports(p) is None
    ]


@pytest.fixture(autouse=True)
def fake_timings(monkeypatch):
    monkeypatch.setattr(conv_plan, "_plans", {})
    monkeypatch.setattr(conv_plan, "_tables", {})
    monkeypatch.setattr(select, "find", fake_find)


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(2, 4, 3, padding=1, bias=False),
        torch.nn.ReLU(),
        torch.nn.Conv2d(4, 3, 3, stride=2, padding=1),
    )


def step(model, x, dy):
    """Output and the gradients of the parameters and of x for output gradient dy."""
    x = x.detach().clone().requires_grad_()
    y = model(x)
    y.backward(dy)
    grads = [p.grad.clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    return y.detach(), x.grad, grads


def check_step(model, reference, x, dy):
    y, dx, grads = step(model, x, dy)
    ref_y, ref_dx, ref_grads = step(reference, x.double(), dy.double())
    assert_close(y, ref_y)
    assert_close(dx, ref_dx)
    for g, r in zip(grads, ref_grads, strict=True):
        assert_close(g, r)


def inputs():
    torch.manual_seed(1)
    x = torch.randn(N, 2, 5, 5)
    dy = torch.randn(N, 3, 3, 3)
    return x, dy


@pytest.mark.parametrize("limit, micro_batch", [(None, "all"), (0, "powerOfTwo")])
def test_converted_with_micro_batches_matches_torch(limit, micro_batch):
    model = tiny_model()
    reference = copy.deepcopy(model).double()
    converted, report = rtdnn.convert(model, workspace_limit=limit, micro_batch=micro_batch)
    x, dy = inputs()
    check_step(converted, reference, x, dy)
    plans = {(r.layer, r.direction): r.plan for r in report.plans()}
    assert set(plans) == {
        (layer, d) for layer in ("0", "2") for d in ("forward", "backward_data", "backward_filter")
    }
    for plan in plans.values():
        assert plan.batch == N
        if limit == 0:  # GEMM needs workspace
            assert plan.micro_batches == NO_WORKSPACE and plan.workspace_bytes == 0
        else:
            assert plan.micro_batches == SPLIT and plan.workspace_bytes > 0
    printed = str(report)
    assert "planned  2 convolutions" in printed and "backward_filter" in printed
    assert ("2x1 IMPLICIT_GEMM" if limit == 0 else "2x1 GEMM") in printed


def test_default_convert_does_not_plan(monkeypatch):
    monkeypatch.setattr(conv_plan, "plan_for", lambda *a: pytest.fail("planned"))
    converted, report = rtdnn.convert(tiny_model())
    x, dy = inputs()
    # Converted with a policy, then again without: back to the default.
    rtdnn.convert(converted, inplace=True, micro_batch="all")
    rtdnn.convert(converted, inplace=True)
    step(converted, x, dy)
    assert report.tuned == {} and "planned" not in str(report)


def all_fronts(model):
    """Every (layer, direction) front of a planned model, in plan_network's order."""
    fronts = []
    for _, tuning in rtdnn.network_plan.tuned_layers(model):
        for d in ("forward", "backward_data", "backward_filter"):
            if d in tuning.seen:
                seen = tuning.seen[d]
                table = conv_plan.table(seen.problem, seen.policy, seen.deterministic)
                fronts.append(desirable_plans(table, seen.problem.batch, seen.policy))
    return fronts


def test_divide_keeps_the_sum_within_the_budget_at_the_least_time():
    model = tiny_model()
    reference = copy.deepcopy(model).double()
    x, dy = inputs()
    model, _ = rtdnn.convert(model, workspace_limit=1 << 40, workspace_policy="divide",
                             micro_batch="all")  # fmt: skip
    # A first training step measures every layer; each runs within the whole budget.
    check_step(model, reference, x, dy)
    free = rtdnn.plan_network(model)
    fronts = all_fronts(model)
    assert len(free.rows) == len(fronts) == 6
    assert all(r.plan.micro_batches == SPLIT for r in free.rows)
    need = free.workspace_bytes
    assert need > 0 and free.time_ms == 6 * 2.0

    budget = need // 2
    plan = rtdnn.plan_network(model, budget=budget)
    assert plan.workspace_bytes == sum(r.plan.workspace_bytes for r in plan.rows) <= budget
    # The least total time of any choice within the budget, by brute force.
    best = min(
        sum(p.time_ms for p in combo)
        for combo in itertools.product(*fronts)
        if sum(p.workspace_bytes for p in combo) <= budget
    )
    assert plan.time_ms == pytest.approx(best) and 6 * 2.0 < plan.time_ms < 6 * 3.0
    assert plan.undivided_ms == pytest.approx(6 * 200.0)
    printed = str(plan)
    assert "workspace_policy='divide'" in printed and "vs undivided" in printed

    # Each direction now runs within its share, by the plan chosen for it.
    check_step(model, reference, x, dy)
    chosen = {(r.layer, r.direction): r.plan for r in plan.rows}
    for path, tuning in rtdnn.network_plan.tuned_layers(model):
        for d, seen in tuning.seen.items():
            assert seen.workspace_limit == tuning.limits[d] == chosen[path, d].workspace_bytes
            assert seen.plan.time_ms == chosen[path, d].time_ms


def test_plan_network_leaves_the_model_as_it_was():
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.BatchNorm2d(3))
    converted, _ = rtdnn.convert(model, micro_batch="all")
    before = copy.deepcopy(converted.state_dict())
    x, _ = inputs()
    plan = rtdnn.plan_network(converted, x)  # x needs no gradient: no backward-data
    assert [r.direction for r in plan.rows] == ["forward", "backward_filter"]
    assert all(p.grad is None for p in converted.parameters())
    after = converted.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    forward_only = rtdnn.plan_network(converted, x, backward=False)
    assert [r.direction for r in forward_only.rows] == ["forward"]


# -- rtdnn tune --model ---------------------------------------------------------------------


@pytest.fixture
def tiny_suite(tmp_path):
    layer = dict(n=N, c=2, k=3, spatial=[4, 4], kernel=[3, 3], stride=[1, 1], padding=[1, 1],
                 dilation=[1, 1], groups=1)  # fmt: skip
    path = tmp_path / "tiny.json"
    suite = {"suite": "tiny", "layers": [dict(layer, name="first"), dict(layer, name="second")]}
    path.write_text(json.dumps(suite))
    return str(path)


@pytest.mark.parametrize("policy", ["reuse", "divide"])
def test_tune_prints_the_plan_of_a_suite(tiny_suite, capsys, policy):
    argv = ["tune", "--model", tiny_suite, "--batch", "2", "--workspace-limit", "1MiB"]
    assert cli.main([*argv, "--workspace-policy", policy]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for layer in ("first", "second"):
        for d in ("forward", "backward_data", "backward_filter"):
            assert any(line.startswith(layer) and d in line for line in lines), out
    assert "2x1 GEMM" in out and f"workspace_policy={policy!r}" in out
    total = next(line for line in lines if line.startswith("total"))
    assert "100.00x vs undivided" in total  # 6 x 200 ms undivided, 6 x 2 ms planned


def test_tune_forward_at_the_suites_batch(tiny_suite, capsys):
    assert cli.main(["tune", "--model", tiny_suite, "--direction", "forward"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if line.startswith(("first", "second"))]
    assert [r.split()[1:3] for r in rows] == [["forward", str(N)]] * 2, lines


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(micro_batch="ALL"), "micro_batch"),
        (dict(micro_batch=None), "micro_batch"),
        (dict(workspace_limit=-1), "workspace_limit"),
        (dict(workspace_limit=1.5), "workspace_limit"),
        (dict(workspace_limit=True), "workspace_limit"),
        (dict(workspace_policy="share"), "workspace_policy"),
        (dict(workspace_policy="divide"), "workspace_limit"),  # a budget is needed
    ],
)
def test_convert_refuses_bad_settings(kwargs, name):
    model = tiny_model()
    with pytest.raises(rtdnn.BadParamError, match=name):
        rtdnn.convert(model, inplace=True, **kwargs)
    assert type(model[0]) is torch.nn.Conv2d  # nothing converted


def test_plan_network_needs_a_planned_model():
    converted, _ = rtdnn.convert(tiny_model())
    with pytest.raises(rtdnn.BadParamError, match="model"):
        rtdnn.plan_network(converted, inputs()[0])
    planned, _ = rtdnn.convert(tiny_model(), micro_batch="all")
    with pytest.raises(rtdnn.BadParamError, match="directions"):
        rtdnn.plan_network(planned, inputs()[0], directions="forward")
    with pytest.raises(rtdnn.BadParamError, match="budget"):
        rtdnn.plan_network(planned, inputs()[0], budget=-1)
    with pytest.raises(rtdnn.BadParamError, match="example_input"):
        rtdnn.plan_network(planned)  # nothing has run yet


def test_parse_bytes():
    assert parse_bytes("b", "64MiB") == 64 << 20 and parse_bytes("b", "1.5 GiB") == 3 << 29
    assert parse_bytes("b", "100MB") == 10**8 and parse_bytes("b", "0") == 0
    for bad in ("-1", "1.5", "lots", "5 XB", ""):
        with pytest.raises(rtdnn.BadParamError, match="budget"):
            parse_bytes("budget", bad)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--workspace-limit", "-5"], ["--workspace-limit", "-5"]),
        (["--workspace-limit", "1.5"], ["--workspace-limit", "1.5"]),
        (["--workspace-limit", "lots"], ["--workspace-limit", "lots"]),
        (["--policy", "half"], ["--policy", "half", "powerOfTwo"]),
        (["--workspace-policy", "share"], ["--workspace-policy", "share"]),
        (["--workspace-policy", "divide"], ["--workspace-policy divide", "--workspace-limit"]),
        (["--batch", "0"], ["--batch", "positive"]),
    ],
)
def test_tune_bad_options_exit_2(tiny_suite, capsys, monkeypatch, argv, words):
    monkeypatch.setattr(cli, "_tune", lambda args: pytest.fail("work started"))
    with pytest.raises(SystemExit) as e:
        cli.main(["tune", "--model", tiny_suite, *argv])
    assert e.value.code == 2
    line = next(ln for ln in capsys.readouterr().err.splitlines() if ": error: " in ln)
    for word in words:
        assert word in line, line


@pytest.mark.parametrize(
    "argv, words",
    [
        (["tune", "--list", "--batch", "2"], ["--batch", "only with --model"]),
        (["tune", "--clear", "--workspace-limit", "1MiB"], ["--workspace-limit", "--model"]),
        (["tune", "--model", "nosuchnet"], ["--model", "nosuchnet"]),
        (["tune", "--model", "small", "--list"], ["--list", "not allowed with", "--model"]),
    ],
)
def test_tune_option_groups(capsys, monkeypatch, argv, words):
    monkeypatch.setattr(cli, "_tune", lambda args: pytest.fail("work started"))
    monkeypatch.setattr(cli, "_installed", lambda name: False)  # no torchvision
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    line = next(ln for ln in capsys.readouterr().err.splitlines() if ": error: " in ln)
    for word in words:
        assert word in line, line
