"""Host time of one convolution call on the Hopper path, on the CPU: the algorithm's prepared
runner for a ResNet-50 layer (bf16, batch 2, channels-last), with the GPU parts stood in for
(the Hopper scope check, the device's multiprocessors, the current device and stream) and
each compiled kernel replaced by a launcher that does nothing. What is timed is rtdnn's
Python from the runner to Triton's C launcher: descriptors, the launch's key, its arguments.
Prints microseconds a call, the minimum of several rounds, for the layers named.

    PYTHONPATH=src python benchmarks/probes/host_hopper_cpu.py
"""

import functools
import os
import timeit

os.environ.setdefault("TRITON_INTERPRET", "1")  # CPU tensors; nothing is interpreted below

import torch  # noqa: E402
from gpu_road_cpu import slot_launches_on_the_cpu  # noqa: E402

from rtdnn.algos import ALGORITHMS, ConvTensors  # noqa: E402
from rtdnn.algos import implicit_gemm as ig  # noqa: E402
from rtdnn.ops.conv import _problem_for_selection  # noqa: E402


def stand_in_for_the_gpu() -> None:
    ig.hopper_unsupported = lambda p: None
    ig.multiprocessor_count = lambda device: 132
    torch.cuda.current_device = lambda: 0
    slot_launches_on_the_cpu()


# (name, direction, x shape, w shape, stride, padding)
LAYERS = [
    ("l1.0.conv2", "forward", (2, 64, 56, 56), (64, 64, 3, 3), 1, 1),
    ("l3.0.conv2", "forward", (2, 256, 28, 28), (256, 256, 3, 3), 2, 1),
    ("l3.0.conv2", "backward_data", (2, 256, 28, 28), (256, 256, 3, 3), 2, 1),
    ("l3.x.conv2", "backward_filter", (2, 256, 14, 14), (256, 256, 3, 3), 1, 1),
]


def main() -> None:
    stand_in_for_the_gpu()
    algo = ALGORITHMS["IMPLICIT_GEMM"]
    cl = torch.channels_last
    for name, direction, xs, ws, stride, pad in LAYERS:
        x = torch.randn(xs).to(torch.bfloat16).to(memory_format=cl)
        w = torch.randn(ws).to(torch.bfloat16).to(memory_format=cl)
        conv = dict(stride=stride, padding=pad, dilation=1, groups=1, mode="cross_correlation")
        p, _ = _problem_for_selection(direction, x, w, math=None, **conv)
        tiles = ig.hopper_candidates(p, 4)[0]
        run = algo.prepare(p, tiles)
        y = torch.empty(p.y.shape, dtype=torch.bfloat16).to(memory_format=cl)
        t = ConvTensors(x, w, y)
        workspace = torch.empty(max(1, algo.workspace_bytes(p)), dtype=torch.uint8)
        run(t, workspace, 1.0, 0.0)
        calls = 5000
        call = functools.partial(run, t, workspace, 1.0, 0.0)
        best = min(timeit.repeat(call, number=calls, repeat=5))
        print(f"{name:12s} {direction:16s} {best / calls * 1e6:6.2f} us a call  {tiles}")


if __name__ == "__main__":
    main()
