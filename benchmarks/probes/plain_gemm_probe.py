# ruff: noqa: B023 (the lambdas are called inside the loop that binds them)
"""GPU probe: plain (dense, unit-stride) GEMMs of linear layers and 1x1 channels-last
convolutions, in the three directions, three ways in one process: cuBLAS (torch.matmul on the
same layouts), rtdnn's building block as it runs today (ops.linear*, tiles tuned), and a
prototype persistent kernel that loads both operands through host-side TMA tensor descriptors
(no per-element addresses or masks: the descriptor's bounds zero-fill the edges), over several
tile shapes, with and without Triton 3.6's warp specialization, split-K for short outputs.
Each result's error against cuBLAS's is printed beside its time.

    PYTHONPATH=src python benchmarks/probes/plain_gemm_probe.py [OUT_FILE]
    (PROTOTYPE=0: cuBLAS and rtdnn only)

Directions, for activations x (M rows x K features) and weights w (N x K):
    forward       y  = x @ w^T         A = x (row-major),   B = w^T (w row-major)
    backward_data dx = dy @ w          A = dy,              B = w   (N x K row-major)
    backward_wt   dw = dy^T @ x        A = dy^T (dy row-major), B = x
"""

import os
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from rtdnn import ops
from rtdnn.core.timing import device_time_ms
from rtdnn.reference import rel_error


@triton.jit
def _tile(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    in_group = GROUP_M * num_pid_n
    first_m = (tile_id // in_group) * GROUP_M
    size_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % in_group) % size_m
    pid_n = (tile_id % in_group) // size_m
    return pid_m, pid_n


@triton.jit
def gemm_tma_kernel(
    a_desc, b_desc, c_desc, M, N, K, alpha,
    A_T: tl.constexpr, B_T: tl.constexpr, SPLITS: tl.constexpr, NUM_SMS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):  # fmt: skip
    """C = alpha * A @ B, A (M x K) and B (K x N) stored as given by A_T / B_T (transposed:
    stored K x M, N x K). SPLITS > 1: C is float32 [SPLITS, M, N] partial sums."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, SPLITS)
    tiles = num_pid_m * num_pid_n
    for job in tl.range(tl.program_id(0), tiles * SPLITS, NUM_SMS, flatten=True,
                        warp_specialize=WARP_SPECIALIZE):  # fmt: skip
        split = job // tiles
        pid_m, pid_n = _tile(job % tiles, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        k_begin = split * per_split
        k_end = tl.minimum(k_begin + per_split, k_tiles)
        for ki in range(k_begin, k_end):
            off_k = ki * BLOCK_K
            if A_T:
                a = a_desc.load([off_k, off_m]).T
            else:
                a = a_desc.load([off_m, off_k])
            if B_T:
                b = b_desc.load([off_n, off_k]).T
            else:
                b = b_desc.load([off_k, off_n])
            acc = tl.dot(a, b, acc)
        acc = acc * alpha
        if SPLITS == 1:
            c_desc.store([off_m, off_n], acc.to(c_desc.dtype))
        else:
            c_desc.store([split, off_m, off_n], acc[None, :, :])


def gemm_tma(a, b, a_t, b_t, m, n, k, cfg, ws=False, splits=1):
    """Returns a callable computing C (m x n) and C itself (float32 partials if splits > 1,
    summed by the callable)."""
    bm, bn, bk, warps, stages = cfg
    a_desc = TensorDescriptor.from_tensor(a, [bk, bm] if a_t else [bm, bk])
    b_desc = TensorDescriptor.from_tensor(b, [bn, bk] if b_t else [bk, bn])
    if splits == 1:
        c = torch.empty(m, n, dtype=a.dtype, device=a.device)
        out = c
    else:
        c = torch.empty(splits, m, n, dtype=torch.float32, device=a.device)
        out = torch.empty(m, n, dtype=a.dtype, device=a.device)
    c_desc = TensorDescriptor.from_tensor(c, [bm, bn] if splits == 1 else [1, bm, bn])
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count if a.is_cuda else 3
    jobs = triton.cdiv(m, bm) * triton.cdiv(n, bn) * splits
    grid = (min(sms, jobs),)

    def run():
        gemm_tma_kernel[grid](
            a_desc, b_desc, c_desc, m, n, k, 1.0, a_t, b_t, splits, grid[0], bm, bn, bk, 8, ws,
            num_warps=warps, num_stages=stages,
        )  # fmt: skip
        if splits > 1:
            out.copy_(c.sum(0))
        return out

    return run, out


CONFIGS = [
    (128, 128, 64, 4, 4),
    (128, 128, 64, 8, 4),
    (128, 256, 64, 8, 3),
    (256, 128, 64, 8, 3),
    (128, 128, 128, 8, 3),
    (64, 128, 64, 4, 5),
]
SPLIT_CONFIGS = [(128, 128, 64, 4, 4), (128, 128, 64, 8, 3), (64, 128, 64, 4, 5)]
WS_CONFIGS = [(128, 128, 64, 8, 3)]

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
            if os.environ.get("PROTOTYPE") == "0":
                continue
            tiles = triton.cdiv(m, 128) * triton.cdiv(n, 128)
            k_tiles = triton.cdiv(k, 64)
            split_options = [1]
            if tiles < sms:
                split_options.append(max(2, min(sms // tiles, k_tiles // 4, 32)))
            for splits in split_options:
                for cfg in CONFIGS if splits == 1 else SPLIT_CONFIGS:
                    run, out = gemm_tma(a, b, a_t, b_t, m, n, k, cfg, splits=splits)
                    report(f"tma[s{splits}]", cfg, run, lambda: out)
                for cfg in WS_CONFIGS:
                    run, out = gemm_tma(a, b, a_t, b_t, m, n, k, cfg, ws=True, splits=splits)
                    report(f"tma_ws[s{splits}]", cfg, run, lambda: out)
    say("")
    say("best ratio vs cuBLAS per shape, direction and implementation")
    for key, (ratio, cfg) in sorted(summary.items()):
        say(f"{' '.join(key)} {ratio:.2f} {cfg}")


if __name__ == "__main__":
    main()
