# ruff: noqa: B023 (the lambdas are called inside the loop that binds them)
"""Backward-filter of the grouped suite's layers, tile by tile, beside cuDNN: DIRECT's
block-diagonal tensor-core tiles over lanes, pixels per step, warps and pipeline stages; its
"dot_taps" tiles (one accumulator per filter tap); its "gemm" tiles on super-groups of 32 and
64 channels, with the filter taps as GEMM batch entries (as shipped) or folded into the GEMM's
columns (implicit_gemm.PACK_BELOW raised, so one tile reads dy for several taps). Prints each
variant's time, ratio to cuDNN and error.

    PYTHONPATH=src python benchmarks/probes/grouped_filter_probe.py [LAYER_PREFIX]
FAMILIES (default "dot taps gemm") picks the families; CHUNKS="0.5 2" also times the
"dot_taps" tiles with that many times the chunks of direct.taps_chunks (one wave).
"""

import dataclasses
import math
import os
import sys

import torch

import rtdnn.algos.direct as direct
import rtdnn.algos.implicit_gemm as implicit_gemm
from rtdnn.algos import ALGORITHMS, ConvTensors, direct_gemm
from rtdnn.algos.direct import DirectTiles
from rtdnn.algos.tiles import gemm_candidates
from rtdnn.bench.conv import DTYPES, _conv_args, _layer_tensors, load_suite
from rtdnn.core.timing import device_time_ms
from rtdnn.ops.conv import _problem_for_selection
from rtdnn.reference import rel_error

FAMILIES = os.environ.get("FAMILIES", "dot taps gemm").split()
SHIPPED_PACK_BELOW = implicit_gemm.PACK_BELOW
SHIPPED_TAPS_CHUNKS = direct.taps_chunks


def dot_variants(cg: int) -> list[DirectTiles]:
    out = []
    for lanes in (32, 64):
        if lanes < cg:
            continue
        for bp in (32, 64, 128):
            for warps in (4, 8):
                for stages in (1, 3):
                    out.append(DirectTiles(bp, lanes, 1, 1, warps, stages, kernel="dot"))
    return out


def taps_variants(p) -> list[DirectTiles]:
    """DIRECT's "dot_taps" candidates and 8 warps of each."""
    shipped = direct._dot_taps_candidates(p)
    return shipped + [dataclasses.replace(t, num_warps=8) for t in shipped]


def taps_chunks_scaled(factor: float):
    """direct.taps_chunks with `factor` times its chunks."""

    def chunks(p, tiles):
        pixels = p.batch * math.prod(p.out_spatial)
        n = max(1, min(round(SHIPPED_TAPS_CHUNKS(p, tiles)[0] * factor), pixels))
        per_chunk = -(-pixels // n)
        return -(-pixels // per_chunk), per_chunk

    return chunks


def gemm_variants(p, cg: int) -> list[tuple[str, DirectTiles, bool]]:
    out = []
    for width in (32, 64):
        if width < cg or p.in_channels % width:
            continue
        for pack in (False, True):
            implicit_gemm.PACK_BELOW = 128 if pack else SHIPPED_PACK_BELOW
            pw = direct_gemm.widened(p, width)
            rows, cols, depth, _ = implicit_gemm.gemm_shape(pw)
            for t in dict.fromkeys(gemm_candidates(pw, rows, cols, depth)):
                tiles = DirectTiles(
                    t.block_m, t.block_n, t.block_k, t.group_m, t.num_warps, t.num_stages,
                    kernel="gemm", width=width,
                )  # fmt: skip
                out.append((f"gemm W{width} {'packed' if pack else 'by-tap'}", tiles, pack))
    implicit_gemm.PACK_BELOW = SHIPPED_PACK_BELOW
    return out


def main() -> None:
    prefix = sys.argv[1] if len(sys.argv) > 1 else ""
    algo = ALGORITHMS["DIRECT"]
    print(torch.cuda.get_device_name())
    for layer in load_suite("grouped"):
        name = layer["name"]
        if not name.startswith(prefix):
            continue
        x, w = _layer_tensors(layer, DTYPES["bf16"], None)
        args = _conv_args(layer)
        y = torch.nn.functional.conv2d(x, w, None, **args)
        dy = torch.randn_like(y)
        p, _ = _problem_for_selection(
            "backward_filter", x, w, mode="cross_correlation", math=None, **args
        )
        cg = p.in_channels // p.groups

        def theirs():
            return torch.ops.aten.convolution_backward(
                dy, x, w, None, args["stride"], args["padding"], args["dilation"], False,
                [0, 0], args["groups"], [False, True, False])[1]  # fmt: skip

        expected = theirs().double().cpu()
        cudnn_ms = device_time_ms(theirs, rep_ms=20)
        print(f"== {name} cg={cg} cudnn {cudnn_ms * 1e3:.1f} us", flush=True)
        out = torch.empty_like(w)
        tensors = ConvTensors(x, out, dy)
        variants = []
        if "dot" in FAMILIES:
            variants += [("dot", t, False) for t in dot_variants(cg)]
        if "taps" in FAMILIES:
            variants += [("taps", t, False) for t in taps_variants(p)]
        for factor in (float(f) for f in os.environ.get("CHUNKS", "").split()):
            variants += [(f"taps x{factor}", t, factor) for t in taps_variants(p)]
        if "gemm" in FAMILIES:
            variants += gemm_variants(p, cg)
        results = []
        for label, tiles, pack in variants:
            if label.startswith("taps x"):  # pack: the chunks' factor
                direct.taps_chunks = taps_chunks_scaled(pack)
                pack = False
            implicit_gemm.PACK_BELOW = 128 if pack else SHIPPED_PACK_BELOW
            try:
                need = algo.workspace_bytes(p)
                if tiles.kernel == "gemm":
                    need = max(need, direct_gemm.workspace_bytes(p, tiles.width))
                ws = torch.empty(need, dtype=torch.uint8, device="cuda") if need else None
                run = algo.prepare(p, tiles)
                out.fill_(float("nan"))
                run(tensors, ws, 1.0, 0.0)
                err = rel_error(out, expected)
                ms = device_time_ms(lambda: run(tensors, ws, 1.0, 0.0), rep_ms=20)
                results.append((ms, label, tiles, err))
                print(f"  {ms * 1e3:7.1f} us {cudnn_ms / ms:5.2f}x err {err:.1e} {label} "
                      f"{tiles}", flush=True)  # fmt: skip
            except Exception as e:  # report and go on
                print(f"  FAILED {label} {tiles}: {type(e).__name__}: {e}"[:300], flush=True)
            finally:
                implicit_gemm.PACK_BELOW = SHIPPED_PACK_BELOW
                direct.taps_chunks = SHIPPED_TAPS_CHUNKS
        for ms, label, tiles, _err in sorted(results, key=lambda r: r[0])[:3]:
            print(f"  best {ms * 1e3:7.1f} us {cudnn_ms / ms:5.2f}x {label} {tiles}")


if __name__ == "__main__":
    main()
