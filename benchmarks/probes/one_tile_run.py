"""Run one suite layer's convolution with one implicit-GEMM tile a few times and nothing else,
for a profiler (ncu) to catch: bf16 or fp16, channels-last, as conv_tiles_probe.py times it.

    PYTHONPATH=src python benchmarks/probes/one_tile_run.py SUITE LAYER DIRECTION DTYPE TILES
    (TILES as conv_tiles_probe.py labels them, e.g. 128x64x32/w4s4/rows)
"""

import sys

import torch

from rtdnn.algos import ALGORITHMS, ConvTensors
from rtdnn.bench.conv import DTYPES, _conv_args, _layer_tensors, load_suite
from rtdnn.ops.conv import _problem_for_selection

ALGO = {"forward": "IMPLICIT_GEMM", "backward_data": "IMPLICIT_GEMM"}


def label(tiles) -> str:
    shape = f"{tiles.block_m}x{tiles.block_n}x{tiles.block_k}"
    shape += f"/w{tiles.num_warps}s{tiles.num_stages}"
    shape += "/rows" if getattr(tiles, "filter_rows", False) else ""
    return shape + (f"/{tiles.precision}" if getattr(tiles, "precision", "") else "")


def main() -> None:
    suite, name, direction, dtype, wanted = sys.argv[1:6]
    layer = next(layer for layer in load_suite(suite) if layer["name"] == name)
    x, w = _layer_tensors(layer, DTYPES[dtype], None)
    args = _conv_args(layer)
    y = torch.nn.functional.conv2d(x, w, None, **args)
    p, _ = _problem_for_selection(direction, x, w, mode="cross_correlation", math=None, **args)
    algo = ALGORITHMS[ALGO.get(direction, "IMPLICIT_GEMM_SPLIT_K")]
    tiles = next(t for t in algo.tile_candidates(p) if label(t) == wanted)
    workspace = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8, device="cuda")
    run = algo.prepare(p, tiles)
    for _ in range(4):
        run(ConvTensors(x, w, y), workspace, 1.0, 0.0)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
