"""Helpers shared by the CPU tests of the memory-bound primitives (not a test module)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

# Max abs error allowed, relative to max(|ref|, 1): float32 arithmetic inside, result rounded
# to the storage dtype.
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
LAYOUTS = ("contiguous", "channels_last", "strided", "reversed")


def make(shape, dtype=torch.float32, layout="contiguous", fill=None, scale=1.0) -> torch.Tensor:
    """A tensor of `shape` in the given memory layout:
    contiguous; channels_last (C innermost, for 3 dims or more, else reversed); strided (a
    non-dense view: every other element of a wider last dim); reversed (all strides reversed).
    fill(shape) -> float32 values (default randn * scale)."""
    shape = tuple(shape)
    gen = fill or (lambda s: torch.randn(s) * scale)
    nd = len(shape)
    if layout == "channels_last" and nd < 3:
        layout = "reversed"
    if layout == "contiguous":
        t = gen(shape)
    elif layout == "channels_last":
        order = (0, *range(2, nd), 1)
        t = gen(tuple(shape[d] for d in order)).permute(*_inverse(order))
    elif layout == "reversed":
        t = gen(shape[::-1]).permute(*reversed(range(nd)))
    elif layout == "strided":
        wide = (*shape[:-1], 2 * shape[-1]) if nd else shape
        t = gen(wide)[..., ::2] if nd else gen(shape)
    else:
        raise ValueError(layout)
    return t.to(dtype)


def _inverse(order):
    inv = [0] * len(order)
    for i, d in enumerate(order):
        inv[d] = i
    return inv


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype=None, tol=None, what=""):
    dtype = dtype or out.dtype
    tol = TOL[dtype] if tol is None else tol
    out64 = out.detach().double().cpu()
    ref64 = ref.detach().double().cpu()
    assert out64.shape == ref64.shape, (what, out64.shape, ref64.shape)
    assert torch.isfinite(out64).all() or not torch.isfinite(ref64).all(), f"{what}: non-finite"
    # Equal entries (a max over a window of padding only is -inf in both) count as exact;
    # anything else non-finite, NaN included, fails.
    diff = torch.where(out64 == ref64, 0.0, (out64 - ref64).abs())
    err = diff.max().item() if out64.numel() else 0.0
    finite_ref = ref64[torch.isfinite(ref64)]
    scale = max(finite_ref.abs().max().item() if finite_ref.numel() else 0.0, 1.0)
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol:.1g} * {scale:.3g}"


def out_for(shape, like: torch.Tensor, beta: float, layout="contiguous"):
    """(out argument, its prior value for the reference): NaN-poisoned when beta == 0, since
    rtdnn must not read it then; random otherwise."""
    if beta == 0:
        out = make(shape, like.dtype, layout, fill=lambda s: torch.full(s, float("nan")))
        return out, None
    out = make(shape, like.dtype, layout)
    return out, out.clone()
