"""Compile the implicit GEMMs' tiles for few-channel layers (the shapes of
tests/test_conv_gpu.py::test_few_channel_every_tile) for sm_90 without a GPU (a CPU-only
check; see aot_compile.py) and print the shared memory Triton allocates for each, beside
implicit_gemm.shared_memory_count's: forward (IMPLICIT_GEMM) and backward-filter
(IMPLICIT_GEMM_SPLIT_K), TF32, strict float32 and bfloat16, every tile candidate. A line
ends in UNDER where the count is below the allocation (the count must bound it).

    PYTHONPATH=src python benchmarks/aot_compile_few_channels.py
    (TRITON_INTERPRET must be unset)
"""

import dataclasses
import pathlib
import sys

from sm90_stub import accept_cpu_tensors, activate, compile_only  # noqa: E402

activate()

import torch  # noqa: E402

torch.cuda.get_device_capability = lambda *args: (9, 0)
kernels: list = []
compile_only(kernels)

from rtdnn.algos import ALGORITHMS, ConvTensors, implicit_gemm  # noqa: E402
from rtdnn.ops.conv import _problem_for_selection  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "tests"))
from test_conv_gpu import FEW_CHANNELS  # noqa: E402

accept_cpu_tensors()
implicit_gemm.parallel_slots = lambda device: 2 * 132  # an H100's multiprocessors
implicit_gemm.shared_memory_bytes = lambda device: 1 << 30  # every candidate, to compare

CASES = [("tf32", torch.float32), ("fp32", torch.float32), (None, torch.bfloat16)]
ALGOS = {"forward": "IMPLICIT_GEMM", "backward_filter": "IMPLICIT_GEMM_SPLIT_K"}


def channels_last(t: torch.Tensor) -> torch.Tensor:
    return t.movedim(1, -1).contiguous().movedim(-1, 1)


def main() -> None:
    args = dict(stride=1, padding=0, dilation=1, groups=1, mode="cross_correlation")
    for math_mode, dtype in CASES:
        for xs, ws, conv in FEW_CHANNELS:
            x = channels_last(torch.randn(xs, dtype=dtype))
            w = channels_last(torch.randn(ws, dtype=dtype))
            for direction, name in ALGOS.items():
                p, s = _problem_for_selection(direction, x, w, math=math_mode, **{**args, **conv})
                p = dataclasses.replace(p, device="cuda")  # the GPU's tiles
                algo = ALGORITHMS[name]
                workspace = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8)
                for tiles in algo.tile_candidates(p):
                    if not getattr(tiles, "filter_rows", False):
                        continue
                    kernels.clear()
                    tensors = ConvTensors(s.x.clone(), s.w.clone(), s.y.clone())
                    algo.prepare(p, tiles)(tensors, workspace, 1.0, 0.0)
                    shared = max(
                        (k.metadata.shared for k in kernels if "brgemm" in k.name), default=0
                    )
                    count = implicit_gemm.shared_memory_count(p, tiles)
                    flag = " UNDER" if count < shared else ""
                    print(f"{math_mode or 'bf16'} {direction} {ws} {tiles}: "
                          f"{shared} bytes, counted {count}{flag}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
