"""Convolution descriptors: the parameters, the direction and the whole problem as one value.

A `ConvProblem` is frozen and hashable. It is validated once when it is made and it is the key
that kernel caches and algorithm choices are indexed by.
"""

from __future__ import annotations

import math as _math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import torch

from .errors import bad_param, not_supported
from .tensor import TensorDesc

CONV_MODES = ("cross_correlation", "convolution")


class Direction(str, Enum):
    FORWARD = "forward"
    BACKWARD_DATA = "backward_data"
    BACKWARD_FILTER = "backward_filter"

    @classmethod
    def parse(cls, value: str | Direction) -> Direction:
        try:
            return cls(value)
        except ValueError:
            raise bad_param("direction", value, f"one of {[d.value for d in cls]}") from None


def as_tuple(name: str, value: int | Sequence[int], n: int) -> tuple[int, ...]:
    """Expand an int to an n-tuple, or check a sequence has n ints."""
    if isinstance(value, bool):
        raise bad_param(name, value, f"an int or a sequence of {n} ints")
    if isinstance(value, int):
        return (value,) * n
    try:
        t = tuple(value)
    except TypeError:
        raise bad_param(name, value, f"an int or a sequence of {n} ints") from None
    if len(t) != n or not all(isinstance(v, int) and not isinstance(v, bool) for v in t):
        raise bad_param(name, value, f"an int or a sequence of {n} ints")
    return t


@dataclass(frozen=True)
class ConvDesc:
    """Stride, padding, dilation (one entry per spatial dim), groups, mode and math mode."""

    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    mode: str
    math: str

    @classmethod
    def create(
        cls,
        spatial_dims: int,
        stride: int | Sequence[int],
        padding: int | Sequence[int],
        dilation: int | Sequence[int],
        groups: int,
        mode: str,
        math: str,
    ) -> ConvDesc:
        stride_t = as_tuple("stride", stride, spatial_dims)
        padding_t = as_tuple("padding", padding, spatial_dims)
        dilation_t = as_tuple("dilation", dilation, spatial_dims)
        if any(s < 1 for s in stride_t):
            raise bad_param("stride", stride, "every entry >= 1")
        if any(p < 0 for p in padding_t):
            raise bad_param("padding", padding, "every entry >= 0")
        if any(d < 1 for d in dilation_t):
            raise bad_param("dilation", dilation, "every entry >= 1")
        if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
            raise bad_param("groups", groups, "an int >= 1")
        if mode not in CONV_MODES:
            raise bad_param("mode", mode, f"one of {CONV_MODES}")
        return cls(stride_t, padding_t, dilation_t, groups, mode, math)


def conv_output_size(
    in_size: Sequence[int], kernel: Sequence[int], conv: ConvDesc
) -> tuple[int, ...]:
    """Output spatial size: floor((i + 2p - d*(r-1) - 1) / s) + 1 per dim."""
    return tuple(
        (i + 2 * p - d * (r - 1) - 1) // s + 1
        for i, r, s, p, d in zip(
            in_size, kernel, conv.stride, conv.padding, conv.dilation, strict=True
        )
    )


def conv_output_shape(
    x_shape: Sequence[int], w_shape: Sequence[int], conv: ConvDesc
) -> tuple[int, ...]:
    """Validate x and w shapes against each other and `conv`; return y's shape (N, K, *out)."""
    nd = len(x_shape)
    if nd not in (3, 4, 5):
        raise bad_param("x.dim()", nd, "3, 4 or 5 (N, C and 1 to 3 spatial dims)")
    if len(w_shape) != nd:
        raise bad_param("w.dim()", len(w_shape), f"{nd}, the same as x")
    if len(conv.stride) != nd - 2:
        raise bad_param("stride", conv.stride, f"{nd - 2} entries, one per spatial dim")
    n, c = x_shape[:2]
    k, c_per_group = w_shape[:2]
    g = conv.groups
    if c % g:
        raise bad_param("groups", g, f"a divisor of the input channels C={c}")
    if k % g:
        raise bad_param("groups", g, f"a divisor of the output channels K={k}")
    if c_per_group * g != c:
        raise bad_param("w.shape[1]", c_per_group, f"C/groups = {c}/{g} = {c // g}")
    # A batch of 0 is valid (the result is empty); every other dim needs at least one entry.
    if n < 0 or any(s < 1 for s in (*x_shape[1:], *w_shape)):
        raise bad_param(
            "shape", (tuple(x_shape), tuple(w_shape)), "no dimension below 1 (a batch of 0 is fine)"
        )
    out = conv_output_size(x_shape[2:], w_shape[2:], conv)
    if any(o < 1 for o in out):
        raise bad_param(
            "output size",
            out,
            f"every dim >= 1; input {tuple(x_shape[2:])} with kernel {tuple(w_shape[2:])}, "
            f"padding {conv.padding}, dilation {conv.dilation}, stride {conv.stride} "
            "is too small",
        )
    return (n, k, *out)


#: What a convolution's forward can apply to its result (ConvProblem.activation).
CONV_ACTIVATIONS = ("identity", "relu")


def conv_activation(activation: str | None) -> str:
    """A forward's `activation` argument checked: one of CONV_ACTIVATIONS (None: "identity")."""
    if activation is None:
        return "identity"
    if activation not in CONV_ACTIVATIONS:
        raise bad_param("activation", activation, f"one of {CONV_ACTIVATIONS}")
    return activation


@dataclass(frozen=True)
class ConvProblem:
    """One convolution in one direction.

    x: input (N, C, *spatial), w: filter (K, C/groups, *kernel), y: output (N, K, *out_spatial),
    each with the strides of the tensor the caller passes (for the direction's output, the
    tensor rtdnn writes). `device` is "cuda" or "cpu". `activation` (forward only; one of
    CONV_ACTIVATIONS) is applied to the result after the bias and beta terms, as cuDNN's
    ConvolutionBiasActivationForward does.
    """

    direction: Direction
    x: TensorDesc
    w: TensorDesc
    y: TensorDesc
    conv: ConvDesc
    device: str
    has_bias: bool = False
    activation: str = "identity"

    # -- sizes ------------------------------------------------------------------------------
    @property
    def spatial_dims(self) -> int:
        return self.x.ndim - 2

    @property
    def batch(self) -> int:
        return self.x.shape[0]

    @property
    def in_channels(self) -> int:
        return self.x.shape[1]

    @property
    def out_channels(self) -> int:
        return self.w.shape[0]

    @property
    def groups(self) -> int:
        return self.conv.groups

    @property
    def in_spatial(self) -> tuple[int, ...]:
        return self.x.shape[2:]

    @property
    def out_spatial(self) -> tuple[int, ...]:
        return self.y.shape[2:]

    @property
    def kernel(self) -> tuple[int, ...]:
        return self.w.shape[2:]

    @property
    def dtype(self) -> torch.dtype:
        return self.x.dtype

    @property
    def flops(self) -> int:
        """Multiply-adds times two; the same count in every direction."""
        return (
            2
            * self.batch
            * self.out_channels
            * _math.prod(self.out_spatial)
            * (self.in_channels // self.groups)
            * _math.prod(self.kernel)
        )

    def key(self) -> str:
        """A stable text key for tuning databases and reports."""
        c = self.conv
        return (
            f"{self.direction.value}|{self.dtype}|{c.math}|x{self.x.shape}{self.x.strides}"
            f"|w{self.w.shape}{self.w.strides}|y{self.y.strides}|s{c.stride}p{c.padding}"
            f"d{c.dilation}g{c.groups}|{c.mode}|bias{int(self.has_bias)}|{self.device}"
            + ("" if self.activation == "identity" else f"|{self.activation}")
        )

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        direction: Direction,
        x: TensorDesc,
        w: TensorDesc,
        y: TensorDesc,
        conv: ConvDesc,
        device: str,
        has_bias: bool = False,
        activation: str = "identity",
    ) -> ConvProblem:
        """Validate shapes against each other and return the problem."""
        expected_y = conv_output_shape(x.shape, w.shape, conv)
        if y.shape != expected_y:
            name = "dy.shape" if direction != Direction.FORWARD else "out.shape"
            raise bad_param(name, y.shape, f"{expected_y}")
        if not (x.dtype == w.dtype == y.dtype):
            raise bad_param("dtype", (x.dtype, w.dtype, y.dtype), "the same dtype for x, w and y")
        if device not in ("cuda", "cpu"):
            raise not_supported("device", device, "rtdnn runs on CUDA GPUs or the CPU interpreter")
        if conv_activation(activation) != "identity" and direction != Direction.FORWARD:
            raise bad_param("activation", activation, "'identity' outside the forward direction")
        return cls(direction, x, w, y, conv, device, has_bias, activation)
