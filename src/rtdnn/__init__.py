"""rtdnn: deep-learning primitives with cuDNN's semantics, generated at run time with Triton."""

from .autograd import batch_norm, group_norm, instance_norm, layer_norm, rms_norm
from .core import (
    AllocFailedError,
    BadParamError,
    Error,
    ExecutionFailedError,
    NotSupportedError,
)
from .ops import (
    batch_norm_backward,
    batch_norm_forward_inference,
    batch_norm_forward_training,
    conv_backward_bias,
    conv_backward_data,
    conv_backward_filter,
    conv_forward,
    find_conv_algorithms,
    get_conv_algorithm,
    group_norm_backward,
    group_norm_forward,
    instance_norm_backward,
    instance_norm_forward,
    layer_norm_backward,
    layer_norm_forward,
    rms_norm_backward,
    rms_norm_forward,
)
from .select import AlgoPerf

__version__ = "0.1.0"

__all__ = [
    "AlgoPerf",
    "AllocFailedError",
    "BadParamError",
    "Error",
    "ExecutionFailedError",
    "NotSupportedError",
    "batch_norm",
    "batch_norm_backward",
    "batch_norm_forward_inference",
    "batch_norm_forward_training",
    "conv_backward_bias",
    "conv_backward_data",
    "conv_backward_filter",
    "conv_forward",
    "find_conv_algorithms",
    "get_conv_algorithm",
    "group_norm",
    "group_norm_backward",
    "group_norm_forward",
    "instance_norm",
    "instance_norm_backward",
    "instance_norm_forward",
    "layer_norm",
    "layer_norm_backward",
    "layer_norm_forward",
    "rms_norm",
    "rms_norm_backward",
    "rms_norm_forward",
]
