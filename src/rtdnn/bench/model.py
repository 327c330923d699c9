"""Whole-model benchmark: a torchvision ResNet-50, EfficientNet-B0, MobileNetV3-Large,
ConvNeXt-T or ViT-B/16 (or a small CNN) converted with rtdnn.convert, beside the unconverted
PyTorch model (cuDNN, benchmark mode), in one process.

Measures inference and training-step throughput (images/s; SGD with momentum, autocast,
channels-last), issued eagerly from Python; on a GPU the training step again with autograd's
backward on the calling thread (torch.autograd.set_multithreading_enabled(False)); inference
again with the batch norms that follow convolutions folded into them on both sides
(rtdnn.convert(fold_batch_norm=True) against torch.fx.experimental.optimization.fuse), as
inference deployments run; on a GPU, replayed from a CUDA graph of the whole step (forward,
backward and optimizer step captured once), which takes the host's cost of issuing each layer
out of both sides; on request, both models under torch.compile (the loss and optimizer stay
eager); the converted model's output difference from PyTorch's; and where the GPU time of a
training step goes by layer type (convolution, normalization, pooling, activation, other),
from the profiler's kernel names.
Without a GPU it runs a smoke version: the small CNN for two steps through the interpreter,
checking that conversion, forward and backward run.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import time

import torch

from .. import nn as rnn
from ..convert import convert
from ..core.timing import capture

#: Kernel-name fragments -> layer type, for both cuDNN/ATen kernels and rtdnn's Triton kernels.
CATEGORIES = {
    "attention": ("attention", "attn", "fmha", "flash", "sdpa"),
    "convolution": ("conv", "brgemm", "im2col", "col2im", "wgrad", "dgrad", "fprop", "gemm",
                    "sm90_xmma", "cutlass", "direct_", "depthwise", "pack_filter"),
    "normalization": ("batch_norm", "batchnorm", "bn_", "norm", "welford"),
    "pooling": ("pool",),
    "activation": ("relu", "elementwise", "threshold", "activation"),
}  # fmt: skip


def category(kernel_name: str) -> str:
    name = kernel_name.lower()
    for cat, needles in CATEGORIES.items():
        if any(n in name for n in needles):
            return cat
    return "other"


class ResidualBlock(torch.nn.Module):
    """conv-bn-relu, conv-bn, add the input, relu: ResNet's basic block."""

    def __init__(self, c: int):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(c)
        self.conv2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(c)
        self.relu = torch.nn.ReLU()

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(y)) + x)


def small_cnn(classes: int = 10) -> torch.nn.Module:
    """A ResNet-style network small enough for the interpreter."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False),
        torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        ResidualBlock(16),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(16, classes),
    )


#: The torchvision models `--model` takes (224x224 input, random weights): ResNet-50, and the
#: depthwise networks whose depthwise convolutions run as DIRECT.
TORCHVISION_MODELS = (
    "resnet50", "efficientnet_b0", "mobilenet_v3_large", "convnext_tiny", "vit_b_16"
)  # fmt: skip
MODELS = (*TORCHVISION_MODELS, "small")


def build(name: str) -> tuple[torch.nn.Module, int]:
    """(model, input resolution)."""
    if name in TORCHVISION_MODELS:
        import torchvision

        model = getattr(torchvision.models, name)(weights=None)
        if name == "vit_b_16":
            # torchvision starts ViT's classifier at zero: both outputs would be zero and
            # their difference say nothing.
            torch.nn.init.normal_(model.heads.head.weight, std=0.02)
        return model, 224
    if name == "small":
        return small_cnn(), 32
    raise ValueError(f"model={name!r}: expected one of {MODELS}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _images_per_s(step, batch: int, steps: int, warmup: int, device: torch.device) -> float:
    for _ in range(warmup):
        step()
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    return batch * steps / (time.perf_counter() - start)


def _breakdown(step, device: torch.device) -> dict[str, float]:
    """GPU milliseconds per layer type over one call of `step`."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        _sync(device)
    out: dict[str, float] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            cat = category(event.name)
            out[cat] = out.get(cat, 0.0) + event.device_time_total / 1e3
    return out


def run_model(
    name: str = "resnet50",
    batch: int = 128,
    dtype: str = "bf16",
    steps: int = 20,
    out_dir: str | None = None,
    fuse: bool = True,
    compile_mode: str | None = None,
) -> dict:
    """Benchmark `name` converted (with `convert(fuse=fuse)`: batch norm fused with the ReLU and
    residual add after it) and unconverted; print a markdown table; return the numbers.
    compile_mode: also time both models under torch.compile(mode=compile_mode) ("default",
    "reduce-overhead", ...), the seconds of each side's first calls (tracing and compiling)
    reported beside (without a GPU: the smoke run's small CNN, compiled for the CPU)."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if not cuda:  # a smoke run through the interpreter
        name, batch, steps = "small", 2, 1
    torch.backends.cudnn.benchmark = True
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype) if cuda else None
    torch.manual_seed(0)
    model, size = build(name)
    model = model.to(device).to(memory_format=torch.channels_last)
    converted, report = convert(model, fuse=fuse)
    x = torch.randn(batch, 3, size, size, device=device).to(memory_format=torch.channels_last)
    target = torch.randint(0, 10, (batch,), device=device)

    def autocast(cache: bool = True):
        # A captured step must not keep autocast's cast weights between calls (torch's CUDA
        # graph notes): the cache would outlive the graph's memory pool.
        return torch.autocast(device.type, dtype=amp, enabled=amp is not None, cache_enabled=cache)

    results: dict = {"model": name, "batch": batch, "dtype": dtype if cuda else "float32",
                     "device": torch.cuda.get_device_name() if cuda else "cpu (interpreter)",
                     "replaced": report.counts(), "kept": [k[:2] for k in report.kept],
                     "fused": len(report.fused)}  # fmt: skip
    model.eval()
    converted.eval()
    with torch.no_grad(), autocast():
        ref, out = model(x).float(), converted(x).float()
    results["output_rel_diff"] = float((out - ref).norm() / ref.norm())
    steps_fns = {}
    for label, net, loss_fn in (
        ("pytorch", model, torch.nn.CrossEntropyLoss()),
        ("rtdnn", converted, rnn.CrossEntropyLoss()),
    ):
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

        def infer(net=net, cache=True):
            with torch.no_grad(), autocast(cache):
                net(x)

        def train(net=net, opt=opt, loss_fn=loss_fn, cache=True):
            with autocast(cache):
                loss = loss_fn(net(x).float(), target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        steps_fns[label] = (net, infer, train)
    # Rounds alternate between the two models and the median is kept, so that a slow spell of
    # the host or the GPU does not land on one side only. Eager rounds of one run spread by up
    # to 15% with the host's speed: five of them give a steadier median than three.
    rounds = 5 if cuda else 1
    samples: dict[str, list[float]] = {}
    for _ in range(rounds):
        for label, (net, infer, train) in steps_fns.items():
            net.eval()
            rate = _images_per_s(infer, batch, steps, 2, device)
            samples.setdefault(f"{label}_inference_img_s", []).append(rate)
            net.train()
            rate = _images_per_s(train, batch, steps, 2, device)
            samples.setdefault(f"{label}_training_img_s", []).append(rate)
            if cuda:  # the CPU's backward runs on the calling thread already
                # Autograd runs a GPU graph's backward on a thread of its own, where the
                # Python of each layer's backward ran 1.5 times slower (BENCHMARKS.md).
                with torch.autograd.set_multithreading_enabled(False):
                    rate = _images_per_s(train, batch, steps, 2, device)
                samples.setdefault(f"{label}_calling_thread_training_img_s", []).append(rate)
    folded_steps = _folded_steps(model, autocast, x, results)
    for _ in range(rounds if folded_steps else 0):
        for label, infer in folded_steps.items():
            rate = _images_per_s(infer, batch, steps, 2, device)
            samples.setdefault(f"{label}_folded_inference_img_s", []).append(rate)
    if cuda:  # the same steps replayed from CUDA graphs, each side captured once per kind
        for label, (net, infer, train) in steps_fns.items():
            for kind, fn, mode in (("inference", infer, False), ("training", train, True)):
                net.train(mode)
                step = functools.partial(fn, cache=False)
                replay = capture(step)  # warm-up on a side stream, then one capture
                if replay is step:  # the capture failed (capture warned): no graph row
                    continue
                for _ in range(rounds):
                    rate = _images_per_s(replay, batch, steps, 2, device)
                    samples.setdefault(f"{label}_graph_{kind}_img_s", []).append(rate)
    if compile_mode is not None:
        results["compile_mode"] = compile_mode
        compiled_steps = _compiled_steps(steps_fns, compile_mode, device, results)
        for _ in range(rounds):  # alternating sides, as the eager rounds
            for key, (net, mode, step) in compiled_steps.items():
                net.train(mode)
                rate = _images_per_s(step, batch, steps, 2, device)
                samples.setdefault(f"{key}_img_s", []).append(rate)
    for key, values in samples.items():
        results[key] = sorted(values)[len(values) // 2]
        results[key + "_rounds"] = values
    if cuda:
        for label, (net, _, train) in steps_fns.items():
            net.train()
            results[f"{label}_training_ms_by_type"] = _breakdown(train, device)
        for kind in KINDS:
            if f"rtdnn_{kind}_img_s" in results and f"pytorch_{kind}_img_s" in results:
                results[f"{kind}_ratio"] = (
                    results[f"rtdnn_{kind}_img_s"] / results[f"pytorch_{kind}_img_s"]
                )
    md = markdown(results)
    print(md)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, f"model_{name}.json"), "w") as f:
            json.dump(results, f, indent=1)
        with open(os.path.join(out_dir, f"model_{name}.md"), "w") as f:
            f.write(md)
    return results


def _folded_steps(model: torch.nn.Module, autocast, x: torch.Tensor, results: dict) -> dict:
    """Each side's inference step with the batch norms after convolutions folded into them:
    PyTorch's by torch.fx.experimental.optimization.fuse (weights and bias), rtdnn's by
    convert(fold_batch_norm=True) (weights, bias and the ReLU after them, in the GEMM's
    epilogue). {} when either side cannot fold the model (the reason goes into `results`)."""
    from torch.fx.experimental.optimization import fuse as torch_fold

    eval_model = copy.deepcopy(model).eval()
    try:
        torch_folded = torch_fold(eval_model)
        rtdnn_folded, report = convert(eval_model, fold_batch_norm=True)
    except Exception as e:  # an untraceable model: no folded rows
        results["folded_error"] = f"{type(e).__name__}: {e}"[:500]
        return {}
    nets = {"pytorch": torch_folded, "rtdnn": rtdnn_folded}
    results["folded"] = len(report.folded)
    with torch.no_grad(), autocast():
        ref, out = torch_folded(x).float(), rtdnn_folded(x).float()
    results["folded_output_rel_diff"] = float((out - ref).norm() / ref.norm())

    def infer(net):
        with torch.no_grad(), autocast():
            net(x)

    return {label: functools.partial(infer, net) for label, net in nets.items()}


def _compiled_steps(steps_fns: dict, mode: str, device: torch.device, results: dict) -> dict:
    """Each side's model under torch.compile(mode=mode), its inference and training steps
    compiled by three calls each (tracing, compiling; reduce-overhead records its CUDA graphs
    too), whose seconds go into `results`: {"<side>_compiled_<kind>": (net, training mode,
    step)}. A side whose compilation fails gets an error in `results` and no step."""
    out = {}
    for label, (net, infer, train) in steps_fns.items():
        compiled = None
        for kind, fn, training in (("inference", infer, False), ("training", train, True)):
            net.train(training)
            start = time.perf_counter()
            try:
                if compiled is None:
                    compiled = torch.compile(net, mode=mode)
                step = functools.partial(fn, compiled)
                for _ in range(3):
                    step()
                _sync(device)
            except Exception as e:  # reported beside the other rows, which still run
                results[f"{label}_compile_{kind}_error"] = f"{type(e).__name__}: {e}"[:500]
                continue
            results[f"{label}_compile_{kind}_s"] = time.perf_counter() - start
            out[f"{label}_compiled_{kind}"] = (net, training, step)
    return out


#: The throughput rows: eager steps, the same steps replayed from CUDA graphs, and the models
#: under torch.compile.
KINDS = (
    "inference", "training", "calling_thread_training", "folded_inference", "graph_inference",
    "graph_training", "compiled_inference", "compiled_training",
)  # fmt: skip


def _row_label(kind: str, r: dict) -> str:
    """The table's name for a throughput row."""
    if kind.startswith("graph_"):
        return kind.removeprefix("graph_") + ", CUDA graph"
    if kind == "folded_inference":
        return f"inference, batch norms folded into convolutions ({r.get('folded', 0)})"
    if kind == "calling_thread_training":
        return "training, backward on the calling thread"
    if kind.startswith("compiled_"):
        return kind.removeprefix("compiled_") + f", torch.compile ({r['compile_mode']})"
    return kind


def markdown(r: dict) -> str:
    lines = [
        f"### {r['model']}, batch {r['batch']}, {r['dtype']}, {r['device']}, "
        f"{r.get('fused', 0)} batch norms fused",
        "",
        "| | PyTorch img/s | rtdnn img/s | ratio |",
        "|---|---:|---:|---:|",
    ]
    for kind in KINDS:
        a, b = r.get(f"pytorch_{kind}_img_s"), r.get(f"rtdnn_{kind}_img_s")
        if kind.startswith("compiled_") and "compile_mode" not in r:
            continue
        label = _row_label(kind, r)
        if a is None or b is None:  # no graph rows without a GPU, a capture or compile failed
            # A model either side cannot fold, or a run from before the calling-thread row:
            # no row.
            if kind in ("folded_inference", "calling_thread_training"):
                continue
            if not r["device"].startswith("cpu"):
                failed = "compile failed" if kind.startswith("compiled_") else "capture failed"
                cells = [f"{v:.1f}" if v is not None else failed for v in (a, b)]
                lines.append(f"| {label} | {cells[0]} | {cells[1]} | |")
            continue
        lines.append(f"| {label} | {a:.1f} | {b:.1f} | {b / a:.2f} |")
    lines += ["", f"converted output vs PyTorch: relative difference {r['output_rel_diff']:.1e}"]
    if "folded_output_rel_diff" in r:
        lines += [f"folded: relative difference {r['folded_output_rel_diff']:.1e}"]
    if "compile_mode" in r:
        first = ", ".join(
            f"{side} {kind} {r[f'{side}_compile_{kind}_s']:.0f} s"
            for side in ("pytorch", "rtdnn")
            for kind in ("inference", "training")
            if f"{side}_compile_{kind}_s" in r
        )
        lines += ["", f"torch.compile's first three calls (tracing, compiling; training's "
                  f"recompiles the graph compiled for inference): {first}"]  # fmt: skip
        for side in ("pytorch", "rtdnn"):
            for kind in ("inference", "training"):
                if f"{side}_compile_{kind}_error" in r:
                    error = r[f"{side}_compile_{kind}_error"]
                    lines.append(f"{side} {kind} under torch.compile failed: {error}")
    if r["device"].startswith("cpu"):
        lines += [
            "",
            "(CPU: rtdnn runs in Triton's interpreter; the times are no measure of speed)",
        ]
    if "rtdnn_training_ms_by_type" in r:
        lines += ["", "| training step, GPU ms | PyTorch | rtdnn |", "|---|---:|---:|"]
        cats = [*CATEGORIES, "other"]
        for cat in cats:
            a = r["pytorch_training_ms_by_type"].get(cat, 0.0)
            b = r["rtdnn_training_ms_by_type"].get(cat, 0.0)
            lines.append(f"| {cat} | {a:.2f} | {b:.2f} |")
        gpu = [sum(r[f"{k}_training_ms_by_type"].values()) for k in ("pytorch", "rtdnn")]
        wall = [1e3 * r["batch"] / r[f"{k}_training_img_s"] for k in ("pytorch", "rtdnn")]
        lines.append(f"| **all kernels** | {gpu[0]:.2f} | {gpu[1]:.2f} |")
        lines.append(f"| **wall time per step** | {wall[0]:.2f} | {wall[1]:.2f} |")
        lines += [
            "",
            "Wall time above the kernels' total is time the GPU waits for the host to issue work.",
        ]
    return "\n".join(lines) + "\n"
