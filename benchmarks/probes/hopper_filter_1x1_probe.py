"""GPU probe: 1x1 weight gradients in 16-bit data on the Hopper weight-gradient kernel
(kernels/conv_hopper_filter.py), which `hopper_unsupported` leaves to the TMA GEMM, beside what
`auto` runs today and cuDNN, in one process. For each layer: cuDNN, rtdnn's `auto` (its
algorithm named), then every Hopper unit of IMPLICIT_GEMM_SPLIT_K with the 1x1 rule lifted
(this process only; the kernel takes outputs of 14 to 28 pixels a side anyway), each checked
against cuDNN's result (output poisoned with NaN first).

    PYTHONPATH=src python benchmarks/probes/hopper_filter_1x1_probe.py [SUITE] [LAYERS] [DTYPE]

LAYERS: comma-separated names (default: every 1x1 layer of the suite); DTYPE bf16 or fp16.
"""

import math
import sys

import torch

from rtdnn import ops
from rtdnn.algos import ALGORITHMS, ConvTensors, implicit_gemm
from rtdnn.algos.implicit_gemm import HopperConvTiles
from rtdnn.bench.conv import DTYPES, layer_calls, load_suite
from rtdnn.core.timing import device_time_ms
from rtdnn.ops.conv import _problem_for_selection
from rtdnn.reference import rel_error

ONE_BY_ONE = "1x1 16-bit weight gradients outside 14 to 28 output pixels: a plain GEMM"
_unsupported = implicit_gemm.hopper_unsupported


def _lifted(p):
    reason = _unsupported(p)
    return None if reason == ONE_BY_ONE else reason


def main() -> None:
    suite = sys.argv[1] if len(sys.argv) > 1 else "resnet50"
    layers = load_suite(suite)
    names = sys.argv[2].split(",") if len(sys.argv) > 2 and sys.argv[2] else None
    dtype = DTYPES[sys.argv[3] if len(sys.argv) > 3 else "bf16"]
    algo = ALGORITHMS["IMPLICIT_GEMM_SPLIT_K"]
    print(torch.cuda.get_device_name(), suite, dtype)
    print("layer | cuDNN ms | auto ms (algo) | best Hopper ms (unit) | auto/cuDNN | Hopper/cuDNN")
    ratios = {"auto": [], "best": []}
    for layer in layers:
        if math.prod(layer["kernel"]) != 1 or (names and layer["name"] not in names):
            continue
        c = layer_calls(layer, "backward_filter", dtype, None)
        ref = c.expected.double().cpu()
        theirs = device_time_ms(c.theirs)
        auto_ms = device_time_ms(c.ours)
        auto_name = ops.get_conv_algorithm(c.x, c.w, direction="backward_filter", **c.args)
        p, _ = _problem_for_selection(
            "backward_filter", c.x, c.w, mode="cross_correlation", math=None, **c.args
        )
        # The rule lifted only here, so that `auto` above ran what it runs today.
        implicit_gemm.hopper_unsupported = _lifted
        workspace = torch.empty(algo.workspace_bytes(p), dtype=torch.uint8, device="cuda")
        rows = []
        for tiles in algo.tile_candidates(p):
            if not isinstance(tiles, HopperConvTiles):
                continue
            out = torch.full_like(c.w, float("nan"))
            run = algo.prepare(p, tiles)
            tensors = ConvTensors(c.x, out, c.dy)
            run(tensors, workspace, 1.0, 0.0)
            err = rel_error(out, ref)
            ms = device_time_ms(lambda run=run, t=tensors, ws=workspace: run(t, ws, 1.0, 0.0))
            unit = f"{tiles.block_m}x{tiles.block_n}x{tiles.block_k}/s{tiles.num_stages}"
            rows.append((ms, unit, err))
            print(f"  {layer['name']} {unit} {ms:.4f} ms err {err:.1e}", flush=True)
        implicit_gemm.hopper_unsupported = _unsupported
        good = [r for r in rows if r[2] < 2e-2]
        best = min(good) if good else (float("nan"), "-", float("nan"))
        ratios["auto"].append(theirs / auto_ms)
        if good:
            ratios["best"].append(theirs / best[0])
        print(
            f"{layer['name']} | {theirs:.4f} | {auto_ms:.4f} ({auto_name}) | {best[0]:.4f} "
            f"({best[1]}) | {theirs / auto_ms:.2f} | {theirs / best[0]:.2f}",
            flush=True,
        )
    for key, values in ratios.items():
        if values:
            gm = math.exp(sum(map(math.log, values)) / len(values))
            print(f"geomean {key} {gm:.2f} over {len(values)} layers")


if __name__ == "__main__":
    main()
