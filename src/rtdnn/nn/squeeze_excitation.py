"""torchvision.ops.SqueezeExcitation (MobileNetV3's and EfficientNet's block) computed by rtdnn
as one op (rtdnn.squeeze_excitation), with the same constructor, submodules and state_dict."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .. import autograd
from ..ops.squeeze_excitation import MAX_SQUEEZE
from ._inputs import check_dtype

_ACTIVATIONS = {torch.nn.ReLU: "relu", torch.nn.SiLU: "silu"}
_GATES = {torch.nn.Sigmoid: "sigmoid", torch.nn.Hardsigmoid: "hardsigmoid"}


def _kind(module: torch.nn.Module, table: dict[type, str]) -> str | None:
    """What `module` computes, by its class: exactly torch's, or rtdnn's twin of it (a user's
    subclass may compute something else)."""
    cls = type(module)
    for base, name in table.items():
        if cls is base or (issubclass(cls, base) and cls.__module__.startswith("rtdnn.nn")):
            return name
    return None


def _pointwise(conv: torch.nn.Module) -> bool:
    """Whether `conv` is a plain 1x1 convolution (a matrix product on pooled values)."""
    return (
        isinstance(conv, torch.nn.Conv2d) and conv.kernel_size == (1, 1)
        and conv.stride == (1, 1) and conv.dilation == (1, 1) and conv.groups == 1
        and conv.padding in ((0, 0), "valid") and not conv._forward_hooks
        and not conv._forward_pre_hooks
    )  # fmt: skip


class SqueezeExcitation(torch.nn.Module):
    """y = x * scale_activation(fc2(activation(fc1(avgpool(x))))), torchvision's block: avgpool
    an AdaptiveAvgPool2d(1), fc1 and fc2 1x1 convolutions with biases. Input (N, C, H, W) or
    (C, H, W).

    With a ReLU or SiLU `activation` and a Sigmoid or Hardsigmoid `scale_activation` (torch's or
    rtdnn's) the block runs as one rtdnn op (four launches each way, five backward above
    R = 128, every step between x and y in float32); other activations, or submodules changed
    into something else, run the submodules one after the other as torchvision does.
    rtdnn.convert turns torchvision's SqueezeExcitation modules into this one (same submodules
    and state_dict).
    """

    def __init__(
        self,
        input_channels: int,
        squeeze_channels: int,
        activation: Callable[..., torch.nn.Module] = torch.nn.ReLU,
        scale_activation: Callable[..., torch.nn.Module] = torch.nn.Sigmoid,
    ) -> None:
        super().__init__()
        self.avgpool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc1 = torch.nn.Conv2d(input_channels, squeeze_channels, 1)
        self.fc2 = torch.nn.Conv2d(squeeze_channels, input_channels, 1)
        self.activation = activation()
        self.scale_activation = scale_activation()

    def _modes(self) -> tuple[str, str] | None:
        """(activation, gate) when the submodules are what the fused op computes, else None."""
        pool = self.avgpool
        if not isinstance(pool, torch.nn.AdaptiveAvgPool2d) or pool.output_size not in (1, (1, 1)):
            return None
        if pool._forward_hooks or pool._forward_pre_hooks:
            return None
        if not _pointwise(self.fc1) or not _pointwise(self.fc2):
            return None
        activation = _kind(self.activation, _ACTIVATIONS)
        gate = _kind(self.scale_activation, _GATES)
        if activation is None or gate is None or self.fc1.out_channels > MAX_SQUEEZE:
            return None
        return activation, gate

    def _scale(self, input: Tensor) -> Tensor:
        """torchvision's computation of the scale, one submodule at a time."""
        scale = self.avgpool(input)
        scale = self.fc1(scale)
        scale = self.activation(scale)
        scale = self.fc2(scale)
        return self.scale_activation(scale)

    def forward(self, input: Tensor) -> Tensor:
        modes = self._modes()
        if modes is None or input.dim() not in (3, 4):
            return self._scale(input) * input
        check_dtype(self, input)
        unbatched = input.dim() == 3
        x = input.unsqueeze(0) if unbatched else input
        fc1, fc2 = self.fc1, self.fc2
        y = autograd.squeeze_excitation_api(x, fc1.weight, fc1.bias, fc2.weight, fc2.bias, *modes)
        return y.squeeze(0) if unbatched else y
