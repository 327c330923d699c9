"""Compile the FFT and FFT_TILING kernels for sm_90 without a GPU (a CPU-only check; see
aot_compile.py): every direction and mode, the GPU plans, copy blocks and tile candidates,
on the shapes of tests/test_conv_fft_gpu.py, channels-last and contiguous, with bias and beta.
The transforms run in torch.fft on the CPU; results are meaningless: only compilation is
checked.

    PYTHONPATH=src python benchmarks/aot_compile_fft.py [SHAPE_INDEX ...]
    (TRITON_INTERPRET must be unset)
"""

import dataclasses
import sys

from sm90_stub import accept_cpu_tensors, activate, compile_only  # noqa: E402

activate()

import torch  # noqa: E402

compiled = compile_only()

from rtdnn.algos import ALGORITHMS, ConvTensors  # noqa: E402
from rtdnn.core import ConvDesc, conv_output_shape, empty_like_layout  # noqa: E402
from rtdnn.ops.conv import _problem_for_selection  # noqa: E402

accept_cpu_tensors()


def main() -> None:
    sys.path.insert(0, "tests")
    from test_conv_fft_gpu import SHAPES

    only = [int(i) for i in sys.argv[1:]]  # indices into SHAPES; all by default
    for i, (xs, ws, conv) in enumerate(SHAPES):
        if only and i not in only:
            continue
        for dtype in (torch.bfloat16, torch.float32):
            for channels_last in (True, False):
                x, w = torch.randn(xs).to(dtype), torch.randn(ws).to(dtype)
                if channels_last:
                    x = x.movedim(1, -1).contiguous().movedim(-1, 1)
                    w = w.movedim(1, -1).contiguous().movedim(-1, 1)
                c = {
                    **dict(stride=1, padding=0, dilation=1, groups=1, mode="cross_correlation"),
                    **conv,
                }
                desc = ConvDesc.create(x.dim() - 2, 1, c["padding"], 1, c["groups"], c["mode"],
                                       "fp32")  # fmt: skip
                y = empty_like_layout(conv_output_shape(x.shape, w.shape, desc), x)
                bias = torch.randn(ws[0]).to(dtype)
                for d in ("forward", "backward_data", "backward_filter"):
                    p, _ = _problem_for_selection(d, x, w, math=None, **c)
                    p = dataclasses.replace(p, device="cuda")  # the GPU's plan and tiles
                    for name in ("FFT", "FFT_TILING"):
                        algo = ALGORITHMS[name]
                        wsp = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8)
                        for tiles in algo.tile_candidates(p):
                            run = algo.prepare(p, tiles)
                            has_bias = d == "forward"
                            t = ConvTensors(x.clone(), w.clone(), y.clone(),
                                            bias if has_bias else None)  # fmt: skip
                            run(t, wsp, 1.0, 0.0)
                            run(t, wsp, 0.5, 1.0)
    print(f"compiled {len(compiled)} kernel variants for sm_90")


if __name__ == "__main__":
    main()
