"""Where the memory-bound kernels below the bandwidth bar spend their time, and how their
launch choices move it: per-kernel GPU time (torch.profiler) of the slow rows of
BENCHMARKS.md, split counts of the reductions, programs per slot of the row-norm backward.
    PYTHONPATH=src python benchmarks/probes/bandwidth_probe.py OUT_DIR [SECTION ...]
SECTION: reductions, rows, breakdowns (default: all).
"""

import dataclasses
import json
import os
import sys
import warnings

import torch
from host_timing import kernel_times

from rtdnn import ops
from rtdnn.algos import norm as engine
from rtdnn.algos.geometry import parallel_slots
from rtdnn.core.timing import copy_bandwidth, device_time_ms
from rtdnn.kernels import reduction as red

out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
results = []


def record(**row):
    results.append(row)
    print(json.dumps(row), flush=True)


def bench(fn) -> float:
    return device_time_ms(fn, graph=False)


copy = copy_bandwidth()
record(what="copy GB/s", value=round(copy))
slots = parallel_slots("cuda")


def pct(nbytes, ms):
    return round(100 * nbytes / ms / 1e6 / copy, 1)


def reductions() -> None:
    """Split counts of the reduce kernel (the plan's `slots`), on the two slow rows."""
    x = torch.randn(128, 256, 64, 64, device="cuda", dtype=torch.bfloat16).to(
        memory_format=torch.channels_last
    )
    rows = torch.randn(32768, 4096, device="cuda", dtype=torch.bfloat16)
    torch_calls = {"add": lambda: x.sum((0, 2, 3)), "max": lambda: rows.max(1)}
    for name, t, op, dims, idx in (
        ("sum NHWC over N,H,W", x, "add", (0, 2, 3), False),
        ("max+indices rows", rows, "max", (1,), True),
        ("max rows", rows, "max", (1,), False),
        ("norm2 rows", rows, "norm2", (1,), False),
    ):
        ref = torch.amax(t.float(), dim=dims, keepdim=True) if op == "max" else None
        shape = [1 if d in dims else s for d, s in enumerate(t.shape)]
        for mult in (1, 2, 4, 8, 16):
            out = torch.empty(shape, device="cuda", dtype=t.dtype)
            plan = red.plan_reduce(t.shape, t.stride(), out.stride(), dims, slots=mult * slots,
                                   elem_bytes=2)  # fmt: skip
            ix = torch.empty(out.shape, dtype=torch.int64, device="cuda") if idx else None

            def run(plan=plan, out=out, ix=ix, t=t, op=op):
                red.launch_reduce(t, out, ix, plan, op, 1.0, 0.0)

            run()
            if ref is not None:
                assert torch.equal(out.float(), ref), name
            ms = bench(run)
            record(what="reduce", case=name, slots_mult=mult, splits=plan.splits,
                   per_split=plan.geo.work_per_split, ms=round(ms, 4),
                   pct=pct(t.numel() * 2, ms))  # fmt: skip
        record(what="reduce kernels", case=name,
               kernels=kernel_times(lambda t=t, op=op, dims=dims, idx=idx: ops.reduce_tensor(
                   t, op, dims, indices=idx)))  # fmt: skip
        if op in torch_calls and (op != "max" or idx):
            record(what="torch", case=name, ms=round(bench(torch_calls[op]), 4))


def row_backward(d: int) -> None:
    """Programs per slot of the row-norm backward, and where its time goes."""
    default_policy = engine.GPU_POLICY
    xr = torch.randn(32768, d, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(xr)
    w = torch.randn(d, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(d, device="cuda", dtype=torch.bfloat16)
    _, mean, rstd = ops.layer_norm_forward(xr, d, w, b)
    _, rms_rstd = ops.rms_norm_forward(xr, d, w)
    moved = 3 * xr.numel() * 2
    calls = {
        "layer norm bwd": lambda: ops.layer_norm_backward(dy, xr, d, mean, rstd, w),
        "rms norm bwd": lambda: ops.rms_norm_backward(dy, xr, d, rms_rstd, w),
    }
    # Does a call synchronize with the device (an allocation, a host read)? Such a call's time
    # includes the host's.
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for fn in calls.values():
            fn()
    torch.cuda.set_sync_debug_mode(0)
    record(what="row bwd syncs", d=d, warnings=[str(w.message)[:160] for w in caught])
    for op, fn in calls.items():
        ms = bench(fn)
        record(what="row bwd default", op=op, d=d, ms=round(ms, 4), pct=pct(moved, ms),
               kernels=kernel_times(fn))  # fmt: skip
    if d > 1024:
        return
    for per_slot in (1, 2, 3, 4, 6):
        engine.GPU_POLICY = dataclasses.replace(default_policy, row_programs_per_slot=per_slot)
        engine.clear_plans()
        for op, fn in calls.items():
            ms = bench(fn)
            record(what="row bwd", op=op, d=d, programs_per_slot=per_slot, ms=round(ms, 4),
                   pct=pct(moved, ms))  # fmt: skip
    engine.GPU_POLICY = default_policy
    engine.clear_plans()


def breakdowns() -> None:
    """Per-kernel time of the other slow rows."""
    xs = torch.randn(128, 1 << 20, device="cuda", dtype=torch.bfloat16)
    ys = ops.softmax_forward(xs)
    dys = torch.randn_like(ys)
    record(what="kernels", case="softmax accurate fwd 128x2^20",
           kernels=kernel_times(lambda: ops.softmax_forward(xs)))  # fmt: skip
    record(what="kernels", case="softmax accurate bwd 128x2^20",
           kernels=kernel_times(lambda: ops.softmax_backward(ys, dys)))  # fmt: skip
    xp = torch.randn(160, 256, 56, 56, device="cuda", dtype=torch.bfloat16).to(
        memory_format=torch.channels_last
    )
    yp = ops.pooling_forward(xp, "max", 3, stride=2, padding=1)
    dyp = torch.randn_like(yp)
    record(what="kernels", case="max pool bwd 3x3/2 160x256x56x56 NHWC",
           kernels=kernel_times(
               lambda: ops.pooling_backward(dyp, xp, yp, "max", 3, stride=2, padding=1)
           ))  # fmt: skip
    lrn = dict(lrn_alpha=1e-4, lrn_beta=0.75, lrn_k=2.0)
    for cl in (True, False):
        xl = torch.randn(512, 96, 55, 55, device="cuda", dtype=torch.bfloat16)
        if cl:
            xl = xl.to(memory_format=torch.channels_last)
        dyl = torch.randn_like(xl)
        tag = "NHWC" if cl else "NCHW"
        record(what="kernels", case=f"lrn fwd {tag}",
               kernels=kernel_times(lambda xl=xl: ops.lrn_forward(xl, 5, **lrn)))  # fmt: skip
        record(what="kernels", case=f"lrn bwd {tag}",
               kernels=kernel_times(
                   lambda xl=xl, dyl=dyl: ops.lrn_backward(dyl, xl, None, 5, **lrn)))  # fmt: skip
    for shape in ((64, 512, 28, 28), (64, 256, 56, 56), (128, 1024, 14, 14)):
        xb = torch.randn(*shape, device="cuda", dtype=torch.bfloat16).to(
            memory_format=torch.channels_last
        )
        c = shape[1]
        wb, bb = torch.randn(c, device="cuda"), torch.randn(c, device="cuda")
        rm, rv = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
        record(what="kernels", case=f"bn train fwd {shape}",
               kernels=kernel_times(lambda xb=xb, wb=wb, bb=bb, rm=rm, rv=rv:
                                    ops.batch_norm_forward_training(
                                        xb, wb, bb, running_mean=rm, running_var=rv)))  # fmt: skip


sections = sys.argv[2:] or ["reductions", "rows", "breakdowns"]
if "reductions" in sections:
    reductions()
if "rows" in sections:
    for d in (768, 1024, 4096, 8192):
        row_backward(d)
if "breakdowns" in sections:
    breakdowns()
with open(os.path.join(out_dir, "bandwidth_probe.json"), "w") as f:
    json.dump(results, f, indent=1)
