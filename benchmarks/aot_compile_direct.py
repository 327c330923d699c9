"""Compile DIRECT's kernels for sm_90 without a GPU (a CPU-only check; see aot_compile.py):
every direction, the GPU tile candidates, on the shapes of tests/test_conv_direct_gpu.py and
one layer of each bench suite kernel size. Results are meaningless: only compilation is checked.

    PYTHONPATH=src python benchmarks/aot_compile_direct.py [SHAPE_INDEX ...]
    (TRITON_INTERPRET must be unset)
"""

import dataclasses
import sys

from sm90_stub import accept_cpu_tensors, activate, compile_only  # noqa: E402

activate()

import torch  # noqa: E402

compiled = compile_only()

import rtdnn  # noqa: E402
from rtdnn.algos import direct  # noqa: E402
from rtdnn.ops.conv import _problem_for_selection  # noqa: E402

accept_cpu_tensors()
_candidates = direct.Direct.tile_candidates


def every_candidate(self, p):
    return _candidates(self, dataclasses.replace(p, device="cuda"))


def main() -> None:
    sys.path.insert(0, "tests")
    from test_conv_direct_gpu import SHAPES, WIDE_GROUPS

    algo = direct.Direct()
    only = [int(i) for i in sys.argv[1:]]  # indices into SHAPES; all by default
    for i, (xs, ws, conv) in enumerate(SHAPES):
        if only and i not in only:
            continue
        # Beyond 8 channels per group DIRECT takes 16-bit data only.
        wide = (xs, ws, conv) in WIDE_GROUPS
        for dtype in (torch.bfloat16,) if wide else (torch.bfloat16, torch.float32):
            x, w = torch.randn(xs).to(dtype), torch.randn(ws).to(dtype)
            x = x.movedim(1, -1).contiguous().movedim(-1, 1)
            w = w.movedim(1, -1).contiguous().movedim(-1, 1)
            y = rtdnn.conv_forward(x, w, algo="DIRECT", **conv)
            c = {
                **dict(stride=1, padding=0, dilation=1, groups=1, mode="cross_correlation"),
                **conv,
            }
            for d in ("forward", "backward_data", "backward_filter"):
                p, _ = _problem_for_selection(d, x, w, math=None, **c)
                for tiles in every_candidate(algo, p):
                    run = algo.prepare(p, tiles)
                    t = rtdnn.algos.ConvTensors(x, w.clone(), y.clone())
                    ws_bytes = algo.workspace_bytes(p)
                    wsp = torch.empty(ws_bytes, dtype=torch.uint8) if ws_bytes else None
                    run(t, wsp, 1.0, 0.0)
                    run(t, wsp, 0.5, 1.0)
    print(f"compiled {len(compiled)} kernel variants for sm_90")


if __name__ == "__main__":
    main()
