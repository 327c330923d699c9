"""Memory-bound primitives beside PyTorch eager, on the GPU: pooling, activations, softmax,
LRN, dropout and tensor ops, forward and backward, on large inputs (>= 256 MiB moved).

Every case is run by both sides on the same tensors; rtdnn's result is checked against
PyTorch's; both are timed the same way (core.timing.device_time_ms: CUDA-graph replay, median
of many runs, L2 flushed before each run by reading a larger buffer). Throughput is counted on
minimal bytes: each input the operation needs read once, each output written once, whatever
either implementation actually moves (PyTorch's max-pool backward, for instance, also reads
int64 indices). The ceiling is the measured bandwidth of a large device-to-device copy (bytes
read + bytes written).

    from rtdnn.bench.prims import run_ops
    rows = run_ops(["pooling", "softmax"], "bench-results")      # or ["all"]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import ops as rt
from ..core.timing import copy_bandwidth, device_time_ms
from .output import write_results

OPS = ("pooling", "activation", "softmax", "lrn", "dropout", "tensor")
MiB = 1 << 20
# A dry run of the harness on the CPU (interpreter) sets these: batch sizes divided by SHRINK.
DEVICE = "cuda"
SHRINK = 1


def _n(batch: int) -> int:
    return max(1, batch // SHRINK)


@dataclass
class PrimRow:
    op: str  # family
    case: str
    direction: str  # forward / backward
    dtype: str
    mib: float  # minimal MiB moved
    rtdnn_ms: float
    torch_ms: float
    ratio: float  # torch_ms / rtdnn_ms: above 1 means rtdnn is faster
    rtdnn_gbs: float
    torch_gbs: float
    rtdnn_pct: float  # rtdnn GB/s as a percent of the measured copy bandwidth
    torch_pct: float
    err: float  # max |rtdnn - torch| / max(|torch|, 1)
    ok: bool


@dataclass
class Case:
    op: str
    name: str
    direction: str
    nbytes: int
    ours: Callable
    theirs: Callable
    tol: float = 3e-2  # agreement with PyTorch (both round to bf16)
    check: Callable | None = None  # custom agreement check (ours_out, theirs_out) -> err
    # What rtdnn's result is checked against, where eager's own bf16 result is too rough (it
    # rounds in between): eager on float32 copies of the same inputs. Default: `theirs`.
    reference: Callable | None = None


def _nb(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _cl(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last)


def _randn(*shape, dtype=torch.bfloat16, cl=False) -> torch.Tensor:
    shape = (_n(shape[0]), *shape[1:])
    t = torch.randn(*shape, device=DEVICE, dtype=dtype)
    return _cl(t) if cl else t


def _err(a, b) -> float:
    if isinstance(a, tuple):
        a, b = a[0], b[0]
    a, b = a.float(), b.float()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1.0)).item()


# -- cases -----------------------------------------------------------------------------------


def pooling_cases() -> list[Case]:
    cases = []
    x = _randn(160, 256, 56, 56, cl=True)  # ResNet-like activations, channels-last bf16
    k, s, p = 3, 2, 1
    y = rt.pooling_forward(x, "max", k, stride=s, padding=p)
    dy = torch.randn_like(y)
    _, idx = torch.ops.aten.max_pool2d_with_indices(x, [k, k], [s, s], [p, p])
    name = f"max 3x3/2 x{tuple(x.shape)} NHWC"
    cases.append(Case("pooling", name, "forward", _nb(x, y),
                      lambda: rt.pooling_forward(x, "max", k, stride=s, padding=p),
                      lambda: F.max_pool2d(x, k, s, p)))  # fmt: skip
    cases.append(Case("pooling", name, "backward", _nb(dy, x, x),
                      lambda: rt.pooling_backward(dy, x, y, "max", k, stride=s, padding=p),
                      lambda: torch.ops.aten.max_pool2d_with_indices_backward(
                          dy, x, [k, k], [s, s], [p, p], [1, 1], False, idx)))  # fmt: skip
    name = f"avg 3x3/2 x{tuple(x.shape)} NHWC"
    cases.append(Case("pooling", name, "forward", _nb(x, y),
                      lambda: rt.pooling_forward(x, "avg_include_pad", k, stride=s, padding=p),
                      lambda: F.avg_pool2d(x, k, s, p)))  # fmt: skip
    cases.append(
        Case(
            "pooling",
            name,
            "backward",
            _nb(dy, x),
            lambda: rt.pooling_backward(dy, x, None, "avg_include_pad", k, stride=s, padding=p),
            lambda: torch.ops.aten.avg_pool2d_backward(
                dy, x, [k, k], [s, s], [p, p], False, True, None
            ),
            # float64 on contiguous NCHW copies: eager's channels-last backward, bf16 or
            # float32, is 1.04 (relative norm) from it on this input, rtdnn's 1.7e-3.
            reference=lambda: torch.ops.aten.avg_pool2d_backward(
                dy.double().contiguous(),
                x.double().contiguous(),
                [k, k],
                [s, s],
                [p, p],
                False,
                True,
                None,
            ),
        )
    )
    g = _randn(1280, 2048, 7, 7, cl=True)
    gy = rt.adaptive_avg_pool(g, 1)
    gdy = torch.randn_like(gy)
    name = f"global avg x{tuple(g.shape)} NHWC"
    cases.append(Case("pooling", name, "forward", _nb(g, gy),
                      lambda: rt.adaptive_avg_pool(g, 1),
                      lambda: F.adaptive_avg_pool2d(g, 1)))  # fmt: skip
    cases.append(Case("pooling", name, "backward", _nb(gdy, g),
                      lambda: rt.adaptive_avg_pool_backward(gdy, g.shape),
                      lambda: torch.ops.aten._adaptive_avg_pool2d_backward(gdy, g)))  # fmt: skip
    return cases


_ACT = {
    # mode: (forward, backward(dy, x, y), what the backward reads)
    "relu": (F.relu, lambda dy, x, y: torch.ops.aten.threshold_backward(dy, y, 0), "y"),
    "sigmoid": (torch.sigmoid, lambda dy, x, y: torch.ops.aten.sigmoid_backward(dy, y), "y"),
    "tanh": (torch.tanh, lambda dy, x, y: torch.ops.aten.tanh_backward(dy, y), "y"),
    "elu": (F.elu, lambda dy, x, y: torch.ops.aten.elu_backward(dy, 1.0, 1, 1.0, False, x), "x"),
    "leaky_relu": (F.leaky_relu,
                   lambda dy, x, y: torch.ops.aten.leaky_relu_backward(dy, x, 0.01, False), "x"),
    "clipped_relu": (F.relu6,
                     lambda dy, x, y: torch.ops.aten.hardtanh_backward(dy, x, 0.0, 6.0), "x"),
    "swish": (F.silu, lambda dy, x, y: torch.ops.aten.silu_backward(dy, x), "x"),
    "gelu": (F.gelu, lambda dy, x, y: torch.ops.aten.gelu_backward(dy, x), "x"),
    "gelu_tanh": (lambda t: F.gelu(t, approximate="tanh"),
                  lambda dy, x, y: torch.ops.aten.gelu_backward(dy, x, approximate="tanh"), "x"),
}  # fmt: skip


def activation_cases() -> list[Case]:
    cases = []
    x = _randn(128, 256, 64, 64, cl=True) * 2  # 256 MiB of bf16
    dy = torch.randn_like(x)
    for mode, (fwd, bwd, _) in _ACT.items():
        y = fwd(x)
        name = f"{mode} x{tuple(x.shape)}"
        cases.append(Case("activation", name, "forward", _nb(x, y),
                          lambda mode=mode: rt.activation_forward(x, mode),
                          lambda fwd=fwd: fwd(x)))  # fmt: skip
        cases.append(Case("activation", name, "backward", _nb(dy, x, x),
                          lambda mode=mode, y=y: rt.activation_backward(dy, x, y, mode),
                          lambda bwd=bwd, y=y: bwd(dy, x, y)))  # fmt: skip
    return cases


def softmax_cases() -> list[Case]:
    cases = []
    for shape, mode in (((32768, 4096), "channel"), ((128, 1 << 20), "channel"),
                        ((64, 32, 256, 256), "channel")):  # fmt: skip
        x = _randn(*shape) * 2
        dim = 1
        for algo in ("accurate", "log"):
            tf = torch.log_softmax if algo == "log" else torch.softmax
            tb = (torch._log_softmax_backward_data if algo == "log"
                  else torch._softmax_backward_data)  # fmt: skip
            y = tf(x, dim)
            dy = torch.randn_like(y)
            name = f"{algo} {mode} x{tuple(x.shape)}"
            cases.append(Case("softmax", name, "forward", _nb(x, y),
                              lambda algo=algo, x=x, mode=mode: rt.softmax_forward(
                                  x, algo=algo, mode=mode),
                              lambda tf=tf, x=x, dim=dim: tf(x, dim)))  # fmt: skip
            cases.append(Case("softmax", name, "backward", _nb(y, dy, dy),
                              lambda algo=algo, y=y, dy=dy, mode=mode: rt.softmax_backward(
                                  y, dy, algo=algo, mode=mode),
                              lambda tb=tb, y=y, dy=dy, d=dim: tb(dy, y, d, y.dtype)))  # fmt: skip
    return cases


_LRN = dict(lrn_alpha=1e-4, lrn_beta=0.75, lrn_k=2.0)


def lrn_cases() -> list[Case]:
    cases = []
    for cl in (True, False):
        x = _randn(512, 96, 55, 55, cl=cl)
        xr = x.detach().requires_grad_()
        yr = F.local_response_norm(xr, 5, 1e-4, 0.75, 2.0)
        dy = torch.randn_like(yr)
        name = f"size 5 x{tuple(x.shape)} {'NHWC' if cl else 'NCHW'}"
        cases.append(Case("lrn", name, "forward", _nb(x, x),
                          lambda x=x: rt.lrn_forward(x, 5, **_LRN),
                          lambda x=x: F.local_response_norm(x, 5, 1e-4, 0.75, 2.0)))  # fmt: skip
        cases.append(Case("lrn", name, "backward", _nb(dy, x, x),
                          lambda x=x, dy=dy: rt.lrn_backward(dy, x, None, 5, **_LRN),
                          lambda xr=xr, yr=yr, dy=dy: torch.autograd.grad(
                              yr, xr, dy, retain_graph=True)[0]))  # fmt: skip
    return cases


def _dropout_check(p):
    def check(ours, theirs):
        # Different generators: compare the keep rate and the kept values' scaling instead.
        keep = (ours != 0).float().mean().item()
        return abs(keep - (1 - p))

    return check


def dropout_cases() -> list[Case]:
    x = _randn(128, 256, 64, 64, cl=True) + 4.0  # nonzero, so zeros mark dropped elements
    p = 0.1
    dy = torch.randn_like(x)
    mask = torch.rand_like(x, dtype=torch.float32) >= p
    name = f"p=0.1 x{tuple(x.shape)}"
    return [
        Case("dropout", name, "forward", _nb(x, x),
             lambda: rt.dropout_forward(x, p, 1234),
             lambda: torch.ops.aten.native_dropout(x, p, True)[0],
             check=_dropout_check(p), tol=0.01),
        Case("dropout", name, "backward", _nb(dy, dy),
             lambda: rt.dropout_backward(dy, p, 1234),
             lambda: torch.ops.aten.native_dropout_backward(dy, mask, 1 / (1 - p)),
             check=lambda o, t: 0.0),
    ]  # fmt: skip


def tensor_cases() -> list[Case]:
    cases = []
    x = _randn(128, 256, 64, 64, cl=True)
    b = _randn(1, 256, 1, 1)
    y2 = torch.randn_like(x)
    shp = tuple(x.shape)
    cases.append(Case("tensor", f"op_tensor add bias x{shp}", "forward", _nb(x, x),
                      lambda: rt.op_tensor(x, b, "add"), lambda: x + b))  # fmt: skip
    cases.append(Case("tensor", f"op_tensor mul x{shp}", "forward", _nb(x, y2, x),
                      lambda: rt.op_tensor(x, y2, "mul"), lambda: x * y2))  # fmt: skip
    c = torch.randn_like(x)
    cases.append(Case("tensor", f"add_tensor c += bias x{shp}", "forward", _nb(c, c),
                      lambda: rt.add_tensor(b, c), lambda: c.add_(b),
                      check=lambda o, t: 0.0))  # fmt: skip
    cases.append(Case("tensor", f"scale_tensor x{shp}", "forward", _nb(c, c),
                      lambda: rt.scale_tensor(c, 1.0), lambda: c.mul_(1.0)))  # fmt: skip
    cases.append(Case("tensor", f"set_tensor x{shp}", "forward", _nb(c),
                      lambda: rt.set_tensor(c, 0.5), lambda: c.fill_(0.5)))  # fmt: skip
    xn = _randn(128, 256, 64, 64)
    cases.append(Case("tensor", f"transform NCHW->NHWC x{shp}", "forward", _nb(xn, xn),
                      lambda: rt.transform_tensor(xn, memory_format=torch.channels_last),
                      lambda: xn.contiguous(memory_format=torch.channels_last)))  # fmt: skip
    xf = _randn(64, 256, 64, 64, dtype=torch.float32)
    cases.append(Case("tensor", f"transform fp32->bf16 x{tuple(xf.shape)}", "forward",
                      _nb(xf) + _nb(xf) // 2,
                      lambda: rt.transform_tensor(xf, dtype=torch.bfloat16),
                      lambda: xf.to(torch.bfloat16)))  # fmt: skip
    cases.append(Case("tensor", f"reduce add over N,H,W (NHWC) x{shp}", "forward", _nb(x),
                      lambda: rt.reduce_tensor(x, "add", (0, 2, 3)),
                      lambda: x.sum((0, 2, 3), keepdim=True), tol=5e-2))  # fmt: skip
    cases.append(Case("tensor", f"reduce avg over H,W (NCHW) x{shp}", "forward", _nb(xn),
                      lambda: rt.reduce_tensor(xn, "avg", (2, 3)),
                      lambda: xn.mean((2, 3), keepdim=True)))  # fmt: skip
    r = _randn(32768, 4096)
    cases.append(Case("tensor", "reduce max+indices rows x(32768, 4096)", "forward", _nb(r),
                      lambda: rt.reduce_tensor(r, "max", 1, indices=True),
                      lambda: torch.max(r, 1, keepdim=True)))  # fmt: skip
    cases.append(Case("tensor", "reduce norm2 rows x(32768, 4096)", "forward", _nb(r),
                      lambda: rt.reduce_tensor(r, "norm2", 1),
                      lambda: torch.linalg.vector_norm(r, dim=1, keepdim=True)))  # fmt: skip
    return cases


CASES = {
    "pooling": pooling_cases,
    "activation": activation_cases,
    "softmax": softmax_cases,
    "lrn": lrn_cases,
    "dropout": dropout_cases,
    "tensor": tensor_cases,
}


def run_case(case: Case, copy_gbs: float, dtype: str = "bf16") -> PrimRow:
    ours_out = case.ours()
    theirs_out = case.reference() if case.reference else case.theirs()
    err = case.check(ours_out, theirs_out) if case.check else _err(ours_out, theirs_out)
    del ours_out, theirs_out
    ours_ms = device_time_ms(case.ours)
    theirs_ms = device_time_ms(case.theirs)
    ours_gbs = case.nbytes / ours_ms / 1e6
    theirs_gbs = case.nbytes / theirs_ms / 1e6
    return PrimRow(
        case.op, case.name, case.direction, dtype, case.nbytes / MiB, ours_ms, theirs_ms,
        theirs_ms / ours_ms, ours_gbs, theirs_gbs, 100 * ours_gbs / copy_gbs,
        100 * theirs_gbs / copy_gbs, err, err <= case.tol,
    )  # fmt: skip


def markdown(rows: list[PrimRow], title: str) -> str:
    lines = [
        f"### {title}",
        "",
        "| op | case | dir | MiB | rtdnn ms | torch ms | ratio | rtdnn GB/s | torch GB/s "
        "| rtdnn % copy | torch % copy | ok |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.op} | {r.case} | {r.direction} | {r.mib:.0f} | {r.rtdnn_ms:.3f} | "
            f"{r.torch_ms:.3f} | {r.ratio:.2f} | {r.rtdnn_gbs:.0f} | {r.torch_gbs:.0f} | "
            f"{r.rtdnn_pct:.0f} | {r.torch_pct:.0f} | "
            f"{'yes' if r.ok else f'NO ({r.err:.1e})'} |"
        )
    return "\n".join(lines) + "\n"


def run_ops(ops: list[str], out_dir: str | None = None) -> list[PrimRow]:
    """Benchmark the given families ("pooling", "activation", "softmax", "lrn", "dropout",
    "tensor", or "all") on the current GPU; print a markdown table; with `out_dir`, write
    prims_<families>.json and .md there. Returns the rows."""
    if not torch.cuda.is_available():
        raise RuntimeError("rtdnn.bench.prims needs a CUDA GPU")
    families = list(OPS) if (not ops or "all" in ops) else list(ops)
    unknown = [f for f in families if f not in CASES]
    if unknown:
        raise ValueError(f"unknown op families {unknown}: choose from {OPS} or 'all'")
    torch.manual_seed(0)
    copy_gbs = copy_bandwidth()
    rows: list[PrimRow] = []
    with torch.cuda.stream(torch.cuda.Stream()):  # graphs are captured on it (core.timing)
        for fam in families:
            cases = CASES[fam]()
            for case in cases:
                row = run_case(case, copy_gbs)
                rows.append(row)
                print(
                    f"{row.op:10s} {row.direction:8s} {row.case:45s} rtdnn "
                    f"{row.rtdnn_pct:5.1f}% torch {row.torch_pct:5.1f}% ratio {row.ratio:5.2f} "
                    f"{'ok' if row.ok else 'NO'}",
                    flush=True,
                )
            del cases
            torch.cuda.empty_cache()
    torch.cuda.synchronize()
    title = (
        f"Memory-bound primitives, bf16 unless noted, {torch.cuda.get_device_name()}, "
        f"measured copy bandwidth {copy_gbs:.0f} GB/s"
    )
    md = markdown(rows, title)
    print(md)
    if out_dir:
        stem = f"prims_{'_'.join(families)}"
        write_results(out_dir, stem, title, rows, md, copy_gbs=copy_gbs)
    return rows
