"""Compile the attention forward for sm_90 without a GPU and report what the compiler made of
each tile variant: registers, spills, shared memory, whether ptxas serialized the warp-group
MMAs, and whether the MMAs read K and V straight from shared memory (TMA) or via registers.

    PYTHONPATH=src:benchmarks python benchmarks/probes/attention_forward_compile.py [quick]

(TRITON_INTERPRET must be unset.) Relies on Triton 3.6 internals; a development aid only.
"""

import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from sm90_stub import accept_cpu_tensors, activate  # noqa: E402

activate()

import torch  # noqa: E402
import triton  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from rtdnn.ops import attention as A  # noqa: E402

accept_cpu_tensors()
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
SMEM_LIMIT = 232448  # bytes of shared memory per block on an H100
kernels: list = []
_run = JITFunction.run


def _compile_only(self, *args, grid, warmup, **kwargs):
    kernel = _run(self, *args, grid=grid, warmup=True, **kwargs)
    kernels.append(kernel)
    return kernel


JITFunction.run = _compile_only


def report(kernel) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(kernel.asm["ptx"])
        f.flush()
        log = subprocess.run(
            [PTXAS, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True, text=True
        ).stderr
    regs = re.findall(r"Used (\d+) registers", log)
    spills = re.findall(r"(\d+) bytes spill stores", log)
    ttgir = kernel.asm["ttgir"]
    serial = "SERIALIZED " if "C7515" in log or "serializ" in log.lower() else ""
    tma = ttgir.count("async_tma_copy_global_to_local")
    wgmma = ttgir.count("ttng.warp_group_dot ")
    shared = kernel.metadata.shared
    over = " OVER-SMEM" if shared > SMEM_LIMIT else ""
    return (
        f"regs {regs} spills {spills} smem {shared}{over} {serial}tma_copies {tma} "
        f"wgmma {wgmma} scratch {kernel.metadata.global_scratch_size}"
    )


def variant(e, causal, block_n, warps, stages, tma, block_m=128, mask=False, dropout=0.0):
    cfg = dict(
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=e, BLOCK_DV=e, UPCAST=False, PRECISION="ieee",
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    A._forward_config = lambda *args: dict(cfg)
    A._use_tma = lambda *args: tma
    q = torch.randn(1, 4, 300, e, dtype=torch.bfloat16)
    k = torch.randn(1, 2, 300, e, dtype=torch.bfloat16)
    v = torch.randn(1, 2, 300, e, dtype=torch.bfloat16)
    m = torch.rand(300, 300) > 0.5 if mask else None
    kernels.clear()
    A.attention_forward(q, k, v, m, causal, 0.1, True, dropout, 5)
    name = (
        f"E{e} causal={causal:d} {block_m}x{block_n} w{warps} s{stages} tma={tma:d} "
        f"mask={mask:d} drop={dropout}"
    )
    try:
        print(f"{name:52s} {report(kernels[-1])}", flush=True)
    except Exception as err:  # noqa: BLE001
        print(f"{name:52s} FAILED {type(err).__name__}: {err}", flush=True)


def product() -> None:
    """The forward as shipped (its own tiles), every dtype and path; TMA where the GPU would
    take it (the device checks of _use_tma skipped: the tensors are on the CPU)."""
    config = A._forward_config

    def use_tma(q4, k4, v4, out, cfg):
        return q4.dtype != torch.float32 and cfg["BLOCK_M"] >= 64

    A._use_tma = use_tma
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for e, ev in ((64, 64), (128, 128), (96, 64), (256, 256), (32, 32)):
            for mask, causal, p in ((False, False, 0.0), (False, True, 0.0), (True, False, 0.0),
                                    (False, True, 0.1)):  # fmt: skip
                q = torch.randn(1, 4, 300, e, dtype=dtype)
                k = torch.randn(1, 2, 300, e, dtype=dtype)
                v = torch.randn(1, 2, 300, ev, dtype=dtype)
                m = torch.rand(300, 300) > 0.5 if mask else None
                kernels.clear()
                A.attention_forward(q, k, v, m, causal, 0.1, True, p, 5)
                cfg = config(q, e, ev, mask or p > 0)
                name = (
                    f"{str(dtype)[6:]} E{e}/{ev} causal={causal:d} mask={mask:d} drop={p} "
                    f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']} w{cfg['num_warps']} "
                    f"tma={use_tma(q, 0, 0, 0, cfg):d}"
                )
                print(f"{name:62s} {report(kernels[-1])}", flush=True)


if __name__ == "__main__":
    if "product" in sys.argv:
        product()
        sys.exit()
    quick = "quick" in sys.argv
    for e in (128, 64):
        for causal in (False, True):
            for tma in (True, False):
                for block_n, warps, stages in (
                    (64, 8, 3), (128, 8, 2), (128, 8, 3), (64, 4, 3), (64, 8, 4), (128, 8, 4),
                    (64, 8, 2),
                ):  # fmt: skip
                    if quick and (block_n, warps, stages) != (64, 8, 3):
                        continue
                    try:
                        variant(e, causal, block_n, warps, stages, tma)
                    except Exception as err:  # noqa: BLE001
                        print(f"E{e} {causal} {block_n} w{warps} s{stages} tma={tma} FAILED: "
                              f"{type(err).__name__}: {str(err)[:300]}", flush=True)  # fmt: skip
    # The other paths still compile with the 128-row tiles.
    variant(128, False, 64, 8, 3, True, mask=True)
    variant(64, True, 64, 8, 3, True, dropout=0.1)
    variant(128, False, 64, 8, 3, False, mask=True)
