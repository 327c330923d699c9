# ruff: noqa: B023 (the lambdas are called inside the loop that binds them)
"""GPU probe of IMPLICIT_GEMM's TMA forward (kernels/conv_tma.py) on the stride-1 layers of
the resnet50 suite in bf16: each TMA tile candidate and each pointer-path candidate, timed
beside cuDNN in the same process, with the error of each against cuDNN's result.

    RTDNN_TMA=1 PYTHONPATH=src python benchmarks/probes/tma_probe.py [SUITE] [LIMIT]
"""

import os
import sys

import torch
import torch.nn.functional as F

from rtdnn.algos import ALGORITHMS, ConvTensors
from rtdnn.bench.conv import DTYPES, _conv_args, _layer_tensors, load_suite, matmul_ceiling
from rtdnn.core.timing import device_time_ms
from rtdnn.ops.conv import _problem_for_selection
from rtdnn.reference import rel_error


def main() -> None:
    os.environ["RTDNN_TMA"] = "1"
    suite = sys.argv[1] if len(sys.argv) > 1 else "resnet50"
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    dtype = DTYPES["bf16"]
    ceiling = matmul_ceiling(dtype)
    algo = ALGORITHMS["IMPLICIT_GEMM"]
    print(f"{torch.cuda.get_device_name()}, matmul ceiling {ceiling:.0f} TFLOP/s")
    print("layer tiles kind ms cudnn_ms ratio TFLOP/s err_vs_cudnn")
    layers = [e for e in load_suite(suite) if e["stride"] in (1, [1, 1], (1, 1))]
    for layer in layers[:limit]:
        x, w = _layer_tensors(layer, dtype, None)
        args = _conv_args(layer)
        y = F.conv2d(x, w, None, **args)
        theirs = device_time_ms(lambda: F.conv2d(x, w, None, **args))
        flops = 2 * y.numel() * w[0].numel()
        p, _ = _problem_for_selection("forward", x, w, mode="cross_correlation", math=None,
                                      **args)  # fmt: skip
        for tiles in algo.tile_candidates(p):
            kind = "tma" if getattr(tiles, "tma", False) else "pointer"
            out = torch.full_like(y, float("nan"))
            run = algo.prepare(p, tiles)
            t = ConvTensors(x, w, out)
            run(t, None, 1.0, 0.0)
            err = rel_error(out, y.double().cpu())
            ms = device_time_ms(lambda: run(t, None, 1.0, 0.0))
            shape = f"{tiles.block_m}x{tiles.block_n}x{tiles.block_k}"
            shape += f"/w{tiles.num_warps}s{tiles.num_stages}"
            print(f"{layer['name']} {shape} {kind} {ms:.3f} {theirs:.3f} {theirs / ms:.2f} "
                  f"{flops / ms / 1e9:.0f} {err:.1e}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
