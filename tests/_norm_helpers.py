"""Shared helpers of the normalization tests: inputs in several memory layouts, tolerances."""

from __future__ import annotations

import torch

LAYOUTS = ("contiguous", "channels_last", "strided", "permuted")

#: Norm-wise relative error allowed against the float64 reference, per data type.
TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def make(shape, dtype=torch.float32, layout="contiguous", *, seed=0, scale=1.0, shift=0.0):
    """A tensor of `shape` with values shift + scale * N(0, 1), laid out as asked:
    channels-last (dim 1 innermost), a strided view (every other element of the last dim), or
    all dims reversed in memory."""
    g = torch.Generator().manual_seed(seed)
    shape = tuple(shape)

    def rand(s):
        return (torch.randn(s, generator=g, dtype=torch.float64) * scale + shift).to(dtype)

    if layout == "channels_last" and len(shape) >= 3:
        return rand((shape[0], *shape[2:], shape[1])).movedim(-1, 1)
    if layout == "strided":
        return rand((*shape[:-1], 2 * shape[-1]))[..., ::2]
    if layout == "permuted":
        return rand(shape[::-1]).permute(*reversed(range(len(shape))))
    return rand(shape)


def nan_like(t: torch.Tensor) -> torch.Tensor:
    """An output buffer full of NaN with t's shape and layout: beta == 0 must never read it."""
    return torch.full_like(t, float("nan"))


def check(out, ref, dtype=torch.float32, factor=1.0, what="", floor=0.0):
    """Norm-wise relative error within TOL[dtype] * factor. `floor` (a norm) replaces ||ref||
    when larger: gradients that are small differences of large terms are judged against the
    size of the terms, since rounding of those terms is all either side can resolve."""
    out64, ref64 = out.detach().double().cpu(), ref.detach().double().cpu()
    err = float("inf")
    if torch.isfinite(out64).all():
        err = float((out64 - ref64).norm()) / max(float(ref64.norm()), floor, 1e-300)
    assert err <= TOL[dtype] * factor, f"{what} rel. error {err:.2e} > {TOL[dtype] * factor:.1e}"


def term_size(dy, rstd_max, w=None) -> float:
    """||dy|| * max rstd * max |w|: the size of the terms a normalization's dx combines."""
    scale = float(dy.double().norm()) * float(rstd_max)
    return scale * (float(w.abs().max()) if w is not None else 1.0)


def scaling(case: str, like: torch.Tensor):
    """(alpha, beta, out, prior) for a scaling case: plain, a NaN-poisoned out with beta 0, or
    alpha and beta with a prior out value (prior is what the reference should see)."""
    if case == "plain":
        return 1.0, 0.0, None, None
    if case == "nan_out":
        return 0.5, 0.0, nan_like(like), None
    prior = make(like.shape, like.dtype, seed=99)
    out = torch.empty_like(like)
    out.copy_(prior)
    return 0.75, -0.5, out, prior
