"""Compile the TMA GEMM (kernels/gemm_tma.py) for sm_90 without a GPU (a CPU-only check; see
aot_compile.py): the three orientations a linear layer and a 1x1 convolution use (A and B as
stored, with a float32 output; B transposed; A transposed), bfloat16 and float16, every tile
candidate of a GPU, split and unsplit, with and without bias and beta; and report registers,
spills, TMA copies and warp-group MMAs of each. Results of the launches are meaningless: only
compilation is checked.

    PYTHONPATH=src python benchmarks/aot_compile_gemm_tma.py
    (TRITON_INTERPRET must be unset)
"""

from sm90_stub import accept_cpu_tensors, activate, compile_only  # noqa: E402

activate()

import torch  # noqa: E402

kernels: list = []
compile_only(kernels)

from rtdnn.algos import tiles as tiles_module  # noqa: E402
from rtdnn.kernels import launch as launch_module  # noqa: E402
from rtdnn.kernels.launch import MatrixLayout, TmaGemmLaunch  # noqa: E402

accept_cpu_tensors()
launch_module.stream_counters = lambda device, n: torch.zeros(n, dtype=torch.int32)
tiles_module.multiprocessor_count = lambda device: 132
torch.cuda.current_device = lambda: 0


def report(kernel) -> str:
    ir = kernel.asm["ttgir"]
    return (
        f"regs {getattr(kernel, 'n_regs', '?')} spills {getattr(kernel, 'n_spills', '?')} "
        f"tma copies {ir.count('async_tma_copy_global')}, wgmma {ir.count('warp_group_dot ')}"
    )


def main() -> None:
    m, n, k = 4096, 256, 2048
    failures = 0
    for dtype in (torch.bfloat16, torch.float16):
        for a_t, b_t in ((False, True), (False, False), (True, False)):
            a = MatrixLayout(m, k, m if a_t else k, a_t)
            b = MatrixLayout(k, n, k if b_t else n, b_t)
            a_data = torch.empty(k * m, dtype=dtype)
            b_data = torch.empty(k * n, dtype=dtype)
            # A float32 output too: the GEMM algorithm's backward-data writes float32 columns.
            c = torch.empty(m, n, dtype=dtype if a_t or b_t else torch.float32)
            for t in tiles_module.tma_gemm_candidates("cuda", dtype, 128, n, k):
                for bias, beta in ((None, 0.0), (torch.empty(n, dtype=dtype), 1.0)):
                    launch = TmaGemmLaunch(a, b, (n, 1), tiles=t, programs=132)
                    ws = torch.empty(max(1, launch.partial_bytes), dtype=torch.uint8)
                    kernels.clear()
                    name = f"{dtype} a_t={a_t} b_t={b_t} {t} bias={bias is not None}"
                    try:
                        launch(a_data, b_data, c, beta=beta, bias=bias, workspace=ws)
                        print(name, report(kernels[-1]))
                    except Exception as e:  # noqa: BLE001 (report every failure, go on)
                        failures += 1
                        print(name, "FAILED", type(e).__name__, str(e)[:300])
    print("failures:", failures)


if __name__ == "__main__":
    main()
