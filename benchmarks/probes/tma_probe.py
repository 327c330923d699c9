# ruff: noqa: B023 (the lambdas are called inside the loop that binds them)
"""GPU probe of IMPLICIT_GEMM's TMA kernels (kernels/conv_tma.py) on the stride-1 layers of a
suite in bf16, every direction: each TMA tile candidate and each pointer-path candidate (and
IMPLICIT_GEMM_SPLIT_K's for backward-filter), timed beside cuDNN in the same process, with the
error of each against cuDNN's result.

    PYTHONPATH=src python benchmarks/probes/tma_probe.py [SUITE] [LIMIT] [DIRECTIONS]
    (DIRECTIONS: comma-separated of forward,backward_data,backward_filter; default all)
"""

import os
import sys

import torch
import torch.nn.functional as F

from rtdnn.algos import ALGORITHMS, ConvTensors
from rtdnn.bench.conv import DTYPES, _conv_args, _layer_tensors, load_suite, matmul_ceiling
from rtdnn.core.timing import device_time_ms
from rtdnn.ops.conv import _problem_for_selection
from rtdnn.reference import rel_error

ALGOS = {
    "forward": ["IMPLICIT_GEMM"],
    "backward_data": ["IMPLICIT_GEMM"],
    "backward_filter": ["IMPLICIT_GEMM", "IMPLICIT_GEMM_SPLIT_K"],
}


def main() -> None:
    os.environ["RTDNN_TMA"] = "1"
    suite = sys.argv[1] if len(sys.argv) > 1 else "resnet50"
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    directions = sys.argv[3].split(",") if len(sys.argv) > 3 else list(ALGOS)
    dtype = DTYPES["bf16"]
    ceiling = matmul_ceiling(dtype)
    print(f"{torch.cuda.get_device_name()}, matmul ceiling {ceiling:.0f} TFLOP/s")
    print("layer direction algo tiles kind ms cudnn_ms ratio TFLOP/s err_vs_cudnn")
    layers = [e for e in load_suite(suite) if e["stride"] in (1, [1, 1], (1, 1))]
    for layer in layers[:limit]:
        x, w = _layer_tensors(layer, dtype, None)
        args = _conv_args(layer)
        y = F.conv2d(x, w, None, **args)
        dy = torch.randn_like(y)
        flops = 2 * y.numel() * w[0].numel()
        mask = {
            "backward_data": (True, False, False), "backward_filter": (False, True, False),
        }  # fmt: skip

        def cudnn(direction):
            if direction == "forward":
                return F.conv2d(x, w, None, **args)
            grads = torch.ops.aten.convolution_backward(
                dy, x, w, None, args["stride"], args["padding"], args["dilation"], False,
                [0, 0], args["groups"], mask[direction],
            )  # fmt: skip
            return grads[0] if direction == "backward_data" else grads[1]

        for direction in directions:
            theirs = device_time_ms(lambda: cudnn(direction))
            ref = cudnn(direction).double().cpu()
            p, _ = _problem_for_selection(direction, x, w, mode="cross_correlation", math=None,
                                          **args)  # fmt: skip
            for name in ALGOS[direction]:
                algo = ALGORITHMS[name]
                workspace = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8, device="cuda")
                for tiles in algo.tile_candidates(p):
                    kind = "tma" if getattr(tiles, "tma", False) else "pointer"
                    out = torch.full_like(ref, float("nan"), dtype=dtype, device="cuda")
                    out = out.contiguous(memory_format=torch.channels_last)
                    t = {
                        "forward": ConvTensors(x, w, out),
                        "backward_data": ConvTensors(out, w, dy),
                        "backward_filter": ConvTensors(x, out, dy),
                    }[direction]
                    run = algo.prepare(p, tiles)
                    run(t, workspace, 1.0, 0.0)
                    err = rel_error(out, ref)
                    ms = device_time_ms(lambda: run(t, workspace, 1.0, 0.0))
                    shape = f"{tiles.block_m}x{tiles.block_n}x{tiles.block_k}"
                    shape += f"/w{tiles.num_warps}s{tiles.num_stages}"
                    print(f"{layer['name']} {direction} {name} {shape} {kind} {ms:.3f} "
                          f"{theirs:.3f} {theirs / ms:.2f} {flops / ms / 1e9:.0f} {err:.1e}",
                          flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
