"""Command line: `rtdnn info`, `rtdnn bench`, `rtdnn demo`."""

from __future__ import annotations

import argparse
import os
import platform
import sys


def _info(args) -> int:
    import torch
    import triton

    import rtdnn
    from rtdnn.core import INTERPRETED

    print(f"rtdnn     {rtdnn.__version__}")
    print(f"python    {platform.python_version()}")
    print(f"torch     {torch.__version__} (cuDNN {torch.backends.cudnn.version()})")
    print(f"triton    {triton.__version__}")
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        print(f"device    {p.name}, {p.multi_processor_count} SMs, {p.total_memory >> 30} GiB")
    else:
        print("device    no CUDA device: CPU tensors only, through Triton's interpreter")
    mode = "interpreted (TRITON_INTERPRET=1)" if INTERPRETED else "compiled"
    print(f"kernels   {mode}")
    cache = os.environ.get("TRITON_CACHE_DIR", os.path.expanduser("~/.triton/cache"))
    print(f"cache     Triton kernels: {cache}")
    return 0


def _self_check() -> int:
    import warnings

    from rtdnn.bench.selfcheck import run_all

    # The interpreter evaluates masked-off lanes too (e.g. exp of -inf padding) and NumPy
    # warns about them; the results are masked out, so the warnings are noise here.
    warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")
    failed = 0
    for name, err, ok in run_all():
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name:40s} rel. error {err:.1e}")
    print(f"self-check: {'all passed' if not failed else f'{failed} failed'}")
    return 1 if failed else 0


def _bench(args) -> int:
    import torch

    if not torch.cuda.is_available() and args.model is not None:
        print("No CUDA device: a smoke run of the small CNN through Triton's interpreter.")
        from rtdnn.bench.model import run_model

        run_model(args.model, out_dir=args.out, fuse=not args.no_fuse)
        return 0
    if not torch.cuda.is_available():
        print("No CUDA device: running the correctness self-check through Triton's interpreter.")
        print("Performance needs a GPU: run `rtdnn bench` on a machine with one.")
        return _self_check()
    if args.op is not None:
        return _bench_op(args)
    if args.model is not None:
        from rtdnn.bench.model import run_model

        run_model(
            args.model, args.batch or 128, args.dtype, out_dir=args.out, fuse=not args.no_fuse
        )
        return 0
    from rtdnn.bench.conv import DIRECTIONS, run_suite

    directions = list(DIRECTIONS) if args.direction == "all" else [args.direction]
    rows = run_suite(
        args.suite, args.dtype, directions, args.batch, args.limit, args.out, args.find,
        args.eager,
    )  # fmt: skip
    return 0 if all(r.ok for r in rows) else 1


def _bench_op(args) -> int:
    """Memory-bound primitives beside PyTorch eager: GB/s and percent of copy bandwidth."""
    from rtdnn.bench.norm import run_norm
    from rtdnn.bench.prims import OPS, run_ops

    if args.op in ("norm", "all"):
        run_norm(args.out)
    if args.op != "norm":
        run_ops(list(OPS) if args.op == "all" else [args.op], args.out)
    return 0


def _demo(args) -> int:
    import torch

    from rtdnn.demo import train

    if not torch.cuda.is_available():
        print(
            "No CUDA device: training through Triton's interpreter on the CPU, on a budget of "
            f"{args.budget or 200:.0f} s (on a GPU this takes seconds)."
        )
    result = train(epochs=args.epochs, budget_s=args.budget, plot=args.plot)
    print(
        f"test accuracy {result['accuracy']:.1%} after {result['steps']} steps "
        f"({result['seconds']:.1f} s on {result['device']}"
        f"{', stopped at the time budget' if result['stopped_at_budget'] else ''})"
    )
    if args.plot:
        print(f"loss curve written to {args.plot}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rtdnn", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, device, compiled or interpreted, cache locations")
    bench = sub.add_parser("bench", help="benchmark against PyTorch/cuDNN (self-check on CPU)")
    bench.add_argument("--suite", default="resnet50", help="layer suite (default resnet50)")
    bench.add_argument("--dtype", default="bf16", help="bf16, fp16 or float32 (TF32)")
    bench.add_argument(
        "--direction",
        default="all",
        choices=["all", "forward", "backward_data", "backward_filter"],
    )
    bench.add_argument(
        "--op",
        default=None,
        choices=["pooling", "activation", "softmax", "lrn", "dropout", "tensor", "norm", "all"],
        help="benchmark memory-bound primitives instead of the convolution suite",
    )
    bench.add_argument(
        "--model",
        default=None,
        choices=["resnet50", "efficientnet_b0", "mobilenet_v3_large", "convnext_tiny", "small"],
        help="whole-model training and inference beside PyTorch (a smoke run without a GPU)",
    )
    bench.add_argument(
        "--no-fuse",
        action="store_true",
        help="with --model: convert without fusing batch norm with the ReLU and add after it",
    )
    bench.add_argument("--batch", type=int, default=None, help="override the suite's batch")
    bench.add_argument("--limit", type=int, default=None, help="only the first N layers")
    bench.add_argument("--out", default="bench-results", help="folder for JSON and markdown")
    bench.add_argument(
        "--find", action="store_true", help="let rtdnn measure every algorithm per layer first"
    )
    bench.add_argument(
        "--eager", action="store_true", help="also time plain calls (host overhead included)"
    )
    demo = sub.add_parser("demo", help="train a small CNN on the digits data set")
    demo.add_argument("--epochs", type=int, default=None, help="default 20 (GPU), 6 (CPU)")
    demo.add_argument("--budget", type=float, default=None, help="seconds; default 200 on CPU")
    demo.add_argument("--plot", default=None, help="write the loss curve to this PNG")
    args = parser.parse_args(argv)
    if args.command in ("bench", "demo") and not _cpu_ready():
        # Without a GPU the self-check runs in the interpreter, which must be chosen before
        # triton is imported: re-run this command with it set.
        os.environ["TRITON_INTERPRET"] = "1"
        os.execv(sys.executable, [sys.executable, "-m", "rtdnn.cli", *sys.argv[1:]])
    return {"info": _info, "bench": _bench, "demo": _demo}[args.command](args)


def _cpu_ready() -> bool:
    """True if kernels can run here as things stand: a GPU, or the interpreter already on."""
    import torch

    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


if __name__ == "__main__":
    sys.exit(main())
