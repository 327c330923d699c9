"""rtdnn: deep-learning primitives with cuDNN's semantics, generated at run time with Triton."""

from .convert import ConversionReport, convert
from .core import (
    AllocFailedError,
    BadParamError,
    Error,
    ExecutionFailedError,
    NotSupportedError,
)
from .ops import (
    conv_backward_bias,
    conv_backward_data,
    conv_backward_filter,
    conv_forward,
    cross_entropy,
    find_conv_algorithms,
    get_conv_algorithm,
    linear,
    linear_backward_bias,
    linear_backward_data,
    linear_backward_weight,
)
from .select import AlgoPerf

__version__ = "0.1.0"

__all__ = [
    "AlgoPerf",
    "ConversionReport",
    "convert",
    "AllocFailedError",
    "BadParamError",
    "Error",
    "ExecutionFailedError",
    "NotSupportedError",
    "conv_backward_bias",
    "conv_backward_data",
    "conv_backward_filter",
    "conv_forward",
    "cross_entropy",
    "find_conv_algorithms",
    "get_conv_algorithm",
    "linear",
    "linear_backward_bias",
    "linear_backward_data",
    "linear_backward_weight",
]
