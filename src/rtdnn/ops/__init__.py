"""The public functional API, one module per primitive family."""

from .conv import (
    conv_backward_bias,
    conv_backward_data,
    conv_backward_filter,
    conv_forward,
    find_conv_algorithms,
    get_conv_algorithm,
)
from .linear import linear, linear_backward_bias, linear_backward_data, linear_backward_weight
from .loss import cross_entropy, cross_entropy_backward, cross_entropy_forward

__all__ = [
    "cross_entropy",
    "cross_entropy_backward",
    "cross_entropy_forward",
    "linear",
    "linear_backward_bias",
    "linear_backward_data",
    "linear_backward_weight",
    "conv_backward_bias",
    "conv_backward_data",
    "conv_backward_filter",
    "conv_forward",
    "find_conv_algorithms",
    "get_conv_algorithm",
]
