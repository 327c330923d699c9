"""torch.nn.LocalResponseNorm computed by rtdnn, with the same constructor arguments."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import autograd


class LocalResponseNorm(torch.nn.LocalResponseNorm):
    """torch.nn.LocalResponseNorm(size, alpha, beta, k) computed by rtdnn."""

    def forward(self, input: Tensor) -> Tensor:
        return autograd.lrn_forward(
            input, int(self.size), float(self.alpha), float(self.beta), float(self.k)
        )
