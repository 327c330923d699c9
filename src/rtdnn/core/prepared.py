"""Prepared calls: what a public function checks and decides once per call signature.

A layer calls the same function with tensors of the same shapes, strides, dtypes and devices
on every step, so everything that depends only on those (the checks, the tiles, the kernel
launches) is done on the first call of a signature. The result, a prepared call that holds
no tensors, is kept under the signature; later calls with that signature check only what
the signature does not fix (scalars, overlaps between the tensors given) and go straight to
the kernels. A signature that fails its checks stores nothing, so it fails again next time.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def signature(name: str, tensors, *flags) -> tuple | None:
    """A call's signature: its tensors' shapes, strides, dtypes and devices (None stays None),
    and flags with their types, so that True and 1 differ (a list or tuple flag keyed element
    by element, each with its type: the checks of [True] and [1] differ). None when an
    argument that should be a tensor is not one: such a call is checked every time."""
    parts = [name]
    append = parts.append  # a signature is built on every call: one loop, no generators
    for t in tensors:
        if t is None:
            append(None)
        elif isinstance(t, torch.Tensor):
            append((t.shape, t.stride(), t.dtype, t.device))
        else:
            return None
    for f in flags:
        # A str equals no value of another type, so it stands for itself.
        append(f if type(f) is str else _flag(f))
    return tuple(parts)


def _flag(f: object) -> tuple:
    if isinstance(f, list | tuple):
        # Sequences of scalars (a convolution's stride, padding and dilation: six per layer
        # call) are keyed as their values and their values' types side by side, which costs
        # half of keying each element; others element by element. The two forms have
        # different lengths, so they never compare equal.
        types = tuple(map(type, f))
        if _SCALARS.issuperset(types):
            return (type(f), tuple(f), types)
        return (type(f), tuple(_flag(e) for e in f))
    return (type(f), f)


#: The element types a flat sequence flag may hold to be keyed by value and type (_flag).
_SCALARS = frozenset({int, float, bool, str, type(None)})


def nonzero(v: object) -> object:
    """v != 0 for a signature, whatever v is (the checks judge it later)."""
    try:
        return bool(v != 0)
    except Exception:
        return v


class PreparedCalls:
    """Signatures -> prepared calls, for one family of functions."""

    def __init__(self, limit: int = 4096):
        self.calls: dict[tuple, Callable] = {}
        self.limit = limit  # a bound on what many distinct problems keep

    def find(self, key: tuple | None) -> Callable | None:
        """The call prepared under `key`, or None (also for a key of None or unhashable)."""
        if key is None:
            return None
        try:
            return self.calls.get(key)
        except TypeError:
            return None

    def get(self, key: tuple | None, prepare: Callable[[], Callable]) -> Callable:
        """The call prepared under `key`, or `prepare()` (which checks the arguments and
        raises on bad ones), kept under `key` unless key is None or unhashable (symbolic
        sizes while tracing)."""
        if key is None:
            return prepare()
        try:
            call = self.calls.get(key)
        except TypeError:
            return prepare()
        if call is None:
            call = prepare()
            if len(self.calls) >= self.limit:
                self.calls.clear()
            self.calls[key] = call
        return call

    def clear(self) -> None:
        self.calls.clear()
