"""Attention beside PyTorch: rtdnn.scaled_dot_product_attention against the fastest of
torch's flash and cuDNN backends for the same call, forward and forward + backward, in one
process on one GPU (`rtdnn bench --op attention`).

Cases: sequence lengths 512 to 16k, 8 to 32 query heads, head sizes 64 and 128, causal and
not, and grouped-query attention (8 key/value heads for 32 query heads), in bfloat16, the
batch shrinking as the sequence grows so that each case does about the same work. Work is
counted as flash-attention does: 4 L S E multiply-adds per head forward (halved when
causal), 2.5 times that for the backward; TFLOP/s is reported beside the measured matmul
ceiling.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..core.timing import device_time_ms
from .conv import matmul_ceiling
from .output import write_results

DEVICE = "cuda"  # the tests run the harness on the CPU (interpreter) with tiny cases


@dataclass(frozen=True)
class AttentionCase:
    """One attention call: (batch, query heads, key/value heads, L = S, head size, causal)."""

    batch: int
    heads: int
    kv_heads: int
    seq: int
    head_dim: int
    causal: bool

    @property
    def name(self) -> str:
        gqa = f"/{self.kv_heads}kv" if self.kv_heads != self.heads else ""
        causal = " causal" if self.causal else ""
        return f"N{self.batch} H{self.heads}{gqa} L{self.seq} E{self.head_dim}{causal}"

    def forward_flops(self) -> float:
        per_head = 4 * self.seq * self.seq * self.head_dim
        return self.batch * self.heads * per_head * (0.5 if self.causal else 1.0)


@dataclass
class AttentionRow:
    case: str
    direction: str  # "forward" or "forward+backward"
    rtdnn_ms: float
    torch_ms: float
    torch_backend: str  # the faster of torch's backends for this call
    ratio: float  # torch_ms / rtdnn_ms: above 1 means rtdnn is faster
    rtdnn_tflops: float
    torch_tflops: float
    rtdnn_pct: float  # of the matmul ceiling
    err: float  # ||rtdnn - torch|| / ||torch|| (output; with the backward, dq)
    ok: bool


def cases() -> list[AttentionCase]:
    """The suite: about 2^32 score elements per case (batch x heads x L x S)."""
    out = []
    for seq in (512, 1024, 2048, 4096, 8192, 16384):
        for head_dim in (64, 128):
            heads = 2048 // head_dim  # 32 heads of 64 or 16 of 128: a model width of 2048
            batch = max(1, 2**32 // (heads * seq * seq))
            for causal in (False, True):
                out.append(AttentionCase(batch, heads, heads, seq, head_dim, causal))
        batch = max(1, 2**32 // (32 * seq * seq))
        out.append(AttentionCase(batch, 32, 8, seq, 128, True))  # grouped-query attention
    return out


def _torch_backends() -> dict[str, list]:
    from torch.nn.attention import SDPBackend

    return {"flash": [SDPBackend.FLASH_ATTENTION], "cudnn": [SDPBackend.CUDNN_ATTENTION]}


def _time_torch(run: Callable[[], object]) -> tuple[float, str]:
    """The faster of torch's flash and cuDNN backends for `run`, and its name (a backend that
    does not take the call is skipped)."""
    from torch.nn.attention import sdpa_kernel

    best, name = float("inf"), "none"
    for backend, which in _torch_backends().items():
        try:
            with sdpa_kernel(which):
                run()
                ms = device_time_ms(run, graph=False)
        except RuntimeError:  # this backend does not support the call
            continue
        if ms < best:
            best, name = ms, backend
    return best, name


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def run_case(case: AttentionCase, ceiling: float, dtype=torch.bfloat16) -> list[AttentionRow]:
    """Forward and forward + backward of one case, rtdnn beside torch."""
    import rtdnn

    def make(heads: int, grad: bool) -> torch.Tensor:
        t = torch.randn(case.batch, heads, case.seq, case.head_dim, device=DEVICE, dtype=dtype)
        return t.requires_grad_(grad)

    gqa = case.kv_heads != case.heads
    q, k, v = make(case.heads, True), make(case.kv_heads, True), make(case.kv_heads, True)
    dout = torch.randn_like(q)
    kw = dict(is_causal=case.causal, enable_gqa=gqa)
    F = torch.nn.functional

    def ours() -> torch.Tensor:
        return rtdnn.scaled_dot_product_attention(q, k, v, **kw)

    def theirs() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, **kw)

    def with_backward(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        def step() -> torch.Tensor:
            q.grad = k.grad = v.grad = None
            fn().backward(dout)
            return q.grad

        return step

    rows = []
    flops = case.forward_flops()
    for direction, mine, other, work in (
        ("forward", ours, theirs, flops),
        ("forward+backward", with_backward(ours), with_backward(theirs), 3.5 * flops),
    ):
        with torch.no_grad() if direction == "forward" else torch.enable_grad():
            err = _rel(mine().detach(), other().detach())
            ms = device_time_ms(mine, graph=False)
            their_ms, backend = _time_torch(other)
        tflops = work / ms / 1e9
        rows.append(
            AttentionRow(
                case.name,
                direction,
                ms,
                their_ms,
                backend,
                their_ms / ms,
                tflops,
                work / their_ms / 1e9,
                100 * tflops / ceiling,
                err,
                err <= 2e-2,
            )  # fmt: skip
        )
    return rows


def markdown(rows: list[AttentionRow], title: str) -> str:
    lines = [
        f"### {title}",
        "",
        "| case | direction | rtdnn ms | torch ms (backend) | ratio | rtdnn TFLOP/s | "
        "torch TFLOP/s | rtdnn % ceiling | ok |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.case} | {r.direction} | {r.rtdnn_ms:.3f} | {r.torch_ms:.3f} "
            f"({r.torch_backend}) | {r.ratio:.2f} | {r.rtdnn_tflops:.0f} | "
            f"{r.torch_tflops:.0f} | {r.rtdnn_pct:.0f} | "
            f"{'yes' if r.ok else f'NO ({r.err:.1e})'} |"
        )
    return "\n".join(lines) + "\n"


def run_attention(out_dir: str | None = None, limit: int | None = None) -> list[AttentionRow]:
    """Run the suite (its first `limit` cases) on the current GPU, print a markdown table,
    and with `out_dir` write attention_bf16.json and .md there. Returns the rows."""
    if not torch.cuda.is_available():
        raise RuntimeError("rtdnn.bench.attention needs a CUDA GPU")
    torch.manual_seed(0)
    ceiling = matmul_ceiling(torch.bfloat16)
    rows: list[AttentionRow] = []
    for case in cases()[:limit]:
        for row in run_case(case, ceiling):
            rows.append(row)
            print(
                f"{row.case:36s} {row.direction:16s} rtdnn {row.rtdnn_tflops:5.0f} TFLOP/s, "
                f"torch {row.torch_tflops:5.0f} ({row.torch_backend}), ratio {row.ratio:5.2f} "
                f"{'ok' if row.ok else 'NO'}",
                flush=True,
            )
        torch.cuda.empty_cache()
    title = f"Attention, bf16, {torch.cuda.get_device_name()}, matmul ceiling {ceiling:.0f} TFLOP/s"
    md = markdown(rows, title)
    print(md)
    if out_dir:
        write_results(out_dir, "attention_bf16", title, rows, md, ceiling=ceiling)
    return rows
