"""Accuracy of every convolution algorithm, per dtype and direction: the relative error
||out - ref|| / ||ref|| against a float64 reference of the same inputs, on a few layer shapes
that between them reach every algorithm (3x3 and 5x5 stride 1, 1x1, a strided RGB stem,
depthwise and grouped), at a batch small enough for the float64 reference.

    PYTHONPATH=src python benchmarks/probes/algo_accuracy.py [--batch N] [--layers 0,3]
        [--out FILE.md]

--layers picks rows of LAYERS by index, so that several processes can share the layers (each
compiles its own kernels: with RTDNN_AUTOTUNE=0, compiling is most of a GPU run's time).

On a GPU the reference is torch's float64 convolution there; on a CPU (tiny shapes, the
interpreter) rtdnn.reference's; the CPU run checks the script, its numbers are not the GPU's
(no TF32 there). Inputs are standard normal, the filter scaled by 1/sqrt(fan-in), dy standard
normal, so every output is of order 1. "floor" is the float64 result rounded to the output's
dtype, the error no algorithm can beat.
"""

import argparse
import math

import torch

import rtdnn
from rtdnn import reference as R
from rtdnn.algos import ALGORITHMS

#: (name, C, K, spatial, kernel, stride, padding, groups)
LAYERS = [
    ("3x3", 64, 64, 28, 3, 1, 1, 1),
    ("5x5", 32, 64, 27, 5, 1, 2, 1),
    ("1x1", 256, 64, 28, 1, 1, 0, 1),
    ("stem 7x7 s2", 3, 64, 112, 7, 2, 3, 1),
    ("stem 11x11 s4", 3, 64, 115, 11, 4, 2, 1),
    ("depthwise 3x3", 96, 96, 28, 3, 1, 1, 96),
    ("grouped 3x3 (4 per group)", 128, 128, 28, 3, 1, 1, 32),
]
TINY = [(n, min(c, 8), min(k, 8), 7, r, s, p, min(g, 8) if g > 1 else 1)
        for n, c, k, _, r, s, p, g in LAYERS]  # fmt: skip
#: dtype name -> (torch dtype, rtdnn math mode, cuDNN's TF32 switch)
DTYPES = {
    "fp32": (torch.float32, "fp32", False),
    "tf32": (torch.float32, "tf32", True),
    "fp16": (torch.float16, None, False),
    "bf16": (torch.bfloat16, None, False),
}
DIRECTIONS = ("forward", "backward_data", "backward_filter")


def _reference(direction, x, w, dy, conv, device):
    """The float64 result of `direction` on these inputs."""
    x, w, dy = x.double(), w.double(), dy.double()
    if device == "cpu":
        return {
            "forward": lambda: R.conv_forward(x, w, **conv),
            "backward_data": lambda: R.conv_backward_data(dy, w, x.shape, **conv),
            "backward_filter": lambda: R.conv_backward_filter(x, dy, w.shape, **conv),
        }[direction]()
    mask = {"forward": None, "backward_data": [True, False, False],
            "backward_filter": [False, True, False]}[direction]  # fmt: skip
    if mask is None:
        return torch.nn.functional.conv2d(x, w, **conv)
    out = torch.ops.aten.convolution_backward(
        dy, x, w, None, [conv["stride"]] * 2, [conv["padding"]] * 2, [1, 1], False, [0, 0],
        conv["groups"], mask,
    )  # fmt: skip
    return out[0] if direction == "backward_data" else out[1]


def _ours(direction, algo, x, w, dy, conv, math_mode):
    kw = dict(algo=algo, math=math_mode, **conv)
    if direction == "forward":
        return rtdnn.conv_forward(x, w, **kw)
    if direction == "backward_data":
        return rtdnn.conv_backward_data(dy, w, x.shape, **kw)
    return rtdnn.conv_backward_filter(x, dy, w.shape, **kw)


def measure(batch: int, device: str, picked: list[int] | None = None) -> list[tuple]:
    """(layer, dtype, direction, algorithm, relative error or a reason) for every case of the
    layers `picked` (indices into LAYERS; None: all)."""
    rows = []
    layers = LAYERS if device == "cuda" else TINY
    layers = [layers[i] for i in picked] if picked is not None else layers
    gen = torch.Generator().manual_seed(0)
    for name, c, k, size, r, s, p, g in layers:
        conv = dict(stride=s, padding=p, groups=g)
        x64 = torch.randn(batch, c, size, size, generator=gen, dtype=torch.float64)
        w64 = torch.randn(k, c // g, r, r, generator=gen, dtype=torch.float64)
        w64 /= math.sqrt(c // g * r * r)
        out_size = (size + 2 * p - r) // s + 1
        dy64 = torch.randn(batch, k, out_size, out_size, generator=gen, dtype=torch.float64)
        for dname, (dtype, math_mode, tf32) in DTYPES.items():
            torch.backends.cudnn.allow_tf32 = tf32
            cl = lambda t: t.to(device, dtype).contiguous(memory_format=torch.channels_last)  # noqa: E731,B023
            x, w, dy = cl(x64), cl(w64), cl(dy64)
            for direction in DIRECTIONS:
                # The reference takes the inputs as rounded to the dtype: only the
                # algorithm's own arithmetic is measured.
                ref = _reference(direction, x, w, dy, conv, device).cpu()
                # The floor: the exact result rounded to the output's dtype.
                floor = R.rel_error(ref.to(dtype), ref)
                rows.append((name, dname, direction, "floor", f"{floor:.1e}"))
                for algo in ALGORITHMS:
                    try:
                        out = _ours(direction, algo, x, w, dy, conv, math_mode)
                        err = f"{R.rel_error(out, ref):.1e}"
                    except rtdnn.NotSupportedError:
                        err = "-"
                    except Exception as e:  # one failure must not hide the other results
                        err = f"failed: {type(e).__name__}"
                    rows.append((name, dname, direction, algo, err))
                print(f"{name} {dname} {direction} done", flush=True)
    return rows


def markdown(rows: list[tuple]) -> str:
    """One table: a row per (layer, dtype, direction), a column per algorithm after the
    floor (the float64 result rounded to the output's dtype: what no algorithm beats)."""
    algos = ["floor", *ALGORITHMS]
    lines = ["| layer | dtype | direction | " + " | ".join(algos) + " |",
             "|---|---|---|" + "---:|" * len(algos)]  # fmt: skip
    cases: dict[tuple, dict] = {}
    for name, dtype, direction, algo, err in rows:
        cases.setdefault((name, dtype, direction), {})[algo] = err
    for (name, dtype, direction), errs in cases.items():
        cells = " | ".join(errs.get(a, "-") for a in algos)
        lines.append(f"| {name} | {dtype} | {direction} | {cells} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--layers", default=None, help="indices into LAYERS, e.g. 0,3")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    picked = [int(i) for i in args.layers.split(",")] if args.layers else None
    table = markdown(measure(args.batch or (8 if device == "cuda" else 1), device, picked))
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
