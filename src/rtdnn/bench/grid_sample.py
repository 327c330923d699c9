"""The spatial transformer beside PyTorch: rtdnn.affine_grid + rtdnn.grid_sample against
torch's, forward and forward + backward (input and theta gradients), in one process on one GPU
(`rtdnn bench --op grid_sample`).

Cases: a 64 x 64 x 128 x 128 float32 input sampled at the same size through a mild affine map
(rotation, 0.9 to 1.1 zoom, shift: a share of the points falls outside, so padding matters),
bilinear and nearest, zeros, border and reflection padding, align_corners both ways; one 3-D
trilinear case of the same size (8 x 32 x 64^3). torch runs cuDNN's sampler only for 2-D
bilinear, zeros padding and align_corners=True (its grid_sampler's rule), its own CUDA kernel
otherwise; the row names which.

The sampler is memory-bound: GB/s counts the minimal bytes (input, grid and output once each,
the grid written by affine_grid and read by the sampler; the backward adds dy, the input again,
the grid, dx and the grid gradient written and read), reported beside the device's copy
bandwidth. Both sides are timed as plain calls.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..core.timing import copy_bandwidth, device_time_ms
from .output import write_results

DEVICE = "cuda"  # the tests run the harness on the CPU (interpreter) with tiny cases
# Both sides are measured against torch in float64 on the same data. A row is ok when rtdnn's
# error is within AGREEMENT or within twice torch's own float32 error: theta's gradient sums
# the grid gradient over every point, with cancellation, and float32 implementations differ
# there by 1e-3 and more. Nearest jumps to the neighbouring pixel wherever a point lies within
# an ulp of a boundary (2e-3). A wrong padding mode is off by about 0.3, a wrong index by more
# than 1.
AGREEMENT = {"bilinear": 1e-4, "nearest": 2e-2}


@dataclass(frozen=True)
class GridCase:
    """One sampling: input shape (N, C, H, W) or (N, C, D, H, W), sampled at the same size."""

    shape: tuple[int, ...]
    mode: str  # "bilinear" (trilinear in 3-D) or "nearest"
    padding_mode: str  # "zeros", "border" or "reflection"
    align_corners: bool

    @property
    def name(self) -> str:
        mode = "trilinear" if len(self.shape) == 5 and self.mode == "bilinear" else self.mode
        dims = "x".join(map(str, self.shape))
        return f"{dims} {mode} {self.padding_mode} align={int(self.align_corners)}"

    def torch_backend(self, device: str) -> str:
        """Which kernel torch's grid_sample runs (its rule for cuDNN's sampler)."""
        cudnn = (
            device == "cuda" and torch.backends.cudnn.is_available()
            and torch.backends.cudnn.enabled and len(self.shape) == 4 and self.shape[1] <= 1024
            and self.mode == "bilinear" and self.padding_mode == "zeros" and self.align_corners
        )  # fmt: skip
        return "cudnn" if cudnn else "native"

    def forward_bytes(self, itemsize: int = 4) -> float:
        """Input read, grid written and read, output written."""
        n, _, *spatial = self.shape
        points = n * math.prod(spatial)
        grid = points * len(spatial)
        return float(itemsize * (2 * math.prod(self.shape) + 2 * grid))

    def backward_bytes(self, itemsize: int = 4) -> float:
        """dy and the input read, dx written; the grid read, its gradient written and read."""
        n, _, *spatial = self.shape
        grid = n * math.prod(spatial) * len(spatial)
        return float(itemsize * (3 * math.prod(self.shape) + 3 * grid))


@dataclass
class GridRow:
    case: str
    direction: str  # "forward" or "forward+backward"
    rtdnn_ms: float
    torch_ms: float
    torch_backend: str  # "cudnn" or "native"
    ratio: float  # torch_ms / rtdnn_ms: above 1 means rtdnn is faster
    rtdnn_gbs: float
    torch_gbs: float
    rtdnn_pct: float  # of copy bandwidth
    err: float  # ||rtdnn - ref|| / ||ref|| against torch in float64 (output; with the backward,
    # the worse of dx and dtheta)
    torch_err: float  # torch's own float32 error against the same reference
    ok: bool


def cases() -> list[GridCase]:
    """The suite: every 2-D mode, padding and alignment, then one trilinear case."""
    out = []
    for mode in ("bilinear", "nearest"):
        for padding in ("zeros", "border", "reflection"):
            for align in (False, True):
                out.append(GridCase((64, 64, 128, 128), mode, padding, align))
    out.append(GridCase((8, 32, 64, 64, 64), "bilinear", "zeros", False))
    return out


def make_theta(n: int, dims: int, gen: torch.Generator | None = None) -> torch.Tensor:
    """(n, dims, dims + 1) affine maps: a rotation of up to 15 degrees in the x-y plane, a zoom
    of 0.9 to 1.1 and a shift of up to 0.05 of the extent on each axis."""
    angle = (torch.rand(n, generator=gen) - 0.5) * math.radians(30)
    zoom = 0.9 + 0.2 * torch.rand(n, generator=gen)
    cos, sin = zoom * torch.cos(angle), zoom * torch.sin(angle)
    theta = torch.zeros(n, dims, dims + 1)
    theta[:, 0, 0], theta[:, 0, 1] = cos, -sin
    theta[:, 1, 0], theta[:, 1, 1] = sin, cos
    if dims == 3:
        theta[:, 2, 2] = zoom
    theta[:, :, dims] = (torch.rand(n, dims, generator=gen) - 0.5) * 0.2
    return theta


THETA_SEED = 0


def case_theta(index: int) -> torch.Tensor:
    """theta as run_grid_sample draws it for cases()[index] (one generator, seeded THETA_SEED,
    drawn from case by case), for probes that look at one case alone."""
    gen = torch.Generator().manual_seed(THETA_SEED)
    for case in cases()[: index + 1]:
        theta = make_theta(case.shape[0], len(case.shape) - 2, gen)
    return theta


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def run_case(case: GridCase, copy_gbs: float, gen: torch.Generator | None = None) -> list[GridRow]:
    """Forward and forward + backward of one case, rtdnn beside torch (the input and dy drawn
    on DEVICE by its default generator, theta by `gen`)."""
    import rtdnn

    x = torch.randn(case.shape, device=DEVICE).requires_grad_()
    theta = make_theta(case.shape[0], len(case.shape) - 2, gen).to(DEVICE).requires_grad_()
    dy = torch.randn(case.shape, device=DEVICE)
    size = list(case.shape)
    kw = dict(mode=case.mode, padding_mode=case.padding_mode, align_corners=case.align_corners)

    def ours() -> torch.Tensor:
        grid = rtdnn.affine_grid(theta, size, align_corners=case.align_corners)
        return rtdnn.grid_sample(x, grid, **kw)

    def theirs() -> torch.Tensor:
        grid = F.affine_grid(theta, size, align_corners=case.align_corners)
        return F.grid_sample(x, grid, **kw)

    def exact() -> torch.Tensor:  # the reference: torch's sampler in float64
        grid = F.affine_grid(theta64, size, align_corners=case.align_corners)
        return F.grid_sample(x64, grid, **kw)

    x64 = x.detach().double().requires_grad_()
    theta64 = theta.detach().double().requires_grad_()

    def with_backward(fn: Callable[[], torch.Tensor], leaves=(x, theta)) -> Callable[[], tuple]:
        def step() -> tuple[torch.Tensor, torch.Tensor]:
            for t in leaves:
                t.grad = None
            fn().backward(dy.to(leaves[0].dtype))
            return tuple(t.grad for t in leaves)

        return step

    def error(mine: object, other: object) -> float:
        """Relative error of the output, or the worse of dx's and dtheta's."""
        if isinstance(mine, torch.Tensor):
            return _rel(mine.detach(), other.detach())
        return max(_rel(a, b) for a, b in zip(mine, other, strict=True))

    rows = []
    work = case.forward_bytes()
    for direction, mine, other, ref, nbytes in (
        ("forward", ours, theirs, exact, work),
        ("forward+backward", with_backward(ours), with_backward(theirs),
         with_backward(exact, (x64, theta64)), work + case.backward_bytes()),
    ):  # fmt: skip
        with torch.no_grad() if direction == "forward" else torch.enable_grad():
            want = ref()
            err, torch_err = error(mine(), want), error(other(), want)
            ms = device_time_ms(mine, graph=False)
            their_ms = device_time_ms(other, graph=False)
        gbs = nbytes / ms / 1e6
        ok = err <= max(AGREEMENT[case.mode], 2 * torch_err)
        backend = case.torch_backend(x.device.type)
        row = GridRow(case.name, direction, ms, their_ms, backend, their_ms / ms, gbs,
                      nbytes / their_ms / 1e6, 100 * gbs / copy_gbs, err, torch_err,
                      ok)  # fmt: skip
        rows.append(row)
    return rows


def markdown(rows: list[GridRow], title: str) -> str:
    lines = [
        f"### {title}",
        "",
        "| case | direction | rtdnn ms | torch ms (backend) | ratio | rtdnn GB/s | torch GB/s | "
        "rtdnn % copy | error vs float64, rtdnn / torch | ok |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.case} | {r.direction} | {r.rtdnn_ms:.3f} | {r.torch_ms:.3f} "
            f"({r.torch_backend}) | {r.ratio:.2f} | {r.rtdnn_gbs:.0f} | {r.torch_gbs:.0f} | "
            f"{r.rtdnn_pct:.0f} | {r.err:.1e} / {r.torch_err:.1e} | {'yes' if r.ok else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def run_grid_sample(out_dir: str | None = None, limit: int | None = None) -> list[GridRow]:
    """Run the suite (its first `limit` cases) on the current GPU, print a markdown table,
    and with `out_dir` write grid_sample_float32.json and .md there. Returns the rows."""
    if not torch.cuda.is_available():
        raise RuntimeError("rtdnn.bench.grid_sample needs a CUDA GPU")
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(THETA_SEED)
    copy_gbs = copy_bandwidth()
    rows: list[GridRow] = []
    for case in cases()[:limit]:
        for row in run_case(case, copy_gbs, gen):
            rows.append(row)
            print(
                f"{row.case:40s} {row.direction:16s} rtdnn {row.rtdnn_gbs:6.0f} GB/s "
                f"({row.rtdnn_pct:3.0f}% of copy), torch {row.torch_gbs:6.0f} "
                f"({row.torch_backend}), ratio {row.ratio:5.2f} {'ok' if row.ok else 'NO'}",
                flush=True,
            )
        torch.cuda.empty_cache()
    title = (
        f"Spatial transformer (affine_grid + grid_sample), float32, "
        f"{torch.cuda.get_device_name()}, copy {copy_gbs:.0f} GB/s"
    )
    md = markdown(rows, title)
    print(md)
    if out_dir:
        write_results(out_dir, "grid_sample_float32", title, rows, md, copy_gbs=copy_gbs)
    return rows
