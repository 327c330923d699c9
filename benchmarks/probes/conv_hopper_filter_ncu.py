"""One launch of each of the Hopper weight gradient's unit shapes on VGG-16's conv512_512_28
(batch 64, bf16), for Nsight Compute (gpu_hopper_filter_units.sh)."""

import torch

from rtdnn.algos import ALGORITHMS, ConvTensors
from rtdnn.bench.conv import layer_calls, load_suite
from rtdnn.bench.conv_algos import _problem

layer = next(v for v in load_suite("vgg16") if v["name"] == "conv512_512_28")
c = layer_calls(layer, "backward_filter", torch.bfloat16, None)
p = _problem(c, "backward_filter")
algo = ALGORITHMS["IMPLICIT_GEMM_SPLIT_K"]
workspace = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8, device="cuda")
for tiles in algo.tile_candidates(p):
    print(tiles)
    algo.prepare(p, tiles)(ConvTensors(c.x, torch.empty_like(c.w), c.dy), workspace, 1.0, 0.0)
torch.cuda.synchronize()
