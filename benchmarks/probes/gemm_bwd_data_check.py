"""GEMM backward-data on the GPU, strict fp32, undivided and on batch slices, vs float64."""

import torch

import rtdnn
from rtdnn import reference as R

torch.manual_seed(0)
x = torch.randn(8, 32, 28, 28, device="cuda")
w = torch.randn(64, 32, 3, 3, device="cuda")
dy = torch.randn(8, 64, 28, 28, device="cuda")
for algo in ["GEMM", "IMPLICIT_GEMM"]:
    for beta in [0.0, 0.5]:
        prior = torch.randn_like(x)
        got = rtdnn.conv_backward_data(
            dy,
            w,
            x.shape,
            padding=1,
            math="fp32",
            algo=algo,
            alpha=0.75,
            beta=beta,
            out=prior.clone(),
        )
        ref = R.conv_backward_data(dy, w, x.shape, padding=1, alpha=0.75, beta=beta, out=prior)
        half = prior.clone()
        rtdnn.conv_backward_data(
            dy[4:],
            w,
            (4, 32, 28, 28),
            padding=1,
            math="fp32",
            algo=algo,
            alpha=0.75,
            beta=beta,
            out=half[4:],
        )
        print(
            algo,
            beta,
            "whole",
            R.rel_error(got, ref),
            "slice",
            R.rel_error(half[4:], ref[4:]),
            flush=True,
        )
