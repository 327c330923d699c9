"""torch.nn.LocalResponseNorm computed by rtdnn, with the same constructor arguments."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .. import autograd
from ..core import bad_param
from ._inputs import check_dtype


class LocalResponseNorm(torch.nn.LocalResponseNorm):
    """torch.nn.LocalResponseNorm(size, alpha, beta, k) computed by rtdnn."""

    def forward(self, input: Tensor) -> Tensor:
        check_dtype(self, input)
        if input.dim() < 3:  # torch's rule: (N, C, *S) with at least one spatial dim
            raise bad_param("input.dim()", input.dim(), "3 or more, (N, C, *S)")
        shape = input.shape
        if input.dim() > 5:  # the normalization is across channels: merge the spatial dims
            # (their product, not -1: -1 is ambiguous for a batch of 0, which torch accepts)
            input = input.reshape(shape[0], shape[1], math.prod(shape[2:]))
        y = autograd.lrn_forward(
            input, int(self.size), float(self.alpha), float(self.beta), float(self.k)
        )
        return y.reshape(shape)
