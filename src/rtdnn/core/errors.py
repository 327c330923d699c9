"""Errors raised by rtdnn, one class per cuDNN status.

Every check runs before any kernel is launched, so an error means nothing was written. The
message names the parameter, the value it had and what was expected. Each class also derives
from the closest built-in exception, so `except ValueError` keeps working in user code, and
from the one torch raises for the same mistake (RuntimeError for a shape, rank or dtype that
does not fit), so code written against torch.nn catches rtdnn's errors too.
"""

from __future__ import annotations


class Error(Exception):
    """Base class of every rtdnn error. `status` is the matching cuDNN status name."""

    status = "CUDNN_STATUS_INTERNAL_ERROR"


class BadParamError(Error, ValueError, RuntimeError):
    """An argument is invalid: wrong shape, dtype, device, layout or value.

    A ValueError, and also a RuntimeError because torch raises RuntimeError for most of these
    (a channel count or rank that does not fit, mismatched dtypes)."""

    status = "CUDNN_STATUS_BAD_PARAM"


class NotSupportedError(Error, NotImplementedError):
    """The request is valid but this algorithm or this build does not implement it."""

    status = "CUDNN_STATUS_NOT_SUPPORTED"


class AllocFailedError(Error, MemoryError):
    """A workspace or output could not be allocated within the given limit."""

    status = "CUDNN_STATUS_ALLOC_FAILED"


class ExecutionFailedError(Error, RuntimeError):
    """A kernel failed to compile or launch."""

    status = "CUDNN_STATUS_EXECUTION_FAILED"


def bad_param(name: str, value: object, expected: str) -> BadParamError:
    """Build the standard message: which parameter, what it was, what was expected."""
    return BadParamError(f"{name}={value!r} is invalid: expected {expected}")


def not_supported(what: str, value: object, reason: str) -> NotSupportedError:
    return NotSupportedError(f"{what}={value!r} is not supported: {reason}")
