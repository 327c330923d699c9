"""What each launch of a ResNet-50 training step costs the host, in parts. Per kernel, over
STEPS steps after warm-up (backward on the calling thread): the calls, the host microseconds
inside SlotLaunch.__call__, of them the microseconds inside the compiled kernel's C entry
point (Triton's argument parsing and the driver's cuLaunchKernelEx), and the CUtensorMaps
encoded (make_tensordesc_arg, a driver call each: the maps are kept per address, so a step
whose tensors sit where they sat before encodes none). Beside them, what a PyTorch op's
launch costs this host (a small in-place add). Results per step.
    PYTHONPATH=src python benchmarks/probes/host_launch_parts.py OUT.json [STEPS]
"""

import collections
import gc
import json
import sys
import time

import torch
from host_timing import host_us, resnet50_pair, sgd_train_step

import rtdnn
from rtdnn.kernels import launch as L

steps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
model, converted, x, target = resnet50_pair(128)
step = sgd_train_step(converted.train(), rtdnn.nn.CrossEntropyLoss(), x, target)
with torch.autograd.set_multithreading_enabled(False):
    for _ in range(5):
        step()
torch.cuda.synchronize()

parts: dict = collections.defaultdict(
    lambda: {"calls": 0, "slot_us": 0.0, "c_launch_us": 0.0, "encodes": 0, "encode_us": 0.0}
)
OUTSIDE = "(outside SlotLaunch)"
current: list = [None]  # the entry of the kernel whose SlotLaunch.__call__ runs
slot_call, encode = L.SlotLaunch.__call__, L.make_tensordesc_arg


def timed_call(self, *values):
    entry = current[0] = parts[self.fn.__name__]
    t0 = time.perf_counter()
    slot_call(self, *values)
    entry["slot_us"] += (time.perf_counter() - t0) * 1e6
    entry["calls"] += 1
    current[0] = None


def timed_encode(desc, meta):
    t0 = time.perf_counter()
    out = encode(desc, meta)
    entry = current[0] or parts[OUTSIDE]
    entry["encodes"] += 1
    entry["encode_us"] += (time.perf_counter() - t0) * 1e6
    return out


def timed_entry(c_launch):
    def run(*args):
        t0 = time.perf_counter()
        c_launch(*args)
        (current[0] or parts[OUTSIDE])["c_launch_us"] += (time.perf_counter() - t0) * 1e6

    return run


compiled = [k for k in gc.get_objects() if isinstance(k, L._Compiled)]
for k in compiled:
    if k.c_launch is not None:
        k.c_launch = timed_entry(k.c_launch)
L.SlotLaunch.__call__, L.make_tensordesc_arg = timed_call, timed_encode
torch.cuda.synchronize()
with torch.autograd.set_multithreading_enabled(False):
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    step_ms = (time.perf_counter() - t0) * 1e3 / steps
torch.cuda.synchronize()
L.SlotLaunch.__call__, L.make_tensordesc_arg = slot_call, encode

small = torch.zeros(256, device="cuda")
torch_add_us = host_us(lambda: small.add_(1.0))[0]
per_step = {
    name: {key: round(value / steps, 1) for key, value in entry.items()}
    for name, entry in sorted(parts.items(), key=lambda kv: -kv[1]["slot_us"])
}
totals = {key: round(sum(e[key] for e in per_step.values()), 1) for key in parts[OUTSIDE]}
report = {
    "step_host_ms": round(step_ms, 2),
    "per_step_totals": totals,
    "tensor_maps_kept": sum(len(k.tensor_maps) for k in compiled),
    "compiled_kernels": len(compiled),
    "torch_in_place_add_host_us": round(torch_add_us, 2),
    "per_kernel_per_step": per_step,
}
print(json.dumps({k: v for k, v in report.items() if k != "per_kernel_per_step"}, indent=1))
for name, e in list(per_step.items())[:20]:
    print(
        f"{name:40s} {e['calls']:6.0f} calls {e['slot_us']:8.1f} us, C entry "
        f"{e['c_launch_us']:8.1f} us, {e['encodes']:5.1f} maps {e['encode_us']:7.1f} us"
    )
with open(sys.argv[1], "w") as f:
    json.dump(report, f, indent=1)
