"""Attention forward on the GPU: correctness of the forward's tile variants against torch, then
their times beside the previous kernel and torch's fastest SDPA backend (flash or cuDNN),
bf16, the `rtdnn bench --op attention` cases from L = 4096 up. The previous kernel is timed
if benchmarks/probes/attention_forward_old_kernel.py is there: an older
src/rtdnn/kernels/attention.py (`git show COMMIT:src/rtdnn/kernels/attention.py > ...`) whose
forward takes the arguments before NEG_SCALE and TMA were added.

    PYTHONPATH=src python benchmarks/probes/attention_forward_probe.py OUT_DIR [quick]

A variant is (BLOCK_M, BLOCK_N, num_warps, num_stages, TMA), set by replacing
rtdnn.ops.attention's _forward_config and _use_tma for the call; "product" is the forward as
shipped. Writes attention_forward_probe.json and .md to OUT_DIR.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton

from rtdnn.bench.attention import _time_torch, cases
from rtdnn.core.timing import device_time_ms
from rtdnn.ops import attention as A

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import attention_forward_old_kernel as OLD
except ImportError:
    OLD = None

PRODUCT_CONFIG, PRODUCT_TMA = A._forward_config, A._use_tma
# Edge-shape checks for every variant, not only the shipped one (the timing compares each
# variant with torch on the bench cases anyway).
ALL_VARIANTS = os.environ.get("PROBE_ALL_VARIANTS") == "1"

# (name, BLOCK_M, BLOCK_N, warps, stages, tma); None: the shipped forward.
VARIANTS = [
    ("product", None, None, None, None, None),
    ("tma m128 n64 w8 s3", 128, 64, 8, 3, True),
    ("tma m128 n128 w8 s3", 128, 128, 8, 3, True),
    ("ptr m128 n64 w8 s3", 128, 64, 8, 3, False),
    ("tma m64 n64 w4 s3", 64, 64, 4, 3, True),
    ("tma m64 n64 w4 s2", 64, 64, 4, 2, True),
    ("tma m64 n64 w4 s4", 64, 64, 4, 4, True),
    ("tma m64 n128 w4 s2", 64, 128, 4, 2, True),
    ("ptr m64 n64 w4 s3", 64, 64, 4, 3, False),
]


def select(variant) -> None:
    name, bm, bn, warps, stages, tma = variant
    if bn is None:
        A._forward_config, A._use_tma = PRODUCT_CONFIG, PRODUCT_TMA
        return

    def config(*args):
        cfg = PRODUCT_CONFIG(*args)
        return dict(cfg, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)

    A._forward_config = config
    A._use_tma = PRODUCT_TMA if tma else (lambda *args: False)


def forward(q, k, v, causal, gqa, mask=None, scale=None, p=0.0, seed=0):
    s = 1.0 / q.shape[-1] ** 0.5 if scale is None else scale
    return A.attention_forward(q, k, v, mask, causal, s, gqa, p, seed)[0]


def old_forward(q, k, v, causal, gqa):
    n, h, lq, e = q.shape
    lk, ev = k.shape[2], v.shape[3]
    out = torch.empty((n, h, lq, ev), dtype=q.dtype, device=q.device)
    lse = torch.empty((n, h, lq), dtype=torch.float32, device=q.device)
    cfg = A._config(q, e, ev)
    OLD.attention_forward_kernel[(triton.cdiv(lq, cfg["BLOCK_M"]), n * h)](
        q, k, v, out, lse, q, 1.0 / e**0.5, 0.0, 0, h, lq, lk, e, ev, h // k.shape[1],
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), 0, 0, 0, 0,
        HAS_MASK=False, CAUSAL=causal, DROPOUT=False, **cfg,
    )  # fmt: skip
    return out


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def correctness(log) -> bool:
    """Every variant on edge shapes against torch's math in float32: lengths that are not
    multiples of the tiles, causal with L != S, GQA, head sizes 64, 96 (tiles wider than the
    head), 128; the shipped forward also with masks, dropout, a negative scale, strided and
    misaligned (pointer path) inputs."""
    ok = True
    torch.manual_seed(0)
    dev = os.environ.get("PROBE_DEVICE", "cuda")  # "cpu" (interpreter): a dry run of this
    div = int(os.environ.get("PROBE_LEN_DIV", "1"))  # with lengths divided by this

    def check(tag, out, ref, tol=2e-2):
        nonlocal ok
        err = rel(out, ref)
        good = err <= tol and torch.isfinite(out).all().item()
        ok &= good
        log(f"  {tag:70s} err {err:.2e} {'ok' if good else 'FAIL'}")

    # Lengths that are multiples of 16 (the kernels the timing compiles) but not of the tiles,
    # and odd ones; L < S and L > S.
    shapes = [((2, 4, 1008, 0), (2, 2, 1104, 0)), ((1, 2, 777, 0), (1, 2, 333, 0)),
              ((1, 4, 256, 0), (1, 4, 256, 0))]  # fmt: skip
    for variant in VARIANTS if dev == "cuda" and ALL_VARIANTS else VARIANTS[:1]:
        select(variant)
        product = variant[1] is None
        for e in (64, 128, 96) if product else (64, 128):
            for qs, ks in shapes if product else shapes[2:]:
                qs, ks = (*qs[:2], qs[2] // div, e), (*ks[:2], ks[2] // div, e)
                q = torch.randn(qs, device=dev, dtype=torch.bfloat16)
                k = torch.randn(ks, device=dev, dtype=torch.bfloat16)
                v = torch.randn(ks, device=dev, dtype=torch.bfloat16)
                gqa = qs[1] != ks[1]
                for causal in (False, True):
                    ref = F.scaled_dot_product_attention(
                        q.float(), k.float(), v.float(), is_causal=causal, enable_gqa=gqa
                    )
                    out = forward(q, k, v, causal, gqa)
                    check(f"{variant[0]} E{e} q{qs} k{ks} causal={causal}", out, ref)
    select(VARIANTS[0])
    lq, lk = 500 // div, 600 // div
    q = torch.randn(2, 4, lq, 128, device=dev, dtype=torch.bfloat16)
    k = torch.randn(2, 4, lk, 128, device=dev, dtype=torch.bfloat16)
    v = torch.randn(2, 4, lk, 128, device=dev, dtype=torch.bfloat16)
    qf, kf, vf = q.float(), k.float(), v.float()
    mask = torch.rand(2, 1, lq, lk, device=dev) > 0.3
    check("product bool mask", forward(q, k, v, False, False, mask=mask),
          F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask))  # fmt: skip
    add = torch.randn(lq, lk, device=dev)
    check("product additive mask", forward(q, k, v, False, False, mask=add),
          F.scaled_dot_product_attention(qf, kf, vf, attn_mask=add))  # fmt: skip
    check("product negative scale", forward(q, k, v, False, False, scale=-0.05),
          F.scaled_dot_product_attention(qf, kf, vf, scale=-0.05))  # fmt: skip
    keep = A.attention_dropout_mask((2, 4, lq, lk), 0.2, 7, dev)
    probs = torch.softmax(qf @ kf.transpose(-1, -2) / 128**0.5, -1) * keep / 0.8
    check("product dropout (causal=False)", forward(q, k, v, False, False, p=0.2, seed=7),
          probs @ vf)  # fmt: skip
    qt = torch.randn(2, lq, 4, 128, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    check("product (B, L, H, E) storage (TMA-able)", forward(qt, k, v, True, False),
          F.scaled_dot_product_attention(qt.float(), kf, vf, is_causal=True))  # fmt: skip
    wide = torch.randn(2, 4, lk, 130, device=dev, dtype=torch.bfloat16)
    ks = wide[..., 1:129]  # misaligned base and 260-byte rows: the pointer path
    assert dev == "cpu" or not A._tma_ready(ks)
    check("product misaligned key (pointer path)", forward(q, ks, v, True, False),
          F.scaled_dot_product_attention(qf, ks.float(), vf, is_causal=True))  # fmt: skip
    e256 = torch.randn(1, 2, 300 // div, 256, device=dev, dtype=torch.bfloat16)
    check("product E256", forward(e256, e256, e256, True, False),
          F.scaled_dot_product_attention(e256.float(), e256.float(), e256.float(),
                                         is_causal=True))  # fmt: skip
    q32 = torch.randn(1, 2, 300 // div, 64, device=dev)
    check("product float32", forward(q32, q32, q32, True, False),
          F.scaled_dot_product_attention(q32, q32, q32, is_causal=True), tol=1e-3)  # fmt: skip
    return ok


def time_case(case, log) -> dict:
    """One bench case: torch's fastest backend, the previous kernel and every variant."""
    torch.manual_seed(0)
    gqa = case.kv_heads != case.heads
    shape = (case.batch, case.heads, case.seq, case.head_dim)
    q = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    k = torch.randn((*shape[:1], case.kv_heads, *shape[2:]), device="cuda", dtype=q.dtype)
    v = torch.randn_like(k)
    flops = case.forward_flops()

    def theirs():
        return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, enable_gqa=gqa)

    def ours():
        return forward(q, k, v, case.causal, gqa)

    def previous():
        return old_forward(q, k, v, case.causal, gqa)

    ref = theirs()
    torch_ms, backend = _time_torch(theirs)
    row = dict(case=case.name, torch_ms=torch_ms, torch_backend=backend,
               torch_tflops=flops / torch_ms / 1e9, variants={})  # fmt: skip
    runs = [("old", None, previous)] if OLD is not None else []
    runs += [(variant[0], variant, ours) for variant in VARIANTS]
    for name, variant, fn in runs:
        if variant is not None:
            select(variant)
        try:
            err = rel(fn(), ref)
            ms = device_time_ms(fn, graph=False)
        except Exception as ex:  # noqa: BLE001
            log(f"{case.name:36s} {name:16s} FAILED {type(ex).__name__}: {ex}"[:400])
            continue
        row["variants"][name] = dict(ms=ms, tflops=flops / ms / 1e9, ratio=torch_ms / ms,
                                     err=err)  # fmt: skip
        log(f"{case.name:36s} {name:16s} {ms:8.3f} ms {flops / ms / 1e9:5.0f} TFLOP/s "
            f"ratio {torch_ms / ms:5.2f} (torch {torch_ms:.3f} ms {backend} "
            f"{flops / torch_ms / 1e9:.0f}) err {err:.1e}")  # fmt: skip
    select(VARIANTS[0])
    return row


def timing(log, quick: bool) -> list[dict]:
    rows = []
    for case in cases():
        if case.seq < 4096 or (quick and case.seq > 8192):
            continue
        with torch.no_grad():
            rows.append(time_case(case, log))
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    out_dir = sys.argv[1]
    quick = "quick" in sys.argv
    os.makedirs(out_dir, exist_ok=True)

    md = open(os.path.join(out_dir, "attention_forward_probe.md"), "w")

    def log(msg):  # written as it goes: a run cut short still leaves its lines
        print(msg, flush=True)
        md.write(msg + "\n")
        md.flush()

    t0 = time.time()
    log(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    log("correctness:")
    ok = correctness(log)
    log(f"correctness {'ok' if ok else 'FAILED'} ({time.time() - t0:.0f} s)")
    rows = timing(log, quick)
    log(f"done in {time.time() - t0:.0f} s")
    with open(os.path.join(out_dir, "attention_forward_probe.json"), "w") as f:
        json.dump(dict(correct=ok, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
