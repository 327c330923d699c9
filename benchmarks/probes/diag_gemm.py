"""Is the building block itself fast? A plain GEMM through brgemm_kernel (strided addressing)
against torch.matmul, the implicit-GEMM forward of the same size, and what the compiler made."""

import torch
import triton

from rtdnn.kernels import strided
from rtdnn.kernels.launch import BrgemmLaunch, Operand, Output, TileConfig
from rtdnn.kernels.strided import StridedGeometry

M, N, K = 3136, 512, 4608
a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
ga = StridedGeometry(M, K, 1, 0, 0, 0, K, 1, 0)
gb = StridedGeometry(K, N, 1, 0, 0, 0, N, 1, 0)
gc = StridedGeometry(M, N, 1, 0, 0, 0, N, 1, 0)
flops = 2 * M * N * K
ms = triton.testing.do_bench(lambda: a @ b, return_mode="median")
print(f"torch.matmul {M}x{N}x{K}: {ms * 1e3:.1f} us {flops / ms / 1e9:.0f} TFLOP/s")
for bm, bn, bk, w, s in [
    (128, 128, 64, 8, 3),
    (128, 128, 64, 4, 4),
    (128, 256, 64, 8, 3),
    (64, 128, 64, 4, 4),
    (128, 64, 64, 4, 4),
    (128, 128, 128, 8, 3),
]:
    t = TileConfig(bm, bn, bk, 8, w, s)
    g = BrgemmLaunch(
        Operand(strided.strided_a_setup, strided.strided_a_load, ga),
        Operand(strided.strided_b_setup, strided.strided_b_load, gb),
        Output(strided.strided_c_addr, gc),
        m=M,
        n=N,
        steps=triton.cdiv(K, bk),
        batches=1,
        tiles=t,
    )
    ms = triton.testing.do_bench(lambda g=g: g(a, b, c), return_mode="median")
    err = ((c.float() - (a.float() @ b.float())).norm() / (a.float() @ b.float()).norm()).item()
    print(f"brgemm strided {t}: {ms * 1e3:.1f} us {flops / ms / 1e9:.0f} TFLOP/s err {err:.1e}")
    k = g._variants[(False, False)][0].compiled
    ttgir = k.asm["ttgir"]
    print(
        "   wgmma:",
        "warp_group_dot" in ttgir,
        " async_copy:",
        "async_copy" in ttgir,
        " regs:",
        k.n_regs,
        " spills:",
        k.n_spills,
        " smem:",
        k.metadata.shared,
    )
