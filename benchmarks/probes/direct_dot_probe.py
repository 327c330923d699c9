# ruff: noqa: B023 (the lambdas are called inside the loop that binds them)
"""A short GPU probe of DIRECT's two kernel families on a few suite layers, every direction:
each candidate's time beside cuDNN's in the same process, and its error against cuDNN.

    PYTHONPATH=src python benchmarks/probes/direct_dot_probe.py
"""

import torch
import torch.nn.functional as F

from rtdnn.algos import ALGORITHMS, ConvTensors
from rtdnn.algos.direct import DirectTiles
from rtdnn.bench.conv import DTYPES, _conv_args, _layer_tensors, load_suite
from rtdnn.core.timing import device_time_ms
from rtdnn.ops.conv import _problem_for_selection
from rtdnn.reference import rel_error

LAYERS = [
    ("depthwise", "effb0.dw32.112.k3"),
    ("depthwise", "effb0.dw144.56.k5.s2"),
    ("depthwise", "convnext.dw96.56.k7"),
    ("depthwise", "effb0.dw672.14.k5"),
    ("grouped", "resnext50.g128.56"),
    ("grouped", "resnext50.g512.14"),
]
TILES = {
    "dot": DirectTiles(128, 16, 1, 1, 4, 3, kernel="dot"),
    "dot64": DirectTiles(64, 16, 1, 1, 4, 3, kernel="dot"),
    "fma": DirectTiles(64, 64, 1, 1, 4, 1),
    "fma16": DirectTiles(16, 64, 1, 1, 4, 1),
}
PLAN = {
    "forward": ("dot", "fma"),
    "backward_data": ("dot", "fma"),
    "backward_filter": ("dot64", "fma16"),
}


def main() -> None:
    algo = ALGORITHMS["DIRECT"]
    print("layer direction variant ms cudnn_ms ratio err")
    for suite, name in LAYERS:
        layer = next(e for e in load_suite(suite) if e["name"] == name)
        x, w = _layer_tensors(layer, DTYPES["bf16"], None)
        args = _conv_args(layer)
        y = F.conv2d(x, w, None, **args)
        dy = torch.randn_like(y)
        for direction, variants in PLAN.items():
            p, _ = _problem_for_selection(
                direction, x, w, mode="cross_correlation", math=None, **args
            )
            if direction == "forward":
                out, tensors = torch.empty_like(y), None
                tensors = ConvTensors(x, w, out)
                theirs = lambda: F.conv2d(x, w, None, **args)  # noqa: E731
            elif direction == "backward_data":
                out = torch.empty_like(x)
                tensors = ConvTensors(out, w, dy)
                theirs = lambda: torch.ops.aten.convolution_backward(  # noqa: E731
                    dy, x, w, None, args["stride"], args["padding"], args["dilation"], False,
                    [0, 0], args["groups"], [True, False, False])[0]  # fmt: skip
            else:
                out = torch.empty_like(w)
                tensors = ConvTensors(x, out, dy)
                theirs = lambda: torch.ops.aten.convolution_backward(  # noqa: E731
                    dy, x, w, None, args["stride"], args["padding"], args["dilation"], False,
                    [0, 0], args["groups"], [False, True, False])[1]  # fmt: skip
            expected = theirs().double().cpu()
            cudnn_ms = device_time_ms(theirs, rep_ms=20)
            need = algo.workspace_bytes(p)
            ws = torch.empty(need, dtype=torch.uint8, device="cuda") if need else None
            for v in variants:
                tiles = TILES[v]
                if tiles.kernel != "dot" and p.in_channels // p.groups > 8:
                    continue
                try:
                    run = algo.prepare(p, tiles)
                    out.fill_(float("nan"))
                    run(tensors, ws, 1.0, 0.0)
                    err = rel_error(out, expected)
                    ms = device_time_ms(lambda: run(tensors, ws, 1.0, 0.0), rep_ms=20)
                    print(f"{name} {direction} {v} {ms:.3f} {cudnn_ms:.3f} "
                          f"{cudnn_ms / ms:.2f} {err:.1e}", flush=True)  # fmt: skip
                except Exception as e:  # report and go on
                    print(f"{name} {direction} {v} FAILED {type(e).__name__}: {e}"[:300])


if __name__ == "__main__":
    main()
