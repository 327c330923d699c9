"""Convolution modules: drop-ins for torch.nn.Conv1d/2d/3d with the same constructor,
parameters and state_dict keys; the arithmetic runs in rtdnn."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import autograd


def autocast_inputs(*tensors: Tensor | None) -> tuple[Tensor | None, ...]:
    """Under torch.autocast, cast floating inputs to the autocast dtype, as torch does for its
    own convolutions and matmuls (the custom ops themselves take one dtype)."""
    first = next(t for t in tensors if t is not None)
    kind = first.device.type
    if not torch.is_autocast_enabled(kind):
        return tensors
    dtype = torch.get_autocast_dtype(kind)
    # A tensor already in the autocast dtype (the activations, after the first layer) is
    # passed as it is: .to() would return it too, but through the dispatcher.
    return tuple(t if t is None or t.dtype == dtype else t.to(dtype) for t in tensors)


class _RtdnnConv:
    """Replaces torch's _conv_forward; everything else is inherited from torch.nn.ConvNd."""

    def _conv_forward(self, input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        input, weight, bias = autocast_inputs(input, weight, bias)
        padding = self.padding
        if self.padding_mode != "zeros":
            input = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            padding = (0,) * len(self.kernel_size)
        elif padding == "valid":
            padding = (0,) * len(self.kernel_size)
        elif padding == "same":
            # Total padding d*(k-1) per dim; an odd total puts the extra pixel on the right.
            totals = [d * (k - 1) for d, k in zip(self.dilation, self.kernel_size, strict=True)]
            padding = tuple(t // 2 for t in totals)
            if any(t % 2 for t in totals):
                extra = []
                for t in reversed(totals):
                    extra += [0, t % 2]
                input = F.pad(input, extra)
        return autograd.conv_forward(
            input, weight, bias, list(self.stride), list(padding), list(self.dilation),
            self.groups, "cross_correlation",
        )  # fmt: skip


class Conv1d(_RtdnnConv, torch.nn.Conv1d):
    """torch.nn.Conv1d computed by rtdnn."""


class Conv2d(_RtdnnConv, torch.nn.Conv2d):
    """torch.nn.Conv2d computed by rtdnn."""


class Conv3d(_RtdnnConv, torch.nn.Conv3d):
    """torch.nn.Conv3d computed by rtdnn."""
