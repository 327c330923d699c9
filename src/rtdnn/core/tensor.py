"""Tensor descriptors, dtypes, math modes and the checks every primitive shares."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from .errors import BadParamError, NotSupportedError, bad_param

#: Storage dtypes every primitive accepts; arithmetic inside kernels is float32.
SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)

#: Element offsets are computed in 32-bit integers inside the kernels.
MAX_ELEMENTS = 2**31 - 1

MATH_MODES = ("fp32", "tf32")


#: The getter behind torch.backends.cudnn.allow_tf32, whose module property costs several
#: times the call itself (it is read on every convolution call); the property without it.
_cudnn_allow_tf32 = getattr(
    torch._C, "_get_cudnn_allow_tf32", lambda: torch.backends.cudnn.allow_tf32
)


def default_math_mode() -> str:
    """The math mode used when a caller gives none: PyTorch's cuDNN TF32 switch decides."""
    return "tf32" if _cudnn_allow_tf32() else "fp32"


def default_matmul_math_mode() -> str:
    """The math mode of a matrix product (linear layers) when a caller gives none: PyTorch's
    matmul TF32 switch decides, as it does for torch.nn.Linear (off by default)."""
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"


def resolve_math_mode(math: str | None, matmul: bool = False) -> str:
    """`math` checked, or the default when None: cuDNN's TF32 switch for convolutions, the
    matmul switch (`matmul=True`) for matrix products."""
    if math is None:
        return default_matmul_math_mode() if matmul else default_math_mode()
    if math not in MATH_MODES:
        raise bad_param("math", math, f"one of {MATH_MODES} or None")
    return math


def resolve_deterministic(deterministic: bool | None) -> bool:
    """True if only algorithms whose results repeat bit for bit may run. None follows PyTorch's
    switch, torch.use_deterministic_algorithms (read on every call, as torch's own ops do)."""
    if deterministic is None:
        return torch.are_deterministic_algorithms_enabled()
    if not isinstance(deterministic, bool):
        raise bad_param(
            "deterministic", deterministic, "True, False or None (follow PyTorch's setting)"
        )
    return deterministic


@dataclass(frozen=True)
class TensorDesc:
    """Shape, strides (in elements, may be negative) and dtype of one tensor.

    `offset` is the element offset of logical index (0, ..., 0) from the data pointer; it is
    non-zero only for views rtdnn builds itself, such as a weight flipped for true convolution.
    """

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: torch.dtype
    offset: int = 0

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorDesc:
        return cls(tuple(t.shape), tuple(t.stride()), t.dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def flipped(self, dims: Sequence[int]) -> TensorDesc:
        """The same memory read with the given dims reversed (negative strides)."""
        strides = list(self.strides)
        offset = self.offset
        for d in dims:
            offset += (self.shape[d] - 1) * strides[d]
            strides[d] = -strides[d]
        return TensorDesc(self.shape, tuple(strides), self.dtype, offset)


def check_tensor(
    name: str,
    t: object,
    *,
    ndim: int | tuple[int, ...] | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | None = None,
    empty: bool = False,
) -> torch.Tensor:
    """Validate one tensor argument and return it; raise BadParamError naming `name`.

    empty: accept tensors with a zero-sized dim (the caller then returns without launching a
    kernel, as an op over no elements must)."""
    if not isinstance(t, torch.Tensor):
        raise bad_param(name, type(t).__name__, "a torch.Tensor")
    if t.dtype not in SUPPORTED_DTYPES:
        raise bad_param(f"{name}.dtype", t.dtype, "one of float32, float16, bfloat16")
    if dtype is not None and t.dtype != dtype:
        raise bad_param(f"{name}.dtype", t.dtype, f"{dtype} (the dtype of the other operands)")
    if device is not None and t.device != device:
        raise bad_param(f"{name}.device", t.device, f"{device} (the device of the other operands)")
    if t.device.type not in ("cpu", "cuda"):
        raise bad_param(f"{name}.device", t.device, "a CUDA device, or the CPU (interpreter)")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else ndim
        if t.dim() not in allowed:
            raise bad_param(f"{name}.dim()", t.dim(), f"one of {allowed}")
    if t.numel() > MAX_ELEMENTS:
        raise NotSupportedError(
            f"{name} has {t.numel()} elements: tensors above 2**31 - 1 elements are not supported"
        )
    if t.numel() == 0 and not empty:
        raise bad_param(f"{name}.shape", tuple(t.shape), "no zero-sized dimension")
    return t


def check_scaling(alpha: float, beta: float, out: torch.Tensor | None) -> None:
    """cuDNN's output scaling: out = alpha * op + beta * out. beta != 0 needs `out`.

    Both must be finite: a NaN or infinite scale would write NaN or inf everywhere."""
    for name, v in (("alpha", alpha), ("beta", beta)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            raise bad_param(name, v, "a finite real number")
    if beta != 0 and out is None:
        raise bad_param("beta", beta, "0 unless `out` is given (beta scales out's prior value)")


def check_out(out: torch.Tensor, shape: Sequence[int], like: torch.Tensor) -> None:
    """`out` must have the op's result shape, dtype and device."""
    check_tensor("out", out, dtype=like.dtype, device=like.device, empty=True)
    if tuple(out.shape) != tuple(shape):
        raise bad_param("out.shape", tuple(out.shape), f"{tuple(shape)}")
    if _overlaps_itself(out):
        raise BadParamError("out has overlapping elements (a broadcast view): it cannot be written")


def tma_aligned(*tensors: torch.Tensor) -> bool:
    """Whether every tensor's data starts on a 16-byte boundary: what the copy engine needs of
    a tensor descriptor's base (its strides are checked when a call is prepared)."""
    return all(t.data_ptr() % 16 == 0 for t in tensors)


def check_no_overlap(
    out: torch.Tensor,
    inputs: Iterable[tuple[str, torch.Tensor | None]],
    *,
    same_index_ok: bool = False,
    out_name: str = "out",
) -> None:
    """`out` (the written tensor, called `out_name` in errors) must not share memory with any
    of the named input tensors (None entries skipped).

    A kernel that writes an element another program still has to read gives a wrong result,
    so an overlap is refused. same_index_ok: the op is elementwise (element i of out depends
    only on element i of each input, read before it is written), so `out` may be exactly an
    input (same address, shape, strides and dtype: in place). Overlap is judged by address
    ranges: views that interleave without sharing an element (x[::2] and x[1::2]) are refused
    too.
    """
    lo, hi = _address_range(out)
    for name, t in inputs:
        if t is None or t.numel() == 0:
            continue
        t_lo, t_hi = _address_range(t)
        if t_hi <= lo or hi <= t_lo:
            continue
        if same_index_ok and _same_view(out, t):
            continue
        allowed = f" (or exactly {name}, in place)" if same_index_ok else ""
        raise BadParamError(
            f"{out_name} overlaps {name} in memory: expected an {out_name} that shares no "
            f"memory with the inputs{allowed}"
        )


def check_out_disjoint(out: torch.Tensor | None, **inputs: torch.Tensor | None) -> None:
    """`out`, when given, shares no memory at all with the named inputs (None skipped): for
    ops that are not elementwise, where even exactly an input (in place) is wrong because
    programs read elements others have already written. Checked on every call: cached call
    plans know shapes and strides, not addresses."""
    if out is not None:
        check_no_overlap(out, inputs.items())


def byte_spans(*tensors: torch.Tensor | None) -> tuple[int, ...]:
    """Each tensor's bytes from its first element to one past its last (0 for None or an
    empty tensor). They depend only on shapes, strides and dtypes, so a prepared call keeps
    them and checks overlaps from addresses alone (spans_apart)."""
    return tuple(
        0 if t is None or t.numel() == 0 else _address_range(t)[1] - t.data_ptr() for t in tensors
    )


def spans_apart(tensors, spans: tuple[int, ...], written: int) -> bool:
    """Whether each of the first `written` tensors shares no memory with any other among
    `tensors` (spans[i] the byte span of tensors[i], from byte_spans, 0 to skip it). False
    means that check_no_overlap is to say which overlap and raise."""
    ranges = [(t.data_ptr(), s) if s else None for t, s in zip(tensors, spans, strict=True)]
    for i in range(written):
        if ranges[i] is None:
            continue
        lo, span = ranges[i]
        hi = lo + span
        for j, other in enumerate(ranges):
            if j != i and other is not None and other[0] < hi and lo < other[0] + other[1]:
                return False
    return True


def _address_range(t: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) byte addresses a view touches (torch strides are never negative)."""
    n = t.numel()
    if n == 0:
        return 0, 0
    start = t.data_ptr()
    if t.is_contiguous():  # an attribute read: most parameters and statistics
        return start, start + n * t.element_size()
    return start, start + memory_span(tuple(t.shape), tuple(t.stride())) * t.element_size()


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.data_ptr() == b.data_ptr()
        and a.dtype == b.dtype
        and a.shape == b.shape
        and a.stride() == b.stride()
    )


def _overlaps_itself(t: torch.Tensor) -> bool:
    dims = sorted((abs(st), sz) for st, sz in zip(t.stride(), t.shape, strict=True) if sz > 1)
    extent = 1
    for stride, size in dims:
        if stride < extent:
            return True
        extent = stride * size
    return False


def contiguous_strides(shape: Sequence[int], dims: Iterable[int]) -> tuple[int, ...]:
    """Strides over all of `shape`'s dims of a tensor dense over `dims`, given outermost
    first, and 0 elsewhere: `dims` a permutation of every dim gives a dense layout in that
    order (channels-last is (0, 2, ..., 1)); a subset, a weight over those dims broadcast to
    `shape`."""
    strides = [0] * len(shape)
    step = 1
    for d in reversed(tuple(dims)):
        strides[d] = step
        step *= shape[d]
    return tuple(strides)


@functools.lru_cache(maxsize=4096)
def memory_span(shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """Elements between the lowest and highest address a view touches, plus one. Kernels
    address memory with int32 offsets, so this must stay within MAX_ELEMENTS."""
    return 1 + sum((s - 1) * abs(st) for s, st in zip(shape, strides, strict=True))


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints, on the host: triton.cdiv is a constexpr function, whose calls
    from Python cost microseconds each."""
    return -(-a // b)


def cached_call(fn, *args):
    """fn(*args) for an lru_cache'd fn, or its uncached original when an argument cannot be
    hashed (symbolic sizes while tracing, lists)."""
    try:
        return fn(*args)
    except TypeError:
        return fn.__wrapped__(*args)


def empty_like_layout(shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
    """A new tensor of `shape` whose dims are laid out in memory in `like`'s order.

    This is how outputs keep the input's memory format: channels-last in, channels-last out.
    """
    shape = tuple(shape)
    return torch.empty_strided(
        shape, layout_strides(shape, like), dtype=like.dtype, device=like.device
    )


def layout_strides(shape: Sequence[int], like: torch.Tensor) -> tuple[int, ...]:
    """The strides of a dense tensor of `shape` laid out in `like`'s order (channels-last if
    like is, else contiguous)."""
    cl = len(shape) == like.dim() and channels_last(like)
    return cached_call(dense_strides, tuple(shape), cl)


@functools.lru_cache(maxsize=4096)
def dense_strides(shape: tuple[int, ...], channels_last: bool) -> tuple[int, ...]:
    """The strides of a dense tensor of `shape`, channels-last (dim 1 innermost, then the
    spatial dims, then dim 0) or contiguous. Called for every output, every step: computed
    once per shape."""
    n = len(shape)
    order = (0, *range(2, n), 1) if channels_last else range(n)
    strides = [0] * n
    step = 1
    for d in reversed(tuple(order)):
        strides[d] = step
        step *= shape[d]
    return tuple(strides)


def channels_last(t: torch.Tensor) -> bool:
    """True if the channel dim (dim 1) is the innermost in memory."""
    return cached_call(_channels_last, t.shape, t.stride())


@functools.lru_cache(maxsize=4096)
def _channels_last(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    if len(shape) < 3 or shape[1] == 1:
        return False
    return strides[1] == 1 and all(strides[d] >= shape[1] for d in range(2, len(shape)))
