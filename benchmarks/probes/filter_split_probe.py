# ruff: noqa: B023 (the lambdas are called inside the loop that binds them)
"""GPU probe of IMPLICIT_GEMM_SPLIT_K's backward-filter on dense suite layers (bf16,
channels-last): every tile candidate plus 64-wide tiles, at several split counts, beside cuDNN
in the same process, with each result's error against cuDNN's. Answers how much of the time is
the reduction's finish (the last program of a tile sums every split's partial tile alone).

    PYTHONPATH=src python benchmarks/probes/filter_split_probe.py [SUITE] [LAYERS] [SPLITS]
    (LAYERS: comma-separated names, default a fixed set of resnet50 layers;
     SPLITS: comma-separated counts, 0 = the algorithm's own)
"""

import sys

import torch

from rtdnn.algos import ALGORITHMS, ConvTensors
from rtdnn.algos import implicit_gemm as ig
from rtdnn.bench.conv import DTYPES, _conv_args, _layer_tensors, load_suite
from rtdnn.core.timing import device_time_ms
from rtdnn.kernels.launch import TileConfig
from rtdnn.ops.conv import _problem_for_selection
from rtdnn.reference import rel_error

LAYERS = "l1.0.conv2,l1.x.conv1,l1.0.conv3,l2.x.conv2,l3.x.conv1,l3.x.conv2,l4.x.conv2"
EXTRA = [
    TileConfig(64, 64, 64, 8, 4, 4),
    TileConfig(64, 64, 128, 8, 4, 3),
    TileConfig(64, 128, 64, 8, 4, 3),
    TileConfig(64, 256, 64, 8, 8, 3),
]


def main() -> None:
    suite = sys.argv[1] if len(sys.argv) > 1 else "resnet50"
    names = (sys.argv[2] if len(sys.argv) > 2 else LAYERS).split(",")
    split_counts = [int(s) for s in (sys.argv[3] if len(sys.argv) > 3 else "0,8,16,32").split(",")]
    dtype = DTYPES["bf16"]
    print(torch.cuda.get_device_name())
    print("layer tiles splits ms cudnn_ms ratio TFLOP/s err_vs_cudnn")
    algo = ALGORITHMS["IMPLICIT_GEMM_SPLIT_K"]
    own_splits = ig.split_count
    for layer in load_suite(suite):
        if layer["name"] not in names:
            continue
        x, w = _layer_tensors(layer, dtype, None)
        args = _conv_args(layer)
        y = torch.nn.functional.conv2d(x, w, None, **args)
        dy = torch.randn_like(y)
        flops = 2 * y.numel() * w[0].numel()

        def cudnn():
            return torch.ops.aten.convolution_backward(
                dy, x, w, None, args["stride"], args["padding"], args["dilation"], False,
                [0, 0], args["groups"], (False, True, False),
            )[1]  # fmt: skip

        theirs = device_time_ms(cudnn)
        ref = cudnn().double().cpu()
        p, _ = _problem_for_selection(
            "backward_filter", x, w, mode="cross_correlation", math=None, **args
        )
        default = own_splits(p)
        candidates = algo.tile_candidates(p) + EXTRA
        for splits in split_counts:
            ig.split_count = lambda q, s=splits: s or own_splits(q)
            workspace = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8, device="cuda")
            for tiles in candidates:
                if getattr(tiles, "tma", False):
                    continue
                out = torch.full_like(w, float("nan")).contiguous(memory_format=torch.channels_last)
                t = ConvTensors(x, out, dy)
                try:
                    run = algo.prepare(p, tiles)
                    run(t, workspace, 1.0, 0.0)
                except Exception as e:  # noqa: BLE001 - a probe reports and goes on
                    print(f"{layer['name']} {tiles} failed: {type(e).__name__}: {e}")
                    continue
                err = rel_error(out, ref)
                ms = device_time_ms(lambda: run(t, workspace, 1.0, 0.0))
                shape = f"{tiles.block_m}x{tiles.block_n}x{tiles.block_k}"
                shape += f"/w{tiles.num_warps}s{tiles.num_stages}"
                print(
                    f"{layer['name']} {shape} {splits or default} {ms:.3f} {theirs:.3f} "
                    f"{theirs / ms:.2f} {flops / ms / 1e9:.0f} {err:.1e}",
                    flush=True,
                )
        ig.split_count = own_splits


if __name__ == "__main__":
    main()
