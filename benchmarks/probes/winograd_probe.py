"""WINOGRAD_NONFUSED on the GPU: its error against the float64 reference per dtype, tile size and
direction (the table in algos/winograd.py's docstring), and its time beside IMPLICIT_GEMM and
cuDNN (through torch) on the 3x3 stride-1 layers of ResNet-50.

    PYTHONPATH=src python3 benchmarks/probes/winograd_probe.py [errors] [times[:fp32,bf16]]
        [stages[:SUITE]]

stages: strict float32 on a suite's 3x3 stride-1 layers (resnet50 by default) at its batch
size, beside cuDNN in benchmark mode (see `stages`).

Each tile size is forced by restricting the algorithm's candidates (OUT_TILES) to it.
"""

from __future__ import annotations

import sys

import torch

import rtdnn
import rtdnn.ops.conv as conv_ops
from rtdnn import reference as R
from rtdnn.algos import ALGORITHMS, winograd
from rtdnn.algos import tiles as tile_choice
from rtdnn.core.timing import device_time_ms

ALGO = "WINOGRAD_NONFUSED"
FUSED = "WINOGRAD"
CASES = {
    "fp32": (torch.float32, "fp32"),
    "tf32": (torch.float32, "tf32"),
    "fp16": (torch.float16, None),
    "bf16": (torch.bfloat16, None),
}
DIRECTIONS = ("forward", "backward_data", "backward_filter")
#: ResNet-50's 3x3 stride-1 layers: (batch, channels, size).
LAYERS = [(32, 64, 56), (32, 128, 28), (32, 256, 14), (32, 512, 7)]


FORMATS = {"fp32": "fp32", "tf32": "tf32", "fp16": "float16", "bf16": "bfloat16"}


def force_tile(case: str, m: int) -> None:
    winograd.OUT_TILES[FORMATS[case]] = (m,)
    ALGORITHMS[ALGO]._runners.clear()
    ALGORITHMS[FUSED]._runners.clear()
    conv_ops._prepared.clear()
    tile_choice._chosen.clear()


def channels_last(t: torch.Tensor) -> torch.Tensor:
    return t.movedim(1, -1).contiguous().movedim(-1, 1)


def data(dtype, n, c, k, size):
    x = channels_last(torch.randn(n, c, size, size, device="cuda").to(dtype))
    w = channels_last((torch.randn(k, c, 3, 3, device="cuda") / (9 * c) ** 0.5).to(dtype))
    dy = channels_last(torch.randn(n, k, size, size, device="cuda").to(dtype))
    return x, w, dy


def call(direction, x, w, dy, algo, math):
    args = dict(padding=1, algo=algo, math=math)
    if direction == "forward":
        return lambda: rtdnn.conv_forward(x, w, **args)
    if direction == "backward_data":
        return lambda: rtdnn.conv_backward_data(dy, w, x.shape, **args)
    return lambda: rtdnn.conv_backward_filter(x, dy, w.shape, **args)


def reference(direction, x, w, dy):
    if direction == "forward":
        return R.conv_forward(x, w, padding=1)
    if direction == "backward_data":
        return R.conv_backward_data(dy, w, x.shape, padding=1)
    return R.conv_backward_filter(x, dy, w.shape, padding=1)


def errors() -> None:
    print("relative error vs float64, N=8 C=K=64 28x28 pad 1 (fwd / bwd-data / bwd-filter)")
    heads = ["NONFUSED F(2x2)", "NONFUSED F(4x4)", "WINOGRAD F(2x2)", "WINOGRAD F(4x4)", "IG"]
    print(f"{'case':6} " + " ".join(f"{h:>27}" for h in heads))
    defaults = dict(winograd.OUT_TILES)
    for case, (dtype, math) in CASES.items():
        torch.manual_seed(0)
        x, w, dy = data(dtype, 8, 64, 64, 28)
        refs = [reference(d, x, w, dy) for d in DIRECTIONS]
        cols = []
        for algo, m in ((ALGO, 2), (ALGO, 4), (FUSED, 2), (FUSED, 4), ("IMPLICIT_GEMM", None)):
            if m is not None:
                force_tile(case, m)
            errs = [
                R.rel_error(call(d, x, w, dy, algo, math)(), ref)
                for d, ref in zip(DIRECTIONS, refs, strict=True)
                if not (algo == FUSED and d == "backward_filter")
            ]
            cols.append(" / ".join(f"{e:.1e}" for e in errs))
        print(f"{case:6} " + " ".join(f"{c:>27}" for c in cols), flush=True)
    winograd.OUT_TILES.update(defaults)


def errors_precision(precision: str) -> None:
    """Strict float32 with other products (e.g. 3xTF32) than the module's."""
    defaults = dict(winograd.OUT_TILES)
    saved = winograd.PRECISION["fp32"]
    winograd.PRECISION["fp32"] = precision
    torch.manual_seed(0)
    x, w, dy = data(torch.float32, 8, 64, 64, 28)
    cols = []
    for algo, m in ((ALGO, 2), (ALGO, 4), (FUSED, 2), (FUSED, 4)):
        force_tile("fp32", m)
        errs = [
            R.rel_error(call(d, x, w, dy, algo, "fp32")(), reference(d, x, w, dy))
            for d in DIRECTIONS
            if not (algo == FUSED and d == "backward_filter")
        ]
        cols.append(" / ".join(f"{e:.1e}" for e in errs))
    print(f"fp32 {precision} " + " ".join(f"{c:>27}" for c in cols), flush=True)
    winograd.PRECISION["fp32"] = saved
    winograd.OUT_TILES.update(defaults)


def times(cases=("fp32", "bf16")) -> None:
    print("\nms per call, channels-last, padding 1; cuDNN through torch (same dtype/math)")
    for case in cases:
        dtype, math = CASES[case]
        torch.backends.cudnn.allow_tf32 = math != "fp32"
        torch.backends.cuda.matmul.allow_tf32 = math != "fp32"
        for n, c, size in LAYERS:
            x, w, dy = data(dtype, n, c, c, size)
            for d in DIRECTIONS:
                row = {}
                saved = winograd.OUT_TILES[FORMATS[case]]
                for algo in (ALGO, FUSED):
                    if algo == FUSED and d == "backward_filter":
                        continue
                    for m in saved:
                        force_tile(case, m)
                        fn = call(d, x, w, dy, algo, math)
                        row[f"{'fused' if algo == FUSED else 'nonfused'}{m}"] = device_time_ms(
                            fn, rep_ms=50
                        )
                if case == "fp32":  # IEEE float32 products instead of the module's
                    precision = winograd.PRECISION["fp32"]
                    winograd.PRECISION["fp32"] = "ieee"
                    for m in saved:
                        force_tile(case, m)
                        fn = call(d, x, w, dy, ALGO, math)
                        row[f"ieee{m}"] = device_time_ms(fn, rep_ms=50)
                    winograd.PRECISION["fp32"] = precision
                winograd.OUT_TILES[FORMATS[case]] = saved
                row["IG"] = device_time_ms(call(d, x, w, dy, "IMPLICIT_GEMM", math), rep_ms=50)
                row["cudnn"] = device_time_ms(torch_call(d, x, w, dy), rep_ms=50)
                best = min(v for k, v in row.items() if "fused" in k)
                text = " ".join(f"{k}={v:.3f}" for k, v in row.items())
                print(
                    f"{case} N={n} C=K={c} {size}x{size} {d:16} {text}  "
                    f"IG/wino={row['IG'] / best:.2f} cudnn/wino={row['cudnn'] / best:.2f}",
                    flush=True,
                )


def suite_layers(suite: str) -> list[tuple[str, int, int, int, int]]:
    """(name, batch, c, k, side) of a suite's square 3x3 stride-1 padding-1 layers."""
    import json
    from importlib import resources

    path = resources.files("rtdnn.bench") / "suites" / f"{suite}.json"
    layers = json.loads(path.read_text())["layers"]
    return [
        (e["name"], e["n"], e["c"], e["k"], e["spatial"][0])
        for e in layers
        if e["kernel"] == [3, 3] and e["stride"] == [1, 1] and e["padding"] == [1, 1]
        and e["groups"] == 1 and e["spatial"][0] == e["spatial"][1]
    ]  # fmt: skip


def stages(suite: str = "resnet50") -> None:
    """Strict float32 on a suite's 3x3 stride-1 layers: WINOGRAD_NONFUSED's whole call and
    each kernel's share (torch.profiler over 10 calls), the tiles chosen, cuDNN in benchmark
    mode, what `auto` picks; IMPLICIT_GEMM's time unless IG=0."""
    import os

    from torch.profiler import ProfilerActivity, profile

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    with_ig = os.environ.get("IG", "1") != "0"
    print(f"\n{suite}, strict float32, channels-last, us per call; kernels: us per call")
    print("| layer | direction | WINOGRAD_NONFUSED | cuDNN | ratio | IMPLICIT_GEMM | IG / wino "
          "| auto | kernels | tiles |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---|---|---|")
    for name, batch, c, k, size in suite_layers(suite):
        x, w, dy = data(torch.float32, batch, c, k, size)
        for d in DIRECTIONS:
            fn = call(d, x, w, dy, ALGO, "fp32")
            total = device_time_ms(fn, rep_ms=30) * 1e3
            cudnn = device_time_ms(torch_call(d, x, w, dy), rep_ms=30) * 1e3
            ig = float("nan")
            if with_ig:
                ig = device_time_ms(call(d, x, w, dy, "IMPLICIT_GEMM", "fp32"), rep_ms=30) * 1e3
            auto = rtdnn.get_conv_algorithm(x, w, direction=d, padding=1, math="fp32")
            chosen = [v for key, v in tile_choice._chosen.items() if ALGO in str(key)]
            tiles = chosen[-1] if chosen else None
            fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    fn()
                torch.cuda.synchronize()
            kernels: dict[str, float] = {}
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    kname = e.name.split("(")[0].removesuffix("_kernel")[:24]
                    kernels[kname] = kernels.get(kname, 0.0) + e.device_time / 10
            parts = ", ".join(f"{key} {v:.0f}" for key, v in kernels.items())
            label = (f"{tiles.block_m}x{tiles.block_n}x{tiles.block_k} F({tiles.out_tile}x"
                     f"{tiles.out_tile})") if tiles else "-"  # fmt: skip
            print(f"| {name} | {d} | {total:.1f} | {cudnn:.1f} | {cudnn / total:.2f} | "
                  f"{ig:.1f} | {ig / total:.2f} | {auto} | {parts} | {label} |",
                  flush=True)  # fmt: skip


def torch_call(direction, x, w, dy):
    from torch.nn.grad import conv2d_input, conv2d_weight

    if direction == "forward":
        return lambda: torch.nn.functional.conv2d(x, w, padding=1)
    if direction == "backward_data":
        return lambda: conv2d_input(x.shape, w, dy, padding=1)
    return lambda: conv2d_weight(x, w.shape, dy, padding=1)


if __name__ == "__main__":
    what = sys.argv[1:] or ["errors", "times"]
    if "errors" in what:
        errors()
    for arg in what:
        if arg.startswith("precision:"):  # strict float32's errors with these products
            errors_precision(arg.split(":")[1])
    for arg in what:
        if arg.startswith("stages"):  # stages or stages:SUITE
            stages(*[arg.split(":")[1]] if ":" in arg else [])
    for arg in what:
        if arg.startswith("times"):  # times or times:fp32,bf16
            times(*[arg.split(":")[1].split(",")] if ":" in arg else [])
