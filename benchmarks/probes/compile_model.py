"""A model (ResNet-50 unless MODEL is given) under torch.compile(mode=MODE), converted and not:
seconds of the first three calls and images/s afterwards, inference and then training,
printed as each is measured (a slow compile still leaves the earlier lines).
    PYTHONPATH=src python benchmarks/probes/compile_model.py [MODE] [MODEL] [KINDS]
KINDS: inference,training (default both). CUDAGRAPH_HISTORY=1: CUDA-graph trees record where
each allocation was made, which their errors then show.
"""

import os
import sys
import time

import torch
from host_timing import resnet50_pair, sgd_train_step

import rtdnn

mode = sys.argv[1] if len(sys.argv) > 1 else "reduce-overhead"
name = sys.argv[2] if len(sys.argv) > 2 else "resnet50"
kinds = (sys.argv[3] if len(sys.argv) > 3 else "inference,training").split(",")
batch = 128
if os.environ.get("CUDAGRAPH_HISTORY") == "1":  # where memory left in their pool was made
    import torch._inductor.config

    torch._inductor.config.triton.cudagraph_trees_history_recording = True
model, converted, x, target = resnet50_pair(batch, name)
print(f"{name}: built", flush=True)
nets = {"rtdnn": (converted, rtdnn.nn.CrossEntropyLoss()),
        "pytorch": (model, torch.nn.CrossEntropyLoss())}  # fmt: skip


def rate(step, steps: int = 20) -> float:
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return batch * steps / (time.perf_counter() - t0)


def make_step(kind: str, net, loss_fn):
    """One inference call (no grad) or one SGD training step of `net`, bf16 autocast."""
    if kind == "training":
        return sgd_train_step(net, loss_fn, x, target)

    def infer():
        with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
            net(x)

    return infer


for kind in kinds:
    for side, (net, loss_fn) in nets.items():
        net.train(kind == "training")
        eager = rate(make_step(kind, net, loss_fn))
        step = make_step(kind, torch.compile(net, mode=mode), loss_fn)
        t0 = time.perf_counter()
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        fast = [round(rate(step)) for _ in range(3)]
        print(f"{side} {kind}: eager {eager:.0f} img/s; torch.compile({mode}) first three calls "
              f"{first:.0f} s, then {fast} img/s", flush=True)  # fmt: skip
