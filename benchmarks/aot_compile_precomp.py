"""Compile the IMPLICIT_PRECOMP_GEMM kernels for sm_90 without a GPU (a CPU-only check; see
aot_compile.py): the table builder and the GEMM with every tile candidate, every direction,
on the shapes of tests/test_conv_precomp_gpu.py, channels-last and contiguous, bfloat16,
float16 and float32 (strict and TF32), with bias and beta; and the int64 tables of problems
whose offsets pass 2^31 elements (forced on the first shape; `wide` with shape indices).
Results are meaningless: only compilation is checked.

    PYTHONPATH=src python benchmarks/aot_compile_precomp.py [SHAPE_INDEX ...] [wide]
    (TRITON_INTERPRET must be unset)
"""

import dataclasses
import sys

from sm90_stub import activate  # noqa: E402

activate()

import torch  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

compiled: set = set()
_run = JITFunction.run


def _compile_only(self, *args, grid, warmup, **kwargs):
    kernel = _run(self, *args, grid=grid, warmup=True, **kwargs)
    compiled.add((self.__name__, kernel.hash))
    return kernel


JITFunction.run = _compile_only

from rtdnn.algos import ALGORITHMS, ConvTensors  # noqa: E402
from rtdnn.kernels import launch  # noqa: E402
from rtdnn.ops.conv import _problem_for_selection  # noqa: E402

launch.INTERPRETED = True
for module in list(sys.modules.values()):
    if getattr(module, "__name__", "").startswith("rtdnn") and hasattr(module, "check_runnable"):
        module.check_runnable = lambda device: None

NUMBERS = ((torch.bfloat16, "fp32"), (torch.float16, "fp32"), (torch.float32, "fp32"),
           (torch.float32, "tf32"))  # fmt: skip


def main() -> None:
    sys.path.insert(0, "tests")
    from test_conv_precomp_gpu import SHAPES

    algo = ALGORITHMS["IMPLICIT_PRECOMP_GEMM"]
    args = sys.argv[1:]  # indices into SHAPES and "wide"; everything by default
    only = [int(a) for a in args if a.isdigit()]
    for i, (xs, ws, conv) in enumerate(SHAPES):
        if args and i not in only:
            continue
        for dtype, math_mode in NUMBERS:
            for channels_last in (True, False):
                x, w = torch.randn(xs).to(dtype), torch.randn(ws).to(dtype)
                if channels_last:
                    x = x.movedim(1, -1).contiguous().movedim(-1, 1)
                    w = w.movedim(1, -1).contiguous().movedim(-1, 1)
                c = {
                    **dict(stride=1, padding=0, dilation=1, groups=1, mode="cross_correlation"),
                    **conv,
                }
                for d in ("forward", "backward_data", "backward_filter"):
                    p, scratch = _problem_for_selection(d, x, w, math=math_mode, **c)
                    p = dataclasses.replace(p, device="cuda")  # the GPU's tiles
                    bias = torch.randn(ws[0]).to(dtype) if d == "forward" else None
                    wsp = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8)
                    for tiles in algo.tile_candidates(p):
                        run = algo.prepare(p, tiles)
                        t = ConvTensors(scratch.x.clone(), scratch.w.clone(), scratch.y.clone(),
                                        bias)  # fmt: skip
                        run(t, wsp, 1.0, 0.0)
                        run(t, wsp, 0.5, 1.0)
    if not args or "wide" in args:  # int64 tables, as for offsets past 2^31 elements
        wide_tables(algo, *SHAPES[0])
    print(f"compiled {len(compiled)} kernel variants for sm_90")


def wide_tables(algo, xs, ws, conv) -> None:
    """The int64 table's builder and loads, every direction, in bfloat16, channels-last."""
    from rtdnn.algos import implicit_precomp_gemm as precomp

    narrow = precomp._tables

    def wide(p, geo):
        t = narrow(p, geo)
        return dataclasses.replace(t, dtype=torch.int64, nbytes=2 * t.nbytes)

    precomp._tables = wide
    x = torch.randn(xs).to(torch.bfloat16).movedim(1, -1).contiguous().movedim(-1, 1)
    w = torch.randn(ws).to(torch.bfloat16).movedim(1, -1).contiguous().movedim(-1, 1)
    c = {**dict(stride=1, padding=0, dilation=1, groups=1, mode="cross_correlation"), **conv}
    for d in ("forward", "backward_data", "backward_filter"):
        p, scratch = _problem_for_selection(d, x, w, math="fp32", **c)
        p = dataclasses.replace(p, device="cuda")
        tiles = algo.tile_candidates(p)[0]
        wsp = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8)
        algo.prepare(p, tiles)(scratch, wsp, 1.0, 0.0)
    precomp._tables = narrow


if __name__ == "__main__":
    main()
