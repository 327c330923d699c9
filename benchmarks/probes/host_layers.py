"""Where a ResNet-50 training step's host time goes, by removing layers of it: the step as it
runs, the step with each Triton launch prepared but not issued (kernels do not run: timing
only), and the step with the launches removed altogether; beside PyTorch's step; and the
step as it runs with autograd's backward on the calling thread instead of its device thread. Rounds
alternate between the variants, since the host's speed drifts; the minimum per variant is kept.
A Python profile of the launch-free step shows where the rest goes.
    PYTHONPATH=src python benchmarks/probes/host_layers.py OUT_DIR
"""

import gc
import json
import os
import sys
import time

import torch
from host_timing import profile_steps, resnet50_pair, sgd_train_step

import rtdnn
from rtdnn.kernels import launch as L

out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
model, converted, x, target = resnet50_pair(128)


torch_step = sgd_train_step(model.train(), torch.nn.CrossEntropyLoss(), x, target)
ours = sgd_train_step(converted.train(), rtdnn.nn.CrossEntropyLoss(), x, target)
real_call = L.SlotLaunch.__call__


_c_launchers: dict = {}


def set_issue(issue: bool) -> None:
    """Whether prepared launches reach Triton's C launcher or stop just before it. (Kernels
    without a C launcher, which need scratch memory, keep Triton's own path.)"""
    if not _c_launchers:  # every compiled kernel, once they all exist (after warm-up)
        _c_launchers.update((k, k.c_launch) for k in gc.get_objects() if isinstance(k, L._Compiled))
    for k, c_launch in _c_launchers.items():
        if c_launch is not None:
            k.c_launch = c_launch if issue else _not_issued


def _not_issued(*args):
    return None


def no_launch(self, *values):
    return None


# variant -> (SlotLaunch.__call__, whether the C launcher is called, backward on its own thread)
variants = {
    "as run": (real_call, True, True),
    "as run, backward on the calling thread": (real_call, True, False),
    "launch prepared, not issued": (real_call, False, True),
    "no launch": (no_launch, True, True),
}


def host_ms(step, n=10):
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t0)
    torch.cuda.synchronize()
    return best * 1e3


for _ in range(5):
    torch_step()
    ours()
results: dict[str, list[float]] = {k: [] for k in ["pytorch", *variants]}
for _ in range(5):
    results["pytorch"].append(host_ms(torch_step))
    for name, (fn, issue, threaded) in variants.items():
        L.SlotLaunch.__call__ = fn
        set_issue(issue)
        with torch.autograd.set_multithreading_enabled(threaded):
            results[name].append(host_ms(ours))
    L.SlotLaunch.__call__ = real_call
    set_issue(True)
summary = {k: {"min_ms": round(min(v), 2), "rounds": [round(t, 2) for t in v]}
           for k, v in results.items()}  # fmt: skip
print(json.dumps(summary, indent=1), flush=True)

L.SlotLaunch.__call__ = no_launch
profile_steps(ours, os.path.join(out_dir, "no_launch_profile.txt"))
L.SlotLaunch.__call__ = real_call
with open(os.path.join(out_dir, "host_layers.json"), "w") as f:
    json.dump(summary, f, indent=1)
