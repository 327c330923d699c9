"""Compile WINOGRAD_NONFUSED's kernels for sm_90 without a GPU (a CPU-only check; see
aot_compile.py) and report how each GEMM fills shared memory: Hopper's TF32 products
(wgmma .tf32, which 3xTF32 and TF32 use) read both operands with the reduced dimension
contiguous; an operand stored otherwise is copied 4 bytes at a time (cp.async.ca ... 4)
instead of 16 (cp.async.cg ... 16). Every direction, strict float32 and TF32, channels-last,
each tile candidate; every direction on an image of one tile; then the FMA products on an
RGB stem (3 reduced or written channels): WINOGRAD (fused) in forward and backward-data,
WINOGRAD_NONFUSED's weight gradient, each FMA tile candidate's registers and spills (ptxas).
Results are meaningless: only compilation is checked.

    PYTHONPATH=src python benchmarks/aot_compile_winograd.py
    (TRITON_INTERPRET must be unset)
"""

import collections
import dataclasses
import re

from sm90_stub import accept_cpu_tensors, activate, compile_only, ptxas_log  # noqa: E402

activate()

import torch  # noqa: E402

kernels: list = []
compiled = compile_only(kernels)

from rtdnn.algos import ALGORITHMS, ConvTensors, winograd  # noqa: E402
from rtdnn.ops.conv import _problem_for_selection  # noqa: E402

accept_cpu_tensors()
winograd.parallel_slots = lambda device: 2 * 132  # an H100's multiprocessors


#: The instructions counted: global-to-shared copies, global loads, tensor-core products.
OPCODE = re.compile(
    r"^\s*(?:@%p\d+\s+)?((?:cp\.async\.c[ag]|ld\.global|wgmma\.mma_async|mma\.sync)[\w.:]*)",
    re.M,
)


def copies(ptx: str) -> str:
    """How a kernel's PTX fills shared memory and multiplies: each counted opcode's count
    (cp.async.ca: 4-byte copies; cp.async.cg: 16-byte ones)."""
    ops = collections.Counter(m.group(1) for m in OPCODE.finditer(ptx))
    return ", ".join(f"{k}: {v}" for k, v in sorted(ops.items()))


def main() -> None:
    algo = ALGORITHMS["WINOGRAD_NONFUSED"]
    x = torch.randn(8, 64, 28, 28).movedim(1, -1).contiguous().movedim(-1, 1)
    w = torch.randn(64, 64, 3, 3).movedim(1, -1).contiguous().movedim(-1, 1)
    conv = dict(stride=1, padding=1, dilation=1, groups=1, mode="cross_correlation")
    for math_mode in ("fp32", "tf32"):
        for d in ("forward", "backward_data", "backward_filter"):
            p, scratch = _problem_for_selection(d, x, w, math=math_mode, **conv)
            p = dataclasses.replace(p, device="cuda")  # the GPU's tiles
            wsp = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8)
            for tiles in algo.tile_candidates(p):
                kernels.clear()
                run = algo.prepare(p, tiles)
                run(ConvTensors(scratch.x.clone(), scratch.w.clone(), scratch.y.clone()), wsp,
                    1.0, 0.0)  # fmt: skip
                for k in kernels:
                    if "brgemm" in k.name:
                        print(f"{math_mode} {d} F({tiles.out_tile}x{tiles.out_tile}) "
                              f"{tiles}: "
                              f"{copies(k.asm['ptx'])}")  # fmt: skip
    one_tile(conv)
    fused_few_channels(conv)
    print(f"compiled {len(compiled)} kernel variants for sm_90")


def one_tile(conv: dict) -> None:
    """Every direction's first candidates on an image of one tile (batch 1, 2x2): a tile
    count of 1 reaches the kernels as a compile-time constant, which once failed to compile
    (an int has no .to)."""
    algo = ALGORITHMS["WINOGRAD_NONFUSED"]
    x, w = torch.randn(1, 16, 2, 2), torch.randn(16, 16, 3, 3)
    for d in ("forward", "backward_data", "backward_filter"):
        p, scratch = _problem_for_selection(d, x, w, math="fp32", **conv)
        p = dataclasses.replace(p, device="cuda")
        wsp = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8)
        for tiles in algo.tile_candidates(p)[:2]:
            algo.prepare(p, tiles)(
                ConvTensors(scratch.x.clone(), scratch.w.clone(), scratch.y.clone()), wsp, 1.0, 0.0
            )
        print(f"one tile, {d}: compiled")


def fused_few_channels(conv: dict) -> None:
    """The FMA products where 3 channels a group are reduced or written: WINOGRAD (fused) in a
    stem's forward and backward-data and the backward-data of a layer of 3 filters,
    WINOGRAD_NONFUSED in a stem's weight gradient; each such tile candidate's registers and
    spill bytes."""
    cases = (("forward", 3, 64), ("backward_data", 64, 3), ("backward_data", 3, 64),
             ("backward_filter", 3, 64))  # fmt: skip
    for dtype, math_mode in ((torch.float32, "fp32"), (torch.bfloat16, None)):
        for d, c, k in cases:
            algo = ALGORITHMS["WINOGRAD_NONFUSED" if d == "backward_filter" else "WINOGRAD"]
            x = torch.randn(8, c, 32, 32, dtype=dtype).movedim(1, -1).contiguous().movedim(-1, 1)
            w = torch.randn(k, c, 3, 3, dtype=dtype).movedim(1, -1).contiguous().movedim(-1, 1)
            p, scratch = _problem_for_selection(d, x, w, math=math_mode, **conv)
            p = dataclasses.replace(p, device="cuda")
            wsp = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8)
            for tiles in [t for t in algo.tile_candidates(p) if t.fma or t.block_n < 16]:
                kernels.clear()
                algo.prepare(p, tiles)(
                    ConvTensors(scratch.x.clone(), scratch.w.clone(), scratch.y.clone()), wsp,
                    1.0, 0.0,
                )  # fmt: skip
                for kern in kernels:
                    if "fused" in kern.name or "fma" in kern.name:
                        log = ptxas_log(kern)
                        regs = re.findall(r"Used (\d+) registers", log)
                        spills = re.findall(r"(\d+) bytes spill stores", log)
                        print(f"{algo.name} {dtype} {d} {kern.name} {tiles}: registers {regs} "
                              f"spill stores {spills}")  # fmt: skip


if __name__ == "__main__":
    main()
