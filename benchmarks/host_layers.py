"""Where a ResNet-50 training step's host time goes, by removing layers of it: the step as it
runs, the step with each Triton launch prepared but not issued (kernels do not run: timing
only), and the step with the launches removed altogether; beside PyTorch's step. Rounds
alternate between the variants, since the host's speed drifts; the minimum per variant is kept.
A Python profile of the launch-free step shows where the rest goes.
    PYTHONPATH=src python benchmarks/host_layers.py OUT_DIR
"""

import cProfile
import json
import os
import pstats
import sys
import time

import torch

import rtdnn
from rtdnn.bench.model import build
from rtdnn.kernels import launch as L

out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
torch.backends.cudnn.benchmark = True
torch.manual_seed(0)
model, size = build("resnet50")
model = model.cuda().to(memory_format=torch.channels_last)
converted, _ = rtdnn.convert(model, fuse=True)
x = torch.randn(128, 3, size, size, device="cuda").to(memory_format=torch.channels_last)
target = torch.randint(0, 10, (128,), device="cuda")


def train_step(net, loss_fn):
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(net(x).float(), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


torch_step = train_step(model.train(), torch.nn.CrossEntropyLoss())
ours = train_step(converted.train(), rtdnn.nn.CrossEntropyLoss())
real_call = L.SlotLaunch.__call__
real_c_launch = {}


def prepared_only(self, *values):
    """The fast path without the C launch: fill the slots and look up the compiled kernel."""
    args = self.template.copy()
    device = torch._C._cuda_getDevice()
    sig = [device]
    for i, v in zip(self.index, values, strict=True):
        kind = type(v)
        if kind is float:
            sig.append(float)
            args[i] = v
        elif isinstance(v, torch.Tensor):
            ptr = v.data_ptr()
            sig.append((v.dtype, (ptr & 15) == 0))
            args[i] = ptr
        elif kind is int:
            sig.append(((v & 15) == 0, v == 1, -(2**31) <= v < 2**31))
            args[i] = v
        else:
            sig.append(kind)
            args[i] = v
    compiled = self.compiled.get(tuple(sig))
    L._launch_hooks_installed()
    torch._C._cuda_getCurrentRawStream(device)
    return compiled


def no_launch(self, *values):
    return None


variants = {"as run": real_call, "launch prepared, not issued": prepared_only,
            "no launch": no_launch}  # fmt: skip


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
    for name, fn in variants.items():
        L.SlotLaunch.__call__ = fn
        results[name].append(host_ms(ours))
    L.SlotLaunch.__call__ = real_call
summary = {k: {"min_ms": round(min(v), 2), "rounds": [round(t, 2) for t in v]}
           for k, v in results.items()}  # fmt: skip
print(json.dumps(summary, indent=1), flush=True)

L.SlotLaunch.__call__ = no_launch
pr = cProfile.Profile()
for _ in range(5):
    torch.cuda.synchronize()
    pr.enable()
    ours()
    pr.disable()
L.SlotLaunch.__call__ = real_call
torch.cuda.synchronize()
with open(os.path.join(out_dir, "no_launch_profile.txt"), "w") as f:
    st = pstats.Stats(pr, stream=f)
    st.sort_stats("tottime").print_stats(60)
    st.sort_stats("cumulative").print_stats(90)
with open(os.path.join(out_dir, "host_layers.json"), "w") as f:
    json.dump(summary, f, indent=1)
