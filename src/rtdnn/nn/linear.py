"""Linear layers and the classification loss: drop-ins for torch.nn.Linear and
torch.nn.CrossEntropyLoss, computed by rtdnn."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import autograd
from .conv import autocast_inputs


class Linear(torch.nn.Linear):
    """torch.nn.Linear computed by rtdnn (same arguments, parameters and state_dict keys)."""

    def forward(self, input: Tensor) -> Tensor:
        input, weight, bias = autocast_inputs(input, self.weight, self.bias)
        return autograd.linear(input, weight, bias, None)


class CrossEntropyLoss(torch.nn.CrossEntropyLoss):
    """torch.nn.CrossEntropyLoss for class-index targets, log-softmax fused in."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        if target.is_floating_point():
            raise NotImplementedError(
                "target of class probabilities is not supported: pass class indices (int64)"
            )
        loss, _, _ = autograd.cross_entropy(
            input, target, self.weight, self.ignore_index, self.label_smoothing, self.reduction
        )
        return loss
