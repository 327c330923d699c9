"""`rtdnn bench --micro-batch` (bench.micro_batch), end to end on the CPU: two tiny layers at a
batch of 4, limits small enough that splitting the batch matters.

The interpreter's timings are noise, so select.find is replaced by made-up times (the
algorithms' real workspaces): an algorithm that needs no workspace costs 3 ms a sample, one
that needs some 1 ms a sample, each plus 0.25 ms a launch. Under a limit that only micro-batches
fit, splitting then pays; under one the whole batch fits, it does not (a launch more costs
0.25 ms). The chosen plans do run, through the real kernels, and are checked against the
undivided plan's output.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from rtdnn import select
from rtdnn.algos import ALGORITHMS
from rtdnn.bench import micro_batch
from rtdnn.core import BadParamError
from rtdnn.select import AlgoPerf

KiB = 1 << 10
# GEMM needs 2.25 KiB a sample on the strided layer (tiny3x3s2): the whole batch does not fit
# 4 KiB, one sample does (split-K's backward-data: two samples). Split-K's backward-filter
# needs 9 KiB a sample on tiny3x3: one sample fits 16 KiB, two do not. At 4 MiB every
# algorithm fits the whole batch.
LIMITS = (4 * KiB, 16 * KiB, 4096 * KiB)
BUDGET = 40 * KiB  # for all nine convolutions: the division has to trade
POLICIES = ("undivided", "powerOfTwo", "all")


def made_up_find(p, tensors, refresh=False):
    results = []
    for a in ALGORITHMS.values():
        if a.supports(p) is None:
            ws = a.workspace_bytes(p)
            # The workspace-hungry algorithms are the fast ones; IMPLICIT_PRECOMP_GEMM's small
            # table buys no speed here (it runs like IMPLICIT_GEMM).
            slow = not ws or a.name == "IMPLICIT_PRECOMP_GEMM"
            per_sample = 5.0 if a.name == "DIRECT" else 3.0 if slow else 1.0
            ms = per_sample * p.batch + 0.25
            results.append(AlgoPerf(a.name, ms, ws, a.deterministic(p)))
    return sorted(results, key=lambda r: r.time_ms)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("micro_batch")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(select, "find", made_up_find)
        result = micro_batch.run(
            micro_batch.TINY, suite="tiny", batch=4, limits=LIMITS, budget=BUDGET,
            out_dir=str(out), progress=lambda line: None,
        )  # fmt: skip
    return result, out


def rows(report, **match):
    return [r for r in report["plans"] if all(r[k] == v for k, v in match.items())]


def test_tables_have_every_setting_kernel_and_policy(report):
    r, _ = report
    kernels = [(k["layer"], k["direction"]) for k in r["kernels"]]
    assert len(kernels) == 2 * 3 and r["convolutions"] == (1 + 2) * 3
    settings = [s["name"] for s in r["settings"]]
    assert settings == ["reuse 4 KiB", "reuse 16 KiB", "reuse 4 MiB", "divide 40 KiB"]
    assert len(r["plans"]) == len(settings) * len(kernels) * len(POLICIES)
    assert [(t["setting"], t["policy"]) for t in r["totals"]] == [
        (s, p) for s in settings for p in POLICIES
    ]
    assert r["timing"] == "interpreter" and r["batch"] == 4
    assert set(r["cost"]["benchmark_s"]) == set(POLICIES)
    assert r["cost"]["sizes"] == {"undivided": 1, "powerOfTwo": 3, "all": 4}
    assert all(r["cost"]["ilp_s"][p] > 0 for p in POLICIES)


def test_micro_batches_add_up_and_keep_to_the_policy(report):
    r, _ = report
    for row in r["plans"]:
        for plan in row["plans"]:
            sizes = [b for b, _ in plan["micro_batches"]]
            assert sum(sizes) == 4, row
            if row["policy"] == "undivided":
                assert sizes == [4]
            if row["policy"] == "powerOfTwo":
                assert set(sizes) <= {1, 2, 4}
        assert sum(p["convolutions"] for p in row["plans"]) == row["count"]


def test_every_plan_keeps_to_its_workspace(report):
    r, _ = report
    for s in r["settings"]:
        for policy in POLICIES:
            sub = rows(r, setting=s["name"], policy=policy)
            if s["policy"] == "reuse":
                assert all(
                    p["workspace_bytes"] <= s["limit_bytes"] for x in sub for p in x["plans"]
                )
            else:  # one budget for the sum of every convolution's buffer
                held = sum(
                    p["workspace_bytes"] * p["convolutions"] for x in sub for p in x["plans"]
                )
                assert held <= s["limit_bytes"]
                (total,) = [t for t in r["totals"] if t["setting"] == s["name"]
                            and t["policy"] == policy]  # fmt: skip
                assert total["workspace_bytes"] == held


def test_no_plan_slower_than_undivided_and_splitting_pays_where_it_should(report):
    r, _ = report
    for row in r["plans"]:
        if row["setting"].startswith("reuse"):  # per layer under a per-layer limit
            assert row["planned_speedup"] >= 1.0, row
    for total in r["totals"]:
        assert total["planned_speedup"] >= 1.0, total
        # Without the first layer's (tiny3x3's) backward-data: the same plans, one row less.
        (input_grad,) = rows(r, setting=total["setting"], policy=total["policy"],
                             layer="tiny3x3", direction="backward_data")  # fmt: skip
        no_input = total["planned_ms"] - input_grad["planned_ms"]
        assert total["no_input_grad_ms"] == pytest.approx(no_input), total
        assert total["no_input_grad_speedup"] >= 1.0, total
    # (setting, layer, direction, the fast algorithm, the micro-batch sizes it fits in):
    # split-K's backward-data partial sums fit 4 KiB for two samples, GEMM's column matrix for
    # one.
    for setting, layer, direction, algo, sizes in [
        ("reuse 4 KiB", "tiny3x3s2", "forward", "GEMM", [1] * 4),
        ("reuse 4 KiB", "tiny3x3s2", "backward_data", "IMPLICIT_GEMM_SPLIT_K", [2, 2]),
        ("reuse 16 KiB", "tiny3x3", "backward_filter", "IMPLICIT_GEMM_SPLIT_K", [1] * 4),
    ]:
        for policy in ("powerOfTwo", "all"):
            (x,) = rows(r, setting=setting, layer=layer, direction=direction, policy=policy)
            assert x["plans"][0]["micro_batches"] == [[b, algo] for b in sizes]
            planned = sum(1.0 * b + 0.25 for b in sizes)  # made_up_find's cost model
            assert x["planned_speedup"] == pytest.approx((3 * 4 + 0.25) / planned)
            assert x["unlocked"] == [algo]
    loose = rows(r, setting="reuse 4 MiB")
    assert all(x["planned_speedup"] == 1.0 and not x["unlocked"] for x in loose)
    assert all(x["plans"][0]["micro_batches"] == [[4, x["plans"][0]["micro_batches"][0][1]]]
               for x in loose)  # fmt: skip


def test_the_plans_ran_and_agree_with_undivided(report):
    r, _ = report
    for row in r["plans"]:
        assert math.isfinite(row["run_ms"]) and row["run_ms"] > 0, row
        assert row["rel_err"] < 1e-4, row
    assert r["disagree"] == 0


def test_files_written_and_timings_labelled(report):
    r, out = report
    md = (out / "micro_batch_tiny.md").read_text()
    assert "Triton interpreter on the CPU, not GPU times" in md
    assert "1.63x" in md and "1.21x" in md and "arXiv 1804.04806" in md
    assert "#### reuse 16 KiB: per layer" in md and "#### Planning cost" in md
    assert "no input grad ms" in md
    with open(out / "micro_batch_tiny.json") as f:
        stored = json.load(f, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    assert stored["totals"] == json.loads(json.dumps(r["totals"]))


def test_figure_written(report):
    pytest.importorskip("matplotlib", reason="the figure needs matplotlib (the demo extra)")
    r, out = report
    png = out / "micro_batch_tiny_pareto.png"
    assert r["figure"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (
        "![Pareto front](micro_batch_tiny_pareto.png)" in (out / "micro_batch_tiny.md").read_text()
    )


def test_default_budget_is_the_middle_limit_for_every_convolution(monkeypatch):
    monkeypatch.setattr(select, "find", made_up_find)
    r = micro_batch.run(
        micro_batch.TINY[:1], suite="tiny", batch=2, limits=LIMITS, execute=False,
        progress=lambda line: None,
    )  # fmt: skip
    assert r["settings"][-1] == {
        "name": "divide 48 KiB",
        "policy": "divide",
        "limit_bytes": 48 * KiB,
    }
    assert all(math.isnan(row["run_ms"]) for row in r["plans"])


def test_unknown_policy_refused():
    with pytest.raises(BadParamError, match="sideways"):
        micro_batch.run(micro_batch.TINY, suite="tiny", batch=4, policies=["sideways"])


def test_compile_ahead_runs_every_supported_algorithm_once(monkeypatch):
    """What a compiling worker does for one (layer, size, direction): every algorithm that
    supports the problem runs once (here in the interpreter), none fails; with fewer than two
    workers nothing is spawned."""
    from rtdnn.algos import supported_algorithms

    # The worker turns tile tuning off for its process; monkeypatch restores this one's.
    monkeypatch.setenv("RTDNN_AUTOTUNE", "0")

    layer = micro_batch.TINY[1]
    conv, t = micro_batch.operands(layer, 2, torch.float32, "cpu")
    for direction in ("forward", "backward_filter"):
        p = micro_batch.problem(direction, conv, t)
        ran = micro_batch._compile_one((layer, 2, "float32", direction, "cpu"))
        assert ran == len(supported_algorithms(p)) > 1
    assert micro_batch.compile_ahead(micro_batch.TINY, 4, "float32", ["forward"], ["all"], 1) == (
        0,
        0.0,
    )


def test_stored_sizes_read_from_a_problem_built_on_the_meta_device():
    """compile_ahead skips the sizes the tuning database holds: it finds them from operands on
    the meta device (no memory), which must give the keys that measuring on real ones stored."""
    from rtdnn.select import database

    layer = micro_batch.TINY[1]
    conv, t = micro_batch.operands(layer, 4, torch.float32, "cpu")
    p = micro_batch.problem("backward_filter", conv, t)
    env = database.environment("cpu")
    q, _ = micro_batch.sub_problem(p, t, 0, 2)
    database.database().store(q.key(), 2, env, [AlgoPerf("IMPLICIT_GEMM", 1.0, 0, True)])

    conv, meta = micro_batch.operands(layer, 4, torch.float32, "meta")
    assert meta.x.device.type == "meta"
    p_meta = micro_batch.problem("backward_filter", conv, meta, "cpu")
    assert p_meta.key() == p.key()
    assert micro_batch.stored_sizes(p_meta, meta, [1, 2, 3, 4], env) == [2]
