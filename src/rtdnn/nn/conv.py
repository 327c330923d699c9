"""Convolution modules: drop-ins for torch.nn.Conv1d/2d/3d with the same constructor,
parameters and state_dict keys; the arithmetic runs in rtdnn. Like torch's, they take batched
(N, C, *S) and unbatched (C, *S) input, and a batch of 0."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import autograd
from ..autograd.conv_plan import ConvTuning, planned_conv
from ..core import (
    SUPPORTED_DTYPES,
    ConvDesc,
    bad_param,
    conv_output_shape,
    not_supported,
)
from ..ops.conv import pad_same
from ._inputs import batched, unbatch

MODE = "cross_correlation"  # what torch.nn's convolution modules compute


def autocast_inputs(first: Tensor, *tensors: Tensor | None) -> tuple[Tensor | None, ...]:
    """Under torch.autocast, cast floating inputs to the autocast dtype, as torch does for its
    own convolutions and matmuls (the custom ops themselves take one dtype). The first is
    the layer's input, whose device says which autocast applies."""
    tensors = (first, *tensors)
    kind = first.device.type
    if not torch.is_autocast_enabled(kind):
        return tensors
    dtype = torch.get_autocast_dtype(kind)
    # A tensor already in the autocast dtype (the activations, after the first layer) is
    # passed as it is: .to() would return it too, but through the dispatcher.
    return tuple(t if t is None or t.dtype == dtype else t.to(dtype) for t in tensors)


class _RtdnnConv:
    """Replaces torch's _conv_forward; everything else is inherited from torch.nn.ConvNd.

    `tuning` (set by rtdnn.convert with a workspace limit or a micro-batch policy) makes the
    layer run each direction by a measured plan within its limit (see autograd.conv_plan);
    None runs the convolution as the functions' defaults do. `activation` ("identity" or
    "relu", set where rtdnn.fuse folds a batch norm and its ReLU into the layer) is applied to
    the result, in the convolution's own kernel where its algorithm can.
    """

    tuning: ConvTuning | None = None
    activation: str = "identity"
    folded_batch_norm: bool = False  # rtdnn.fuse.fold_batch_norm folded one into this layer

    def forward(
        self, input: Tensor, batch_norm: torch.nn.Module | None = None, z: Tensor | None = None
    ) -> Tensor:
        """torch's forward; with `batch_norm`, an rtdnn batch norm that rtdnn.fuse paired with
        this layer, batch_norm(conv(input), z), one op in training (see its after_conv)."""
        if batch_norm is not None:
            return batch_norm.after_conv(self, input, z)
        if z is not None:
            raise bad_param("z", "a tensor", "None without batch_norm (z is the batch norm's)")
        return self._conv_forward(input, self.weight, self.bias)

    def pairs_with_batch_norm(self, channels: int, input: Tensor | None = None) -> bool:
        """Whether this layer's convolution can run in one op with a batch norm of `channels`
        features (autograd.conv_batch_norm): zero padding given as numbers (or "valid"), no
        measured plan, activation or folded batch norm of its own; and, for `input` when
        given, batched input of this layer's channels and a dtype rtdnn computes. Otherwise
        the two modules run apart, and the convolution's own checks speak for bad input."""
        padding = self.padding
        layer = (
            self.tuning is None
            and self.activation == "identity"
            and not self.folded_batch_norm
            and self.padding_mode == "zeros"
            and (padding == "valid" or not isinstance(padding, str))
            and self.out_channels == channels
        )
        return layer and (
            input is None
            or (
                input.dim() == len(self.kernel_size) + 2
                and input.shape[1] == self.in_channels
                and input.dtype in SUPPORTED_DTYPES
            )
        )

    def autocast_inputs(self, input: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """(input, weight, bias) as this layer's convolution takes them under autocast."""
        return autocast_inputs(input, self._parameters["weight"], self._parameters.get("bias"))

    def geometry(self) -> tuple[list[int], list[int], list[int], int]:
        """(stride, padding, dilation, groups) as the custom ops take them."""
        padding = self.padding
        if padding == "valid":
            padding = (0,) * len(self.kernel_size)
        return list(self.stride), list(padding), list(self.dilation), self.groups

    def output_like(self, z: Tensor, x: Tensor) -> bool:
        """Whether z has the shape, dtype and device of this layer's output for the input x
        (as autocast_inputs gives it)."""
        if z.dtype != x.dtype or z.device != x.device or z.dim() != x.dim():
            return False
        stride, padding, dilation, _ = self.geometry()
        desc = ConvDesc.create(x.dim() - 2, stride, padding, dilation, self.groups, MODE, "fp32")
        return tuple(z.shape) == conv_output_shape(x.shape, self.weight.shape, desc)

    def _conv_forward(self, input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        input, added = batched(self, input, len(self.kernel_size))
        if added and self.folded_batch_norm:
            # The batch norm folded in would have taken the unbatched output (K, *S) as a
            # batch of K (BatchNorm1d) or refused it (2d, 3d): not what the fold computes.
            raise not_supported(
                "input.dim()", input.dim() - 1,
                f"a batch norm was folded into this {type(self).__name__}, which takes "
                "batched input only",
            )  # fmt: skip
        if input.shape[1] != self.in_channels:
            raise bad_param(
                f"input.shape[{0 if added else 1}]",
                input.shape[1],
                f"{self.in_channels} channels (in_channels of {type(self).__name__}), "
                f"got input of size {list(input.shape[added:])}",
            )
        return unbatch(self._batched_forward(input, weight, bias), added)

    def _batched_forward(self, input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        input, weight, bias = autocast_inputs(input, weight, bias)
        padding = self.padding
        if self.padding_mode != "zeros":
            input = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            padding = (0,) * len(self.kernel_size)
        elif padding == "valid":
            padding = (0,) * len(self.kernel_size)
        elif padding == "same":
            input, padding = pad_same(input, self.kernel_size, self.dilation)
        args = (
            input, weight, bias, list(self.stride), list(padding), list(self.dilation),
            self.groups, MODE,
        )  # fmt: skip
        if self.tuning is not None:
            y = planned_conv(*args, self.tuning)
            if self.activation == "identity":
                return y
            return autograd.activation_forward(y, self.activation, [])
        if self.activation != "identity":
            return autograd.conv_forward(
                *args, "auto", None, None, 1.0, "undivided", None, self.activation
            )
        return autograd.conv_forward(*args)

    def extra_repr(self) -> str:
        extra = "" if self.activation == "identity" else f", activation={self.activation}"
        return super().extra_repr() + extra


class Conv1d(_RtdnnConv, torch.nn.Conv1d):
    """torch.nn.Conv1d computed by rtdnn."""


class Conv2d(_RtdnnConv, torch.nn.Conv2d):
    """torch.nn.Conv2d computed by rtdnn."""


class Conv3d(_RtdnnConv, torch.nn.Conv3d):
    """torch.nn.Conv3d computed by rtdnn."""
