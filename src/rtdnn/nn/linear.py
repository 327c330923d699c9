"""Linear layers and the classification loss: drop-ins for torch.nn.Linear and
torch.nn.CrossEntropyLoss, computed by rtdnn. Like torch's, Linear takes (*, in_features)
including a 1-D (in_features,) and no rows at all, and CrossEntropyLoss takes unbatched (C,)
logits with a 0-d target."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import autograd
from ..core import bad_param
from ._inputs import check_dtype, unbatch
from .conv import autocast_inputs


class Linear(torch.nn.Linear):
    """torch.nn.Linear computed by rtdnn (same arguments, parameters and state_dict keys)."""

    def forward(self, input: Tensor) -> Tensor:
        check_dtype(self, input)
        if input.dim() == 0 or input.shape[-1] != self.in_features:
            raise bad_param(
                "input.shape", tuple(input.shape),
                f"(*, {self.in_features}): in_features of Linear is {self.in_features}",
            )  # fmt: skip
        added = input.dim() == 1
        input, weight, bias = autocast_inputs(
            input.unsqueeze(0) if added else input, self.weight, self.bias
        )
        return unbatch(autograd.linear(input, weight, bias, None), added)


class CrossEntropyLoss(torch.nn.CrossEntropyLoss):
    """torch.nn.CrossEntropyLoss for class-index targets, log-softmax fused in."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        if target.is_floating_point():
            raise NotImplementedError(
                "target of class probabilities is not supported: pass class indices (int64)"
            )
        check_dtype(self, input)
        # Unbatched (C,) logits with a 0-d target are taken by the op itself.
        loss, _, _ = autograd.cross_entropy(
            input, target, self.weight, self.ignore_index, self.label_smoothing, self.reduction
        )
        return loss
