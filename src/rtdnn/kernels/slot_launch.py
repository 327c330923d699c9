"""A prepared launch whose changing arguments are given by position.

Like `launch.KernelLaunch`, but cheaper per call: the argument list is built once with holes
("slots") for the tensors and floats that change between calls, so a call only fills the
holes, checks the tensors' 16-byte alignment (part of Triton's specialization) and launches
the compiled kernel. Memory-bound kernels such as the normalizations take a few microseconds
on the GPU, so the host must not take longer.
"""

from __future__ import annotations

import torch

from ..core import INTERPRETED


class SlotLaunch:
    def __init__(self, fn, grid: tuple[int, ...], options: dict, slots: tuple[str, ...], **fixed):
        names = list(fn.arg_names)
        missing = set(names) - set(fixed) - set(slots)
        if missing:
            raise TypeError(f"{fn.__name__}: no value for {sorted(missing)}")
        self.fn = fn
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.options = options
        self.template = [fixed.get(n) for n in names]
        self.index = [names.index(s) for s in slots]
        self.compiled = None
        self.aligned = None

    def __call__(self, *values) -> None:
        args = self.template.copy()
        for i, v in zip(self.index, values, strict=True):
            args[i] = v
        aligned = tuple(v.data_ptr() % 16 == 0 for v in values if isinstance(v, torch.Tensor))
        if self.compiled is not None and aligned == self.aligned:
            self.compiled[self.grid](*args)
            return
        kernel = self.fn[self.grid](*args, **self.options)
        if not INTERPRETED:
            self.compiled, self.aligned = kernel, aligned
