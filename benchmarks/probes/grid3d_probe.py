"""Which gradient of the trilinear spatial transformer strays at 8 x 32 x 64^3 (the bench's
3-D case): the output, d input, d grid and d theta of rtdnn and of torch's float32, each against
torch in float64 on the same data and the same float32 grid.
    PYTHONPATH=src python benchmarks/probes/grid3d_probe.py [bench]
("bench": theta as the bench draws it for this case)
"""

import sys

import torch
import torch.nn.functional as F

import rtdnn
from rtdnn.bench.grid_sample import case_theta, cases, make_theta
from rtdnn.ops import spatial_transformer as st


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


torch.manual_seed(0)
shape = (8, 32, 64, 64, 64)
kw = dict(mode="bilinear", padding_mode="zeros", align_corners=False)
x = torch.randn(shape, device="cuda")
dy = torch.randn(shape, device="cuda")
if sys.argv[1:] == ["bench"]:  # the bench's theta for its trilinear case
    theta = case_theta(len(cases()) - 1).cuda()
else:
    theta = make_theta(8, 3, torch.Generator().manual_seed(0)).cuda()
grid = F.affine_grid(theta, list(shape), align_corners=False)  # one float32 grid for all
x64, g64 = x.double().requires_grad_(), grid.double().requires_grad_()
y64 = F.grid_sample(x64, g64, **kw)
y64.backward(dy.double())
x32, g32 = x.clone().requires_grad_(), grid.clone().requires_grad_()
F.grid_sample(x32, g32, **kw).backward(dy)
y = rtdnn.grid_sample(x, grid, **kw)
for det in (False, True):
    dx, dgrid = st.grid_sample_backward(dy, x, grid, "bilinear", "zeros", False, deterministic=det)
    print(
        f"deterministic={det}: dx rtdnn {rel(dx, x64.grad):.1e} torch {rel(x32.grad, x64.grad):.1e}"
        f"; dgrid rtdnn {rel(dgrid, g64.grad):.1e} torch {rel(g32.grad, g64.grad):.1e}"
    )
print(f"y rtdnn {rel(y, y64):.1e}")
got = st.affine_grid_backward(g64.grad.float(), list(shape), False)
t64 = theta.double().requires_grad_()
F.affine_grid(t64, list(shape), align_corners=False).backward(g64.grad)
print(f"dtheta from the exact dgrid (rounded to float32): rtdnn {rel(got, t64.grad):.1e}")

# The bench's path: theta -> affine_grid -> grid_sample through autograd, each op from rtdnn or
# torch, against the float64 chain.
t64 = theta.double().requires_grad_()
x64 = x.double().requires_grad_()
F.grid_sample(x64, F.affine_grid(t64, list(shape), align_corners=False), **kw).backward(dy.double())
for grid_op in ("rtdnn", "torch"):
    for sample_op in ("rtdnn", "torch"):
        t = theta.clone().requires_grad_()
        xs = x.clone().requires_grad_()
        make = rtdnn.affine_grid if grid_op == "rtdnn" else F.affine_grid
        sample = rtdnn.grid_sample if sample_op == "rtdnn" else F.grid_sample
        sample(xs, make(t, list(shape), align_corners=False), **kw).backward(dy)
        print(
            f"affine_grid {grid_op}, grid_sample {sample_op}: dx {rel(xs.grad, x64.grad):.1e}, "
            f"dtheta {rel(t.grad, t64.grad):.1e}"
        )
