"""Compile IMPLICIT_GEMM's TMA kernels (kernels/conv_tma.py), every direction (backward-filter
also split, as IMPLICIT_GEMM_SPLIT_K), for
sm_90 without a GPU (a CPU-only check; see aot_compile.py) on ResNet-style layers in
bfloat16, float16 and TF32, with
every TMA tile candidate, and report what the compiler made of it: registers, spills, the
scratch the descriptors take, whether the operands arrive by TMA copies
(ttng.async_tma_copy_global_to_local) and the products are warp-group MMAs
(ttng.warp_group_dot), and how many layout conversions sit in the kernel. Results of the
launches are meaningless: only compilation is checked.

    PYTHONPATH=src python benchmarks/aot_compile_tma.py
    (TRITON_INTERPRET must be unset)
"""

import dataclasses
import os
import sys

from sm90_stub import accept_cpu_tensors, activate, compile_only  # noqa: E402

activate()

import torch  # noqa: E402

kernels: list = []
compile_only(kernels)

from rtdnn.algos import ALGORITHMS, ConvTensors  # noqa: E402
from rtdnn.algos import implicit_gemm as ig  # noqa: E402
from rtdnn.ops.conv import _problem_for_selection  # noqa: E402

accept_cpu_tensors()
os.environ[ig.TMA_ENV] = "1"
# No CUDA here: arrival counters on the CPU, and an H100's 132 multiprocessors for split-K.
ig.stream_counters = lambda device, n: torch.zeros(n, dtype=torch.int32)
ig.parallel_slots = lambda device: 2 * 132
torch.cuda.get_device_capability = lambda *a: (9, 0)

# (x shape, w shape, conv): ResNet-50's 3x3 and 1x1 layers at batch 2, a 5x5 dilated one.
LAYERS = [
    ((2, 64, 56, 56), (64, 64, 3, 3), dict(padding=1)),
    ((2, 256, 14, 14), (256, 256, 3, 3), dict(padding=1)),
    ((2, 512, 7, 7), (512, 512, 3, 3), dict(padding=1)),
    ((2, 256, 56, 56), (64, 256, 1, 1), dict()),
    ((2, 64, 20, 20), (96, 64, 5, 5), dict(padding=4, dilation=2)),
]
NUMBERS = ((torch.bfloat16, "fp32"), (torch.float16, "fp32"), (torch.float32, "tf32"))


def report(kernel) -> str:
    ir = kernel.asm["ttgir"]
    md = kernel.metadata
    return (
        f"regs {getattr(kernel, 'n_regs', '?')} spills {getattr(kernel, 'n_spills', '?')} "
        f"scratch {md.global_scratch_size} B, tma copies {ir.count('async_tma_copy_global')}, "
        f"wgmma {ir.count('warp_group_dot ')}, convert_layout {ir.count('convert_layout')}, "
        f"local_alloc {ir.count('local_alloc')}"
    )


def main() -> None:
    for xs, ws, conv in LAYERS:
        for dtype, math_mode in NUMBERS:
            x = torch.randn(xs).to(dtype).movedim(1, -1).contiguous().movedim(-1, 1)
            w = torch.randn(ws).to(dtype).movedim(1, -1).contiguous().movedim(-1, 1)
            c = dict(stride=1, padding=0, dilation=1, groups=1, mode="cross_correlation")
            for d, name in (
                ("forward", "IMPLICIT_GEMM"), ("backward_data", "IMPLICIT_GEMM"),
                ("backward_filter", "IMPLICIT_GEMM"), ("backward_filter", "IMPLICIT_GEMM_SPLIT_K"),
            ):  # fmt: skip
                algo = ALGORITHMS[name]
                p, scratch = _problem_for_selection(d, x, w, math=math_mode, **{**c, **conv})
                p = dataclasses.replace(p, device="cuda")
                workspace = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8)
                for tiles in algo.tile_candidates(p):
                    if not getattr(tiles, "tma", False):
                        continue
                    kernels.clear()
                    t = ConvTensors(scratch.x.clone(), scratch.w.clone(), scratch.y.clone(), None)
                    algo.prepare(p, tiles)(t, workspace, 1.0, 0.0)
                    shape = f"{tiles.block_m}x{tiles.block_n}x{tiles.block_k}"
                    label = f"{d} {name} {xs} {ws} {str(dtype)[6:]} {shape}"
                    print(f"{label} w{tiles.num_warps} s{tiles.num_stages}: {report(kernels[-1])}")


if __name__ == "__main__":
    sys.exit(main())
