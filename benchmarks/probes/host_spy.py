"""A converted model's training step (ResNet-50 unless MODEL is given) in a loop for SECONDS
seconds, each step issued from a drained GPU, for a sampling profiler to watch from outside
(py-spy, which costs the profiled Python nothing, unlike cProfile):
    py-spy record --format raw --threads --idle -o OUT.txt -- \
        python benchmarks/probes/host_spy.py [SECONDS] [MODEL]
Prints the host milliseconds per step of the loop. host_spy_report.py reads OUT.txt.
"""

import sys
import time

import torch
from host_timing import resnet50_pair, sgd_train_step

import rtdnn

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
model_name = sys.argv[2] if len(sys.argv) > 2 else "resnet50"
_, converted, x, target = resnet50_pair(128, model_name)
step = sgd_train_step(converted.train(), rtdnn.nn.CrossEntropyLoss(), x, target)
for _ in range(5):
    step()
torch.cuda.synchronize()


def timed_loop() -> list[float]:
    """The loop the profiler watches: one step at a time from a drained GPU."""
    host = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        host.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return host


host = sorted(timed_loop())
print(f"{model_name}: {len(host)} steps, host ms per step min {host[0]:.1f} "
      f"median {host[len(host) // 2]:.1f}", flush=True)  # fmt: skip
