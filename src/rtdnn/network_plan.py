"""Planning every convolution of a converted model under one workspace policy.

A model converted with `rtdnn.convert(model, workspace_limit=..., micro_batch=...,
workspace_policy=...)` plans each convolution on its first use of a shape: every algorithm is
timed at every micro-batch size the policy allows (kept in the tuning database), and the layer
runs the fastest plan within its limit. Under "reuse" that limit is `workspace_limit` for each
layer. Under "divide" `workspace_limit` is a budget for the sum of all the layers' workspaces,
which only a view of every layer can divide: `plan_network` runs the model once forward and
backward on an example, takes each layer's Pareto front of time against workspace, solves the
integer linear program (select.plan.divide_workspace) and fixes each layer's limits.

rtdnn's convolutions share one workspace buffer per stream (core.handle.stream_workspace),
sized by the largest request, so the memory a network takes for workspace is its largest
layer's. "divide" bounds the sum, which also bounds that; "reuse" with the same number of
bytes bounds only the largest, and so is never slower.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from .autograd.conv_plan import DIRECTIONS, ConvTuning
from .core import BadParamError, NotSupportedError, bad_param
from .nn.conv import _RtdnnConv
from .ops import conv_plan
from .select.plan import (
    Plan,
    check_bytes,
    desirable_plans,
    divide_workspace,
    fastest,
    reuse_workspace,
)

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS.update({"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40})


def parse_bytes(name: str, text: str) -> int:
    """A byte count written as a number and an optional unit: "65536", "64MiB", "1.5 GiB",
    "100MB" (KiB/MiB/GiB are powers of 1024, KB/MB/GB of 1000; case does not matter).
    BadParamError naming `name` unless it comes to a whole number of bytes >= 0."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = match and match.group(2).lower()
    if match is None or unit not in _UNITS:
        raise bad_param(name, text, "a number of bytes, e.g. 65536, 64MiB, 1.5GiB or 100MB")
    number = match.group(1)
    whole, _, fraction = number.partition(".")
    # Exact arithmetic: 1.5GiB is a whole number of bytes, 1.5B is not.
    numerator = int(whole + fraction) * _UNITS[unit]
    denominator = 10 ** len(fraction)
    if numerator % denominator:
        raise bad_param(name, text, "a whole number of bytes")
    return numerator // denominator


def format_bytes(n: int) -> str:
    """64 MiB, 1.5 KiB, 0 B."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def format_micro_batches(plan: Plan) -> str:
    """(3, GEMM), (1, IMPLICIT_GEMM), (1, IMPLICIT_GEMM) -> "3 GEMM + 2x1 IMPLICIT_GEMM"."""
    parts: list[list] = []
    for size, algo in plan.micro_batches:
        if parts and parts[-1][1:] == [size, algo]:
            parts[-1][0] += 1
        else:
            parts.append([1, size, algo])
    return " + ".join(f"{c}x{s} {a}" if c > 1 else f"{s} {a}" for c, s, a in parts)


@dataclass(frozen=True)
class LayerPlan:
    """One layer and direction: its chosen plan and, for comparison, the undivided one the
    same workspace policy would choose (None if it found none)."""

    layer: str
    direction: str
    plan: Plan
    undivided: Plan | None = None


@dataclass
class NetworkPlan:
    """The plan of every convolution of a network (by layer, then direction), the policies
    it was made under, and what planning cost."""

    rows: list[LayerPlan]
    micro_batch: str
    workspace_policy: str
    workspace_limit: int | None
    measure_seconds: float = 0.0
    solve_seconds: float = 0.0

    @property
    def time_ms(self) -> float:
        return sum(r.plan.time_ms for r in self.rows)

    @property
    def undivided_ms(self) -> float | None:
        if not self.rows or any(r.undivided is None for r in self.rows):
            return None
        return sum(r.undivided.time_ms for r in self.rows)

    @property
    def workspace_bytes(self) -> int:
        """What the policy bounds: the largest layer's workspace ("reuse"), or the sum of
        all layers' ("divide")."""
        sizes = [r.plan.workspace_bytes for r in self.rows]
        if self.workspace_policy == "divide":
            return sum(sizes)
        return max(sizes, default=0)

    def __str__(self) -> str:
        limit = "none" if self.workspace_limit is None else format_bytes(self.workspace_limit)
        what = "per layer" if self.workspace_policy == "reuse" else "for the network"
        lines = [
            f"plan: micro_batch={self.micro_batch!r}, workspace_policy="
            f"{self.workspace_policy!r}, workspace limit {limit} {what}",
            *table_lines(self.rows),
        ]
        total = f"{'total':52s} {'':38s} {self.time_ms:10.3f}"
        total += f" {format_bytes(self.workspace_bytes):>11s}"
        undivided = self.undivided_ms
        if undivided is not None:
            total += f" {undivided:10.3f}"
            if self.time_ms > 0:
                total += f"  {undivided / self.time_ms:.2f}x vs undivided"
        lines.append(total)
        kind = "sum" if self.workspace_policy == "divide" else "largest"
        lines.append(
            f"(workspace total: the {kind} of the layers'; measuring {self.measure_seconds:.1f} "
            f"s, solving {self.solve_seconds:.3f} s)"
        )
        return "\n".join(lines)


def table_lines(rows: list[LayerPlan]) -> list[str]:
    """The per-layer table: layer, direction, batch, micro-batches, time, workspace, and the
    undivided time where known."""
    lines = [
        f"{'layer':30s} {'direction':15s} {'N':>5s} {'micro-batches':38s} {'time ms':>10s} "
        f"{'workspace':>11s} {'undivided':>10s}"
    ]
    for r in rows:
        line = (
            f"{r.layer or '(root)':30s} {r.direction:15s} {r.plan.batch:5d} "
            f"{format_micro_batches(r.plan):38s} {r.plan.time_ms:10.3f} "
            f"{format_bytes(r.plan.workspace_bytes):>11s}"
        )
        if r.undivided is not None:
            line += f" {r.undivided.time_ms:10.3f}"
        lines.append(line)
    return lines


def tuned_layers(model: torch.nn.Module) -> list[tuple[str, ConvTuning]]:
    """(path, tuning) of every convolution that rtdnn.convert gave a workspace policy."""
    return [
        (path, m.tuning)
        for path, m in model.named_modules()
        if isinstance(m, _RtdnnConv) and m.tuning is not None
    ]


def _tensors(value) -> Iterator[torch.Tensor]:
    """The tensors in a model's output: a tensor, or nested tuples, lists and dicts."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _run_once(model: torch.nn.Module, example_input, backward: bool) -> None:
    """One forward (and backward, with random output gradients) of `model` on `example_input`,
    leaving the model as it was: buffers (batch-norm statistics) restored, no .grad written."""
    saved = {name: b.detach().clone() for name, b in model.named_buffers()}
    try:
        with torch.set_grad_enabled(backward):
            out = model(example_input)
        outputs = [t for t in _tensors(out) if t.requires_grad]
        leaves = [p for p in model.parameters() if p.requires_grad]
        leaves += [t for t in _tensors(example_input) if t.requires_grad]
        if backward and outputs and leaves:
            grads = [torch.randn_like(t) for t in outputs]
            torch.autograd.grad(outputs, leaves, grads, allow_unused=True)
    finally:
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(saved[name])


def plan_network(
    model: torch.nn.Module,
    example_input=None,
    *,
    budget: int | None = None,
    backward: bool = True,
    directions: Sequence[str] | None = None,
) -> NetworkPlan:
    """Plan every convolution of `model` (converted by rtdnn.convert with a workspace limit or
    a micro-batch policy) and fix the plans.

    With `example_input`, first runs `model(example_input)` once, and backward from random
    output gradients unless `backward` is False (so the directions a training step runs:
    backward-data only where a layer's input needs a gradient), each layer's problems
    measured on first use (or read from the tuning database); the model's buffers and
    gradients are left as they were. Without it, plans what the layers ran last (e.g. after
    a first training step).

    Under workspace_policy "reuse" each layer keeps the fastest plan within its limit; under
    "divide" the integer linear program picks one plan per layer and direction with the sum
    of their workspaces within the budget, and each direction runs from then on within its
    share (a direction not planned gets none). `budget` (bytes) replaces the
    workspace_limit given to convert; `directions` (default all three) limits the plan to
    some of them.

    Returns the NetworkPlan: per layer and direction the plan (micro-batches, algorithms,
    time, workspace) beside the undivided plan the same policy would choose.
    """
    check_bytes("budget", budget)
    if directions is None:
        directions = DIRECTIONS
    elif isinstance(directions, str) or not set(directions) <= set(DIRECTIONS):
        raise bad_param("directions", directions, f"None or a sequence of {DIRECTIONS}")
    layers = tuned_layers(model)
    if not layers:
        raise bad_param(
            "model", type(model).__name__,
            "a model converted by rtdnn.convert with workspace_limit or micro_batch",
        )  # fmt: skip
    settings = {(t.micro_batch, t.workspace_limit, t.workspace_policy) for _, t in layers}
    if len(settings) > 1:
        raise bad_param("model", sorted(settings, key=str), "one setting for every layer")
    ((micro_batch, limit, policy),) = settings
    if budget is not None:
        limit = budget
        for _, tuning in layers:
            tuning.workspace_limit = budget
    start = time.perf_counter()
    if example_input is not None:
        for _, tuning in layers:
            tuning.limits = None  # "divide": each layer within the whole budget meanwhile
            tuning.seen.clear()
        _run_once(model, example_input, backward)
    measured = time.perf_counter()

    entries = [(path, t, d) for path, t in layers for d in directions if d in t.seen]
    if not entries:
        given = None if example_input is None else type(example_input).__name__
        raise bad_param("example_input", given, "an input on which the model's convolutions run")
    fronts, undivided = [], []
    for _, tuning, direction in entries:
        seen = tuning.seen[direction]
        table = conv_plan.table(seen.problem, seen.policy, seen.deterministic)
        fronts.append(desirable_plans(table, seen.problem.batch, seen.policy))
        undivided.append(desirable_plans(table, seen.problem.batch, "undivided"))
    chosen = _choose(fronts, policy, limit)
    baseline = _choose(undivided, policy, limit, best_effort=True)
    solved = time.perf_counter()
    for _, tuning in layers:
        tuning.limits = {} if policy == "divide" else None
    if policy == "divide":
        for (_, tuning, direction), plan in zip(entries, chosen, strict=True):
            tuning.limits[direction] = plan.workspace_bytes
    rows = [
        LayerPlan(path, d, plan, base)
        for (path, _, d), plan, base in zip(entries, chosen, baseline, strict=True)
    ]
    return NetworkPlan(rows, micro_batch, policy, limit, measured - start, solved - measured)


def _choose(fronts, policy: str, limit: int | None, best_effort: bool = False) -> list:
    """One plan per front under the workspace policy (None each where `best_effort` and no
    choice fits)."""
    if not fronts:
        return []
    try:
        if limit is None:
            return [fastest(f) for f in fronts]
        if policy == "divide":
            return divide_workspace(fronts, limit)
        return reuse_workspace(fronts, limit)
    except (BadParamError, NotSupportedError):
        if not best_effort:
            raise
        return [None] * len(fronts)


__all__ = [
    "LayerPlan",
    "NetworkPlan",
    "format_bytes",
    "format_micro_batches",
    "parse_bytes",
    "plan_network",
    "tuned_layers",
]
