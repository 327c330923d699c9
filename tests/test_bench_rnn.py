"""`rtdnn bench --op rnn`'s harness on the CPU: the suite's cases, the work count, and one tiny
case run through the interpreter with made-up timings (the GPU run times both sides for real)."""

import pytest
import torch

from rtdnn.bench import rnn as bench


def test_suite_cases():
    cases = bench.cases()
    assert 12 <= len(cases) <= 16
    assert cases[0] == bench.RnnCase("lstm", 2, 1024, 1024, 128, 64)  # the target case first
    assert {c.mode for c in cases} == {"lstm", "gru"}
    assert min(c.hidden for c in cases) == 256 and max(c.hidden for c in cases) == 2048
    assert min(c.steps for c in cases) == 50 and max(c.steps for c in cases) == 1500
    assert min(c.batch for c in cases) == 16 and max(c.batch for c in cases) == 128
    assert any(c.bidirectional and c.layers == 3 and c.hidden == 1024 for c in cases)
    assert len({c.name for c in cases}) == len(cases)


def test_forward_flops():
    # One layer: T x N x 2 x gates x H x (I + H).
    assert bench.RnnCase("gru", 1, 8, 4, 5, 2).forward_flops() == 5 * 2 * 2 * 3 * 8 * (4 + 8)
    # Two bidirectional layers: the second reads both directions' outputs (2 H).
    case = bench.RnnCase("lstm", 2, 8, 4, 5, 2, bidirectional=True)
    per_step = 2 * 4 * 8 * ((4 + 8) + (16 + 8))
    assert case.forward_flops() == 2 * 5 * 2 * per_step


@pytest.mark.parametrize("mode", ("lstm", "gru"))
def test_one_case_rows(monkeypatch, mode):
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    times = iter([1.0, 2.0, 1.0, 2.0])  # rtdnn then torch, per direction
    monkeypatch.setattr(bench, "device_time_ms", lambda fn, **kw: (fn(), next(times))[1])
    case = bench.RnnCase(mode, 2, 16, 16, 3, 2, bidirectional=True)
    torch.manual_seed(0)
    rows = bench.run_case(case, ceiling=100.0, dtype=torch.float32)
    assert [r.direction for r in rows] == ["forward", "forward+backward"]
    for r in rows:
        assert r.ok and 0 <= r.err < 1e-4, r
        assert r.ratio == pytest.approx(2.0)
    assert rows[0].rtdnn_tflops == pytest.approx(case.forward_flops() / 1e9)
    assert rows[1].rtdnn_tflops == pytest.approx(3 * case.forward_flops() / 1e9)
    assert rows[1].rtdnn_pct == pytest.approx(rows[1].rtdnn_tflops)
    assert f"| {case.name} | forward |" in bench.markdown(rows, "t")


def test_disagreement_is_flagged(monkeypatch):
    """rtdnn's module given other recurrent weights than torch's: both rows say NO."""
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "device_time_ms", lambda fn, **kw: (fn(), 1.0)[1])
    make = bench._modules

    def perturbed(case, dtype):
        ours, theirs = make(case, dtype)
        with torch.no_grad():
            ours.weight_hh_l0.mul_(1.5)
        return ours, theirs

    monkeypatch.setattr(bench, "_modules", perturbed)
    rows = bench.run_case(bench.RnnCase("gru", 1, 16, 16, 3, 2), 100.0, torch.float32)
    assert [r.ok for r in rows] == [False, False]
    assert all(r.err > 1e-3 for r in rows)
    assert "| NO (" in bench.markdown(rows, "t")
