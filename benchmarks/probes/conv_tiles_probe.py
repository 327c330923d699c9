# ruff: noqa: B023 (the lambdas are called inside the loop that binds them)
"""GPU probe of the implicit GEMM's tiles on chosen suite layers (bf16, channels-last): in each
direction, every tile candidate of the algorithm the heuristic runs there (IMPLICIT_GEMM for
forward and backward-data, IMPLICIT_GEMM_SPLIT_K for backward-filter) timed beside cuDNN in
the same process, with each result's error against cuDNN's. The best row of each layer and
direction is what the tile tuner would choose. Run it once per source tree (PYTHONPATH) in one
session to compare two versions of the kernels on one GPU.

    PYTHONPATH=src python benchmarks/probes/conv_tiles_probe.py [SUITE] [LAYERS] [DIRS] [DTYPE]

(DTYPE: bf16, the default, or fp16.) Tile labels: BMxBNxBK/wWARPSsSTAGES, then "/rows" for
the forward by filter rows and "/PRECISION" where the tiles choose one.
"""

import math
import sys

import torch

from rtdnn.algos import ALGORITHMS, ConvTensors
from rtdnn.bench.conv import DTYPES, _conv_args, _layer_tensors, load_suite
from rtdnn.core.timing import device_time_ms
from rtdnn.ops.conv import _problem_for_selection
from rtdnn.reference import rel_error

LAYERS = "l1.0.conv2,l1.x.conv1,l2.x.conv2,l3.x.conv2,l4.x.conv2"
ALGO = {
    "forward": "IMPLICIT_GEMM",
    "backward_data": "IMPLICIT_GEMM",
    "backward_filter": "IMPLICIT_GEMM_SPLIT_K",
}


def main() -> None:
    suite = sys.argv[1] if len(sys.argv) > 1 else "resnet50"
    names = (sys.argv[2] if len(sys.argv) > 2 else LAYERS).split(",")
    directions = (sys.argv[3] if len(sys.argv) > 3 else ",".join(ALGO)).split(",")
    dtype = DTYPES[sys.argv[4] if len(sys.argv) > 4 else "bf16"]
    print(torch.cuda.get_device_name())
    print("layer direction tiles ms cudnn_ms ratio TFLOP/s err_vs_cudnn")
    best = {}
    for layer in load_suite(suite):
        if layer["name"] not in names:
            continue
        x, w = _layer_tensors(layer, dtype, None)
        args = _conv_args(layer)
        y = torch.nn.functional.conv2d(x, w, None, **args)
        dy = torch.randn_like(y)
        flops = 2 * y.numel() * w[0].numel()
        mask = {"backward_data": (True, False, False), "backward_filter": (False, True, False)}

        def cudnn(direction):
            if direction == "forward":
                return torch.nn.functional.conv2d(x, w, None, **args)
            grads = torch.ops.aten.convolution_backward(
                dy, x, w, None, args["stride"], args["padding"], args["dilation"], False,
                [0, 0], args["groups"], mask[direction],
            )  # fmt: skip
            return grads[0] if direction == "backward_data" else grads[1]

        for direction in directions:
            theirs = device_time_ms(lambda: cudnn(direction))
            ref = cudnn(direction).double().cpu()
            p, _ = _problem_for_selection(
                direction, x, w, mode="cross_correlation", math=None, **args
            )
            algo = ALGORITHMS[ALGO[direction]]
            workspace = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8, device="cuda")
            for tiles in algo.tile_candidates(p):
                if getattr(tiles, "tma", False):
                    continue
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
                shape += "/rows" if getattr(tiles, "filter_rows", False) else ""
                shape += f"/{tiles.precision}" if getattr(tiles, "precision", "") else ""
                print(
                    f"{layer['name']} {direction} {shape} {ms:.4f} {theirs:.4f} "
                    f"{theirs / ms:.2f} {flops / ms / 1e9:.0f} {err:.1e}",
                    flush=True,
                )
                key = (layer["name"], direction)
                if err < 2e-2 and (key not in best or ms < best[key][0]):
                    best[key] = (ms, theirs)
    print("best per layer and direction (ratio = cuDNN / rtdnn):")
    for direction in directions:
        ratios = [theirs / ms for (_, d), (ms, theirs) in best.items() if d == direction]
        for (name, d), (ms, theirs) in best.items():
            if d == direction:
                print(f"  {name} {d} {ms:.4f} ms, cuDNN {theirs:.4f}, ratio {theirs / ms:.2f}")
        if ratios:
            geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
            print(f"geomean {direction} {geomean:.2f} over {len(ratios)} layers")


if __name__ == "__main__":
    main()
