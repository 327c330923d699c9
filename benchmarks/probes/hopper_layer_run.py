"""Run one suite layer's rtdnn call a few times (after a warm-up that compiles and chooses its
tiles), for a profiler to sample: `ncu_hopper_layers.sh` profiles the last calls. Usage:
    python hopper_layer_run.py SUITE DIRECTION DTYPE LAYER [REPEATS]"""

import sys

import torch

from rtdnn.bench.conv import DTYPES, layer_calls, load_suite

suite, direction, dtype_name, name, *rest = sys.argv[1:]
repeats = int(rest[0]) if rest else 3
layer = next(layer for layer in load_suite(suite) if layer["name"] == name)
c = layer_calls(layer, direction, DTYPES[dtype_name], None)
for _ in range(2 + repeats):  # two warm-up calls, then the ones to profile
    c.ours()
torch.cuda.synchronize()
print(f"{suite} {name} {direction} {dtype_name}: ran {2 + repeats} calls")
