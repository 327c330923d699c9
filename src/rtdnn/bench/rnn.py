"""Recurrent layers beside PyTorch: rtdnn.nn.LSTM and GRU against torch.nn's (cuDNN's RNN on a
GPU) with the same weights, forward and forward + backward, in one process on one GPU
(`rtdnn bench --op rnn`).

Cases, DeepBench-style: LSTM and GRU with hidden sizes 256 to 2048, 50 to 1500 time steps,
batches of 16 to 128, in bfloat16; bidirectional speech-style stacks (3 layers of 1024 over
161 spectrogram features); the first case is the 2-layer LSTM of hidden 1024, T 128, batch 64.
Work counts the GEMMs: per layer and direction, T x batch x 2 x gates x hidden x (input +
hidden) multiply-adds' flops forward, twice that for the backward (data and weights); TFLOP/s
is reported beside the measured matmul ceiling. Both sides are timed as plain calls (the
host's cost of launching each step included), inputs of shape (T, batch, input).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..core.timing import device_time_ms
from .conv import matmul_ceiling
from .output import write_results

DEVICE = "cuda"  # the tests run the harness on the CPU (interpreter) with tiny cases
GATES = {"lstm": 4, "gru": 3}
# bf16 keeps 8 bits and each side rounds every step's states its own way: torch's bf16 LSTM and
# GRU (2 layers, 64 to 300 steps) differ from float32 by 4e-3 to 7e-3 of the norm, output and
# input gradient alike, so two bf16 implementations may differ by about 1e-2.
AGREEMENT = {torch.bfloat16: 5e-2, torch.float16: 1e-2, torch.float32: 1e-4}


@dataclass(frozen=True)
class RnnCase:
    """One recurrent stack: mode ("lstm" or "gru"), layers, hidden size, input size, time
    steps, batch, bidirectional."""

    mode: str
    layers: int
    hidden: int
    input_size: int
    steps: int
    batch: int
    bidirectional: bool = False

    @property
    def name(self) -> str:
        stack = f"{self.layers}x" if self.layers > 1 else ""
        bi = " bidir" if self.bidirectional else ""
        return (
            f"{self.mode.upper()} {stack}H{self.hidden}{bi} I{self.input_size} "
            f"T{self.steps} N{self.batch}"
        )

    def forward_flops(self) -> float:
        """GEMM flops of the forward: the input projection and the recurrent product of every
        step, per layer and direction (elementwise gate work not counted)."""
        dirs = 2 if self.bidirectional else 1
        total = 0
        for layer in range(self.layers):
            inputs = self.input_size if layer == 0 else dirs * self.hidden
            per_direction = 2 * GATES[self.mode] * self.hidden * (inputs + self.hidden)
            total += dirs * self.steps * self.batch * per_direction
        return float(total)


@dataclass
class RnnRow:
    case: str
    direction: str  # "forward" or "forward+backward"
    rtdnn_ms: float
    torch_ms: float
    ratio: float  # torch_ms / rtdnn_ms: above 1 means rtdnn is faster
    rtdnn_tflops: float
    torch_tflops: float
    rtdnn_pct: float  # of the matmul ceiling
    err: float  # ||rtdnn - torch|| / ||torch|| (output; with the backward, the input's gradient)
    ok: bool


def cases() -> list[RnnCase]:
    """The suite, the target case first (so that --limit 1 runs it)."""
    return [
        RnnCase("lstm", 2, 1024, 1024, 128, 64),
        # Single layers, input size = hidden (DeepBench's training shapes, narrowed).
        RnnCase("lstm", 1, 256, 256, 150, 64),
        RnnCase("lstm", 1, 512, 512, 1500, 16),
        RnnCase("lstm", 1, 1024, 1024, 50, 128),
        RnnCase("lstm", 1, 1536, 1536, 50, 32),
        RnnCase("lstm", 1, 2048, 2048, 50, 32),
        RnnCase("gru", 1, 256, 256, 1500, 32),
        RnnCase("gru", 1, 512, 512, 375, 64),
        RnnCase("gru", 1, 1024, 1024, 750, 32),
        RnnCase("gru", 1, 1536, 1536, 50, 128),
        RnnCase("gru", 1, 2048, 2048, 150, 16),
        # Speech-style bidirectional stacks over 161 spectrogram features.
        RnnCase("lstm", 3, 1024, 161, 500, 32, bidirectional=True),
        RnnCase("gru", 3, 768, 161, 500, 32, bidirectional=True),
        RnnCase("lstm", 2, 512, 161, 1000, 64, bidirectional=True),
    ]


def _modules(case: RnnCase, dtype: torch.dtype) -> tuple[torch.nn.RNNBase, torch.nn.RNNBase]:
    """(rtdnn's module, torch's) with the same weights, on DEVICE in `dtype`."""
    import rtdnn.nn

    kinds = {"lstm": (torch.nn.LSTM, rtdnn.nn.LSTM), "gru": (torch.nn.GRU, rtdnn.nn.GRU)}
    theirs_cls, ours_cls = kinds[case.mode]
    args = (case.input_size, case.hidden, case.layers)
    kw = dict(bidirectional=case.bidirectional)
    theirs = theirs_cls(*args, **kw).to(DEVICE, dtype)
    ours = ours_cls(*args, **kw).to(DEVICE, dtype)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def run_case(case: RnnCase, ceiling: float, dtype=torch.bfloat16) -> list[RnnRow]:
    """Forward and forward + backward of one case, rtdnn beside torch."""
    ours, theirs = _modules(case, dtype)
    x = torch.randn(case.steps, case.batch, case.input_size, device=DEVICE, dtype=dtype)
    x.requires_grad_()
    dirs = 2 if case.bidirectional else 1
    dy = torch.randn(case.steps, case.batch, dirs * case.hidden, device=DEVICE, dtype=dtype)

    def forward(module: torch.nn.RNNBase) -> Callable[[], torch.Tensor]:
        return lambda: module(x)[0]

    def with_backward(module: torch.nn.RNNBase) -> Callable[[], torch.Tensor]:
        def step() -> torch.Tensor:
            x.grad = None
            module.zero_grad(set_to_none=True)
            module(x)[0].backward(dy)
            return x.grad

        return step

    rows = []
    flops = case.forward_flops()
    for direction, mine, other, work in (
        ("forward", forward(ours), forward(theirs), flops),
        ("forward+backward", with_backward(ours), with_backward(theirs), 3 * flops),
    ):
        with torch.no_grad() if direction == "forward" else torch.enable_grad():
            err = _rel(mine().detach(), other().detach())
            ms = device_time_ms(mine, graph=False)
            their_ms = device_time_ms(other, graph=False)
        tflops = work / ms / 1e9
        row = RnnRow(case.name, direction, ms, their_ms, their_ms / ms, tflops,
                     work / their_ms / 1e9, 100 * tflops / ceiling, err,
                     err <= AGREEMENT[dtype])  # fmt: skip
        rows.append(row)
    return rows


def markdown(rows: list[RnnRow], title: str) -> str:
    lines = [
        f"### {title}",
        "",
        "| case | direction | rtdnn ms | torch ms | ratio | rtdnn TFLOP/s | torch TFLOP/s | "
        "rtdnn % ceiling | ok |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.case} | {r.direction} | {r.rtdnn_ms:.3f} | {r.torch_ms:.3f} | "
            f"{r.ratio:.2f} | {r.rtdnn_tflops:.1f} | {r.torch_tflops:.1f} | {r.rtdnn_pct:.0f} | "
            f"{'yes' if r.ok else f'NO ({r.err:.1e})'} |"
        )
    return "\n".join(lines) + "\n"


def run_rnn(out_dir: str | None = None, limit: int | None = None) -> list[RnnRow]:
    """Run the suite (its first `limit` cases) on the current GPU, print a markdown table,
    and with `out_dir` write rnn_bf16.json and .md there. Returns the rows."""
    if not torch.cuda.is_available():
        raise RuntimeError("rtdnn.bench.rnn needs a CUDA GPU")
    torch.manual_seed(0)
    ceiling = matmul_ceiling(torch.bfloat16)
    rows: list[RnnRow] = []
    for case in cases()[:limit]:
        for row in run_case(case, ceiling):
            rows.append(row)
            print(
                f"{row.case:40s} {row.direction:16s} rtdnn {row.rtdnn_ms:8.3f} ms "
                f"{row.rtdnn_tflops:5.1f} TFLOP/s, torch {row.torch_ms:8.3f} ms, "
                f"ratio {row.ratio:5.2f} {'ok' if row.ok else 'NO'}",
                flush=True,
            )
        torch.cuda.empty_cache()
    backend = (
        "cuDNN"
        if torch.backends.cudnn.is_available() and torch.backends.cudnn.enabled
        else "native"
    )
    title = (
        f"Recurrent layers, bf16, {torch.cuda.get_device_name()} (torch: {backend}), "
        f"matmul ceiling {ceiling:.0f} TFLOP/s"
    )
    md = markdown(rows, title)
    print(md)
    if out_dir:
        write_results(out_dir, "rnn_bf16", title, rows, md, ceiling=ceiling)
    return rows
