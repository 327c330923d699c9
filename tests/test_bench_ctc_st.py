"""`rtdnn bench --op ctc` and `--op grid_sample`'s harnesses on the CPU: the suites' cases, the
inputs they draw and the bytes they count, and tiny cases run through the interpreter with
made-up timings (the GPU run times both sides for real)."""

import math

import pytest
import torch

from rtdnn.bench import ctc as ctc_bench
from rtdnn.bench import grid_sample as grid_bench


def test_ctc_cases():
    cases = ctc_bench.cases()
    assert 6 <= len(cases) <= 8
    assert {c.steps for c in cases} >= {200, 1000} and all(200 <= c.steps <= 1000 for c in cases)
    assert {c.batch for c in cases} == {32, 64}
    assert min(c.classes for c in cases) == 29 and max(c.classes for c in cases) == 5000
    assert max(c.max_target for c in cases) == 200
    assert all(2 * c.max_target < c.steps for c in cases)  # every target alignable
    assert any(not c.full_lengths for c in cases) and any(c.full_lengths for c in cases)
    assert len({c.name for c in cases}) == len(cases)


@pytest.mark.parametrize("full", (True, False))
def test_ctc_inputs_are_feasible(monkeypatch, full):
    monkeypatch.setattr(ctc_bench, "DEVICE", "cpu")
    case = ctc_bench.CtcCase(40, 6, 7, 12, full_lengths=full)
    inputs = ctc_bench.make_inputs(case, torch.Generator().manual_seed(1))
    assert inputs.log_probs.shape == (40, 6, 7) and inputs.log_probs.requires_grad
    assert inputs.log_probs.exp().sum(-1).sub(1).abs().max() < 1e-5
    assert inputs.targets.shape == (6, 12) and 1 <= inputs.targets.min() <= inputs.targets.max() < 7
    assert max(inputs.target_lengths) == 12
    assert all(
        2 * s + 1 <= t for s, t in zip(inputs.target_lengths, inputs.input_lengths, strict=True)
    )
    assert max(inputs.input_lengths) == 40
    assert (min(inputs.input_lengths) == 40) == full


@pytest.mark.parametrize("full", (True, False))
def test_ctc_one_case_rows(monkeypatch, full):
    monkeypatch.setattr(ctc_bench, "DEVICE", "cpu")
    monkeypatch.setattr(ctc_bench, "device_time_ms", lambda fn, **kw: (fn(), 1.0)[1])
    seen = []

    def time_torch(calls):
        seen.append(sorted(calls))
        for call in calls.values():
            call()
        return 3.0, "native"

    monkeypatch.setattr(ctc_bench, "_time_torch", time_torch)
    case = ctc_bench.CtcCase(12, 3, 5, 4, full_lengths=full)
    rows = ctc_bench.run_case(case, torch.Generator().manual_seed(0))
    assert seen == [["native"], ["native"]]  # no cuDNN off a GPU
    assert [r.direction for r in rows] == ["forward", "forward+backward"]
    for r in rows:
        assert r.ok and r.err < 1e-5, r
        assert r.ratio == pytest.approx(3.0) and r.torch_backend == "native"
    assert f"| {case.name} | forward+backward |" in ctc_bench.markdown(rows, "t")


def test_grid_cases_and_bytes():
    cases = grid_bench.cases()
    two_d = [c for c in cases if len(c.shape) == 4]
    assert all(c.shape == (64, 64, 128, 128) for c in two_d)
    assert {(c.mode, c.padding_mode, c.align_corners) for c in two_d} == {
        (m, p, a)
        for m in ("bilinear", "nearest")
        for p in ("zeros", "border", "reflection")
        for a in (False, True)
    }
    three_d = [c for c in cases if len(c.shape) == 5]
    assert len(three_d) == 1 and three_d[0].mode == "bilinear" and "trilinear" in three_d[0].name
    assert math.prod(three_d[0].shape) == math.prod(two_d[0].shape)
    case = grid_bench.GridCase((2, 3, 4, 5), "bilinear", "zeros", True)
    grid = 2 * 4 * 5 * 2
    assert case.forward_bytes() == 4 * (2 * 120 + 2 * grid)
    assert case.backward_bytes() == 4 * (3 * 120 + 3 * grid)
    # torch's rule for cuDNN's sampler: 2-D bilinear, zeros, align_corners, on a GPU.
    cudnn = torch.backends.cudnn.is_available() and torch.backends.cudnn.enabled
    assert case.torch_backend("cuda") == ("cudnn" if cudnn else "native")
    assert case.torch_backend("cpu") == "native"
    for other in (
        grid_bench.GridCase((2, 3, 4, 5), "bilinear", "zeros", False),
        grid_bench.GridCase((2, 3, 4, 5), "nearest", "zeros", True),
        grid_bench.GridCase((2, 3, 4, 5), "bilinear", "border", True),
        grid_bench.GridCase((2, 3, 4, 5, 6), "bilinear", "zeros", True),
    ):
        assert other.torch_backend("cuda") == "native"


@pytest.mark.parametrize("dims", (2, 3))
def test_theta_is_a_mild_map(dims):
    theta = grid_bench.make_theta(64, dims, torch.Generator().manual_seed(0))
    assert theta.shape == (64, dims, dims + 1)
    linear = theta[:, :, :dims]
    zoom = torch.linalg.det(linear).abs() ** (1 / dims)
    assert zoom.min() >= 0.9 - 1e-6 and zoom.max() <= 1.1 + 1e-6
    assert theta[:, :, dims].abs().max() <= 0.1
    rotation = torch.atan2(theta[:, 1, 0], theta[:, 0, 0])
    assert rotation.abs().max() <= math.radians(15) + 1e-6 and rotation.abs().max() > 0


@pytest.mark.parametrize(
    "case",
    (
        grid_bench.GridCase((2, 3, 5, 6), "bilinear", "reflection", False),
        grid_bench.GridCase((2, 3, 5, 6), "nearest", "border", True),
        grid_bench.GridCase((1, 2, 3, 4, 5), "bilinear", "zeros", False),
    ),
    ids=lambda c: c.name,
)
def test_grid_one_case_rows(monkeypatch, case):
    monkeypatch.setattr(grid_bench, "DEVICE", "cpu")
    times = iter([1.0, 2.0, 1.0, 2.0])  # rtdnn then torch, per direction
    monkeypatch.setattr(grid_bench, "device_time_ms", lambda fn, **kw: (fn(), next(times))[1])
    rows = grid_bench.run_case(case, copy_gbs=1.0, gen=torch.Generator().manual_seed(0))
    assert [r.direction for r in rows] == ["forward", "forward+backward"]
    for r in rows:
        assert r.ok and r.err < 1e-5, r
        assert r.ratio == pytest.approx(2.0) and r.torch_backend == "native"
    assert rows[0].rtdnn_gbs == pytest.approx(case.forward_bytes() / 1e6)
    total = case.forward_bytes() + case.backward_bytes()
    assert rows[1].rtdnn_gbs == pytest.approx(total / 1e6)
    assert rows[1].rtdnn_pct == pytest.approx(100 * rows[1].rtdnn_gbs)
    assert f"| {case.name} | forward |" in grid_bench.markdown(rows, "t")


def test_disagreement_is_flagged(monkeypatch):
    """Results 1% off torch's: every row says NO (the bars are far tighter)."""
    import rtdnn

    F = torch.nn.functional
    monkeypatch.setattr(rtdnn, "ctc_loss", lambda *a: 1.01 * F.ctc_loss(*a))
    monkeypatch.setattr(rtdnn, "grid_sample", lambda *a, **kw: 1.01 * F.grid_sample(*a, **kw))
    for bench in (ctc_bench, grid_bench):
        monkeypatch.setattr(bench, "DEVICE", "cpu")
        monkeypatch.setattr(bench, "device_time_ms", lambda fn, **kw: (fn(), 1.0)[1])
    gen = torch.Generator().manual_seed(0)
    rows = ctc_bench.run_case(ctc_bench.CtcCase(12, 3, 5, 4), gen)
    case = grid_bench.GridCase((2, 3, 5, 6), "bilinear", "zeros", True)
    rows += grid_bench.run_case(case, copy_gbs=1.0, gen=gen)
    assert [r.ok for r in rows] == [False] * 4
    assert all(r.err == pytest.approx(1e-2, rel=1e-3) for r in rows)
