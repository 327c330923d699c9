"""Compile the kernels of a training step for sm_90 without a GPU (a CPU-only check).

Triton's interpreter runs code that the compiler rejects, so CPU tests alone can pass while the
GPU build fails. This script swaps the CUDA driver for a stub that reports an sm_90 target,
makes every launch a compile-only warm-up (Triton -> TTGIR -> PTX -> cubin with the bundled
ptxas), and runs, on CPU tensors with the GPU tile shapes, a forward and backward pass through
the demo's CNN and a small ResNet-style block (convolutions with bias, batch norm, pooling,
linear, cross-entropy). Results are meaningless: only compilation is checked.

    PYTHONPATH=src python benchmarks/aot_compile.py [--conv-tests] [--prims] [--split-finish]
    (TRITON_INTERPRET must be unset)

Relies on Triton 3.6 internals (CudaDriver, JITFunction.run's warm-up flag); a development aid.
"""

import dataclasses
import sys

from sm90_stub import accept_cpu_tensors, activate, compile_only  # noqa: E402

activate()

import torch  # noqa: E402

compiled = compile_only()

import rtdnn  # noqa: E402
import rtdnn.nn as rnn  # noqa: E402
from rtdnn.algos import tiles  # noqa: E402

accept_cpu_tensors()
_candidates = tiles.tile_candidates
tiles.tile_candidates = lambda device, *a: _candidates("cuda", *a)


def main() -> None:
    from rtdnn.demo import lenet

    torch.manual_seed(0)
    for width, batch in ((16, 32), (32, 64)):
        model = lenet(width=width)
        x, t = torch.randn(batch, 1, 8, 8), torch.randint(0, 10, (batch,))
        rnn.CrossEntropyLoss()(model(x), t).backward()
    block = torch.nn.Sequential(
        rnn.Conv2d(16, 32, 3, padding=1, bias=True), rnn.BatchNorm2d(32), rnn.ReLU(),
        rnn.Conv2d(32, 32, 1), rnn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), rnn.Linear(32, 10),
    )  # fmt: skip
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(4, 16, 12, 12).to(dtype).to(memory_format=torch.channels_last)
        rnn.CrossEntropyLoss()(block.to(dtype)(x).float(), torch.randint(0, 10, (4,))).backward()
    if "--conv-tests" in sys.argv:  # every convolution the GPU test module runs
        sys.path.insert(0, "tests")
        from test_conv_gpu import CASES, MATRIX

        for case, layout, (xs, ws, conv) in MATRIX:
            dtype, math_mode, _ = CASES[case]
            x, w = torch.randn(xs).to(dtype), torch.randn(ws).to(dtype)
            if layout == "channels_last":
                x = x.movedim(1, -1).contiguous().movedim(-1, 1)
                w = w.movedim(1, -1).contiguous().movedim(-1, 1)
            y = rtdnn.conv_forward(x, w, **conv)
            for algo in rtdnn.algos.ALGORITHMS:
                kw = dict(algo=algo, math=math_mode, **conv)
                for fn, args in (
                    (rtdnn.conv_forward, (x, w)),
                    (rtdnn.conv_backward_data, (y, w, x.shape)),
                    (rtdnn.conv_backward_filter, (x, y, w.shape)),
                ):
                    try:
                        fn(*args, **kw)
                    except rtdnn.NotSupportedError:  # e.g. DIRECT above 8 channels per group
                        continue
            rtdnn.conv_backward_bias(y)
    if "--prims" in sys.argv:  # reductions (every op, split or not, with indices) and norms
        for x, dims in (
            (torch.randn(4, 64, 6, 6).to(memory_format=torch.channels_last), (0, 2, 3)),
            (torch.randn(8, 4096), (1,)),
            (torch.randn(3, 9000), None),
        ):
            for dtype in (torch.float32, torch.bfloat16):
                for op in ("add", "mul", "min", "max", "amax", "avg", "norm1", "norm2"):
                    rtdnn.reduce_tensor(x.to(dtype), op, dims)
                    if op in ("min", "max", "amax"):
                        rtdnn.reduce_tensor(x.to(dtype), op, dims, indices=True)
        for d in (768, 2048):
            x = torch.randn(64, d).to(torch.bfloat16)
            w = torch.randn(d).to(torch.bfloat16)
            _, mean, rstd = rtdnn.layer_norm_forward(x, d, w, w)
            rtdnn.layer_norm_backward(x, x, d, mean, rstd, w)
        from rtdnn.algos import norm as engine

        for stages in (1, 2, 4):
            engine.GPU_POLICY = dataclasses.replace(engine.GPU_POLICY, stats_stages=stages)
            engine.clear_plans()
            x = torch.randn(8, 64, 14, 14).to(torch.bfloat16).to(memory_format=torch.channels_last)
            rtdnn.batch_norm_forward_training(x, torch.randn(64), torch.randn(64))
    if "--split-finish" in sys.argv:  # split-K finished by a launch of its own
        from rtdnn.kernels.launch import BrgemmLaunch

        BrgemmLaunch.FINISH_APART_FROM = 2
        for dtype, math_mode in ((torch.bfloat16, None), (torch.float32, "tf32")):
            x = torch.randn(4, 64, 9, 9).to(dtype).movedim(1, -1).contiguous().movedim(-1, 1)
            w = torch.randn(64, 64, 3, 3).to(dtype).movedim(1, -1).contiguous().movedim(-1, 1)
            y = rtdnn.conv_forward(x, w, padding=1, math=math_mode)
            for algo in ("IMPLICIT_GEMM_SPLIT_K", "IMPLICIT_PRECOMP_GEMM"):
                rtdnn.conv_backward_filter(x, y, w.shape, padding=1, algo=algo, math=math_mode)
            small = torch.randn(2, 512, 2, 2).to(dtype).to(memory_format=torch.channels_last)
            w2 = torch.randn(64, 512, 3, 3).to(dtype).to(memory_format=torch.channels_last)
            rtdnn.conv_forward(small, w2, torch.randn(64).to(dtype), padding=1,
                               algo="IMPLICIT_GEMM_SPLIT_K", math=math_mode)  # fmt: skip
            rows = torch.randn(4096, 256).to(dtype)
            rtdnn.linear_backward_weight(rows, torch.randn(4096, 32).to(dtype))
    print(f"compiled {len(compiled)} kernel variants for sm_90")


if __name__ == "__main__":
    main()
