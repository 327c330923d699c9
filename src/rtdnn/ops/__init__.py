"""The public functional API, one module per primitive family."""

from .batch_norm import (
    batch_norm_backward,
    batch_norm_forward_inference,
    batch_norm_forward_training,
)
from .conv import (
    conv_backward_bias,
    conv_backward_data,
    conv_backward_filter,
    conv_forward,
    find_conv_algorithms,
    get_conv_algorithm,
)
from .group_norm import (
    group_norm_backward,
    group_norm_forward,
    instance_norm_backward,
    instance_norm_forward,
)
from .layer_norm import (
    layer_norm_backward,
    layer_norm_forward,
    rms_norm_backward,
    rms_norm_forward,
)

__all__ = [
    "batch_norm_backward",
    "batch_norm_forward_inference",
    "batch_norm_forward_training",
    "conv_backward_bias",
    "conv_backward_data",
    "conv_backward_filter",
    "conv_forward",
    "find_conv_algorithms",
    "get_conv_algorithm",
    "group_norm_backward",
    "group_norm_forward",
    "instance_norm_backward",
    "instance_norm_forward",
    "layer_norm_backward",
    "layer_norm_forward",
    "rms_norm_backward",
    "rms_norm_forward",
]
