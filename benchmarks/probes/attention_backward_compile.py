"""Compile the attention backward for sm_90 without a GPU and report, per kernel, registers,
spills, shared memory and TMA copies (see attention_forward_compile.py, whose report this
uses), for the tile variants that attention_backward_probe.py times and for the backward as
shipped in every dtype and path.

    PYTHONPATH=src:benchmarks python benchmarks/probes/attention_backward_compile.py [product]

(TRITON_INTERPRET must be unset.) Relies on Triton 3.6 internals; a development aid only.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attention_forward_compile as FC  # noqa: E402  (activates the sm_90 stub)
import torch  # noqa: E402

from rtdnn.ops import attention as A  # noqa: E402

SHIPPED_CONFIG = A._backward_config

# (name, dK/dV (BLOCK_M, BLOCK_N, warps, stages), dQ (BLOCK_M, BLOCK_N, warps, stages))
VARIANTS = [
    ("m64n128w8s2 / m128n64w8s2", (64, 128, 8, 2), (128, 64, 8, 2)),
    ("m64n128w8s3 / m128n64w8s3", (64, 128, 8, 3), (128, 64, 8, 3)),
    ("m32n128w4s3 / m128n32w4s3", (32, 128, 4, 3), (128, 32, 4, 3)),
    ("m32n128w4s5 / m128n32w4s5", (32, 128, 4, 5), (128, 32, 4, 5)),
    ("m64n128w4s2 / m128n64w4s2", (64, 128, 4, 2), (128, 64, 4, 2)),
    ("m32n128w8s3 / m128n128w8s2", (32, 128, 8, 3), (128, 128, 8, 2)),
    ("m64n64w4s3 / m64n64w4s3", (64, 64, 4, 3), (64, 64, 4, 3)),
    ("m128n128w8s2 / m128n32w8s3", (128, 128, 8, 2), (128, 32, 8, 3)),
]


def select(dkdv, dq):
    def config(*args):
        a, b = SHIPPED_CONFIG(*args)
        a = dict(a, BLOCK_M=dkdv[0], BLOCK_N=dkdv[1], num_warps=dkdv[2], num_stages=dkdv[3])
        b = dict(b, BLOCK_M=dq[0], BLOCK_N=dq[1], num_warps=dq[2], num_stages=dq[3])
        return a, b

    A._backward_config = config


def run(name, e, causal, tma, dtype=torch.bfloat16, mask=False, dropout=0.0, ev=None, group=2):
    ev = e if ev is None else ev
    A._use_tma = lambda *args: tma
    A._sum_group_in_kernel = lambda *args: True
    q = torch.randn(1, 2 * group, 300, e, dtype=dtype)
    k = torch.randn(1, 2, 300, e, dtype=dtype)
    v = torch.randn(1, 2, 300, ev, dtype=dtype)
    out = torch.randn(1, 2 * group, 300, ev, dtype=dtype)
    lse = torch.zeros(1, 2 * group, 300)
    m = torch.rand(300, 300) > 0.5 if mask else None
    FC.kernels.clear()
    A.attention_backward(out, q, k, v, out, lse, m, causal, 0.1, True, dropout, 5)
    for kernel in FC.kernels:
        kname = kernel.name.replace("attention_backward_", "").replace("_kernel", "")
        if kname == "delta":
            continue
        try:
            print(f"{name:58s} {kname:5s} {FC.report(kernel)}", flush=True)
        except Exception as err:  # noqa: BLE001
            print(f"{name:58s} {kname:5s} FAILED {type(err).__name__}: {err}", flush=True)


def product() -> None:
    """The backward as shipped: its own tiles, every dtype and path, TMA where the GPU would
    take it (16-bit, head sizes up to 128)."""
    A._backward_config = SHIPPED_CONFIG
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for e, ev in ((64, 64), (128, 128), (96, 64), (256, 256), (32, 32)):
            for mask, causal, p in ((False, False, 0.0), (False, True, 0.0), (True, False, 0.0),
                                    (False, True, 0.1)):  # fmt: skip
                tma = dtype != torch.float32 and max(e, ev) <= 128
                name = f"{str(dtype)[6:]} E{e}/{ev} causal={causal:d} mask={mask:d} drop={p}"
                name += f" tma={tma:d}"
                run(name, e, causal, tma, dtype, mask, p, ev)


if __name__ == "__main__":
    if "product" in sys.argv:
        product()
        sys.exit()
    for e in (64, 128):
        for causal in (False, True):
            for vname, dkdv, dq in VARIANTS:
                select(dkdv, dq)
                for tma in (True,) if "quick" in sys.argv else (True, False):
                    try:
                        run(f"E{e} causal={causal:d} tma={tma:d} {vname}", e, causal, tma)
                    except Exception as err:  # noqa: BLE001
                        print(f"E{e} {causal} {vname} FAILED {type(err).__name__}: "
                              f"{str(err)[:300]}", flush=True)  # fmt: skip
