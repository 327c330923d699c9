"""Host-side launch helpers for the batch-reduce GEMM. No policy: callers pick tiles and splits."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

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


@dataclass(frozen=True)
class Operand:
    """A GEMM operand: the tensor, its addressing functions and their geometry tuple."""

    tensor: torch.Tensor
    setup: object
    load: object
    geo: tuple


@dataclass(frozen=True)
class Output:
    tensor: torch.Tensor
    addr: object
    geo: tuple


def launch_brgemm(
    a: Operand,
    b: Operand,
    c: Output,
    *,
    m: int,
    n: int,
    steps: int,
    batches: int,
    tiles: TileConfig,
    alpha: float = 1.0,
    beta: float = 0.0,
    bias: torch.Tensor | None = None,
    activation=identity,
    precision: str = "ieee",
    splits: int = 1,
    workspace: torch.Tensor | None = None,
) -> None:
    """C[b] = act(alpha * sum_t A[b, t] @ B[b, t] + bias + beta * C[b]) for b < batches.

    With splits > 1, `workspace` must hold batches * splits * m * n float32 values.
    """
    splits = max(1, min(splits, steps))
    if splits > 1:
        assert workspace is not None and workspace.numel() * workspace.element_size() >= (
            batches * splits * m * n * 4
        )
        ws = workspace.view(torch.float32)
    else:
        ws = c.tensor
    steps_per_split = triton.cdiv(steps, splits)
    splits = triton.cdiv(steps, steps_per_split)
    grid = (triton.cdiv(m, tiles.block_m) * triton.cdiv(n, tiles.block_n), batches * splits)
    common = dict(
        ACTIVATION=activation,
        HAS_BIAS=bias is not None,
        BETA_NONZERO=beta != 0,
        SPLITS=splits,
    )
    brgemm_kernel[grid](
        a.tensor, b.tensor, c.tensor, bias if bias is not None else c.tensor, ws,
        a.geo, b.geo, c.geo,
        m, n, steps, steps_per_split, float(alpha), float(beta),
        A_SETUP=a.setup, A_LOAD=a.load, B_SETUP=b.setup, B_LOAD=b.load, C_ADDR=c.addr,
        PRECISION=precision,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        GROUP_M=tiles.group_m, num_warps=tiles.num_warps, num_stages=tiles.num_stages,
        **common,
    )  # fmt: skip
    if splits > 1:
        block = 64
        reduce_grid = (triton.cdiv(m, block), triton.cdiv(n, block), batches)
        brgemm_reduce_kernel[reduce_grid](
            c.tensor, bias if bias is not None else c.tensor, ws, c.geo, m, n,
            float(alpha), float(beta), C_ADDR=c.addr, BLOCK_M=block, BLOCK_N=block, **common,
        )  # fmt: skip
