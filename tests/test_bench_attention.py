"""`rtdnn bench --op attention`'s harness on the CPU: the suite's cases, and one tiny case run
through the interpreter with made-up timings (the GPU run times both sides for real)."""

import pytest
import torch

from rtdnn.bench import attention as bench


def test_suite_cases():
    cases = bench.cases()
    assert {c.seq for c in cases} == {512, 1024, 2048, 4096, 8192, 16384}
    assert {c.head_dim for c in cases} == {64, 128}
    assert any(c.causal for c in cases) and any(not c.causal for c in cases)
    gqa = [c for c in cases if c.kv_heads != c.heads]
    assert gqa and all(c.heads % c.kv_heads == 0 for c in gqa)
    # Work per case stays within a factor 4 across the suite (the batch shrinks with L).
    work = [c.batch * c.heads * c.seq**2 for c in cases]
    assert max(work) <= 4 * min(work)
    full = bench.AttentionCase(2, 4, 4, 8, 16, False)
    assert full.forward_flops() == 2 * 4 * 4 * 8 * 8 * 16
    assert bench.AttentionCase(2, 4, 4, 8, 16, True).forward_flops() == full.forward_flops() / 2


def test_one_case_rows(monkeypatch):
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "device_time_ms", lambda fn, **kw: (fn(), 1.0)[1])
    monkeypatch.setattr(bench, "_time_torch", lambda run: (run(), (2.0, "flash"))[1])
    case = bench.AttentionCase(1, 2, 1, 8, 16, True)
    rows = bench.run_case(case, ceiling=100.0, dtype=torch.float32)
    assert [r.direction for r in rows] == ["forward", "forward+backward"]
    for r in rows:
        assert r.ok and r.err < 1e-5, r
        assert r.ratio == pytest.approx(2.0) and r.torch_backend == "flash"
    assert rows[0].rtdnn_tflops == pytest.approx(case.forward_flops() / 1e9)
    assert rows[1].rtdnn_tflops == pytest.approx(3.5 * case.forward_flops() / 1e9)
    assert "| N1 H2/1kv L8 E16 causal | forward |" in bench.markdown(rows, "t")
