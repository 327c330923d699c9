# ruff: noqa: B023 (the lambdas are called inside the loop that binds them)
"""GPU probe: plain (dense, unit-stride) GEMMs of linear layers and 1x1 channels-last
convolutions, in the three directions, in one process: cuBLAS (torch.matmul on the same
layouts), rtdnn's ops.linear* as they run (tiles tuned), and every tile candidate of the TMA
GEMM (kernels/gemm_tma.py) forced, split and unsplit. Each result's error against cuBLAS's is
printed beside its time. (At 4d15b77 this probe held the TMA GEMM's prototype, with Triton's
warp specialization as a variant: benchmarks/results/plain_gemm_prototype_h200_4d15b77.txt.)

    PYTHONPATH=src python benchmarks/probes/plain_gemm_probe.py [OUT_FILE]
    (TILES=0: cuBLAS and ops.linear* only)

Directions, for activations x (M rows x K features) and weights w (N x K):
    forward       y  = x @ w^T         A = x (row-major),   B = w^T (w row-major)
    backward_data dx = dy @ w          A = dy,              B = w   (N x K row-major)
    backward_wt   dw = dy^T @ x        A = dy^T (dy row-major), B = x
"""

import os
import sys

import torch
import triton

from rtdnn import ops
from rtdnn.algos.tiles import tma_gemm_candidates
from rtdnn.core.timing import device_time_ms
from rtdnn.kernels.launch import MatrixLayout, TmaGemmLaunch
from rtdnn.reference import rel_error


def gemm_tma(a, b, a_t, b_t, m, n, k, tiles, sms):
    """A callable computing C (m x n) = A @ B on the TMA GEMM with these tiles, and C."""
    a_layout = MatrixLayout(m, k, a.stride(0), a_t)
    b_layout = MatrixLayout(k, n, b.stride(0), b_t)
    launch = TmaGemmLaunch(a_layout, b_layout, (n, 1), tiles=tiles, programs=sms)
    out = torch.empty(m, n, dtype=a.dtype, device=a.device)
    ws = torch.empty(max(1, launch.partial_bytes), dtype=torch.uint8, device=a.device)
    return (lambda: launch(a, b, out, workspace=ws)), out


SHAPES = [  # name, M (rows: tokens or pixels), K (in features / C), N (out features / K)
    ("vit.qkv", 25216, 768, 2304),
    ("vit.proj", 25216, 768, 768),
    ("vit.fc1", 25216, 768, 3072),
    ("vit.fc2", 25216, 3072, 768),
    ("r50.l1.conv1", 200704, 256, 64),
    ("r50.l1.conv3", 200704, 64, 256),
    ("r50.l2.conv1", 50176, 512, 128),
    ("r50.l2.conv3", 50176, 128, 512),
    ("r50.l3.conv1", 12544, 1024, 256),
    ("r50.l3.conv3", 12544, 256, 1024),
    ("r50.l4.conv1", 3136, 2048, 512),
    ("r50.l4.conv3", 3136, 512, 2048),
]


def main() -> None:
    out_file = open(sys.argv[1], "w") if len(sys.argv) > 1 else None  # noqa: SIM115

    def say(line):
        print(line, flush=True)
        if out_file:
            print(line, file=out_file, flush=True)

    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    say(f"{torch.cuda.get_device_name()}, {sms} SMs, triton {triton.__version__}")
    say("shape direction impl config ms cublas_ms ratio_vs_cublas TFLOP/s err")
    summary = {}
    for name, m_rows, k_in, n_out in SHAPES:
        x = torch.randn(m_rows, k_in, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n_out, k_in, device=dev, dtype=torch.bfloat16) / k_in**0.5
        dy = torch.randn(m_rows, n_out, device=dev, dtype=torch.bfloat16)
        flops = 2 * m_rows * k_in * n_out
        cases = {
            # direction: (cuBLAS call, rtdnn call, (A, B, a_t, b_t, M, N, K))
            "forward": (
                lambda: x @ w.t(),
                lambda: ops.linear(x, w),
                (x, w, False, True, m_rows, n_out, k_in),
            ),  # fmt: skip
            "backward_data": (
                lambda: dy @ w,
                lambda: ops.linear_backward_data(dy, w),
                (dy, w, False, False, m_rows, k_in, n_out),
            ),  # fmt: skip
            "backward_weight": (
                lambda: dy.t() @ x,
                lambda: ops.linear_backward_weight(x, dy),
                (dy, x, True, False, n_out, k_in, m_rows),
            ),  # fmt: skip
        }
        for direction, (cublas, ours, (a, b, a_t, b_t, m, n, k)) in cases.items():
            ref = cublas().double().cpu()
            t_cublas = device_time_ms(cublas, rep_ms=50)

            def report(impl, cfg, run, result):
                try:
                    run()
                    torch.cuda.synchronize()
                    err = rel_error(result().float(), ref) if callable(result) else 0.0
                    ms = device_time_ms(run, rep_ms=50)
                except Exception as e:  # noqa: BLE001 (a probe reports every failure and goes on)
                    failure = f"{type(e).__name__}: {str(e)[:200]}"
                    say(f"{name} {direction} {impl} {cfg} FAILED {failure}")
                    return
                ratio = t_cublas / ms
                say(f"{name} {direction} {impl} {cfg} {ms:.4f} {t_cublas:.4f} {ratio:.2f} "
                    f"{flops / ms / 1e9:.1f} {err:.1e}")  # fmt: skip
                key = (name, direction, impl.split("[")[0])
                if ratio > summary.get(key, (0, None))[0]:
                    summary[key] = (ratio, f"{impl} {cfg}")

            report("cublas", "-", cublas, cublas)
            report("rtdnn", "tuned", ours, ours)
            if os.environ.get("TILES") == "0":
                continue
            for tiles in tma_gemm_candidates("cuda", a.dtype, m, n, k):
                run, out = gemm_tma(a, b, a_t, b_t, m, n, k, tiles, sms)
                shape = (tiles.block_m, tiles.block_n, tiles.block_k, tiles.num_warps)
                config = f"{shape}s{tiles.num_stages}"
                report(f"tma[split{tiles.splits}]", config, run, lambda: out)
    say("")
    say("best ratio vs cuBLAS per shape, direction and implementation")
    for key, (ratio, cfg) in sorted(summary.items()):
        say(f"{' '.join(key)} {ratio:.2f} {cfg}")


if __name__ == "__main__":
    main()
