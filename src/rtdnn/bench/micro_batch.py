"""mu-cuDNN's experiment (Oyama et al. 2018, arXiv 1804.04806) on rtdnn's algorithms: what
splitting each convolution's batch into micro-batches gains under a workspace limit.

For every convolution of a suite, in each direction (forward, backward-data, backward-filter),
every algorithm is measured once at every micro-batch size the policies allow, one size at a
time (ops.conv_plan.measure through select.find, so that the results go to the tuning database
and a later run reads them back instead of measuring). From those tables select.plan builds
each convolution's Pareto front of time against workspace for each policy (undivided,
powerOfTwo, all), and picks one plan per convolution for each workspace setting:

    reuse L    every convolution gets the same limit of L bytes (one buffer shared by all):
               its fastest plan within L. Undivided, this is what cuDNN does.
    divide B   one budget of B bytes for the network (one buffer per convolution): the plans of
               least total time whose workspaces sum to at most B, by integer linear program.

Before measuring on a GPU, worker processes compile every kernel the measurements will run
(each algorithm at each size, heuristic tiles), so that Triton's on-disk cache holds them and
the serial measurements time instead of compiling one kernel after another (compiling was
most of AlexNet's 381 s at powerOfTwo). Sizes the tuning database already holds are neither
compiled nor measured (a run cut off by a time limit resumes); the plans that use them then
compile their kernels when they first run, unless Triton's cache has them. The chosen plans
are then run (ops.conv_plan.run_plan) and timed, and checked against the undivided plan's
output. The report shows both times apart: "planned", the sum of the micro-batches'
benchmarked times that the planner predicts, and "run", the plan executed. On a machine
without a GPU the kernels run in Triton's interpreter and every time is an interpreter time,
which says nothing about any GPU; the report says so.

A suite layer may carry "count": how many convolutions of the network have its shape. Totals
and the network budget count each of them (ResNet-50's 23 shapes are its 53 convolutions).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from .. import __version__
from ..algos import ConvTensors, supported_algorithms
from ..core import ConvDesc, ConvProblem, Direction, TensorDesc, bad_param, resolve_math_mode
from ..core.conv import conv_output_shape
from ..core.handle import allocate_workspace
from ..core.tensor import empty_like_layout
from ..core.timing import device_time_ms
from ..ops.conv_plan import measure, run_plan, sub_problem
from ..reference import rel_error
from ..select import database
from ..select.plan import (
    POLICIES,
    Plan,
    batch_sizes,
    desirable_plans,
    divide_workspace,
    reuse_workspace,
)
from .conv import AGREEMENT, DIRECTIONS, DTYPES

MiB = 1 << 20
KiB = 1 << 10
#: The per-layer limits of the experiment (reuse), in bytes.
LIMITS = (8 * MiB, 64 * MiB, 512 * MiB)
#: The suites of the experiment and their mini-batch sizes. AlexNet's 256 is μ-cuDNN's (its
#: repository's test/bench/alexnet.csv); the paper's ResNet batch could not be confirmed from
#: the sources at hand, so the ResNets run at 64, as rtdnn's other ResNet benchmarks do.
SUITES = {"alexnet": 256, "resnet18": 64, "resnet50": 64}

#: Two small layers for a run through the interpreter, with limits in KiB instead of MiB so
#: that the workspaces of these shapes exceed them and splitting the batch matters.
TINY_BATCH = 4
TINY_LIMITS = (8 * KiB, 64 * KiB, 512 * KiB)
TINY = [
    {"name": "tiny3x3", "c": 8, "k": 16, "spatial": [8, 8], "kernel": [3, 3], "stride": [1, 1],
     "padding": [1, 1], "dilation": [1, 1], "groups": 1},
    {"name": "tiny3x3s2", "c": 4, "k": 8, "spatial": [7, 7], "kernel": [3, 3], "stride": [2, 2],
     "padding": [1, 1], "dilation": [1, 1], "groups": 1, "count": 2},
]  # fmt: skip

#: What the μ-cuDNN authors report, each with where it is stated.
PAPER = [
    {"workload": "AlexNet", "result": "1.63x", "setting": "P100-SXM2; Caffe and TensorFlow "
     "(the abstract does not say which framework gave which number)",
     "source": "arXiv 1804.04806, abstract"},
    {"workload": "ResNet-18", "result": "1.21x", "setting": "P100-SXM2, at the same memory "
     "footprint", "source": "arXiv 1804.04806, abstract"},
    {"workload": "DeepBench 3x3 layers", "result": "up to 2.31x", "setting": "P100-SXM2, "
     "mini-batch 256, workspace limits 128, 256 and 512 MiB",
     "source": "github.com/spcl/ucudnn README"},
    {"workload": "DeepBench 5x5 layers", "result": "up to 3.85x", "setting": "as above",
     "source": "github.com/spcl/ucudnn README"},
]  # fmt: skip


# -- the convolutions -------------------------------------------------------------------------


@dataclass
class Kernel:
    """One convolution of the suite in one direction, and what was measured for it."""

    layer: str
    direction: str
    count: int  # convolutions of the network with this shape
    problem: ConvProblem
    table: dict[int, list[tuple[str, float, int]]]  # {size: [(algo, ms, workspace)]}
    benchmark_s: dict[int, float]  # seconds spent measuring each size
    stored: list[int]  # sizes whose results the tuning database already held
    fronts: dict[str, list[Plan]] = field(default_factory=dict)  # per policy

    @property
    def batch(self) -> int:
        return self.problem.batch


def operands(layer: dict, batch: int, dtype: torch.dtype, device: str):
    """(ConvDesc, ConvTensors) of a suite layer at `batch`: random x, w and dy, channels-last
    as the other convolution benchmarks use them."""
    nd = len(layer["spatial"])
    conv = ConvDesc.create(
        nd, layer["stride"], layer["padding"], layer["dilation"], layer.get("groups", 1),
        "cross_correlation", resolve_math_mode(None),
    )  # fmt: skip
    memory = {1: torch.contiguous_format, 2: torch.channels_last, 3: torch.channels_last_3d}[nd]
    x = torch.randn(batch, layer["c"], *layer["spatial"], device=device, dtype=dtype)
    fan_in = layer["c"] // conv.groups * math.prod(layer["kernel"])
    w = torch.randn(layer["k"], layer["c"] // conv.groups, *layer["kernel"], device=device)
    w = (w / math.sqrt(fan_in)).to(dtype)
    x, w = x.contiguous(memory_format=memory), w.contiguous(memory_format=memory)
    y = empty_like_layout(conv_output_shape(x.shape, w.shape, conv), x).normal_()
    return conv, ConvTensors(x, w, y)


def problem(
    direction: str, conv: ConvDesc, t: ConvTensors, device: str | None = None
) -> ConvProblem:
    """The problem of `t` in `direction`, on `device` (default: where `t` is; t may be on the
    meta device when only the problem's key is wanted)."""
    x, w, y = (TensorDesc.of(a) for a in (t.x, t.w, t.y))
    device = device or t.x.device.type
    return ConvProblem.create(Direction.parse(direction), x, w, y, conv, device)


def stored_sizes(
    p: ConvProblem, t: ConvTensors, sizes: Sequence[int], env: database.Environment
) -> list[int]:
    """The micro-batch sizes of `p` (on `t`'s shapes) whose results the tuning database holds
    for `env`."""
    db = database.database()
    return [b for b in sizes if db.lookup(sub_problem(p, t, 0, b)[0].key(), b, env)]


def _compile_one(item: tuple[dict, int, str, str, str]) -> int:
    """In a worker process: run every algorithm that supports one (layer, micro-batch size,
    dtype, direction, device) once, on fresh operands, with the first tile candidate; times
    nothing. Returns how many ran."""
    os.environ["RTDNN_AUTOTUNE"] = "0"  # tuning would time kernels side by side with others
    layer, batch, dtype, direction, device = item
    conv, t = operands(layer, batch, DTYPES[dtype], device)
    p = problem(direction, conv, t)
    ran = 0
    for algo in supported_algorithms(p):
        written = t.written(p.direction)
        tensors = t.with_written(p.direction, torch.empty_like(written))
        try:
            algo.run(p, tensors, allocate_workspace(algo.workspace_bytes(p), written.device))
            ran += 1
        except Exception:  # noqa: BLE001  what fails here, the measurement reports
            pass
    if device == "cuda":
        torch.cuda.synchronize()
    return ran


def compile_ahead(
    layers: Sequence[dict],
    batch: int,
    dtype: str,
    directions: Sequence[str],
    policies: Sequence[str],
    workers: int,
) -> tuple[int, float]:
    """Compile what measure_suite will run on the GPU in `workers` processes (see the module
    docstring); (algorithm runs, seconds). Nothing with fewer than two workers."""
    if workers < 2:
        return 0, 0.0
    sizes = sorted({b for policy in policies for b in batch_sizes(policy, batch)})
    # What the tuning database holds is read back, not run: a cut-off run resumes cheaply.
    env, items = database.environment("cuda"), []
    for layer in layers:
        conv, t = operands(layer, batch, DTYPES[dtype], "meta")
        for d in directions:
            held = set(stored_sizes(problem(d, conv, t, "cuda"), t, sizes, env))
            items += [(layer, b, dtype, d, "cuda") for b in sizes if b not in held]
    if not items:
        return 0, 0.0
    start = time.perf_counter()
    # Spawned, not forked: CUDA does not survive a fork.
    with torch.multiprocessing.get_context("spawn").Pool(workers) as pool:
        ran = sum(pool.map(_compile_one, items, chunksize=1))
    return ran, time.perf_counter() - start


def measure_suite(
    layers: Sequence[dict],
    batch: int,
    dtype: torch.dtype,
    device: str,
    directions: Sequence[str],
    policies: Sequence[str],
    progress: Callable[[str], None] = print,
) -> list[Kernel]:
    """Every algorithm at every micro-batch size `policies` allow, per layer and direction.

    Each size is measured on its own so that the report can say what each policy's benchmark
    costs. Sizes the tuning database holds for this environment are read back, not measured.
    """
    sizes = sorted({b for policy in policies for b in batch_sizes(policy, batch)})
    env = database.environment(device)
    kernels = []
    for layer in layers:
        conv, t = operands(layer, batch, dtype, device)
        for direction in directions:
            p = problem(direction, conv, t)
            stored = stored_sizes(p, t, sizes, env)
            table, seconds = {}, {}
            for b in sizes:
                start = time.perf_counter()
                table.update(measure(p, t, [b]))
                seconds[b] = time.perf_counter() - start
            kernels.append(
                Kernel(layer["name"], direction, layer.get("count", 1), p, table, seconds, stored)
            )
            progress(
                f"measured {layer['name']:12s} {direction:16s} {len(sizes)} sizes "
                f"({len(stored)} from the tuning database) in {sum(seconds.values()):.1f} s"
            )
        del t
    return kernels


# -- planning ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """A workspace setting: "reuse" with a per-convolution limit, or "divide" with a budget."""

    policy: str  # "reuse" or "divide"
    limit_bytes: int

    @property
    def name(self) -> str:
        return f"{self.policy} {_size(self.limit_bytes)}"


@dataclass
class Choice:
    """The plans a setting and a micro-batch policy give one kernel: (plan, how many of the
    kernel's `count` convolutions run it); under divide, equal convolutions may differ."""

    plans: list[tuple[Plan, int]]

    @property
    def planned_ms(self) -> float:
        return sum(p.time_ms * n for p, n in self.plans)


def plan_all(
    kernels: list[Kernel], policies: Sequence[str], settings: Sequence[Setting]
) -> tuple[dict[tuple[str, str], list[Choice]], dict[str, float], dict[str, float]]:
    """The choices per (setting name, policy), one per kernel; and the seconds the dynamic
    programs (the fronts) and the integer linear programs took, per policy.

    The undivided plans are candidates of every policy, so no policy's choice is slower than
    undivided's: per kernel under reuse, in total under divide (where the solver's optimality
    gap could otherwise leave a policy's total a hair above undivided's, its undivided choice
    is kept then).
    """
    try:  # imported now, so that the solver's seconds leave the import out
        import scipy.optimize  # noqa: F401
    except ImportError:
        pass  # divide_workspace says what is missing
    dp_s, ilp_s = dict.fromkeys(policies, 0.0), dict.fromkeys(policies, 0.0)
    for policy in policies:
        start = time.perf_counter()
        for k in kernels:
            k.fronts[policy] = desirable_plans(k.table, k.batch, policy)
        dp_s[policy] = time.perf_counter() - start
    choices: dict[tuple[str, str], list[Choice]] = {}
    for s in settings:
        for policy in policies:
            if s.policy == "reuse":
                picked = reuse_workspace([k.fronts[policy] for k in kernels], s.limit_bytes)
                choices[s.name, policy] = [
                    Choice([(p, k.count)]) for p, k in zip(picked, kernels, strict=True)
                ]
                continue
            start = time.perf_counter()
            flat = [k.fronts[policy] for k in kernels for _ in range(k.count)]
            chosen = iter(divide_workspace(flat, s.limit_bytes))
            ilp_s[policy] += time.perf_counter() - start
            per_kernel = [[next(chosen) for _ in range(k.count)] for k in kernels]
            choices[s.name, policy] = [
                Choice([(p, plans.count(p)) for p in dict.fromkeys(plans)]) for plans in per_kernel
            ]
    for s in settings:
        if s.policy == "divide" and "undivided" in policies:
            base = choices[s.name, "undivided"]
            for policy in policies:
                if _total(choices[s.name, policy]) > _total(base):
                    choices[s.name, policy] = base
    return choices, dp_s, ilp_s


def _total(choices: list[Choice]) -> float:
    return sum(c.planned_ms for c in choices)


def unlocked(k: Kernel, plan: Plan) -> list[str]:
    """Algorithms the plan runs on micro-batches that the whole batch could not run within the
    plan's workspace: what splitting made usable."""
    whole = {a: ws for a, _, ws in k.table.get(k.batch, ())}
    return sorted(
        {a for _, a in plan.micro_batches if whole.get(a, math.inf) > plan.workspace_bytes}
    )


# -- running the plans ------------------------------------------------------------------------


def _time_ms(fn: Callable[[], None], device: str) -> float:
    """Device time on a GPU; on the CPU the wall time of one interpreted run after another (as
    select.find times there)."""
    if device == "cuda":
        return device_time_ms(fn, rep_ms=50)
    fn()
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def run_plans(
    layers: Sequence[dict],
    kernels: list[Kernel],
    choices: dict[tuple[str, str], list[Choice]],
    dtype: torch.dtype,
    device: str,
    progress: Callable[[str], None] = print,
) -> dict[tuple[str, str, tuple], tuple[float, float]]:
    """{(layer, direction, micro_batches): (run ms, rel. error against the undivided plan)}
    for every distinct plan chosen."""
    results = {}
    by_layer = {layer["name"]: layer for layer in layers}
    for i, k in enumerate(kernels):
        plans = {p.micro_batches: p for c in choices.values() for p, _ in c[i].plans}
        _, t = operands(by_layer[k.layer], k.batch, dtype, device)
        for plan, result in _run_kernel(k.problem, list(plans.values()), t, device).items():
            results[k.layer, k.direction, plan.micro_batches] = result
        progress(f"ran {k.layer:12s} {k.direction:16s} {len(plans)} plans")
    return results


def _run_kernel(
    p: ConvProblem, plans: list[Plan], t: ConvTensors, device: str
) -> dict[Plan, tuple[float, float]]:
    """{plan: (run ms, rel. error)} for plans of one problem on `t`, the errors against the
    output of an undivided plan (run first)."""
    results = {}
    written, reference = t.written(p.direction), None
    for plan in sorted(plans, key=lambda q: (len(q.micro_batches) > 1, q.time_ms)):
        # `written` holds the last timed run's output afterwards.
        ms = _time_ms(lambda plan=plan: run_plan(plan, p, t, 1.0, 0.0), device)
        if reference is None:
            reference = written.detach().to("cpu", torch.float64)  # where rel_error compares
        results[plan] = (ms, rel_error(written, reference))
    return results


# -- the report -------------------------------------------------------------------------------


def run(
    layers: Sequence[dict],
    *,
    suite: str,
    batch: int,
    dtype: str = "float32",
    directions: Sequence[str] = DIRECTIONS,
    policies: Sequence[str] = POLICIES,
    limits: Sequence[int] = LIMITS,
    budget: int | None = None,
    device: str | None = None,
    out_dir: str | None = None,
    execute: bool = True,
    workers: int = 0,
    progress: Callable[[str], None] = print,
) -> dict:
    """The experiment on `layers` (suite entries; their "n" is ignored for `batch`): returns
    the report as a JSON-ready dict and, with `out_dir`, writes micro_batch_{suite}.json,
    .md and _pareto.png (the figure needs matplotlib; without it the report says so).

    limits: per-convolution limits in bytes (reuse); budget: the network budget in bytes
    (divide), by default the middle limit times the number of convolutions (layers' counts
    times directions): what per-convolution buffers of that size take together, as in Caffe,
    where every layer holds its own. `execute` False skips running the plans. `workers`: on a
    GPU, processes that compile the kernels ahead of the measurements (compile_ahead; 0: none).
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch_dtype = DTYPES[dtype]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise bad_param("policies", list(policies), f"some of {POLICIES}")
    policies = [p for p in POLICIES if p in policies]  # undivided first: the baseline
    compiled, compile_s = (0, 0.0)
    if device == "cuda":
        compiled, compile_s = compile_ahead(layers, batch, dtype, directions, policies, workers)
        progress(
            f"compiled ahead: {compiled} algorithm runs in {compile_s:.0f} s, {workers} workers"
        )
    torch.manual_seed(0)
    kernels = measure_suite(layers, batch, torch_dtype, device, directions, policies, progress)
    convolutions = sum(k.count for k in kernels)
    if budget is None:
        budget = sorted(limits)[len(limits) // 2] * convolutions
    settings = [Setting("reuse", limit) for limit in sorted(limits)] + [Setting("divide", budget)]
    choices, dp_s, ilp_s = plan_all(kernels, policies, settings)
    runs = run_plans(layers, kernels, choices, torch_dtype, device, progress) if execute else {}

    report = {
        "suite": suite,
        "batch": batch,
        "dtype": dtype + (" (TF32)" if torch_dtype == torch.float32 else ""),
        "device": str(database.environment(device)),
        "timing": "device" if device == "cuda" else "interpreter",
        "tiles": "first candidate (RTDNN_AUTOTUNE=0)"
        if os.environ.get("RTDNN_AUTOTUNE") == "0"
        else "tuned per problem",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _commit(),
        "rtdnn": __version__,
        "policies": policies,
        "settings": [{"name": s.name, "policy": s.policy, "limit_bytes": s.limit_bytes}
                     for s in settings],
        "convolutions": convolutions,
        # Plans are checked against the undivided plan's output within this relative error
        # (different algorithms round differently).
        "tolerance": AGREEMENT[torch_dtype],
        "paper": PAPER,
        "kernels": [_kernel_json(k) for k in kernels],
        "plans": _plan_rows(kernels, settings, policies, choices, runs),
        "cost": {
            "benchmark_s": {p: _benchmark_s(kernels, p, batch) for p in policies},
            "compile_ahead_s": compile_s,
            "sizes": {p: len(batch_sizes(p, batch)) for p in policies},
            "dynamic_program_s": dp_s,
            "ilp_s": ilp_s,
        },
    }  # fmt: skip
    report["totals"] = _totals(report["plans"], settings, policies)
    report["disagree"] = sum(r["rel_err"] > report["tolerance"] for r in report["plans"])
    report["figure"] = None
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        stem = os.path.join(out_dir, f"micro_batch_{suite}")
        report["figure"] = plot_front(report, kernels, choices, settings, stem + "_pareto.png")
        with open(stem + ".json", "w") as f:
            json.dump(_finite(report), f, indent=1)
        with open(stem + ".md", "w") as f:
            f.write(markdown(report))
    return report


def _finite(value):
    """`value` with NaN (times of plans not run) as None, which JSON can hold."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _commit() -> str:
    """The source's commit, "-dirty" when the working tree differs from it (a copy of a tree
    with uncommitted changes, or a repository whose HEAD is not the code that runs)."""
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=7"], capture_output=True,
            text=True, timeout=10, cwd=os.path.dirname(os.path.abspath(__file__)),
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def _benchmark_s(kernels: list[Kernel], policy: str, batch: int) -> float:
    """Seconds spent measuring the sizes `policy` needs (sizes read from the database cost
    nothing here)."""
    return sum(k.benchmark_s[b] for k in kernels for b in batch_sizes(policy, batch))


def _kernel_json(k: Kernel) -> dict:
    return {
        "layer": k.layer,
        "direction": k.direction,
        "count": k.count,
        "problem": k.problem.key(),
        "sizes_from_database": k.stored,
        "table": {str(b): rows for b, rows in k.table.items()},
    }


def _plan_rows(kernels, settings, policies, choices, runs) -> list[dict]:
    """One row per (setting, kernel, policy): the plans and their times, planned and run."""
    rows = []
    for s in settings:
        for i, k in enumerate(kernels):
            base = choices[s.name, policies[0]][i]
            base_run = _run_ms(k, base, runs)
            for policy in policies:
                c = choices[s.name, policy][i]
                run_ms = _run_ms(k, c, runs)
                errors = [
                    runs[k.layer, k.direction, p.micro_batches][1]
                    for p, _ in c.plans
                    if (k.layer, k.direction, p.micro_batches) in runs
                ]
                rows.append({
                    "setting": s.name, "layer": k.layer, "direction": k.direction,
                    "count": k.count, "policy": policy,
                    "plans": [{"micro_batches": [list(m) for m in p.micro_batches],
                               "time_ms": p.time_ms, "workspace_bytes": p.workspace_bytes,
                               "convolutions": n} for p, n in c.plans],
                    "workspace_bytes": max(p.workspace_bytes for p, _ in c.plans),
                    "planned_ms": c.planned_ms,
                    "planned_speedup": base.planned_ms / c.planned_ms,
                    "run_ms": run_ms,
                    "run_speedup": base_run / run_ms,
                    "rel_err": max(errors, default=math.nan),
                    "unlocked": sorted({a for p, _ in c.plans for a in unlocked(k, p)}),
                })  # fmt: skip
    return rows


def _run_ms(k: Kernel, c: Choice, runs) -> float:
    """The choice's run time over the kernel's convolutions; NaN if the plans were not run."""
    keys = [(k.layer, k.direction, p.micro_batches) for p, _ in c.plans]
    if not all(key in runs for key in keys):
        return math.nan
    return sum(runs[key][0] * n for key, (_, n) in zip(keys, c.plans, strict=True))


def _totals(rows: list[dict], settings, policies) -> list[dict]:
    """Per setting and policy: summed times and the workspace held (reuse: the one buffer,
    as large as the largest plan's; divide: the sum of every convolution's). Also the planned
    time without the first layer's backward-data: a training step whose input needs no
    gradient (Caffe's, the paper's) does not run it (from the same plans: under a network
    budget the program would give its buffer to others)."""
    totals = []
    first = rows[0]["layer"] if rows else None
    for s in settings:
        base = None
        for policy in policies:
            sub = [r for r in rows if r["setting"] == s.name and r["policy"] == policy]
            planned = sum(r["planned_ms"] for r in sub)
            ran = sum(r["run_ms"] for r in sub)
            input_grad = sum(
                r["planned_ms"]
                for r in sub
                if r["layer"] == first and r["direction"] == Direction.BACKWARD_DATA.value
            )
            if s.policy == "reuse":
                workspace = max(r["workspace_bytes"] for r in sub)
            else:
                workspace = sum(
                    p["workspace_bytes"] * p["convolutions"] for r in sub for p in r["plans"]
                )
            base = base or (planned, ran, planned - input_grad)
            totals.append({
                "setting": s.name, "policy": policy, "planned_ms": planned, "run_ms": ran,
                "planned_speedup": base[0] / planned, "run_speedup": base[1] / ran,
                "no_input_grad_ms": planned - input_grad,
                # NaN when the first layer's backward-data is all the suite ran.
                "no_input_grad_speedup": base[2] / (planned - input_grad)
                if planned > input_grad
                else math.nan,
                "workspace_bytes": workspace, "limit_bytes": s.limit_bytes,
            })  # fmt: skip
    return totals


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", KiB)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{nbytes:.0f} B"


def describe(micro_batches: Sequence[Sequence]) -> str:
    """ "2x128 FFT + 64 GEMM": equal micro-batches counted."""
    parts: list[list] = []
    for b, a in micro_batches:
        if parts and parts[-1][1:] == [b, a]:
            parts[-1][0] += 1
        else:
            parts.append([1, b, a])
    return " + ".join(f"{n}x{b} {a}" if n > 1 else f"{b} {a}" for n, b, a in parts)


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


def _x(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def markdown(report: dict) -> str:
    policies = report["policies"]
    interpreted = report["timing"] == "interpreter"
    # report["convolutions"] counts (convolution, direction) pairs, as the budget does.
    directions = len({r["direction"] for r in report["plans"]})
    lines = [
        f"### Micro-batching (μ-cuDNN's experiment): {report['suite']}, batch {report['batch']}, "
        f"{report['dtype']}",
        "",
        f"{report['date']}, {report['device']}, commit {report['commit']}, kernel tiles "
        f"{report['tiles']}; "
        f"{report['convolutions'] // directions} convolutions x {directions} directions.",
        "",
        "**Timings: Triton interpreter on the CPU, not GPU times; they say nothing about any "
        "GPU.**" if interpreted else "Timings: device time (CUDA-graph replay, median, L2 "
        "flushed).",
        "*planned*: the sum of the plan's benchmarked micro-batch times (what the planner "
        "predicts); *run*: the plan executed end to end. Speedups are against the undivided "
        "policy under the same workspace setting. reuse L: every convolution within L, one "
        "buffer for all; divide B: one budget B for the sum of the convolutions' buffers "
        "(integer linear program).",
        "",
        _agreement(report),
        "",
        "*no input grad*: planned, without the first convolution's backward-data, which a "
        "training step whose input needs no gradient (Caffe's, the paper's) does not run.",
        "",
        "| setting | policy | planned ms | speedup | run ms | speedup | no input grad ms | "
        "speedup | workspace held |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for t in report["totals"]:
        lines.append(
            f"| {t['setting']} | {t['policy']} | {_ms(t['planned_ms'])} | "
            f"**{_x(t['planned_speedup'])}** | {_ms(t['run_ms'])} | {_x(t['run_speedup'])} | "
            f"{_ms(t['no_input_grad_ms'])} | {_x(t['no_input_grad_speedup'])} | "
            f"{_size(t['workspace_bytes'])} |"
        )
    lines += ["", "What μ-cuDNN's authors report (P100, not comparable hardware):", ""]
    lines += ["| workload | speedup | setting | source |", "|---|---:|---|---|"]
    lines += [f"| {p['workload']} | {p['result']} | {p['setting']} | {p['source']} |"
              for p in report["paper"]]  # fmt: skip
    best = policies[-1]
    for s in report["settings"]:
        head = "| layer | direction | n | " + " | ".join(f"{p} ms | x" for p in policies)
        lines += [
            "",
            f"#### {s['name']}: per layer (planned ms; n convolutions of the shape)",
            "",
            head + f" | plan ({best}) | workspace | unlocked | run x | rel. err |",
            "|---|---|---:|" + "---:|---:|" * len(policies) + "---|---:|---|---:|---:|",
        ]
        rows = [r for r in report["plans"] if r["setting"] == s["name"]]
        for r in (r for r in rows if r["policy"] == best):
            same = {p: next(q for q in rows if q["policy"] == p and q["layer"] == r["layer"]
                            and q["direction"] == r["direction"]) for p in policies}  # fmt: skip
            cells = " | ".join(
                f"{_ms(same[p]['planned_ms'])} | {_x(same[p]['planned_speedup'])}" for p in policies
            )
            plan = "; ".join(
                describe(p["micro_batches"])
                + (f" (x{p['convolutions']})" if len(r["plans"]) > 1 else "")
                for p in r["plans"]
            )
            lines.append(
                f"| {r['layer']} | {r['direction']} | {r['count']} | {cells} | {plan} | "
                f"{_size(r['workspace_bytes'])} | {', '.join(r['unlocked']) or '-'} | "
                f"{_x(r['run_speedup'])} | {_err(r['rel_err'], report['tolerance'])} |"
            )
    cost = report["cost"]
    lines += [
        "",
        "#### Planning cost",
        "",
        "Benchmark seconds count only sizes not already in the tuning database "
        f"({sum(len(k['sizes_from_database']) for k in report['kernels'])} "
        "(convolution, size) pairs were read from it), after compiling the kernels ahead in "
        f"parallel for {cost.get('compile_ahead_s', 0.0):.0f} s (every policy's sizes at once).",
        "",
        "| policy | sizes per convolution | benchmark s | dynamic programs s | ILP s (divide) |",
        "|---|---:|---:|---:|---:|",
    ]
    for p in policies:
        lines.append(
            f"| {p} | {cost['sizes'][p]} | {cost['benchmark_s'][p]:.2f} | "
            f"{cost['dynamic_program_s'][p]:.3f} | {cost['ilp_s'][p]:.3f} |"
        )
    if report["figure"]:
        lines += ["", f"![Pareto front]({os.path.basename(report['figure'])})"]
    elif report.get("figure_missing"):
        lines += ["", f"(No figure: {report['figure_missing']}.)"]
    return "\n".join(lines) + "\n"


def _err(value: float, tolerance: float) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:.1e}" + (" **NO**" if value > tolerance else "")


def _agreement(report: dict) -> str:
    if all(math.isnan(r["rel_err"]) for r in report["plans"]):
        return "The plans were not run."
    if report["disagree"]:
        return (
            f"**{report['disagree']} plans disagree with the undivided plan's output** "
            f"(rel. error above {report['tolerance']:.0e}, marked NO)."
        )
    return (
        f"Every plan's output agrees with the undivided plan's within {report['tolerance']:.0e} "
        "(rel. error)."
    )


# -- the figure -------------------------------------------------------------------------------


def plot_front(
    report: dict,
    kernels: list[Kernel],
    choices: dict[tuple[str, str], list[Choice]],
    settings: Sequence[Setting],
    path: str,
) -> str | None:
    """A PNG of one kernel's Pareto fronts (time against workspace, one per policy) with the
    plans chosen under each reuse limit marked (a star; a cross for the undivided choice); the
    kernel is the one micro-batching speeds up most under the middle limit. Returns the path,
    or None (and the reason in report["figure_missing"]) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        report["figure_missing"] = f"matplotlib is not installed ({e}); pip install 'rtdnn[demo]'"
        return None
    policies = report["policies"]
    reuse = [s for s in settings if s.policy == "reuse"]
    middle = reuse[len(reuse) // 2]
    best = policies[-1]

    def gain(i: int) -> float:
        base = choices[middle.name, policies[0]][i].planned_ms
        return base / choices[middle.name, best][i].planned_ms

    i = max(range(len(kernels)), key=gain)
    k = kernels[i]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy, style in zip(policies, ("o-", "s--", "^:"), strict=False):
        front = k.fronts[policy]
        ax.plot(
            [p.workspace_bytes / MiB for p in front], [p.time_ms for p in front], style,
            drawstyle="steps-post", label=f"{policy} front ({len(front)} plans)", alpha=0.8,
        )  # fmt: skip
    for s, color in zip(reuse, ("tab:red", "tab:purple", "black", "tab:brown"), strict=False):
        ax.axvline(s.limit_bytes / MiB, color=color, lw=0.8, ls=":")
        (plan, _), *_ = choices[s.name, best][i].plans
        (base, _), *_ = choices[s.name, policies[0]][i].plans
        ax.plot(base.workspace_bytes / MiB, base.time_ms, "x", color=color, ms=10, mew=2)
        ax.plot(
            plan.workspace_bytes / MiB, plan.time_ms, "*", color=color, ms=14,
            label=f"{s.name}: {describe(plan.micro_batches)} (x: {policies[0]})",
        )  # fmt: skip
    ax.set_xscale("symlog", linthresh=min(s.limit_bytes for s in reuse) / MiB / 8)
    ax.set_xlabel("workspace (MiB)")
    timing = "interpreter ms (CPU)" if report["timing"] == "interpreter" else "ms"
    ax.set_ylabel(f"planned time, {timing}")
    ax.set_title(
        f"{report['suite']} {k.layer} {k.direction}, batch {k.batch}: chosen plans ({best}) "
        "marked", fontsize=9,
    )  # fmt: skip
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    report["figure_kernel"] = {"layer": k.layer, "direction": k.direction}
    return path


# -- the command line -------------------------------------------------------------------------


def run_suites(
    suites: Sequence[str] | None,
    dtype: str,
    directions: Sequence[str] | None,
    batch: int | None,
    limit: int | None,
    policies: Sequence[str] | None,
    budget_mib: int | None,
    out_dir: str,
    workers: int | None = None,
) -> list[dict]:
    """`rtdnn bench --micro-batch`: the experiment on each suite (default: SUITES at their
    batch sizes), the first `limit` layers of each, printing the Markdown report. Without a
    GPU: the tiny layers through the interpreter instead, whatever the suite options say.
    workers: processes compiling kernels ahead on the GPU (default: the CPUs, at most 16)."""
    from .conv import load_suite

    common = dict(
        directions=directions or DIRECTIONS, policies=policies or POLICIES, out_dir=out_dir
    )
    if not torch.cuda.is_available():
        print(
            "No CUDA device: the experiment on two tiny layers through Triton's interpreter, "
            f"batch {TINY_BATCH}, limits of 8, 64 and 512 KiB; some minutes (interpreter "
            "timings, not GPU times; suite, batch, dtype and budget options are for the GPU "
            "run)."
        )
        report = run(TINY, suite="tiny", batch=TINY_BATCH, limits=TINY_LIMITS, **common)
        print(markdown(report))
        return [report]
    reports = []
    for suite in suites or SUITES:
        layers = load_suite(suite)[:limit]
        n = batch or SUITES.get(suite) or layers[0]["n"]
        budget = budget_mib * MiB if budget_mib else None
        if workers is None:
            workers = min(16, os.cpu_count() or 1)
        report = run(
            layers, suite=suite, batch=n, dtype=dtype, budget=budget, workers=workers, **common
        )
        print(markdown(report))
        reports.append(report)
    return reports
