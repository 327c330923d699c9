"""Where a CTC forward + backward's time goes: the first `rtdnn bench --op ctc` case (or the
case index given) under torch.profiler, each kernel's device time per call, rtdnn beside
torch.

    PYTHONPATH=src python benchmarks/probes/ctc_breakdown.py [CASE_INDEX]
"""

import sys

import torch
import torch.nn.functional as F

import rtdnn
from rtdnn.bench.ctc import cases, make_inputs

sys.path.insert(0, "benchmarks/probes")
from kernel_breakdown import kernel_times  # noqa: E402


def main() -> None:
    case = cases()[int(sys.argv[1]) if len(sys.argv) > 1 else 0]
    inputs = make_inputs(case, torch.Generator().manual_seed(0))
    lp = inputs.log_probs
    args = (inputs.targets, inputs.input_lengths, inputs.target_lengths)

    def ours():
        lp.grad = None
        rtdnn.ctc_loss(lp, *args).backward()

    def theirs():
        lp.grad = None
        F.ctc_loss(lp, *args).backward()

    for name, fn in (("rtdnn", ours), ("torch", theirs)):
        times = kernel_times(fn, 20)
        print(f"{case.name} forward+backward, {name}: {sum(times.values()):.1f} us of kernels")
        for kernel, us in sorted(times.items(), key=lambda kv: -kv[1]):
            print(f"    {us:8.1f}  {kernel}")


if __name__ == "__main__":
    main()
