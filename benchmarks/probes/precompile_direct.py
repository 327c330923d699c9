"""Compile every DIRECT kernel a bench suite will try (each layer, direction and tile
candidate) in parallel worker processes, so that the benchmark's serial tile tuning finds them
in Triton's on-disk cache instead of compiling one after another. Runs each launch once on real
tensors of the layer's shapes; times nothing.

    PYTHONPATH=src python benchmarks/probes/precompile_direct.py SUITE [SUITE ...] [--workers N]
"""

import sys
import time

import torch
import torch.multiprocessing as mp


def _work(item):
    suite, index, direction, dtype_name = item
    from rtdnn.algos import ALGORITHMS, ConvTensors
    from rtdnn.bench.conv import DTYPES, _conv_args, _layer_tensors, load_suite
    from rtdnn.ops.conv import _problem_for_selection

    layer = load_suite(suite)[index]
    x, w = _layer_tensors(layer, DTYPES[dtype_name], None)
    args = _conv_args(layer)
    p, scratch = _problem_for_selection(
        direction, x, w, mode="cross_correlation", math=None, **args
    )
    algo = ALGORITHMS["DIRECT"]
    if algo.supports(p) is not None:
        return 0
    need = algo.workspace_bytes(p)
    ws = torch.empty(need, dtype=torch.uint8, device="cuda") if need else None
    count = 0
    for tiles in algo.tile_candidates(p):
        t = ConvTensors(scratch.x, scratch.w, scratch.y)
        algo.prepare(p, tiles)(t, ws, 1.0, 0.0)
        count += 1
    torch.cuda.synchronize()
    return count


def main() -> None:
    from rtdnn.bench.conv import load_suite

    argv = sys.argv[1:]
    workers = 12
    if "--workers" in argv:
        i = argv.index("--workers")
        workers = int(argv[i + 1])
        del argv[i : i + 2]
    items = [
        (suite, i, d, "bf16")
        for suite in argv
        for i in range(len(load_suite(suite)))
        for d in ("forward", "backward_data", "backward_filter")
    ]
    start = time.time()
    with mp.get_context("spawn").Pool(workers) as pool:
        counts = pool.map(_work, items, chunksize=1)
    print(f"precompiled {sum(counts)} DIRECT launches in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
