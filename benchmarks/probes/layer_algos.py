"""Every convolution algorithm on one suite layer: checked against cuDNN's result (output
poisoned with NaN first), timed (first tile candidate, triton.testing.do_bench median), and
broken down kernel by kernel (torch.profiler), beside cuDNN in the same process.

    PYTHONPATH=src python benchmarks/probes/layer_algos.py SUITE LAYER:DIRECTION[:BATCH] ...
        [--dtype fp32|tf32|bf16|fp16] [--algos GEMM,IMPLICIT_GEMM,...] [--all-tiles]

--all-tiles times every tile candidate of each algorithm (the tuner's choice is the fastest)
and breaks the fastest down, instead of the first candidate (the untuned choice).
--splits 1,2,5 runs IMPLICIT_GEMM_SPLIT_K (and GEMM's weight gradient) at each of these
split counts in place of split_count's (0: split_count's own), a row per count.

fp32 is strict float32 (cuDNN with TF32 off), tf32 float32 data with TF32 products.
"""

import argparse
import contextlib

import torch
from kernel_breakdown import kernel_times
from triton.testing import do_bench

from rtdnn import reference as R
from rtdnn.algos import ALGORITHMS, ConvTensors, gemm, implicit_gemm
from rtdnn.bench.conv import layer_calls, load_suite
from rtdnn.ops.conv import _problem_for_selection

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
          "fp16": torch.float16}  # fmt: skip


def run(
    suite: str,
    name: str,
    direction: str,
    batch: int | None,
    dtype: str,
    algos: list[str] | None = None,
    all_tiles: bool = False,
    splits: list[int] | None = None,
) -> None:
    layer = next(entry for entry in load_suite(suite) if entry["name"] == name)
    torch.backends.cudnn.allow_tf32 = dtype != "fp32"
    torch.backends.cudnn.benchmark = True
    calls = layer_calls(layer, direction, DTYPES[dtype], batch)
    x, w, dy = calls.x, calls.w, calls.dy
    math = {"fp32": "fp32", "tf32": "tf32"}.get(dtype)
    ref = calls.expected.double().cpu()
    base = do_bench(calls.theirs, return_mode="median")
    print(f"{suite}.{name} {direction} batch {x.shape[0]} {dtype}: cuDNN {base:.3f} ms", flush=True)
    p, _ = _problem_for_selection(
        direction, x, w, mode="cross_correlation", math=math, **calls.args
    )
    written = {"forward": calls.y, "backward_data": x, "backward_filter": w}[direction]
    out = torch.empty_like(written)
    tensors = {
        "forward": ConvTensors(x, w, out),
        "backward_data": ConvTensors(out, w, dy),
        "backward_filter": ConvTensors(x, out, dy),
    }[direction]
    runs = [
        (algo, count)
        for algo in ALGORITHMS.values()
        if algos is None or algo.name in algos
        for count in (splits if splits and algo.name == "IMPLICIT_GEMM_SPLIT_K" else [0])
    ]
    for algo, count in runs:
        with forced_splits(count):
            time_algorithm(algo, count, p, tensors, out, ref, base, all_tiles)
    for kernel, us in sorted(kernel_times(calls.theirs, 5).items(), key=lambda kv: -kv[1]):
        print(f"      {us:9.1f} us  cuDNN: {kernel}")


@contextlib.contextmanager
def forced_splits(count: int):
    """split_count replaced by `count` (0: left as it is) while the block runs."""
    own = implicit_gemm.split_count
    if count:
        implicit_gemm.split_count = gemm.split_count = lambda p: count
    try:
        yield
    finally:
        implicit_gemm.split_count = gemm.split_count = own


def time_algorithm(algo, count, p, tensors, out, ref, base, all_tiles) -> None:
    """Check and time `algo` on p (the first tile candidate, or each with all_tiles), then
    break its fastest run down kernel by kernel."""
    label = f"{algo.name}" + (f"/{count}" if count else "")
    reason = algo.supports(p)
    if reason is not None:
        print(f"  {label:22s} not supported: {reason[:100]}")
        return
    need = algo.workspace_bytes(p)
    ws = torch.empty(max(need, 16), dtype=torch.uint8, device="cuda")
    candidates = algo.tile_candidates(p)
    best = None
    for tiles in candidates if all_tiles else candidates[:1]:
        runner = algo.prepare(p, tiles)
        out.fill_(float("nan"))
        runner(tensors, ws, 1.0, 0.0)
        err = R.rel_error(out, ref)
        ms = do_bench(lambda: runner(tensors, ws, 1.0, 0.0), return_mode="median")  # noqa: B023
        print(f"  {label:22s} {ms:8.3f} ms ({base / ms:5.2f}x cuDNN) workspace "
              f"{need / 2**20:8.1f} MiB rel err {err:.1e}  {tiles}", flush=True)  # fmt: skip
        if best is None or ms < best[0]:
            best = (ms, runner, tiles)
    ms, runner, tiles = best
    if all_tiles:
        print(f"  {label:22s} best {ms:8.3f} ms ({base / ms:5.2f}x cuDNN)  {tiles}")
    for kernel, us in sorted(
        kernel_times(lambda: runner(tensors, ws, 1.0, 0.0), 5).items(),  # noqa: B023
        key=lambda kv: -kv[1],
    ):
        print(f"      {us:9.1f} us  {kernel}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("suite")
    parser.add_argument("layers", nargs="+", help="LAYER:DIRECTION[:BATCH]")
    parser.add_argument("--dtype", default="tf32", choices=sorted(DTYPES))
    parser.add_argument("--algos", help="comma-separated algorithm names (default: all)")
    parser.add_argument("--all-tiles", action="store_true", help="time every tile candidate")
    parser.add_argument("--splits", help="comma-separated split counts for split-K")
    args = parser.parse_args()
    algos = args.algos.split(",") if args.algos else None
    for spec in args.layers:
        name, direction, *batch = spec.split(":")
        batch = int(batch[0]) if batch else None
        splits = [int(n) for n in args.splits.split(",")] if args.splits else None
        run(args.suite, name, direction, batch, args.dtype, algos, args.all_tiles, splits)


if __name__ == "__main__":
    main()
