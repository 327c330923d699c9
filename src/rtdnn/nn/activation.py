"""Activation and softmax modules: drop-ins for torch.nn.ReLU, Sigmoid, Tanh, ELU, LeakyReLU,
SiLU, GELU, Hardtanh, Softmax and LogSoftmax with the same constructor arguments.

`inplace=True` is accepted for signature compatibility, but the result is always a new tensor
(autograd needs the input or output that an in-place op would overwrite).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .. import autograd
from ._inputs import check_dtype


class ReLU(torch.nn.ReLU):
    """torch.nn.ReLU computed by rtdnn."""

    def forward(self, input: Tensor) -> Tensor:
        check_dtype(self, input)
        return autograd.activation_forward(input, "relu", [])


class Sigmoid(torch.nn.Sigmoid):
    """torch.nn.Sigmoid computed by rtdnn."""

    def forward(self, input: Tensor) -> Tensor:
        check_dtype(self, input)
        return autograd.activation_forward(input, "sigmoid", [])


class Tanh(torch.nn.Tanh):
    """torch.nn.Tanh computed by rtdnn."""

    def forward(self, input: Tensor) -> Tensor:
        check_dtype(self, input)
        return autograd.activation_forward(input, "tanh", [])


class ELU(torch.nn.ELU):
    """torch.nn.ELU computed by rtdnn."""

    def forward(self, input: Tensor) -> Tensor:
        check_dtype(self, input)
        return autograd.activation_forward(input, "elu", [float(self.alpha)])


class LeakyReLU(torch.nn.LeakyReLU):
    """torch.nn.LeakyReLU computed by rtdnn."""

    def forward(self, input: Tensor) -> Tensor:
        check_dtype(self, input)
        return autograd.activation_forward(input, "leaky_relu", [float(self.negative_slope)])


class SiLU(torch.nn.SiLU):
    """torch.nn.SiLU computed by rtdnn (cuDNN's swish with beta = 1)."""

    def forward(self, input: Tensor) -> Tensor:
        check_dtype(self, input)
        return autograd.activation_forward(input, "swish", [1.0])


class GELU(torch.nn.GELU):
    """torch.nn.GELU computed by rtdnn: approximate="none" (erf) or "tanh"."""

    def forward(self, input: Tensor) -> Tensor:
        check_dtype(self, input)
        mode = "gelu_tanh" if self.approximate == "tanh" else "gelu"
        return autograd.activation_forward(input, mode, [])


class Hardtanh(torch.nn.Hardtanh):
    """torch.nn.Hardtanh computed by rtdnn (cuDNN's clipped ReLU when min_val is 0)."""

    def forward(self, input: Tensor) -> Tensor:
        check_dtype(self, input)
        lo, hi = float(self.min_val), float(self.max_val)
        if lo == 0.0:
            return autograd.activation_forward(input, "clipped_relu", [hi])
        return autograd.activation_forward(input, "hardtanh", [lo, hi])


def _softmax_dim(ndim: int, dim: int | None) -> int:
    if dim is None:  # torch's legacy rule for an unspecified dim
        dim = 0 if ndim in (0, 1, 3) else 1
    return dim % max(ndim, 1)


def _softmax(input: Tensor, dim: int | None, algo: str) -> Tensor:
    """rtdnn's channel-mode softmax runs over dim 1: move `dim` there as a view."""
    if input.dim() <= 1:  # the op takes a 1-D x as one row
        return autograd.softmax_forward(input.reshape(-1), algo, "channel").reshape(input.shape)
    d = _softmax_dim(input.dim(), dim)
    moved = input.movedim(d, 1)
    shape = moved.shape
    if moved.dim() > 5:  # more positions than the kernels address: merge the trailing ones
        moved = moved.reshape(shape[0], shape[1], math.prod(shape[2:]))
    y = autograd.softmax_forward(moved, algo, "channel")
    return y.reshape(shape).movedim(1, d)


class Softmax(torch.nn.Softmax):
    """torch.nn.Softmax computed by rtdnn."""

    def forward(self, input: Tensor) -> Tensor:
        check_dtype(self, input)
        return _softmax(input, self.dim, "accurate")


class LogSoftmax(torch.nn.LogSoftmax):
    """torch.nn.LogSoftmax computed by rtdnn."""

    def forward(self, input: Tensor) -> Tensor:
        check_dtype(self, input)
        return _softmax(input, self.dim, "log")
