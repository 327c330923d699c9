"""The public functional API, one module per primitive family."""

from .conv import (
    conv_backward_bias,
    conv_backward_data,
    conv_backward_filter,
    conv_forward,
    find_conv_algorithms,
    get_conv_algorithm,
)

__all__ = [
    "conv_backward_bias",
    "conv_backward_data",
    "conv_backward_filter",
    "conv_forward",
    "find_conv_algorithms",
    "get_conv_algorithm",
]
