"""Normalization benchmark: rtdnn beside PyTorch eager, in one process on one GPU.

Normalization is memory-bound, so throughput is reported in GB/s against the *minimal* bytes
(every operand read once, every result written once) and as a percent of the device copy
bandwidth measured at the start (a large device-to-device copy, bytes read + written).

Two-pass algorithms read some operands twice: batch norm's training forward reads x once for
the statistics and once to normalize, and every split backward (batch norm) reads x and dy
once for the per-channel sums and once for dx. For those rows the table also gives the percent
of copy bandwidth on the bytes the algorithm must move ("counted"); the column says which
operands are read twice. Layer and RMS norm rows that fit in registers move the minimal bytes.

Both sides are timed the same way (core.timing.device_time_ms: each call captured in a CUDA
graph and the graph replayed, median of many runs, L2 flushed before each run by reading a
larger buffer), so the host's cost of issuing launches is left out of both; the whole
benchmark runs on a side stream, so that eager's autograd backward is captured on the stream
its forward ran on. rtdnn's result is checked against eager's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import ops
from ..core.timing import copy_bandwidth, device_time_ms
from .output import write_results

#: ResNet-50's batch-norm layers (channels, spatial size), channels-last.
RESNET50_BN = [(64, 112), (256, 56), (512, 28), (1024, 14), (2048, 7)]
#: Transformer rows: (rows, hidden size).
TRANSFORMER_ROWS = [(32768, 768), (32768, 1024), (32768, 4096), (32768, 8192)]
# rtdnn and eager round differently: these bound the rel. error of a correct result.
AGREEMENT = {torch.bfloat16: 2e-2, torch.float16: 3e-3, torch.float32: 1e-4}


@dataclass
class Row:
    op: str
    shape: str
    rtdnn_ms: float
    eager_ms: float
    ratio: float  # eager time / rtdnn time: above 1 means rtdnn is faster
    gbps: float  # minimal bytes / rtdnn time
    copy_pct: float  # gbps as a percent of the measured copy bandwidth
    counted_pct: float  # bytes the algorithm moves (two-pass reads included) / time / copy
    reread: str  # operands read twice by rtdnn's algorithm ("" if none)
    rel_err_vs_eager: float
    ok: bool


def _rel(a, b) -> float:
    if isinstance(a, (tuple, list)):
        return max(_rel(x, y) for x, y in zip(a, b, strict=True))
    a64, b64 = a.detach().double().cpu(), b.detach().double().cpu()
    if not torch.isfinite(a64).all():
        return float("inf")
    return float((a64 - b64).norm() / b64.norm().clamp_min(1e-30))


def _channels_last(t: torch.Tensor) -> torch.Tensor:
    return t.movedim(1, -1).contiguous().movedim(-1, 1)


def _row(op, shape, ours, theirs, check, min_tensors, counted_tensors, reread, elem_bytes,
         numel, copy_gbps, dtype) -> Row:  # fmt: skip
    err = _rel(*check())
    ours_ms, theirs_ms = device_time_ms(ours), device_time_ms(theirs)
    gbps = min_tensors * numel * elem_bytes / ours_ms / 1e6
    counted = counted_tensors * numel * elem_bytes / ours_ms / 1e6
    return Row(
        op, shape, ours_ms, theirs_ms, theirs_ms / ours_ms, gbps, 100 * gbps / copy_gbps,
        100 * counted / copy_gbps, reread, err, err < AGREEMENT[dtype],
    )  # fmt: skip


def batch_norm_rows(n: int, c: int, hw: int, dtype: torch.dtype, copy_gbps: float) -> list[Row]:
    shape = (n, c, hw, hw)
    name = f"{n}x{c}x{hw}x{hw}"
    x = _channels_last(torch.randn(shape, device="cuda", dtype=dtype))
    z = _channels_last(torch.randn(shape, device="cuda", dtype=dtype))
    dy = _channels_last(torch.randn(shape, device="cuda", dtype=dtype))
    w = torch.rand(c, device="cuda") + 0.5
    b = torch.randn(c, device="cuda")
    rm, rv = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
    rm2, rv2 = rm.clone(), rv.clone()
    numel, eb = x.numel(), x.element_size()
    rows = []

    def ours_train():
        return ops.batch_norm_forward_training(x, w, b, running_mean=rm, running_var=rv)[0]

    def eager_train():
        return F.batch_norm(x, rm2, rv2, w, b, training=True)

    rows.append(_row("bn train fwd", name, ours_train, eager_train,
                     lambda: (ours_train(), eager_train()), 2, 3, "x", eb, numel, copy_gbps,
                     dtype))  # fmt: skip

    def ours_infer():
        return ops.batch_norm_forward_inference(x, w, b, rm, rv)

    def eager_infer():
        return F.batch_norm(x, rm, rv, w, b, training=False)

    rows.append(_row("bn infer fwd", name, ours_infer, eager_infer,
                     lambda: (ours_infer(), eager_infer()), 2, 2, "", eb, numel, copy_gbps,
                     dtype))  # fmt: skip

    _, mean, invstd = ops.batch_norm_forward_training(x, w, b)
    xe = x.detach().requires_grad_()
    we, be = w.detach().requires_grad_(), b.detach().requires_grad_()
    ye = F.batch_norm(xe, None, None, we, be, training=True)

    def ours_bwd():
        return ops.batch_norm_backward(dy, x, mean, invstd, w, b)[:3]

    def eager_bwd():
        return torch.autograd.grad(ye, (xe, we, be), dy, retain_graph=True)

    rows.append(_row("bn bwd", name, ours_bwd, eager_bwd, lambda: (ours_bwd(), eager_bwd()),
                     3, 5, "x, dy", eb, numel, copy_gbps, dtype))  # fmt: skip

    def ours_add_relu():
        return ops.batch_norm_forward_training(x, w, b, z=z, activation="relu")[0]

    def eager_add_relu():
        return torch.relu(F.batch_norm(x, None, None, w, b, training=True) + z)

    rows.append(_row("bn+add+relu train fwd", name, ours_add_relu, eager_add_relu,
                     lambda: (ours_add_relu(), eager_add_relu()), 3, 4, "x", eb, numel,
                     copy_gbps, dtype))  # fmt: skip

    _, mean, invstd = ops.batch_norm_forward_training(x, w, b, z=z, activation="relu")
    ze = z.detach().requires_grad_()
    ye = torch.relu(F.batch_norm(xe, None, None, we, be, training=True) + ze)

    def ours_add_relu_bwd():
        dx, dw, db, dz = ops.batch_norm_backward(dy, x, mean, invstd, w, b, z=z,
                                                 activation="relu")  # fmt: skip
        return dx, dw, db, dz

    def eager_add_relu_bwd():
        return torch.autograd.grad(ye, (xe, we, be, ze), dy, retain_graph=True)

    def float32_add_relu_bwd():
        # Checked against eager in float32 from the same inputs: eager in bf16 rounds the
        # normalized value before adding z, which moves the ReLU mask and costs ~5e-2.
        xf, zf = x.float().requires_grad_(), z.float().requires_grad_()
        wf, bf = w.float().requires_grad_(), b.float().requires_grad_()
        yf = torch.relu(F.batch_norm(xf, None, None, wf, bf, training=True) + zf)
        return torch.autograd.grad(yf, (xf, wf, bf, zf), dy.float())

    # Minimal: read x, dy, z; write dx, dz. rtdnn: pass 1 reads x, dy, z and writes dz;
    # pass 2 reads x and dz and writes dx.
    rows.append(_row("bn+add+relu bwd", name, ours_add_relu_bwd, eager_add_relu_bwd,
                     lambda: (ours_add_relu_bwd(), float32_add_relu_bwd()), 5, 7, "x, dz", eb,
                     numel, copy_gbps, dtype))  # fmt: skip
    return rows


def row_norm_rows(rows_n: int, d: int, dtype: torch.dtype, copy_gbps: float) -> list[Row]:
    name = f"{rows_n}x{d}"
    x = torch.randn(rows_n, d, device="cuda", dtype=dtype)
    dy = torch.randn_like(x)
    w = torch.rand(d, device="cuda", dtype=dtype) + 0.5
    b = torch.randn(d, device="cuda", dtype=dtype)
    numel, eb = x.numel(), x.element_size()
    out = []

    def ours_ln():
        return ops.layer_norm_forward(x, d, w, b)[0]

    def eager_ln():
        return F.layer_norm(x, (d,), w, b)

    out.append(_row("layer norm fwd", name, ours_ln, eager_ln, lambda: (ours_ln(), eager_ln()),
                    2, 2, "", eb, numel, copy_gbps, dtype))  # fmt: skip

    _, mean, rstd = ops.layer_norm_forward(x, d, w, b)
    xe, we, be = (t.detach().requires_grad_() for t in (x, w, b))
    ye = F.layer_norm(xe, (d,), we, be)

    def ours_ln_bwd():
        return ops.layer_norm_backward(dy, x, d, mean, rstd, w)

    def eager_ln_bwd():
        return torch.autograd.grad(ye, (xe, we, be), dy, retain_graph=True)

    out.append(_row("layer norm bwd", name, ours_ln_bwd, eager_ln_bwd,
                    lambda: (ours_ln_bwd(), eager_ln_bwd()), 3, 3, "", eb, numel, copy_gbps,
                    dtype))  # fmt: skip

    eps = 1e-6

    def ours_rms():
        return ops.rms_norm_forward(x, d, w, eps=eps)[0]

    def eager_rms():
        return F.rms_norm(x, (d,), w, eps)

    out.append(_row("rms norm fwd", name, ours_rms, eager_rms, lambda: (ours_rms(), eager_rms()),
                    2, 2, "", eb, numel, copy_gbps, dtype))  # fmt: skip

    _, rstd = ops.rms_norm_forward(x, d, w, eps=eps)
    ye = F.rms_norm(xe, (d,), we, eps)

    def ours_rms_bwd():
        return ops.rms_norm_backward(dy, x, d, rstd, w)

    def eager_rms_bwd():
        return torch.autograd.grad(ye, (xe, we), dy, retain_graph=True)

    out.append(_row("rms norm bwd", name, ours_rms_bwd, eager_rms_bwd,
                    lambda: (ours_rms_bwd(), eager_rms_bwd()), 3, 3, "", eb, numel, copy_gbps,
                    dtype))  # fmt: skip
    return out


def markdown(rows: list[Row], title: str) -> str:
    lines = [
        f"### {title}",
        "",
        "| op | shape | rtdnn ms | eager ms | eager/rtdnn | GB/s (min bytes) | % copy "
        "| % copy (counted) | read twice | ok |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        ok = "yes" if r.ok else f"NO ({r.rel_err_vs_eager:.1e})"
        lines.append(
            f"| {r.op} | {r.shape} | {r.rtdnn_ms:.3f} | {r.eager_ms:.3f} | {r.ratio:.2f} | "
            f"{r.gbps:.0f} | {r.copy_pct:.0f} | {r.counted_pct:.0f} | {r.reread or '-'} | {ok} |"
        )
    return "\n".join(lines) + "\n"


def run_norm(
    out_dir: str | None = None,
    dtype: torch.dtype = torch.bfloat16,
    batches: tuple[int, ...] = (64, 128),
) -> list[Row]:
    """Time every normalization beside PyTorch eager on the GPU; print a markdown table and,
    with `out_dir`, write norm.json and norm.md there. Returns the rows."""
    if not torch.cuda.is_available():
        raise RuntimeError("run_norm needs a CUDA GPU")
    torch.backends.cudnn.benchmark = True
    rows: list[Row] = []
    copy_gbps = copy_bandwidth()
    with torch.cuda.stream(torch.cuda.Stream()):
        for n in batches:
            for c, hw in RESNET50_BN:
                rows += batch_norm_rows(n, c, hw, dtype, copy_gbps)
                torch.cuda.empty_cache()
        for rows_n, d in TRANSFORMER_ROWS:
            rows += row_norm_rows(rows_n, d, dtype, copy_gbps)
            torch.cuda.empty_cache()
    torch.cuda.synchronize()
    dname = str(dtype).replace("torch.", "")
    title = (
        f"Normalization, {dname}, {torch.cuda.get_device_name()}, "
        f"copy bandwidth {copy_gbps:.0f} GB/s (read + write)"
    )
    md = markdown(rows, title)
    print(md)
    if out_dir:
        write_results(out_dir, "norm", title, rows, md, copy_gbps=copy_gbps)
    return rows


def self_check() -> list[tuple[str, float, bool]]:
    """Every normalization family, forward and backward, on tiny shapes against the float64
    reference (through the interpreter on a machine without a GPU)."""
    from .. import reference as R

    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(shape, generator=g).to(device)

    x, dy, z = rand(2, 3, 4, 5), rand(2, 3, 4, 5), rand(2, 3, 4, 5)
    w, b, w2 = rand(3), rand(3), rand(4, 5)
    bn = ops.batch_norm_forward_training(x, w, b, z=z, activation="relu")
    ln = ops.layer_norm_forward(x, (4, 5), w2)
    rms = ops.rms_norm_forward(x, 5, w2[0])
    gn = ops.group_norm_forward(x, 3, w, b)
    cases = [
        ("batch_norm forward_training", bn,
         R.batch_norm_forward_training(x, w, b, z=z, activation="relu")[:3]),
        ("batch_norm backward", ops.batch_norm_backward(dy, x, *bn[1:], w, b, z=z,
                                                        activation="relu"),
         R.batch_norm_backward(dy, x, *bn[1:], w, b, z=z, activation="relu")),
        ("batch_norm forward_inference", ops.batch_norm_forward_inference(x, w, b, b, w.abs()),
         R.batch_norm_forward_inference(x, w, b, b, w.abs())),
        ("layer_norm forward", ln, R.layer_norm_forward(x, (4, 5), w2)),
        ("layer_norm backward", ops.layer_norm_backward(dy, x, (4, 5), *ln[1:], w2),
         R.layer_norm_backward(dy, x, (4, 5), *ln[1:], w2)),
        ("rms_norm forward", rms, R.rms_norm_forward(x, 5, w2[0])),
        ("rms_norm backward", ops.rms_norm_backward(dy, x, 5, rms[1], w2[0]),
         R.rms_norm_backward(dy, x, 5, rms[1], w2[0])),
        ("group_norm forward", gn, R.group_norm_forward(x, 3, w, b)),
        ("group_norm backward", ops.group_norm_backward(dy, x, 3, *gn[1:], w),
         R.group_norm_backward(dy, x, 3, *gn[1:], w)),
    ]  # fmt: skip
    results = []
    for name, got, want in cases:
        err = _rel(got, want)
        results.append((f"norm {name}", err, err < 1e-4))
    return results
