"""`rtdnn demo` end to end on a tiny budget: data loading, a training step through every rtdnn
module of the network, evaluation and the loss plot."""

from __future__ import annotations

import pytest

pytest.importorskip("sklearn", reason="the demo's data set ships with scikit-learn")


@pytest.mark.slow
def test_demo_runs_and_reports(tmp_path):
    from rtdnn.demo import train

    plot = tmp_path / "loss.png"
    result = train(epochs=1, budget_s=0.1, plot=str(plot) if _has_matplotlib() else None)
    assert result["steps"] == 1 and result["stopped_at_budget"]
    assert 0.0 <= result["accuracy"] <= 1.0
    assert len(result["losses"]) == 1 and result["losses"][0] > 0
    if _has_matplotlib():
        assert plot.stat().st_size > 0


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True
