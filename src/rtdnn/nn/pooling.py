"""Pooling modules: drop-ins for torch.nn.MaxPool1d/2d/3d, AvgPool1d/2d/3d and
AdaptiveAvgPool1d/2d/3d with the same constructor arguments; the arithmetic runs in rtdnn.
Like torch's, they take batched (N, C, *S) and unbatched (C, *S) input, and a batch of 0."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import autograd
from ..core import NotSupportedError
from ._inputs import batched, unbatch


def _tuple(v, n: int) -> list[int]:
    return list(v) if isinstance(v, (tuple, list)) else [v] * n


class _RtdnnMaxPool:
    _nd = 2

    def forward(self, input: Tensor) -> Tensor:
        if self.return_indices:
            raise NotSupportedError("return_indices=True is not supported by rtdnn pooling")
        n = self._nd
        input, added = batched(self, input, n)
        stride = self.stride if self.stride is not None else self.kernel_size
        y = autograd.pooling_forward(
            input, "max", _tuple(self.kernel_size, n), _tuple(stride, n),
            _tuple(self.padding, n), _tuple(self.dilation, n), bool(self.ceil_mode),
        )  # fmt: skip
        return unbatch(y, added)


class MaxPool1d(_RtdnnMaxPool, torch.nn.MaxPool1d):
    """torch.nn.MaxPool1d computed by rtdnn (return_indices is not supported)."""

    _nd = 1


class MaxPool2d(_RtdnnMaxPool, torch.nn.MaxPool2d):
    """torch.nn.MaxPool2d computed by rtdnn (return_indices is not supported)."""

    _nd = 2


class MaxPool3d(_RtdnnMaxPool, torch.nn.MaxPool3d):
    """torch.nn.MaxPool3d computed by rtdnn (return_indices is not supported)."""

    _nd = 3


class _RtdnnAvgPool:
    _nd = 2

    def forward(self, input: Tensor) -> Tensor:
        if getattr(self, "divisor_override", None) is not None:
            raise NotSupportedError("divisor_override is not supported by rtdnn pooling")
        n = self._nd
        input, added = batched(self, input, n)
        stride = self.stride if self.stride is not None else self.kernel_size
        mode = "avg_include_pad" if self.count_include_pad else "avg_exclude_pad"
        y = autograd.pooling_forward(
            input, mode, _tuple(self.kernel_size, n), _tuple(stride, n),
            _tuple(self.padding, n), [1] * n, bool(self.ceil_mode),
        )  # fmt: skip
        return unbatch(y, added)


class AvgPool1d(_RtdnnAvgPool, torch.nn.AvgPool1d):
    """torch.nn.AvgPool1d computed by rtdnn."""

    _nd = 1


class AvgPool2d(_RtdnnAvgPool, torch.nn.AvgPool2d):
    """torch.nn.AvgPool2d computed by rtdnn (divisor_override is not supported)."""

    _nd = 2


class AvgPool3d(_RtdnnAvgPool, torch.nn.AvgPool3d):
    """torch.nn.AvgPool3d computed by rtdnn (divisor_override is not supported)."""

    _nd = 3


class _RtdnnAdaptiveAvgPool:
    _nd = 2

    def forward(self, input: Tensor) -> Tensor:
        n = self._nd
        input, added = batched(self, input, n)
        size = _tuple(self.output_size, n)
        size = [input.shape[2 + i] if s is None else s for i, s in enumerate(size)]
        return unbatch(autograd.adaptive_avg_pool(input, size), added)


class AdaptiveAvgPool1d(_RtdnnAdaptiveAvgPool, torch.nn.AdaptiveAvgPool1d):
    """torch.nn.AdaptiveAvgPool1d computed by rtdnn."""

    _nd = 1


class AdaptiveAvgPool2d(_RtdnnAdaptiveAvgPool, torch.nn.AdaptiveAvgPool2d):
    """torch.nn.AdaptiveAvgPool2d computed by rtdnn."""

    _nd = 2


class AdaptiveAvgPool3d(_RtdnnAdaptiveAvgPool, torch.nn.AdaptiveAvgPool3d):
    """torch.nn.AdaptiveAvgPool3d computed by rtdnn."""

    _nd = 3
