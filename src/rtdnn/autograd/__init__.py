"""PyTorch integration: rtdnn's primitives as torch.library custom ops (rtdnn::*) with autograd
and fake (meta) kernels, one module per primitive family, mirroring rtdnn.ops.

_custom_op.py holds the machinery (CustomOp, custom_op, the eager fast path) and the helpers the
families share. A new family adds one module here beside its module in ops/.
"""

from ._custom_op import CustomOp, custom_op
from .activation import activation_backward, activation_forward
from .batch_norm import batch_norm, batch_norm_bwd, batch_norm_infer, batch_norm_train
from .conv import conv_backward_bias, conv_backward_data, conv_backward_filter, conv_forward
from .dropout import dropout_backward, dropout_forward
from .group_norm import group_norm, group_norm_bwd, group_norm_fwd, instance_norm
from .layer_norm import (
    layer_norm,
    layer_norm_bwd,
    layer_norm_fwd,
    rms_norm,
    rms_norm_bwd,
    rms_norm_fwd,
)
from .linear import linear, linear_backward_bias, linear_backward_data, linear_backward_weight
from .loss import cross_entropy, cross_entropy_backward
from .lrn import lrn_backward, lrn_forward
from .pooling import (
    adaptive_avg_pool,
    adaptive_avg_pool_backward,
    pooling_backward,
    pooling_forward,
)
from .softmax import softmax_backward, softmax_forward
from .tensor_ops import op_tensor, reduce_tensor, transform_tensor

__all__ = [
    "CustomOp",
    "activation_backward",
    "activation_forward",
    "adaptive_avg_pool",
    "adaptive_avg_pool_backward",
    "batch_norm",
    "batch_norm_bwd",
    "batch_norm_infer",
    "batch_norm_train",
    "conv_backward_bias",
    "conv_backward_data",
    "conv_backward_filter",
    "conv_forward",
    "cross_entropy",
    "cross_entropy_backward",
    "custom_op",
    "dropout_backward",
    "dropout_forward",
    "group_norm",
    "group_norm_bwd",
    "group_norm_fwd",
    "instance_norm",
    "layer_norm",
    "layer_norm_bwd",
    "layer_norm_fwd",
    "linear",
    "linear_backward_bias",
    "linear_backward_data",
    "linear_backward_weight",
    "lrn_backward",
    "lrn_forward",
    "op_tensor",
    "pooling_backward",
    "pooling_forward",
    "reduce_tensor",
    "rms_norm",
    "rms_norm_bwd",
    "rms_norm_fwd",
    "softmax_backward",
    "softmax_forward",
    "transform_tensor",
]
