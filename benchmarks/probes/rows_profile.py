"""Run DIRECT on one suite layer with given tiles, a few times each, for a profiler (ncu).

    PYTHONPATH=src python benchmarks/probes/rows_profile.py SUITE LAYER DIRECTION SPEC ...

SPEC is KIND:BLOCK_M:BLOCK_N:BLOCK_K:WARPS[:STEP_ROWS] (DirectTiles). Each tile spec runs
twice (a warm-up, then the launch to profile); tiles are not tuned.
"""

import sys

import torch

from rtdnn.algos import ALGORITHMS, ConvTensors
from rtdnn.algos.direct import DirectTiles
from rtdnn.bench.conv import DTYPES, _conv_args, _layer_tensors, load_suite
from rtdnn.ops.conv import _problem_for_selection


def main() -> None:
    suite, name, direction, *specs = sys.argv[1:]
    layer = next(entry for entry in load_suite(suite) if entry["name"] == name)
    x, w = _layer_tensors(layer, DTYPES["bf16"], None)
    p, scratch = _problem_for_selection(
        direction, x, w, mode="cross_correlation", math=None, **_conv_args(layer)
    )
    algo = ALGORITHMS["DIRECT"]
    need = algo.workspace_bytes(p)
    ws = torch.empty(max(need, 1), dtype=torch.uint8, device="cuda")
    for spec in specs:
        kind, bm, bn, bk, warps, *r = spec.split(":")
        tiles = DirectTiles(
            int(bm),
            int(bn),
            int(bk),
            1,
            int(warps),
            1,
            kernel=kind,
            step_rows=int(r[0]) if r else 1,
        )
        run = algo.prepare(p, tiles)
        for _ in range(2):
            run(ConvTensors(scratch.x, scratch.w, scratch.y), ws, 1.0, 0.0)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
