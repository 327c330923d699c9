"""Micro-batch planning: split a convolution's batch so faster algorithms fit a workspace limit.

A layer whose fastest algorithm needs more workspace than the caller allows can run its batch
in micro-batches instead, each with the fastest algorithm whose (smaller) workspace fits. The
micro-batches run one after another and reuse one buffer, so a plan's workspace is the largest
any of its micro-batches needs and its time is the sum of theirs.

Everything here is a pure function on plain data, measured elsewhere:

    table: {micro-batch size b: [(algorithm, time_ms, workspace_bytes), ...]}

`desirable_plans` finds, by dynamic programming over the batch, every plan that no other plan
beats in both time and workspace (the Pareto front of time against workspace). From one front
per layer, `reuse_workspace` picks each layer's fastest plan under one per-layer limit (one
buffer shared by all layers) and `divide_workspace` picks the plans that minimise the total time
with the sum of the layers' workspaces within a budget (a 0-1 integer linear program; needs
scipy).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..core import NotSupportedError, bad_param

# How the batch may be split: not at all, into powers of two (and the whole batch), or freely.
POLICIES = ("undivided", "powerOfTwo", "all")
# How a network's layers share workspace: one limit for each layer (one buffer they take turns
# with), or one budget for the sum of the layers' workspaces (reuse_workspace, divide_workspace).
WORKSPACE_POLICIES = ("reuse", "divide")

Table = Mapping[int, Iterable[tuple[str, float, int]]]


@dataclass(frozen=True)
class Plan:
    """How to run one convolution: micro-batches (size, algorithm) that add up to the batch,
    largest first; the sum of their times and the largest of their workspaces."""

    micro_batches: tuple[tuple[int, str], ...]
    time_ms: float
    workspace_bytes: int

    @property
    def batch(self) -> int:
        return sum(b for b, _ in self.micro_batches)


def check_policy(name: str, policy: object) -> str:
    """`policy` if it is one of POLICIES, else BadParamError naming `name`."""
    if not isinstance(policy, str) or policy not in POLICIES:
        raise bad_param(name, policy, f"one of {POLICIES}")
    return policy


def check_workspace_policy(name: str, policy: object) -> str:
    """`policy` if it is one of WORKSPACE_POLICIES, else BadParamError naming `name`."""
    if not isinstance(policy, str) or policy not in WORKSPACE_POLICIES:
        raise bad_param(name, policy, f"one of {WORKSPACE_POLICIES}")
    return policy


def check_bytes(name: str, value: object, *, optional: bool = True) -> int | None:
    """A byte count: an int >= 0 (or None where `optional`), else BadParamError naming `name`."""
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        expected = "None or an int >= 0 (bytes)" if optional else "an int >= 0 (bytes)"
        raise bad_param(name, value, expected)
    return value


def batch_sizes(policy: str, batch: int) -> list[int]:
    """The micro-batch sizes `policy` allows for a batch of `batch`, ascending. The whole batch
    is always one of them, so a plan is never worse than running it undivided."""
    check_policy("policy", policy)
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise bad_param("batch", batch, "an int >= 1")
    if policy == "undivided":
        return [batch]
    if policy == "all":
        return list(range(1, batch + 1))
    powers = [1 << k for k in range(batch.bit_length()) if 1 << k < batch]
    return [*powers, batch]


def pareto_front(plans: Iterable[Plan]) -> list[Plan]:
    """The plans no other plan beats in both time and workspace, by workspace ascending (so
    time strictly descending). Among equal ones the one with fewer micro-batches is kept."""
    front: list[Plan] = []
    for p in sorted(plans, key=lambda p: (p.workspace_bytes, p.time_ms, len(p.micro_batches))):
        if not front or p.time_ms < front[-1].time_ms:
            front.append(p)
    return front


class _Kernels:
    """The measured algorithms of the allowed sizes as arrays: times[s, k] and
    workspaces[s, k] of the k-th entry at size s (inf and 0 where there is none)."""

    def __init__(self, table: Table, sizes: list[int], batch: int):
        # By workspace, so that of equally fast algorithms the smaller workspace is picked.
        rows = {
            b: sorted(
                ((a, float(t), int(ws)) for a, t, ws in table.get(b, ()) if math.isfinite(t)),
                key=lambda r: r[2],
            )
            for b in sizes
        }
        width = max((len(r) for r in rows.values()), default=0)
        self.algos = [[""] * width for _ in range(batch + 1)]
        self.times = np.full((batch + 1, width), math.inf)
        self.workspaces = np.zeros((batch + 1, width), dtype=np.int64)
        for b, r in rows.items():
            for k, (a, t, ws) in enumerate(r):
                self.algos[b][k], self.times[b, k], self.workspaces[b, k] = a, t, ws

    def levels(self, workspace_limit: int | None) -> list[int]:
        """The workspace sizes at which the fastest plan can change: every measured one."""
        found = np.unique(self.workspaces[np.isfinite(self.times)])
        return [int(w) for w in found if workspace_limit is None or w <= workspace_limit]

    def fastest_plan(self, batch: int, workspace_limit: int) -> Plan | None:
        """The fastest plan whose every micro-batch fits `workspace_limit` bytes, or None.

        Within one limit the workspace no longer matters (a plan's is the largest of its
        micro-batches', each within the limit), so each size takes its fastest algorithm that
        fits and the batch is split by a one-dimensional dynamic program: the best time for b
        is the better of running b at once and the best (s, best time for b - s). A split of
        b always has a part of at most b/2, so s runs up to b/2 only.
        """
        times = np.where(self.workspaces <= workspace_limit, self.times, math.inf)
        if times.shape[1] == 0:
            return None
        pick = times.argmin(axis=1)
        single = times[np.arange(batch + 1), pick]
        best = np.full(batch + 1, math.inf)
        best[0] = 0.0
        first = np.zeros(batch + 1, dtype=np.int64)  # the size of one micro-batch of the best
        for b in range(1, batch + 1):
            best[b], first[b] = single[b], b  # undivided wins ties
            half = b // 2
            if half:
                splits = single[1 : half + 1] + best[b - 1 : b - half - 1 : -1]
                j = int(splits.argmin())
                if splits[j] < best[b]:
                    best[b], first[b] = splits[j], j + 1
        if not math.isfinite(best[batch]):
            return None
        parts, b = [], batch
        while b:
            s = int(first[b])
            parts.append((s, self.algos[s][pick[s]], int(self.workspaces[s, pick[s]])))
            b -= s
        parts.sort(key=lambda m: (-m[0], m[1]))
        time = sum(float(single[s]) for s, _, _ in parts)
        return Plan(tuple((s, a) for s, a, _ in parts), time, max(ws for _, _, ws in parts))


def desirable_plans(
    table: Table, batch: int, policy: str = "all", workspace_limit: int | None = None
) -> list[Plan]:
    """Every Pareto-optimal plan (time against workspace) for a batch of `batch`, by workspace
    ascending, using the measured `table` and the sizes `policy` allows; plans needing more
    than `workspace_limit` bytes are left out. Empty if nothing measured fits.

    A plan's workspace is one of the measured ones, so the front is found by taking the
    fastest plan within each measured workspace size in turn (a dynamic program over the
    batch, see _Kernels.fastest_plan) and keeping those that are faster than every plan
    needing less.
    """
    sizes = batch_sizes(policy, batch)
    check_bytes("workspace_limit", workspace_limit)
    kernels = _Kernels(table, sizes, batch)
    plans = (kernels.fastest_plan(batch, w) for w in kernels.levels(workspace_limit))
    return pareto_front(p for p in plans if p is not None)


def fastest(plans: Iterable[Plan], workspace_limit: int | None = None) -> Plan | None:
    """The fastest plan within `workspace_limit` bytes (the smaller workspace on a tie), or
    None if none fits."""
    fits = [p for p in plans if workspace_limit is None or p.workspace_bytes <= workspace_limit]
    return min(fits, key=lambda p: (p.time_ms, p.workspace_bytes), default=None)


def best_plan(
    table: Table, batch: int, policy: str = "all", workspace_limit: int | None = None
) -> Plan:
    """The fastest plan for a batch of `batch` within `workspace_limit` bytes (one dynamic
    program at that limit: cheaper than the whole front of desirable_plans).

    NotSupportedError if no measured algorithm fits the limit at any allowed size.
    """
    sizes = batch_sizes(policy, batch)
    check_bytes("workspace_limit", workspace_limit)
    limit = workspace_limit if workspace_limit is not None else np.iinfo(np.int64).max
    plan = _Kernels(table, sizes, batch).fastest_plan(batch, limit)
    if plan is None:
        raise NotSupportedError(
            f"no measured algorithm runs a batch of {batch} (policy={policy!r}) within "
            f"workspace_limit={workspace_limit!r}"
        )
    return plan


def _check_fronts(fronts: Sequence[Sequence[Plan]]) -> None:
    for i, front in enumerate(fronts):
        if not front:
            raise bad_param(f"fronts[{i}]", list(front), "at least one plan per layer")


def reuse_workspace(fronts: Sequence[Sequence[Plan]], workspace_limit: int) -> list[Plan]:
    """One plan per layer under the workspace-reuse policy: every layer gets the same limit
    of `workspace_limit` bytes and they share one buffer of that size (the layers run one at a
    time), so each simply takes its fastest plan that fits.

    fronts: one list of plans per layer (e.g. desirable_plans of each layer and direction).
    BadParamError naming `workspace_limit` if some layer has no plan within it.
    """
    check_bytes("workspace_limit", workspace_limit, optional=False)
    _check_fronts(fronts)
    chosen = [fastest(front, workspace_limit) for front in fronts]
    if any(p is None for p in chosen):
        need = max(min(p.workspace_bytes for p in front) for front in fronts)
        raise bad_param("workspace_limit", workspace_limit, f">= {need}, what some layer needs")
    return chosen


def divide_workspace(fronts: Sequence[Sequence[Plan]], budget: int) -> list[Plan]:
    """One plan per layer minimising the total time, with the sum of their workspaces (one
    buffer per layer) at most `budget` bytes: mu-cuDNN's workspace division.

    A 0-1 integer linear program: a variable per (layer, plan), exactly one chosen per layer,
    sum of the chosen workspaces <= budget; minimise the sum of the chosen times. Solved with
    scipy.optimize.milp (HiGHS); scipy is imported only here (NotSupportedError without it).
    BadParamError naming `budget` if even the smallest plans do not fit.
    """
    check_bytes("budget", budget, optional=False)
    _check_fronts(fronts)
    least = sum(min(p.workspace_bytes for p in front) for front in fronts)
    if least > budget:
        raise bad_param("budget", budget, f">= {least}, the least these layers need together")
    try:
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import csr_array
    except ImportError as e:
        raise NotSupportedError(
            f"divide_workspace needs scipy (pip install 'rtdnn[plan]'): {e}"
        ) from None

    # Plans that alone exceed the budget can never be chosen.
    flat = [(i, p) for i, front in enumerate(fronts) for p in front if p.workspace_bytes <= budget]
    n = len(flat)
    time = np.array([p.time_ms for _, p in flat], dtype=float)
    ws = np.array([p.workspace_bytes for _, p in flat], dtype=float)
    layers = np.array([i for i, _ in flat])
    one_per_layer = csr_array((np.ones(n), (layers, np.arange(n))), shape=(len(fronts), n))
    # Workspaces in units of the budget keep the coefficients near 1 for the solver; its
    # answer is then checked in exact integers, and the bound tightened if rounding let it
    # exceed the budget by a few bytes.
    scale = float(max(budget, 1))
    limit = budget
    for _ in range(4):
        result = milp(
            c=time,
            constraints=[
                LinearConstraint(one_per_layer, 1, 1),
                LinearConstraint(ws[None, :] / scale, -np.inf, limit / scale),
            ],
            integrality=np.ones(n),
            bounds=Bounds(0, 1),
        )
        if result.x is None:
            raise NotSupportedError(f"the workspace division found no solution: {result.message}")
        chosen = sorted((flat[j] for j in np.flatnonzero(result.x > 0.5)), key=lambda c: c[0])
        total = sum(p.workspace_bytes for _, p in chosen)
        if [i for i, _ in chosen] == list(range(len(fronts))) and total <= budget:
            return [p for _, p in chosen]
        limit -= max(total - budget, 1)
    raise NotSupportedError(f"the workspace division exceeded budget={budget} after rounding")


__all__ = [
    "POLICIES",
    "WORKSPACE_POLICIES",
    "Plan",
    "batch_sizes",
    "best_plan",
    "check_bytes",
    "check_policy",
    "check_workspace_policy",
    "desirable_plans",
    "divide_workspace",
    "fastest",
    "pareto_front",
    "reuse_workspace",
]
