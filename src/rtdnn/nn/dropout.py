"""torch.nn.Dropout computed by rtdnn, with the same constructor arguments.

Each training-mode call draws a seed from torch's default CPU generator (so torch.manual_seed
makes runs repeatable); the mask is a function of that seed and the element's index, and the
backward recomputes it instead of storing it. `inplace=True` is accepted but ignored.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import autograd
from ._inputs import check_dtype


class Dropout(torch.nn.Dropout):
    """torch.nn.Dropout computed by rtdnn (counter-based Philox mask)."""

    def forward(self, input: Tensor) -> Tensor:
        check_dtype(self, input)
        if not self.training or self.p == 0.0:
            return input
        seed = torch.randint(0, 2**31 - 1, (), dtype=torch.int64)
        return autograd.dropout_forward(input, float(self.p), seed)
