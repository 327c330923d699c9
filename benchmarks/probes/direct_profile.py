"""Run one suite layer's convolution through one algorithm a few times, for a profiler.

    PYTHONPATH=src python benchmarks/probes/direct_profile.py SUITE LAYER DIRECTION [ALGO] [REPS]

Under `ncu --kernel-name regex:... --launch-skip S --launch-count 1` it gives one warm launch.
KERNEL=dot (or rows, fma, dot_rows) keeps DIRECT's tile candidates of that family only, so
that RTDNN_AUTOTUNE=0 runs its first.
"""

import os
import sys

import torch

import rtdnn
from rtdnn.bench.conv import DTYPES, _conv_args, _layer_tensors, load_suite


def main() -> None:
    kind = os.environ.get("KERNEL")
    if kind:
        from rtdnn.algos.direct import Direct

        every = Direct.tile_candidates
        Direct.tile_candidates = lambda self, p: [t for t in every(self, p) if t.kernel == kind]
    suite, name, direction = sys.argv[1:4]
    algo = sys.argv[4] if len(sys.argv) > 4 else "DIRECT"
    reps = int(sys.argv[5]) if len(sys.argv) > 5 else 3
    layer = next(entry for entry in load_suite(suite) if entry["name"] == name)
    x, w = _layer_tensors(layer, DTYPES["bf16"], None)
    args = _conv_args(layer)
    y = rtdnn.conv_forward(x, w, algo=algo, **args)
    for _ in range(reps):
        if direction == "forward":
            rtdnn.conv_forward(x, w, algo=algo, **args)
        elif direction == "backward_data":
            rtdnn.conv_backward_data(y, w, x.shape, algo=algo, **args)
        else:
            rtdnn.conv_backward_filter(x, y, w.shape, algo=algo, **args)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
