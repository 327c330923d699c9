"""Micro-batch planning as pure functions: the dynamic program over the batch (Pareto fronts of
time against workspace, the three policies), workspace reuse and the network-wide workspace
division (an integer linear program), on hand-made tables with known optima and against brute
force on random ones."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rtdnn
from rtdnn.select.plan import (
    Plan,
    batch_sizes,
    best_plan,
    desirable_plans,
    divide_workspace,
    pareto_front,
    reuse_workspace,
)

MiB = 1 << 20


def fast_and_slow(batch: int, per_sample_ws: int = 100, overhead: float = 0.25) -> dict:
    """FAST costs 1 ms a sample plus a launch overhead and needs workspace in proportion to
    the batch; SLOW needs none and costs 3 ms a sample. (Times are exact binary fractions, so
    equal sums compare equal.)"""
    return {
        b: [("FAST", b + overhead, b * per_sample_ws), ("SLOW", 3.0 * b, 0)]
        for b in range(1, batch + 1)
    }


def time_of(plan: Plan, table: dict) -> float:
    """The plan's time recomputed from the table, and a check of its workspace."""
    entries = {(b, a): (t, ws) for b, rows in table.items() for a, t, ws in rows}
    assert plan.workspace_bytes == max(entries[m][1] for m in plan.micro_batches)
    return sum(entries[m][0] for m in plan.micro_batches)


# -- batch sizes per policy ------------------------------------------------------------------


def test_batch_sizes_per_policy():
    assert batch_sizes("undivided", 6) == [6]
    assert batch_sizes("powerOfTwo", 6) == [1, 2, 4, 6]
    assert batch_sizes("powerOfTwo", 8) == [1, 2, 4, 8]
    assert batch_sizes("powerOfTwo", 1) == [1]
    assert batch_sizes("all", 4) == [1, 2, 3, 4]


@pytest.mark.parametrize("policy", ["ALL", "power_of_two", "", None, 2])
def test_unknown_policy_is_refused(policy):
    with pytest.raises(rtdnn.BadParamError, match="policy"):
        batch_sizes(policy, 4)
    with pytest.raises(rtdnn.BadParamError, match="policy"):
        desirable_plans(fast_and_slow(4), 4, policy)


@pytest.mark.parametrize("limit", [-1, 1.5, "1MiB", True])
def test_bad_workspace_limit_is_refused(limit):
    with pytest.raises(rtdnn.BadParamError, match="workspace_limit"):
        desirable_plans(fast_and_slow(4), 4, "all", limit)


# -- the dynamic program on known optima -----------------------------------------------------


def test_splitting_wins_under_a_tight_limit():
    table = fast_and_slow(4)  # FAST at b needs 100 * b bytes
    # Undivided, only SLOW fits 200 bytes: 12 ms.
    assert best_plan(table, 4, "undivided", 200) == Plan(((4, "SLOW"),), 12.0, 0)
    # Split in two halves, FAST fits: 2 * 2.25 ms (four singles would cost 4 * 1.25).
    assert best_plan(table, 4, "all", 200) == Plan(((2, "FAST"), (2, "FAST")), 4.5, 200)
    assert best_plan(table, 4, "powerOfTwo", 200) == Plan(((2, "FAST"), (2, "FAST")), 4.5, 200)
    # Under 100 bytes only single samples run FAST.
    assert best_plan(table, 4, "all", 100) == Plan(((1, "FAST"),) * 4, 5.0, 100)


def test_splitting_does_not_win_when_the_fast_algorithm_fits():
    table = fast_and_slow(4)
    for policy in ("undivided", "powerOfTwo", "all"):
        assert best_plan(table, 4, policy) == Plan(((4, "FAST"),), 4.25, 400)
        assert best_plan(table, 4, policy, 400) == Plan(((4, "FAST"),), 4.25, 400)


def test_the_policy_limits_the_sizes():
    # At 6 with 300 bytes: "all" takes 3 + 3 (FAST), powerOfTwo must use 2 + 2 + 2 (its sizes
    # are 1, 2, 4 and 6; 4 needs 400 bytes).
    table = fast_and_slow(6)
    assert best_plan(table, 6, "all", 300).micro_batches == ((3, "FAST"), (3, "FAST"))
    assert best_plan(table, 6, "powerOfTwo", 300).micro_batches == ((2, "FAST"),) * 3
    assert best_plan(table, 6, "undivided", 300).micro_batches == ((6, "SLOW"),)


def test_mixed_algorithms_in_one_plan():
    # One sample left over: the best plan runs 4 with FAST and the last one with SLOW, which is
    # cheaper than FAST's launch overhead would make it.
    table = {
        1: [("FAST", 5.0, 100), ("SLOW", 1.5, 0)],
        4: [("FAST", 2.0, 400), ("SLOW", 6.0, 0)],
        5: [("FAST", 9.0, 500), ("SLOW", 7.5, 0)],
    }
    plan = best_plan(table, 5, "all", 400)
    assert plan == Plan(((4, "FAST"), (1, "SLOW")), 3.5, 400)


def test_the_front_of_a_known_table():
    # 3 + 1 with FAST (300 bytes) costs 4.5 ms, as 2 + 2 does with less: not on the front.
    front = desirable_plans(fast_and_slow(4), 4, "all")
    assert [(p.workspace_bytes, p.time_ms, p.micro_batches) for p in front] == [
        (0, 12.0, ((4, "SLOW"),)),
        (100, 5.0, ((1, "FAST"),) * 4),
        (200, 4.5, ((2, "FAST"),) * 2),
        (400, 4.25, ((4, "FAST"),)),
    ]


def test_unmeasured_and_failed_entries_are_ignored():
    table = {2: [("FAST", math.inf, 0), ("SLOW", 6.0, 0)], 1: []}
    assert best_plan(table, 2, "all") == Plan(((2, "SLOW"),), 6.0, 0)
    with pytest.raises(rtdnn.NotSupportedError, match="workspace_limit=10"):
        best_plan({2: [("FAST", 1.0, 20)]}, 2, "all", 10)


def test_pareto_front_drops_dominated_and_duplicate_plans():
    a = Plan(((2, "A"),), 5.0, 0)
    b = Plan(((2, "B"),), 3.0, 100)
    dominated = Plan(((2, "C"),), 4.0, 200)
    tie = Plan(((1, "B"), (1, "B")), 3.0, 100)
    assert pareto_front([dominated, tie, b, a]) == [a, b]


# -- the dynamic program against brute force --------------------------------------------------


def partitions(n: int, sizes: list[int], largest: int | None = None):
    """Every multiset of allowed sizes adding up to n, largest first."""
    if n == 0:
        yield ()
        return
    for s in sorted(sizes, reverse=True):
        if s <= n and (largest is None or s <= largest):
            for rest in partitions(n - s, sizes, s):
                yield (s, *rest)


def brute_front(table: dict, n: int, policy: str, limit: int | None) -> list[tuple]:
    points = set()
    for parts in partitions(n, batch_sizes(policy, n)):
        choices = [
            [(t, ws) for _, t, ws in table[b] if limit is None or ws <= limit] for b in parts
        ]
        for combo in itertools.product(*choices):
            points.add((max(ws for _, ws in combo), sum(t for t, _ in combo)))
    front = []
    for ws, t in sorted(points):
        if not front or t < front[-1][1]:
            front.append((ws, t))
    return front


@st.composite
def tables(draw):
    n = draw(st.integers(1, 7))
    algos = ["A", "B", "C"][: draw(st.integers(1, 3))]
    # Integer times keep every sum exact, whatever order it is added in.
    table = {
        b: [(a, float(draw(st.integers(1, 40))), draw(st.integers(0, 4)) * 64) for a in algos]
        for b in range(1, n + 1)
    }
    return table, n


@settings(max_examples=150, deadline=None)
@given(
    tn=tables(),
    policy=st.sampled_from(["undivided", "powerOfTwo", "all"]),
    limit=st.sampled_from([None, 0, 64, 128, 256]),
)
def test_the_front_equals_brute_force(tn, policy, limit):
    table, n = tn
    front = desirable_plans(table, n, policy, limit)
    assert [(p.workspace_bytes, p.time_ms) for p in front] == brute_front(table, n, policy, limit)
    allowed = set(batch_sizes(policy, n))
    for p in front:
        assert p.batch == n and {b for b, _ in p.micro_batches} <= allowed
        assert p.time_ms == time_of(p, table)
        assert limit is None or p.workspace_bytes <= limit
    # best_plan's single dynamic program at the limit finds the fastest point of the front,
    # never slower than the fastest undivided algorithm that fits.
    if front:
        best = best_plan(table, n, policy, limit)
        assert (best.time_ms, best.batch) == (front[-1].time_ms, n)
        assert best.time_ms == time_of(best, table)
        assert limit is None or best.workspace_bytes <= limit
    undivided = [t for _, t, ws in table[n] if limit is None or ws <= limit]
    if undivided:
        assert front[-1].time_ms <= min(undivided)


# -- one budget for a network ---------------------------------------------------------------


def network() -> list[list[Plan]]:
    """Three layers' fronts (workspace in MiB, time in ms)."""

    def front(*points):
        return [Plan(((8, f"algo{i}"),), t, ws * MiB) for i, (ws, t) in enumerate(points)]

    return [
        front((0, 10.0), (4, 6.0), (8, 5.0)),
        front((0, 8.0), (2, 7.0), (6, 3.0)),
        front((0, 4.0), (1, 3.5)),
    ]


def brute_division(fronts, budget):
    best = None
    for combo in itertools.product(*fronts):
        if sum(p.workspace_bytes for p in combo) <= budget:
            t = sum(p.time_ms for p in combo)
            if best is None or t < best[0]:
                best = (t, combo)
    return best


def test_reuse_gives_every_layer_the_same_limit():
    fronts = network()
    chosen = reuse_workspace(fronts, 4 * MiB)
    assert [p.time_ms for p in chosen] == [6.0, 7.0, 3.5]
    assert [p.workspace_bytes for p in chosen] == [4 * MiB, 2 * MiB, 1 * MiB]
    assert [p.time_ms for p in reuse_workspace(fronts, 0)] == [10.0, 8.0, 4.0]
    with pytest.raises(rtdnn.BadParamError, match="workspace_limit"):
        reuse_workspace([[Plan(((1, "A"),), 1.0, 100)]], 99)


@pytest.mark.parametrize("budget_mib", [0, 1, 6, 7, 10, 15, 100])
def test_division_finds_the_known_optimum(budget_mib):
    pytest.importorskip("scipy", reason="divide_workspace needs scipy (the test extra has it)")
    fronts, budget = network(), budget_mib * MiB
    chosen = divide_workspace(fronts, budget)
    t, combo = brute_division(fronts, budget)
    assert sum(p.workspace_bytes for p in chosen) <= budget
    assert sum(p.time_ms for p in chosen) == pytest.approx(t)
    assert all(p in front for p, front in zip(chosen, fronts, strict=True))
    if budget_mib == 6:  # the second layer's 6 MiB plan beats 4 + 2 (3 + 10 vs 6 + 7)
        assert list(chosen) == list(combo)
        assert [p.workspace_bytes // MiB for p in chosen] == [0, 6, 0]


@settings(max_examples=40, deadline=None)
@given(
    points=st.lists(
        st.lists(st.tuples(st.integers(0, 50), st.integers(1, 100)), min_size=1, max_size=4),
        min_size=1,
        max_size=5,
    ),
    budget=st.integers(0, 150),
)
def test_division_equals_brute_force(points, budget):
    pytest.importorskip("scipy", reason="divide_workspace needs scipy (the test extra has it)")
    fronts = [
        [Plan(((1, f"a{j}"),), float(t), ws) for j, (ws, t) in enumerate(layer)] for layer in points
    ]
    best = brute_division(fronts, budget)
    if best is None:
        with pytest.raises(rtdnn.BadParamError, match="budget"):
            divide_workspace(fronts, budget)
        return
    chosen = divide_workspace(fronts, budget)
    assert sum(p.workspace_bytes for p in chosen) <= budget
    assert sum(p.time_ms for p in chosen) == best[0]


@pytest.mark.parametrize("budget", [-1, 2.5, None, "8MiB"])
def test_bad_budget_is_refused(budget):
    with pytest.raises(rtdnn.BadParamError, match="budget"):
        divide_workspace(network(), budget)


def test_a_layer_without_plans_is_refused():
    with pytest.raises(rtdnn.BadParamError, match=r"fronts\[1\]"):
        divide_workspace([network()[0], []], 10 * MiB)


def test_rtdnn_imports_without_scipy():
    """scipy is optional: only divide_workspace needs it, and says so."""
    code = (
        "import sys; sys.modules['scipy'] = None\n"
        "import rtdnn\n"
        "from rtdnn.select.plan import Plan, divide_workspace\n"
        "try:\n"
        "    divide_workspace([[Plan(((1, 'A'),), 1.0, 0)]], 0)\n"
        "except rtdnn.NotSupportedError as e:\n"
        "    assert 'scipy' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('no error without scipy')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
