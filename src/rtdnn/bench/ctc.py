"""CTC loss beside PyTorch: rtdnn.ctc_loss against torch.nn.functional.ctc_loss, forward and
forward + backward, in one process on one GPU (`rtdnn bench --op ctc`).

Cases at speech sizes: 200 to 1000 frames, batches of 32 and 64, alphabets of 29 (characters)
to 5000 (word pieces), targets of up to 200 labels; float32 log-probabilities, reduction
"mean". torch runs cuDNN's CTC only under its own conditions (blank 0, float32, every input
length equal to T, target lengths below 256, targets concatenated int32 on the host, lengths as
lists of ints), and its native CUDA kernels otherwise: each row times torch in both forms
where cuDNN takes the call and reports the faster, and names it. rtdnn is given the usual
form (padded int64 targets and lengths, on the GPU). Cases with unequal input lengths are
ones cuDNN declines. Both sides are timed as plain calls (rtdnn checks the lengths and
targets on the host before launching, as torch's native path also synchronizes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..core.timing import device_time_ms
from .output import write_results

DEVICE = "cuda"  # the tests run the harness on the CPU (interpreter) with tiny cases
# float32 sums over up to 1000 frames in log space, in different orders on the two sides.
AGREEMENT = 1e-3


@dataclass(frozen=True)
class CtcCase:
    """One CTC call: frames T, batch N, classes C (blank 0 included), the longest target S,
    and whether every input length is T (else they vary down to 3/4 of T)."""

    steps: int
    batch: int
    classes: int
    max_target: int
    full_lengths: bool = True

    @property
    def name(self) -> str:
        varied = " varied lengths" if not self.full_lengths else ""
        return f"T{self.steps} N{self.batch} C{self.classes} S{self.max_target}{varied}"


@dataclass
class CtcRow:
    case: str
    direction: str  # "forward" or "forward+backward"
    rtdnn_ms: float
    torch_ms: float
    torch_backend: str  # "cudnn" or "native": the faster form torch ran
    ratio: float  # torch_ms / rtdnn_ms: above 1 means rtdnn is faster
    err: float  # ||rtdnn - torch|| / ||torch|| (torch native; the loss, or the gradient)
    ok: bool


def cases() -> list[CtcCase]:
    """The suite: character-level (C 29) and word-piece (C 1000, 5000) alphabets."""
    return [
        CtcCase(200, 64, 29, 50),
        CtcCase(500, 32, 29, 150),
        CtcCase(1000, 32, 29, 200),
        CtcCase(1000, 64, 29, 200, full_lengths=False),
        CtcCase(400, 64, 1000, 100),
        CtcCase(250, 32, 5000, 100),
        CtcCase(1000, 32, 5000, 200, full_lengths=False),
    ]


@dataclass
class CtcInputs:
    log_probs: torch.Tensor  # (T, N, C) float32, a leaf that requires grad
    targets: torch.Tensor  # (N, S) int64 on DEVICE; labels beyond a length are ignored
    input_lengths: list[int]
    target_lengths: list[int]


def make_inputs(case: CtcCase, gen: torch.Generator | None = None) -> CtcInputs:
    """Random log-probabilities (drawn on DEVICE by its default generator) and feasible
    targets and lengths (drawn by `gen`: labels 1 .. C-1, each target short enough for its
    input length even with every label repeated)."""
    T, N, C, S = case.steps, case.batch, case.classes, case.max_target
    logits = torch.randn(T, N, C, device=DEVICE)
    log_probs = logits.log_softmax(-1).requires_grad_()
    if case.full_lengths:
        input_lengths = [T] * N
    else:
        input_lengths = torch.randint(3 * T // 4, T + 1, (N,), generator=gen).tolist()
        input_lengths[0] = T
    target_lengths = torch.randint(S // 2, S + 1, (N,), generator=gen)
    target_lengths = torch.minimum(target_lengths, (torch.tensor(input_lengths) - 1) // 2)
    target_lengths[0] = min(S, (T - 1) // 2)
    targets = torch.randint(1, C, (N, S), generator=gen)
    return CtcInputs(log_probs, targets.to(DEVICE), input_lengths, target_lengths.tolist())


def _cudnn_takes(inputs: CtcInputs, flat: torch.Tensor) -> bool:
    """Whether torch's ctc_loss runs cuDNN's for the host-targets form (torch's own test;
    it has no CPU kernel, so off a GPU the answer is no)."""
    if inputs.log_probs.device.type != "cuda":
        return False
    return bool(torch._use_cudnn_ctc_loss(
        inputs.log_probs, flat, inputs.input_lengths, inputs.target_lengths, 0
    ))  # fmt: skip


def _torch_calls(inputs: CtcInputs) -> dict[str, Callable[[], torch.Tensor]]:
    """torch's ctc_loss in each form it may run: "native" (the padded targets and length
    tensors on the GPU, cuDNN off), and "cudnn" where cuDNN takes the call."""
    lp, n = inputs.log_probs, inputs.targets.shape[0]
    in_len = torch.tensor(inputs.input_lengths, device=lp.device)
    tgt_len = torch.tensor(inputs.target_lengths, device=lp.device)

    def native() -> torch.Tensor:
        with torch.backends.cudnn.flags(enabled=False):
            return F.ctc_loss(lp, inputs.targets, in_len, tgt_len)

    calls = {"native": native}
    host = inputs.targets.cpu()
    flat = torch.cat([host[i, : inputs.target_lengths[i]] for i in range(n)]).int()
    if _cudnn_takes(inputs, flat):

        def cudnn() -> torch.Tensor:
            return F.ctc_loss(lp, flat, inputs.input_lengths, inputs.target_lengths)

        calls["cudnn"] = cudnn
    return calls


def _time_torch(calls: dict[str, Callable[[], object]]) -> tuple[float, str]:
    """The faster of torch's forms, and its name."""
    times = {name: device_time_ms(call, graph=False) for name, call in calls.items()}
    name = min(times, key=times.get)
    return times[name], name


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def run_case(case: CtcCase, gen: torch.Generator | None = None) -> list[CtcRow]:
    """Forward and forward + backward of one case, rtdnn beside torch."""
    import rtdnn

    inputs = make_inputs(case, gen)
    lp = inputs.log_probs
    in_len = torch.tensor(inputs.input_lengths, device=lp.device)
    tgt_len = torch.tensor(inputs.target_lengths, device=lp.device)

    def ours() -> torch.Tensor:
        return rtdnn.ctc_loss(lp, inputs.targets, in_len, tgt_len)

    def with_backward(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        def step() -> torch.Tensor:
            lp.grad = None
            fn().backward()
            return lp.grad

        return step

    theirs = _torch_calls(inputs)
    rows = []
    for direction, mine, others in (
        ("forward", ours, theirs),
        (
            "forward+backward",
            with_backward(ours),
            {name: with_backward(call) for name, call in theirs.items()},
        ),
    ):
        with torch.no_grad() if direction == "forward" else torch.enable_grad():
            err = _rel(mine().detach(), others["native"]().detach())
            ms = device_time_ms(mine, graph=False)
            their_ms, backend = _time_torch(others)
        ok = err <= AGREEMENT
        rows.append(CtcRow(case.name, direction, ms, their_ms, backend, their_ms / ms, err, ok))
    return rows


def markdown(rows: list[CtcRow], title: str) -> str:
    lines = [
        f"### {title}",
        "",
        "| case | direction | rtdnn ms | torch ms (backend) | ratio | ok |",
        "|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.case} | {r.direction} | {r.rtdnn_ms:.3f} | {r.torch_ms:.3f} "
            f"({r.torch_backend}) | {r.ratio:.2f} | {'yes' if r.ok else f'NO ({r.err:.1e})'} |"
        )
    return "\n".join(lines) + "\n"


def run_ctc(out_dir: str | None = None, limit: int | None = None) -> list[CtcRow]:
    """Run the suite (its first `limit` cases) on the current GPU, print a markdown table,
    and with `out_dir` write ctc_float32.json and .md there. Returns the rows."""
    if not torch.cuda.is_available():
        raise RuntimeError("rtdnn.bench.ctc needs a CUDA GPU")
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    rows: list[CtcRow] = []
    for case in cases()[:limit]:
        for row in run_case(case, gen):
            rows.append(row)
            print(
                f"{row.case:36s} {row.direction:16s} rtdnn {row.rtdnn_ms:8.3f} ms, torch "
                f"{row.torch_ms:8.3f} ms ({row.torch_backend}), ratio {row.ratio:5.2f} "
                f"{'ok' if row.ok else 'NO'}",
                flush=True,
            )
        torch.cuda.empty_cache()
    title = f"CTC loss, float32, reduction mean, {torch.cuda.get_device_name()}"
    md = markdown(rows, title)
    print(md)
    if out_dir:
        write_results(out_dir, "ctc_float32", title, rows, md)
    return rows
