"""Each IMPLICIT_GEMM tile candidate of a few suite layers, run through the algorithm's own
prepared runner (algo.prepare on the layer's tensors), beside the call a user makes untuned
and cuDNN: to compare two source trees (run once with each on PYTHONPATH). Usage:
    python hopper_layer_tiles.py SUITE DIRECTION DTYPE LAYER [LAYER ...]"""

import functools
import sys

import torch

from rtdnn.algos import ALGORITHMS, ConvTensors
from rtdnn.bench.conv import DTYPES, _bench, layer_calls, load_suite
from rtdnn.ops.conv import _problem_for_selection

suite, direction, dtype_name, *names = sys.argv[1:]
dtype = DTYPES[dtype_name]
torch.backends.cudnn.benchmark = True
layers = {layer["name"]: layer for layer in load_suite(suite)}
algo = ALGORITHMS["IMPLICIT_GEMM"]


def written_tensors(c) -> ConvTensors:
    """The layer's tensors with a fresh output of the direction's written tensor."""
    if direction == "forward":
        return ConvTensors(c.x, c.w, torch.empty_like(c.y))
    if direction == "backward_data":
        return ConvTensors(torch.empty_like(c.x), c.w, c.dy)
    return ConvTensors(c.x, torch.empty_like(c.w), c.dy)


for name in names:
    c = layer_calls(layers[name], direction, dtype, None)
    p, _ = _problem_for_selection(direction, c.x, c.w, **c.args, mode="cross_correlation",
                                  math=None)  # fmt: skip
    untuned = _bench(functools.partial(c.ours, algo="IMPLICIT_GEMM"))
    print(f"{name} {direction}: untuned {untuned:.4f} ms; cuDNN {_bench(c.theirs):.4f} ms")
    t = written_tensors(c)
    workspace = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8, device="cuda")
    for tiles in algo.tile_candidates(p)[:8]:
        try:
            run = algo.prepare(p, tiles)
            ms = _bench(functools.partial(run, t, workspace, 1.0, 0.0))
        except Exception as e:  # a candidate that does not run here
            print(f"    {tiles}: {type(e).__name__}")
            continue
        print(f"    {ms:.4f} ms  {tiles}")
