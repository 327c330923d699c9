"""Normalization modules: drop-ins for torch.nn's, with the same constructor arguments,
parameters, buffers and state_dict keys (they subclass them); the arithmetic runs in rtdnn.

Batch norm follows torch exactly: in training, num_batches_tracked counts the steps and
momentum=None means a cumulative average (factor 1 / steps); the running variance takes the
unbiased batch variance; eval mode uses the running statistics unless track_running_stats is
False, in which case batch statistics are used in both modes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import autograd
from ._inputs import check_dtype

#: The fused activations (kernels.norm_addressing.ACTIVATIONS) as torch computes them.
TORCH_ACTIVATIONS = {
    "identity": lambda y: y,
    "relu": torch.relu,
    "silu": torch.nn.functional.silu,
    "hardswish": torch.nn.functional.hardswish,
}


class _RtdnnBatchNorm:
    """Replaces torch's _BatchNorm.forward; everything else is inherited.

    `activation` ("identity", "relu", "silu" or "hardswish") and the optional residual `z` of
    forward are cuDNN's fused BN_ACTIVATION / BN_ADD_ACTIVATION: y = activation(bn(input) + z).
    rtdnn.fuse sets the activation on modules whose output feeds a ReLU, SiLU or Hardswish. A
    z that the fused op cannot take (another shape, to broadcast, or another dtype or device)
    is added after the batch norm with torch's own rules, as the unfused model did.
    """

    activation = "identity"

    def extra_repr(self) -> str:
        fused = "" if self.activation == "identity" else f", activation={self.activation}"
        return super().extra_repr() + fused

    def forward(self, input: Tensor, z: Tensor | None = None) -> Tensor:
        if z is not None and (
            z.shape != input.shape or z.dtype != input.dtype or z.device != input.device
        ):
            y = self._batch_norm(input, None, "identity") + z
            return TORCH_ACTIVATIONS[self.activation](y)
        return self._batch_norm(input, z, self.activation)

    def _batch_norm(self, input: Tensor, z: Tensor | None, activation: str) -> Tensor:
        self._check_input_dim(input)
        check_dtype(self, input)
        running_mean, running_var, use_batch, factor = self._statistics()
        parameters = self._parameters
        return autograd.batch_norm(
            input,
            running_mean,
            running_var,
            parameters.get("weight"),
            parameters.get("bias"),
            use_batch,
            factor,
            self.eps,
            z=z,
            activation=activation,
        )

    def _statistics(self, count: bool = True) -> tuple[Tensor | None, Tensor | None, bool, float]:
        """(running_mean, running_var, whether to use batch statistics, the momentum factor)
        for one call, as torch's forward decides them; the running statistics are None when
        not tracked. A call in training counts a step in num_batches_tracked, here (as torch
        does) or, with count=False, by the caller once its op has run."""
        # The module's own dictionaries, read once: each attribute read through
        # Module.__getattr__ costs more than the rest of this method's Python.
        buffers = self._buffers
        factor = 0.0 if self.momentum is None else self.momentum
        steps = buffers.get("num_batches_tracked")
        if self.training and self.track_running_stats and steps is not None:
            if count:
                steps.add_(1)
            if self.momentum is None:  # cumulative moving average, this step included
                factor = 1.0 / (float(steps) + (0 if count else 1))
        running_mean, running_var = buffers.get("running_mean"), buffers.get("running_var")
        # Batch statistics in training, and in eval when there are no running statistics.
        use_batch = self.training or (running_mean is None and running_var is None)
        if self.training and not self.track_running_stats:
            running_mean = running_var = None
        return running_mean, running_var, use_batch, factor

    def after_conv(self, conv: torch.nn.Module, input: Tensor, z: Tensor | None = None) -> Tensor:
        """self(conv(input), z) for an rtdnn convolution module `conv` that rtdnn.fuse paired
        with this batch norm: in training, where both layers allow it, one op and one autograd
        node (autograd.conv_batch_norm); otherwise the two modules one after the other."""
        if self.training and conv.pairs_with_batch_norm(self.num_features, input):
            x, w, b = conv.autocast_inputs(input)
            if z is None or conv.output_like(z, x):
                self._check_input_dim(input)  # the convolution's output has input's dims
                # The step is counted once the op has run: a convolution that refuses its
                # arguments leaves the batch norm as it was, as the two modules apart do.
                running_mean, running_var, _, factor = self._statistics(count=False)
                parameters = self._parameters
                y = autograd.conv_batch_norm(
                    x, w, b, *conv.geometry(), parameters.get("weight"),
                    parameters.get("bias"), running_mean, running_var, factor, self.eps, z=z,
                    activation=self.activation,
                )  # fmt: skip
                steps = self._buffers.get("num_batches_tracked")
                if self.track_running_stats and steps is not None:
                    steps.add_(1)
                return y
        return self(conv(input), z)


class BatchNorm1d(_RtdnnBatchNorm, torch.nn.BatchNorm1d):
    """torch.nn.BatchNorm1d computed by rtdnn."""


class BatchNorm2d(_RtdnnBatchNorm, torch.nn.BatchNorm2d):
    """torch.nn.BatchNorm2d computed by rtdnn."""


class BatchNorm3d(_RtdnnBatchNorm, torch.nn.BatchNorm3d):
    """torch.nn.BatchNorm3d computed by rtdnn."""


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm computed by rtdnn."""

    def forward(self, input: Tensor) -> Tensor:
        check_dtype(self, input)
        return autograd.layer_norm(
            input, list(self.normalized_shape), self.weight, self.bias, self.eps
        )


class RMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm computed by rtdnn."""

    def forward(self, x: Tensor) -> Tensor:
        check_dtype(self, x)
        return autograd.rms_norm(x, list(self.normalized_shape), self.weight, self.eps)


class GroupNorm(torch.nn.GroupNorm):
    """torch.nn.GroupNorm computed by rtdnn."""

    def forward(self, input: Tensor) -> Tensor:
        check_dtype(self, input)
        return autograd.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)


class _RtdnnInstanceNorm:
    """Replaces torch's _InstanceNorm._apply_instance_norm (unbatched inputs, channel checks
    and state_dict handling are inherited)."""

    def _apply_instance_norm(self, input: Tensor) -> Tensor:
        check_dtype(self, input)
        return autograd.instance_norm(
            input,
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            self.training or not self.track_running_stats,
            self.momentum if self.momentum is not None else 0.0,
            self.eps,
        )


class InstanceNorm1d(_RtdnnInstanceNorm, torch.nn.InstanceNorm1d):
    """torch.nn.InstanceNorm1d computed by rtdnn."""


class InstanceNorm2d(_RtdnnInstanceNorm, torch.nn.InstanceNorm2d):
    """torch.nn.InstanceNorm2d computed by rtdnn."""


class InstanceNorm3d(_RtdnnInstanceNorm, torch.nn.InstanceNorm3d):
    """torch.nn.InstanceNorm3d computed by rtdnn."""
