"""What a ResNet-50 training step launches and what each launch costs the host: per kernel,
the calls of SlotLaunch.__call__ in one step (backward on the calling thread), how many took
Triton's own path (the first call of a signature, kernels with scratch memory), and the host
microseconds spent inside those calls; and the calls of Triton's JITFunction.run outside
SlotLaunch (kernels launched some other way).
    PYTHONPATH=src python benchmarks/probes/host_launch_counts.py OUT.json
"""

import collections
import json
import sys
import time

import torch
from host_timing import resnet50_pair, sgd_train_step
from triton.runtime.jit import JITFunction

import rtdnn
from rtdnn.kernels import launch as L

model, converted, x, target = resnet50_pair(128)
step = sgd_train_step(converted.train(), rtdnn.nn.CrossEntropyLoss(), x, target)
for _ in range(5):
    step()
torch.cuda.synchronize()

calls: dict[str, list] = collections.defaultdict(lambda: [0, 0, 0.0])  # calls, slow, host us
inside = [False]
slot_call, slow_path, jit_run = L.SlotLaunch.__call__, L.SlotLaunch._slow_path, JITFunction.run
other: collections.Counter = collections.Counter()


def counted_call(self, *values):
    entry = calls[self.fn.__name__]
    inside[0] = True
    t0 = time.perf_counter()
    slot_call(self, *values)
    entry[2] += (time.perf_counter() - t0) * 1e6
    entry[0] += 1
    inside[0] = False


def counted_slow(self, key, compiled, values):
    calls[self.fn.__name__][1] += 1
    return slow_path(self, key, compiled, values)


def counted_run(self, *args, **kwargs):
    if not inside[0]:
        other[self.__name__] += 1
    return jit_run(self, *args, **kwargs)


L.SlotLaunch.__call__, L.SlotLaunch._slow_path, JITFunction.run = (
    counted_call, counted_slow, counted_run
)  # fmt: skip
torch.cuda.synchronize()
with torch.autograd.set_multithreading_enabled(False):
    t0 = time.perf_counter()
    step()
    total = (time.perf_counter() - t0) * 1e3
torch.cuda.synchronize()
rows = sorted(calls.items(), key=lambda kv: -kv[1][2])
report = {
    "step_host_ms": round(total, 2),
    "slot_launches": sum(v[0] for v in calls.values()),
    "slow_path_launches": sum(v[1] for v in calls.values()),
    "slot_launch_host_ms": round(sum(v[2] for v in calls.values()) / 1e3, 2),
    "per_kernel": {k: {"calls": v[0], "slow": v[1], "host_us": round(v[2], 1)} for k, v in rows},
    "jit_runs_outside_slot_launch": dict(other),
}
print(json.dumps({k: v for k, v in report.items() if k != "per_kernel"}, indent=1))
for k, v in list(report["per_kernel"].items())[:25]:
    print(f"{k:50s} {v['calls']:5d} {v['slow']:4d} {v['host_us']:9.1f} us")
with open(sys.argv[1], "w") as f:
    json.dump(report, f, indent=1)
