"""Activation functions and their derivatives as OP functions of the elementwise kernel.

Forward ops read A = x. Backward ops read A = dy and B = the one tensor the derivative needs
(x or y, see `ACTIVATIONS`), so each backward moves dy, one input and dx: no more.
Coefficients arrive in p0 (and p1 for hardtanh's ceiling).
"""

from typing import NamedTuple

import triton
import triton.language as tl

from .mathfn import expm1, normal_cdf, normal_pdf, sigmoid, tanh

# Module constants read inside @triton.jit functions must be tl.constexpr.
_SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
_GELU_C = tl.constexpr(0.044715)


@triton.jit
def identity_fwd(a, b, c, index, p0, p1, p2, seed):
    return a


@triton.jit
def identity_bwd(a, b, c, index, p0, p1, p2, seed):
    return a


@triton.jit
def relu_fwd(a, b, c, index, p0, p1, p2, seed):
    # `a < 0` is False for NaN, so NaN passes through as in torch.relu.
    return tl.where(a < 0.0, 0.0, a)


@triton.jit
def relu_bwd(a, b, c, index, p0, p1, p2, seed):
    # b = y; y > 0 exactly where x > 0 (torch's threshold_backward on the result).
    return tl.where(b > 0.0, a, 0.0)


@triton.jit
def sigmoid_fwd(a, b, c, index, p0, p1, p2, seed):
    return sigmoid(a)


@triton.jit
def sigmoid_bwd(a, b, c, index, p0, p1, p2, seed):
    return a * b * (1.0 - b)


@triton.jit
def tanh_fwd(a, b, c, index, p0, p1, p2, seed):
    return tanh(a)


@triton.jit
def tanh_bwd(a, b, c, index, p0, p1, p2, seed):
    return a * (1.0 - b * b)


@triton.jit
def hardtanh_fwd(a, b, c, index, p0, p1, p2, seed):
    """Clamp to [p0, p1]; clipped ReLU is p0 = 0. NaN passes through."""
    return tl.where(a < p0, p0, tl.where(a > p1, p1, a))


@triton.jit
def hardtanh_bwd(a, b, c, index, p0, p1, p2, seed):
    # torch's hardtanh_backward: the gradient flows strictly inside (min, max).
    return tl.where((b > p0) & (b < p1), a, 0.0)


@triton.jit
def elu_fwd(a, b, c, index, p0, p1, p2, seed):
    return tl.where(a > 0.0, a, p0 * expm1(a))


@triton.jit
def elu_bwd(a, b, c, index, p0, p1, p2, seed):
    return tl.where(b > 0.0, a, a * p0 * tl.exp(tl.minimum(b, 0.0)))


@triton.jit
def leaky_relu_fwd(a, b, c, index, p0, p1, p2, seed):
    return tl.where(a > 0.0, a, a * p0)


@triton.jit
def leaky_relu_bwd(a, b, c, index, p0, p1, p2, seed):
    return tl.where(b > 0.0, a, a * p0)


@triton.jit
def swish_fwd(a, b, c, index, p0, p1, p2, seed):
    """x * sigmoid(beta x), beta = p0 (1 for SiLU)."""
    return a * sigmoid(p0 * a)


@triton.jit
def swish_bwd(a, b, c, index, p0, p1, p2, seed):
    s = sigmoid(p0 * b)
    return a * (s + p0 * b * s * (1.0 - s))


@triton.jit
def gelu_fwd(a, b, c, index, p0, p1, p2, seed):
    return a * normal_cdf(a)


@triton.jit
def gelu_bwd(a, b, c, index, p0, p1, p2, seed):
    return a * (normal_cdf(b) + b * normal_pdf(b))


@triton.jit
def _gelu_tanh_u2(x):
    """2u with u = sqrt(2/pi) (x + 0.044715 x^3): 0.5 x (1 + tanh u) = x sigmoid(2u)."""
    return 2.0 * _SQRT_2_OVER_PI * (x + _GELU_C * x * x * x)


@triton.jit
def gelu_tanh_fwd(a, b, c, index, p0, p1, p2, seed):
    # x * sigmoid(2u) has no cancellation in the lower tail, unlike 0.5 x (1 + tanh u).
    return a * sigmoid(_gelu_tanh_u2(a))


@triton.jit
def gelu_tanh_bwd(a, b, c, index, p0, p1, p2, seed):
    s = sigmoid(_gelu_tanh_u2(b))
    du2 = 2.0 * _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_C * b * b)
    return a * (s + b * s * (1.0 - s) * du2)


class Activation(NamedTuple):
    forward: object
    backward: object
    needs: str  # what the backward reads besides dy: "x", "y" or "" (nothing)


ACTIVATIONS: dict[str, Activation] = {
    "identity": Activation(identity_fwd, identity_bwd, ""),
    "relu": Activation(relu_fwd, relu_bwd, "y"),
    "sigmoid": Activation(sigmoid_fwd, sigmoid_bwd, "y"),
    "tanh": Activation(tanh_fwd, tanh_bwd, "y"),
    "clipped_relu": Activation(hardtanh_fwd, hardtanh_bwd, "x"),
    "hardtanh": Activation(hardtanh_fwd, hardtanh_bwd, "x"),
    "elu": Activation(elu_fwd, elu_bwd, "x"),
    "leaky_relu": Activation(leaky_relu_fwd, leaky_relu_bwd, "x"),
    "swish": Activation(swish_fwd, swish_bwd, "x"),
    "gelu": Activation(gelu_fwd, gelu_bwd, "x"),
    "gelu_tanh": Activation(gelu_tanh_fwd, gelu_tanh_bwd, "x"),
}
