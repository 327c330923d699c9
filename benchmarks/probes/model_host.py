"""Where a training step's wall time goes (ResNet-50 unless MODEL is given): host time per
step (one step issued with the GPU drained, so the launch queue never fills), wall time per
step, GPU idle time, allocator traffic, a Python profile of the rtdnn step and a profiler
trace of one step of each model.
    PYTHONPATH=src python benchmarks/probes/model_host.py OUT_DIR [BATCH] [MODEL]
TRACES=0 leaves the profiler traces out (they are tens of MB for the mobile networks).
"""

import gc
import json
import os
import sys
import time

import torch
from host_timing import profile_steps, resnet50_pair, sgd_train_step
from torch.profiler import ProfilerActivity, profile

import rtdnn

out_dir = sys.argv[1]
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 128
os.makedirs(out_dir, exist_ok=True)
model_name = sys.argv[3] if len(sys.argv) > 3 else "resnet50"
traces = os.environ.get("TRACES", "1") != "0"
model, converted, x, target = resnet50_pair(batch, model_name)


steps = {
    "pytorch": sgd_train_step(model.train(), torch.nn.CrossEntropyLoss(), x, target),
    "rtdnn": sgd_train_step(converted.train(), rtdnn.nn.CrossEntropyLoss(), x, target),
}
results = {}
for name, step in steps.items():
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    stats0 = torch.cuda.memory_stats()
    gc_ms = [0.0, 0.0, 0.0]
    gc_start = [0.0]

    def gc_timer(phase, info, gc_ms=gc_ms, gc_start=gc_start):
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            gc_ms[info["generation"]] += (time.perf_counter() - gc_start[0]) * 1e3

    gc.callbacks.append(gc_timer)
    host = []
    for _ in range(10):  # one step at a time from a drained GPU: the host's own cost
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        host.append(time.perf_counter() - t0)
    gc.callbacks.remove(gc_timer)
    with torch.autograd.set_multithreading_enabled(False):  # backward on the calling thread
        single = []
        for _ in range(10):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            single.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / 20
    stats1 = torch.cuda.memory_stats()
    results[name] = {
        "host_ms": min(host) * 1e3,
        "host_ms_all": sorted(round(h * 1e3, 1) for h in host),
        "gc_ms_per_step_by_generation": [round(g / 10, 2) for g in gc_ms],
        "host_ms_backward_on_calling_thread": min(single) * 1e3,
        "wall_ms": wall * 1e3,
        "device_allocs_per_step": (stats1["num_device_alloc"] - stats0["num_device_alloc"]) / 30,
        "device_frees_per_step": (stats1["num_device_free"] - stats0["num_device_free"]) / 30,
        "alloc_retries": stats1["num_alloc_retries"] - stats0["num_alloc_retries"],
        "allocations_per_step": (
            stats1["allocation.all.allocated"] - stats0["allocation.all.allocated"]
        )
        / 30,
    }
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    if traces:
        prof.export_chrome_trace(os.path.join(out_dir, f"trace_{name}.json"))
    with open(os.path.join(out_dir, f"cpu_ops_{name}.txt"), "w") as f:
        f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    results[name]["kernels_per_step"] = len(kernels)
    results[name]["kernel_ms"] = sum(e.device_time_total for e in kernels) / 1e3
    print(name, json.dumps(results[name]), flush=True)


class PythonWork(torch.autograd.Function):
    """The same Python work in forward and backward, to compare the two threads' speed."""

    @staticmethod
    def forward(ctx, t):
        for _ in range(20):
            sum(range(1000))
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g):
        t0 = time.perf_counter()
        for _ in range(20):
            sum(range(1000))
        results["python_us_in_backward"] = (time.perf_counter() - t0) / 20 * 1e6
        return g


leaf = torch.ones(4, device="cuda", requires_grad=True)
for _ in range(5):
    t0 = time.perf_counter()
    y = PythonWork.apply(leaf)
    results["python_us_in_forward"] = (time.perf_counter() - t0) / 20 * 1e6
    y.sum().backward()
print({k: v for k, v in results.items() if k.startswith("python")}, flush=True)

# Back-to-back steps (no synchronization between them), as in training: the host's time per
# step there, and a trace of three of them (launch calls that block show a full launch queue).
for name, step in steps.items():
    torch.cuda.synchronize()
    marks = [time.perf_counter()]
    for _ in range(20):
        step()
        marks.append(time.perf_counter())
    torch.cuda.synchronize()
    results[name]["loop_host_ms_per_step"] = [
        round((b - a) * 1e3, 1) for a, b in zip(marks, marks[1:], strict=False)
    ]
    print(name, "back to back, host ms per step:", results[name]["loop_host_ms_per_step"])
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    if traces:
        prof.export_chrome_trace(os.path.join(out_dir, f"trace_{name}_loop.json"))

profile_steps(steps["rtdnn"], os.path.join(out_dir, "rtdnn_step_profile.txt"))
with open(os.path.join(out_dir, "model_host.json"), "w") as f:
    json.dump(results, f, indent=1)
