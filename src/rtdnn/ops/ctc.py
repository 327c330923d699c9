"""Connectionist temporal classification loss (cudnnCTCLoss), forward and backward.

Semantics are torch.nn.functional.ctc_loss's: log_probs (T, N, C) (or unbatched (T, C)) with any
strides; targets padded (N, S) or concatenated 1-D (sum of target_lengths), int32 or int64;
input_lengths and target_lengths as tensors or sequences of ints. The per-element loss is
-log p(target | input) over all alignments (repeated labels need a blank between them); an
impossible alignment gives inf, or 0 with zero_infinity. reduction "mean" divides each loss by
its target length (at least 1) and averages over the batch; "sum"; "none" gives (N,).

Targets may be on log_probs' device or on the host (as torch's cuDNN path wants them). Bad
input is refused before any launch: lengths outside [0, T] and [0, S], and targets equal to
blank or outside [0, C) within their lengths, checked where the targets are (on a GPU, with
one synchronization; padding beyond a length is ignored, as torch does). The kernels never
read past a length.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton

from ..core import bad_param, check_runnable, check_tensor
from ..kernels.ctc import ctc_alpha_kernel, ctc_beta_kernel, ctc_grad_kernel
from ..kernels.launch import launch_cached
from ._common import check_span

REDUCTIONS = ("mean", "sum", "none")
_BLOCK_C = 128


def _recursion_warps(block_l: int) -> int:
    """Warps of the alpha and beta recursions: each step's exps and logs over the row are the
    step's latency, so wide rows take 8 (measured on an H100 with
    benchmarks/probes/ctc_warps.py: 504 against 591 us for alpha and 821 against 1219 us for
    beta at 512 lanes; 1 and 2 warps were 2 to 4 times slower; equal at 128 lanes)."""
    return 8 if block_l >= 256 else 4


def _lengths(name: str, v: object, n: int, device) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        if v.dtype not in (torch.int32, torch.int64) or v.dim() > 1:
            raise bad_param(name, f"{v.dtype} tensor of shape {tuple(v.shape)}", "int lengths (N,)")
        t = v.reshape(-1).to("cpu", torch.int64)
    elif isinstance(v, int) and not isinstance(v, bool):
        t = torch.tensor([v])
    elif isinstance(v, Sequence) and all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        t = torch.tensor(list(v), dtype=torch.int64)
    else:
        raise bad_param(name, v, "a tensor or a sequence of ints")
    if t.numel() != n:
        raise bad_param(f"{name}", tuple(t.tolist()), f"{n} lengths (one per batch element)")
    return t


def prepare(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths,
    target_lengths,
    blank: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, bool]:
    """Validate; return (log_probs (T, N, C), the targets flat (their own dtype, contiguous),
    per-element offsets into them, input lengths, target lengths (int64, all on log_probs'
    device), the longest target length, unbatched)."""
    lp = check_tensor("log_probs", log_probs, ndim=(2, 3), empty=True)
    unbatched = lp.dim() == 2
    if unbatched:
        lp = lp.unsqueeze(1)
    T, N, C = lp.shape
    if T == 0 or N == 0 or C == 0:
        raise bad_param("log_probs.shape", tuple(log_probs.shape), "no zero-sized dimension")
    check_span("log_probs", lp)
    if not isinstance(blank, int) or isinstance(blank, bool) or not 0 <= blank < C:
        raise bad_param("blank", blank, f"a class index in [0, {C})")
    if not isinstance(targets, torch.Tensor) or targets.dtype not in (torch.int32, torch.int64):
        raise bad_param("targets.dtype", getattr(targets, "dtype", type(targets).__name__),
                        "int32 or int64")  # fmt: skip
    if targets.device not in (lp.device, torch.device("cpu")):
        raise bad_param("targets.device", targets.device, f"{lp.device} or cpu")
    in_len = _lengths("input_lengths", input_lengths, N, lp.device)
    tgt_len = _lengths("target_lengths", target_lengths, N, lp.device)
    if (in_len < 0).any() or (in_len > T).any():
        raise bad_param("input_lengths", tuple(in_len.tolist()), f"lengths in [0, {T}]")
    if (tgt_len < 0).any():
        raise bad_param("target_lengths", tuple(tgt_len.tolist()), "non-negative lengths")
    if targets.dim() == 2 and not unbatched:
        if targets.shape[0] != N:
            raise bad_param("targets.shape", tuple(targets.shape), f"({N}, S)")
        S = targets.shape[1]
        if (tgt_len > S).any():
            raise bad_param("target_lengths", tuple(tgt_len.tolist()), f"lengths in [0, {S}]")
        flat = targets.reshape(-1).contiguous()  # a reshape of a strided view may keep strides
        offsets = torch.arange(N, dtype=torch.int64) * S
        # The positions within each length (padding past a length is never read).
        used = torch.arange(S, device=flat.device)[None, :] < tgt_len.to(flat.device)[:, None]
        used = used.reshape(-1)
    elif targets.dim() == 1:
        total = int(tgt_len.sum())
        if unbatched and targets.numel() < total:
            raise bad_param("target_lengths", tuple(tgt_len.tolist()), f"at most {targets.numel()}")
        if not unbatched and targets.numel() < total:
            raise bad_param(
                "targets.shape", tuple(targets.shape),
                f"at least sum(target_lengths) = {total} concatenated labels",
            )  # fmt: skip
        flat = targets.contiguous()
        offsets = torch.cumsum(tgt_len, 0) - tgt_len
        used = torch.arange(targets.numel(), device=flat.device) < total
    else:
        raise bad_param("targets.dim()", targets.dim(), "2 (padded) or 1 (concatenated)")
    # The labels within each length: a class, never the blank. Checked where they are: on
    # the host for free, on the GPU with one synchronization (torch's own cuDNN path takes
    # targets on the host).
    bad = used & ((flat < 0) | (flat >= C) | (flat == blank))
    if bad.any():
        v = int(flat[bad][0])
        raise bad_param(
            "targets", v, f"labels in [0, {C}) other than blank={blank} within target_lengths"
        )
    flat = flat.to(lp.device)
    # One copy of the per-element integers to the device.
    offsets, in_len_d, tgt_len_d = torch.stack([offsets, in_len, tgt_len]).to(lp.device)
    max_target = int(tgt_len.max())
    return lp, flat, offsets, in_len_d, tgt_len_d, max_target, unbatched


def ctc_forward(
    lp: torch.Tensor, targets, offsets, in_len, tgt_len, blank: int, max_target: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(nll (N,) float32, alpha workspace (N, T, BLOCK_L) float32) from prepare()'s results;
    max_target: the largest target length (sizes the label lanes)."""
    T, N, _ = lp.shape
    block_l = triton.next_power_of_2(2 * max_target + 1)
    alpha = torch.empty((N, T, block_l), dtype=torch.float32, device=lp.device)
    nll = torch.empty((N,), dtype=torch.float32, device=lp.device)
    check_runnable(lp.device)
    s_t, s_n, s_c = lp.stride()
    launch_cached(
        ctc_alpha_kernel, (N,), dict(lp=lp, targets=targets, offsets=offsets, in_len=in_len,
        tgt_len=tgt_len, alpha=alpha, nll=nll), num_warps=_recursion_warps(block_l), s_t=s_t,
        s_n=s_n, s_c=s_c, T=T, BLANK=blank, BLOCK_L=block_l,
    )  # fmt: skip
    return nll, alpha


def ctc_backward(
    grad_nll: torch.Tensor, lp: torch.Tensor, targets, offsets, in_len, tgt_len,
    nll: torch.Tensor, alpha: torch.Tensor, blank: int, zero_infinity: bool,
) -> torch.Tensor:  # fmt: skip
    """d (grad_nll . nll) / d log_probs, (T, N, C) in log_probs' dtype (torch's gradient: see
    kernels/ctc.py)."""
    T, N, C = lp.shape
    block_l = alpha.shape[2]
    dev = lp.device
    grad = torch.empty((T, N, C), dtype=lp.dtype, device=dev)
    post = torch.empty((N, T, block_l), dtype=torch.float32, device=dev)
    links = torch.empty((N, block_l), dtype=torch.int32, device=dev)
    heads = torch.empty_like(links)
    repeats = torch.empty((N,), dtype=torch.int32, device=dev)
    check_runnable(dev)
    labels = dict(lp=lp, targets=targets, offsets=offsets, in_len=in_len, tgt_len=tgt_len)
    s_t, s_n, s_c = lp.stride()
    strides = dict(s_t=s_t, s_n=s_n, s_c=s_c, T=T, BLANK=blank, BLOCK_L=block_l)
    launch_cached(
        ctc_beta_kernel, (N,), dict(**labels, alpha=alpha, post=post, links=links, heads=heads,
        repeats=repeats), num_warps=_recursion_warps(block_l), CHUNK=min(16, block_l),
        **strides,
    )  # fmt: skip
    g_t, g_n, g_c = grad.stride()
    launch_cached(
        ctc_grad_kernel, (T * N,), dict(**labels, post=post, links=links, heads=heads,
        repeats=repeats, nll=nll, grad_nll=grad_nll.float().contiguous(), grad=grad),
        g_t=g_t, g_n=g_n, g_c=g_c, C=C, ZERO_INFINITY=zero_infinity,
        BLOCK_C=min(_BLOCK_C, triton.next_power_of_2(C)), **strides,
    )  # fmt: skip
    return grad


def reduce(loss: torch.Tensor, tgt_len: torch.Tensor, reduction: str) -> torch.Tensor:
    """torch's reductions of the per-element losses (N,)."""
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return (loss / tgt_len.clamp(min=1).to(loss.dtype)).mean()


def check_reduction(reduction: object, zero_infinity: object) -> None:
    if reduction not in REDUCTIONS:
        raise bad_param("reduction", reduction, "'mean', 'sum' or 'none'")
    if not isinstance(zero_infinity, bool):
        raise bad_param("zero_infinity", zero_infinity, "True or False")
