"""Connectionist temporal classification loss (cudnnCTCLoss), forward and backward.

Semantics are torch.nn.functional.ctc_loss's: log_probs (T, N, C) (or unbatched (T, C)) with any
strides; targets padded (N, S) or concatenated 1-D (sum of target_lengths), int32 or int64;
input_lengths and target_lengths as tensors or sequences of ints. The per-element loss is
-log p(target | input) over all alignments (repeated labels need a blank between them); an
impossible alignment gives inf, or 0 with zero_infinity. reduction "mean" divides each loss by
its target length (at least 1) and averages over the batch; "sum"; "none" gives (N,).

Targets and lengths may be on log_probs' device or on the host (as torch's cuDNN path wants
them). Bad input is refused before the recursions run: lengths outside [0, T] and [0, S], and
targets equal to blank or outside [0, C) within their lengths (padding beyond a length is
ignored, as torch does). They are checked where they are: on the host with no
synchronization, or, when any of them is on the GPU, by one small kernel whose summary the
host reads back (one synchronization). The kernels never read past a length.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton

from ..core import bad_param, check_runnable, check_tensor
from ..core.handle import stream_counters
from ..kernels import ctc as kernels
from ..kernels.ctc import ctc_alpha_kernel, ctc_beta_kernel, ctc_check_kernel, ctc_grad_kernel
from ..kernels.launch import launch_cached
from ._common import check_span

REDUCTIONS = ("mean", "sum", "none")
_REDUCTION = {"none": kernels.NONE.value, "sum": kernels.SUM.value, "mean": kernels.MEAN.value}
_BLOCK_C = 128


def _recursion_warps(block_l: int) -> int:
    """Warps of the alpha and beta recursions: each step's exps and logs over the row are the
    step's latency, so wide rows take 8 (measured on an H100 with
    benchmarks/probes/ctc_warps.py: 504 against 591 us for alpha and 821 against 1219 us for
    beta at 512 lanes; 1 and 2 warps were 2 to 4 times slower; equal at 128 lanes)."""
    return 8 if block_l >= 256 else 4


def _lengths(name: str, v: object, n: int) -> torch.Tensor:
    """A length per batch element, as a 1-D tensor where it is (a sequence becomes one on the
    host); its values are checked with the targets."""
    if isinstance(v, torch.Tensor):
        if v.dtype not in (torch.int32, torch.int64) or v.dim() > 1:
            raise bad_param(name, f"{v.dtype} tensor of shape {tuple(v.shape)}", "int lengths (N,)")
        t = v.reshape(-1)
    elif isinstance(v, int) and not isinstance(v, bool):
        t = torch.tensor([v])
    elif isinstance(v, Sequence) and all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        t = torch.tensor(list(v), dtype=torch.int64)
    else:
        raise bad_param(name, v, "a tensor or a sequence of ints")
    if t.numel() != n:
        raise bad_param(f"{name}", tuple(t.tolist()), f"{n} lengths (one per batch element)")
    return t


def _summary_on_host(
    flat: torch.Tensor, in_len: torch.Tensor, tgt_len: torch.Tensor, width: int, C: int, blank: int
) -> tuple[torch.Tensor, list[int]]:
    """ctc_check_kernel's results, computed by torch on the host: (lengths (3, N) int64: the
    offsets into `flat`, input and target lengths; the summary of the lengths and of the
    first bad label). width: labels per element of padded targets, 0 for concatenated."""
    in_len, tgt_len = in_len.to(torch.int64), tgt_len.to(torch.int64)
    n, total = len(tgt_len), int(tgt_len.sum())
    if width:
        offsets = torch.arange(n, dtype=torch.int64) * width
        used = torch.arange(width)[None, :] < tgt_len[:, None]
    else:
        offsets = torch.cumsum(tgt_len, 0) - tgt_len
        used = torch.arange(flat.numel()) < total
    bad = used.reshape(-1) & ((flat < 0) | (flat >= C) | (flat == blank))
    first = int(bad.nonzero()[0, 0]) if bad.any() else flat.numel()
    value = int(flat[first]) if first < flat.numel() else 0
    stats = [in_len.min(), in_len.max(), tgt_len.min(), tgt_len.max()]
    summary = [int(v) for v in stats] + [total, first, value]
    return torch.stack([offsets, in_len, tgt_len]), summary


def _summary_on_device(
    flat: torch.Tensor, in_len: torch.Tensor, tgt_len: torch.Tensor, width: int, C: int, blank: int
) -> tuple[torch.Tensor, list[int]]:
    """_summary_on_host's results from ctc_check_kernel on the tensors' device: one launch and
    one synchronization (reading the summary back), whatever the batch."""
    n = in_len.numel()
    out = torch.empty(3 * n + 7, dtype=torch.int64, device=flat.device)
    check_runnable(flat.device)
    launch_cached(
        ctc_check_kernel, (1,), dict(targets=flat, in_len=in_len, tgt_len=tgt_len, lengths=out,
        summary=out[3 * n :]), n_targets=flat.numel(), in_stride=in_len.stride(0),
        tgt_stride=tgt_len.stride(0), N=n, S=width, C=C, BLANK=blank, PADDED=bool(width),
        BLOCK=1024,
    )  # fmt: skip
    return out[: 3 * n].view(3, n), out[3 * n :].tolist()


def _refuse_bad(
    summary: list[int], lengths: torch.Tensor, T: int, width: int, flat: torch.Tensor,
    unbatched: bool, C: int, blank: int,
) -> None:  # fmt: skip
    """Raise BadParamError for lengths out of range or a bad label (see _summary_on_host)."""
    least_in, most_in, least_tgt, most_tgt, total, first, value = summary

    def shown(row: int) -> tuple[int, ...]:  # only when refusing: it may read the GPU
        return tuple(lengths[row].tolist())

    if least_in < 0 or most_in > T:
        raise bad_param("input_lengths", shown(1), f"lengths in [0, {T}]")
    if least_tgt < 0:
        raise bad_param("target_lengths", shown(2), "non-negative lengths")
    if width and most_tgt > width:
        raise bad_param("target_lengths", shown(2), f"lengths in [0, {width}]")
    if not width and total > flat.numel():
        if unbatched:
            raise bad_param("target_lengths", shown(2), f"at most {flat.numel()}")
        raise bad_param(
            "targets.shape", (flat.numel(),),
            f"at least sum(target_lengths) = {total} concatenated labels",
        )  # fmt: skip
    if first < flat.numel():
        raise bad_param(
            "targets", value, f"labels in [0, {C}) other than blank={blank} within target_lengths"
        )


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
    in_len = _lengths("input_lengths", input_lengths, N)
    tgt_len = _lengths("target_lengths", target_lengths, N)
    for name, t in (("input_lengths", in_len), ("target_lengths", tgt_len)):
        if t.device not in (lp.device, torch.device("cpu")):
            raise bad_param(f"{name}.device", t.device, f"{lp.device} or cpu")
    if targets.dim() == 2 and not unbatched:
        if targets.shape[0] != N:
            raise bad_param("targets.shape", tuple(targets.shape), f"({N}, S)")
        width = targets.shape[1]
    elif targets.dim() == 1:
        width = 0
    else:
        raise bad_param("targets.dim()", targets.dim(), "2 (padded) or 1 (concatenated)")
    flat = targets.reshape(-1).contiguous()  # a reshape of a strided view may keep strides
    # Checked where the targets and lengths are: on the host with no synchronization (torch's
    # cuDNN path takes them there); else on log_probs' device with one.
    if all(t.device.type == "cpu" for t in (flat, in_len, tgt_len)):
        lengths, summary = _summary_on_host(flat, in_len, tgt_len, width, C, blank)
    else:
        flat, in_len, tgt_len = (t.to(lp.device) for t in (flat, in_len, tgt_len))
        lengths, summary = _summary_on_device(flat, in_len, tgt_len, width, C, blank)
    _refuse_bad(summary, lengths, T, width, flat, unbatched, C, blank)
    # One copy of the per-element integers to the device (none when they are there).
    offsets, in_len, tgt_len = lengths.to(lp.device)
    return lp, flat.to(lp.device), offsets, in_len, tgt_len, summary[3], unbatched


def ctc_forward(
    lp: torch.Tensor, targets, offsets, in_len, tgt_len, blank: int, max_target: int,
    reduction: str, zero_infinity: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(loss float32: (N,) for reduction "none", else a scalar; nll (N,) float32; alpha
    workspace (N, T, BLOCK_L) float32) from prepare()'s results; max_target: the largest
    target length (sizes the label lanes)."""
    T, N, _ = lp.shape
    block_l = triton.next_power_of_2(2 * max_target + 1)
    alpha = torch.empty((N, T, block_l), dtype=torch.float32, device=lp.device)
    nll = torch.empty((N,), dtype=torch.float32, device=lp.device)
    loss = nll.new_empty((N,) if reduction == "none" else ())
    check_runnable(lp.device)
    s_t, s_n, s_c = lp.stride()
    launch_cached(
        ctc_alpha_kernel, (N,), dict(lp=lp, targets=targets, offsets=offsets, in_len=in_len,
        tgt_len=tgt_len, alpha=alpha, nll=nll, loss=loss,
        counter=stream_counters(lp.device, 1)), num_warps=_recursion_warps(block_l), s_t=s_t,
        s_n=s_n, s_c=s_c, T=T, BLANK=blank, BLOCK_L=block_l, REDUCTION=_REDUCTION[reduction],
        ZERO_INFINITY=zero_infinity, BLOCK_N=min(1024, triton.next_power_of_2(N)),
    )  # fmt: skip
    return loss, nll, alpha


def ctc_backward(
    grad_loss: torch.Tensor, lp: torch.Tensor, targets, offsets, in_len, tgt_len,
    nll: torch.Tensor, alpha: torch.Tensor, blank: int, reduction: str, zero_infinity: bool,
) -> torch.Tensor:  # fmt: skip
    """d (grad_loss . loss) / d log_probs, (T, N, C) in log_probs' dtype, for ctc_forward's
    loss (torch's gradient: see kernels/ctc.py)."""
    T, N, C = lp.shape
    block_l = alpha.shape[2]
    dev = lp.device
    grad = torch.empty((T, N, C), dtype=lp.dtype, device=dev)
    post = torch.empty((N, T, block_l), dtype=torch.float32, device=dev)
    links = torch.empty((N, block_l), dtype=torch.int32, device=dev)
    heads = torch.empty_like(links)
    repeats = torch.empty((N,), dtype=torch.int32, device=dev)
    grad_loss = grad_loss.float()  # (N,) or a scalar; any stride
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
        repeats=repeats, nll=nll, grad_loss=grad_loss, grad=grad),
        grad_stride=grad_loss.stride(0) if grad_loss.dim() else 0, g_t=g_t, g_n=g_n, g_c=g_c,
        C=C, REDUCTION=_REDUCTION[reduction], ZERO_INFINITY=zero_infinity,
        BLOCK_C=min(_BLOCK_C, triton.next_power_of_2(C)), **strides,
    )  # fmt: skip
    return grad


def check_reduction(reduction: object, zero_infinity: object) -> None:
    if reduction not in REDUCTIONS:
        raise bad_param("reduction", reduction, "'mean', 'sum' or 'none'")
    if not isinstance(zero_infinity, bool):
        raise bad_param("zero_infinity", zero_infinity, "True or False")
