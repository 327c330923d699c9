"""Why the bench's trilinear row (8 x 32 x 64^3) is 1.4e-2 off float64 in dtheta: which points'
source coordinates fall in another cell with a float32 grid than with the float64 one. Runs on
the CPU (rtdnn's grid through the interpreter: TRITON_INTERPRET=1, about a minute or two).
    TRITON_INTERPRET=1 PYTHONPATH=src python benchmarks/probes/grid3d_flips.py
"""

import torch.nn.functional as F

import rtdnn
from rtdnn.bench.grid_sample import case_theta, cases

theta = case_theta(len(cases()) - 1)  # the bench's trilinear case
size = [8, 32, 64, 64, 64]
exact = F.affine_grid(theta.double(), size, align_corners=False)
exact_src = ((exact + 1) * 64 - 1) / 2
for name, grid in (
    ("rtdnn", rtdnn.affine_grid(theta, size, align_corners=False)),
    ("torch float32", F.affine_grid(theta, size, align_corners=False)),
):
    src = ((grid + 1) * 64 - 1) / 2  # in float32, as both samplers unnormalize
    flips = src.floor().double() != exact_src.floor()
    print(
        f"{name}: mean |grid - exact| {(grid.double() - exact).abs().mean():.2e}, "
        f"points in another cell per axis (x, y, z) {flips.sum(dim=(0, 1, 2, 3)).tolist()}"
    )
    if flips.any():
        at = exact_src[flips]
        print(
            f"  their exact source coordinates: {at.unique().tolist()[:4]} "
            f"(within {(at - at.round()).abs().max():.1e} of a cell boundary)"
        )
