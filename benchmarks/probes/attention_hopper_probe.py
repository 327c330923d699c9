"""The attention suite with the warp-specialized Hopper forward (kernels/attention_hopper.py),
then the forward of every suite case, and of ViT-B/16's attention, by both kernels side by
side in one process (the Triton kernel by turning the Hopper path off), beside torch's
fastest backend.

    PYTHONPATH=src python benchmarks/probes/attention_hopper_probe.py OUT_DIR

Writes attention_bf16.{md,json} (the suite, as `rtdnn bench --op attention`) and
attention_hopper_side_by_side.md to OUT_DIR.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

from rtdnn.bench.attention import AttentionCase, _time_torch, cases, run_attention
from rtdnn.core.prepared import PreparedCalls
from rtdnn.core.timing import device_time_ms
from rtdnn.ops import attention as A

ON_HOPPER = A._on_hopper


def use_hopper(on: bool) -> None:
    """Route the forward through the Hopper kernel (where it fits) or the Triton kernel."""
    A._on_hopper = ON_HOPPER if on else (lambda t: False)
    A._calls = PreparedCalls()  # prepared calls hold the path they chose


def side_by_side(case: AttentionCase, log) -> None:
    torch.manual_seed(0)
    gqa = case.kv_heads != case.heads
    shape = (case.batch, case.heads, case.seq, case.head_dim)
    q = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    k = torch.randn((case.batch, case.kv_heads, *shape[2:]), device="cuda", dtype=q.dtype)
    v = torch.randn_like(k)
    scale = case.head_dim**-0.5

    def theirs():
        return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, enable_gqa=gqa)

    def ours():
        return A.attention_forward(q, k, v, None, case.causal, scale, gqa)[0]

    with torch.no_grad():
        ref = theirs()
        torch_ms, backend = _time_torch(theirs)
        row = f"| {case.name} | {torch_ms:.3f} ({backend}) |"
        for on in (False, True):
            use_hopper(on)
            out = ours()
            err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
            ms = device_time_ms(ours, graph=False)
            tflops = case.forward_flops() / ms / 1e9
            row += f" {ms:.3f} | {torch_ms / ms:.2f} | {tflops:.0f} | {err:.1e} |"
    log(row)


def main() -> None:
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    run_attention(out_dir)
    md = open(os.path.join(out_dir, "attention_hopper_side_by_side.md"), "w")

    def log(line: str) -> None:
        print(line, flush=True)
        md.write(line + "\n")
        md.flush()

    log(f"Forward, bf16, {torch.cuda.get_device_name()}: Triton kernel, then the Hopper kernel")
    log("")
    log("| case | torch ms | Triton ms | ratio | TFLOP/s | err | Hopper ms | ratio | TFLOP/s "
        "| err |")  # fmt: skip
    log("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    vit = [AttentionCase(128, 12, 12, 197, 64, False), AttentionCase(32, 12, 12, 197, 64, False)]
    for case in cases() + vit:
        side_by_side(case, log)
        torch.cuda.empty_cache()
    use_hopper(True)


if __name__ == "__main__":
    main()
