"""Host-side launch helpers. No policy: callers pick tiles and splits.

A layer runs the same kernels with the same sizes on every step, so launches are prepared once
per problem. `SlotLaunch` and `KernelLaunch` fix a kernel's grid, integer arguments and
compile-time constants; the first call goes through Triton's JIT (compiling if needed) and later
calls go straight to the compiled kernel's launcher, skipping Triton's per-call argument
binding, which costs more than the kernel itself on small layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
from triton import knobs
from triton.runtime import driver

from ..core import INTERPRETED
from .brgemm import brgemm_kernel, brgemm_reduce_kernel, identity


@dataclass(frozen=True)
class TileConfig:
    """Tile shape and launch parameters of one brgemm_kernel compilation."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3


def _signature(values) -> tuple:
    """What Triton specializes a compiled kernel on, for the arguments that change between
    calls: each tensor's dtype and 16-byte alignment, each int's divisibility by 16 and
    equality to 1 and whether it fits in 32 bits. Calls with the same signature can share one
    compiled kernel."""
    sig = []
    for v in values:
        kind = type(v)
        if kind is float:  # alpha, beta: the most common non-tensor slots
            sig.append(float)
        elif isinstance(v, torch.Tensor):
            sig.append((v.dtype, (v.data_ptr() & 15) == 0))
        elif kind is int:
            sig.append(((v & 15) == 0, v == 1, -(2**31) <= v < 2**31))
        else:
            sig.append(kind)
    return tuple(sig)


def _launch_hooks_installed() -> bool:
    """Whether a launch hook (a profiler such as proton) is installed: an empty HookChain in
    Triton 3.6, None in earlier versions, when there is none."""
    hook = knobs.runtime.launch_enter_hook
    return hook is not None and bool(getattr(hook, "calls", True))


class SlotLaunch:
    """One @triton.jit kernel with a fixed grid and fixed arguments, and holes ("slots") for the
    arguments that change between calls (tensors, alpha, beta, seeds), given by position.

    The first call with a new argument signature (see `_signature`) on a device goes through
    Triton's JIT, compiling if needed; later calls fill the slots and call that compiled
    kernel's launcher on the current stream. Memory-bound kernels take a few microseconds on
    the GPU, so the host must not take longer.
    """

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
        self.compiled: dict[tuple, tuple] = {}

    def __call__(self, *values) -> None:
        args = self.template.copy()
        for i, v in zip(self.index, values, strict=True):
            args[i] = v
        if INTERPRETED:
            self.fn[self.grid](*args, **self.options)
            return
        # A compiled module is loaded on the device current when it was first launched.
        device = driver.active.get_current_device()
        key = (device, _signature(values))
        compiled = self.compiled.get(key)
        if compiled is None:
            kernel = self.fn[self.grid](*args, **self.options)
            # kernel.run loads the module on first access, which sets kernel.function.
            self.compiled[key] = (kernel, kernel.run, kernel.function, kernel.packed_metadata)
            return
        kernel, launcher, function, metadata = compiled
        # What CompiledKernel.__getitem__'s runner does, without a closure and launch metadata
        # per call; a profiling hook (e.g. proton) still gets Triton's full path.
        if _launch_hooks_installed():
            kernel[self.grid](*args)
            return
        stream = driver.active.get_current_stream(device)
        gx, gy, gz = self.grid
        launcher(gx, gy, gz, stream, function, metadata, None, None, None, *args)


class KernelLaunch(SlotLaunch):
    """A SlotLaunch whose changing arguments are given by name: the names of the first call's
    keyword arguments become the slots, and every later call must name the same ones."""

    def __init__(self, fn, grid: tuple[int, ...], options: dict, **args):
        self._setup = (fn, grid, options, args)
        self.slots: tuple[str, ...] | None = None

    def __call__(self, **changes) -> None:
        if self.slots is None:
            fn, grid, options, args = self._setup
            self.slots = tuple(changes)
            fixed = {k: v for k, v in args.items() if k not in changes}
            super().__init__(fn, grid, options, self.slots, **fixed)
        super().__call__(*[changes[name] for name in self.slots])


@dataclass(frozen=True)
class Operand:
    """How a GEMM operand is addressed: setup and load functions and their geometry tuple."""

    setup: object
    load: object
    geo: tuple


@dataclass(frozen=True)
class Output:
    addr: object
    geo: tuple


class BrgemmLaunch:
    """C[b] = act(alpha * sum_t A[b, t] @ B[b, t] + bias + beta * C[b]) for b < batches.

    Sizes, addressing and tiles are fixed at construction; call with the tensors. With
    splits > 1 the workspace must hold `partial_bytes` bytes of float32 partial sums.
    """

    def __init__(
        self,
        a: Operand,
        b: Operand,
        c: Output,
        *,
        m: int,
        n: int,
        steps: int,
        batches: int,
        tiles: TileConfig,
        precision: str = "ieee",
        activation=identity,
        splits: int = 1,
    ):
        # steps == 0 is valid: C = beta * C + bias (e.g. pixels no filter tap reaches).
        splits = max(1, min(splits, steps))
        self.steps_per_split = triton.cdiv(steps, splits)
        self.splits = triton.cdiv(steps, self.steps_per_split) if steps else 1
        self.partial_bytes = batches * self.splits * m * n * 4 if self.splits > 1 else 0
        self.config = dict(
            a=a, b=b, c=c, m=m, n=n, steps=steps, batches=batches, tiles=tiles,
            precision=precision, activation=activation,
        )  # fmt: skip
        self._variants: dict[tuple[bool, bool], tuple[KernelLaunch, KernelLaunch | None]] = {}

    def _variant(self, has_bias: bool, beta_nonzero: bool):
        cfg = self.config
        a, b, c, t = cfg["a"], cfg["b"], cfg["c"], cfg["tiles"]
        m, n = cfg["m"], cfg["n"]
        flags = dict(
            ACTIVATION=cfg["activation"], HAS_BIAS=has_bias, BETA_NONZERO=beta_nonzero,
            SPLITS=self.splits,
        )  # fmt: skip
        # Each distinct geometry is passed once; the operands pick theirs by index.
        geos: list[tuple] = []
        for g in (a.geo, b.geo, c.geo):
            if g not in geos:
                geos.append(g)
        main = KernelLaunch(
            brgemm_kernel,
            (triton.cdiv(m, t.block_m) * triton.cdiv(n, t.block_n), cfg["batches"] * self.splits),
            dict(num_warps=t.num_warps, num_stages=t.num_stages),
            geos=tuple(geos), A_GEO=geos.index(a.geo), B_GEO=geos.index(b.geo),
            C_GEO=geos.index(c.geo), M=m, N=n, STEPS=cfg["steps"],
            steps_per_split=self.steps_per_split,
            A_SETUP=a.setup, A_LOAD=a.load, B_SETUP=b.setup, B_LOAD=b.load, C_ADDR=c.addr,
            PRECISION=cfg["precision"], BLOCK_M=t.block_m, BLOCK_N=t.block_n,
            BLOCK_K=t.block_k, GROUP_M=t.group_m, **flags,
        )  # fmt: skip
        reduce = None
        if self.splits > 1:
            block = 64
            reduce = KernelLaunch(
                brgemm_reduce_kernel,
                (triton.cdiv(m, block), triton.cdiv(n, block), cfg["batches"]),
                dict(num_warps=4),
                c_geo=c.geo, M=m, N=n, C_ADDR=c.addr, BLOCK_M=block, BLOCK_N=block, **flags,
            )  # fmt: skip
        return main, reduce

    def __call__(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        c: torch.Tensor,
        *,
        alpha: float = 1.0,
        beta: float = 0.0,
        bias: torch.Tensor | None = None,
        workspace: torch.Tensor | None = None,
    ) -> None:
        key = (bias is not None, beta != 0)
        if key not in self._variants:
            self._variants[key] = self._variant(*key)
        main, reduce = self._variants[key]
        ws = c
        if reduce is not None:
            ws = workspace.view(torch.float32)
        bias_arg = bias if bias is not None else c
        alpha, beta = float(alpha), float(beta)
        main(A=a, B=b, C=c, BIAS=bias_arg, WS=ws, alpha=alpha, beta=beta)
        if reduce is not None:
            reduce(C=c, BIAS=bias_arg, WS=ws, alpha=alpha, beta=beta)
