"""Every convolution algorithm on every layer of a suite: where each one wins.

For each layer and direction, each algorithm that supports the problem is run by name (its
workspace allocated as a plain call allocates it) and timed beside PyTorch's convolution
(cuDNN on a GPU) in the same process, the way bench.conv times rtdnn's own choice; its result
is compared with cuDNN's. One row per (layer, direction, algorithm): time, workspace bytes,
ratio to cuDNN, relative error against cuDNN's result, whether it was the fastest correct one
for that (layer, direction) and whether algo="auto" picks it. A second table counts, per
algorithm, the (layer, direction) pairs it won: its win region; a third, the winners per
filter size and stride.

Without a GPU the same runs through Triton's interpreter on TINY_LAYERS, a smoke run: its
times measure the interpreter, not the algorithms.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass

import torch

from .. import ops
from ..algos import ALGORITHMS, get_algorithm
from ..core import (
    ConvDesc,
    ConvProblem,
    Direction,
    TensorDesc,
    conv_output_shape,
    empty_like_layout,
    resolve_math_mode,
)
from ..core.timing import device_time_ms
from .conv import (
    DIRECTIONS,
    DTYPES,
    LayerCalls,
    float64_errors,
    geomean,
    judge,
    layer_calls,
    load_suite,
)
from .output import write_results

#: The CPU smoke run's layers: a 3x3 stride-1 layer (every 2-D algorithm takes it) and a
#: 1-D one; small enough for the interpreter.
TINY_LAYERS = [
    {"name": "tiny_3x3", "n": 1, "c": 4, "k": 4, "spatial": [6, 6], "kernel": [3, 3],
     "stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1},
    {"name": "tiny_1d_k5", "n": 1, "c": 2, "k": 2, "spatial": [16], "kernel": [5],
     "stride": [1], "padding": [2], "dilation": [1], "groups": 1},
]  # fmt: skip

#: "auto" counts as choosing well where it is within this factor of the fastest.
AUTO_SLACK = 1.05


@dataclass
class AlgoRow:
    layer: str
    direction: str
    algo: str
    ms: float  # NaN where the algorithm did not run
    workspace_bytes: int
    cudnn_ms: float
    ratio: float  # cuDNN time / this algorithm's: above 1 means faster than cuDNN
    rel_err_vs_cudnn: float
    ok: bool  # ran, and right (bench.conv.judge: cuDNN's result, else the float64 one)
    # "ok", "wrong result" (either followed by both errors against float64 where the
    # algorithm disagreed with cuDNN), "not supported: <reason>", "failed: <error>"
    status: str = "ok"
    fastest: bool = False  # the fastest correct algorithm for this (layer, direction)
    auto: bool = False  # the one algo="auto" runs here
    kernel: str = ""  # filter size and stride, e.g. "3x3 s1": what the win regions group by

    @property
    def failed(self) -> bool:
        """It should have run correctly and did not (not supported is no failure)."""
        return self.status.startswith(("failed", "wrong result"))


def algorithm_names(algo: str) -> list[str]:
    """The algorithms `--algo` names: "all", or one name (any case; BadParamError naming
    the known ones for another)."""
    if algo.lower() == "all":
        return list(ALGORITHMS)
    return [get_algorithm(algo).name]


def _problem(c: LayerCalls, direction: str, math_mode: str | None = None) -> ConvProblem:
    """The problem rtdnn's call builds for this layer (what supports and workspace_bytes
    are asked about): the written tensor laid out as the call allocates it (like x for
    forward and backward-filter, like dy for backward-data), the math mode it resolves."""
    a = c.args
    conv = ConvDesc.create(
        c.x.dim() - 2, a["stride"], a["padding"], a["dilation"], a["groups"],
        "cross_correlation", resolve_math_mode(math_mode),
    )  # fmt: skip
    d = Direction.parse(direction)
    x, w, y = c.x, c.w, c.dy
    if d == Direction.FORWARD:
        y = empty_like_layout(conv_output_shape(c.x.shape, c.w.shape, conv), c.x)
    elif d == Direction.BACKWARD_DATA:
        x = empty_like_layout(c.x.shape, c.dy)
    else:
        w = empty_like_layout(c.w.shape, c.x)
    return ConvProblem.create(
        d, TensorDesc.of(x), TensorDesc.of(w), TensorDesc.of(y), conv, c.x.device.type
    )


def _time_ms(fn, device: str, warmed: bool = False) -> float:
    """Device time on the GPU, as bench.conv measures it; elsewhere one run's wall time,
    after a first run unless `warmed` (fn already ran once)."""
    if device == "cuda":
        return device_time_ms(fn, rep_ms=100)
    if not warmed:
        fn()
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def run_layer_algos(
    layer: dict,
    direction: str,
    dtype: torch.dtype,
    algos: list[str],
    batch: int | None = None,
    device: str = "cuda",
    list_unsupported: bool = False,
    math_mode: str | None = None,
) -> list[AlgoRow]:
    """One row per algorithm of `algos` that supports this layer in `direction` (and, with
    `list_unsupported`, one saying why for each that does not), fastest and auto marked.
    `math_mode`: rtdnn's `math` for float32 (cuDNN's TF32 switch is the caller's)."""
    c = layer_calls(layer, direction, dtype, batch, device)
    p = _problem(c, direction, math_mode)
    exact = functools.cache(lambda: c.exact().cpu())  # only where an algorithm disagrees
    cudnn_ms = _time_ms(c.theirs, device)
    auto = ops.get_conv_algorithm(c.x, c.w, direction=direction, math=math_mode, **c.args)
    rows = []
    for name in algos:
        a = ALGORITHMS[name]
        row = AlgoRow(layer["name"], direction, name, math.nan, 0, cudnn_ms, math.nan, math.nan,
                      False, auto=name == auto, kernel=kernel_label(layer))  # fmt: skip
        reason = a.supports(p)
        if reason is not None:
            if list_unsupported:
                row.status = f"not supported: {reason}"
                rows.append(row)
            continue
        row.workspace_bytes = a.workspace_bytes(p)
        run = lambda name=name: c.ours(algo=name, math=math_mode)
        try:
            verdict = judge(run(), c, dtype, exact)
            row.rel_err_vs_cudnn = verdict.err
            row.ms = _time_ms(run, device, warmed=True)
        except Exception as e:  # one failing algorithm must not hide the others' results
            row.status = f"failed: {type(e).__name__}: {e}"
        else:
            row.ratio = cudnn_ms / row.ms
            row.ok = verdict.ok
            row.status = "ok" if row.ok else "wrong result"
            row.status += float64_errors(verdict.err64, verdict.cudnn_err64)
        rows.append(row)
    correct = [r for r in rows if r.ok]
    if correct:
        min(correct, key=lambda r: r.ms).fastest = True
    return rows


def kernel_label(layer: dict) -> str:
    """A layer's filter size and stride as the win regions name them: "3x3 s1", "31 s1",
    "5x20 s2x1" (a stride equal in every dim written once), " g" added if grouped."""
    sizes = "x".join(map(str, layer["kernel"]))
    strides = "x".join(map(str, dict.fromkeys(layer["stride"])))
    return f"{sizes} s{strides}" + (" g" if layer.get("groups", 1) > 1 else "")


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def markdown(rows: list[AlgoRow], title: str, baseline: str = "cuDNN") -> str:
    """The per-algorithm table (fastest per layer and direction in bold) and the win-region
    table."""
    lines = [
        f"### {title}",
        "",
        f"| layer | direction | algo | ms | workspace | {baseline} ms | ratio | rel. err vs "
        f"{baseline} | fastest | auto | status |",
        "|---|---|---|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for r in rows:
        ran = r.status.startswith(("ok", "wrong result"))
        name = f"**{r.algo}**" if r.fastest else r.algo
        timing = f"{r.ms:.3f} | {_size(r.workspace_bytes)}" if ran else "- | -"
        ratio = f"{r.ratio:.2f} | {r.rel_err_vs_cudnn:.1e}" if ran else "- | -"
        lines.append(
            f"| {r.layer} | {r.direction} | {name} | {timing} | {r.cudnn_ms:.3f} | {ratio} | "
            f"{'**yes**' if r.fastest else ''} | {'yes' if r.auto else ''} | {r.status} |"
        )
    return "\n".join(lines) + "\n\n" + win_regions(rows, baseline)


def win_regions(rows: list[AlgoRow], baseline: str = "cuDNN") -> str:
    """Per algorithm: the (layer, direction) pairs it ran on, won (overall and per
    direction), and beat the baseline on; and how often algo="auto" was near the best."""
    directions = [d for d in DIRECTIONS if any(r.direction == d for r in rows)]
    head = "| algo | ran on | fastest on | " + " | ".join(f"fastest {d}" for d in directions)
    lines = [
        "#### Win regions: (layer, direction) pairs where each algorithm was the fastest",
        "",
        head + f" | faster than {baseline} | geomean ratio |",
        "|---|---:|---:|" + "---:|" * len(directions) + "---:|---:|",
    ]
    for algo in dict.fromkeys(r.algo for r in rows):
        mine = [r for r in rows if r.algo == algo and r.ok]
        won = [r for r in mine if r.fastest]
        per_direction = " | ".join(str(sum(r.direction == d for r in won)) for d in directions)
        lines.append(
            f"| {algo} | {len(mine)} | {len(won)} | {per_direction} | "
            f"{sum(r.ratio > 1 for r in mine)} | {geomean([r.ratio for r in mine]):.2f} |"
        )
    lines += ["", *_wins_by_kernel(rows)]
    # auto's choice is judged only where it was among the algorithms timed.
    judged = {(r.layer, r.direction) for r in rows if r.auto and r.ok}
    near = 0
    for pair in judged:
        here = [r for r in rows if (r.layer, r.direction) == pair and r.ok]
        best = min(r.ms for r in here)
        near += any(r.auto and r.ms <= AUTO_SLACK * best for r in here)
    if judged:
        lines += [
            "",
            f'algo="auto" ran an algorithm within {100 * (AUTO_SLACK - 1):.0f}% of the fastest '
            f"on {near} of {len(judged)} (layer, direction) pairs.",
        ]
    return "\n".join(lines) + "\n"


def _wins_by_kernel(rows: list[AlgoRow]) -> list[str]:
    """Per filter size and stride: how many (layer, direction) pairs each algorithm won."""
    lines = [
        "By filter size and stride (g: grouped):",
        "",
        "| kernel | pairs | fastest (pairs won) |",
        "|---|---:|---|",
    ]
    for kernel in dict.fromkeys(r.kernel for r in rows):
        here = [r for r in rows if r.kernel == kernel]
        pairs = {(r.layer, r.direction) for r in here}
        wins = {}
        for r in here:
            if r.fastest:
                wins[r.algo] = wins.get(r.algo, 0) + 1
        ranked = sorted(wins.items(), key=lambda item: -item[1])
        lines.append(f"| {kernel} | {len(pairs)} | {', '.join(f'{a} {n}' for a, n in ranked)} |")
    return lines


def run_algo_suite(
    suite: str,
    dtype_name: str,
    directions: list[str],
    algo: str = "all",
    batch: int | None = None,
    limit: int | None = None,
    out_dir: str | None = None,
    layers: list[dict] | None = None,
    math_mode: str = "tf32",
) -> list[AlgoRow]:
    """Every algorithm of `algo` ("all" or a name) on the suite's layers (or `layers`), in
    every direction of `directions`, beside PyTorch; on the GPU if there is one, else through
    the interpreter. float32 runs under `math_mode`: "tf32", or "fp32" (strict, cuDNN's TF32
    off too). Writes conv_algos_<suite>_<dtype>[_strict].json and .md to `out_dir`."""
    from tqdm import tqdm

    names = algorithm_names(algo)
    dtype = DTYPES[dtype_name]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    baseline = "cuDNN" if device == "cuda" else "PyTorch CPU"
    where = (
        torch.cuda.get_device_name()
        if device == "cuda"
        else "Triton's interpreter on the CPU (times measure the interpreter)"
    )
    strict = dtype == torch.float32 and math_mode == "fp32"
    number_format = "" if dtype != torch.float32 else " (strict)" if strict else " (TF32)"
    layers = (layers if layers is not None else load_suite(suite))[:limit]
    title = (
        f"{suite}, {dtype_name}{number_format}, every algorithm ({algo}), batch "
        f"{batch or 'as in suite'}, {where}"
    )
    stem = f"conv_algos_{suite}_{dtype_name}{'_strict' if strict else ''}"
    rows: list[AlgoRow] = []
    work = [(layer, d) for d in directions for layer in layers]
    # cuDNN chooses its algorithms by measurement, with TF32 as rtdnn's math mode says.
    with torch.backends.cudnn.flags(
        enabled=True, benchmark=True, deterministic=False, allow_tf32=not strict
    ):
        progress = tqdm(work, desc=stem, unit="layer")
        for layer, d in progress:
            here = run_layer_algos(
                layer, d, dtype, names, batch, device, list_unsupported=algo.lower() != "all",
                math_mode=math_mode,
            )  # fmt: skip
            rows += here
            for r in here:
                progress.write(
                    f"{r.layer:12s} {r.direction:16s} {r.algo:22s} {r.ms:9.3f} ms vs "
                    f"{baseline} {r.cudnn_ms:.3f} ms: {r.ratio:.2f}x"
                    f"{'  fastest' if r.fastest else ''} ({r.status})"
                )
            if out_dir:  # rewritten after every layer, so an interrupted run keeps what it did
                _write(out_dir, stem, title, rows, baseline)
    print(markdown(rows, title, baseline))
    return rows


def _write(out_dir: str, stem: str, title: str, rows: list[AlgoRow], baseline: str) -> None:
    md = markdown(rows, title, baseline)
    write_results(out_dir, stem, title, rows, md, baseline=baseline)
