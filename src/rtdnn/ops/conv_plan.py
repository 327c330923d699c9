"""Micro-batched convolution: measure, plan and run a convolution in slices of its batch.

The batch rows of a convolution are independent in forward and backward-data, so a slice of
x and y along N is a convolution of its own and may run with its own algorithm. Backward-filter
sums over the batch: its slices add their contributions into the one filter gradient. Each
micro-batch size the policy allows is measured once per problem (through select.find, which
times every algorithm on scratch output), and select.plan's dynamic program picks the plan.

Network planning (rtdnn.plan_network) needs to know which problems a model's layers ran and
what was measured for them: `observed()` collects, in the calling thread, every plan made or
reused while it is open, and `table` returns the latest measurements of a problem.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch

try:  # a progress bar while measuring, where tqdm is installed
    from tqdm.auto import tqdm
except ImportError:  # pragma: no cover - tqdm is a dependency, but measuring needs none
    tqdm = None

from .. import select
from ..algos import ConvTensors, get_algorithm
from ..core import ConvProblem, Direction, bad_param
from ..core.handle import stream_workspace
from ..select.plan import Plan, batch_sizes, best_plan, check_bytes, check_policy

# Plans by (problem, policy, workspace limit): measuring is expensive, and a training loop
# repeats the same problems every step.
_plans: dict[tuple, Plan] = {}
# The latest measurements by (problem, policy, deterministic), for network planning.
_tables: dict[tuple, dict[int, list]] = {}


@dataclass(frozen=True)
class Observed:
    """A plan one call ran: its problem, batch policy, workspace limit, and whether it was
    made of deterministic algorithms only (see `table`)."""

    problem: ConvProblem
    policy: str
    workspace_limit: int | None
    plan: Plan
    deterministic: bool = False


_local = threading.local()  # .observers: the lists open `observed()` blocks append to


@contextlib.contextmanager
def observed() -> Iterator[list[Observed]]:
    """Collect every plan run in this thread while open. Inside, the conv functions measure
    and plan even micro_batch="undivided" calls (the fastest algorithm within the limit,
    measured rather than guessed), so that every call made in it has a plan to observe."""
    stack = _local.__dict__.setdefault("observers", [])
    seen: list[Observed] = []
    stack.append(seen)
    try:
        yield seen
    finally:
        # By identity: two open lists may be equal (both empty).
        del stack[next(i for i, s in enumerate(stack) if s is seen)]


def observing() -> bool:
    """True inside an `observed()` block of this thread."""
    # The thread's own dictionary, as observed() fills it: getattr would raise and catch an
    # AttributeError on every convolution call outside such a block.
    return bool(_local.__dict__.get("observers"))


def table(p: ConvProblem, policy: str, deterministic: bool = False) -> dict[int, list]:
    """What was last measured for `p` at the sizes `policy` allows (of the deterministic
    algorithms where `deterministic`): {b: [(algorithm, time_ms, workspace_bytes), ...]}.
    BadParamError if `p` was not planned so."""
    found = _tables.get((p, policy, deterministic))
    if found is None:
        raise bad_param("policy", policy, "a policy this problem was planned with")
    return found


def check_micro_batch(micro_batch: object, algo: object) -> None:
    """For the conv functions: a known policy, and the algorithm left to the plan."""
    check_policy("micro_batch", micro_batch)
    if micro_batch != "undivided" and algo != "auto":
        raise bad_param(
            "algo", algo, f'"auto" with micro_batch={micro_batch!r} (the plan picks algorithms)'
        )


def sub_problem(
    p: ConvProblem, t: ConvTensors, start: int, size: int
) -> tuple[ConvProblem, ConvTensors]:
    """Batch rows [start, start + size) of `p` on `t`: x and y (data and its gradient in
    every direction) are views sliced along N; the filter (or filter gradient) is whole."""
    x, y = t.x.narrow(0, start, size), t.y.narrow(0, start, size)
    rows = lambda d: replace(d, shape=(size, *d.shape[1:]))  # noqa: E731
    q = replace(p, x=rows(p.x), y=rows(p.y))
    return q, ConvTensors(x, t.w, y, t.bias)


def measure(
    p: ConvProblem, t: ConvTensors, sizes: list[int], deterministic: bool = False
) -> dict[int, list]:
    """{b: [(algorithm, time_ms, workspace_bytes), ...]} for the first b batch rows of `t`,
    every algorithm that runs them (`deterministic`: that is deterministic), timed by
    select.find. `t`'s inputs are read; the
    direction's output is left alone (find writes a scratch copy)."""
    table = {}
    if tqdm is not None and len(sizes) > 1:
        # Shown on a terminal only (disable=None); each size runs every algorithm once.
        what = f"measuring {p.direction.value} N={p.batch}"
        sizes = tqdm(sizes, desc=what, unit="size", leave=False, disable=None)
    for b in sizes:
        q, sub = sub_problem(p, t, 0, b)
        written = sub.written(p.direction)
        scratch = torch.empty_strided(
            written.shape, written.stride(), dtype=written.dtype, device=written.device
        )
        results = select.find(q, sub.with_written(p.direction, scratch))
        table[b] = [
            (r.algo, r.time_ms, r.workspace_bytes)
            for r in results
            if r.status == "ok" and (r.deterministic or not deterministic)
        ]
    return table


def plan_for(
    p: ConvProblem,
    t: ConvTensors,
    policy: str,
    workspace_limit: int | None,
    deterministic: bool = False,
) -> Plan:
    """The fastest plan for `p` within `workspace_limit` bytes (`deterministic`: of
    deterministic algorithms only), measured on `t` on first use of this (problem, policy,
    limit, deterministic) and remembered."""
    check_policy("policy", policy)
    check_bytes("workspace_limit", workspace_limit)
    key = (p, policy, workspace_limit, deterministic)
    plan = _plans.get(key)
    if plan is None:
        measured = measure(p, t, batch_sizes(policy, p.batch), deterministic)
        _tables[p, policy, deterministic] = measured
        plan = _plans[key] = best_plan(measured, p.batch, policy, workspace_limit)
    for seen in getattr(_local, "observers", ()):
        seen.append(Observed(p, policy, workspace_limit, plan, deterministic))
    return plan


def run_plan(plan: Plan, p: ConvProblem, t: ConvTensors, alpha: float, beta: float) -> None:
    """Run `p` on `t` micro-batch by micro-batch, with one workspace buffer for all.

    Forward and backward-data write disjoint slices of their output, each scaled by alpha and
    beta. Backward-filter adds every slice's gradient g_i into the one output: the first with
    the caller's beta, the rest with beta = 1, each with alpha, which gives
    alpha * sum_i g_i + beta * out, the undivided result.
    """
    if plan.batch != p.batch:
        raise bad_param("plan", plan.micro_batches, f"micro-batches adding up to {p.batch}")
    workspace = stream_workspace(plan.workspace_bytes, t.x.device)
    accumulate = p.direction == Direction.BACKWARD_FILTER
    start = 0
    for i, (size, name) in enumerate(plan.micro_batches):
        q, sub = sub_problem(p, t, start, size)
        algorithm = get_algorithm(name)
        slice_beta = 1.0 if accumulate and i > 0 else beta
        algorithm.runner(q, sub, workspace)(sub, workspace, alpha, slice_beta)
        start += size


def run_micro_batched(
    p: ConvProblem,
    t: ConvTensors,
    policy: str,
    workspace_limit: int | None,
    alpha: float,
    beta: float,
    deterministic: bool = False,
) -> None:
    """The conv functions' micro_batch path: plan `p` (measured on first use), then run it."""
    run_plan(plan_for(p, t, policy, workspace_limit, deterministic), p, t, alpha, beta)
