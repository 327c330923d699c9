"""The CTC loss: a drop-in for torch.nn.CTCLoss, computed by rtdnn."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import autograd


class CTCLoss(torch.nn.CTCLoss):
    """torch.nn.CTCLoss computed by rtdnn (same arguments: blank, reduction, zero_infinity)."""

    def forward(self, log_probs: Tensor, targets: Tensor, input_lengths, target_lengths) -> Tensor:
        return autograd.ctc_loss(
            log_probs, targets, input_lengths, target_lengths, self.blank, self.reduction,
            self.zero_infinity,
        )  # fmt: skip
