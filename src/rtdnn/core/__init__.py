"""Descriptors, dtypes, math modes and errors: the bottom layer, shared by everything above."""

from .conv import (
    CONV_MODES,
    ConvDesc,
    ConvProblem,
    Direction,
    as_tuple,
    conv_output_shape,
    conv_output_size,
)
from .errors import (
    AllocFailedError,
    BadParamError,
    Error,
    ExecutionFailedError,
    NotSupportedError,
    bad_param,
    not_supported,
)
from .handle import INTERPRETED, allocate_workspace, check_runnable
from .tensor import (
    MATH_MODES,
    SUPPORTED_DTYPES,
    TensorDesc,
    channels_last,
    check_out,
    check_scaling,
    check_tensor,
    default_math_mode,
    empty_like_layout,
    resolve_math_mode,
)

__all__ = [
    "AllocFailedError",
    "BadParamError",
    "CONV_MODES",
    "ConvDesc",
    "ConvProblem",
    "Direction",
    "Error",
    "INTERPRETED",
    "allocate_workspace",
    "check_runnable",
    "ExecutionFailedError",
    "MATH_MODES",
    "NotSupportedError",
    "SUPPORTED_DTYPES",
    "TensorDesc",
    "as_tuple",
    "bad_param",
    "channels_last",
    "check_out",
    "check_scaling",
    "check_tensor",
    "conv_output_shape",
    "conv_output_size",
    "default_math_mode",
    "empty_like_layout",
    "not_supported",
    "resolve_math_mode",
]
