"""Command line: `rtdnn info`, `rtdnn bench`, `rtdnn tune`, `rtdnn demo`."""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import platform
import sys
import time

from . import __version__

#: --dtype values: the canonical name each stands for (bf16, fp16, or float32 with TF32 math).
DTYPES = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "float32": "float32",
    "fp32": "float32",
}
OPS = (
    "pooling", "activation", "softmax", "lrn", "dropout", "tensor", "norm", "attention", "rnn",
    "ctc", "grid_sample", "all",
)  # fmt: skip
MODELS = (
    "resnet50", "efficientnet_b0", "mobilenet_v3_large", "convnext_tiny", "vit_b_16", "small"
)  # fmt: skip
DIRECTIONS = ("all", "forward", "backward_data", "backward_filter")
#: Micro-batch policies (select.plan.POLICIES, named here so that parsing imports nothing).
POLICIES = ("undivided", "powerOfTwo", "all")
DEMO_EXTRA = 'pip install -e ".[demo]"'

# The bench options each kind of run uses (the convolution suite is the default kind); giving
# one to a run that does not use it is an error rather than silently ignored.
_USED_BY = {
    "suite": {"suite", "dtype", "direction", "batch", "limit", "find", "eager"},
    "algo": {"suite", "dtype", "direction", "batch", "limit", "algo", "math"},
    "op": {"limit"},  # --op attention, rnn, ctc, grid_sample: the first N cases
    "model": {"dtype", "batch", "no_fuse", "compile"},
    "micro_batch": {"suite", "dtype", "direction", "batch", "limit", "policies", "budget"},
}
_KIND_NAMES = {
    "op": "--op",
    "model": "--model",
    "algo": "--algo",
    "micro_batch": "--micro-batch",
    "suite": "the convolution suite",
}


def suites() -> list[str]:
    """The layer suites shipped in rtdnn/bench/suites (read from disk, nothing imported)."""
    folder = os.path.join(os.path.dirname(__file__), "bench", "suites")
    return sorted(name[:-5] for name in os.listdir(folder) if name.endswith(".json"))


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _bytes(text: str) -> int:
    from .core import BadParamError
    from .network_plan import parse_bytes

    try:
        return parse_bytes("bytes", text)
    except BadParamError:
        raise argparse.ArgumentTypeError(
            f"expected a number of bytes such as 65536, 64MiB or 1.5GiB, got {text!r}"
        ) from None


def _policies(text: str) -> list[str]:
    names = text.split(",")
    if not all(name in POLICIES for name in names):
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {', '.join(POLICIES)}, got {text!r}"
        )
    return names


def _dtype(text: str) -> str:
    if text not in DTYPES:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(DTYPES)}, got {text!r}")
    return DTYPES[text]


def _algo(text: str) -> str:
    """'all', or a convolution algorithm's name (any case) as rtdnn registers it."""
    from .algos import ALGORITHMS

    if text.lower() == "all":
        return "all"
    if text.upper() not in ALGORITHMS:
        names = ", ".join(["all", *ALGORITHMS])
        raise argparse.ArgumentTypeError(f"expected one of {names}, got {text!r}")
    return text.upper()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rtdnn", description=__doc__)
    parser.add_argument("--version", action="version", version=f"rtdnn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, device, compiled or interpreted, cache locations")
    bench = sub.add_parser(
        "bench",
        help="benchmark against PyTorch/cuDNN (without a GPU: the correctness self-check)",
        description="On a GPU: rtdnn beside PyTorch/cuDNN. Without one: a correctness "
        "self-check of every primitive through Triton's interpreter (the options below are "
        "then checked but only --model and --algo apply, as smoke runs on small problems).",
    )
    bench.add_argument(
        "--suite", choices=suites(), default=None, help="convolution layer suite (default resnet50)"
    )
    bench.add_argument(
        "--dtype",
        type=_dtype,
        default=None,
        metavar="{bf16,fp16,float32}",
        help="bf16 (default; or bfloat16), fp16 (float16), float32 (fp32; TF32 math)",
    )
    bench.add_argument("--direction", choices=DIRECTIONS, default=None, help="default all")
    bench.add_argument(
        "--op",
        choices=OPS,
        default=None,
        help="benchmark memory-bound primitives, attention, recurrent layers, CTC or the spatial "
        "transformer instead of the convolution suite",
    )
    bench.add_argument(
        "--model",
        choices=MODELS,
        default=None,
        help="whole-model training and inference beside PyTorch (a smoke run without a GPU)",
    )
    bench.add_argument(
        "--no-fuse",
        action="store_true",
        help="with --model: convert without fusing batch norm with the ReLU and add after it",
    )
    bench.add_argument(
        "--compile",
        choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
        default=None,
        metavar="MODE",
        help="with --model: also time both models under torch.compile(mode=MODE) (default, "
        "reduce-overhead, max-autotune, max-autotune-no-cudagraphs)",
    )
    bench.add_argument(
        "--micro-batch",
        action="store_true",
        help="mu-cuDNN's experiment: micro-batch plans under per-layer limits of 8, 64 and "
        "512 MiB and a network budget (default suites alexnet, resnet18, resnet50; without a "
        "GPU two tiny layers through the interpreter)",
    )
    bench.add_argument(
        "--policies",
        type=_policies,
        default=None,
        metavar="LIST",
        help="with --micro-batch: comma-separated of undivided,powerOfTwo,all (default all three)",
    )
    bench.add_argument(
        "--budget",
        type=_positive_int,
        default=None,
        metavar="MIB",
        help="with --micro-batch: the network's workspace budget (default 64 MiB a convolution)",
    )
    bench.add_argument(
        "--batch", type=_positive_int, default=None, help="override the suite's batch"
    )
    bench.add_argument(
        "--limit", type=_positive_int, default=None,
        help="only the first N layers (with --op attention, rnn, ctc, grid_sample or all: cases "
        "of each of those)",
    )  # fmt: skip
    bench.add_argument("--out", default="bench-results", help="folder for JSON and markdown")
    bench.add_argument(
        "--find", action="store_true", help="let rtdnn measure every algorithm per layer first"
    )
    bench.add_argument(
        "--eager", action="store_true", help="also time plain calls (host overhead included)"
    )
    bench.add_argument(
        "--algo",
        type=_algo,
        default=None,
        metavar="{all,NAME}",
        help="time every convolution algorithm (all) or one (e.g. WINOGRAD) on each layer of "
        "the suite, forced, beside cuDNN: a row per layer, direction and algorithm, the fastest "
        "marked, and a table of where each wins (without a GPU: tiny layers, interpreted)",
    )
    bench.add_argument(
        "--math",
        choices=("tf32", "fp32"),
        default=None,
        help="with --algo and --dtype float32: tf32 (default) or fp32, strict IEEE float32 "
        "products (cuDNN's TF32 off too)",
    )
    tune = sub.add_parser(
        "tune",
        help="plan a model's convolutions under a workspace limit; list, export or clear the "
        "tuning database",
        description="--model plans every convolution of a model or layer suite in "
        "micro-batches under a workspace limit and prints the plan per layer. The tuning "
        "database keeps what is measured (and the tile choices of the GPU kernels) across "
        "processes. Its file is RTDNN_TUNING_DB, else $XDG_CACHE_HOME/rtdnn/tuning.sqlite3 or "
        "~/.cache/rtdnn/tuning.sqlite3; RTDNN_TUNING_DB=off keeps it in memory.",
    )
    action = tune.add_mutually_exclusive_group(required=True)
    action.add_argument(
        "--model",
        metavar="NAME",
        help=f"plan this: a layer suite ({', '.join(suites())}; first), a suite .json file, "
        "small, or a torchvision model (resnet18, alexnet, ...)",
    )
    action.add_argument("--list", action="store_true", help="print every stored result")
    action.add_argument("--export", metavar="FILE", help="write every stored result as JSON")
    action.add_argument("--clear", action="store_true", help="delete every stored result")
    planning = tune.add_argument_group("planning (with --model)")
    planning.add_argument(
        "--batch", type=_positive_int, default=None, help="default: the suite's, 32 for models"
    )
    planning.add_argument(
        "--workspace-limit",
        type=_bytes,
        default=None,
        metavar="BYTES",
        help="e.g. 64MiB, 1GiB, 500MB: per layer (reuse) or for the network (divide); default none",
    )
    planning.add_argument(
        "--policy", choices=POLICIES, default=None, help="micro-batch sizes (default all)"
    )
    planning.add_argument(
        "--workspace-policy",
        choices=("reuse", "divide"),
        default=None,
        help="reuse (default): the limit is each layer's; divide: one budget for the sum",
    )
    planning.add_argument("--direction", choices=DIRECTIONS, default=None, help="default all")
    planning.add_argument(
        "--dtype",
        type=_dtype,
        default=None,
        metavar="{bf16,fp16,float32}",
        help="default bf16 on a GPU, float32 without",
    )
    demo = sub.add_parser("demo", help="train a small CNN on the digits data set")
    demo.add_argument(
        "--epochs", type=_positive_int, default=None, help="default 20 (GPU), 6 (CPU)"
    )
    demo.add_argument(
        "--budget", type=_positive_seconds, default=None, help="seconds; default 200 on CPU"
    )
    demo.add_argument("--plot", default=None, help="write the loss curve to this PNG")
    parser.set_defaults(command_parser=None)
    bench.set_defaults(command_parser=bench)
    tune.set_defaults(command_parser=tune)
    demo.set_defaults(command_parser=demo)
    return parser


def _validate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Everything argparse's types and choices cannot check alone, before any work starts."""
    if args.command == "bench":
        _validate_bench(parser, args)
    elif args.command == "tune":
        _validate_tune(parser, args)
    elif args.command == "demo":
        if not _installed("sklearn"):
            parser.error(f"rtdnn demo needs scikit-learn for its data set: {DEMO_EXTRA}")
        if args.plot is not None:
            if not _installed("matplotlib"):
                parser.error(f"--plot needs matplotlib: {DEMO_EXTRA}")
            folder = os.path.dirname(os.path.abspath(args.plot))
            if not os.path.isdir(folder):
                parser.error(f"--plot {args.plot}: folder {folder} does not exist")


def _validate_tune(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.export is not None:
        folder = os.path.dirname(os.path.abspath(args.export))
        if not os.path.isdir(folder):
            parser.error(f"--export {args.export}: folder {folder} does not exist")
        if os.path.isdir(args.export):
            parser.error(f"--export {args.export}: is a folder, expected a file name")
    options = ("batch", "workspace_limit", "policy", "workspace_policy", "direction", "dtype")
    given = [name for name in options if getattr(args, name) is not None]
    if args.model is None:
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            parser.error(f"{flags}: only with --model")
        return
    from .bench.tune import is_suite

    if not is_suite(args.model) and args.model != "small":
        if not _installed("torchvision"):
            parser.error(
                f"--model {args.model}: not a suite ({', '.join(suites())}) nor a .json file; "
                "torchvision models need torchvision: pip install torchvision"
            )
        import torchvision

        if args.model not in torchvision.models.list_models(module=torchvision.models):
            parser.error(
                f"--model {args.model}: not a suite ({', '.join(suites())}), a .json file, "
                "small, or a torchvision classification model"
            )
    if args.workspace_policy == "divide" and args.workspace_limit is None:
        parser.error("--workspace-policy divide: needs --workspace-limit (the network budget)")


def _validate_bench(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    kinds = {
        "op": args.op is not None,
        "model": args.model is not None,
        "micro_batch": args.micro_batch,
    }
    chosen = [name for name, on in kinds.items() if on]
    if len(chosen) > 1:
        flags = " and ".join("--" + name.replace("_", "-") for name in chosen)
        parser.error(f"{flags}: give one of them")
    kind = chosen[0] if chosen else "algo" if args.algo is not None else "suite"
    options = (
        "suite", "dtype", "direction", "batch", "limit", "find", "eager", "no_fuse", "compile",
        "algo", "math", "policies", "budget",
    )  # fmt: skip
    given = [name for name in options if getattr(args, name) not in (None, False)]
    unused = [name for name in given if name not in _USED_BY[kind]]
    if unused:
        flags = ", ".join("--" + name.replace("_", "-") for name in unused)
        parser.error(f"{flags}: not used by {_KIND_NAMES[kind]}")
    if args.math is not None and args.dtype != "float32":
        parser.error(f"--math {args.math}: only with --dtype float32 (half precision always "
                     "accumulates in float32)")  # fmt: skip
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        parser.error(f"--out {args.out}: exists and is not a folder")
    if kind == "micro_batch" and not _installed("scipy"):
        parser.error("--micro-batch needs scipy for the network budget: pip install 'rtdnn[plan]'")
    if kind == "model" and args.model != "small" and not _installed("torchvision"):
        parser.error(f"--model {args.model} needs torchvision: pip install torchvision")
    args.given = given
    # Defaults, filled in only now so that an option given explicitly can be told apart.
    args.suite = args.suite or "resnet50"
    # The micro-batch experiment defaults to float32, the precision of mu-cuDNN's paper.
    args.dtype = args.dtype or ("float32" if kind == "micro_batch" else "bf16")
    args.direction = args.direction or "all"
    args.math = args.math or "tf32"


def _info(args) -> int:
    import torch
    import triton

    from .core import INTERPRETED

    try:
        import numpy

        numpy_version = numpy.__version__
    except ImportError:
        numpy_version = "not installed (Triton's interpreter needs it)"
    cuda = torch.cuda.is_available()
    print(f"rtdnn     {__version__}")
    print(f"python    {platform.python_version()}")
    cudnn = torch.backends.cudnn.version()
    print(f"torch     {torch.__version__} ({f'cuDNN {cudnn}' if cudnn else 'no cuDNN'})")
    print(f"triton    {triton.__version__}")
    print(f"numpy     {numpy_version}")
    if cuda:
        p = torch.cuda.get_device_properties(0)
        print(f"device    {p.name}, {p.multi_processor_count} SMs, {p.total_memory >> 30} GiB")
    else:
        print("device    no CUDA device")
    if INTERPRETED:
        kernels = "run in Triton's interpreter (TRITON_INTERPRET=1) on the CPU: correct, slow"
    elif cuda:
        kernels = "compiled for the GPU at first use"
    else:
        kernels = (
            "cannot run: no CUDA device, and TRITON_INTERPRET=1 was not set before rtdnn was "
            "imported (set it to run them in Triton's interpreter; `rtdnn bench` and `rtdnn "
            "demo` do)"
        )
    print(f"kernels   {kernels}")
    cache = os.environ.get("TRITON_CACHE_DIR", os.path.expanduser("~/.triton/cache"))
    print(f"cache     compiled Triton kernels: {cache}")
    from .select.database import default_path

    print(f"cache     tuning database: {default_path() or 'in memory (RTDNN_TUNING_DB=off)'}")
    return 0


def _self_check() -> int:
    from .bench.selfcheck import run_all

    failed = 0
    for name, err, ok in run_all():
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name:40s} rel. error {err:.1e}")
    print(f"self-check: {'all passed' if not failed else f'{failed} failed'}")
    return 1 if failed else 0


def _written(folder: str, since: float) -> list[str]:
    """The files in `folder` written at or after `since` (time.time())."""
    if not os.path.isdir(folder):
        return []
    paths = (os.path.join(folder, name) for name in sorted(os.listdir(folder)))
    return [os.path.abspath(p) for p in paths if os.path.getmtime(p) >= since]


def _bench(args) -> int:
    import torch

    start = time.time() - 1  # file times may be rounded down to the second
    if args.micro_batch:
        from .bench.micro_batch import run_suites

        run_suites(
            [args.suite] if "suite" in args.given else None, args.dtype,
            None if args.direction == "all" else [args.direction], args.batch, args.limit,
            args.policies, args.budget, args.out,
        )  # fmt: skip
        status = 0
    elif not torch.cuda.is_available() and args.model is not None:
        print("No CUDA device: a smoke run of the small CNN through Triton's interpreter.")
        ignored = [f"--model {args.model}"] if args.model != "small" else []
        ignored += ["--" + name for name in args.given if name in ("batch", "dtype")]
        if ignored:
            print(f"({', '.join(ignored)}: for the GPU benchmark; the smoke run takes none)")
        from .bench.model import run_model

        run_model(args.model, out_dir=args.out, fuse=not args.no_fuse, compile_mode=args.compile)
        status = 0
    elif args.algo is not None:  # with or without a GPU
        status = _bench_algos(args)
    elif not torch.cuda.is_available():
        print("No CUDA device: running the correctness self-check through Triton's interpreter.")
        print("Performance needs a GPU: run `rtdnn bench` on a machine with one.")
        given = args.given + (["op"] if args.op is not None else [])
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            print(f"({flags}: for the GPU benchmark; the self-check takes no options)")
        return _self_check()
    elif args.op is not None:
        status = _bench_op(args)
    elif args.model is not None:
        from .bench.model import run_model

        run_model(
            args.model, args.batch or 128, args.dtype, out_dir=args.out, fuse=not args.no_fuse,
            compile_mode=args.compile,
        )  # fmt: skip
        status = 0
    else:
        from .bench.conv import DIRECTIONS, run_suite

        directions = list(DIRECTIONS) if args.direction == "all" else [args.direction]
        rows = run_suite(
            args.suite, args.dtype, directions, args.batch, args.limit, args.out, args.find,
            args.eager,
        )  # fmt: skip
        status = 0 if all(r.ok for r in rows) else 1
    written = _written(args.out, start)
    print("results written to:" if written else f"no results written to {args.out}")
    for path in written:
        print(f"  {path}")
    return status


def _bench_algos(args) -> int:
    """Every algorithm (or one) forced on every layer beside cuDNN; without a GPU, on tiny
    layers through the interpreter. Status 1 if one failed or disagreed with the baseline."""
    import torch

    from .bench.conv import DIRECTIONS
    from .bench.conv_algos import TINY_LAYERS, run_algo_suite

    directions = list(DIRECTIONS) if args.direction == "all" else [args.direction]
    if torch.cuda.is_available():
        rows = run_algo_suite(
            args.suite, args.dtype, directions, args.algo, args.batch, args.limit, args.out,
            math_mode=args.math,
        )  # fmt: skip
    else:
        print(
            f"No CUDA device: a smoke run of --algo {args.algo} on tiny layers through Triton's "
            "interpreter (its times measure the interpreter)."
        )
        unused = [name for name in args.given if name in ("suite", "batch", "limit")]
        unused += ["dtype"] if "dtype" in args.given and args.dtype != "float32" else []
        if unused:
            flags = ", ".join("--" + name for name in unused)
            print(f"({flags}: for the GPU benchmark; the smoke run takes float32)")
        rows = run_algo_suite(
            "tiny", "float32", directions, args.algo, out_dir=args.out, layers=TINY_LAYERS,
            math_mode=args.math,
        )  # fmt: skip
    return 1 if any(r.failed for r in rows) else 0


def _bench_op(args) -> int:
    """Memory-bound primitives beside PyTorch eager (GB/s and percent of copy bandwidth);
    attention beside torch's fastest backend and recurrent layers beside torch's (cuDNN's),
    in TFLOP/s and percent of the matmul ceiling; CTC and the spatial transformer beside
    torch's. Exit status 1 when a row of attention, recurrent layers, CTC or the sampler
    disagrees with torch (every family chosen runs first)."""
    from .bench.attention import run_attention
    from .bench.ctc import run_ctc
    from .bench.grid_sample import run_grid_sample
    from .bench.norm import run_norm
    from .bench.prims import OPS as PRIM_OPS
    from .bench.prims import run_ops
    from .bench.rnn import run_rnn

    if args.op in ("norm", "all"):
        run_norm(args.out)
    if args.op in (*PRIM_OPS, "all"):
        run_ops(list(PRIM_OPS) if args.op == "all" else [args.op], args.out)
    checked = {
        "attention": run_attention, "rnn": run_rnn, "ctc": run_ctc, "grid_sample": run_grid_sample,
    }  # fmt: skip
    failed = False
    for name, run in checked.items():
        if args.op in (name, "all"):
            rows = run(args.out, args.limit)
            failed = failed or any(not r.ok for r in rows)
    return 1 if failed else 0


def _tune(args) -> int:
    """Plan a model (--model), or list, export or clear the tuning database."""
    import json

    from .select import database as tuning

    if args.model is not None:
        import torch

        from .bench.tune import run_tune

        default_dtype = "bf16" if torch.cuda.is_available() else "float32"
        plan = run_tune(
            args.model, args.batch, args.dtype or default_dtype, args.workspace_limit,
            args.policy or "all", args.workspace_policy or "reuse", args.direction or "all",
        )  # fmt: skip
        print(f"{args.model} on {'cuda' if torch.cuda.is_available() else 'cpu'}")
        print(plan)
        return 0

    db = tuning.database()
    where = db.location if db.path is not None else "in memory (RTDNN_TUNING_DB=off)"
    if args.clear:
        print(f"tuning database {where}: deleted {db.clear()} stored results and tile choices")
    elif args.export is not None:
        document = db.export()
        with open(args.export, "w") as f:
            json.dump(document, f, indent=1)
        print(
            f"{len(document['results'])} results and {len(document['tiles'])} tile choices "
            f"from {where} written to {os.path.abspath(args.export)}"
        )
    else:
        _list_tuning(where, db.entries(), db.tile_entries())
    return 0


def _list_tuning(where: str, entries, tile_entries) -> None:
    """Results grouped by environment, then by problem and batch size, fastest first."""
    print(f"tuning database {where}: {len(entries)} results, {len(tile_entries)} tile choices")
    environment = group = None
    for e in entries:
        if e.environment != environment:
            environment, group = e.environment, None
            print(f"\n{environment}")
        if (e.problem, e.batch) != group:
            group = (e.problem, e.batch)
            print(f"  {e.problem}  batch {e.batch}")
        print(
            f"    {e.algo:22s} {e.time_ms:10.4f} ms {e.workspace_bytes:>14,d} B  "
            f"{'deterministic' if e.deterministic else 'nondeterministic':16s} {e.status}"
        )
    if tile_entries:
        print("\ntile choices")
    for t in tile_entries:
        print(f"  {t.environment}  {t.algo}  {t.problem}: {t.tiles}")


def _demo(args) -> int:
    import torch

    from .demo import train

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
        print(f"loss curve written to {os.path.abspath(args.plot)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    args = parser.parse_args(argv)
    _validate(args.command_parser or parser, args)
    runs_kernels = args.command in ("bench", "demo") or getattr(args, "model", None) is not None
    if runs_kernels and not _cpu_ready():
        # Without a GPU the kernels run in the interpreter, which must be chosen before triton
        # is imported (importing rtdnn imports it): re-run this command with it set.
        os.environ["TRITON_INTERPRET"] = "1"
        os.execv(sys.executable, [sys.executable, "-m", "rtdnn.cli", *argv])
    return {"info": _info, "bench": _bench, "tune": _tune, "demo": _demo}[args.command](args)


def _cpu_ready() -> bool:
    """True if kernels can run here as things stand: a GPU, or the interpreter already on."""
    import torch

    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


if __name__ == "__main__":
    sys.exit(main())
