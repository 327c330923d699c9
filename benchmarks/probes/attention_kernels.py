"""Attention on the GPU, kernel by kernel, and versions of the backward side by side.

    PYTHONPATH=src python benchmarks/probes/attention_kernels.py OUT_DIR [HEADS]

1. The suite's cases of head size HEADS (default "128"; "all": 64 and 128) with L >= 4096:
   the forward, and forward + backward with each version in VERSIONS (dK/dV tiles at head
   size 128; "old kernels": those of benchmarks/probes/attention_old_kernel.py when that
   file is there, a copy of an earlier src/rtdnn/kernels/attention.py with the same
   arguments: `git show REV:src/rtdnn/kernels/attention.py > ...`), beside torch's fastest
   SDPA backend, interleaved per case.
2. torch.profiler's device time per kernel for one causal and one non-causal case, rtdnn's
   kernels beside torch's (cuDNN's), forward + backward.

Writes attention_kernels.json and prints a markdown table.
"""

from __future__ import annotations

import json
import os
import sys

import torch

import rtdnn
from rtdnn.bench.attention import _time_torch, cases
from rtdnn.core.timing import device_time_ms
from rtdnn.ops import attention as A

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_breakdown import kernel_times  # noqa: E402

try:
    import attention_old_kernel as OLD
except ImportError:
    OLD = None
NEW = A.K
SHIPPED = A._backward_config
# name -> dK/dV tiles (BLOCK_M, BLOCK_N, num_warps, num_stages) at head size 128 (None: the
# shipped ones), or "old" for the old kernels with the shipped tiles
VERSIONS = {
    "shipped": None,
    "dkdv 32x128 w8 s3": (32, 128, 8, 3),
    "dkdv 64x64 w8 s3": (64, 64, 8, 3),
    "dkdv 64x64 w8 s2": (64, 64, 8, 2),
}
if OLD is not None:
    VERSIONS["old kernels"] = "old"


def use(version: str) -> None:
    """Run rtdnn's attention as `version` (prepared launches are dropped)."""
    tiles = VERSIONS[version]
    A.K = OLD if tiles == "old" else NEW

    def config(q, e, ev, extra, causal):
        dkdv, dq = SHIPPED(q, e, ev, extra, causal)
        if isinstance(tiles, tuple) and max(dkdv["BLOCK_D"], dkdv["BLOCK_DV"]) == 128:
            m, n, w, st = tiles
            dkdv = dict(dkdv, BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=st)
        return dkdv, dq

    A._backward_config = config
    A._calls.clear()


def tensors(case):
    def make(heads):
        t = torch.randn(case.batch, heads, case.seq, case.head_dim, device="cuda",
                        dtype=torch.bfloat16)  # fmt: skip
        return t.requires_grad_()

    q, k, v = make(case.heads), make(case.kv_heads), make(case.kv_heads)
    kw = dict(is_causal=case.causal, enable_gqa=case.kv_heads != case.heads)
    return q, k, v, torch.randn_like(q), kw


def calls(case, sdpa):
    q, k, v, dout, kw = tensors(case)

    def forward():
        with torch.no_grad():
            return sdpa(q, k, v, **kw)

    def both():
        q.grad = k.grad = v.grad = None
        sdpa(q, k, v, **kw).backward(dout)
        return q.grad

    return forward, both


def main(out_dir: str, heads: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    F = torch.nn.functional
    wanted = [
        c for c in cases()
        if c.seq >= 4096 and (heads == "all" or c.head_dim == int(heads))
    ]  # fmt: skip
    names = list(VERSIONS)
    rows = []
    print("| case | direction | " + " | ".join(f"{n} ms" for n in names)
          + " | torch ms | " + " | ".join(f"{n} ratio" for n in names) + " |")  # fmt: skip
    print("|---|---|" + "---:|" * (2 * len(names) + 1))
    for case in wanted:
        theirs = calls(case, F.scaled_dot_product_attention)
        for d, direction in enumerate(("forward", "forward+backward")):
            ms = {}
            for name in names:
                if d == 0 and VERSIONS[name] is not None and VERSIONS[name] != "old":
                    continue  # the forward does not change with dK/dV's tiles
                if case.head_dim != 128 and isinstance(VERSIONS[name], tuple):
                    continue
                use(name)
                mine = calls(case, rtdnn.scaled_dot_product_attention)[d]
                mine()
                ms[name] = device_time_ms(mine, graph=False)
            use(names[0])
            ms["torch"], backend = _time_torch(theirs[d])
            row = dict(case=case.name, direction=direction, backend=backend, **ms)
            rows.append(row)
            print(f"| {case.name} | {direction} | "
                  + " | ".join(f"{ms[n]:.3f}" if n in ms else "" for n in names)
                  + f" | {ms['torch']:.3f} | "
                  + " | ".join(f"{ms['torch'] / ms[n]:.2f}" if n in ms else "" for n in names)
                  + " |", flush=True)  # fmt: skip
        torch.cuda.empty_cache()
    use(names[0])

    profiles = {}
    for case in [c for c in wanted if c.kv_heads == c.heads and c.head_dim == 128][:2]:
        mine = calls(case, rtdnn.scaled_dot_product_attention)[1]
        theirs = calls(case, F.scaled_dot_product_attention)[1]
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            profiles[case.name] = dict(rtdnn=kernel_times(mine, 5), cudnn=kernel_times(theirs, 5))
        print(f"\n{case.name}, forward + backward, device us per call")
        for side, times in profiles[case.name].items():
            for kernel, us in sorted(times.items(), key=lambda kv: -kv[1]):
                print(f"  {side:6s} {us:9.1f}  {kernel}")
    with open(os.path.join(out_dir, "attention_kernels.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), rows=rows, profiles=profiles), f,
                  indent=1)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "128")
