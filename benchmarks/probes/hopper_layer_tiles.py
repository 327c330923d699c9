"""Each IMPLICIT_GEMM tile candidate of a few suite layers, timed through rtdnn's own call
(the choice forced into the tuner's memory), beside the untuned choice and cuDNN: to compare
two source trees (run once with each on PYTHONPATH). Usage:
    python hopper_layer_tiles.py SUITE DIRECTION DTYPE LAYER [LAYER ...]"""

import functools
import sys

import torch

from rtdnn.algos import ALGORITHMS, tiles
from rtdnn.bench.conv import DTYPES, _bench, layer_calls, load_suite
from rtdnn.ops.conv import _prepared as prepared_calls
from rtdnn.ops.conv import _problem_for_selection

suite, direction, dtype_name, *names = sys.argv[1:]
dtype = DTYPES[dtype_name]
torch.backends.cudnn.benchmark = True
layers = {layer["name"]: layer for layer in load_suite(suite)}
algo = ALGORITHMS["IMPLICIT_GEMM"]


def forget() -> None:
    """Forget the tiles chosen and the calls prepared with them (a prepared call keeps its
    runner, tiles included, so forcing a tile needs both gone)."""
    tiles._chosen.clear()
    prepared_calls.clear()


for name in names:
    c = layer_calls(layers[name], direction, dtype, None)
    p, _ = _problem_for_selection(direction, c.x, c.w, **c.args, mode="cross_correlation",
                                  math=None)  # fmt: skip
    forget()
    c.ours(algo="IMPLICIT_GEMM")
    # The key the call tuned under (the problem of its own tensors' strides); none where
    # there was one candidate (nothing to choose).
    keys = [(k, v) for k, v in tiles._chosen.items() if k[0] == algo.name]
    (key, chosen), *_ = keys or [((algo.name, p.key()), algo.tile_candidates(p)[0])]
    untuned = _bench(functools.partial(c.ours, algo="IMPLICIT_GEMM"))
    print(
        f"{name} {direction}: untuned {untuned:.4f} ms ({chosen}); cuDNN {_bench(c.theirs):.4f} ms"
    )
    for t in algo.tile_candidates(p)[:8]:
        forget()
        tiles._chosen[key] = t
        try:
            ms = _bench(functools.partial(c.ours, algo="IMPLICIT_GEMM"))
        except Exception as e:  # a candidate that does not run here
            print(f"    {t}: {type(e).__name__}")
            continue
        print(f"    {ms:.4f} ms  {t}")
