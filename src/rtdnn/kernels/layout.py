"""Host-side helpers shared by the memory-bound kernels' planners."""

from __future__ import annotations


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def merge_dims(dims, shape, lists) -> tuple[list[int], list[list[int]]]:
    """Visit `dims` (outermost first), drop size-1 ones and merge neighbours that are
    contiguous in every stride list: fewer, longer dims mean less index arithmetic and longer
    vector accesses. Returns (sizes, merged stride lists)."""
    sizes: list[int] = []
    merged: list[list[int]] = [[] for _ in lists]
    for d in dims:
        if shape[d] == 1:
            continue
        if sizes and all(m[-1] == st[d] * shape[d] for m, st in zip(merged, lists, strict=True)):
            sizes[-1] *= shape[d]
            for m, st in zip(merged, lists, strict=True):
                m[-1] = st[d]
            continue
        sizes.append(shape[d])
        for m, st in zip(merged, lists, strict=True):
            m.append(st[d])
    return sizes, merged
