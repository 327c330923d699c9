# ruff: noqa: B023 (the lambdas are called inside the loop that binds them)
"""Weight gradients of ungrouped 64-channel layers (ResNet-50's and VGG-16's) through DIRECT's
"dot_taps" tiles, beside `auto` (tiles tuned) and cuDNN: a layer of at most 64 input and output
channels is one super-group of those tiles, with no zeros, and they read dy once per filter
row where the split-K implicit GEMM reads it once per tap.

    PYTHONPATH=src python benchmarks/probes/dense_filter_taps_probe.py
"""

import torch

from rtdnn.algos import ALGORITHMS, ConvTensors
from rtdnn.algos.direct import _dot_taps_candidates
from rtdnn.bench.conv import layer_calls, load_suite
from rtdnn.core.timing import device_time_ms
from rtdnn.ops.conv import _problem_for_selection
from rtdnn.reference import rel_error


def main() -> None:
    print(torch.cuda.get_device_name())
    algo = ALGORITHMS["DIRECT"]
    for suite in ("resnet50", "vgg16"):
        for layer in load_suite(suite):
            if layer.get("groups", 1) != 1 or not 16 <= layer["c"] <= 64 or layer["k"] > 64:
                continue
            calls = layer_calls(layer, "backward_filter", torch.bfloat16, None)
            expected = calls.expected.double().cpu()
            cudnn = device_time_ms(calls.theirs) * 1e3
            auto = device_time_ms(calls.ours) * 1e3
            print(f"== {suite} {layer['name']} cudnn {cudnn:.1f} us, auto {auto:.1f} us "
                  f"({cudnn / auto:.2f}x)", flush=True)  # fmt: skip
            p, _ = _problem_for_selection(
                "backward_filter", calls.x, calls.w, mode="cross_correlation", math=None,
                **calls.args,
            )  # fmt: skip
            need = algo.workspace_bytes(p)
            ws = torch.empty(need, dtype=torch.uint8, device="cuda")
            out = torch.empty_like(calls.w)
            tensors = ConvTensors(calls.x, out, calls.dy)
            for tiles in _dot_taps_candidates(p):
                run = algo.prepare(p, tiles)
                out.fill_(float("nan"))
                run(tensors, ws, 1.0, 0.0)
                err = rel_error(out, expected)
                us = device_time_ms(lambda: run(tensors, ws, 1.0, 0.0)) * 1e3
                print(f"  {us:7.1f} us {cudnn / us:5.2f}x err {err:.1e} {tiles}", flush=True)


if __name__ == "__main__":
    main()
