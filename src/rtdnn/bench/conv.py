"""Convolution benchmark: rtdnn beside PyTorch/cuDNN on a layer suite, in one process.

Every layer is run through both, rtdnn's result is checked against cuDNN's, and both are timed
the same way (core.timing.device_time_ms: CUDA-graph replay, median, L2 flushed before each
run), so the ratio compares device time. Both sides choose their algorithm by measurement first
(cuDNN's benchmark mode; rtdnn's find_conv_algorithms). The eager columns time plain calls,
host overhead included. Throughput is reported as TFLOP/s and as a percent of the matmul
ceiling measured on the same GPU at the start; for memory-bound layers (those whose FLOPs per
byte moved lie below the GPU's ridge point: matmul ceiling / copy bandwidth, e.g. depthwise
convolutions) also as GB/s and a percent of the copy bandwidth measured at the start, where
the bytes are the least any algorithm moves: the two inputs read once, the output written once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

import torch
import torch.nn.functional as F

from .. import ops
from ..algos import ALGORITHMS
from ..core import NotSupportedError
from ..core.timing import copy_bandwidth, device_time_ms
from ..reference import rel_error
from .output import write_results

DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
}
DIRECTIONS = ("forward", "backward_data", "backward_filter")
# rtdnn vs cuDNN differ by both sides' rounding; these bound rel. error for a correct result.
AGREEMENT = {torch.bfloat16: 2e-2, torch.float16: 3e-3, torch.float32: 5e-3}


@dataclass
class Row:
    layer: str
    direction: str
    algo: str
    rtdnn_ms: float
    cudnn_ms: float
    ratio: float  # cuDNN time / rtdnn time: above 1 means rtdnn is faster
    rtdnn_eager_ms: float
    cudnn_eager_ms: float
    tflops: float
    ceiling_pct: float
    rel_err_vs_cudnn: float
    ok: bool
    gbps: float = 0.0  # least bytes moved (inputs read, output written) / rtdnn time
    copy_pct: float = 0.0  # gbps as a percent of the measured copy bandwidth
    memory_bound: bool = False  # FLOPs per byte below the ridge point
    # Where rtdnn and cuDNN disagree: each one's error against the float64 result.
    rel_err_vs_float64: float = math.nan
    cudnn_err_vs_float64: float = math.nan


def load_suite(name: str) -> list[dict]:
    text = resources.files("rtdnn.bench").joinpath("suites", f"{name}.json").read_text()
    return json.loads(text)["layers"]


def suites() -> list[str]:
    folder = resources.files("rtdnn.bench").joinpath("suites")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def _bench(fn, graph: bool = True) -> float:
    return device_time_ms(fn, rep_ms=100, graph=graph)


def matmul_ceiling(dtype: torch.dtype) -> float:
    """Measured TFLOP/s of a large matmul in this dtype (TF32 for float32) on random data."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    ms = _bench(lambda: a @ b)
    return 2 * n**3 / ms / 1e9


def _channels_last(t: torch.Tensor) -> torch.Tensor:
    """t with its channels innermost, as a model moved to channels-last holds it: 4-D and 5-D
    tensors through torch's memory formats, whose strides for a dimension of size 1 (a
    depthwise filter's one input channel) are those the shipped tile table's keys recorded
    from models (a copy through movedim gives that dimension another stride, and the lookup
    missed)."""
    formats = {4: torch.channels_last, 5: torch.channels_last_3d}
    if t.dim() in formats:
        return t.to(memory_format=formats[t.dim()])
    return t.movedim(1, -1).contiguous().movedim(-1, 1)


def _layer_tensors(layer: dict, dtype: torch.dtype, batch: int | None, device: str = "cuda"):
    n = batch or layer["n"]
    spatial = layer["spatial"]
    kernel = layer["kernel"]
    g = layer.get("groups", 1)
    x = _channels_last(torch.randn(n, layer["c"], *spatial, device=device, dtype=dtype))
    fan_in = layer["c"] // g * math.prod(kernel)
    w = torch.randn(layer["k"], layer["c"] // g, *kernel, device=device, dtype=dtype)
    w = _channels_last(w / math.sqrt(fan_in))
    return x, w


def _conv_args(layer: dict) -> dict:
    return dict(
        stride=layer["stride"],
        padding=layer["padding"],
        dilation=layer["dilation"],
        groups=layer.get("groups", 1),
    )


@dataclass
class LayerCalls:
    """One layer in one direction, ready to run: rtdnn's call (keywords such as algo= go to
    the rtdnn function), PyTorch's (cuDNN on a GPU), and PyTorch's result. dy is the
    gradient the backward directions take."""

    x: torch.Tensor
    w: torch.Tensor
    y: torch.Tensor
    dy: torch.Tensor
    args: dict
    ours: Callable[..., torch.Tensor]
    theirs: Callable[[], torch.Tensor]
    expected: torch.Tensor
    exact: Callable[[], torch.Tensor]  #: the float64 result, computed when asked for

    @property
    def flops(self) -> int:
        # Each output element: one multiply-add per filter element of its group, (C/g) * R.
        return 2 * self.y.numel() * self.w[0].numel()


def layer_calls(
    layer: dict, direction: str, dtype: torch.dtype, batch: int | None, device: str = "cuda"
) -> LayerCalls:
    x, w = _layer_tensors(layer, dtype, batch, device)
    args = _conv_args(layer)
    conv = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[x.dim()]
    y = conv(x, w, None, args["stride"], args["padding"], args["dilation"], args["groups"])
    dy = torch.randn_like(y)
    nd = x.dim() - 2

    mask = [direction == "backward_data", direction == "backward_filter", False]

    def torch_result(x_: torch.Tensor, w_: torch.Tensor, dy_: torch.Tensor) -> torch.Tensor:
        # PyTorch's result of this direction on these tensors (cuDNN on a GPU; float64 ones
        # give the exact result).
        if direction == "forward":
            return conv(x_, w_, None, *args.values())
        grads = torch.ops.aten.convolution_backward(
            dy_, x_, w_, None, args["stride"], args["padding"], args["dilation"], False,
            [0] * nd, args["groups"], mask,
        )  # fmt: skip
        return grads[0] if direction == "backward_data" else grads[1]

    theirs = lambda: torch_result(x, w, dy)
    exact = lambda: torch_result(x.double(), w.double(), dy.double())
    if direction == "forward":
        ours = lambda **kw: ops.conv_forward(x, w, **args, **kw)
        expected = y
    elif direction == "backward_data":
        ours = lambda **kw: ops.conv_backward_data(dy, w, x.shape, **args, **kw)
        expected = theirs()
    else:
        ours = lambda **kw: ops.conv_backward_filter(x, dy, w.shape, **args, **kw)
        expected = theirs()
    return LayerCalls(x, w, y, dy, args, ours, theirs, expected, exact)


@dataclass
class Verdict:
    """Whether rtdnn's result is right: its error against cuDNN's, and where the two
    disagreed, each one's error against the float64 result."""

    ok: bool
    err: float
    err64: float = math.nan
    cudnn_err64: float = math.nan


def judge(
    out: torch.Tensor,
    c: LayerCalls,
    dtype: torch.dtype,
    exact: Callable[[], torch.Tensor] | None = None,
) -> Verdict:
    """rtdnn's result `out` of `c`'s call against cuDNN's. Both round, differently (cuDNN's
    TF32 algorithms among them), so where they disagree beyond AGREEMENT[dtype] the float64
    result of the same call decides: rtdnn passes if within AGREEMENT[dtype] of it. `exact`:
    that result on the CPU, where the caller keeps it for several judgements (default: c's,
    computed here)."""
    err = rel_error(out, c.expected.double().cpu())
    if err < AGREEMENT[dtype]:
        return Verdict(True, err)
    truth = exact() if exact is not None else c.exact().cpu()
    err64, cudnn_err64 = rel_error(out, truth), rel_error(c.expected, truth)
    return Verdict(err64 < AGREEMENT[dtype], err, err64, cudnn_err64)


def run_layer(
    layer: dict,
    direction: str,
    dtype: torch.dtype,
    batch: int | None,
    find: bool = False,
    eager: bool = False,
) -> Row:
    c = layer_calls(layer, direction, dtype, batch)
    x, w, y, args, ours, theirs = c.x, c.w, c.y, c.args, c.ours, c.theirs
    if find:
        ops.find_conv_algorithms(x, w, direction=direction, **args)
    algo = ops.get_conv_algorithm(x, w, direction=direction, **args)
    verdict = judge(ours(), c, dtype)
    ours_ms, theirs_ms = _bench(ours), _bench(theirs)
    ours_eager = theirs_eager = float("nan")
    if eager:
        ours_eager, theirs_eager = _bench(ours, graph=False), _bench(theirs, graph=False)
    tflops = c.flops / ours_ms / 1e9
    nbytes = (x.numel() + w.numel() + y.numel()) * x.element_size()
    return Row(
        layer["name"], direction, algo, ours_ms, theirs_ms, theirs_ms / ours_ms, ours_eager,
        theirs_eager, tflops, 0.0, verdict.err, verdict.ok, gbps=nbytes / ours_ms / 1e6,
        rel_err_vs_float64=verdict.err64, cudnn_err_vs_float64=verdict.cudnn_err64,
    )  # fmt: skip


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def float64_errors(err64: float, cudnn_err64: float) -> str:
    """rtdnn's and cuDNN's errors against the float64 result, as the tables print them (an
    empty string where they were not measured: the two agreed)."""
    if math.isnan(err64):
        return ""
    return f" (vs float64: rtdnn {err64:.1e}, cuDNN {cudnn_err64:.1e})"


def _verdict(r: Row) -> str:
    """The table's "ok" cell: yes, or NO with the error against cuDNN; where the two
    disagreed, each one's error against the float64 result too."""
    cell = "yes" if r.ok else f"NO ({r.rel_err_vs_cudnn:.1e} vs cuDNN)"
    return cell + float64_errors(r.rel_err_vs_float64, r.cudnn_err_vs_float64)


def markdown(rows: list[Row], title: str) -> str:
    eager = any(not math.isnan(r.rtdnn_eager_ms) for r in rows)
    head = (
        "| layer | direction | algo | rtdnn ms | cuDNN ms | ratio | TFLOP/s | % ceiling | "
        "GB/s | % copy |"
    )
    rule = "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
    if eager:
        head += " eager rtdnn ms | eager cuDNN ms | eager ratio |"
        rule += "---:|---:|---:|"
    lines = [f"### {title}", "", head + " ok |", rule + "---|"]
    for r in rows:
        line = (
            f"| {r.layer} | {r.direction} | {r.algo} | {r.rtdnn_ms:.3f} | {r.cudnn_ms:.3f} | "
            f"{r.ratio:.2f} | {r.tflops:.1f} | {r.ceiling_pct:.0f} |"
        )
        # Bandwidth only where it is the bar (compute-bound layers show "-").
        line += f" {r.gbps:.0f} | {r.copy_pct:.0f} |" if r.memory_bound else " - | - |"
        if eager:
            line += (
                f" {r.rtdnn_eager_ms:.3f} | {r.cudnn_eager_ms:.3f} | "
                f"{r.cudnn_eager_ms / r.rtdnn_eager_ms:.2f} |"
            )
        lines.append(line + f" {_verdict(r)} |")
    for d in DIRECTIONS:
        sub = [r for r in rows if r.direction == d]
        if sub:
            line = (
                f"| **geomean** | {d} | | | | **{geomean([r.ratio for r in sub]):.2f}** | | | | |"
            )
            if eager:
                ratio = geomean([r.cudnn_eager_ms / r.rtdnn_eager_ms for r in sub])
                line += f" | | **{ratio:.2f}** |"
            lines.append(line + " |")
    return "\n".join(lines) + "\n"


def run_suite(
    suite: str,
    dtype_name: str,
    directions: list[str],
    batch: int | None = None,
    limit: int | None = None,
    out_dir: str | None = None,
    find: bool = False,
    eager: bool = False,
) -> list[Row]:
    from tqdm import tqdm

    dtype = DTYPES[dtype_name]
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = True
    ceiling = matmul_ceiling(dtype)
    bandwidth = copy_bandwidth()
    ridge = ceiling * 1e3 / bandwidth  # FLOPs per byte where compute and memory take as long
    layers = load_suite(suite)[:limit]
    rows: list[Row] = []
    work = [(layer, d) for d in directions for layer in layers]
    title = (
        f"{suite}, {dtype_name}{' (TF32)' if dtype == torch.float32 else ''}, "
        f"batch {batch or 'as in suite'}, {torch.cuda.get_device_name()}, "
        f"matmul ceiling {ceiling:.0f} TFLOP/s, copy bandwidth {bandwidth:.0f} GB/s"
    )
    progress = tqdm(work, desc=f"{suite} {dtype_name}", unit="layer")
    for layer, d in progress:
        row = run_layer(layer, d, dtype, batch, find, eager)
        row.ceiling_pct = 100 * row.tflops / ceiling
        row.copy_pct = 100 * row.gbps / bandwidth
        row.memory_bound = row.tflops * 1e3 / row.gbps < ridge
        rows.append(row)
        progress.write(
            f"{row.layer:12s} {row.direction:16s} {row.algo:22s} {row.rtdnn_ms:.3f} ms vs "
            f"{row.cudnn_ms:.3f} ms: {row.ratio:.2f}x, {row.gbps:.0f} GB/s "
            f"({row.copy_pct:.0f}% of copy) (eager {row.rtdnn_eager_ms:.3f} vs "
            f"{row.cudnn_eager_ms:.3f})"
        )
        if out_dir:  # rewritten after every layer, so an interrupted run keeps what it did
            _write(out_dir, f"conv_{suite}_{dtype_name}", title, rows)
    print(markdown(rows, title))
    return rows


def _write(out_dir: str, stem: str, title: str, rows: list[Row]) -> None:
    write_results(out_dir, stem, title, rows, markdown(rows, title))


def self_check() -> list[tuple[str, float, bool]]:
    """Every convolution algorithm and direction on tiny shapes against the float64 reference
    (through the interpreter on a machine without a GPU)."""
    from .. import reference as R

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    x = torch.randn(2, 4, 6, 5, device=device)
    w = torch.randn(6, 2, 3, 3, device=device)
    args = dict(stride=(2, 1), padding=1, dilation=1, groups=2, math="fp32")
    ref_args = {k: v for k, v in args.items() if k != "math"}
    y = R.conv_forward(x, w, **ref_args)
    dy = torch.randn(y.shape, device=device)
    results = []
    for direction in DIRECTIONS:
        for algo in ALGORITHMS:
            try:
                if direction == "forward":
                    out = ops.conv_forward(x, w, algo=algo, **args)
                    ref = y
                elif direction == "backward_data":
                    out = ops.conv_backward_data(dy, w, x.shape, algo=algo, **args)
                    ref = R.conv_backward_data(dy, w, x.shape, **ref_args)
                else:
                    out = ops.conv_backward_filter(x, dy, w.shape, algo=algo, **args)
                    ref = R.conv_backward_filter(x, dy, w.shape, **ref_args)
            except NotSupportedError:  # e.g. split-K outside backward-filter
                continue
            err = rel_error(out, ref)
            results.append((f"conv {direction} {algo}", err, err < 1e-5))
    db = ops.conv_backward_bias(dy)
    err = rel_error(db, R.conv_backward_bias(dy))
    results.append(("conv backward_bias", err, err < 1e-5))
    return results
