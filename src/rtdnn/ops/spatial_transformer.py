"""Spatial transformer: the affine grid generator and the grid sampler (cudnnSpatialTf*).

Semantics are torch.nn.functional.affine_grid's and grid_sample's:
  affine_grid(theta (N, 2, 3), size (N, C, H, W)) -> grid (N, H, W, 2);
  affine_grid(theta (N, 3, 4), size (N, C, D, H, W)) -> grid (N, D, H, W, 3);
  grid_sample(x (N, C, H, W), grid (N, OH, OW, 2)) -> (N, C, OH, OW), and the 5-D (trilinear)
  form, with grid values in [-1, 1] spanning the input (the corner pixels' centers with
  align_corners=True, their outer edges otherwise), mode "bilinear" or "nearest", padding_mode
  "zeros", "border" or "reflection". Any strides; float32, float16 or bfloat16, math in float32.

The input gradient of grid_sample is a scatter: by default float32 atomic adds, whose order
varies, so its last bits may differ from run to run; deterministic=True (or
torch.use_deterministic_algorithms(True)) takes a serial scatter that repeats bit for bit. The
grid gradient, affine_grid and its backward are always deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton

from ..core import bad_param, cdiv, check_runnable, check_tensor, empty_like_layout, not_supported
from ..core.tensor import resolve_deterministic
from ..kernels import spatial_transformer as k
from ._common import check_span

MODES = {"nearest": k.NEAREST, "bilinear": k.BILINEAR}
PADDINGS = {"zeros": k.ZEROS, "border": k.BORDER, "reflection": k.REFLECTION}
_BLOCK = 128


def _check_size(size: object, theta: torch.Tensor) -> tuple[int, ...]:
    if not isinstance(size, Sequence) or len(size) not in (4, 5):
        raise bad_param("size", size, "(N, C, H, W) or (N, C, D, H, W)")
    if not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in size):
        raise bad_param("size", size, "positive integers")
    dims = len(size) - 2
    if tuple(theta.shape) != (size[0], dims, dims + 1):
        raise bad_param(
            "theta.shape", tuple(theta.shape), f"({size[0]}, {dims}, {dims + 1}) for size={size}"
        )
    return tuple(size)


def _spatial(size: Sequence[int]) -> tuple[int, int, int]:
    return (1, *size) if len(size) == 2 else tuple(size)


def affine_grid(theta: torch.Tensor, size: Sequence[int], align_corners: bool = False):
    """The sampling grid of the affine maps `theta`: (N, 2, 3) for size (N, C, H, W), giving
    (N, H, W, 2); (N, 3, 4) for size (N, C, D, H, W), giving (N, D, H, W, 3). grid[n, ...] is
    theta[n] @ (x, y[, z], 1) over the normalized output coordinates, in theta's dtype."""
    theta = check_tensor("theta", theta, ndim=3)
    size = _check_size(size, theta)
    align = _check_bool("align_corners", align_corners)
    D, H, W = _spatial(size[2:])
    three_d = len(size) == 5
    grid = torch.empty(
        (size[0], *size[2:], 3 if three_d else 2), dtype=theta.dtype, device=theta.device
    )
    check_runnable(theta.device)
    P = D * H * W
    k.affine_grid_kernel[(size[0], cdiv(P, _BLOCK))](
        theta.contiguous(), grid, P, D, H, W, THREE_D=three_d, ALIGN=align, BLOCK=_BLOCK
    )
    return grid


def affine_grid_backward(
    dgrid: torch.Tensor, size: Sequence[int], align_corners: bool = False
) -> torch.Tensor:
    """d loss / d theta from d loss / d grid (the grid's shape), in dgrid's dtype."""
    dgrid = check_tensor("dgrid", dgrid, ndim=(4, 5))
    dims = len(size) - 2
    theta_shape = (size[0], dims, dims + 1)
    if tuple(dgrid.shape) != (size[0], *size[2:], dims):
        raise bad_param("dgrid.shape", tuple(dgrid.shape), f"{(size[0], *size[2:], dims)}")
    align = _check_bool("align_corners", align_corners)
    D, H, W = _spatial(size[2:])
    dtheta = torch.empty(theta_shape, dtype=dgrid.dtype, device=dgrid.device)
    check_runnable(dgrid.device)
    k.affine_grid_backward_kernel[(size[0], dims)](
        dgrid.contiguous(), dtheta, D * H * W, D, H, W,
        THREE_D=dims == 3, ALIGN=align, BLOCK=_BLOCK,
    )  # fmt: skip
    return dtheta


def _check_bool(name: str, v: object) -> bool:
    if not isinstance(v, bool):
        raise bad_param(name, v, "True or False")
    return v


def _check_sample(x, grid, mode, padding_mode, align_corners):
    x = check_tensor("input", x, ndim=(4, 5))
    grid = check_tensor("grid", grid, ndim=x.dim(), dtype=x.dtype, device=x.device)
    dims = x.dim() - 2
    if grid.shape[-1] != dims:
        raise bad_param(
            "grid.shape", tuple(grid.shape), f"a last size of {dims} for {x.dim()}-D input"
        )
    if grid.shape[0] != x.shape[0]:
        raise bad_param("grid.shape", tuple(grid.shape), f"batch size {x.shape[0]} (input's)")
    if mode == "bicubic":
        raise not_supported("mode", mode, "only 'bilinear' and 'nearest' are implemented")
    if mode not in MODES:
        raise bad_param("mode", mode, "'bilinear' or 'nearest'")
    if padding_mode not in PADDINGS:
        raise bad_param("padding_mode", padding_mode, "'zeros', 'border' or 'reflection'")
    align = _check_bool("align_corners", align_corners)
    check_span("input", x)
    check_span("grid", grid)
    return x, grid, align


def _strides5(t: torch.Tensor) -> tuple[int, ...]:
    """Strides of an (N, C, [D,] H, W) tensor as 5 numbers (a missing D gets stride 0)."""
    s = t.stride()
    return s if t.dim() == 5 else (s[0], s[1], 0, s[2], s[3])


def _grid_strides(g: torch.Tensor) -> tuple[int, ...]:
    s = g.stride()
    return s if g.dim() == 5 else (s[0], 0, s[1], s[2], s[3])


def grid_sample(
    input: torch.Tensor,
    grid: torch.Tensor,
    mode: str = "bilinear",
    padding_mode: str = "zeros",
    align_corners: bool = False,
) -> torch.Tensor:
    """Sample `input` (N, C, H, W) at `grid` (N, OH, OW, 2) -> (N, C, OH, OW) (or the 5-D
    forms, trilinear), in input's memory format and dtype."""
    x, grid, align = _check_sample(input, grid, mode, padding_mode, align_corners)
    N, C = x.shape[:2]
    out_sp = tuple(grid.shape[1:-1])
    y = empty_like_layout((N, C, *out_sp), x)
    check_runnable(x.device)
    ID, IH, IW = _spatial(x.shape[2:])
    _, OH, OW = _spatial(out_sp)
    P = _numel(out_sp)
    if y.numel() == 0:
        return y
    block, block_c = _sample_tile(x, mode)
    k.grid_sample_kernel[(N, cdiv(P, block))](
        x, grid, y, C, P, OH, OW, ID, IH, IW,
        *_strides5(x), *_grid_strides(grid), *_strides5(y),
        MODE=MODES[mode], PADDING=PADDINGS[padding_mode], ALIGN=align,
        THREE_D=x.dim() == 5, BLOCK=block, BLOCK_C=block_c,
    )  # fmt: skip
    return y


def _sample_tile(x: torch.Tensor, mode: str) -> tuple[int, int]:
    """The forward's (points, channels) per program step. Measured on an H100
    (benchmarks/probes/grid_sample_sweep.py, 64x64x128x128 float32, rotated grids): where a
    point's channels are contiguous (channels-last) a wide block of them makes each corner's
    gather one vector load (bilinear 5.4 -> 0.22 ms, 83% of copy bandwidth); channels-first,
    one channel a step is fastest for (tri)linear, two for nearest (0.26 -> 0.24 ms)."""
    channels = x.shape[1]
    if x.stride(1) == 1 and channels > 1:
        block_c = min(64, triton.next_power_of_2(channels))
        return max(16, 1024 // block_c), block_c
    return _BLOCK, 2 if mode == "nearest" and channels > 1 else 1


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def grid_sample_backward(
    dy: torch.Tensor,
    input: torch.Tensor,
    grid: torch.Tensor,
    mode: str = "bilinear",
    padding_mode: str = "zeros",
    align_corners: bool = False,
    *,
    input_grad: bool = True,
    deterministic: bool | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(d input, d grid) of grid_sample from dy (the output's shape). d input is None when
    input_grad=False; deterministic: see the module docstring."""
    x, grid, align = _check_sample(input, grid, mode, padding_mode, align_corners)
    N, C = x.shape[:2]
    out_sp = tuple(grid.shape[1:-1])
    dy = check_tensor("dy", dy, ndim=x.dim(), dtype=x.dtype, device=x.device)
    if tuple(dy.shape) != (N, C, *out_sp):
        raise bad_param("dy.shape", tuple(dy.shape), f"{(N, C, *out_sp)}")
    serial = resolve_deterministic(deterministic)
    check_span("dy", dy)
    check_runnable(x.device)
    ID, IH, IW = _spatial(x.shape[2:])
    _, OH, OW = _spatial(out_sp)
    P = _numel(out_sp)
    dgrid = torch.empty(grid.shape, dtype=grid.dtype, device=grid.device)
    dx = empty_like_layout(x.shape, x) if input_grad else None
    # The input gradient's sums run in a zeroed float32 (N, C, volume) buffer: dx itself when
    # it is one. Without an input gradient the kernel never touches it (dgrid stands in).
    direct = dx is not None and dx.dtype == torch.float32 and dx.is_contiguous()
    if dx is None:
        acc = dgrid
    elif direct:
        acc = dx.zero_()
    else:
        acc = torch.zeros((N, C, ID * IH * IW), dtype=torch.float32, device=x.device)
    common = dict(
        MODE=MODES[mode], PADDING=PADDINGS[padding_mode], ALIGN=align, THREE_D=x.dim() == 5
    )
    k.grid_sample_backward_kernel[(N, cdiv(P, _BLOCK))](
        dy, x, grid, acc, dgrid, C, P, OH, OW, ID, IH, IW,
        *_strides5(dy), *_strides5(x), *_grid_strides(grid),
        INPUT_GRAD=input_grad and not serial, BLOCK=_BLOCK, **common,
    )  # fmt: skip
    if not input_grad:
        return None, dgrid
    if serial:
        block_c = min(64, triton.next_power_of_2(C))
        k.grid_sample_input_grad_serial_kernel[(N, cdiv(C, block_c))](
            dy, grid, acc, C, P, OH, OW, ID, IH, IW,
            *_strides5(dy), *_grid_strides(grid), BLOCK_C=block_c, **common,
        )  # fmt: skip
    if not direct:
        dx.copy_(acc.view(x.shape))
    return dx, dgrid
