"""Input checks every rtdnn.nn module shares: the dtypes rtdnn computes, and torch's unbatched
inputs (a layer on (N, C, *S) also takes (C, *S) and returns its result without the batch dim).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..core import SUPPORTED_DTYPES, bad_param, not_supported


def check_dtype(module: torch.nn.Module, input: Tensor, name: str = "input") -> None:
    """rtdnn computes float32, float16 and bfloat16; a float64 input is refused by name
    (rtdnn.convert leaves float64 modules in torch for this reason)."""
    if input.is_floating_point() and input.dtype not in SUPPORTED_DTYPES:
        raise not_supported(
            f"{name}.dtype",
            input.dtype,
            f"rtdnn.nn.{type(module).__name__} computes float32, float16 and bfloat16 "
            "(rtdnn.convert keeps float64 modules as torch modules)",
        )


def batched(module: torch.nn.Module, input: Tensor, spatial: int) -> tuple[Tensor, bool]:
    """(input with a batch dim, whether one was added) for a layer on (N, C, *S) with
    `spatial` dims in S, which also takes the unbatched (C, *S) as torch's layers do."""
    check_dtype(module, input)
    if input.dim() == spatial + 2:
        return input, False
    if input.dim() == spatial + 1:
        return input.unsqueeze(0), True
    raise bad_param(
        "input.dim()",
        input.dim(),
        f"{spatial + 1} (unbatched) or {spatial + 2} (batched) for "
        f"{type(module).__name__}, got input of size {list(input.shape)}",
    )


def unbatch(y: Tensor, added: bool) -> Tensor:
    """Drop the batch dim `batched` added."""
    return y.squeeze(0) if added else y
