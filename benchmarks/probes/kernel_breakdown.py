"""Where a suite's time goes, kernel by kernel: each layer and direction through rtdnn (tiles
as tuned or as the heuristic gives) under torch.profiler, the mean device time of every
kernel it launched per call, beside cuDNN's kernels for the same call.

    PYTHONPATH=src python benchmarks/probes/kernel_breakdown.py SUITE [ALGO] [REPS]
"""

import sys
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import rtdnn
from rtdnn.bench.conv import DTYPES, _conv_args, _layer_tensors, load_suite

CONV = {2: F.conv2d, 3: F.conv3d, 1: F.conv1d}


def kernel_times(fn, reps: int) -> dict[str, float]:
    """Mean device microseconds per call of each kernel `fn` launches."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    total: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total[event.name[:60]] += event.device_time / reps
    return dict(total)


def breakdown(layer: dict, algo: str, reps: int) -> None:
    """Print one layer's kernels, every direction."""
    x, w = _layer_tensors(layer, DTYPES["bf16"], None)
    args = _conv_args(layer)
    y = rtdnn.conv_forward(x, w, algo=algo, **args)
    calls = {
        "forward": (
            lambda: rtdnn.conv_forward(x, w, algo=algo, **args),
            lambda: CONV[x.dim() - 2](x, w, **args),
        ),
        "backward_data": (
            lambda: rtdnn.conv_backward_data(y, w, x.shape, algo=algo, **args),
            lambda: torch.ops.aten.convolution_backward(
                y, x, w, None, args["stride"], args["padding"], args["dilation"], False,
                [0] * (x.dim() - 2), args["groups"], [True, False, False],
            ),
        ),
        "backward_filter": (
            lambda: rtdnn.conv_backward_filter(x, y, w.shape, algo=algo, **args),
            lambda: torch.ops.aten.convolution_backward(
                y, x, w, None, args["stride"], args["padding"], args["dilation"], False,
                [0] * (x.dim() - 2), args["groups"], [False, True, False],
            ),
        ),
    }  # fmt: skip
    for direction, (ours, theirs) in calls.items():
        mine, ref = kernel_times(ours, reps), kernel_times(theirs, reps)
        print(
            f"{layer['name']:24s} {direction:15s} rtdnn {sum(mine.values()):7.1f} us "
            f"cuDNN {sum(ref.values()):7.1f} us"
        )
        for name, us in sorted(mine.items(), key=lambda kv: -kv[1]):
            print(f"    {us:7.1f}  {name}")
        for name, us in sorted(ref.items(), key=lambda kv: -kv[1]):
            print(f"    {us:7.1f}  cuDNN: {name}")


def main() -> None:
    suite = sys.argv[1]
    algo = sys.argv[2] if len(sys.argv) > 2 else "DIRECT"
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    for layer in load_suite(suite):
        breakdown(layer, algo, reps)


if __name__ == "__main__":
    main()
