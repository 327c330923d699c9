"""Host-side launch helpers. No policy: callers pick tiles and splits.

A convolution layer runs the same kernels with the same sizes on every step, so launches are
prepared once per problem. `KernelLaunch` fixes a kernel's grid, integer arguments and
compile-time constants; the first call goes through Triton's JIT (compiling if needed) and later
calls go straight to the compiled kernel, skipping Triton's per-call argument binding, which
costs more than the kernel itself on small layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

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


def _alignment(tensors) -> tuple:
    """Pointer alignment of the tensor arguments: part of Triton's specialization."""
    return tuple(t.data_ptr() % 16 == 0 for t in tensors if isinstance(t, torch.Tensor))


class KernelLaunch:
    """One @triton.jit kernel with a fixed grid and fixed non-tensor arguments.

    Call it with the arguments that change between calls (tensors, alpha, beta) by name.
    """

    def __init__(self, fn, grid: tuple[int, ...], options: dict, **args):
        self.fn = fn
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.options = options
        self.args = args
        self.compiled = None
        self.aligned = None

    def __call__(self, **changes) -> None:
        """Launch; `changes` must name the same arguments on every call (the tensors)."""
        args = {**self.args, **changes}
        values = [args[name] for name in self.fn.arg_names]
        aligned = _alignment(changes.values())
        if self.compiled is not None and aligned == self.aligned:
            self.compiled[self.grid](*values)
            return
        kernel = self.fn[self.grid](*values, **self.options)
        if not INTERPRETED:
            self.compiled, self.aligned = kernel, aligned


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
