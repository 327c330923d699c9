"""Compile every normalization kernel variant for sm_90 without a GPU (a CPU-only check).

Triton's interpreter accepts code the compiler rejects (it found a NamedTuple-in-loop bug and an
argument name that clashes with Triton's binder). This script replaces the CUDA driver by a
stub that reports an sm_90 target, runs the normalization ops on CPU tensors with the GPU tile
policy, and instead of launching compiles each kernel (Triton -> PTX -> cubin with the bundled
ptxas), printing registers and spills per variant.

    PYTHONPATH=src python benchmarks/aot_compile_norm.py      (TRITON_INTERPRET must be unset)

Relies on Triton 3.6 internals (CudaDriver, JITFunction.warmup); a development aid only.
"""

import os
import re
import subprocess
import tempfile

from sm90_stub import activate  # noqa: E402

activate()

import torch  # noqa: E402
import triton  # noqa: E402

import rtdnn  # noqa: E402
import rtdnn.ops._norm as checks  # noqa: E402
from rtdnn.algos import norm as engine  # noqa: E402
from rtdnn.kernels import launch  # noqa: E402

checks.check_runnable = lambda device: None
engine.policy = lambda device: engine.GPU_POLICY
engine.parallel_slots = lambda kind: 2 * 132
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
seen: set = set()


def _compile(self, *values):
    args = self.template.copy()
    for i, v in zip(self.index, values, strict=True):
        args[i] = v
    args = [a.dtype if isinstance(a, torch.Tensor) else a for a in args]
    kernel = self.fn.warmup(*args, grid=self.grid, **self.options)
    if kernel.hash in seen:
        return
    seen.add(kernel.hash)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(kernel.asm["ptx"])
        f.flush()
        log = subprocess.run(
            [PTXAS, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True, text=True
        ).stderr
    regs = re.findall(r"Used (\d+) registers", log)
    spills = re.findall(r"(\d+) bytes spill stores", log)
    print(f"{self.fn.__name__:28s} grid={self.grid} warps={self.options['num_warps']} "
          f"regs={regs} spill={spills}")  # fmt: skip


launch.SlotLaunch.__call__ = _compile


def _cl(t):
    return t.movedim(1, -1).contiguous().movedim(-1, 1)


def main() -> None:
    bf = torch.bfloat16
    for shape in [(64, 256, 56, 56), (64, 2048, 7, 7)]:
        x, c = _cl(torch.empty(shape, dtype=bf)), shape[1]
        w, b, rm, rv = torch.ones(c), torch.zeros(c), torch.zeros(c), torch.ones(c)
        _, m, s = rtdnn.batch_norm_forward_training(x, w, b, running_mean=rm, running_var=rv)
        rtdnn.batch_norm_forward_inference(x, w, b, rm, rv)
        rtdnn.batch_norm_backward(x, x, m, s, w, b)
        rtdnn.batch_norm_forward_training(x, w, b, z=x, activation="relu")
        rtdnn.batch_norm_backward(x, x, m, s, w, b, z=x, activation="relu")
    x = torch.empty(8, 64, 28, 28, dtype=bf)
    _, m, s = rtdnn.batch_norm_forward_training(x, torch.ones(64))
    rtdnn.batch_norm_backward(x, x, m, s, torch.ones(64))
    rtdnn.batch_norm_forward_training(
        _cl(torch.empty(64, 16, 7, 7, dtype=bf)), mode="per_activation"
    )
    for rows, d in [(32768, 768), (32768, 4096), (32768, 8192), (4, 100000)]:
        x, w = torch.empty(rows, d, dtype=bf), torch.empty(d, dtype=bf)
        _, m, s = rtdnn.layer_norm_forward(x, d, w, w)
        rtdnn.layer_norm_backward(x, x, d, m, s, w)
        _, s = rtdnn.rms_norm_forward(x, d, w)
        rtdnn.rms_norm_backward(x, x, d, s, w)
    for x in (torch.empty(8, 64, 16, 16, dtype=bf), _cl(torch.empty(8, 64, 16, 16, dtype=bf))):
        _, m, s = rtdnn.group_norm_forward(x, 8, torch.ones(64), torch.zeros(64))
        rtdnn.group_norm_backward(x, x, 8, m, s, torch.ones(64))
        _, m, s = rtdnn.instance_norm_forward(x, torch.ones(64))
        rtdnn.instance_norm_backward(x, x, m, s, torch.ones(64))
    print(f"compiled {len(seen)} kernel variants for sm_90")


if __name__ == "__main__":
    main()
