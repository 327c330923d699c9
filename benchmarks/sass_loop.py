"""How many instructions a convolution kernel's main loop issues per step, without a GPU.

Compiles one problem's kernels for sm_90 (the stub driver of aot_compile.py), disassembles
each with the cuobjdump Triton ships, finds the largest loop that holds a matrix or FMA
instruction (the reduction loop) and prints its instruction count and most frequent opcodes.
A kernel bound by issue slots rather than by its tensor cores shows many integer
instructions per HGMMA here; this is how the index arithmetic of the implicit GEMM was found
and cut (BENCHMARKS.md, "integer work out of the main loop").

    PYTHONPATH=src python benchmarks/sass_loop.py DIRECTION ALGO X_SHAPE W_SHAPE [k=v ...]
    e.g. backward_filter IMPLICIT_GEMM_SPLIT_K 2,64,56,56 64,64,3,3 padding=1
    (TRITON_INTERPRET must be unset; channels-last; every tile candidate; dtype=fp16 or
    dtype=fp32 for another dtype than bf16)
"""

import collections
import dataclasses
import os
import re
import subprocess
import sys
import tempfile

from sm90_stub import accept_cpu_tensors, activate, compile_only  # noqa: E402

activate()

import torch  # noqa: E402
import triton  # noqa: E402

kernels: list = []
compile_only(kernels)

from rtdnn.algos import ALGORITHMS, ConvTensors, direct, geometry, implicit_gemm  # noqa: E402
from rtdnn.ops.conv import _problem_for_selection  # noqa: E402

accept_cpu_tensors()
# An H100's 132 multiprocessors for the split counts; arrival counters on the CPU.
for module in (implicit_gemm, direct, geometry):
    module.parallel_slots = lambda device: 2 * 132
implicit_gemm.stream_counters = lambda device, n: torch.zeros(n, dtype=torch.int32)
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)(.*)")


def resources(kernel) -> str:
    """Registers and spill stores per thread, from cuobjdump's resource usage."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True)
    regs = re.search(r"REG:(\d+)", usage.stdout)
    stack = re.search(r"STACK:(\d+)", usage.stdout)
    return f"{regs[1] if regs else '?'} registers, stack {stack[1] if stack else '?'} bytes"


def main_loop(kernel) -> list[str]:
    """Opcodes of the largest loop (a backward branch) holding an MMA or FFMA instruction."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([CUOBJDUMP, "-sass", f.name], capture_output=True, text=True)
    ops = [(int(m[1], 16), m[2], m[3]) for m in map(INSTRUCTION.search, sass.stdout.split("\n"))
           if m]  # fmt: skip
    best: list[str] = []
    for address, op, rest in ops:
        target = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if target and int(target[1], 16) < address:
            body = [o for a, o, _ in ops if int(target[1], 16) <= a <= address]
            if any("MMA" in o or o.startswith("FFMA") for o in body) and len(body) > len(best):
                best = body
    return best


def main() -> None:
    direction, name, xs, ws, *conv_args = sys.argv[1:]
    shape = lambda s: tuple(int(v) for v in s.split(","))  # noqa: E731
    conv = dict(stride=1, padding=0, dilation=1, groups=1, mode="cross_correlation")
    dtype = torch.bfloat16
    for arg in conv_args:
        key, value = arg.split("=")
        if key == "dtype":
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[value]
        else:
            conv[key] = value if key == "mode" else int(value)
    channels_last = lambda t: t.movedim(1, -1).contiguous().movedim(-1, 1)  # noqa: E731
    x = channels_last(torch.randn(shape(xs)).to(dtype))
    w = channels_last(torch.randn(shape(ws)).to(dtype))
    algo = ALGORITHMS[name]
    p, scratch = _problem_for_selection(direction, x, w, math=None, **conv)
    p = dataclasses.replace(p, device="cuda")
    workspace = torch.empty(max(algo.workspace_bytes(p), 16), dtype=torch.uint8)
    for tiles in algo.tile_candidates(p):
        kernels.clear()
        t = ConvTensors(scratch.x.clone(), scratch.w.clone(), scratch.y.clone(), None)
        algo.prepare(p, tiles)(t, workspace, 1.0, 0.0)
        for kernel in kernels:
            body = main_loop(kernel)
            if body:
                # Loads keep their width (LDG.E.128 against LDG.E.U16): a vector load split
                # into scalar ones shows there.
                counts = collections.Counter(
                    op if op.startswith(("LDG", "STG", "LDS")) else op.split(".")[0] for op in body
                )
                top = " ".join(f"{op}:{n}" for op, n in counts.most_common(12))
                print(f"{kernel.name} {tiles}: {len(body)} per step ({top}); {resources(kernel)}")


if __name__ == "__main__":
    main()
