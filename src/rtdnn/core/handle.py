"""Where kernels run: compiled on a CUDA device, or in Triton's interpreter on the CPU."""

from __future__ import annotations

import os

import torch

from .errors import AllocFailedError, NotSupportedError

#: Triton decides at import time whether @triton.jit kernels are compiled or interpreted.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def check_runnable(device: torch.device) -> None:
    """CPU tensors need the interpreter; raise before any kernel is launched otherwise."""
    if device.type == "cpu" and not INTERPRETED:
        raise NotSupportedError(
            "device=cpu is not supported when kernels are compiled: set TRITON_INTERPRET=1 "
            "before importing rtdnn to run them in Triton's interpreter, or use CUDA tensors"
        )


def allocate_workspace(nbytes: int, device: torch.device) -> torch.Tensor | None:
    """A scratch buffer of `nbytes` (None for zero), or AllocFailedError."""
    if nbytes == 0:
        return None
    try:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    except torch.OutOfMemoryError as e:
        raise AllocFailedError(f"workspace of {nbytes} bytes could not be allocated: {e}") from e
