"""Attention backward on the GPU: correctness of the backward's tile variants against float32
autograd (torch's own bf16 backward's error printed beside), then backward times of every
variant beside the previous backward (e33c2f5's kernels, if
benchmarks/probes/attention_backward_old_kernel.py is there: `git show
e33c2f5:src/rtdnn/kernels/attention.py > benchmarks/probes/attention_backward_old_kernel.py`),
the forward, rtdnn's forward + backward through autograd and torch's fastest SDPA backend
(flash or cuDNN), bf16, on the `rtdnn bench --op attention` cases from L = 1024 up.

    PYTHONPATH=src python benchmarks/probes/attention_backward_probe.py OUT_DIR [final]

"final": the shipped backward only (no variants). Before anything runs, worker processes
compile every kernel the run will launch (Triton's disk cache then has them), so that the
compiles overlap. A variant is (dK/dV tiles, dQ tiles) per head size, each (BLOCK_M,
BLOCK_N, num_warps, num_stages), set by replacing rtdnn.ops.attention's _backward_config.
Writes attention_backward_probe.json and .md to OUT_DIR.
"""

from __future__ import annotations

import json
import multiprocessing as mp
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
    import attention_backward_old_kernel as OLD
except ImportError:
    OLD = None

SHIPPED = A._backward_config
# dK/dV options and dQ options per head size; variant i changes one kernel's tiles from
# option 0 (so that differences in time belong to that kernel).
DKDV = {
    64: [(64, 128, 8, 2), (32, 128, 8, 2), (32, 128, 8, 4), (32, 64, 4, 3), (64, 128, 8, 3)],
    128: [(32, 128, 8, 2), (32, 128, 8, 3), (16, 128, 8, 3), (32, 64, 4, 3), (64, 128, 8, 2)],
}
DQ = {
    64: [(128, 64, 8, 2), (128, 64, 4, 3), (128, 128, 8, 2), (128, 32, 8, 3), (64, 64, 4, 2)],
    128: [(128, 64, 8, 2), (128, 32, 8, 3), (128, 128, 8, 2), (64, 64, 4, 2), (128, 64, 8, 3)],
}
VARIANTS = ["shipped"] + [f"dkdv{i}/dq0" for i in range(5)] + [f"dkdv0/dq{i}" for i in range(1, 5)]
FINAL = "final" in sys.argv


def select(name: str) -> None:
    if name == "shipped":
        A._backward_config = SHIPPED
        return
    a, b = name.split("/")
    i, j = int(a[4:]), int(b[2:])

    def config(q, e, ev, extra, causal):
        dkdv, dq = SHIPPED(q, e, ev, extra, causal)
        head = max(dkdv["BLOCK_D"], dkdv["BLOCK_DV"])
        x, y = DKDV[head][i], DQ[head][j]
        dkdv = dict(dkdv, BLOCK_M=x[0], BLOCK_N=x[1], num_warps=x[2], num_stages=x[3])
        dq = dict(dq, BLOCK_M=y[0], BLOCK_N=y[1], num_warps=y[2], num_stages=y[3])
        return dkdv, dq

    A._backward_config = config


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def reference(q, k, v, dout, causal=False, mask=None, scale=None, keep=None, p=0.0):
    """Float32 autograd of the plain formula: (out, dq, dk, dv)."""
    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ kk.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if causal:
        s = s.masked_fill(
            torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf")
        )
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    probs = torch.softmax(s, -1)
    if keep is not None:
        probs = probs * keep / (1 - p)
    out = probs @ vv
    out.backward(dout.float())
    return out, q.grad, k.grad, v.grad


def backward(q, k, v, dout, causal=False, mask=None, scale=None, p=0.0, seed=0):
    s = q.shape[-1] ** -0.5 if scale is None else scale
    gqa = q.shape[1] != k.shape[1]
    out, lse = A.attention_forward(q, k, v, mask, causal, s, gqa, p, seed)
    return A.attention_backward(dout, q, k, v, out, lse, mask, causal, s, gqa, p, seed)


def correctness(log, variants, compile_only=False) -> bool:
    """Edge shapes against float32 autograd: lengths not multiples of the tiles (and odd),
    causal with L != S, GQA (summed in the kernel and by the caller), head sizes 64, 96 and
    128; the shipped backward also with masks, dropout, (B, L, H, E) storage, a misaligned
    key (pointer path), head size 256, float16 and float32."""
    ok = True
    torch.manual_seed(0)
    dev = os.environ.get("PROBE_DEVICE", "cuda")  # "cpu" (interpreter): a dry run of this
    div = int(os.environ.get("PROBE_LEN_DIV", "1"))  # with lengths divided by this

    def check(tag, got, ref, tol=3e-2, theirs=None):
        nonlocal ok
        if compile_only:
            return
        errs = [rel(a, b) for a, b in zip(got, ref[1:], strict=True)]
        good = all(e <= tol for e in errs) and all(torch.isfinite(g).all().item() for g in got)
        ok &= good
        extra = ""
        if theirs is not None:
            pairs = zip(theirs, ref[1:], strict=True)
            extra = " torch bf16 " + " ".join(f"{rel(a, b):.1e}" for a, b in pairs)
        log(f"  {tag:64s} dq/dk/dv {' '.join(f'{e:.1e}' for e in errs)}"
            f" {'ok' if good else 'FAIL'}{extra}")  # fmt: skip

    def torch_grads(q, k, v, dout, causal):
        qs, ks, vs = (t.detach().requires_grad_() for t in (q, k, v))
        gqa = q.shape[1] != k.shape[1]
        F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, enable_gqa=gqa).backward(dout)
        return qs.grad, ks.grad, vs.grad

    shapes = [((2, 4, 1008), (2, 4, 1104)), ((2, 8, 1008), (2, 2, 1104)),
              ((1, 2, 777), (1, 2, 333)), ((1, 4, 333), (1, 2, 777))]  # fmt: skip
    for variant in variants:
        select(variant)
        shipped = variant == "shipped"
        for e in (64, 128, 96) if shipped else (64, 128):
            for qs, ks in shapes if shipped else shapes[:2]:
                qs, ks = (*qs[:2], qs[2] // div), (*ks[:2], ks[2] // div)
                q = torch.randn(*qs, e, device=dev, dtype=torch.bfloat16)
                k = torch.randn(*ks, e, device=dev, dtype=torch.bfloat16)
                v = torch.randn(*ks, e, device=dev, dtype=torch.bfloat16)
                dout = torch.randn_like(q)
                for causal in (False, True):
                    got = backward(q, k, v, dout, causal)
                    if compile_only:
                        continue
                    ref = reference(q, k, v, dout, causal)
                    theirs = torch_grads(q, k, v, dout, causal)
                    check(f"{variant} E{e} q{qs} k{ks} causal={causal}", got, ref, theirs=theirs)
                    if qs[1] != ks[1] and variant == "shipped":  # the caller's sum as well
                        fold = A._sum_group_in_kernel
                        A._sum_group_in_kernel = lambda *args: False
                        got = backward(q, k, v, dout, causal)
                        A._sum_group_in_kernel = fold
                        check(f"{variant} E{e} q{qs} k{ks} causal={causal} summed by the caller",
                              got, ref)  # fmt: skip
    select("shipped")
    if "shipped" not in variants:
        return ok
    lq, lk = 500 // div, 600 // div
    q = torch.randn(2, 4, lq, 128, device=dev, dtype=torch.bfloat16)
    k = torch.randn(2, 4, lk, 128, device=dev, dtype=torch.bfloat16)
    v = torch.randn(2, 4, lk, 128, device=dev, dtype=torch.bfloat16)
    dout = torch.randn_like(q)
    mask = torch.rand(2, 1, lq, lk, device=dev) > 0.3
    check("shipped bool mask", backward(q, k, v, dout, mask=mask),
          None if compile_only else reference(q, k, v, dout, mask=mask))  # fmt: skip
    add = torch.randn(lq, lk, device=dev)
    check("shipped additive mask", backward(q, k, v, dout, mask=add),
          None if compile_only else reference(q, k, v, dout, mask=add))  # fmt: skip
    check("shipped negative scale", backward(q, k, v, dout, scale=-0.05),
          None if compile_only else reference(q, k, v, dout, scale=-0.05))  # fmt: skip
    for causal in (False, True):
        keep = A.attention_dropout_mask((2, 4, lq, lk), 0.2, 7, dev)
        got = backward(q, k, v, dout, causal, p=0.2, seed=7)
        want = None if compile_only else reference(q, k, v, dout, causal, keep=keep, p=0.2)
        check(f"shipped dropout causal={causal}", got, want)
    qt = torch.randn(2, lq, 4, 128, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    check("shipped (B, L, H, E) storage", backward(qt, k, v, dout, True),
          None if compile_only else reference(qt, k, v, dout, True))  # fmt: skip
    wide = torch.randn(2, 4, lk, 130, device=dev, dtype=torch.bfloat16)
    ks = wide[..., 1:129]  # misaligned base and 260-byte rows: the pointer path
    check("shipped misaligned key (pointer path)", backward(q, ks, v, dout, True),
          None if compile_only else reference(q, ks, v, dout, True))  # fmt: skip
    # Independent q and k: with q = k the diagonal scores saturate the softmax, the true
    # dq and dk nearly vanish and their relative errors mean nothing.
    for e, dtype in ((256, torch.bfloat16), (64, torch.float16)):
        x = [torch.randn(1, 4, 300 // div, e, device=dev, dtype=dtype) for _ in range(4)]
        check(f"shipped E{e} {str(dtype)[6:]} causal", backward(*x, True),
              None if compile_only else reference(*x, True))  # fmt: skip
    x = [torch.randn(1, 2, 300 // div, 64, device=dev) for _ in range(4)]
    torch.backends.cuda.matmul.allow_tf32 = False  # strict float32, in rtdnn and the reference
    check("shipped float32 causal", backward(*x, True),
          None if compile_only else reference(*x, True), tol=1e-3)  # fmt: skip
    return ok


def old_backward(dout, q, k, v, out, lse, causal, scale):
    """e33c2f5's backward (no mask, no dropout)."""
    n, h, lq, e = q.shape
    hk, lk, ev = k.shape[1], k.shape[2], v.shape[3]
    delta = (dout.float() * out.float()).sum(-1).contiguous()
    cfg = A._config(q, e, ev)
    st = (*q.stride(), *k.stride(), *v.stride(), *dout.stride(), 0, 0, 0, 0)
    flags = dict(HAS_MASK=False, CAUSAL=causal, DROPOUT=False, **cfg)
    common = (scale, 0.0, 0, h, lq, lk, e, ev, h // hk)
    dk = torch.empty((n, h, lk, e), dtype=torch.float32, device=q.device)
    dv = torch.empty((n, h, lk, ev), dtype=torch.float32, device=q.device)
    OLD.attention_backward_dkdv_kernel[(triton.cdiv(lk, cfg["BLOCK_N"]), n * h)](
        q, k, v, dout, lse, delta, dk, dv, q, *common, *st, **flags
    )
    dq = torch.empty_like(q)
    OLD.attention_backward_dq_kernel[(triton.cdiv(lq, cfg["BLOCK_M"]), n * h)](
        q, k, v, dout, lse, delta, dq, q, *common, *st, *dq.stride(), **flags
    )
    dk = dk.view(n, hk, h // hk, lk, e).sum(2).to(k.dtype)
    dv = dv.view(n, hk, h // hk, lk, ev).sum(2).to(v.dtype)
    return dq, dk, dv


def timing_cases(final: bool):
    """Longest sequences first (the target is L >= 4096): a run cut short has those."""
    return sorted((c for c in cases() if c.seq >= 1024 or final), key=lambda c: -c.seq)


def time_case(case, variants, log, compile_only=False) -> dict:
    import rtdnn

    torch.manual_seed(0)
    gqa = case.kv_heads != case.heads
    shape = (case.batch, case.heads, case.seq, case.head_dim)
    q = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    k = torch.randn((*shape[:1], case.kv_heads, *shape[2:]), device="cuda", dtype=q.dtype)
    v = torch.randn_like(k)
    dout = torch.randn_like(q)
    scale = case.head_dim**-0.5
    select("shipped")
    out, lse = A.attention_forward(q, k, v, None, case.causal, scale, gqa)
    flops = case.forward_flops()

    def bwd():
        return A.attention_backward(dout, q, k, v, out, lse, None, case.causal, scale, gqa)

    def old():
        return old_backward(dout, q, k, v, out, lse, case.causal, scale)

    if compile_only:
        for variant in variants:
            select(variant)
            bwd()
        if OLD is not None:
            old()
        return {}
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]

    def step(fn):
        def run():
            for t in leaves:
                t.grad = None
            fn(*leaves, is_causal=case.causal, enable_gqa=gqa).backward(dout)

        return run

    with torch.no_grad():
        fwd_ms = device_time_ms(
            lambda: A.attention_forward(q, k, v, None, case.causal, scale, gqa), graph=False
        )
    torch_ms, backend = _time_torch(step(F.scaled_dot_product_attention))
    ours_ms = device_time_ms(step(rtdnn.scaled_dot_product_attention), graph=False)
    ref = [g.clone() for g in bwd()]
    row = dict(case=case.name, torch_fb_ms=torch_ms, backend=backend, fwd_ms=fwd_ms,
               ours_fb_ms=ours_ms, ratio=torch_ms / ours_ms, bwd={})  # fmt: skip
    log(f"{case.name:34s} fwd {fwd_ms:7.3f} fwd+bwd ours {ours_ms:7.3f} torch {torch_ms:7.3f} "
        f"({backend}) ratio {torch_ms / ours_ms:5.2f} ({4.5 * flops / ours_ms / 1e9:.0f} vs "
        f"{3.5 * flops / torch_ms / 1e9:.0f} TFLOP/s counted 3.5x)")  # fmt: skip
    runs = [("old", old)] if OLD is not None else []
    runs += [(variant, bwd) for variant in variants]
    for name, fn in runs:
        select(name if name != "old" else "shipped")
        try:
            got = fn()
            err = max(rel(a, b) for a, b in zip(got, ref, strict=True))
            ms = device_time_ms(fn, graph=False)
        except Exception as ex:  # noqa: BLE001
            log(f"  {name:14s} FAILED {type(ex).__name__}: {ex}"[:400])
            continue
        est = torch_ms / (fwd_ms + ms)
        row["bwd"][name] = dict(ms=ms, err=err, est_ratio=est)
        log(f"  {name:14s} bwd {ms:7.3f} ms {2.5 * flops / ms / 1e9:4.0f} TFLOP/s  fwd+bwd "
            f"{fwd_ms + ms:7.3f} est. ratio {est:5.2f}  diff vs shipped {err:.1e}")  # fmt: skip
    select("shipped")
    return row


def compile_worker(variants, part, parts) -> None:
    """Launch-free compile of what the run will launch (its share: every parts-th job)."""
    from triton.runtime.jit import JITFunction

    run = JITFunction.run

    def warm(self, *args, grid, warmup, **kwargs):
        return run(self, *args, grid=grid, warmup=True, **kwargs)

    JITFunction.run = warm
    jobs = [("corr", v) for v in variants] + [("case", c) for c in timing_cases(FINAL)]
    for i, (kind, what) in enumerate(jobs):
        if i % parts != part:
            continue
        try:
            if kind == "corr":
                correctness(print, [what], compile_only=True)
            else:
                time_case(what, variants, print, compile_only=True)
        except Exception as ex:  # noqa: BLE001
            print(f"compile job {kind} {what}: {type(ex).__name__}: {str(ex)[:300]}", flush=True)


def main() -> None:
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    variants = ["shipped"] if FINAL else VARIANTS
    md = open(os.path.join(out_dir, "attention_backward_probe.md"), "w")

    def log(msg):  # written as it goes: a run cut short still leaves its lines
        print(msg, flush=True)
        md.write(msg + "\n")
        md.flush()

    t0 = time.time()
    log(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    parts = min(14, os.cpu_count() or 1)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=compile_worker, args=(variants, i, parts)) for i in range(parts)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    log(f"compiled in {time.time() - t0:.0f} s")
    log("correctness (errors against float32 autograd):")
    ok = correctness(log, variants)
    log(f"correctness {'ok' if ok else 'FAILED'} ({time.time() - t0:.0f} s)")
    rows = []
    for case in timing_cases(FINAL):
        rows.append(time_case(case, variants, log))
        torch.cuda.empty_cache()
    log(f"done in {time.time() - t0:.0f} s")
    with open(os.path.join(out_dir, "attention_backward_probe.json"), "w") as f:
        json.dump(dict(correct=ok, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
